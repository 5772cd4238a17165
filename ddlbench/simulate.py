"""The performance model's replay (issue 18, first part): one steady-state training iteration of
an all-reduce method, event by event, from a compute profile and a per-message network model
(docs/DESIGN.md section 3). Pure: no torch, no job.

**Inputs.** ``Workload``: the forward time, each gradient tensor's backward time (the gap since
the previous gradient was ready) and bytes, in backward order (as the profiler's JSON holds
them), and the optimizer's step. ``Link``: one all-reduce message of M bytes among the run's P
workers costs ``alpha + beta * M`` (``comm_bench``'s per-P fit, the form MG-WFBP plans with).

**Replay.** One compute stream runs forward, then backward, producing gradient b at
``forward_s + sum(backward_s[:b+1])``; the method's messages (``groups``: consecutive backward
positions) each leave once their last gradient is ready, on ``channels`` FIFO communication
threads (1: the cost model's one stream); the optimizer steps once every message is done. The
events are the timeline's (``ddlbench.timeline``): an iteration, forward and backward and the
optimizer as compute, the method's ``step`` as a wait, each message a ``comm`` span with its
bytes and tensors, so ``timeline.overlap`` gives the predicted metrics and ``timeline.trace``
a trace that ``python -m ddlbench.timeline`` reads beside a measured one.

**Methods** (``GROUPINGS``): ``bspa2a`` one message after the backward; ``wfbp`` one per tensor;
``fusion`` buckets of at most ``threshold`` bytes (``planning.plan_buckets``, as the method
packs them); ``ddp`` buckets of ``bucket_cap_mb`` (DDP's rebuilt buckets, in gradient order; its
first-iteration order ignored); ``mgwfbp`` the suite's own ``planning.merge_groups`` on the same
inputs. With one channel the iteration is exactly ``forward_s + planning.schedule_time(...) +
optimizer_s`` (the section 3 recurrences). ``bytescheduler`` (``bytescheduler()``) replays
several iterations in steady state: chunks, priority, credit, per-tensor updates on a completer
thread and the next forward waiting per module. The parameter-server methods and the
compressors are not modelled yet.
"""
from __future__ import annotations

import heapq
from dataclasses import dataclass, field

from . import timeline
from .errors import UsageError
from .planning import BYTESCHEDULER_CREDIT as BS_CREDIT
from .planning import BYTESCHEDULER_PARTITION as BS_PARTITION
from .planning import (DDP_DEFAULT_BUCKET_MB, DEFAULT_MIN_GROUP_ELEMENTS,
                       HOROVOD_DEFAULT_THRESHOLD, chunk_table, merge_groups, plan_buckets)

MIB = 1024 * 1024
# MG-WFBP's small-group merge: the original's elements, of fp32
MGWFBP_MIN_GROUP_BYTES = DEFAULT_MIN_GROUP_ELEMENTS * 4


@dataclass(frozen=True)
class Workload:
    """One rank's compute per iteration; lists in backward order."""
    forward_s: float
    backward_s: list[float]
    nbytes: list[int]
    optimizer_s: float = 0.0
    names: list[str] | None = None

    def __post_init__(self):
        if len(self.backward_s) != len(self.nbytes) or not self.nbytes:
            raise UsageError(f"a profile needs one backward time per tensor: "
                             f"{len(self.backward_s)} times for {len(self.nbytes)} tensors")
        if self.names is not None and len(self.names) != len(self.nbytes):
            raise UsageError(f"{len(self.names)} names for {len(self.nbytes)} tensors")
        bad = [x for x in (self.forward_s, self.optimizer_s, *self.backward_s, *self.nbytes)
               if not x >= 0]
        if bad:
            raise UsageError(f"times and sizes must be finite and >= 0, got {bad[0]!r}")

    @property
    def compute_s(self) -> float:
        return self.forward_s + sum(self.backward_s) + self.optimizer_s


@dataclass(frozen=True)
class Link:
    """One message of M bytes costs ``alpha + beta * M`` seconds."""
    alpha: float
    beta: float

    def __post_init__(self):
        if not (self.alpha >= 0 and self.beta >= 0):
            raise UsageError(f"alpha and beta must be >= 0, got {self.alpha!r}, {self.beta!r}")

    def time(self, nbytes: float) -> float:
        return self.alpha + self.beta * nbytes


@dataclass
class Prediction:
    method: str
    iteration_s: float
    groups: list[list[int]]                 # each message's tensors (backward positions)
    message_bytes: list[int]                # each message's bytes
    events: list = field(repr=False)
    metrics: dict = field(repr=False)       # timeline.overlap's means for the iteration
    bottleneck: str = ""
    history: list | None = field(default=None, repr=False)  # every replayed iteration's events

    def throughput(self, batch_size: int, nworkers: int) -> float:
        """Samples per second over all workers."""
        return batch_size * nworkers / self.iteration_s


def _bspa2a(work, link, settings):
    return [list(range(len(work.nbytes)))]


def _wfbp(work, link, settings):
    return [[b] for b in range(len(work.nbytes))]


def _fusion(work, link, settings):
    return plan_buckets(work.nbytes, float(settings.get("threshold", HOROVOD_DEFAULT_THRESHOLD)))


def _ddp(work, link, settings):
    cap_mb = float(settings.get("bucket_cap_mb", DDP_DEFAULT_BUCKET_MB))
    return plan_buckets(work.nbytes, cap_mb * MIB)


def _mgwfbp(work, link, settings):
    return merge_groups(work.backward_s, work.nbytes, link.alpha, link.beta,
                        int(settings.get("min_group_bytes", MGWFBP_MIN_GROUP_BYTES)))


GROUPINGS = {"bspa2a": _bspa2a, "wfbp": _wfbp, "fusion": _fusion, "ddp": _ddp,
             "mgwfbp": _mgwfbp}
METHODS = (*GROUPINGS, "bytescheduler")


def groups_of(method: str, work: Workload, link: Link, **settings) -> list[list[int]]:
    """The messages ``method`` sends per iteration, as groups of backward positions."""
    if method not in GROUPINGS:
        raise UsageError(f"cannot predict method {method!r} yet; modelled: "
                         f"{', '.join(METHODS)}")
    return GROUPINGS[method](work, link, settings)


def replay(work: Workload, link: Link, groups: list[list[int]], channels: int = 1,
           method: str = "groups") -> Prediction:
    """One iteration with ``groups`` sent as messages, in order, each once its last gradient
    is ready, on ``channels`` FIFO threads."""
    if sorted(b for g in groups for b in g) != list(range(len(work.nbytes))):
        raise UsageError("the groups must cover every tensor exactly once")
    us = 1e6
    events = []
    fwd_end = work.forward_s
    ready, t = [], fwd_end
    for tb in work.backward_s:
        t += tb
        ready.append(t)
    bwd_end = t
    free = [0.0] * max(1, channels)
    last_end = bwd_end
    for g in groups:
        nbytes = sum(work.nbytes[b] for b in g)
        start = max(max(ready[b] for b in g), heapq.heappop(free))
        end = start + link.time(nbytes)
        heapq.heappush(free, end)
        last_end = max(last_end, end)
        args = {"bytes": nbytes}
        if work.names is not None:
            args["tensor"] = timeline.tensors_label([work.names[b] for b in g])
        events.append(("allreduce", timeline.COMM, "allreduce", start * us, end * us, args))
    end = last_end + work.optimizer_s
    main = timeline.MAIN
    events += [("iteration", timeline.ITERATION, main, 0.0, end * us, {"index": 0}),
               ("forward", timeline.COMPUTE, main, 0.0, fwd_end * us, None),
               ("backward", timeline.COMPUTE, main, fwd_end * us, bwd_end * us, None),
               ("step", timeline.WAIT, main, bwd_end * us, end * us, None),
               ("optimizer", timeline.COMPUTE, main, last_end * us, end * us, None)]
    metrics = timeline.overlap(events)["mean"]
    return Prediction(method, end, groups, [sum(work.nbytes[b] for b in g) for g in groups],
                      events, metrics, _bottleneck(work, link, len(groups), metrics))


def predict(method: str, work: Workload, link: Link, channels: int = 1,
            **settings) -> Prediction:
    """``method``'s iteration (its settings as the training script names them: ``threshold``
    bytes, ``bucket_cap_mb``, ``min_group_bytes``; ``partition`` and ``credit`` elements)."""
    if method == "bytescheduler":
        return bytescheduler(work, link, int(settings.get("partition", BS_PARTITION)),
                             int(settings.get("credit", BS_CREDIT)), channels)
    return replay(work, link, groups_of(method, work, link, **settings), channels, method)


class _Scheduler:
    """ByteScheduler's side of the replay: chunks queue by priority (front layers first) as
    their tensor's gradient is ready; the dispatcher hands the best to the transport while the
    credit (elements in flight) is positive, subtracting its size; a completed chunk gives its
    size back; when a tensor's chunks are all done the completer thread updates it."""

    def __init__(self, work, link, table, credit, channels, element_bytes, opt_s, names):
        self.work, self.link, self.table = work, link, table
        self.credit, self.element_bytes, self.opt_s, self.names = \
            credit, element_bytes, opt_s, names
        self.free = [0.0] * max(1, channels)
        self.queue: list = []            # (tensor, chunk index, iteration, ready time)
        self.arrivals: list = []         # (ready time, seq, tensor, chunk index, iteration)
        self.inflight: list = []         # (end, seq, size)
        self.left: dict = {}             # (iteration, tensor) -> chunks not yet done
        self.done: dict = {}             # (iteration, tensor) -> when its update ended
        self.completer = 0.0
        self.events: list = []
        self.now = 0.0
        self.seq = 0

    def ready(self, it, tensor, t, chunks):
        self.left[(it, tensor)] = len(chunks)
        for c in chunks:
            self.seq += 1
            heapq.heappush(self.arrivals, (t, self.seq, tensor, c, it))

    def _dispatch(self):
        while self.credit > 0 and self.queue:
            tensor, c, it, ready = heapq.heappop(self.queue)
            _, begin, end = self.table[c]
            size = end - begin
            self.credit -= size
            start = max(self.now, heapq.heappop(self.free))
            finish = start + self.link.time(size * self.element_bytes)
            heapq.heappush(self.free, finish)
            self.seq += 1
            heapq.heappush(self.inflight, (finish, self.seq, size, it, tensor))
            label = f"{self.names[tensor]}[{begin}:{end}]"
            us = 1e6
            self.events.append((label, timeline.QUEUE, "scheduler queue", ready * us,
                                self.now * us, None))
            self.events.append(("allreduce", timeline.COMM, "allreduce", start * us,
                                finish * us, {"bytes": size * self.element_bytes,
                                              "tensor": label}))

    def step(self) -> bool:
        """Process the next arrival or completion; False when there is none."""
        nxt_a = self.arrivals[0][0] if self.arrivals else None
        nxt_c = self.inflight[0][0] if self.inflight else None
        if nxt_a is None and nxt_c is None:
            return False
        if nxt_c is None or (nxt_a is not None and nxt_a <= nxt_c):
            t, _, tensor, c, it = heapq.heappop(self.arrivals)
            self.now = max(self.now, t)
            heapq.heappush(self.queue, (tensor, c, it, t))
        else:
            t, _, size, it, tensor = heapq.heappop(self.inflight)
            self.now = max(self.now, t)
            self.credit += size
            self.left[(it, tensor)] -= 1
            if self.left[(it, tensor)] == 0:
                start = max(t, self.completer)
                self.completer = start + self.opt_s[tensor]
                self.done[(it, tensor)] = self.completer
                us = 1e6
                self.events.append(("optimizer", timeline.COMPUTE, "completer", start * us,
                                    self.completer * us, None))
        self._dispatch()
        return True

    def update_done(self, it, tensor) -> float:
        while (it, tensor) not in self.done:
            if not self.step():
                raise RuntimeError("a tensor's update never came")  # pragma: no cover
        return self.done[(it, tensor)]


def bytescheduler(work: Workload, link: Link, partition: int = None, credit: int = None,
                  channels: int = 1, element_bytes: int = 4, iterations: int = 4) -> Prediction:
    """ByteScheduler (docs/DESIGN.md section 5) in steady state: ``iterations`` iterations
    replayed, the last full one reported (from one forward's start to the next's). Each
    tensor's forward takes a share of ``forward_s`` in proportion to its backward time (the
    profile times the forward as a whole); a module's forward first waits for its tensor's
    update of the previous iteration, which the completer thread applies (a share of
    ``optimizer_s`` in proportion to bytes) once the tensor's chunks are all reduced.
    Rank 0's negotiation is not modelled."""
    partition = BS_PARTITION if partition is None else partition
    credit = BS_CREDIT if credit is None else credit
    if partition <= 0 or credit <= 0:
        raise UsageError(f"partition and credit must be positive elements, got {partition}, "
                         f"{credit}")
    n = len(work.nbytes)
    # forward order (l = 0 next to the input): backward position b is l = n-1-b
    tb = [work.backward_s[n - 1 - l] for l in range(n)]
    nbytes = [work.nbytes[n - 1 - l] for l in range(n)]
    names = ([work.names[n - 1 - l] for l in range(n)] if work.names is not None
             else [f"tensor {l}" for l in range(n)])
    total_tb, total_bytes = sum(tb), sum(nbytes)
    fwd = [work.forward_s * (x / total_tb if total_tb else 1 / n) for x in tb]
    opt = [work.optimizer_s * (x / total_bytes if total_bytes else 1 / n) for x in nbytes]
    table = chunk_table([max(1, -(-x // element_bytes)) for x in nbytes], partition)
    chunks_of: dict = {}
    for c, (l, _, _) in enumerate(table):
        chunks_of.setdefault(l, []).append(c)
    s = _Scheduler(work, link, table, credit, channels, element_bytes, opt, names)
    us, main = 1e6, timeline.MAIN
    t, starts, events = 0.0, [], []
    for it in range(iterations):
        starts.append(t)
        f0 = t
        for l in range(n):
            if it > 0:
                ready = s.update_done(it - 1, l)
                if ready > t:
                    events.append(("forward pre-hook", timeline.WAIT, main, t * us, ready * us,
                                   None))
                    t = ready
            t += fwd[l]
        events.append(("forward", timeline.COMPUTE, main, f0 * us, t * us, None))
        b0 = t
        for l in range(n - 1, -1, -1):
            t += tb[l]
            s.ready(it, l, t, chunks_of[l])
        events.append(("backward", timeline.COMPUTE, main, b0 * us, t * us, None))
    # the last iteration's forward start closes the one before it: run the schedule that far
    for l in range(n):
        s.update_done(iterations - 1, l)
    lo, hi = starts[-2], starts[-1]
    window = [e for e in events + s.events if e[4] is not None and e[4] > lo * us
              and e[3] < hi * us]
    window.append(("iteration", timeline.ITERATION, main, lo * us, hi * us, {"index": 0}))
    metrics = timeline.overlap(window)["mean"]
    # one message per chunk, in priority order
    return Prediction("bytescheduler", hi - lo, [[n - 1 - l] for l, _, _ in table],
                      [(e - b) * element_bytes for _, b, e in table], window, metrics,
                      _bottleneck(work, link, len(table), metrics), events + s.events)


def _bottleneck(work, link, messages: int, m) -> str:
    """What limits the iteration, in words: compute when under a tenth of it is exposed
    communication; else latency or bandwidth, whichever of the messages' start-ups and their
    bytes costs more."""
    if m["exposed_s"] < 0.1 * m["iteration_s"]:
        return "compute-bound"
    startups = link.alpha * messages
    transfer = link.beta * sum(work.nbytes)
    return "latency-bound" if startups > transfer else "bandwidth-bound"


def trace(prediction: Prediction, meta: dict | None = None) -> dict:
    """The prediction as a trace file's object (one rank, on its own clock)."""
    return timeline.trace([{"rank": 0, "events": prediction.events, "offset_us": 0.0,
                            "uncertainty_us": 0.0, "name": f"{prediction.method} (predicted)"}],
                          {"predicted": True, "method": prediction.method, **(meta or {})})

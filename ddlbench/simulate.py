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
optimizer_s`` (the section 3 recurrences). ByteScheduler, the parameter-server methods and the
compressors are not modelled yet.
"""
from __future__ import annotations

import heapq
from dataclasses import dataclass, field

from . import timeline
from .errors import UsageError
from .planning import merge_groups, plan_buckets

MIB = 1024 * 1024
DDP_BUCKET_MB = 25.0        # torch DDP's bucket_cap_mb default
FUSION_THRESHOLD = 64 * MIB  # Horovod's HOROVOD_FUSION_THRESHOLD default, the suite's fusion's
MGWFBP_MIN_GROUP_BYTES = 8192 * 4  # the original's 8192 fp32 elements


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
    groups: list[list[int]]
    events: list = field(repr=False)
    metrics: dict = field(repr=False)       # timeline.overlap's means for the iteration
    bottleneck: str = ""

    def throughput(self, batch_size: int, nworkers: int) -> float:
        """Samples per second over all workers."""
        return batch_size * nworkers / self.iteration_s


def _bspa2a(work, link, settings):
    return [list(range(len(work.nbytes)))]


def _wfbp(work, link, settings):
    return [[b] for b in range(len(work.nbytes))]


def _fusion(work, link, settings):
    return plan_buckets(work.nbytes, float(settings.get("threshold", FUSION_THRESHOLD)))


def _ddp(work, link, settings):
    return plan_buckets(work.nbytes, float(settings.get("bucket_cap_mb", DDP_BUCKET_MB)) * MIB)


def _mgwfbp(work, link, settings):
    return merge_groups(work.backward_s, work.nbytes, link.alpha, link.beta,
                        int(settings.get("min_group_bytes", MGWFBP_MIN_GROUP_BYTES)))


GROUPINGS = {"bspa2a": _bspa2a, "wfbp": _wfbp, "fusion": _fusion, "ddp": _ddp,
             "mgwfbp": _mgwfbp}


def groups_of(method: str, work: Workload, link: Link, **settings) -> list[list[int]]:
    """The messages ``method`` sends per iteration, as groups of backward positions."""
    if method not in GROUPINGS:
        raise UsageError(f"cannot predict method {method!r} yet; modelled: "
                         f"{', '.join(GROUPINGS)}")
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
            names = [work.names[b] for b in g]
            args["tensor"] = names[0] if len(names) == 1 else \
                f"{names[0]} .. {names[-1]} ({len(names)} tensors)"
        events.append(("allreduce", timeline.COMM, "allreduce", start * us, end * us, args))
    end = last_end + work.optimizer_s
    main = timeline.MAIN
    events += [("iteration", timeline.ITERATION, main, 0.0, end * us, {"index": 0}),
               ("forward", timeline.COMPUTE, main, 0.0, fwd_end * us, None),
               ("backward", timeline.COMPUTE, main, fwd_end * us, bwd_end * us, None),
               ("step", timeline.WAIT, main, bwd_end * us, end * us, None),
               ("optimizer", timeline.COMPUTE, main, last_end * us, end * us, None)]
    metrics = timeline.overlap(events)["mean"]
    return Prediction(method, end, groups, events, metrics,
                      _bottleneck(work, link, groups, metrics))


def predict(method: str, work: Workload, link: Link, channels: int = 1,
            **settings) -> Prediction:
    """``method``'s iteration (its settings as the training script names them: ``threshold``
    bytes, ``bucket_cap_mb``, ``min_group_bytes``)."""
    return replay(work, link, groups_of(method, work, link, **settings), channels, method)


def _bottleneck(work, link, groups, m) -> str:
    """What limits the iteration, in words: compute when under a tenth of it is exposed
    communication; else latency or bandwidth, whichever of the messages' start-ups and their
    bytes costs more."""
    if m["exposed_s"] < 0.1 * m["iteration_s"]:
        return "compute-bound"
    startups = link.alpha * len(groups)
    transfer = link.beta * sum(work.nbytes)
    return "latency-bound" if startups > transfer else "bandwidth-bound"


def trace(prediction: Prediction, meta: dict | None = None) -> dict:
    """The prediction as a trace file's object (one rank, on its own clock)."""
    return timeline.trace([{"rank": 0, "events": prediction.events, "offset_us": 0.0,
                            "uncertainty_us": 0.0, "name": f"{prediction.method} (predicted)"}],
                          {"predicted": True, "method": prediction.method, **(meta or {})})

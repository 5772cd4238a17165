"""The performance model's replay: one steady-state training iteration of an all-reduce
method, event by event, from a compute profile and a per-message network model
(docs/DESIGN.md section 3). Pure: no torch, no job.

**Inputs.** ``Compute``: the forward time, each gradient tensor's backward time (the gap since
the previous gradient was ready) and bytes, in backward order (as the profiler's JSON holds
them), the optimizer's step and optionally each tensor's share of the forward (ByteScheduler's
replay). ``Link``: one all-reduce message of M bytes among the run's P workers costs ``alpha +
beta * M`` (``comm_bench``'s per-P fit, the form MG-WFBP plans with).

**Replay.** One compute stream runs forward, then backward, producing gradient b at
``forward_s + sum(backward_s[:b+1])``; the method's messages (``groups``: consecutive backward
positions) each leave once their last gradient is ready, on ``channels`` FIFO communication
threads (1: the cost model's one stream); the optimizer steps once every message is done. The
events are the timeline's (``ddlbench.timeline``): an iteration, forward and backward and the
optimizer as compute, the method's ``step`` as a wait, each message a ``comm`` span with its
bytes and tensors, so ``timeline.overlap`` gives the predicted metrics and ``timeline.trace``
a trace that ``python -m ddlbench.timeline`` reads beside a measured one.

**Methods**: each method's class declares its rule (``Method.rule``, a
``ddlbench.methods.rules.Rule``) and the replay reads it from the registry (``method_class``),
naming no method itself; the rule reads the method's resolved options (``options_for``: an
instance of its ``Options``, the defaults with the values given). A rule with a grouping sends
those messages (``rules.one_message`` after the backward, BSP; ``rules.per_tensor``;
``rules.fused``, buckets of at most the method's ``fusion_threshold`` bytes, as the methods
pack them; ``rules.ddp``, DDP's rebuilt buckets in gradient order, the first 1 MiB at the
default cap, its first-iteration order ignored; ``rules.merged``, the suite's own
``planning.merge_groups`` on the same inputs). With one channel the iteration is exactly
``forward_s + planning.schedule_time(...) + optimizer_s`` (the section 3 recurrences). A rule
with ``scheduler`` replays ByteScheduler (``bytescheduler()``): several iterations in steady
state, chunks, priority, credit, per-tensor updates on a completer thread and the next forward
waiting per module; with ``Compute.launch`` on the worker's host and device, as every schedule
(``_ByteSchedulerRun``).

**Compressors** (``Codec``): a message's collectives are what the compressor declares it hands
over (``compression.Compressor.sends_for``: all-reduces on the message link, all-gathers on the
all-gather link);
its encode and decode where the method calls it (``_HostWork``): the bucketed methods' gradient
hooks hand a group to their communication thread, which encodes and issues it (an ``issue`` row;
BSP's step does it on the training thread), and the step decodes on the training thread; DDP
and ByteScheduler run theirs on the channel (their own threads). What the compressor issues
only inside ``wait()``
(PowerSGD's Q all-reduce and the encode before it, ``Codec.phases``) the bucketed methods do in
the step, message by message; DDP's and ByteScheduler's threads right after the P.

**Parameter servers** (``ServerLinks``; the methods of architecture ``ps``): units
(fusion by ``threshold``) cut into ``partition_bytes`` partitions, keys numbered as the
method numbers them (``key_order``) and placed as its ``--ps-placement`` says (least-loaded by
bytes in key order, or key mod S; ``planning.Placer``, the engine's own); each partition's
push holds the pusher's uplink and its server's downlink (all pushers' copies), its pull the
reverse (``_PushPull``), so partitions pipeline and a server shared by n
pushers costs n times its bytes (incast); ByteScheduler-PS's credit returns when a chunk is
pushed. Not modelled: the servers' summing time, server-side priority.

**The methods' own work** (``Compute.host``, the profiler's ``host``: seconds per byte of a
copy and of an in-place divide; ``_HostWork``), as the implementations do it: the bucketed
methods keep each bucket's gradients as views into its flat buffer (no pack, no unpack); the
all-reduce ones average in the collective (``ReduceOp.AVG``: a divide on the message's channel
after the sum), the PS ones divide each unit in the step, once pulled, on the training thread
(without a compressor, more than one worker); DDP copies into its buckets and divides before
each all-reduce and copies back once all are done; ByteScheduler's completer divides each
tensor before its update. Each piece is a ``codec``
span on the training thread, named for what it does: inside the backward when a hook does it
(compute there), inside the step otherwise (exposed, as the run's timeline has its divide).
The bucketed all-reduce methods also spend ``Host.issue_s`` there on each collective they start
(an ``issue`` span after the pack and encode, before the message; docs/DESIGN.md section 3).

**CPU interference** (``Compute.compute_slowdown`` kappa and ``comm_slowdown`` mu, the
profiler's ``interference``): one event simulator (``_CoSim``) runs every schedule, a worker's
host and device (``_Schedule``; one thread on a CPU) and ByteScheduler's threads
(``_ByteSchedulerRun``; with a launch the device too), at
piecewise-constant rates: compute (the training thread's forward, backward and optimizer;
ByteScheduler's completer's updates) progresses at ``1 / (1 + kappa)`` while any
communication is in flight, communication (a channel's collectives, encode and decode; a
push or pull) at ``1 / (1 + mu)`` while anything computes. Interference is a parameter of the
simulator: with both 0 the schedule is the section 3 recurrences (tests/model_reference.py writes
them again, and tests/test_simulate.py holds the simulator to them).
"""
from __future__ import annotations

import bisect
import heapq
import itertools
import math
from dataclasses import dataclass, field, replace
from functools import cached_property
from typing import Callable

import compression

from .. import timeline
from ..errors import UsageError
from ..planning import BYTESCHEDULER_CREDIT as BS_CREDIT
from ..planning import BYTESCHEDULER_PARTITION as BS_PARTITION
from ..planning import DEFAULT_PARTITION_BYTES, DEFAULT_PS_PLACEMENT, Placer, chunk_table
from ..methods.rules import MIB, Rule  # noqa: F401 (the model's names)


@dataclass(frozen=True)
class Host:
    """What a method's own handling of the gradients costs the training thread (docs/DESIGN.md
    section 3; the profiler's ``host``): seconds per byte to copy gradients into or out of a
    flat buffer (a bucket's pack and unpack, DDP's copies in and out of its buckets) and to
    divide a summed gradient by the number of workers in place, and seconds to issue one
    collective (``issue_s``: the suite's counted call and the process group's enqueue, what a
    bucketed all-reduce method's hook or step spends per collective it starts), and seconds
    per byte of an outer optimizer's step (``outer_step_s_per_byte``: DiLoCo's Nesterov SGD
    over the parameters). Zero: free (a profile that did not measure them)."""
    copy_s_per_byte: float = 0.0
    divide_s_per_byte: float = 0.0
    issue_s: float = 0.0
    outer_step_s_per_byte: float = 0.0

    def __post_init__(self):
        if not all(0 <= x < float("inf") for x in (self.copy_s_per_byte,
                                                     self.divide_s_per_byte, self.issue_s)):
            raise UsageError(f"host copy, divide and issue times must be finite and >= 0, got "
                             f"{self.copy_s_per_byte!r}, {self.divide_s_per_byte!r} and "
                             f"{self.issue_s!r}")
        if not 0 <= self.outer_step_s_per_byte < float("inf"):
            raise UsageError(f"an outer step's time per byte must be finite and >= 0, got "
                             f"{self.outer_step_s_per_byte!r}")


NO_HOST = Host()
ISSUER_ROW = "issue"  # the timeline row of a method's communication thread (threads.Issuer)
DEVICE_ROW = "device"  # the device's compute, where it is a resource of its own (Launch)


@dataclass(frozen=True)
class Launch:
    """The host's side of a step on an accelerator (the profile's ``launch``): the training
    thread's seconds to launch the forward, each gradient tensor's share of the backward (in
    ``Compute``'s backward order: the gap between its gradient hook and the previous one's,
    the device not synchronised) and the optimizer's step. With it the replay has two
    resources per worker, host and device (``_Schedule``); without it (a CPU, where the
    training thread does the compute itself) one. ``hook_s``: what a bucketed method's
    gradient hook costs the training thread per gradient (count it, hand a complete bucket
    to the communication thread), measured inside a backward."""
    forward_s: float
    backward_s: list[float]
    optimizer_s: float = 0.0
    hook_s: float = 0.0

    def __post_init__(self):
        if not all(0 <= x < float("inf")
                   for x in (self.forward_s, self.optimizer_s, self.hook_s, *self.backward_s)):
            raise UsageError("the launch times must be finite and >= 0")


@dataclass(frozen=True)
class Compute:
    """One rank's compute per iteration, from a profile; lists in backward order. (Was
    ``Workload``: ``models.Workload`` is the thing that trains, this what it costs.)"""
    forward_s: float
    backward_s: list[float]
    nbytes: list[int]
    optimizer_s: float = 0.0
    names: list[str] | None = None
    shapes: list[tuple[int, ...]] | None = None     # each tensor's (compressors need them)
    # CPU interference (docs/DESIGN.md section 3): compute takes (1 + compute_slowdown) times
    # as long while communication is in flight, communication (1 + comm_slowdown) times as
    # long while compute runs (the profiler's ``interference``)
    compute_slowdown: float = 0.0
    comm_slowdown: float = 0.0
    # each tensor's share of forward_s (the profiler's forward_tensor_s: its modules' own time
    # and what ran since the previous one), same order; ByteScheduler's replay shares the
    # forward with it. None: the profile timed the forward only as a whole
    forward_tensor_s: list[float] | None = None
    host: Host = NO_HOST
    launch: Launch | None = None     # the host's side of an accelerator's step (Launch)

    def __post_init__(self):
        if len(self.backward_s) != len(self.nbytes) or not self.nbytes:
            raise UsageError(f"a profile needs one backward time per tensor: "
                             f"{len(self.backward_s)} times for {len(self.nbytes)} tensors")
        if self.names is not None and len(self.names) != len(self.nbytes):
            raise UsageError(f"{len(self.names)} names for {len(self.nbytes)} tensors")
        if self.shapes is not None and len(self.shapes) != len(self.nbytes):
            raise UsageError(f"{len(self.shapes)} shapes for {len(self.nbytes)} tensors")
        bad = [x for x in (self.forward_s, self.optimizer_s, *self.backward_s, *self.nbytes)
               if not x >= 0]
        if bad:
            raise UsageError(f"times and sizes must be finite and >= 0, got {bad[0]!r}")
        if not all(0 <= x < float("inf") for x in (self.compute_slowdown, self.comm_slowdown)):
            raise UsageError(f"the interference slowdowns must be finite and >= 0, got "
                             f"{self.compute_slowdown!r} and {self.comm_slowdown!r}")
        f = self.forward_tensor_s
        if f is not None and (len(f) != len(self.nbytes)
                              or not all(0 <= x < float("inf") for x in f)
                              or not sum(f) <= self.forward_s + 1e-9):
            raise UsageError(f"forward_tensor_s needs one finite time >= 0 per tensor "
                             f"({len(self.nbytes)}), summing to at most forward_s "
                             f"({self.forward_s!r})")
        if self.launch is not None and len(self.launch.backward_s) != len(self.nbytes):
            raise UsageError(f"the launch times need one backward time per tensor: "
                             f"{len(self.launch.backward_s)} for {len(self.nbytes)} tensors")

    @property
    def compute_s(self) -> float:
        return self.forward_s + sum(self.backward_s) + self.optimizer_s

    @property
    def interferes(self) -> bool:
        return bool(self.compute_slowdown or self.comm_slowdown)


@dataclass(frozen=True)
class Link:
    """One message of M bytes costs ``alpha + beta * M`` seconds; with ``points`` (measured
    ``(bytes, seconds)``: comm_bench's rows, sizes increasing, times not decreasing) it costs
    the measured times instead, linearly interpolated between the points, from ``(0,
    min(alpha, first time))`` below the first and the last time plus ``beta`` a byte beyond
    the last. ``alpha`` and ``beta`` stay the line MG-WFBP plans with.

    ``per_message_s`` is added to every message (what a model's sequence of mixed sizes costs
    beyond the per-size times, each size measured on its own), ``queued_s`` to a message that
    waits behind another on its channel (what a burst of messages started at once costs
    beyond the same messages one at a time); either may be negative, a message never costs
    less than nothing. Both come from ``comm_bench --ops burst`` (``topology.Measured``)."""
    alpha: float
    beta: float
    points: tuple[tuple[float, float], ...] | None = None
    per_message_s: float = 0.0
    queued_s: float = 0.0

    def __post_init__(self):
        if not (self.alpha >= 0 and self.beta >= 0):
            raise UsageError(f"alpha and beta must be >= 0, got {self.alpha!r}, {self.beta!r}")
        if not (math.isfinite(self.per_message_s) and math.isfinite(self.queued_s)):
            raise UsageError(f"a link's per-message and queueing costs must be finite, got "
                             f"{self.per_message_s!r}, {self.queued_s!r}")
        pts = self.points
        if pts is not None and not (
                pts and all(0 < s < float("inf") and 0 <= t < float("inf") for s, t in pts)
                and all(a[0] < b[0] and a[1] <= b[1] for a, b in zip(pts, pts[1:]))):
            raise UsageError("a link's measured points need sizes > 0, increasing, and times "
                             ">= 0, not decreasing")

    def time(self, nbytes: float, queued: bool = False) -> float:
        """One message of ``nbytes``; ``queued``: it waited behind another."""
        extra = self.per_message_s + (self.queued_s if queued else 0.0)
        return max(0.0, self.measured(nbytes) + extra) if extra else self.measured(nbytes)

    def measured(self, nbytes: float) -> float:
        """The per-size time alone: the line, or the measured points."""
        pts = self.points
        if pts is None:
            return self.alpha + self.beta * nbytes
        if nbytes >= pts[-1][0]:
            return pts[-1][1] + self.beta * (nbytes - pts[-1][0])
        i = bisect.bisect_right(pts, nbytes, key=lambda p: p[0])
        (s0, t0), (s1, t1) = (pts[i - 1] if i else (0.0, min(self.alpha, pts[0][1]))), pts[i]
        return t0 + (t1 - t0) * (nbytes - s0) / (s1 - s0)


@dataclass(frozen=True)
class ServerLinks:
    """Push and pull through parameter servers (docs/DESIGN.md section 6): ``pushers`` clients
    (workers, or machines under one client per machine) each push every partition to its
    server and pull the sum back; partitions are placed on ``nservers`` servers by the
    method's placement (``_PushPull``). A push
    of m bytes occupies its pusher's uplink ``worker_beta * m`` and its server's downlink
    ``server_beta * m`` for each of the ``pushers`` copies; a pull the reverse; each costs
    ``alpha`` on top. From a comm_bench push/pull fit (``alpha_f + beta_f * M`` for push and
    pull of M bytes, incast included): ``alpha = alpha_f / 2``, ``worker_beta = beta_f / 2``,
    ``server_beta = 0``.

    ``queued_s_per_byte``: what a partition whose push waits behind another's on its pusher's
    uplink costs there beyond ``worker_beta``, per byte (the push/pull of a message of several
    partitions, all in flight, beyond the pipeline of its one-partition times: on one 2-core
    machine the pushes, pulls and sums share the cores and hardly pipeline; from comm_bench's
    rows beyond one partition, ``topology.Measured``). Never negative: the pipeline already
    overlaps every push with the pull before it, the fastest the links allow."""
    alpha: float
    worker_beta: float
    server_beta: float
    nservers: int = 1
    pushers: int = 1
    queued_s_per_byte: float = 0.0

    def __post_init__(self):
        if not (self.alpha >= 0 and self.worker_beta >= 0 and self.server_beta >= 0):
            raise UsageError("push/pull alpha and betas must be >= 0")
        if not 0 <= self.queued_s_per_byte < math.inf:
            raise UsageError(f"a push's queueing cost must be a number >= 0, got "
                             f"{self.queued_s_per_byte!r}")
        if self.nservers < 1 or self.pushers < 1:
            raise UsageError(f"need at least one server and one pusher, got {self.nservers} "
                             f"and {self.pushers}")

    def stage(self, nbytes: float) -> float:
        """One push (or pull) of ``nbytes`` with nothing else on the links."""
        return self.alpha + max(self.worker_beta * nbytes,
                                self.server_beta * nbytes * self.pushers)

    def message(self, nbytes: int, partition_bytes: int) -> float:
        """One message of ``nbytes`` cut into ``partition_bytes`` partitions, all pushed at
        once and pulled back, alone on the links: when its last pull is done (``_PushPull``)."""
        pp = _PushPull(self, partition_bytes, None)
        return pp.send(0.0, pp.parts(int(nbytes), 0), None)[1]


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


@dataclass(frozen=True)
class Codec:
    """A compressor's side of each message (docs/DESIGN.md section 7): the collectives it
    declares for a bucket (``compression.Compressor.sends_for``, with its resolved
    ``options``: all-reduces on the message ``Link``, all-gathers on ``allgather``, costed by
    their gathered bytes) and its encode and decode time per dense element it declares
    (``codec_bench --output``): on the training thread for the bucketed
    methods (``_HostWork``: encoded when handed over, decoded in the step), on the message's
    channel before and after its collectives for DDP (a thread of its own) and ByteScheduler
    (its dispatcher and completer). ``encode_at_wait_s_per_element``: the part of the encode
    the compressor does only when the bucket is waited for, before the collectives it then
    issues (``phases``; PowerSGD's Q), from codec_bench. ``options``: the compressor's
    ``Options``, or a mapping of option values (others' ignored) or None (its defaults), which
    are resolved to them."""
    compressor: str = "none"
    nworkers: int = 1
    options: object = None
    encode_s_per_element: float = 0.0
    decode_s_per_element: float = 0.0
    allgather: Link | None = None
    encode_at_wait_s_per_element: float = 0.0   # of the encode, what is done when waited for

    def __post_init__(self):
        if self.nworkers < 1:
            raise UsageError(f"a codec needs at least one worker, got {self.nworkers}")
        if not (self.encode_s_per_element >= 0 and self.decode_s_per_element >= 0):
            raise UsageError("encode and decode times must be >= 0")
        if not 0 <= self.encode_at_wait_s_per_element <= self.encode_s_per_element:
            raise UsageError(f"the encode done when waited for must be >= 0 and at most the "
                             f"whole encode, got {self.encode_at_wait_s_per_element!r} of "
                             f"{self.encode_s_per_element!r} s per element")
        object.__setattr__(self, "options", self._declarer.options)

    @cached_property
    def _declarer(self):
        """The compressor with its options, for its declaration (an unknown id: one line)."""
        return compression.declared(self.compressor, self.options)

    @property
    def gathers(self) -> bool:
        """Whether the compressor may all-gather (the network model must give that link)."""
        return compression.ALLGATHER in self._declarer.issues

    def sends(self, shapes) -> compression.Sends:
        """What the compressor declares for a bucket of ``shapes`` (fp32 gradients)."""
        return self._declarer.sends_for(shapes, self.nworkers, GRADIENT_BYTES)

    def elements(self, shapes) -> int:
        """The dense elements its encode and decode pass over for a bucket of ``shapes``."""
        return self.sends(shapes).codec_elements

    def collectives(self, shapes: list[tuple[int, ...]]) -> list[tuple[str, int]]:
        ops = list(self.sends(shapes).collectives)
        for op, _ in ops:
            if op not in (compression.ALLREDUCE, compression.ALLGATHER):
                raise UsageError(f"compressor {self.compressor} declares a collective {op!r}: "
                                 f"the model prices all-reduces and all-gathers")
        if self.allgather is None and any(op == compression.ALLGATHER for op, _ in ops):
            raise UsageError(f"compressor {self.compressor} all-gathers: the network model "
                             f"must give an all-gather link")
        return ops

    def phases(self, shapes) -> tuple[list[tuple[str, int]], list[tuple[str, int]]]:
        """``collectives(shapes)`` as (issued when the bucket is handed over, issued when it
        is waited for: the declaration's ``at_wait``, PowerSGD's Q)."""
        ops = self.collectives(shapes)
        late = self.sends(shapes).at_wait
        return ops[:len(ops) - late], ops[len(ops) - late:]


NO_CODEC = Codec()


GRADIENT_BYTES = 4   # the model's gradients are fp32


def _numel(shape) -> int:
    n = 1
    for d in shape:
        n *= int(d)
    return n


def _shapes(work: Compute, b: int) -> list[tuple[int, ...]]:
    if work.shapes is not None:
        return [tuple(work.shapes[b])]
    return [(max(1, work.nbytes[b] // 4),)]


# --------------------------------------------------------------------------- the transports

class _AllReduce:
    """Messages on ``channels`` FIFO threads: each waits for a free channel, then encodes,
    runs its collectives one after another, and decodes. A message that had to wait (its
    channel busy when it was handed over) costs the link's ``queued_s`` more a collective.
    ``defer``: the collectives a compressor issues only when the bucket is waited for
    (``Codec.phases``) are left out of ``send`` and sent by ``send_late`` (the bucketed
    methods wait on the training thread, in the step); without, they follow the others (DDP's
    and ByteScheduler's threads wait right after starting). ``steps``: the method's declared
    exchange (``Rule.exchange``), each (collective, share of the message, its group's
    ``Link``, optionally the share of its size ``Comm`` counts: an all-gather's 1/s, what
    this worker contributes), run instead of the compressor's collectives; their payload is
    what ``Comm`` counts. ``divide_share``: the share of a message divided after its
    collectives (``Rule.divide_shard``'s 1/s). ``pipelined`` (``Rule.pipelined``): each step
    of ``steps`` is a FIFO of its own, which a message enters when its previous step is done
    and the step is free of the message before it; the channel is free once its first step
    is done."""

    def __init__(self, link: Link, codec: Codec, channels: int, defer: bool = False,
                 average_s_per_byte: float = 0.0, steps: tuple = (), gather: tuple = (),
                 divide_share: float = 1.0, pipelined: bool = False):
        self.link, self.codec, self.defer, self.steps = link, codec, defer, tuple(steps)
        self.stages = [0.0] * len(self.steps) if pipelined and self.steps else None
        self.gather_steps = tuple(gather)
        self.average = average_s_per_byte  # the all-reduce's own division (ReduceOp.AVG)
        self.divide_share = divide_share
        self.free = [(0.0, i) for i in range(max(1, channels))]
        self.events: list = []

    def send_late(self, ready: float, shapes, label: str | None) -> tuple[float, int] | None:
        """A message's collectives issued when it is waited for, on the first free channel
        (behind everything handed over before): (done, payload bytes); None when it has none
        (or the transport does not defer them)."""
        late = self.codec.phases(shapes)[1] if self.defer else []
        if not late:
            return None
        free, lane = heapq.heappop(self.free)
        t, payload = self._run(late, max(ready, free), free > ready, lane, label)
        heapq.heappush(self.free, (t, lane))
        return t, payload

    def gather(self, ready: float, nbytes: int, label: str | None) -> tuple[float, int]:
        """A message's collectives after the optimizer (``Rule.gather``: the all-gather of its
        updated shards), on the first free channel: (done, payload bytes)."""
        free, lane = heapq.heappop(self.free)
        ops = [(op, nbytes * share, *given) for op, share, *given in self.gather_steps]
        t, payload = self._run(ops, max(ready, free), free > ready, lane, label)
        heapq.heappush(self.free, (t, lane))
        return t, payload

    def _run(self, ops, t: float, queued: bool, lane: int, label,
             stages: list | None = None) -> tuple[float, int]:
        """Run ``ops`` one after another on channel ``lane`` from ``t``: (end, payload);
        ``stages``: op k also waits for the FIFO of step k, and holds it until it is done."""
        row = "allreduce" if lane == 0 else f"allreduce {lane + 1}"
        tensor = {"tensor": label} if label is not None else {}
        payload = 0
        for k, (op, size, *given) in enumerate(ops):
            link = given[0] if given else (self.codec.allgather if op == "allgather"
                                           else self.link)
            if stages is not None:
                queued, t = stages[k] > t, max(t, stages[k])
                row = f"{op} stage {k + 1}"
            end = t + link.time(size, queued)
            if stages is not None:
                stages[k] = end
            self.events.append((op, timeline.COMM, row, t * 1e6, end * 1e6,
                                {"bytes": size, **tensor}))
            payload += size * (given[1] if len(given) > 1 else 1)
            t = end
        return t, payload

    def send(self, ready: float, shapes, label: str | None) -> tuple[float, float, int]:
        """(when the transport has taken it, when it is done, payload bytes)."""
        free, lane = heapq.heappop(self.free)
        row = "allreduce" if lane == 0 else f"allreduce {lane + 1}"
        t = max(ready, free)
        queued = free > ready
        elements = self.codec.elements(shapes)
        us = 1e6
        tensor = {"tensor": label} if label is not None else {}
        enc = self.codec.encode_s_per_element * elements
        if enc:
            self.events.append(("encode", timeline.CODEC, row, t * us, (t + enc) * us,
                                {"elements": elements, **tensor}))
            t += enc
        early, late = self.codec.phases(shapes)
        divided = sum(size for _, size in early + late) * self.divide_share
        if self.steps:   # (a dense message: its one all-reduce's bytes)
            nbytes = sum(size for _, size in early + late)
            early, late = [(op, nbytes * share, *given) for op, share, *given in self.steps], []
        t, payload = self._run(early if self.defer else early + late, t, queued, lane, label,
                               self.stages)
        free = None if self.stages is None else self.stages[0]   # (its first step done)
        if self.average:
            avg = self.average * divided
            self.events.append(("average", timeline.CODEC, row, t * us, (t + avg) * us,
                                {"bytes": divided, **tensor}))
            t += avg
        dec = self.codec.decode_s_per_element * elements
        if dec:
            self.events.append(("decode", timeline.CODEC, row, t * us, (t + dec) * us,
                                {"elements": elements, **tensor}))
            t += dec
        heapq.heappush(self.free, (t if free is None else free, lane))
        return t, t, payload


class _PushPull:
    """Push and pull through parameter servers (``ServerLinks``). Per partition of m bytes on
    its server s (``placement``: ``planning.Placer``, keys placed as ``declare`` gives them,
    else at their first push): the push holds the pusher's uplink ``worker_beta * m`` (in push
    order) and server s's downlink ``server_beta * m * pushers`` (every pusher's copy), then
    costs ``alpha``; the pull then holds s's uplink and the pusher's downlink likewise. Under
    one client per machine, ``local`` (``topology.local_reduce``) is one way through the
    leader's intra-node link with its local workers' copies: a partition crosses it inward
    before its push (the copies in, for the local sum) and outward after its pull (the total
    back), each direction a FIFO of its own. Pushes, sums and pulls of different partitions
    overlap as the links allow, so a large message costs ``max(M * worker_beta, M * pushers *
    server_beta / k, M * local beta)`` per direction (docs/DESIGN.md section 3); a push that
    waits behind another's for the uplink holds it ``queued_s_per_byte * m`` longer. Servers
    sum in arrival order (FIFO); their summing time and server-side priority scheduling are
    not modelled."""

    def __init__(self, servers: ServerLinks, partition_bytes: int, local: Link | None,
                 placement: str = DEFAULT_PS_PLACEMENT):
        if partition_bytes <= 0:
            raise UsageError(f"partition bytes must be positive, got {partition_bytes}")
        self.s, self.partition, self.local = servers, int(partition_bytes), local
        self.placer = Placer(servers.nservers, placement)
        self.up = self.down = 0.0
        self.last_push = -math.inf             # when the last push took the uplink
        self.sdown = [0.0] * servers.nservers
        self.sup = [0.0] * servers.nservers
        self.leader = {"in": 0.0, "out": 0.0}  # when the leader's intra-node link is free
        self.events: list = []

    def _local(self, way: str, t: float, m: int) -> float:
        """When partition ``m`` has crossed the leader's intra-node link ``way`` ("in": the
        local workers' copies, "out": the total back to them) from ``t``: the link is busy
        ``local.time(m) - alpha`` per partition, in order, then ``alpha``."""
        if self.local is None:
            return t
        busy = max(0.0, self.local.time(m) - self.local.alpha)
        self.leader[way] = max(t, self.leader[way]) + busy
        return self.leader[way] + self.local.alpha

    def declare(self, parts) -> None:
        """Place the (key, bytes) ``parts`` in this order (the engine's key order)."""
        for key, m in parts:
            self.placer.server(key, m)

    def parts(self, nbytes: int, first_key: int) -> list[tuple[int, int]]:
        """(key, bytes) of a unit of ``nbytes`` cut into partitions, keys from ``first_key``."""
        out, off, key = [], 0, first_key
        while off < nbytes or not out:
            m = min(self.partition, nbytes - off)
            out.append((key, m))
            off += m
            key += 1
        return out

    def send(self, ready: float, parts, label: str | None) -> tuple[float, float, int]:
        s, us = self.s, 1e6
        taken = done = ready
        tensor = {"tensor": label} if label is not None else {}
        for key, m in parts:
            srv = self.placer.server(key, m)
            t0 = self._local("in", ready, m)          # the machine's workers hand it in
            up0 = max(t0, self.up)
            behind = self.up > t0 or self.last_push >= t0   # waits behind another's push
            self.last_push = up0
            self.up = up0 + s.worker_beta * m + (s.queued_s_per_byte * m if behind else 0.0)
            sd0 = max(up0, self.sdown[srv])
            self.sdown[srv] = sd0 + s.server_beta * m * s.pushers
            pushed = max(self.up, self.sdown[srv]) + s.alpha
            su0 = max(pushed, self.sup[srv])
            self.sup[srv] = su0 + s.server_beta * m * s.pushers
            dn0 = max(su0, self.down)
            self.down = dn0 + s.worker_beta * m
            pulled = max(self.sup[srv], self.down) + s.alpha
            end = self._local("out", pulled, m)       # and get the total back
            args = {"bytes": m, "key": key, "server": srv, **tensor}
            self.events.append(("push", timeline.COMM, "push", up0 * us, pushed * us, args))
            self.events.append(("pull", timeline.COMM, "pull", su0 * us, end * us, dict(args)))
            taken, done = max(taken, pushed), max(done, end)
        return taken, done, sum(m for _, m in parts)


# --------------------------------------------------------------------------- CPU interference

COMPUTE, WAIT = "compute", "wait"        # what a _CoSim thread yields


class _CoSim:
    """Compute and communication sharing the CPU (docs/DESIGN.md section 3), with
    piecewise-constant rates: compute progresses at ``1 / (1 + kappa)`` while any communication
    is in flight, communication at ``1 / (1 + mu)`` while any compute thread is busy.

    *Communication* all slows alike, so it runs on a clock of its own, ``v``, advancing at its
    rate: a transport handed a message at ``v`` schedules it in ``v`` exactly as it would
    without interference, ``sent(v_done)`` says when it will be done, ``at(v, callback)``
    registers an event there, and ``real(v)`` maps its times back to wall time. It is in flight
    while ``v`` is short of the latest ``v_done`` (a message waits in a transport only while
    others run).

    *Compute* runs on threads: generators yielding ``(COMPUTE, seconds)`` (work at full speed)
    or ``(WAIT, key)`` (until ``signal(key)``). ``run()`` advances wall time ``t`` from event
    to event (a thread's work done, a communication event, the last message done), each
    step at the rates of its start."""

    def __init__(self, kappa: float, mu: float):
        self.kappa, self.mu = kappa, mu
        self.t = self.v = 0.0
        self.comm_until = 0.0           # v when everything handed over is done
        self.left: dict = {}            # computing thread -> work left (seconds at full speed)
        self.threads: dict = {}         # thread -> its generator
        self.waiting: dict = {}         # key -> threads waiting for it
        self.signals: set = set()
        self.events: list = []          # heap (v, seq, callback)
        self.seq = 0
        self.knots_t, self.knots_v = [0.0], [0.0]     # (t, v) at each step

    def spawn(self, name: str, thread) -> None:
        self.threads[name] = thread
        self._resume(name)

    def _resume(self, name: str) -> None:
        while True:
            try:
                kind, arg = next(self.threads[name])
            except StopIteration:
                del self.threads[name]
                return
            if kind == COMPUTE:
                if arg > 0:
                    self.left[name] = arg
                    return
            elif arg not in self.signals:
                self.waiting.setdefault(arg, []).append(name)
                return

    def signal(self, key) -> None:
        self.signals.add(key)
        for name in self.waiting.pop(key, []):
            self._resume(name)

    def sent(self, v_done: float) -> None:
        self.comm_until = max(self.comm_until, v_done)

    def at(self, v: float, callback) -> None:
        self.seq += 1
        heapq.heappush(self.events, (v, self.seq, callback))

    def drained(self):
        """``yield from`` it in a thread: wait until everything handed over is done."""
        if self.v < self.comm_until:
            key = ("drained", self.comm_until)
            self.at(self.comm_until, lambda: self.signal(key))
            yield WAIT, key

    def run(self) -> None:
        """Until nothing computes, no event is pending and nothing is in flight. On a tie a
        thread's work ends first, then the communication events in order."""
        while True:
            flying = self.v < self.comm_until
            slow_c = 1.0 + self.kappa if flying else 1.0     # wall seconds per compute second
            slow_m = 1.0 + self.mu if self.left else 1.0     # and per communication second
            step = None                             # (wall seconds, what, which thread)
            if self.left:
                name = min(self.left, key=self.left.get)
                step = (self.left[name] * slow_c, COMPUTE, name)
            if self.events:
                dt = max(0.0, (self.events[0][0] - self.v) * slow_m)
                if step is None or dt < step[0]:
                    step = (dt, "event", None)
            if flying:
                dt = (self.comm_until - self.v) * slow_m
                if step is None or dt < step[0]:
                    step = (dt, "drained", None)
            if step is None:
                return
            dt, what, name = step
            self.t += dt
            for thread in self.left:
                self.left[thread] = max(0.0, self.left[thread] - dt / slow_c)
            if what == "event":
                self.v = max(self.v, self.events[0][0])
            elif what == "drained":
                self.v = self.comm_until
            else:
                self.v += dt / slow_m
            if self.v > self.knots_v[-1]:
                self.knots_t.append(self.t)
                self.knots_v.append(self.v)
            if what == "event":
                heapq.heappop(self.events)[2]()
            elif what == COMPUTE:
                del self.left[name]
                self._resume(name)

    def real(self, v: float) -> float:
        """The wall time at which the communication clock read ``v``."""
        i = max(0, bisect.bisect_right(self.knots_v, v) - 1)
        t0, v0 = self.knots_t[i], self.knots_v[i]
        if i + 1 == len(self.knots_v):
            return t0 + (v - v0)         # past the end nothing computes
        t1, v1 = self.knots_t[i + 1], self.knots_v[i + 1]
        return t0 + (v - v0) * (t1 - t0) / (v1 - v0)

    def on_wall_clock(self, events: list) -> list:
        """A transport's events (on ``v``, in microseconds) in wall time."""
        us = 1e6
        return [(name, cat, row, self.real(a / us) * us,
                 None if b is None else self.real(b / us) * us, args)
                for name, cat, row, a, b, args in events]


# --------------------------------------------------------------------------- the methods' rules

def method_class(method: str):
    """The registered class of ``method`` (its ``rule``, options, architecture and
    compressors); a UsageError naming the modelled methods when it has no rule."""
    from .. import methods
    try:
        cls = methods.lookup(method)
    except UsageError:
        cls = None
    if cls is None or getattr(cls, "rule", None) is None:
        raise UsageError(f"cannot predict method {method!r}; modelled: {', '.join(_modelled())}")
    return cls


def _modelled(architecture: str | None = None, grouped: bool | None = None) -> list[str]:
    """The registered methods with a model rule (of one architecture; with a grouping, True, or
    ByteScheduler's schedule, False) in the survey's order: all-to-all before parameter
    server, within each BSP first, then the registry's order, ByteScheduler's schedule last."""
    from .. import methods
    found = [(mid, cls) for mid, cls in methods.registry().items()
             if getattr(cls, "rule", None) is not None
             and architecture in (None, cls.architecture)
             and grouped in (None, cls.rule.grouping is not None)]
    order = {mid: i for i, (mid, _) in enumerate(found)}
    return sorted(order, key=lambda mid: (
        methods.lookup(mid).architecture != methods.A2A, methods.lookup(mid).rule.scheduler,
        not methods.lookup(mid).rule.after_backward, order[mid]))


def __getattr__(name: str):
    """Views of the registry's rules (no method is named here): ``METHODS`` (every modelled
    method), ``PS_METHODS``, ``GROUPINGS`` and ``PS_GROUPINGS`` (id -> grouping of the methods
    that send fixed groups every step, all-reduced on the whole job or pushed; not those that
    declare an exchange of their own, ``Rule.exchange``, nor the periodic ones, ``Rule.period``),
    ``COMPRESSORS_OF`` (id -> the compressors it takes)."""
    from ..methods import A2A, PS
    if name == "METHODS":
        return tuple(_modelled())
    if name == "PS_METHODS":
        return tuple(_modelled(PS))
    if name in ("GROUPINGS", "PS_GROUPINGS"):
        return {m: method_class(m).rule.grouping
                for m in _modelled(A2A if name == "GROUPINGS" else PS, grouped=True)
                if not method_class(m).rule.exchange and not method_class(m).rule.period}
    if name == "COMPRESSORS_OF":
        return {m: tuple(c for c in compression.COMPRESSORS
                         if method_class(m).accepts(c) is None)
                for m in _modelled()}
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _rule(method: str) -> Rule | None:
    """``method``'s rule; None for a name the registry does not know (``replay``'s groups given
    by hand: sent as they are ready, the bucketed methods' host work)."""
    try:
        return method_class(method).rule
    except UsageError:
        return None


def options_for(method: str, options=None, **values):
    """``method``'s resolved options, an instance of its class's ``Options`` (what a run's
    ``RunConfig.of`` builds, which its rule reads): ``options`` (None: the declared defaults)
    with ``values`` (option name -> value, as the training script, the sweep and the launchers
    name them; None: unchanged) applied by ``dataclasses.replace``, unchecked (the model
    replays any value, the training script's lower bounds included: the commands check their
    flags and files where they read them). A name ``method`` does not declare is skipped (one
    set of values may serve several methods); one that no registered method declares is a
    UsageError."""
    from ..methods import option_owners
    cls = method_class(method)
    if options is None:
        options = cls.Options()
    elif not isinstance(options, cls.Options):
        raise UsageError(f"method {method} takes {cls.Options.__name__}, not "
                         f"{type(options).__name__}")
    specs = {spec.name: spec for spec in cls.Options.specs()}
    unknown = sorted(set(values) - set(specs) - set(option_owners()))
    if unknown:
        raise UsageError(f"no method has an option {unknown[0]!r}")
    given = {k: v for k, v in values.items() if k in specs and v is not None}
    return replace(options, **given) if given else options


def groups_of(method: str, work: Compute, link: Link | None, options=None,
              **values) -> list[list[int]]:
    """The messages (all-reduce) or units (PS) ``method`` sends per iteration, as groups of
    backward positions, with its options (``options_for``)."""
    cls = method_class(method)
    if cls.rule.grouping is None:
        raise UsageError(f"method {method} sends ByteScheduler's chunks, not fixed groups")
    return cls.rule.groups(cls, work, link, options_for(method, options, **values))


class _HostWork:
    """The methods' own handling of the gradients (``Compute.host``) and of their compressor's
    codec, as each does it. The bucketed methods (every grouped rule without ``reducer``, the
    PS ones included) keep a group's gradients as views into its flat buffer
    (``methods/allreduce.py``): nothing is packed or unpacked. Their gradient hooks hand a
    complete group to the method's communication thread (``threaded``), which encodes and issues
    it (``pack``: a span on the ``issue`` row, one group after another, on the communication
    clock); a method without hooks (BSP) does that on the training thread in the step. In
    ``step()``,
    message by message as each is done, they decode it and, without a compressor (a compressor
    averages itself), the PS methods divide it by the workers; the all-reduce ones
    (``averages``) have the collective average (``ReduceOp.AVG``: Gloo divides after the sum
    on its own thread, ``_AllReduce.average``; NCCL inside the kernel). DDP (a rule with
    ``reducer``) copies each gradient into its bucket and divides the bucket before its
    all-reduce, in its hooks on the training thread, and copies the buckets back once all are
    done;
    its compressor runs on a thread of its own (the transport's channel: ``channel_codec``).
    ByteScheduler's completer divides each tensor as the bucketed methods divide a message
    (``div``). A compressor's encode done only when a bucket is waited for (PowerSGD's Q:
    ``Codec.encode_at_wait_s_per_element``) is done in the step, once the bucket's first
    collectives are, before the ones it then issues (``at_wait``), on the training thread. The
    bucketed all-reduce methods spend ``Host.issue_s`` on each collective they issue, after the
    encode, before the message starts (on the communication thread or, without hooks, the
    training thread); DDP's reducer issues from C++ and the PS methods through their client,
    whose costs are not measured (zero). ``divide_share``: the share of each message the
    method divides (``Rule.divide_shard``: a sharding method's shard). ``sync``: a periodic
    method's own work per byte of each message before and after its collective
    (``Rule.sync_before``, ``sync_after``: the host figures named there, summed), packed with
    the issue and finished with the decode, on the training thread."""

    def __init__(self, reducer: bool, work: Compute, codec: Codec, nworkers: int,
                 issues: bool = False, averages: bool = False, divide_share: float = 1.0,
                 sync: tuple[float, float] = (0.0, 0.0)):
        h = work.host
        self.work = work
        self.codec = codec
        self.copy = h.copy_s_per_byte if reducer else 0.0  # DDP's; the buckets are views
        divides = nworkers > 1 and codec.compressor == "none"
        in_collective = averages and not reducer
        self.div = h.divide_s_per_byte * divide_share if divides and not in_collective else 0.0
        self.average = h.divide_s_per_byte if divides and in_collective else 0.0
        self.sync_before, self.sync_after = sync
        self.reducer = reducer
        # the gradient hooks hand groups to a communication thread that encodes and issues
        # them (methods/allreduce.py, ps.py: threads.Issuer); DDP's reducer copies in its hooks
        self.threaded = not reducer
        self.issue = h.issue_s if issues and not self.reducer else 0.0
        late = codec.encode_at_wait_s_per_element
        self.enc = 0.0 if self.reducer else codec.encode_s_per_element - late
        self.enc_wait = 0.0 if self.reducer else late
        self.dec = 0.0 if self.reducer else codec.decode_s_per_element

    def channel_codec(self, codec: Codec) -> Codec:
        """The codec the transport runs: DDP's; the collectives alone for the others."""
        if self.reducer:
            return codec
        return replace(codec, encode_s_per_element=0.0, decode_s_per_element=0.0,
                       encode_at_wait_s_per_element=0.0)

    def _sizes(self, g) -> tuple[int, int]:
        """(bytes, the dense elements the codec passes over) of group ``g``."""
        return (sum(self.work.nbytes[b] for b in g),
                self.codec.elements([s for b in g for s in _shapes(self.work, b)]))

    def _issued(self, g) -> tuple[int, int]:
        """How many collectives group ``g`` issues (when handed over, when waited for)."""
        if not self.issue:
            return 0, 0
        first, late = self.codec.phases([s for b in g for s in _shapes(self.work, b)])
        return len(first), len(late)

    def pack(self, g) -> float:
        nbytes, elements = self._sizes(g)
        if self.reducer:
            return (self.copy + self.div) * nbytes
        return (self.sync_before * nbytes + self.enc * elements
                + self.issue * self._issued(g)[0])

    def at_wait(self, g) -> float:
        return self.enc_wait * self._sizes(g)[1] + self.issue * self._issued(g)[1]

    def finish(self, g) -> float:
        if self.reducer:
            return 0.0
        nbytes, elements = self._sizes(g)
        return (self.div + self.sync_after) * nbytes + self.dec * elements

    def after_all(self) -> float:
        return self.copy * sum(self.work.nbytes) if self.reducer else 0.0

    def pack_name(self, g) -> str:
        """What ``pack(g)`` does, for its span on the timeline."""
        if self.reducer:
            return "copy into bucket" + (", divide" if self.div else "")
        return ", ".join(w for w, on in (("pack", self.sync_before), ("encode", self.enc),
                                          ("issue", self._issued(g)[0])) if on)

    def at_wait_name(self, g) -> str:
        return ", ".join(w for w, on in (("encode", self.enc_wait),
                                          ("issue", self._issued(g)[1])) if on)

    def finish_name(self, g) -> str:
        return ", ".join(w for w, on in (("decode", self.dec), ("divide", self.div),
                                          ("unpack", self.sync_after)) if on)


def replay(work: Compute, link: Link | None, groups: list[list[int]], channels: int = 1,
           method: str = "groups", codec: Codec = NO_CODEC, servers: ServerLinks | None = None,
           partition_bytes: int = DEFAULT_PARTITION_BYTES, local: Link | None = None,
           bsp: bool | None = None, nworkers: int = 1, steps: tuple = (), gather: tuple = (),
           prefetch: bool = False, optimizer_share: float = 1.0,
           placement: str = DEFAULT_PS_PLACEMENT, key_order: list | None = None,
           divide_share: float = 1.0, regather: bool = False) -> Prediction:
    """One iteration with ``groups`` sent as messages, in order, each once its last gradient
    is ready: all-reduced on ``channels`` FIFO threads (``link``, ``codec``), or, with
    ``servers``, pushed and pulled in ``partition_bytes`` partitions (keys numbered over the
    groups in ``key_order``, None: theirs, placed by ``placement``: ``_declare``). ``bsp``:
    the groups wait for the whole backward (default: the rule's ``after_backward``, BSP's,
    which packs, encodes and sends them in the step).
    ``method``: a registered id, whose rule says BSP or not and whose host work is DDP's or the
    bucketed methods'; any other name (the default): groups given by hand, bucketed.
    One event simulator runs it (``_CoSim``, with ``work``'s CPU interference; none: the
    section 3 recurrences, up to rounding). The training thread packs (and encodes) each group
    before handing it over and finishes each (decode, divide, unpack) in order once it is done
    (``_HostWork``). ``steps``: a method's declared exchange, (collective, share of the
    message, ``Link``) each, run for every message instead of its all-reduce. ``gather``,
    a sharding method's collectives after the optimizer (``Rule.gather``, as ``steps``): the
    previous step's start with the iteration, in forward order, and the forward waits for all
    (``prefetch`` False) or each group's share for its own, and with ``regather`` each
    group's backward waits for its gather again (``_Sharded``); the optimizer takes
    ``optimizer_share`` of ``work.optimizer_s``. ``divide_share``: the share of each message
    the method divides (``Rule.divide_shard``). A message's bytes are its collectives'
    payload as ``Comm`` counts it, its gathers' included."""
    if sorted(b for g in groups for b in g) != list(range(len(work.nbytes))):
        raise UsageError("the groups must cover every tensor exactly once")
    us = 1e6
    rule = _rule(method)
    host, transport = _transport(rule, work, link, codec, nworkers, channels, divide_share,
                                 servers, (partition_bytes, local, placement), steps, gather)
    wait_all = bool(rule and rule.after_backward) if bsp is None else bsp
    sizes, first_key = [], (_declare(transport, work, groups, key_order) if servers else {})

    def label_of(g):
        return (timeline.tensors_label([work.names[b] for b in g])
                if work.names is not None else None)

    def send(g, start):
        """(when taken, when done) of group ``g`` handed over at ``start``; its size noted."""
        nbytes = sum(work.nbytes[b] for b in g)
        if servers is not None:
            parts = transport.parts(nbytes, first_key[tuple(g)])
            taken, end, size = transport.send(start, parts, label_of(g))
        else:
            taken, end, size = transport.send(start, [s for b in g for s in _shapes(work, b)],
                                              label_of(g))
        sizes.append(size)
        return taken, end

    def send_late(i, start):
        """When the collectives group ``i`` issues when waited for, from ``start``, are done
        (None: it issues none); their bytes join its size."""
        if servers is not None:
            return None
        sent = transport.send_late(start, [s for b in groups[i] for s in _shapes(work, b)],
                                   label_of(groups[i]))
        if sent is None:
            return None
        sizes[i] += sent[1]
        return sent[0]

    extra = {} if not gather else {"sharded": _Sharded.of(
        transport, work, groups, label_of, prefetch, optimizer_share, regather)}
    end, spans, comm_events, codec = _schedule(work, groups, wait_all, send, send_late,
                                               transport, host, **extra)
    if extra:
        sizes = [size + gathered for size, gathered in zip(sizes, extra["sharded"].gathered)]
    events = comm_events + [("iteration", timeline.ITERATION, timeline.MAIN, 0.0, end * us,
                             {"index": 0})]
    events += [(name, cat, row, a * us, b * us, None) for name, cat, row, a, b in spans]
    # the method's own work: inside the backward when a hook does it (compute there), inside
    # the step otherwise (exposed, as the run's timeline has it)
    events += [(name, timeline.CODEC, row, a * us, b * us, None) for name, row, a, b in codec]
    metrics = timeline.overlap(events)["mean"]
    return Prediction(method, end, groups, sizes, events, metrics,
                      _bottleneck(work, link, servers, sizes, metrics))


def _transport(rule, work, link, codec, nworkers, channels, divide_share, servers, ps, steps,
               gather) -> tuple:
    """``replay``'s host work (``_HostWork``: the rule's divide, in the collective or in the
    step, ``Rule.divide_in_step``; its sync work) and transport (push/pull with ``servers``,
    ``ps`` its partition bytes, local link and placement; else all-reduce on ``link``)."""
    host = _HostWork(bool(rule and rule.reducer), work, codec, nworkers,
                     issues=servers is None,
                     averages=servers is None and not (rule and rule.divide_in_step),
                     divide_share=divide_share, sync=_sync_work(rule, work.host))
    if servers is not None:
        return host, _PushPull(servers, *ps)
    if link is None:
        raise UsageError("an all-reduce method needs a link")
    return host, _AllReduce(link, host.channel_codec(codec), channels, defer=not host.reducer,
                            average_s_per_byte=host.average, steps=steps, gather=gather,
                            divide_share=divide_share, pipelined=bool(rule and rule.pipelined))


def _sync_work(rule, host: Host) -> tuple[float, float]:
    """A periodic method's own work per byte of a message before and after its collective
    (``Rule.sync_before``, ``sync_after``: ``host``'s figures by name, summed)."""
    if rule is None:
        return 0.0, 0.0
    return (sum(getattr(host, name) for name in rule.sync_before),
            sum(getattr(host, name) for name in rule.sync_after))


class _IssueThread:
    """A method's communication thread in the replay (``threads.Issuer``): it encodes and
    issues each group its gradient hooks hand it (``_HostWork.pack``), one after another, on
    the communication clock; its spans go on the ``issue`` row of ``events``."""

    def __init__(self, host: _HostWork, events: list):
        self.host, self.events, self.free = host, events, 0.0

    def take(self, g, now: float) -> float:
        """When group ``g``, handed over at ``now``, is issued."""
        seconds = self.host.pack(g)
        start = max(now, self.free)
        if seconds:
            self.events.append((self.host.pack_name(g), timeline.CODEC, ISSUER_ROW,
                                start * 1e6, (start + seconds) * 1e6, None))
        self.free = start + seconds
        return self.free


@dataclass(frozen=True)
class _Sharded:
    """A sharding method's part of ``replay``'s schedule: ``gather(i, start)`` (when group
    i's all-gather, started at ``start``, is done; its payload added to ``gathered[i]``),
    each group's share of the forward (``forward_s``, in group order), whether each share
    waits for its own group's gather (``prefetch``) or the forward for every one, the
    optimizer's share of ``optimizer_s``, and whether each group is gathered again before its
    backward (``regather``: ZeRO-3)."""
    gather: Callable
    forward_s: list
    prefetch: bool
    optimizer_share: float
    regather: bool = False
    gathered: list = field(default_factory=list)

    @classmethod
    def of(cls, transport, work: Compute, groups, label_of, prefetch: bool,
           optimizer_share: float, regather: bool = False) -> "_Sharded":
        """``replay``'s: the groups' gathers on ``transport`` (its declared ``gather``)."""
        gathered = [0] * len(groups)

        def gather(i, start):
            g = groups[i]
            done, payload = transport.gather(start, sum(work.nbytes[b] for b in g), label_of(g))
            gathered[i] += payload
            return done
        return cls(gather, _group_forward_s(work, groups), prefetch, optimizer_share,
                   regather, gathered)


def _group_forward_s(work: Compute, groups) -> list[float]:
    """Each group's share of the forward: its tensors' (``_forward_order``)."""
    n = len(work.nbytes)
    fwd = _forward_order(work)[3]
    return [sum(fwd[n - 1 - b] for b in g) for g in groups]


def _launch(sim: _CoSim, seconds: float, launched):
    """A host thread launches a piece of device work: ``seconds`` of its own compute, then
    it signals ``launched`` (the key the device's ``_on_device`` waits for)."""
    yield COMPUTE, seconds
    sim.signal(launched)


def _on_device(seconds: float, launched=None):
    """The device computes a piece of work, done no earlier than the host launched it: it
    ends at ``max(device free + seconds, launch end)`` (``launched``: the key the host
    signals then; None: one resource, the thread computing being the one that launched it).
    Every piece of device work of ``_Schedule`` and of ByteScheduler's replay runs through
    it (docs/DESIGN.md section 3, "Host and device")."""
    yield COMPUTE, seconds
    if launched is not None:
        yield WAIT, launched


def _schedule(work: Compute, groups, wait_all: bool, send, send_late, transport,
              host: _HostWork, sharded: _Sharded | None = None):
    """``replay``'s iteration (``_Schedule``): (its end, the spans (name, category, row,
    start, end), the transport's events in wall time, the host work's spans (name, row,
    start, end)). tests/model_reference.py writes the one-resource case again, without the
    event simulator, with this signature (without ``sharded``)."""
    return _Schedule(work, groups, wait_all, send, send_late, transport, host, sharded).run()


class _Schedule:
    """``replay``'s iteration on the event simulator (``_CoSim``, at ``work``'s CPU
    interference, zero for none), on a worker's host and device. The host (the training
    thread) launches the forward, each tensor's backward and the optimizer, runs the gradient
    hooks (handing each complete group, in order, to the method's communication thread,
    ``_IssueThread``, or, with ``wait_all`` or without that thread, packing and issuing it
    itself) and in the step packs and issues what no hook did (BSP). The device runs what was
    launched, no earlier; a group's collectives start once its gradients are computed and it
    was issued (``send``); the step's work on the gradients (waiting for each group, what its
    compressor does when waited for and the collectives it then issues: ``send_late``; decode,
    divide, DDP's copy out) and the optimizer run on the device in order; the transport
    schedules on the communication clock.

    With ``work.launch`` (an accelerator) host and device are two resources: the host spends
    ``Launch``'s times (and ``hook_s`` per gradient where a Python hook hands groups to the
    communication thread) and never waits for the device (an NCCL ``wait()`` only orders the
    device's streams), only, in the step, for its communication thread to have issued
    everything; the iteration ends when both are done. The forward ends at ``max(device,
    host)``, tensor b's backward at ``max(device + backward_s[b], host launched b)``; the
    device's spans go on ``DEVICE_ROW``. Without (a CPU) they are one resource, the host far
    ahead of a device that is the training thread itself: one thread runs each piece's device
    work, then the host's (each launch returns with its work done, no hook cost), which with
    no interference is the section 3 recurrences. Interference (kappa, mu) slows host and
    device alike as compute. ``run()`` returns the iteration's end, the spans (name, category,
    row, start, end), the transport's events in wall time and the host work's spans (name,
    row, start, end)."""

    def __init__(self, work: Compute, groups, wait_all: bool, send, send_late, transport,
                 host: _HostWork, sharded: _Sharded | None = None):
        self.sim = _CoSim(work.compute_slowdown, work.comm_slowdown)
        self.sharded = sharded
        self.work, self.groups, self.wait_all = work, groups, wait_all
        self.send, self.send_late, self.transport, self.host = send, send_late, transport, host
        self.two = work.launch is not None        # host and device are resources of their own
        self.device_row = DEVICE_ROW if self.two else timeline.MAIN
        self.issuer = (_IssueThread(host, transport.events) if host.threaded and not wait_all
                       else None)
        self.t: dict = {}           # when each piece ended ("host forward", "device end", ...)
        self.codec: list = []       # the host work's spans (name, row, start, end)
        self.issued: dict = {}      # group index -> when it is issued (communication clock)
        self.launched: set = set()  # backward positions launched (one resource: computed)
        self.next = 0               # the next group to issue
        self.last = {max(g): i for i, g in enumerate(groups)}  # a group is computed at its last
        # ZeRO-3: the groups in the order the backward reaches them (at their first tensor)
        self.reached = sorted(range(len(groups)), key=lambda i: min(groups[i]))
        self.regathers: set = set()  # the groups whose gather before the backward was issued

    def run(self):
        sim = self.sim
        if self.two:
            sim.spawn("device", self._device())
            sim.spawn("host", self._host())
        else:
            sim.spawn("training", self._device())
        sim.run()
        t = self.t
        end = max(t["host end"], t["device end"]) if self.two else t["device end"]
        return end, self._spans(end), sim.on_wall_clock(self.transport.events), self.codec

    def _work(self, name: str, seconds: float, row: str):
        """The method's own work on ``row``'s thread; a span when it took time."""
        t0 = self.sim.t
        yield COMPUTE, seconds
        if self.sim.t > t0:
            self.codec.append((name, row, t0, self.sim.t))

    def _host(self):
        """The training thread on an accelerator: launches, hooks and the step."""
        launch, sim = self.work.launch, self.sim
        yield from _launch(sim, launch.forward_s, ("launched", "forward"))
        self.t["host forward"] = sim.t
        hook = launch.hook_s if self.issuer is not None else 0.0   # DDP's are C++, BSP has none
        for b, tb in enumerate(launch.backward_s):
            yield COMPUTE, tb + hook
            yield from self._hook(b)
            sim.signal(("launched", b))
        self.t["host backward"] = sim.t
        yield from self._issue_rest()
        if self.issuer is not None and self.issuer.free > sim.v:   # the step drains the thread
            key = ("issuer drained",)
            sim.at(self.issuer.free, lambda: sim.signal(key))
            yield WAIT, key
        self.t["host step"] = sim.t
        yield COMPUTE, launch.optimizer_s
        self.t["host end"] = sim.t

    def _hook(self, b: int):
        """Tensor ``b``'s gradient hook: the groups now complete are issued, in order, unless
        they wait for the whole backward."""
        self.launched.add(b)
        while (self.next < len(self.groups) and not self.wait_all
               and self.launched.issuperset(self.groups[self.next])):
            yield from self._issue()

    def _issue_rest(self):
        """The step issues what no hook did (BSP's groups)."""
        while self.next < len(self.groups):
            yield from self._issue()

    def _issue(self):
        """The host issues the next group now, through the communication thread or itself."""
        i, g = self.next, self.groups[self.next]
        if self.issuer is not None:
            self.issued[i] = self.issuer.take(g, self.sim.v)
        else:
            yield from self._work(self.host.pack_name(g), self.host.pack(g), timeline.MAIN)
            self.issued[i] = self.sim.v
        self.next += 1
        self.sim.signal(("issued", i))

    def _device(self):
        """The device's work in launch order; on one resource each piece's host work after
        it."""
        sim, work = self.sim, self.work
        if self.sharded is None:
            yield from self._compute(work.forward_s, "forward")
        else:
            yield from self._gathered_forward()
        self.t["device forward"] = sim.t
        regather = self.sharded is not None and self.sharded.regather
        for b, tb in enumerate(work.backward_s):
            if regather:
                yield from self._regathered(b)
            yield from self._compute(tb, b)
            if b in self.last:
                sim.spawn(("send", self.last[b]), self._sender(self.last[b]))
            if not self.two:
                yield from self._hook(b)
        self.t["device backward"] = sim.t
        if not self.two:
            yield from self._issue_rest()
        yield from self._gradients()
        self.t["device optimizer"] = sim.t
        share = 1.0 if self.sharded is None else self.sharded.optimizer_share
        yield COMPUTE, work.optimizer_s * share
        self.t["device end"] = sim.t

    def _gathered_forward(self):
        """The forward after the previous step's all-gathers, issued now in forward order (the
        last group first): each group's share of it waits for that group's (prefetched), or
        the whole forward for every one."""
        sim, sharded = self.sim, self.sharded
        order = list(reversed(range(len(self.groups))))
        for i in order:
            done = sharded.gather(i, sim.v)
            sim.sent(done)
            sim.at(done, lambda k=("gathered", i): sim.signal(k))
        for i in (order if not sharded.prefetch else order[:1]):
            yield WAIT, ("gathered", i)
        self.t["forward start"] = sim.t   # (the wait before it: a span of its own)
        for i in order:
            yield WAIT, ("gathered", i)
            yield COMPUTE, sharded.forward_s[i]
        if self.two:
            yield WAIT, ("launched", "forward")

    def _regather(self, i: int) -> None:
        """Group ``i``'s gather before its backward, issued now (once)."""
        if i in self.regathers:
            return
        self.regathers.add(i)
        sim = self.sim
        done = self.sharded.gather(i, sim.v)
        sim.sent(done)
        sim.at(done, lambda k=("regathered", i): sim.signal(k))

    def _regathered(self, b: int):
        """ZeRO-3 (FSDP2's pre-backward): before the backward reaches a group's first tensor
        ``b`` its parameters are gathered again (issued now unless prefetched) and waited for,
        then the next group the backward reaches is prefetched."""
        k = next((k for k, i in enumerate(self.reached) if min(self.groups[i]) == b), None)
        if k is None:
            return
        i = self.reached[k]
        self._regather(i)
        yield WAIT, ("regathered", i)
        if k + 1 < len(self.reached):
            self._regather(self.reached[k + 1])

    def _compute(self, seconds: float, what):
        """The device computes ``what`` (the forward, a backward position), done no earlier
        than the host launched it."""
        yield from _on_device(seconds, ("launched", what) if self.two else None)

    def _sender(self, i: int):
        """Group ``i``'s collectives: once computed (now) and issued."""
        yield WAIT, ("issued", i)
        done = self.send(self.groups[i], max(self.sim.v, self.issued[i]))[1]
        self.sim.sent(done)
        self.sim.at(done, lambda: self.sim.signal(("done", i)))

    def _gradients(self):
        """The step's work on the gradients on the device, group by group: wait for it, what
        its compressor does when waited for (and the collectives it then issues), decode and
        divide; then wait for every message and copy DDP's buckets out."""
        sim, host, row = self.sim, self.host, self.device_row
        for i, g in enumerate(self.groups):
            yield WAIT, ("done", i)
            yield from self._work(host.at_wait_name(g), host.at_wait(g), row)
            done = self.send_late(i, sim.v)
            if done is not None:
                sim.sent(done)
                sim.at(done, lambda k=("late", i): sim.signal(k))
                yield WAIT, ("late", i)
            yield from self._work(host.finish_name(g), host.finish(g), row)
        yield from sim.drained()
        yield from self._work("copy out of buckets", host.after_all(), row)

    def _spans(self, end: float) -> list:
        """The training thread's spans, and the device's on a row of its own; on one resource
        the step holds the optimizer."""
        t, main, compute = self.t, timeline.MAIN, timeline.COMPUTE
        start = t.get("forward start", 0.0)   # after a sharding method's first gather
        waited = [("allgather wait", timeline.WAIT, main, 0.0, start)] if start > 0 else []
        if not self.two:
            return waited + [
                ("forward", compute, main, start, t["device forward"]),
                ("backward", compute, main, t["device forward"], t["device backward"]),
                ("step", timeline.WAIT, main, t["device backward"], end),
                ("optimizer", compute, main, t["device optimizer"], end)]
        dev = DEVICE_ROW
        spans = [("forward", compute, main, 0.0, t["host forward"]),
                 ("backward", compute, main, t["host forward"], t["host backward"]),
                 ("step", timeline.WAIT, main, t["host backward"], t["host step"]),
                 ("optimizer", compute, main, t["host step"], t["host end"]),
                 ("synchronize", timeline.WAIT, main, t["host end"], end),
                 ("forward", compute, dev, start, t["device forward"]),
                 ("backward", compute, dev, t["device forward"], t["device backward"]),
                 ("optimizer", compute, dev, t["device optimizer"], t["device end"])]
        return [x for x in spans if x[4] > x[3] or x[0] != "synchronize"] + \
            [(name, cat, dev, a, b) for name, cat, _, a, b in waited]


def _declare(transport: _PushPull, work: Compute, groups: list[list[int]],
             key_order: list[int] | None) -> dict:
    """Each group's first key (by the group's tuple): the groups' partitions numbered with
    the groups taken in ``key_order`` (None: in order) and placed on the servers in that
    order, as the engine plans a session."""
    out, key = {}, 0
    for i in range(len(groups)) if key_order is None else key_order:
        parts = transport.parts(sum(work.nbytes[b] for b in groups[i]), key)
        transport.declare(parts)
        out[tuple(groups[i])] = key
        key += len(parts)
    return out


def predict(method: str, work: Compute, link: Link | None, channels: int = 1,
            codec: Codec = NO_CODEC, servers: ServerLinks | None = None,
            local: Link | None = None, nworkers: int = 1, options=None,
            batches_per_iter: int | None = None, steps: tuple = (), gather: tuple = (),
            optimizer_share: float = 1.0, divide_share: float = 1.0, **values) -> Prediction:
    """``method``'s iteration with its options (``options_for``: ``options``, an instance of
    its ``Options``, None its defaults, with ``values`` by option name; its rule reads them:
    a fusion threshold, ``bucket_cap_mb``, ``mgwfbp_min_group``; ByteScheduler's
    ``partition`` and ``credit`` in elements; ``partition_bytes`` for the PS methods).
    ``batches_per_iter``: ByteScheduler's timing round, see ``bytescheduler``; the other
    methods finish every iteration in it. All-reduce methods cost messages on ``link``
    (with ``codec``); the PS methods need ``servers`` (and ``local`` for a machine's local
    sum). ``nworkers``: the run's workers (the methods divide the sums only when above 1).
    ``steps``: the links of a rule's declared exchange (``Rule.exchange``; ``cell`` gives
    them from the network), (collective, share of the message, ``Link``) each; ``gather``
    likewise for a sharding method's collectives after the optimizer (``Rule.gather``), and
    ``optimizer_share``, the share of the optimizer's time its shard takes (``cell``: 1/s for
    the group of ``Rule.optimizer_shard``); whether the gathers overlap the next forward is
    the option ``Rule.prefetch`` names, whether they run again before the backward the option
    ``Rule.regather`` names; ``divide_share``, the share of each message the method divides
    (``cell``: 1/s for the group of ``Rule.divide_shard``)."""
    cls = method_class(method)
    rule = cls.rule
    options = options_for(method, options, **values)
    why = cls.accepts(codec.compressor)
    if why is not None:
        allowed = [c for c in compression.COMPRESSORS if cls.accepts(c) is None]
        raise UsageError(f"method {method} does not take compressor {codec.compressor} "
                         f"(it takes {', '.join(allowed)})")
    from ..methods import PS
    if cls.architecture == PS:
        if servers is None:
            raise UsageError(f"method {method} needs the parameter servers' links")
        partition_bytes = int(getattr(options, "partition_bytes", DEFAULT_PARTITION_BYTES))
        placement = getattr(options, "ps_placement", DEFAULT_PS_PLACEMENT)
        if rule.scheduler:
            return bytescheduler(work, link, credit=int(getattr(options, "credit", BS_CREDIT)),
                                 servers=servers, partition_bytes=partition_bytes,
                                 local=local, nworkers=nworkers,
                                 batches_per_iter=batches_per_iter, method=method,
                                 placement=placement)
        groups = rule.groups(cls, work, None, options)
        return replay(work, None, groups, method=method, servers=servers,
                      partition_bytes=partition_bytes, local=local, nworkers=nworkers,
                      placement=placement, key_order=_key_order(cls, options, work, groups))
    if link is None:
        raise UsageError(f"method {method} needs an all-reduce link")
    if rule.scheduler:
        return bytescheduler(work, link, int(getattr(options, "partition", BS_PARTITION)),
                             int(getattr(options, "credit", BS_CREDIT)), channels, codec=codec,
                             nworkers=nworkers, batches_per_iter=batches_per_iter,
                             method=method)
    declared_steps = len(rule.steps(options)), len(rule.steps(options, after_optimizer=True))
    if declared_steps[0] != len(steps):
        raise UsageError(f"method {method} declares {declared_steps[0]} collective(s) per "
                         f"message; their links were given for {len(steps)}")
    if declared_steps[1] != len(gather):
        raise UsageError(f"method {method} declares {declared_steps[1]} collective(s) after "
                         f"its optimizer per message; their links were given for {len(gather)}")
    prefetch = rule.prefetch is True or (isinstance(rule.prefetch, str)
                                         and str(getattr(options, rule.prefetch)) == "1")
    regather = rule.regather is not None and str(getattr(options, rule.regather)) == "1"
    p = replay(work, link, rule.groups(cls, work, link, options), channels, method,
               codec, nworkers=nworkers, steps=steps, gather=gather, prefetch=prefetch,
               optimizer_share=optimizer_share, divide_share=divide_share, regather=regather)
    return _periodic(p, work, int(getattr(cls, rule.period)(options))) if rule.period else p


def _key_order(cls, options, work: Compute, groups: list[list[int]]) -> list[int] | None:
    """The order in which a PS method numbers its units' keys (``BucketedPS.key_order``, by
    their tensors' names); None: in push order (also where the profile has no names)."""
    if work.names is None or not hasattr(cls, "key_order"):
        return None
    return cls.key_order(options, [[work.names[b] for b in g] for g in groups])


def _periodic(synced: Prediction, work: Compute, period: int) -> Prediction:
    """A periodic method's mean iteration: one step that syncs (``synced``, its messages after
    the whole step) in every ``period``, the others its compute alone (no communication; CPU
    interference none there). The events and metrics are the syncing step's."""
    return replace(synced, iteration_s=(synced.iteration_s + (period - 1) * work.compute_s)
                   / period)


def bytescheduler(work: Compute, link: Link | None, partition: int = None, credit: int = None,
                  channels: int = 1, element_bytes: int = 4, iterations: int = 4,
                  codec: Codec = NO_CODEC, servers: ServerLinks | None = None,
                  partition_bytes: int = DEFAULT_PARTITION_BYTES,
                  local: Link | None = None,
                  nworkers: int = 1, batches_per_iter: int | None = None,
                  method: str | None = None,
                  placement: str = DEFAULT_PS_PLACEMENT) -> Prediction:
    """ByteScheduler (docs/DESIGN.md section 5) in steady state: ``iterations`` iterations
    replayed, the last full one reported (from one forward's start to the next's). With
    ``batches_per_iter`` B, one timing round of the measurement protocol (docs/DESIGN.md
    section 8) instead: B iterations from a clean start (the first forward waits for nothing)
    and the ``synchronize()`` after them (every update applied), the iteration time being the
    round's over B (what a run's throughput measures) and the metrics those of the B
    iterations, the synchronize between rounds outside them (as a run's timeline has them). Each
    tensor's forward takes its ``forward_tensor_s`` plus a share of the rest of ``forward_s``
    in proportion to it (evenly where all are 0); without them (a profile that timed the
    forward as a whole) a share of ``forward_s`` in proportion to its backward time. A
    module's forward first waits for its tensor's update of the previous iteration, which the
    completer thread applies (a share of ``optimizer_s`` in proportion to bytes) once the
    tensor's chunks are all reduced, after dividing it by ``nworkers`` (above 1, without a
    compressor: ``work.host``'s divide; each tensor is sent in place, no copies). Rank 0's
    negotiation is not modelled. With ``servers`` it is ByteScheduler-PS: chunks are the PS
    partitions (``partition_bytes``), pushed and pulled, the credit returned once a chunk is
    pushed; a codec then does not apply. Under CPU interference (``replay``'s event simulator) the
    forward pieces, the backward and the completer's updates are the compute that
    communication slows and that slows it. With ``work.launch`` the worker's host launches
    and its device computes (``_ByteSchedulerRun``: the hooks' ``hook_s``, the completer's
    launches, the updates on the device). ``method``: the prediction's name (default: the
    registry's method on this schedule and architecture)."""
    ps = servers is not None
    if ps:
        partition = max(1, int(partition_bytes) // element_bytes)
    partition = BS_PARTITION if partition is None else partition
    credit = BS_CREDIT if credit is None else credit
    if partition <= 0 or credit <= 0:
        raise UsageError(f"partition and credit must be positive elements, got {partition}, "
                         f"{credit}")
    if batches_per_iter is not None:
        if isinstance(batches_per_iter, bool) or not isinstance(batches_per_iter, int) or \
                batches_per_iter < 1:
            raise UsageError(f"batches per timing round must be a whole number >= 1, got "
                             f"{batches_per_iter!r}")
        iterations = batches_per_iter
    n = len(work.nbytes)
    tb, nbytes, names, fwd = _forward_order(work)
    divide = _HostWork(False, work, NO_CODEC if ps else codec, nworkers).div
    total_bytes = sum(nbytes)
    opt = [work.optimizer_s * (x / total_bytes if total_bytes else 1 / n) + divide * x
           for x in nbytes]
    table = chunk_table([max(1, -(-x // element_bytes)) for x in nbytes], partition)
    chunks_of: dict = {}
    for c, (l, _, _) in enumerate(table):
        chunks_of.setdefault(l, []).append(c)
    if ps:   # keys: the chunks in registration order, placed in that order (the engine's)
        transport = _PushPull(servers, partition * element_bytes, local, placement)
        transport.declare([(c, (e - b) * element_bytes) for c, (_, b, e) in enumerate(table)])
    elif link is None:
        raise UsageError("bytescheduler needs an all-reduce link")
    else:
        transport = _AllReduce(link, codec, channels)
    plan = (table, chunks_of, credit, element_bytes, names, ps)
    starts, every = _bytescheduler_threads(work, transport, plan, fwd, tb, opt, iterations)
    window, iteration_s = _reported(starts, every, batches_per_iter)
    metrics = timeline.overlap(window)["mean"]
    sizes = [(e - b) * element_bytes for _, b, e in table]
    if method is None:  # the registry's method on ByteScheduler's schedule, of the architecture
        from ..methods import A2A, PS
        method = _modelled(PS if ps else A2A, grouped=False)[0]
    # one message per chunk, in priority order
    return Prediction(method, iteration_s, [[n - 1 - l] for l, _, _ in table], sizes, window,
                      metrics, _bottleneck(work, link, servers, sizes, metrics), every)


def _forward_order(work: Compute):
    """Per tensor in forward order (l = 0 next to the input; backward position b is
    l = n-1-b): its backward seconds, bytes, name and forward seconds (its
    ``forward_tensor_s`` plus a share of the rest of ``forward_s`` in proportion to it, evenly
    where all are 0; without them a share of ``forward_s`` in proportion to its backward)."""
    n = len(work.nbytes)
    tb = [work.backward_s[n - 1 - l] for l in range(n)]
    nbytes = [work.nbytes[n - 1 - l] for l in range(n)]
    names = ([work.names[n - 1 - l] for l in range(n)] if work.names is not None
             else [f"tensor {l}" for l in range(n)])
    total_tb = sum(tb)
    if work.forward_tensor_s is None:
        fwd = [work.forward_s * (x / total_tb if total_tb else 1 / n) for x in tb]
    else:
        own = [work.forward_tensor_s[n - 1 - l] for l in range(n)]
        rest, total_own = max(0.0, work.forward_s - sum(own)), sum(own)
        fwd = [x + rest * (x / total_own if total_own else 1 / n) for x in own]
    return tb, nbytes, names, fwd


def _reported(starts, every, batches_per_iter):
    """(the events reported, the iteration's seconds) of ByteScheduler's replayed iterations:
    the last full one (from one forward's start to the next's) in steady state; with
    ``batches_per_iter``, the timing round: every event, each iteration from its forward to the
    next one's (the last to its backward's end), then the synchronize until the last update,
    the round's time over its iterations."""
    us, main = 1e6, timeline.MAIN
    if batches_per_iter is None:
        lo, hi = starts[-2], starts[-1]
        window = [e for e in every if e[4] is not None and e[4] > lo * us and e[3] < hi * us]
        window.append(("iteration", timeline.ITERATION, main, lo * us, hi * us, {"index": 0}))
        return window, hi - lo
    end = max(e[4] for e in every if e[4] is not None) / us
    last = max(e[4] for e in every if e[0] == "backward") / us
    window = list(every)
    for i, (lo, hi) in enumerate(zip(starts, starts[1:] + [last])):
        window.append(("iteration", timeline.ITERATION, main, lo * us, hi * us, {"index": i}))
    window.append(("synchronize", timeline.WAIT, main, last * us, end * us, None))
    return window, end / batches_per_iter


class _Dispatcher:
    """ByteScheduler's dispatcher in the replay, on the communication clock: chunks queue by
    priority (front layers first) as their tensor's gradient is ready (``ready``); it hands
    the best to the transport while the credit (elements in flight) is positive, subtracting
    its size; the credit comes back when the transport has taken the chunk (all-reduce: done;
    PS: pushed); a tensor whose chunks are all done is signalled ``("reduced", k)``, the k-th
    so (``reduced[k]``: its (iteration, tensor))."""

    def __init__(self, sim, transport, plan, events: list):
        self.sim, self.transport, self.events = sim, transport, events
        self.table, self.chunks_of, self.credit, self.element_bytes, self.names, self.ps = plan
        self.queue: list = []        # (tensor, chunk index, iteration, ready time)
        self.left: dict = {}         # (iteration, tensor) -> chunks not yet done
        self.reduced: list = []      # (iteration, tensor), all chunks done, in that order

    def ready(self, it: int, tensor: int) -> None:
        self.left[(it, tensor)] = len(self.chunks_of[tensor])
        for c in self.chunks_of[tensor]:
            heapq.heappush(self.queue, (tensor, c, it, self.sim.t))
            self.dispatch()

    def dispatch(self) -> None:
        sim, us = self.sim, 1e6
        while self.credit > 0 and self.queue:
            tensor, c, it, ready = heapq.heappop(self.queue)
            _, begin, end = self.table[c]
            size = end - begin
            self.credit -= size
            label = f"{self.names[tensor]}[{begin}:{end}]"
            what = [(c, size * self.element_bytes)] if self.ps else [(size,)]
            taken, done, _ = self.transport.send(sim.v, what, label)
            sim.sent(done)
            sim.at(taken, lambda size=size: self._credit_back(size))
            sim.at(done, lambda it=it, tensor=tensor: self._chunk_done(it, tensor))
            self.events.append((label, timeline.QUEUE, "scheduler queue", ready * us,
                                sim.t * us, None))

    def _credit_back(self, size: int) -> None:
        self.credit += size
        self.dispatch()

    def _chunk_done(self, it: int, tensor: int) -> None:
        self.left[(it, tensor)] -= 1
        if self.left[(it, tensor)] == 0:
            self.reduced.append((it, tensor))
            self.sim.signal(("reduced", len(self.reduced) - 1))


def _bytescheduler_threads(work, transport, plan, fwd, tb, opt, iterations):
    """``bytescheduler``'s iterations on the event simulator (``_ByteSchedulerRun``).
    Returns each iteration's start and every event in wall time."""
    return _ByteSchedulerRun(work, transport, plan, fwd, tb, opt).run(iterations)


class _ByteSchedulerRun:
    """``bytescheduler``'s iterations on the event simulator (``_CoSim``, at ``work``'s CPU
    interference, zero for none): the training thread (each module's forward after its
    tensor's previous update, the backward marking chunks ready) and the completer thread
    (each tensor's update once its chunks are reduced, in the order they were) compute; the
    dispatcher (``_Dispatcher``) hands chunks to the transport by priority under the credit.

    With ``work.launch`` (an accelerator) a worker's host and device are resources of their
    own, as in ``_Schedule`` (``_launch``, ``_on_device``): the training thread launches each
    module's forward (``launch.forward_s`` shared evenly: launches count kernels, not FLOPs)
    once its tensor's previous update was launched, and each tensor's backward
    (``launch.backward_s``) plus ``hook_s`` (ByteScheduler's gradient hooks are Python); the
    completer, a host thread, launches each update (``launch.optimizer_s`` shared evenly);
    the device (``_device``) runs the forward and backward pieces in launch order, each
    module's forward after its tensor's update, and the updates in the order launched,
    between pieces. A tensor is ready for the dispatcher once its hook ran and the device
    computed it (the method learns it from a post-accumulate-grad hook on the host, no event,
    no sync; its collective then waits for the device's stream). The iterations start on
    the device (where the previous backward ended). Without, one resource: the training
    thread computes, the completer computes the updates beside it."""

    def __init__(self, work, transport, plan, fwd, tb, opt):
        self.sim = _CoSim(work.compute_slowdown, work.comm_slowdown)
        self.transport, self.fwd, self.tb, self.opt, self.n = transport, fwd, tb, opt, len(tb)
        self.starts: list = []
        self.events: list = []
        self.dispatcher = _Dispatcher(self.sim, transport, plan, self.events)
        launch, n = work.launch, len(tb)
        self.two = launch is not None
        if self.two:
            self.host_fwd = launch.forward_s / n
            self.host_bwd = [launch.backward_s[n - 1 - l] + launch.hook_s for l in range(n)]
            self.host_opt = launch.optimizer_s / n
        self.half: set = set()       # (iteration, tensor): hooked or computed, not both yet
        self.pending: list = []      # updates launched, not yet run on the device, in order
        self.launches = 0            # updates launched so far
        self.applied: set = set()    # (iteration, tensor) updated on the device

    def run(self, iterations: int):
        sim = self.sim
        sim.spawn("completer", self._completer())
        sim.spawn("training", self._training(iterations))
        if self.two:
            sim.spawn("device", self._device(iterations))
        sim.run()      # to the end: every chunk reduced, every update applied
        if "training" in sim.threads or "device" in sim.threads or \
                any(self.dispatcher.left.values()):
            raise RuntimeError("the co-simulation stopped early")  # pragma: no cover
        return self.starts, self.events + sim.on_wall_clock(self.transport.events)

    def _training(self, iterations: int):
        """The training thread: computes, or with a launch launches, each piece."""
        sim, events, n, us, main = self.sim, self.events, self.n, 1e6, timeline.MAIN
        for it in range(iterations):
            if not self.two:
                self.starts.append(sim.t)
            f0 = sim.t
            for l in range(n):
                if it > 0:
                    w0 = sim.t
                    yield WAIT, ("updated", it - 1, l)
                    if sim.t > w0:
                        events.append(("forward pre-hook", timeline.WAIT, main, w0 * us,
                                       sim.t * us, None))
                if self.two:
                    yield from _launch(sim, self.host_fwd, ("launched", "forward", it, l))
                else:
                    yield COMPUTE, self.fwd[l]
            events.append(("forward", timeline.COMPUTE, main, f0 * us, sim.t * us, None))
            b0 = sim.t
            for l in range(n - 1, -1, -1):
                if self.two:
                    yield from _launch(sim, self.host_bwd[l], ("launched", "backward", it, l))
                else:
                    yield COMPUTE, self.tb[l]
                self._ready(it, l)
            events.append(("backward", timeline.COMPUTE, main, b0 * us, sim.t * us, None))

    def _ready(self, it: int, l: int) -> None:
        """Tensor ``l``'s gradient of iteration ``it`` goes to the dispatcher: computed (one
        resource); with a launch, once both its hook ran and the device computed it."""
        if self.two and (it, l) not in self.half:
            self.half.add((it, l))
            return
        self.dispatcher.ready(it, l)

    def _completer(self):
        """Each tensor's update once its chunks are reduced: computed, or with a launch
        launched (the device runs it, ``_updates``)."""
        sim, us = self.sim, 1e6
        for k in itertools.count():
            yield WAIT, ("reduced", k)
            it, tensor = self.dispatcher.reduced[k]
            start = sim.t
            if self.two:
                self.pending.append((it, tensor))
                self.launches += 1
                sim.signal(("launching", self.launches - 1))
                yield from _launch(sim, self.host_opt, ("launched", "update", it, tensor))
            else:
                yield COMPUTE, self.opt[tensor]
            self.events.append(("optimizer", timeline.COMPUTE, "completer", start * us,
                                sim.t * us, None))
            sim.signal(("updated", it, tensor))

    def _device(self, iterations: int):
        """The device (with a launch): each iteration's forward and backward pieces, each done
        no earlier than launched, the updates launched meanwhile between them."""
        sim, events, n, us, row = self.sim, self.events, self.n, 1e6, DEVICE_ROW
        for it in range(iterations):
            self.starts.append(sim.t)
            f0 = sim.t
            for l in range(n):
                yield from self._updates((it - 1, l) if it > 0 else None)
                yield from _on_device(self.fwd[l], ("launched", "forward", it, l))
            events.append(("forward", timeline.COMPUTE, row, f0 * us, sim.t * us, None))
            b0 = sim.t
            for l in range(n - 1, -1, -1):
                yield from self._updates()
                yield from _on_device(self.tb[l], ("launched", "backward", it, l))
                self._ready(it, l)
            events.append(("backward", timeline.COMPUTE, row, b0 * us, sim.t * us, None))
        for l in range(n):
            yield from self._updates((iterations - 1, l))

    def _updates(self, until=None):
        """The device runs the updates launched so far, in launch order; with ``until``, an
        (iteration, tensor), until that one's has run, waiting for its launch."""
        sim, us = self.sim, 1e6
        while self.pending or (until is not None and until not in self.applied):
            if not self.pending:
                yield WAIT, ("launching", self.launches)
                continue
            it, tensor = self.pending.pop(0)
            start = sim.t
            yield from _on_device(self.opt[tensor], ("launched", "update", it, tensor))
            self.events.append(("optimizer", timeline.COMPUTE, DEVICE_ROW, start * us,
                                sim.t * us, None))
            self.applied.add((it, tensor))


def _bottleneck(work, link, servers, sizes, m) -> str:
    """What limits the iteration, in words: compute when under a tenth of it is exposed
    communication; else latency or bandwidth (the servers' links: server-bound), whichever of
    the messages' start-ups and their bytes costs more."""
    if m["exposed_s"] < 0.1 * m["iteration_s"]:
        return "compute-bound"
    if servers is not None:
        startups = 2 * servers.alpha * len(sizes)
        worker = servers.worker_beta * sum(sizes)
        server = servers.server_beta * servers.pushers * sum(sizes) / servers.nservers
        if startups > 2 * max(worker, server):
            return "latency-bound"
        return "server-bound" if server > worker else "bandwidth-bound"
    startups = link.alpha * len(sizes)
    transfer = link.beta * sum(sizes)
    return "latency-bound" if startups > transfer else "bandwidth-bound"


def trace(prediction: Prediction, meta: dict | None = None) -> dict:
    """The prediction as a trace file's object (one rank, on its own clock)."""
    return timeline.trace([{"rank": 0, "events": prediction.events, "offset_us": 0.0,
                            "uncertainty_us": 0.0, "name": f"{prediction.method} (predicted)"}],
                          {"predicted": True, "method": prediction.method, **(meta or {})})

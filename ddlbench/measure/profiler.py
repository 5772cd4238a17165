"""Layer-wise profiler for MG-WFBP and the performance model (docs/DESIGN.md section 4).
``python -m ddlbench.measure.profiler``:

    python -m ddlbench.measure.profiler --model resnet50 --batch-size 64 --nworkers 4 \\
        --output prof.json
    python -m ddlbench.train --method mgwfbp --mgwfbp-profile prof.json ...
    python -m ddlbench.measure.profiler --model resnet18 --image-size 64 --batch-size 16 \\
        --nworkers 4 --slots 2 --net 1gbit --output prof.json   # 2 emulated machines x 2

What it measures, on the rank's own batch:

- per-tensor backward times: a post-accumulate-grad hook on every parameter stamps the time its
  gradient is ready, after synchronising the device; a tensor's backward time is the gap since
  the previous tensor was ready (the first one's since the backward pass entered the model,
  stamped by a gradient hook on the model's outputs), so ``sum(backward)`` is the backward pass
  through the model. Tensors are listed in the order their gradients became ready (backward
  order), gaps averaged over ``--iters`` iterations (default 50) after ``--warmup`` (default 5);
- the forward time: model forward pre-hook to forward hook, device synchronised at both
  (averaged over the iterations without the module hooks below);
- each tensor's share of it (``forward_tensor_s``, for ByteScheduler's replay): in every other
  measured iteration forward hooks on every module owning parameters stamp the time (device
  synchronised); a module's own time (less its timed descendants') and the time since the
  previous timed module go to the parameters it is the first to own, by bytes; median
  fractions of the pass, times the forward time of the iterations without these hooks;
- alpha and beta of this cluster: an all-reduce micro-benchmark
  (``ddlbench.measure.comm_bench``) over
  the sizes of the model's gradient tensors and the whole gradient, fitted as
  ``t = alpha + beta * bytes`` (relative least squares);
- with more than one worker, the CPU interference (``measure_interference``; skipped with
  ``--no-interference``, null on one worker): forward-backward passes and all-reduces of the
  model's largest gradient timed alone and beside each other, every rank at once; compute
  beside communication takes ``1 + compute_slowdown`` times as long, communication beside
  compute ``1 + comm_slowdown`` times (``python -m ddlbench.model.predict`` replays with them).
  Both are of the network the workers run over (``--net``, as the training script's): over
  loopback the cores carry every byte, over an emulated link the shaper sets the pace
  (docs/DESIGN.md section 3 has the figures). ``--slots S`` (the training script's) places
  the workers as its local spawner does, S to an emulated host, so that a profile is taken
  on the layout of the runs it predicts: with ``--nworkers 4 --slots 2 --net 1gbit`` the
  all-reduces cross the 1 Gbit/s link between the two machines and each machine's loopback
  inside it, as those runs' do;
- with parameter servers (``--nservers S``, extra processes that only sum, as the training
  script's), the same beside the servers' push/pull (``interference_ps``): every gradient
  tensor cut into the servers' ``--partition-bytes`` partitions, all pushed at once and
  their sums pulled back (``--ps-clients`` as the method's). The servers, and with one
  client per machine its leader's local sums, take the workers' cores: over loopback
  ResNet-18's compute on 2 workers and one server took x3.41 on rank 0 (the leader) and
  x2.72 on rank 1 beside push/pulls, x1.66 and x1.86 beside all-reduces (one run); the PS
  methods' replay takes this one (``predict.interference_of``);
- what the methods' own handling of the gradients costs (``host``, ``measure_host``): every
  gradient copied into one flat buffer and back, and the buffer divided in place, per byte,
  and the issue of one collective (``measure_issue``), every rank at once.
- on an accelerator, the host's side of the step (``launch``, ``measure_launch``): the same
  passes stamped on the host's clock without synchronising the device, so the training
  thread's launch time of the forward, of each tensor's backward and of the optimizer's step,
  and what a bucketed method's gradient hook costs it inside a backward; the model replays
  host and device as two resources with them (``simulate.Launch``).

Every rank runs the same forward/backward iterations at the same time (so the device and the
cores are as busy as in training), meeting before each (a barrier, as a synchronous step's
ranks meet at its collectives), but only rank 0's timings are kept and broadcast: every rank
ends up with rank 0's profile, which adds each rank's mean compute (``rank_compute_s``) and
each of its passes (``rank_passes_s``), from which the model takes each step's slowest
(``predict.slowest_rank``). Gradients are cleared before each iteration (set to None, as the
training loop leaves them), and the model's buffers (BatchNorm statistics) and the random
generators are restored afterwards, so profiling leaves no trace on the run.

The profile file (JSON, ``"format": "ddlbench-mgwfbp-profile"``): the model name and workload,
the tensors in backward order (name, shape, bytes), ``backward_s`` (per tensor, same order),
``forward_s``, ``forward_tensor_s`` (per tensor, same order; sum <= ``forward_s``), ``alpha_s``,
``beta_s_per_byte``, and where they were measured (``nworkers``, ``backend``, ``device``,
``network``, ``net``: the emulated link as a run's record has it, and ``slots``: workers per
emulated host, null where not given), the optimizer's step
(``optimizer_s``) and ``interference`` (``compute_slowdown``, ``comm_slowdown``, the
all-reduce's ``bytes``, the ``iters`` of each phase, the mean times behind them, ``per_rank``;
or null), ``interference_ps`` (the same beside push/pulls, with ``op: "pushpull"``,
``nservers``, ``ps_clients`` and ``partition_bytes``; absent without servers) and ``host``
(``copy_s_per_byte``, ``divide_s_per_byte``, ``outer_step_s_per_byte``, the gradient
``bytes`` and ``iters`` they were timed with, ``issue_s`` and its ``issue_iters``) and ``launch`` (on an accelerator, the
host's side of the step, ``measure_launch``: ``forward_s``, ``backward_s`` per tensor in the
same order, ``optimizer_s``, ``hook_s``, ``iters``; null on a CPU, where the host computes).
``--alpha``/``--beta`` given here replace the fitted values, to plan for a cluster other than
this one.
"""
from __future__ import annotations

import argparse
import math
import statistics
import sys
import time
from contextlib import contextmanager

from ..errors import ArgumentParser, UsageError, check_writable
from . import workload as workloads
from .workload import OPTIMIZERS
from ..options import add_network_flags, add_ps_flags
from ..planning import DDP_DEFAULT_BUCKET_MB, DEFAULT_MIN_GROUP_ELEMENTS
from .profile_file import PROFILE_FORMAT, PROFILE_VERSION, trainable, write_profile

DEFAULT_WARMUP = 5
DEFAULT_ITERS = 50
DEFAULT_COMM_WARMUP = 2
DEFAULT_COMM_ITERS = 10
DEFAULT_INTERFERENCE_ITERS = 4
DEFAULT_HOST_ITERS = 5
DEFAULT_ISSUE_ITERS = 50
MAX_INTERFERENCE_ALLREDUCES = 10000


# --------------------------------------------------------------------------- measuring

def _tensors_in(obj) -> list:
    """Tensors requiring grad inside a model's output (tensor, tuple, list, dict, ModelOutput)."""
    import torch
    if isinstance(obj, torch.Tensor):
        return [obj] if obj.requires_grad else []
    if isinstance(obj, dict):
        obj = list(obj.values())
    if isinstance(obj, (list, tuple)):
        return [t for x in obj for t in _tensors_in(x)]
    return []


@contextmanager
def _leaving_no_trace(model, device):
    """Gradients cleared (set to None, as the training loop leaves them), the model's buffers
    (BatchNorm statistics) and the random generators restored afterwards."""
    import torch
    saved_buffers = [(b, b.detach().clone()) for b in model.buffers()]
    saved_rng = torch.get_rng_state()
    saved_cuda_rng = (torch.cuda.get_rng_state(device)
                      if device is not None and device.type == "cuda" else None)
    try:
        yield
    finally:
        for p in model.parameters():
            if p.requires_grad:
                p.grad = None
        with torch.no_grad():
            for b, v in saved_buffers:
                b.copy_(v)
        torch.set_rng_state(saved_rng)
        if saved_cuda_rng is not None:
            torch.cuda.set_rng_state(saved_cuda_rng, device)


@contextmanager
def _removed_after(handles):
    try:
        yield
    finally:
        for h in handles:
            h.remove()


def _param_owners(model, params) -> list[tuple[object, list[int]]]:
    """Every module owning trainable parameters directly, with their indices in ``params``."""
    index = {id(p): i for i, p in enumerate(params)}
    owners = []
    for m in model.modules():
        own = [index[id(p)] for p in m.parameters(recurse=False) if id(p) in index]
        if own:
            owners.append((m, own))
    return owners


class _ForwardSplit:
    """One forward pass cut among the parameter-owning modules (``measure_layers``).

    Hook stamps cut the pass into intervals. An interval inside a timed module belongs to the
    innermost one (its span less its timed descendants'); one outside every timed module
    (activations, pooling between them) to the next timed module to start; what follows the
    last one is left over. A module is timed when it is the first in the pass to own some of
    its parameters, its time split among those by bytes; one whose parameters all ran before
    (a tied decoder) counts as compute of its parent or of the next module (their first user
    is what waits for their update). Parameters no called module owns (used functionally)
    get 0."""

    def __init__(self, nbytes: list[int], start: float):
        self.nbytes = nbytes
        self.spent = [0.0] * len(nbytes)
        self.claimed: set[int] = set()
        self.stack: list = []          # per open module: the parameters it times, or None
        self.last, self.pending, self.closed = start, 0.0, False

    def _give(self, seconds: float, to: list[int]) -> None:
        total = sum(self.nbytes[i] for i in to)
        for i in to:
            self.spent[i] += seconds * (self.nbytes[i] / total if total else 1 / len(to))

    def _charge(self, now: float) -> None:
        seconds, self.last = now - self.last, now
        for own in reversed(self.stack):
            if own:
                self._give(seconds, own)
                return
        self.pending += seconds

    def enter(self, own: list[int], now: float) -> None:
        if self.closed:
            return
        self._charge(now)
        new = [i for i in own if i not in self.claimed]
        if new:
            self.claimed.update(new)
            self._give(self.pending, new)
            self.pending = 0.0
        self.stack.append(new or None)

    def leave(self, now: float) -> None:
        if self.closed or not self.stack:
            return
        self._charge(now)
        self.stack.pop()

    def close(self, now: float) -> None:
        if not self.closed:
            self._charge(now)
            self.closed = True


def measure_layers(model, forward_backward, *, device=None, warmup: int = DEFAULT_WARMUP,
                   iters: int = DEFAULT_ITERS, step=None) -> dict:
    """This rank's per-tensor backward times and forward time (module docstring).

    Returns ``{"order": parameter indices (of the trainable parameters, in
    ``model.parameters()`` order) in backward order, "backward_s": seconds per tensor in that
    order, "forward_s": seconds, "forward_tensor_s": each tensor's share of the forward, same
    order, "passes_s": each measured pass's forward and backward (to its last gradient), in
    order}``. Parameters that never got a gradient come last, at 0 s. ``step``, if given, runs
    before every pass, warm-up too (``make_profile``: the ranks' barrier).

    The passes and their hooks: ``_layer_passes``; the backward order and times:
    ``_backward_times``; the forward and its shares: ``_forward_shares``."""
    if iters <= 0 or warmup < 0:
        raise UsageError("profiling needs iterations > 0 and warm-up >= 0")
    params = [p for p in model.parameters() if p.requires_grad]
    sync = _synchronizer(device)
    cur: dict = {}
    handles = _layer_hooks(model, params, cur, sync)
    with _leaving_no_trace(model, device), _removed_after(handles):
        forward, ready_at, orders, fractions, passes = _layer_passes(
            forward_backward, params, cur, sync, warmup=warmup, iters=iters, step=step)
    order, backward = _backward_times(orders, ready_at)
    forward_s, forward_tensor_s = _forward_shares(forward, fractions, order)
    return {"order": order, "backward_s": backward, "forward_s": forward_s,
            "forward_tensor_s": forward_tensor_s, "passes_s": passes}


def _synchronizer(device):
    """A function that waits for ``device``'s queued work (nothing to wait for without one)."""
    from .. import runtime

    def sync():
        if device is not None:
            runtime.synchronize(device)
    return sync


def _layer_hooks(model, params, cur: dict, sync) -> list:
    """The hooks ``measure_layers`` times a pass with; they stamp ``time.perf_counter()`` into
    ``cur`` (cleared before every pass), each after ``sync()``: ``"f0"`` and ``"f1"`` as the
    model's forward starts and ends, ``"b0"`` as the backward enters the model (a gradient hook
    on its outputs), and (parameter index, time) into ``cur["ready"]`` as each gradient of
    ``params`` is ready. With ``cur["timing"]`` set, a ``_ForwardSplit`` in ``cur["split"]``
    takes the stamps of the forward hooks on every module owning parameters. Returns the
    handles: the model's own hooks first (they open and close the pass around its modules')."""
    return (_pass_hooks(model, params, cur, sync) + _module_hooks(model, params, cur, sync)
            + _grad_hooks(params, cur, sync))


def _pass_hooks(model, params, cur: dict, sync) -> list:
    """The model's forward pre-hook and forward hook (``_layer_hooks``): ``"f0"``, ``"f1"``,
    the pass's ``_ForwardSplit`` when timing, and the backward's start ``"b0"``."""
    nbytes = [p.numel() * p.element_size() for p in params]

    def on_backward_start(_grad):
        if "b0" not in cur:
            sync()
            cur["b0"] = time.perf_counter()

    def pre_forward(_module, _args):
        sync()
        cur["f0"] = time.perf_counter()
        if cur.get("timing"):
            cur["split"] = _ForwardSplit(nbytes, cur["f0"])

    def post_forward(_module, _args, output):
        sync()
        cur["f1"] = time.perf_counter()
        if cur.get("split") is not None:
            cur["split"].close(cur["f1"])
        for t in _tensors_in(output):
            t.register_hook(on_backward_start)

    return [model.register_forward_pre_hook(pre_forward),
            model.register_forward_hook(post_forward)]


def _module_hooks(model, params, cur: dict, sync) -> list:
    """Forward pre-hooks and hooks on every module owning parameters (``_layer_hooks``): they
    feed the pass's ``_ForwardSplit``, if it has one and it is still open."""
    def module_pre(own):
        def hook(_module, _args):
            split = cur.get("split")
            if split is not None and not split.closed:
                sync()
                split.enter(own, time.perf_counter())
        return hook

    def module_post(_module, _args, _output):
        split = cur.get("split")
        if split is not None and not split.closed:
            sync()
            split.leave(time.perf_counter())

    handles = []
    for m, own in _param_owners(model, params):
        handles += [m.register_forward_pre_hook(module_pre(own)),
                    m.register_forward_hook(module_post)]
    return handles


def _grad_hooks(params, cur: dict, sync) -> list:
    """A hook on every parameter of ``params`` (``_layer_hooks``): (its index, the time) into
    ``cur["ready"]`` as its gradient is ready."""
    from .. import compat

    def ready_hook(i):
        def hook(_p):
            sync()
            cur["ready"].append((i, time.perf_counter()))
        return hook
    return [compat.on_grad_ready(p, ready_hook(i)) for i, p in enumerate(params)]


def _layer_passes(forward_backward, params, cur: dict, sync, *, warmup: int, iters: int,
                  step) -> tuple[list, list, list, list, list]:
    """``warmup + iters`` passes of ``forward_backward`` with the hooks of ``_layer_hooks``
    recording into ``cur``, gradients cleared (and ``step`` run) before each; the warm-up's
    are dropped. Every other measured pass (the only one if there is one) is cut among the
    modules (``_ForwardSplit``); the others time the forward without the module hooks (on a
    GPU these synchronise the device at every module). The backward is timed in every pass
    (the forward hooks do not run in it).

    Returns, over the measured passes: the forwards timed without the module hooks (or the
    only pass's), every parameter's ready times since the backward's start, each pass's
    order of ready gradients, each cut pass's fractions of the forward per parameter, and
    each pass's forward and backward (to its last gradient)."""
    forward, ready_at, orders, fractions, passes = [], [[] for _ in params], [], [], []
    for it in range(warmup + iters):
        if step is not None:
            step()
        for p in params:
            p.grad = None
        split_here = it >= warmup and ((it - warmup) % 2 == 1 or iters == 1)
        cur.clear()
        cur["ready"] = []
        cur["timing"] = split_here
        forward_backward()
        sync()
        if it < warmup:
            continue
        if "f0" not in cur or "f1" not in cur:
            raise RuntimeError("the profiler saw no forward pass through the model")
        span = cur["f1"] - cur["f0"]
        if split_here:
            fractions.append([x / span if span > 0 else 0.0 for x in cur["split"].spent])
        if not split_here or iters == 1:
            forward.append(span)
        start = cur.get("b0", cur["f1"])
        # the pass: its forward and its backward, to the last gradient
        passes.append(span + max((t for _, t in cur["ready"]), default=start) - start)
        orders.append([i for i, _ in cur["ready"]])
        for i, t in cur["ready"]:
            ready_at[i].append(t - start)
    return forward, ready_at, orders, fractions, passes


def _backward_times(orders: list[list[int]],
                    ready_at: list[list[float]]) -> tuple[list[int], list[float]]:
    """The backward order and each tensor's backward time in it (``measure_layers``).

    Autograd's order is the one the first measured iteration showed (it is the same every
    iteration for a fixed graph), parameters that never got a gradient last (at 0 s); a
    tensor's time is the gap between mean ready times."""
    n = len(ready_at)
    order = []
    for i in orders[0]:
        if i not in order:
            order.append(i)
    order += [i for i in reversed(range(n)) if i not in set(order)]
    mean_ready = [statistics.fmean(ready_at[i]) if ready_at[i] else None for i in range(n)]
    backward, prev = [], 0.0
    for i in order:
        if mean_ready[i] is None:
            backward.append(0.0)
            continue
        backward.append(max(0.0, mean_ready[i] - prev))
        prev = max(prev, mean_ready[i])
    return order, backward


def _forward_shares(forward: list[float], fractions: list[list[float]],
                    order: list[int]) -> tuple[float, list[float]]:
    """The mean forward and each tensor's share of it, in ``order`` (``measure_layers``).

    Each tensor's median fraction of the cut passes, scaled to sum to the median fraction
    attributed (at most 1; a sum of medians of skewed samples falls short of it), times the
    forward timed without the module hooks."""
    n = len(order)
    forward_s = statistics.fmean(forward)
    share = [statistics.median(f[i] for f in fractions) for i in range(n)]
    attributed = min(1.0, statistics.median(sum(f) for f in fractions))
    scale = forward_s * (attributed / sum(share) if sum(share) > 0 else 0.0)
    return forward_s, [share[i] * scale for i in order]


def measure_launch(model, forward_backward, order: list[int], *, device=None,
                   optimizer=None, warmup: int = DEFAULT_WARMUP,
                   iters: int = DEFAULT_ITERS) -> dict:
    """The host's side of a step on an accelerator (``simulate.Launch``; docs/DESIGN.md
    section 3): the same passes as ``measure_layers`` with the same hooks stamping the host's
    clock, but the device synchronised only between passes, so each stamp is when the training
    thread got there (launched), not when the device did: the forward's launch (median), each
    tensor's share of the backward's (the gaps between gradient hooks, in ``order``, the
    profile's backward order), and ``hook_s``, what a bucketed method's gradient hook costs
    the training thread per gradient inside a backward (count the gradient, hand a full
    bucket to a communication thread: ``threads.Issuer``'s queue), as the median of the
    backward's launch with such a hook on every parameter less without, per gradient. With
    ``optimizer``, its step's launch too (median of ``iters`` steps, each between two
    synchronisations; it changes the parameters). On a CPU the host does the compute: the
    replay takes none of this (``make_profile`` records it on accelerators only)."""
    import queue
    import threading

    from .. import compat
    params = [p for p in model.parameters() if p.requires_grad]
    cur: dict = {}
    sync = _synchronizer(device)

    def passes(extra=()):
        """(forwards, every parameter's ready times, orders, each pass's backward)."""
        nosync = lambda: None  # noqa: E731
        handles = (_pass_hooks(model, params, cur, nosync) + _grad_hooks(params, cur, nosync)
                   + list(extra))
        with _leaving_no_trace(model, device), _removed_after(handles):
            forward, ready_at, orders, _, _ = _layer_passes(
                forward_backward, params, cur, nosync, warmup=warmup, iters=iters, step=sync)
        backward = [max(r[k] for r in ready_at if len(r) > k) for k in range(len(orders))]
        return forward, ready_at, orders, backward

    forward, ready_at, orders, plain = passes()
    # the hooks of a bucketed method: count, and hand every 4th gradient's bucket over
    handed: queue.SimpleQueue = queue.SimpleQueue()
    taker = threading.Thread(target=lambda: [None for _ in iter(handed.get, None)],
                             name="profiler-issue", daemon=True)
    taker.start()
    count = [0]

    def hook(_p):
        count[0] += 1
        if count[0] % 4 == 0:
            handed.put(count[0])
    try:
        hooked = passes([compat.on_grad_ready(p, hook) for p in params])[3]
    finally:
        handed.put(None)
        taker.join()
    gaps = dict(zip(*_backward_times(orders, ready_at)))
    out = {"forward_s": statistics.median(forward), "backward_s": [gaps[i] for i in order],
           "hook_s": max(0.0, (statistics.median(hooked) - statistics.median(plain))
                         / max(1, len(params))),
           "iters": iters}
    if optimizer is not None:
        out["optimizer_s"] = _launch_of(optimizer.step, device, iters)
    return out


def _launch_of(fn, device, iters: int) -> float:
    """Median host seconds of ``fn()`` started with the device idle, not waited for."""
    sync = _synchronizer(device)
    times = []
    for _ in range(max(1, iters)):
        sync()
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    sync()
    return statistics.median(times)


def interference_bytes(nbytes: list[int]) -> int:
    """The all-reduce the interference is measured with: the model's largest gradient, at most
    DDP's default bucket (what fusion and DDP send), at least one element."""
    return max(4, min(max(nbytes, default=4), int(DDP_DEFAULT_BUCKET_MB * 1024 * 1024)))


def measure_interference(model, forward_backward, nbytes: int, *, group=None, device=None,
                         iters: int = DEFAULT_INTERFERENCE_ITERS,
                         comm_iters: int = DEFAULT_COMM_ITERS,
                         max_allreduces: int = MAX_INTERFERENCE_ALLREDUCES, ps=None,
                         ps_bytes: list[int] | None = None) -> dict:
    """How much compute and communication slow each other down when they run at once
    (docs/DESIGN.md section 3: on CPUs a Gloo collective needs the cores the backward uses).

    Every rank of ``group`` at once (collective): all-reduces of ``nbytes`` alone,
    ``forward_backward`` alone, then both at once (``_interference_phases``). Compute under
    concurrent communication takes ``1 + compute_slowdown`` times as long, communication under
    concurrent compute ``1 + comm_slowdown`` times; the means are the ranks' means, ``per_rank``
    has each rank's two slowdowns (``_interference_result``). On a GPU the compute is timed on
    its stream and each all-reduce on a stream of its own, so that neither waits for the
    other. Gradients are cleared and buffers and random generators restored afterwards.

    ``ps`` (a job's parameter-server client, ``runtime.Context.ps``): the communication is a
    push/pull instead, of ``ps_bytes`` (``_Exchange``); ``op`` in the result says which."""
    import torch.distributed as dist
    if iters <= 0 or comm_iters <= 0:
        raise UsageError("the interference needs iterations > 0")
    began = time.perf_counter()
    on = device if dist.get_backend(group) == "nccl" else "cpu"
    compute = _timed_compute(model, forward_backward, device)
    exchange = _Exchange(nbytes, group=group, device=device, ps=ps, ps_bytes=ps_bytes)
    with _leaving_no_trace(model, device):
        phases = _interference_phases(compute, exchange, group=group, on=on, iters=iters,
                                      comm_iters=comm_iters, max_allreduces=max_allreduces)
        exchange.close()
    return _interference_result(*phases, group=group, on=on, op=exchange.op,
                                nbytes=exchange.nbytes, began=began)


def _timed_compute(model, forward_backward, device):
    """A function running one ``forward_backward`` (the gradients cleared first) and returning
    its (start, end), on a GPU once the device's current stream has done its work."""
    import torch
    params = [p for p in model.parameters() if p.requires_grad]
    cuda = device is not None and device.type == "cuda"

    def compute():
        for p in params:
            p.grad = None
        t0 = time.perf_counter()
        forward_backward()
        if cuda:
            torch.cuda.current_stream(device).synchronize()
        return t0, time.perf_counter()
    return compute


class _Exchange:
    """The communication ``measure_interference`` times, one at each call, which returns its
    (start, end): an all-reduce of ``nbytes`` on ``group`` (on a GPU on a stream of its own).
    With ``ps``, a push/pull instead, of ``ps_bytes`` (each gradient tensor's bytes; default
    one message of ``nbytes``): every tensor cut into the servers' partitions, all pushed at
    once and their sums pulled back, as WFBP-PS sends them."""

    def __init__(self, nbytes: int, *, group=None, device=None, ps=None,
                 ps_bytes: list[int] | None = None):
        import torch
        self.group, self.ps = group, ps
        self.cuda = device is not None and device.type == "cuda"
        self.side = torch.cuda.Stream(device) if self.cuda else None
        self.buf = torch.zeros(max(1, nbytes // 4), dtype=torch.float32, device=device)
        self.parts = None
        if ps is not None:
            sizes = [max(1, b // 4) for b in (ps_bytes or [self.buf.numel() * 4])]
            self.buf = torch.zeros(sum(sizes), dtype=torch.float32, device=device)
            offsets = [sum(sizes[:i]) for i in range(len(sizes))]
            self.parts = [(p, off) for unit, off in zip(
                ps.open([(n, torch.float32) for n in sizes]), offsets) for p in unit]
        self.op = "allreduce" if self.parts is None else "pushpull"
        self.nbytes = int(self.buf.numel() * 4)

    def __call__(self) -> tuple[float, float]:
        import torch
        import torch.distributed as dist
        buf = self.buf
        t0 = time.perf_counter()
        if self.parts is not None:
            for h in [self.ps.push_pull(p, buf[off + p.start:off + p.end])
                      for p, off in self.parts]:
                h.wait()
        elif self.cuda:
            with torch.cuda.stream(self.side):
                dist.all_reduce(buf, group=self.group)
            self.side.synchronize()
        else:
            dist.all_reduce(buf, group=self.group)
        return t0, time.perf_counter()

    def close(self) -> None:
        """End the push/pull session, if there is one."""
        if self.parts is not None:
            self.ps.close()


def _seconds(spans) -> list[float]:
    """The length of each (start, end)."""
    return [b - a for a, b in spans]


def _slowest(x: float, *, group, on) -> float:
    """The largest ``x`` of the ranks of ``group`` (an all-reduce on ``on``)."""
    import torch
    import torch.distributed as dist
    t = torch.tensor([x], dtype=torch.float64, device=on)
    dist.all_reduce(t, op=dist.ReduceOp.MAX, group=group)
    return float(t.item())


def _interference_phases(compute, communicate, *, group, on, iters: int, comm_iters: int,
                         max_allreduces: int) -> tuple[list, list, list, list, int]:
    """The three phases of ``measure_interference``, every rank of ``group`` at once, each
    after a barrier (a warm-up of each first: the layer timing ran before): ``communicate``
    alone (``comm_iters``, one at a time, as a method's channel sends them); ``compute`` alone
    (``iters``); then a background thread runs back-to-back ``communicate``s, enough to cover
    ``iters + 1`` computes (the slowest rank's, at most ``max_allreduces``), while this thread
    computes until they are done (``_side_by_side``).

    Returns the seconds of communication alone and of compute alone, the (start, end) of
    every communication and compute of the third phase, and how many communications it ran."""
    import torch.distributed as dist
    compute()
    communicate()
    dist.barrier(group=group)
    comm_alone = _seconds(communicate() for _ in range(comm_iters))
    dist.barrier(group=group)
    compute_alone = _seconds(compute() for _ in range(iters))
    window = (iters + 1) * _slowest(statistics.fmean(compute_alone), group=group, on=on)
    count = int(min(max_allreduces, max(comm_iters, math.ceil(
        window / max(1e-9, -_slowest(-statistics.fmean(comm_alone), group=group, on=on))))))
    dist.barrier(group=group)
    comm_spans, compute_spans = _side_by_side(compute, communicate, count)
    return comm_alone, compute_alone, comm_spans, compute_spans, count


def _side_by_side(compute, communicate, count: int) -> tuple[list, list]:
    """``count`` back-to-back ``communicate``s on a background thread, and ``compute``s on
    this one until they are done: the (start, end) of each. The background thread's error,
    if any, is raised here once it has ended."""
    import threading
    comm_spans, failed, done = [], [], threading.Event()

    def background():
        try:
            for _ in range(count):
                comm_spans.append(communicate())
        except BaseException as e:     # re-raised on the profiler's thread
            failed.append(e)
        finally:
            done.set()

    thread = threading.Thread(target=background, name="interference", daemon=True)
    thread.start()
    compute_spans = []
    while not done.is_set():
        compute_spans.append(compute())
    thread.join()
    if failed:
        raise failed[0]
    return comm_spans, compute_spans


def _slowdown(a: float, b: float) -> float | None:
    """How much longer ``a`` took than ``b`` (a fraction), None if ``a`` is NaN."""
    return None if math.isnan(a) else a / b - 1.0


def _interference_result(comm_alone, compute_alone, comm_spans, compute_spans, count: int, *,
                         group, on, op: str, nbytes: int, began: float) -> dict:
    """``measure_interference``'s result from its phases (``_interference_phases``), every
    rank of ``group`` at once (an all-reduce of each rank's means). Compute beside
    communication is the third phase's computes that ended before its last communication;
    communication beside compute every communication of the third phase (compute runs
    throughout). The means are the ranks' means; ``per_rank`` has each rank's two slowdowns;
    ``seconds`` is the time since ``began``."""
    import torch
    import torch.distributed as dist
    end = comm_spans[-1][1]
    beside = _seconds(s for s in compute_spans if s[1] <= end)
    mine = [statistics.fmean(compute_alone), statistics.fmean(beside) if beside else math.nan,
            statistics.fmean(comm_alone), statistics.fmean(_seconds(comm_spans))]
    table = torch.zeros((dist.get_world_size(group), 4), dtype=torch.float64, device=on)
    table[dist.get_rank(group)] = torch.tensor(mine, dtype=torch.float64)
    dist.all_reduce(table, group=group)
    rows = table.cpu().tolist()
    means = [statistics.fmean(r[i] for r in rows) for i in range(4)]
    return {"op": op,
            "compute_slowdown": _slowdown(means[1], means[0]),
            "comm_slowdown": _slowdown(means[3], means[2]),
            "bytes": nbytes,
            "iters": {"compute_alone": len(compute_alone), "comm_alone": len(comm_alone),
                      "compute_beside_comm": len(beside), "comm_beside_compute": count},
            "compute_s": means[0],
            "compute_beside_comm_s": None if math.isnan(means[1]) else means[1],
            "comm_s": means[2], "comm_beside_compute_s": means[3],
            "per_rank": [[_slowdown(r[1], r[0]), _slowdown(r[3], r[2])] for r in rows],
            "seconds": time.perf_counter() - began}


def measure_host(model, forward_backward, *, device=None,
                 iters: int = DEFAULT_HOST_ITERS) -> dict:
    """What the methods' own handling of the gradients costs per byte (docs/DESIGN.md section
    3; ``simulate.Host``), on the model's real gradients (one ``forward_backward``): every
    gradient copied into one flat buffer and back (a bucket's pack and unpack, DDP's copies),
    and the buffer divided in place (the average of a sum), and an outer optimizer's step over
    it (DiLoCo's: SGD with Nesterov momentum 0.9 on the averaged pseudo-gradient); each timed
    ``iters`` times after one untimed round, the medians per byte. Gradients are cleared and
    buffers and random generators restored afterwards."""
    import torch

    from .. import runtime
    with _leaving_no_trace(model, device):
        forward_backward()
        grads = [p.grad for p in model.parameters() if p.requires_grad and p.grad is not None]
        if not grads:
            raise UsageError("the model has no gradients to time the methods' copies with")
        nbytes = sum(g.numel() * g.element_size() for g in grads)
        flat = torch.empty(sum(g.numel() for g in grads), dtype=grads[0].dtype,
                           device=grads[0].device)

        def copy():
            # as methods.allreduce.Bucket's pack and unpack (a layer above: not imported here)
            offset = 0
            for g in grads:
                n = g.numel()
                flat[offset:offset + n].copy_(g.reshape(-1))
                offset += n
            offset = 0
            for g in grads:
                n = g.numel()
                g.copy_(flat[offset:offset + n].view_as(g))
                offset += n

        def timed(fn) -> float:
            times = []
            for k in range(iters + 1):
                runtime.synchronize(flat.device)
                start = time.perf_counter()
                fn()
                runtime.synchronize(flat.device)
                if k:
                    times.append(time.perf_counter() - start)
            return statistics.median(times)

        copies = timed(copy)
        divide = timed(lambda: flat.div_(2))
        outer = torch.nn.Parameter(torch.zeros_like(flat))   # (its momentum: one more buffer)
        outer.grad = flat
        outer_step = timed(torch.optim.SGD([outer], lr=0.7, momentum=0.9, nesterov=True).step)
        del outer
    return {"copy_s_per_byte": copies / (2 * nbytes), "divide_s_per_byte": divide / nbytes,
            "outer_step_s_per_byte": outer_step / nbytes,
            "bytes": nbytes, "iters": iters, **measure_issue(device=device)}


def measure_issue(*, device=None, group=None, iters: int = DEFAULT_ISSUE_ITERS) -> dict:
    """What the training thread spends issuing one collective as the bucketed all-reduce
    methods do (``simulate.Host.issue_s``): one element started as a bucket's launch starts
    it (the uncompressed compressor's ``reduce_async`` on the suite's counted collectives,
    ``runtime.comm.Comm``, its timeline recording as in a benchmark's timed rounds), every
    rank at once on ``group``; the median of ``iters`` after five untimed, each waited for
    outside its time. Mostly the process group's own enqueue: on a GPU with NCCL, host time a
    launch-bound backward cannot hide."""
    import torch
    import torch.distributed as dist

    import compression

    from .. import runtime
    from ..runtime.comm import Comm
    comm = Comm(dist.get_rank(group), dist.get_world_size(group), group=group)
    one = torch.zeros(1, device=device)
    codec = compression.NoCompression()
    times = []
    comm.timeline.start()
    try:
        for k in range(iters + 5):
            runtime.synchronize(one.device)
            start = time.perf_counter()
            with comm.about(lambda: "issue"):
                pending = codec.reduce_async((0,), one, comm, shapes=[one.shape])
            elapsed = time.perf_counter() - start
            pending.wait()
            if k >= 5:
                times.append(elapsed)
    finally:
        comm.timeline.stop()
    return {"issue_s": statistics.median(times), "issue_iters": iters}


def calibration_sizes(nbytes: list[int]) -> list[int]:
    """Message sizes for the in-run alpha/beta fit: every distinct tensor size and the whole
    gradient (the largest group MG-WFBP can form)."""
    return sorted(set(nbytes) | {sum(nbytes)}) if nbytes else []


def fit_allreduce(nbytes: list[int], *, group=None, device=None,
                  warmup: int = DEFAULT_COMM_WARMUP, iters: int = DEFAULT_COMM_ITERS) -> dict:
    """All-reduce micro-benchmark over ``calibration_sizes(nbytes)`` and its alpha-beta fit
    (``comm_bench.measure``). Collective; every rank gets the same numbers."""
    from . import comm_bench
    res = comm_bench.measure("allreduce", calibration_sizes(nbytes), group=group, device=device,
                             warmup=warmup, iters=iters)
    return {"alpha_s": res["fit"]["alpha_s"], "beta_s_per_byte": res["fit"]["beta_s_per_byte"],
            "worst_abs_error": res["fit"]["worst_abs_error"],
            "sizes_bytes": [r["size_bytes"] for r in res["rows"]],
            "times_s": [r["time_s"] for r in res["rows"]]}


def make_profile(model, model_name: str, forward_backward, *, device=None, group=None,
                 warmup: int = DEFAULT_WARMUP, iters: int = DEFAULT_ITERS,
                 comm_warmup: int = DEFAULT_COMM_WARMUP, comm_iters: int = DEFAULT_COMM_ITERS,
                 alpha: float | None = None, beta: float | None = None,
                 network: str | None = None, workload: dict | None = None) -> dict:
    """Profile ``model`` on this cluster and return rank 0's profile on every rank.

    Collective: every rank of ``group`` calls it. alpha/beta are fitted here unless both are
    given."""
    import torch.distributed as dist
    named = trainable(model)
    # the ranks meet before every pass, as a synchronous step's do (each waits for the
    # slowest: the per-step spread the model takes, predict.slowest_rank)
    meet = (lambda: dist.barrier(group=group)) if dist.get_world_size(group) > 1 else None
    measured = measure_layers(model, forward_backward, device=device, warmup=warmup, iters=iters,
                              step=meet)
    if alpha is None or beta is None:
        fit = fit_allreduce([p.numel() * p.element_size() for _, p in named], group=group,
                            device=device, warmup=comm_warmup, iters=comm_iters)
    else:
        fit = {"alpha_s": float(alpha), "beta_s_per_byte": float(beta), "given": True}
    # every rank's compute (forward and backward; its mean and each pass), rank order: the
    # others wait for the slowest in a synchronous step, and the model takes that
    # (predict.slowest_rank)
    gathered = [None] * dist.get_world_size(group)
    dist.all_gather_object(gathered, (float(measured["forward_s"]) + sum(measured["backward_s"]),
                                      [float(x) for x in measured["passes_s"]]), group=group)
    ranks, passes = [r for r, _ in gathered], [p for _, p in gathered]
    prof = None
    if dist.get_rank(group) == 0:
        order = measured["order"]
        prof = {
            "format": PROFILE_FORMAT, "version": PROFILE_VERSION, "model": model_name,
            "workload": workload or {},
            "tensors": [{"name": named[i][0], "shape": list(named[i][1].shape),
                         "bytes": named[i][1].numel() * named[i][1].element_size()}
                        for i in order],
            "backward_s": measured["backward_s"], "forward_s": measured["forward_s"],
            "forward_tensor_s": measured["forward_tensor_s"],
            "alpha_s": fit["alpha_s"], "beta_s_per_byte": fit["beta_s_per_byte"],
            "nworkers": dist.get_world_size(group), "backend": dist.get_backend(group),
            "device": device.type if device is not None else "cpu",
            "network": network,
            "iterations": {"warmup": warmup, "measured": iters},
            "comm_fit": fit,
            "rank_compute_s": ranks,
            "rank_passes_s": passes,
        }
    box = [prof]
    dist.broadcast_object_list(box, src=_global_rank0(group), group=group)
    return box[0]


def _global_rank0(group):
    import torch.distributed as dist
    return 0 if group is None else dist.get_global_rank(group, 0)


# --------------------------------------------------------------------------- command line

def parse_args(argv=None) -> argparse.Namespace:
    p = ArgumentParser(prog="python -m ddlbench.measure.profiler",
                       description=__doc__.split("\n")[0],
                       raise_errors=True, formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--model", default="resnet50")
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--sentence-len", type=int, default=64)
    p.add_argument("--vocab-size", type=int, default=None, help="BERT's vocabulary (default: "
                   "the model's)")
    p.add_argument("--image-size", type=int, default=None)
    p.add_argument("--num-classes", type=int, default=1000)
    p.add_argument("--optimizer", default="auto", choices=OPTIMIZERS,
                   help="the optimizer whose step is timed (the training script's choice)")
    p.add_argument("--momentum", type=float, default=None)
    p.add_argument("--weight-decay", type=float, default=0.0)
    p.add_argument("--lr", type=float, default=None)
    p.add_argument("--warmup", type=int, default=DEFAULT_WARMUP, help="untimed iterations")
    p.add_argument("--iters", type=int, default=DEFAULT_ITERS, help="measured iterations")
    p.add_argument("--comm-warmup", type=int, default=DEFAULT_COMM_WARMUP)
    p.add_argument("--comm-iters", type=int, default=DEFAULT_COMM_ITERS,
                   help="timed all-reduces per size for the alpha/beta fit")
    p.add_argument("--alpha", type=float, default=None,
                   help="seconds per message: use this instead of fitting (with --beta)")
    p.add_argument("--beta", type=float, default=None, help="seconds per byte (with --alpha)")
    p.add_argument("--min-group", type=int, default=DEFAULT_MIN_GROUP_ELEMENTS,
                   metavar="ELEMENTS",
                   help="for the printed groups: also merge groups smaller than this (0: off)")
    p.add_argument("--no-interference", action="store_true",
                   help="skip timing compute and all-reduces beside each other (the CPU "
                        "interference the performance model takes; a few seconds)")
    p.add_argument("--interference-iters", type=int, default=DEFAULT_INTERFERENCE_ITERS,
                   help="forward-backward passes alone and beside all-reduces")
    add_ps_flags(p, nservers_default=0, what="with --nservers: ",
                 nservers_help="parameter servers (extra processes): also time the interference "
                               "beside their push/pull (interference_ps), as a PS method's run "
                               "has it")
    p.add_argument("--output", default=None, help="write the profile here (rank 0)")
    p.add_argument("--nworkers", type=int, default=None)
    p.add_argument("--no-cuda", action="store_true")
    p.add_argument("--backend", default="auto", choices=("auto", "nccl", "gloo"))
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--seed", type=int, default=42)
    p.add_argument("--timeout", type=float, default=300.0)
    add_network_flags(p, net="; the all-reduce fit and the CPU interference are of that "
                             "network (a Gloo all-reduce over a 1 Gbit/s link takes the cores "
                             "far less than over loopback)")
    p.add_argument("--slots", type=int, default=None, metavar="S",
                   help="workers per emulated host, as the training script's --slots (with "
                        "--net: machines of S workers, so the all-reduces cross the emulated "
                        "link between machines and the loopback inside one, as in a run on "
                        "that layout; default: one worker per host under --net)")
    return p.parse_args(argv)


def check(args) -> None:
    workloads.check_workload(args, positive=("--iters", "--comm-iters", "--timeout",
                                             "--nworkers", "--threads", "--interference-iters",
                                             "--partition-bytes", "--slots"),
                             nonneg=("--nservers", "--warmup", "--comm-warmup", "--min-group",
                                     "--alpha", "--beta", "--seed", "--momentum",
                                     "--weight-decay", "--lr"))
    if args.output:
        check_writable(args.output)
    from .. import netem
    from ..launch import local
    local.check_slots(args.slots)
    netem.check(args.net)
    if (args.alpha is None) != (args.beta is None):
        raise UsageError("--alpha and --beta go together")


def main(argv=None) -> int:
    from ..launch.job import run_job
    argv = list(sys.argv[1:] if argv is None else argv)
    return run_job(argv, "ddlbench.measure.profiler", parse_args, check, worker)


def worker(args, placement) -> int:
    from .. import runtime
    from .workload import OptimizerSpec, Spec, learning_rate, make_optimizer, replica
    from ..netem import run_info

    def run(ctx) -> int:
        work, batch = replica(Spec.of(args), ctx)

        def forward_backward():
            work.loss(work.model, batch).backward()

        workload = {"batch_size": args.batch_size, **work.details}
        prof = make_profile(work.model, args.model, forward_backward, device=ctx.device,
                            warmup=args.warmup, iters=args.iters, comm_warmup=args.comm_warmup,
                            comm_iters=args.comm_iters, alpha=args.alpha, beta=args.beta,
                            network=args.network, workload=workload)
        prof["net"] = run_info(args.net)       # the emulated link, as a run's record has it
        prof["slots"] = args.slots             # workers per emulated host (None: not given)
        # CPU interference, for the performance model: every rank at once, as in training,
        # over the network the run uses; nothing to interfere with on one worker
        prof["interference"] = None
        if ctx.size > 1 and not args.no_interference:
            nbytes = interference_bytes([t["bytes"] for t in prof["tensors"]])
            prof["interference"] = measure_interference(
                work.model, forward_backward, nbytes, device=ctx.device,
                iters=args.interference_iters, comm_iters=args.comm_iters)
            if ctx.ps is not None:      # and beside the servers' push/pull (PS methods)
                prof["interference_ps"] = {**measure_interference(
                    work.model, forward_backward, nbytes, device=ctx.device,
                    iters=args.interference_iters, comm_iters=args.comm_iters, ps=ctx.ps,
                    ps_bytes=[t["bytes"] for t in prof["tensors"]]),
                    "nservers": args.nservers, "ps_clients": args.ps_clients,
                    "partition_bytes": args.partition_bytes}
        # The methods' own copies and divides, every rank at once, as in training
        prof["host"] = measure_host(work.model, forward_backward, device=ctx.device)
        # The machine the ranks shared (the model's core sharing when extrapolating:
        # ddlbench.model.cell.Machine): this rank's cores and torch threads
        import torch
        from ..hosts import pinning
        prof["machine"] = {"cores": len(pinning.available_cores()),
                           "threads": torch.get_num_threads()}
        # Last, as it changes the parameters: the optimizer's step, for the performance model
        # (python -m ddlbench.model.predict). Every rank steps at once, as in training.
        opt = OptimizerSpec.of(args)
        optimizer = make_optimizer(opt, work.model.parameters(), learning_rate(opt, ctx.size))
        seconds = time_optimizer(optimizer, forward_backward, device=ctx.device,
                                 warmup=args.warmup, iters=args.iters)
        prof["optimizer"] = type(optimizer).__name__
        prof["optimizer_s"] = seconds
        # On an accelerator, the host's side of the step (the model's two resources)
        prof["launch"] = None
        if ctx.device is not None and ctx.device.type != "cpu":
            index = {name: i for i, (name, _) in enumerate(trainable(work.model))}
            prof["launch"] = measure_launch(
                work.model, forward_backward, [index[t["name"]] for t in prof["tensors"]],
                device=ctx.device, optimizer=optimizer, warmup=args.warmup, iters=args.iters)
        if ctx.is_root:
            print(format_profile(prof, args.min_group), flush=True)
            if args.output:
                write_profile(args.output, prof)
                print(f"profile written to {args.output}", flush=True)
        return 0
    return runtime.start(placement, runtime.Job.of(args), run)


def time_optimizer(optimizer, forward_backward, *, device=None, warmup: int = DEFAULT_WARMUP,
                   iters: int = DEFAULT_ITERS) -> float:
    """Mean seconds of ``optimizer.step()`` over every parameter, after ``warmup`` untimed
    steps (the gradients of one ``forward_backward``; it changes the parameters)."""
    from .. import runtime
    forward_backward()
    for _ in range(warmup):
        optimizer.step()
    runtime.synchronize(device)
    start = time.perf_counter()
    for _ in range(max(1, iters)):
        optimizer.step()
    runtime.synchronize(device)
    seconds = (time.perf_counter() - start) / max(1, iters)
    optimizer.zero_grad(set_to_none=True)
    return seconds


def _interference_lines(x: dict | None) -> list[str]:
    if not x:
        return []

    def pct(v):
        return "-" if v is None else f"{100 * v:+.1f}%"
    what = "push/pulls" if x.get("op") == "pushpull" else "all-reduces"
    return [f"# interference: compute {pct(x['compute_slowdown'])} beside {what} of "
            f"{x['bytes'] / 1e6:.2f} MB, communication {pct(x['comm_slowdown'])} beside "
            f"compute ({x['compute_s'] * 1e3:.1f} -> "
            f"{(x['compute_beside_comm_s'] or math.nan) * 1e3:.1f} ms, "
            f"{x['comm_s'] * 1e3:.2f} -> {x['comm_beside_compute_s'] * 1e3:.2f} ms; "
            f"measured in {x['seconds']:.1f} s)"]


def _host_lines(x: dict | None) -> list[str]:
    if not x:
        return []

    def rate(s_per_byte):
        return f"{1e-9 / s_per_byte:.2f} GB/s" if s_per_byte > 0 else "-"
    issue = f", {x['issue_s'] * 1e6:.1f} us to issue a collective" if "issue_s" in x else ""
    outer = (f", an outer step {rate(x['outer_step_s_per_byte'])}"
             if "outer_step_s_per_byte" in x else "")
    return [f"# the methods' own work on {x['bytes'] / 1e6:.2f} MB of gradients: copy "
            f"{rate(x['copy_s_per_byte'])}, divide {rate(x['divide_s_per_byte'])}{outer}"
            f"{issue}"]


def _launch_lines(x: dict | None, prof: dict) -> list[str]:
    if not x:
        return []
    ms = 1e3
    return [f"# the host's side (launch): forward {x['forward_s'] * ms:.3f} ms, backward "
            f"{sum(x['backward_s']) * ms:.3f} ms (device {prof['forward_s'] * ms:.3f} and "
            f"{sum(prof['backward_s']) * ms:.3f} ms), optimizer "
            f"{x.get('optimizer_s', 0.0) * ms:.3f} ms; a method's gradient hook "
            f"{x['hook_s'] * 1e6:.1f} us"]


def _forward_lines(prof: dict) -> list[str]:
    shares = prof.get("forward_tensor_s")
    if shares is None:
        return []
    f = prof["forward_s"]
    return [f"# forward by tensor: {sum(shares) * 1e3:.3f} ms of {f * 1e3:.3f} ms "
            f"({100 * sum(shares) / f if f else 0:.0f}%) to the tensors' modules, "
            f"{sum(1 for x in shares if x == 0)} tensor(s) at 0"]


def _layout(prof: dict) -> str:
    """Where the workers ran, for the profile's first line: the emulated network and the
    workers per emulated host, where given."""
    net, slots = prof.get("net") or {}, prof.get("slots")
    where = f", over {net['profile']} (emulated)" if net.get("emulated") else ""
    return where + (f", {slots} worker(s) per machine" if slots else "")


def format_profile(prof: dict, min_group: int) -> str:
    from ..planning import merge_groups, schedule_time
    nbytes = [t["bytes"] for t in prof["tensors"]]
    tb = prof["backward_s"]
    a, b = prof["alpha_s"], prof["beta_s_per_byte"]
    lines = [f"# {prof['model']}: {len(nbytes)} tensors, forward {prof['forward_s'] * 1e3:.3f} ms, "
             f"backward {sum(tb) * 1e3:.3f} ms (sum over tensors); measured on "
             f"{prof['nworkers']} worker(s), {prof['backend']}, {prof['device']}"
             + _layout(prof),
             f"# alpha = {a * 1e6:.2f} us, beta = {b * 1e9:.4f} ns/B"
             + (f"; optimizer {prof['optimizer']} step {prof['optimizer_s'] * 1e3:.3f} ms"
                if prof.get("optimizer_s") is not None else ""),
             *_forward_lines(prof),
             *_interference_lines(prof.get("interference")),
             *_interference_lines(prof.get("interference_ps")),
             *_host_lines(prof.get("host")),
             *_launch_lines(prof.get("launch"), prof),
             f"# {'backward':>8} {'bytes':>11} {'tb (ms)':>10}  tensor"]
    for k, (t, x) in enumerate(zip(prof["tensors"], tb)):
        lines.append(f"  {k:8d} {t['bytes']:11d} {x * 1e3:10.4f}  {t['name']}")
    first = prof["tensors"][0] if prof["tensors"] else {"bytes": 4, "shape": [1]}
    element = first["bytes"] // max(1, math.prod(first["shape"]))  # min_group is in elements
    groups = merge_groups(tb, nbytes, a, b, min_group * element)
    sizes = [sum(nbytes[i] for i in g) for g in groups]
    wfbp = schedule_time(tb, nbytes, [[i] for i in range(len(nbytes))], a, b)
    mg = schedule_time(tb, nbytes, groups, a, b)
    lines.append(f"MG-WFBP groups: {len(groups)} (bytes, backward order): {sizes}")
    lines.append(f"predicted backward + communication: WFBP {wfbp * 1e3:.3f} ms, "
                 f"MG-WFBP {mg * 1e3:.3f} ms")
    return "\n".join(lines)


if __name__ == "__main__":
    from ddlbench.errors import finish
    sys.exit(finish(main()))

"""``--verify``: prove a method right against plain synchronous SGD on the averaged gradient.

The reference shares no code with any method's communication path. A tensor hook on every
parameter copies the rank's *local* gradient as autograd produces it, before any method's hook
can touch it; after the method's step the copies of all ranks are summed in float64 (gathered,
with a compressor), averaged and given to the same optimizer class acting on copies of the
parameters. Each rank then compares its own parameters with the reference, and rank 0's
parameters with every other rank's: replicas must be bit-identical.

The reference parameters and optimizer keep the model's own precision (fp32): the optimizer's
arithmetic is then the same as the method's, step for step, and any difference comes from how
the gradient was averaged. (A float64 optimizer would differ from the fp32 one by itself, most
visibly with Adam plus weight decay, where ``g + wd * p`` cancels and the step is normalised.)

A parameter passes when ``|p - ref| <= atol + rtol * |ref|`` elementwise: fp32 reordering of
sums gives errors of a few ulps, while a gradient that was not averaged, averaged twice, or
applied late is off by orders of magnitude more.

With a compressor, the gathered local gradients are grouped into the method's buckets of that
step (``method.plan()``, a ``BucketPlan`` of parameter slices: asked before the step's backward
when the method declares its plan known then, since it may re-plan after its first step; after
the step when it decides its buckets during the step, as DDP does) and each bucket goes through
the compressor's mathematics as written independently in ``compression/reference.py`` (its own
state: residuals, PowerSGD's Q), in place of the plain average. Where that mathematics allows a
correct implementation to differ by more than fp32 reordering (fp16's half-precision sums,
PowerSGD's fp32 factorisation), it returns a per-element bound on the averaged gradient; for SGD
the bound is carried through the optimizer's linear update (momentum, weight decay, dampening,
Nesterov) into a per-element allowance added to the tolerance. Adam and AdamW normalise each
element's step, which is not linear in the gradient: there the allowance grows, each step, by lr
times the largest difference two normalised steps can have (twice the largest step, from the
betas and the step count) times the element's relative uncertainty (twice its bound over its
averaged gradient, at most 1; the largest so far, since the moments keep every step's error). An
element whose averaged gradient is below its rounding (a sign the half sums may flip) is then
allowed a step's difference; the others a fraction of lr as small as their rounding.

A method that changes the algorithm (``Method.changes_algorithm``: periodic averaging) names
its own mathematics instead (``Method.reference_for``: ``module:Class``, written apart from
it, as a compressor's is): ``Replicas`` gathers every rank's local gradients and hands them to
that simulation of the P replicas, and each rank is compared with its own simulated replica.
The replicas differ between syncs: they must be bit-identical only after a step the simulation
says synced them.
"""
from __future__ import annotations

import math
import os
from typing import TYPE_CHECKING

import torch
import torch.distributed as dist

from . import methods, session
from .methods.base import BEFORE_STEP
from .measure import workload
from .timeline import WAIT

if TYPE_CHECKING:
    from .run_config import RunConfig

DEFAULT_RTOL = 1e-5
DEFAULT_ATOL = 1e-7
# Adam normalises every element's step to about lr, so a rounding difference in a near-zero
# averaged gradient (fp32 sums of P values in another order) can move that element's step by a
# visible fraction of lr - measured up to 1% of lr with 4 workers - but never by more than about
# lr, while a communication bug (a gradient left local, stale or missing) moves it by about lr.
# AdamW has the same normalised step; its decoupled decay, lr * wd * p, is computed from the
# same parameters on both sides and adds only rounding, so the same bound holds. Both are
# blind to the gradient's scale (a sum instead of an average gives the same step): only SGD
# verifies the division by the workers.
ADAM_ATOL_FRACTION_OF_LR = 0.05


def adam_step_bound(beta1: float, beta2: float, t: int) -> float:
    """The largest |m_hat / sqrt(v_hat)| Adam can take at step ``t`` (eps aside), in units of
    lr, over every gradient history: by Cauchy-Schwarz on m = (1 - b1) sum b1^k g_k and
    v = (1 - b2) sum b2^k g_k^2, with their bias corrections. 1 at the first step (sign(g))."""
    ratio = beta1 * beta1 / beta2
    series = t if ratio == 1 else (1 - ratio ** t) / (1 - ratio)
    return ((1 - beta1) / math.sqrt(1 - beta2) * math.sqrt(1 - beta2 ** t)
            / (1 - beta1 ** t) * math.sqrt(series))


def default_tolerance(optimizer: str, lr: float) -> tuple[float, float]:
    """(rtol, atol) for ``--verify`` when not given on the command line; ``optimizer`` is the
    resolved name (``workload.optimizer_name``: sgd, adam or adamw)."""
    if optimizer in ("adam", "adamw"):
        return DEFAULT_RTOL, ADAM_ATOL_FRACTION_OF_LR * lr
    return DEFAULT_RTOL, DEFAULT_ATOL


def _tiles(intervals, n) -> bool:
    """Whether the sorted (start, end) intervals cover [0, n) exactly once (an empty tensor:
    one empty interval)."""
    if n == 0:
        return intervals == [(0, 0)]
    at = 0
    for a, b in intervals:
        if a != at or b <= a:
            return False
        at = b
    return at == n


class Reference:
    # whether the replicas must be identical after the step just taken: always, for
    # synchronous SGD (``Replicas``: only after a sync)
    synced = True

    def __init__(self, model, make_optimizer, ctx, rtol=DEFAULT_RTOL, atol=DEFAULT_ATOL,
                 compression=None, method=None):
        """``compression``: a ``compression.reference.ReferenceMath`` (None: plain average);
        ``method``: the method verified, whose declared hooks say where the whole parameters
        and the local gradients are (``full_parameters``, ``hook_local_gradients``; None:
        ``model``'s parameters themselves)."""
        self.ctx = ctx
        self.rtol, self.atol = rtol, atol
        self.method = method
        self.params = (list(method.full_parameters()) if method is not None
                       else [p for p in model.parameters() if p.requires_grad])
        self.ref = [p.detach().clone() for p in self.params]
        self.opt = make_optimizer(self.ref)
        self.local: list[torch.Tensor | None] = [None] * len(self.params)
        self.math = compression
        # Per-element allowance for a compressor's legitimate rounding, carried through SGD.
        self.allow: list[torch.Tensor] | None = None
        self._allow_buf: list[torch.Tensor | None] = [None] * len(self.params)
        self._uncertain: list[torch.Tensor | None] = [None] * len(self.params)  # Adam's
        self._steps = 0
        if method is not None:
            self._handles = method.hook_local_gradients(
                lambda i, grad: self._capture_hook(i)(grad))
        else:
            self._handles = [p.register_hook(self._capture_hook(i))
                             for i, p in enumerate(self.params)]

    def _current(self) -> list:
        """The parameters as they stand now, whole (a collective where the method gathers)."""
        return list(self.method.full_parameters()) if self.method is not None else self.params

    def _capture_hook(self, i):
        def capture(grad):
            self.local[i] = grad.detach().to(torch.float64, copy=True)
            return None  # leave the gradient as it is
        return capture

    def step(self, plan=None) -> None:
        """Average every rank's captured gradient in float64 and update the reference.
        ``plan``: the method's ``BucketPlan`` of this step, needed with a compressor."""
        flat = torch.cat([(g if g is not None else torch.zeros_like(r, dtype=torch.float64))
                          .reshape(-1)
                          for g, r in zip(self.local, self.ref)])
        device = flat.device if self.ctx.backend == "nccl" else torch.device("cpu")
        flat = flat.to(device)
        bound = None
        if self.math is None:
            # A float64 sum of fp32 values: exact to about 1e-16 in any order, and the same on
            # every rank (the collective hands every rank the same reduced bytes).
            dist.all_reduce(flat)
            average = flat / self.ctx.size
        else:
            # A compressor's mathematics needs each rank's own gradient.
            gathered = [torch.empty_like(flat) for _ in range(self.ctx.size)]
            dist.all_gather(gathered, flat)
            average, bound = self._compressed_average(gathered, plan)
        offset = 0
        for r in self.ref:
            n = r.numel()
            r.grad = average[offset:offset + n].view_as(r).to(device=r.device, dtype=r.dtype)
            offset += n
        self._steps += 1
        if bound is not None:
            self._carry_allowance(bound)
            self._carry_adam_allowance(bound, average)
        self.opt.step()
        self.local = [None] * len(self.params)

    def _compressed_average(self, gathered, plan):
        """The compressor's mathematics applied bucket by bucket to every rank's gradient.

        A bucket lists slices of parameters' flat gradients: a whole parameter is named by its
        index and keeps its shape; a part of one (a method that cuts tensors into chunks) is
        named by (index, start, end) and shaped as a vector."""
        sizes = [r.numel() for r in self.ref]
        starts = [0]
        for n in sizes:
            starts.append(starts[-1] + n)

        def invalid():
            return RuntimeError("verify with a compressor: the method's plan() must cover "
                                f"every parameter exactly once, got {plan}")
        pieces = {i: [] for i in range(len(self.ref))}
        buckets = []  # per bucket: [(name, shape, begin, end)] in the flat gradient
        for members in (plan.buckets if plan is not None else ()):
            bucket = []
            for piece in members:
                i, a, b = piece.param, piece.start, piece.end
                if i not in pieces or not 0 <= a <= b <= sizes[i]:
                    raise invalid()
                whole = (a, b) == (0, sizes[i])
                name, shape = (i, self.ref[i].shape) if whole else ((i, a, b), (b - a,))
                pieces[i].append((a, b))
                bucket.append((name, shape, starts[i] + a, starts[i] + b))
            buckets.append(bucket)
        if not buckets or not all(_tiles(sorted(p), sizes[i]) for i, p in pieces.items()):
            raise invalid()
        average = torch.zeros_like(gathered[0])
        bound = torch.zeros_like(gathered[0])
        bounded = False  # None from every bucket: as exact as the dense average
        for bucket in buckets:
            per_rank = [torch.cat([x[begin:end] for _, _, begin, end in bucket])
                        for x in gathered]
            avg, b = self.math.aggregate([name for name, *_ in bucket], per_rank,
                                         [shape for _, shape, _, _ in bucket])
            offset = 0
            for _, _, begin, end in bucket:
                average[begin:end] = avg[offset:offset + end - begin]
                if b is not None:
                    bound[begin:end] = b[offset:offset + end - begin]
                    bounded = True
                offset += end - begin
        return average, (bound if bounded else None)

    def _carry_allowance(self, bound) -> None:
        """Carry a per-element bound on the averaged gradient through torch.optim.SGD's update
        (the same recurrence on |errors|): d = g + wd p; buf = mu buf + (1 - dampening) d
        (buf = d on the first step); step = d + mu buf (Nesterov) or buf; p -= lr step."""
        if not isinstance(self.opt, torch.optim.SGD):
            return
        for group, i, (e,) in self._per_parameter(bound):
            lr, mu, wd = group["lr"], group["momentum"], group["weight_decay"]
            damp, nesterov = group["dampening"], group["nesterov"]
            e = e + wd * self.allow[i]
            if mu:
                prev = self._allow_buf[i]
                buf = e.clone() if prev is None else mu * prev + (1 - damp) * e
                self._allow_buf[i] = buf
                e = e + mu * buf if nesterov else buf
            self.allow[i] += lr * e

    def _carry_adam_allowance(self, bound, average) -> None:
        """Under Adam or AdamW: per element, lr times the largest difference of two of its
        normalised steps at this step count (``adam_step_bound``, twice) times its relative
        uncertainty so far (min(1, 2 e / |g|), the largest yet), added to the allowance."""
        if not isinstance(self.opt, (torch.optim.Adam, torch.optim.AdamW)):
            return
        for group, i, (e, g) in self._per_parameter(bound, average):
            beta1, beta2 = group["betas"]
            reach = 2 * group["lr"] * adam_step_bound(beta1, beta2, self._steps)
            u = torch.where(e > 0, (2 * e / g.abs().clamp_min(1e-300)).clamp(max=1.0),
                            torch.zeros_like(e))
            prev = self._uncertain[i]
            self._uncertain[i] = u if prev is None else torch.maximum(prev, u)
            self.allow[i] += reach * self._uncertain[i]

    def _per_parameter(self, *flats):
        """(its optimizer group, its index, its part of each flat tensor shaped as it) for
        every reference parameter; the allowance made if there is none yet."""
        if self.allow is None:
            self.allow = [torch.zeros_like(r, dtype=torch.float64) for r in self.ref]
        index = {id(r): i for i, r in enumerate(self.ref)}
        starts = [0]
        for r in self.ref:
            starts.append(starts[-1] + r.numel())
        for group in self.opt.param_groups:
            for param in group["params"]:
                i = index[id(param)]
                device = self.allow[i].device
                yield group, i, tuple(f[starts[i]:starts[i + 1]].view_as(self.ref[i]).to(device)
                                      for f in flats)

    def compare(self) -> tuple[float, float]:
        """(max |p - ref|, worst |p - ref| / (atol + rtol |ref| + allowance)) over every rank
        (the allowance: a compressor's legitimate rounding, zero without one)."""
        max_abs, worst = 0.0, 0.0
        with torch.no_grad():
            for i, (p, r) in enumerate(zip(self._current(), self.ref)):
                r64 = r.to(torch.float64)
                diff = (p.detach().to(torch.float64) - r64).abs()
                max_abs = max(max_abs, float(diff.max()))
                tol = self.atol + self.rtol * r64.abs()
                if self.allow is not None:
                    tol = tol + self.allow[i].to(tol.device)
                worst = max(worst, float((diff / tol).max()))
        t = torch.tensor([max_abs, worst], dtype=torch.float64,
                         device=self.ctx.device if self.ctx.backend == "nccl" else "cpu")
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        return float(t[0]), float(t[1])

    def replica_spread(self) -> float:
        """max |p - p on rank 0| over every parameter and rank: data-parallel replicas must be
        bit-identical after each step (every rank decodes the same exchanged data)."""
        with torch.no_grad():
            params = self._current()
            dtypes = {p.dtype for p in params}
            dtype = dtypes.pop() if len(dtypes) == 1 else torch.float64  # exact either way
            mine = torch.cat([p.detach().reshape(-1).to(dtype) for p in params])
            if self.ctx.backend != "nccl":
                mine = mine.cpu()
            root = mine.clone()
            dist.broadcast(root, 0)
            t = (mine - root).abs().max().reshape(1)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        return float(t[0])

    def max_allowance(self) -> float | None:
        """The largest per-element allowance for the compressor's rounding (None: none)."""
        if self.allow is None:
            return None
        return max((float(a.max()) for a in self.allow), default=0.0)

    def close(self) -> None:
        for h in self._handles:
            h.remove()


class Replicas(Reference):
    """The reference of a method that changes the algorithm: ``simulation`` (its
    ``reference_for`` class: ``step(per_rank) -> synced``, ``replicas``) steps the P replicas
    on every rank's captured local gradient; this rank's parameters are compared with its own
    simulated replica, and the replicas with each other only when it synced."""

    def __init__(self, model, simulation, ctx, rtol=DEFAULT_RTOL, atol=DEFAULT_ATOL):
        super().__init__(model, lambda _params: None, ctx, rtol=rtol, atol=atol)
        self.simulation = simulation
        self.synced = False

    def step(self, plan=None) -> None:
        sizes = [r.numel() for r in self.ref]
        flat = torch.cat([(g if g is not None else torch.zeros(n, dtype=torch.float64,
                                                               device=p.device)).reshape(-1)
                          for g, n, p in zip(self.local, sizes, self.params)])
        have = torch.tensor([g is not None for g in self.local], dtype=torch.int32)
        device = flat.device if self.ctx.backend == "nccl" else torch.device("cpu")
        flat, have = flat.to(device), have.to(device)
        gathered = [torch.empty_like(flat) for _ in range(self.ctx.size)]
        dist.all_gather(gathered, flat)
        haves = [torch.empty_like(have) for _ in range(self.ctx.size)]
        dist.all_gather(haves, have)
        per_rank = []
        for x, h in zip(gathered, haves):
            grads, offset = [], 0
            for p, n, present in zip(self.params, sizes, h.tolist()):
                grads.append(x[offset:offset + n].view(p.shape) if present else None)
                offset += n
            per_rank.append(grads)
        self.synced = bool(self.simulation.step(per_rank))
        self.ref = self.simulation.replicas[self.ctx.rank]
        self._steps += 1
        self.local = [None] * len(self.params)


# -- the --verify loop ------------------------------------------------------------------------

def run(config: RunConfig, ctx) -> int:
    """Run every (method, compressor) pair of ``config`` for ``--verify STEPS`` steps beside
    the reference, one line per step on rank 0; 1 when any step of any pair failed."""
    lr = workload.learning_rate(config.optimizer, ctx.size)
    rtol, atol = default_tolerance(workload.optimizer_name(config.optimizer), lr)
    rtol = rtol if config.rtol is None else config.rtol
    atol = atol if config.atol is None else config.atol
    failed = []
    if any(methods.lookup(m, config.engine).architecture == methods.PS for m, _ in config.runs):
        from .methods.ps import servers_line
        _log(ctx, f"verify: parameter servers: {servers_line(ctx.nservers)}")
    for method_id, comp in config.runs:
        name = method_id if comp == "none" else f"{method_id}+{comp}"
        if not _verify_one(config, ctx, method_id, comp, name, rtol, atol):
            failed.append(name)
    _log(ctx, f"verify: {ctx.size} worker(s), {config.spec.model}: "
         + ("all methods match the reference" if not failed
            else f"FAILED: {', '.join(failed)}"))
    return 1 if failed else 0


def _verify_one(config: RunConfig, ctx, method_id, comp, name, rtol, atol) -> bool:
    run = session.build(config, ctx, method_id, comp)
    with run.method as method:
        run.calibrate()
        math = None
        if comp != "none":
            math = reference_math(comp, ctx.size, method.params[0].dtype,
                                  config.compressor_options, config.engine)

        def make_optimizer(params):
            return workload.make_optimizer(run.optimizer_spec, params, run.lr)
        own = method.reference_for(method.options, workload.optimizer_name(config.optimizer))
        if own:
            _log(ctx, f"verify {name}: it changes the algorithm; against {own}, its "
                      f"{ctx.size} replicas simulated in one process")
            reference = Replicas(run.work.model, method_math(own, method, ctx.size,
                                                             make_optimizer),
                                 ctx, rtol=rtol, atol=atol)
        else:
            reference = Reference(run.work.model, make_optimizer, ctx, rtol=rtol, atol=atol,
                                  compression=math, method=method)
        recording = _Recording(config, ctx, run, name)
        ok = True
        try:
            for step in range(1, config.verify + 1):
                ok &= _step(run, reference, math is not None, name, step, ctx)
        finally:
            reference.close()
        recording.finish()
        if config.save_params:
            whole = method.full_parameters()   # (every rank: a method may gather them)
            if ctx.is_root:
                _save_params(config.save_params.replace("{method}", name),
                             zip(method.param_names, whole))
    run.write_trace(config.trace_collectives, name)
    return ok


def reference_math(comp: str, world: int, dtype, values: dict, engine: str = "torch"):
    """Compressor ``comp``'s mathematics, written apart from its exchange path: the class its
    declaration names (``reference``, ``module:Class``; the built-ins'
    ``compression.reference.ReferenceMath``), constructed as (id, workers, dtype=, its own
    options resolved from ``values``); ``aggregate(names, per_rank, shapes)`` per bucket."""
    import compression
    cls = _loaded(compression.reference_of(comp), f"compressor {comp!r}")
    options = compression.lookup(comp).Options.resolve(values).as_dict()
    if comp in compression.BUILTIN:
        # Horovod's fp16 casts, sums in half and divides the half sum ("after")
        options["fp16_divide"] = "after" if engine == "horovod" else "before"
    return cls(comp, world, dtype=dtype, **options)


def method_math(target: str, method, world: int, make_optimizer):
    """The mathematics a method that changes the algorithm names (``target``,
    ``module:Class``, from its ``reference_for``), constructed as (workers, the model's
    parameters, the run's optimizer on other tensors, the method's resolved options)."""
    cls = _loaded(target, f"method {method.id or type(method).__name__}")
    return cls(world, method.params, make_optimizer, **method.options.as_dict())


def _loaded(target: str, whose: str):
    """The class ``target`` (``module:Class``) names: ``whose`` reference; one line when it
    cannot be loaded."""
    import importlib

    from .errors import UsageError
    module, _, attr = target.partition(":")
    try:
        return getattr(importlib.import_module(module), attr)
    except Exception as e:  # ImportError, AttributeError, or the module's own error
        raise UsageError(f"{whose}: cannot load its reference {target!r}: "
                         f"{type(e).__name__}: {e}") from None


def _step(run, reference, compressed: bool, name: str, step: int, ctx) -> bool:
    """One step of the method beside the reference; the step's line; whether it passed."""
    method = run.method
    # The buckets this step uses: asked before it (a method may re-plan after a step), or
    # after it from a method that decides them during backward.
    before = compressed and method.plan_known == BEFORE_STEP
    plan = method.plan() if before else None
    tl = run.comm.timeline  # records with --timeline PATH, off otherwise
    with tl.iteration():
        run.train_step(zero_grad=False)
    with tl.span("synchronize", WAIT):
        method.synchronize()
    if compressed and not before:
        plan = method.plan()
    reference.step(plan)
    max_abs, worst = reference.compare()
    # (every rank takes the same branch: the replica check is collective)
    spread = reference.replica_spread() if reference.synced else None
    ok = worst <= 1.0 and spread in (0.0, None)
    allowance = reference.max_allowance()
    extra = f", compressor allowance <= {allowance:.1e}" if allowance is not None else ""
    extra += (", replicas apart until the next sync" if spread is None
              else ", replicas identical" if spread == 0.0
              else f", replicas differ by up to {spread:.3e}")
    _log(ctx, f"verify {name} step {step}: max |param - reference| = {max_abs:.3e} "
         f"({worst:.3f} of tolerance, rtol {reference.rtol:g} atol {reference.atol:g}{extra}) "
         f"{'OK' if ok else 'FAIL'}")
    method.zero_grad()
    return ok


class _Recording:
    """``--timeline PATH`` under ``--verify``: the method's verified steps recorded as a
    benchmark's timed rounds are (each step an iteration, its closing ``synchronize()`` a wait;
    the reference's work between steps is outside them), parameter servers included, and
    written to PATH with ``{method}`` replaced; nothing without ``--timeline``."""

    def __init__(self, config: RunConfig, ctx, run, name: str):
        self.ctx, self.run, self.name = ctx, run, name
        self.path = config.timeline.replace("{method}", name) if config.timeline else None
        self.meta = {"method": name, "model": config.spec.model, "nworkers": ctx.size,
                     "net": config.net, "verify": config.verify}
        self.steps = config.verify
        if self.path is None:
            return
        from .measure import overlap
        tl = run.comm.timeline
        run.watch(config)
        self.servers = run.servers_recorded(config, ctx)
        self.clock = overlap.align(ctx.device if ctx.backend == "nccl" else None)
        if self.servers:
            overlap.servers_start(ctx.ps, ctx.rank)
        tl.start()

    def finish(self) -> None:
        if self.path is None:
            return
        from .measure import overlap
        tl, ctx = self.run.comm.timeline, self.ctx
        tl.stop()
        self.run.unwatch()
        served = overlap.servers_stop(ctx.ps, ctx.rank) if self.servers else None
        overlap.collect(tl, ctx.rank, ctx.size, self.clock, self.path, meta=self.meta,
                        servers=served, server_iterations=self.steps)
        _log(ctx, f"verify {self.name}: timeline {self.path}")


def _log(ctx, line: str) -> None:
    if ctx.is_root:
        print(line, flush=True)


def _save_params(path: str, named) -> None:
    import numpy as np
    arrays = {n: p.detach().cpu().double().numpy() for n, p in named}
    tmp = path + ".tmp.npz"
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)  # as --output's
    np.savez(tmp, **arrays)
    os.replace(tmp, path)

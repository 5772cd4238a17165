"""Sharded data parallel, ZeRO stages 1 and 2 (DeepSpeed's ZeRO-1/2, Megatron's distributed
optimizer), on the suite's declared collectives: ``zero``.

Gradients are packed in backward order into buckets of at most ``--threshold`` bytes (as tensor
fusion packs them), started in bucket order from the gradient hooks on the communication
thread. Each bucket is reduce-scattered instead of all-reduced: worker r of the shard group
(size s) receives the sum of every worker's elements ``r*L:(r+1)*L`` of the bucket (L = its
length padded to a multiple of s, divided by s), by the carrier ``--rs-carrier`` names
(``collectives``: ``a2a``, an all-to-all and a local sum in rank order, Gloo's default;
``native``, the backend's own, NCCL's default; ``auto``, the backend's declared default).

The optimizer steps only this worker's shards: the method builds, once, a flat fp32 tensor per
bucket holding its shard of the bucket's parameters, and an optimizer of the user's class with
the user's per-group hyper-parameters over those shards (its state, momentum or Adam's moments,
exists for 1/s of the parameters). That is exact for optimizers whose update is elementwise
(SGD with momentum, weight decay and Nesterov, Adam, AdamW, ...), which is every optimizer the
suite builds; a bucket never mixes parameter groups. After the step the shards are all-gathered
into the bucket's flat parameter buffer, of which every parameter is a view: either at once
(``--gather-prefetch 0``, the step waits for them, as DeepSpeed ZeRO-1/2 does) or issued in
forward order at the end of the step and waited for by a forward pre-hook on each module just
before it needs its parameters (``--gather-prefetch 1``), so the all-gathers overlap the next
forward; ``synchronize()`` waits for every one.

Stage 1 (``--zero-stage 1``) keeps every gradient: each parameter's ``.grad`` is a view into its
bucket's padded buffer (as fusion's), reduce-scattered in place. Stage 2 frees them: when a
bucket is started its gradients are packed into a fresh flat tensor and set to None, and that
tensor is dropped once the bucket's reduce-scatter is done, so a worker holds the gradient
shards (1/s) plus the buckets in flight. The record gives the optimizer-state and gradient
bytes each worker holds (``memory``).

``hsdp`` is hybrid sharding (torch's HSDP, MiCS): the shard group is this worker's machine
(``collectives.MACHINE``), and each reduce-scattered shard is then all-reduced across machines
(``ACROSS``: the workers with this local index), so the optimizer state is sharded l ways and
replicated n ways, and only 2(n-1)/n of a shard crosses the machines' network.

Bytes per worker per step, G the gradient bytes (padded): reduce-scatter (s-1)/s G (``a2a``;
``native`` on Gloo runs as an all-reduce, 2(s-1)/s G) plus all-gather (s-1)/s G; HSDP adds
2(n-1)/n G/l across. The gradient is divided by the whole job's P after the reduction, on the
shard (1/s of the division an all-reduce needs).

The bucket plan follows the gradient-ready order rank 0 observes in ``calibrate()`` (one
forward and backward with the hooks only recording; the buckets and shards are then re-planned
before any optimizer state exists); without a calibration, reverse registration order.
"""
from __future__ import annotations

from dataclasses import dataclass

from ..collectives import ACROSS, TWO_LEVEL, MACHINE, WORLD, declared
from ..options import Options, one_of, option
from ..planning import HOROVOD_DEFAULT_THRESHOLD
from . import rules, threads
from .allreduce import Bucket, BucketedAllReduce, threshold_option, zero_all
from .base import require_even_machines

STAGES = one_of("2", "1")
CARRIERS = one_of("auto", "a2a", "native", "ring", "two-level")
GATHER_CARRIERS = one_of("auto", "native", "two-level")
SWITCH = one_of("1", "0")


@dataclass(frozen=True)
class ZeroOptions(Options):
    threshold: float = threshold_option(
        float(HOROVOD_DEFAULT_THRESHOLD),
        "bucket size in bytes (gradients packed as tensor fusion packs them; 0 = one bucket "
        "per tensor)")
    zero_stage: str = option(
        "2", STAGES, "ZeRO stage: 1 keeps every gradient, 2 frees each bucket's gradients "
        "once reduce-scattered (both shard the optimizer state)")
    rs_carrier: str = option(
        "auto", CARRIERS, "how gradients are reduce-scattered: a2a (all-to-all + local sum in "
        "rank order), native (the backend's reduce-scatter), ring (P-1 steps to the next rank, "
        "on the communication thread), two-level (inside the machine, then 1/l across machines), "
        "auto (the backend's default)")
    ag_carrier: str = option(
        "auto", GATHER_CARRIERS, "how the updated shards are all-gathered: native (the "
        "backend's all-gather), two-level (across machines, then inside the machine), auto (the "
        "backend's default)")
    gather_prefetch: str = option(
        "1", SWITCH, "1: all-gather the updated shards in forward order after the step, each "
        "waited for by the module that needs it; 0: the step waits for every all-gather")


class _ShardedBucket(Bucket):
    """A bucket whose flat gradient is reduce-scattered among ``parts`` workers: its length
    padded to a multiple of ``parts``; stage 1 (``keep``) keeps a padded buffer whose views are
    the gradients (as ``Bucket``'s, even for a lone tensor), stage 2 none (packed when
    started)."""

    def __init__(self, params: list, members: list[int], parts: int, keep: bool):
        import torch
        self.members = members
        self.params = [params[i] for i in members]
        self.sizes = [p.numel() for p in self.params]
        self.numel = sum(self.sizes)
        self.nbytes = sum(p.numel() * p.element_size() for p in self.params)
        self.padded = -(-self.numel // parts) * parts
        self.shard_len = self.padded // parts
        first = self.params[0]
        self.dtype, self.device = first.dtype, first.device
        self.buffer = self.views = None
        if keep:
            self.buffer = torch.zeros(self.padded, dtype=first.dtype, device=first.device)
            self.views = [flat.view(p.shape) for flat, p in
                          zip(self.buffer[:self.numel].split(self.sizes), self.params)]
        self.reduced = None
        self.label = None
        self.ready = 0
        self.pending = None
        self.flat = None
        # the bucket's parameters: a padded flat buffer, each parameter a view of it, and this
        # worker's shard of it (what the optimizer steps), set by the method
        self.weights = None
        self.shard = None
        self.grad_shard = None
        self.gather = None   # the all-gather of the updated shard, while in flight

    def pack(self):
        """The bucket's padded flat gradient: the buffer (stage 1), or a fresh tensor with the
        gradients copied in and set to None (stage 2; a missing one counts as zeros)."""
        import torch
        if self.views is not None:
            self.adopt()
            return self.buffer
        flat = torch.empty(self.padded, dtype=self.dtype, device=self.device)
        dsts, srcs, zeros = [], [], [flat[self.numel:]]
        for part, p in zip(flat[:self.numel].split(self.sizes), self.params):
            if p.grad is None:
                zeros.append(part)
            else:
                dsts.append(part.view(p.shape))
                srcs.append(p.grad)
        from ..compat import copy_all
        copy_all(dsts, srcs)
        zero_all([z for z in zeros if z.numel()])
        for p in self.params:
            p.grad = None
        return flat


class Zero(BucketedAllReduce):
    id = "zero"
    display = "ZeRO-A2A"
    summary = ("ZeRO-1/2 sharded data parallel: gradients packed in backward order into buckets "
               "of at most `--threshold` bytes, each reduce-scattered as it completes; the "
               "optimizer steps this worker's 1/P shard; the shards all-gathered before (or "
               "overlapping) the next forward (`hsdp`: sharded inside each machine)")
    Options = ZeroOptions
    shard_layout = WORLD   # the group that shares the optimizer state
    rule = rules.Rule(grouping=rules.fused, advise=rules.threshold_grid,
                      exchange=(rules.Step("reduce_scatter", WORLD,
                                           carrier_option="rs_carrier"),),
                      gather=(rules.Step("allgather", WORLD, carrier_option="ag_carrier"),),
                      optimizer_shard=WORLD, prefetch="gather_prefetch", divide_shard=WORLD,
                      divide_in_step=True)
    rebuild = False  # the plan follows the order rank 0 observed in calibrate()

    @classmethod
    def accepts(cls, compressor: str) -> str | None:
        return None if compressor == "none" else (
            "it reduce-scatters each bucket by its own collectives, not through a compressor")

    @classmethod
    def fusion_threshold(cls, options, nbytes: list[int]) -> float:
        return float(options.threshold)

    @classmethod
    def refuses(cls, options) -> str | None:
        if cls.shard_layout != WORLD and TWO_LEVEL in (options.rs_carrier, options.ag_carrier):
            return (f"method {cls.id} shards on the machine: its collectives there have no "
                    f"level to split (--rs-carrier and --ag-carrier two-level are zero's)")
        return None

    def __init__(self, model, optimizer, comm, options=None, compressor=None, model_name=None):
        self._calibrating = False
        hsdp = self.shard_layout != WORLD
        # (built on every rank, in the constructor: building a group is collective)
        self.shards = comm.group_of(self.shard_layout)
        self.across = comm.group_of(ACROSS) if hsdp else None
        if hsdp:
            require_even_machines(self.id, comm)
        given = options if options is not None else self.Options()
        refused = self.refuses(given)
        if refused:
            from ..errors import UsageError
            raise UsageError(refused)
        if TWO_LEVEL in (given.rs_carrier, given.ag_carrier):
            comm.levels()   # (its groups built here, on every rank, as any layout's)
        self.keep_grads = given.zero_stage == "1"
        self._group_of_param = {}
        for k, g in enumerate(optimizer.param_groups):
            for p in g["params"]:
                self._group_of_param[id(p)] = k
        self.user_optimizer = optimizer
        self._shard_optimizer = None
        super().__init__(model, optimizer, comm, options, compressor, model_name)
        self.carrier = self.options.rs_carrier if self.options.rs_carrier != "auto" else None
        self.gather_carrier = (self.options.ag_carrier if self.options.ag_carrier != "auto"
                               else None)
        # a gather in levels issues its second level when waited for: every one is waited for
        # before the next backward's first reduce-scatter, in the same order on every rank
        self._chained_gathers = self.gather_carrier == TWO_LEVEL
        self.optimizer = self._shard_optimizer
        self._gathers_pending = False
        self._module_buckets = self._modules_to_buckets()
        for module in self._module_buckets:
            self._handles.append(module.register_forward_pre_hook(self._before_module))

    # -- planning: buckets, flat parameters, shards, the optimizer ----------------------------
    def _groups(self, order: list[int]) -> list[list[int]]:
        from ..planning import plan_buckets
        nbytes = [self.params[i].numel() * self.params[i].element_size() for i in order]
        keys = [(self.params[i].dtype, self.params[i].device,
                 self._group_of_param.get(id(self.params[i]))) for i in order]
        if any(k[2] is None for k in keys):
            from ..errors import UsageError
            missing = next(self.param_names[i] for i, k in zip(order, keys) if k[2] is None)
            raise UsageError(f"method {self.id}: parameter {missing} is not in the optimizer; "
                             f"it steps only the parameters the optimizer was given")
        return [[order[j] for j in g] for g in plan_buckets(nbytes, self.threshold, keys)]

    def _plan(self, order: list[int]) -> None:
        import torch
        parts, me = self.shards.size, self.shards.rank
        self.order = order
        old = getattr(self, "buckets", None)
        self.buckets = [_ShardedBucket(self.params, g, parts, self.keep_grads)
                        for g in self._groups(order)]
        self.bucket_of = {}
        for b in self.buckets:
            for i in b.members:
                self.bucket_of[i] = b
            b.weights = torch.zeros(b.padded, dtype=b.dtype, device=b.device)
            with torch.no_grad():
                for flat, p in zip(b.weights[:b.numel].split(b.sizes), b.params):
                    flat.copy_(p.detach().view(-1))
                for flat, p in zip(b.weights[:b.numel].split(b.sizes), b.params):
                    p.data = flat.view(p.shape)
            if parts == 1:
                # a shard group of one: the shard is the bucket, stepped in place (nothing to
                # reduce-scatter or gather), its gradient the bucket's flat gradient
                b.shard, b.grad_shard = torch.nn.Parameter(b.weights), None
                continue
            b.shard = torch.nn.Parameter(
                b.weights[me * b.shard_len:(me + 1) * b.shard_len].clone())
            b.grad_shard = torch.zeros(b.shard_len, dtype=b.dtype, device=b.device)
        del old
        self._next = 0
        self._adopt_views()
        self._build_optimizer()

    def _build_optimizer(self) -> None:
        """The user's optimizer class, with its groups' hyper-parameters, over the shards; the
        same object across re-plans (before any step: it holds no state yet), so hooks on it
        (the timeline's) stay."""
        user = self.user_optimizer
        groups = [[] for _ in user.param_groups]
        for b in self.buckets:
            groups[self._group_of_param[id(b.params[0])]].append(b.shard)
        if self._shard_optimizer is not None:
            for g, shards in zip(self._shard_optimizer.param_groups, groups):
                g["params"] = shards
            return
        specs = [{**{k: v for k, v in g.items() if k != "params"}, "params": shards}
                 for g, shards in zip(user.param_groups, groups) if shards]
        try:
            self._shard_optimizer = type(user)(specs)
        except TypeError as e:
            from ..errors import UsageError
            raise UsageError(f"method {self.id} cannot build {type(user).__name__} over its shards "
                             f"(it constructs the optimizer's class with the given groups' "
                             f"settings): {e}") from None

    def _modules_to_buckets(self) -> dict:
        """Each module that owns parameters directly -> the buckets holding them."""
        index = {id(p): i for i, p in enumerate(self.params)}
        out = {}
        for module in self.model.modules():
            own = [index[id(p)] for p in module.parameters(recurse=False) if id(p) in index]
            if own:
                out[module] = own
        return out

    # -- backward: reduce-scatter ---------------------------------------------------------------
    def _on_ready(self, i: int) -> None:
        if self._calibrating:
            self._seen.append(i)
            return
        if self._chained_gathers and self._gathers_pending:
            self._wait_gathers()
        self.bucket_of[i].ready += 1
        self._launch_in_order(self._issuer.hand if self._issuer is not None else self._launch)

    def _launch(self, b) -> None:
        b.flat = b.pack()
        with self.comm.about(b.label or self._label(b)):
            if self.shards.size == 1:
                b.grad_shard = b.flat
                b.pending = (None if self.across is None else
                             self.comm.allreduce(b.grad_shard, async_op=True, group=self.across))
            elif self.across is None:
                b.pending = self.comm.reduce_scatter(b.grad_shard, b.flat, async_op=True,
                                                     carrier=self.carrier, group=self.shards)
            else:
                self.comm.reduce_scatter(b.grad_shard, b.flat, async_op=False,
                                         carrier=self.carrier, group=self.shards)
                b.pending = self.comm.allreduce(b.grad_shard, async_op=True, group=self.across)

    def _bucket_name(self, b) -> str:
        """A bucket as a failure names it: its index, tensors and the group it is sharded on."""
        where = threads.group_text(self.shards)
        if self.across is not None:
            where += f" and {threads.group_text(self.across)}"
        return f"{super()._bucket_name(b)} on {where}"

    def _wait(self, b, work, what: str) -> None:
        """``work.wait()``; a failure names the collective, the bucket and its group."""
        threads.wait_for(work, f"method {self.id}: {what} of {self._bucket_name(b)}")

    def _finish(self, b) -> int | None:
        if b.pending is not None:
            self._wait(b, b.pending, "the reduce-scatter" if self.across is None
                       else "the reduce-scatter and all-reduce")
        replaced = b.replaced() if self.keep_grads else None
        b.pending = None
        b.flat = None
        b.ready = 0
        return replaced

    # -- the step -------------------------------------------------------------------------------
    def step(self) -> None:
        self._wait_gathers()   # (a bucket whose parameters no forward read: its shard's turn)
        self._reduce_all()
        for b in self.buckets:
            if self.comm.size > 1:
                b.grad_shard.div_(self.comm.size)
            b.shard.grad = b.grad_shard.view(-1)
        self.optimizer.step()
        self._steps += 1
        self._gather()

    def _gather(self) -> None:
        """All-gather every bucket's updated shard into its parameters: in forward order
        (buckets are in backward order), waited for here or by the modules' pre-hooks."""
        if self.shards.size == 1:   # (the optimizer stepped the parameters themselves)
            return
        for b in reversed(self.buckets):
            with self.comm.about(b.label or self._label(b)):
                b.gather = self.comm.allgather(b.weights, b.shard.detach(), async_op=True,
                                               group=self.shards, carrier=self.gather_carrier)
        self._gathers_pending = True
        if self.options.gather_prefetch == "0":
            self._wait_gathers()

    def _wait_gathers(self, buckets=None) -> None:
        if not self._gathers_pending:
            return
        for b in self.buckets if buckets is None else buckets:
            if b.gather is not None:
                work, b.gather = b.gather, None
                self._wait(b, work, "the all-gather")
        if buckets is None:
            self._gathers_pending = False

    def _before_module(self, module, _args) -> None:
        if self._gathers_pending:
            self._wait_gathers([self.bucket_of[i] for i in self._module_buckets[module]])

    def synchronize(self) -> None:
        self._wait_gathers()

    def zero_grad(self) -> None:
        super().zero_grad()
        for b in self.buckets:
            b.shard.grad = None

    def close(self) -> None:
        if not self.failed:
            self._wait_gathers()
        super().close()

    # -- calibration: the order rank 0's gradients become ready -------------------------------
    def calibrate(self, forward_backward) -> None:
        import torch
        self._seen = []
        self._calibrating = True
        try:
            forward_backward()
        finally:
            self._calibrating = False
        n = len(self.params)
        seen = self._seen + [i for i in reversed(range(n)) if i not in set(self._seen)]
        self._seen = []
        order = torch.tensor(seen, dtype=torch.int64)
        if self.params and self.params[0].device.type == "cuda" and \
                self.comm.backend() == "nccl":
            order = order.to(self.params[0].device)
        self.comm.broadcast(order, src=0)
        order = [int(x) for x in order.cpu()]
        if order != self.order:
            self._plan(order)

    # -- the record -------------------------------------------------------------------------------
    def describe(self) -> dict:
        d = super().describe()
        d.pop("fusion_buffer_bytes", None)
        d.pop("max_fusion_buffer_bytes", None)
        d.update({
            "zero_stage": int(self.options.zero_stage),
            "rs_carrier": declared("reduce_scatter").carrier(
                self.carrier, self.comm.backend(self.shards)).name,
            "ag_carrier": declared("allgather").carrier(
                self.gather_carrier, self.comm.backend(self.shards)).name,
            "shard_workers": self.shards.size,
            "padded_bytes": [b.padded * b.weights.element_size() for b in self.buckets],
            "memory": self.memory(),
        })
        groups = self.comm.describe_groups()
        if groups is not None:
            d["groups"] = groups
        return d

    def memory(self) -> dict:
        """Bytes this worker holds: the optimizer's state (its shards'), the gradients kept
        between steps (stage 1: every bucket's buffer; both: the reduced shards) and the
        shards of parameters the optimizer steps."""
        from .base import optimizer_state_bytes
        size = self.buckets[0].weights.element_size() if self.buckets else 4
        kept = sum(b.buffer.numel() for b in self.buckets if b.buffer is not None)
        shards = sum(b.shard_len for b in self.buckets)
        alone = self.shards.size == 1   # the shards are the buckets' own buffers
        grads = (kept or shards) if alone else kept + shards
        return {"optimizer_state_bytes": optimizer_state_bytes(self.optimizer),
                "gradient_bytes": grads * size,
                "parameter_shard_bytes": 0 if alone else shards * size}


class HSDP(Zero):
    id = "hsdp"
    display = "HSDP-A2A"
    summary = ("hybrid sharded data parallel: zero with the optimizer state sharded inside "
               "each machine; each bucket reduce-scattered inside the machine, its shard "
               "all-reduced across machines, the updated shards all-gathered inside the machine")
    shard_layout = MACHINE
    even_machines = True
    rule = rules.Rule(grouping=rules.fused, advise=rules.threshold_grid,
                      exchange=(rules.Step("reduce_scatter", MACHINE,
                                           carrier_option="rs_carrier"),
                                rules.Step("allreduce", ACROSS, shard_of=MACHINE)),
                      gather=(rules.Step("allgather", MACHINE),), optimizer_shard=MACHINE,
                      prefetch="gather_prefetch", divide_shard=MACHINE, divide_in_step=True)

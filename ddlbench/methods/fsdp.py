"""torch's own sharded data parallel as peers of the suite's methods: FSDP2 (``fully_shard``) and
DDP with torch's ``ZeroRedundancyOptimizer``, each as a registered method.

``fsdp2``: torch FSDP2's ``fully_shard`` on a 1-D device mesh over the whole job (the job's
process group, ``DeviceMesh.from_group``), applied as users apply it: one unit per repeated
block (every module held by an ``nn.ModuleList`` or ``nn.Sequential`` that has trainable
parameters, the outermost such: each transformer layer, each ResNet stage's blocks, each layer
of a plain ``Sequential``), then the root (the rest: embeddings, stem, heads). A block sharing a
parameter with the rest of the model is left to the root. ``--reshard-after-forward 0`` (the
default) keeps each unit's gathered parameters from its forward until after the backward
(ZeRO-2-like: per step one all-gather and one reduce-scatter per unit); ``1`` frees them after
the forward and all-gathers them again in the backward (ZeRO-3; the root's too). FSDP2
replaces the parameters by sharded DTensors, so the method rebuilds the user's optimizer (its
class, each group's hyper-parameters) over them, as Horovod's ``DistributedOptimizer`` wraps
the user's: ``step()`` runs it; the optimizer must not have stepped yet. Its collectives are
FSDP2's own, not the suite's ``Comm``: custom all-gather and reduce-scatter objects
(``FSDPModule.set_custom_all_gather`` / ``set_custom_reduce_scatter``) issue exactly what
torch's defaults issue (``all_gather_single``, ``reduce_scatter_single``) and count each call
through ``Comm.count`` (``allgather``; ``reduce_scatter`` with the ``native`` carrier, which on
Gloo runs as an all-reduce), with a span on the timeline while it records. Per worker per
step, G the gradient bytes (each tensor padded by torch to whole rows per worker): all-gather
(P-1)/P G, reduce-scatter on Gloo 2(P-1)/P G (NCCL: (P-1)/P G): 3(P-1)/P G on Gloo, and
with ZeRO-3 a second all-gather of every unit, 4(P-1)/P G. FSDP2 issues them on the training
thread inside forward and backward, which waits for each: each is also a wait span there. For
``--verify``, ``full_parameters()`` gathers the sharded parameters (``DTensor.full_tensor``)
and ``hook_local_gradients`` hooks the unsharded parameters the forward runs on (the same
tensors every step, found by a forward pre-hook on the module owning each).

``fsdp2_hsdp``: FSDP2's HSDP, the peer of ``hsdp``: the same units and options on a 2-D device
mesh (``replicate``, ``shard``) made from the placement's groups, a row per machine (the
``machine`` groups: the shard dim), a column per local index (the ``across`` groups: the
replicate dim). Per unit torch reduce-scatters the gradients on the machine (the custom
reduce-scatter, counted there), then all-reduces the 1/l shard across machines itself
(``dist.all_reduce``: no custom-comm interface), then calls the unit's all-reduce hook
(``set_all_reduce_hook``) with it, which counts it on ``across`` and puts it on the timeline
(from the end of the reduce-scatter until the hook); the all-gathers run on the machine. Per
worker per step on Gloo: 2(l-1)/l G + 2(n-1)/n G/l + (l-1)/l G. An id of its own (not an
option of ``fsdp2``): the model's rule is per class.

``ddp_zero1``: torch DDP (``ddp``'s buckets and options) with the optimizer replaced by torch's
``ZeroRedundancyOptimizer`` of the user's class and groups (ZeRO-1: each worker holds the state
of and steps 1/P of the parameters, then every worker broadcasts its updated parameters, one
broadcast per parameter). ``overlap_with_ddp=True`` refuses Gloo, so the broadcasts follow the
step. Bytes: DDP's all-reduce counted from the model, the broadcasts per rank's partition
(each worker sends (P-1) times its partition); the broadcasts are not on the timeline.
"""
from __future__ import annotations

from dataclasses import dataclass

from ..collectives import ACROSS, MACHINE, WORLD
from ..errors import UsageError
from ..options import Options, one_of, option
from . import rules
from .base import Method, require_even_machines
from .ddp import DDP, DDPOptions

RESHARD = one_of("0", "1")


@dataclass(frozen=True)
class FSDP2Options(Options):
    reshard_after_forward: str = option(
        "0", RESHARD, "FSDP2: 1 frees each unit's gathered parameters after its forward and "
        "all-gathers them again in the backward (ZeRO-3); 0 keeps them until after the "
        "backward (ZeRO-2-like)")


def _units(model) -> list[str]:
    """The names of the modules ``fsdp2`` shards as units of their own before the root: every
    module held by a ModuleList or Sequential with trainable parameters, outermost first,
    unless it shares a parameter with a module outside it."""
    from torch import nn
    where: dict[int, set[str]] = {}
    for name, p in model.named_parameters(remove_duplicate=False):
        where.setdefault(id(p), set()).add(name)
    chosen = []

    def walk(prefix: str, module) -> None:
        for name, child in module.named_children():
            path = prefix + name
            own = [p for p in child.parameters() if p.requires_grad]
            shared = any(not n.startswith(path + ".") for p in own for n in where[id(p)])
            if isinstance(module, (nn.ModuleList, nn.Sequential)) and own and not shared:
                chosen.append(path)
            else:
                walk(path + ".", child)
    walk("", model)
    return chosen


def rebuilt_optimizer(method: str, optimizer, params: dict):
    """The user's optimizer class, with each group's hyper-parameters, over ``params`` (old
    parameter -> its replacement, by id); one line when that cannot be."""
    if optimizer.state:
        raise UsageError(f"method {method} rebuilds the optimizer over its own parameters: it "
                         f"must not have stepped yet ({type(optimizer).__name__} holds state)")
    groups = []
    for g in optimizer.param_groups:
        missing = [i for i, p in enumerate(g["params"]) if id(p) not in params]
        if missing:
            raise UsageError(f"method {method} steps the model's parameters: the optimizer's "
                             f"group {len(groups)} holds {len(missing)} tensor(s) that are not")
        groups.append({**{k: v for k, v in g.items() if k != "params"},
                       "params": [params[id(p)] for p in g["params"]]})
    try:
        return type(optimizer)(groups)
    except Exception as e:  # an optimizer not built from its groups alone
        raise UsageError(f"method {method} cannot rebuild the optimizer "
                         f"{type(optimizer).__name__} from its parameter groups: "
                         f"{type(e).__name__}: {e}") from None


def local_state_bytes(optimizer) -> int:
    """Bytes of the optimizer's state this worker holds (a DTensor's local shard only)."""
    total = 0
    for state in optimizer.state.values():
        for value in state.values():
            local = value.to_local() if hasattr(value, "to_local") else value
            if hasattr(local, "numel") and hasattr(local, "element_size"):
                total += local.numel() * local.element_size()
    return total


class _Counted:
    """An FSDP2 collective (its custom-comm interface: ``allocate`` and ``__call__``) doing
    what torch's default does, counted through the suite's ``Comm`` and on its timeline."""

    def __init__(self, comm, op: str, unit: str, group=None):
        self.comm, self.op, self.unit, self.group = comm, op, unit, group
        # (the timeline's row and the span's group: as Comm's own collectives on a group)
        layout = None if group is None or group.layout == WORLD else group.layout
        self.row = op if layout is None else f"{op} @{layout}"
        self.where = {} if layout is None else {"group": layout}
        self.mark = None   # when this unit's last reduce-scatter ended (its output allocated)

    def allocate(self, size, *, dtype, device):
        import torch

        from ..timeline import now_us
        out = torch.empty(*size, dtype=dtype, device=device)
        self.mark = now_us()
        return out

    def _issue(self, tensor, async_op: bool, issue):
        from ..timeline import COMM, WAIT, now_us
        self.comm.count(self.op, tensor.numel(), tensor.dtype, carrier="native",
                        group=self.group)
        tl = self.comm.timeline
        if not tl.enabled:
            return issue()
        args = {"bytes": tensor.numel() * tensor.element_size(), "carrier": "native",
                **self.where, "tensor": self.unit}
        if not async_op:
            # issued on the training thread inside forward or backward, which waits for it:
            # a wait there, not compute (as DDP's wait for its all-reduces)
            with tl.span(self.op, WAIT, _thread()), tl.span(self.op, COMM, self.row, **args):
                try:
                    return issue()
                finally:
                    self.mark = now_us()
        t0 = now_us()
        work = issue()
        tl.comm(self.op, work, self.row, start_us=t0, **args)  # FSDP2 waits on torch's Work
        return work


def _thread() -> str:
    """The timeline's row for the calling thread (the training thread's, or its name)."""
    import threading

    from ..timeline import MAIN
    current = threading.current_thread()
    return MAIN if current is threading.main_thread() else current.name


class _CountedAllGather(_Counted):
    def __call__(self, output_tensor, input_tensor, group, async_op=False):
        from ..runtime.comm import all_gather_single
        return self._issue(input_tensor, async_op, lambda: all_gather_single(
            output_tensor, input_tensor, group=group, async_op=async_op))


class _CountedReduceScatter(_Counted):
    def __call__(self, output_tensor, input_tensor, group, op, async_op=False):
        from ..runtime.comm import reduce_scatter_single
        return self._issue(input_tensor, async_op, lambda: reduce_scatter_single(
            output_tensor, input_tensor, group=group, op=op, async_op=async_op))


class _CountedAllReduce:
    """FSDP2's HSDP all-reduce of a unit's reduce-scattered shard across the replicate group:
    torch issues it itself (``dist.all_reduce``, no custom-comm interface), then calls the
    unit's all-reduce hook (``FSDPModule.set_all_reduce_hook``) with the all-reduced shard.
    The hook counts it through ``Comm.count`` on ``group`` and, while the timeline records,
    puts it there as a span from the end of the unit's reduce-scatter (``scatter.mark``: the
    all-reduce follows it on the training thread) until now, and as a wait on that thread."""

    def __init__(self, comm, unit: str, group, scatter: _Counted):
        self.comm, self.unit, self.group, self.scatter = comm, unit, group, scatter

    def __call__(self, shard) -> None:
        from ..timeline import COMM, WAIT
        self.comm.count("allreduce", shard.numel(), shard.dtype, group=self.group)
        tl = self.comm.timeline
        if tl.enabled and self.scatter.mark is not None:
            layout = self.group.layout
            tl.past("allreduce", COMM, f"allreduce @{layout}", self.scatter.mark,
                    bytes=shard.numel() * shard.element_size(), group=layout,
                    tensor=self.unit)
            tl.past("allreduce", WAIT, _thread(), self.scatter.mark)
        self.scatter.mark = None


class _Handles:
    """Hooks registered together, removed together."""

    def __init__(self):
        self.handles = []

    def remove(self) -> None:
        while self.handles:
            self.handles.pop().remove()


class FSDP2(Method):
    id = "fsdp2"
    display = "FSDP2"
    summary = ("torch FSDP2 `fully_shard`, one unit per repeated block then the root: each "
               "unit's parameters all-gathered in forward, its gradients reduce-scattered in "
               "backward, the optimizer on the shards (`--reshard-after-forward 1`: ZeRO-3)")
    Options = FSDP2Options
    # the model: per unit, its gradients reduce-scattered once its backward is done (torch's
    # native reduce-scatter: an all-reduce on Gloo), the optimizer on 1/P, and its parameters
    # all-gathered before its forward, the next unit's prefetched; with ZeRO-3 gathered again
    # before its backward (the next unit's prefetched there too)
    rule = rules.Rule(grouping=rules.units,
                      exchange=(rules.Step("reduce_scatter", carrier="native"),),
                      gather=(rules.Step("allgather"),), optimizer_shard=WORLD, prefetch=True,
                      regather="reshard_after_forward")

    def __init__(self, model, optimizer, comm, options=None, compressor=None, model_name=None):
        super().__init__(model, optimizer, comm, options, compressor, model_name)
        import warnings

        from torch.distributed.fsdp import fully_shard
        self.reshard = self.options.reshard_after_forward == "1"
        # FSDP2 warns once that the root returned a view (a later in-place op on it would skip
        # its pre-backward hook); the suite's losses take no such op, and --verify proves it
        warnings.filterwarnings("ignore", message="FSDP2-wrapped module .* returned a view")
        device = self.params[0].device if self.params else None
        self.mesh = self._mesh(device.type if device else "cpu")
        before = dict(model.named_parameters())
        self.units = _units(model)
        for name in [*self.units, ""]:
            unit = model.get_submodule(name)
            fully_shard(unit, mesh=self.mesh, reshard_after_forward=self.reshard)
            self._count(unit, name or "root")
        after = dict(model.named_parameters())
        self.params = [after[n] for n in self.param_names]
        self.user_optimizer = optimizer
        self.optimizer = rebuilt_optimizer(self.id, optimizer, {
            id(p): after[n] for n, p in before.items() if n in after})

    def _mesh(self, device_type: str):
        """The device mesh every unit is sharded on: the job's process group, 1-D."""
        import torch.distributed as dist
        from torch.distributed.device_mesh import DeviceMesh
        group = self.comm.group if self.comm.group is not None else dist.group.WORLD
        return DeviceMesh.from_group(group, device_type)

    def _count(self, unit, name: str) -> None:
        """FSDP2's collectives of ``unit``, counted (custom all-gather and reduce-scatter)."""
        unit.set_custom_all_gather(_CountedAllGather(self.comm, "allgather", name))
        unit.set_custom_reduce_scatter(_CountedReduceScatter(self.comm, "reduce_scatter", name))

    def step(self) -> None:
        self.optimizer.step()

    # -- for --verify -------------------------------------------------------------------------
    def full_parameters(self) -> list:
        """The sharded parameters gathered whole (a collective: every rank calls it)."""
        return [p.full_tensor() if hasattr(p, "full_tensor") else p for p in self.params]

    def hook_local_gradients(self, capture) -> list:
        """FSDP2's forward runs on unsharded parameters it swaps in for the sharded ones (the
        same tensor each step): a forward pre-hook on each parameter's owning module hooks its
        unsharded parameter the first time it is in place."""
        handles, hooked = _Handles(), set()
        owners: dict[str, list] = {}
        for i, name in enumerate(self.param_names):
            path, _, attr = name.rpartition(".")
            owners.setdefault(path, []).append((i, attr))

        def before(module, _args, entries):
            for i, attr in entries:
                t = getattr(module, attr)
                if not hasattr(t, "full_tensor") and id(t) not in hooked:
                    hooked.add(id(t))
                    handles.handles.append(t.register_hook(lambda g, i=i: capture(i, g)))
        for path, entries in owners.items():
            handles.handles.append(self.model.get_submodule(path).register_forward_pre_hook(
                lambda m, a, entries=entries: before(m, a, entries)))
        return [handles]

    def describe(self) -> dict:
        d = super().describe()
        d.update({"units": [*self.units, "(root)"], "reshard_after_forward": self.reshard,
                  "mesh": list(self.mesh.shape) if self.mesh.ndim > 1 else self.comm.size,
                  "bytes_counted_from": "FSDP2's collectives"})
        if "memory" in d:
            d["memory"]["optimizer_state_bytes"] = local_state_bytes(self.optimizer)
        return d


class FSDP2HSDP(FSDP2):
    id = "fsdp2_hsdp"
    display = "FSDP2-HSDP"
    summary = ("torch FSDP2's HSDP: `fully_shard` (fsdp2's units) on a 2-D device mesh, "
               "replicated across machines and sharded inside each; each unit's gradients "
               "reduce-scattered inside the machine, the shard all-reduced across machines, "
               "its parameters all-gathered inside the machine")
    even_machines = True
    # the model: fsdp2's, with the reduce-scatter and all-gather on the machine group and the
    # shard (1/l) all-reduced across machines after each reduce-scatter, as torch issues them
    rule = rules.Rule(grouping=rules.units,
                      exchange=(rules.Step("reduce_scatter", MACHINE, carrier="native"),
                                rules.Step("allreduce", ACROSS, shard_of=MACHINE)),
                      gather=(rules.Step("allgather", MACHINE),), optimizer_shard=MACHINE,
                      prefetch=True)

    def _mesh(self, device_type: str):
        """A 2-D mesh (replicate, shard) from the placement's groups: row i the ranks of
        machine i (the shard dim: ``collectives.MACHINE``), column j the workers of local
        index j (the replicate dim: ``ACROSS``). A dim of groups of one (one machine, or one
        worker a machine) has no process group of the suite's: one is made per rank."""
        import torch
        import torch.distributed as dist
        from torch.distributed.device_mesh import DeviceMesh
        require_even_machines(self.id, self.comm)
        self.machine, self.across = self.comm.group_of(MACHINE), self.comm.group_of(ACROSS)
        job = dist.get_process_group_ranks(self.comm.group) if self.comm.group is not None \
            else list(range(dist.get_world_size()))
        handles = []
        for g in (self.across, self.machine):
            if g.size == self.comm.size:   # (the whole job's group: its handle may be None)
                handle = self.comm.group if self.comm.group is not None else dist.group.WORLD
            elif g.size == 1:
                handle, _ = dist.new_subgroups_by_enumeration([[r] for r in job],
                                                              backend=self.comm.backend())
            else:
                handle = g.handle
            handles.append(handle)
        rows = [[job[r] for r in m] for m in self.comm.machines()]
        return DeviceMesh.from_group(handles, device_type, mesh=torch.tensor(rows),
                                     mesh_dim_names=("replicate", "shard"))

    def _count(self, unit, name: str) -> None:
        scatter = _CountedReduceScatter(self.comm, "reduce_scatter", name, self.machine)
        unit.set_custom_all_gather(_CountedAllGather(self.comm, "allgather", name,
                                                     self.machine))
        unit.set_custom_reduce_scatter(scatter)
        unit.set_all_reduce_hook(_CountedAllReduce(self.comm, name, self.across, scatter))

    def describe(self) -> dict:
        d = super().describe()
        d["groups"] = self.comm.describe_groups()
        return d


class DDPZeRO1(DDP):
    id = "ddp_zero1"
    display = "DDP+ZeroRedundancyOptimizer"
    summary = ("torch DDP with its own buckets, and torch's `ZeroRedundancyOptimizer` (ZeRO-1: "
               "each worker steps 1/P of the parameters, then broadcasts them)")
    Options = DDPOptions
    # the model: DDP's buckets and host work, the optimizer on 1/P, then its parameters'
    # broadcasts (each rank's 1/P to the others: an all-gather's bytes) before the forward
    rule = rules.Rule(grouping=rules.ddp, reducer=True, advise=rules.bucket_cap_grid,
                      exchange=(rules.Step("allreduce"),),
                      gather=(rules.Step("allgather", counted_as="broadcast"),),
                      optimizer_shard=WORLD, prefetch=False)
    baseline = False
    hatch = None

    @classmethod
    def accepts(cls, compressor: str) -> str | None:
        return None if compressor == "none" else (
            "it is torch's DDP with ZeroRedundancyOptimizer as users run it (compressors: "
            "method ddp)")

    def __init__(self, model, optimizer, comm, options=None, compressor=None, model_name=None):
        super().__init__(model, optimizer, comm, options, compressor, model_name)
        import torch.distributed as dist
        from torch.distributed.optim import ZeroRedundancyOptimizer
        same = {id(p): p for p in model.parameters()}
        plain = rebuilt_optimizer(self.id, optimizer, same)   # the same checks
        groups = plain.param_groups
        self.user_optimizer = optimizer
        # (every group carries all its hyper-parameters: no defaults to pass, and an
        # optimizer's ``defaults`` may hold keys its constructor does not take)
        self.optimizer = ZeroRedundancyOptimizer(
            [dict(g) for g in groups], optimizer_class=type(optimizer),
            process_group=comm.group)
        own = [p for g in self.optimizer.optim.param_groups for p in g["params"]]
        mine = [sum(p.numel() for p in own), len(own)]
        parts = [None] * comm.size
        dist.all_gather_object(parts, mine, group=comm.group)
        self._partitions = parts   # per rank: (elements, tensors) it steps and broadcasts
        self._dtype = self.params[0].dtype if self.params else None

    def step(self) -> None:
        super().step()   # DDP's: the optimizer (here ZeRO's step and broadcasts), DDP's bytes
        for r, (numel, tensors) in enumerate(self._partitions):
            if tensors:
                self.comm.count("broadcast", numel, self._dtype, calls=tensors,
                                root=r == self.comm.rank)

    def describe(self) -> dict:
        d = super().describe()
        d["zero_partitions"] = [numel for numel, _ in self._partitions]
        if "memory" in d:
            d["memory"]["optimizer_state_bytes"] = local_state_bytes(self.optimizer.optim)
        return d

"""Hierarchical all-reduce on the groups of the placement: each bucket reduce-scattered inside
its machine, the shard all-reduced across machines, all-gathered inside the machine.

``hier`` packs gradients into buckets as tensor fusion does (``--threshold``, backward order,
started in bucket order from the hooks on the communication thread). Each bucket then takes
three collectives instead of one all-reduce (Horovod's ``HOROVOD_HIERARCHICAL_ALLREDUCE``, in
the form NCCL's two-level algorithms take): a reduce-scatter on the ``machine`` group (the l
workers of this machine; Gloo's ``a2a`` carrier), an all-reduce of this worker's 1/l shard on
the ``across`` group (one worker per machine, those with this local index: the l across-groups
of a machine run at once, together moving the bucket once over its NIC), then an all-gather on
the ``machine`` group. Each worker sends ``2(l-1)/l G`` inside its machine and ``2(n-1)/n G/l``
across, where the flat ring sends ``2(P-1)/P G`` over the slowest link. The shard is divided by
P before the all-gather (1/l of the division a flat all-reduce needs). A bucket whose length is
not a multiple of l is reduced through a padded copy. On one machine the across-groups are
single workers (their all-reduce is nothing); with one worker per machine the machine groups
are (the reduce-scatter and all-gather are copies, skipped: one all-reduce across).
"""
from __future__ import annotations

from ..collectives import ACROSS, MACHINE
from . import rules
from .allreduce import BucketedAllReduce, FusionOptions
from .base import require_even_machines


class Hier(BucketedAllReduce):
    id = "hier"
    display = "Hier-A2A"
    summary = ("gradients packed in backward order into buckets of at most `--threshold` bytes; "
               "each reduce-scattered inside its machine, the shard all-reduced across "
               "machines, all-gathered inside the machine (hierarchical all-reduce)")
    Options = FusionOptions
    rule = rules.Rule(grouping=rules.fused, advise=rules.threshold_grid,
                      exchange=(rules.Step("reduce_scatter", MACHINE),
                                rules.Step("allreduce", ACROSS, shard_of=MACHINE),
                                rules.Step("allgather", MACHINE)),
                      divide_shard=MACHINE)   # the shard divided, on the thread

    @classmethod
    def accepts(cls, compressor: str) -> str | None:
        return None if compressor == "none" else (
            "it sends each bucket by its own collectives, not through a compressor")

    @classmethod
    def fusion_threshold(cls, options, nbytes: list[int]) -> float:
        return float(options.threshold)

    def __init__(self, model, optimizer, comm, options=None, compressor=None, model_name=None):
        super().__init__(model, optimizer, comm, options, compressor, model_name)
        # (built on every rank, in the constructor: building a group is collective)
        self.machine = self.comm.group_of(MACHINE)
        self.across = self.comm.group_of(ACROSS)
        require_even_machines(self.id, self.comm)

    def _launch(self, b) -> None:
        from compression import Pending
        b.flat = b.pack()
        if self.comm.size > 1:
            with self.comm.about(b.label or self._label(b)):
                self._exchange(b, b.flat)
        b.pending = Pending(None, None)

    def _exchange(self, b, flat) -> None:
        """The bucket's three collectives, in place in ``flat``, averaged."""
        import torch
        local, comm = self.machine.size, self.comm
        if local == 1:
            comm.allreduce(flat, async_op=False, group=self.across)
            flat.div_(comm.size)
            return
        n = flat.numel()
        whole = -(-n // local) * local
        if getattr(b, "shard", None) is None or b.shard.numel() != whole // local:
            b.padded = (torch.zeros(whole, dtype=flat.dtype, device=flat.device)
                        if whole != n else None)
            b.shard = torch.empty(whole // local, dtype=flat.dtype, device=flat.device)
        work = flat
        if b.padded is not None:
            b.padded[:n].copy_(flat)
            work = b.padded
        comm.reduce_scatter(b.shard, work, async_op=False, group=self.machine)
        comm.allreduce(b.shard, async_op=False, group=self.across)
        b.shard.div_(comm.size)
        comm.allgather(work, b.shard, async_op=False, group=self.machine)
        if b.padded is not None:
            flat.copy_(b.padded[:n])

    def describe(self) -> dict:
        d = super().describe()
        d["groups"] = self.comm.describe_groups()
        return d

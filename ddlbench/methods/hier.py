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

The three collectives of a bucket run as a pipeline of three threads (NCCL pipelines its
two-level algorithms by chunk; Horovod runs them one after another per fused buffer): the
communication thread issues the reduce-scatter and hands the bucket on; the ``across`` stage
waits for it and issues the all-reduce; the ``gather`` stage waits for that, divides, and
issues the all-gather on a second process group of the machine's ranks (one process group per
issuing thread, so each sees its collectives in bucket order on every rank). So a bucket's
all-reduce across machines overlaps the next bucket's reduce-scatter and the previous one's
all-gather, and the NIC is not idle while the machine's workers exchange. The training thread
waits for the all-gathers in the step; a stage's error names its bucket.
"""
from __future__ import annotations

from ..collectives import ACROSS, MACHINE
from . import rules, threads
from .allreduce import BucketedAllReduce, FusionOptions
from .base import require_even_machines


class Hier(BucketedAllReduce):
    id = "hier"
    display = "Hier-A2A"
    summary = ("gradients packed in backward order into buckets of at most `--threshold` bytes; "
               "each reduce-scattered inside its machine, the shard all-reduced across "
               "machines, all-gathered inside the machine (hierarchical all-reduce)")
    Options = FusionOptions
    even_machines = True
    rule = rules.Rule(grouping=rules.fused, advise=rules.threshold_grid,
                      exchange=(rules.Step("reduce_scatter", MACHINE),
                                rules.Step("allreduce", ACROSS, shard_of=MACHINE),
                                rules.Step("allgather", MACHINE)),
                      divide_shard=MACHINE,   # the shard divided, on the thread
                      pipelined=True)         # each collective on a thread of its own

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
        # the all-gathers go on a second process group of the machine's ranks: they are issued
        # by the gather stage's thread while the communication thread issues reduce-scatters
        self.gathers = self.comm.group_of(MACHINE, channel=1) if self.machine.size > 1 else None
        device = self.params[0].device if self.params else None
        self._stages = tuple(threads.Issuer(f"{self.id}-{name}", stage, self._bucket_name, device)
                             for name, stage in (("across", self._across),
                                                 ("gather", self._gather)))

    def start(self) -> None:
        super().start()
        if self._issuer is not None:   # (without a communication thread the stages run inline)
            for stage in self._stages:
                stage.start()

    def close(self) -> None:
        try:
            for stage in self._stages:
                stage.stop()
        finally:
            super().close()

    def _issued(self) -> None:
        """Every bucket handed over issued by the communication thread, then by each stage."""
        super()._issued()
        for stage in self._stages:
            stage.drain()

    # -- a bucket's three collectives, in a pipeline of three threads ------------------------
    def _launch(self, b) -> None:
        """Stage 1 (the communication thread): the bucket's reduce-scatter inside the machine,
        handed to stage 2 without waiting for it."""
        b.flat = b.pack()
        b.pending = _Staged(self, b)
        if self.comm.size == 1:
            return
        if self.machine.size == 1:           # one worker per machine: one all-reduce across
            b.shard, b.padded, b.work = b.flat, None, None
        else:
            import torch
            local, n = self.machine.size, b.flat.numel()
            whole = -(-n // local) * local
            if getattr(b, "shard", None) is None or b.shard.numel() != whole // local:
                b.padded = (torch.zeros(whole, dtype=b.flat.dtype, device=b.flat.device)
                            if whole != n else None)
                b.shard = torch.empty(whole // local, dtype=b.flat.dtype, device=b.flat.device)
            source = b.flat
            if b.padded is not None:
                b.padded[:n].copy_(b.flat)
                source = b.padded
            with self.comm.about(b.label or self._label(b)):
                b.work = self.comm.reduce_scatter(b.shard, source, async_op=True,
                                                  group=self.machine)
        self._stages[0].hand(b)

    def _across(self, b) -> None:
        """Stage 2: once the bucket's reduce-scatter is done, its shard's all-reduce across
        machines, handed to stage 3 without waiting for it."""
        if b.work is not None:
            self._wait(b, "reduce-scatter", self.machine)
        with self.comm.about(b.label or self._label(b)):
            b.work = self.comm.allreduce(b.shard, async_op=True, group=self.across)
        self._stages[1].hand(b)

    def _gather(self, b) -> None:
        """Stage 3: once the all-reduce is done, the shard averaged and all-gathered inside the
        machine (on the second process group); the training thread waits for it."""
        self._wait(b, "all-reduce", self.across)
        b.shard.div_(self.comm.size)
        if self.gathers is None:
            b.work = None
            return
        with self.comm.about(b.label or self._label(b)):
            b.work = self.comm.allgather(b.flat if b.padded is None else b.padded, b.shard,
                                         async_op=True, group=self.gathers)

    def describe(self) -> dict:
        d = super().describe()
        d["groups"] = self.comm.describe_groups()
        return d

    def _wait(self, b, what: str, group) -> None:
        """Wait for the bucket's collective ``what``; a failure names it, the bucket and its
        group."""
        work, b.work = b.work, None
        threads.wait_for(work, f"method {self.id}: the {what} of {self._bucket_name(b)} on "
                               f"{threads.group_text(group)}")

class _Staged:
    """A bucket in hier's pipeline, as the training thread waits for it: every stage has
    issued its collectives (the stages' threads drained), then the all-gather done and a
    padded bucket's result copied back."""

    def __init__(self, method: Hier, b):
        self.method, self.b = method, b

    def wait(self) -> None:
        b = self.b
        if self.method.comm.size == 1:
            return
        for stage in self.method._stages:
            stage.drain()
        if b.work is not None:
            self.method._wait(b, "all-gather", self.method.gathers)
        if b.padded is not None:
            b.flat.copy_(b.padded[:b.flat.numel()])

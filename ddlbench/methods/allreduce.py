"""All-to-all methods built on one bucketed all-reduce engine: BSP, WFBP and tensor fusion.

Gradients are grouped into buckets in backward order. A bucket is reduced as soon as every
gradient in it is ready (post-accumulate-grad hooks), but buckets are always *started* in bucket
order: a bucket that is complete early waits for the ones before it. Every rank therefore issues
the same collectives in the same order, whatever the timing of its backward pass.

- ``wfbp``: one bucket per tensor (fusion threshold 0);
- ``fusion``: consecutive tensors packed into buckets of at most ``threshold`` bytes (Horovod's
  tensor fusion; a tensor larger than the threshold travels alone);
- ``bspa2a``: no hooks; after the whole backward, one all-reduce of every gradient.

The first step runs with buckets planned in reverse registration order (what autograd usually
does); at its end rank 0's observed gradient-ready order is broadcast and every rank re-plans
from it, as DDP rebuilds its buckets after the first iteration.
"""
from __future__ import annotations

from dataclasses import dataclass

from ..model import rules
from ..options import NONNEG, Options, option
from ..planning import HOROVOD_DEFAULT_THRESHOLD, plan_buckets
from ..timeline import tensors_label
from .base import BucketPlan, Method



def threshold_option(default: float, help: str):
    """The fusion threshold in bytes, an option of every method that fuses by one."""
    return option(default, NONNEG, help, must="must be >= 0 bytes")


@dataclass(frozen=True)
class FusionOptions(Options):
    threshold: float = threshold_option(
        float(HOROVOD_DEFAULT_THRESHOLD),
        "fusion threshold in bytes (Horovod semantics: 0 = one message per tensor)")


class Bucket:
    """Gradients reduced together, packed into one flat tensor."""

    def __init__(self, params: list, members: list[int]):
        import torch
        self.members = members
        self.params = [params[i] for i in members]
        self.sizes = [p.numel() for p in self.params]
        self.numel = sum(self.sizes)
        self.nbytes = sum(p.numel() * p.element_size() for p in self.params)
        first = self.params[0]
        # A lone tensor is reduced in place in its .grad; a group goes through one flat buffer.
        self.buffer = (torch.empty(self.numel, dtype=first.dtype, device=first.device)
                       if len(members) > 1 else None)
        self.ready = 0
        self.pending = None
        self.flat = None

    def pack(self):
        """The bucket's gradients as one flat tensor (a missing gradient counts as zeros): a
        lone contiguous gradient is used in place, several are copied into the buffer."""
        import torch
        for p in self.params:
            if p.grad is None:  # unused in this forward: contributes zeros
                p.grad = torch.zeros_like(p)
        if self.buffer is None:
            g = self.params[0].grad
            return g.view(-1) if g.is_contiguous() else g.reshape(-1).clone()
        offset = 0
        for p, n in zip(self.params, self.sizes):
            self.buffer[offset:offset + n].copy_(p.grad.reshape(-1))
            offset += n
        return self.buffer

    def unpack(self, flat) -> None:
        """Copy ``flat`` back into the gradients, unless it already is the gradient."""
        if self.buffer is not None or not self.params[0].grad.is_contiguous():
            offset = 0
            for p, n in zip(self.params, self.sizes):
                p.grad.copy_(flat[offset:offset + n].view_as(p.grad))
                offset += n


class BucketedAllReduce(Method):
    """Buckets started strictly in bucket order from gradient hooks, each reduced through the
    compressor; subclasses choose the threshold (and whether to overlap)."""

    overlap = True  # start buckets from hooks during backward
    rebuild = True  # re-plan from rank 0's gradient order after the first step

    @classmethod
    def accepts(cls, compressor: str) -> str | None:
        return None

    def __init__(self, model, optimizer, comm, options=None, compressor=None, model_name=None):
        super().__init__(model, optimizer, comm, options, compressor, model_name)
        self.threshold = self._threshold()
        self._plan(list(reversed(range(len(self.params)))))
        self._seen: list[int] = []
        self._steps = 0
        if self.overlap:
            self._register_ready_hooks(self._on_ready)

    def _threshold(self) -> float:
        return 0.0

    # -- planning ---------------------------------------------------------------------------
    def _groups(self, order: list[int]) -> list[list[int]]:
        nbytes = [self.params[i].numel() * self.params[i].element_size() for i in order]
        keys = [(self.params[i].dtype, self.params[i].device) for i in order]
        return [[order[j] for j in g] for g in plan_buckets(nbytes, self.threshold, keys)]

    def _plan(self, order: list[int]) -> None:
        self.order = order
        self.buckets = [Bucket(self.params, g) for g in self._groups(order)]
        self.bucket_of = {}
        for b in self.buckets:
            for i in b.members:
                self.bucket_of[i] = b
        self._next = 0

    # -- hooks and launching -----------------------------------------------------------------
    def _on_ready(self, i: int) -> None:
        if self._steps == 0:
            self._seen.append(i)
        self.bucket_of[i].ready += 1
        self._launch_in_order()

    def _launch_in_order(self) -> None:
        while self._next < len(self.buckets):
            b = self.buckets[self._next]
            if b.ready < len(b.members):
                return
            self._launch(b)
            self._next += 1

    def _launch(self, b: Bucket) -> None:
        b.flat = b.pack()
        with self.comm.about(lambda: tensors_label([self.param_names[i] for i in b.members])):
            b.pending = self.compressor.reduce_async(tuple(b.members), b.flat, self.comm,
                                                     shapes=[p.shape for p in b.params])

    def _finish(self, b: Bucket) -> None:
        b.pending.wait()
        b.unpack(b.flat)
        b.pending = None
        b.flat = None
        b.ready = 0

    # -- the step ----------------------------------------------------------------------------
    def step(self) -> None:
        for b in self.buckets[self._next:]:
            b.ready = len(b.members)
        self._launch_in_order()
        for b in self.buckets:
            self._finish(b)
        self._next = 0
        self.optimizer.step()
        self._steps += 1
        if self._steps == 1 and self.overlap and self.rebuild:
            self._rebuild_from_rank0()

    def _rebuild_from_rank0(self) -> None:
        import torch
        n = len(self.params)
        seen = self._seen + [i for i in reversed(range(n)) if i not in set(self._seen)]
        order = torch.tensor(seen, dtype=torch.int64)
        if self.params and self.params[0].device.type == "cuda" and \
                torch.distributed.get_backend(self.comm.group) == "nccl":
            order = order.to(self.params[0].device)
        self.comm.broadcast(order, src=0)
        order = [int(x) for x in order.cpu()]
        if order != self.order:
            self._plan(order)
        self._seen = []

    def plan(self) -> BucketPlan:
        """The current buckets, each a list of whole parameters in packing order."""
        return BucketPlan.of_params([b.members for b in self.buckets], self.params)

    def describe(self) -> dict:
        d = super().describe()
        d.update({
            "threshold_bytes": self.threshold if self.threshold != float("inf") else None,
            "buckets": len(self.buckets),
            "bucket_bytes": [b.nbytes for b in self.buckets],
            "fusion_buffer_bytes": sum(b.buffer.numel() * b.buffer.element_size()
                                       for b in self.buckets if b.buffer is not None),
            "max_fusion_buffer_bytes": max([b.nbytes for b in self.buckets if b.buffer is not None],
                                           default=0),
            **self.compressor.describe(),
        })
        return d


class WFBP(BucketedAllReduce):
    id = "wfbp"
    display = "WFBP-A2A"
    summary = "each gradient is all-reduced the moment its hook fires, in backward order"
    model = rules.Rule(grouping=rules.per_tensor)
    hatch = "oo"


class Fusion(BucketedAllReduce):
    id = "fusion"
    display = "Fusion-A2A"
    summary = ("gradients packed in backward order into buckets of at most `--threshold` "
               "bytes (Horovod's tensor fusion; 0 = WFBP)")
    Options = FusionOptions
    model = rules.Rule(grouping=rules.buckets(HOROVOD_DEFAULT_THRESHOLD),
                       advise=rules.threshold_grid)

    def _threshold(self) -> float:
        return float(self.options.threshold)


class BSPA2A(BucketedAllReduce):
    id = "bspa2a"
    display = "BSP-A2A"
    summary = "waits for the whole backward, then one all-reduce of every gradient"
    overlap = False
    model = rules.Rule(grouping=rules.one_message, after_backward=True)
    hatch = ".."

    def _threshold(self) -> float:
        return float("inf")

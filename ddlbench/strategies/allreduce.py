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

import torch

import compression

from . import register
from .base import Strategy

HOROVOD_DEFAULT_THRESHOLD = 64 * 1024 * 1024


def plan_buckets(nbytes: list[int], threshold: float, keys: list | None = None) -> list[list[int]]:
    """Split positions 0..n-1 (in backward order) into consecutive groups of at most
    ``threshold`` bytes; threshold 0 gives one group per tensor. ``keys`` (e.g. dtypes) that
    differ also close a group."""
    groups: list[list[int]] = []
    current: list[int] = []
    total = 0
    for i, n in enumerate(nbytes):
        fits = current and total + n <= threshold and (keys is None or keys[i] == keys[current[0]])
        if current and not fits:
            groups.append(current)
            current, total = [], 0
        current.append(i)
        total += n
    if current:
        groups.append(current)
    return groups


class _Bucket:
    def __init__(self, params: list[torch.nn.Parameter], members: list[int]):
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

    def pack(self) -> torch.Tensor:
        """The bucket's gradients as one flat tensor (a missing gradient counts as zeros): a
        lone contiguous gradient is used in place, several are copied into the buffer."""
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

    def unpack(self, flat: torch.Tensor) -> None:
        """Copy ``flat`` back into the gradients, unless it already is the gradient."""
        if self.buffer is not None or not self.params[0].grad.is_contiguous():
            offset = 0
            for p, n in zip(self.params, self.sizes):
                p.grad.copy_(flat[offset:offset + n].view_as(p.grad))
                offset += n


class BucketedAllReduce(Strategy):
    overlap = True           # start buckets from hooks during backward
    default_threshold = 0.0  # bytes

    def __init__(self, model, optimizer, comm, settings):
        super().__init__(model, optimizer, comm, settings)
        self.compressor = settings.get("compressor_obj") or compression.create("none")
        self.threshold = self._threshold(settings)
        self.rebuild = settings.get("rebuild_buckets", True)
        n = len(self.params)
        self._plan(list(reversed(range(n))))
        self._seen: list[int] = []
        self._steps = 0
        if self.overlap:
            self._register_ready_hooks(self._on_ready)

    def _threshold(self, settings) -> float:
        t = settings.get("threshold")
        return self.default_threshold if t is None else float(t)

    # -- planning ---------------------------------------------------------------------------
    def _groups(self, order: list[int]) -> list[list[int]]:
        nbytes = [self.params[i].numel() * self.params[i].element_size() for i in order]
        keys = [(self.params[i].dtype, self.params[i].device) for i in order]
        return [[order[j] for j in g] for g in plan_buckets(nbytes, self.threshold, keys)]

    def _plan(self, order: list[int]) -> None:
        self.order = order
        self.buckets = [_Bucket(self.params, g) for g in self._groups(order)]
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

    def _launch(self, b: _Bucket) -> None:
        b.flat = b.pack()
        b.pending = self.compressor.reduce_async(tuple(b.members), b.flat, self.comm,
                                                 shapes=[p.shape for p in b.params])

    def _finish(self, b: _Bucket) -> None:
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

    def groups(self) -> list[list[int]]:
        """The current buckets as lists of parameter indices (order of model.parameters())."""
        return [list(b.members) for b in self.buckets]

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


@register
class WFBP(BucketedAllReduce):
    name = "wfbp"
    display = "WFBP-A2A"
    default_threshold = 0.0

    def _threshold(self, settings) -> float:
        return 0.0


@register
class Fusion(BucketedAllReduce):
    name = "fusion"
    display = "Fusion-A2A"
    default_threshold = float(HOROVOD_DEFAULT_THRESHOLD)


@register
class BSPA2A(BucketedAllReduce):
    name = "bspa2a"
    display = "BSP-A2A"
    overlap = False

    def _threshold(self, settings) -> float:
        return float("inf")

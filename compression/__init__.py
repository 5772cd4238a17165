"""Gradient compressors: what is sent instead of the dense fp32 gradient (DESIGN.md section 7).

A compressor has one job, in the spirit of torch DDP's comm hooks: take a flat gradient tensor,
exchange it with the other workers in whatever encoded form it likes, and leave the average of
all workers' (decoded) gradients in that tensor. It knows nothing of buckets, hooks or
schedules; the strategy decides when and on what to call it. State such as error-feedback
residuals is kept per ``key`` (a stable name of the tensor or group being reduced).

    pending = compressor.reduce_async(key, flat, comm)   # starts communication
    pending.wait()                                       # flat now holds the average

Only ``none`` (dense all-reduce) lives here so far; fp16, TopK, signSGD and PowerSGD are the
subject of their own issue.
"""
from __future__ import annotations

import torch

from ddlbench.errors import UsageError


class Pending:
    """A started exchange; ``wait()`` completes it and leaves the average in place."""

    def __init__(self, work, finish):
        self._work = work
        self._finish = finish

    def wait(self) -> None:
        if self._work is not None:
            self._work.wait()
            self._work = None
            self._finish()


class Compressor:
    name = "none"

    def reduce_async(self, key, tensor: torch.Tensor, comm, shapes=None) -> Pending:
        """Start exchanging ``tensor`` (flat); ``shapes`` are the shapes of the gradients
        packed in it, in order, for compressors that work per matrix (PowerSGD)."""
        raise NotImplementedError

    def describe(self) -> dict:
        return {"compressor": self.name}


class NoCompression(Compressor):
    """Dense fp32 all-reduce, then divide by the number of workers."""

    name = "none"

    def reduce_async(self, key, tensor, comm, shapes=None):
        work = comm.allreduce(tensor, async_op=True)
        size = comm.size
        return Pending(work, lambda: tensor.div_(size))


COMPRESSORS = {"none": NoCompression}


def create(name: str, density: float = 0.001, **options) -> Compressor:
    if name not in COMPRESSORS:
        raise UsageError(f"unknown compressor {name!r}; known: {', '.join(COMPRESSORS)}")
    if not (0.0 < density <= 1.0):
        raise UsageError(f"--density must be in (0, 1], got {density}")
    return COMPRESSORS[name]()

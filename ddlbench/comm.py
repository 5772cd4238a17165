"""The collectives a strategy may use, with what they move counted.

Every strategy talks through one ``Comm``; that is where bytes are counted and where the order of
collectives can be traced (``trace=True``), so a test can check that every rank issues the same
sequence. Collectives sum; averaging is the caller's business.

Byte counts, per worker:
- ``payload``: bytes of the tensors handed to collectives (the nccl-tests "algbw" bytes);
- ``wire_sent``: what one worker sends under the ring algorithms of DESIGN.md section 3,
  all-reduce ``2(P-1)/P * M``, all-gather ``(P-1) * m``. It is a model of the algorithm, not a
  packet capture; Gloo and NCCL pick ring-like algorithms for large messages.
- parameter server (``push_pull``): ``push`` counts the bytes a worker sends to the servers and
  ``pull`` the bytes it receives back (M each per iteration, whatever W); these are the bytes
  actually handed to the transport, not a model.
"""
from __future__ import annotations

from collections import defaultdict

import torch
import torch.distributed as dist


_ITEMSIZE: dict = {}


# torch 2.14 deprecates all_gather_into_tensor for all_gather_single (same arguments); torch 2.0
# (the Horovod lane) has only the former.
all_gather_single = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor


class Comm:
    def __init__(self, rank: int, size: int, group=None, trace: bool = False, ps=None):
        self.rank = rank
        self.size = size
        self.group = group
        self.ps = ps  # PSClient of a job with parameter servers
        self.trace: list[tuple[str, int, str]] | None = [] if trace else None
        self.reset_stats()

    # -- accounting ------------------------------------------------------------------------
    def reset_stats(self) -> None:
        self.payload = defaultdict(int)
        self.wire_sent = defaultdict(int)
        self.calls = defaultdict(int)

    def _count(self, op: str, tensor: torch.Tensor, wire_factor: float) -> None:
        self.count(op, tensor.numel(), tensor.dtype, wire_factor)

    def count(self, op: str, numel: int, dtype: torch.dtype, wire_factor: float) -> None:
        """Account one collective of ``numel`` elements of ``dtype`` (also for collectives
        issued elsewhere, such as Horovod's)."""
        size = _ITEMSIZE.get(dtype)
        if size is None:
            size = _ITEMSIZE[dtype] = torch.empty((), dtype=dtype).element_size()
        nbytes = numel * size
        self.payload[op] += nbytes
        self.wire_sent[op] += int(round(nbytes * wire_factor))
        self.calls[op] += 1
        if self.trace is not None:
            self.trace.append((op, numel, str(dtype).replace("torch.", "")))

    def stats(self) -> dict:
        return {"payload_bytes": dict(self.payload), "wire_sent_bytes": dict(self.wire_sent),
                "calls": dict(self.calls)}

    # -- collectives -----------------------------------------------------------------------
    def allreduce(self, tensor: torch.Tensor, async_op: bool = True):
        """Sum ``tensor`` over all ranks, in place."""
        p = self.size
        self._count("allreduce", tensor, 2 * (p - 1) / p)
        return dist.all_reduce(tensor, group=self.group, async_op=async_op)

    def allgather(self, output: torch.Tensor, tensor: torch.Tensor, async_op: bool = True):
        """Gather every rank's ``tensor`` into ``output`` (size P * tensor.numel())."""
        self._count("allgather", tensor, self.size - 1)
        return all_gather_single(output, tensor, group=self.group, async_op=async_op)

    def broadcast(self, tensor: torch.Tensor, src: int = 0, async_op: bool = False):
        self._count("broadcast", tensor, (self.size - 1) if self.rank == src else 0)
        return dist.broadcast(tensor, src, group=self.group, async_op=async_op)

    def push_pull(self, part, data: torch.Tensor):
        """Push one partition to its server and post the pull of the sum into ``data``
        (returns the ``ps.Handle``). Traced as one ("push", key, numel) entry: servers match
        by key, so the order of pushes may differ between workers."""
        nbytes = data.numel() * data.element_size()
        for op in ("push", "pull"):
            self.payload[op] += nbytes
            self.calls[op] += 1
        self.wire_sent["push"] += nbytes
        if self.trace is not None:
            self.trace.append(("push", part.key, data.numel()))
        return self.ps.push_pull(part, data)

    def barrier(self) -> None:
        dist.barrier(group=self.group)

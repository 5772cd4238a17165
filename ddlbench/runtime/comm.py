"""The collectives a method may use, with what they move counted (the one place bytes are counted).

Every method talks through one ``Comm``, and so does the compressor it hands its buckets to;
that is where bytes are counted and where the order of collectives can be traced
(``trace=True``), so a test can check that every rank issues the same sequence. Collectives
sum; averaging is the caller's business: ``average_op()`` says whether this group's backend can
average in the all-reduce itself (``ReduceOp.AVG``), else the caller divides.

Byte counts, per worker:
- ``payload``: bytes of the tensors handed to collectives (the nccl-tests "algbw" bytes);
- ``wire_sent``: what one worker sends under the ring model of ``ddlbench.costs``
  (docs/DESIGN.md section 3), all-reduce ``2(P-1)/P * M``, all-gather ``(P-1) * m``. It is a
  model of the algorithm, not a packet capture; Gloo and NCCL pick ring-like algorithms for
  large messages.
- parameter server (``push_pull``): ``push`` counts the bytes a worker sends to the servers and
  ``pull`` the bytes it receives back (M each per iteration, whatever W); these are the bytes
  actually handed to the transport, not a model.

A compressor also reports here, per gradient it exchanges, the dense fp32 figures that gradient
would have cost (``count_dense``), and times its encoding and decoding (``clock``); the run's
compression figures (``compression_stats``) are read from these counters.
"""
from __future__ import annotations

import threading
import time
from collections import defaultdict
from contextlib import contextmanager, nullcontext

import torch
import torch.distributed as dist

from ..costs import bus_factor, sent_bytes

_ITEMSIZE: dict = {}
_RING_OPS = ("allreduce", "allgather")  # what compressors exchange with

# torch 2.14 deprecates all_gather_into_tensor for all_gather_single (same arguments); torch 2.0
# (the Horovod lane) has only the former.
all_gather_single = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor


def backend_averages(backend: str) -> bool:
    """Whether all-reduce takes ``ReduceOp.AVG`` on ``backend``: NCCL does (NCCL >= 2.10,
    what every torch this suite runs on bundles); Gloo from torch 2.8 (pytorch/pytorch#149781,
    a sum then a division; torch 2.7 and older refuse it: "Cannot use ReduceOp.AVG with
    Gloo"); any other backend is not assumed to."""
    if backend == "nccl":
        return True
    if backend == "gloo":
        from ..compat import TORCH_VERSION
        return TORCH_VERSION >= (2, 8)
    return False


def itemsize(dtype: torch.dtype) -> int:
    size = _ITEMSIZE.get(dtype)
    if size is None:
        size = _ITEMSIZE[dtype] = torch.empty((), dtype=dtype).element_size()
    return size


def _ignore(*_tensors) -> None:
    """``Comm.clock``'s ``encoded`` where nothing records it."""


_UNLABELLED = nullcontext()


class _About:
    """``Comm.about`` while the timeline records: the thread's label for the block."""

    def __init__(self, local: threading.local, label):
        self._local, self._label, self._previous = local, label, None

    def __enter__(self):
        self._previous = getattr(self._local, "label", None)
        self._local.label = self._label

    def __exit__(self, *_exc):
        self._local.label = self._previous


class Comm:
    def __init__(self, rank: int, size: int, group=None, trace: bool = False, ps=None,
                 trace_file: bool = False):
        self.rank = rank
        self.size = size
        self.group = group
        self.ps = ps  # PSClient of a job with parameter servers
        self.trace: list[tuple[str, int, str]] | None = [] if trace else None
        # What ran when, over the timed rounds (ddlbench.timeline): every collective
        # handed to the transport is a span on it.
        from ..timeline import Timeline
        self.timeline = Timeline(rank, trace_file=trace_file)
        self._about = threading.local()
        self._average_op = False  # not yet decided (average_op)
        self.reset_stats()

    # -- accounting ------------------------------------------------------------------------
    def reset_stats(self) -> None:
        self.payload = defaultdict(int)
        self.wire_sent = defaultdict(int)
        self.calls = defaultdict(int)
        self.dense = defaultdict(float)     # dense fp32 payload and wire bytes of compressed data
        self.seconds = defaultdict(float)   # encode_s (of it encode_at_wait_s), decode_s
        self._events = []                   # CUDA timing events not yet read

    def count(self, op: str, numel: int, dtype: torch.dtype, calls: int = 1,
              root: bool = True) -> None:
        """Account ``calls`` collectives moving ``numel`` elements of ``dtype`` in all (also
        for collectives issued elsewhere, such as Horovod's or DDP's own; ``calls=0`` when
        their number is unknown: then nothing is traced either). ``root``: whether this rank
        is a broadcast's source."""
        nbytes = numel * itemsize(dtype)
        self.payload[op] += nbytes
        self.wire_sent[op] += sent_bytes(op, nbytes, self.size, root=root)
        self.calls[op] += calls
        if self.trace is not None and calls:
            self.trace.append((op, numel, str(dtype).replace("torch.", "")))

    def count_dense(self, numel: int) -> None:
        """A compressor exchanged a gradient of ``numel`` elements: what it would have cost as
        a dense fp32 all-reduce."""
        nbytes = numel * 4
        self.dense["payload_bytes"] += nbytes
        self.dense["wire_bytes"] += nbytes * bus_factor("allreduce", self.size)

    @contextmanager
    def clock(self, what: str, tensor: torch.Tensor, at_wait: bool = False):
        """Time a block of encoding or decoding work (``what``: encode_s or decode_s): wall
        clock on the CPU, CUDA events (read later, no synchronisation here) on a GPU. Yields
        ``encoded(*tensors)``: the block names the encoded tensors (what an encoder produced,
        what a decoder read), whose bytes its timeline span carries (``bytes_out`` of an
        encode, ``bytes_in`` of a decode) beside the dense ``bytes``. ``at_wait``: an encode
        the compressor does only when the bucket is waited for (PowerSGD's Q, which needs the
        reduced P), counted in ``encode_s`` and also in ``encode_at_wait_s``."""
        keys = (what, "encode_at_wait_s") if at_wait and what == "encode_s" else (what,)
        if tensor.is_cuda:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            yield _ignore
            end.record()
            self._events.extend((key, start, end) for key in keys)
            if len(self._events) > 4096:
                self._read_events(len(self._events) // 2)
        else:
            t0 = time.perf_counter()
            # The dense gradient it works on; what it becomes is on the wire: the bytes of the
            # collective spans that follow.
            with self.timeline.span(what[:-2], "codec", "compressor", elements=tensor.numel(),
                                    bytes=tensor.numel() * itemsize(tensor.dtype)) as args:
                key = "bytes_out" if what == "encode_s" else "bytes_in"

                def encoded(*tensors):
                    if args is not None:
                        args[key] = sum(t.numel() * itemsize(t.dtype) for t in tensors)
                yield encoded
            elapsed = time.perf_counter() - t0
            for key in keys:
                self.seconds[key] += elapsed

    def _read_events(self, n: int | None = None) -> None:
        n = len(self._events) if n is None else n
        for what, start, end in self._events[:n]:
            end.synchronize()
            self.seconds[what] += start.elapsed_time(end) / 1000.0
        del self._events[:n]

    def stats(self, steps: int = 1) -> dict:
        """Bytes handed to collectives, wire bytes sent and calls, per operation, divided by
        ``steps``."""
        return {name: {op: v / steps for op, v in counts.items()}
                for name, counts in (("payload_bytes", self.payload),
                                     ("wire_sent_bytes", self.wire_sent),
                                     ("calls", self.calls))}

    def compression_stats(self, steps: int = 1) -> dict | None:
        """Per-worker compression figures divided by ``steps``: bytes handed to collectives,
        wire bytes sent and received (ring model: a ring all-reduce or all-gather receives what
        it sends), the dense fp32 figures of the same gradients, encode and decode seconds
        (and the part of the encode done when a bucket was waited for). None when no
        compressor exchanged anything."""
        if not self.dense["payload_bytes"]:
            return None
        self._read_events()
        payload = sum(self.payload[op] for op in _RING_OPS)
        wire = sum(self.wire_sent[op] for op in _RING_OPS)
        out = {"payload_bytes": payload / steps, "wire_sent_bytes": wire / steps,
               "wire_received_bytes": wire / steps,
               "dense_payload_bytes": self.dense["payload_bytes"] / steps,
               "dense_wire_bytes": self.dense["wire_bytes"] / steps,
               "encode_s": self.seconds["encode_s"] / steps,
               "encode_at_wait_s": self.seconds["encode_at_wait_s"] / steps,
               "decode_s": self.seconds["decode_s"] / steps}
        out["compression_ratio"] = (out["dense_payload_bytes"] / out["payload_bytes"]
                                    if out["payload_bytes"] else None)
        return out

    # -- collectives -----------------------------------------------------------------------
    def average_op(self):
        """``ReduceOp.AVG`` where this group's backend averages in the all-reduce itself
        (``backend_averages``), else None: then sum and divide. None also for one worker
        (nothing to divide) and for a ``Comm`` that is not the process group it reports (no
        group initialised, or another size: a stand-in such as compression.bench's)."""
        if self._average_op is False:
            op = None
            if self.size > 1 and dist.is_available() and dist.is_initialized() and \
                    dist.get_world_size(self.group) == self.size and \
                    backend_averages(dist.get_backend(self.group)):
                op = dist.ReduceOp.AVG
            self._average_op = op
        return self._average_op

    def allreduce(self, tensor: torch.Tensor, async_op: bool = True, op=None):
        """Sum ``tensor`` over all ranks, in place (``op``: another reduction, such as
        ``average_op()``'s)."""
        self.count("allreduce", tensor.numel(), tensor.dtype)
        kwargs = {} if op is None else {"op": op}
        return self._traced("allreduce", tensor, async_op, lambda: dist.all_reduce(
            tensor, group=self.group, async_op=async_op, **kwargs))

    def allgather(self, output: torch.Tensor, tensor: torch.Tensor, async_op: bool = True):
        """Gather every rank's ``tensor`` into ``output`` (size P * tensor.numel())."""
        self.count("allgather", tensor.numel(), tensor.dtype)
        return self._traced("allgather", tensor, async_op, lambda: all_gather_single(
            output, tensor, group=self.group, async_op=async_op))

    def broadcast(self, tensor: torch.Tensor, src: int = 0, async_op: bool = False):
        self.count("broadcast", tensor.numel(), tensor.dtype, root=self.rank == src)
        return self._traced("broadcast", tensor, async_op, lambda: dist.broadcast(
            tensor, src, group=self.group, async_op=async_op))

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
        return self.timeline.comm("push_pull", self.ps.push_pull(part, data), "push_pull",
                                  bytes=nbytes, key=part.key, server=part.server)

    def about(self, label):
        """The collectives this thread issues inside carry ``label`` on the timeline (the
        gradient tensors they move: ``timeline.tensors_label``); ``label`` may be a
        callable, called only while the timeline records. A context manager; with the
        timeline off a shared one that does nothing (no generator per collective)."""
        if not self.timeline.enabled:
            return _UNLABELLED
        return _About(self._about, label() if callable(label) else label)

    def _traced(self, op: str, tensor: torch.Tensor, async_op: bool, issue):
        """Issue a collective; while the timeline records, it is a span from now until it
        completes (an asynchronous one's future, a blocking one's return)."""
        tl = self.timeline
        if not tl.enabled:
            return issue()
        args = {"bytes": tensor.numel() * itemsize(tensor.dtype)}
        label = getattr(self._about, "label", None)
        if label is not None:
            args["tensor"] = label
        if async_op:
            return tl.comm(op, issue(), op, **args)
        with tl.span(op, "comm", op, **args):
            return issue()

    def barrier(self) -> None:
        dist.barrier(group=self.group)

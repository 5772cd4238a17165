"""The collectives a method may use, with what they move counted (the one place bytes are counted).

Every method talks through one ``Comm``, and so does the compressor it hands its buckets to;
that is where bytes are counted and where the order of collectives can be traced
(``trace=True``), so a test can check that every rank issues the same sequence. Only the
collectives declared in ``ddlbench.collectives`` exist here: all-reduce, reduce-scatter (with
its declared carriers: ``a2a``, an all-to-all and a local sum in rank order, the default on
Gloo; ``native``, the backend's own), all-gather, all-to-all, broadcast, push/pull. Each takes
``group``: a layout (``"world"``, ``"machine"``, ``"across"``) or a ``runtime.groups.Group``;
``group_of(layout)`` builds the job's groups once, from where its ranks sit. Collectives sum;
averaging is the caller's business: ``average_op()`` says whether this group's backend can
average in the all-reduce itself (``ReduceOp.AVG``), else the caller divides.

Byte counts, per worker:
- ``payload``: bytes of the tensors handed to collectives (the nccl-tests "algbw" bytes);
- ``wire_sent``: what one worker sends as the collective's declaration says for its group's
  size, carrier and backend (``collectives.sent_bytes``; docs/DESIGN.md section 3), all-reduce
  ``2(P-1)/P * M``, all-gather ``(P-1) * m``, reduce-scatter by all-to-all ``(P-1)/P * M``. It
  is a model of the algorithm, not a packet capture (tests/test_collectives.py holds it to the
  kernel's loopback counters within 2% on Gloo); ``wire_by_group``: the same per group layout,
  for collectives on groups other than the whole job.
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

from ..collectives import ACROSS, A2A, MACHINE, RING, WORLD, bus_factor, declared, sent_bytes
from .groups import Group, Groups

_ITEMSIZE: dict = {}
_RING_OPS = ("allreduce", "allgather")  # what compressors exchange with

# torch 2.14 deprecates all_gather_into_tensor for all_gather_single (same arguments); torch 2.0
# (the Horovod lane) has only the former.
all_gather_single = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
# likewise reduce_scatter_single (torch 2.14) and reduce_scatter_tensor
reduce_scatter_single = (getattr(dist, "reduce_scatter_single", None)
                         or dist.reduce_scatter_tensor)


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


class _Done:
    """The work of a collective with nothing to send (a group of one): already complete."""

    def wait(self, *_args) -> bool:
        return True

    def is_completed(self) -> bool:
        return True


def _done(async_op: bool):
    return _Done() if async_op else None


class _Then:
    """An asynchronous collective's work whose ``wait()`` also runs ``finish`` once, after it
    (reduce-scatter's ``a2a`` carrier: the local sum after the all-to-all)."""

    def __init__(self, work, finish):
        self._work, self._finish = work, finish

    def is_completed(self) -> bool:
        return self._work.is_completed()

    def wait(self, *args) -> bool:
        self._work.wait(*args)
        if self._finish is not None:
            finish, self._finish = self._finish, None
            finish()
        return True


def _ring_reduce_scatter(output: torch.Tensor, tensor: torch.Tensor, ranks: list[int],
                         me: int, handle) -> None:
    """Reduce-scatter's ``ring`` carrier: P - 1 steps; at step s group rank r sends its
    running sum of shard (r - s - 1) mod P to rank r + 1 and adds the shard (r - s - 2) mod P
    it receives from rank r - 1, so after the last step it holds the whole sum of shard r.
    Each rank sends (P - 1)/P of the tensor, only to its neighbour (``ranks``: the group's
    global ranks in group order, ``me``: this rank's place in it)."""
    p = len(ranks)
    acc = tensor.detach().reshape(-1).clone().view(p, -1)
    incoming = torch.empty_like(acc[0])
    after, before = ranks[(me + 1) % p], ranks[(me - 1) % p]
    for step in range(p - 1):
        ops = [dist.P2POp(dist.isend, acc[(me - step - 1) % p], after, handle),
               dist.P2POp(dist.irecv, incoming, before, handle)]
        for work in dist.batch_isend_irecv(ops):
            work.wait()
        acc[(me - step - 2) % p].add_(incoming)
    output.view(-1).copy_(acc[me])


def _sum_in_rank_order(shards: torch.Tensor, size: int, output: torch.Tensor) -> None:
    """``output`` = shard 0 + shard 1 + ... of ``shards`` (``size`` equal parts), added left to
    right, as a single process sums the ranks' tensors."""
    parts = shards.view(size, -1)
    out = output.view(-1)
    out.copy_(parts[0])
    for j in range(1, size):
        out.add_(parts[j])


class Comm:
    def __init__(self, rank: int, size: int, group=None, trace: bool = False, ps=None,
                 trace_file: bool = False, groups: Groups | None = None):
        self.rank = rank
        self.size = size
        self.group = group
        self.ps = ps  # PSClient of a job with parameter servers
        self._groups = groups  # the job's groups by layout (built here when first asked)
        self._backend = False  # not yet asked (backend)
        self.trace: list[tuple[str, int, str]] | None = [] if trace else None
        # What ran when, over the timed rounds (ddlbench.timeline): every collective
        # handed to the transport is a span on it.
        from ..timeline import Timeline
        self.timeline = Timeline(rank, trace_file=trace_file)
        self._about = threading.local()
        self._average_op = False  # not yet decided (average_op)
        self._levels = None       # (machine group, across group, rank order): levels()
        self.reset_stats()

    # -- accounting ------------------------------------------------------------------------
    def reset_stats(self) -> None:
        self.payload = defaultdict(int)
        self.wire_sent = defaultdict(int)
        self.wire_by_group = defaultdict(lambda: defaultdict(int))  # layout -> op -> bytes
        self.calls = defaultdict(int)
        self.dense = defaultdict(float)     # dense fp32 payload and wire bytes of compressed data
        self.seconds = defaultdict(float)   # encode_s (of it encode_at_wait_s), decode_s
        self._events = []                   # CUDA timing events not yet read

    def count(self, op: str, numel: int, dtype: torch.dtype, calls: int = 1,
              root: bool = True, group: Group | None = None, carrier: str | None = None) -> None:
        """Account ``calls`` collectives moving ``numel`` elements of ``dtype`` in all (also
        for collectives issued elsewhere, such as Horovod's or DDP's own; ``calls=0`` when
        their number is unknown: then nothing is traced either). ``root``: whether this rank
        is a broadcast's source; ``group``: where it ran (None: the whole job); ``carrier``:
        how (its declared bytes)."""
        nbytes = numel * itemsize(dtype)
        size = self.size if group is None else group.size
        sent = sent_bytes(op, nbytes, size, root=root, carrier=carrier,
                          backend=self.backend(group) if carrier or group else None)
        self.payload[op] += nbytes
        self.wire_sent[op] += sent
        self.calls[op] += calls
        name = op
        if group is not None and group.layout != WORLD:
            self.wire_by_group[group.layout][op] += sent
            name = f"{op}@{group.layout}"
        if self.trace is not None and calls:
            self.trace.append((name, numel, str(dtype).replace("torch.", "")))

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
        ``steps``; with ``wire_sent_bytes_by_group`` (layout -> operation -> bytes) where
        collectives ran on groups other than the whole job."""
        out = {name: {op: v / steps for op, v in counts.items()}
               for name, counts in (("payload_bytes", self.payload),
                                    ("wire_sent_bytes", self.wire_sent),
                                    ("calls", self.calls))}
        if self.wire_by_group:
            out["wire_sent_bytes_by_group"] = {
                layout: {op: v / steps for op, v in ops.items()}
                for layout, ops in self.wire_by_group.items()}
        return out

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

    # -- groups ------------------------------------------------------------------------------
    def _job_groups(self) -> Groups:
        """The job's groups (made here, for this Comm's group, when none was given)."""
        if self._groups is None:
            self._groups = Groups(self.rank, self.size, self.group)
        return self._groups

    def group_of(self, layout: str, channel: int = 0) -> Group:
        """This rank's group of ``layout`` (``collectives.LAYOUTS``): built once for the job,
        on every rank, the first time any rank's method asks (ask in the constructor);
        ``channel`` > 0: another process group of the same ranks (``Groups.get``), for a second
        thread's collectives."""
        return self._job_groups().get(layout, channel)

    def machines(self) -> list[list[int]]:
        """The job's ranks grouped by machine (gathered once, on every rank, when first
        asked)."""
        return self._job_groups().machines

    def describe_groups(self) -> dict | None:
        """The layouts built, each as its groups of job ranks (None: only the whole job)."""
        return None if self._groups is None else self._groups.describe()

    def backend(self, group: Group | None = None) -> str | None:
        """The backend the collectives of ``group`` (None: the whole job) run on; None where
        no process group is initialised (a stand-in ``Comm``)."""
        if group is not None and group.backend is not None:
            return group.backend
        if self._backend is False:
            self._backend = (dist.get_backend(self.group) if dist.is_available()
                             and dist.is_initialized() else None)
        return self._backend

    def _where(self, group) -> tuple[Group | None, object, int]:
        """(the group, torch's handle, its size) of a collective's ``group`` argument."""
        if group is None or group == WORLD:
            return None, self.group, self.size
        if isinstance(group, str):
            group = self.group_of(group)
        return group, group.handle, group.size

    # -- collectives -----------------------------------------------------------------------
    def average_op(self):
        """``ReduceOp.AVG`` where this group's backend averages in the all-reduce itself
        (``backend_averages``), else None: then sum and divide. None also for one worker
        (nothing to divide) and for a ``Comm`` that is not the process group it reports (no
        group initialised, or another size: a stand-in such as codec_bench's)."""
        if self._average_op is False:
            op = None
            if self.size > 1 and dist.is_available() and dist.is_initialized() and \
                    dist.get_world_size(self.group) == self.size and \
                    backend_averages(dist.get_backend(self.group)):
                op = dist.ReduceOp.AVG
            self._average_op = op
        return self._average_op

    def allreduce(self, tensor: torch.Tensor, async_op: bool = True, op=None, group=None):
        """Sum ``tensor`` over the group's ranks, in place (``op``: another reduction, such as
        ``average_op()``'s)."""
        g, handle, size = self._where(group)
        self.count("allreduce", tensor.numel(), tensor.dtype, group=g)
        if size == 1 and g is not None:
            return _done(async_op)
        kwargs = {} if op is None else {"op": op}
        return self._traced("allreduce", tensor, async_op, lambda: dist.all_reduce(
            tensor, group=handle, async_op=async_op, **kwargs), g)

    def reduce_scatter(self, output: torch.Tensor, tensor: torch.Tensor, async_op: bool = True,
                       carrier: str | None = None, group=None):
        """Into ``output``, the sum over the group's ranks of this rank's shard of ``tensor``
        (P equal shards, shard r to group rank r), carried by ``carrier``
        (``collectives``: ``a2a``, ``native`` or ``ring``; None: the backend's declared
        default). The ``a2a`` carrier sums the shards in rank order (as a single process
        would); the ``ring`` carrier runs its steps on the calling thread (blocking: with
        ``async_op`` its work is already complete)."""
        g, handle, size = self._where(group)
        declaration = declared("reduce_scatter").carrier(carrier, self.backend(g))
        carrier = declaration.name
        if tensor.numel() != output.numel() * size:
            raise ValueError(f"reduce_scatter of {tensor.numel()} elements among {size} ranks "
                             f"needs an output of {tensor.numel() // max(size, 1)} elements "
                             f"and a tensor of {size} equal shards; got an output of "
                             f"{output.numel()}")
        if declaration.levels:
            return self._reduce_scatter_levels(output, tensor, async_op, g)
        self.count("reduce_scatter", tensor.numel(), tensor.dtype, group=g, carrier=carrier)
        if size == 1:
            output.copy_(tensor.view(-1))
            return _done(async_op)
        if carrier == RING:         # its steps run on this thread: done when it returns
            ranks = list(range(size)) if g is None else list(g.ranks)
            me = self.rank if g is None else g.rank
            self._traced("reduce_scatter", tensor, False, lambda: _ring_reduce_scatter(
                output, tensor, ranks, me, handle), g, carrier=carrier)
            return _done(async_op)
        if carrier != A2A:
            return self._traced("reduce_scatter", tensor, async_op, lambda: reduce_scatter_single(
                output, tensor, group=handle, async_op=async_op), g, carrier=carrier)
        shards = torch.empty(tensor.numel(), dtype=tensor.dtype, device=tensor.device)
        work = self._traced("reduce_scatter", tensor, async_op, lambda: dist.all_to_all_single(
            shards, tensor.view(-1), group=handle, async_op=async_op), g, carrier=carrier)
        if not async_op:
            _sum_in_rank_order(shards, size, output)
            return None
        return _Then(work, lambda: _sum_in_rank_order(shards, size, output))

    def all_to_all(self, output: torch.Tensor, tensor: torch.Tensor, async_op: bool = True,
                   group=None):
        """Chunk j of ``tensor`` (P equal chunks) to group rank j; ``output`` receives the
        chunks of every rank, in rank order."""
        g, handle, size = self._where(group)
        self.count("all_to_all", tensor.numel(), tensor.dtype, group=g)
        if size == 1 and g is not None:
            output.copy_(tensor)
            return _done(async_op)
        return self._traced("all_to_all", tensor, async_op, lambda: dist.all_to_all_single(
            output, tensor, group=handle, async_op=async_op), g)

    def allgather(self, output: torch.Tensor, tensor: torch.Tensor, async_op: bool = True,
                  group=None, carrier: str | None = None):
        """Gather every group rank's ``tensor`` into ``output`` (size P * tensor.numel()),
        carried by ``carrier`` (``collectives``: ``native``, the default, or ``two-level``)."""
        g, handle, size = self._where(group)
        if declared("allgather").carrier(carrier, self.backend(g)).levels:
            return self._allgather_levels(output, tensor, async_op, g)
        self.count("allgather", tensor.numel(), tensor.dtype, group=g)
        if size == 1 and g is not None:
            output.view(-1).copy_(tensor.view(-1))
            return _done(async_op)
        return self._traced("allgather", tensor, async_op, lambda: all_gather_single(
            output, tensor, group=handle, async_op=async_op), g)

    # -- the carriers in levels (collectives.TWO_LEVEL): machine, then across, or back ------
    def levels(self, group: Group | None = None):
        """(my machine's group, my group across machines, the order of the job's ranks that
        puts each machine-group rank's chunk together: local index 0's ranks by rank, then
        local index 1's, ...) for a collective of the whole job in two levels. The groups
        are built on first asking: a method that uses these carriers asks in its
        constructor, as for any layout."""
        if group is not None and group.layout != WORLD:
            from ..errors import UsageError
            raise UsageError(f"a collective in levels runs on the whole job, not on group "
                             f"{group.layout}")
        if self._levels is None:
            machines = self.machines()
            sizes = sorted({len(m) for m in machines})
            if len(sizes) > 1:
                from ..errors import UsageError
                raise UsageError(f"a collective in levels needs machines of one size, got "
                                 f"{'/'.join(str(len(m)) for m in machines)} workers")
            order = [r for j in range(sizes[0]) for r in sorted(m[j] for m in machines)]
            self._levels = (self.group_of(MACHINE), self.group_of(ACROSS),
                            torch.tensor(order, dtype=torch.int64))
        machine, across, order = self._levels
        return machine, across, order

    def _reduce_scatter_levels(self, output, tensor, async_op, g):
        """Reduce-scatter ``two-level``: the shards put in ``levels()``'s order (chunk j of the
        machine: the shards of the ranks of local index j, as their group across orders
        them), reduce-scattered inside the machine (on this thread), then that chunk across
        machines, rank r receiving shard r."""
        machine, across, order = self.levels(g)
        shards = tensor.reshape(self.size, -1)
        ordered = shards.index_select(0, order.to(tensor.device)).view(-1)
        chunk = torch.empty(tensor.numel() // machine.size, dtype=tensor.dtype,
                            device=tensor.device)
        self.reduce_scatter(chunk, ordered, async_op=False, group=machine)
        return self.reduce_scatter(output, chunk, async_op=async_op, group=across)

    def _allgather_levels(self, output, tensor, async_op, g):
        """All-gather ``two-level``: the shards of my local index gathered across machines (a
        chunk), then the machine's chunks inside it, put back in rank order. The second level
        is issued when the first is waited for: every rank must wait in the same order (the
        sharding methods wait in forward order)."""
        machine, across, order = self.levels(g)
        chunk = torch.empty(output.numel() // machine.size, dtype=output.dtype,
                            device=output.device)
        work = self.allgather(chunk, tensor, async_op=True, group=across)

        def inside() -> None:
            gathered = torch.empty(output.numel(), dtype=output.dtype, device=output.device)
            self.allgather(gathered, chunk, async_op=False, group=machine)
            output.view(self.size, -1).index_copy_(0, order.to(output.device),
                                                    gathered.view(self.size, -1))
        if not async_op:
            work.wait()
            inside()
            return None
        return _Then(work, inside)

    def broadcast(self, tensor: torch.Tensor, src: int = 0, async_op: bool = False, group=None):
        """Group rank ``src``'s ``tensor`` to every rank of the group."""
        g, handle, size = self._where(group)
        me = self.rank if g is None else g.rank
        self.count("broadcast", tensor.numel(), tensor.dtype, root=me == src, group=g)
        if size == 1 and g is not None:
            return _done(async_op)
        root = src if g is None else g.ranks[src]
        return self._traced("broadcast", tensor, async_op, lambda: dist.broadcast(
            tensor, root, group=handle, async_op=async_op), g)

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

    def _traced(self, op: str, tensor: torch.Tensor, async_op: bool, issue,
                group: Group | None = None, **extra):
        """Issue a collective; while the timeline records, it is a span from now until it
        completes (an asynchronous one's future, a blocking one's return), on a row of its
        own per group layout (``op``, or ``op @layout`` with the ``group`` argument), with
        ``extra`` (the carrier) among its arguments."""
        tl = self.timeline
        if not tl.enabled:
            return issue()
        args = {"bytes": tensor.numel() * itemsize(tensor.dtype), **extra}
        row = op
        if group is not None and group.layout != WORLD:
            args["group"] = group.layout
            row = f"{op} @{group.layout}"
        label = getattr(self._about, "label", None)
        if label is not None:
            args["tensor"] = label
        if async_op:
            return tl.comm(op, issue(), row, **args)
        with tl.span(op, "comm", row, **args):
            return issue()

    def barrier(self) -> None:
        dist.barrier(group=self.group)

"""Parameter-server methods (DESIGN.md sections 2 and 6): BSP-PS, WFBP-PS, ByteScheduler-PS.

Gradients are grouped into units in backward order by a fusion threshold in bytes (BytePS-like
semantics: ``bspps`` defaults to 536,870,912, one unit for any model the suite has, pushed after
the whole backward; ``wfbpps`` defaults to 0, one unit per tensor, pushed from its gradient hook
the moment it is ready; ``--threshold`` overrides either). Each unit is cut into
``--partition-bytes`` partitions, pushed to their servers and pulled back summed
(``ddlbench.ps``); ``step()`` waits for the pulls, divides by the number of workers and applies
the optimizer.

Unlike all-reduce, nothing here needs the workers to agree on an order: a server matches pushes
by key, so each worker pushes a unit as soon as it is complete on that worker. The units are
planned once, in reverse registration order (the order autograd usually produces gradients),
and must be the same on every worker because the servers hold one buffer per partition; they
are not re-planned from observed order as the all-reduce methods' buckets are.
"""
from __future__ import annotations

import queue
import threading

import torch

from .. import ps
from ..errors import UsageError
from . import register
from .allreduce import _Bucket, plan_buckets
from .base import Strategy
from .bytescheduler import ByteScheduler

BSP_PS_THRESHOLD = 536_870_912  # bytes: every gradient in one fused unit


def require_servers(name: str, comm, settings: dict) -> None:
    if comm.ps is None:
        raise UsageError(f"method {name} needs parameter servers: start the job with "
                         f"--nservers S (S >= 1 extra processes)")
    compressor = settings.get("compressor_obj")
    if compressor is not None and compressor.name != "none":
        raise UsageError(f"method {name} pushes dense gradients; --compressor "
                         f"{compressor.name} is for the all-reduce methods")


class BucketedPS(Strategy):
    architecture = "ps"
    overlap = True
    default_threshold = 0.0

    def __init__(self, model, optimizer, comm, settings):
        super().__init__(model, optimizer, comm, settings)
        require_servers(self.name, comm, settings)
        t = settings.get("threshold")
        self.threshold = self.default_threshold if t is None else float(t)
        order = list(reversed(range(len(self.params))))
        nbytes = [self.params[i].numel() * self.params[i].element_size() for i in order]
        keys = [(self.params[i].dtype, self.params[i].device) for i in order]
        groups = [[order[j] for j in g] for g in plan_buckets(nbytes, self.threshold, keys)]
        self.buckets = [_Bucket(self.params, g) for g in groups]
        self.unit_of = {i: u for u, b in enumerate(self.buckets) for i in b.members}
        self.parts = comm.ps.open([(b.numel, b.params[0].dtype) for b in self.buckets])
        self._launched: set[int] = set()
        if self.overlap:
            self._register_ready_hooks(self._on_ready)

    def _on_ready(self, i: int) -> None:
        u = self.unit_of[i]
        b = self.buckets[u]
        b.ready += 1
        if b.ready == len(b.members):
            self._launch(u)

    def _launch(self, u: int) -> None:
        b = self.buckets[u]
        self._launched.add(u)
        b.flat = flat = b.pack()
        b.pending = [self.comm.push_pull(part, flat[part.start:part.end])
                     for part in self.parts[u]]

    def step(self) -> None:
        for u in range(len(self.buckets)):
            if u not in self._launched:
                self._launch(u)
        for b in self.buckets:
            for h in b.pending:
                h.wait()
            if self.comm.size > 1:
                b.flat.div_(self.comm.size)
            b.unpack(b.flat)
            b.pending = None
            b.flat = None
            b.ready = 0
        self._launched.clear()
        self.optimizer.step()

    def groups(self) -> list[list[int]]:
        return [list(b.members) for b in self.buckets]

    def describe(self) -> dict:
        d = super().describe()
        parts = [p for unit in self.parts for p in unit]
        per_server = [0] * self.comm.ps.nservers
        for p, b in ((p, self.buckets[p.unit]) for p in parts):
            per_server[p.server] += p.numel * b.params[0].element_size()
        d.update({
            "threshold_bytes": self.threshold if self.threshold != float("inf") else None,
            "units": len(self.buckets),
            "unit_bytes": [b.nbytes for b in self.buckets],
            "nservers": self.comm.ps.nservers,
            "partition_bytes": self.comm.ps.partition_bytes,
            "partitions": len(parts),
            "bytes_per_server": per_server,
            "compressor": "none",
        })
        return d

    def close(self) -> None:
        super().close()
        self.comm.ps.close()


@register
class BSPPS(BucketedPS):
    name = "bspps"
    display = "BSP-PS"
    overlap = False
    default_threshold = float(BSP_PS_THRESHOLD)


@register
class WFBPPS(BucketedPS):
    name = "wfbpps"
    display = "WFBP-PS"
    overlap = True
    default_threshold = 0.0


@register
class ByteSchedulerPS(ByteScheduler):
    """ByteScheduler over the parameter servers (DESIGN.md sections 5 and 6).

    The A2A scheduler's partition + priority + credit rules, per-tensor updates and forward
    pre-hooks, with two differences that the transport allows or needs:

    - **No negotiation.** Servers match pushes by key, so every worker dispatches by its own
      readiness; nothing is broadcast.
    - **Credit returns when the server has taken a push**, not when the sum comes back (as in
      BytePS, whose server acknowledges a push on receipt). Returning it on the pull would
      deadlock under jitter: worker A could hold its window on chunks that worker B, whose
      window holds others, has not pushed yet.

    Chunks are the PS partitions: each tensor is cut into ``--partition-bytes`` pieces (the
    unit a server sums), so ``--partition`` (A2A, in elements) does not apply here;
    ``--credit`` is in elements as for the A2A scheduler.
    """
    name = "byteschedulerps"
    display = "ByteScheduler-PS"
    architecture = "ps"
    negotiated = False
    credit_on_completion = False

    def __init__(self, model, optimizer, comm, settings):
        require_servers(self.name, comm, settings)
        self._pushes: queue.Queue = queue.Queue()
        super().__init__(model, optimizer, comm, settings)
        self._credit_thread = threading.Thread(target=self._guard(self._credit_loop),
                                               name="bytescheduler-credit", daemon=True)
        self._credit_thread.start()

    def _partition(self, settings) -> int:
        size = self.params[0].element_size() if self.params else 4
        return ps.partition_elements(self.comm.ps.partition_bytes, size)

    def _chunk_table(self) -> list[tuple[int, int, int]]:
        self.parts = self.comm.ps.open([(p.numel(), p.dtype) for p in self.params])
        self._part_of = [p for unit in self.parts for p in unit]
        return [(p.unit, p.start, p.end) for p in self._part_of]

    def _start_chunk(self, chunk: int, data: torch.Tensor):
        handle = self.comm.push_pull(self._part_of[chunk], data)
        self._pushes.put((chunk, handle))
        return handle

    def _credit_loop(self) -> None:
        while True:
            item = self._pushes.get()
            if item is None:
                return
            chunk, handle = item
            handle.wait_push()
            with self._cv:
                self.window.done(chunk)
                self._cv.notify_all()

    def describe(self) -> dict:
        d = super().describe()
        d.pop("negotiation_messages_per_iteration", None)
        d.pop("negotiation_bytes_per_iteration", None)
        d.update({
            "order_agreement": "none needed: servers match pushes by key",
            "credit_returned": "when the server has taken the push",
            "nservers": self.comm.ps.nservers,
            "partition_bytes": self.comm.ps.partition_bytes,
            "partitions": len(self._part_of),
        })
        return d

    def close(self) -> None:
        super().close()
        self._pushes.put(None)
        self._credit_thread.join(timeout=10)
        self.comm.ps.close()

"""torch DistributedDataParallel: the baseline a user would otherwise pick.

DDP owns its buckets (``bucket_cap_mb``, default 25 MiB as in torch), overlaps their all-reduce
with the backward pass and averages the gradients itself; ``step()`` only applies the optimizer.

With ``--compressor`` other than none, DDP keeps its buckets, their order and its overlap, and a
comm hook (``register_comm_hook``) hands each bucket to the suite's compressor instead of DDP's
dense all-reduce: DDP's scheduling with this suite's compression mathematics, so a compressor
can be compared across every method on the same terms. (This is not torch's own
``fp16_compress_hook`` or ``powerSGD_hook``: their mathematics differ in detail, e.g. the fp16
hook divides after the half cast and the PowerSGD hook starts after 1000 dense steps.)

DDP calls the hook on the autograd thread as each bucket becomes ready, in bucket order on every
rank, and waits for the hook's future at the end of backward. The hook only queues the bucket;
one exchange thread per strategy runs the compressor on the queued buckets one after the other
and completes their futures, so backward computation goes on while a bucket is encoded and
exchanged, and every collective of the compressor (PowerSGD's second all-reduce included) is
issued from that one thread in bucket order, the same on every rank. DDP itself issues no
collective on the group during backward (its buffer broadcasts and bucket rebuild run in
forward, after the queue has drained), so sharing the group is safe.
"""
from __future__ import annotations

import queue
import threading

import torch
from torch.nn.parallel import DistributedDataParallel

from . import register
from .base import Strategy, given_compressor

DDP_DEFAULT_BUCKET_MB = 25.0


@register
class DDP(Strategy):
    name = "ddp"
    display = "DDP"
    # --verify asks for the buckets after the step: DDP decides them inside backward (it
    # rebuilds them in the order gradients arrived, after its first step).
    groups_after_step = True

    def __init__(self, model, optimizer, comm, settings):
        super().__init__(model, optimizer, comm, settings)
        self.bucket_cap_mb = float(settings.get("bucket_cap_mb") or DDP_DEFAULT_BUCKET_MB)
        device = next(model.parameters()).device
        self.ddp = DistributedDataParallel(
            model,
            device_ids=[device] if device.type == "cuda" else None,
            bucket_cap_mb=self.bucket_cap_mb,
            process_group=comm.group,
        )
        self.compressor = given_compressor(settings)
        self._step_groups: list[list[int]] = []
        self._last_groups: list[list[int]] = []
        if self.compressor is not None:
            self._index = {id(p): i for i, p in enumerate(self.params)}
            self._queue: queue.Queue = queue.Queue()
            self._thread = threading.Thread(target=self._exchange_loop, daemon=True,
                                            name="ddlbench-ddp-compressor")
            self._thread.start()
            self.ddp.register_comm_hook(None, self._hook)
        # Without a compressor DDP all-reduces every gradient once per step; counted from the
        # model, since its buckets are internal. Ring wire bytes as in Comm.
        nbytes = sum(p.numel() * p.element_size() for p in self.params)
        self._per_step = nbytes
        self._wire = int(round(nbytes * 2 * (comm.size - 1) / comm.size))

    @property
    def module(self):
        return self.ddp

    # -- the comm hook (compressor only) ----------------------------------------------------------
    def _hook(self, _state, bucket):  # (DDP rejects a return annotation given as a string)
        params = bucket.parameters()
        members = tuple(self._index[id(p)] for p in params)
        if bucket.index() == 0:
            self._step_groups = []  # the first bucket of a new backward
        self._step_groups.append(list(members))
        fut: torch.futures.Future = torch.futures.Future()
        self._queue.put((members, bucket.buffer(), [p.shape for p in params], fut))
        return fut

    def _exchange_loop(self) -> None:
        if self.params and self.params[0].is_cuda:  # a new thread starts on device 0
            torch.cuda.set_device(self.params[0].device)
        while True:
            item = self._queue.get()
            if item is None:
                return
            members, flat, shapes, fut = item
            try:
                self.compressor.reduce_async(members, flat, self.comm, shapes).wait()
            except BaseException as e:  # DDP's wait at the end of backward raises it
                fut.set_exception(e)
            else:
                fut.set_result(flat)

    # -- the step -----------------------------------------------------------------------------------
    def step(self) -> None:
        self.optimizer.step()
        if self.compressor is None:
            self.comm.payload["allreduce"] += self._per_step
            self.comm.wire_sent["allreduce"] += self._wire
        else:
            self._last_groups = self._step_groups

    def groups(self) -> list[list[int]]:
        """The buckets the last step exchanged (parameter indices, in bucket packing order):
        DDP plans them itself and re-plans after its first step."""
        return [list(g) for g in self._last_groups]

    def describe(self) -> dict:
        d = super().describe()
        d.update({"bucket_cap_mb": self.bucket_cap_mb})
        if self.compressor is None:
            d["bytes_counted_from"] = "model"
        else:
            d.update({"comm_hook": "ddlbench compressor", "buckets": len(self._last_groups),
                      **self.compressor.describe()})
        return d

    def close(self) -> None:
        if self.compressor is not None and self._thread.is_alive():
            self._queue.put(None)
            self._thread.join()
        super().close()

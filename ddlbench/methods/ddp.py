"""torch DistributedDataParallel: the baseline a user would otherwise pick.

DDP owns its buckets (``bucket_cap_mb``, default 25 MiB as in torch, and at that default torch's
first bucket of 1 MiB), overlaps their all-reduce with the backward pass and averages the
gradients itself; ``step()`` only applies the optimizer. ``bucket_cap_mb`` 0 is one bucket per
gradient tensor (as fusion's threshold 0): DDP gets a cap of one byte, first bucket included.

With ``--compressor`` other than none, DDP keeps its buckets, their order and its overlap, and a
comm hook (``register_comm_hook``) hands each bucket to the suite's compressor instead of DDP's
dense all-reduce: DDP's scheduling with this suite's compression mathematics, so a compressor
can be compared across every method on the same terms. (This is not torch's own
``fp16_compress_hook``, ``bf16_compress_hook`` or ``powerSGD_hook``: their mathematics differ in
detail, e.g. the fp16 and bf16 hooks divide after the 16-bit cast and the PowerSGD hook starts
after 1000 dense steps.)

Without a compressor DDP's C++ reducer all-reduces the buckets, out of the suite's sight: its
communication is not on the timeline. With ``--timeline PATH`` (a trace file) a comm hook does
what DDP's default does, average then all-reduce each bucket asynchronously on DDP's group
(torch's ``allreduce_hook`` is the same), but through the suite's ``Comm``, so every bucket's
all-reduce is a span of the trace and of the overlap metrics; DDP still owns the buckets, their
order and the overlap with backward. DDP's wait for the all-reduces at the end of backward
(from its last bucket's hook to the last all-reduce's completion) is a wait span inside the
backward span, not compute.

DDP calls the hook on the autograd thread as each bucket becomes ready, in bucket order on every
rank, and waits for the hook's future at the end of backward. The hook only queues the bucket;
one exchange thread per method (started by ``start()``) runs the compressor on the queued
buckets one after the other and completes their futures, so backward computation goes on while a
bucket is encoded and exchanged, and every collective of the compressor (PowerSGD's second all-
reduce included) is issued from that one thread in bucket order, the same on every rank. DDP
itself issues no collective on the group during backward (its buffer broadcasts and bucket
rebuild run in forward, after the queue has drained), so sharing the group is safe.
"""
from __future__ import annotations

import inspect
import weakref
from dataclasses import dataclass

from .. import timeline
from ..options import NONNEG, Options, option
from ..planning import DDP_DEFAULT_BUCKET_MB
from ..timeline import tensors_label
from . import rules
from .base import AFTER_STEP, BucketPlan, Method
from .threads import QueueWorker


def _weak_hook(bound):
    """A comm hook that calls ``bound`` (a method of the DDP strategy) through a weak reference.

    DDP's reducer holds its hook in C++, where Python's garbage collector cannot see it: a hook
    holding the strategy, which holds the DDP wrapper, which holds the reducer, is a cycle never
    collected. The wrapper, its reducer and the process group the reducer holds would then live
    until the interpreter's own teardown, where a Gloo group's destructor can end the process
    with SIGABRT ("terminate called without an active exception") after a run that succeeded."""
    ref = weakref.WeakMethod(bound)

    def hook(state, bucket):
        return ref()(state, bucket)
    return hook



@dataclass(frozen=True)
class DDPOptions(Options):
    bucket_cap_mb: float = option(DDP_DEFAULT_BUCKET_MB, NONNEG,
                                  "DDP bucket size in MiB (the default: torch's, first bucket "
                                  "1 MiB; 0: one bucket per gradient tensor)")


# bucket_cap_mb 0: a cap of one byte. A DDP bucket closes once it holds at least its cap
# (torch's _compute_bucket_assignment_by_size, and the reducer's rebuild after the first step),
# so every tensor closes its own bucket.
PER_TENSOR_CAP_BYTES = 1


def _build_ddp(model, cap_mb: float, device, group):
    """torch's DDP of ``model`` at the suite's ``bucket_cap_mb`` (0: one bucket per tensor),
    and the first bucket's cap it was built with, in bytes."""
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel
    # At the default cap DDP gets torch's defaults, as `DistributedDataParallel(model)`
    # builds it: in torch 2.14 a cap given explicitly also caps the first bucket, which
    # torch's default keeps at 1 MiB (planning.ddp_buckets, the simulator's rule)
    # (older torch, e.g. the Horovod lane's 2.0.1, takes no None: its default is 25 and its
    # first bucket always dist._DEFAULT_FIRST_BUCKET_BYTES, read as DDP is built)
    torch_default = inspect.signature(DistributedDataParallel.__init__).parameters[
        "bucket_cap_mb"].default
    per_tensor = cap_mb == 0
    if per_tensor:
        cap = PER_TENSOR_CAP_BYTES / (1024 * 1024)
    else:
        default = cap_mb == DDP_DEFAULT_BUCKET_MB and torch_default is None
        cap = None if default else cap_mb
    saved = dist._DEFAULT_FIRST_BUCKET_BYTES
    if per_tensor and torch_default is not None:  # older torch: its first bucket too
        dist._DEFAULT_FIRST_BUCKET_BYTES = PER_TENSOR_CAP_BYTES
    try:
        ddp = DistributedDataParallel(model, bucket_cap_mb=cap, process_group=group,
                                      device_ids=[device] if device.type == "cuda" else None)
        config = getattr(ddp, "_bucket_config", None)   # older torch: the global
        first = int(getattr(config, "first_bucket_bytes_cap", dist._DEFAULT_FIRST_BUCKET_BYTES))
    finally:
        dist._DEFAULT_FIRST_BUCKET_BYTES = saved
    return ddp, first


class DDP(Method):
    id = "ddp"
    display = "DDP"
    summary = "torch `DistributedDataParallel` with its own buckets"
    Options = DDPOptions
    rule = rules.Rule(grouping=rules.ddp, reducer=True, advise=rules.bucket_cap_grid)
    baseline = True
    # DDP decides its buckets inside backward (it rebuilds them in the order gradients
    # arrived, after its first step): --verify asks for them after the step.
    plan_known = AFTER_STEP

    @classmethod
    def accepts(cls, compressor: str) -> str | None:
        return None

    def __init__(self, model, optimizer, comm, options=None, compressor=None, model_name=None):
        super().__init__(model, optimizer, comm, options, compressor, model_name)
        self.bucket_cap_mb = float(self.options.bucket_cap_mb)
        device = next(model.parameters()).device
        self.ddp, self.first_bucket_bytes = _build_ddp(model, self.bucket_cap_mb, device,
                                                       comm.group)
        self._step_groups: list[list[int]] = []
        self._last_groups: list[list[int]] = []
        self._exchange = None
        if self.given_compressor() is not None:
            self._index = {id(p): i for i, p in enumerate(self.params)}
            self._exchange = QueueWorker("ddlbench-ddp-compressor", self._exchange_one,
                                         device=self.params[0].device if self.params else None)
            self.ddp.register_comm_hook(None, _weak_hook(self._hook))
        elif comm.timeline.trace_file:
            self._index = {id(p): i for i, p in enumerate(self.params)}
            self.ddp.register_comm_hook(None, _weak_hook(self._observed_hook))
        self._observed = comm.timeline.trace_file and self._exchange is None
        # Without a compressor DDP all-reduces every gradient once per step: counted from the
        # model, since its buckets are internal.
        self._numel = sum(p.numel() for p in self.params)

    def start(self) -> None:
        if self._exchange is not None:
            self._exchange.start()

    @property
    def module(self):
        return self.ddp

    # -- the comm hook (compressor only) ----------------------------------------------------------
    def _members(self, bucket) -> tuple:
        """The bucket's parameters (indices), noted as this step's next group."""
        members = tuple(self._index[id(p)] for p in bucket.parameters())
        if bucket.index() == 0:
            self._step_groups = []  # the first bucket of a new backward
        self._step_groups.append(list(members))
        return members

    def _hook(self, _state, bucket):  # (DDP rejects a return annotation given as a string)
        import torch
        params = bucket.parameters()
        members = self._members(bucket)
        fut = torch.futures.Future()
        self._exchange.put((members, bucket.buffer(), [p.shape for p in params], fut))
        return fut

    def _observed_hook(self, _state, bucket):
        """DDP's default reduction (average, then all-reduce the bucket) through ``Comm``, so
        that the timeline sees each bucket's all-reduce (--timeline PATH only)."""
        members = self._members(bucket)
        flat = bucket.buffer()
        flat.div_(self.comm.size)
        with self.comm.about(lambda: tensors_label([self.param_names[i] for i in members])):
            work = self.comm.allreduce(flat, async_op=True)
        fut = work.get_future()
        tl = self.comm.timeline
        if bucket.is_last() and tl.enabled:
            # The last bucket is ready: autograd's work is done and DDP now waits, inside
            # backward, for the all-reduces (the last one issued ends last). A wait span on the
            # training thread, so the metrics do not count it as backward compute.
            t0 = timeline.now_us()
            fut.add_done_callback(lambda _f: tl.events.append(
                ("all-reduces", timeline.WAIT, timeline.MAIN, t0, timeline.now_us(), None)))
        return fut.then(lambda _fut: flat)

    def _exchange_one(self, item) -> None:
        members, flat, shapes, fut = item
        try:
            self.compressor.reduce_async(members, flat, self.comm, shapes).wait()
        except BaseException as e:  # DDP's wait at the end of backward raises it
            fut.set_exception(e)
        else:
            fut.set_result(flat)

    # -- the step ----------------------------------------------------------------------------
    def step(self) -> None:
        self.optimizer.step()
        if self._observed:   # counted by Comm, bucket by bucket
            self._last_groups = self._step_groups
        elif self._exchange is None:
            dtype = self.params[0].dtype if self.params else None
            self.comm.count("allreduce", self._numel, dtype, calls=0)
        else:
            self._last_groups = self._step_groups

    def plan(self) -> BucketPlan:
        """The buckets the last step exchanged (whole parameters, in bucket packing order):
        DDP plans them itself and re-plans after its first step."""
        return BucketPlan.of_params(self._last_groups, self.params, AFTER_STEP)

    def describe(self) -> dict:
        d = super().describe()
        d.update({"bucket_cap_mb": self.bucket_cap_mb,
                  "first_bucket_bytes": self.first_bucket_bytes})
        if self._observed:
            d.update({"comm_hook": "ddlbench all-reduce (--timeline)",
                      "buckets": len(self._last_groups)})
        elif self._exchange is None:
            d["bytes_counted_from"] = "model"
        else:
            d.update({"comm_hook": "ddlbench compressor", "buckets": len(self._last_groups),
                      **self.compressor.describe()})
        return d

    def close(self) -> None:
        if self._exchange is not None:
            self._exchange.stop()
        super().close()

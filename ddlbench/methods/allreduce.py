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

The gradients of a bucket of several tensors live in its flat buffer: each ``.grad`` is a view
into it, set when the buckets are planned and kept across steps (the method's ``zero_grad()``
zeroes the buffers in place), as DDP's ``gradient_as_bucket_view=True``; autograd accumulates
into them in place, so a bucket is reduced where the gradients are, with no packing or
unpacking. The re-plan after the first step (and MG-WFBP's, after its calibration) moves the
gradients into the new buffers with one fused copy per bucket.

The gradient hooks do not issue collectives: a hook counts its gradient and hands each bucket
that is complete, in bucket order, to the method's communication thread (``threads.Issuer``,
Horovod's background loop), which encodes and issues it; ``step()`` waits until the thread has
issued what it was handed, then issues the buckets no hook completed (all of BSP's) itself.
"""
from __future__ import annotations

from dataclasses import dataclass

from ..options import NONNEG, Options, option
from ..planning import HOROVOD_DEFAULT_THRESHOLD, plan_buckets
from ..timeline import tensors_label
from . import rules, threads
from .base import BucketPlan, Method



def threshold_option(default: float, help: str):
    """The fusion threshold in bytes, an option of every method that fuses by one."""
    return option(default, NONNEG, help, must="must be >= 0 bytes")


@dataclass(frozen=True)
class FusionOptions(Options):
    threshold: float = threshold_option(
        float(HOROVOD_DEFAULT_THRESHOLD),
        "fusion threshold in bytes (Horovod semantics: 0 = one message per tensor)")


def zero_all(tensors: list) -> None:
    """``t.zero_()`` for every tensor, in one fused call."""
    import torch
    if len(tensors) == 1:
        tensors[0].zero_()
    elif tensors:
        torch._foreach_zero_(tensors)


class Bucket:
    """Gradients reduced together as one flat tensor.

    A bucket of several tensors owns a flat buffer, and each of its parameters' ``.grad`` is a
    view into it (``views``), set once and kept across steps, as DDP's
    ``gradient_as_bucket_view=True`` does: autograd accumulates into an existing dense ``.grad``
    in place, so the buffer already holds the gradients when the bucket is complete and the
    reduced result lands in them; nothing is packed or unpacked. A lone tensor has no buffer:
    its own gradient is reduced in place."""

    def __init__(self, params: list, members: list[int]):
        import torch
        self.members = members
        self.params = [params[i] for i in members]
        self.sizes = [p.numel() for p in self.params]
        self.numel = sum(self.sizes)
        self.nbytes = sum(p.numel() * p.element_size() for p in self.params)
        first = self.params[0]
        self.buffer = None
        self.views = None
        if len(members) > 1:
            self.buffer = torch.empty(self.numel, dtype=first.dtype, device=first.device)
            self.views = [flat.view(p.shape)
                          for flat, p in zip(self.buffer.split(self.sizes), self.params)]
        self.reduced = None  # a lone bucket's gradient tensor, while it is being reduced
        self.label = None    # its tensors' names on the timeline (set once, by the method)
        self.ready = 0
        self.pending = None
        self.flat = None

    def adopt(self) -> None:
        """Make every gradient of a buffered bucket its view, keeping its value (a missing
        gradient: zeros): one fused copy of those that are not views (set to None by someone
        else, or a re-plan's new buffer), one fused zero of the missing ones; nothing when
        every gradient already is its view."""
        if self.views is None:
            return
        dsts, srcs, zeros = [], [], []
        for p, v in zip(self.params, self.views):
            g = p.grad
            if g is v:
                continue
            if g is None:
                zeros.append(v)
            else:
                dsts.append(v)
                srcs.append(g)
        from ..compat import copy_all  # torch: imported when a run starts
        copy_all(dsts, srcs)
        zero_all(zeros)
        if dsts or zeros:
            for p, v in zip(self.params, self.views):
                p.grad = v

    def pack(self):
        """The bucket's gradients as one flat tensor (a missing gradient counts as zeros): the
        buffer, or a lone contiguous gradient itself (a non-contiguous one: a flat copy)."""
        import torch
        if self.views is not None:
            self.adopt()
            return self.buffer
        p = self.params[0]
        if p.grad is None:  # unused in this forward: contributes zeros
            p.grad = torch.zeros_like(p)
        g = self.reduced = p.grad
        return g.view(-1) if g.is_contiguous() else g.reshape(-1).clone()

    def unpack(self, flat) -> None:
        """Copy ``flat`` back into a lone non-contiguous gradient; otherwise the result already
        is the gradient."""
        if self.views is None:
            g = self.reduced
            self.reduced = None
            if flat.data_ptr() != g.data_ptr():
                g.copy_(flat.view(g.shape))

    def settle(self) -> int | None:
        """After its collectives are done: the result in place (``unpack``), the bucket ready
        for the next step; the parameter whose gradient was replaced after the bucket was
        packed, if any (``replaced``)."""
        replaced = self.replaced()
        self.unpack(self.flat)
        self.pending = None
        self.flat = None
        self.ready = 0
        return replaced

    def replaced(self) -> int | None:
        """The first member (parameter index) whose ``.grad`` is no longer the tensor this
        bucket reduces into (its view, or the lone gradient it packed), else None."""
        if self.views is not None:
            for i, p, v in zip(self.members, self.params, self.views):
                if p.grad is not v:
                    return i
        elif self.reduced is not None and self.params[0].grad is not self.reduced:
            return self.members[0]
        return None


class GradViews:
    """What keeps the gradients of buffered buckets views into their buffers (``Bucket``), for
    a method with ``buckets``, ``model``, ``params``, ``param_names``, ``optimizer`` and
    ``_finish(bucket)`` (wait for one bucket, then ``Bucket.settle``):

    - ``zero_grad()`` zeroes each buffer in place (one fused zero for all buffers) and keeps
      the views; a lone tensor's gradient is set to None, as ``optimizer.zero_grad()`` would;
    - a forward pre-hook on the model gives a gradient that someone set to None (an
      ``optimizer.zero_grad(set_to_none=True)`` outside the method) its view back, zeroed,
      before backward; one replaced by another tensor makes the next ``step()`` refuse, with
      one line, as does one replaced after its bucket was reduced;
    - a re-plan (``_adopt_views``) moves the gradients into the new buffers with one fused copy
      per bucket.

    Call ``_watch_grads()`` once, after ``self.buckets`` exists; ``_adopt_views()`` after every
    (re-)plan."""

    _calibrating = False  # a method that measures with the model's hooks off (MG-WFBP)

    def _watch_grads(self) -> None:
        self._foreign: int | None = None
        ids = {id(p) for p in self.params}
        self._unbucketed = [p for g in self.optimizer.param_groups for p in g["params"]
                            if id(p) not in ids]
        self._handles.append(self.model.register_forward_pre_hook(self._before_forward))

    def _adopt_views(self) -> None:
        """The buffered buckets' gradients made views (after a plan), and the list the
        forward pre-hook walks."""
        self._viewed = []
        self._buffers = []
        self._lone = []
        for b in self.buckets:
            if b.views is None:
                self._lone.append(b.params[0])
                continue
            b.adopt()
            self._buffers.append(b.buffer)
            self._viewed.extend(zip(b.members, b.params, b.views))

    def _before_forward(self, _module, _args) -> None:
        if self._calibrating:
            return
        missing = []
        for i, p, v in self._viewed:
            g = p.grad
            if g is v:
                continue
            if g is None:
                p.grad = v
                missing.append(v)
            elif self._foreign is None:
                self._foreign = i
        zero_all(missing)

    def zero_grad(self) -> None:
        zero_all(self._buffers)
        for p in self._lone:
            p.grad = None
        for p in self._unbucketed:
            p.grad = None

    def _finish_all(self) -> int | None:
        """``_finish`` every bucket, in order; the first parameter whose gradient was replaced
        after its bucket was started, if any."""
        replaced = None
        for b in self.buckets:
            r = self._finish(b)
            replaced = r if replaced is None else replaced
        return replaced

    def _settle_in_flight(self) -> None:
        """Wait for the buckets in flight, start no other (the step is refused)."""
        for b in self.buckets:
            if b.pending is not None:
                self._finish(b)
            b.ready = 0

    def _refuse_replaced(self, i: int, when: str) -> None:
        from ..errors import UsageError
        self._foreign = None
        raise UsageError(
            f"method {self.id or type(self).__name__}: the gradient of {self.param_names[i]} "
            f"was replaced by another tensor {when}; this method reduces gradients in place "
            f"(each a view into its bucket's buffer): write into p.grad, or set it to None")


class BucketedAllReduce(threads.HandsOver, GradViews, Method):
    """Buckets started strictly in bucket order from gradient hooks, each reduced through the
    compressor; subclasses choose the threshold (and whether to overlap). Gradients of a
    bucket of several tensors are views into its buffer (``GradViews``)."""

    overlap = True  # start buckets from hooks during backward
    rebuild = True  # re-plan from rank 0's gradient order after the first step
    # the model packs the buckets this class's fusion_threshold gives, as the method does
    rule = rules.Rule(grouping=rules.fused)

    def __init_subclass__(cls, **kwargs):
        """Refuses the instance method ``_threshold`` a subclass once overrode (neither the
        method nor the model would read it now): one line naming ``fusion_threshold``."""
        super().__init_subclass__(**kwargs)
        if "_threshold" in cls.__dict__:
            raise TypeError(f"{cls.__name__} overrides _threshold(self), which is gone: override "
                            f"the classmethod fusion_threshold(cls, options, nbytes) instead "
                            f"(the method and the performance model both read it)")

    @classmethod
    def accepts(cls, compressor: str) -> str | None:
        return None

    @classmethod
    def fusion_threshold(cls, options, nbytes: list[int]) -> float:
        """The bytes a bucket holds at most (``planning.plan_buckets``: 0 one bucket per
        tensor, inf one for all), from the method's ``options`` and its gradients' bytes
        (``nbytes``, any order). The method plans with it and the model's rule
        (``rules.fused``) calls it, so a subclass overriding it is replayed as it runs.
        Torch-free."""
        return 0.0

    def __init__(self, model, optimizer, comm, options=None, compressor=None, model_name=None):
        super().__init__(model, optimizer, comm, options, compressor, model_name)
        self.threshold = float(self.fusion_threshold(
            self.options, [p.numel() * p.element_size() for p in self.params]))
        self._plan(list(reversed(range(len(self.params)))))
        self._watch_grads()
        self._seen: list[int] = []
        self._steps = 0
        self._issuer = None
        if self.overlap:
            device = self.params[0].device if self.params else None
            self._issuer = threads.Issuer(f"{self.id or 'allreduce'}-issue", self._launch,
                                          describe=self._bucket_name, device=device)
            self._register_ready_hooks(self._on_ready)

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
        self._adopt_views()

    # -- hooks and launching -----------------------------------------------------------------
    def _on_ready(self, i: int) -> None:
        if self._steps == 0:
            self._seen.append(i)
        self.bucket_of[i].ready += 1
        self._launch_in_order(self._issuer.hand if self._issuer is not None else self._launch)

    def _launch_in_order(self, launch=None) -> None:
        """Launch (``launch``: hand over) every complete bucket from the next one on, in bucket
        order, up to the first incomplete one."""
        launch = launch or self._launch
        while self._next < len(self.buckets):
            b = self.buckets[self._next]
            if b.ready < len(b.members):
                return
            launch(b)
            self._next += 1

    def _bucket_name(self, b: Bucket) -> str:
        k = self.buckets.index(b) if b in self.buckets else "?"
        return f"bucket {k} ({self._label(b)})"

    def _label(self, b: Bucket) -> str:
        if b.label is None:
            b.label = tensors_label([self.param_names[i] for i in b.members])
        return b.label

    def _issued(self) -> None:
        """Wait until the communication thread has issued every bucket it was handed: the
        training thread issues nothing before (every rank must issue in bucket order)."""
        if self._issuer is not None:
            self._issuer.drain()

    def _launch(self, b: Bucket) -> None:
        b.flat = b.pack()
        with self.comm.about(b.label or self._label(b)):
            b.pending = self.compressor.reduce_async(tuple(b.members), b.flat, self.comm,
                                                     shapes=[p.shape for p in b.params])

    def _finish(self, b: Bucket) -> int | None:
        """Wait for the bucket and put its result in place; the parameter whose gradient was
        replaced after the bucket was packed, if any."""
        b.pending.wait()
        return b.settle()

    def _drain(self) -> None:
        """Wait for every bucket in flight, launch no other: the step is refused."""
        self._issued()
        self._settle_in_flight()
        self._next = 0
        if self._steps == 0:
            self._seen = []  # the order is observed again in the next step

    # -- the step ----------------------------------------------------------------------------
    def _reduce_all(self) -> None:
        """The step's communication: refuse a gradient replaced before backward; wait until the
        thread has issued what the hooks handed over, issue the buckets no hook completed, in
        bucket order, and finish every bucket; refuse one replaced after it was started."""
        if self._foreign is not None:
            self._drain()
            self._refuse_replaced(self._foreign, "before backward")
        self._issued()
        for b in self.buckets[self._next:]:
            b.ready = len(b.members)
        self._launch_in_order()
        replaced = self._finish_all()
        self._next = 0
        if replaced is not None:
            self._refuse_replaced(replaced, "after its bucket was started")

    def step(self) -> None:
        self._reduce_all()
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
    rule = rules.Rule(grouping=rules.per_tensor)
    hatch = "oo"


class Fusion(BucketedAllReduce):
    id = "fusion"
    display = "Fusion-A2A"
    summary = ("gradients packed in backward order into buckets of at most `--threshold` "
               "bytes (Horovod's tensor fusion; 0 = WFBP)")
    Options = FusionOptions
    rule = rules.Rule(grouping=rules.fused, advise=rules.threshold_grid)

    @classmethod
    def fusion_threshold(cls, options, nbytes: list[int]) -> float:
        return float(options.threshold)


class BSPA2A(BucketedAllReduce):
    id = "bspa2a"
    display = "BSP-A2A"
    summary = "waits for the whole backward, then one all-reduce of every gradient"
    overlap = False
    rule = rules.Rule(grouping=rules.one_message, after_backward=True)
    hatch = ".."

    @classmethod
    def fusion_threshold(cls, options, nbytes: list[int]) -> float:
        return float("inf")

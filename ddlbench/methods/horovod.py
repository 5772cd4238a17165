"""The methods of the real-Horovod lane (``--engine horovod``), on Horovod's own machinery.

- ``wfbp``: ``hvd.DistributedOptimizer``, fusion threshold 0 and cycle time 0: each gradient is
  all-reduced alone from Horovod's own gradient hook;
- ``fusion``: the same with ``HOROVOD_FUSION_THRESHOLD`` = ``--threshold`` (64 MiB unless
  given), Horovod's tensor fusion at its cycle time;
- ``mgwfbp``: MG-WFBP's groups (planned exactly as on the torch engine, ``MGWFBPPlanning``)
  handed to ``hvd.DistributedOptimizer(groups=...)``, Horovod's grouped all-reduce, with group
  fusion across groups off;
- ``bspa2a``: after the backward pass, one ``hvd.allreduce_`` of all gradients flattened.

``--compressor fp16`` is ``hvd.Compression.fp16`` (cast before, back after). Horovod averages
(``op=Average``). Each class says which HOROVOD_* settings it needs (``horovod_settings``);
``ddlbench.runtime.horovod`` applies them before ``hvd.init()``. Each implements the torch
engine's method of the same id, with its options. Nothing here may use torch APIs newer than
2.0 (Horovod's environment).

The ``Comm`` gets the gradients each step hands to Horovod (payload bytes and tensor count, in
the compressed dtype); how Horovod fuses them is its own business and is not counted.
"""
from __future__ import annotations

import os

from ..errors import UsageError
from .allreduce import BSPA2A, WFBP, Fusion
from .base import BucketPlan, LaneMethod
from .mgwfbp import MGWFBP, MGWFBPPlanning

COMPRESSORS = ("none", "fp16")
# MG-WFBP's groups must each go as one fused message: Horovod splits a group that does not fit
# its fusion buffer, so the buffer is made larger than any group can be. On the CPU the
# untouched part of the buffer is only address space.
MGWFBP_FUSION_BYTES = 1 << 30
# Every method alone, as soon as it is ready: no fusion, no cycle to wait for.
UNFUSED = {"HOROVOD_FUSION_THRESHOLD": "0", "HOROVOD_CYCLE_TIME": "0"}


def _hvd():
    import horovod.torch as hvd
    return hvd


def check(args, methods: list[str], compressors: list[str], under_launcher: bool) -> None:
    """The input checks of an --engine horovod run, each a clear line."""
    if len(methods) > 1:
        raise UsageError("--engine horovod runs one method per job: Horovod reads its fusion "
                         "threshold and cycle time once, at hvd.init()")
    for c in compressors:
        if c not in COMPRESSORS:
            raise UsageError(f"--engine horovod takes --compressor none or fp16 (Horovod's own "
                             f"compression), not {c!r}")
    if args.nservers:
        raise UsageError("--engine horovod has no parameter servers (--nservers); the PS "
                         "methods run on --engine torch")
    if not under_launcher and (args.nworkers or 1) > 1:
        raise UsageError("--engine horovod starts under mpirun or horovodrun, not the local "
                         "spawner: nworkers=N engine=horovod ./horovod/horovod_mpi_cj.sh "
                         "(or horovodrun --gloo -np N python -m ddlbench.train ...)")


class _HorovodMethod(LaneMethod):
    """A method of the torch engine (``implements``) on Horovod's machinery: same id, options
    and meaning; ``horovod_settings`` are the HOROVOD_* variables it needs at ``hvd.init()``."""

    engine = "horovod"

    @classmethod
    def accepts(cls, compressor: str) -> str | None:
        return None if compressor in COMPRESSORS else "Horovod's own compression is fp16 only"

    @classmethod
    def horovod_settings(cls, options) -> dict[str, str]:
        return dict(UNFUSED)

    def __init__(self, model, optimizer, comm, options=None, compressor=None, model_name=None):
        import torch
        super().__init__(model, optimizer, comm, options, compressor, model_name)
        self.hvd = _hvd()
        fp16 = self.compressor.id == "fp16"
        self.compression = self.hvd.Compression.fp16 if fp16 else self.hvd.Compression.none
        self.wire_dtype = torch.float16 if fp16 else None

    def _account(self, tensors) -> None:
        for t in tensors:
            if t is not None:
                self.comm.count("allreduce", t.numel(), self.wire_dtype or t.dtype)

    def plan(self) -> BucketPlan:
        """What one compressed message holds, for --verify's reference: fp16 is elementwise,
        so each tensor is its own group."""
        return BucketPlan.of_params([[i] for i in range(len(self.params))], self.params)

    def describe(self) -> dict:
        import horovod
        import torch

        from ..runtime.horovod import recorded_settings
        d = super().describe()
        d["engine"] = "horovod"
        d["horovod"] = {"version": horovod.__version__, "torch": torch.__version__,
                        "controller": "mpi" if self.hvd.mpi_enabled() else "gloo",
                        "settings": recorded_settings(),
                        "compression": self.compressor.id}
        return d


class _DistributedOptimizerMethod(_HorovodMethod):
    """hvd.DistributedOptimizer around the given optimizer (built at once, or after
    calibration when the groups come from it)."""

    implements = WFBP
    plans_groups = False

    def __init__(self, model, optimizer, comm, options=None, compressor=None, model_name=None):
        super().__init__(model, optimizer, comm, options, compressor, model_name)
        self.dopt = None
        if not self.plans_groups:
            self._wrap(None)

    def _wrap(self, groups) -> None:
        self.dopt = self.hvd.DistributedOptimizer(
            self.optimizer, named_parameters=list(self.model.named_parameters()),
            compression=self.compression, op=self.hvd.Average, groups=groups)

    def step(self) -> None:
        self._account([p.grad for p in self.params])
        self.dopt.step()

    def zero_grad(self) -> None:
        self.dopt.zero_grad()

    def close(self) -> None:
        super().close()
        if self.dopt is not None:
            self.dopt._handles.clear()  # nothing outstanding after step(); drop references


class HorovodWFBP(_DistributedOptimizerMethod):
    implements = WFBP
    display = "WFBP (Horovod)"


class HorovodFusion(_DistributedOptimizerMethod):
    implements = Fusion
    display = "Horovod tensor fusion"

    @classmethod
    def horovod_settings(cls, options) -> dict[str, str]:
        # Horovod's tensor fusion at its own cycle time (or the user's).
        return {"HOROVOD_FUSION_THRESHOLD": str(int(options.threshold))}

    def describe(self) -> dict:
        d = super().describe()
        d["threshold_bytes"] = int(os.environ.get("HOROVOD_FUSION_THRESHOLD", "0"))
        return d


class HorovodMGWFBP(MGWFBPPlanning, _DistributedOptimizerMethod):
    implements = MGWFBP
    display = "MG-WFBP (Horovod grouped all-reduce)"
    plans_groups = True

    @classmethod
    def horovod_settings(cls, options) -> dict[str, str]:
        # The planned groups, each fused, never fused with each other.
        return {"HOROVOD_FUSION_THRESHOLD": str(MGWFBP_FUSION_BYTES), "HOROVOD_CYCLE_TIME": "0",
                "HOROVOD_DISABLE_GROUP_FUSION": "1"}

    def __init__(self, model, optimizer, comm, options=None, compressor=None, model_name=None):
        super().__init__(model, optimizer, comm, options, compressor, model_name)
        self._init_planning()

    def calibrate(self, forward_backward) -> None:
        groups = self._plan_groups(forward_backward)  # no Horovod hooks yet: nothing is sent
        biggest = max((sum(self.params[i].numel() * self.params[i].element_size() for i in g)
                       for g in groups), default=0)
        if biggest > MGWFBP_FUSION_BYTES:
            raise UsageError(f"an MG-WFBP group of {biggest} bytes exceeds Horovod's fusion "
                             f"buffer ({MGWFBP_FUSION_BYTES} bytes); Horovod would split it")
        self._wrap([[self.params[i] for i in g] for g in groups])

    def describe(self) -> dict:
        d = super().describe()
        d["mgwfbp"] = self.plan_info
        return d


class HorovodBSP(_HorovodMethod):
    implements = BSPA2A
    display = "BSP-A2A (one Horovod all-reduce)"

    def step(self) -> None:
        import torch
        grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in self.params]
        flat = torch.cat([g.reshape(-1) for g in grads])
        self._account([flat])
        wire, ctx = self.compression.compress(flat)
        self.hvd.allreduce_(wire, op=self.hvd.Average, name="ddlbench.bspa2a")
        flat = self.compression.decompress(wire, ctx)
        offset = 0
        for p in self.params:
            n = p.numel()
            if p.grad is None:
                p.grad = flat[offset:offset + n].view_as(p).clone()
            else:
                p.grad.copy_(flat[offset:offset + n].view_as(p))
            offset += n
        self.optimizer.step()

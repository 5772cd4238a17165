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
(``op=Average``). The HOROVOD_* settings are applied by ``ddlbench.horovod_engine`` before
``hvd.init()``. Nothing here may use torch APIs newer than 2.0 (Horovod's environment).

The ``Comm`` gets the gradients each step hands to Horovod (payload bytes and tensor count, in
the compressed dtype); how Horovod fuses them is its own business and is not counted.
"""
from __future__ import annotations

import os

import torch

from ..errors import UsageError
from ..horovod_engine import no_mapping, recorded_settings
from .base import Strategy
from .mgwfbp import MGWFBPPlanning


def _hvd():
    import horovod.torch as hvd
    return hvd


class _HorovodStrategy(Strategy):
    engine = "horovod"

    def __init__(self, model, optimizer, comm, settings):
        super().__init__(model, optimizer, comm, settings)
        self.hvd = _hvd()
        compressor = settings.get("compressor") or "none"
        self.compressor_name = compressor
        self.compression = (self.hvd.Compression.fp16 if compressor == "fp16"
                            else self.hvd.Compression.none)
        self.wire_dtype = torch.float16 if compressor == "fp16" else None

    def _account(self, tensors) -> None:
        p = self.comm.size
        for t in tensors:
            if t is not None:
                self.comm.count("allreduce", t.numel(), self.wire_dtype or t.dtype,
                                2 * (p - 1) / p)

    def groups(self) -> list[list[int]]:
        """What one compressed message holds, for --verify's reference: fp16 is elementwise,
        so each tensor is its own group."""
        return [[i] for i in range(len(self.params))]

    def describe(self) -> dict:
        d = super().describe()
        d["engine"] = "horovod"
        import horovod
        d["horovod"] = {"version": horovod.__version__, "torch": torch.__version__,
                        "controller": "mpi" if self.hvd.mpi_enabled() else "gloo",
                        "settings": recorded_settings(),
                        "compression": self.compressor_name}
        return d


class _DistributedOptimizerStrategy(_HorovodStrategy):
    """hvd.DistributedOptimizer around the given optimizer (built at once, or after
    calibration when the groups come from it)."""

    plans_groups = False

    def __init__(self, model, optimizer, comm, settings):
        super().__init__(model, optimizer, comm, settings)
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


class HorovodWFBP(_DistributedOptimizerStrategy):
    name = "wfbp"
    display = "WFBP (Horovod)"


class HorovodFusion(_DistributedOptimizerStrategy):
    name = "fusion"
    display = "Horovod tensor fusion"

    def describe(self) -> dict:
        d = super().describe()
        d["threshold_bytes"] = int(os.environ.get("HOROVOD_FUSION_THRESHOLD", "0"))
        return d


class HorovodMGWFBP(MGWFBPPlanning, _DistributedOptimizerStrategy):
    name = "mgwfbp"
    display = "MG-WFBP (Horovod grouped all-reduce)"
    plans_groups = True

    def __init__(self, model, optimizer, comm, settings):
        self._init_planning(settings)
        super().__init__(model, optimizer, comm, settings)

    def calibrate(self, forward_backward) -> None:
        from ..horovod_engine import MGWFBP_FUSION_BYTES
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


class HorovodBSP(_HorovodStrategy):
    name = "bspa2a"
    display = "BSP-A2A (one Horovod all-reduce)"

    def step(self) -> None:
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


METHODS = {cls.name: cls for cls in (HorovodWFBP, HorovodFusion, HorovodMGWFBP, HorovodBSP)}


def lookup(name: str):
    if name not in METHODS:
        raise no_mapping(name)
    return METHODS[name]

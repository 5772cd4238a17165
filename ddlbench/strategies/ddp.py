"""torch DistributedDataParallel: the baseline a user would otherwise pick.

DDP owns its buckets (``bucket_cap_mb``, default 25 MiB as in torch), overlaps their all-reduce
with the backward pass and averages the gradients itself; ``step()`` only applies the optimizer.
"""
from __future__ import annotations

from torch.nn.parallel import DistributedDataParallel

from . import register
from .base import Strategy

DDP_DEFAULT_BUCKET_MB = 25.0


@register
class DDP(Strategy):
    name = "ddp"
    display = "DDP"

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
        # DDP all-reduces every gradient once per step; counted from the model, since its
        # buckets are internal. Ring wire bytes as in Comm.
        nbytes = sum(p.numel() * p.element_size() for p in self.params)
        self._per_step = nbytes
        self._wire = int(round(nbytes * 2 * (comm.size - 1) / comm.size))

    @property
    def module(self):
        return self.ddp

    def step(self) -> None:
        self.optimizer.step()
        self.comm.payload["allreduce"] += self._per_step
        self.comm.wire_sent["allreduce"] += self._wire

    def describe(self) -> dict:
        d = super().describe()
        d.update({"bucket_cap_mb": self.bucket_cap_mb, "bytes_counted_from": "model"})
        return d

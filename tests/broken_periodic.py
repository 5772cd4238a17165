"""Deliberately wrong periodic-averaging methods: ``--verify`` (the simulation of
``ddlbench.methods.periodic_reference``) must catch each of them."""
from ddlbench.methods.periodic import DDPLocalSGD, DiLoCo, LocalSGD
from ddlbench.methods.torchft import TorchftDiLoCo


class LocalSGDSums(LocalSGD):
    """Sums the replicas' parameters at each sync but forgets to divide by the workers."""
    id = "test-localsgd-sums"

    def _sync(self):
        import torch
        with torch.no_grad():
            for p in self.params:
                self.comm.allreduce(p.detach(), async_op=False)


class DiLoCoPlainOuter(DiLoCo):
    """Steps the global parameters by plain SGD on the averaged pseudo-gradient: the outer
    Nesterov momentum forgotten."""
    id = "test-diloco-plain-outer"

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        import torch
        self.outer = torch.optim.SGD(self.global_params, lr=float(self.options.outer_lr))


class DDPLocalSGDTorchWarmup(DDPLocalSGD):
    """torch's averager with ``warmup_steps`` equal to the hook's ``start_localSGD_iter`` (0),
    as torch's example pairs them: it averages after steps 1, H + 1, ..., one step before
    ``localsgd``'s schedule."""
    id = "test-ddp-localsgd-warmup-0"

    @classmethod
    def averager_warmup(cls, period: int) -> int:
        return 0


class TorchftPlainOuter(TorchftDiLoCo):
    """torchft's DiLoCo (the lane's method, run as a ``module:Class`` on the torch engine) with
    a plain SGD outer optimizer: the outer Nesterov momentum forgotten."""

    def outer_optimizer(self):
        import torch
        return torch.optim.SGD(self.params, lr=float(self.options.outer_lr))

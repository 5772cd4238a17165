"""Deliberately wrong periodic-averaging methods: ``--verify`` (the simulation of
``ddlbench.methods.periodic_reference``) must catch each of them."""
from ddlbench.methods.periodic import DiLoCo, LocalSGD


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

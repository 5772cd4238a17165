"""``--verify``: prove a method right against plain synchronous SGD on the averaged gradient.

The reference shares no code with any method's communication path. A tensor hook on every
parameter copies the rank's *local* gradient as autograd produces it, before any method's hook
can touch it; after the method's step the copies of all ranks are gathered, averaged in float64
and given to the same optimizer class acting on copies of the parameters. Each rank then
compares its own parameters with the reference.

The reference parameters and optimizer keep the model's own precision (fp32): the optimizer's
arithmetic is then the same as the method's, step for step, and any difference comes from how
the gradient was averaged. (A float64 optimizer would differ from the fp32 one by itself, most
visibly with Adam plus weight decay, where ``g + wd * p`` cancels and the step is normalised.)

A parameter passes when ``|p - ref| <= atol + rtol * |ref|`` elementwise: fp32 reordering of
sums gives errors of a few ulps, while a gradient that was not averaged, averaged twice, or
applied late is off by orders of magnitude more.
"""
from __future__ import annotations

import torch
import torch.distributed as dist

DEFAULT_RTOL = 1e-5
DEFAULT_ATOL = 1e-7
# Adam normalises every element's step to about lr, so a rounding difference in a near-zero
# averaged gradient (fp32 sums of P values in another order) can move that element's step by a
# visible fraction of lr - measured up to 1% of lr with 4 workers - but never by more than about
# lr, while a communication bug (a gradient left local, stale or missing) moves it by about lr.
ADAM_ATOL_FRACTION_OF_LR = 0.05


def default_tolerance(optimizer: str, lr: float) -> tuple[float, float]:
    """(rtol, atol) for ``--verify`` when not given on the command line."""
    if optimizer == "adam":
        return DEFAULT_RTOL, ADAM_ATOL_FRACTION_OF_LR * lr
    return DEFAULT_RTOL, DEFAULT_ATOL


class Reference:
    def __init__(self, model, make_optimizer, ctx, rtol=DEFAULT_RTOL, atol=DEFAULT_ATOL):
        self.ctx = ctx
        self.rtol, self.atol = rtol, atol
        self.params = [p for p in model.parameters() if p.requires_grad]
        self.ref = [p.detach().clone() for p in self.params]
        self.opt = make_optimizer(self.ref)
        self.local: list[torch.Tensor | None] = [None] * len(self.params)
        self._handles = [p.register_hook(self._capture_hook(i))
                         for i, p in enumerate(self.params)]

    def _capture_hook(self, i):
        def capture(grad):
            self.local[i] = grad.detach().to(torch.float64, copy=True)
            return None  # leave the gradient as it is
        return capture

    def step(self) -> None:
        """Average every rank's captured gradient in float64 and update the reference."""
        flat = torch.cat([(g if g is not None else torch.zeros_like(r, dtype=torch.float64))
                          .reshape(-1)
                          for g, r in zip(self.local, self.ref)])
        device = flat.device if self.ctx.backend == "nccl" else torch.device("cpu")
        flat = flat.to(device)
        gathered = [torch.empty_like(flat) for _ in range(self.ctx.size)]
        dist.all_gather(gathered, flat)
        average = torch.stack(gathered).sum(0) / self.ctx.size
        offset = 0
        for r in self.ref:
            n = r.numel()
            r.grad = average[offset:offset + n].view_as(r).to(device=r.device, dtype=r.dtype)
            offset += n
        self.opt.step()
        self.local = [None] * len(self.params)

    def compare(self) -> tuple[float, float]:
        """(max |p - ref|, worst |p - ref| / (atol + rtol |ref|)) over every rank."""
        max_abs, worst = 0.0, 0.0
        with torch.no_grad():
            for p, r in zip(self.params, self.ref):
                r64 = r.to(torch.float64)
                diff = (p.detach().to(torch.float64) - r64).abs()
                max_abs = max(max_abs, float(diff.max()))
                worst = max(worst, float((diff / (self.atol + self.rtol * r64.abs())).max()))
        t = torch.tensor([max_abs, worst], dtype=torch.float64,
                         device=self.ctx.device if self.ctx.backend == "nccl" else "cpu")
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        return float(t[0]), float(t[1])

    def close(self) -> None:
        for h in self._handles:
            h.remove()

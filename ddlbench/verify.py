"""``--verify``: prove a method right against plain synchronous SGD on the averaged gradient.

The reference shares no code with any method's communication path. A tensor hook on every
parameter copies the rank's *local* gradient as autograd produces it, before any method's hook
can touch it; after the method's step the copies of all ranks are gathered, averaged in float64
and given to the same optimizer class acting on float64 copies of the parameters. Each rank then
compares its own parameters with the reference.

A parameter passes when ``|p - ref| <= atol + rtol * |ref|`` elementwise: fp32 reordering of
sums gives errors of a few ulps, while a gradient that was not averaged, averaged twice, or
applied late is off by orders of magnitude more.
"""
from __future__ import annotations

import torch
import torch.distributed as dist

DEFAULT_RTOL = 1e-5
DEFAULT_ATOL = 1e-7


class Reference:
    def __init__(self, model, make_optimizer, ctx, rtol=DEFAULT_RTOL, atol=DEFAULT_ATOL):
        self.ctx = ctx
        self.rtol, self.atol = rtol, atol
        self.params = [p for p in model.parameters() if p.requires_grad]
        self.ref = [p.detach().to(torch.float64).clone() for p in self.params]
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
        flat = torch.cat([(g if g is not None else torch.zeros_like(r)).reshape(-1)
                          for g, r in zip(self.local, self.ref)])
        device = flat.device if self.ctx.backend == "nccl" else torch.device("cpu")
        flat = flat.to(device)
        gathered = [torch.empty_like(flat) for _ in range(self.ctx.size)]
        dist.all_gather(gathered, flat)
        average = torch.stack(gathered).sum(0) / self.ctx.size
        offset = 0
        for r in self.ref:
            n = r.numel()
            r.grad = average[offset:offset + n].view_as(r).to(r.device)
            offset += n
        self.opt.step()
        self.local = [None] * len(self.params)

    def compare(self) -> tuple[float, float]:
        """(max |p - ref|, worst |p - ref| / (atol + rtol |ref|)) over every rank."""
        max_abs, worst = 0.0, 0.0
        with torch.no_grad():
            for p, r in zip(self.params, self.ref):
                diff = (p.detach().to(torch.float64) - r).abs()
                max_abs = max(max_abs, float(diff.max()))
                worst = max(worst, float((diff / (self.atol + self.rtol * r.abs())).max()))
        t = torch.tensor([max_abs, worst], dtype=torch.float64,
                         device=self.ctx.device if self.ctx.backend == "nccl" else "cpu")
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        return float(t[0]), float(t[1])

    def close(self) -> None:
        for h in self._handles:
            h.remove()

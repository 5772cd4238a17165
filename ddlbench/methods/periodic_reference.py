"""The mathematics of periodic averaging, for ``--verify``: P replicas simulated in one
process from every worker's captured local gradients. Nothing here is shared with the methods
(``ddlbench/methods/periodic.py``; this module imports none of it): a second, plainer writing,
so that a bug in the methods' packing, averaging, period or outer step shows up as a difference
(``ddlbench.verify.Replicas`` drives it).

Constructed as ``Class(workers, params, make_optimizer, **the method's resolved options)``:
``params`` the model's trainable parameters at the start (every replica starts from them),
``make_optimizer(tensors)`` the run's optimizer class and settings on other tensors (P copies
are made, one per replica). ``step(per_rank)`` takes one training step: ``per_rank[r][i]`` is
worker r's local gradient of parameter i (float64 holding the worker's values, or None when it
had none: the optimizer then skips it, as the worker's did); every replica's optimizer steps
on its own gradient, and after every ``period``-th step the replicas are synced; it returns
whether they were (then every replica is equal). ``replicas[r]``: replica r's parameters.

- ``LocalSGDMath``: the sync replaces every replica's parameters by their mean (a float64 sum
  over the replicas divided by P); optimizer state stays per replica.
- ``DiLoCoMath``: the global parameters (the replicas' at the last sync) and a float64
  momentum buffer; the sync takes the pseudo-gradient, the float64 mean over replicas of
  global minus replica, and applies Nesterov momentum written out (not torch's SGD):
  ``buf = delta`` at the first sync, then ``buf = mu buf + delta``; ``global -= lr (delta + mu
  buf)`` (``lr delta`` with mu = 0); every replica restarts from the new global parameters.

Precision and tolerance. The replicas and their optimizers keep the model's dtype (fp32), as
the single-process reference of ``ddlbench.verify`` does, and for the same reason; everything
the replicas are synced by (the mean, the pseudo-gradient, the outer step) is float64, rounded
once to the model's dtype. The simulation is driven by the gradients the workers computed, so
the inner steps are the workers' own arithmetic on the same inputs: bit-identical until the
first sync, and afterwards the same recurrences started from parameters that differ by the
sync's rounding. The workers average in fp32 (a ring's P-1 additions, each within 2^-24 of a
partial sum, then a division), DiLoCo's outer step runs in fp32 as well: a sync leaves each
parameter within a few 2^-24 of its magnitude (the replicas lie within H small steps of each
other, so the partial sums are of the parameter's size), and later steps carry that forward
without growing it (the inner steps do not multiply the difference: SGD's and Adam's buffers
do not depend on the parameters, except through weight decay's small factor). The verifier's
rtol of 1e-5 (168 x 2^-24) and atol of 1e-7 (parameters near zero) hold this with a margin
for the tests' runs: over 8 steps at most 0.03 of the tolerance on BERT-Tiny (SGD with momentum
0.9 and AdamW, 4 workers, H = 3) and 0.28 on ResNet-18 (3 workers, H = 2, DiLoCo; localsgd
0.13), where a conv weight that shrank from about 0.05 to 1e-3 keeps a sync's rounding of its
former size (2e-8) against the tolerance of its present one; it grows by about 0.03 a sync, so
verify tens of steps, not hundreds. A method that forgets to divide by P, syncs at the wrong
step, keeps a replica out or steps the outer optimizer without its momentum is off by a step's
size (1e-4 to 1e-1 of the parameters).

Why not a float64 optimizer: the first writing ran the P optimizers in float64. The fp32
method then rounds every step's parameter and buffer where the simulation does not, and these
roundings, of the size of the parameter's history (2e-8 on a conv1 weight of ResNet-18 that
had crossed zero from 0.1 to 4e-4), are judged against the tolerance of its present value: 0.53
of it after 5 steps and growing by 0.1 a step (ResNet-18, 3 workers, H = 2), a verifier that
would fail a correct method after about 10 steps.

Nothing here imports torch at module level: the methods' registry imports this package's
modules to find the methods.
"""
from __future__ import annotations


class LocalSGDMath:
    """P replicas, each its own optimizer on its own gradient; every ``period`` steps their
    parameters replaced by the float64 mean."""

    def __init__(self, workers: int, params, make_optimizer, period: int = 4, **_options):
        self.world = workers
        self.period = int(period)
        self.replicas = [[p.detach().clone() for p in params] for _ in range(workers)]
        self.optimizers = [make_optimizer(r) for r in self.replicas]
        self.steps = 0

    def step(self, per_rank) -> bool:
        """One local step of every replica on its own gradients; the sync after every
        ``period``-th. Whether the replicas were synced (are equal) now."""
        for replica, optimizer, grads in zip(self.replicas, self.optimizers, per_rank):
            for p, g in zip(replica, grads):
                p.grad = None if g is None else g.to(p.device, p.dtype).view_as(p).clone()
            optimizer.step()
        self.steps += 1
        if self.steps % self.period:
            return False
        self.sync()
        return True

    def mean(self, of) -> list:
        """Per parameter, the float64 mean over the replicas of ``of(r, i)`` (float64)."""
        import torch
        n = len(self.replicas[0])
        out = []
        for i in range(n):
            total = of(0, i).to(torch.float64, copy=True)
            for r in range(1, self.world):
                total += of(r, i)
            out.append(total / self.world)
        return out

    def sync(self) -> None:
        mean = self.mean(lambda r, i: self.replicas[r][i])
        for replica in self.replicas:
            for p, m in zip(replica, mean):
                p.copy_(m)


class DiLoCoMath(LocalSGDMath):
    """LocalSGD's inner steps; at each sync Nesterov momentum on the mean pseudo-gradient
    (global minus replica) moves the global parameters, where every replica restarts."""

    def __init__(self, workers: int, params, make_optimizer, period: int = 4,
                 outer_lr: float = 0.7, outer_momentum: float = 0.9, **_options):
        super().__init__(workers, params, make_optimizer, period)
        self.outer_lr, self.mu = float(outer_lr), float(outer_momentum)
        self.globals = [p.clone() for p in self.replicas[0]]   # the model's dtype
        self.buffers = None

    def sync(self) -> None:
        import torch
        f64 = torch.float64
        delta = self.mean(lambda r, i: self.globals[i].to(f64) - self.replicas[r][i].to(f64))
        if self.buffers is None:
            self.buffers = [d.clone() for d in delta]
        else:
            self.buffers = [self.mu * b + d for b, d in zip(self.buffers, delta)]
        for g, d, b in zip(self.globals, delta, self.buffers):
            g.copy_(g.to(f64) - self.outer_lr * (d + self.mu * b if self.mu else d))
        for replica in self.replicas:
            for p, g in zip(replica, self.globals):
                p.copy_(g)

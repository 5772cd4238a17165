"""DiLoCo at one worker writes its pseudo-gradient straight into the outer gradients (no flat
buffer: no ``cat``, no copy but the parameters' restart from the global ones), and steps the
outer optimizer as its mathematics, written here, says.

One process, a one-rank Gloo group on a HashStore (as tests/test_grad_views.py). What the
method does on more than one worker is ``--verify``'s (tests/test_periodic.py)."""
import collections

import pytest
import torch
import torch.distributed as dist
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode

from ddlbench.methods import create
from ddlbench.runtime.comm import Comm


@pytest.fixture(scope="module", autouse=True)
def one_rank_group():
    if not dist.is_initialized():
        dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    yield


class _Ops(TorchDispatchMode):
    """The ATen operators dispatched while active, counted by name (the profiler's
    record-function markers left out: they are no tensor work)."""

    def __init__(self):
        super().__init__()
        self.counts = collections.Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = str(func)
        if not name.startswith("profiler."):
            self.counts[name] += 1
        return func(*args, **(kwargs or {}))


class _Net(nn.Module):
    """Linear layers and a LayerNorm: tensors of several sizes."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.a, self.norm, self.b, self.c = (nn.Linear(6, 16), nn.LayerNorm(16),
                                             nn.Linear(16, 16), nn.Linear(16, 3))

    def forward(self, x):
        return self.c(torch.tanh(self.b(self.norm(torch.tanh(self.a(x))))))


def _batch(step: int):
    return torch.randn(5, 6, generator=torch.Generator().manual_seed(100 + step))


def _loss(model, x):
    return model(x).pow(2).mean()


def _optimizer(model):
    return torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)


def _bare_step(model, opt, step):
    _loss(model, _batch(step)).backward()
    opt.step()
    opt.zero_grad(set_to_none=True)


def _method_step(model, method, step):
    _loss(method.module, _batch(step)).backward()
    method.step()
    method.zero_grad()


def test_diloco_at_one_worker_steps_the_outer_optimizer_without_a_flat_buffer():
    """Two periods of H = 2 against the same mathematics written here: inner SGD steps, then
    the outer Nesterov SGD on global minus local, every parameter restarting from it; the
    sync step makes no ``cat`` and copies only the parameters back."""
    period, outer_lr, outer_momentum = 2, 0.7, 0.9
    ref = _Net()
    inner = _optimizer(ref)
    glob = [p.detach().clone() for p in ref.parameters()]
    outer = torch.optim.SGD(glob, lr=outer_lr, momentum=outer_momentum, nesterov=True)
    for s in range(2 * period):
        _bare_step(ref, inner, s)
        if (s + 1) % period == 0:
            with torch.no_grad():
                for g, p in zip(glob, ref.parameters()):
                    g.grad = g - p
                outer.step()
                for g, p in zip(glob, ref.parameters()):
                    p.copy_(g)

    model = _Net()
    values = {"period": period, "outer_lr": outer_lr, "outer_momentum": outer_momentum}
    comm = Comm(0, 1)
    with create("diloco", model, _optimizer(model), comm, values) as method:
        _method_step(model, method, 0)
        with _Ops() as ops:
            _method_step(model, method, 1)       # the first sync
        for s in range(2, 2 * period):
            _method_step(model, method, s)
        assert method.syncs == 2
    tensors = len(list(model.parameters()))
    assert [k for k in ops.counts if k.startswith("aten.cat")] == []
    assert ops.counts["aten.sub.out"] == tensors
    assert ops.counts["aten.copy_.default"] + tensors * ops.counts[
        "aten._foreach_copy_.default"] == tensors, ops.counts
    assert sum(comm.calls.values()) == 0
    for p, q in zip(model.parameters(), ref.parameters()):
        assert torch.equal(p, q)

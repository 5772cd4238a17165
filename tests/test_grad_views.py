"""Gradients as views into their bucket's flat buffer (issue 44, item 1): set once, kept across
steps, re-plans and ``zero_grad()``, so a step packs and unpacks nothing.

One process, a one-rank Gloo group on a HashStore (as tests/test_buckets.py): the methods run
their whole machinery, and the collectives of one worker change nothing. Correctness over
several workers is ``--verify``'s (tests/test_verify.py)."""
import pytest
import torch
import torch.distributed as dist
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode

from ddlbench.runtime.comm import Comm, backend_averages
from ddlbench.errors import UsageError
from ddlbench.methods import create


@pytest.fixture(scope="module", autouse=True)
def one_rank_group():
    if not dist.is_initialized():
        dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    yield


def _mlp(layers: int, seed: int = 0):
    """``layers`` linear layers: 2 * layers tensors."""
    torch.manual_seed(seed)
    mods = []
    for k in range(layers):
        mods += [nn.Linear(6 + k, 7 + k), nn.Tanh()]
    return nn.Sequential(*mods[:-1])


def _batch(layers: int, step: int = 0):
    g = torch.Generator().manual_seed(100 + step)
    return torch.randn(5, 6, generator=g)


def _loss(model, x):
    return model(x).pow(2).mean()


def _method(name, model, momentum=0.9, **values):
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=momentum)
    return create(name, model, opt, Comm(0, 1), values)


def _assert_views(method):
    """Every gradient of a bucket with a buffer is a view into that buffer, at its offset."""
    buffered = [b for b in method.buckets if b.buffer is not None]
    assert buffered, "no bucket with a buffer"
    for b in buffered:
        start = b.buffer.data_ptr()
        offset = 0
        for p, n in zip(b.params, b.sizes):
            g = p.grad
            assert g is not None
            assert g._base is b.buffer
            assert g.untyped_storage().data_ptr() == b.buffer.untyped_storage().data_ptr()
            assert g.data_ptr() == start + offset * g.element_size()
            assert g.shape == p.shape
            offset += n


def _plain_sgd(layers, steps, momentum=0.9):
    """The parameters after ``steps`` of plain SGD (one worker) and the last step's grads."""
    ref = _mlp(layers)
    opt = torch.optim.SGD(ref.parameters(), lr=0.1, momentum=momentum)
    grads = None
    for s in range(steps):
        _loss(ref, _batch(layers, s)).backward()
        grads = [p.grad.clone() for p in ref.parameters()]
        opt.step()
        opt.zero_grad(set_to_none=True)
    return [p.detach().clone() for p in ref.parameters()], grads


@pytest.mark.parametrize("name,values", [
    ("bspa2a", {}),
    ("fusion", {}),                    # one bucket of every tensor
    ("fusion", {"threshold": 300}),    # buckets of several tensors beside lone ones
])
def test_gradients_stay_views_across_steps_and_zero_grad(name, values):
    layers = 4
    model = _mlp(layers)
    s = _method(name, model, **values)
    buffers = [b.buffer for b in s.buckets]
    _assert_views(s)  # from the plan on (zeros until the first backward)
    for step in range(3):
        _loss(model, _batch(layers, step)).backward()
        _assert_views(s)            # autograd accumulated into the views
        s.step()
        _assert_views(s)
        s.zero_grad()
        _assert_views(s)
        for b in s.buckets:
            if b.buffer is not None:
                assert not b.buffer.any()   # zeroed in place
            else:
                assert b.params[0].grad is None  # a lone gradient: set to None, as before
    # an MLP's backward order is the planned one: the buffers were never replaced
    assert [b.buffer for b in s.buckets] == buffers
    expected, _ = _plain_sgd(layers, 3)
    for p, q in zip(model.parameters(), expected):
        assert torch.allclose(p, q, rtol=1e-6, atol=1e-7)
    s.close()


class _Reordered(nn.Module):
    """Registered b then a, run a then b: the gradients arrive in another order than the
    reversed registration the first step plans with, so fusion re-plans after it."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(1)
        self.b = nn.Linear(8, 3)
        self.c = nn.Linear(8, 8)
        self.a = nn.Linear(4, 8)

    def forward(self, x):
        return self.b(torch.tanh(self.c(torch.tanh(self.a(x)))))


def test_a_replan_moves_the_gradients_into_the_new_buffers_with_their_values():
    model = _Reordered()
    twin = _Reordered()
    s = _method("fusion", model, threshold=400)
    first_plan = [b.members for b in s.buckets]
    x = torch.randn(5, 4, generator=torch.Generator().manual_seed(3))
    _loss(model, x).backward()
    _loss(twin, x).backward()
    s.step()
    assert [b.members for b in s.buckets] != first_plan, "no re-plan happened"
    _assert_views(s)
    # the re-plan kept the step's (averaged) gradients, now in the new buffers
    for p, q in zip(model.parameters(), twin.parameters()):
        assert torch.equal(p.grad, q.grad)
    s.zero_grad()
    for step in range(2):
        _loss(model, x).backward()
        _assert_views(s)
        s.step()
        _assert_views(s)
        s.zero_grad()
    s.close()


def test_mgwfbp_replans_after_calibration_with_views():
    layers = 4
    model = _mlp(layers)
    s = _method("mgwfbp", model)
    assert all(b.buffer is None for b in s.buckets)  # one bucket per tensor until calibrated
    n = len(s.params)
    groups = [list(reversed(range(n)))[:3], list(reversed(range(n)))[3:]]
    # the plan calibration would broadcast, without profiling this machine
    s._plan_groups = lambda forward_backward: setattr(s, "_planned", groups) or groups
    s.calibrate(lambda: _loss(model, _batch(layers)).backward())
    assert [b.members for b in s.buckets] == groups
    _assert_views(s)
    s.optimizer.zero_grad(set_to_none=True)  # what the session does after calibrating
    for step in range(3):
        _loss(model, _batch(layers, step)).backward()
        _assert_views(s)
        s.step()
        s.zero_grad()
        _assert_views(s)
    expected, _ = _plain_sgd(layers, 3)
    for p, q in zip(model.parameters(), expected):
        assert torch.allclose(p, q, rtol=1e-6, atol=1e-7)
    s.close()


def test_set_to_none_elsewhere_gets_the_views_back_before_backward():
    layers = 3
    model = _mlp(layers)
    s = _method("fusion", model)
    for step in range(3):
        s.optimizer.zero_grad(set_to_none=True)  # the user's loop, not the method's
        assert all(p.grad is None for p in model.parameters())
        _loss(model, _batch(layers, step)).backward()
        _assert_views(s)
        s.step()
    expected, _ = _plain_sgd(layers, 3)
    for p, q in zip(model.parameters(), expected):
        assert torch.allclose(p, q, rtol=1e-6, atol=1e-7)
    s.close()


@pytest.mark.parametrize("name", ["bspa2a", "fusion"])
def test_a_gradient_replaced_before_backward_is_refused_in_one_line(name):
    layers = 3
    model = _mlp(layers)
    s = _method(name, model)
    _loss(model, _batch(layers)).backward()
    s.step()
    s.zero_grad()
    victim = list(model.parameters())[2]
    victim.grad = torch.zeros_like(victim)   # not the bucket's view
    _loss(model, _batch(layers, 1)).backward()
    with pytest.raises(UsageError) as e:
        s.step()
    line = str(e.value)
    assert "\n" not in line and "2.weight" in line and "replaced" in line, line
    # what the line says to do instead works: the method goes on
    victim.grad = None
    s.zero_grad()
    _loss(model, _batch(layers, 2)).backward()
    s.step()
    _assert_views(s)
    s.close()


def test_a_gradient_replaced_after_its_bucket_started_is_refused():
    layers = 3
    model = _mlp(layers)
    s = _method("fusion", model)  # hooks start the bucket during backward
    _loss(model, _batch(layers)).backward()
    victim = list(model.parameters())[0]
    victim.grad = victim.grad.clone()   # the average would land in the view, not here
    with pytest.raises(UsageError, match="0.weight.*after its bucket was started"):
        s.step()
    s.close()


class _CopyCounter(TorchDispatchMode):
    """Counts the copying operators dispatched while active."""
    COPIES = ("aten.copy_.default", "aten._foreach_copy_.default", "aten.cat.default",
              "aten.clone.default", "aten._to_copy.default")

    def __init__(self):
        super().__init__()
        self.counts = {}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = str(func)
        if name in self.COPIES:
            self.counts[name] = self.counts.get(name, 0) + 1
        return func(*args, **(kwargs or {}))


def _copies_in_a_step(name, layers, **values):
    model = _mlp(layers)
    s = _method(name, model, **values)
    for step in range(3):  # warm-up: the momentum buffers, the re-plan after the first step
        _loss(model, _batch(layers, step)).backward()
        s.step()
        s.zero_grad()
    with _CopyCounter() as counter:
        _loss(model, _batch(layers, 3)).backward()
        s.step()
        s.zero_grad()
    s.close()
    return counter.counts


@pytest.mark.parametrize("name,values", [("bspa2a", {}), ("fusion", {}), ("wfbp", {}),
                                         ("fusion", {"threshold": 300})])
def test_no_per_tensor_copy_in_a_step(name, values):
    """A step (backward, step, zero_grad) after warm-up copies nothing per tensor: the same
    number of copies (none) with N tensors as with 2N."""
    few = _copies_in_a_step(name, 3, **values)
    many = _copies_in_a_step(name, 6, **values)
    assert few == many, (few, many)
    assert sum(many.values()) == 0, many


def test_average_in_the_collective_where_the_backend_can():
    assert backend_averages("nccl")
    assert not backend_averages("mpi")
    # one worker divides nothing; a Comm that is not the group it reports is a stand-in
    assert Comm(0, 1).average_op() is None
    assert Comm(0, 3).average_op() is None


# ------------------------------------------------------------------------- two workers

def _two_worker(rank, world, store, out):
    from ddlbench import compat, errors
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=world)
    layers = 3
    results = {}
    for name, values in (("bspa2a", {}), ("fusion", {"threshold": 300}), ("wfbp", {})):
        model, twin = _mlp(layers), _mlp(layers)
        comm = Comm(rank, world, trace=True)
        reduced = []     # the memory each all-reduce ran on
        allreduce = comm.allreduce
        comm.allreduce = lambda t, *a, **k: (reduced.append(t.data_ptr()),
                                             allreduce(t, *a, **k))[1]
        s = create(name, model, torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9), comm,
                   values)
        twin_opt = torch.optim.SGD(twin.parameters(), lr=0.1, momentum=0.9)
        for step in range(3):
            xs = [_batch(layers, 10 * step + r) for r in range(world)]
            reduced.clear()
            _loss(model, xs[rank]).backward()
            s.step()
            views = all(p.grad is v for b in s.buckets if b.views is not None
                        for p, v in zip(b.params, b.views))
            # in place: each bucket's all-reduce ran on its buffer, or on a lone tensor's
            # gradient itself (wfbp: every bucket; no view to check there)
            in_place = sorted(reduced) == sorted(
                b.buffer.data_ptr() if b.buffer is not None else b.params[0].grad.data_ptr()
                for b in s.buckets)
            s.zero_grad()
            # one process, plain SGD on the average of the workers' gradients
            _loss(twin, torch.cat(xs)).backward()
            twin_opt.step()
            twin_opt.zero_grad()
        worst = max(float(((p - q).abs() / (1e-6 + 1e-5 * q.abs())).max())
                    for p, q in zip(model.parameters(), twin.parameters()))
        results[name] = {"worst": worst, "views": views, "in_place": in_place,
                         "lone": sum(b.buffer is None for b in s.buckets),
                         "averages": comm.average_op() is not None,
                         "ops": sorted({op for op, _, _ in comm.trace})}
        s.close()
    if rank == 0:
        torch.save(results, out)
    compat.destroy_process_group()
    errors.finish(0)


def test_two_workers_average_in_place_through_the_views(tmp_path):
    """Two Gloo workers on different data: every method's parameters are plain SGD's on the
    averaged gradient (the all-reduce averaging by itself where Gloo can, torch >= 2.8)."""
    import torch.multiprocessing as mp

    from ddlbench.compat import TORCH_VERSION
    out = tmp_path / "results.pt"
    mp.spawn(_two_worker, args=(2, str(tmp_path / "store"), str(out)), nprocs=2)
    results = torch.load(out)
    for name, r in results.items():
        assert r["worst"] <= 1.0, (name, r)
        assert r["views"] and r["in_place"], (name, r)
        # wfbp reduces every one of the 6 tensors alone, in its own gradient; the others have
        # a buffer for some
        assert (r["lone"] == 2 * 3) == (name == "wfbp"), (name, r)
        # bspa2a does not re-plan: no broadcast of rank 0's order
        assert r["ops"] == (["allreduce"] if name == "bspa2a" else ["allreduce", "broadcast"]), r
        assert r["averages"] == (TORCH_VERSION >= (2, 8)), r

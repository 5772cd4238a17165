"""The bucketed all-reduce methods' communication thread (issue 44 item 2, ``threads.Issuer``):
hooks hand complete buckets over in bucket order, the thread issues them in that order, the
step waits for it before issuing anything itself, and an error on the thread reaches the
training thread naming the bucket. Across ranks the order is tests/test_order.py's (hook
jitter, 3 workers); here one process, a one-rank Gloo group on a HashStore."""
import threading
import time

import pytest
import torch
import torch.distributed as dist
from torch import nn

from ddlbench.runtime.comm import Comm
from ddlbench.methods import create, threads


@pytest.fixture(scope="module", autouse=True)
def one_rank_group():
    if not dist.is_initialized():
        dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    yield


def test_items_are_issued_on_the_thread_in_the_order_handed_over():
    seen = []
    gate = threading.Event()

    def issue(item):
        gate.wait(5)  # the training thread hands everything over first
        seen.append((item, threading.current_thread().name))

    issuer = threads.Issuer("probe-issue", issue)
    issuer.start()
    try:
        for k in range(50):
            issuer.hand(k)
        assert len(seen) < 50  # hand returned before the thread issued everything
        gate.set()
        issuer.drain()
        assert seen == [(k, "probe-issue") for k in range(50)]
    finally:
        issuer.stop()
    assert not issuer.running


def test_without_start_an_item_is_issued_in_the_hand_over():
    seen = []
    issuer = threads.Issuer("probe-issue", lambda item: seen.append(
        (item, threading.current_thread().name)))
    issuer.hand("a")
    assert seen == [("a", threading.current_thread().name)]
    issuer.drain()  # nothing to wait for
    issuer.stop()


def test_an_error_on_the_thread_names_the_item_at_the_next_drain_and_hand():
    def issue(item):
        if item == 2:
            raise ValueError("no route to host")
        time.sleep(0.01)

    issuer = threads.Issuer("probe-issue", issue, describe=lambda k: f"bucket {k}")
    issuer.start()
    try:
        for k in range(4):
            issuer.hand(k)
        with pytest.raises(threads.IssueFailed, match=r"^probe-issue: could not issue bucket 2: "
                                                      r"ValueError: no route to host$"):
            issuer.drain()
        with pytest.raises(threads.IssueFailed, match="bucket 2"):
            issuer.hand(5)
    finally:
        issuer.stop()


def _mlp():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(6, 7), nn.Tanh(), nn.Linear(7, 8), nn.Tanh(), nn.Linear(8, 3))


def _step(method, model, seed=0):
    x = torch.randn(5, 6, generator=torch.Generator().manual_seed(seed))
    model(x).pow(2).mean().backward()
    method.step()
    method.zero_grad()


@pytest.mark.parametrize("name,values", [("wfbp", {}), ("fusion", {"threshold": 200})])
def test_the_hooks_buckets_are_issued_by_the_thread_in_bucket_order(name, values):
    """Every bucket a hook completes is issued on the method's thread, in bucket order; the
    parameters equal one worker's SGD. The thread's first issue waits until backward has
    handed every bucket over, so the order checked is the queue's too, not only the hooks'."""
    model = _mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    comm = Comm(0, 1)
    issued = []
    allreduce = comm.allreduce
    backward_done = threading.Event()

    def traced(tensor, *a, **k):
        backward_done.wait(30)
        issued.append((tensor.numel(), threading.current_thread().name))
        return allreduce(tensor, *a, **k)
    comm.allreduce = traced
    ref = _mlp()
    ref_opt = torch.optim.SGD(ref.parameters(), lr=0.1)
    with create(name, model, opt, comm, values) as method:
        for s in range(3):
            issued.clear()
            backward_done.clear()
            x = torch.randn(5, 6, generator=torch.Generator().manual_seed(s))
            model(x).pow(2).mean().backward()
            backward_done.set()
            order = [b.numel for b in method.buckets]   # the plan the step issued
            method.step()
            method.zero_grad()
            ref(x).pow(2).mean().backward()
            ref_opt.step()
            ref_opt.zero_grad()
            assert {t for _, t in issued} == {f"{name}-issue"}, issued
            if s > 0:  # the plan is stable after the first step's re-plan
                assert len(order) == len(set(order)) > 1, order   # sizes tell buckets apart
                assert [n for n, _ in issued] == order, (issued, order)
    for p, q in zip(model.parameters(), ref.parameters()):
        assert torch.allclose(p, q, rtol=0, atol=1e-7)


def test_bspa2a_issues_its_one_bucket_from_the_step():
    model = _mlp()
    comm = Comm(0, 1)
    names = []
    allreduce = comm.allreduce
    comm.allreduce = lambda t, *a, **k: (names.append(threading.current_thread().name),
                                         allreduce(t, *a, **k))[1]
    with create("bspa2a", model, torch.optim.SGD(model.parameters(), lr=0.1), comm) as method:
        assert method._issuer is None
        _step(method, model)
    assert names == [threading.current_thread().name]


def test_an_error_issuing_a_bucket_reaches_the_step_naming_the_bucket():
    model = _mlp()
    comm = Comm(0, 1)
    allreduce = comm.allreduce
    calls = []

    def failing(tensor, *a, **k):
        calls.append(tensor.numel())
        if len(calls) == 2:
            raise RuntimeError("Connection closed by peer")
        return allreduce(tensor, *a, **k)
    comm.allreduce = failing
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    method = create("wfbp", model, opt, comm)
    before = [p.detach().clone() for p in model.parameters()]
    with pytest.raises(threads.IssueFailed) as e:
        with method:
            _step(method, model)
    # wfbp: one bucket per tensor, the first planned in reverse registration order
    assert str(e.value) == ("wfbp-issue: could not issue bucket 1 (4.weight): RuntimeError: "
                            "Connection closed by peer")
    assert all(torch.equal(p, q) for p, q in zip(model.parameters(), before))  # no update
    assert not method._issuer.running

"""Methods are context managers: after a run, also one ended by an exception in the training
thread or in a method's own thread, no method thread, no hook the method put on the model and
no process group is left."""
import gc
import threading

import pytest
import torch.distributed as dist

from ddlbench import train
from ddlbench.hosts.placement import single
from ddlbench.measure import timing
from ddlbench.methods import base, threads

from .conftest import TINY_BERT

RUN = [*TINY_BERT, "--num-warmup-batches", "3", "--num-batches-per-iter", "1",
       "--num-iters", "1"]


class Injected(RuntimeError):
    pass


HOOK_DICTS = ("_forward_pre_hooks", "_forward_hooks", "_backward_pre_hooks", "_backward_hooks",
              "_state_dict_hooks", "_load_state_dict_pre_hooks")


def _hooks(model) -> dict:
    """Every hook on the model: each module's (by kind) and each parameter's, gradient-ready
    (``register_post_accumulate_grad_hook``, what ``compat.on_grad_ready`` uses on this torch)
    and gradient (``register_hook``) ones."""
    out = {}
    for name, m in model.named_modules():
        for kind in HOOK_DICTS:
            out[f"module {name or '(root)'} {kind}"] = len(getattr(m, kind, None) or {})
    for name, p in model.named_parameters():
        out[f"parameter {name} post-accumulate"] = len(p._post_accumulate_grad_hooks or {})
        out[f"parameter {name} backward"] = len(p._backward_hooks or {})
    return out


@pytest.fixture
def methods_made(monkeypatch):
    """Every method a test's run makes (its name), with its model and the hooks the model had
    when the method got it. (The model, not the method: holding the method would keep DDP's
    wrapper alive.)"""
    made = []
    real = base.Method.__init__

    def init(self, model, *args, **kwargs):
        made.append((type(self).__name__, model, _hooks(model)))
        real(self, model, *args, **kwargs)
    monkeypatch.setattr(base.Method, "__init__", init)
    return made


def assert_no_hook_left(made, expected: int = 1):
    """After close(), each method's model has the hooks it had before the method, and none of
    the kinds the methods use at all (--timeline's gradient-ready hooks, the run's, included:
    the run removes them at its end, ``session.Run.watch``)."""
    assert len(made) == expected, [name for name, *_ in made]
    for name, model, before in made:
        after = _hooks(model)
        added = {k: after[k] - before.get(k, 0) for k in after if after[k] != before.get(k, 0)}
        assert added == {}, f"{name} left hooks after close(): {added}"
        for p in model.parameters():
            assert not p._post_accumulate_grad_hooks, name
        for m in model.modules():
            assert not m._forward_pre_hooks, (name, type(m).__name__)


@pytest.fixture
def clean_world():
    if dist.is_initialized():  # another test's world of one
        dist.destroy_process_group()
    before = set(threading.enumerate())
    yield before
    if dist.is_initialized():
        dist.destroy_process_group()


def _fail_after(steps):
    """timing.run that trains ``steps`` batches, then fails as a crashing workload would."""
    def run(ctx, train_step, finish, **kw):
        for _ in range(steps):
            train_step()
        raise Injected("injected failure in the training loop")
    return run


@pytest.mark.parametrize("method,compressor", [
    ("bytescheduler", "none"),   # dispatcher and completer threads, updates left in flight
    ("bytescheduler", "topk"),
    ("ddp", "fp16"),             # DDP's exchange thread
    ("fusion", "eftopk"),
    ("wfbpps", "none"),          # BucketedPS: hooks, its issue thread, the PS transport
    ("byteschedulerps", "none"),  # and its credit thread
])
def test_an_exception_in_the_loop_leaves_no_thread_no_hook_and_no_group(clean_world, monkeypatch,
                                                                        methods_made, method,
                                                                        compressor, tmp_path):
    """With a trace file asked for, so that the run's own gradient-ready hooks are there to
    be removed too."""
    monkeypatch.setattr(timing, "run", _fail_after(3))
    args = train.parse_args([*RUN, "--method", method, "--compressor", compressor,
                             "--partition", "20000", "--timeline", str(tmp_path / "t.json")])
    with pytest.raises(Injected):
        train.worker(args, single())
    assert not dist.is_initialized()
    assert set(threading.enumerate()) == clean_world
    assert_no_hook_left(methods_made)


@pytest.mark.parametrize("compressor,traced", [("none", True), ("powersgd", False)])
def test_a_ddp_with_a_comm_hook_is_freed_before_its_group_is_destroyed(clean_world, tmp_path,
                                                                       methods_made,
                                                                       compressor, traced):
    """DDP's reducer holds its comm hook in C++, out of the garbage collector's sight: a hook
    holding the wrapper kept it, its reducer and its Gloo group alive until the interpreter's
    teardown, where a worker of a run that had succeeded died now and then with SIGABRT
    ("terminate called without an active exception")."""
    from torch.nn.parallel import DistributedDataParallel
    trace = ["--timeline", str(tmp_path / "ddp.trace.json")] if traced else []
    args = train.parse_args([*RUN, "--method", "ddp", "--compressor", compressor, *trace,
                             "--output", str(tmp_path / "ddp.json")])
    assert train.worker(args, single()) == 0
    assert not dist.is_initialized()
    assert [o for o in gc.get_objects() if isinstance(o, DistributedDataParallel)] == []
    assert set(threading.enumerate()) == clean_world
    assert_no_hook_left(methods_made)


def test_an_exception_in_a_method_thread_is_raised_and_leaves_nothing(clean_world,
                                                                      monkeypatch,
                                                                      methods_made):
    """A chunk's compressor failing on the ByteScheduler's dispatcher thread: the training
    thread gets the error, and the method still stops both its threads."""
    import compression
    calls = {"n": 0}
    real = compression.FP16.reduce_async

    def failing(self, *a, **kw):
        calls["n"] += 1
        if calls["n"] == 20:
            raise Injected("injected failure in the compressor")
        return real(self, *a, **kw)

    monkeypatch.setattr(compression.FP16, "reduce_async", failing)
    args = train.parse_args([*RUN, "--method", "bytescheduler", "--compressor", "fp16",
                             "--partition", "20000"])
    with pytest.raises(RuntimeError, match="communication thread failed: Injected"):
        train.worker(args, single())
    assert calls["n"] == 20
    assert not dist.is_initialized()
    assert set(threading.enumerate()) == clean_world
    assert_no_hook_left(methods_made)


def test_a_thread_that_does_not_stop_is_an_error_naming_it():
    release = threading.Event()
    worker = threads.QueueWorker("test-stuck-worker", lambda item: release.wait(30))
    worker.start()
    worker.put("item")
    with pytest.raises(threads.ThreadLeftRunning,
                       match="thread test-stuck-worker still running 0.2 s after it was asked "
                             "to stop"):
        worker.stop(timeout=0.2)
    release.set()
    worker.stop()
    assert not worker._thread.is_alive()

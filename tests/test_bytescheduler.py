"""ByteScheduler-A2A (docs/DESIGN.md section 5): the dispatch rule, per-layer updates and forward
waits in one process with a communication stub that the test completes by hand; then the real
method on 1-4 workers against the reference, under hook jitter, and its flags and launcher."""
import contextlib
import json
import threading
import time

import pytest
import torch
from torch import nn

from ddlbench import methods, train as train_mod
from ddlbench.methods.bytescheduler import ByteScheduler, CreditWindow, chunk_table

from . import traces
from .conftest import REPO, TINY_BERT, TINY_BERT_VOCAB, QUICK_TIMING, describe, run, train, \
    verify_lines

# Small settings so that tensors are really cut and the window really limits what is in flight.
PARTITION = 10000
CREDIT = 40000


# -- the dispatch rule -------------------------------------------------------------------------
def test_chunks_are_contiguous_slices_in_priority_order():
    table = chunk_table([120, 30, 750, 25, 100], 100)
    assert table == [(0, 0, 100), (0, 100, 120), (1, 0, 30),
                     *[(2, s, min(750, s + 100)) for s in range(0, 750, 100)],
                     (3, 0, 25), (4, 0, 100)]


def test_window_takes_the_front_layers_first_while_credit_is_positive():
    table = chunk_table([120, 30, 750, 25], 100)  # chunks 0-1: t0, 2: t1, 3-10: t2, 11: t3
    w = CreditWindow(table, credit=250)
    w.ready(3)
    assert w.take() == [11] and w.credit == 225
    w.ready(2)
    w.ready(0)
    # t0 overtakes t2 (ready before it); the chunk that drives credit to <= 0 still goes.
    assert w.take() == [0, 1, 3, 4] and w.credit == 225 - 100 - 20 - 100 - 100 == -95
    assert w.take() == []
    w.done(0)                      # credit 5 > 0: exactly one more chunk
    w.ready(1)
    assert w.take() == [2] and w.credit == 5 - 30
    w.done(11)
    w.done(1)                      # credit 20
    assert w.take() == [5] and w.credit == -80
    w.done(3)
    w.done(4)                      # credit 120: two would fit, the limit allows one
    assert w.take(limit=1) == [6] and w.credit == 20
    assert w.take() == [7] and w.credit == -80
    w.done(5)
    w.done(6)
    w.done(7)                      # 220: the rest of t2 (100, 100, 50) goes
    assert w.take() == [8, 9, 10] and w.credit == -30 and w.take() == []
    w.start_iteration()            # next iteration: same chunks again, credit carried over
    w.ready(1)
    assert w.take() == []          # still -30: the previous iteration's chunks fill it
    w.done(8)
    assert w.take() == [2] and w.credit == 40


# -- one process, hand-completed communication -------------------------------------------------
class _Held:
    def __init__(self):
        self.released = threading.Event()

    def wait(self):
        assert self.released.wait(30), "chunk never released"


class HandComm:
    """One rank (``size`` as given: the data is never exchanged); each all-reduce is held until
    the test releases it; ``average``: what ``average_op()`` answers (a real Comm: AVG where the
    backend averages)."""
    rank, group, trace = 0, None, None

    def __init__(self, size=1, average=None):
        self.size, self.average = size, average
        self.issued = []  # (tensor, handle), in start order
        self.ops = []     # each all-reduce's op
        self.lock = threading.Lock()

    @contextlib.contextmanager
    def about(self, label):   # (names the tensors on a real Comm's timeline)
        yield

    def average_op(self):
        return self.average

    def allreduce(self, tensor, async_op=True, op=None):
        h = _Held()
        with self.lock:
            self.issued.append((tensor, h))
            self.ops.append(op)
        return h

    def count(self):
        with self.lock:
            return len(self.issued)

    def wait_count(self, n, settle=0.3):
        deadline = time.time() + 20
        while self.count() < n:
            assert time.time() < deadline, f"only {self.count()} of {n} chunks started"
            time.sleep(0.01)
        time.sleep(settle)  # nothing more may start
        return self.count()


class _Gate(torch.autograd.Function):
    """Holds the backward pass at this point until ``event`` is set."""
    @staticmethod
    def forward(ctx, x, event):
        ctx.event = event
        return x.clone()

    @staticmethod
    def backward(ctx, g):
        assert ctx.event.wait(20)
        return g, None


class Net(nn.Module):
    # parameters in priority order: w0 (120), b0 (30), w1 (750), b1 (25)
    def __init__(self):
        super().__init__()
        self.fc0 = nn.Linear(4, 30)
        self.fc1 = nn.Linear(30, 25)
        self.gate = None

    def forward(self, x):
        h = self.fc0(x)
        if self.gate is not None:
            h = _Gate.apply(h, self.gate)
        return self.fc1(torch.relu(h))


def _setup(credit, partition=100, optimizer="sgd"):
    torch.manual_seed(0)
    net, twin = Net(), Net()
    twin.load_state_dict(net.state_dict())
    make = ((lambda ps: torch.optim.SGD(ps, lr=0.1, momentum=0.9)) if optimizer == "sgd"
            else (lambda ps: torch.optim.Adam(ps, lr=0.01)))
    comm = HandComm()
    s = ByteScheduler(net, make(net.parameters()), comm,
                      ByteScheduler.Options(partition=partition, credit=credit))
    s.start()
    return s, comm, net, twin, make(twin.parameters())


def _chunk_of(s, comm, k):
    """(tensor index, start) of the k-th started all-reduce."""
    t = comm.issued[k][0]
    for i, p in enumerate(s.params):
        if s._flat[i] is not None and t.untyped_storage().data_ptr() == \
                s._flat[i].untyped_storage().data_ptr():
            return i, (t.data_ptr() - s._flat[i].data_ptr()) // t.element_size()
    raise AssertionError("all-reduce of an unknown tensor")


def test_front_layers_overtake_queued_back_layers_one_chunk_in_flight():
    # credit of one element: each chunk fills the window, so chunks go one at a time.
    s, comm, net, *_ = _setup(credit=1)
    net.gate = threading.Event()
    x = torch.randn(8, 4)
    done = threading.Thread(target=lambda: net(x).sum().backward())
    done.start()
    # Only fc1's gradients exist while the backward is held at the gate: one of them starts.
    comm.wait_count(1)
    first = _chunk_of(s, comm, 0)
    assert first[0] in (2, 3), first
    net.gate.set()
    done.join(20)
    s.step()
    order = [first]
    for k in range(1, len(s.table)):
        comm.issued[k - 1][1].released.set()
        assert comm.wait_count(k + 1, settle=0.05) == k + 1  # never two in flight
        order.append(_chunk_of(s, comm, k))
    comm.issued[-1][1].released.set()
    s.synchronize()
    everything = [(i, start) for i, start, _ in s.table]
    # After the first, strictly by priority: fc0's chunks overtake fc1's, queued earlier.
    assert order[1:] == [c for c in everything if c != first]
    assert order[1] == (0, 0)
    s.close()


def test_credit_window_bounds_what_is_in_flight():
    s, comm, net, *_ = _setup(credit=250)
    net(torch.randn(8, 4)).sum().backward()
    s.step()
    sizes = {(i, start): end - start for i, start, end in s.table}
    released = 0
    while released < len(s.table):
        n = comm.wait_count(released + 1)
        in_flight = [sizes[_chunk_of(s, comm, k)] for k in range(released, n)]
        if n < len(s.table):  # more waiting: the window is full, by the last chunk taken
            assert sum(in_flight) >= 250 > sum(in_flight[:-1]), in_flight
        comm.issued[released][1].released.set()
        released += 1
    s.synchronize()
    assert n == len(s.table) == 12
    s.close()


def _until(predicate, what, timeout=10):
    deadline = time.time() + timeout
    while not predicate():
        assert time.time() < deadline, what
        time.sleep(0.01)


@pytest.mark.parametrize("optimizer", ["sgd", "adam"])
def test_each_tensor_is_updated_when_its_chunks_are_reduced(optimizer):
    s, comm, net, twin, twin_opt = _setup(credit=10**6, optimizer=optimizer)
    n = len(s.table)
    for it in range(2):
        x = torch.randn(8, 4)
        before = [p.detach().clone() for p in net.parameters()]
        net(x).sum().backward()
        twin(x).sum().backward()
        twin_opt.step()
        twin_opt.zero_grad()
        s.step()  # returns with every chunk still held
        s.zero_grad()
        comm.wait_count(n * (it + 1))
        tensor_of = [_chunk_of(s, comm, k)[0] for k in range(n * it, n * (it + 1))]
        assert all(torch.equal(p, b) for p, b in zip(net.parameters(), before))
        expected = list(twin.parameters())
        # Release the chunks one by one (in start order, as a FIFO link completes them): a
        # tensor is updated, exactly as one optimizer step would, the moment its last chunk
        # is reduced; the others stay as they were.
        for k, i in enumerate(tensor_of):
            comm.issued[n * it + k][1].released.set()
            if i not in tensor_of[k + 1:]:
                _until(lambda: torch.equal(s.params[i], expected[i]), (it, k, i))
            for j in range(4):
                if j in tensor_of[k + 1:]:
                    assert torch.equal(s.params[j], before[j]), (it, k, j)
        s.synchronize()
        assert all(torch.equal(p, q) for p, q in zip(net.parameters(), expected))
        assert all(p.grad is None for p in net.parameters())
    # The user's optimizer holds the state, as if it had stepped itself.
    assert len(s.optimizer.state) == 4
    s.close()


class _Unnegotiated(ByteScheduler):
    """Every rank its own leader: no negotiation group (none can exist without a process
    group), so the stub can say it has two workers."""
    negotiated = False


@pytest.mark.parametrize("size,average,divisions", [(1, None, 0), (2, None, 4), (2, "AVG", 0)])
def test_a_tensor_is_divided_only_where_its_collective_summed_it(monkeypatch, size, average,
                                                                  divisions):
    """Each chunk's all-reduce averages where the backend can (``average_op``) and the
    completer then divides nothing; where it sums, each complete tensor is divided once by
    the workers, except at one worker (a pass over every gradient for nothing)."""
    calls = []
    div_ = torch.Tensor.div_
    monkeypatch.setattr(torch.Tensor, "div_", lambda t, *a, **k: calls.append(a) or div_(t, *a,
                                                                                        **k))
    torch.manual_seed(0)
    net = Net()
    comm = HandComm(size=size, average=average)
    s = _Unnegotiated(net, torch.optim.SGD(net.parameters(), lr=0.1), comm,
                      ByteScheduler.Options(partition=100, credit=10**6))
    s.start()
    net(torch.randn(8, 4)).sum().backward()
    s.step()
    comm.wait_count(len(s.table))
    for _, h in comm.issued:
        h.released.set()
    s.synchronize()
    s.close()
    assert comm.ops == [average] * len(s.table)
    assert calls == [(size,)] * divisions   # one division per tensor (4), or none


def test_next_forward_waits_only_for_its_own_layers():
    # One chunk in flight at a time: after the first, the rest go by priority, so fc0's
    # tensors (0, 1) complete while fc1's weight (tensor 2) still has chunks to go.
    s, comm, net, *_ = _setup(credit=1)
    net(torch.randn(8, 4)).sum().backward()
    s.step()  # returns at once; the next forward starts while everything is in flight
    ran = {name: threading.Event() for name in ("fc0", "fc1")}
    for name in ran:
        getattr(net, name).register_forward_hook(lambda *_, e=ran[name]: e.set())
    fwd = threading.Thread(target=lambda: net(torch.randn(8, 4)))
    fwd.start()
    left = list(s.window.count)  # chunks of each tensor not yet reduced
    overlapped = False

    def check():
        front, everything = left[0] == left[1] == 0, not any(left)
        if front:
            assert ran["fc0"].wait(10), left
        time.sleep(0.1)
        assert ran["fc0"].is_set() == front, left
        if everything:
            assert ran["fc1"].wait(10), left
        assert ran["fc1"].is_set() == everything, left
        return front and not everything

    for k in range(len(s.table)):
        comm.wait_count(k + 1, settle=0.05)
        i = _chunk_of(s, comm, k)[0]
        overlapped |= check()
        comm.issued[k][1].released.set()
        left[i] -= 1
    check()
    fwd.join(10)
    assert overlapped  # fc0 ran its next forward while fc1's chunks were still moving
    s.close()


# -- the real method on several workers ---------------------------------------------------------
def test_registered():
    cls = methods.lookup("bytescheduler")
    assert cls is ByteScheduler and cls.display == "ByteScheduler-A2A"


# The 3-step reference matrix (1-4 workers x both models x SGD and Adam, pairwise) runs ByteScheduler
# beside MG-WFBP: tests/test_mgwfbp.py::test_three_steps_match_the_reference.


def _n_chunks(model_args, partition):
    import models
    kw = ({"sentence_len": 16, "vocab_size": TINY_BERT_VOCAB} if "bert_tiny" in model_args
          else {"image_size": 32})
    work = models.build(model_args[1], **kw)
    return chunk_table([p.numel() for p in work.model.parameters()], partition)


@pytest.mark.timeout(300)
def test_hook_jitter_same_collectives_on_every_rank(tmp_path):
    prefix = str(tmp_path / "trace")
    # Each rank sleeps a different random 0-20 ms in every gradient hook, so the ranks see
    # their gradients ready in different orders and at different times.
    proc = train(*TINY_BERT, "--verify", "3", "--method", "bytescheduler", "--nworkers", "3",
                 "--partition", str(PARTITION), "--credit", str(CREDIT),
                 "--trace-collectives", prefix, timeout=280, DDLBENCH_TEST_HOOK_JITTER_MS=20)
    assert proc.returncode == 0, describe(proc)
    steps = verify_lines(proc.stdout)["bytescheduler"]
    assert len(steps) == 3 and all(ok and max_abs < 1e-6 for _, max_abs, _, ok in steps), steps
    traces = []
    for rank in range(3):
        with open(f"{prefix}.bytescheduler.{rank}.json") as f:
            traces.append([tuple(x) for x in json.load(f)])
    assert traces[0] == traces[1] == traces[2]
    # Only the data all-reduces travel on the traced group: every chunk, once per step.
    table = _n_chunks(TINY_BERT, PARTITION)
    assert {t[0] for t in traces[0]} == {"allreduce"}
    assert len(traces[0]) == 3 * len(table) and len(table) > 46  # more chunks than tensors
    for k in range(3):
        step = traces[0][k * len(table):(k + 1) * len(table)]
        assert sorted(n for _, n, _ in step) == sorted(e - s for _, s, e in table)
        assert max(n for _, n, _ in step) == PARTITION


def test_benchmark_with_settings_from_the_environment(tmp_path, load_json):
    out, trace = tmp_path / "rec.json", tmp_path / "trace.json"
    proc = train(*TINY_BERT, *QUICK_TIMING, "--method", "bytescheduler", "--nworkers", "2",
                 "--output", str(out), "--timeline", str(trace),
                 BYTESCHEDULER_PARTITION=20000, BYTESCHEDULER_CREDIT=50000)
    assert proc.returncode == 0, describe(proc)
    assert "Total sen/sec on 2 CPU(s): " in proc.stdout
    rec = load_json(out)
    m = rec["method"]
    assert (m["method"], m["partition_elements"], m["credit_elements"]) == \
        ("bytescheduler", 20000, 50000)
    table = _n_chunks(TINY_BERT, 20000)
    assert m["chunks"] == len(table) and m["max_chunk_elements"] == 20000
    assert m["negotiation_messages_per_iteration"] > 0
    per_iter = rec["communication_per_iteration"]
    assert per_iter["calls"]["allreduce"] == len(table)
    assert per_iter["payload_bytes"]["allreduce"] == rec["model"]["gradient_bytes"]
    # The timeline of the 4 timed steps: every chunk queued in the scheduler from its tensor's
    # readiness, then all-reduced once a step (the same chunks in the same order on both
    # ranks: rank 0 decides), never before it left the queue.
    rows = traces.check_run_trace(trace, 2, 4)
    traces.check_record(rec["timeline"], 2, 4, trace)
    for rank in range(2):
        queued = sorted((e for (p, thread), evs in rows.items() if p == rank
                         and thread.startswith("scheduler queue") for e in evs),
                        key=lambda e: e["ts"] + e["dur"])
        assert sorted(e["args"]["chunk"] for e in queued) == sorted(list(range(len(table))) * 4)
        sent = traces.collectives(rows, rank)
        assert len(sent) == len(queued) == 4 * len(table)
        # The k-th chunk handed over was all-reduced k-th, after its queue span ended.
        for q, (start, name, nbytes) in zip(queued, sent):
            assert name == "allreduce" and start >= q["ts"] + q["dur"] - 1
            assert nbytes == 4 * q["args"]["elements"]


def test_published_defaults_and_environment(monkeypatch):
    monkeypatch.delenv("BYTESCHEDULER_PARTITION", raising=False)
    monkeypatch.delenv("BYTESCHEDULER_CREDIT", raising=False)
    a = train_mod.parse_args([])
    assert (a.partition, a.credit) == (4_000_000, 16_000_000)
    monkeypatch.setenv("BYTESCHEDULER_PARTITION", "123")
    monkeypatch.setenv("BYTESCHEDULER_CREDIT", "456")
    a = train_mod.parse_args([])
    assert (a.partition, a.credit) == (123, 456)
    assert train_mod.parse_args(["--partition", "7"]).partition == 7  # the flag wins


@pytest.mark.parametrize("args,env,message", [
    (["--partition", "0"], {}, "--partition must be at least 1000 elements, got 0"),
    (["--credit", "-5"], {}, "--credit must be a positive number of elements, got -5"),
    ([], {"BYTESCHEDULER_CREDIT": "0"}, "--credit must be a positive number of elements, got 0"),
])
def test_bad_settings(args, env, message):
    proc = train(*TINY_BERT, "--method", "bytescheduler", *args, "--nworkers", "2", **env)
    assert proc.returncode == 2, describe(proc)
    assert proc.stderr.strip().splitlines() == [f"ddlbench: error: {message}"], describe(proc)


# -- the launcher ---------------------------------------------------------------------------------
LAUNCHER = f"{REPO}/bytescheduler/horovod_mpi_cj.sh"
SMALL = dict(dnn="bert_tiny", bs="4", senlen="16", iters="2")


def test_launcher_verifies_with_its_settings():
    workload = {k: v for k, v in SMALL.items() if k != "iters"}  # a verification times nothing
    proc = run(["bash", LAUNCHER], timeout=300, nworkers=2, partition=PARTITION,
               BYTESCHEDULER_CREDIT=CREDIT, extra_args="--verify 2 --timeout 60", **workload)
    assert proc.returncode == 0, describe(proc)
    assert [ok for *_, ok in verify_lines(proc.stdout)["bytescheduler"]] == [True, True]
    assert "--method bytescheduler" in proc.stderr
    assert f"--partition {PARTITION} --credit {CREDIT}" in proc.stderr


@pytest.mark.parametrize("env,message", [
    (dict(partition="0"), "partition must be an integer >= 1000, got '0'"),
    (dict(BYTESCHEDULER_CREDIT="-1"), "credit must be a positive integer, got '-1'"),
])
def test_launcher_bad_settings(env, message):
    proc = run(["bash", LAUNCHER], timeout=60, nworkers=2, **env)
    assert proc.returncode != 0
    err = [ln for ln in proc.stderr.splitlines() if "error" in ln]
    assert err and message in err[0], describe(proc)

"""Periodic averaging, ``localsgd``, ``diloco`` and torch's own, ``ddp_localsgd`` (DDP with
the post-local-SGD hook and ``PeriodicModelAverager``): at H = 1 with SGD (with and without
momentum) ``localsgd`` and ``ddp_localsgd`` are synchronous SGD, held to the averaged gradient's
single-process reference (``ddp_localsgd``'s parameters equal ``ddp``'s); at H > 1 all three
equal the simulation of P replicas written apart (``ddlbench/methods/periodic_reference.py``)
at 3 and 4 workers and on 2 emulated machines x 2 slots, with the replicas compared only on
sync steps; deliberately wrong variants (``tests/broken_periodic.py``, torch's averager on its
example's schedule among them) fail; each sends ``2(P-1)/P G`` per H steps (G = the
parameters' bytes) at P = 2, 3, 4, as timeline spans labelled with their tensors, what the
model predicts; all declare that they change the algorithm, which the methods table and the
sweep's report say."""
import json

import numpy as np
import pytest

from .conftest import MOMENTUM_SGD, TINY_BERT, describe, tiny_bert_model, train, verify_lines

BOTH = "localsgd,diloco"
ALL = "localsgd,diloco,ddp_localsgd"
SUMS = "tests.broken_periodic:LocalSGDSums"
PLAIN_OUTER = "tests.broken_periodic:DiLoCoPlainOuter"
TORCH_WARMUP = "tests.broken_periodic:DDPLocalSGDTorchWarmup"
AGAINST = "it changes the algorithm; against ddlbench.methods.periodic_reference:"


def _verified(proc, methods, steps):
    """Every step of every method OK; its lines."""
    lines = verify_lines(proc.stdout)
    for m in methods:
        assert [ok for *_, ok in lines[m]] == [True] * steps, (m, describe(proc))
    return lines


def _synced_steps(stdout, method):
    """The steps whose line checked the replicas (identical), and those that did not."""
    synced, apart = [], []
    for line in stdout.splitlines():
        if line.startswith(f"verify {method} step "):
            step = int(line.split(" step ")[1].split(":")[0])
            if "replicas identical" in line:
                synced.append(step)
            elif "replicas apart until the next sync" in line:
                apart.append(step)
    return synced, apart


@pytest.fixture(scope="module")
def period_1_job(tmp_path_factory):
    """H = 1, 3 workers, momentum SGD: localsgd, ddp_localsgd and ddp verified in one job (a
    job's start costs more than its methods' steps), each method's parameters saved."""
    path = tmp_path_factory.mktemp("period_1")
    proc = train(*TINY_BERT, *MOMENTUM_SGD, "--nworkers", "3", "--verify", "3",
                 "--method", "localsgd,ddp_localsgd,ddp", "--period", "1",
                 "--save-params", str(path / "{method}.npz"), timeout=300)
    return proc, path


@pytest.mark.parametrize("workers,momentum", [(3, MOMENTUM_SGD), (2, ["--optimizer", "sgd"])])
def test_localsgd_at_period_1_is_synchronous_sgd(workers, momentum, request):
    """H = 1 with SGD: the parameters average of P replicas each stepped on its own gradient
    (and its own momentum buffer, linear in the gradients) is the step on the averaged
    gradient: the existing reference, replicas identical every step. (3 workers: the job of
    ``period_1_job``.)"""
    if workers == 3:
        proc, _ = request.getfixturevalue("period_1_job")
    else:
        proc = train(*TINY_BERT, *momentum, "--nworkers", str(workers), "--verify", "3",
                     "--method", "localsgd", "--period", "1", timeout=300)
    assert proc.returncode == 0, describe(proc)
    _verified(proc, ["localsgd"], 3)
    assert AGAINST not in proc.stdout   # the averaged gradient's reference
    assert _synced_steps(proc.stdout, "localsgd") == ([1, 2, 3], [])


def test_torch_local_sgd_at_period_1_is_ddp(period_1_job):
    """H = 1, 3 workers, momentum SGD: torch's averager after every step (its gradients
    never leave the worker) is synchronous SGD: the averaged gradient's reference, replicas
    identical every step, and its parameters those of ``ddp`` in the same run within fp32
    rounding (a step's size is 1e-4 to 1e-2 of them)."""
    proc, tmp_path = period_1_job
    assert proc.returncode == 0, describe(proc)
    _verified(proc, ["ddp_localsgd", "ddp"], 3)
    assert AGAINST not in proc.stdout
    assert _synced_steps(proc.stdout, "ddp_localsgd") == ([1, 2, 3], [])
    torch_local, ddp = (np.load(tmp_path / f"{m}.npz") for m in ("ddp_localsgd", "ddp"))
    start = {n: p.detach().double().numpy() for n, p in tiny_bert_model().named_parameters()}
    assert sorted(torch_local.files) == sorted(ddp.files) == sorted(start)
    moved = 0.0
    for name in ddp.files:
        np.testing.assert_allclose(torch_local[name], ddp[name], rtol=1e-5, atol=1e-7,
                                   err_msg=name)
        moved = max(moved, float(np.abs(ddp[name] - start[name]).max()))
    assert moved > 1e-4   # the parameters did move: equal after 3 real steps


def test_periodic_methods_equal_the_simulation_and_the_wrong_ones_fail():
    """3 workers, H = 2, momentum SGD: the three methods equal the simulation of their
    replicas (the replicas compared on steps 2 and 4 only); a local SGD that sums without
    dividing and a DiLoCo whose outer step forgot its Nesterov momentum fail at their first
    sync, far outside the tolerance, and exactly from it (before it they are right); torch's
    averager on its example's schedule (warm-up steps = the hook's start, 0) averages after
    step 1, which the simulation's replicas have not: it fails from step 1."""
    proc = train(*TINY_BERT, *MOMENTUM_SGD, "--nworkers", "3", "--verify", "4", "--period", "2",
                 "--method", f"{ALL},{SUMS},{PLAIN_OUTER},{TORCH_WARMUP}", timeout=300)
    assert proc.returncode == 1, describe(proc)
    lines = _verified(proc, ALL.split(","), 4)
    for m in ALL.split(","):
        assert f"verify {m}: {AGAINST}" in proc.stdout
        assert _synced_steps(proc.stdout, m) == ([2, 4], [1, 3])
        assert max(frac for _, _, frac, _ in lines[m]) < 0.5
    for broken in (SUMS, PLAIN_OUTER):
        rows = lines[broken]
        assert rows[0][3] and not rows[1][3], (broken, rows)
        assert rows[1][2] > 100, (broken, rows)   # orders of magnitude outside
    rows = lines[TORCH_WARMUP]
    assert not rows[0][3] and rows[0][2] > 100, rows
    assert "FAILED: " + ", ".join([SUMS, PLAIN_OUTER, TORCH_WARMUP]) in proc.stdout


def test_periodic_methods_equal_the_simulation_at_4_workers_under_adamw():
    """4 workers, H = 3, AdamW (its moments stay local: never synchronous SGD)."""
    proc = train(*TINY_BERT, "--optimizer", "adamw", "--nworkers", "4", "--verify", "4",
                 "--period", "3", "--method", ALL, timeout=300)
    assert proc.returncode == 0, describe(proc)
    _verified(proc, ALL.split(","), 4)
    for m in ALL.split(","):
        assert _synced_steps(proc.stdout, m) == ([3], [1, 2, 4])


def test_periodic_methods_equal_the_simulation_on_two_machines():
    """2 emulated machines x 2 slots (the averages are whole-job all-reduces), H = 2."""
    proc = train(*TINY_BERT, *MOMENTUM_SGD, "--nworkers", "4", "--slots", "2", "--verify", "4",
                 "--period", "2", "--method", BOTH, timeout=300)
    assert proc.returncode == 0, describe(proc)
    _verified(proc, ["localsgd", "diloco"], 4)


@pytest.mark.parametrize("workers", [2, 3, 4])
def test_periodic_methods_send_their_parameters_once_per_period(workers, tmp_path):
    """Per worker per step, 2(P-1)/P G / H on the wire (G: the parameters' bytes; H = 4, the
    default) from the record's counters, within 2%: a warm-up and a round of whole periods
    (4 + 4 steps), so the timed steps hold one sync. ``ddp_localsgd``'s are what torch's
    averager all-reduces (its DDP reduces on groups of one: nothing), one flat buffer of every
    parameter, as the model predicts it (one message of G every H steps). The all-reduces are
    timeline spans carrying their tensors' names."""
    from ddlbench.model import simulate as sim
    period = 4
    proc = train(*TINY_BERT, "--nworkers", str(workers), "--method", ALL,
                 "--num-warmup-batches", str(period), "--num-batches-per-iter", str(period),
                 "--num-iters", "1", "--output", str(tmp_path / "{method}.json"),
                 *(["--timeline", str(tmp_path / "{method}.trace.json")] if workers == 3
                   else []), timeout=300)
    assert proc.returncode == 0, describe(proc)
    params = list(tiny_bert_model().parameters())
    G = sum(p.numel() * p.element_size() for p in params)
    expected = 2 * (workers - 1) / workers * G / period
    work = sim.Compute(forward_s=0.01, backward_s=[1e-4] * len(params),
                       nbytes=[p.numel() * p.element_size() for p in reversed(params)])
    for m in ALL.split(","):
        rec = json.loads((tmp_path / f"{m}.json").read_text())
        method = rec["method"]
        messages = method.get("bucket_bytes", [method.get("averaged_bytes")])
        assert rec["model"]["gradient_bytes"] == G == sum(messages)
        traffic = rec["communication_per_iteration"]
        assert traffic["wire_sent_bytes"]["allreduce"] == pytest.approx(expected, rel=0.02), m
        assert set(traffic["wire_sent_bytes"]) == {"allreduce"}, traffic
        assert traffic["calls"]["allreduce"] == len(messages) / period
        assert method["period"] == period and method["changes_algorithm"]
        # 8 steps in all (warm-up included), a sync after every 4th
        assert (method["steps"], method["syncs"]) == (8, 2)
        # the model's messages: the bytes counted, once per period
        predicted = sim.predict(m, work, sim.Link(1e-4, 1e-9), nworkers=workers)
        assert predicted.message_bytes == messages, m
        assert traffic["payload_bytes"]["allreduce"] == sum(predicted.message_bytes) / period
        if workers == 3:
            trace = json.loads((tmp_path / f"{m}.trace.json").read_text())
            spans = [e for e in trace["traceEvents"]
                     if e.get("cat") == "comm" and e.get("name") == "allreduce"]
            # 1 sync in the timed steps, one all-reduce a bucket, on each of 3 ranks
            assert len(spans) == len(messages) * workers, spans
            assert all(e["args"]["bytes"] == G and "46 tensors" in e["args"]["tensor"]
                       for e in spans), spans[0]


def test_they_declare_that_they_change_the_algorithm():
    """The declaration (``Method.changes_algorithm``), what the methods table and the sweep's
    report make of it, ``reference_for`` (H = 1 under SGD: the averaged gradient's reference),
    the sync period for the model, and only ``none`` for a compressor. No torch needed."""
    from ddlbench import methods
    from ddlbench.sweep import aggregate, report
    local, diloco = methods.lookup("localsgd"), methods.lookup("diloco")
    peer = methods.lookup("ddp_localsgd")
    assert local.changes_algorithm and diloco.changes_algorithm
    assert peer.changes_algorithm == local.changes_algorithm
    assert all(cls.changes_algorithm is None for mid, cls in methods.registry().items()
               if mid not in ALL.split(","))
    table = methods.table()
    assert table.count("(**changes the algorithm**: ") == 3
    opts = local.Options.resolve({"period": 1})
    assert local.reference_for(opts, "sgd") == ""
    assert local.reference_for(opts, "adamw") == local.reference
    peer_opts = peer.Options.resolve({"period": 1})
    assert peer.reference_for(peer_opts, "sgd") == ""
    assert peer.reference_for(peer_opts, "adamw") == local.reference
    assert peer.reference_for(peer.Options(), "sgd") == local.reference
    # --period is one option of all three, its default 4 (torch's example's period)
    assert peer.sync_period(peer.Options()) == 4 and peer.accepts("fp16")
    assert [peer.averager_warmup(h) for h in (1, 4)] == [0, 3]
    assert diloco.reference_for(diloco.Options.resolve({"period": 1}), "sgd") == diloco.reference
    assert local.sync_period(local.Options()) == 4
    assert diloco.Options().outer_lr == 0.7 and diloco.Options().outer_momentum == 0.9
    assert local.accepts("none") is None and local.accepts("fp16")
    assert diloco.accepts("topk")

    def row(mid, label):
        return aggregate.Row(network="lo", connection="lo", model="bert_tiny", batch_size=4,
                             task="t", label=label, engine="torch", architecture="a2a",
                             method_id=mid)
    t = aggregate.Table(rows=[row("ddp", "DDP"), row("localsgd", "LocalSGD"),
                              row("tests.broken_methods:Crash", "x")],
                        counts=[2], noun="CPU", aggregate="median", min_ok=1, tries=1,
                        header=None, tries_used=[], superseded=0)
    line, blank = report.algorithm_lines(t)
    assert line.startswith("Not synchronous SGD: LocalSGD: the replicas step apart") and \
        "says nothing of their model quality" in line and blank == ""
    t.rows = t.rows[:1]
    assert report.algorithm_lines(t) == []

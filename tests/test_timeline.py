"""The timeline (issue 17): overlap metrics from hand-written events, the merged Chrome trace's
form, a parameter server's own recording, and real runs' traces and records."""
import json
import math
import os
import queue
import statistics
import sys
import threading
import time

import pytest
import torch

from ddlbench import timeline as tl
from ddlbench.runtime import ps

from . import traces
from .conftest import QUICK_TIMING, REPO, TINY_BERT, describe, run, train
from .traces import check_trace

MAIN = tl.MAIN


def span(name, cat, start, end, thread=MAIN, **args):
    return (name, cat, thread, float(start), float(end), args or None)


# Two iterations, microseconds. Iteration 0 [0, 100]: forward [0, 30] with a wait [10, 15]
# inside it (a forward pre-hook), backward [30, 60], step [60, 90] (a wait) holding the
# optimizer [80, 90]; loop overhead [90, 100]. Communication on two threads at once, [40, 70]
# and [50, 85], a push [12, 14] during the pre-hook's wait, and [95, 105] across the iterations'
# border. Iteration 1 [100, 200]: forward [100, 150], step [150, 190] without an optimizer.
EVENTS = [
    span("iteration", "iteration", 0, 100, index=0),
    span("forward", "compute", 0, 30), span("pre-hook", "wait", 10, 15),
    span("backward", "compute", 30, 60),
    span("step", "wait", 60, 90), span("optimizer", "compute", 80, 90),
    span("allreduce", "comm", 40, 70, thread="allreduce", bytes=8),
    span("allreduce", "comm", 50, 85, thread="allgather"),
    span("push_pull", "comm", 12, 14, thread="push_pull"),
    span("allreduce", "comm", 95, 105, thread="allreduce"),
    ("w", "ready", "gradients", 45.0, None, None),
    span("iteration", "iteration", 100, 200, index=1),
    span("forward", "compute", 100, 150), span("step", "wait", 150, 190),
]


def test_overlap_metrics_of_a_hand_written_trace():
    m = tl.overlap(EVENTS)
    assert m["iterations"] == 2
    first, second = m["per_iteration"]
    us = 1e-6
    # compute: forward minus its wait (25), backward (30), optimizer (10); wait: the pre-hook
    # (5) and the step outside its optimizer (20); communication: [12,14] U [40,85] U [95,100].
    expect = {"iteration_s": 100, "compute_s": 65, "wait_s": 25, "comm_s": 52,
              "hidden_s": 25,    # [40,60] in backward, [80,85] in the optimizer
              "exposed_s": 30,   # (comm U wait) minus compute: [10,15], [60,80], [95,100]
              "idle_s": 5}       # [90,95]
    for k, v in expect.items():
        assert first[k] == pytest.approx(v * us, rel=1e-12, abs=1e-15), k
    assert first["overlap"] == pytest.approx(25 / 52, rel=1e-12)
    # [100,105] of the collective that crossed the border, during the forward
    expect = {"iteration_s": 100, "compute_s": 50, "wait_s": 40, "comm_s": 5, "hidden_s": 5,
              "exposed_s": 40, "idle_s": 10}
    for k, v in expect.items():
        assert second[k] == pytest.approx(v * us, rel=1e-12, abs=1e-15), k
    assert second["overlap"] == 1.0
    mean = m["mean"]
    assert mean["compute_s"] == pytest.approx(57.5 * us, rel=1e-12)
    assert mean["exposed_s"] == pytest.approx(35 * us, rel=1e-12)
    assert mean["overlap"] == pytest.approx(15 / 28.5, rel=1e-12)
    assert tl.overlap([]) is None


def _collective(name, t0, t1, thread="allreduce"):
    return (name, tl.COMM, thread, t0, t1, {"bytes": 4})


def test_transport_queue_is_inferred_in_hand_over_order():
    events = [("backward", tl.COMPUTE, MAIN, 0.0, 30.0, None),
              _collective("allreduce", 1.0, 10.0), _collective("allreduce", 2.0, 15.0),
              _collective("broadcast", 3.0, 20.0, "broadcast"),
              ("push_pull", tl.COMM, "push_pull", 4.0, 8.0, {"key": 1}),   # to a server
              _collective("allreduce", 25.0, 26.0),
              ("iteration", tl.ITERATION, MAIN, 0.0, 30.0, {"index": 0})]
    # one thread: each waits for the one before; push/pull and compute untouched
    one = tl.transport_queues(events, 1)
    assert [(e[5] or {}).get("queued_us") for e in one] == [None, None, 8.0, 12.0, None, None, None]
    # two threads (Gloo's): the broadcast starts when the first all-reduce ends, at 10
    two = tl.transport_queues(events, 2)
    assert [(e[5] or {}).get("queued_us") for e in two] == [None, None, None, 7.0, None, None, None]
    assert [e[:5] for e in two] == [e[:5] for e in events] and events[2][5] == {"bytes": 4}
    # the metrics read the union of the spans: the same
    assert tl.overlap(one) == tl.overlap(events) and tl.overlap(events)["mean"]["comm_s"] > 0


def test_cost_benchmark_rotates_the_three_modes(tmp_path):
    # (its own process: it starts a process group of one)
    out = tmp_path / "cost.json"
    proc = run([sys.executable, "-m", "ddlbench.overhead", "--timeline", "--model", "resnet18",
                "--image-size", "32", "--batch-size", "2", "--methods", "wfbp", "--rounds", "6",
                "--batches", "1", "--warmup", "1", "--json", str(out)], timeout=200)
    assert proc.returncode == 0, describe(proc)
    lines = proc.stdout.splitlines()
    assert lines[1].split() == ["method", "none", "s/round", "counters/none", "full/none"]
    name, seconds, counters, full = lines[2].split()
    # (how much slower a recorded round is, is the benchmark's to say, not a test's bound)
    with open(out) as f:
        rec = json.load(f)
    assert rec["mode"] == "timeline" and list(rec["methods"]) == ["wfbp"], rec
    fig = rec["methods"]["wfbp"]
    assert name == "wfbp" and set(fig) == {"none_s_per_round", "counters/none", "full/none",
                                           "round_s"}
    for printed, key, places in ((seconds, "none_s_per_round", 4), (counters, "counters/none", 3),
                                 (full, "full/none", 3)):
        assert math.isfinite(fig[key]) and fig[key] > 0, (key, fig)
        assert float(printed) == pytest.approx(fig[key], abs=0.6 * 10 ** -places), (key, lines)
    # the figures from the recorded rounds, computed here: throughput of each mode over the
    # unrecorded rounds' (the unrecorded round's time over the recorded one's), round by round
    rounds = fig["round_s"]
    assert {mode: len(t) for mode, t in rounds.items()} == {"none": 6, "counters": 6, "full": 6}
    assert fig["none_s_per_round"] == pytest.approx(statistics.median(rounds["none"]))
    for mode in ("counters", "full"):
        mine = statistics.median(n / t for n, t in zip(rounds["none"], rounds[mode]))
        assert fig[f"{mode}/none"] == pytest.approx(mine, rel=1e-12), (mode, rounds)


def test_cost_benchmark_figures_from_known_rounds():
    """The timeline's cost from known seconds per round: each ratio the median of the rounds'
    quotients none / mode (a throughput ratio: 0.8 where recording costs 25%), not inverted and
    not the quotient of the medians."""
    from ddlbench import overhead
    times = {"none": [1.0, 2.0, 4.0], "counters": [2.0, 2.0, 5.0], "full": [1.0, 4.0, 8.0]}
    assert overhead._timeline_figures(times) == {
        "none_s_per_round": 2.0, "counters/none": 0.8,   # 0.5, 1.0, 0.8 (medians: 2/2 = 1.0)
        "full/none": 0.5, "round_s": times}               # 1.0, 0.5, 0.5 (inverted: 2.0)


def test_overhead_figures_are_medians_of_the_rounds():
    """The figures from known round times (seconds per round of each loop): throughput ratios
    the median of the rounds' quotients (not the quotient of the medians: 3 rounds where they
    differ), extra microseconds per tensor the median of the rounds' differences."""
    from types import SimpleNamespace

    from ddlbench import overhead
    times = {"bare": [1.0, 2.0, 4.0], "method": [2.0, 2.0, 5.0], "raw_hook": [1.5, 2.5, 4.0],
             "ddp_match": [1.0, 4.0, 4.0]}
    fig = overhead._figures(SimpleNamespace(batches=2, batch_size=3), times, tensors=10)
    assert fig["bare_s_per_round"] == 2.0 and fig["method_s_per_round"] == 2.0
    assert fig["samples_per_s"] == {"bare": 3.0, "method": 3.0, "raw_hook": 6 / 2.5,
                                    "ddp_match": 1.5}
    assert fig["ratio"] == pytest.approx({"method/bare": 0.8,          # 0.5, 1.0, 0.8
                                          "method/ddp_match": 0.8,     # 0.5, 2.0, 0.8
                                          "raw_hook/bare": 0.8,        # 2/3, 0.8, 1.0
                                          "ddp_match/bare": 1.0})      # 1.0, 0.5, 1.0
    # (the quotient of the medians would be 1.0 for method/bare)
    # (t - b) / 2 batches / 10 tensors, in us: method 1, 0, 1; raw 0.5, 0.5, 0; ddp 0, 2, 0;
    # method - raw, round by round: 0.5, -0.5, 1 (not the difference of the medians, 2.5e4)
    assert fig["us_per_tensor"] == pytest.approx({"method": 5e4, "raw_hook": 2.5e4,
                                                  "ddp_match": 0.0, "method-raw_hook": 2.5e4})
    assert list(fig["interval"]) == ["method/bare", "method/ddp_match",
                                     "method-raw_hook us/tensor"]
    assert fig["interval"]["method-raw_hook us/tensor"] is None   # 3 rounds: none
    many = {loop: t * 3 for loop, t in times.items()}              # 9 rounds: the extremes
    assert overhead._figures(SimpleNamespace(batches=2, batch_size=3), many, tensors=10)[
        "interval"]["method-raw_hook us/tensor"] == pytest.approx((-2.5e4, 5e4))
    assert fig["tensors"] == 10 and fig["round_s"] is times


def test_overhead_record_keeps_each_finished_method_when_a_later_one_fails(tmp_path,
                                                                         monkeypatch):
    """``--json`` is written after every method: a method that fails (or a step's time limit)
    after the first leaves the first one's figures on disk."""
    from types import SimpleNamespace

    import torch

    from ddlbench import overhead

    def compare(args, name, cls, comm, say):
        if name == "fusion":
            raise RuntimeError("fusion broke")
        return {"ratio": {"method/bare": 0.9}}
    monkeypatch.setattr(overhead, "_compare", compare)
    out = tmp_path / "o.json"
    args = overhead.parse_args(["--model", "resnet18", "--methods", "wfbp,fusion",
                                "--json", str(out)])
    ctx = SimpleNamespace(device=torch.device("cpu"), rank=0, size=1, backend="gloo",
                          is_root=True)
    with pytest.raises(RuntimeError, match="fusion broke"):
        overhead.run(args, ctx)
    rec = json.loads(out.read_text())
    assert rec["methods"] == {"wfbp": {"ratio": {"method/bare": 0.9}}} and rec["nworkers"] == 1


def test_overhead_interval_is_the_sign_tests_order_statistics():
    """The interval of a median ratio: order statistics k and n+1-k, k the largest keeping a
    sign test's confidence at 95% or more: 15 rounds give the 4th and 12th (96.5%), 6 the
    extremes (96.9%), 5 nothing (93.75% at best)."""
    from ddlbench.stats import median_interval
    values = [float(v) for v in (9, 3, 14, 1, 7, 12, 5, 15, 2, 11, 6, 10, 4, 13, 8)]
    assert median_interval(values) == (4.0, 12.0)
    assert median_interval([6.0, 1.0, 5.0, 2.0, 4.0, 3.0]) == (1.0, 6.0)
    assert median_interval([1.0, 2.0, 3.0, 4.0, 5.0]) is None
    # a lower confidence narrows it: at 88% 15 rounds give the 5th and 11th (88.2%)
    assert median_interval(values, confidence=0.88) == (5.0, 11.0)


def test_overhead_round_is_the_slowest_workers(monkeypatch):
    """With several workers, each round's time is the slowest worker's, the same figure on
    every worker; one worker's times are its own."""
    from types import SimpleNamespace

    import torch.distributed as dist

    from ddlbench import overhead
    mine = {"bare": [1.0, 5.0], "method": [2.0, 2.0]}
    theirs = {"bare": [3.0, 4.0], "method": [1.0, 6.0]}

    def gather(out, obj, group=None):
        assert obj is mine and group == "g"
        out[:] = [mine, theirs]
    monkeypatch.setattr(dist, "all_gather_object", gather)
    assert overhead._slowest(SimpleNamespace(size=2, group="g"), mine) == {
        "bare": [3.0, 5.0], "method": [2.0, 6.0]}
    assert overhead._slowest(SimpleNamespace(size=1, group="g"), mine) is mine


def test_overhead_benchmark_on_two_workers(tmp_path):
    """The peers on two workers: one table (worker 0's), each round the job's, the DDP
    reference sending the method's messages in as many buckets, the job's samples per second."""
    out = tmp_path / "overhead.json"
    proc = run([sys.executable, "-m", "ddlbench.overhead", "--model", "resnet18",
                "--image-size", "32", "--batch-size", "2", "--methods", "wfbp", "--rounds", "2",
                "--batches", "1", "--warmup", "1", "--nworkers", "2", "--json", str(out)],
               timeout=200)
    assert proc.returncode == 0, describe(proc)
    lines = proc.stdout.splitlines()
    assert lines[0].startswith("resnet18 bs 2, 2 workers (gloo), 2 rounds x 1 batches"), lines
    assert lines[1].split() == OVERHEAD_COLUMNS and len(lines) == 3, lines
    with open(out) as f:
        rec = json.load(f)
    fig = rec["methods"]["wfbp"]
    assert rec["nworkers"] == 2 and fig["tensors"] == 62
    assert fig["ddp_reference"]["bucket_cap_mb"] == 0 and fig["ddp_reference"]["buckets"] == 62
    # 2 workers x 1 batch x 2 samples a round
    assert fig["samples_per_s"]["bare"] == pytest.approx(4 / fig["bare_s_per_round"], rel=1e-9)
    assert fig["interval"] == {"method/bare": None, "method/ddp_match": None,   # 2 rounds
                               "method-raw_hook us/tensor": None}
    assert lines[2].split()[5] == lines[2].split()[10] == lines[2].split()[13] == "-"
    proc = run([sys.executable, "-m", "ddlbench.overhead", "--nworkers", "0"], timeout=60)
    assert proc.returncode == 2 and proc.stderr.strip().splitlines() == [
        "ddlbench: error: --nworkers must be positive, got 0"], describe(proc)
    proc = run([sys.executable, "-m", "ddlbench.overhead", "--vocab-size", "1000"], timeout=60)
    assert proc.returncode == 2 and proc.stderr.strip().splitlines() == [
        "ddlbench: error: --vocab-size applies to the BERT models, not resnet18"], describe(proc)


def test_pool_rounds_pools_the_paired_rounds_of_several_runs(tmp_path):
    """scripts/pool_rounds.py: two runs' rounds together, each ratio the method's throughput
    over the reference's in the same round, the median, the rounds ahead and the sign test's
    one-sided p; a record without round times is refused in one line."""
    runs = [{"methods": {"fusion": {"round_s": {"method": [1.0, 2.0, 1.0],
                                                "ddp_match": [2.0, 1.0, 1.5],
                                                "bare": [0.5, 1.0, 0.5]}}}},
            {"methods": {"fusion": {"round_s": {"method": [1.0, 1.0, 4.0],
                                                "ddp_match": [3.0, 1.2, 2.0],
                                                "bare": [0.9, 0.5, 1.0]}}}}]
    paths = []
    for i, rec in enumerate(runs):
        paths.append(str(tmp_path / f"run{i}.json"))
        with open(paths[-1], "w") as f:
            json.dump(rec, f)
    script = os.path.join(REPO, "scripts", "pool_rounds.py")
    proc = run([sys.executable, script, *paths], timeout=60)
    assert proc.returncode == 0, describe(proc)
    # ratios to ddp: 2, 0.5, 1.5, 3, 1.2, 0.5 -> sorted 0.5 0.5 1.2 1.5 2 3, median 1.35; the
    # 6 rounds' interval is their extremes; 4 ahead: p = (15 + 6 + 1) / 64
    assert proc.stdout.splitlines()[0].split() == [
        "fusion", "/", "ddp_match", "1.350", "[0.500,", "3.000]", "ahead", "in", "4", "of", "6",
        "rounds", "(one-sided", "p", "=", "0.34)"]
    # to bare: 0.5, 0.5, 0.5, 0.9, 0.5, 0.25: none ahead, p = 1
    assert proc.stdout.splitlines()[1].split()[3:11] == [
        "0.500", "[0.250,", "0.900]", "ahead", "in", "0", "of", "6"]
    del runs[1]["methods"]["fusion"]["round_s"]
    with open(paths[1], "w") as f:
        json.dump(runs[1], f)
    proc = run([sys.executable, script, *paths], timeout=60)
    assert proc.returncode == 2 and proc.stderr.strip().splitlines() == [
        "pool_rounds: error: fusion: the record has no round_s (written before it was kept)"]


OVERHEAD_COLUMNS = ["method", "bare", "s/round", "bare", "samples/s", "method", "s/round",
                    "ratio", "(median)", "ci(ratio)", "tensors", "us/tensor", "raw", "us/tensor",
                    "us-raw", "ci(us-raw)", "ddp", "us/tensor", "method/ddp", "ci(method/ddp)",
                    "ddp", "cap", "MiB", "ddp", "buckets"]


def test_overhead_benchmark_prints_the_bare_loops_rate_with_the_benchmarks_optimizer(tmp_path):
    out = tmp_path / "overhead.json"
    proc = run([sys.executable, "-m", "ddlbench.overhead", "--model", "bert_tiny",
                "--sentence-len", "16", "--vocab-size", "1000", "--batch-size", "2",
                "--optimizer", "auto", "--methods", "wfbp,bspa2a", "--rounds", "2",
                "--batches", "2", "--warmup", "1", "--json", str(out)],
               timeout=200, OMP_NUM_THREADS=1)
    # (one thread: on a 2-core machine that other work keeps busy, torch's two OpenMP threads
    # wait for each other up to ~1 s a step)
    assert proc.returncode == 0, describe(proc)
    lines = proc.stdout.splitlines()
    assert lines[0].startswith("bert_tiny (vocabulary 1000) bs 2, 1 worker (gloo)"), lines
    assert lines[1].split() == OVERHEAD_COLUMNS
    rows = {line.split()[0]: line.split() for line in lines[2:]}
    assert list(rows) == ["wfbp", "bspa2a"], lines
    with open(out) as f:
        rec = json.load(f)
    got = rec["methods"]
    import models
    built = models.build("bert_tiny", sentence_len=16, vocab_size=1000).model
    assert rec["vocab_size"] == 1000 and built.config.vocab_size == 1000
    n = sum(p.requires_grad for p in built.parameters())
    for name, row in rows.items():
        _, bare, rate, seconds, ratio, ci_bare, tensors, us, raw_us, over_raw, ci_raw, ddp_us, \
            vs_ddp, ci, cap, buckets = row
        assert float(seconds) > 0, row
        fig = got[name]
        # the printed rate (one decimal) is the record's: 2 batches x 2 samples over the round
        assert float(rate) == pytest.approx(fig["samples_per_s"]["bare"], abs=0.051)
        assert fig["samples_per_s"]["bare"] == pytest.approx(2 * 2 / fig["bare_s_per_round"],
                                                             rel=1e-9)
        # what the figures must be (how fast is the benchmark's to say): the printed ones the
        # record's; every ratio finite and positive; each loop's seconds per round the samples
        # over its rate, and with 2 rounds (the median their mean) its extra microseconds per
        # tensor the difference of the medians over the batches and tensors
        assert float(bare) == pytest.approx(fig["bare_s_per_round"], abs=6e-5)
        assert float(seconds) == pytest.approx(fig["method_s_per_round"], abs=6e-5)
        assert float(ratio) == pytest.approx(fig["ratio"]["method/bare"], abs=6e-4)
        assert all(math.isfinite(r) and r > 0 for r in fig["ratio"].values()), fig
        per_round = {loop: 2 * 2 / rate for loop, rate in fig["samples_per_s"].items()}
        assert per_round["bare"] == pytest.approx(fig["bare_s_per_round"], rel=1e-9)
        assert per_round["method"] == pytest.approx(fig["method_s_per_round"], rel=1e-9)
        assert fig["us_per_tensor"] == pytest.approx(
            {**{loop: (per_round[loop] - per_round["bare"]) / 2 / n * 1e6
                for loop in ("method", "raw_hook", "ddp_match")},
             "method-raw_hook": (per_round["method"] - per_round["raw_hook"]) / 2 / n * 1e6},
            rel=1e-6, abs=1e-6)
        assert int(tensors) == fig["tensors"] == n
        assert [float(us), float(raw_us), float(ddp_us)] == pytest.approx(
            [fig["us_per_tensor"][k] for k in ("method", "raw_hook", "ddp_match")], abs=0.01)
        assert float(over_raw) == pytest.approx(fig["us_per_tensor"]["method-raw_hook"],
                                                abs=0.051)
        assert fig["ratio"]["method/ddp_match"] == pytest.approx(float(vs_ddp), abs=1e-3)
        assert ci == ci_bare == ci_raw == "-"   # 2 rounds: no interval
        assert fig["interval"] == {"method/bare": None, "method/ddp_match": None,
                                   "method-raw_hook us/tensor": None}
        assert set(fig["samples_per_s"]) == {"bare", "method", "raw_hook", "ddp_match"}
        assert float(cap) == fig["ddp_reference"]["bucket_cap_mb"] and \
            int(buckets) == fig["ddp_reference"]["buckets"]
    # the DDP sending WFBP's messages: one bucket per gradient tensor, as DDP itself counts
    # them (its logging data); BSP's: one bucket of every gradient
    assert got["wfbp"]["ddp_reference"]["bucket_cap_mb"] == 0
    assert got["wfbp"]["ddp_reference"]["buckets"] == n
    assert got["bspa2a"]["ddp_reference"]["buckets"] == 1
    if not torch.cuda.is_available():  # --cuda on a machine without a GPU: one line, exit 2
        proc = run([sys.executable, "-m", "ddlbench.overhead", "--cuda"], timeout=100)
        assert proc.returncode == 2 and proc.stderr.strip().splitlines() == [
            "ddlbench: error: --cuda: torch sees no CUDA GPU here"], describe(proc)


def test_ddp_with_bucket_cap_0_is_one_bucket_per_tensor(tmp_path, load_json):
    out = tmp_path / "rec.json"
    proc = train(*TINY_BERT, *QUICK_TIMING, "--method", "ddp", "--bucket-cap-mb", "0",
                 "--output", str(out))
    assert proc.returncode == 0, describe(proc)
    rec = load_json(out)
    assert rec["config"]["nworkers"] == 1 and rec["config"]["bucket_cap_mb"] == 0
    assert rec["method"]["bucket_cap_mb"] == 0 and rec["method"]["first_bucket_bytes"] == 1
    proc = train(*TINY_BERT, "--method", "ddp", "--bucket-cap-mb", "-1", "--output", str(out),
                 timeout=120)
    assert proc.returncode == 2 and proc.stderr.strip().splitlines() == [
        "ddlbench: error: --bucket-cap-mb must be >= 0, got -1"], describe(proc)


def test_no_communication_has_no_overlap_ratio():
    m = tl.iteration_metrics([span("forward", "compute", 0, 10)], 0.0, 10.0)
    assert m["overlap"] is None and m["comm_s"] == 0 and m["exposed_s"] == 0


class _FakeWork:
    """A transport's work the test completes by hand."""

    def __init__(self):
        self.done = False
        self.waited = 0

    def is_completed(self):
        return self.done

    def wait(self, *_args):
        self.waited += 1
        self.done = True
        return True


def test_a_collectives_completion_is_discovered_at_the_next_event_or_its_wait(monkeypatch):
    """No callback per collective: a span ends at the first recorder event after its work
    completed (an issue, a span's start or end, an instant; in issue order), or where it was
    waited for, and says when it was last seen incomplete; a window's end closes what is
    left."""
    now = [0.0]
    monkeypatch.setattr(tl, "now_us", lambda: now[0])

    def at(us):
        now[0] = float(us)

    def comm_spans():
        return [(e[3], e[4], (e[5] or {}).get("pending_us")) for e in t.events
                if e[1] == tl.COMM]

    t = tl.Timeline()
    t.start()
    a, b, c, d = _FakeWork(), _FakeWork(), _FakeWork(), _FakeWork()
    at(0)
    wa = t.comm("allreduce", a, "allreduce", bytes=1)
    at(20)
    wb = t.comm("allreduce", b, "allreduce", bytes=2)   # a seen running at 20
    at(30)
    a.done = b.done = True
    at(40)
    t.instant("mark", "ready")                          # both discovered complete here
    # b was never asked while a ran ahead of it
    assert comm_spans() == [(0.0, 40.0, 20.0), (20.0, 40.0, None)]
    at(45)
    assert wa.wait() and wb.wait() and a.waited == b.waited == 1
    assert len(comm_spans()) == 2                       # closed once
    at(70)
    wc = t.comm("allgather", c, "allgather")
    at(90)
    wd = t.comm("allgather", d, "allgather")            # c seen running at 90
    at(120)
    wd.wait()                                           # d ends here, but behind c
    assert len(comm_spans()) == 2
    at(140)
    c.done = True
    at(150)
    with t.span("backward", tl.COMPUTE):                # c discovered as a span starts ...
        at(160)
    assert comm_spans()[2:] == [(70.0, 150.0, 120.0), (90.0, 120.0, None)]  # ... d at its wait
    assert wc.wait() and len(comm_spans()) == 4
    at(200)
    t.comm("broadcast", _FakeWork(), "broadcast")
    at(230)
    t.stop()                                            # what is left ends with the window
    assert comm_spans()[-1] == (200.0, 230.0, 200.0) and not t._pending


def test_merged_trace_is_on_rank_0s_clock_with_a_row_per_stream():
    rank1 = [span("iteration", "iteration", 1000, 1100, index=0),
             span("allreduce", "comm", 1010, 1050, thread="allreduce"),
             span("allreduce", "comm", 1020, 1060, thread="allreduce")]   # in flight at once
    obj = tl.trace([{"rank": 0, "events": EVENTS, "offset_us": 0.0, "uncertainty_us": 0.0},
                    {"rank": 1, "events": rank1, "offset_us": 1000.0, "uncertainty_us": 2.5}],
                   meta={"method": "x"})
    rows = check_trace(obj)
    assert obj["metadata"]["uncertainty_us"] == {"0": 0.0, "1": 2.5}
    assert obj["metadata"]["method"] == "x"
    # Rank 1's clock runs 1000 us ahead: its iteration starts where rank 0's does.
    assert rows[(1, MAIN)][0]["ts"] == rows[(0, MAIN)][0]["ts"] == 0
    # Two collectives in flight at once: two rows.
    assert [e["ts"] for e in rows[(1, "allreduce")]] == [10]
    assert [e["ts"] for e in rows[(1, "allreduce 2")]] == [20]
    assert rows[(0, "gradients")][0]["ph"] == "i"
    assert {p for p, _ in rows} == {0, 1}


# ------------------------------------------------------------ a parameter server's recording

class _Done:
    def __init__(self, fetch=None):
        self.fetch = fetch

    def wait(self, timeout=None):
        if self.fetch is not None:
            self.fetch()


class _Peers:
    """A server's push/pull group, scripted: what a peer sends comes from a queue per (peer,
    tag) the test fills; what the server sends lands in one per (peer, tag) at once, its
    completion seen ``late_s`` later (as a real send's can be: the peer has the data before
    the sender's wait returns)."""

    def __init__(self, late_s=0.0):
        self.inbox, self.outbox, self.late_s = {}, {}, late_s

    @staticmethod
    def _queue(box, peer, tag):
        return box.setdefault((peer, tag), queue.Queue())

    def deliver(self, peer, tag, tensor):
        self._queue(self.inbox, peer, tag).put(tensor)

    def recv(self, tensors, peer, tag):
        q = self._queue(self.inbox, peer, tag)
        return _Done(lambda: tensors[0].copy_(q.get(timeout=30)))

    def send(self, tensors, peer, tag):
        self._queue(self.outbox, peer, tag).put(tensors[0].clone())
        return _Done(lambda: time.sleep(self.late_s))

    def reply(self, peer, tag):
        return self._queue(self.outbox, peer, tag).get(timeout=30)


@pytest.mark.parametrize("schedule", [None, "fewest-pushes"])
def test_a_server_records_receives_sums_and_sends_only_while_told(schedule):
    """Two pushers, three keys, four rounds: worker 0 turns the server's timeline on for rounds
    1 and 2 only, asks its clock and its events. Each recorded push is a receive and a sum
    (on the peer's thread, or the engine's with server-side scheduling), each round of a key
    one send to both pushers, after its sums. Sends complete late: stopping the timeline
    waits for the recorded ones, so the events asked next are whole."""
    group = _Peers(late_s=0.02)
    server = ps.Server(group, rank=2, nworkers=2, nservers=1, timeout_s=30)
    keys = {k: ps._Key(4, torch.float32) for k in range(3)}
    session = threading.Thread(target=server._session, args=(keys, [0, 1], schedule))
    session.start()

    def ask(op, reply):
        group.deliver(0, ps.header_tag(0), torch.tensor([op, -1]))
        out = group.reply(0, ps.TAG_STATS)
        assert out.dtype == reply
        return out

    def round_(r):
        for key in keys:
            for peer in (0, 1):
                group.deliver(peer, ps.header_tag(0), torch.tensor([ps.OP_PUSH, key]))
                group.deliver(peer, ps.TAG_DATA + key, torch.full((4,), 10.0 * r + key + peer))
        for key in keys:   # every pusher pulls the sum before pushing the key again
            for peer in (0, 1):
                got = group.reply(peer, ps.TAG_DATA + key)
                assert torch.equal(got, torch.full((4,), 20.0 * r + 2 * key + 1)), (r, key)

    round_(0)
    assert int(ask(ps.OP_TIMELINE_ON, torch.int64)[0]) == 0
    round_(1)
    round_(2)
    recorded = int(ask(ps.OP_TIMELINE_OFF, torch.int64)[0])
    round_(3)
    t0 = tl.now_us()
    clock = float(ask(ps.OP_CLOCK, torch.float64)[0])
    assert t0 <= clock <= tl.now_us()       # one process: one clock
    n = int(ask(ps.OP_EVENTS, torch.int64)[0])
    events = [tuple(e) for e in json.loads(group.reply(0, ps.TAG_STATS).numpy().tobytes())]
    assert len(json.dumps(server.timeline.events).encode()) == n
    for peer in (0, 1):
        group.deliver(peer, ps.header_tag(0), torch.tensor([ps.OP_END, -1]))
    session.join(30)
    assert not session.is_alive()

    # Rounds 1 and 2 only (round 3, after the stop, added nothing): a receive and a sum per
    # push, a send per key and round.
    assert len(events) == recorded == 2 * 3 * 2 * 2 + 2 * 3
    for name, cat, *_ in events:
        assert cat == {"receive": "comm", "sum": "compute", "send": "comm"}[name]
    for key in keys:
        for peer in (0, 1):
            row = f"receive from worker {peer}"
            got = [e for e in events if e[0] == "receive" and e[5]["key"] == key
                   and e[5]["peer"] == peer]
            assert [e[2] for e in got] == [row] * 2
            assert all(e[5]["bytes"] == 16 for e in got)
            sums = [e for e in events if e[0] == "sum" and e[5] == {"key": key, "peer": peer}]
            assert [e[2] for e in sums] == ["priority sum" if schedule else row] * 2
            for rec, add in zip(got, sums):   # received, then summed
                assert rec[3] <= rec[4] <= add[3] <= add[4]
        sums = sorted((e for e in events if e[0] == "sum" and e[5]["key"] == key),
                      key=lambda e: e[3])
        sends = sorted((e for e in events if e[0] == "send" and e[5]["key"] == key),
                       key=lambda e: e[3])
        assert [e[5] for e in sends] == [{"key": key, "bytes": 16, "peers": [0, 1]}] * 2
        assert [e[2] for e in sends] == ["send"] * 2
        for i, send in enumerate(sends):
            assert send[3] >= max(e[4] for e in sums[2 * i:2 * i + 2]) and send[4] >= send[3]
    assert server.timeline.enabled is False


class _AheadServer:
    """The push/pull group as worker 0 sees it, with one scripted server whose clock runs
    ``ahead`` microseconds ahead of the worker's and who recorded ``events``."""

    def __init__(self, ahead, events):
        self.ahead, self.events, self.replies, self.asked = ahead, events, queue.Queue(), []

    def send(self, tensors, peer, tag):
        assert peer == 2 and tag == ps.header_tag(0)
        op = int(tensors[0][0])
        self.asked.append(op)
        if op == ps.OP_CLOCK:
            self.replies.put(torch.tensor([tl.now_us() + self.ahead], dtype=torch.float64))
        elif op == ps.OP_EVENTS:
            text = json.dumps(self.events).encode()
            self.replies.put(torch.tensor([len(text)]))
            self.replies.put(torch.frombuffer(bytearray(text), dtype=torch.uint8))
        else:
            self.replies.put(torch.zeros(1, dtype=torch.int64))
        return _Done()

    def recv(self, tensors, peer, tag):
        assert peer == 2 and tag == ps.TAG_STATS
        return _Done(lambda: tensors[0].copy_(self.replies.get(timeout=30)))


def test_worker_0_measures_a_server_clock_and_fetches_its_events_onto_its_own():
    ahead = 5e6
    start = tl.now_us() + ahead
    events = [("receive", "comm", "receive from worker 0", start, start + 10.0,
               {"key": 0, "bytes": 16, "peer": 0}),
              ("send", "comm", "send", start + 20.0, start + 30.0,
               {"key": 0, "bytes": 16, "peers": [0]})]
    group = _AheadServer(ahead, events)
    client = ps.PSClient(group, rank=0, nworkers=2, nservers=1, partition_bytes=1 << 16,
                         timeout_s=30)
    client.session = 0      # (worker 0 asks inside a session: its first here)
    client.timeline_on()
    [(offset, uncertainty)] = client.server_clocks(rounds=5)
    assert 0 <= uncertainty and abs(offset - ahead) <= uncertainty + 1e-3
    client.timeline_off()
    [got] = client.server_events()
    assert got == {"rank": 2, "name": "server 0 (rank 2)", "events": events,
                   "offset_us": offset, "uncertainty_us": uncertainty}
    assert group.asked == [ps.OP_TIMELINE_ON] + [ps.OP_CLOCK] * 5 + [ps.OP_TIMELINE_OFF,
                                                                     ps.OP_EVENTS]
    # On rank 0's clock in the trace: the server's row starts where rank 0's did.
    mine = [span("iteration", "iteration", start - ahead, start - ahead + 50, index=0)]
    obj = tl.trace([{"rank": 0, "events": mine, "offset_us": 0.0, "uncertainty_us": 0.0}, got])
    rows = check_trace(obj)
    assert abs(rows[(2, "receive from worker 0")][0]["ts"]) <= uncertainty + 1e-3
    assert obj["metadata"]["offsets_us"]["2"] == offset


def _check_servers(obj, rec, nworkers, nservers):
    """A trace's parameter-server processes against its workers' pushes and the record."""
    procs = {p["rank"]: p for p in tl.read(obj)}
    assert sorted(procs) == list(range(nworkers + nservers))
    pushers = rec["method"]["pushers"]
    pushed, iters = {}, {}
    for r in range(nworkers):
        for e in procs[r]["events"]:
            if e[0] == "push_pull":
                pushed.setdefault(e[5]["server"], set()).add(e[5]["key"])
            if e[0] == "iteration":
                iters.setdefault(r, []).append(e)
    n = len(iters[0])
    offsets, unc = obj["metadata"]["offsets_us"], obj["metadata"]["uncertainty_us"]
    eps = 0.01   # the trace's rounding of ts and dur
    for s in range(nservers):
        rank = nworkers + s
        assert procs[rank]["name"] == f"server {s} (rank {rank})"
        events = procs[rank]["events"]
        assert {e[0] for e in events} == {"receive", "sum", "send"}
        assert all(e[4] is not None for e in events)
        # Rank 0's events against this server's: its offset to rank 0 comes from ping-pongs
        # with rank 0 itself, so the uncertainty bounds the error (NTP).
        u = unc[str(rank)] + eps
        sums = [e for e in events if e[0] == "sum"]
        assert {e[5]["key"] for e in sums} == pushed[s], s
        for key in pushed[s]:
            mine = sorted((e for e in sums if e[5]["key"] == key), key=lambda e: e[3])
            sends = sorted((e for e in events if e[0] == "send" and e[5]["key"] == key),
                           key=lambda e: e[3])
            receives = sorted((e for e in events if e[0] == "receive" and e[5]["key"] == key
                               and e[5]["peer"] == 0), key=lambda e: e[3])
            # Every pusher's push summed once per iteration; one send per iteration.
            assert len(mine) == len(pushers) * n and len(sends) == len(receives) == n, key
            for i in range(n):
                rnd = mine[i * len(pushers):(i + 1) * len(pushers)]
                assert sorted(e[5]["peer"] for e in rnd) == pushers, (key, i)
                send = sends[i]
                assert send[5]["peers"] == pushers and send[5]["bytes"] > 0
                assert send[3] >= max(e[4] for e in rnd) - eps, (key, i)
                # Worker 0's push of the iteration arrives, is summed and sent back within
                # its iteration, on rank 0's clock.
                it = iters[0][i]
                assert it[3] - u <= receives[i][3] and receives[i][4] <= it[4] + u, (key, i)
                assert it[3] - u <= send[3] <= it[4] + u, (key, i)
    servers = rec["timeline"]["servers"]
    assert [x["rank"] for x in servers] == list(range(nworkers, nworkers + nservers))
    for x in servers:
        assert x["offset_us"] == offsets[str(x["rank"])]
        assert x["uncertainty_us"] == unc[str(x["rank"])] > 0
        assert x["name"] == procs[x["rank"]]["name"] and x["iterations"] == n
        assert x["pushes_recorded"] == len(pushers) * len(pushed[x["rank"] - nworkers]) * n
        assert 0 < x["busy_ms_per_iteration"] < rec["timeline"]["mean"]["iteration_s"] * 1e3


# Every method's trace at 2 and 3 workers, carried by runs other tests make anyway: the --verify
# runs write one trace per method (bspa2a, wfbp, fusion, ddp: tests/test_verify.py; mgwfbp and
# bytescheduler: test_mgwfbp.py; bspps, wfbpps, byteschedulerps: test_ps.py), and timed runs
# check the record beside the trace: bspa2a, wfbp, fusion and ddp at 2 workers and fusion at 3
# (test_train.py), bytescheduler at 2 (test_bytescheduler.py), wfbpps and byteschedulerps at 2
# and 3 (test_ps.py); here wfbpps with two servers.
@pytest.mark.timeout(300)
def test_a_run_writes_a_valid_merged_trace(tmp_path, load_json):
    path, out = tmp_path / "trace.json", tmp_path / "rec.json"
    # Two workers on two logical machines (--slots 1): both push, to two servers.
    nworkers = 2
    proc = train(*TINY_BERT, *QUICK_TIMING, "--method", "wfbpps", "--nworkers", str(nworkers),
                 "--nservers", "2", "--slots", "1", "--timeline", str(path), "--output",
                 str(out), timeout=280)
    assert proc.returncode == 0, describe(proc)
    iters = 2 * 2   # QUICK_TIMING: 2 rounds of 2 batches
    traces.check_run_trace(path, nworkers, iters, same_collectives=False)
    full = load_json(out)
    _check_servers(json.loads(path.read_text()), full, nworkers, 2)
    traces.check_record(full["timeline"], nworkers, iters, path)
    assert "Overlap: compute " in proc.stdout and f"trace: {path}" in proc.stdout


def test_metrics_without_a_trace_file_and_a_limit(tmp_path, load_json):
    out = tmp_path / "rec.json"
    # batch 64, not 4 or 16: at 4 an iteration is about 10 ms, and the all-reduce of one (a
    # Gloo call and its copies, about 1 ms) came to 14% of it on a busy machine; at 16 (17 ms)
    # once to 13% (2.1 ms) in a fresh clone's full suite; at 64 an iteration takes 35-40 ms
    proc = run([sys.executable, "-m", "ddlbench.train", *TINY_BERT, "--batch-size", "64",
                *QUICK_TIMING, "--method", "bspa2a", "--timeline-iters", "3", "--output",
                str(out)], timeout=200)
    assert proc.returncode == 0, describe(proc)
    rec = load_json(out)["timeline"]
    assert rec["recorded_iterations"] == 3 and rec["trace"] is None
    # One worker: its all-reduce of one is a formality, the iteration is compute.
    m = rec["mean"]
    assert m["compute_s"] > 0.5 * m["iteration_s"] and m["comm_s"] < 0.1 * m["iteration_s"]
    assert rec["slowest_rank"] == 0 and list(rec["per_rank"]) == ["0"]
    assert "Overlap: compute " in proc.stdout


@pytest.mark.parametrize("args,message", [
    (["--timeline", "/proc/ddlbench-trace.json"], "/proc/ddlbench-trace.json"),
    (["--timeline-iters", "-1"], "--timeline-iters must be a finite number >= 0"),
    (["--verify", "1", "--method", "wfbp,fusion", "--timeline", "t.json"],
     "--timeline with several methods or compressors needs '{method}' in the path"),
])
def test_bad_timeline_input_is_one_line(args, message):
    proc = train(*TINY_BERT, "--method", "wfbp", *args, timeout=120)
    assert proc.returncode == 2, describe(proc)
    assert proc.stderr.count("\n") == 1 and message in proc.stderr, describe(proc)

"""The timeline (issue 17, first part): overlap metrics from hand-written events, the merged
Chrome trace's form, and real runs' traces and records."""
import json
import sys

import pytest

from ddlbench import timeline as tl

from .conftest import QUICK_TIMING, TINY_BERT, describe, run, train

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


def test_no_communication_has_no_overlap_ratio():
    m = tl.iteration_metrics([span("forward", "compute", 0, 10)], 0.0, 10.0)
    assert m["overlap"] is None and m["comm_s"] == 0 and m["exposed_s"] == 0


def check_trace(obj) -> dict:
    """The trace-event rules a viewer relies on; returns {(pid, thread name): [events]}."""
    assert set(obj) >= {"traceEvents", "metadata"}
    names, rows = {}, {}
    for e in obj["traceEvents"]:
        assert {"ph", "ts", "pid", "tid"} <= set(e), e
        if e["ph"] == "M":
            if e["name"] == "thread_name":
                names[(e["pid"], e["tid"])] = e["args"]["name"]
            continue
        assert e["ph"] in ("X", "i") and e["ts"] >= 0, e
        rows.setdefault((e["pid"], e["tid"]), []).append(e)
    out = {}
    for key, evs in rows.items():
        last, stack = -1.0, []
        for e in evs:
            assert e["ts"] >= last, ("timestamps go back", key, e)
            last = e["ts"]
            if e["ph"] != "X":
                continue
            end = e["ts"] + e["dur"]
            while stack and stack[-1] <= e["ts"]:
                stack.pop()
            assert not stack or end <= stack[-1] + 1e-3, ("spans overlap on a row", key, e)
            stack.append(end)
        out[(key[0], names[key])] = evs
    return out


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


def _collectives(rows, pid):
    return sorted(((e["ts"], e["name"], e.get("args", {}).get("bytes"))
                   for (p, thread), evs in rows.items() if p == pid
                   for e in evs if e.get("cat") == "comm"))


@pytest.mark.timeout(300)
@pytest.mark.parametrize("method,nworkers,extra", [
    ("wfbp", 2, []), ("bytescheduler", 3, []), ("wfbpps", 2, ["--nservers", "1"])])
def test_a_run_writes_a_valid_merged_trace(tmp_path, load_json, method, nworkers, extra):
    path, out = tmp_path / "trace.json", tmp_path / "rec.json"
    proc = train(*TINY_BERT, *QUICK_TIMING, "--method", method, "--nworkers", str(nworkers),
                 *extra, "--timeline", str(path), "--output", str(out), timeout=280)
    assert proc.returncode == 0, describe(proc)
    rows = check_trace(json.loads(path.read_text()))
    iters = 2 * 2   # QUICK_TIMING: 2 rounds of 2 batches
    for rank in range(nworkers):
        main = rows[(rank, MAIN)]
        its = [e for e in main if e["name"] == "iteration"]
        assert [e["args"]["index"] for e in its] == list(range(iters)), rank
        start = its[0]["ts"]
        end = max(e["ts"] + e["dur"] for e in main if e["ph"] == "X")
        comm = [e for (p, _), evs in rows.items() if p == rank for e in evs
                if e.get("cat") == "comm"]
        assert comm, (rank, sorted(rows))
        # Nothing of the warm-up, nothing after the run's last synchronize.
        assert all(start <= e["ts"] and e["ts"] + e["dur"] <= end + 1 for e in comm), rank
        assert {e["name"] for e in main} >= {"forward", "backward", "step", "synchronize"}
    if method != "wfbpps":   # all-reduce: every rank issues the same collectives, in order
        seqs = [[(n, b) for _, n, b in _collectives(rows, r)] for r in range(nworkers)]
        assert all(s == seqs[0] for s in seqs), seqs
    rec = load_json(out)["timeline"]
    assert rec["recorded_iterations"] == iters and rec["comm_observed"]
    assert set(rec["per_rank"]) == {str(r) for r in range(nworkers)}
    m = rec["mean"]
    assert 0 <= m["overlap"] <= 1 and m["comm_s"] > 0 and m["compute_s"] > 0
    assert m["hidden_s"] + m["exposed_s"] >= m["comm_s"] - 1e-9
    assert rec["trace"] == str(path)
    assert "Overlap: compute " in proc.stdout and f"trace: {path}" in proc.stdout


def test_metrics_without_a_trace_file_and_a_limit(tmp_path, load_json):
    out = tmp_path / "rec.json"
    proc = run([sys.executable, "-m", "ddlbench.train", *TINY_BERT, *QUICK_TIMING, "--method",
                "bspa2a", "--timeline-iters", "3", "--output", str(out)], timeout=200)
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
    (["--verify", "1", "--timeline", "t.json"], "--timeline has no effect with --verify"),
])
def test_bad_timeline_input_is_one_line(args, message):
    proc = train(*TINY_BERT, "--method", "wfbp", *args, timeout=120)
    assert proc.returncode == 2, describe(proc)
    assert proc.stderr.count("\n") == 1 and message in proc.stderr, describe(proc)

"""Reading a merged trace back and ``python -m ddlbench.timeline`` (issue 17, item 3): the metrics
of a trace read back are those of the recorded events, exposed spans exactly, the summary and
the comparison of hand-made traces, bad input one line."""
import json
import subprocess
import sys

import pytest

from ddlbench import timeline as tl
from ddlbench.timeline import cli

from .conftest import REPO

MAIN = tl.MAIN
US = 1e-6


def span(name, cat, start, end, thread=MAIN, **args):
    return (name, cat, thread, float(start), float(end), args or None)


# Rank 0, microseconds. Iteration 0 [0, 500]: forward [0, 250], step [250, 450] (a wait) holding
# the optimizer [400, 450]. Communication: an all-reduce [100, 400] (exposed: 150, the part after
# the forward), an all-gather on its own thread [300, 480] at the same time (exposed 130: the
# optimizer hides 50), two more all-reduces in flight [350, 470] and [380, 490] (rows
# "allreduce 2" and "allreduce 3" in the trace; exposed 70 and 60), a push/pull [460, 500]
# (exposed 40). Iteration 1 [500, 800]: forward [500, 700], step [700, 790], an all-reduce
# [690, 760] (exposed 60).
RANK0 = [
    span("iteration", "iteration", 0, 500, index=0),
    span("forward", "compute", 0, 250),
    span("step", "wait", 250, 450), span("optimizer", "compute", 400, 450),
    span("allreduce", "comm", 100, 400, thread="allreduce", bytes=4000),
    span("allgather", "comm", 300, 480, thread="allgather", bytes=800),
    span("allreduce", "comm", 350, 470, thread="allreduce", bytes=400),
    span("allreduce", "comm", 380, 490, thread="allreduce", bytes=200),
    span("push_pull", "comm", 460, 500, thread="push_pull", bytes=64, key=7, server=0),
    ("fc.weight", "ready", "gradients", 200.0, None, {"bytes": 64}),
    span("iteration", "iteration", 500, 800, index=1),
    span("forward", "compute", 500, 700), span("step", "wait", 700, 790),
    span("allreduce", "comm", 690, 760, thread="allreduce", bytes=4000),
]
# Rank 1, its clock 1000 us ahead of rank 0's: one iteration [0, 600] on rank 0's clock,
# forward [0, 300], step [300, 600], a reduce-scatter [250, 550] (exposed 250, the longest).
RANK1 = [
    span("iteration", "iteration", 1000, 1600, index=0),
    span("forward", "compute", 1000, 1300), span("step", "wait", 1300, 1600),
    span("reduce_scatter", "comm", 1250, 1550, thread="reduce_scatter", bytes=1000),
]
META = {"method": "wfbp"}


def make_trace(r0=RANK0, r1=RANK1, meta=META):
    return tl.trace([{"rank": 0, "events": r0, "offset_us": 0.0, "uncertainty_us": 0.0},
                     {"rank": 1, "events": r1, "offset_us": 1000.0, "uncertainty_us": 2.5}],
                    meta=meta)


def shifted(events, by):
    return [(n, c, t, a - by, None if b is None else b - by, x) for n, c, t, a, b, x in events]


def key(e):
    return (e[3], e[2], e[0], -1 if e[4] is None else e[4], json.dumps(e[5], sort_keys=True))


def test_read_is_the_recorded_events_back_on_rank_0s_clock(tmp_path):
    obj = make_trace()
    rows = {(e["pid"], e["args"]["name"]) for e in obj["traceEvents"]
            if e["name"] == "thread_name"}
    assert {(0, "allreduce 2"), (0, "allreduce 3")} <= rows   # in flight at once: lane rows
    path = tmp_path / "t.json"
    tl.write(str(path), obj)
    for source in (obj, str(path)):
        ranks = tl.read(source)
        assert [(r["rank"], r["name"]) for r in ranks] == [(0, "rank 0"), (1, "rank 1")]
        assert sorted(ranks[0]["events"], key=key) == sorted(RANK0, key=key)
        assert sorted(ranks[1]["events"], key=key) == sorted(shifted(RANK1, 1000.0), key=key)
        # Exactly the metrics of the recorded events.
        assert tl.overlap(ranks[0]["events"]) == tl.overlap(RANK0)
        assert tl.overlap(ranks[1]["events"]) == tl.overlap(RANK1)


def test_hand_computed_metrics_and_exposed_spans_of_the_trace_read_back():
    ranks = tl.read(make_trace())
    m0 = tl.overlap(ranks[0]["events"])
    first, second = m0["per_iteration"]
    # Iteration 0: compute [0,250] + [400,450]; wait [250,400]; comm [100,500]; hidden
    # [100,250] + [400,450]; exposed (comm U wait) - compute = 200; nothing idle.
    expect = {"iteration_s": 500, "compute_s": 300, "wait_s": 150, "comm_s": 400,
              "hidden_s": 200, "exposed_s": 200, "idle_s": 0}
    assert first == pytest.approx({**{k: v * US for k, v in expect.items()}, "overlap": 0.5},
                                  rel=1e-12, abs=1e-15)
    # Iteration 1: comm [690,760], 10 of it under the forward, 60 in the step's wait.
    expect = {"iteration_s": 300, "compute_s": 200, "wait_s": 90, "comm_s": 70,
              "hidden_s": 10, "exposed_s": 90, "idle_s": 10}
    assert second == pytest.approx({**{k: v * US for k, v in expect.items()}, "overlap": 1 / 7},
                                   rel=1e-12, abs=1e-15)
    got = [(s["name"], s["thread"], s["start_us"], s["duration_us"], s["exposed_us"],
            (s["args"] or {}).get("bytes")) for s in tl.exposed_spans(ranks[0]["events"], n=None)]
    assert got == [("allreduce", "allreduce", 100.0, 300.0, 150.0, 4000),
                   ("allgather", "allgather", 300.0, 180.0, 130.0, 800),
                   ("allreduce", "allreduce", 350.0, 120.0, 70.0, 400),
                   ("allreduce", "allreduce", 380.0, 110.0, 60.0, 200),
                   ("allreduce", "allreduce", 690.0, 70.0, 60.0, 4000),   # equal: earlier first
                   ("push_pull", "push_pull", 460.0, 40.0, 40.0, 64)]
    assert tl.exposed_spans(ranks[0]["events"], n=2)[1]["name"] == "allgather"
    assert tl.exposed_spans(ranks[0]["events"])[-1]["args"] == {"bytes": 64, "key": 7,
                                                                 "server": 0}
    assert [s["exposed_us"] for s in tl.exposed_spans(ranks[1]["events"])] == [250.0]


def test_lane_rows_fold_back_only_beside_their_base_row():
    def row(tid, name):
        return {"ph": "M", "name": "thread_name", "pid": 3, "tid": tid, "ts": 0,
                "args": {"name": name}}

    def ev(tid, ts, dur):
        return {"ph": "X", "name": "op", "cat": "comm", "pid": 3, "tid": tid, "ts": ts,
                "dur": dur}
    obj = {"traceEvents": [ev(1, 0, 10), ev(2, 5, 10), ev(3, 0, 4), ev(4, 1, 1), ev(5, 2, 1),
                           {"ph": "C", "name": "counter", "pid": 3, "tid": 1, "ts": 1},
                           {"ph": "B", "name": "begin", "pid": 3, "tid": 1, "ts": 2},
                           row(1, "allreduce"), row(2, "allreduce 2"), row(3, "worker 2"),
                           row(4, "allreduce 1"), row(5, "allreduce 2x")]}
    (r,) = tl.read(obj)
    assert r["rank"] == 3 and r["name"] == "rank 3"   # no process_name: the pid's
    assert [e[2] for e in r["events"]] == ["allreduce", "allreduce", "worker 2", "allreduce 1",
                                           "allreduce 2x"]
    assert r["events"][1] == ("op", "comm", "allreduce", 5.0, 15.0, None)


def summary_lines(capsys, *argv):
    assert cli.main([*argv]) == 0
    out, err = capsys.readouterr()
    assert err == ""
    return out.splitlines()


def test_the_summary_lists_metrics_per_rank_and_the_longest_exposed_first(tmp_path, capsys):
    path = tmp_path / "run.json"
    tl.write(str(path), make_trace())
    lines = summary_lines(capsys, str(path))
    assert lines[0] == (f"{path}: 2 ranks; method=wfbp; clock: time.perf_counter, "
                        "microseconds, rank 0's clock; offsets to rank 0: rank 0 +0.0 us "
                        "(+-0.0), rank 1 +1000.0 us (+-2.5)")
    assert lines[2].split() == ["rank", "iteration", "ms", "compute", "ms", "wait", "ms",
                                "communication", "ms", "hidden", "ms", "exposed", "ms", "overlap",
                                "%", "idle", "ms", "iterations"]
    # Means of rank 0's two iterations; rank 1 is the slowest.
    assert lines[3].split() == ["rank", "0", "0.400", "0.250", "0.120", "0.235", "0.105",
                                "0.145", "44.681", "0.005", "2"]
    assert lines[4].split() == ["rank", "1", "0.600", "0.300", "0.300", "0.300", "0.050",
                                "0.300", "16.667", "0.000", "1", "<-", "slowest"]
    assert lines[6] == "Longest exposed communication (7 of 7 spans, all ranks; --top 10):"
    assert lines[7].split() == ["rank", "name", "thread", "tensor", "bytes", "duration", "ms",
                                "exposed", "ms"]
    assert lines[8].split() == ["1", "reduce_scatter", "reduce_scatter", "-", "1000", "0.300",
                                "0.250"]
    assert lines[9].split() == ["0", "allreduce", "allreduce", "-", "4000", "0.300", "0.150"]
    assert lines[14].split() == ["0", "push_pull", "push_pull", "7", "64", "0.040", "0.040"]
    assert len(lines) == 15

    lines = summary_lines(capsys, str(path), "--top", "1")
    assert lines[6] == "Longest exposed communication (1 of 7 spans, all ranks; --top 1):"
    assert len(lines) == 9
    (data,) = [json.loads("\n".join(summary_lines(capsys, str(path), "--json", "--top", "2")))]
    assert data["slowest_rank"] == 1 and data["comm_spans"] == 7
    assert [(s["rank"], s["name"], s["exposed_us"]) for s in data["exposed"]] == \
        [(1, "reduce_scatter", 250.0), (0, "allreduce", 150.0)]
    assert data["ranks"][0]["mean"] == pytest.approx(tl.overlap(RANK0)["mean"], rel=1e-12)
    assert data["ranks"][1]["iterations"] == 1
    assert data["metadata"]["uncertainty_us"] == {"0": 0.0, "1": 2.5}

    # A parameter server's process: no iterations; its long receive is not a worker's exposed
    # communication.
    server = {"rank": 2, "name": "server 0 (rank 2)", "offset_us": 0.0, "uncertainty_us": 1.0,
              "events": [span("receive", "comm", 0, 700, thread="receive from worker 0",
                              key=7, bytes=64)]}
    obj = tl.trace([{"rank": 0, "events": RANK0, "offset_us": 0.0, "uncertainty_us": 0.0},
                    {"rank": 1, "events": RANK1, "offset_us": 1000.0, "uncertainty_us": 2.5},
                    server], meta=META)
    tl.write(str(path), obj)
    (data,) = [json.loads("\n".join(summary_lines(capsys, str(path), "--json", "--top", "2")))]
    assert data["comm_spans"] == 7 and data["exposed"][0]["name"] == "reduce_scatter"
    assert data["ranks"][2] == {"rank": 2, "name": "server 0 (rank 2)", "iterations": 0,
                                "mean": None}


# B: rank 0 iteration [0, 450], forward [0, 300], step [300, 450], an all-reduce [200, 400];
# rank 1 [0, 400], all forward, no communication (overlap None).
B_RANK0 = [span("iteration", "iteration", 0, 450, index=0), span("forward", "compute", 0, 300),
           span("step", "wait", 300, 450),
           span("allreduce", "comm", 200, 400, thread="allreduce", bytes=4000)]
B_RANK1 = [span("iteration", "iteration", 1000, 1400, index=0),
           span("forward", "compute", 1000, 1400)]


def test_compare_gives_b_minus_a_and_b_over_a(tmp_path, capsys):
    a, b = tmp_path / "wfbp.json", tmp_path / "fusion.json"
    tl.write(str(a), make_trace())
    tl.write(str(b), make_trace(B_RANK0, B_RANK1))
    # A's slowest is rank 1 (600 us), B's rank 0 (450 us).
    c = cli.compare(cli.summarize(tl.load(str(a))), cli.summarize(tl.load(str(b))),
                    per_rank=True)
    assert c["slowest"]["ranks"] == [1, 0]
    m = c["slowest"]["metrics"]
    expect = {"iteration_s": (600, 450), "compute_s": (300, 300), "wait_s": (300, 150),
              "comm_s": (300, 200), "hidden_s": (50, 100), "exposed_s": (300, 150)}
    for k, (va, vb) in expect.items():
        assert m[k] == pytest.approx({"a": va * US, "b": vb * US, "diff": (vb - va) * US,
                                      "ratio": vb / va}, rel=1e-12, abs=1e-18), k
    assert m["overlap"] == pytest.approx({"a": 1 / 6, "b": 0.5, "diff": 1 / 3, "ratio": 3.0},
                                         rel=1e-12)
    assert m["idle_s"] == {"a": 0.0, "b": 0.0, "diff": 0.0, "ratio": None}    # A is 0
    assert m["iterations"] == {"a": 1, "b": 1, "diff": 0, "ratio": 1.0}
    rank1 = c["per_rank"][1]["metrics"]
    assert rank1["overlap"] == {"a": pytest.approx(1 / 6), "b": None, "diff": None,
                                "ratio": None}
    assert rank1["comm_s"] == {"a": pytest.approx(300 * US), "b": 0.0,
                               "diff": pytest.approx(-300 * US), "ratio": 0.0}

    lines = summary_lines(capsys, str(a), str(b), "--per-rank")
    assert lines[0] == "A = wfbp.json (slowest rank 1), B = fusion.json (slowest rank 0)"
    assert lines[2].split() == ["slowest", "rank", "wfbp.json", "fusion.json", "B-A", "B/A"]
    table = {" ".join(w for w in ln.split() if not w[-1].isdigit() and w != "-"): ln.split()
             for ln in lines[3:12]}
    assert table["iteration ms"][-4:] == ["0.600", "0.450", "-0.150", "0.750"]
    assert table["wait ms"][-4:] == ["0.300", "0.150", "-0.150", "0.500"]
    assert table["hidden ms"][-4:] == ["0.050", "0.100", "+0.050", "2.000"]
    assert table["overlap %"][-4:] == ["16.667", "50.000", "+33.333", "3.000"]
    assert table["idle ms"][-4:] == ["0.000", "0.000", "+0.000", "-"]
    assert table["iterations"][-4:] == ["1", "1", "+0", "1.000"]
    assert lines[13].split()[:2] == ["rank", "0"] and lines[24].split()[:2] == ["rank", "1"]
    assert lines[24 + 7].split() == ["overlap", "%", "16.667", "-", "-", "-"]   # B: no comm
    assert len(lines) == 34

    lines = summary_lines(capsys, str(a), str(b), "--labels", "X,Y")
    assert lines[0] == "A = X (slowest rank 1), B = Y (slowest rank 0)" and len(lines) == 12
    data = json.loads("\n".join(summary_lines(capsys, str(a), str(b), "--json")))
    assert data["labels"] == ["wfbp.json", "fusion.json"] and "per_rank" not in data
    assert data["slowest"]["metrics"]["overlap"]["ratio"] == pytest.approx(3.0, rel=1e-12)


def _bad_files(tmp_path):
    files = {}
    for name, text in (("notjson.json", "{not json"), ("list.json", "[1, 2]"),
                       ("nokey.json", '{"events": []}'),
                       ("dictevents.json", '{"traceEvents": {}}'),
                       ("nodur.json", '{"traceEvents": [{"ph": "X", "name": "f", "pid": 0, '
                                      '"tid": 1, "ts": 0}]}'),
                       ("notobject.json", '{"traceEvents": [3]}')):
        (tmp_path / name).write_text(text)
        files[name] = str(tmp_path / name)
    files["noiter.json"] = str(tmp_path / "noiter.json")
    tl.write(files["noiter.json"], make_trace([e for e in RANK0 if e[1] != "iteration"],
                                              [e for e in RANK1 if e[1] != "iteration"]))
    tl.write(str(tmp_path / "good.json"), make_trace())
    return files, str(tmp_path / "good.json")


@pytest.mark.parametrize("argv,message", [
    (["{tmp}/missing.json"], "{tmp}/missing.json: no such file"),
    (["{tmp}"], "{tmp} is a folder; give a trace file"),
    (["notjson.json"], "notjson.json is not JSON (Expecting property name enclosed in double "
                       "quotes: line 1 column 2 (char 1))"),
    (["list.json"], "list.json is not a trace-event object (a JSON object with a traceEvents "
                    "list)"),
    (["nokey.json"], "nokey.json is not a trace-event object"),
    (["dictevents.json"], "dictevents.json is not a trace-event object"),
    (["nodur.json"], "nodur.json: traceEvents[0] ('X' 'f') has no numeric dur"),
    (["notobject.json"], "notobject.json: traceEvents[0] is not an object"),
    (["noiter.json"], 'noiter.json has no iteration spans (cat "iteration"): nothing to measure'),
    (["good.json", "noiter.json"], "noiter.json has no iteration spans"),
    ([], "the following arguments are required: TRACE"),
    (["good.json"] * 3, "give one trace to summarise or two to compare, got 3"),
    (["good.json", "--top", "-1"], "--top must be >= 0, got -1"),
    (["good.json", "--top", "x"], "argument --top: invalid int value: 'x'"),
    (["good.json", "--per-rank"], "--per-rank compares two traces; give two"),
    (["good.json", "--labels", "X,Y"], "--labels compares two traces; give two"),
    (["good.json", "good.json", "--labels", "X"], "--labels takes two names, X,Y; got 'X'"),
    (["good.json", "good.json", "--labels", "X,"], "--labels takes two names, X,Y; got 'X,'"),
    (["good.json", "good.json", "--top", "3"], "--top lists one trace's spans; it has no "
                                               "effect when comparing"),
    (["good.json", "--bogus"], "unrecognized arguments: --bogus"),
])
def test_bad_input_is_one_line_and_exit_2(tmp_path, capsys, argv, message):
    files, good = _bad_files(tmp_path)
    files["good.json"] = good

    def path(a):
        return files.get(a, a.replace("{tmp}", str(tmp_path)))
    assert cli.main([path(a) for a in argv]) == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert err.count("\n") == 1 and err.startswith("ddlbench.timeline: error: "), err
    expected = message.replace("{tmp}", str(tmp_path))
    for name, p in files.items():   # the file's path as given
        expected = expected.replace(name, p)
    assert expected in err, err


def test_the_module_entry_point_without_torch(tmp_path, capsys):
    a, b = tmp_path / "wfbp.json", tmp_path / "fusion.json"
    tl.write(str(a), make_trace())
    tl.write(str(b), make_trace(B_RANK0, B_RANK1))
    proc = subprocess.run([sys.executable, "-X", "importtime", "-m", "ddlbench.timeline",
                           str(a), str(b)], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert cli.main([str(a), str(b)]) == 0
    assert proc.stdout == capsys.readouterr().out
    imported = [ln.rsplit("|", 1)[-1].strip() for ln in proc.stderr.splitlines()
                if ln.startswith("import time:")]
    assert "ddlbench.timeline.cli" in imported
    assert [m for m in imported if m.split(".")[0] == "torch"] == []
    proc = subprocess.run([sys.executable, "-m", "ddlbench.timeline",
                           str(tmp_path / "missing.json")], cwd=REPO, capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr == f"ddlbench.timeline: error: {tmp_path}/missing.json: no such file\n"

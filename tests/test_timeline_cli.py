"""Reading a merged trace back and ``python -m ddlbench.timeline`` (issue 17, item 3): the metrics
of a trace read back are those of the recorded events, exposed spans exactly, the summary and
the comparison of hand-made traces, bad input one line."""
import json
import random
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


# ----------------------------------------------------------------- issue 47: large traces

def _random_rank(rng, iterations, grid=None):
    """A rank's events as the recorder makes them, shuffled: iterations back to back or with
    gaps (one overlapping the next), forward/backward/step with waits and the optimizer nested
    in them (a wait exactly as long as the compute it sits in: the later listed is the inner),
    zero-length spans, collectives on several threads across the iterations' borders (some
    through several), instants.
    Times on a grid of whole microseconds (``grid``, exact sums), else any float."""
    def t(x):
        return float(round(x / grid) * grid) if grid else x

    events, now = [], 0.0
    for i in range(iterations):
        start = now
        fwd, bwd, step = (t(rng.uniform(5, 40)) for _ in range(3))
        a, b, c = start + fwd, start + fwd + bwd, start + fwd + bwd + step
        end = c + t(rng.choice([0, 0, rng.uniform(0, 5)]))
        events += [span("iteration", "iteration", start, end, index=i),
                   span("forward", "compute", start, a), span("backward", "compute", a, b),
                   span("step", "wait", b, c)]
        h = t(rng.uniform(start, a))
        events.append(span("pre-hook", "wait", h, min(a, h + t(rng.uniform(0, 4)))))
        if rng.random() < 0.3:
            events.append(span("tie", rng.choice(["compute", "wait"]), a, b))
        o = t(rng.uniform(b, c))
        events.append(span("optimizer", "compute", o, c))
        events.append(span("empty", rng.choice(["compute", "wait"]), o, o))
        for _ in range(rng.randint(0, 6)):
            s = t(rng.uniform(start - 10, end + 10))
            events.append(span("allreduce", "comm", s, s + t(rng.uniform(0, 30)),
                               thread=rng.choice(["allreduce", "allgather", "push_pull"])))
        if rng.random() < 0.2:      # through the next iterations
            events.append(span("push_pull", "comm", start + 1.0, t(start + rng.uniform(50, 300)),
                               thread="push_pull"))
        events.append(("w", "ready", "gradients", t(rng.uniform(a, b)), None, {"bytes": 4}))
        events.append(span("encode", "codec", b, b + 1.0, thread="compressor"))
        now = end + t(rng.choice([0, rng.uniform(0, 10), -rng.uniform(0, 3)]))
    events.append(span("synchronize", "wait", now, now + t(rng.uniform(1, 9))))
    events.append(span("allreduce", "comm", now - 50.0, now + 20.0, thread="allreduce"))
    rng.shuffle(events)
    return events


def _brute_force(events, start, end):
    """The metrics of window [start, end] cut at every span's end points: each piece is the
    innermost training-thread span's covering it (the latest started, then the shortest, then
    the later listed, its length as clipped to the window; as ``innermost`` has always read
    them, a span of no length is innermost from its point to the training thread's next end
    point) and communication where any comm span covers it."""
    def clip(e):
        return max(e[3], start), min(e[4], end)

    def overlaps(e):
        return e[4] is not None and e[4] > start and e[3] < end
    main = [(i, *clip(e), e[1]) for i, e in enumerate(events)
            if e[2] == MAIN and e[1] in ("compute", "wait") and overlaps(e)]
    comm = [clip(e) for e in events if e[1] == "comm" and overlaps(e)]
    ends = {p for _, a, b, _ in main for p in (a, b)}
    points = sorted(ends | {p for c in comm for p in c})
    t = dict.fromkeys(("compute", "wait", "comm", "hidden", "comm_wait"), 0.0)
    for p, q in zip(points, points[1:]):
        last = max((x for x in ends if x <= p), default=None)
        cover = [(a, -(b - a), i, cat) for i, a, b, cat in main
                 if a <= p < b or a == b == last]
        label = max(cover)[3] if cover else None
        if label:
            t[label] += q - p
        if any(a <= p < b for a, b in comm):
            t["comm"] += q - p
            if label:
                t["hidden" if label == "compute" else "comm_wait"] += q - p
    c, w, m, hidden, cw = t["compute"], t["wait"], t["comm"], t["hidden"], t["comm_wait"]
    return {"iteration_s": (end - start) * US, "compute_s": c * US, "wait_s": w * US,
            "comm_s": m * US, "hidden_s": hidden * US, "exposed_s": (m + w - cw - hidden) * US,
            "overlap": hidden / m if m > 0 else None,
            "idle_s": max(0.0, (end - start) - (c + w + m - hidden - cw)) * US}


@pytest.mark.parametrize("grid", [1.0, None])
def test_overlap_metrics_match_a_brute_force_reference(grid):
    rng = random.Random(47)
    events = _random_rank(rng, 60, grid)
    got = tl.overlap(events)
    iters = sorted((e for e in events if e[1] == "iteration"), key=lambda e: e[3])
    assert got["iterations"] == len(iters) == 60
    for e, m in zip(iters, got["per_iteration"]):
        # Bit for bit the metrics of the window alone, from every event (the definition).
        assert m == tl.iteration_metrics(events, e[3], e[4])
        ref = _brute_force(events, e[3], e[4])
        if grid:    # whole microseconds: every sum exact
            assert m == ref
        else:
            assert (m["overlap"] is None) == (ref["overlap"] is None)
            assert {k: v for k, v in m.items() if k != "overlap"} == pytest.approx(
                {k: v for k, v in ref.items() if k != "overlap"}, rel=1e-9, abs=1e-15)
            if m["overlap"] is not None:
                assert m["overlap"] == pytest.approx(ref["overlap"], rel=1e-9, abs=1e-12)
    # Each communication span's exposed part: its length less its overlap with the innermost
    # compute of the whole rank, added up piece by piece; longest exposed first, then earlier.
    main = [(e[3], e[4], e[1]) for e in events if e[2] == MAIN and e[1] in ("compute", "wait")]
    compute = tl.innermost(main).get("compute", [])
    ends = {(e[3], e[4] - e[3], e[2]): e[4] for e in events if e[1] == "comm"}
    spans = tl.exposed_spans(events, None)
    assert sorted((s["start_us"], s["duration_us"], s["thread"]) for s in spans) == \
        sorted(e[3:4] + (e[4] - e[3], e[2]) for e in events if e[1] == "comm")
    for s in spans:
        t0, t1 = s["start_us"], ends[(s["start_us"], s["duration_us"], s["thread"])]
        hidden = sum(max(0.0, min(t1, b) - max(t0, a)) for a, b in compute)
        assert s["exposed_us"] == pytest.approx((t1 - t0) - hidden, rel=1e-12, abs=1e-9)
        assert s["exposed_us"] == (t1 - t0) - tl.measure(tl.intersect([(t0, t1)], compute))
    assert [(-s["exposed_us"], s["start_us"]) for s in spans] == \
        sorted((-s["exposed_us"], s["start_us"]) for s in spans)
    assert tl.exposed_spans(events, 5) == spans[:5] and tl.exposed_spans(events, 0) == []


class _Counted(float):
    """A timestamp that counts the comparisons made with it: the work of sorting, searching and
    cutting spans."""
    count = 0

    def __lt__(self, other):
        _Counted.count += 1
        return float.__lt__(self, other)

    def __le__(self, other):
        _Counted.count += 1
        return float.__le__(self, other)

    def __gt__(self, other):
        _Counted.count += 1
        return float.__gt__(self, other)

    def __ge__(self, other):
        _Counted.count += 1
        return float.__ge__(self, other)


def _work(iterations):
    events = [(n, c, th, _Counted(a), None if b is None else _Counted(b), x)
              for n, c, th, a, b, x in _random_rank(random.Random(iterations), iterations)]
    _Counted.count = 0
    m = tl.overlap(events)
    tl.exposed_spans(events, 10)
    tl.exposed_spans(events, None)
    assert m["iterations"] == iterations
    return _Counted.count


def test_the_work_grows_about_linearly_with_the_trace():
    # Every iteration against every event (the 8 MB in 3 s, 200 MB in hours) is 16
    # times the work for 4 times the trace; sorting once is a little over 4.
    small, large = _work(250), _work(1000)
    assert large < 6 * small, (small, large)


def _bad_events(tmp_path, name, text):
    path = tmp_path / name
    path.write_text('{"traceEvents": [{"ph": "X", "name": "iteration", "cat": "iteration", '
                    '"pid": 0, "tid": 1, "ts": 0, "dur": 10}, ' + text + "]}")
    return str(path)


@pytest.mark.parametrize("event,message", [
    ('{"ph": "X", "name": "forward", "pid": 0, "tid": 1, "ts": NaN, "dur": 1}',
     "traceEvents[1] ('X' 'forward') has ts nan, not a finite number"),
    ('{"ph": "X", "name": "forward", "pid": 0, "tid": 1, "ts": 1, "dur": -1e308}',
     "traceEvents[1] ('X' 'forward') has a negative dur (-1e+308)"),
    ('{"ph": "X", "name": "forward", "pid": 0, "tid": 1, "ts": 1, "dur": -1}',
     "traceEvents[1] ('X' 'forward') has a negative dur (-1)"),
    ('{"ph": "X", "name": "f", "pid": 0, "tid": 1, "ts": 1, "dur": Infinity}',
     "traceEvents[1] ('X' 'f') has dur inf, not a finite number"),
    ('{"ph": "i", "name": "w", "pid": 0, "tid": 1, "ts": -Infinity}',
     "traceEvents[1] ('i' 'w') has ts -inf, not a finite number"),
    ('{"ph": "i", "name": "w", "pid": 0, "tid": 1, "ts": 1' + "0" * 400 + "}",
     "traceEvents[1] ('i' 'w') has ts 100000000000000000000..., not a finite number"),
    ('{"ph": "X", "name": "f", "pid": 0, "tid": 1, "ts": 1e308, "dur": 1e308}',
     "traceEvents[1] ('X' 'f') ends past the largest number (ts 1e+308 + dur 1e+308)"),
    ('{"ph": "X", "name": "f", "pid": [0], "tid": 1, "ts": 1, "dur": 1}',
     "traceEvents[1] ('X' 'f') has a pid that is a JSON array, not a number or a string"),
    ('{"ph": "X", "name": "f", "pid": 0, "tid": {}, "ts": 1, "dur": 1}',
     "traceEvents[1] ('X' 'f') has a tid that is a JSON object, not a number or a string"),
    ('{"ph": "X", "name": "f", "pid": 0, "tid": 1, "ts": 1, "dur": 1, "args": {"a": '
     + "[" * 100000 + "]" * 100000 + "}}", "is JSON nested too deeply to decode"),
])
def test_non_finite_times_and_deep_nesting_are_one_line_and_exit_2(tmp_path, capsys, event,
                                                                   message):
    path = _bad_events(tmp_path, "bad.json", event)
    assert cli.main([path]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.count("\n") == 1, err
    assert err.startswith(f"ddlbench.timeline: error: {path}") and message in err, err
    with pytest.raises(tl.UsageError, match="nested too deeply|finite|negative|JSON"):
        tl.read(path)


def test_deeply_nested_json_through_the_entry_point_is_one_line(tmp_path):
    nested = tmp_path / "nested.json"
    nested.write_text("[" * 100000 + "]" * 100000)
    deep_meta = tmp_path / "meta.json"
    deep_meta.write_text('{"traceEvents": [], "metadata": ' + "{\"a\": " * 50000 + "1"
                         + "}" * 50000 + "}")
    for path in (nested, deep_meta):
        proc = subprocess.run([sys.executable, "-m", "ddlbench.timeline", str(path)], cwd=REPO,
                              capture_output=True, text=True, timeout=60)
        assert proc.returncode == 2 and proc.stdout == "", proc.stderr
        assert proc.stderr == (f"ddlbench.timeline: error: {path} is JSON nested too deeply "
                               "to decode\n")
    with pytest.raises(tl.UsageError, match="nested too deeply"):
        tl.load(str(nested))


def test_values_too_deep_to_print_are_one_line(tmp_path, capsys, monkeypatch):
    path = tmp_path / "t.json"
    tl.write(str(path), make_trace())

    def too_deep(*_args, **_kwargs):
        raise RecursionError("maximum recursion depth exceeded")
    monkeypatch.setattr(cli, "format_summary", too_deep)
    assert cli.main([str(path)]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err == (f"ddlbench.timeline: error: {path}: values nested too deeply "
                                 "to print\n")


def test_a_file_read_event_by_event_is_the_object_read_whole(tmp_path):
    obj = make_trace()
    plain, spaced, odd = tmp_path / "plain.json", tmp_path / "spaced.json", tmp_path / "odd.json"
    tl.write(str(plain), obj)
    spaced.write_text(" \n" + json.dumps(obj, indent=3) + "\n\t")
    # Members in another order, the events' list given twice (JSON: the last one counts).
    odd.write_text('{"metadata": {"method": "x"}, "traceEvents": [3], "displayTimeUnit": "ms",'
                   ' "traceEvents": ' + json.dumps(obj["traceEvents"]) + "}")
    whole = tl.read(obj)
    for path in (plain, spaced, odd):
        assert tl.read(str(path)) == whole == tl.read(tl.load(str(path)))
        assert tl.read_trace(str(path))[0] == whole
    assert tl.read_trace(str(odd))[1] == {"method": "x"}
    assert cli.summarize(str(plain), 3) == cli.summarize(tl.load(str(plain)), 3, str(plain))
    for text, message in (('{"traceEvents": [], "traceEvents": {}}', "is not a trace-event "
                                                                      "object"),
                          ('{"traceEvents": [1,]}', "is not JSON (Expecting value"),
                          ('{"traceEvents": []} x', "is not JSON (Extra data"),
                          ('{"traceEvents": [5], "traceEvents": []}', "has no iteration spans")):
        odd.write_text(text)
        with pytest.raises(tl.UsageError) as info:
            cli.summarize(str(odd))
        assert message in str(info.value)


def test_an_iteration_without_an_end_is_not_an_iteration():
    instant = ("iteration", "iteration", MAIN, 50.0, None, {"index": 9})
    assert tl.overlap(RANK0 + [instant]) == tl.overlap(RANK0)
    assert tl.overlap([instant, span("forward", "compute", 0, 100)]) is None

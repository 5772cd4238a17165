"""Checks of a run's merged Chrome trace (--timeline PATH) and its record's timeline section,
shared by the tests whose benchmark or verification runs also write one (every method at 2 and
3 workers, without runs of their own: tests/test_timeline.py says which test carries which)."""
import json

MAIN = "training"


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
            while stack and stack[-1] <= e["ts"] + 1e-3:   # (ts + dur: float sums, in us)
                stack.pop()
            assert not stack or end <= stack[-1] + 1e-3, ("spans overlap on a row", key, e)
            stack.append(end)
        out[(key[0], names[key])] = evs
    return out


def collectives(rows, pid):
    """(start, name, bytes) of a rank's communication spans, in start order."""
    return sorted(((e["ts"], e["name"], e.get("args", {}).get("bytes"))
                   for (p, _), evs in rows.items() if p == pid
                   for e in evs if e.get("cat") == "comm"))


def check_run_trace(path, nworkers: int, iters: int, observed: bool = True,
                    same_collectives: bool = True) -> dict:
    """A run's trace file: valid; on every worker ``iters`` iterations indexed 0.., the
    training thread's forward, backward, step and synchronize; its communication (where the
    suite observes it: not DDP's) inside the timed run; with ``same_collectives`` (all-reduce
    methods) the same sequence of collectives on every rank. Returns the rows."""
    with open(path) as f:
        rows = check_trace(json.load(f))
    for rank in range(nworkers):
        main = rows[(rank, MAIN)]
        its = [e for e in main if e["name"] == "iteration"]
        assert [e["args"]["index"] for e in its] == list(range(iters)), rank
        start = its[0]["ts"]
        end = max(e["ts"] + e["dur"] for e in main if e["ph"] == "X")
        comm = [e for (p, _), evs in rows.items() if p == rank for e in evs
                if e.get("cat") == "comm"]
        if nworkers > 1:
            assert bool(comm) == observed, (rank, sorted(rows))
        # Nothing of the warm-up, nothing after the run's last synchronize.
        assert all(start <= e["ts"] and e["ts"] + e["dur"] <= end + 1 for e in comm), rank
        assert {e["name"] for e in main} >= {"forward", "backward", "step", "synchronize"}
    if same_collectives:
        seqs = [[(n, b) for _, n, b in collectives(rows, r)] for r in range(nworkers)]
        assert all(s == seqs[0] for s in seqs), seqs
    return rows


def check_record(section: dict, nworkers: int, iters: int, path=None,
                 observed: bool = True) -> None:
    """The record's ``timeline`` section of the same run."""
    assert section["recorded_iterations"] == iters
    assert section["comm_observed"] == observed
    assert set(section["per_rank"]) == {str(r) for r in range(nworkers)}
    m = section["mean"]
    assert m["compute_s"] > 0 and m["iteration_s"] >= m["compute_s"]
    if observed:
        assert 0 <= m["overlap"] <= 1 and m["comm_s"] > 0
        assert m["hidden_s"] + m["exposed_s"] >= m["comm_s"] - 1e-9
    else:
        assert m["comm_s"] == 0 and m["overlap"] is None
    assert section["trace"] == (None if path is None else str(path))


PS_METHODS = ("bspps", "wfbpps", "byteschedulerps", "byteschedulerps-worker")


def verify_timeline(tmp_path) -> list[str]:
    """The flag that makes a --verify run write one trace per method under ``tmp_path``."""
    return ["--timeline", str(tmp_path / "{method}.trace.json")]


def check_verify_traces(tmp_path, stdout: str, methods, nworkers: int, steps: int) -> dict:
    """Each method's trace of a --verify run made with ``verify_timeline``: named on the
    console, valid, ``steps`` iterations on every rank, its collectives observed (DDP's too: a
    trace file routes its buckets through the suite's hook) and, for all-reduce methods, the
    same on every rank. Returns {method: rows}."""
    out = {}
    for method in methods:
        path = tmp_path / f"{method}.trace.json"
        assert f"verify {method}: timeline {path}" in stdout, method
        out[method] = check_run_trace(path, nworkers, steps,
                                      same_collectives=method not in PS_METHODS)
    return out

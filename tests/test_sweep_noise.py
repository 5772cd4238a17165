"""Noise control (issue 19): tries interleaved round-robin over the cells in a seeded order,
medians with 95% intervals, ties and the noise floor in the reports, and local processes
pinned to cores of their own.

Sweeps here run tests/fake_train.py (DDLBENCH_SWEEP_PROGRAM); reports come from hand-written
stores; the pinning tests spawn tests/affinity_probe.py (no torch) and one real 2-worker
comm_bench job.
"""
import json
import os
import re
import signal
import subprocess
import sys
import time

import pytest

import benchmarks
from ddlbench.errors import UsageError
from ddlbench.hosts import pinning
from ddlbench.sweep import aggregate, config, execute, plots, report, store

from .conftest import REPO, describe, env, run
from .fake_train import throughput as fake_throughput
from .test_sweep import FAKE, _line, folders, try_lines, write_config

CORES = pinning.available_cores()


# ------------------------------------------------------------------------------ pinning

def _cpu_list(text: str) -> list[int]:
    """/proc's Cpus_allowed_list ("0-3,8") as a list."""
    out = []
    for part in text.split(","):
        lo, _, hi = part.partition("-")
        out += range(int(lo), int(hi or lo) + 1)
    return out


def test_split_and_plan():
    assert pinning.split(2, [0, 1]) == [[0], [1]]
    assert pinning.split(3, list(range(8))) == [[0, 1], [2, 3], [4, 5]]
    assert pinning.split(3, [0, 1]) is None
    p = pinning.plan(2, 1, cores=[4, 5, 6, 7])
    assert p["pinning"] == "pinned" and p["machine_cores"] == 4
    assert [(r["role"], r["cores"]) for r in p["ranks"]] == [("worker", [4]), ("worker", [5]),
                                                            ("server", [6])]
    # 2 workers fit 2 cores, a server too does not: the workers pinned, the server on both
    p = pinning.plan(2, 1, cores=[0, 1])
    assert p["pinning"] == "workers"
    assert p["reason"] == "2 workers on 2 cores: 1 core each; 1 server on all of them"
    assert [(r["role"], r["cores"]) for r in p["ranks"]] == [("worker", [0]), ("worker", [1]),
                                                            ("server", [0, 1])]
    p = pinning.plan(4, 0, cores=[0, 1])
    assert p["pinning"] == "shared" and p["reason"] == "4 workers share 2 cores"
    assert all(r["cores"] == [0, 1] for r in p["ranks"])
    assert pinning.plan(2, 0, pin=False, cores=[0, 1])["pinning"] == "off"
    assert not pinning.enabled({"DDLBENCH_PIN": "0"}) and pinning.enabled({})


def _probe(tmp_path, monkeypatch, nprocs, **kw):
    """Spawn ``nprocs`` affinity probes through the local spawner; each one's report."""
    from ddlbench.launch.local import spawn_local
    out = tmp_path / f"probe{len(list(tmp_path.glob('probe*')))}"
    monkeypatch.setenv("AFFINITY_OUT", str(out))
    monkeypatch.chdir(REPO)
    assert spawn_local(nprocs, [], module="tests.affinity_probe", **kw) == 0
    return [json.load(open(f"{out}.{r}.json")) for r in range(nprocs)]


def test_the_spawner_pins_each_process_before_it_starts(tmp_path, monkeypatch):
    """As many processes as cores: each runs on one core of its own from the start (its
    Cpus_allowed_list), and learns the plan; one more than the cores, or --no-pin, or
    DDLBENCH_PIN=0: none is pinned, and the plan says why."""
    monkeypatch.delenv("DDLBENCH_PIN", raising=False)
    n = min(len(CORES), 8)
    got = _probe(tmp_path, monkeypatch, n)
    expected = pinning.split(n, CORES)
    assert [_cpu_list(g["cpus_allowed_list"]) for g in got] == expected
    assert [g["affinity"] for g in got] == expected
    assert len({tuple(c) for c in expected}) == n  # distinct
    assert all(g["plan"]["pinning"] == "pinned" for g in got)
    assert [r["cores"] for r in got[0]["plan"]["ranks"]] == expected
    shared = _probe(tmp_path, monkeypatch, len(CORES) + 1)
    assert all(g["affinity"] == CORES for g in shared)
    assert shared[0]["plan"]["pinning"] == "shared"
    assert shared[0]["plan"]["reason"] == f"{len(CORES) + 1} workers share {len(CORES)} " \
        f"core{'s' if len(CORES) > 1 else ''}"
    off = _probe(tmp_path, monkeypatch, 1, pin=False)
    assert off[0]["affinity"] == CORES and off[0]["plan"]["pinning"] == "off"
    monkeypatch.setenv("DDLBENCH_PIN", "0")
    off = _probe(tmp_path, monkeypatch, 1)
    assert off[0]["affinity"] == CORES and off[0]["plan"]["pinning"] == "off"


def test_pinning_holds_in_an_emulated_network(tmp_path, monkeypatch):
    """Under --net each process starts through `ip netns exec`: the affinity set between
    fork and exec is kept."""
    from ddlbench import netem
    reason = netem.unavailable_reason()
    if reason is not None or len(CORES) < 2:
        pytest.skip(reason or "one core")
    monkeypatch.setenv("DDLBENCH_NET_PROBE_S", "0")
    got = _probe(tmp_path, monkeypatch, 2, net="1gbit")
    assert [g["affinity"] for g in got] == pinning.split(2, CORES)
    assert got[0]["netns"] != os.readlink("/proc/self/ns/net")  # really in a namespace


def test_two_workers_of_a_real_job_are_pinned_and_recorded(tmp_path):
    """A real 2-worker job (comm_bench, the cheapest): each worker's cores, as it read them,
    in the record; one intra-op thread per core it got."""
    rec = tmp_path / "cb.json"
    proc = run([sys.executable, "-m", "ddlbench.measure.comm_bench", "--nworkers", "2", "--ops",
                "allreduce", "--max-bytes", "4K", "--iters", "1", "--warmup", "0",
                "--output", str(rec)], timeout=120)
    assert proc.returncode == 0, describe(proc)
    env_ = json.load(open(rec))["environment"]
    placement = env_["placement"]
    expected = pinning.split(2, CORES)
    if expected is None:  # one core: shared
        assert placement["pinning"] == "shared"
        return
    assert placement["pinning"] == "pinned" and placement["machine_cores"] == len(CORES)
    assert [r["cores"] for r in placement["ranks"]] == expected
    assert expected[0] != expected[1]
    assert env_["threads_per_worker"] == len(expected[0])


# ------------------------------------------------------------------------ the order of tries

@pytest.fixture
def calls(monkeypatch, tmp_path):
    """The fake training program's starts, "method nworkers" each, in order."""
    path = tmp_path / "calls.txt"
    monkeypatch.setenv(config.PROGRAM_ENV, FAKE)
    monkeypatch.setenv("FAKE_TRAIN_CALLS", str(path))
    for k in ("FAKE_TRAIN_FIXED", "FAKE_TRAIN_SECONDS"):
        monkeypatch.delenv(k, raising=False)
    return lambda: path.read_text().splitlines() if path.exists() else []


def _expected(sweep, seed, tries):
    """(cell, try) in the order a sweep must run them: round by round, each round's cells in
    the order of the SHA-256 of seed, round and cell hash (worked out here, not by the
    suite's code)."""
    import hashlib
    out = []
    for i in range(tries):
        cells = sorted(sweep.cells(), key=lambda c: hashlib.sha256(
            f"{seed}:{i}:{c.hash}".encode()).hexdigest())
        out += [(c, i) for c in cells]
    return out


def _call(cell):
    return f"{cell.method['method']} {cell.nworkers}"


def test_tries_run_round_robin_each_round_shuffled_by_the_seed(tmp_path, calls, capsys):
    cfg = write_config(tmp_path, methods=["wfbp", "fusion", "ddp"], nworkers=[1, 2], tries=3,
                       seed=7)
    sweep = config.load(str(cfg), preflight=False)
    expected = _expected(sweep, 7, 3)
    rounds = [[c.name for c, i in expected if i == r] for r in range(3)]
    # shuffled: not the sweep file's order, and not the same order every round
    assert rounds[0] != [c.name for c in sweep.cells()]
    assert rounds[0] != rounds[1] or rounds[1] != rounds[2]
    assert [(c.name, i) for c, i in expected] == \
        [(t.cell.name, t.try_index) for t in execute.pending(sweep.cells(), 3, [], False, 7)[0]]
    # --dry-run shows that order
    assert benchmarks.main(["--config", str(cfg), "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "each round shuffled by seed 7 (the sweep file's seed)" in out
    shown = [ln.split(":")[0] for ln in out.splitlines() if ln.startswith("local_")]
    assert shown == [f"{c.name} try {i}" for c, i in expected]
    assert benchmarks.main(["--config", str(cfg), "--quiet"]) == 0
    assert calls() == [_call(c) for c, _ in expected]
    [folder] = folders(tmp_path)
    assert [(e["hash"], e["try"]) for e in try_lines(folder)] == \
        [(c.hash, i) for c, i in expected]
    [header] = store.headers(store.read(os.path.join(folder, "results.jsonl"))[0])
    assert header["seed"] == 7 and header["seed_source"] == "the sweep file's seed"


def test_the_seed_is_chosen_once_recorded_and_kept(tmp_path, calls, capsys):
    """Without a seed in the sweep file: the dry run names the one the store will get and its
    order is the order run; a resumed sweep keeps the recorded seed."""
    cfg = write_config(tmp_path, methods=["wfbp", "fusion"], nworkers=[1, 2], tries=2)
    sweep = config.load(str(cfg), preflight=False)
    assert benchmarks.main(["--config", str(cfg), "--dry-run"]) == 0
    out = capsys.readouterr().out
    line = next(ln for ln in out.splitlines() if ln.startswith("order: "))
    seed = int(line.split("seed ")[1].split()[0])
    assert "(chosen for this store from its folder's name)" in line
    shown = [ln.split(":")[0] for ln in out.splitlines() if ln.startswith("local_")]
    expected = _expected(sweep, seed, 2)
    assert shown == [f"{c.name} try {i}" for c, i in expected]
    # the first round only, then the rest
    assert benchmarks.main(["--config", str(cfg), "--quiet", "--only", "nworkers=1"]) == 0
    assert benchmarks.main(["--config", str(cfg), "--quiet"]) == 0
    [folder] = folders(tmp_path)
    heads = store.headers(store.read(os.path.join(folder, "results.jsonl"))[0])
    assert [h["seed"] for h in heads] == [seed, seed]
    assert [h["seed_source"] for h in heads] == [
        "chosen for this store from its folder's name", "recorded in the store"]
    first = [x for x in expected if x[0].nworkers == 1]
    rest = [x for x in expected if x[0].nworkers != 1]
    assert calls() == [_call(c) for c, _ in first + rest]


@pytest.mark.parametrize("shared", [False, True], ids=["a-job-per-try", "shared-jobs"])
def test_a_sweep_killed_mid_try_resumes_without_repeating_or_skipping(tmp_path, monkeypatch,
                                                                     shared):
    """Killed with kill -9 inside a job (of one try, or with shared jobs of a round's tries of
    one worker count: wfbp and fusion, 2 each) and run again: the store holds every try once,
    in the planned order; the killed job (none of whose tries reached the store) ran again."""
    monkeypatch.setenv(config.PROGRAM_ENV, FAKE)  # part of each cell's hash, as in the sweep
    cfg = write_config(tmp_path, methods=["wfbp", "fusion"], nworkers=[1, 2], tries=2,
                       shared_jobs=shared)
    sweep = config.load(str(cfg), preflight=False)
    calls = tmp_path / "calls.txt"
    run_env = env(**{config.PROGRAM_ENV: FAKE, "FAKE_TRAIN_SECONDS": "0.6",
                     "FAKE_TRAIN_CALLS": str(calls)})
    cmd = [sys.executable, "benchmarks.py", "--config", str(cfg), "--quiet"]
    proc = subprocess.Popen(cmd, cwd=REPO, env=run_env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    before = 4 if shared else 5   # tries in the store before the kill: 2 jobs, or 5 tries
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        found = folders(tmp_path)
        inflight = os.path.join(found[0], "inflight.json") if found else ""
        if found and os.path.exists(os.path.join(found[0], "results.jsonl")) \
                and len(try_lines(found[0])) >= before and os.path.exists(inflight):
            break
        time.sleep(0.05)
    else:
        proc.kill()
        pytest.fail("the sweep never reached its next job: " + proc.communicate()[1])
    time.sleep(0.2)  # inside the job (each of its tries takes 0.6 s)
    proc.send_signal(signal.SIGKILL)
    proc.communicate()
    folder = found[0]
    done = len(try_lines(folder))
    seed = store.headers(store.read(os.path.join(folder, "results.jsonl"))[0])[0]["seed"]
    expected = _expected(sweep, seed, 2)
    jobs = _jobs_by_hand(expected) if shared else [[x] for x in expected]
    assert [len(j) for j in jobs] == ([2] * 4 if shared else [1] * 8)
    ends = [sum(len(j) for j in jobs[:k + 1]) for k in range(len(jobs))]
    assert done in ends and before <= done < 8   # whole jobs only
    killed = ends.index(done) + 1                # the job that was going (from 0)
    again = subprocess.run(cmd, cwd=REPO, env=run_env, capture_output=True, text=True,
                           timeout=120)
    assert again.returncode == 0, describe(again)
    assert folders(tmp_path) == [folder]
    # the store: every try once, in the planned order
    assert [(e["hash"], e["try"]) for e in try_lines(folder)] == \
        [(c.hash, i) for job in jobs for c, i in job]
    # the starts: the killed job started twice (none of its tries reached the store)
    started = calls.read_text().splitlines()
    order = [_job_call(job) for job in jobs]
    assert started == order[:killed + 1] + order[killed:]


# ------------------------------------------------------------- medians, intervals and ties

R18 = {"model": "resnet18", "batch_size": 16}


def _try(h, method, n, i, thr, rounds=None, placement=None, compressor=None, arch="a2a"):
    e = _line(h, "1gbit", R18, method, arch, n, i, "ok", thr)
    if compressor:
        e["config"]["method"]["compressor"] = compressor
        e["label"] = f"{method} compressor={compressor}"
    if rounds is not None:
        e["record"]["result"] = {"total_throughput": rounds}
    if placement is not None:
        e["record"]["environment"]["placement"] = placement
    return e


SHARED = {"pinning": "shared", "reason": "4 workers share 2 cores", "machine_cores": 2,
          "workers": 4, "servers": 0, "ranks": []}
PINNED = {"pinning": "pinned", "reason": "2 workers on 2 cores: 1 core each",
          "machine_cores": 2, "workers": 2, "servers": 0, "ranks": []}


def noisy_store(folder):
    """ResNet-18 on 1gbit: wfbp, fusion and ddp at 1, 2 and 4 workers, fusion with fp16 and
    bspps at 1 worker. 3 tries each at 1 and 2 workers (the interval over tries: [min, max]
    with 3), 1 or 2 at 4 workers with per-round throughputs (the interval over rounds); the
    4-worker runs shared 2 cores."""
    os.makedirs(folder, exist_ok=True)
    header = {"kind": "sweep", "name": "noise", "tries": 3, "min_ok": 1, "aggregate": "mean",
              "seed": 3, "networks": [{"name": "1gbit", "kind": "net", "profile": "1gbit"}],
              "tasks": [R18], "engines": ["torch"], "nworkers": [1, 2, 4],
              "methods": [{"method": "wfbp"}, {"method": "fusion"}, {"method": "ddp"},
                          {"method": "fusion", "compressor": "fp16"}, {"method": "bspps"}]}
    T = _try
    lines = [header]
    for h, m, n, values in (("w1", "wfbp", 1, (124.8, 120.0, 130.0)),
                            ("f1", "fusion", 1, (109.2, 105.0, 112.0)),
                            ("d1", "ddp", 1, (98.9, 95.0, 101.0)),
                            ("w2", "wfbp", 2, (200.0, 210.0, 220.0)),
                            ("f2", "fusion", 2, (215.0, 205.0, 225.0)),
                            ("d2", "ddp", 2, (150.0, 150.0, 150.0))):
        lines += [T(h, m, n, i, v, placement=PINNED if n == 2 else None)
                  for i, v in enumerate(values)]
    lines += [T("c1", "fusion", 1, i, 150.0, compressor="fp16") for i in range(3)]
    lines += [T("p1", "bspps", 1, i, 60.0, arch="ps") for i in range(3)]
    lines += [T("w4", "wfbp", 4, 0, 320.0, rounds=[300.0, 340.0], placement=SHARED),
              T("f4", "fusion", 4, 0, 255.0, rounds=[250.0, 260.0], placement=SHARED),
              T("d4", "ddp", 4, 0, 210.0, rounds=[200.0, 220.0], placement=SHARED),
              T("d4", "ddp", 4, 1, 210.0, rounds=[210.0, 210.0], placement=SHARED),
              _line("d4", "1gbit", R18, "ddp", "a2a", 4, 2, "failed")]
    header["cells"] = list(dict.fromkeys(e["hash"] for e in lines[1:]))
    with open(os.path.join(folder, "results.jsonl"), "w") as f:
        f.writelines(json.dumps(e) + "\n" for e in lines)
    return folder


# By hand: 3 tries give [min, max] (a resample's median is the smallest value with
# probability 7/27, so at least 51 of 2000 are); one try with rounds [a, b] gives [a, b] (a
# resample's mean is a with probability 1/4); ddp's two tries at 4 workers, rounds
# [200, 220] and [210, 210]: the median of the two means is 205, 210 or 215 (1/4, 1/2, 1/4).
# Ties: at 1 worker fusion+fp16's [150, 150] is apart from every other interval (best); at 2
# fusion's [205, 225] overlaps wfbp's [200, 220] (tied), ddp's [150, 150] is apart; at 4
# wfbp's [300, 340] is apart from [250, 260] and [205, 215] (best).
_ROW = "| ResNet-18 | 16 | 1gbit (emulated) | "
EXPECTED_INTERVALS = "".join([
    "| DNN | BS | CONNECTION | METHOD | 1 GPU | 2 GPUs | 4 GPUs |\n",
    "| --- | --- | --- | --- | --- | --- | --- |\n",
    _ROW + "wfbp | 124.8 [120.0, 130.0] | 210.0 [200.0, 220.0] (tied) | "
    "320.0 [300.0, 340.0] (rounds) (best) |\n",
    _ROW + "fusion | 109.2 [105.0, 112.0] | 215.0 [205.0, 225.0] (tied) | "
    "255.0 [250.0, 260.0] (rounds) |\n",
    _ROW + "ddp | 98.9 [95.0, 101.0] | 150.0 [150.0, 150.0] | "
    "210.0 [205.0, 215.0] (rounds) |\n",
    _ROW + "fusion compressor=fp16 | 150.0 [150.0, 150.0] (best) | - | - |\n",
    _ROW + "bspps | 60.0 [60.0, 60.0] | - | - |\n"])
# The all-to-all methods without a compressor at 1 worker: 124.8 / 98.9 = 1.2619
EXPECTED_FLOOR = ("Noise floor: at 1 worker the all-to-all methods without a compressor do "
                  "the same work, so the max/min ratio of their medians is noise: ResNet-18, "
                  "batch 16, 1gbit (emulated): 1.262 (wfbp 124.8 / ddp 98.9; of wfbp, fusion, "
                  "ddp).")
EXPECTED_SHARED = ("4 workers share 2 cores: compute contention is part of every figure of "
                   "theirs (the 4-worker cells).")


def test_workers_pinned_beside_a_floating_server_are_said_so(tmp_path):
    """2-worker tries of wfbp and fusion ran beside a parameter server on every core (a job
    shared with a PS method), ddp's pinned alone: one line for the former, none for ddp; the
    4-worker tries' shared line stays."""
    folder = noisy_store(str(tmp_path / "noise"))
    entries, _ = store.read(os.path.join(folder, "results.jsonl"))
    beside = dict(PINNED, pinning="workers", servers=1,
                  reason="2 workers on 2 cores: 1 core each; 1 server on all of them")
    for e in entries:
        if e.get("kind") == "try" and e["config"]["nworkers"] == 2 and e["label"] != "ddp":
            e["record"]["environment"]["placement"] = beside
    assert report.contention_lines(aggregate.build(entries)) == [
        EXPECTED_SHARED,
        "2 workers pinned to cores of their own and 1 parameter server on all 2 cores (the "
        "2-worker cells of fusion and wfbp): a server sums only under a parameter-server "
        "method, whose figures then include its contention for the workers' cores."]


def test_intervals_ties_and_the_noise_floor_from_a_hand_written_store(tmp_path, capsys):
    folder = noisy_store(str(tmp_path / "noise"))
    assert benchmarks.main(["report", folder, "--no-plots"]) == 0
    out = capsys.readouterr().out
    assert EXPECTED_INTERVALS in out and EXPECTED_FLOOR in out
    readme = open(os.path.join(folder, "README.md")).read()
    assert "## Medians and 95% intervals" in readme
    assert EXPECTED_INTERVALS in readme and EXPECTED_FLOOR in readme
    head = readme.split("## Throughput")[0]
    assert EXPECTED_SHARED in head
    # the original's table is untouched: mean +- std
    assert "| ResNet-18 | 16 | 1gbit (emulated) | wfbp | 124.9 +- 4.08 | 210.0 +- 8.16 | " \
        "320.0 +- 0.00 |" in readme
    t = aggregate.load(folder)
    by = {(r.label, n): s for r in t.rows for n, s in r.cells.items()}
    assert by[("wfbp", 1)].basis == "tries" and by[("wfbp", 4)].basis == "rounds"
    rk = aggregate.ranking(t.rows, 2)
    assert rk.best.label == "fusion" and [r.label for r in rk.tied] == ["wfbp"]
    assert not rk.distinguishable
    assert aggregate.ranking(t.rows, 4).best.label == "wfbp"
    assert aggregate.ranking(t.rows, 4).distinguishable
    [floor] = aggregate.noise_floor(t)
    assert floor.ratio == pytest.approx(124.8 / 98.9)
    # Without 1-worker cells there is no noise floor line.
    entries, _ = store.read(os.path.join(folder, "results.jsonl"))
    report.write_all(folder, plots=False, entries=[
        e for e in entries if e.get("kind") != "try" or e["config"]["nworkers"] != 1])
    readme = open(os.path.join(folder, "README.md")).read()
    assert "Noise floor" not in readme and "## Medians and 95% intervals" in readme


def test_median_interval_by_hand():
    """7 tries: the 2.5th percentile of 2000 resampled medians is the second smallest value
    (P(median = smallest) = P(4 or more of 7 draws are it) = 0.010, P(median <= second) =
    0.108), the 97.5th the second largest; equal values, a point; one try with no per-round
    figures, no interval; the same key, the same figures."""
    values = [7.0, 1.0, 5.0, 3.0, 6.0, 2.0, 4.0]
    assert aggregate.median_interval(values, None, "k") == (4.0, 2.0, 6.0, "tries")
    assert aggregate.median_interval([5.0] * 3, None, "k") == (5.0, 5.0, 5.0, "tries")
    assert aggregate.median_interval([5.0], None, "k") == (5.0, None, None, None)
    assert aggregate.median_interval([5.0, 7.0], [[4.0, 6.0], [7.0, 7.0]], "k") == \
        (6.0, 5.5, 6.5, "rounds")
    a = aggregate.median_interval([1.0, 2.0, 3.0, 4.0], None, "x")
    assert a == aggregate.median_interval([1.0, 2.0, 3.0, 4.0], None, "x")


def _labels(monkeypatch, t, folder):
    """The texts drawn on the throughput plots."""
    import matplotlib
    matplotlib.use("Agg")
    from matplotlib.axes import Axes
    drawn = []
    original = Axes.text

    def text(self, x, y, s, *a, **k):
        drawn.append(s)
        return original(self, x, y, s, *a, **k)
    monkeypatch.setattr(Axes, "text", text)
    plots.draw(t, folder)
    return drawn


def test_the_plot_labels_a_best_only_when_it_is_told_apart(tmp_path, monkeypatch):
    folder = noisy_store(str(tmp_path / "noise"))
    t = aggregate.load(folder)
    rows = t.rows
    # at 2 workers fusion and wfbp tie: no label; at 4 wfbp is apart: its speedup
    # (mean 320 over its 1-worker mean 124.93)
    assert plots.best_label(rows, 2) is None
    row, text = plots.best_label(rows, 4)
    assert row.label == "wfbp" and text == "2.6x"
    drawn = _labels(monkeypatch, t, str(tmp_path / "plots"))
    assert "2.6x" in drawn
    assert "2.0x" not in drawn  # fusion's 215 / 109.4 at 2 workers, tied with wfbp
    assert any("no best at 2 GPU(s)" in s for s in drawn)
    # Two methods tied at the only multi-worker count: no best label at all
    entries, _ = store.read(os.path.join(folder, "results.jsonl"))
    two = aggregate.build([e for e in entries if e.get("kind") != "try"
                           or e["config"]["nworkers"] in (1, 2)])
    drawn = _labels(monkeypatch, two, str(tmp_path / "plots2"))
    assert not [s for s in drawn if s.endswith("x")]


# What the sweep says, from the same store by hand: at 1 worker fusion+fp16's 150 is apart
# from every other interval, 150 / 124.8 = 1.202 ahead of wfbp, bspps 60 is 60% below; at 2
# fusion (215) and wfbp (210) overlap, ddp 150 is 1 - 150/215 = 30% below; at 4 wfbp's 320 is
# apart, 320/255 = 1.255 ahead of fusion, ddp 210 is 34% below. No timelines, no predictions.
EXPECTED_CONCLUSION = [
    "**ResNet-18, batch 16, 1gbit (emulated), 1 worker**: fusion compressor=fp16 is fastest "
    "(150.0 img/s), 20% ahead of wfbp, its interval apart from every other method's; bspps is "
    "slowest (60.0, 60% below).",
    "**ResNet-18, batch 16, 1gbit (emulated), 2 workers**: fusion and wfbp are tied best "
    "(215.0 img/s the highest median; their intervals overlap); ddp is slowest (150.0, 30% "
    "below).",
    "**ResNet-18, batch 16, 1gbit (emulated), 4 workers**: wfbp is fastest (320.0 img/s), 25% "
    "ahead of fusion, its interval apart from every other method's; ddp is slowest (210.0, 34% "
    "below)."]


def test_at_1_worker_without_peers_the_conclusion_calls_the_spread_noise(tmp_path):
    """The same store without the 1-worker cells that still do other work (a compressor, a
    parameter server): the rest do identical work, and the paragraph says their spread is
    noise (the noise floor's ratio, 124.8 / 98.9) instead of what communication exposes."""
    folder = noisy_store(str(tmp_path / "noise"))
    entries, _ = store.read(os.path.join(folder, "results.jsonl"))
    kept = [e for e in entries if e["kind"] != "try" or e["config"]["nworkers"] != 1
            or e["label"] in ("wfbp", "fusion", "ddp")]
    line = [ln for ln in report.conclusion(aggregate.build(kept)) if "1 worker**" in ln]
    # wfbp [120, 130] apart from fusion [105, 112]: 124.8 / 109.2 = +14%; ddp 98.9: -21%
    assert line == ["**ResNet-18, batch 16, 1gbit (emulated), 1 worker**: wfbp is fastest "
                    "(124.8 img/s), 14% ahead of fusion, its interval apart from every other "
                    "method's; ddp is slowest (98.9, 21% below); with 1 worker there is no "
                    "communication: the 1.262 max/min ratio of their medians is noise and each "
                    "method's own bookkeeping."], line


def test_what_the_sweep_says_is_made_from_its_data(tmp_path):
    folder = noisy_store(str(tmp_path / "noise"))
    t = aggregate.load(folder)
    lines = report.conclusion(t)
    assert lines[0] == "## What this sweep says"
    assert [ln for ln in lines if ln.startswith("**")] == EXPECTED_CONCLUSION
    report.write_all(folder, plots=False)
    readme = open(os.path.join(folder, "README.md")).read()
    assert readme.index("## What this sweep says") < readme.index("## Throughput")
    assert all(p in readme for p in EXPECTED_CONCLUSION)


# ------------------------------------------------------------------------------ shared jobs

def _jobs_by_hand(order):
    """(cell, try) in planned order, grouped as ``shared_jobs`` must: an all-to-all cell joins
    the first job of its round and worker count that holds no cell of its method id and no
    cell whose ``--threshold``
    disagrees (the one setting of these sweeps that other methods take: a cell that gives it
    never joins one of fusion, wfbpps or bspps that does not), else starts one. Jobs run in
    the order of their first cell."""
    takes = {"fusion", "wfbpps", "bspps"}
    thresholds = lambda a, b: "threshold" in a.method and b.method["method"] in takes \
        and b.method.get("threshold") != a.method["threshold"]
    jobs = []
    for cell, i in order:
        for job in jobs:
            c0, i0 = job[0]
            if i0 == i and c0.nworkers == cell.nworkers \
                    and all(c.method["method"] != cell.method["method"] for c, _ in job) \
                    and not any(thresholds(cell, c) or thresholds(c, cell) for c, _ in job):
                job.append((cell, i))
                break
        else:
            jobs.append([(cell, i)])
    return jobs


def _job_call(job):
    return f"{','.join(c.method['method'] for c, _ in job)} {job[0][0].nworkers}"


SHARED_METHODS = ["wfbp", "fusion", "ddp", "wfbpps", "bspps",
                  {"method": "fusion", "threshold": 1000, "label": "fusion-1k"}]


def test_shared_jobs_time_a_rounds_methods_in_one_job_each(tmp_path, calls, capsys):
    cfg = write_config(tmp_path, methods=SHARED_METHODS, nworkers=[1, 2], tries=2, seed=7,
                       shared_jobs=True)
    sweep = config.load(str(cfg), preflight=False)
    jobs = _jobs_by_hand(_expected(sweep, 7, 2))
    # per round and worker count 6 cells in 2 jobs: never two fusions in one, fusion-1k
    # never with a PS method (both take --threshold, it gives one)
    assert len(jobs) == 8 and sum(len(j) for j in jobs) == 24
    for job in jobs:
        ids = [c.method["method"] for c, _ in job]
        assert ids.count("fusion") <= 1
        assert not ("fusion-1k" in [c.label for c, _ in job] and {"wfbpps", "bspps"} & set(ids))
    # a shared cell is another measurement than the same cell in a job of its own
    alone = config.load(str(write_config(tmp_path, name="alone", methods=SHARED_METHODS,
                                         nworkers=[1, 2], tries=2, seed=7)), preflight=False)
    assert all(c.shares for c in sweep.cells())
    assert not any(a.hash == b.hash for a, b in zip(alone.cells(), sweep.cells()))
    # the dry run lists the jobs and their commands
    assert benchmarks.main(["--config", str(cfg), "--dry-run"]) == 0
    shown = [ln.split(" try ")[0].split(", ") for ln in capsys.readouterr().out.splitlines()
             if ln.startswith("local_")]
    assert shown == [[c.name for c, _ in job] for job in jobs]
    assert benchmarks.main(["--config", str(cfg), "--quiet"]) == 0
    assert calls() == [_job_call(job) for job in jobs]
    [folder] = folders(tmp_path)
    lines = try_lines(folder)
    assert [(e["hash"], e["try"]) for e in lines] == [(c.hash, i) for job in jobs
                                                      for c, i in job]
    assert sorted(os.listdir(os.path.join(folder, "records"))) == sorted(
        f"{c.name}_try{i}.json" for job in jobs for c, i in job)   # no job folder left
    at = 0
    for job in jobs:
        mine, at = lines[at:at + len(job)], at + len(job)
        for k, (e, (cell, i)) in enumerate(zip(mine, job)):
            # each cell's own figures, from its own record
            assert e["status"] == "ok" and e["throughput"] == fake_throughput(
                cell.method["method"], "resnet18", cell.nworkers)
            assert e["record"]["config"]["method"] == cell.method["method"]
            assert e["log_total"]["value"] == pytest.approx(e["throughput"], abs=0.05)
            if len(job) > 1:
                assert e["job"]["cells"] == [c.name for c, _ in job] and e["job"]["index"] == k
                assert e["job"]["status"] == "ok"
                assert e["seconds"] == pytest.approx(e["job"]["seconds"] / len(job), abs=1e-3)
                assert f"--method {_job_call(job).split()[0]}" in e["command"]
            else:
                assert "job" not in e
        assert len({e["log"] for e in mine}) == 1
    # what the report makes of it: every cell once per try
    readme = open(os.path.join(folder, "README.md")).read()
    assert "fusion-1k" in readme


def test_a_failing_method_fails_only_itself_and_the_rest_of_its_job(tmp_path, calls):
    cfg = write_config(tmp_path, methods=["wfbp", "tests.broken_methods:Crash", "ddp",
                                          "fusion"], nworkers=[2], tries=1, seed=11,
                       shared_jobs=True)
    sweep = config.load(str(cfg), preflight=False)
    [job] = _jobs_by_hand(_expected(sweep, 11, 1))
    crash = [c.method["method"] for c, _ in job].index("tests.broken_methods:Crash")
    assert 0 < crash < 3  # (this seed puts a method on either side of it)
    assert benchmarks.main(["--config", str(cfg), "--quiet"]) == 1
    assert calls() == [_job_call(job)]
    [folder] = folders(tmp_path)
    got = [(e["cell"], e["status"], e.get("reason")) for e in try_lines(folder)]
    assert got == [(c.name, "ok", None) if k < crash else (c.name, "failed", "exit code 1")
                   for k, (c, _) in enumerate(job)]
    assert all(e["job"]["status"] == "failed" for e in try_lines(folder))


def test_cells_join_a_job_only_where_their_settings_agree(tmp_path, monkeypatch):
    sweep = config.load(str(write_config(
        tmp_path, shared_jobs=True, methods=[
            "wfbp", {"method": "fusion", "threshold": 1000}, "ddp",
            {"method": "bytescheduler", "partition": 4096}])), preflight=False)
    wfbp, fusion, ddp, bs = [c for c in sweep.cells() if c.nworkers == 2]
    assert fusion.can_join([wfbp, ddp, bs]) and not fusion.can_join([fusion])
    assert fusion.job_key() == wfbp.job_key() == bs.job_key()
    # a setting that another method of the job takes but is not given for it: not together
    # (the job's command line would give it to both)
    owners = config.settings()
    monkeypatch.setattr(config, "settings", lambda: {
        **owners, "threshold": (owners["threshold"][0], owners["threshold"][1] | {"wfbp"})})
    assert not fusion.can_join([wfbp]) and not wfbp.can_join([fusion])
    assert fusion.can_join([ddp, bs])
    args = config.job_args(sweep, [fusion, ddp, bs], "r/{method}.json")
    assert args[args.index("--method") + 1] == "fusion,ddp,bytescheduler"
    assert args[args.index("--threshold") + 1] == "1000"
    assert args[args.index("--partition") + 1] == "4096"


# ----------------------------------------------------------------------------- adaptive tries

def test_adaptive_tries_go_on_while_an_interval_is_too_wide(tmp_path, calls, monkeypatch,
                                                            capsys):
    """wfbp's tries give 0.9, 1.0, 1.1 times its figure (then 1.0), fusion's and ddp's the
    same figure each time. With a target of +-3% and at most 5 tries: after 3 tries wfbp's
    interval is [0.9, 1.1] x (+-10%), after 4 at least [0.95, 1.05] x (a resample's median is
    0.95 x or less when 2 of its 4 draws are the 0.9 one: probability 0.26), so it gets tries
    3 and 4 and, at 5 ([0.9, 1.1] x: 3 of 5 draws, probability 0.058), is still too wide;
    fusion and ddp ([x, x]) get none. The store alone says which tries are wanted: the same
    sweep run first without adaptive tries, then with, adds exactly those."""
    monkeypatch.setenv("FAKE_TRAIN_NOISY", "wfbp")
    base = dict(methods=["wfbp", "fusion", "ddp"], nworkers=[2], tries=3, seed=5,
                shared_jobs=True)
    write_config(tmp_path, **base)
    assert benchmarks.main(["--config", str(tmp_path / "t.yaml"), "--quiet"]) == 0
    assert len(calls()) == 3   # 3 rounds of one shared job
    cfg = write_config(tmp_path, **base, adaptive={"target": 0.03, "max_tries": 5})
    assert benchmarks.main(["--config", str(cfg), "--dry-run"]) == 0
    assert ("adaptive: then rounds of one more try for the cells whose 95% interval is wider "
            "than +-3% of their median, up to 5 tries each") in capsys.readouterr().out
    assert benchmarks.main(["--config", str(cfg), "--quiet"]) == 0
    assert calls()[3:] == ["wfbp 2", "wfbp 2"]
    [folder] = folders(tmp_path)   # the same store, completed
    lines = try_lines(folder)
    assert [(e["cell"].split("_")[-2], e["try"]) for e in lines[9:]] == [("wfbp", 3),
                                                                          ("wfbp", 4)]
    base_wfbp = fake_throughput("wfbp", "resnet18", 2)
    assert [e["throughput"] for e in lines if "_wfbp_" in e["cell"]] == [
        round(base_wfbp * f, 3) for f in (0.9, 1.0, 1.1, 1.0, 1.0)]
    # nothing more to add: a third start begins a new store
    assert execute.extra_round(config.load(str(cfg), preflight=False),
                               config.load(str(cfg), preflight=False).cells(),
                               store.read(os.path.join(folder, "results.jsonl"))[0], 5) == []
    readme = open(os.path.join(folder, "README.md")).read()
    assert ("Adaptive tries: a cell whose interval was wider than +-3% of its median got "
            "another try, up to 5: 2 extra tries in 1 cell(s); still wider after 5: ResNet-18 "
            "wfbp at 2 on local.") in readme


def test_adaptive_tries_leave_a_failing_cell_alone(tmp_path, calls, monkeypatch):
    """A cell whose tries all failed gets no more (it fails, it is not noisy); a noisy one
    beside it does."""
    monkeypatch.setenv("FAKE_TRAIN_NOISY", "wfbp")
    cfg = write_config(tmp_path, methods=["wfbp", "tests.broken_methods:Crash"], nworkers=[1],
                       tries=3, adaptive={"target": 0.03, "max_tries": 4})
    assert benchmarks.main(["--config", str(cfg), "--quiet"]) == 1
    assert sorted(calls()) == ["tests.broken_methods:Crash 1"] * 3 + ["wfbp 1"] * 4


@pytest.mark.parametrize("adaptive,message", [
    ({"target": 0.03}, "adaptive must be a mapping of target"),
    ({"target": 0, "max_tries": 5}, "adaptive target must be a fraction between 0 and 1"),
    ({"target": 0.03, "max_tries": 3}, "adaptive max_tries must be an integer above tries (3)"),
    ("yes", "adaptive must be a mapping"),
])
def test_bad_adaptive_settings_are_one_line(tmp_path, adaptive, message):
    cfg = write_config(tmp_path, tries=3, adaptive=adaptive)
    with pytest.raises(UsageError, match=re.escape(message)):
        config.load(str(cfg), preflight=False)

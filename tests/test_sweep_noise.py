"""Noise control (issue 19): tries interleaved round-robin over the cells in a seeded order,
medians with 95% intervals, ties and the noise floor in the reports, and local processes
pinned to cores of their own.

Sweeps here run tests/fake_train.py (DDLBENCH_SWEEP_PROGRAM); reports come from hand-written
stores; the pinning tests spawn tests/affinity_probe.py (no torch) and one real 2-worker
comm_bench job.
"""
import json
import os
import signal
import subprocess
import sys
import time

import pytest

import benchmarks
from ddlbench.hosts import pinning
from ddlbench.sweep import config, execute, store

from .conftest import REPO, describe, env, run
from .test_sweep import FAKE, folders, try_lines, write_config

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
    proc = run([sys.executable, "-m", "ddlbench.comm_bench", "--nworkers", "2", "--ops",
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
    assert "(chosen for this store (from its folder's name))" in line
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
        "chosen for this store (from its folder's name)", "recorded in the store"]
    first = [x for x in expected if x[0].nworkers == 1]
    rest = [x for x in expected if x[0].nworkers != 1]
    assert calls() == [_call(c) for c, _ in first + rest]


def test_a_sweep_killed_mid_try_resumes_without_repeating_or_skipping(tmp_path, monkeypatch):
    monkeypatch.setenv(config.PROGRAM_ENV, FAKE)  # part of each cell's hash, as in the sweep
    cfg = write_config(tmp_path, methods=["wfbp", "fusion"], nworkers=[1, 2], tries=2)
    sweep = config.load(str(cfg), preflight=False)
    calls = tmp_path / "calls.txt"
    run_env = env(**{config.PROGRAM_ENV: FAKE, "FAKE_TRAIN_SECONDS": "0.6",
                     "FAKE_TRAIN_CALLS": str(calls)})
    cmd = [sys.executable, "benchmarks.py", "--config", str(cfg), "--quiet"]
    proc = subprocess.Popen(cmd, cwd=REPO, env=run_env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        found = folders(tmp_path)
        inflight = os.path.join(found[0], "inflight.json") if found else ""
        if found and os.path.exists(os.path.join(found[0], "results.jsonl")) \
                and len(try_lines(found[0])) >= 5 and os.path.exists(inflight):
            break
        time.sleep(0.05)
    else:
        proc.kill()
        pytest.fail("the sweep never reached its sixth try: " + proc.communicate()[1])
    time.sleep(0.2)  # inside the try (it takes 0.6 s)
    proc.send_signal(signal.SIGKILL)
    proc.communicate()
    folder = found[0]
    done = len(try_lines(folder))
    assert 5 <= done < 8
    seed = store.headers(store.read(os.path.join(folder, "results.jsonl"))[0])[0]["seed"]
    expected = _expected(sweep, seed, 2)
    again = subprocess.run(cmd, cwd=REPO, env=run_env, capture_output=True, text=True,
                           timeout=120)
    assert again.returncode == 0, describe(again)
    assert folders(tmp_path) == [folder]
    # the store: every try once, in the planned order
    assert [(e["hash"], e["try"]) for e in try_lines(folder)] == \
        [(c.hash, i) for c, i in expected]
    # the starts: the killed try started twice (its first run never reached the store)
    started = calls.read_text().splitlines()
    order = [_call(c) for c, _ in expected]
    assert started == order[:done + 1] + order[done:]

"""Noise control (issue 19): tries interleaved round-robin over the cells in a seeded order,
medians with 95% intervals, ties and the noise floor in the reports, and local processes
pinned to cores of their own.

Sweeps here run tests/fake_train.py (DDLBENCH_SWEEP_PROGRAM); reports come from hand-written
stores; the pinning tests spawn tests/affinity_probe.py (no torch) and one real 2-worker
comm_bench job.
"""
import json
import os
import sys

import pytest

from ddlbench.hosts import pinning

from .conftest import REPO, describe, run

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

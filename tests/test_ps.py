"""The parameter-server architecture: partition plan, the three PS methods against the
single-process reference, bytes on the wire, failures of servers and workers, the launcher."""
import os
import signal
import subprocess
import sys
import time

import psutil
import pytest
import torch

from ddlbench import planning
from ddlbench.engine import ps
from ddlbench.hosts.hostfile import Host
from ddlbench.launch import pslaunch

from .conftest import (MOMENTUM_SGD, QUICK_TIMING, REPO, SMALL_CNN, TINY_BERT, describe, env,
                       run, train, verify_lines)

PS_METHODS = ["bspps", "wfbpps", "byteschedulerps"]
LAUNCHER = f"{REPO}/byteps/byteps_launch.sh"
FAKE_SSH = f"{REPO}/tests/fake_ssh.sh"
# Small partitions and a small credit window, so that tensors are cut, spread over both
# servers, and the window throttles dispatch.
CNN_PS = [*SMALL_CNN, "--partition-bytes", "262144", "--credit", "200000"]
BERT_PS = [*TINY_BERT, "--partition-bytes", "65536", "--credit", "50000"]


# ------------------------------------------------------------------------ the partition plan

def test_plan_cuts_units_and_spreads_keys_round_robin():
    # fp32: 40 bytes = 10 elements per partition; 3 servers.
    parts = ps.plan([(25, torch.float32), (10, torch.float32), (3, torch.float64)], 40, 3)
    got = [[(p.key, p.start, p.end, p.server) for p in unit] for unit in parts]
    assert got == [[(0, 0, 10, 0), (1, 10, 20, 1), (2, 20, 25, 2)],
                   [(3, 0, 10, 0)],
                   [(4, 0, 3, 1)]]          # float64: 5 elements per partition, 3 fit in one
    assert [p.unit for unit in parts for p in unit] == [0, 0, 0, 1, 2]


def test_more_servers_than_partitions_leaves_some_idle():
    parts = ps.plan([(5, torch.float32)], 4096, 4)
    assert [(p.key, p.server, p.numel) for unit in parts for p in unit] == [(0, 0, 5)]


def test_default_server_count():
    assert [planning.default_nservers(w) for w in (1, 4, 5, 8, 9)] == [1, 1, 2, 2, 3]
    assert planning.default_nservers(16, hosts=4) == 4


def test_launcher_placement_fills_slots_and_puts_servers_on_worker_machines():
    hosts = [Host("a", 2), Host("b", 2), Host("c", 4)]
    workers, servers = pslaunch.placement(hosts, 5, 4)
    assert workers == ["a", "a", "b", "b", "c"]
    assert servers == ["a", "b", "c", "a"]


# ------------------------------------------------------------- correctness, 1-4 workers

# Model x worker count (1-4) x server count (1, 2), pairwise for the suite's time budget:
# every worker count, both server counts with an odd and an even number of workers. Every run
# checks all three PS methods for 3 momentum-SGD steps, with random per-rank delays in the
# gradient hooks when there are several workers (pushes then leave in a different order on
# each worker).
MATRIX = [("cnn", 1, 1), ("cnn", 2, 1), ("cnn", 3, 2), ("bert", 1, 2), ("bert", 3, 1),
          ("bert", 4, 2)]


@pytest.mark.timeout(600)
@pytest.mark.parametrize("model,nworkers,nservers", MATRIX)
def test_ps_methods_equal_the_reference(model, nworkers, nservers):
    workload = CNN_PS if model == "cnn" else BERT_PS
    jitter = {"DDLBENCH_TEST_HOOK_JITTER_MS": 10} if nworkers > 1 else {}
    proc = train(*workload, "--verify", "3", "--method", ",".join(PS_METHODS), *MOMENTUM_SGD,
                 "--nworkers", str(nworkers), "--nservers", str(nservers), "--no-cuda",
                 timeout=540, **jitter)
    assert proc.returncode == 0, describe(proc)
    lines = verify_lines(proc.stdout)
    assert set(lines) == set(PS_METHODS), describe(proc)
    for method in PS_METHODS:
        steps = lines[method]
        assert [s for s, *_ in steps] == [1, 2, 3], method
        assert all(ok for *_, ok in steps), (method, steps)
    assert "replicas differ" not in proc.stdout


@pytest.mark.timeout(300)
def test_verify_all_includes_the_ps_methods_with_default_servers():
    # --method all with no --nservers: the spawner starts one server for 2 workers.
    proc = train(*BERT_PS, "--verify", "1", "--method", "all", "--nworkers", "2",
                 "--no-cuda", timeout=280)
    assert proc.returncode == 0, describe(proc)
    assert set(PS_METHODS) <= set(verify_lines(proc.stdout))


@pytest.mark.timeout(300)
def test_more_servers_than_partitions_is_still_correct():
    proc = train(*TINY_BERT, "--verify", "2", "--method", "bspps", "--nworkers", "2",
                 "--nservers", "3", "--partition-bytes", str(10 ** 9), "--no-cuda",
                 timeout=280)
    assert proc.returncode == 0, describe(proc)
    assert all(ok for *_, ok in verify_lines(proc.stdout)["bspps"])


# ---------------------------------------------------------------- what a benchmark records

@pytest.mark.timeout(300)
@pytest.mark.parametrize("method", ["wfbpps", "byteschedulerps"])
def test_record_counts_pushed_and_pulled_bytes(tmp_path, load_json, method):
    out = tmp_path / "rec.json"
    # A benchmark takes only its method's options: the credit is byteschedulerps's.
    workload = BERT_PS if method == "byteschedulerps" else BERT_PS[:-2]
    proc = train(*workload, *QUICK_TIMING, "--method", method, "--nworkers", "2",
                 "--nservers", "2", "--no-cuda", "--output", str(out), timeout=280)
    assert proc.returncode == 0, describe(proc)
    rec = load_json(out)
    grad = rec["model"]["gradient_bytes"]
    per_iter = rec["communication_per_iteration"]
    # Each worker pushes its whole gradient and pulls the whole sum, every iteration.
    assert per_iter["payload_bytes"] == {"push": grad, "pull": grad}
    assert per_iter["calls"]["push"] == rec["method"]["partitions"]
    assert rec["config"]["nservers"] == 2 and rec["method"]["nservers"] == 2
    assert rec["method"]["partition_bytes"] == 65536
    servers = rec["servers"]
    assert [s["rank"] for s in servers] == [2, 3]
    # Every push of every step so far (warm-up 1 + 2 rounds of 2) reached a server, and every
    # sum went back to both workers.
    steps = 1 + 2 * 2
    assert sum(s["bytes_received"] for s in servers) == 2 * grad * steps
    assert sum(s["bytes_sent"] for s in servers) == 2 * grad * steps
    assert all(s["rss_bytes"] >= s["rss_bytes_at_start"] > 0 for s in servers)
    assert "Parameter servers: 2, partition 65536 bytes" in proc.stdout


# ------------------------------------------------------------------------------- failures

def _children_alive(proc):
    try:
        return [c for c in psutil.Process(proc.pid).children(recursive=True) if c.is_running()]
    except psutil.NoSuchProcess:
        return []


def _start_long_run(nworkers, nservers, method):
    args = [sys.executable, "-m", "ddlbench.train", *TINY_BERT, "--method", method,
            "--nworkers", str(nworkers), "--nservers", str(nservers), "--no-cuda",
            "--num-warmup-batches", "1000000", "--timeout", "60"]
    return subprocess.Popen(args, cwd=REPO, env=env(), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)


def _rank_process(proc, rank, deadline_s=120):
    """The spawned process with RANK=rank, once it is warming up."""
    deadline = time.monotonic() + deadline_s
    while time.monotonic() < deadline:
        for c in _children_alive(proc):
            try:
                if c.environ().get("RANK") == str(rank):
                    return c
            except psutil.Error:
                pass
        time.sleep(0.5)
    raise AssertionError("rank never started")


def _kill_and_collect(proc, victim, settle_s=3):
    # Let the job get into its training loop: rank 0 says so, then a few steps.
    head = []
    for line in proc.stdout:
        head.append(line)
        if line.startswith("Running warmup"):
            break
    time.sleep(settle_s)
    assert proc.poll() is None, (head, proc.communicate())
    victim.kill()
    start = time.monotonic()
    try:
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    return out, err, time.monotonic() - start


@pytest.mark.timeout(240)
@pytest.mark.parametrize("method", ["wfbpps", "byteschedulerps"])
def test_a_dead_server_stops_every_worker_naming_it(method):
    proc = _start_long_run(2, 1, method)
    server = _rank_process(proc, 2)
    pids = [c.pid for c in _children_alive(proc)]
    out, err, took = _kill_and_collect(proc, server)
    assert proc.returncode != 0
    assert took < 30, err
    for w in (0, 1):
        assert any(line.startswith(f"ddlbench: worker {w}: error:") and
                   "parameter server 0 (rank 2)" in line for line in err.splitlines()), err
    assert "Traceback" not in err, err
    assert not [p for p in pids if psutil.pid_exists(p) and
                psutil.Process(p).status() != psutil.STATUS_ZOMBIE]


@pytest.mark.timeout(240)
def test_a_dead_worker_stops_the_servers_and_the_other_workers():
    proc = _start_long_run(2, 2, "wfbpps")
    worker = _rank_process(proc, 1)
    pids = [c.pid for c in _children_alive(proc)]
    out, err, took = _kill_and_collect(proc, worker)
    assert proc.returncode != 0
    assert took < 30, err
    # Each server names the worker it lost, at once (before the spawner stops anything).
    for s, rank in ((0, 2), (1, 3)):
        assert any(ln.startswith(f"ddlbench: parameter server {s} (rank {rank}): ") and
                   "worker 1 failed" in ln for ln in err.splitlines()), err
    assert not [p for p in pids if psutil.pid_exists(p) and
                psutil.Process(p).status() != psutil.STATUS_ZOMBIE]


# ---------------------------------------------------------------------------- bad input

@pytest.mark.parametrize("args,message", [
    (["--nservers", "0"], "--nservers must be positive, got 0"),
    (["--nservers", "-2"], "--nservers must be positive, got -2"),
    (["--partition-bytes", "0"], "--partition-bytes must be at least 4096 bytes, got 0"),
    (["--compressor", "topk"], "cannot take --compressor topk"),
])
def test_bad_ps_input_is_one_line(args, message):
    proc = train(*TINY_BERT, "--method", "wfbpps", "--nworkers", "2", *args, timeout=120)
    assert proc.returncode == 2, describe(proc)
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("ddlbench: error: "), describe(proc)
    assert message in lines[0]


def test_ps_method_without_servers_under_a_launcher_is_refused():
    # As if started by mpirun -np 1 with no --nservers: no process is left to be a server.
    e = dict(OMPI_COMM_WORLD_RANK="0", OMPI_COMM_WORLD_SIZE="1", MASTER_ADDR="127.0.0.1")
    proc = train(*TINY_BERT, "--method", "bspps", timeout=120, **e)
    assert proc.returncode == 2, describe(proc)
    assert proc.stderr.strip() == ("ddlbench: error: method bspps needs parameter servers: "
                                   "--nservers S (under a launcher, S of its processes become "
                                   "servers)")


def test_unknown_host_in_the_config_is_one_line(tmp_path):
    hf = tmp_path / "hosts"
    hf.write_text("localhost slots=1\nno-such-host.invalid slots=1\n")
    proc = run(["bash", LAUNCHER], timeout=60, hostfile=str(hf), nworkers="2", dnn="bert_tiny")
    assert proc.returncode == 2, describe(proc)
    assert proc.stderr.strip() == (f"ddlbench: error: unknown host 'no-such-host.invalid' in "
                                   f"host file {hf}")


@pytest.mark.parametrize("var,value,message", [
    ("nservers", "0", "nservers must be a positive integer, got '0'"),
    ("partition_bytes", "-5", "partition_bytes must be an integer >= 4096, got '-5'"),
    ("bytescheduler", "2", "bytescheduler must be 0 or 1, got '2'"),
])
def test_launcher_bad_env_is_one_line(var, value, message):
    proc = run(["bash", LAUNCHER], timeout=60, nworkers="2", **{var: value})
    assert proc.returncode == 2, describe(proc)
    assert proc.stderr.strip() == f"byteps/byteps_launch.sh: error: {message}"


# ------------------------------------------------------------------------------ launchers

SMALL_ENV = dict(dnn="bert_tiny", bs="4", senlen="16", iters="2",
                 extra_args="--num-warmup-batches 1 --num-batches-per-iter 2 --timeout 60 "
                            "--no-cuda")


@pytest.mark.timeout(300)
def test_launcher_on_localhost_spawns_workers_and_servers(tmp_path, load_json):
    out = tmp_path / "rec.json"
    proc = run(["bash", LAUNCHER], timeout=280, hostfile=f"{REPO}/configs/cluster2",
               nworkers="2", bytescheduler="1",
               **dict(SMALL_ENV, extra_args=SMALL_ENV["extra_args"] + f" --output {out}"))
    assert proc.returncode == 0, describe(proc)
    rec = load_json(out)
    assert rec["config"]["method"] == "byteschedulerps"
    assert rec["config"]["nservers"] == 1       # one machine, 2 workers: one server
    assert "--nworkers 2 --nservers 1" in proc.stderr


@pytest.mark.timeout(300)
def test_launcher_over_ssh_uses_the_dmlc_variables(tmp_path, load_json):
    """Two 'remote' hosts (127.0.0.2 and 127.0.0.3 through a stand-in for ssh): one worker and
    one server each, started with the DMLC_* variables, rendezvous on the first host."""
    hf = tmp_path / "hosts"
    hf.write_text("127.0.0.2 slots=1\n127.0.0.3 slots=1\n")
    out = tmp_path / "rec.json"
    log = tmp_path / "ssh.log"
    proc = run(["bash", LAUNCHER], timeout=280, hostfile=str(hf), nworkers="2",
               threshold="536870912", SSH=FAKE_SSH, FAKE_SSH_LOG=str(log),
               **dict(SMALL_ENV, extra_args=SMALL_ENV["extra_args"] + f" --output {out}"))
    assert proc.returncode == 0, describe(proc)
    rec = load_json(out)
    assert rec["config"]["method"] == "bspps" and rec["config"]["nservers"] == 2
    assert rec["environment"]["launcher"] == "dmlc"
    assert [s["rank"] for s in rec["servers"]] == [2, 3]
    # One ssh to choose the port on the first host, then one worker and one server per host
    # (started one after the other, but each ssh logs when it runs: their order may vary).
    calls = log.read_text().splitlines()
    assert calls[0] == "127.0.0.2", calls
    assert sorted(calls[1:]) == ["127.0.0.2 DMLC_ROLE=server", "127.0.0.2 DMLC_ROLE=worker",
                                 "127.0.0.3 DMLC_ROLE=server", "127.0.0.3 DMLC_ROLE=worker"], calls


@pytest.mark.timeout(300)
def test_interrupting_the_launcher_leaves_no_process(tmp_path):
    hf = tmp_path / "hosts"
    hf.write_text("127.0.0.2 slots=1\n127.0.0.3 slots=1\n")
    e = env(hostfile=str(hf), nworkers="2", SSH=FAKE_SSH, dnn="bert_tiny", bs="4", senlen="16",
            extra_args="--num-warmup-batches 1000000 --timeout 60 --no-cuda --job-id pstest1")
    proc = subprocess.Popen(["bash", LAUNCHER], cwd=REPO, env=e, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)

    def job_processes():
        return [p for p in psutil.process_iter(["cmdline"])
                if "--job-id pstest1" in " ".join(p.info["cmdline"] or [])
                and "ddlbench.train" in " ".join(p.info["cmdline"] or [])]
    try:
        deadline = time.monotonic() + 120
        while len(job_processes()) < 4 and time.monotonic() < deadline:
            time.sleep(0.5)
        assert len(job_processes()) >= 4, proc.stderr.read() if proc.poll() is not None else ""
        time.sleep(5)
        proc.send_signal(signal.SIGINT)
        proc.wait(timeout=60)
        assert proc.returncode != 0
        deadline = time.monotonic() + 30
        while job_processes() and time.monotonic() < deadline:
            time.sleep(0.5)
        assert job_processes() == []
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        for p in job_processes():
            p.kill()

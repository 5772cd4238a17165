"""Hostile input and hostile events (issue 15): bad input is one line and exit 2 before any work,
a killed parent takes its job along, a sweep runs what it records, nothing reaches a remote
shell unquoted, and stop.sh stops one job only.

Bad input is checked in this process where the command allows it (the checks are the same
functions; no interpreter start per case), the shell launchers with ``dry_run=1``."""
import json
import os
import random
import shlex
import signal
import subprocess
import sys
import time
import uuid

import psutil
import pytest

import benchmarks
from ddlbench import train
from ddlbench.measure import comm_bench, profiler
from ddlbench.errors import check_writable, UsageError
from ddlbench.launch import job as job_mod
from ddlbench.launch import pslaunch
from ddlbench.measure import record
from ddlbench.netem import state as netem_state
from ddlbench.sweep import config, runner, store

from . import hostile
from .conftest import REPO, TINY_BERT, describe, env

LAUNCHERS = {"horovod": "horovod/horovod_mpi_cj.sh", "byteps": "byteps/byteps_launch.sh"}


class WouldRun(Exception):
    """Raised instead of spawning or running: the input was accepted."""


@pytest.fixture
def no_runs(monkeypatch):
    """Commands run in this process up to the point where work would start."""
    def refuse(*_a, **_k):
        raise WouldRun()
    monkeypatch.setattr(job_mod, "spawn_local", refuse)
    for mod in (train, comm_bench, profiler):
        monkeypatch.setattr(mod, "worker", refuse)
    for k in list(os.environ):
        if k.startswith(("DDLBENCH_NET", "DMLC_", "BYTESCHEDULER_", "RANK", "OMPI_")):
            monkeypatch.delenv(k)


def outcome(fn, argv, capfd) -> str:
    """'run' (accepted), or 'line' (exit 2 and one line on stderr); anything else fails."""
    try:
        rc = fn(argv)
    except WouldRun:
        capfd.readouterr()
        return "run"
    except SystemExit as e:  # the one-line parser's exit
        rc = e.code
    err = capfd.readouterr().err
    if rc == 0:  # a command that did its work here (benchmarks.py --dry-run)
        return "run"
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert rc == 2 and len(lines) == 1 and "Traceback" not in err, \
        f"{argv}: exit {rc}, stderr:\n{err}"
    return "line"


def _train_cases():
    return [c for c in hostile.CASES if c.cmd[1:3] == ["-m", "ddlbench.train"]]


@pytest.mark.parametrize("case", _train_cases(), ids=lambda c: c.name)
def test_bad_training_flags_are_one_line(case, tmp_path, monkeypatch, capfd, no_runs):
    for k, v in case.env.items():
        monkeypatch.setenv(k, v)
    for rel, text in case.files.items():
        (tmp_path / rel).write_text(text)
    argv = [a.replace("{tmp}", str(tmp_path)) for a in case.cmd[3:]]
    assert outcome(train.main, argv, capfd) == "line"
    assert sorted(os.listdir(tmp_path)) == sorted(case.files)  # no file written


def test_accepted_flags_still_run(tmp_path, capfd, no_runs):
    """The checks refuse what is wrong, not what is unusual."""
    for argv in (["--output", str(tmp_path / "new" / "r.json")],  # a folder to be made
                 ["--method", "bytescheduler", "--partition", "1000", "--credit", "1"],
                 ["--method", "fusion", "--threshold", "0"], ["--seed", "0"],
                 ["--verify", "2", "--method", "all", "--nservers", "1",
                  "--ps-force-servers"], ["--verify", "2", "--method", "all"],
                 ["--method", "wfbpps", "--partition-bytes", "4096"],
                 ["--compressor", "topk", "--density", "1"]):
        assert outcome(train.main, [*TINY_BERT, *argv], capfd) == "run", argv
    assert os.listdir(tmp_path) == []


SWEEP_CASES = [c for c in hostile.CASES if c.cmd[1:2] == ["benchmarks.py"]]
# Host files, the PS launcher, the shell launchers, the emulated network's state: no torch.
TOOL_CASES = [c for c in hostile.CASES if c.cmd[0] == "bash" or c.cmd[1:3] in (
    ["-m", "ddlbench.hosts.hostfile"], ["-m", "ddlbench.launch.pslaunch"],
    ["-m", "ddlbench.netem"])]


@pytest.mark.parametrize("case", TOOL_CASES, ids=lambda c: c.name)
def test_bad_host_files_and_launcher_variables_are_one_line(case):
    outcome, tail, made = hostile.run_case(case, REPO)
    assert outcome == case.expect and not made, (outcome, tail, made)


def test_a_port_in_use_is_one_line():
    import socket
    from datetime import timedelta
    from ddlbench import runtime
    from ddlbench.hosts.placement import Placement
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        p = Placement(0, 2, 0, 2, "mpi", "127.0.0.1", port)
        with pytest.raises(UsageError, match=f"cannot open the rendezvous store at "
                                             f"MASTER_ADDR=127.0.0.1 MASTER_PORT={port}"):
            runtime._store(p, timedelta(seconds=5))


@pytest.mark.parametrize("case", SWEEP_CASES, ids=lambda c: c.name)
def test_bad_sweep_files_and_stores_are_one_line(case, tmp_path, capfd, no_runs):
    for rel, text in case.files.items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(text)
    before = sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*"))
    argv = [a.replace("{tmp}", str(tmp_path)) for a in case.cmd[2:]]
    assert outcome(benchmarks.main, argv, capfd) == "line"
    assert sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*")) == before


def test_a_sweep_refuses_a_folder_it_cannot_write(tmp_path, capfd, no_runs):
    (tmp_path / "results").write_text("a file where the results folder goes\n")
    cfg = tmp_path / "s.yaml"
    cfg.write_text(hostile.SWEEP_HEAD + hostile.SWEEP_TASK + hostile.SWEEP_METHODS
                   + f"results: {tmp_path}/results/x\nlogs: {tmp_path}/logs\n")
    assert outcome(benchmarks.main, ["--config", str(cfg), "--quiet"], capfd) == "line"
    assert sorted(os.listdir(tmp_path)) == ["results", "s.yaml"]


def test_the_report_skips_ill_typed_lines(tmp_path):
    path = tmp_path / "results.jsonl"
    good = {"kind": "try", "hash": "h", "try": 0, "status": "ok", "throughput": 5.0,
            "config": {"network": {"name": "local", "kind": "net", "profile": "loopback"},
                       "task": {"model": "m", "batch_size": 2},
                       "method": {"method": "wfbp"}, "nworkers": 1}}
    lines = [good, dict(good, try_="x", **{"try": "0"}), dict(good, throughput="fast"),
             dict(good, config={"network": "local"}), [1, 2], "text",
             {"kind": "sweep", "networks": 3}]
    path.write_text("".join(json.dumps(x) + "\n" for x in lines))
    entries, bad = store.read(str(path))
    assert entries == [good] and bad == 6
    # A try without its cell (a store of an older writer) is read, but not reported.
    from ddlbench.sweep import aggregate
    table = aggregate.build([good, {"kind": "try", "hash": "x", "try": 0, "status": "ok"}])
    assert table.unreadable == 1 and [r.model for r in table.rows] == ["m"]


def test_write_checks_and_record_mode(tmp_path):
    with pytest.raises(UsageError, match="is a folder"):
        check_writable(str(tmp_path))
    with pytest.raises(UsageError, match="cannot be written"):
        check_writable("/proc/ddlbench-test.json")
    (tmp_path / "f").write_text("x")
    with pytest.raises(UsageError, match="is not a folder"):
        check_writable(str(tmp_path / "f" / "r.json"))
    check_writable(str(tmp_path / "a" / "b" / "r.json"))  # made when written
    assert sorted(os.listdir(tmp_path)) == ["f"]
    old = os.umask(0o022)
    try:
        record.write_atomic(str(tmp_path / "r.json"), {"x": float("nan"), "y": [1.5]})
    finally:
        os.umask(old)
    assert os.stat(tmp_path / "r.json").st_mode & 0o777 == 0o644
    assert json.loads((tmp_path / "r.json").read_text()) == {"x": None, "y": [1.5]}


# ------------------------------------------------------------------- random input, every flag

NASTY = ["nan", "inf", "-inf", "-1", "0", "1e308", "9" * 30, "", " ", "é", "$(touch X)",
         "`touch X`", "a;touch X", "'\"", "../../../etc/passwd", "/proc/x", "--", "-h5", "1e-320",
         "0x10", "\x7f"]


def parser_of(parse):
    """The (first) parser a command builds: its ``parse(argv)`` stopped at ``parse_args``."""
    import argparse
    captured = {}

    class Capture(Exception):
        pass

    def stop(self, argv=None, namespace=None):
        captured.setdefault("p", self)
        raise Capture()
    saved = argparse.ArgumentParser.parse_args
    argparse.ArgumentParser.parse_args = stop
    try:
        parse([])
    except Capture:
        pass
    finally:
        argparse.ArgumentParser.parse_args = saved
    return captured["p"]


def _flags(parser_fn):
    """Every --flag of a command that takes a value, from its own parser."""
    return [a.option_strings[0] for a in parser_of(parser_fn)._actions
            if a.option_strings and a.nargs != 0 and a.option_strings[0] != "--help"]


@pytest.mark.parametrize("name,fn,parse,base", [
    ("train", train.main, train.parse_args, TINY_BERT),
    ("comm_bench", comm_bench.main, comm_bench.parse_args, ["--ops", "allreduce"]),
    ("profiler", profiler.main, profiler.parse_args, ["--model", "bert_tiny"]),
    ("benchmarks.py", benchmarks.main, lambda a: benchmarks._run_parser().parse_args(a),
     ["--config", "quick", "--dry-run", "--results", "{tmp}/r"]),
])
def test_random_values_for_every_flag_are_a_run_or_one_line(name, fn, parse, base, tmp_path,
                                                             capfd, no_runs, monkeypatch):
    monkeypatch.chdir(tmp_path)  # a stray "touch X" would land here
    rng = random.Random(15)
    flags = _flags(parse)
    assert len(flags) >= (5 if name == "benchmarks.py" else 8), flags
    seen = set()
    for flag in flags:
        for value in rng.sample(NASTY, 6):
            argv = [a.replace("{tmp}", str(tmp_path)) for a in base] + [flag, value]
            try:
                seen.add(outcome(fn, argv, capfd))
            except Exception as e:  # the traceback a user would have seen
                raise AssertionError(f"{name} {flag} {value!r}: {type(e).__name__}: {e}") \
                    from e
    assert seen == {"run", "line"} or name == "benchmarks.py"
    assert not os.path.exists(tmp_path / "X")


def test_random_launcher_variables_are_a_run_or_one_line(tmp_path):
    """Every variable of the shell launchers, with dry_run=1 (the command is printed, not
    run): never a traceback, never a stray file."""
    hosts = tmp_path / "hosts"
    hosts.write_text("localhost slots=4\n")
    variables = ["nworkers", "bs", "dnn", "senlen", "iters", "image_size", "rdma", "method",
                 "threshold", "compressor", "density", "engine", "launcher", "extra_args",
                 "hostfile", "partition", "credit", "net"]
    rng = random.Random(15)
    results = {}
    for launcher, script in LAUNCHERS.items():
        extra = ["nservers", "bytescheduler", "job"] if launcher == "byteps" else []
        for var in variables + extra:
            for value in rng.sample(NASTY, 2):
                e = env(**{"hostfile": str(hosts), "nworkers": "2", "dry_run": "1", var: value})
                proc = subprocess.run(["bash", script], cwd=REPO,
                                      env=e, capture_output=True, text=True, timeout=60)
                lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
                ok = proc.returncode == 0 or (proc.returncode == 2 and len(lines) == 1)
                assert ok and "Traceback" not in proc.stderr, \
                    f"{script} {var}={value!r}: {describe(proc)}"
                results[proc.returncode] = results.get(proc.returncode, 0) + 1
    assert set(results) == {0, 2}
    assert not os.path.exists(os.path.join(REPO, "X"))


def test_extra_args_split_as_a_shell_would_and_expand_nothing(tmp_path):
    hosts = tmp_path / "hosts"
    hosts.write_text("localhost slots=2\n")
    path = str(tmp_path / "a dir with 'quotes'" / "r.json")
    e = env(hostfile=str(hosts), nworkers="2", dry_run="1",
            extra_args=f"--output {shlex.quote(path)} /etc/* $HOME")
    proc = subprocess.run(["bash", LAUNCHERS["horovod"]], cwd=REPO, env=e, capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == 0, describe(proc)
    words = shlex.split(proc.stdout)
    assert words[-4:] == ["--output", path, "/etc/*", "$HOME"]
    # timeline= (a path with spaces and quotes too) and timeline_iters= become their flags
    proc = subprocess.run(["bash", LAUNCHERS["horovod"]], cwd=REPO, capture_output=True,
                          env=dict(e, timeline=path, timeline_iters="3"), text=True, timeout=60)
    assert proc.returncode == 0, describe(proc)
    words = shlex.split(proc.stdout)
    assert words[words.index("--timeline") + 1] == path
    assert words[words.index("--timeline-iters") + 1] == "3"
    proc = subprocess.run(["bash", LAUNCHERS["horovod"]], cwd=REPO, capture_output=True,
                          env=dict(e, extra_args="--output 'unbalanced"), text=True, timeout=60)
    assert proc.returncode == 2 and "cannot split" in proc.stderr, describe(proc)


def test_an_rdma_sweep_cell_passes_a_path_with_spaces_and_quotes(tmp_path):
    cfg = tmp_path / "s.yaml"
    cfg.write_text("name: r\nnetworks: [rdma0]\n" + hostile.SWEEP_TASK
                   + "methods: [wfbp]\nnworkers: [2]\nhostfile: configs/cluster2\n")
    sweep = config.load(str(cfg), preflight=False)
    [cell] = sweep.cells()
    record_path = str(tmp_path / "my results" / "it's \"here\".json")
    cmd, extra = runner.command(sweep, cell, record_path)
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=60,
                          env=dict(env(), **extra, dry_run="1"))
    assert proc.returncode == 0, describe(proc)
    words = shlex.split(proc.stdout)
    assert words[words.index("--output") + 1] == record_path


# ------------------------------------------------------------------------------- the remote shell

def test_nothing_reaches_a_remote_shell_unquoted(tmp_path):
    evil = f"$(touch {tmp_path}/x); `touch {tmp_path}/y` ' \" \\ ;& | * ~ \n"
    code = "import json, os, sys; print(json.dumps([sys.argv[1:], os.environ['DDLBENCH_V']]))"
    line = pslaunch.remote_line(str(tmp_path), {"DDLBENCH_V": evil}, sys.executable,
                                ["-c", code, evil, "--x"])
    out = subprocess.run(["bash", "-c", line], capture_output=True, text=True, timeout=60)
    assert json.loads(out.stdout) == [[evil, "--x"], evil]
    assert os.listdir(tmp_path) == []
    with pytest.raises(UsageError, match="not a valid variable name"):
        pslaunch.remote_line(str(tmp_path), pslaunch.forwarded_env(
            {f"DDLBENCH_Z$(touch {tmp_path}/z)": "1", "HOME": "/"}), sys.executable, [])
    with pytest.raises(UsageError, match="job id"):
        pslaunch.check_job_id("a;b")


def test_an_injected_variable_name_stops_the_ps_launcher(tmp_path):
    hosts = tmp_path / "hosts"
    hosts.write_text("127.0.0.2 slots=1\n127.0.0.3 slots=1\n")
    e = env(**{f"DDLBENCH_Z$(touch {tmp_path}/x)": "1"})
    e["SSH"] = os.path.join(REPO, "tests", "fake_ssh.sh")
    proc = subprocess.run([sys.executable, "-m", "ddlbench.launch.pslaunch", "--hostfile",
                           str(hosts), "--nworkers", "2", "--", *TINY_BERT], cwd=REPO, env=e,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and "not a valid variable name" in proc.stderr, describe(proc)
    assert sorted(os.listdir(tmp_path)) == ["hosts"]


# ------------------------------------------------------------------------------ killed outright

def _job(marker):
    out = []
    for p in psutil.process_iter(["cmdline"]):
        try:
            if marker in " ".join(p.info["cmdline"] or []) and p.pid != os.getpid() and \
                    p.status() != psutil.STATUS_ZOMBIE:
                out.append(p)
        except psutil.Error:
            pass
    return out


def _kill_parent_and_wait(cmd, marker, expect, extra_env=None, gone=lambda: True):
    proc = subprocess.Popen(cmd, cwd=REPO, env=env(**(extra_env or {})),
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            start_new_session=True)
    try:
        deadline = time.monotonic() + 120
        while len(_job(marker)) < expect and time.monotonic() < deadline and proc.poll() is None:
            time.sleep(0.2)
        assert len(_job(marker)) >= expect, proc.stderr.read().decode() if proc.poll() else ""
        time.sleep(1.0)
        proc.kill()  # SIGKILL: no handler runs in the parent
        proc.wait()
        deadline = time.monotonic() + 10
        while (_job(marker) or not gone()) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert _job(marker) == [] and gone()
    finally:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        for p in _job(marker):
            p.kill()


LONG = [*TINY_BERT, "--num-warmup-batches", "1000000", "--timeout", "60"]


@pytest.mark.timeout(200)
def test_kill_9_of_the_spawner_takes_workers_and_servers_along():
    marker = f"kill9-{uuid.uuid4().hex[:8]}"
    _kill_parent_and_wait([sys.executable, "-m", "ddlbench.train", "--nworkers", "2",
                           "--method", "wfbpps", "--nservers", "1", "--ps-force-servers",
                           "--job-id", marker, *LONG],
                          marker, expect=4)  # the spawner, 2 workers, 1 server


@pytest.mark.timeout(200)
def test_kill_9_of_the_ps_launcher_takes_its_remote_processes_along(tmp_path):
    marker = f"kill9ps-{uuid.uuid4().hex[:8]}"
    hosts = tmp_path / "hosts"
    hosts.write_text("127.0.0.2 slots=1\n127.0.0.3 slots=1\n")
    _kill_parent_and_wait([sys.executable, "-m", "ddlbench.launch.pslaunch", "--hostfile",
                           str(hosts), "--nworkers", "2", "--nservers", "1", "--job-id", marker,
                           "--", "--method", "wfbpps", *LONG], marker, expect=4,
                          extra_env={"SSH": os.path.join(REPO, "tests", "fake_ssh.sh")})


@pytest.mark.timeout(200)
def test_kill_9_under_an_emulated_network_reclaims_its_namespaces(tmp_path):
    from ddlbench import netem
    why = netem.unavailable_reason()
    if why:
        pytest.skip(why)
    marker = f"kill9net-{uuid.uuid4().hex[:8]}"
    state = tmp_path / "netem"
    state.mkdir()
    before = set(netem.list_namespaces())

    def no_namespaces():
        return not set(netem.list_namespaces()) - before and not list(state.glob("*.json"))
    _kill_parent_and_wait([sys.executable, "-m", "ddlbench.train", "--nworkers", "2", "--net",
                           "1gbit", "--job-id", marker, *LONG], marker, expect=3,
                          extra_env={"DDLBENCH_NETEM_STATE": str(state),
                                     "DDLBENCH_NET_PROBE_S": "0"}, gone=no_namespaces)


def test_the_reaper_removes_a_dead_owners_set(tmp_path, monkeypatch):
    """The watcher a cluster starts: it outlives its owner by one poll and removes the owner's
    state (no namespace needed to show it)."""
    monkeypatch.setenv("DDLBENCH_NETEM_STATE", str(tmp_path))
    owner = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(0.5)"])
    (tmp_path / "abc123.json").write_text(json.dumps({"run_id": "abc123", "namespaces": []}))
    assert netem_state.reap("abc123", owner.pid, poll_s=0.05) is True
    owner.wait()
    assert os.listdir(tmp_path) == []
    # A run that ends normally removes its file first: the watcher leaves quietly.
    assert netem_state.reap("gone", os.getpid()) is False


@pytest.mark.timeout(200)
def test_a_dead_worker_is_named_in_one_line():
    marker = f"dead-{uuid.uuid4().hex[:8]}"
    proc = subprocess.Popen([sys.executable, "-m", "ddlbench.train", "--nworkers", "2",
                             "--job-id", marker, *LONG], cwd=REPO, env=env(),
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    try:
        deadline = time.monotonic() + 120
        while len(_job(marker)) < 3 and time.monotonic() < deadline:
            time.sleep(0.2)
        [victim] = [p for p in _job(marker) if p.pid != proc.pid
                    and p.environ().get("RANK") == "1"]
        time.sleep(2)
        victim.kill()
        _, err = proc.communicate(timeout=90)
        assert proc.returncode == 128 + signal.SIGKILL, err
        named = [ln for ln in err.splitlines() if "worker 1" in ln]
        assert named and named[0] == (f"ddlbench: worker 1 (pid {victim.pid}) was killed by "
                                      f"SIGKILL; stopping the others"), err
        assert "Traceback" not in err, err
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)


# ------------------------------------------------------------------------- stop.sh, one job only

def test_stop_sh_stops_its_job_and_leaves_a_decoy(tmp_path):
    hosts = tmp_path / "hosts"
    hosts.write_text("localhost slots=2\n")
    sleep = "import time, sys; time.sleep(120)"
    target = f"stopme-{uuid.uuid4().hex[:8]}"
    procs = [subprocess.Popen([sys.executable, "-c", sleep, "ddlbench.train", *job_args])
             for job_args in (["--job-id", target], ["--job-id", target + "x"], [])]
    try:
        e = env(hostfile=str(hosts))
        # (without job=, every PS job of this user and checkout: tests/test_stop.py)
        proc = subprocess.run(["bash", "byteps/stop.sh"], cwd=REPO, env=dict(e, job=target),
                              capture_output=True, text=True, timeout=60)
        assert proc.returncode == 0, describe(proc)
        procs[0].wait(timeout=10)
        time.sleep(0.3)
        assert procs[1].poll() is None and procs[2].poll() is None  # the decoys live on
    finally:
        for p in procs:
            p.kill()
            p.wait()


# --------------------------------------------------------------- a sweep runs what it records

def test_a_sweep_runs_exactly_what_it_records(tmp_path, monkeypatch):
    monkeypatch.setenv(config.PROGRAM_ENV, "tests.fake_train")

    def sweep_file(name, extra=""):
        path = tmp_path / f"{name}.yaml"
        path.write_text(f"name: {name}\nnetworks: [local]\n" + hostile.SWEEP_TASK
                        + "methods: [wfbp]\nnworkers: [1]\ntries: 1\ntimeout: 60\n"
                        + f"results: {tmp_path}/results-{name}\nlogs: {tmp_path}/logs\n" + extra)
        return str(path)

    def ran(name):
        [folder] = os.listdir(tmp_path / f"results-{name}")
        entries, bad = store.read(str(tmp_path / f"results-{name}" / folder / "results.jsonl"))
        [entry] = [e for e in entries if e["kind"] == "try"]
        assert entry["status"] == "ok" and bad == 0, entry
        return entry

    assert benchmarks.main(["--config", sweep_file("clean"), "--quiet"]) == 0
    clean = ran("clean")
    for k, v in {"DDLBENCH_NET": "1gbit", "BYTESCHEDULER_PARTITION": "7",
                 "BYTESCHEDULER_CREDIT": "9", "DMLC_NUM_SERVER": "3",
                 "HOROVOD_FUSION_THRESHOLD": "1",
                 # the shell launchers' own variables, which the sweep sets per run itself
                 "iters": "1", "extra_args": "--verify 1", "timeline": "/tmp/x.json"}.items():
        monkeypatch.setenv(k, v)
    assert benchmarks.main(["--config", sweep_file("leaky"), "--quiet"]) == 0
    leaky = ran("leaky")
    assert leaky["record"]["inherited"] == {} and leaky["hash"] == clean["hash"]
    # What the sweep file sets reaches the run, and is part of the cell.
    assert benchmarks.main(["--config", sweep_file("set", "env: {BYTESCHEDULER_CREDIT: 5000}\n"),
                            "--quiet"]) == 0
    chosen = ran("set")
    assert chosen["record"]["inherited"] == {"BYTESCHEDULER_CREDIT": "5000"}
    assert chosen["config"]["env"] == {"BYTESCHEDULER_CREDIT": "5000"}
    assert chosen["hash"] != clean["hash"]
    # Inherited thread settings are kept, recorded and hashed.
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    assert benchmarks.main(["--config", sweep_file("omp"), "--quiet"]) == 0
    omp = ran("omp")
    assert omp["record"]["inherited"] == {"OMP_NUM_THREADS": "1"}
    assert omp["config"]["environment"] == {"OMP_NUM_THREADS": "1"}
    assert omp["hash"] != clean["hash"]


def test_a_bad_flag_is_said_once_per_job(tmp_path):
    """Every process of a job meets the same bad flag; one of them says so."""
    hosts = tmp_path / "hosts"
    hosts.write_text("127.0.0.2 slots=1\n127.0.0.3 slots=1\n")
    e = env(SSH=os.path.join(REPO, "tests", "fake_ssh.sh"))
    proc = subprocess.run([sys.executable, "-m", "ddlbench.launch.pslaunch", "--hostfile",
                           str(hosts), "--nworkers", "2", "--nservers", "2", "--", *TINY_BERT,
                           "--method", "wfbpps", "--bogus"], cwd=REPO, env=e,
                          capture_output=True, text=True, timeout=120)
    errors = [ln for ln in proc.stderr.splitlines() if "error" in ln]
    assert proc.returncode == 2 and errors == [
        "ddlbench: error: unrecognized arguments: --bogus"], describe(proc)

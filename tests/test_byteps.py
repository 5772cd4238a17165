"""The real-BytePS lane (byteps/legacy_env.sh, --engine byteps): BytePS 0.2.5.post15 with the
project's patch (byteps/cpu_only.patch), built on the Horovod environment.

Bad input and a missing prerequisite are one line each. Where the environment is built (as
`make test` does first): the patch applied cleanly to the registry's source and the build
recorded its hash; 2 CPU workers push_pull through 1 real server, each in shared memory of its
own; `--verify 3` passes for wfbpps (2 workers, 1 server), bspps and byteschedulerps (2
workers, 2 servers; the servers' scheduling heap is the patch's) through
`engine=byteps ./byteps/byteps_launch.sh`; a run's record names BytePS and the patch, its
servers' traffic lines add up to every push and pull, and its --timeline holds BytePS's own
trace; a BytePS server that dies ends the job within 30 s with one line, leaving no process.
Elsewhere those tests skip with the reason the build recorded, where that reason holds
(tests/skip_conditions.py); any other reason, or an environment that is simply not built,
fails."""
import glob
import hashlib
import json
import os
import re
import shutil
import signal
import subprocess
import time

import pytest

from ddlbench import netem

from .conftest import MOMENTUM_SGD, REPO, SMALL_CNN, describe, env, verify_lines
from .skip_conditions import byteps_skip_reason

NETEM = netem.unavailable_reason()
needs_netem = pytest.mark.skipif(NETEM is not None, reason=NETEM or "")

SCRIPT = os.path.join(REPO, "byteps", "legacy_env.sh")
CHECK = os.path.join(REPO, "byteps", "legacy_check.sh")
PATCH = os.path.join(REPO, "byteps", "cpu_only.patch")
LAUNCHER = os.path.join(REPO, "byteps", "byteps_launch.sh")


def _run(tmp_path, *args, timeout=60, **extra):
    """The script with a cache folder of the test's own."""
    e = dict(os.environ, DDLBENCH_CACHE=str(tmp_path / "cache"), **extra)
    return subprocess.run([SCRIPT, *args], env=e, capture_output=True, text=True,
                          timeout=timeout)


def _one_line(proc, code: int, message: str) -> str:
    assert proc.returncode == code and proc.stdout == "", describe(proc)
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("byteps-env: error: ") \
        and message in lines[0], proc.stderr
    return lines[0][len("byteps-env: error: "):]


@pytest.mark.parametrize("args,message", [
    (["frobnicate"], "unknown command 'frobnicate' (build [--optional], python, remove, "
                     "where)"),
    (["build", "--fast"], "unknown option '--fast' (build [--optional])"),
])
def test_bad_commands_are_one_line(tmp_path, args, message):
    _one_line(_run(tmp_path, *args), 2, message)


def test_without_the_horovod_environment_the_build_stops_before_it_starts(tmp_path):
    """(A cache of the test's own holds no Horovod environment.)"""
    why = _one_line(_run(tmp_path, "build"), 2, "the real-Horovod environment it is built on "
                                                "is missing")
    assert "make horovod-env" in why
    assert not (tmp_path / "cache" / "src").exists()   # nothing fetched, nothing built
    # --optional: not an error; the reason is recorded for the tests' skips and `python`
    proc = _run(tmp_path, "build", "--optional")
    assert proc.returncode == 0, describe(proc)
    assert (tmp_path / "cache" / "byteps-env.unavailable").read_text().strip() == why
    assert _one_line(_run(tmp_path, "python"), 3, why) == why
    proc = _run(tmp_path, "remove")
    assert proc.returncode == 0 and not (tmp_path / "cache" / "byteps-env.unavailable").exists()
    _one_line(_run(tmp_path, "python"), 1, "the BytePS environment is not built")


def test_the_environment_is_named_by_the_patch(tmp_path):
    """Another patch is another environment; the same patch, the same one."""
    where = _run(tmp_path, "where")
    again = _run(tmp_path, "where")
    assert where.returncode == 0 and where.stdout == again.stdout, describe(where)
    changed = tmp_path / "changed.patch"
    with open(PATCH) as f:
        changed.write_text(f.read() + "\n")
    copy = tmp_path / "byteps"
    copy.mkdir()
    for name in ("legacy_env.sh", "legacy_check.sh"):
        (copy / name).symlink_to(os.path.join(REPO, "byteps", name))
    (copy / "cpu_only.patch").symlink_to(changed)
    (tmp_path / "horovod").symlink_to(os.path.join(REPO, "horovod"))
    (tmp_path / "scripts").symlink_to(os.path.join(REPO, "scripts"))
    other = subprocess.run([str(copy / "legacy_env.sh"), "where"], capture_output=True,
                           text=True, env=dict(os.environ, DDLBENCH_CACHE=str(tmp_path)))
    assert other.returncode == 0 and other.stdout.strip() != where.stdout.strip(), \
        describe(other)


@pytest.fixture(scope="session")
def byteps_python():
    """The environment's Python, building it where it is missing (as `make test` does)."""
    build = subprocess.run([SCRIPT, "build", "--optional"], capture_output=True, text=True,
                           timeout=3600)
    assert build.returncode == 0, f"building the BytePS environment failed:\n{build.stderr}"
    proc = subprocess.run([SCRIPT, "python"], capture_output=True, text=True, timeout=60)
    reason = byteps_skip_reason(proc)    # a condition really absent here, or fails
    if reason is not None:
        pytest.skip("real BytePS: " + reason)
    return proc.stdout.strip()


def test_the_patch_applied_to_the_registry_source_and_its_hash_is_recorded(byteps_python):
    where = subprocess.run([SCRIPT, "where"], capture_output=True, text=True).stdout.strip()
    with open(where + ".log") as f:
        log = f.read()
    with open(PATCH) as f:
        patched = re.findall(r"^diff --git a/(\S+) ", f.read(), re.M)
    assert len(patched) >= 10, patched
    for name in patched:
        assert f"Applied patch {name} cleanly." in log, name
    with open(PATCH, "rb") as f:
        sha = hashlib.sha256(f.read()).hexdigest()
    assert f"patch sha256 {sha}" in log
    with open(os.path.join(where, "byteps-env.json")) as f:
        recorded = json.load(f)
    assert recorded["patch_sha256"] == sha and recorded["byteps"] == "0.2.5.post15"
    assert recorded["torch"].startswith("2.0.1"), recorded


def test_two_cpu_workers_push_pull_in_shared_memory_of_their_own(byteps_python):
    check = subprocess.run([CHECK, byteps_python], capture_output=True, text=True,
                           timeout=300)
    assert check.returncode == 0, describe(check)
    segments = {}
    for rank in (0, 1):
        assert f"worker {rank} of 2 push_pull: [3.0, 3.0, 3.0, 3.0]" in check.stdout
        assert f"worker {rank} average of 10 partitions: ok" in check.stdout
        line = re.search(rf"^worker {rank} shared memory: (.*)$", check.stdout, re.M)
        segments[rank] = set(line.group(1).split())
        # BytePS_ShM_<job>_<worker>_<key>: one segment per tensor, named for the worker
        assert len(segments[rank]) == 2 and all(
            re.fullmatch(rf"/dev/shm/BytePS_ShM_\d+_{rank}_\d+", s) for s in segments[rank]), \
            check.stdout
    # unpatched, both workers mapped /dev/shm/BytePS_ShM_<key> and wrote over each other
    assert not segments[0] & segments[1], check.stdout


def _hostfile(tmp_path, n):
    path = tmp_path / f"hosts{n}"
    path.write_text(f"localhost slots={n}\n")
    return str(path)


# SqueezeNet 1.1 (1.2 M parameters, 52 tensors, the largest 4 MB in float64): a step of
# ResNet-18's 11.7 M takes BytePS 3 times as long here, its loop threads spinning beside the
# workers on 2 cores.
LANE_CNN = {"dnn": "squeezenet1_1", "bs": "4", "image_size": "32"}


def _launch(byteps_python, tmp_path, method, nservers, extra, timeout=240, **more):
    variables = {"nworkers": 2, "nservers": nservers, "hostfile": _hostfile(tmp_path, 2),
                 "method": method, "engine": "byteps", "BYTEPS_PY": byteps_python,
                 "extra_args": " ".join(extra), **LANE_CNN, **more}
    return subprocess.run(["bash", LAUNCHER], cwd=REPO, env=env(**variables),
                          capture_output=True, text=True, timeout=timeout)


@pytest.mark.parametrize("method,nservers,partition", [
    ("wfbpps", 1, 1 << 18), ("bspps", 2, None), ("byteschedulerps", 2, 1 << 15)])
def test_verify_on_real_byteps(byteps_python, tmp_path, method, nservers, partition):
    """wfbpps, bspps and byteschedulerps on real BytePS end each of 3 momentum-SGD steps
    (float64) with the parameters of single-process SGD on the averaged gradient."""
    # wfbpps in 256 KB partitions (the largest gradients in several), bspps's one flat gradient
    # in BytePS's default 4,096,000. byteschedulerps in 32 KB (335 partitions over 2 servers):
    # on 0.2.5's stale scheduling heap (BYTEPS_SERVER_SCHEDULE_HEAP=original) this failed 3 runs
    # of 3, partitions summed over one worker only; on the patch's heap it passes.
    partition = ["--partition-bytes", str(partition)] if partition else []
    proc = _launch(byteps_python, tmp_path, method, nservers,
                   ["--verify", "3", *MOMENTUM_SGD, "--dtype", "float64", "--timeout", "120",
                    *partition])
    assert proc.returncode == 0, describe(proc)
    lines = verify_lines(proc.stdout)[method]
    assert [s for s, *_ in lines] == [1, 2, 3] and all(ok for *_, ok in lines), proc.stdout
    assert f"verify: parameter servers: {nservers}" in proc.stdout, proc.stdout


def test_the_record_says_which_byteps_ran_and_the_timeline_holds_its_trace(
        byteps_python, tmp_path, load_json):
    """A timed run's record names BytePS's version, the patch's hash and the settings; with
    --timeline, BytePS's own trace of the recorded steps is on it: every gradient's push_pull
    (its bytes) and each partition's four stages in order, inside the recorded iterations."""
    from ddlbench.timeline import COMM, ITERATION, read_trace
    out, trace = tmp_path / "record.json", tmp_path / "trace.json"
    # 1 warmup step, 3 timed, the first 2 recorded: BytePS traces steps 2 and 3
    proc = _launch(byteps_python, tmp_path, "byteschedulerps", 2,
                   ["--num-warmup-batches", "1", "--num-batches-per-iter", "3", "--num-iters",
                    "1", "--timeline", str(trace), "--timeline-iters", "2",
                    "--output", str(out)])
    assert proc.returncode == 0, describe(proc)
    record = load_json(out)
    method = record["method"]
    with open(PATCH, "rb") as f:
        sha = hashlib.sha256(f.read()).hexdigest()
    assert method["engine"] == "byteps" and method["nservers"] == 2, method
    assert method["algorithm"]["server_schedule"] == "priority", method
    bps = method["byteps"]
    assert (bps["byteps"], bps["patch_sha256"]) == ("0.2.5.post15", sha), bps
    assert bps["settings"] == {"BYTEPS_CPU_ONLY": "1", "BYTEPS_PARTITION_BYTES": "4096000",
                               "BYTEPS_SERVER_ENABLE_SCHEDULE": "1", "DMLC_NUM_SERVER": "2",
                               "DMLC_NUM_WORKER": "2", "BYTEPS_TRACE_ON": "1",
                               "BYTEPS_TRACE_START_STEP": "2",
                               "BYTEPS_TRACE_END_STEP": "3",
                               # the launcher's settings for a small machine
                               "DDLBENCH_BYTEPS_FAIR": "1", "BYTEPS_SERVER_ENGINE_THREAD": "1",
                               "BYTEPS_OMP_THREAD_PER_GPU": "1", "BYTEPS_ZMQ_NTHREADS": "1",
                               "OMP_WAIT_POLICY": "PASSIVE"}, bps
    # BytePS's processes pinned as the suite's local spawner pins its own: the same plan, and
    # each worker ran on the cores it planned (read by the worker itself)
    from ddlbench.hosts import pinning
    placed = record["environment"]["placement"]
    plan = pinning.plan(2, 2)
    assert (placed["pinning"], placed["workers"], placed["servers"]) == (plan["pinning"], 2, 2)
    workers = [r for r in placed["ranks"] if r["role"] == "worker"]
    assert [r["cores"] for r in workers] == [sorted(r["cores"]) for r in plan["ranks"][:2]]
    assert not any("planned_cores" in r for r in placed["ranks"]), placed
    assert record["timeline"]["comm_observed"] is True, record["timeline"]
    # each server's traffic line (the patch's): together they summed every worker's gradient
    # each of the 4 steps, one push per gradient, and answered as many pulls
    gradient = record["model"]["gradient_bytes"]
    lines = re.findall(r"ddl-benchmarks: BytePS server (\d) received (\d+) pushes of (\d+) "
                       r"bytes and answered (\d+) pulls with (\d+) bytes, after (\d+) init "
                       r"pushes of (\d+) bytes", proc.stdout + proc.stderr)
    assert sorted(int(line[0]) for line in lines) == [0, 1], describe(proc)
    totals = [sum(int(line[i]) for line in lines) for i in range(1, 7)]
    assert totals == [2 * 4 * 52, 2 * 4 * gradient, 2 * 4 * 52, 2 * 4 * gradient,
                      2 * 52, 2 * gradient], lines

    import torchvision
    sizes = {f"Gradient.{n}": p.numel() * 4
             for n, p in torchvision.models.squeezenet1_1().named_parameters()}
    ranks, _ = read_trace(str(trace), "the trace")
    assert [r["rank"] for r in ranks] == [0, 1]
    for r in ranks:
        events = r["events"]
        steps = sorted((e[3], e[4]) for e in events if e[1] == ITERATION)
        assert len(steps) == 2
        ours = [e for e in events if e[1] == COMM]
        assert ours and all(steps[0][0] <= e[3] <= e[4] <= steps[-1][1] for e in ours)
        totals = [e for e in ours if e[2] == "push_pull"]
        # each gradient once a step, with its bytes (float32)
        assert sorted(e[5]["tensor"] for e in totals) == sorted(list(sizes) * 2)
        assert all(e[5]["bytes"] == sizes[e[5]["tensor"]] for e in totals)
        parts: dict = {}
        for e in ours:
            if e[2] != "push_pull":
                assert e[2] == f"byteps {e[0].upper()}", e
                parts.setdefault(e[5]["key"], []).append(e)
        # the default 4,096,000-byte partitions: one per gradient, 4 stages, 2 steps
        assert len(parts) == len(sizes)
        for key, stages in parts.items():
            stages.sort(key=lambda e: e[3])
            assert [e[0] for e in stages] == ["copyd2h", "push", "pull", "copyh2d"] * 2, key
            assert all(a[4] <= b[3] + 1 for a, b in zip(stages, stages[1:])), stages


def test_a_sweep_runs_byteps_beside_the_torch_engine(byteps_python, tmp_path):
    """benchmarks.py with engines [torch, byteps]: BytePS's cell through its shell launcher
    (its scheduler and server started), the torch engine's with servers too, both recorded,
    and the engine ratio table."""
    import benchmarks
    cfg = tmp_path / "sweep.yaml"
    cfg.write_text(
        "name: lanes\nnetworks: [local]\n"
        "tasks:\n  - {model: squeezenet1_1, batch_size: 4, image_size: 32}\n"
        "methods: [{method: wfbpps, args: \"--ps-force-servers --ps-clients process\"}]\n"
        "engines: [torch, byteps]\nnworkers: [2]\ntries: 1\n"
        "timing: {warmup: 1, batches_per_iter: 2, iters: 1}\ntimeout: 300\nkill_grace: 10\n")
    out = tmp_path / "results"
    assert benchmarks.main(["--config", str(cfg), "--results", str(out)]) == 0
    with open(out / "results.jsonl") as f:
        tries = [json.loads(line) for line in f][1:]
    assert sorted(t["status"] for t in tries) == ["ok", "ok"], tries
    engines = {t["record"]["method"].get("engine", "torch"): t for t in tries}
    assert set(engines) == {"torch", "byteps"}
    bps = engines["byteps"]
    assert "engine=byteps" in bps["command"] and "byteps/byteps_launch.sh" in bps["command"]
    assert bps["record"]["method"]["byteps"]["patch_sha256"], bps["record"]["method"]
    for t in tries:   # both with one real server
        assert t["record"]["method"]["nservers"] == 1, t["record"]["method"]
    report = (out / "README.md").read_text()
    assert re.search(r"\| squeezenet1_1 \| 4 \| local \| wfbpps .*\| byteps \| \d+\.\d\d \|",
                     report), report


def test_a_sweep_refuses_byteps_cells_without_the_environment(tmp_path, monkeypatch):
    from ddlbench.sweep import config
    script = tmp_path / "legacy_env.sh"
    script.write_text("#!/bin/sh\necho 'byteps-env: error: not built here: make byteps-env' >&2"
                      "\nexit 2\n")
    script.chmod(0o755)
    from ddlbench import flags
    monkeypatch.setitem(flags.LANE_ENVIRONMENTS, "byteps",
                        flags.LANE_ENVIRONMENTS["byteps"]._replace(env_script=str(script)))
    assert config._lane_env_problem("byteps") == "engine byteps: not built here: make byteps-env"


def _job_processes(job: str) -> list[int]:
    from ddlbench.launch.pslaunch import command_lines
    return [pid for pid, argv in command_lines() if job in argv and "--job-id" in argv]


def test_a_dead_byteps_server_ends_the_job(byteps_python, tmp_path):
    """A server killed in the middle of a run: within 30 s the launcher has stopped every
    process of the job and said which one died, in one line."""
    job = f"deadserver{os.getpid()}"
    variables = {"nworkers": 2, "nservers": 1, "hostfile": _hostfile(tmp_path, 2),
                 "method": "wfbpps", "engine": "byteps", "BYTEPS_PY": byteps_python,
                 **LANE_CNN, "iters": "1000", "job": job,
                 "extra_args": f"--timeline {tmp_path / 'trace.json'}"}
    log = tmp_path / "out"
    with open(log, "w") as out_file:
        proc = subprocess.Popen(["bash", LAUNCHER], cwd=REPO, env=env(**variables),
                                stdout=out_file, stderr=subprocess.PIPE, text=True,
                                start_new_session=True)
    try:
        server = None
        deadline = time.monotonic() + 120
        while server is None and time.monotonic() < deadline and proc.poll() is None:
            time.sleep(0.5)
            for pid in _job_processes(job):
                with open(f"/proc/{pid}/cmdline", "rb") as f:
                    argv = f.read().decode(errors="replace").split("\0")
                with open(f"/proc/{pid}/environ", "rb") as f:
                    environ = f.read().decode(errors="replace").split("\0")
                if "ddlbench.launch.bpsserver" in argv and "DMLC_ROLE=server" in environ:
                    server = pid
        assert server is not None, "no BytePS server of the job appeared"
        # the workers are past bps.init() and the warm-up, training: rank 0 says so
        while "Running benchmark..." not in log.read_text() and proc.poll() is None:
            assert time.monotonic() < deadline + 180, "the workers did not start training"
            time.sleep(0.2)
        assert proc.poll() is None, "the job ended before its server was killed"
        os.kill(server, signal.SIGKILL)
        killed = time.monotonic()
        _, err = proc.communicate(timeout=60)
        took = time.monotonic() - killed
        out = log.read_text()
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
    assert proc.returncode != 0 and took < 30, (took, out[-2000:], err[-3000:])
    assert re.search(r"BytePS server 0 on localhost .*(SIGKILL|signal 9)", err), err[-3000:]
    gone = time.monotonic() + 10     # (a process may still be exiting as the launcher ends)
    while _job_processes(job) and time.monotonic() < gone:
        time.sleep(0.1)
    assert _job_processes(job) == [], "processes of the job are left"
    # the workers, killed, left their shared memory, sockets and trace directories (the run
    # writes a timeline): the launcher removed them
    left = [f for pattern in (f"/dev/shm/BytePS_ShM_{job}_*", f"/tmp/socket_*_{job}_*",
                              f"/tmp/ddlbench-byteps-trace-{job}-*")
            for f in glob.glob(pattern)]
    assert left == [], left


# -- when the lane's tests may skip (injected answers) -------------------------------------------

REGISTRY = ("the package registry cannot be reached (pip download byteps==0.2.5.post15 ...: "
            "WARNING: Retrying (Retry(total=0)) after connection broken by 'NewConnectionError"
            "(...: Failed to establish a new connection: [Errno 101] Network is unreachable')")
NO_HOROVOD = ("the real-Horovod environment it is built on is missing (the package registry "
              "cannot be reached (...)): build it first (make horovod-env)")


def _answer(script: str, code: int, reason: str) -> subprocess.CompletedProcess:
    return subprocess.CompletedProcess([script, "python"], code, "",
                                       f"{script.split('/')[0]}-env: error: {reason}\n")


@pytest.mark.parametrize("code,reason,horovod_code,horovod_reason,skips", [
    (3, REGISTRY, 0, "", True),
    # the Horovod environment it stands on is missing for a skip's reason, or it is here
    (3, NO_HOROVOD, 3, REGISTRY.replace("byteps==0.2.5.post15", "torch==2.0.1"), True),
    (3, NO_HOROVOD, 0, "", False),
    # any pip failure was recorded as "cannot be reached": a registry that answered is not one
    (3, "the package registry cannot be reached (pip download byteps==0.2.5.post15 ...: "
        "ERROR: No matching distribution found for byteps==0.2.5.post15)", 0, "", False),
    (1, "the BytePS environment is not built (/x); run: make byteps-env", 0, "", False),
    (1, "building byteps==0.2.5.post15 failed: error: x; see /x.log", 0, "", False),
    (3, "0.2.5's worker needs a CUDA device", 0, "", False),   # no longer a reason
])
def test_the_skip_is_only_for_a_condition_really_absent(code, reason, horovod_code,
                                                        horovod_reason, skips):
    proc = _answer("byteps/legacy_env.sh", code, reason)
    hvd = _answer("horovod/legacy_env.sh", horovod_code, horovod_reason)
    if skips:
        assert byteps_skip_reason(proc, horovod=hvd) == reason
    else:
        with pytest.raises(AssertionError):
            byteps_skip_reason(proc, horovod=hvd)


def test_missing_debian_packages_skip_only_where_they_are_missing(monkeypatch):
    zmq = ("ZeroMQ's development files are missing (/usr/include/zmq.h, libzmq.so): install "
           "libzmq3-dev (make cluster-deps does)")
    proc = _answer("byteps/legacy_env.sh", 3, zmq)
    monkeypatch.setattr(os.path, "exists", lambda path: False)
    assert byteps_skip_reason(proc) == zmq
    monkeypatch.setattr(os.path, "exists", lambda path: True)
    with pytest.raises(AssertionError, match="are here"):
        byteps_skip_reason(proc)


APT_OFFLINE = ("W: Failed to fetch http://deb.debian.org/debian/dists/bookworm/InRelease  "
               "Temporary failure resolving 'deb.debian.org'")
APT_NO_PACKAGE = "E: Unable to locate package slurm-client"


@pytest.mark.parametrize("uid,update,install,code,last", [
    ("0", APT_OFFLINE, APT_OFFLINE, 0, "system-deps: the package registry cannot be reached"),
    ("0", "", APT_NO_PACKAGE, 1, "system-deps: error: apt-get could not install "
                                 "openssh-client slurm-client util-linux: " + APT_NO_PACKAGE),
    ("1000", "", "", 0, "system-deps: not root: cannot install openssh-client"),
])
def test_system_deps_skips_only_for_a_reason_it_names(tmp_path, uid, update, install, code,
                                                      last):
    """scripts/system-deps.sh --optional (as `make test` runs it) with ssh, srun, unshare out
    of PATH, `id` and `apt-get` fakes: an unreachable registry or no root skips (exit 0, the
    reason said); apt-get failing otherwise is an error (exit 1), --optional or not."""
    if not os.path.exists("/etc/debian_version"):
        pytest.skip("not a Debian machine: scripts/system-deps.sh stops before apt-get")
    bin_ = tmp_path / "bin"
    bin_.mkdir()
    for tool in ("sort", "grep", "mktemp", "tail", "rm", "chmod", "cat"):
        os.symlink(shutil.which(tool), bin_ / tool)
    (bin_ / "id").write_text(f"#!/bin/sh\necho {uid}\n")
    (bin_ / "apt-get").write_text(
        '#!/bin/sh\nif [ "$1" = update ]; then out="$UPDATE"; else out="$INSTALL"; fi\n'
        '[ -z "$out" ] && exit 0\necho "$out"; exit 100\n')
    for fake in ("id", "apt-get"):
        (bin_ / fake).chmod(0o755)
    e = dict(os.environ, PATH=str(bin_), UPDATE=update, INSTALL=install)
    for args, want in ((["--optional"], code), ([], 2 if code == 0 else code)):
        proc = subprocess.run(["/bin/bash", os.path.join(REPO, "scripts", "system-deps.sh"),
                               *args], env=e, capture_output=True, text=True, timeout=60)
        assert proc.returncode == want, (args, proc.stderr)
        for log in set(re.findall(r"/tmp/ddlbench-system-deps\.\w+\.log", proc.stderr)):
            os.remove(log)
        assert proc.stderr.strip().splitlines()[-1].startswith(last), proc.stderr


# -- the launcher's side (no BytePS needed) -------------------------------------------------------

def test_every_worker_is_a_byteps_worker_of_its_own(monkeypatch):
    from ddlbench.launch import pslaunch
    common, roles, names = pslaunch.byteps_roles(["a", "a", "b"], ["c"], "a", "9000", "9001",
                                                 local=False)
    assert common["DMLC_NUM_WORKER"] == "3" and common["DMLC_NUM_SERVER"] == "1"
    assert common["DDLBENCH_ENGINE"] == "byteps" and common["DDLBENCH_STORE_PORT"] == "9001"
    assert "DMLC_NODE_HOST" not in common     # (only when every process is on this machine)
    assert names == ["BytePS scheduler on a", "BytePS server 0 on c", "worker 0 on a",
                     "worker 1 on a", "worker 2 on b"]
    assert [r["DMLC_ROLE"] for _, r in roles] == ["scheduler", "server", "worker", "worker",
                                                  "worker"]
    workers = [r for _, r in roles if r["DMLC_ROLE"] == "worker"]
    assert [(w["DMLC_WORKER_ID"], w["BYTEPS_LOCAL_RANK"], w["BYTEPS_LOCAL_SIZE"])
            for w in workers] == [("0", "0", "1"), ("1", "0", "1"), ("2", "0", "1")]
    # processes per host, for the workers' thread share: host a holds the scheduler too
    assert [r["DDLBENCH_LOCAL_SIZE"] for _, r in roles] == ["3", "1", "3", "3", "1"]
    common, _, _ = pslaunch.byteps_roles(["localhost"] * 2, ["localhost"], "localhost", "1",
                                         "2", local=True)
    assert common["DMLC_PS_ROOT_URI"] == common["DMLC_NODE_HOST"] == "127.0.0.1"
    assert "BYTEPS_SERVER_SCHEDULE_HEAP" not in common
    # 0.2.5's scheduling heap, asked for, reaches every process (ssh forwards no BYTEPS_*)
    monkeypatch.setenv("BYTEPS_SERVER_SCHEDULE_HEAP", "original")
    common, _, _ = pslaunch.byteps_roles(["a"] * 2, ["c"], "a", "1", "2", local=False)
    assert common["BYTEPS_SERVER_SCHEDULE_HEAP"] == "original"


def test_the_lane_sets_what_a_byteps_user_sets_on_a_small_machine(monkeypatch):
    """By default one server engine thread, one OpenMP thread per worker, one ZMQ I/O thread,
    passive OpenMP waits, and the processes pinned; each overridable; DDLBENCH_BYTEPS_FAIR=0 is
    the lane as shipped before (none of them, no pinning, the idle compress loops started)."""
    from ddlbench.errors import UsageError
    from ddlbench.launch import pslaunch
    fair = {"DDLBENCH_BYTEPS_FAIR": "1", "BYTEPS_SERVER_ENGINE_THREAD": "1",
            "BYTEPS_OMP_THREAD_PER_GPU": "1", "BYTEPS_ZMQ_NTHREADS": "1",
            "OMP_WAIT_POLICY": "PASSIVE"}
    assert pslaunch.lane_settings({}) == (fair, True)
    assert pslaunch.lane_settings({"BYTEPS_SERVER_ENGINE_THREAD": "8", "DDLBENCH_PIN": "0"}) \
        == (dict(fair, BYTEPS_SERVER_ENGINE_THREAD="8"), False)
    assert pslaunch.lane_settings({"DDLBENCH_BYTEPS_FAIR": "0"}) == (
        {"DDLBENCH_BYTEPS_FAIR": "0", "BYTEPS_CPU_COMPRESS_LOOPS": "1"}, False)
    with pytest.raises(UsageError, match="DDLBENCH_BYTEPS_FAIR must be 0 or 1, got 'yes'"):
        pslaunch.lane_settings({"DDLBENCH_BYTEPS_FAIR": "yes"})
    # every process learns the plan the suite's local spawner would make for the job
    from ddlbench.hosts import pinning
    common, roles, _ = pslaunch.byteps_roles(["localhost"] * 2, ["localhost"], "localhost",
                                             "1", "2", local=True)
    setups = pslaunch.byteps_pinning(common, roles, 2, 1, pin=True)
    assert len(setups) == len(roles) == 4 and all(callable(f) for f in setups)
    assert json.loads(common[pinning.PLACEMENT_ENV]) == pinning.plan(2, 1)


def test_byteps_traces_the_recorded_steps():
    from ddlbench.runtime.byteps import trace_settings
    on = {"BYTEPS_TRACE_ON": "1"}
    # 2 warmup steps, 6 timed: all recorded (steps 3..8), the first 4, or the first alone
    # (BytePS traces 2 or more: steps 3 and 4, and the reader keeps the recorded one)
    assert trace_settings(2, 6, 6) == {**on, "BYTEPS_TRACE_START_STEP": "3",
                                       "BYTEPS_TRACE_END_STEP": "8"}
    assert trace_settings(2, 6, 4)["BYTEPS_TRACE_END_STEP"] == "6"
    assert trace_settings(2, 6, 1)["BYTEPS_TRACE_END_STEP"] == "4"
    assert trace_settings(0, 6, 9) == {**on, "BYTEPS_TRACE_START_STEP": "1",
                                       "BYTEPS_TRACE_END_STEP": "6"}
    # one timed step, or none recorded: no trace (BytePS needs END > START and reached)
    assert trace_settings(2, 1, 1) == {} and trace_settings(2, 6, 0) == {}


def test_byteps_trace_read_onto_the_timeline_clock(tmp_path, monkeypatch):
    """BytePS's comm.json (system-clock microseconds, as EmitTrace writes it) read into the
    timeline's events on its perf_counter clock, outside the window dropped, the file gone."""
    import time as clock

    from ddlbench.runtime import byteps
    from ddlbench.timeline import COMM, now_us
    (tmp_path / "0").mkdir()
    before = now_us()             # the timeline's clock either side of the system clock's now
    wall = clock.time_ns() / 1000.0
    after = now_us()
    ev = [{"ph": "X", "pid": "Comm.byteps.Gradient.fc.weight", "tid": "total",
           "name": "Comm.byteps.Gradient.fc.weight", "ts": int(wall) - 5000, "dur": 3000,
           "cat": "Comm"},
          {"ph": "X", "pid": "Comm.byteps.Gradient.fc.weight", "tid": "65536",
           "name": "Comm.byteps.Gradient.fc.weight.PUSH", "ts": int(wall) - 4000, "dur": 1000,
           "cat": "Comm"},
          {"ph": "X", "pid": "Comm.byteps.Gradient.fc.weight", "tid": "total",
           "name": "Comm.byteps.Gradient.fc.weight", "ts": int(wall) - 900000, "dur": 10,
           "cat": "Comm"}]
    (tmp_path / "0" / "comm.json").write_text(json.dumps({"traceEvents": ev}))
    monkeypatch.setenv("BYTEPS_TRACE_ON", "1")
    monkeypatch.setenv("BYTEPS_TRACE_DIR", str(tmp_path))
    # the window: from 0.5 s before (the third span, 0.9 s before, outside) to now, however
    # long the file write took
    events = byteps.read_trace((before - 500_000, now_us()))
    assert [e[:3] for e in events] == [("push_pull", COMM, "push_pull"),
                                       ("push", COMM, "byteps PUSH")]
    assert events[0][5] == {"tensor": "Gradient.fc.weight"}
    assert events[1][5] == {"tensor": "Gradient.fc.weight", "key": 65536}
    # 5 ms and 4 ms before `wall` on the timeline's clock: between `before` and `after` less
    # those, give or take the stamps' microsecond and reading the two clocks' offset (20 ms:
    # a thread preempted between its two readings; a missed conversion is off by decades)
    slack = 20_000
    assert before - 5000 - slack <= events[0][3] <= after - 5000 + slack, (before, after, events)
    assert events[0][4] - events[0][3] == 3000 and events[1][3] - events[0][3] == 1000, events
    assert not tmp_path.exists()
    assert byteps.read_trace(None) is None     # the directory is gone with its file


def test_the_workers_placement_under_byteps():
    from ddlbench.errors import UsageError
    from ddlbench.hosts import placement
    env = {"DMLC_ROLE": "worker", "DMLC_PS_ROOT_URI": "127.0.0.1", "DMLC_PS_ROOT_PORT": "9000",
           "DMLC_NUM_WORKER": "2", "DMLC_NUM_SERVER": "2", "DMLC_WORKER_ID": "1",
           "DDLBENCH_WORKER_RANK": "1", "DDLBENCH_NUM_WORKER": "2",
           "DDLBENCH_ENGINE": "byteps", "DDLBENCH_STORE_PORT": "9001"}
    p = placement.detect(env)
    # the servers are BytePS's own, not ranks; worker 0's store is not the scheduler's port
    assert (p.rank, p.world_size, p.master_port, p.launcher) == (1, 2, 9001, "dmlc")
    with pytest.raises(UsageError, match="DDLBENCH_STORE_PORT"):
        placement.detect({k: v for k, v in env.items() if k != "DDLBENCH_STORE_PORT"})
    with pytest.raises(UsageError, match="byteps.server"):
        placement.detect(dict(env, DMLC_ROLE="server", DDLBENCH_SERVER_ID="0"))


def test_stop_finds_byteps_servers_of_a_job():
    from ddlbench.launch import psstop
    argv = ["/x/python", "-m", "ddlbench.launch.bpsserver", "--job-id", "j1"]
    assert psstop.job_of(argv, None) == "j1"
    assert psstop.job_of(["/x/python", "-c", "import byteps.server"], None) is None


@pytest.mark.parametrize("variables,message", [
    ({"engine": "mxnet"}, "engine must be torch or byteps, got 'mxnet'"),
    ({"engine": "byteps", "rdma": "1"}, "engine=byteps runs over TCP (rdma=0)"),
])
def test_launcher_bad_engine_input(tmp_path, variables, message):
    proc = subprocess.run(["bash", LAUNCHER], cwd=REPO, capture_output=True, text=True,
                          env=env(nworkers="2", hostfile=_hostfile(tmp_path, 2), dry_run="1",
                                  **variables), timeout=60)
    assert proc.returncode == 2 and message in proc.stderr, describe(proc)


@pytest.mark.parametrize("args,message", [
    (["--method", "fusion"], "method 'fusion' has no BytePS mapping; --engine byteps runs "
                             "bspps, wfbpps, byteschedulerps"),
    (["--method", "wfbpps", "--threshold", "1000"], "BytePS 0.2.5 fuses nothing"),
    (["--method", "wfbpps", "--compressor", "fp16"], "--engine byteps takes --compressor none"),
    (["--method", "byteschedulerps", "--server-rule", "lowest-key"],
     "--engine byteps runs BytePS's own server rule (fewest-pushes); --server-rule lowest-key "
     "runs on --engine torch"),
])
def test_byteps_bad_input(byteps_python, args, message):
    proc = subprocess.run([byteps_python, "-m", "ddlbench.train", "--engine", "byteps",
                           *SMALL_CNN, *args], cwd=REPO, capture_output=True, text=True,
                          env=env(), timeout=120)
    assert proc.returncode == 2 and message in proc.stderr, describe(proc)


@needs_netem
def test_byteps_over_an_emulated_network(byteps_python, tmp_path):
    """engine=byteps with --net: BytePS's scheduler, 2 servers and 2 workers each on a host of
    an emulated 1 Gbit/s cluster (its own network namespace and address: 2 worker machines),
    byteschedulerps with the servers scheduling (BytePS's fewest-pushes rule) verified over 3
    momentum-SGD steps, and the cluster gone afterwards."""
    proc = _launch(byteps_python, tmp_path, "byteschedulerps", 2,
                   ["--verify", "3", *MOMENTUM_SGD, "--dtype", "float64", "--timeout", "180",
                    "--net", "1gbit", "--partition-bytes", str(1 << 15)], timeout=400)
    assert proc.returncode == 0, describe(proc)
    lines = verify_lines(proc.stdout)["byteschedulerps"]
    assert [s for s, *_ in lines] == [1, 2, 3] and all(ok for *_, ok in lines), proc.stdout
    assert "verify: parameter servers: 2" in proc.stdout, proc.stdout
    runs = sorted(set(re.findall(r"run ([0-9a-f]{6})", proc.stderr)))
    assert len(runs) == 1, proc.stderr          # the cluster's summary names its run
    assert [ns for ns in netem.list_namespaces() if runs[0] in ns] == [], "namespaces left"


# A program that drives the built BytePS server's own scheduling queue (byteps/server/queue.h
# as installed, the patch's heap included): "push ID KEY", "clear KEY" (ClearCounter) and "pop"
# (WaitAndPop, the popped message's id printed). The message carries only what the queue reads.
_QUEUE_DRIVER = r"""
#include <cstdint>
#include <iostream>
#include <string>
#include <unordered_map>
namespace byteps { namespace server {
struct BytePSEngineMessage { uint64_t id; uint64_t key; };
} }
#include "queue.h"
int main() {
  byteps::server::PriorityQueue queue(true);
  std::string op;
  while (std::cin >> op) {
    byteps::server::BytePSEngineMessage m;
    if (op == "push") { std::cin >> m.id >> m.key; queue.Push(m); }
    else if (op == "clear") { std::cin >> m.key; queue.ClearCounter(m.key); }
    else { queue.WaitAndPop(&m); std::cout << m.id << "\n"; }
  }
}
"""


def _server_script(seed: int, pushers: int, nkeys: int, rounds: int):
    """A server's arrivals as BytePS's request handler queues them: per round every pusher's
    push of every key in a random order, pops in between at random and the rest at the round's
    end; a round's last push of a key also queues its ALL_RECV message and clears the key's
    count. (ops for the driver, ops for the suite's queue, ALL_RECV ids.)"""
    import random
    rng = random.Random(seed)
    ops, ours, done, ids = [], [], set(), iter(range(1 << 20))
    queued = 0
    for _ in range(rounds):
        arrivals = [k for k in range(nkeys) for _ in range(pushers)]
        rng.shuffle(arrivals)
        seen: dict = {}
        for key in arrivals:
            i = next(ids)
            ops.append(f"push {i} {key}")
            ours.append(("put", key, i))
            queued += 1
            seen[key] = seen.get(key, 0) + 1
            if seen[key] == pushers:
                j = next(ids)
                done.add(j)
                ops += [f"push {j} {key}", f"clear {key}"]
                queued += 1
            while queued and rng.random() < 0.4:
                ops.append("pop")
                ours.append(("pop",))
                queued -= 1
        ops += ["pop"] * queued
        ours += [("pop",)] * queued
        queued = 0
    return ops, ours, done


def test_the_server_queue_pops_as_bytepss(byteps_python, tmp_path):
    """The suite's fewest-pushes queue (ddlbench.runtime.ps.ServerQueue) pops a server's pushes
    in the order the built BytePS server's own queue does, on the issue's example (pushes of
    keys 2, 2, 1, 0 pop as 1, 0, 2, 2) and on recorded sequences of 3 pushers x 6 keys x 4
    rounds with pops in between (BytePS's ALL_RECV messages take pops of their own; the
    suite's queue has none, the round's last push completing it)."""
    from ddlbench.runtime import ps
    env_dir = os.path.dirname(os.path.dirname(byteps_python))
    headers = glob.glob(os.path.join(env_dir, "lib", "python*", "site-packages", "byteps",
                                     "server", "queue.h"))
    assert len(headers) == 1, env_dir
    with open(headers[0]) as f:
        assert "ddl-benchmarks" in f.read()          # the patched queue the servers run
    (tmp_path / "driver.cc").write_text(_QUEUE_DRIVER)
    build = subprocess.run(["g++", "-std=c++14", "-O1", "-pthread", "-I",
                            os.path.dirname(headers[0]), str(tmp_path / "driver.cc"), "-o",
                            str(tmp_path / "driver")], capture_output=True, text=True,
                           timeout=120)
    assert build.returncode == 0, build.stderr

    def byteps_pops(ops):
        proc = subprocess.run([str(tmp_path / "driver")], input="\n".join(ops) + "\n",
                              capture_output=True, text=True, timeout=60)
        assert proc.returncode == 0, proc.stderr
        return [int(x) for x in proc.stdout.split()]
    example = ["push 0 2", "push 1 2", "push 2 1", "push 3 0"] + ["pop"] * 4
    assert byteps_pops(example) == [2, 3, 0, 1]            # keys 1, 0, 2, 2
    q = ps.ServerQueue("fewest-pushes", expected=4)
    for i, key in enumerate((2, 2, 1, 0)):
        q.put(key, i)
    assert [q.pop()[1] for _ in range(4)] == [2, 3, 0, 1]
    for seed in range(5):
        ops, ours, all_recv = _server_script(seed, pushers=3, nkeys=6, rounds=4)
        theirs = iter(byteps_pops(ops))
        q = ps.ServerQueue("fewest-pushes", expected=3)
        popped, expected = [], []
        for op in ours:
            if op[0] == "put":
                q.put(op[1], op[2])
                continue
            got = next(theirs)
            if got not in all_recv:            # BytePS's pop took a push: so must the suite's
                expected.append(got)
                popped.append(q.pop()[1])
        assert popped == expected and len(popped) == 3 * 6 * 4, seed
        assert next(theirs, None) is None

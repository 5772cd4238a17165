"""byteps/stop.sh without job= (the original's benchmarks.py runs `cd byteps;./stop.sh` after each
PS run): it stops the PS jobs this user started from this checkout, and nothing else."""
import os
import shutil
import subprocess
import sys
import tempfile
import time

import pytest

from ddlbench.launch import psstop

from .conftest import REPO, describe, env

# A stand-in for the training script (no torch): it sleeps. Processes get the command line
# the PS launcher gives its processes, `python -m ddlbench.train ... --job-id ID`, the module
# found in a package of its own (python -P: not the checkout's).
FAKE_TRAIN = "import time\ntime.sleep(120)\n"
OTHER_USER_PYTHON = "/usr/bin/python3"


@pytest.fixture
def fake_package():
    where = tempfile.mkdtemp(prefix="ddlbench-fake-")  # readable by another user
    os.chmod(where, 0o755)
    os.makedirs(os.path.join(where, "ddlbench"))
    for name, text in (("__init__.py", ""), ("train.py", FAKE_TRAIN)):
        with open(os.path.join(where, "ddlbench", name), "w") as f:
            f.write(text)
    for d, _, files in os.walk(where):
        os.chmod(d, 0o755)
        for f in files:
            os.chmod(os.path.join(d, f), 0o644)
    yield where
    shutil.rmtree(where, ignore_errors=True)


def _start(package, cwd, job, method="wfbpps", servers=True, role=None, python=sys.executable,
           user=None):
    argv = [python, "-P", "-m", "ddlbench.train", "--model", "resnet50", "--method", method,
            "--nworkers", "2"]
    if servers:
        argv += ["--nservers", "1"]
    argv += ["--job-id", job]
    e = {"PATH": os.environ["PATH"], "PYTHONPATH": package}
    if role:
        e["DMLC_ROLE"] = role
    return subprocess.Popen(argv, cwd=cwd, env=e, user=user, stdin=subprocess.DEVNULL)


def _wait_listed(procs):
    """Until every process runs its module (its command line is the job's, not the fork's)."""
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        cmdlines = []
        for p in procs:
            try:
                with open(f"/proc/{p.pid}/cmdline", "rb") as f:
                    cmdlines.append(b"ddlbench.train" in f.read())
            except OSError:
                cmdlines.append(False)
        if all(cmdlines):
            return
        time.sleep(0.05)
    raise AssertionError("the stand-in processes did not start")


def _gone(p, timeout=15.0):
    try:
        p.wait(timeout=timeout)
        return True
    except subprocess.TimeoutExpired:
        return False


# A remote host: $SSH (configs/cluster.conf's) the tests' stand-in for ssh, which runs the
# remote command line here.
FAKE_SSH = os.path.join(REPO, "tests", "fake_ssh.sh")


@pytest.fixture
def checkout():
    """A checkout of its own (this one's package and stop.sh under another root), so that
    stopping "this checkout's" jobs never touches a job of the real one, a test beside this one
    included: the real checkout is "another checkout" here."""
    root = tempfile.mkdtemp(prefix="ddlbench-checkout-")
    os.chmod(root, 0o755)
    for package in ("ddlbench", "compression", "models"):
        os.symlink(os.path.join(REPO, package), os.path.join(root, package))
    for folder, name in (("byteps", "stop.sh"), ("configs", "cluster.conf")):
        os.makedirs(os.path.join(root, folder))
        shutil.copy2(os.path.join(REPO, folder, name), os.path.join(root, folder, name))
    yield root
    shutil.rmtree(root, ignore_errors=True)


@pytest.mark.parametrize("hostfile", [None, "localhost", "127.0.0.2"],
                         ids=["no-hostfile", "hostfile", "remote-host"])
def test_stop_without_job_stops_only_this_users_ps_jobs_of_this_checkout(
        tmp_path, fake_package, checkout, hostfile):
    procs = {}
    try:
        procs["mine"] = _start(fake_package, checkout, "mine1")     # the local spawner's
        # a server started over ssh (its role in its environment, not on its command line)
        procs["mine_server"] = _start(fake_package, checkout, "mine2", method="bspa2a",
                                      servers=False, role="server")
        # one machine: no server, as BytePS (the PS method on its command line says PS)
        procs["mine_local"] = _start(fake_package, checkout, "mine3", method="wfbp,bspps",
                                     servers=False)
        # an all-reduce job over a host file (torchrun_hosts'): not a PS job
        procs["allreduce"] = _start(fake_package, checkout, "ar1", method="wfbp",
                                    servers=False)
        procs["other_checkout"] = _start(fake_package, REPO, "theirs1")
        if os.getuid() == 0 and os.access(OTHER_USER_PYTHON, os.X_OK):
            procs["other_user"] = _start(fake_package, checkout, "theirs2",
                                         python=OTHER_USER_PYTHON, user="nobody")
        _wait_listed(procs.values())
        e = env(PY=sys.executable)
        for name in ("job", "hostfile", "nworkers", "DDLBENCH_CLUSTER_CONF", "SSH"):
            e.pop(name, None)
        if hostfile:
            path = tmp_path / "hosts"
            path.write_text(f"{hostfile} slots=2\n")
            e["hostfile"] = str(path)
        if hostfile == "127.0.0.2":
            e["SSH"] = FAKE_SSH
        start = time.monotonic()
        proc = subprocess.run(["bash", "-c", "cd byteps;./stop.sh"],  # benchmarks.py's words
                              cwd=checkout, env=e, capture_output=True, text=True, timeout=60)
        assert proc.returncode == 0, describe(proc)
        host = hostfile or "localhost"
        assert sorted(proc.stdout.splitlines()) == [
            f"stopped job mine1 on {host}: 1 process(es)",
            f"stopped job mine2 on {host}: 1 process(es)",
            f"stopped job mine3 on {host}: 1 process(es)"], describe(proc)
        if not hostfile:
            assert "no host file" in proc.stderr and "this machine only" in proc.stderr
        for name in ("mine", "mine_server", "mine_local"):
            assert _gone(procs[name]) and procs[name].returncode == -15, name
        assert time.monotonic() - start < 30
        for name in ("allreduce", "other_checkout", "other_user"):
            if name in procs:
                assert procs[name].poll() is None, f"{name} was stopped"
    finally:
        for p in procs.values():
            if p.poll() is None:
                p.kill()
            p.wait()


def test_a_ps_jobs_process_is_told_by_its_command_line_and_environment():
    from ddlbench import methods
    ps = frozenset(m for m in methods.names() if methods.architecture(m) == methods.PS)
    assert {"bspps", "wfbpps", "byteschedulerps"} <= ps and "wfbp" not in ps
    train = ["/venv/bin/python", "-m", "ddlbench.train", "--model", "bert"]
    assert psstop.job_of(train + ["--nservers", "1", "--job-id", "a1"], {}) == "a1"
    assert psstop.job_of(train + ["--job-id=a2", "--nservers=2"], None) == "a2"
    assert psstop.job_of(train + ["--job-id", "a3"], {"DMLC_ROLE": "worker"}) == "a3"
    assert psstop.job_of(train + ["--method", "wfbpps", "--job-id", "a6"], {}, ps) == "a6"
    assert psstop.job_of(train + ["--method=bspa2a,byteschedulerps", "--job-id", "a7"], {},
                         ps) == "a7"
    assert psstop.job_of(train + ["--method", "wfbpps", "--job-id", "a6"], {}) is None
    assert psstop.job_of(train + ["--job-id", "a4"], {}, ps) is None          # all-reduce
    assert psstop.job_of(train + ["--method", "wfbp", "--job-id", "a4"], {}, ps) is None
    assert psstop.job_of(train + ["--nservers", "1"], {}) is None          # no job id
    assert psstop.job_of(train + ["--nservers", "1", "--job-id", "x;y"], {}) is None
    assert psstop.job_of(["python", "-m", "ddlbench.launch.psstop", "--job-id", "a5",
                          "--nservers", "1"], {}) is None


def test_stop_with_a_missing_host_file_says_so(checkout):
    proc = subprocess.run(["bash", f"{checkout}/byteps/stop.sh"], cwd=checkout,
                          env=env(PY=sys.executable, hostfile="/nonexistent/hosts"),
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines()[-1] == \
        "ddlbench: error: host file /nonexistent/hosts not found", describe(proc)

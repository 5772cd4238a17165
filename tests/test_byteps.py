"""The real-BytePS lane (byteps/legacy_env.sh): bad input and a missing prerequisite are one line
each; where the environment is built (a machine with an NVIDIA GPU), 2 workers push_pull through
1 server of real BytePS 0.2.5 (byteps/legacy_check.sh); elsewhere that test skips with the
reason the build recorded, where that reason holds: no NVIDIA GPU here, the package registry out
of the network's reach, Debian packages not installed (tests/skip_conditions.py). Any other
reason, or an environment that is simply not built, fails."""
import os
import subprocess

import pytest

from .conftest import REPO, describe
from .skip_conditions import byteps_skip_reason

SCRIPT = os.path.join(REPO, "byteps", "legacy_env.sh")
CHECK = os.path.join(REPO, "byteps", "legacy_check.sh")
GPU = os.path.exists("/dev/nvidiactl")


def _run(tmp_path, *args, timeout=60):
    """The script with a cache folder of the test's own."""
    env = dict(os.environ, DDLBENCH_CACHE=str(tmp_path / "cache"))
    return subprocess.run([SCRIPT, *args], env=env, capture_output=True, text=True,
                          timeout=timeout)


def _one_line(proc, code: int, message: str) -> str:
    assert proc.returncode == code and proc.stdout == "", describe(proc)
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("byteps-env: error: ") \
        and message in lines[0], proc.stderr
    return lines[0][len("byteps-env: error: "):]


@pytest.mark.parametrize("args,message", [
    (["frobnicate"], "unknown command 'frobnicate' (build [--optional] [--force], python, "
                     "remove, where)"),
    (["build", "--fast"], "unknown option '--fast' (build [--optional] [--force])"),
])
def test_bad_commands_are_one_line(tmp_path, args, message):
    _one_line(_run(tmp_path, *args), 2, message)


@pytest.mark.skipif(GPU, reason="this machine has an NVIDIA GPU: the build would go on")
def test_without_a_gpu_the_build_stops_before_it_starts_and_says_why(tmp_path):
    why = _one_line(_run(tmp_path, "build"), 2, "no NVIDIA GPU here")
    assert "byteps/common/global.cc: cudaSetDevice at init" in why
    assert not (tmp_path / "cache").exists()   # nothing fetched, nothing built
    # --optional: not an error; the reason is recorded for the tests' skips and `python`
    proc = _run(tmp_path, "build", "--optional")
    assert proc.returncode == 0, describe(proc)
    assert (tmp_path / "cache" / "byteps-env.unavailable").read_text().strip() == why
    assert _one_line(_run(tmp_path, "python"), 3, why) == why
    proc = _run(tmp_path, "remove")
    assert proc.returncode == 0 and not (tmp_path / "cache" / "byteps-env.unavailable").exists()
    _one_line(_run(tmp_path, "python"), 1, "the BytePS environment is not built")


def test_two_workers_push_pull_through_a_real_byteps_server():
    # (as `make test` does first: where it is built, done at once; without a GPU, at once too)
    build = subprocess.run([SCRIPT, "build", "--optional"], capture_output=True, text=True,
                           timeout=3600)
    assert build.returncode == 0, f"building the BytePS environment failed:\n{build.stderr}"
    proc = subprocess.run([SCRIPT, "python"], capture_output=True, text=True, timeout=60)
    reason = byteps_skip_reason(proc)    # a condition really absent here, or fails
    if reason is not None:
        pytest.skip("real BytePS: " + reason)
    check = subprocess.run([CHECK, proc.stdout.strip()], capture_output=True, text=True,
                           timeout=300)
    assert check.returncode == 0, describe(check)
    for rank in (0, 1):
        assert f"worker {rank} of 2 push_pull: [3.0, 3.0, 3.0, 3.0]" in check.stdout


NO_GPU = ("no NVIDIA GPU here (no /dev/nvidiactl, nvidia-smi lists none): BytePS 0.2.5's worker "
          "needs a CUDA device")
REGISTRY = ("the package registry cannot be reached (pip download byteps==0.2.5.post15 ...: "
            "WARNING: Retrying (Retry(total=0)) after connection broken by 'NewConnectionError"
            "(...: Failed to establish a new connection: [Errno 101] Network is unreachable')")


@pytest.mark.parametrize("code,reason,gpu,skips", [
    (3, NO_GPU, False, True),
    (3, NO_GPU, True, False),            # recorded on another machine, or stale: it has one
    (3, REGISTRY, True, True),
    # any pip failure was recorded as "cannot be reached": a registry that answered is not one
    (3, "the package registry cannot be reached (pip download byteps==0.2.5.post15 ...: "
        "ERROR: No matching distribution found for byteps==0.2.5.post15)", True, False),
    (3, "no CUDA toolkit headers (cuda_runtime.h under $CUDA_HOME or /usr/local/cuda)", True,
     False),
    (1, "the BytePS environment is not built (/x); run: make byteps-env", False, False),
    (1, "building byteps==0.2.5.post15 failed: error: x; see /x.log", True, False),
])
def test_the_skip_is_only_for_a_condition_really_absent(code, reason, gpu, skips):
    proc = subprocess.CompletedProcess([SCRIPT, "python"], code, "",
                                       f"byteps-env: error: {reason}\n")
    if skips:
        assert byteps_skip_reason(proc, gpu=gpu) == reason
    else:
        with pytest.raises(AssertionError):
            byteps_skip_reason(proc, gpu=gpu)


def test_missing_debian_packages_skip_only_where_they_are_missing(monkeypatch):
    zmq = ("ZeroMQ's development files are missing (/usr/include/zmq.h, libzmq.so): install "
           "libzmq3-dev (make cluster-deps does)")
    proc = subprocess.CompletedProcess([SCRIPT, "python"], 3, "", f"byteps-env: error: {zmq}\n")
    monkeypatch.setattr(os.path, "exists", lambda path: False)
    assert byteps_skip_reason(proc, gpu=True) == zmq
    monkeypatch.setattr(os.path, "exists", lambda path: True)
    with pytest.raises(AssertionError, match="are here"):
        byteps_skip_reason(proc, gpu=True)

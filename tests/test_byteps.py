"""The real-BytePS lane (byteps/legacy_env.sh): bad input and a missing prerequisite are one line
each; where the environment is built (a machine with an NVIDIA GPU), 2 workers push_pull through
1 server of real BytePS 0.2.5 (byteps/legacy_check.sh); elsewhere that test skips with the
reason the build recorded."""
import os
import subprocess

import pytest

from .conftest import REPO, describe

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
    proc = subprocess.run([SCRIPT, "python"], capture_output=True, text=True, timeout=60)
    if proc.returncode != 0:
        pytest.skip(proc.stderr.strip().replace("byteps-env: error: ", "real BytePS: "))
    check = subprocess.run([CHECK, proc.stdout.strip()], capture_output=True, text=True,
                           timeout=300)
    assert check.returncode == 0, describe(check)
    for rank in (0, 1):
        assert f"worker {rank} of 2 push_pull: [3.0, 3.0, 3.0, 3.0]" in check.stdout

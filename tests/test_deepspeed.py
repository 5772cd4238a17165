"""Real DeepSpeed 0.19.8 (ZeRO-2 on its CPU accelerator, Gloo) against the suite's reference.

The environment is built by `make deepspeed-env` (scripts/deepspeed_env.sh; `make test` builds
it first, in about 20-40 s). The test skips only when the package registry could not be reached
to build it (tests/skip_conditions.py checks the recorded reason); any other failure fails.
scripts/deepspeed_probe.py runs DeepSpeed's own engine (deepspeed.initialize, engine.backward,
engine.step) in 2 worker processes and compares every rank with torch's optimizer on the
average of the ranks' local gradients; DESIGN.md section 10 has its figures.
"""
import json
import os
import subprocess

import pytest

from .conftest import REPO, env
from .skip_conditions import UNREACHABLE, deepspeed_skip_reason

ENV = os.path.join(REPO, "scripts", "deepspeed_env.sh")


@pytest.fixture(scope="module")
def deepspeed_python():
    build = subprocess.run([ENV, "build", "--optional"], capture_output=True, text=True,
                           timeout=900)
    assert build.returncode == 0, f"building the DeepSpeed environment failed:\n{build.stderr}"
    proc = subprocess.run([ENV, "python"], capture_output=True, text=True, timeout=60)
    reason = deepspeed_skip_reason(proc)
    if reason is not None:
        pytest.skip(reason)
    return proc.stdout.strip()


def test_zero2_equals_the_reference_and_all_reduces_on_gloo(deepspeed_python):
    """ZeRO-2 with SGD (momentum, weight decay), 2 workers, 3 steps: every parameter within
    1e-6 of the reference, the replicas identical; a step's collectives are DeepSpeed's
    default on Gloo: the gradient bucket all-reduced (G bytes, then each rank keeps its
    partition) beside a 4-byte all-reduce, and the updated partitions all-gathered (G)."""
    proc = subprocess.run(
        [deepspeed_python, "scripts/deepspeed_probe.py", "--nproc", "2", "--stages", "2",
         "--steps", "3", "--optimizer", "sgdm", "--json"],
        cwd=REPO, env=env(PYTHONPATH=REPO), capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    r = json.loads([line for line in proc.stdout.splitlines() if line.startswith("{")][-1])
    assert r["stage"] == 2 and r["optimizer"] == "DeepSpeedZeroOptimizer"
    assert r["max_abs_diff"] <= 1e-6 and r["replica_spread"] == 0, r
    g = r["gradient_bytes"]
    assert g == 4 * (32 * 64 + 64 + 64 * 64 + 64 + 64 * 8 + 8)
    calls = sorted(map(tuple, r["calls_step2_rank0"]))
    assert calls == [("all_gather_into_tensor", g), ("all_reduce", 4), ("all_reduce", g)], calls


def test_the_skip_is_only_for_an_unreachable_registry():
    unreachable = (f"{UNREACHABLE} while installing x (ConnectTimeoutError: timed out); see y")
    assert deepspeed_skip_reason(subprocess.CompletedProcess(
        [ENV, "python"], 3, "", f"deepspeed-env: error: {unreachable}\n")) == unreachable
    assert deepspeed_skip_reason(subprocess.CompletedProcess([ENV, "python"], 0, "p", "")) is None
    with pytest.raises(AssertionError, match="should have been built"):
        deepspeed_skip_reason(subprocess.CompletedProcess(
            [ENV, "python"], 1, "", "deepspeed-env: error: the DeepSpeed environment is not "
            "built (x); run: make deepspeed-env\n"))

"""Real DeepSpeed 0.19.8 (ZeRO-2 on its CPU accelerator, Gloo) against the suite's reference.

The environment is built by `make deepspeed-env` (scripts/deepspeed_env.sh; `make test` builds
it first, in about 20-40 s). The test skips only when the package registry could not be reached
to build it (tests/skip_conditions.py checks the recorded reason); any other failure fails.
scripts/deepspeed_probe.py runs DeepSpeed's own engine (deepspeed.initialize, engine.backward,
engine.step) in 2 worker processes and compares every rank with torch's optimizer on the
average of the ranks' local gradients; DESIGN.md section 10 has its figures. The lane
(`--engine deepspeed --method zero`, ddlbench/methods/deepspeed.py) runs the training script
in the environment's Python: --verify against the suite's reference, and its record's bytes.
"""
import json
import os
import subprocess

import pytest

from ddlbench import flags
from ddlbench.errors import UsageError

from .conftest import MOMENTUM_SGD, QUICK_TIMING, REPO, TINY_BERT, env
from .skip_conditions import UNREACHABLE, deepspeed_skip_reason, target_env_python

ENV = os.path.join(REPO, "scripts", "deepspeed_env.sh")


@pytest.fixture(scope="module")
def deepspeed_python():
    return target_env_python("deepspeed_env.sh", "DeepSpeed", deepspeed_skip_reason)


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


def lane(python, *args, timeout=300):
    return subprocess.run([python, "-m", "ddlbench.train", "--timeout", "60", "--engine",
                           "deepspeed", "--method", "zero", *args], cwd=REPO,
                          env=env(PYTHONPATH=REPO), capture_output=True, text=True,
                          timeout=timeout)


def test_lane_verifies_against_the_reference(deepspeed_python):
    """--engine deepspeed --method zero (ZeRO-2 on DeepSpeed's engine, the user's momentum SGD
    handed to deepspeed.initialize): every step equal to single-process SGD on the averaged
    gradient, the replicas identical, on 2 workers."""
    proc = lane(deepspeed_python, *TINY_BERT, *MOMENTUM_SGD, "--nworkers", "2", "--verify", "3")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    steps = [line for line in proc.stdout.splitlines() if line.startswith("verify zero step")]
    assert len(steps) == 3 and all(line.endswith("replicas identical) OK") for line in steps)
    assert "verify: 2 worker(s), bert_tiny: all methods match the reference" in proc.stdout


def test_lane_record_counts_deepspeeds_collectives(deepspeed_python, tmp_path):
    """The record of a timed run at P = 2: what DeepSpeed's comm layer sent per step, counted
    through the suite's Comm, is ZeRO-2's on Gloo: the bucket all-reduced (with a 4-byte
    flag) and the partitions all-gathered, 3(P-1)/P G in all; DeepSpeed's version and config
    (buckets of --threshold bytes, in elements) in the record, nothing left uncounted."""
    out = tmp_path / "rec.json"
    proc = lane(deepspeed_python, *TINY_BERT, "--nworkers", "2", "--threshold", "400000",
                *QUICK_TIMING, "--output", str(out))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    r = json.loads(out.read_text())
    g = r["model"]["gradient_bytes"]
    sent = r["communication_per_iteration"]["wire_sent_bytes"]
    assert set(sent) == {"allreduce", "allgather"}, sent
    assert abs(sum(sent.values()) - 1.5 * g) <= 0.02 * 1.5 * g, (sent, g)
    assert sent["allgather"] == pytest.approx(0.5 * g, rel=0.02)
    ds = r["method"]["deepspeed"]
    assert ds["version"] == "0.19.8" and ds["optimizer"] == "DeepSpeedZeroOptimizer"
    assert ds["config"]["zero_optimization"] == {
        "stage": 2, "reduce_bucket_size": 100000, "allgather_bucket_size": 100000}
    assert ds["uncounted"] == {}
    assert (r["config"]["rs_carrier"], r["config"]["gather_prefetch"]) == ("native", "0")


def _lane_args(*extra):
    return flags.parse_args(["--engine", "deepspeed", "--method", "zero", *TINY_BERT, *extra])


def test_lane_refuses_what_deepspeed_does_not_do():
    """Settings DeepSpeed's ZeRO does not have are one line each (checked without
    DeepSpeed: the lane's own checks)."""
    for extra, words in ((["--rs-carrier", "a2a"], "not --rs-carrier a2a"),
                         (["--gather-prefetch", "1"], "not --gather-prefetch 1"),
                         (["--compressor", "fp16"], "takes --compressor none")):
        with pytest.raises(UsageError, match=words):
            flags.check(_lane_args(*extra), probe_engine=False)
    flags.check(_lane_args("--rs-carrier", "native", "--zero-stage", "1"), probe_engine=False)


def test_the_suites_python_says_how_to_run_the_lane():
    """Without DeepSpeed (the suite's own venv): one line naming the environment's Python."""
    import sys
    proc = subprocess.run([sys.executable, "-m", "ddlbench.train", "--engine", "deepspeed",
                           "--method", "zero", *TINY_BERT], cwd=REPO, env=env(),
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2, proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert "--engine deepspeed is unavailable in this Python" in proc.stderr
    assert "make deepspeed-env" in proc.stderr and "scripts/deepspeed_env.sh python" in proc.stderr


def test_a_sweep_runs_the_lane_in_its_python(deepspeed_python, tmp_path):
    """A sweep's `engines: [torch, deepspeed]`: both cells pass the preflight (the lane's
    checks, its environment found), and the DeepSpeed cell runs through the suite's local
    spawner in the environment's Python."""
    from ddlbench.sweep import config, runner
    path = tmp_path / "ds.yaml"
    path.write_text("name: ds\nnetworks: [local]\ntasks:\n  - {model: bert_tiny, batch_size: 4, "
                    "sentence_len: 16}\nmethods: [zero]\nengines: [torch, deepspeed]\n"
                    "nworkers: [2]\ntries: 1\n")
    sweep = config.load(str(path))
    cmds = {c.engine: runner.command(sweep, c, "r.json")[0] for c in sweep.cells()}
    assert cmds["deepspeed"][0] == deepspeed_python and cmds["torch"][0] != deepspeed_python
    assert cmds["deepspeed"][1:5] == ["-m", "ddlbench.train", "--nworkers", "2"]
    assert cmds["deepspeed"][cmds["deepspeed"].index("--engine") + 1] == "deepspeed"

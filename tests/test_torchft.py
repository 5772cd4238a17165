"""Real torchft 0.2.0's DiLoCo as the lane ``--engine torchft --method diloco``
(ddlbench/methods/torchft.py) against the suite's reference.

The environment is built by `make torchft-env` (scripts/torchft_env.sh; `make test` builds it
first). The tests that need it skip only when the package registry could not be reached to
build it (tests/skip_conditions.py checks the recorded reason); any other failure fails. The
lane runs the training script in the environment's Python: --verify against the simulation of
P DiLoCo replicas (ddlbench.methods.periodic_reference.DiLoCoMath), a deliberately wrong
variant failing it, and the record's bytes as counted from torchft's process group.
"""
import json
import os
import subprocess

import pytest

from ddlbench import flags
from ddlbench.errors import UsageError

from .conftest import MOMENTUM_SGD, QUICK_TIMING, REPO, TINY_BERT, env
from .skip_conditions import UNREACHABLE, torchft_skip_reason, target_env_python

ENV = os.path.join(REPO, "scripts", "torchft_env.sh")


@pytest.fixture(scope="module")
def torchft_python():
    return target_env_python("torchft_env.sh", "torchft", torchft_skip_reason)


def test_the_skip_is_only_for_an_unreachable_registry():
    unreachable = f"{UNREACHABLE} while installing x (ConnectTimeoutError: timed out); see y"
    assert torchft_skip_reason(subprocess.CompletedProcess(
        [ENV, "python"], 3, "", f"torchft-env: error: {unreachable}\n")) == unreachable
    assert torchft_skip_reason(subprocess.CompletedProcess([ENV, "python"], 0, "p", "")) is None
    with pytest.raises(AssertionError, match="should have been built"):
        torchft_skip_reason(subprocess.CompletedProcess(
            [ENV, "python"], 1, "", "torchft-env: error: the torchft environment is not "
            "built (x); run: make torchft-env\n"))


def train(python, *args, engine="torchft", method="diloco", timeout=300):
    return subprocess.run([python, "-m", "ddlbench.train", "--timeout", "60", "--engine",
                           engine, "--method", method, *args], cwd=REPO,
                          env=env(PYTHONPATH=REPO), capture_output=True, text=True,
                          timeout=timeout)


def verify_lines(proc, name="diloco"):
    return [line for line in proc.stdout.splitlines() if line.startswith(f"verify {name} step")]


LANE_CLASS = "ddlbench.methods.torchft:TorchftDiLoCo"
PLAIN_OUTER = "tests.broken_periodic:TorchftPlainOuter"


def test_lane_verifies_and_a_plain_outer_step_fails(torchft_python):
    """torchft's DiLoCo (the lane's class; H = 2, the run's momentum SGD inside, Nesterov SGD
    outside) at 2 workers: every step equal to the simulation of 2 DiLoCo replicas, the
    replicas identical after each sync (steps 2 and 4) and apart between. Then, in the same
    job (a lighthouse of its own, the first one stopped), the same with the outer Nesterov
    momentum forgotten (tests/broken_periodic.py) fails from the first sync. (One job with
    both, run as module:Class on the torch engine, to keep the test short; the record's test
    runs the lane as users do, --engine torchft --method diloco.)"""
    proc = train(torchft_python, *TINY_BERT, *MOMENTUM_SGD, "--period", "2", "--nworkers", "2",
                 "--verify", "4", engine="torch", method=f"{LANE_CLASS},{PLAIN_OUTER}")
    assert proc.returncode == 1, proc.stdout[-3000:] + proc.stderr[-3000:]
    steps = verify_lines(proc, LANE_CLASS)
    assert len(steps) == 4 and all(line.endswith(") OK") for line in steps), steps
    assert [("replicas identical" in line) for line in steps] == [False, True, False, True]
    assert "periodic_reference:DiLoCoMath" in proc.stdout
    broken = verify_lines(proc, PLAIN_OUTER)
    assert [line.endswith(" OK") for line in broken] == [True, False, False, False], broken
    assert f"verify: 2 worker(s), bert_tiny: FAILED: {PLAIN_OUTER}" in proc.stdout


def test_lane_record_counts_torchfts_allreduces(torchft_python, tmp_path):
    """The record of a timed run at P = 2, H = 2: what torchft's manager all-reduced, counted
    through the suite's Comm, is one all-reduce per parameter every H steps, 2(P-1)/P G per H
    steps (diloco's); nothing left uncounted."""
    out = tmp_path / "rec.json"
    proc = train(torchft_python, *TINY_BERT, "--period", "2", "--nworkers", "2",
                 *QUICK_TIMING, "--output", str(out))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    r = json.loads(out.read_text())
    g = r["model"]["gradient_bytes"]
    comm = r["communication_per_iteration"]
    assert set(comm["wire_sent_bytes"]) == {"allreduce"}, comm
    # per step: 2(P-1)/P G every H = 2 steps
    assert comm["wire_sent_bytes"]["allreduce"] == pytest.approx(0.5 * g, rel=1e-9)
    ft = r["method"]["torchft"]
    assert ft["version"] == "0.2.0" and ft["uncounted"] == {} and ft["min_replica_size"] == 2
    assert r["method"]["period"] == 2 and r["method"]["outer_momentum"] == 0.9
    # its options say what ran: one message per tensor (diloco --threshold 0 in the model)
    assert r["config"]["threshold"] == 0.0


def _lane_args(*extra):
    return flags.parse_args(["--engine", "torchft", "--method", "diloco", *TINY_BERT, *extra])


def test_lane_refuses_what_torchft_does_not_do():
    """Settings torchft's DiLoCo does not have are one line each (the lane's own checks,
    without torchft)."""
    for extra, words in ((["--threshold", "1000"], "one all-reduce per parameter"),
                         (["--compressor", "fp16"], "takes --compressor none")):
        with pytest.raises(UsageError, match=words):
            flags.check(_lane_args(*extra), probe_engine=False)
    with pytest.raises(UsageError, match="has no torchft mapping"):
        flags.check(flags.parse_args(["--engine", "torchft", "--method", "localsgd",
                                      *TINY_BERT]), probe_engine=False)
    flags.check(_lane_args("--period", "3", "--outer-momentum", "0"), probe_engine=False)
    flags.check(_lane_args("--threshold", "0"), probe_engine=False)   # what it does anyway


def test_a_sweep_runs_the_lane_in_its_python(torchft_python, tmp_path):
    """A sweep's `engines: [torch, torchft]`: both cells pass the preflight (the lane's checks,
    its environment found), and the torchft cell runs through the suite's local spawner in the
    environment's Python."""
    from ddlbench.sweep import config, runner
    path = tmp_path / "ft.yaml"
    path.write_text("name: ft\nnetworks: [local]\ntasks:\n  - {model: bert_tiny, batch_size: 4, "
                    "sentence_len: 16}\nmethods: [diloco]\nengines: [torch, torchft]\n"
                    "nworkers: [2]\ntries: 1\n")
    sweep = config.load(str(path))
    cmds = {c.engine: runner.command(sweep, c, "r.json")[0] for c in sweep.cells()}
    assert cmds["torchft"][0] == torchft_python and cmds["torch"][0] != torchft_python
    assert cmds["torchft"][1:5] == ["-m", "ddlbench.train", "--nworkers", "2"]
    assert cmds["torchft"][cmds["torchft"].index("--engine") + 1] == "torchft"

import json
import os
import subprocess
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if REPO not in sys.path:
    sys.path.insert(0, REPO)

# Small workloads: every test run fits a 2-core CPU machine.
SMALL_CNN = ["--model", "resnet18", "--image-size", "32", "--batch-size", "4"]
# BERT-Tiny with a 1024-word vocabulary: the same 46 tensors in the same order, the word
# embeddings still the largest (0.5 MB), 2.5 MB of gradient instead of 17.7 (most tests' steps
# and collectives several times cheaper). FULL_TINY_BERT where the bytes matter (a link's time).
TINY_BERT_VOCAB = 1024
TINY_BERT = ["--model", "bert_tiny", "--sentence-len", "16", "--batch-size", "4",
             "--vocab-size", str(TINY_BERT_VOCAB)]
FULL_TINY_BERT = TINY_BERT[:-2]


def tiny_bert_model():
    """The model TINY_BERT trains."""
    import models
    return models.build("bert_tiny", sentence_len=16, vocab_size=TINY_BERT_VOCAB).model
# The suite's default optimizer before issue 16 (now --optimizer auto, the original's: SGD
# without momentum for CNNs, AdamW for BERT), for tests that check methods under momentum SGD.
# SGD also verifies the division by the workers, which Adam's scale-free step cannot see.
MOMENTUM_SGD = ["--optimizer", "sgd", "--momentum", "0.9"]
QUICK_TIMING = ["--num-warmup-batches", "1", "--num-batches-per-iter", "2", "--num-iters", "2"]


def env(**extra):
    e = dict(os.environ)
    # mpirun and torchrun live beside the interpreter in the venv.
    e["PATH"] = os.path.dirname(sys.executable) + os.pathsep + e.get("PATH", "")
    e.pop("DDLBENCH_TEST_HOOK_JITTER_MS", None)
    # MG-WFBP calibrates for real in every run; tests only need its groups, not good timings.
    for knob, value in (("DDLBENCH_MGWFBP_WARMUP", 1), ("DDLBENCH_MGWFBP_ITERS", 3),
                        ("DDLBENCH_MGWFBP_COMM_ITERS", 2)):
        e.setdefault(knob, str(value))
    e.update({k: str(v) for k, v in extra.items()})
    return e


def run(cmd, timeout=300, **extra_env):
    """Run a command from the repository root; its output is kept for the assertion message."""
    return subprocess.run(cmd, cwd=REPO, env=env(**extra_env), capture_output=True, text=True,
                          timeout=timeout)


def train(*args, timeout=300, **extra_env):
    """The training script; with DDLBENCH_TEST_HOOK_JITTER_MS=J, the same behind a random
    0..J ms delay in every method's gradient hooks (tests/jittered_train.py)."""
    module = "tests.jittered_train" if "DDLBENCH_TEST_HOOK_JITTER_MS" in extra_env \
        else "ddlbench.train"
    return run([sys.executable, "-m", module, "--timeout", "60", *args],
               timeout=timeout, **extra_env)


def verify_lines(stdout):
    """{method: [(step, max_abs, fraction_of_tolerance, ok)]} from --verify output."""
    out = {}
    for line in stdout.splitlines():
        if line.startswith("verify ") and " step " in line:
            head, _, rest = line.partition(": max |param - reference| = ")
            name, step = head[len("verify "):].rsplit(" step ", 1)
            max_abs = float(rest.split()[0])
            frac = float(rest.split("(")[1].split()[0])
            out.setdefault(name, []).append((int(step), max_abs, frac, line.endswith("OK")))
    return out


def describe(proc):
    return f"exit {proc.returncode}\nstdout:\n{proc.stdout[-3000:]}\nstderr:\n{proc.stderr[-3000:]}"


@pytest.fixture
def load_json():
    def load(path):
        with open(path) as f:
            return json.load(f)
    return load


@pytest.fixture(scope="session")
def two_machines_hsdp_hier_zero1(tmp_path_factory):
    """One timed job of hsdp, hier and ddp_zero1 on 2 emulated machines x 2 slots (buckets of
    300000 bytes; a record each, ``{method}.json`` in the folder returned with the process):
    test_model_gaps counts all three's bytes, test_hier hier's by group (a job's start costs
    more than its methods' steps)."""
    path = tmp_path_factory.mktemp("two_machines_hsdp_hier_zero1")
    proc = train(*TINY_BERT, "--nworkers", "4", "--slots", "2", *QUICK_TIMING, "--threshold",
                 "300000", "--method", "hsdp,hier,ddp_zero1",
                 "--output", str(path / "{method}.json"), timeout=400)
    return proc, path


NO_ACROSS = "tests.test_fsdp:NoAcross"   # fsdp2_hsdp without its all-reduce across machines


@pytest.fixture(scope="session")
def two_machines_sgd_verified(tmp_path_factory):
    """One verification on 2 emulated machines x 2 slots, momentum SGD, 3 steps, buckets of
    300000 bytes (hsdp's), each method traced (``{method}.json`` in the folder returned with
    the process): hsdp (test_zero), fsdp2_hsdp and NoAcross, which must fail (test_fsdp). Its
    last line names exactly the methods that failed: NoAcross alone."""
    path = tmp_path_factory.mktemp("two_machines_sgd_verified")
    proc = train(*TINY_BERT, "--nworkers", "4", "--slots", "2", *MOMENTUM_SGD, "--threshold",
                 "300000", "--verify", "3", "--method", f"hsdp,fsdp2_hsdp,{NO_ACROSS}",
                 "--timeline", str(path / "{method}.json"), timeout=300)
    return proc, path


def only_no_across_failed(proc) -> bool:
    """The job of ``two_machines_sgd_verified`` failed (exit 1) for NoAcross and no other."""
    return proc.returncode == 1 and proc.stdout.strip().splitlines()[-1] == (
        f"verify: 4 worker(s), bert_tiny: FAILED: {NO_ACROSS}")

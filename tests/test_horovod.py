"""The real-Horovod lane (--engine horovod): Horovod 0.28.1 in its torch 2.0.1 environment.

The environment is built by `make horovod-env` (horovod/legacy_env.sh; `make test` builds it
first). These tests skip only when the package registry could not be reached to build it, a
network error that pip names (tests/skip_conditions.py checks the recorded reason); any other
failure to build or run fails.

The cross-engine checks run both engines in float64: two fp32 runs that differ only in the
order of a sum (Horovod's all-reduce against Gloo's) differ by an ulp after the first step, and
on these tiny models (BatchNorm over 4 values) the next gradients magnify that to 1e-3 by the
third step, so fp32 parameters of different engines cannot be compared after 3 steps. In
float64 the same ulp differences stay near 1e-12, and any real difference (a missed
average, a stale or doubled gradient, a wrong group) is many orders above the bound. Each
engine's fp32 run is also checked by --verify against the float64 reference, step by step.
"""
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys

import numpy as np
import pytest

from .conftest import MOMENTUM_SGD, REPO, SMALL_CNN, TINY_BERT, describe, env, verify_lines
from .skip_conditions import (HOROVOD_MISSING, NO_CUDA, horovod_skip_reason,
                              registry_unreachable)

LEGACY = os.path.join(REPO, "horovod", "legacy_env.sh")
LAUNCHER = os.path.join(REPO, "horovod", "horovod_mpi_cj.sh")
METHODS = ["wfbp", "fusion", "bspa2a", "mgwfbp"]
# float64 parameters of two engines: what reordering the sum of P float64 gradients can do.
RTOL, ATOL = 1e-9, 1e-12


@pytest.fixture(scope="session")
def legacy_python():
    """The legacy environment's Python, building the environment if it is missing."""
    build = subprocess.run([LEGACY, "build", "--optional"], capture_output=True, text=True,
                           timeout=3600)
    assert build.returncode == 0, f"building the Horovod environment failed:\n{build.stderr}"
    proc = subprocess.run([LEGACY, "python"], capture_output=True, text=True)
    reason = horovod_skip_reason(proc)   # the registry out of the network's reach, or fails
    if reason is not None:
        pytest.skip(reason)
    return proc.stdout.strip()


def run_group(cmd, timeout=300, **extra):
    """Run a launcher in its own session; on a timeout the whole session is killed, so no
    mpirun daemon or rank is left behind."""
    p = subprocess.Popen(cmd, cwd=REPO, env=env(**extra), stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        out, err = p.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)
        out, err = p.communicate()
        raise AssertionError(f"timed out after {timeout} s: {cmd}\n{out[-2000:]}\n{err[-2000:]}")
    return subprocess.CompletedProcess(cmd, p.returncode, out, err)


def hostfile(tmp_path, n):
    path = tmp_path / f"hosts{n}"
    path.write_text(f"localhost slots={n}\n")
    return str(path)


def workload_env(workload):
    """The launcher's variables for a workload given as training-script flags."""
    flags = dict(zip(workload[::2], workload[1::2]))
    e = {"dnn": flags["--model"], "bs": flags["--batch-size"]}
    if "--image-size" in flags:
        e["image_size"] = flags["--image-size"]
    if "--sentence-len" in flags:
        e["senlen"] = flags["--sentence-len"]
    return e


def launch(tmp_path, n, workload, method, extra, engine="horovod", python=None, **more):
    if "--vocab-size" in workload:   # no launcher variable of its own
        extra = [*extra, *workload[workload.index("--vocab-size"):][:2]]
    variables = {"nworkers": n, "hostfile": hostfile(tmp_path, n), "method": method,
                 "threshold": 1_000_000, "engine": engine, "extra_args": " ".join(extra),
                 **workload_env(workload), **more}
    if python is not None:  # the torch engine under torch 2.0.1: PY picks the interpreter
        variables.update(PY=python, MPIRUN=os.path.join(os.path.dirname(python), "mpirun"))
    return run_group(["bash", LAUNCHER], **variables)


def load(path):
    with np.load(path) as z:
        return {k: z[k] for k in z.files}


def assert_same_params(a, b, what):
    assert sorted(a) == sorted(b), what
    worst = max(float((np.abs(a[k] - b[k]) / (ATOL + RTOL * np.abs(a[k]))).max()) for k in a)
    diff = max(float(np.abs(a[k] - b[k]).max()) for k in a)
    assert worst <= 1.0, f"{what}: parameters differ by up to {diff:.3e} ({worst:.1f} of tolerance)"


# 2 workers on the small CNN, 3 (an odd count) on tiny BERT, each method in one of them: the
# suite's time budget (fusion also runs on Horovod in the fp16 test below).
CROSS_ENGINE = [(2, "cnn", ["wfbp", "mgwfbp"]), (3, "bert", ["bspa2a", "fusion"])]


def test_every_method_is_checked_against_the_torch_engine():
    assert sorted(m for *_, methods in CROSS_ENGINE for m in methods) == sorted(METHODS)


@pytest.mark.parametrize("nworkers,model,methods", CROSS_ENGINE,
                         ids=["small-cnn-2", "tiny-bert-3"])
def test_horovod_matches_the_torch_engine(legacy_python, tmp_path, nworkers, model, methods):
    """wfbp, fusion, bspa2a and mgwfbp on real Horovod end 3 momentum-SGD steps with the
    parameters of the torch engine (same torch 2.0.1, seed and data), and pass --verify; on
    the CNN, also with those of the torch engine on this environment's torch."""
    workload = SMALL_CNN if model == "cnn" else TINY_BERT
    common = ["--verify", "3", *MOMENTUM_SGD, "--dtype", "float64", "--timeout", "120"]
    torch_run = launch(tmp_path, nworkers, workload, ",".join(methods),
                       common + ["--save-params", str(tmp_path / "torch-{method}.npz")],
                       engine="torch", python=legacy_python)
    assert torch_run.returncode == 0, describe(torch_run)
    for method in methods:
        hvd = launch(tmp_path, nworkers, workload, method,
                     common + ["--save-params", str(tmp_path / f"horovod-{method}.npz")])
        assert hvd.returncode == 0, describe(hvd)
        lines = verify_lines(hvd.stdout)[method]
        assert [s for s, *_ in lines] == [1, 2, 3] and all(ok for *_, ok in lines), hvd.stdout
        assert_same_params(load(tmp_path / f"torch-{method}.npz"),
                           load(tmp_path / f"horovod-{method}.npz"),
                           f"{method}, {nworkers} workers, {model}")
        if method == "mgwfbp":
            assert "MG-WFBP: " in hvd.stdout and "groups from" in hvd.stdout, hvd.stdout
    if model == "cnn":
        # Across environments (torch 2.14 here, 2.0.1 there) the CNN ends equal too: the two
        # lanes run the same workload. (BERT does not: its dropout masks differ between the
        # torch versions.)
        mine = subprocess.run([sys.executable, "-m", "ddlbench.train", "--nworkers",
                               str(nworkers), *workload, "--method", methods[0], *common,
                               "--save-params", str(tmp_path / "new.npz")],
                              cwd=REPO, env=env(), capture_output=True, text=True, timeout=300)
        assert mine.returncode == 0, describe(mine)
        assert_same_params(load(tmp_path / "new.npz"),
                           load(tmp_path / f"horovod-{methods[0]}.npz"),
                           f"torch 2.14 vs Horovod, {methods[0]}")


def test_horovod_fp32_verify_and_fp16_compression(legacy_python, tmp_path):
    """In fp32, Horovod's fusion and its fp16 compression pass --verify with 3 workers: fp16
    against the reference of Horovod's own arithmetic (cast, half sum, divide)."""
    # (the launcher's compressor= names one; --verify takes a list)
    proc = launch(tmp_path, 3, TINY_BERT, "fusion",
                  ["--verify", "3", *MOMENTUM_SGD, "--compressor", "none,fp16"])
    assert proc.returncode == 0, describe(proc)
    for name in ("fusion", "fusion+fp16"):
        lines = verify_lines(proc.stdout)[name]
        assert len(lines) == 3 and all(ok for *_, ok in lines), proc.stdout
        if name == "fusion+fp16":  # the compressor changed the numbers: it ran
            assert max(m for _, m, _, _ in lines) > 1e-7, proc.stdout


def test_horovodrun_gloo_launcher(legacy_python, tmp_path, load_json):
    """launcher=horovodrun: Horovod's Gloo controller runs a timed job and writes a record
    that says which engine and settings ran."""
    out = tmp_path / "rec.json"
    proc = launch(tmp_path, 2, SMALL_CNN, "wfbp",
                  ["--num-warmup-batches", "1", "--num-batches-per-iter", "2",
                   "--num-iters", "2", "--output", str(out)], launcher="horovodrun")
    assert proc.returncode == 0, describe(proc)
    rec = load_json(out)
    hv = rec["method"]["horovod"]
    assert rec["method"]["engine"] == "horovod" and hv["version"] == "0.28.1"
    assert hv["controller"] == "gloo"
    assert hv["settings"]["HOROVOD_FUSION_THRESHOLD"] == "0"
    assert hv["settings"]["HOROVOD_CYCLE_TIME"] == "0"
    assert rec["result"]["throughput"]["mean"] > 0
    # Every gradient handed to Horovod once per step, counted.
    per_iter = rec["communication_per_iteration"]["payload_bytes"]["allreduce"]
    assert per_iter == rec["model"]["gradient_bytes"]


@pytest.mark.parametrize("args, message", [
    (["--method", "bytescheduler"], "has no Horovod mapping"),
    (["--method", "wfbp", "--compressor", "topk"], "--compressor none or fp16"),
    (["--method", "wfbp,fusion", "--verify", "1"], "one method per job"),
])
def test_horovod_bad_input(legacy_python, args, message):
    proc = subprocess.run([legacy_python, "-m", "ddlbench.train", "--engine", "horovod",
                           *SMALL_CNN, *args], cwd=REPO, env=env(), capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 2, describe(proc)
    assert message in proc.stderr and len(proc.stderr.strip().splitlines()) == 1, proc.stderr


def test_horovod_engine_refuses_the_local_spawner(legacy_python):
    proc = subprocess.run([legacy_python, "-m", "ddlbench.train", "--engine", "horovod",
                           "--nworkers", "2", *SMALL_CNN, "--method", "wfbp"], cwd=REPO,
                          env=env(), capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and "horovod_mpi_cj.sh" in proc.stderr, describe(proc)


# -- without the legacy environment ---------------------------------------------------------

def test_main_environment_says_how_to_get_horovod():
    proc = subprocess.run([sys.executable, "-m", "ddlbench.train", "--engine", "horovod",
                           *SMALL_CNN, "--method", "wfbp"], cwd=REPO, env=env(),
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2, describe(proc)
    assert "make horovod-env" in proc.stderr and len(proc.stderr.strip().splitlines()) == 1


def fake_toolkit(tmp_path) -> str:
    """A CUDA_HOME whose bin/nvcc the build's prerequisite check finds (it runs no nvcc before
    the registry check), so that check is reached on a machine without a toolkit too."""
    nvcc = tmp_path / "cuda" / "bin" / "nvcc"
    nvcc.parent.mkdir(parents=True)
    nvcc.write_text("#!/bin/sh\nexit 1\n")
    nvcc.chmod(0o755)
    return str(tmp_path / "cuda")


def test_legacy_env_not_built_and_unreachable_registry(tmp_path):
    cache = tmp_path / "cache"
    e = env(DDLBENCH_CACHE=cache, CUDA_HOME=fake_toolkit(tmp_path))
    proc = subprocess.run([LEGACY, "python"], env=e, capture_output=True, text=True)
    assert proc.returncode == 1 and "make horovod-env" in proc.stderr, proc.stderr
    # No registry: an index on a closed port, no local wheels or indexes.
    offline = dict(e, PIP_INDEX_URL="http://127.0.0.1:9/simple", PIP_EXTRA_INDEX_URL="",
                   PIP_FIND_LINKS="", PIP_CONFIG_FILE=os.devnull, PIP_DEFAULT_TIMEOUT="5")
    proc = subprocess.run([LEGACY, "build"], env=offline, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 3, proc.stderr
    assert "package registry cannot be reached" in proc.stderr.strip().splitlines()[-1]
    proc = subprocess.run([LEGACY, "build", "--optional"], env=offline, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    proc = subprocess.run([LEGACY, "python"], env=e, capture_output=True, text=True)
    assert proc.returncode == 3 and "registry cannot be reached" in proc.stderr, proc.stderr
    proc = subprocess.run([LEGACY, "remove"], env=e, capture_output=True, text=True)
    assert proc.returncode == 0 and not list(cache.glob("horovod-env*")), proc.stderr


def test_a_pip_failure_that_is_not_the_network_is_a_failure(tmp_path):
    """A registry that answers without Horovod (here: no index at all) is no reason to skip:
    exit 1 with its own message, --optional too, nothing recorded, and the tests' skip code
    fails on what `python` then says."""
    cache = tmp_path / "cache"
    e = env(DDLBENCH_CACHE=cache, CUDA_HOME=fake_toolkit(tmp_path), PIP_NO_INDEX="1", PIP_INDEX_URL="", PIP_EXTRA_INDEX_URL="",
            PIP_FIND_LINKS="", PIP_CONFIG_FILE=os.devnull)
    for args in (["build"], ["build", "--optional"]):
        proc = subprocess.run([LEGACY, *args], env=e, capture_output=True, text=True,
                              timeout=300)
        assert proc.returncode == 1, describe(proc)
        last = proc.stderr.strip().splitlines()[-1]
        assert last.startswith("horovod-env: error: pip download horovod==0.28.1 failed, not "
                               "for a network error: ") and "registry" not in last, last
        assert not (cache / "horovod-env.unavailable").exists()
    proc = subprocess.run([LEGACY, "python"], env=e, capture_output=True, text=True)
    assert proc.returncode == 1, describe(proc)
    with pytest.raises(AssertionError, match="not for an unreachable registry"):
        horovod_skip_reason(proc)


def make_test_setup() -> list[str]:
    """The set-up lines of the Makefile's `test` recipe: all but its last, pytest."""
    with open(os.path.join(REPO, "Makefile")) as f:
        recipe = re.search(r"^test: setup\n((?:\t.*\n)+)", f.read(), re.M)
    lines = [line.strip() for line in recipe.group(1).splitlines()]
    assert lines[-1].startswith("$(RUN) $(PY) -m pytest"), lines
    return lines[:-1]


# After the set-up: the skip reasons the tests' fixtures would give, checked where they run.
SKIPS = """
import json, subprocess
from tests.skip_conditions import byteps_skip_reason, horovod_skip_reason
ask = lambda s: subprocess.run([s, "python"], capture_output=True, text=True)
h = ask("horovod/legacy_env.sh")
print(json.dumps([horovod_skip_reason(h), byteps_skip_reason(ask("byteps/legacy_env.sh"), h)]))
"""


def test_make_test_without_a_cuda_toolkit_reaches_pytest(tmp_path):
    """`make test`'s set-up on a machine without a CUDA toolkit: no nvcc on PATH, CUDA_HOME
    pointing nowhere and /usr/local/cuda hidden (an empty folder mounted over it in a mount
    namespace of the test's own), and no package registry for apt-get. Each step exits 0; the
    Horovod lane and BytePS's, built on it, are skipped with that reason, which the tests' skip
    code accepts here; neither is built or downloaded (the decision comes before either).
    DeepSpeed's environment, which needs neither, is built (about 20-40 s)."""
    cuda = "/usr/local/cuda"
    hide = os.access(os.path.join(cuda, "bin", "nvcc"), os.X_OK)
    if hide and (os.geteuid() != 0 or shutil.which("unshare") is None):
        pytest.skip(f"{cuda} holds a CUDA toolkit, which only root can hide (unshare -m)")
    path = [d for d in os.environ["PATH"].split(os.pathsep)
            if d and not os.access(os.path.join(d, "nvcc"), os.X_OK)]
    cache = tmp_path / "cache"
    e = env(DDLBENCH_CACHE=cache, CUDA_HOME=tmp_path / "nowhere", PYTHONPATH=REPO)
    e.pop("CUDAToolkit_ROOT", None)
    # an apt-get that finds no registry: system-deps.sh, where it lacks a package, skips at
    # once (installing is not this test's; scripts/system-deps.sh's own test is in test_byteps)
    fake = tmp_path / "bin"
    fake.mkdir()
    (fake / "apt-get").write_text("#!/bin/sh\necho \"W: Failed to fetch http://deb.debian.org/ "
                                  "Temporary failure resolving 'deb.debian.org'\"\nexit 100\n")
    (fake / "apt-get").chmod(0o755)
    e["PATH"] = os.pathsep.join([str(fake), os.path.dirname(sys.executable), *path])
    (tmp_path / "empty").mkdir()
    script = "set -e\n" + "".join(f"{line}\necho \"exit $? {line}\" >&2\n"
                                   for line in make_test_setup())
    script += f"{shlex.quote(sys.executable)} -c {shlex.quote(SKIPS)}\n"
    if hide:
        script = f"mount --bind {tmp_path / 'empty'} {cuda}\n" + script
    cmd = ["unshare", "-m", "bash", "-c", script] if hide else ["bash", "-c", script]
    proc = subprocess.run(cmd, cwd=REPO, env=e, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, describe(proc)
    for line in make_test_setup():
        assert f"exit 0 {line}" in proc.stderr, describe(proc)
    horovod, byteps = json.loads(proc.stdout.strip().splitlines()[-1])
    assert horovod == f"horovod-env: error: {NO_CUDA} (nvcc) found: Horovod's build needs one " \
        "beside the CUDA build of torch 2.0.1 from PyPI; set CUDA_HOME", horovod
    assert byteps.startswith(HOROVOD_MISSING + NO_CUDA) and "make horovod-env" in byteps, byteps
    # DeepSpeed's and torchft's need neither: built from the registry (or, without one, the
    # reason recorded)
    built = []
    for name in ("deepspeed", "torchft"):
        where = subprocess.run([f"scripts/{name}_env.sh", "where"], cwd=REPO, env=e,
                               capture_output=True, text=True, timeout=60).stdout.strip()
        if os.path.exists(os.path.join(where, ".ready")):
            built += [os.path.basename(where), os.path.basename(where) + ".log"]
        else:
            why = (cache / f"{name}-env.unavailable").read_text()
            assert registry_unreachable(why), why
            built += [f"{name}-env.unavailable"]
    assert sorted(p.name for p in cache.iterdir()) == sorted(
        ["byteps-env.unavailable", "horovod-env.unavailable", *built])


def test_a_missing_cuda_toolkit_skips_only_where_none_is_found():
    reason = (f"horovod-env: error: {NO_CUDA} (nvcc) found: Horovod's build needs one beside "
              "the CUDA build of torch 2.0.1 from PyPI; set CUDA_HOME")
    proc = subprocess.CompletedProcess([LEGACY, "python"], 3, "", reason + "\n")
    assert horovod_skip_reason(proc, toolkit=None) == reason
    with pytest.raises(AssertionError, match="but a CUDA toolkit is here: /usr/local/cuda"):
        horovod_skip_reason(proc, toolkit="/usr/local/cuda")
    with pytest.raises(AssertionError, match="not for an unreachable registry or a missing"):
        horovod_skip_reason(subprocess.CompletedProcess([LEGACY, "python"], 2, "", reason))


NOT_NETWORK = ("the package registry cannot be reached (pip download horovod==0.28.1: ERROR: "
               "No matching distribution found for horovod==0.28.1)")


@pytest.mark.parametrize("code,stderr,skips", [
    (3, "horovod-env: error: the package registry cannot be reached (pip download "
        "horovod==0.28.1: Failed to establish a new connection: [Errno 111] Connection "
        "refused)", True),
    (3, "horovod-env: error: the package registry cannot be reached (pip download "
        "horovod==0.28.1: Failed to establish a new connection: [Errno -3] Temporary failure "
        "in name resolution)", True),
    (3, "horovod-env: error: the package registry cannot be reached while installing "
        "/x/requirements-legacy.txt (WARNING: Retrying (Retry(total=1)) after connection broken "
        "by 'ReadTimeoutError(\"HTTPSConnectionPool(host='pypi.org', port=443): Read timed "
        "out. (read timeout=15)\")': /simple/torch/); see /x.log", True),
    # a record of the script before it told the network from other failures
    (3, "horovod-env: error: " + NOT_NETWORK, False),
    (1, "horovod-env: error: the Horovod environment is not built (/x); run: make "
        "horovod-env", False),
    (2, "horovod-env: error: unknown command", False),
])
def test_the_skip_is_only_for_a_network_error(code, stderr, skips):
    proc = subprocess.CompletedProcess([LEGACY, "python"], code, "", stderr + "\n")
    if skips:
        assert horovod_skip_reason(proc) == stderr
    else:
        with pytest.raises(AssertionError, match="not for an unreachable registry"):
            horovod_skip_reason(proc)


def test_hostfile_for_horovodrun(tmp_path):
    path = tmp_path / "hosts"
    path.write_text("# two machines\nnode1 slots=4\n\nnode2 slots=2  # second\n")
    proc = subprocess.run([sys.executable, "-m", "ddlbench.hosts.hostfile", str(path), "--need", "6",
                           "--horovod"], cwd=REPO, capture_output=True, text=True)
    assert proc.returncode == 0 and proc.stdout.strip() == "node1:4,node2:2", proc.stderr


def test_gloo_operations_under_mpirun_are_refused(legacy_python, tmp_path):
    """Horovod 0.28.1 segfaults with Gloo CPU operations under its MPI controller: one line."""
    proc = launch(tmp_path, 2, SMALL_CNN, "fusion", [], HOROVOD_CPU_OPERATIONS="gloo")
    assert proc.returncode == 2, describe(proc)
    assert "HOROVOD_CPU_OPERATIONS=gloo needs Horovod's Gloo controller" in proc.stderr
    assert "Segmentation fault" not in proc.stderr

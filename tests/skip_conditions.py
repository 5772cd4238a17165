"""When the optional lanes' tests may skip: each condition checked, not trusted.

A skip names a condition that is really absent here (a package registry that the network does
not reach; a CUDA toolkit for Horovod's build; Debian packages not installed), never an error of the suite's own
scripts: an environment that should have been built and is not is a failure, and so is a
recorded reason that does not hold. Each function returns None when the environment is there,
the skip reason when it may be missing, and raises AssertionError otherwise
(tests/test_horovod.py and tests/test_byteps.py test each with injected answers)."""
import os
import re
import shutil
import subprocess

from .conftest import REPO


def _legacy_env_line(name: str) -> str:
    """The value of horovod/legacy_env.sh's line NAME='...'."""
    with open(os.path.join(REPO, "horovod", "legacy_env.sh")) as f:
        found = re.search(rf"^{name}='([^']+)'$", f.read(), re.M)
    assert found, f"horovod/legacy_env.sh has no {name}='...' line"
    return found.group(1)


# pip's words for a network failure, which the script tells from its other failures
NETWORK_ERROR = re.compile(_legacy_env_line("NETWORK_ERROR"), re.I)
UNREACHABLE = "the package registry cannot be reached"
# the start of the script's reason for a machine without a CUDA toolkit
NO_CUDA = _legacy_env_line("NO_CUDA")


def cuda_toolkit() -> str | None:
    """Where horovod/legacy_env.sh's find_cuda finds an nvcc here (CUDA_HOME, CUDAToolkit_ROOT,
    /usr/local/cuda, then PATH), or None."""
    for home in (os.environ.get("CUDA_HOME"), os.environ.get("CUDAToolkit_ROOT"),
                 "/usr/local/cuda"):
        if home and os.access(os.path.join(home, "bin", "nvcc"), os.X_OK):
            return home
    return shutil.which("nvcc")


def registry_unreachable(reason: str) -> bool:
    """The reason says the registry could not be reached, and pip's words in it are a network
    error (not "no matching distribution" alone: a registry that answered)."""
    return UNREACHABLE in reason and NETWORK_ERROR.search(reason) is not None


def horovod_skip_reason(proc: subprocess.CompletedProcess,
                        toolkit: str | None = "look") -> str | None:
    """``horovod/legacy_env.sh python``'s answer, after ``build --optional`` passed.
    ``toolkit``: where a CUDA toolkit is here (None: nowhere; "look": cuda_toolkit())."""
    if proc.returncode == 0:
        return None
    reason = proc.stderr.strip()
    assert proc.returncode == 3, (
        f"the Horovod environment is missing, and not for an unreachable registry or a "
        f"missing CUDA toolkit (exit {proc.returncode}): {reason}")
    if reason.removeprefix("horovod-env: error: ").startswith(NO_CUDA):
        toolkit = cuda_toolkit() if toolkit == "look" else toolkit
        assert toolkit is None, (
            f"the Horovod build recorded '{reason}', but a CUDA toolkit is here: {toolkit}")
        return reason
    assert registry_unreachable(reason), (
        f"the Horovod environment is missing, and not for an unreachable registry or a "
        f"missing CUDA toolkit (exit {proc.returncode}): {reason}")
    return reason


# byteps/legacy_env.sh's reasons for Debian packages that scripts/system-deps.sh could not
# install, each with the file whose absence it names
DEBIAN_PACKAGES = {
    "ZeroMQ's development files are missing": ["/usr/include/zmq.h",
                                               "/usr/lib/x86_64-linux-gnu/libzmq.so"],
    "libnuma's development files are missing": ["/usr/lib/x86_64-linux-gnu/libnuma.so"],
}
PREFIX = "byteps-env: error: "


HOROVOD_MISSING = "the real-Horovod environment it is built on is missing ("


def byteps_skip_reason(proc: subprocess.CompletedProcess,
                       horovod: subprocess.CompletedProcess | None = None) -> str | None:
    """``byteps/legacy_env.sh python``'s answer, after ``build --optional`` passed.
    ``horovod``: ``horovod/legacy_env.sh python``'s answer (None: ask it), which decides when
    the BytePS environment is missing because the Horovod one it is built on is."""
    if proc.returncode == 0:
        return None
    reason = proc.stderr.strip()
    reason = reason[len(PREFIX):] if reason.startswith(PREFIX) else reason
    assert proc.returncode == 3, (
        f"the BytePS environment should have been built and is not (exit {proc.returncode}): "
        f"{reason}")
    if reason.startswith(HOROVOD_MISSING):
        if horovod is None:
            horovod = subprocess.run([os.path.join(REPO, "horovod", "legacy_env.sh"), "python"],
                                     capture_output=True, text=True, timeout=60)
        assert horovod_skip_reason(horovod) is not None, (
            f"the BytePS build recorded '{reason}', but the Horovod environment is here")
        return reason
    if registry_unreachable(reason):
        return reason
    for words, files in DEBIAN_PACKAGES.items():
        if reason.startswith(words):
            assert not all(os.path.exists(f) for f in files), (
                f"the build recorded '{words}', but {' and '.join(files)} are here")
            return reason
    raise AssertionError(f"the BytePS environment is missing for a reason that is not a skip "
                         f"(no registry, no Horovod environment for that reason, Debian "
                         f"packages not installable): {reason}")


def deepspeed_skip_reason(proc: subprocess.CompletedProcess) -> str | None:
    """``scripts/deepspeed_env.sh python``'s answer, after ``build --optional`` passed: None
    when the environment is there, its recorded reason when the registry could not be reached;
    anything else is a failure."""
    return _registry_only_skip_reason(proc, "deepspeed-env", "DeepSpeed")


def torchft_skip_reason(proc: subprocess.CompletedProcess) -> str | None:
    """``scripts/torchft_env.sh python``'s answer, as ``deepspeed_skip_reason``."""
    return _registry_only_skip_reason(proc, "torchft-env", "torchft")


def _registry_only_skip_reason(proc: subprocess.CompletedProcess, name: str,
                               what: str) -> str | None:
    if proc.returncode == 0:
        return None
    reason = proc.stderr.strip().removeprefix(f"{name}: error: ")
    assert proc.returncode == 3 and registry_unreachable(reason), (
        f"the {what} environment should have been built and is not (exit "
        f"{proc.returncode}): {reason}")
    return reason


def target_env_python(script: str, what: str, skip_reason) -> str:
    """A lane environment of ``scripts/target_env_lib.sh`` (``script``: its build script under
    scripts/) built with ``--optional``, and its Python; the test skips (``skip_reason``'s
    answer) only where the registry could not be reached."""
    import pytest
    env_script = os.path.join(REPO, "scripts", script)
    build = subprocess.run([env_script, "build", "--optional"], capture_output=True, text=True,
                           timeout=900)
    assert build.returncode == 0, f"building the {what} environment failed:\n{build.stderr}"
    proc = subprocess.run([env_script, "python"], capture_output=True, text=True, timeout=60)
    reason = skip_reason(proc)
    if reason is not None:
        pytest.skip(reason)
    return proc.stdout.strip()

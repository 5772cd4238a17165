"""When the optional lanes' tests may skip: each condition checked, not trusted.

A skip names a condition that is really absent here (a package registry that the network does
not reach; Debian packages not installed), never an error of the suite's own
scripts: an environment that should have been built and is not is a failure, and so is a
recorded reason that does not hold. Each function returns None when the environment is there,
the skip reason when it may be missing, and raises AssertionError otherwise
(tests/test_horovod.py and tests/test_byteps.py test each with injected answers)."""
import os
import re
import subprocess

from .conftest import REPO


def _network_error_pattern() -> "re.Pattern":
    """pip's words for a network failure: the NETWORK_ERROR line of horovod/legacy_env.sh,
    which tells them from its other failures with the same words."""
    with open(os.path.join(REPO, "horovod", "legacy_env.sh")) as f:
        found = re.search(r"^NETWORK_ERROR='([^']+)'$", f.read(), re.M)
    assert found, "horovod/legacy_env.sh has no NETWORK_ERROR='...' line"
    return re.compile(found.group(1), re.I)


NETWORK_ERROR = _network_error_pattern()
UNREACHABLE = "the package registry cannot be reached"


def registry_unreachable(reason: str) -> bool:
    """The reason says the registry could not be reached, and pip's words in it are a network
    error (not "no matching distribution" alone: a registry that answered)."""
    return UNREACHABLE in reason and NETWORK_ERROR.search(reason) is not None


def horovod_skip_reason(proc: subprocess.CompletedProcess) -> str | None:
    """``horovod/legacy_env.sh python``'s answer, after ``build --optional`` passed."""
    if proc.returncode == 0:
        return None
    reason = proc.stderr.strip()
    assert proc.returncode == 3 and registry_unreachable(reason), (
        f"the Horovod environment is missing, and not for an unreachable registry "
        f"(exit {proc.returncode}): {reason}")
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

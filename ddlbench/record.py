"""The machine-readable run record: configuration, results and an environment manifest."""
from __future__ import annotations

import json
import os
import platform
import socket
import subprocess
import sys
import tempfile

import torch

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def git_commit() -> str | None:
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO, capture_output=True,
                             text=True, timeout=10)
        commit = out.stdout.strip()
        if out.returncode != 0 or not commit:
            return None
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"],
                               cwd=REPO, capture_output=True, text=True, timeout=10).stdout
        return commit + ("-dirty" if dirty.strip() else "")
    except (OSError, subprocess.SubprocessError):
        return None


def _version(module: str) -> str | None:
    try:
        return __import__(module).__version__
    except Exception:
        return None


def manifest(ctx, hosts: list[str]) -> dict:
    from . import __version__
    device = (torch.cuda.get_device_name(ctx.device) if ctx.device.type == "cuda"
              else platform.processor() or platform.machine())
    return {
        "suite_version": __version__,
        "git_commit": git_commit(),
        "python": sys.version.split()[0],
        "torch": torch.__version__,
        "torchvision": _version("torchvision"),
        "transformers": _version("transformers"),
        "cuda": torch.version.cuda,
        "nccl": ".".join(map(str, torch.cuda.nccl.version())) if ctx.backend == "nccl" else None,
        "backend": ctx.backend,
        "launcher": ctx.launcher,
        "device": str(ctx.device),
        "device_name": device,
        "threads_per_worker": torch.get_num_threads(),
        "hosts": hosts,
        "hostname": socket.gethostname(),
        "platform": platform.platform(),
    }


def write_atomic(path: str, record: dict) -> None:
    """Write JSON so that a reader never sees half a file: temp file, fsync, rename."""
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".record-", suffix=".json", dir=directory)
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(record, f, indent=2, sort_keys=True)
            f.write("\n")
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise

"""The machine-readable run record: configuration, results and an environment manifest."""
from __future__ import annotations

import json
import math
import os
import platform
import socket
import subprocess
import sys
import tempfile

import torch

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


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


def _version(package: str) -> str | None:
    """The installed package's version, read from its metadata (importing torchvision for it
    would add seconds to a BERT run)."""
    from importlib import metadata
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return None


def manifest(ctx, hosts: list[str], placement: dict | None = None,
             addresses: list | None = None) -> dict:
    from .. import __version__
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
        # each rank's address: its socket interface's (GLOO_/NCCL_SOCKET_IFNAME), else its
        # host name's
        "addresses": addresses,
        "hostname": socket.gethostname(),
        "platform": platform.platform(),
        # each rank's cores, pinned or shared (ddlbench.hosts.pinning)
        "placement": placement,
    }


def environment(ctx) -> dict:
    """The manifest with every worker's host name and cores (collective: every worker calls
    it)."""
    import torch.distributed as dist

    from ..hosts import pinning
    seen = [None] * ctx.size
    dist.all_gather_object(seen, {"host": socket.gethostname(), "address": address(),
                                  "cores": pinning.available_cores()})
    return manifest(ctx, [s["host"] for s in seen], pinning.record(seen, ctx.launcher),
                    [s["address"] for s in seen])


def address() -> str | None:
    """This process's IPv4 address: its socket interface's (the first of
    ``GLOO_SOCKET_IFNAME`` or ``NCCL_SOCKET_IFNAME``), else its host name's; None when
    neither has one."""
    iface = (os.environ.get("GLOO_SOCKET_IFNAME") or os.environ.get("NCCL_SOCKET_IFNAME")
             or "").split(",")[0].lstrip("=^")
    if iface:
        import psutil
        for a in psutil.net_if_addrs().get(iface, []):
            if a.family == socket.AF_INET:
                return a.address
    try:
        return socket.gethostbyname(socket.gethostname())
    except OSError:
        return None


def peak_rss() -> int:
    import resource
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


COUNTERS = ("bytes_received", "bytes_sent", "pushes_received")


def server_counters(ctx, ps_method: bool) -> list[dict] | None:
    """A parameter-server method's session open, before its first step: each server's traffic
    counters so far (``COUNTERS``, on rank 0; None elsewhere), which ``run_record`` subtracts
    (a job may time several PS methods on its servers). Collective over the workers: rank 0
    reads the counters, then every worker waits for it (a barrier), so that no push of this
    method reaches a server before they are read (the full suite once saw a record 2 pushes
    short: worker 1's first pushes had been counted in the snapshot)."""
    if ctx.ps is None or not ctx.nservers or not ps_method:   # (one machine: no server)
        return None
    import torch.distributed as dist
    counters = ([{k: s[k] for k in COUNTERS} for s in ctx.ps.server_stats()]
                if ctx.is_root else None)
    if dist.is_initialized() and dist.get_world_size() > 1:
        dist.barrier()
    return counters


def run_record(settings: dict, ctx, *, net: str, network: str, lr: float, options: dict,
               method: dict, model: dict, result: dict, communication: dict,
               compression: dict | None, rss_after_warmup: int | None, optimizer: dict,
               flops: dict | None, timeline: dict | None = None,
               servers_before: list[dict] | None = None) -> dict:
    """A benchmark's record: the configuration (``settings``, the command line's as
    ``RunConfig.record()`` gives them, with the running method's effective options), the
    emulated network (``net``) and its label (``network``), the method's description, the
    optimizer that ran (``workload.optimizer_info``), the model, its FLOPs and the FLOP/s
    achieved (``flops.achieved``, rank 0's), the timings, where iteration time went
    (``overlap.collect``), bytes per iteration, memory, the servers' figures (their traffic
    since ``servers_before``, ``server_counters`` at the method's start: its own; their
    memory as it stands) and the environment. Collective: every worker calls it; rank 0's is
    the one to write."""
    import torch.distributed as dist

    from .. import netem
    rss = [None] * ctx.size
    dist.all_gather_object(rss, {"after_warmup": rss_after_warmup,
                                 "per_round": result["rss_bytes_per_round"],
                                 "peak": peak_rss()})
    env = environment(ctx)
    servers = (ctx.ps.server_stats() if ctx.is_root and ctx.ps is not None and ctx.nservers
               and method.get("architecture") == "ps" else None)
    for now, then in zip(servers or [], servers_before or []):
        now.update({k: now[k] - then[k] for k in COUNTERS})
    config = dict(settings)
    config.update(options)
    config.update(nworkers=ctx.size, nservers=ctx.nservers, lr=lr)
    return {
        "config": config,
        "method": method,
        "optimizer": optimizer,
        "model": model,
        "flops": flops,
        "result": result,
        "timeline": timeline,
        "communication_per_iteration": communication,
        "compression_per_iteration": compression,
        "memory": {"rss_bytes_per_worker": rss},
        "servers": servers,
        "environment": env,
        "network": network,
        "net": netem.run_info(net),  # profile, configured and probed rate
    }


def _umask() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def _strict(value):
    """The record as strict JSON: a non-finite float (no JSON word for it) becomes null."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _strict(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_strict(v) for v in value]
    return value


def write_atomic(path: str, record: dict) -> None:
    """Write JSON so that a reader never sees half a file: temp file, fsync, rename."""
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".record-", suffix=".json", dir=directory)
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(_strict(record), f, indent=2, sort_keys=True, allow_nan=False)
            f.write("\n")
            f.flush()
            os.chmod(tmp, 0o666 & ~_umask())  # mkstemp's 0600 is not what the user asked for
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise

"""The real-Horovod lane: ``--engine horovod`` (DESIGN.md section 10).

Horovod 0.28.1 builds only beside torch 2.0.1, so this runs in the legacy environment that
``make horovod-env`` builds (``horovod/legacy_env.sh``), started by ``mpirun`` (Horovod's MPI
controller) or ``horovodrun --gloo`` (its Gloo controller); ``horovod/horovod_mpi_cj.sh
engine=horovod`` does either. Code here and in ``strategies/horovod.py`` must not use torch
APIs newer than 2.0; what differs between versions lives in ``ddlbench.compat``.

The methods are Horovod's own machinery (``METHODS``): ``hvd.DistributedOptimizer`` with the
fusion threshold and cycle time each method implies, its grouped all-reduce for MG-WFBP's
groups, ``hvd.allreduce_`` of the flattened gradients for BSP, ``hvd.Compression.fp16``.
Horovod reads its settings once, in ``hvd.init()``, so one process runs one method.

Everything around the method (the initial broadcast of rank 0's state, ``--verify``, the
timing barriers) uses a torch.distributed Gloo group over the same processes, whose store
address rank 0 hands out through Horovod; Horovod itself never sees those collectives.
"""
from __future__ import annotations

import os
import socket

from .errors import UsageError

METHODS = ("wfbp", "fusion", "bspa2a", "mgwfbp")
COMPRESSORS = ("none", "fp16")
# MG-WFBP's groups must each go as one fused message: Horovod splits a group that does not fit
# its fusion buffer, so the buffer is made larger than any group can be. On the CPU the
# untouched part of the buffer is only address space.
MGWFBP_FUSION_BYTES = 1 << 30


def no_mapping(method: str) -> UsageError:
    return UsageError(f"method {method!r} has no Horovod mapping; --engine horovod runs "
                      f"{', '.join(METHODS)} (the others run on --engine torch)")


def horovod_settings(method: str, threshold: float | None) -> dict[str, str]:
    """The HOROVOD_* variables a method runs with (set before ``hvd.init()``)."""
    from .strategies.allreduce import HOROVOD_DEFAULT_THRESHOLD
    if method == "wfbp":  # every tensor alone, as soon as it is ready
        return {"HOROVOD_FUSION_THRESHOLD": "0", "HOROVOD_CYCLE_TIME": "0"}
    if method == "fusion":  # Horovod's tensor fusion at its own cycle time (or the user's)
        t = HOROVOD_DEFAULT_THRESHOLD if threshold is None else int(threshold)
        return {"HOROVOD_FUSION_THRESHOLD": str(t)}
    if method == "mgwfbp":  # the planned groups, each fused, never fused with each other
        return {"HOROVOD_FUSION_THRESHOLD": str(MGWFBP_FUSION_BYTES), "HOROVOD_CYCLE_TIME": "0",
                "HOROVOD_DISABLE_GROUP_FUSION": "1"}
    if method == "bspa2a":  # one tensor per step: fusion has nothing to do
        return {"HOROVOD_FUSION_THRESHOLD": "0", "HOROVOD_CYCLE_TIME": "0"}
    raise no_mapping(method)


def check(args, methods: list[str], compressors: list[str], under_launcher: bool) -> None:
    """The input checks of an --engine horovod run, each a clear line."""
    for m in methods:
        if m not in METHODS:
            raise no_mapping(m)
    if len(methods) > 1:
        raise UsageError("--engine horovod runs one method per job: Horovod reads its fusion "
                         "threshold and cycle time once, at hvd.init()")
    for c in compressors:
        if c not in COMPRESSORS:
            raise UsageError(f"--engine horovod takes --compressor none or fp16 (Horovod's own "
                             f"compression), not {c!r}")
    if args.nservers:
        raise UsageError("--engine horovod has no parameter servers (--nservers); the PS "
                         "methods run on --engine torch")
    if not under_launcher and (args.nworkers or 1) > 1:
        raise UsageError("--engine horovod starts under mpirun or horovodrun, not the local "
                         "spawner: nworkers=N engine=horovod ./horovod/horovod_mpi_cj.sh "
                         "(or horovodrun --gloo -np N python -m ddlbench.train ...)")


def start(placement, method: str, threshold: float | None) -> dict[str, str]:
    """Set the method's HOROVOD_* variables and join Horovod; returns the settings the run
    used (``recorded_settings``)."""
    os.environ.update(horovod_settings(method, threshold))
    if (os.environ.get("HOROVOD_CPU_OPERATIONS", "").lower() == "gloo"
            and placement.launcher == "mpi" and os.environ.get("HOROVOD_CONTROLLER") != "gloo"):
        # Horovod 0.28.1 crashes (SIGSEGV in its Gloo broadcast) on this combination.
        raise UsageError("HOROVOD_CPU_OPERATIONS=gloo needs Horovod's Gloo controller: start "
                         "with launcher=horovodrun, or unset it under mpirun")
    import horovod.torch as hvd
    hvd.init()
    if (hvd.rank(), hvd.size()) != (placement.rank, placement.world_size):
        raise UsageError(f"Horovod says rank {hvd.rank()} of {hvd.size()}, the launcher "
                         f"{placement.rank} of {placement.world_size}")
    return recorded_settings()


def recorded_settings() -> dict[str, str]:
    """The HOROVOD_* settings worth a line in the run record (not the launcher's plumbing)."""
    return {k: v for k, v in sorted(os.environ.items()) if k in _RECORDED}


_RECORDED = {"HOROVOD_FUSION_THRESHOLD", "HOROVOD_CYCLE_TIME", "HOROVOD_DISABLE_GROUP_FUSION",
             "HOROVOD_CACHE_CAPACITY", "HOROVOD_HIERARCHICAL_ALLREDUCE", "HOROVOD_AUTOTUNE",
             "HOROVOD_CONTROLLER", "HOROVOD_CPU_OPERATIONS"}


def store(placement, timeout):
    """The torch.distributed store of the Gloo group beside Horovod: rank 0 opens it on a
    port the kernel chooses and tells the others its address through Horovod."""
    import horovod.torch as hvd
    import torch.distributed as dist
    if placement.world_size == 1:
        return dist.HashStore()
    server = None
    where = None
    if placement.rank == 0:
        addr = os.environ.get("MASTER_ADDR") or (
            "127.0.0.1" if hvd.local_size() == hvd.size()
            else socket.gethostbyname(socket.gethostname()))
        server = dist.TCPStore(addr, 0, placement.world_size, True, timeout=timeout,
                               wait_for_workers=False)
        where = (addr, server.port)
    addr, port = hvd.broadcast_object(where, root_rank=0, name="ddlbench.store")
    if server is not None:
        return server
    return dist.TCPStore(addr, port, placement.world_size, False, timeout=timeout)


def shutdown() -> None:
    import sys
    hvd = sys.modules.get("horovod.torch")
    if hvd is not None and hvd.is_initialized():
        hvd.shutdown()

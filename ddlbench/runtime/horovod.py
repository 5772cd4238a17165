"""The real-Horovod lane's engine side: join Horovod, and a Gloo group beside it.

See docs/DESIGN.md section 10. Horovod 0.28.1 builds only beside torch 2.0.1, so this runs in
the legacy environment that ``make horovod-env`` builds (``horovod/legacy_env.sh``), started by
``mpirun`` (Horovod's MPI controller) or ``horovodrun --gloo`` (its Gloo controller);
``horovod/horovod_mpi_cj.sh engine=horovod`` does either. Code here and in
``methods/horovod.py`` must not use torch APIs newer than 2.0; what differs between versions
lives in ``ddlbench.compat``.

The methods are Horovod's own machinery (``ddlbench/methods/horovod.py``: each says which
HOROVOD_* settings it needs): ``hvd.DistributedOptimizer`` with the fusion threshold and cycle
time each method implies, its grouped all-reduce for MG-WFBP's groups, ``hvd.allreduce_`` of
the flattened gradients for BSP, ``hvd.Compression.fp16``. Horovod reads its settings once, in
``hvd.init()``, so one process runs one method.

Everything around the method (the initial broadcast of rank 0's state, ``--verify``, the
timing barriers) uses a torch.distributed Gloo group over the same processes, whose store
address rank 0 hands out through Horovod; Horovod itself never sees those collectives.
"""
from __future__ import annotations

import os
import socket

from ..errors import UsageError

def start(placement, settings: dict[str, str]) -> dict[str, str]:
    """Set the method's HOROVOD_* variables (``settings``) and join Horovod; returns the
    settings the run used (``recorded_settings``)."""
    os.environ.update(settings)
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

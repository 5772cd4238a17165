"""The real-BytePS lane's engine side (``--engine byteps``): join BytePS as a worker, and a Gloo
group beside it.

See docs/DESIGN.md section 10. BytePS 0.2.5.post15 runs in the environment ``make byteps-env``
builds (``byteps/legacy_env.sh``: the Horovod environment's torch 2.0.1 with BytePS built on it
and the project's patch ``byteps/cpu_only.patch``), started by ``engine=byteps
./byteps/byteps_launch.sh``, which also starts BytePS's scheduler and servers
(``ddlbench.launch.pslaunch --engine byteps``). Code here and in ``methods/byteps.py`` must not
use torch APIs newer than 2.0.

Every worker process is a BytePS worker of its own (``BYTEPS_LOCAL_SIZE=1``,
``DMLC_WORKER_ID`` its rank): the patch's CPU path (``BYTEPS_CPU_ONLY=1``, set here when the
worker runs on the CPU) has no local NCCL reduce, so every process pushes, as the suite's
``ps_clients=process``. BytePS reads its settings once, in ``bps.init()``, so one process runs
one method.

Everything around the method (the initial broadcast of rank 0's state, ``--verify``, the timing
barriers) uses a torch.distributed Gloo group over the workers, whose store rank 0 serves at
``DMLC_PS_ROOT_URI``:``DDLBENCH_STORE_PORT`` (``DMLC_PS_ROOT_PORT`` is BytePS's scheduler);
BytePS never sees those collectives.
"""
from __future__ import annotations

import json
import os
import sys

from ..errors import UsageError

CPU_ONLY = "BYTEPS_CPU_ONLY"
# The environment's description, written by byteps/legacy_env.sh beside its Python
DESCRIPTION = "byteps-env.json"


def start(placement, settings: dict[str, str], cpu: bool) -> dict[str, str]:
    """Set the method's BYTEPS_* variables (``settings``; ``BYTEPS_CPU_ONLY=1`` on the CPU)
    and join BytePS; returns the settings the run used (``recorded_settings``)."""
    os.environ.update(settings)
    if cpu:
        os.environ[CPU_ONLY] = "1"
    if os.environ.get("BYTEPS_LOCAL_SIZE", "1") != "1":
        raise UsageError("--engine byteps runs one process per BytePS worker: "
                         "BYTEPS_LOCAL_SIZE must be 1 (byteps/byteps_launch.sh engine=byteps "
                         "sets it)")
    import byteps.torch as bps
    bps.init()
    if (bps.rank(), bps.size()) != (placement.rank, placement.world_size):
        raise UsageError(f"BytePS says rank {bps.rank()} of {bps.size()}, the launcher "
                         f"{placement.rank} of {placement.world_size}")
    return recorded_settings()


def recorded_settings() -> dict[str, str]:
    """The BYTEPS_* and DMLC_* settings worth a line in the run record."""
    return {k: v for k, v in sorted(os.environ.items()) if k in _RECORDED}


_RECORDED = {"BYTEPS_PARTITION_BYTES", CPU_ONLY, "BYTEPS_SERVER_ENABLE_SCHEDULE",
             "BYTEPS_SERVER_SCHEDULE_HEAP", "BYTEPS_SCHEDULING_CREDIT", "DMLC_NUM_WORKER",
             "DMLC_NUM_SERVER"}


def nservers() -> int:
    """BytePS's servers in this job (none when one worker runs alone: BytePS is then local)."""
    workers = int(os.environ.get("DMLC_NUM_WORKER", "1"))
    return int(os.environ.get("DMLC_NUM_SERVER", "0")) if workers > 1 else 0


def environment() -> dict:
    """What the build recorded: BytePS's version, the patch and its SHA-256, torch's version
    (``{}`` outside the environment ``make byteps-env`` builds)."""
    path = os.path.join(sys.prefix, DESCRIPTION)
    if not os.path.exists(path):
        return {}
    with open(path) as f:
        return json.load(f)


def shutdown(clean: bool) -> None:
    """Leave BytePS after a clean run (its servers wait for every worker's goodbye); after a
    failure nobody waits for them (BytePS's shutdown with work in flight crashes), and the
    launcher stops the job."""
    bps = sys.modules.get("byteps.torch")
    if bps is not None and clean:
        bps.shutdown()

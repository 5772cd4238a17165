"""Where this process sits in its job: rank, world size and rendezvous, as whichever launcher
started it says.

A worker learns its rank, world size and local rank from whichever launcher started it, first
match wins:

- the suite's local spawner (``python -m ddlbench.train --nworkers N`` with no launcher around it):
  ``DDLBENCH_LAUNCHER=local`` plus the torchrun-style variables below; the rendezvous store
  is on a port the kernel chose, so there is no port race: the spawner opens the socket and
  rank 0 serves the store on it (``DDLBENCH_STORE_FD``; on torch 2.0 the spawner hosts the
  store), or under ``--net`` rank 0 serves it on host 0's address;
- torchrun: ``TORCHELASTIC_RUN_ID`` plus ``RANK``/``WORLD_SIZE``/``LOCAL_RANK``/``MASTER_ADDR``/
  ``MASTER_PORT`` (torchrun's agent hosts the store);
- Open MPI: ``OMPI_COMM_WORLD_RANK``/``_SIZE``/``_LOCAL_RANK``/``_LOCAL_SIZE``; the rendezvous
  address comes from ``MASTER_ADDR`` (the MPI launcher sets it from the host file) and, when
  ``MASTER_PORT`` is unset, rank 0 lets the kernel choose a port and tells the others over MPI;
- horovodrun --gloo: ``HOROVOD_RANK``/``_SIZE``/``_LOCAL_RANK``/``_LOCAL_SIZE`` (only with
  ``--engine horovod``, whose store address travels through Horovod itself);
- Slurm job steps (``srun``): ``SLURM_PROCID``/``SLURM_STEP_NUM_TASKS``/``SLURM_LOCALID``;
  ``MASTER_ADDR`` defaults to the step's first node and ``MASTER_PORT`` must be given or is derived
  from the job id (10000 + job id mod 50000), as is usual on shared clusters.

Nothing here picks an address or a port of its own: they come from the environment or the kernel.
"""
from __future__ import annotations

import os
import socket
import subprocess
from dataclasses import dataclass

from ..errors import UsageError, env_int

STORE_FD_ENV = "DDLBENCH_STORE_FD"   # the local spawner's listening socket, given to rank 0
# engine=byteps (the PS launcher's real-BytePS lane): the engine, and worker 0's store port
ENGINE_ENV = "DDLBENCH_ENGINE"
STORE_PORT_ENV = "DDLBENCH_STORE_PORT"


@dataclass(frozen=True)
class Placement:
    rank: int
    world_size: int
    local_rank: int
    local_world_size: int
    launcher: str  # local | torchrun | mpi | horovodrun | slurm | dmlc | single
    master_addr: str | None
    master_port: int | None
    # Who hosts the rendezvous store: "rank0" (rank 0 starts it), or "external" (the local
    # spawner or torchrun's agent already runs it; every rank is a client).
    store_owner: str = "rank0"
    # The listening socket rank 0 serves the store on (the local spawner's; None: its own)
    store_fd: int | None = None


def _port(env):
    return env_int("MASTER_PORT", env=env)


def detect(env=None) -> Placement | None:
    """The placement given by a launcher, or None when no launcher started this process."""
    env = os.environ if env is None else env

    def _int(key, default=None):
        return env_int(key, default, env=env)

    if env.get("DDLBENCH_LAUNCHER") == "local":
        return Placement(_int("RANK"), _int("WORLD_SIZE"), _int("LOCAL_RANK"),
                         _int("LOCAL_WORLD_SIZE"), "local", env.get("MASTER_ADDR"),
                         # rank0 under --net: the store is on host 0's address (ddlbench.netem)
                         _port(env), store_owner=env.get("DDLBENCH_STORE_OWNER", "external"),
                         store_fd=_int(STORE_FD_ENV))
    if "TORCHELASTIC_RUN_ID" in env and "RANK" in env:
        return Placement(_int("RANK"), _int("WORLD_SIZE"), _int("LOCAL_RANK", 0),
                         _int("LOCAL_WORLD_SIZE", 1), "torchrun", env.get("MASTER_ADDR"),
                         _port(env), store_owner="external")
    if env.get("DMLC_ROLE") in ("worker", "server", "scheduler") and "DMLC_PS_ROOT_URI" in env:
        return _dmlc(env)
    if "OMPI_COMM_WORLD_RANK" in env:
        return Placement(_int("OMPI_COMM_WORLD_RANK"), _int("OMPI_COMM_WORLD_SIZE"),
                         _int("OMPI_COMM_WORLD_LOCAL_RANK", 0),
                         _int("OMPI_COMM_WORLD_LOCAL_SIZE", 1), "mpi",
                         env.get("MASTER_ADDR"), _port(env))
    if "HOROVOD_RANK" in env and "HOROVOD_SIZE" in env:
        # horovodrun --gloo (under mpirun the Open MPI variables above come first). The
        # rendezvous is Horovod's own: --engine horovod shares rank 0's store through it.
        return Placement(_int("HOROVOD_RANK"), _int("HOROVOD_SIZE"),
                         _int("HOROVOD_LOCAL_RANK", 0), _int("HOROVOD_LOCAL_SIZE", 1),
                         "horovodrun", env.get("MASTER_ADDR"), _port(env))
    if "SLURM_PROCID" in env and "SLURM_STEP_NUM_TASKS" in env:
        port = _port(env)
        if port is None and "SLURM_JOB_ID" in env:
            port = 10000 + _int("SLURM_JOB_ID") % 50000
        addr = env.get("MASTER_ADDR") or _slurm_first_node(env)
        return Placement(_int("SLURM_PROCID"), _int("SLURM_STEP_NUM_TASKS"),
                         _int("SLURM_LOCALID", 0),
                         _int("SLURM_STEP_TASKS_PER_NODE", 1) if
                         env.get("SLURM_STEP_TASKS_PER_NODE", "").isdigit() else 1,
                         "slurm", addr, port)
    return None


def dmlc_workers(env=None) -> int | None:
    """Worker processes of a BytePS-style job: ``DDLBENCH_NUM_WORKER`` (the suite's launcher),
    else BytePS's meaning, ``DMLC_NUM_WORKER`` machines x ``BYTEPS_LOCAL_SIZE`` processes each
    (1 when unset). None without ``DMLC_NUM_WORKER``."""
    env = os.environ if env is None else env
    given = env_int("DDLBENCH_NUM_WORKER", env=env)
    if given is not None:
        return given
    machines = env_int("DMLC_NUM_WORKER", env=env)
    if machines is None:
        return None
    return machines * env_int("BYTEPS_LOCAL_SIZE", 1, env=env)


def _dmlc(env) -> Placement:
    """BytePS-style variables (the PS launcher sets them; a BytePS user may already have
    them), with BytePS's meanings: ``DMLC_NUM_WORKER`` worker machines, ``DMLC_WORKER_ID`` the
    machine, ``BYTEPS_LOCAL_RANK``/``BYTEPS_LOCAL_SIZE`` the process on it (size 1 when unset).
    Workers are ranks 0..W-1 (``DDLBENCH_WORKER_RANK`` where the suite's launcher gives it,
    else machine x local size + local rank), servers W..W+S-1 by DDLBENCH_SERVER_ID; worker 0
    hosts the store at DMLC_PS_ROOT_URI:DMLC_PS_ROOT_PORT."""
    role = env["DMLC_ROLE"]

    def _int(key, default=None):
        return env_int(key, default, env=env)

    if role == "scheduler":
        raise UsageError("DMLC_ROLE=scheduler: this suite has no scheduler process; start "
                         "only workers and servers (byteps/byteps_launch.sh does)")
    machines, nservers = _int("DMLC_NUM_WORKER"), _int("DMLC_NUM_SERVER")
    if machines is None or nservers is None:
        raise UsageError("DMLC_ROLE set without DMLC_NUM_WORKER and DMLC_NUM_SERVER")
    nworkers = dmlc_workers(env)
    local_rank, local_size = _int("BYTEPS_LOCAL_RANK", 0), _int("BYTEPS_LOCAL_SIZE", 1)
    if role == "worker":
        machine = _int("DMLC_WORKER_ID")
        if machine is None or not 0 <= machine < machines:
            raise UsageError(f"DMLC_WORKER_ID must be in 0..{machines - 1} (DMLC_NUM_WORKER "
                             f"counts machines), got {env.get('DMLC_WORKER_ID')!r}")
        if not 0 <= local_rank < local_size:
            raise UsageError(f"BYTEPS_LOCAL_RANK must be in 0..{local_size - 1}, got "
                             f"{local_rank}")
        rank = _int("DDLBENCH_WORKER_RANK", machine * local_size + local_rank)
        if not 0 <= rank < nworkers:
            raise UsageError(f"worker rank {rank} outside 0..{nworkers - 1}")
    elif env.get(ENGINE_ENV) == "byteps":
        raise UsageError("DMLC_ROLE=server under engine=byteps: BytePS's servers run "
                         "byteps.server, not the training script")
    else:
        server = _int("DDLBENCH_SERVER_ID")
        if server is None or not 0 <= server < nservers:
            raise UsageError(f"a server needs DDLBENCH_SERVER_ID in 0..{nservers - 1}, got "
                             f"{env.get('DDLBENCH_SERVER_ID')!r}")
        rank = nworkers + server
    port = _int("DMLC_PS_ROOT_PORT")
    if port is None:
        raise UsageError("DMLC_PS_ROOT_URI set without DMLC_PS_ROOT_PORT")
    if env.get(ENGINE_ENV) == "byteps":
        # BytePS's scheduler holds DMLC_PS_ROOT_PORT and its servers are no ranks: the job is
        # the workers, and worker 0's store is on the launcher's DDLBENCH_STORE_PORT
        store = _int(STORE_PORT_ENV)
        if store is None:
            raise UsageError(f"engine=byteps without {STORE_PORT_ENV} (the port of worker 0's "
                             f"store; byteps/byteps_launch.sh engine=byteps sets it)")
        return Placement(rank, nworkers, _int("DDLBENCH_LOCAL_RANK", 0),
                         _int("DDLBENCH_LOCAL_SIZE", 1), "dmlc", env["DMLC_PS_ROOT_URI"], store)
    return Placement(rank, nworkers + nservers, _int("DDLBENCH_LOCAL_RANK", 0),
                     _int("DDLBENCH_LOCAL_SIZE", 1), "dmlc", env["DMLC_PS_ROOT_URI"],
                     port)


def _slurm_first_node(env) -> str | None:
    nodelist = env.get("SLURM_STEP_NODELIST") or env.get("SLURM_JOB_NODELIST")
    if not nodelist:
        return None
    try:
        out = subprocess.run(["scontrol", "show", "hostnames", nodelist], capture_output=True,
                             text=True, timeout=30, check=True).stdout.split()
        return out[0] if out else None
    except (OSError, subprocess.SubprocessError):
        # Plain names or "name[1-4]": the first name of the first range.
        first = nodelist.split(",")[0]
        if "[" in first:
            base, rng = first.split("[", 1)
            return base + rng.split("-")[0].split(",")[0].rstrip("]")
        return first


def launcher_rank() -> str:
    """This process's rank as its launcher gave it (for who prints a job-wide error)."""
    if os.environ.get("DMLC_ROLE") == "server":  # the PS launcher's servers: workers speak
        return "server"
    return next((os.environ[k] for k in ("RANK", "OMPI_COMM_WORLD_RANK", "HOROVOD_RANK",
                                         "SLURM_PROCID", "DDLBENCH_WORKER_RANK")
                 if k in os.environ), "0")


def single() -> Placement:
    return Placement(0, 1, 0, 1, "single", "127.0.0.1", None)


def machine_id() -> str:
    """What tells this worker's machine from the others: ``DDLBENCH_MACHINE`` (the emulated
    network's host, a launcher's host name), else the host name."""
    return os.environ.get("DDLBENCH_MACHINE") or socket.gethostname()

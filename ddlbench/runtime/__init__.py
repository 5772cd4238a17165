"""The torch engine: torch.distributed set up from a Placement (NCCL on CUDA, Gloo on CPU), the
parameter servers' side of a job, and the Horovod lane's start."""
from __future__ import annotations

import datetime
import gc
import os
import sys
from dataclasses import dataclass

import torch
import torch.distributed as dist

from .. import compat
from ..errors import UsageError, first_line
from ..hosts import pinning
from ..hosts.placement import Placement, machine_id
from ..planning import DEFAULT_PARTITION_BYTES, DEFAULT_PS_CLIENTS, PS_CLIENTS
from .groups import Groups
from .ps import PSClient


@dataclass
class Context:
    rank: int
    size: int
    local_rank: int
    local_size: int
    device: torch.device
    backend: str
    launcher: str
    # The parameter-server side of the job (ranks size..size+nservers-1), if it has servers.
    ps: "PSClient | None" = None
    nservers: int = 0
    # --engine horovod: the HOROVOD_* settings it runs with (None on the torch engine).
    horovod: "dict | None" = None
    # --engine byteps: the BYTEPS_* settings it runs with (None on the other engines).
    byteps: "dict | None" = None
    # The job's process groups by layout (ddlbench.runtime.groups), built when first asked.
    groups: "Groups | None" = None

    @property
    def is_root(self) -> bool:
        return self.rank == 0

    @property
    def device_noun(self) -> str:
        """The word the original's log lines use: GPU on CUDA, CPU otherwise."""
        return "GPU" if self.device.type == "cuda" else "CPU"


def choose_device(placement: Placement, use_cuda: bool) -> torch.device:
    if use_cuda and torch.cuda.is_available():
        return torch.device("cuda", placement.local_rank % torch.cuda.device_count())
    return torch.device("cpu")


def choose_backend(device: torch.device, placement: Placement, requested: str = "auto") -> str:
    if requested != "auto":
        if requested == "nccl" and device.type != "cuda":
            raise UsageError("--backend nccl needs CUDA; this run is on the CPU")
        return requested
    if device.type != "cuda":
        return "gloo"
    # NCCL refuses two ranks on one GPU ("Duplicate GPU detected"); Gloo handles CUDA tensors.
    if placement.local_world_size > torch.cuda.device_count():
        return "gloo"
    return "nccl"


def is_server(placement: Placement, nservers: int) -> bool:
    """Ranks W..W+S-1 of a job with S servers are the parameter servers."""
    return nservers > 0 and placement.rank >= placement.world_size - nservers


@dataclass(frozen=True)
class Job:
    """What the runtime needs to know of a job, from any entry's flags (``Job.of``): the
    device (``use_cuda``), the backend (auto, nccl, gloo), how long a collective may wait
    (``timeout_s``), CPU threads per worker, the parameter servers (``nservers``, the
    partition size their keys are cut by, one client per machine or per process; ``ps_local``:
    a PS job whose workers are on one machine and that runs no server, a local reduce and
    broadcast instead, as BytePS) and, for the Horovod lane, the HOROVOD_* settings of the
    method it runs."""
    use_cuda: bool = True
    backend: str = "auto"
    timeout_s: float = 300.0
    threads: int | None = None
    nservers: int = 0
    partition_bytes: int = DEFAULT_PARTITION_BYTES
    ps_clients: str = DEFAULT_PS_CLIENTS
    horovod: dict[str, str] | None = None
    ps_local: bool = False
    byteps: dict[str, str] | None = None
    cudnn_benchmark: bool = False

    @classmethod
    def of(cls, flags, horovod: dict[str, str] | None = None,
           byteps: dict[str, str] | None = None) -> "Job":
        """From a command line's flags (``--no-cuda``, ``--backend``, ``--timeout``,
        ``--threads``, ``--nservers``, ``--partition-bytes``, ``--ps-clients``,
        ``--cudnn-benchmark``)."""
        return cls(use_cuda=not flags.no_cuda, backend=flags.backend, timeout_s=flags.timeout,
                   threads=flags.threads, nservers=flags.nservers,
                   partition_bytes=flags.partition_bytes, ps_clients=flags.ps_clients,
                   horovod=horovod, ps_local=getattr(flags, "ps_local", False), byteps=byteps,
                   cudnn_benchmark=getattr(flags, "cudnn_benchmark", False))


def start(placement: Placement, job: Job, worker) -> int:
    """This process's part of the job: ranks after the workers are parameter servers and
    only sum until worker 0 ends the job (docs/DESIGN.md section 6); a worker joins
    (``init``), runs ``worker(ctx)`` and leaves (``shutdown``: after a failure nobody waits
    for the servers, they see the connections close). Returns the exit status."""
    if is_server(placement, job.nservers):
        return serve(placement, job.nservers, timeout_s=job.timeout_s)
    ctx = init(placement, job)
    try:
        return worker(ctx)
    finally:
        shutdown(ctx, clean=sys.exc_info()[0] is None)


def init(placement: Placement, job: Job) -> Context:
    """Join the job as a worker: the workers' default group (NCCL or Gloo), plus, when the
    job has ``nservers`` parameter servers, the push/pull group shared with them (one client
    per machine, or per worker with ``ps_clients="process"``: ``ddlbench.runtime.ps``). With
    ``ps_local`` and no server, the push/pull group is the workers' own and worker 0 sums
    (``ps.LocalReduce``). With ``horovod`` (the HOROVOD_* settings of the method to run)
    Horovod is started first, and the default group is a Gloo group beside it for everything
    but the method's own communication (ddlbench.runtime.horovod); with ``byteps`` (the
    BYTEPS_* settings) likewise BytePS (ddlbench.runtime.byteps), whose servers are not ranks
    of the job."""
    use_cuda, backend, timeout_s, threads = job.use_cuda, job.backend, job.timeout_s, job.threads
    nservers, partition_bytes, ps_clients, horovod = (job.nservers, job.partition_bytes,
                                                       job.ps_clients, job.horovod)
    nworkers = placement.world_size - nservers
    if nworkers <= 0:
        raise UsageError(f"{placement.world_size} processes cannot hold {nservers} servers "
                         f"and at least one worker")
    device = choose_device(placement, use_cuda)
    backend = choose_backend(device, placement, backend)
    # cuDNN's autotuner, as the original's scripts set it (--cudnn-benchmark); none on the CPU
    torch.backends.cudnn.benchmark = job.cudnn_benchmark
    if device.type == "cuda":
        torch.cuda.set_device(device)
    else:
        # One thread per core this process was pinned to (ddlbench.hosts.pinning), else share
        # the cores between the workers of this host; oversubscription ruins CPU timings.
        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
        share = 1 if pinning.pinned(placement.rank) else max(1, placement.local_world_size)
        torch.set_num_threads(threads or max(1, (cores or 1) // share))
    timeout = datetime.timedelta(seconds=timeout_s)
    client = None
    byteps = job.byteps
    if byteps is not None:
        from . import byteps as byteps_lane
        byteps = byteps_lane.start(placement, byteps, cpu=device.type == "cpu")
        nservers = byteps_lane.nservers()
        backend = "gloo"   # beside BytePS: the auxiliary collectives are few and small
        dist.init_process_group(backend, store=_store(placement, timeout), rank=placement.rank,
                                world_size=placement.world_size, timeout=timeout)
        nworkers = placement.world_size
    elif horovod is not None:
        from . import horovod as horovod_lane
        horovod = horovod_lane.start(placement, horovod)
        # Gloo beside Horovod: the auxiliary collectives are few and small.
        backend = "gloo"
        dist.init_process_group(backend, store=horovod_lane.store(placement, timeout),
                                rank=placement.rank, world_size=placement.world_size,
                                timeout=timeout)
    elif nservers == 0 and placement.launcher == "torchrun" and not job.ps_local:
        dist.init_process_group(backend, init_method="env://", timeout=timeout)
    elif nservers == 0 and not job.ps_local:
        store = _store(placement, timeout)
        dist.init_process_group(backend, store=store, rank=placement.rank,
                                world_size=placement.world_size, timeout=timeout)
    else:
        from . import ps
        store = _store(placement, timeout)
        dist.init_process_group(backend, store=dist.PrefixStore("ddlbench-workers/", store),
                                rank=placement.rank, world_size=nworkers, timeout=timeout)
        group = ps.connect(store, placement.rank, placement.world_size, timeout_s)
        if nservers == 0:   # one machine, no server: a local reduce and broadcast
            client = ps.LocalReduce(group, placement.rank, nworkers, partition_bytes, timeout_s)
        else:
            client = _ps_client(ps, group, placement.rank, nworkers, nservers,
                                partition_bytes, timeout_s, ps_clients)
    return Context(placement.rank, nworkers, placement.local_rank,
                   placement.local_world_size, device, backend, placement.launcher,
                   ps=client, nservers=nservers, horovod=horovod, byteps=byteps,
                   groups=Groups(placement.rank, nworkers))


def _ps_client(ps, group, rank: int, nworkers: int, nservers: int, partition_bytes: int,
               timeout_s: float, clients: str):
    if clients not in PS_CLIENTS:
        raise UsageError(f"ps_clients must be {' or '.join(PS_CLIENTS)}, got {clients!r}")
    if clients == PSClient.clients:
        return PSClient(group, rank, nworkers, nservers, partition_bytes, timeout_s)
    ids: list = [None] * nworkers
    dist.all_gather_object(ids, machine_id())
    groups = ps.machines(ids)
    mine = next(g for g in groups if rank in g)
    leaders = [g[0] for g in groups]
    client = (PSClient(group, rank, nworkers, nservers, partition_bytes, timeout_s,
                       pushers=leaders) if rank == mine[0] else None)
    return ps.MachineClient(group, rank, mine, client, nservers, partition_bytes, timeout_s)


def serve(placement: Placement, nservers: int, timeout_s: float = 300.0) -> int:
    """Run this process as a parameter server until worker 0 ends the job (docs/DESIGN.md
    section 6). Servers sum on the CPU; they join only the push/pull group."""
    from . import ps
    timeout = datetime.timedelta(seconds=timeout_s)
    store = _store(placement, timeout)
    nworkers = placement.world_size - nservers
    group = ps.connect(store, placement.rank, placement.world_size, timeout_s)
    return ps.Server(group, placement.rank, nworkers, nservers, timeout_s).run()


def _store(p: Placement, timeout: datetime.timedelta) -> dist.Store:
    if p.world_size == 1 and p.master_port is None:
        return dist.HashStore()
    addr = p.master_addr
    port = p.master_port
    if p.launcher == "mpi" and port is None:
        return _mpi_store(p, addr or "127.0.0.1", timeout)
    if addr is None or port is None:
        raise UsageError(f"{p.launcher} launch without a rendezvous: set MASTER_ADDR and "
                         "MASTER_PORT (or use the suite's launchers, which set them)")
    is_master = p.rank == 0 and p.store_owner == "rank0"
    # rank 0 of the local spawner serves on the socket the spawner opened (its port)
    given = {"master_listen_fd": p.store_fd} if is_master and p.store_fd is not None else {}
    try:
        return dist.TCPStore(addr, port, p.world_size, is_master, timeout=timeout,
                             wait_for_workers=False, **given)
    except (RuntimeError, OSError) as e:  # DistNetworkError: in use, unreachable, timed out
        what = "open" if is_master else "reach"
        raise UsageError(f"cannot {what} the rendezvous store at MASTER_ADDR={addr} "
                         f"MASTER_PORT={port} ({first_line(e)}); choose a free port or leave "
                         f"MASTER_PORT unset under mpirun (rank 0 then lets the kernel pick)"
                         ) from None


def _mpi_store(p: Placement, addr: str, timeout) -> dist.Store:
    """Rank 0 opens the store on a kernel-chosen port and tells the others through MPI."""
    try:
        from mpi4py import MPI
    except ImportError:
        raise UsageError("started by mpirun without MASTER_PORT, and mpi4py is not installed "
                         "to agree on one") from None
    comm = MPI.COMM_WORLD
    store = None
    port = None
    if p.rank == 0:
        store = dist.TCPStore(addr, 0, p.world_size, True, timeout=timeout,
                              wait_for_workers=False)
        port = store.port
    port = comm.bcast(port, root=0)
    if store is None:
        store = dist.TCPStore(addr, port, p.world_size, False, timeout=timeout)
    return store


def shutdown(ctx: Context | None = None, clean: bool = True) -> None:
    """Leave the job. After a clean run worker 0 tells the servers to stop; after a failure
    nobody waits for them (they notice the closed connections and exit)."""
    if ctx is not None and ctx.ps is not None and clean:
        ctx.ps.shutdown()
    # What the run left in reference cycles (wrappers, their reducers, pending work and the
    # tensors it holds) is freed now, while the interpreter is whole, not in its teardown.
    gc.collect()
    if dist.is_initialized():
        compat.destroy_process_group()  # (on torch 2.0 the process exits hard instead)
    if ctx is not None and ctx.horovod is not None:
        from . import horovod
        horovod.shutdown()
    if ctx is not None and ctx.byteps is not None:
        from . import byteps
        byteps.shutdown(clean)


def synchronize(device: torch.device) -> None:
    """Wait for the device: timings on CUDA are meaningless without it."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)

"""The suite's own local spawner: ``--nworkers N`` processes on this machine (each a host of an
emulated cluster under ``--net``), the first failure taking the others down."""
from __future__ import annotations

import os
import subprocess
import sys

import json

from .. import netem
from ..errors import UsageError
from ..hosts import pinning
from ..hosts.placement import STORE_FD_ENV
from ..hosts.procs import PARENT_ENV, die_with_parent, stop_signals, supervise, terminate

# What one local process needs at least (a small model's worker: interpreter, torch, buffers),
# and how many may share one core before the run is only contention.
MIN_PROCESS_BYTES = 150 << 20
PROCESSES_PER_CORE = 8


def machines(nworkers: int, slots: int | None, net) -> int:
    """How many machines the local spawner puts ``nworkers`` workers on: ``slots`` per emulated
    host, else one per process under ``net`` (an emulated network), else one (the loopback)."""
    if slots is not None:
        # (slots <= 0: the training script's check says so in one line, after this guess)
        return -(-nworkers // slots) if slots > 0 else 1
    try:
        loopback = netem.resolve(net).loopback
    except UsageError:   # (the training script's check says why, in one line)
        loopback = False
    return 1 if loopback else nworkers


def check_slots(slots: int | None, env=None) -> None:
    """``--slots`` under a launcher (one line): it places the workers of this spawner only
    (the training script's and the profiler's check; that it is positive is theirs too)."""
    from ..hosts import placement
    if slots is not None and placement.detect(env) is not None:
        raise UsageError("--slots places the workers of the suite's local spawner; under a "
                         "launcher its host file says which workers share a machine")


def one_machine(nworkers: int, slots: int | None, net, env=None) -> bool:
    """Whether a job's workers are all on one machine (docs/DESIGN.md section 6, "One
    machine"): the local spawner's ``machines`` is 1; under the PS launcher (DMLC_*
    variables), ``DMLC_NUM_WORKER`` (worker machines) is 1; under any other launcher, every
    process of the job is on this host (its local size is the world size)."""
    from ..errors import env_int
    from ..hosts import placement
    env = os.environ if env is None else env
    p = placement.detect(env)
    if p is None or p.launcher == "local":
        return machines(nworkers, slots, net) == 1
    if p.launcher == "dmlc":
        return env_int("DMLC_NUM_WORKER", env=env) == 1
    return p.local_world_size >= p.world_size


def check_capacity(nprocs: int) -> None:
    """Refuse a local job this machine cannot hold, before anything starts (one line)."""
    import psutil
    cores = os.cpu_count() or 1
    free = psutil.virtual_memory().available
    limit = min(max(8, PROCESSES_PER_CORE * cores), free // MIN_PROCESS_BYTES)
    if nprocs > limit:
        raise UsageError(f"{nprocs} local processes asked for, but this machine holds at most "
                         f"{limit} ({cores} cores x {PROCESSES_PER_CORE}, "
                         f"{free / (1 << 30):.1f} GiB free at {MIN_PROCESS_BYTES >> 20} MiB "
                         f"each); use a host file and a launcher for more")


def hosts_of(nprocs: int, nservers: int = 0, slots: int | None = None) -> list[int]:
    """The emulated host of each process: ``slots`` workers per host (None: one process per
    host), then each parameter server (the last ``nservers`` processes) on a host of its own,
    as on a cluster with dedicated server machines."""
    nworkers = nprocs - nservers
    per = slots or 1
    worker_hosts = -(-nworkers // per)
    return [r // per if r < nworkers else worker_hosts + (r - nworkers) for r in range(nprocs)]


def process_names(nprocs: int, nservers: int = 0) -> list[str]:
    """How each process of a local job is named in a line about it: ``worker R`` for the
    workers, ``parameter server S (rank R)`` for the last ``nservers`` processes."""
    first = nprocs - nservers
    return [f"worker {r}" if r < first else f"parameter server {r - first} (rank {r})"
            for r in range(nprocs)]


def spawn_local(nworkers: int, argv: list[str], master_addr: str = "127.0.0.1",
                grace_s: float = 5.0, module: str = "ddlbench.train",
                net: str | None = None, slots: int | None = None, nservers: int = 0,
                pin: bool = True) -> int:
    """Run ``python -m MODULE ARGV`` (the training script unless told otherwise; the
    communication micro-benchmark and the profiler use it too) as ``nworkers`` local processes
    and wait for them.

    The first worker to fail takes the others down (SIGTERM, then SIGKILL after ``grace_s``);
    SIGINT/SIGTERM to this process does the same. Returns the job's exit code: 0 when every
    worker succeeded, else the first failure's code (128 + signal for a killed worker).

    ``net``: a network profile (``ddlbench.netem``); other than loopback, each process runs as
    a host of an emulated cluster (its own network namespace, ``ip netns exec``), which is
    removed when the processes are gone.

    ``slots``: workers per host (``--slots``), the last ``nservers`` processes being servers on
    hosts of their own (``hosts_of``). Each process learns its host as ``DDLBENCH_MACHINE``
    (what the per-machine parameter-server clients group by), under ``--net`` always and on the
    loopback when ``slots`` is given (logical machines: all processes share this machine's
    cores, so ``LOCAL_RANK``/``LOCAL_WORLD_SIZE`` stay this machine's).

    ``pin`` (and ``DDLBENCH_PIN`` not 0): when the processes fit this process's cores, each is
    pinned to cores of its own (``ddlbench.hosts.pinning``) between fork and exec, which
    ``ip netns exec`` keeps under ``--net``; every process learns the plan in
    ``DDLBENCH_PLACEMENT`` for the record.
    """
    base_env = dict(os.environ, DDLBENCH_LAUNCHER="local", WORLD_SIZE=str(nworkers),
                    **{PARENT_ENV: str(os.getpid())},
                    LOCAL_WORLD_SIZE=str(nworkers), MASTER_ADDR=master_addr)
    placement = pinning.plan(nworkers - nservers, nservers,
                             pin=pin and pinning.enabled())
    base_env[pinning.PLACEMENT_ENV] = json.dumps(placement, sort_keys=True)
    procs: list[subprocess.Popen] = []
    cluster = None  # the emulated network of --net: one host per process
    store = None    # the rendezvous of a job on this machine's loopback
    with stop_signals() as stopping:
        try:
            host = hosts_of(nworkers, nservers, slots)
            if net:
                cluster = netem.start(max(host) + 1, net)
            if "MASTER_PORT" not in (cluster.env(0) if cluster else {}):
                store = _Rendezvous(master_addr)   # (an emulated network has its own: host 0's)
                base_env.update(store.env)
            for rank in range(nworkers):
                if stopping["signal"] is not None:
                    break
                env = dict(base_env, RANK=str(rank), LOCAL_RANK=str(rank))
                if cluster or slots:
                    env["DDLBENCH_MACHINE"] = f"host{host[rank]}"
                env.update(cluster.env(host[rank]) if cluster else {})
                serves = rank == 0 and store is not None   # the store, on the given socket
                env.update(store.owner_env if serves else {})
                procs.append(subprocess.Popen([*(cluster.prefix(host[rank]) if cluster else []),
                                               sys.executable, "-m", module, *argv], env=env,
                                              pass_fds=store.fds if serves else (),
                                              preexec_fn=child_setup(placement, rank)))
                if serves:
                    store.handed()
            # Workers that fail together (a failed verification) exit within moments of each
            # other: only the ones still running after grace_s are stopped, and named.
            return supervise(procs, process_names(nworkers, nservers), stopping,
                             settle_s=grace_s)
        finally:
            terminate(procs, grace_s)
            if cluster is not None:
                cluster.down()
            if store is not None:
                store.close()


class _Rendezvous:
    """The rendezvous store of a job on this machine's loopback, on a port the kernel chose
    (no port race). Where torch's ``TCPStore`` takes a listening socket (``master_listen_fd``,
    torch >= 2.1), this process only opens the socket and hands it to rank 0, which serves the
    store on it: the spawner, which only parses and launches, then never imports torch (2 s
    of every local job's start-up on a 2-core machine, before any worker could start).
    Connections that arrive before rank 0 serves wait in the socket's backlog. On torch 2.0
    (the Horovod environment) this process hosts the store itself, as before."""

    def __init__(self, addr: str):
        self._store = self._socket = None
        self.env: dict[str, str] = {}
        self.owner_env: dict[str, str] = {}
        self.fds: tuple = ()
        if _takes_listen_fd():
            import socket
            self._socket = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            self._socket.bind((addr, 0))
            self._socket.listen(128)
            fd = self._socket.fileno()
            self.env = {"MASTER_PORT": str(self._socket.getsockname()[1])}
            self.owner_env = {"DDLBENCH_STORE_OWNER": "rank0", STORE_FD_ENV: str(fd)}
            self.fds = (fd,)
        else:
            import torch.distributed as dist
            self._store = dist.TCPStore(addr, 0, None, True, wait_for_workers=False)
            self.env = {"MASTER_PORT": str(self._store.port)}

    def handed(self) -> None:
        """Rank 0 has the socket: this process's copy is closed (the store lives as long as
        rank 0; a client that connects after it died is refused at once)."""
        if self._socket is not None:
            self._socket.close()
            self._socket = None

    def close(self) -> None:
        self.handed()
        self._store = None


def _takes_listen_fd() -> bool:
    """Whether this environment's torch lets a ``TCPStore`` serve on a given socket (torch >=
    2.1), read from the installed package's version without importing torch."""
    from importlib import metadata
    try:
        major, minor = (int(x) for x in metadata.version("torch").split(".")[:2])
    except (metadata.PackageNotFoundError, ValueError):
        return False
    return (major, minor) >= (2, 1)


def child_setup(placement: dict, rank: int | None):
    """The child's set-up between fork and exec: it dies with this process, and, pinned, runs
    on its own cores (``placement``'s for rank ``rank``; None: every core) from its first
    instruction on (before Python starts, so before torch sizes its thread pools)."""
    die = die_with_parent()
    if rank is None or placement["pinning"] not in (pinning.PINNED, pinning.WORKERS):
        return die
    pin = pinning.pin_to(placement["ranks"][rank]["cores"])

    def preexec() -> None:
        die()
        pin()
    return preexec

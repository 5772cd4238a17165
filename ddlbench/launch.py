"""Where this process sits in the job, and the suite's own local spawner.

A worker learns its rank, world size and local rank from whichever launcher started it, first
match wins:

- the suite's local spawner (``python -m ddlbench.train --nworkers N`` with no launcher around it):
  ``DDLBENCH_LAUNCHER=local`` plus the torchrun-style variables below; the spawner hosts the
  rendezvous store itself, on a port the kernel chose, so there is no port race;
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

import contextlib
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass

from .errors import EXIT_USAGE, UsageError
from .ps import PSError, say


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


def _int(env, key, default=None):
    value = env.get(key)
    if value is None or value == "":
        return default
    try:
        return int(value)
    except ValueError:
        raise UsageError(f"environment variable {key}={value!r} is not an integer") from None


def _port(env):
    return _int(env, "MASTER_PORT")


def detect(env=None) -> Placement | None:
    """The placement given by a launcher, or None when no launcher started this process."""
    env = os.environ if env is None else env
    if env.get("DDLBENCH_LAUNCHER") == "local":
        return Placement(_int(env, "RANK"), _int(env, "WORLD_SIZE"), _int(env, "LOCAL_RANK"),
                         _int(env, "LOCAL_WORLD_SIZE"), "local", env.get("MASTER_ADDR"),
                         # rank0 under --net: the store is on host 0's address (ddlbench.netem)
                         _port(env), store_owner=env.get("DDLBENCH_STORE_OWNER", "external"))
    if "TORCHELASTIC_RUN_ID" in env and "RANK" in env:
        return Placement(_int(env, "RANK"), _int(env, "WORLD_SIZE"), _int(env, "LOCAL_RANK", 0),
                         _int(env, "LOCAL_WORLD_SIZE", 1), "torchrun", env.get("MASTER_ADDR"),
                         _port(env), store_owner="external")
    if env.get("DMLC_ROLE") in ("worker", "server", "scheduler") and "DMLC_PS_ROOT_URI" in env:
        return _dmlc(env)
    if "OMPI_COMM_WORLD_RANK" in env:
        return Placement(_int(env, "OMPI_COMM_WORLD_RANK"), _int(env, "OMPI_COMM_WORLD_SIZE"),
                         _int(env, "OMPI_COMM_WORLD_LOCAL_RANK", 0),
                         _int(env, "OMPI_COMM_WORLD_LOCAL_SIZE", 1), "mpi",
                         env.get("MASTER_ADDR"), _port(env))
    if "HOROVOD_RANK" in env and "HOROVOD_SIZE" in env:
        # horovodrun --gloo (under mpirun the Open MPI variables above come first). The
        # rendezvous is Horovod's own: --engine horovod shares rank 0's store through it.
        return Placement(_int(env, "HOROVOD_RANK"), _int(env, "HOROVOD_SIZE"),
                         _int(env, "HOROVOD_LOCAL_RANK", 0), _int(env, "HOROVOD_LOCAL_SIZE", 1),
                         "horovodrun", env.get("MASTER_ADDR"), _port(env))
    if "SLURM_PROCID" in env and "SLURM_STEP_NUM_TASKS" in env:
        port = _port(env)
        if port is None and "SLURM_JOB_ID" in env:
            port = 10000 + _int(env, "SLURM_JOB_ID") % 50000
        addr = env.get("MASTER_ADDR") or _slurm_first_node(env)
        return Placement(_int(env, "SLURM_PROCID"), _int(env, "SLURM_STEP_NUM_TASKS"),
                         _int(env, "SLURM_LOCALID", 0),
                         _int(env, "SLURM_STEP_TASKS_PER_NODE", 1) if
                         env.get("SLURM_STEP_TASKS_PER_NODE", "").isdigit() else 1,
                         "slurm", addr, port)
    return None


def _dmlc(env) -> Placement:
    """BytePS-style variables (the PS launcher sets them; a BytePS user may already have
    them): workers are ranks 0..W-1 by DMLC_WORKER_ID, servers W..W+S-1 by
    DDLBENCH_SERVER_ID; worker 0 hosts the store at DMLC_PS_ROOT_URI:DMLC_PS_ROOT_PORT."""
    role = env["DMLC_ROLE"]
    if role == "scheduler":
        raise UsageError("DMLC_ROLE=scheduler: this suite has no scheduler process; start "
                         "only workers and servers (byteps/byteps_launch.sh does)")
    nworkers, nservers = _int(env, "DMLC_NUM_WORKER"), _int(env, "DMLC_NUM_SERVER")
    if nworkers is None or nservers is None:
        raise UsageError("DMLC_ROLE set without DMLC_NUM_WORKER and DMLC_NUM_SERVER")
    if role == "worker":
        rank = _int(env, "DMLC_WORKER_ID")
        if rank is None or not 0 <= rank < nworkers:
            raise UsageError(f"DMLC_WORKER_ID must be in 0..{nworkers - 1}, got "
                             f"{env.get('DMLC_WORKER_ID')!r}")
    else:
        server = _int(env, "DDLBENCH_SERVER_ID")
        if server is None or not 0 <= server < nservers:
            raise UsageError(f"a server needs DDLBENCH_SERVER_ID in 0..{nservers - 1}, got "
                             f"{env.get('DDLBENCH_SERVER_ID')!r}")
        rank = nworkers + server
    port = _int(env, "DMLC_PS_ROOT_PORT")
    if port is None:
        raise UsageError("DMLC_PS_ROOT_URI set without DMLC_PS_ROOT_PORT")
    return Placement(rank, nworkers + nservers, _int(env, "DDLBENCH_LOCAL_RANK", 0),
                     _int(env, "DDLBENCH_LOCAL_SIZE", 1), "dmlc", env["DMLC_PS_ROOT_URI"],
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


def run_job(argv, module: str, parse_args, check, worker,
            check_under_launcher: bool = True) -> int:
    """The entry of every job-level command (training script, comm_bench, profiler).

    Parses ``argv``; with no launcher around, checks the input and spawns ``--nworkers`` local
    copies of ``python -m MODULE`` (or runs in this process for one worker); under a launcher,
    checks that ``--nworkers`` agrees with it and runs ``worker(args, placement)``. Bad input is
    one line on stderr (from rank 0 only) and exit code 2.
    """
    try:
        args = parse_args(argv)
        placement = detect()
        nservers = getattr(args, "nservers", 0) or 0  # parameter servers: extra processes
        if placement is None:
            check(args)
            nworkers = args.nworkers or 1
            if nworkers > 1 or nservers > 0:
                # The children learn the server count resolved here (a default, perhaps).
                child_argv = [*argv, "--nservers", str(nservers)] if nservers else argv
                return spawn_local(nworkers + nservers, child_argv, module=module,
                                   net=getattr(args, "net", None))
            placement = single()
        elif args.nworkers is not None and args.nworkers + nservers != placement.world_size:
            raise UsageError(f"--nworkers {args.nworkers}" +
                             (f" and --nservers {nservers}" if nservers else "") +
                             f", but the {placement.launcher} launcher started "
                             f"{placement.world_size} processes")
        elif placement.launcher != "local" and check_under_launcher:
            check(args)
        return worker(args, placement)
    except UsageError as e:
        # Every rank meets the same bad input; one line is enough.
        rank = _launcher_rank()
        if rank == "0":
            print(f"ddlbench: error: {e}", file=sys.stderr, flush=True)
        return EXIT_USAGE
    except PSError as e:
        # A parameter server died or cannot be reached: each worker says which, and leaves at
        # once (its communication threads may still be blocked on the dead peer).
        rank = _launcher_rank()
        say(f"ddlbench: worker {rank}: error: {e}")
        os._exit(1)


def _launcher_rank() -> str:
    """This process's rank as its launcher gave it (for who prints a job-wide error)."""
    return next((os.environ[k] for k in ("RANK", "OMPI_COMM_WORLD_RANK", "HOROVOD_RANK",
                                         "SLURM_PROCID") if k in os.environ), "0")


def single() -> Placement:
    return Placement(0, 1, 0, 1, "single", "127.0.0.1", None)


# --------------------------------------------------------------------------- local spawner

def spawn_local(nworkers: int, argv: list[str], master_addr: str = "127.0.0.1",
                grace_s: float = 5.0, module: str = "ddlbench.train",
                net: str | None = None) -> int:
    """Run ``python -m MODULE ARGV`` (the training script unless told otherwise; the
    communication micro-benchmark and the profiler use it too) as ``nworkers`` local processes
    and wait for them.

    The first worker to fail takes the others down (SIGTERM, then SIGKILL after ``grace_s``);
    SIGINT/SIGTERM to this process does the same. Returns the job's exit code: 0 when every
    worker succeeded, else the first failure's code (128 + signal for a killed worker).

    ``net``: a network profile (``ddlbench.netem``); other than loopback, each process runs as
    a host of an emulated cluster (its own network namespace, ``ip netns exec``), which is
    removed when the processes are gone.
    """
    import torch.distributed as dist  # the store lives in this process, on a kernel-chosen port

    store = dist.TCPStore(master_addr, 0, None, True, wait_for_workers=False)
    base_env = dict(os.environ, DDLBENCH_LAUNCHER="local", WORLD_SIZE=str(nworkers),
                    LOCAL_WORLD_SIZE=str(nworkers), MASTER_ADDR=master_addr,
                    MASTER_PORT=str(store.port))
    procs: list[subprocess.Popen] = []
    cluster = None  # the emulated network of --net: one host per process
    with stop_signals() as stopping:
        try:
            if net:
                from . import netem
                cluster = netem.start(nworkers, net)
            for rank in range(nworkers):
                if stopping["signal"] is not None:
                    break
                env = dict(base_env, RANK=str(rank), LOCAL_RANK=str(rank))
                env.update(cluster.env(rank) if cluster else {})
                procs.append(subprocess.Popen([*(cluster.prefix(rank) if cluster else []),
                                               sys.executable, "-m", module, *argv], env=env))
            # Workers that fail together (a failed verification) exit within moments of each
            # other: only the ones still running after grace_s are stopped, and named.
            return supervise(procs, [f"worker {r}" for r in range(nworkers)], stopping,
                             settle_s=grace_s)
        finally:
            terminate(procs, grace_s)
            if cluster is not None:
                cluster.down()
            del store


@contextlib.contextmanager
def stop_signals():
    """While inside, SIGINT and SIGTERM are recorded instead of raised (so set-up and tear-down
    run to the end): yields a dict whose "signal" is the first one received, else None."""
    stopping = {"signal": None}

    def on_signal(signum, _frame):
        if stopping["signal"] is None:
            stopping["signal"] = signum

    old = {s: signal.signal(s, on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield stopping
    finally:
        for s, handler in old.items():
            signal.signal(s, handler)


def supervise(procs: list[subprocess.Popen], names: list[str], stopping: dict,
              settle_s: float = 0.0, poll_s: float = 0.05) -> int:
    """Wait for a job's processes (``stopping`` from ``stop_signals()``). Returns 0 when every
    one exits 0; 128 + signal when this process got SIGINT/SIGTERM; else the first failure's
    code (128 + signal for a killed process), after giving the others ``settle_s`` to exit on
    their own and naming the failed one when some are still running. The caller stops
    whatever still runs."""
    while True:
        if stopping["signal"] is not None:
            return 128 + stopping["signal"]
        codes = [p.poll() for p in procs]
        bad = [(i, c) for i, c in enumerate(codes) if c not in (None, 0)]
        if bad:
            i, code = bad[0]
            _wait_all(procs, settle_s)
            if any(p.poll() is None for p in procs):
                print(f"ddlbench: {names[i]} exited with code {code}; stopping the others",
                      file=sys.stderr, flush=True)
            return code if code > 0 else 128 - code
        if all(c == 0 for c in codes):
            return 0
        time.sleep(poll_s)


def _wait_all(procs, timeout_s):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and any(p.poll() is None for p in procs):
        time.sleep(0.05)


def terminate(procs, grace_s):
    alive = [p for p in procs if p.poll() is None]
    for p in alive:
        p.terminate()
    deadline = time.monotonic() + grace_s
    for p in alive:
        try:
            p.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()

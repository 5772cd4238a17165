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
import shutil
import sys
import tempfile
import time

from ..errors import UsageError

CPU_ONLY = "BYTEPS_CPU_ONLY"
# =original: the servers keep BytePS 0.2.5's stale scheduling heap (byteps/cpu_only.patch)
SCHEDULE_HEAP = "BYTEPS_SERVER_SCHEDULE_HEAP"
# its values: the patch's heap (the default, also when unset) or 0.2.5's
SCHEDULE_HEAPS = ("patched", "original")
TRACE_ON, TRACE_DIR = "BYTEPS_TRACE_ON", "BYTEPS_TRACE_DIR"
TRACE_START, TRACE_END = "BYTEPS_TRACE_START_STEP", "BYTEPS_TRACE_END_STEP"
# The environment's description, written by byteps/legacy_env.sh beside its Python
DESCRIPTION = "byteps-env.json"


def start(placement, settings: dict[str, str], cpu: bool) -> dict[str, str]:
    """Set the method's BYTEPS_* variables (``settings``; ``BYTEPS_CPU_ONLY=1`` on the CPU)
    and join BytePS; returns the settings the run used (``recorded_settings``)."""
    os.environ.update(settings)
    if cpu:
        os.environ[CPU_ONLY] = "1"
    if settings.get(TRACE_ON) == "1":
        # BytePS writes <dir>/<local rank>/comm.json, and every worker is local rank 0; named
        # for the job, the launcher removes it after a failure (launch.pslaunch.byteps_files)
        job = os.environ.get("BYTEPS_JOB_ID") or str(os.getpid())
        os.environ[TRACE_DIR] = tempfile.mkdtemp(
            prefix=f"ddlbench-byteps-trace-{job}-{placement.rank}-", dir="/tmp")
        os.mkdir(os.path.join(os.environ[TRACE_DIR], "0"))
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


def schedule_heap_problem(environ=None) -> str | None:
    """A BYTEPS_SERVER_SCHEDULE_HEAP that is neither unset nor one of ``SCHEDULE_HEAPS`` (the
    patch reads any other value as the patched heap: a typo would run it and be recorded)."""
    value = (os.environ if environ is None else environ).get(SCHEDULE_HEAP)
    if value and value not in SCHEDULE_HEAPS:
        return (f"{SCHEDULE_HEAP} must be {' or '.join(SCHEDULE_HEAPS)} (unset: patched), "
                f"got {value[:40]!r}")
    return None


def recorded_settings() -> dict[str, str]:
    """The BYTEPS_* and DMLC_* settings worth a line in the run record."""
    return {k: v for k, v in sorted(os.environ.items()) if k in _RECORDED}


_RECORDED = {"BYTEPS_PARTITION_BYTES", CPU_ONLY, "BYTEPS_SERVER_ENABLE_SCHEDULE",
             SCHEDULE_HEAP, "BYTEPS_SCHEDULING_CREDIT", "DMLC_NUM_WORKER",
             "DMLC_NUM_SERVER", TRACE_ON, TRACE_START, TRACE_END,
             # the launcher's settings for a small machine (launch.pslaunch.lane_settings)
             "DDLBENCH_BYTEPS_FAIR", "BYTEPS_SERVER_ENGINE_THREAD", "BYTEPS_OMP_THREAD_PER_GPU",
             "BYTEPS_ZMQ_NTHREADS", "OMP_WAIT_POLICY", "BYTEPS_CPU_COMPRESS_LOOPS"}


# -- BytePS's own trace (--timeline PATH) -----------------------------------------------------

def trace_settings(warmup: int, timed: int, recorded: int) -> dict[str, str]:
    """The BYTEPS_TRACE_* settings that make BytePS trace the recorded steps, warmup + 1 to
    warmup + ``recorded`` (of ``timed``): each gradient's push_pull, from its hand-over to
    BytePS until its callback, and each partition's stages (COPYD2H, PUSH, PULL, COPYH2D on the
    CPU path). BytePS counts a tensor's completed push_pulls and traces from step START to step
    END > START, writing its file when every tensor has completed END; one recorded step is
    traced as two where a second timed step follows (``read_trace`` keeps what falls in the
    recorded iterations). {} where fewer than 2 steps are timed: BytePS cannot trace one."""
    if timed < 2 or recorded < 1:
        return {}
    end = warmup + max(2, min(recorded, timed))
    return {TRACE_ON: "1", TRACE_START: str(warmup + 1), TRACE_END: str(end)}


def read_trace(window: tuple[float, float] | None, timeout_s: float = 30.0) -> list | None:
    """BytePS's trace of this worker (``trace_settings``) in the timeline's event form, on this
    process's ``timeline.now_us`` clock, the spans starting inside ``window`` (the recorded
    iterations' first start and last end; None: all): ``push_pull`` spans (a gradient's
    push_pull, ``tensor`` the name it was given) on the ``push_pull`` row, as the suite's engine names its
    own, and each partition's stages (``copyd2h``, ``push``, ``pull``, ``copyh2d``, ``key``
    BytePS's) on rows ``byteps STAGE``. BytePS writes the file from a thread of its own once the
    last tensor completes the last traced step: waited for up to ``timeout_s``. None where the
    run was not traced or the file never came; the directory is removed."""
    from ..timeline import COMM
    where = os.environ.get(TRACE_DIR)
    if os.environ.get(TRACE_ON) != "1" or not where or not os.path.isdir(where):
        return None
    path = os.path.join(where, "0", "comm.json")
    deadline = time.monotonic() + timeout_s
    trace = None
    while trace is None and time.monotonic() < deadline:
        try:
            with open(path) as f:
                trace = json.load(f)
        except (OSError, ValueError, RecursionError):   # not there yet, or half written
            time.sleep(0.05)
    shutil.rmtree(where, ignore_errors=True)
    if trace is None:
        return None
    # BytePS stamps std::chrono::system_clock microseconds; the timeline perf_counter's
    offset = time.time_ns() / 1000.0 - time.perf_counter_ns() / 1000.0
    events = []
    for e in trace.get("traceEvents", []):
        start = e["ts"] - offset
        if window is not None and not window[0] <= start <= window[1]:
            continue
        # "Comm." and the declared name, which BytePS prefixed with "byteps."
        tensor = e["pid"].removeprefix("Comm.").removeprefix("byteps.")
        if e["tid"] == "total":
            events.append(("push_pull", COMM, "push_pull", start, start + e["dur"],
                           {"tensor": tensor}))
        else:
            stage = e["name"].rsplit(".", 1)[-1]
            events.append((stage.lower(), COMM, f"byteps {stage}", start, start + e["dur"],
                           {"tensor": tensor, "key": int(e["tid"])}))
    return events


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

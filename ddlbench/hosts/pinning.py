"""Which cores a local job's processes run on (docs/DESIGN.md section 8, "Placement").

The suite's local spawner pins each process of a job (workers, then servers) to cores of its
own when they fit the cores this process may use (``os.sched_getaffinity``): each gets
``cores // processes`` consecutive cores, set in the child right after ``fork`` (before it
runs Python, let alone imports torch), and a CPU worker then runs one intra-op thread per core
it got. When the workers fit but not the servers too, the workers are pinned and the servers
run on every core (``workers``: a server sums only under a parameter-server method, so the
all-reduce methods of a job shared with one keep a core per worker). When the workers do not
fit, nothing is pinned and the processes share the cores: the record says ``shared``.
``--no-pin`` or ``DDLBENCH_PIN=0`` turns pinning off (``off``). Every process
of a local job learns the plan in ``DDLBENCH_PLACEMENT`` (JSON) and rank 0 records it with
each worker's cores as the worker itself read them.
"""
from __future__ import annotations

import json
import os

PIN_ENV = "DDLBENCH_PIN"              # 0: do not pin (also --no-pin)
PLACEMENT_ENV = "DDLBENCH_PLACEMENT"  # the local spawner's plan, JSON, for every process
NO_PIN_FLAG = "--no-pin"

PINNED, SHARED, OFF, LAUNCHER = "pinned", "shared", "off", "launcher"
WORKERS = "workers"     # the workers pinned, the servers on every core


def available_cores() -> list[int]:
    """The cores this process may run on, ascending."""
    if hasattr(os, "sched_getaffinity"):
        return sorted(os.sched_getaffinity(0))
    return list(range(os.cpu_count() or 1))  # pragma: no cover - not Linux


def enabled(environ=None) -> bool:
    """False when ``DDLBENCH_PIN`` is 0 (or no, off, false)."""
    environ = os.environ if environ is None else environ
    return environ.get(PIN_ENV, "1").strip().lower() not in ("0", "no", "off", "false")


def split(nprocs: int, cores: list[int]) -> list[list[int]] | None:
    """Each of ``nprocs`` processes' cores: ``len(cores) // nprocs`` consecutive ones each (the
    rest left to the spawner and the system), or None when the processes do not fit."""
    if nprocs <= 0 or nprocs > len(cores):
        return None
    per = len(cores) // nprocs
    return [cores[i * per:(i + 1) * per] for i in range(nprocs)]


def plan(nworkers: int, nservers: int = 0, pin: bool = True,
         cores: list[int] | None = None) -> dict:
    """The placement of a local job of ``nworkers`` workers and ``nservers`` servers (ranks
    after the workers): ``pinning`` (pinned, workers, shared or off), ``reason``,
    ``machine_cores`` (how many this process may use), ``workers``, ``servers`` and, per rank,
    its ``role`` and ``cores`` (pinned: its own; otherwise every core, shared)."""
    cores = available_cores() if cores is None else list(cores)
    nprocs = nworkers + nservers
    chunks = split(nprocs, cores) if pin else None
    workers = split(nworkers, cores) if pin and chunks is None and nservers else None
    if not pin:
        how, reason = OFF, f"pinning turned off ({NO_PIN_FLAG} or {PIN_ENV}=0)"
    elif workers is not None:
        how = WORKERS
        chunks = workers + [cores] * nservers
        reason = (f"{_processes(nworkers, 0)} on {len(cores)} cores: "
                  f"{_plural('core', len(workers[0]))} each; "
                  f"{_plural('server', nservers)} on all of them")
    elif chunks is None:
        how, reason = SHARED, (f"{_processes(nworkers, nservers)} share "
                               f"{_plural('core', len(cores))}")
    else:
        how = PINNED
        reason = (f"{_processes(nworkers, nservers)} on {len(cores)} cores: "
                  f"{_plural('core', len(chunks[0]))} each")
    ranks = [{"rank": r, "role": "worker" if r < nworkers else "server",
              "cores": chunks[r] if chunks else cores} for r in range(nprocs)]
    return {"pinning": how, "reason": reason, "machine_cores": len(cores),
            "workers": nworkers, "servers": nservers, "ranks": ranks}


def _plural(what: str, n: int) -> str:
    return f"{n} {what}{'s' if n != 1 else ''}"


def _processes(nworkers: int, nservers: int) -> str:
    text = _plural("worker", nworkers)
    return f"{text} and {_plural('server', nservers)}" if nservers else text


def pin_to(cores: list[int]):
    """A function for a child between fork and exec: run only on ``cores``."""
    def pin() -> None:
        os.sched_setaffinity(0, cores)
    return pin


def job_plan(environ=None) -> dict | None:
    """The local spawner's plan this process was started under (None: not started by it)."""
    environ = os.environ if environ is None else environ
    raw = environ.get(PLACEMENT_ENV)
    if not raw:
        return None
    try:
        info = json.loads(raw)
    except ValueError:
        return None
    return info if isinstance(info, dict) and isinstance(info.get("ranks"), list) else None


def pinned(rank: int | None = None, environ=None) -> bool:
    """Whether the spawner pinned this process (rank ``rank``, else ``RANK``) to cores of its
    own, and it still runs on exactly those."""
    environ = os.environ if environ is None else environ
    info = job_plan(environ)
    if info is None or info.get("pinning") not in (PINNED, WORKERS):
        return False
    if rank is None:
        try:
            rank = int(environ.get("RANK", ""))
        except ValueError:
            return False
    ranks = info["ranks"]
    if not 0 <= rank < len(ranks):
        return False
    return sorted(ranks[rank].get("cores") or []) == available_cores()


def record(observed: list[dict], launcher: str, environ=None) -> dict:
    """The run record's ``environment.placement``: the spawner's plan (or, under another
    launcher or in one process, what was found), each worker's cores as it read them
    (``observed``: per worker rank, ``host`` and ``cores``), servers as planned."""
    environ = os.environ if environ is None else environ
    # the local spawner's plan, or the BytePS lane's (launch.pslaunch.byteps_pinning)
    info = job_plan(environ) if launcher in ("local", "dmlc") else None
    nworkers = len(observed)
    if info is None:
        if launcher == "single":
            cores = observed[0]["cores"] if observed else available_cores()
            info = {"pinning": PINNED, "reason": f"one process: its {len(cores)} "
                                                 f"core{'s' if len(cores) != 1 else ''}",
                    "machine_cores": len(cores), "workers": 1, "servers": 0, "ranks": []}
        else:
            info = {"pinning": LAUNCHER,
                    "reason": f"placed by the {launcher} launcher, not pinned by the suite",
                    "machine_cores": len(available_cores()), "workers": nworkers,
                    "servers": 0, "ranks": []}
    planned = {r.get("rank"): r for r in info.get("ranks", [])}
    ranks = []
    for rank, seen in enumerate(observed):
        entry = {"rank": rank, "role": "worker", "host": seen.get("host"),
                 "cores": list(seen.get("cores") or [])}
        plan_cores = (planned.get(rank) or {}).get("cores")
        if plan_cores is not None and sorted(plan_cores) != entry["cores"]:
            entry["planned_cores"] = plan_cores
        ranks.append(entry)
    ranks += [dict(r, observed=False) for r in info.get("ranks", [])
              if r.get("role") == "server"]
    return {k: info.get(k) for k in ("pinning", "reason", "machine_cores", "workers",
                                     "servers")} | {"ranks": ranks}

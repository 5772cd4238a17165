"""State files of emulated networks (``/run/ddlbench-netem/ID.json``) and the stale-set cleanup.

Before a run creates anything it writes a state file: the names it will create, its owner's
PID and the owner's start time. Tear-down deletes the file last. A run killed outright
(SIGKILL) leaves its file behind, and the next start (or ``python -m ddlbench.netem cleanup``)
removes every set whose owner is gone, and any namespace of the pattern no file accounts for.
A standing cluster (``cluster up``, standing.py) has no owner once it is up: its file says
``standing`` and only ``cluster down`` or ``cleanup --all`` remove it.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time

from .links import _NS_RE, _remove_namespaces, list_namespaces, namespace_pids


def state_dir() -> str:
    path = os.environ.get("DDLBENCH_NETEM_STATE")
    if path:
        return path
    if os.path.isdir("/run") and os.access("/run", os.W_OK):
        return "/run/ddlbench-netem"
    return os.path.join(os.path.expanduser("~"), ".cache", "ddlbench", "netem")


def _start_time(pid: int) -> str | None:
    """The process's start time in clock ticks since boot: with the PID, it tells a live owner
    from a later process that reused its PID. None for a process that is gone (or a zombie:
    dead, not yet reaped by its parent)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return None if fields[0] in ("Z", "X") else fields[19]
    except (OSError, IndexError):
        return None


def _owner_alive(state: dict) -> bool:
    pid = state.get("owner_pid")
    return isinstance(pid, int) and _start_time(pid) is not None and \
        _start_time(pid) == state.get("owner_start")


def _read_states() -> list[tuple[str, dict]]:
    directory = state_dir()
    out = []
    try:
        names = sorted(os.listdir(directory))
    except OSError:
        return out
    for name in names:
        if not name.endswith(".json"):
            continue
        path = os.path.join(directory, name)
        try:
            with open(path) as f:
                state = json.load(f)
        except (OSError, ValueError, RecursionError):   # RecursionError: nested too deeply
            state = None
        if not isinstance(state, dict) or not isinstance(state.get("namespaces", []), list):
            # Half-written by a run killed at that moment (or not ours): its names follow the
            # pattern, and the orphan sweep below finds them.
            state = {"run_id": name[:-5], "namespaces": []}
        out.append((path, state))
    return out


def write_state(run_id: str, profile: str, namespaces: list[str], **extra) -> str:
    """Write run ``run_id``'s state file (atomically, owned by this process) before anything of
    the run exists; returns its path. ``extra``: more keys (a standing cluster's)."""
    state = {"run_id": run_id, "owner_pid": os.getpid(),
             "owner_start": _start_time(os.getpid()), "created": time.time(),
             "profile": profile, "namespaces": namespaces,
             "command": " ".join(sys.argv), **extra}
    return _write(run_id, state)


def make_standing(run_id: str) -> None:
    """Run ``run_id``'s set outlives its owner (``cluster up``): no owner, ``standing``; only
    ``cluster down`` or ``cleanup --all`` remove it."""
    for path, state in _read_states():
        if path == os.path.join(state_dir(), f"{run_id}.json"):
            state.update(owner_pid=None, owner_start=None, standing=True)
            _write(run_id, state)
            return
    raise FileNotFoundError(f"no state file for run {run_id}")


def _write(run_id: str, state: dict) -> str:
    directory = state_dir()
    os.makedirs(directory, exist_ok=True)
    path = os.path.join(directory, f"{run_id}.json")
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(state, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    return path


def _remove_run(path: str, run_id: str, state: dict) -> None:
    """Remove run ``run_id``'s set: the namespaces its state file names and any others of its
    id (with what runs in them), the folder it names (a standing cluster's, while built), then
    the state file."""
    names = list(state.get("namespaces") or [])
    names += [ns for ns in list_namespaces() if _NS_RE.match(ns)
              and _NS_RE.match(ns).group(1) == run_id and ns not in names]
    _remove_namespaces(names)
    if state.get("directory"):
        shutil.rmtree(state["directory"], ignore_errors=True)
    try:
        os.unlink(path)
    except OSError:
        pass


def cleanup_stale(include_live: bool = False, log=None) -> list[str]:
    """Remove the sets of runs whose owner process is gone (all sets with ``include_live``),
    and namespaces of this package's pattern that no state file accounts for and nothing runs
    in (any with ``include_live``). Returns the run ids removed."""
    removed = []
    known = set()
    for path, state in _read_states():
        run_id = state.get("run_id", os.path.basename(path)[:-5])
        if not include_live and (state.get("standing") or (
                state.get("owner_pid") is not None and _owner_alive(state))):
            known.add(run_id)
            continue
        _remove_run(path, run_id, state)
        removed.append(run_id)
    # Namespaces of the pattern that no state file accounts for (a run writes its state file
    # before it creates anything, so one that started meanwhile has its file by now).
    orphans: dict[str, list[str]] = {}
    for ns in list_namespaces():
        m = _NS_RE.match(ns)
        if m and m.group(1) not in known and not os.path.exists(
                os.path.join(state_dir(), f"{m.group(1)}.json")):
            orphans.setdefault(m.group(1), []).append(ns)
    for run_id, names in orphans.items():
        # Processes still run in it: a live run whose state file is elsewhere (another
        # DDLBENCH_NETEM_STATE); its own owner, or its watcher, removes it.
        if not include_live and any(namespace_pids(ns) for ns in names):
            continue
        _remove_namespaces(names)
        if run_id not in removed:
            removed.append(run_id)
    if removed and log:
        log(f"removed the emulated network(s) of {len(removed)} earlier run(s) that did not "
            f"clean up: {', '.join(removed)}")
    return removed


def start_reaper(run_id: str) -> None:
    """A detached watcher of this process (``python -m ddlbench.netem reap``): when this process
    dies without removing run ``run_id``'s state file (kill -9), the watcher removes the run's
    namespaces and whatever still runs inside them, within a fraction of a second."""
    subprocess.Popen([sys.executable, "-m", "ddlbench.netem", "reap", run_id,
                      "--owner", str(os.getpid())],
                     cwd=os.path.dirname(os.path.dirname(os.path.dirname(
                         os.path.abspath(__file__)))),
                     stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                     stderr=subprocess.DEVNULL, start_new_session=True)


def reap(run_id: str, owner: int, poll_s: float = 0.1) -> bool:
    """Wait while ``owner`` lives and run ``run_id``'s state file exists; if the owner died and
    left the file, remove the run's set. Returns whether it removed anything."""
    path = os.path.join(state_dir(), f"{run_id}.json")
    start = _start_time(owner)
    while os.path.exists(path) and start is not None and _start_time(owner) == start:
        time.sleep(poll_s)
    if not os.path.exists(path):
        return False
    states = [s for p, s in _read_states() if p == path]
    if states and states[0].get("standing"):   # ``cluster up`` made it outlive its owner
        return False
    _remove_run(path, run_id, states[0] if states else {})
    return True

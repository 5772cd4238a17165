"""State files of emulated networks (``/run/ddlbench-netem/ID.json``) and the stale-set cleanup.

Before a run creates anything it writes a state file: the names it will create, its owner's
PID and the owner's start time. Tear-down deletes the file last. A run killed outright
(SIGKILL) leaves its file behind, and the next start (or ``python -m ddlbench.netem cleanup``)
removes every set whose owner is gone, and any namespace of the pattern no file accounts for.
"""
from __future__ import annotations

import json
import os
import sys
import time

from .links import _NS_RE, _remove_namespaces, list_namespaces


def state_dir() -> str:
    path = os.environ.get("DDLBENCH_NETEM_STATE")
    if path:
        return path
    if os.path.isdir("/run") and os.access("/run", os.W_OK):
        return "/run/ddlbench-netem"
    return os.path.join(os.path.expanduser("~"), ".cache", "ddlbench", "netem")


def _start_time(pid: int) -> str | None:
    """The process's start time in clock ticks since boot: with the PID, it tells a live owner
    from a later process that reused its PID."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            stat = f.read()
        return stat.rsplit(")", 1)[1].split()[19]
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
                out.append((path, json.load(f)))
        except (OSError, ValueError):
            # Half-written by a run killed at that moment: its names follow the pattern, and
            # the orphan sweep below finds them.
            out.append((path, {"run_id": name[:-5], "namespaces": []}))
    return out


def write_state(run_id: str, profile: str, namespaces: list[str]) -> str:
    """Write run ``run_id``'s state file (atomically, owned by this process) before anything of
    the run exists; returns its path."""
    directory = state_dir()
    os.makedirs(directory, exist_ok=True)
    path = os.path.join(directory, f"{run_id}.json")
    state = {"run_id": run_id, "owner_pid": os.getpid(),
             "owner_start": _start_time(os.getpid()), "created": time.time(),
             "profile": profile, "namespaces": namespaces,
             "command": " ".join(sys.argv)}
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(state, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    return path


def cleanup_stale(include_live: bool = False, log=None) -> list[str]:
    """Remove the sets of runs whose owner process is gone (all sets with ``include_live``),
    and namespaces of this package's pattern that no state file accounts for. Returns the run
    ids removed."""
    removed = []
    known = set()
    for path, state in _read_states():
        run_id = state.get("run_id", os.path.basename(path)[:-5])
        if state.get("owner_pid") is not None and not include_live and _owner_alive(state):
            known.add(run_id)
            continue
        names = list(state.get("namespaces") or [])
        names += [ns for ns in list_namespaces() if _NS_RE.match(ns)
                  and _NS_RE.match(ns).group(1) == run_id and ns not in names]
        _remove_namespaces(names)
        try:
            os.unlink(path)
        except OSError:
            pass
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
        _remove_namespaces(names)
        if run_id not in removed:
            removed.append(run_id)
    if removed and log:
        log(f"removed the emulated network(s) of {len(removed)} earlier run(s) that did not "
            f"clean up: {', '.join(removed)}")
    return removed

"""The results store: ``results.jsonl``, one JSON line per finished try, append-only.

Lines are of two kinds: ``{"kind": "sweep", ...}`` written each time a sweep starts on this
store (its definition, so reports need nothing else), and ``{"kind": "try", "hash": ...,
"try": i, "attempt": k, "status": ok|failed|timeout, ...}`` written once a try has finished;
a calibrated sweep (``calibrate: true``) adds ``{"kind": "calibration", "job": ...}`` per
calibration job and ``{"kind": "prediction", "hash": ..., "throughput": ...}`` per cell;
with ``pace: true`` also a pace probe's calibration line before each job and a prediction line
per try of its cells (with ``try``, ``attempt`` and ``pace``).
Each line is written with a single ``write`` on a file opened for appending, then flushed and
fsynced before the next run starts; a line cut short (power loss) is skipped when reading and
the next append starts on a fresh line. A try is identified by (cell hash, try index); when a
failed try is run again (``--rerun-failed``) its new line has the next ``attempt`` and the
latest attempt is the one that counts. A lock (``flock``) keeps two sweeps off one store.
"""
from __future__ import annotations

import fcntl
import json
import math
import os

from ..errors import UsageError, parse_json

STORE = "results.jsonl"


def store_path(folder_or_file: str) -> str:
    if os.path.isdir(folder_or_file):
        return os.path.join(folder_or_file, STORE)
    return folder_or_file


def append(path: str, entry: dict) -> None:
    data = (json.dumps(entry, sort_keys=True, separators=(",", ":")) + "\n").encode()
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        size = os.fstat(fd).st_size
        if size:
            with open(path, "rb") as f:
                f.seek(size - 1)
                if f.read(1) != b"\n":
                    data = b"\n" + data  # the previous writer died mid-line
        written = os.write(fd, data)
        while written < len(data):
            written += os.write(fd, data[written:])
        os.fsync(fd)
    finally:
        os.close(fd)


def read(path: str) -> tuple[list[dict], int]:
    """All well-formed lines (legacy lines converted) and how many lines were unreadable."""
    entries, bad = [], 0
    if not os.path.exists(path):
        return entries, 0
    with open(path, errors="replace") as f:
        for line in f:
            line = line.strip()
            if not line:
                continue
            try:
                e = parse_json(line, "a line")   # nested too deeply too: that line alone
            except UsageError:
                bad += 1
                continue
            if not isinstance(e, dict):
                bad += 1
                continue
            if "kind" not in e and "cell" in e:
                try:
                    e = _legacy(e)
                except (TypeError, ValueError, AttributeError, KeyError):
                    bad += 1
                    continue
            if e.get("kind") in ("sweep", "try"):
                if not _well_formed(e):
                    bad += 1
                    continue
                entries.append(e)
            elif e.get("kind") in ("calibration", "prediction"):
                if not _well_formed_model(e):
                    bad += 1
                    continue
                entries.append(e)
    return entries, bad


def _is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_rate(v) -> bool:
    """A throughput the report can aggregate: a finite number >= 0 (JSON's NaN or Infinity, which
    Python's reader takes, would break every mean and interval of its cell)."""
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and v >= 0


def _well_formed(e: dict) -> bool:
    """A line the report can read: a try with its hash, try index and cell configuration (and
    a number as its throughput, if any), or a sweep header with lists where lists belong."""
    if e["kind"] == "sweep":
        networks, tasks, methods = (e.get(k, []) for k in ("networks", "tasks", "methods"))
        return (all(isinstance(x, list) for x in (networks, tasks, methods))
                and all(isinstance(n, dict) and isinstance(n.get("name"), str) for n in networks)
                and all(isinstance(t, dict) and isinstance(t.get("model"), str)
                        and _is_int(t.get("batch_size")) for t in tasks)
                and all(isinstance(m, dict) and isinstance(m.get("method"), str)
                        for m in methods)
                and isinstance(e.get("cells", []), list)
                and isinstance(e.get("engines", []), list))
    throughput = e.get("throughput")
    return (isinstance(e.get("hash"), str) and _is_int(e.get("try"))
            and _is_int(e.get("attempt", 1))
            and (throughput is None or _is_rate(throughput))
            and all(isinstance(e.get(k, ""), str) for k in ("label", "status", "unit"))
            and ("config" not in e or has_cell(e)))


def _well_formed_model(e: dict) -> bool:
    """A calibration job's line (its name and status) or a cell's prediction (its hash, and a
    number as its throughput or a reason why there is none)."""
    if e["kind"] == "calibration":
        return isinstance(e.get("job"), str) and isinstance(e.get("status"), str)
    throughput = e.get("throughput")
    pace = e.get("pace", 1.0)
    return isinstance(e.get("hash"), str) and (
        _is_rate(throughput)
        or (throughput is None and isinstance(e.get("reason"), str))) and (
        # a try's paced prediction (calibrate.pace): its try, attempt and pace
        "try" not in e or (_is_int(e["try"]) and _is_int(e.get("attempt", 1))
                           and isinstance(pace, (int, float)) and not isinstance(pace, bool)))


def has_cell(e: dict) -> bool:
    """A try line with the cell configuration a report needs."""
    cfg = e.get("config")
    if not isinstance(cfg, dict):
        return False
    net, task, method = cfg.get("network"), cfg.get("task"), cfg.get("method")
    return (isinstance(net, dict) and isinstance(net.get("name"), str)
            and isinstance(task, dict) and isinstance(task.get("model"), str)
            and _is_int(task.get("batch_size")) and isinstance(method, dict)
            and isinstance(method.get("method"), str) and _is_int(cfg.get("nworkers"))
            and isinstance(cfg.get("engine", "torch"), str))


def _legacy(e: dict) -> dict:
    """A line of the first benchmarks.py (no hash, network as a string)."""
    from .config import RDMA_LABELS, cell_hash
    net = e.get("network", "local")
    if isinstance(net, str) and net.startswith("rdma") and net[4:].isdigit():
        network = {"name": net, "kind": "rdma", "profile": int(net[4:])}
    else:
        network = {"name": net, "kind": "net", "profile": "loopback"}
    config = {"network": network, "task": e.get("task", {}), "method": e.get("method", {}),
              "engine": "torch", "nworkers": e.get("nworkers")}
    out = dict(e, kind="try", config=config, attempt=1,
               hash=cell_hash(config, version="legacy"))
    out.setdefault("try", 0)
    if isinstance(network["profile"], int):
        out.setdefault("connection", RDMA_LABELS.get(network["profile"]))
    rec = e.get("record")
    if e.get("status") == "ok" and isinstance(rec, dict):
        try:
            out["throughput"] = rec["result"]["throughput"]["mean"]
            out["throughput_std"] = rec["result"]["throughput"].get("std", 0.0)
            out["unit"] = rec["result"].get("unit", "img/sec")
            out["noun"] = ("GPU" if str(rec.get("environment", {}).get("device", ""))
                           .startswith("cuda") else "CPU")
        except (KeyError, TypeError):
            out["status"] = "failed"
            out["reason"] = "no throughput in the record"
    return out


def latest(entries: list[dict]) -> dict[tuple[str, int], dict]:
    """(hash, try) -> the line of its latest attempt."""
    out: dict[tuple[str, int], dict] = {}
    for e in entries:
        if e.get("kind") != "try":
            continue
        key = (e["hash"], int(e["try"]))
        prev = out.get(key)
        if prev is None or int(e.get("attempt", 1)) >= int(prev.get("attempt", 1)):
            out[key] = e
    return out


def headers(entries: list[dict]) -> list[dict]:
    return [e for e in entries if e.get("kind") == "sweep"]


class Lock:
    """An exclusive lock on a store's folder for the life of one sweep."""

    def __init__(self, folder: str):
        self.path = os.path.join(folder, ".lock")
        self.fd = None

    def __enter__(self):
        self.fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(self.fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            try:
                other = os.pread(self.fd, 64, 0).decode(errors="replace").strip()
            finally:
                os.close(self.fd)
                self.fd = None
            raise UsageError(f"another sweep (pid {other or '?'}) is running on "
                             f"{os.path.dirname(self.path)}; wait for it or stop it") from None
        os.ftruncate(self.fd, 0)
        os.pwrite(self.fd, str(os.getpid()).encode(), 0)
        return self

    def __exit__(self, *exc):
        if self.fd is not None:
            fcntl.flock(self.fd, fcntl.LOCK_UN)
            os.close(self.fd)
            self.fd = None

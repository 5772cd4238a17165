"""One try of one cell: its own session and process group, a timeout, and nothing left behind.

The command is the one a user would type: ``python -m ddlbench.train --nworkers N ...`` (the
local launcher; ``--net PROFILE`` for an emulated network) or the shell launcher of the method
(``horovod/horovod_mpi_cj.sh`` and its variants, driven by environment variables) for a real
cluster's ``rdma`` profile. The child starts a new session (``start_new_session``), so the whole
run - launcher, workers, servers, mpirun - is one process group and one session: a timeout
sends SIGTERM to the group (launchers then tear down what they made, e.g. network namespaces),
waits ``kill_grace`` seconds (at most 600; at most 10 when the sweep itself is stopped), then
SIGKILLs whatever is left of the session. The child also gets
SIGTERM if the sweep itself dies (PR_SET_PDEATHSIG), and the sweep writes the running group to
``inflight.json`` so that a restart after kill -9 finishes off any survivor first.
"""
from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import signal
import statistics
import subprocess
import sys
import time

import psutil

from .. import methods
from ..flags import LANE_ENVIRONMENTS
from ..hosts.procs import die_with_parent
from .config import (PROGRAM_ENV, REPO, STOP_GRACE, TRAIN_MODULE, Cell, Sweep,
                     child_environment, format_value, job_args, job_name, lane_python, settings,
                     shell_launcher, trace_path)

LOG_TAIL_LINES = 20
TOTAL_RE = re.compile(r"Total (\w+)/sec on (\d+) \w+\(s\): ([0-9.eE+-]+)")


def command(sweep: Sweep, cell: Cell, record_path: str) -> tuple[list[str], dict]:
    """The command a user would type for this cell, and the environment it adds."""
    return job_command(sweep, [cell], record_path)


def job_command(sweep: Sweep, cells: list[Cell], record_path: str,
                calibration: str | None = None) -> tuple[list[str], dict]:
    """The command of a job of ``cells`` (one; or several that share a job: the local
    launcher with ``--method a,b,...``, '{method}' in ``record_path``; ``calibration``: the
    cells' calibration profile, for a setting that names it, ``job_args``)."""
    cell = cells[0]
    args = job_args(sweep, cells, record_path, calibration)
    local = cell.network.kind == "net"
    lane = LANE_ENVIRONMENTS.get(cell.engine)
    if local and lane is not None and not lane.spawned:
        # Horovod starts under mpirun, BytePS with its scheduler and servers, on this machine
        # too: the shell launcher with this host's slots (Horovod: the loopback only; BytePS's
        # launcher builds an emulated network itself, from --net)
        args = ["--network", cell.network.name, *args, *cell.network.net_args()]
    elif local:
        # (DeepSpeed's lane: the local spawner too, in the lane environment's Python)
        python = sys.executable if lane is None else lane_python(cell.engine)
        program = os.environ.get(PROGRAM_ENV) or TRAIN_MODULE
        cmd = [python, "-m", program, "--nworkers", str(cell.nworkers),
               "--network", cell.network.name, *args, *cell.network.net_args()]
        return cmd, {}
    t, m = cell.task, cell.method
    script = shell_launcher(m["method"])
    env = {"nworkers": str(cell.nworkers), "rdma": "0" if local else str(cell.network.profile),
           "dnn": t["model"], "bs": str(t["batch_size"]), "method": m["method"],
           "hostfile": _abs(sweep.hostfile_for(cell.nworkers, cell.network) if not local
                            else f"configs/cluster{cell.nworkers}")}
    if cell.engine != "torch":
        env["engine"] = cell.engine
    if "sentence_len" in t:
        env["senlen"] = str(t["sentence_len"])
    if "image_size" in t:
        env["image_size"] = str(t["image_size"])
    if "iters" in sweep.timing:
        env["iters"] = str(sweep.timing["iters"])
    # The launchers read a method's settings from variables named after them, and their
    # defaults from the method registry; a method may also need variables that select it.
    for k in settings():
        if k in m:
            env[k] = format_value(m[k])
    env.update(methods.lookup(m["method"]).launcher_vars)
    # Everything else rides in extra_args, which every launcher appends last (so it wins).
    env["extra_args"] = " ".join(shlex.quote(a) for a in args)
    return ["bash", os.path.join(REPO, script)], env


def _abs(path: str) -> str:
    return path if os.path.isabs(path) else os.path.join(REPO, path)


def describe(cmd: list[str], env: dict) -> str:
    return " ".join([*(f"{k}={shlex.quote(v)}" for k, v in env.items()),
                     *(shlex.quote(c) for c in cmd)])


# ------------------------------------------------------------------------ process sessions

def session_members(sid: int, since: float | None = None) -> list[psutil.Process]:
    """Live processes of session ``sid`` (created at or after ``since``, when given)."""
    out = []
    for p in psutil.process_iter(["create_time"]):
        try:
            if os.getsid(p.pid) != sid or p.pid == os.getpid():
                continue
            if since is not None and p.info["create_time"] < since - 1.0:
                continue
            if p.status() == psutil.STATUS_ZOMBIE:
                continue
            out.append(p)
        except (ProcessLookupError, PermissionError, psutil.Error):
            continue
    return out


def kill_session(sid: int, grace_s: float, since: float | None = None,
                 leader: subprocess.Popen | None = None) -> int:
    """SIGTERM the process group and every member of the session, wait up to ``grace_s`` for
    them to go, then SIGKILL the rest. Returns how many processes were signalled."""
    members = session_members(sid, since)
    if not members and (leader is None or leader.poll() is not None):
        return 0
    for sig, wait in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 5.0)):
        try:
            os.killpg(sid, sig)
        except (ProcessLookupError, PermissionError):
            pass
        for p in members:
            try:
                p.send_signal(sig)
            except psutil.Error:
                pass
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline:
            if leader is not None:
                leader.poll()
            if not session_members(sid, since) and (leader is None or
                                                    leader.returncode is not None):
                return len(members)
            time.sleep(0.05)
        members = session_members(sid, since) or members
    if leader is not None:
        try:
            leader.wait(timeout=5)
        except subprocess.TimeoutExpired:
            pass
    return len(members)


class Inflight:
    """``inflight.json`` in the results folder: the run now going, so that a sweep restarted
    after being killed outright can finish it off before anything else."""

    def __init__(self, folder: str):
        self.path = os.path.join(folder, "inflight.json")

    def set(self, info: dict) -> None:
        tmp = self.path + ".tmp"
        with open(tmp, "w") as f:
            json.dump(info, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, self.path)

    def clear(self) -> None:
        try:
            os.unlink(self.path)
        except FileNotFoundError:
            pass

    def reap(self, grace_s: float) -> dict | None:
        """Kill what is left of a run recorded here by a sweep that is gone."""
        try:
            with open(self.path) as f:
                info = json.load(f)
        except (OSError, ValueError, RecursionError):
            self.clear()
            return None
        killed = kill_session(int(info["sid"]), grace_s, since=float(info["started_epoch"]))
        self.clear()
        info["killed"] = killed
        return info


# ------------------------------------------------------------------------------ one try

def run_try(sweep: Sweep, cell: Cell, try_index: int, attempt: int, folder: str,
            logs: str, inflight: Inflight) -> dict:
    """Run one try; return its store entry (status ok, failed or timeout)."""
    return run_cells(sweep, [cell], try_index, attempt, folder, logs, inflight)[0]


def run_cells(sweep: Sweep, cells: list[Cell], try_index: int, attempt: int, folder: str,
              logs: str, inflight: Inflight, calibration: str | None = None) -> list[dict]:
    """Run try ``try_index`` of ``cells`` as one job (one cell; or several that share a job:
    each method timed in turn, each writing its own record); return each cell's store entry
    (status ok, failed or timeout). In a shared job a cell whose record was written is ok even
    if a later method failed the job; the others get the job's status and reason."""
    t0 = time.monotonic()
    suffix = f"_try{try_index}" + (f"_attempt{attempt}" if attempt > 1 else "")
    logfile = os.path.join(logs, f"{job_name(cells)}{suffix}.log")
    records = os.path.join(folder, "records")
    record_paths = [os.path.join(records, f"{c.name}{suffix}.json") for c in cells]
    # a shared job writes its records to a folder of its own, each moved to its cell's path
    job_path = (record_paths[0] if len(cells) == 1 else
                os.path.join(records, f"{job_name(cells)}{suffix}", "{method}.json"))
    os.makedirs(os.path.dirname(job_path), exist_ok=True)
    os.makedirs(logs, exist_ok=True)
    for old in (p for rp in record_paths for p in (rp, trace_path(rp))):
        if os.path.exists(old):
            os.unlink(old)
    cmd, extra_env = job_command(sweep, cells, job_path, calibration)
    shown = describe(cmd, extra_env)
    started = _now()
    res = _run(sweep, cmd, extra_env, logfile, inflight,
               {"cell": job_name(cells), "try": try_index}, timeout=sweep.timeout * len(cells))
    if len(cells) > 1:
        for c, rp in zip(cells, record_paths):
            written = job_path.replace("{method}", c.method["method"])
            for src, dst in ((written, rp), (trace_path(written), trace_path(rp))):
                if os.path.exists(src):
                    os.replace(src, dst)
        shutil.rmtree(os.path.dirname(job_path), ignore_errors=True)
    entries = []
    seconds = res["ended"] - res["launch"]
    for i, (c, rp) in enumerate(zip(cells, record_paths)):
        # (a shared job's cell: its share of the job's time)
        entry = _entry(sweep, c, try_index, attempt, folder, res, rp, logfile,
                       shown, started, round(seconds / len(cells), 3),
                       method=c.method["method"] if len(cells) > 1 else None)
        if len(cells) > 1:
            entry["job"] = {"cells": [x.name for x in cells], "index": i,
                            "seconds": round(seconds, 3),
                            "status": res["status"], "reason": res.get("reason")}
        after = time.monotonic() - res["ended"]
        entry["cpu_steal"] = res["steal"]
        entry["timing"] = {"spawn_s": round(res["spawn_s"], 4), **res["marks"].times,
                           "bookkeeping_s": round(after, 4),
                           "overhead_s": round((res["launch"] - t0) + res["spawn_s"] + after,
                                               4)}
        entries.append(entry)
    return entries


def _entry(sweep: Sweep, cell: Cell, try_index: int, attempt: int, folder: str, res: dict,
           record_path: str, logfile: str, command: str, started: str, seconds: float,
           method: str | None) -> dict:
    """One cell's store entry from its job's outcome ``res`` and its record (``method``: the
    cell's method in a shared job, whose log holds several)."""
    entry = {"kind": "try", "sweep": sweep.name, "hash": cell.hash, "cell": cell.name,
             "try": try_index, "attempt": attempt, "config": cell.config(),
             "label": cell.label, "architecture": cell.architecture, "command": command,
             "log": _rel(logfile), "started": started}
    status, reason = res["status"], res.get("reason")
    if method is not None and os.path.exists(record_path):
        status, reason = "ok", None  # its run ended and wrote its record before the job did
    entry["seconds"] = seconds
    entry["finished"] = _now()
    entry["status"] = status
    if res["leftovers"]:
        entry["leftovers_killed"] = res["leftovers"]
    if sweep.timeline and os.path.exists(trace_path(record_path)):
        entry["trace"] = os.path.relpath(trace_path(record_path), folder)
    log_total = parse_total_line(logfile, method)
    if log_total is not None:
        entry["log_total"] = log_total
    if status == "ok":
        try:
            with open(record_path) as f:
                record = json.load(f)
            entry["record"] = record
            res = record["result"]
            entry["throughput"] = res["throughput"]["mean"]
            entry["throughput_std"] = res["throughput"]["std"]
            entry["unit"] = res["unit"]
            entry["noun"] = _noun(record.get("environment", {}))
        except (OSError, ValueError, KeyError, TypeError, RecursionError) as e:
            if log_total is not None:
                # The original suite's parsing rule: the last 'Total' line of the log.
                entry["throughput"] = log_total["value"]
                entry["unit"] = f"{log_total['unit']}/sec"
                entry["noun"] = log_total["noun"]
                entry["source"] = "log"
            else:
                status = entry["status"] = "failed"
                reason = f"no run record and no 'Total' line in the log ({type(e).__name__})"
    if status != "ok":
        entry["reason"] = reason
        entry["log_tail"] = tail(logfile, LOG_TAIL_LINES)
    # The sweep's own time for this try (``timing``, set by run_cells): preparing and starting
    # the command, then (after the run ended) looking for leftovers, reading the record and
    # the log, building the entry. Appending it to the store comes after (a few ms: one write
    # and an fsync).
    return entry


def _run(sweep: Sweep, cmd: list[str], extra_env: dict, logfile: str, inflight: Inflight,
         info: dict, timeout: float | None = None) -> dict:
    """Run ``cmd`` in a session of its own, its output to ``logfile``, under ``timeout``
    (default: the sweep's; then the whole session is stopped); what happened."""
    timeout = sweep.timeout if timeout is None else timeout
    shown = describe(cmd, extra_env)
    with open(logfile, "w") as out:
        out.write(f"# {shown}\n")
        out.flush()
        started_epoch = time.time()
        cpu = psutil.cpu_times()
        launch = time.monotonic()
        proc = subprocess.Popen(cmd, cwd=REPO, stdout=out, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL,
                                env=dict(child_environment(sweep.env), **extra_env),
                                start_new_session=True, preexec_fn=die_with_parent())
        spawn_s = time.monotonic() - launch
        inflight.set({"sid": proc.pid, "started_epoch": started_epoch, **info,
                      "sweep_pid": os.getpid()})
        marks = _LogWatch(logfile)
        status = reason = None
        try:
            deadline = launch + timeout
            while True:
                try:
                    code = proc.wait(timeout=min(0.1, max(0.0, deadline - time.monotonic())))
                    break
                except subprocess.TimeoutExpired:
                    marks.poll(launch)
                    if time.monotonic() >= deadline:
                        code = None
                        break
            ended = time.monotonic()
            if code is None:
                killed = kill_session(proc.pid, sweep.kill_grace, since=started_epoch,
                                      leader=proc)
                ended = time.monotonic()
                status, reason = "timeout", f"killed after {timeout:g} s"
                out.write(f"\n# benchmarks.py: timeout after {timeout:g} s; stopped the "
                          f"run's process group ({killed} process(es))\n")
                leftovers = 0
            else:
                # The launcher is gone; anything still in its session is an orphan.
                leftovers = kill_session(proc.pid, min(sweep.kill_grace, 5.0),
                                         since=started_epoch)
                status = "ok" if code == 0 else "failed"
                if code != 0:
                    reason = (f"killed by signal {-code}" if code < 0 else f"exit code {code}")
        except BaseException:   # the sweep stopped (SIGTERM, Ctrl-C): its run, briefly
            kill_session(proc.pid, min(sweep.kill_grace, STOP_GRACE), since=started_epoch,
                         leader=proc)
            inflight.clear()
            raise
    inflight.clear()
    marks.poll(launch)
    return {"status": status, "reason": reason, "launch": launch, "ended": ended,
            "leftovers": leftovers, "spawn_s": spawn_s, "marks": marks, "command": shown,
            "steal": steal_share(cpu, psutil.cpu_times())}


def steal_share(before, after) -> float | None:
    """The share of all CPUs' time between two ``psutil.cpu_times()`` that the hypervisor gave
    to other guests (steal: a shared VM's slow minutes; None where the kernel does not say)."""
    if not hasattr(before, "steal"):
        return None
    # guest time is already counted in user and nice
    total = sum(b - a for f, a, b in zip(before._fields, before, after)
                if f not in ("guest", "guest_nice"))
    return round((after.steal - before.steal) / total, 4) if total > 0 else None


def run_command(sweep: Sweep, cmd: list[str], extra_env: dict, logfile: str,
                inflight: Inflight, name: str) -> dict:
    """A command that is not a try (a calibration job), run as a try is: status, reason,
    seconds, the command and log as a store line shows them, and the log's tail on failure."""
    os.makedirs(os.path.dirname(logfile), exist_ok=True)
    res = _run(sweep, cmd, extra_env, logfile, inflight, {"cell": name, "try": 0})
    out = {"status": res["status"], "reason": res["reason"],
           "seconds": round(res["ended"] - res["launch"], 3), "command": res["command"],
           "log": _rel(logfile), "cpu_steal": res["steal"]}
    if res["status"] != "ok":
        out["log_tail"] = tail(logfile, LOG_TAIL_LINES)
    return out


class _LogWatch:
    """Seconds from launch to the first output and to the first timing round (``Iter #0``),
    read from the log while the run goes on."""

    def __init__(self, path: str):
        self.path, self.pos, self.times, self.buf = path, 0, {}, ""

    def poll(self, launch: float) -> None:
        if "first_iter_s" in self.times:
            return
        try:
            with open(self.path, errors="replace") as f:
                f.seek(self.pos)
                chunk = f.read()
                self.pos = f.tell()
        except OSError:
            return
        if not chunk:
            return
        now = round(time.monotonic() - launch, 3)
        self.buf = (self.buf + chunk)[-4096:]
        if "first_output_s" not in self.times and any(
                ln and not ln.startswith("#") for ln in self.buf.splitlines()):
            self.times["first_output_s"] = now
        if "Iter #0" in self.buf:
            self.times["first_iter_s"] = now


def _noun(environment: dict) -> str:
    return "GPU" if str(environment.get("device", "")).startswith("cuda") else "CPU"


def parse_total_line(path: str, method: str | None = None) -> dict | None:
    """The ``Total img/sec on N GPU(s): X +-Y`` lines of a log, as the original's parser read
    them: ``value`` their mean (one line per run, or one per worker machine for a PS method on
    several), ``lines`` how many; with ``method``, of that method's part of a shared job's log
    (from its ``Method: ID (`` header line to the next method's)."""
    found, values = None, []
    inside = method is None
    try:
        with open(path, errors="replace") as f:
            for line in f:
                if method is not None and line.startswith("Method: "):
                    inside = line.startswith(f"Method: {method} (")
                if inside and "Total" in line:
                    m = TOTAL_RE.search(line)
                    if m:
                        noun = "GPU" if "GPU" in line.split(":")[0] else "CPU"
                        values.append(float(m.group(3)))
                        found = {"unit": m.group(1), "workers": int(m.group(2)),
                                 "value": statistics.fmean(values), "lines": len(values),
                                 "noun": noun}
    except OSError:
        return None
    return found


def tail(path: str, n: int) -> list[str]:
    try:
        with open(path, errors="replace") as f:
            return f.read().splitlines()[-n:]
    except OSError:
        return []


def _rel(path: str) -> str:
    rel = os.path.relpath(path, REPO)
    return path if rel.startswith("..") else rel


def _now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S%z")

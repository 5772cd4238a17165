"""Sweeps: method x task x nworkers x network from a YAML file, each run its own process group.

A sweep file (see configs/quick.yaml and configs/paper.yaml)::

    name: quick
    launcher: local            # local (python -m ddlbench.train --nworkers N) or mpi
                               # (horovod/horovod_mpi_cj.sh over configs/cluster$N)
    networks: [local]          # local: labels; mpi: rdma0, rdma1, rdma2
    tasks:
      - {model: resnet18, batch_size: 16, image_size: 32}
      - {model: bert_tiny, batch_size: 8, sentence_len: 32}
    methods: [bspa2a, wfbp, fusion, ddp]     # or {method: fusion, threshold: 1048576}
    nworkers: [1, 2, 4]
    tries: 1
    timing: {warmup: 2, batches_per_iter: 5, iters: 3}
    timeout: 600               # seconds per run; the whole process group is killed after it
    extra_args: ""             # passed through to the training script

Each finished try appends one JSON line to ``results/<name>/results.jsonl`` (the run record
plus the cell); a failed or timed-out try appends its reason and the tail of its log. The report
is a Markdown table in the original suite's format with the 1-worker column taken from this
sweep.
"""
from __future__ import annotations

import json
import os
import shlex
import signal
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass, field

import yaml

from .errors import UsageError
from .record import REPO

KEYS = {"name", "launcher", "networks", "tasks", "methods", "nworkers", "tries", "timing",
        "timeout", "extra_args", "results", "logs"}
TASK_KEYS = {"model", "batch_size", "image_size", "sentence_len"}
METHOD_KEYS = {"method", "threshold", "bucket_cap_mb", "compressor", "density", "label"}
TIMING_KEYS = {"warmup", "batches_per_iter", "iters"}
RDMA_NETWORKS = {"rdma0": "10GbE with TCP/IP", "rdma1": "100GbIB with RDMA",
                 "rdma2": "100GbE with TCP/IP"}
MODEL_NAMES = {"resnet50": "ResNet-50", "bert": "BERT-Large", "bert_base": "BERT-Base",
               "bert_tiny": "BERT-Tiny", "resnet18": "ResNet-18", "vgg16": "VGG-16",
               "densenet121": "DenseNet-121", "mobilenet_v2": "MobileNet-V2",
               "inception_v3": "Inception-V3"}


@dataclass(frozen=True)
class Cell:
    network: str
    task: dict
    method: dict
    nworkers: int

    @property
    def key(self) -> str:
        t = self.task
        m = self.method
        parts = [self.network, f"{t['model']}-bs{t['batch_size']}"]
        if "image_size" in t:
            parts.append(f"px{t['image_size']}")
        if "sentence_len" in t:
            parts.append(f"len{t['sentence_len']}")
        parts.append(method_label(m))
        parts.append(f"n{self.nworkers}")
        return "_".join(str(p) for p in parts)


def method_label(m: dict) -> str:
    if "label" in m:
        return m["label"]
    extras = [f"{k}{m[k]:g}" if isinstance(m[k], (int, float)) else f"{k}-{m[k]}"
              for k in ("threshold", "bucket_cap_mb", "compressor", "density") if k in m]
    return "-".join([m["method"], *extras])


@dataclass
class Sweep:
    name: str
    launcher: str
    networks: list
    tasks: list
    methods: list
    nworkers: list
    tries: int = 1
    timing: dict = field(default_factory=dict)
    timeout: float = 1800.0
    extra_args: str = ""
    results: str = ""
    logs: str = ""

    def cells(self) -> list[Cell]:
        return [Cell(net, task, method, n) for net in self.networks for task in self.tasks
                for method in self.methods for n in self.nworkers]


def resolve_config(name_or_path: str) -> str:
    if os.path.isfile(name_or_path):
        return name_or_path
    candidate = os.path.join(REPO, "configs", f"{name_or_path}.yaml")
    if os.path.isfile(candidate):
        return candidate
    raise UsageError(f"sweep config {name_or_path!r} not found (a path, or a preset name in "
                     f"configs/: {', '.join(presets())})")


def presets() -> list[str]:
    folder = os.path.join(REPO, "configs")
    return sorted(f[:-5] for f in os.listdir(folder) if f.endswith(".yaml"))


def load(path: str) -> Sweep:
    """Parse and check a sweep file; every problem is listed in one UsageError."""
    try:
        with open(path) as f:
            raw = yaml.safe_load(f)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" at line {mark.line + 1}" if mark else ""
        raise UsageError(f"{path}: malformed YAML{where}: "
                         f"{getattr(e, 'problem', None) or e}") from None
    if not isinstance(raw, dict):
        raise UsageError(f"{path}: a sweep file is a YAML mapping (name, tasks, methods, ...)")
    problems = []
    for k in sorted(set(raw) - KEYS):
        problems.append(f"unknown key {k!r}")
    name = str(raw.get("name") or os.path.splitext(os.path.basename(path))[0])
    launcher = raw.get("launcher", "local")
    if launcher not in ("local", "mpi"):
        problems.append(f"launcher must be 'local' or 'mpi', got {launcher!r}")
    networks = _list(raw, "networks", ["local"], problems)
    if launcher == "mpi":
        for n in networks:
            if n not in RDMA_NETWORKS:
                problems.append(f"network {n!r}: with launcher mpi use {', '.join(RDMA_NETWORKS)}")
    tasks = []
    for t in _list(raw, "tasks", None, problems):
        if not isinstance(t, dict) or "model" not in t or "batch_size" not in t:
            problems.append(f"task {t!r} needs model and batch_size")
            continue
        for k in sorted(set(t) - TASK_KEYS):
            problems.append(f"task {t['model']}: unknown key {k!r}")
        for k in ("batch_size", "image_size", "sentence_len"):
            if k in t and not (isinstance(t[k], int) and t[k] > 0):
                problems.append(f"task {t['model']}: {k} must be a positive integer")
        tasks.append(dict(t))
    methods = []
    for m in _list(raw, "methods", None, problems):
        m = {"method": m} if isinstance(m, str) else m
        if not isinstance(m, dict) or "method" not in m:
            problems.append(f"method {m!r} needs a method id")
            continue
        for k in sorted(set(m) - METHOD_KEYS):
            problems.append(f"method {m['method']}: unknown key {k!r}")
        methods.append(dict(m))
    nworkers = _list(raw, "nworkers", [1], problems)
    for n in nworkers:
        if not (isinstance(n, int) and n > 0):
            problems.append(f"nworkers entry {n!r} is not a positive integer")
    tries = raw.get("tries", 1)
    if not (isinstance(tries, int) and tries > 0):
        problems.append(f"tries must be a positive integer, got {tries!r}")
    timing = raw.get("timing", {}) or {}
    if not isinstance(timing, dict):
        problems.append("timing must be a mapping (warmup, batches_per_iter, iters)")
        timing = {}
    for k in sorted(set(timing) - TIMING_KEYS):
        problems.append(f"timing: unknown key {k!r}")
    timeout = raw.get("timeout", 1800)
    if not (isinstance(timeout, (int, float)) and timeout > 0):
        problems.append(f"timeout must be a positive number of seconds, got {timeout!r}")
    problems += _check_names(tasks, methods)
    if launcher == "mpi":
        problems += _check_hostfiles(nworkers)
    if problems:
        raise UsageError(f"{path}: {len(problems)} problem(s): " + "; ".join(problems))
    return Sweep(name, launcher, networks, tasks, methods, nworkers, tries, timing,
                 float(timeout), str(raw.get("extra_args", "") or ""),
                 raw.get("results") or os.path.join(REPO, "results", name),
                 raw.get("logs") or os.path.join(REPO, "logs", name))


def _list(raw, key, default, problems) -> list:
    value = raw.get(key, default)
    if value is None:
        problems.append(f"{key} is required")
        return []
    if not isinstance(value, list) or not value:
        problems.append(f"{key} must be a non-empty list")
        return []
    return value


def _check_names(tasks, methods) -> list[str]:
    import models

    from . import strategies
    problems = []
    known = set(models.names())
    for t in tasks:
        if t["model"] not in known:
            problems.append(f"unknown model {t['model']!r}")
    for m in methods:
        try:
            strategies.lookup(m["method"])
        except UsageError as e:
            problems.append(str(e))
    return problems


def _check_hostfiles(nworkers) -> list[str]:
    from . import hostfile
    problems = []
    for n in nworkers:
        if isinstance(n, int) and n > 0:
            try:
                hostfile.check(os.path.join(REPO, "configs", f"cluster{n}"), n)
            except UsageError as e:
                problems.append(str(e))
    return problems


# ------------------------------------------------------------------------------------ running

def command(sweep: Sweep, cell: Cell, record_path: str) -> tuple[list[str], dict]:
    """The command a user would type for this cell, and its extra environment."""
    t, m = cell.task, cell.method
    timing = sweep.timing
    train = ["--model", t["model"], "--batch-size", str(t["batch_size"])]
    if "image_size" in t:
        train += ["--image-size", str(t["image_size"])]
    if "sentence_len" in t:
        train += ["--sentence-len", str(t["sentence_len"])]
    train += ["--method", m["method"], "--output", record_path]
    for k, flag in (("threshold", "--threshold"), ("bucket_cap_mb", "--bucket-cap-mb"),
                    ("compressor", "--compressor"), ("density", "--density")):
        if k in m:
            train += [flag, str(m[k])]
    for k, flag in (("warmup", "--num-warmup-batches"), ("batches_per_iter",
                    "--num-batches-per-iter"), ("iters", "--num-iters")):
        if k in timing:
            train += [flag, str(timing[k])]
    train += shlex.split(sweep.extra_args)
    if sweep.launcher == "local":
        return ([sys.executable, "-m", "ddlbench.train", "--nworkers", str(cell.nworkers),
                 "--network", cell.network, *train], {})
    env = {"nworkers": str(cell.nworkers), "rdma": cell.network[-1],
           "dnn": t["model"], "bs": str(t["batch_size"]), "method": m["method"],
           "extra_args": " ".join(shlex.quote(a) for a in train[4:] if a)}
    return ["bash", os.path.join(REPO, "horovod", "horovod_mpi_cj.sh")], env


def run_cell(sweep: Sweep, cell: Cell, try_index: int, log=print) -> dict:
    os.makedirs(sweep.logs, exist_ok=True)
    os.makedirs(sweep.results, exist_ok=True)
    logfile = os.path.join(sweep.logs, f"{cell.key}_try{try_index}.log")
    record_path = os.path.join(sweep.results, "records", f"{cell.key}_try{try_index}.json")
    os.makedirs(os.path.dirname(record_path), exist_ok=True)
    if os.path.exists(record_path):
        os.unlink(record_path)
    cmd, extra_env = command(sweep, cell, record_path)
    entry = {"sweep": sweep.name, "cell": cell.key, "try": try_index, "network": cell.network,
             "task": cell.task, "method": cell.method, "nworkers": cell.nworkers,
             "command": " ".join(f"{k}={shlex.quote(v)}" for k, v in extra_env.items())
             + (" " if extra_env else "") + " ".join(shlex.quote(c) for c in cmd),
             "log": os.path.relpath(logfile, REPO)}
    start = time.monotonic()
    with open(logfile, "w") as out:
        out.write(f"# {entry['command']}\n")
        out.flush()
        proc = subprocess.Popen(cmd, cwd=REPO, stdout=out, stderr=subprocess.STDOUT,
                                env=dict(os.environ, **extra_env), start_new_session=True)
        try:
            code = proc.wait(timeout=sweep.timeout)
            status = "ok" if code == 0 else "failed"
            reason = None if code == 0 else f"exit code {code}"
        except subprocess.TimeoutExpired:
            _kill_group(proc)
            status, reason = "timeout", f"killed after {sweep.timeout:g} s"
        except BaseException:
            _kill_group(proc)
            raise
    entry["seconds"] = round(time.monotonic() - start, 3)
    entry["status"] = status
    if status == "ok":
        try:
            with open(record_path) as f:
                entry["record"] = json.load(f)
        except (OSError, ValueError) as e:
            entry["status"], reason = "failed", f"no run record ({e})"
    if entry["status"] != "ok":
        entry["reason"] = reason
        entry["log_tail"] = _tail(logfile, 15)
    return entry


def _kill_group(proc) -> None:
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=5)
            # Children of the group may outlive the leader; sweep the group once more.
            os.killpg(proc.pid, signal.SIGKILL)
            return
        except ProcessLookupError:
            return
        except subprocess.TimeoutExpired:
            continue


def _tail(path: str, n: int) -> list[str]:
    try:
        with open(path, errors="replace") as f:
            return f.read().splitlines()[-n:]
    except OSError:
        return []


def append_result(path: str, entry: dict) -> None:
    """One JSON line per try, appended and flushed to disk before the next run starts."""
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    line = json.dumps(entry, sort_keys=True) + "\n"
    with open(path, "a") as f:
        f.write(line)
        f.flush()
        os.fsync(f.fileno())


def read_results(path: str) -> list[dict]:
    entries = []
    if os.path.exists(path):
        with open(path) as f:
            for line in f:
                line = line.strip()
                if line:
                    try:
                        entries.append(json.loads(line))
                    except ValueError:
                        continue  # a line cut short by a crash: that try is simply not counted
    return entries


# ----------------------------------------------------------------------------------- reporting

def report(entries: list[dict]) -> str:
    """The original suite's Markdown table: one row per (network, task, method), a column per
    worker count, ``mean +- std`` of total throughput over tries; '-' where nothing finished,
    'failed' where every try failed."""
    rows: dict[tuple, dict[int, list]] = {}
    order_n: set[int] = set()
    noun = "GPU"
    for e in entries:
        task = e["task"]
        row = (e["network"], task["model"], task["batch_size"], method_label(e["method"]))
        rows.setdefault(row, {}).setdefault(e["nworkers"], [])
        order_n.add(e["nworkers"])
        if e.get("status") == "ok":
            rec = e["record"]
            rows[row][e["nworkers"]].append(rec["result"]["throughput"]["mean"])
            noun = rec["environment"].get("device_noun") or (
                "GPU" if rec["environment"].get("device", "").startswith("cuda") else "CPU")
    counts = sorted(order_n)
    header = ["DNN", "BS", "CONNECTION", "METHOD"] + [
        f"{n} {noun}{'s' if n > 1 else ''}" for n in counts]
    lines = ["| " + " | ".join(header) + " |",
             "|" + "|".join(" --- " for _ in header) + "|"]
    for (network, model, bs, method), by_n in rows.items():
        cells = [MODEL_NAMES.get(model, model), str(bs), RDMA_NETWORKS.get(network, network),
                 method]
        for n in counts:
            values = by_n.get(n)
            if values is None:
                cells.append("-")
            elif not values:
                cells.append("failed")
            else:
                std = statistics.pstdev(values) if len(values) > 1 else 0.0
                cells.append(f"{statistics.fmean(values):.1f} +- {std:.2f}")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def speedups(entries: list[dict]) -> dict:
    """Speedup S(P) = thr(P)/thr(1) and efficiency S(P)/P per row, from this sweep's own
    1-worker runs (never typed in)."""
    table: dict[tuple, dict[int, list]] = {}
    for e in entries:
        if e.get("status") != "ok":
            continue
        row = (e["network"], e["task"]["model"], e["task"]["batch_size"],
               method_label(e["method"]))
        table.setdefault(row, {}).setdefault(e["nworkers"], []).append(
            e["record"]["result"]["throughput"]["mean"])
    out = {}
    for row, by_n in table.items():
        if 1 not in by_n:
            continue
        base = statistics.fmean(by_n[1])
        out[row] = {n: {"speedup": statistics.fmean(v) / base,
                        "efficiency": statistics.fmean(v) / base / n}
                    for n, v in sorted(by_n.items())}
    return out

"""A sweep's calibration for the performance model (``calibrate: true``): the profiler and
comm_bench run once per task, network and worker count before the cells, and every cell gets
its prediction from them alone (docs/DESIGN.md section 15).

Jobs (networks of the local launcher only: ``local``, ``loopback``, emulated profiles; a real
cluster's ``rdma`` networks are calibrated by hand, with the same two commands under its
launcher):

- ``profile``: ``python -m ddlbench.measure.profiler`` with the task's model and batch on the cell's
  worker count and network (every rank profiling at once, the placement of the run to
  predict, over its ``--net``: one per task, network and worker count). The CPU
  interference is the network's (docs/DESIGN.md section 3: a loopback profile for every
  network put wfbp 14% too slow against BSP in two model-check runs). Where the task has a
  parameter-server cell there, the profile starts that cell's servers (``--nservers``,
  ``--ps-clients``, ``--partition-bytes``) and also times the interference beside their
  push/pull (``interference_ps``, which the PS cells' predictions take);
- ``comm``: ``python -m ddlbench.measure.comm_bench --ops allreduce,allgather`` over the network (its
  ``--net`` profile), messages up to the largest task's gradient; the all-gather only where a
  cell there has a compressor that gathers (its declared ``issues``; the job is then
  named ``..._allgather.comm``): at 1 Gbit/s the all-gathers up to 64 MiB took 12 s;
- ``pushpull``: ``--ops pushpull`` with the servers a parameter-server cell uses, messages up
  to one partition (what comm_bench fits push/pull to: the model pipelines partitions
  itself), then two partitions and the network's largest parameter-server task's gradient,
  all partitions in flight at once: what those cost beyond the model's pipeline is the
  servers' queueing cost (``topology.Measured``; over loopback, where the pushes, pulls and
  sums share the 2 cores, ResNet-18's 12 partitions took 2.2 times the pipeline);
- ``burst``: ``--ops burst --model M`` per task, network and worker count of the all-to-all
  cells: the task's gradient tensors all-reduced one at a time and all at once, from which
  the model's link takes a per-message and a queueing cost (``topology.Measured``); it joins
  only that task's predictions;
- ``codec``: ``python -m ddlbench.measure.codec_bench`` for each compressor (and its settings)
  a task's cells use, at their worker count and the sweep's threads: its encode and decode time per
  element, which the model adds to the method's compute (without it a compressor's codec was
  free: PowerSGD's cells came out 25-76% too fast).

comm_bench times each size, and each burst, by its mean (``--stat mean``), not the median it
prints by default:
the model predicts a mean iteration, and on 2 workers pinned to a core each a small
all-reduce takes 0.3 ms most times and 4 ms (a scheduler turn) some, so its mean was twice
its median (BERT-Tiny's sizes: 1.6 ms against 0.7).

With ``pace: true`` (``pace``), a probe also runs before each job of tries: the profiler,
briefly (``PACE_ITERS``: compute alone, a few iterations), at the job's task and worker count.
Its compute over the calibration profile's is the machine's pace then (a shared 2-core VM ran
up to 40% faster 50 minutes into a sweep than when it was calibrated), and each of the job's
cells gets a second prediction for that try, from the same files with every compute, codec
and host time scaled by the pace (the network's fits are not: they are links, measured once).
The reports show both (README "paced", results.csv ``pace``, ``paced_predicted``).

With ``calibration_check`` (on with calibrate, tolerance 0.2; ``check``), after the tries each
profile and comm job this session ran is timed again briefly at its placement: the profile's
compute alone (a pace probe), the comm job's all-reduce at 1-16 MiB. A probe further than the
tolerance from the calibration, either way, is marked off in the README and on stderr, its job
runs once more and the cells that read it are predicted again (``recalibrate``): one
calibration on this VM was taken in a slow minute (a loopback all-reduce 2-5 times its usual
time, every prediction 15% too slow) and nothing said so. Every job's and try's store line
also carries ``cpu_steal``, the share of all CPUs' time the hypervisor gave other guests
meanwhile (/proc/stat), which the README sums up beside the probes.

Each job runs like a try (its own session, the sweep's timeout, a log in the logs folder) and
leaves ``calibration/<job>.json`` in the results folder and one ``kind: calibration`` line in
the store; a job already done is not run again. Then, before any try, each cell's prediction
(``ddlbench/sweep/predicted.py`` with these files as its profile and network) is one
``kind: prediction`` line: the predictions never see a timed run. The reports put them beside
the measured throughput (README, results.csv, ``plots/predicted_vs_measured.png``).
"""
from __future__ import annotations

import math
import os
import sys
from dataclasses import dataclass, replace

import compression

from ..planning import DEFAULT_PARTITION_BYTES, PS_CLIENTS, default_nservers
from . import store
from .config import task_key

CALIBRATION = "calibration"
COMM_ITERS = ("--warmup", "2", "--iters", "10", "--stat", "mean")
# 8 passes each alone and beside all-reduces for the interference (the default 4 scattered
# widely from one run to the next: docs/DESIGN.md section 3)
PROFILE_ITERS = ("--warmup", "3", "--iters", "10", "--comm-iters", "3",
                 "--interference-iters", "8")
# A pace probe: the compute alone, briefly (no all-reduce fit, no interference timing)
PACE_ITERS = ("--warmup", "2", "--iters", "4", "--no-interference", "--alpha", "0",
              "--beta", "0")
PROFILER = "ddlbench.measure.profiler"      # the module profiles and pace probes run (tests swap it)
COMM_BENCH = "ddlbench.measure.comm_bench"  # the module the comm, push/pull and burst jobs run (too)
CODEC_ITERS = "3"
# The calibration check's all-reduce sizes (powers of two, bytes): from where a loopback
# all-reduce stops being a scheduler turn (~2 ms) to where an emulated link takes ~0.15 s
CHECK_BYTES = (1 << 20, 16 << 20)


@dataclass(frozen=True)
class Job:
    kind: str                 # profile, comm, pushpull, burst, codec or pace
    network: object           # config.Network
    nworkers: int
    task: dict | None = None
    nservers: int | None = None
    ps_clients: str | None = None
    max_bytes: int | None = None
    threads: int | None = None   # the sweep's threads: (profiles: compute as the runs do)
    partition_bytes: int | None = None   # pushpull: the cells' (None: the default)
    compressor: str | None = None        # codec: the compressor and its settings
    codec_options: tuple = ()            # ((name, value), ...)
    tag: str | None = None               # pace: the job and try it runs before
    of: "Job | None" = None              # check: the profile or comm job it times again
    gather: bool = False                 # comm: the all-gather too (a compressor gathers)
    task_name: str | None = None         # the task in file names (the sweep's task_name)

    @property
    def _networked(self) -> bool:
        """Whether the job's workers talk over its network."""
        if self.kind == "check":
            return self.of._networked
        return self.kind != "codec" and (self.nworkers > 1 or self.kind not in ("profile",
                                                                                "pace"))

    @property
    def name(self) -> str:
        # A profile is of the compute and its CPU interference with the communication under
        # the run's placement and network: one per task, network and workers (one worker
        # sends nothing: one per task).
        if self.kind == "pace":     # a probe of the compute before one job of tries
            return f"{self.tag}.pace"
        if self.kind == "check":    # a probe of a profile's or comm job's after the tries
            return f"{self.of.name}.check"
        parts = [self.network.name] if self._networked else []
        if self.task is not None:
            parts.append(self.task_name or task_key(self.task))
        parts.append(f"n{self.nworkers}")
        if self.kind == "comm" and self.gather:
            parts.append("allgather")
        if self.kind == "codec":
            parts.append("-".join([self.compressor] + [f"{k}{v}"
                                                       for k, v in self.codec_options]))
        if self.kind in ("profile", "codec") and self.threads is not None:
            parts.append(f"t{self.threads}")
        if self.kind == "pushpull":
            parts.append(f"k{self.nservers or 'default'}-{self.ps_clients}")
            if self.partition_bytes is not None:
                parts.append(f"p{self.partition_bytes}")
        return "_".join(parts) + f".{self.kind}"

    def path(self, folder: str) -> str:
        return os.path.join(folder, CALIBRATION, f"{self.name}.json")

    def command(self, output: str) -> list[str]:
        if self.kind == "check" and self.of.kind == "profile":   # the compute, as pace does
            return replace(self.of, kind="pace").command(output)
        if self.kind == "check":    # the all-reduce at CHECK_BYTES (sizes the fit has)
            top = self.of.max_bytes or CHECK_BYTES[1]
            cmd = replace(self.of, max_bytes=min(CHECK_BYTES[1], top)).command(output)
            cmd[cmd.index("--ops") + 1] = "allreduce"
            return cmd + ["--min-bytes", str(min(CHECK_BYTES[0], top))]
        net = self.network
        place = ["--nworkers", str(self.nworkers)]
        if self.kind == "codec":
            cmd = [sys.executable, "-m", "ddlbench.measure.codec_bench",
                   "--model", self.task["model"], "--compressor", self.compressor, *place,
                   "--iters", CODEC_ITERS, "--threads", str(self.threads or 1)]
            for k, v in self.codec_options:
                cmd += [f"--{k.replace('_', '-')}", str(v)]
            return cmd + ["--output", output]
        if self.kind in ("profile", "pace"):
            t = self.task
            cmd = [sys.executable, "-m", PROFILER, "--model", t["model"],
                   "--batch-size", str(t["batch_size"]),
                   *(PACE_ITERS if self.kind == "pace" else PROFILE_ITERS), *place]
            if self.threads is not None:
                cmd += ["--threads", str(self.threads)]
            cmd += _shape_flags(t)
            if t.get("args"):
                import shlex
                cmd += shlex.split(t["args"])
            if self._networked:
                cmd += net.net_args()
            if self.kind == "profile" and self.ps_clients is not None:
                # the task has parameter-server cells: the interference beside their push/pull
                cmd += ["--nservers", str(self.nservers), "--ps-clients", self.ps_clients]
                if self.partition_bytes is not None:
                    cmd += ["--partition-bytes", str(self.partition_bytes)]
            return cmd + ["--network", net.name, "--output", output]
        cmd = [sys.executable, "-m", COMM_BENCH, *place,
               *COMM_ITERS,
               "--network", net.name, "--output", output, *net.net_args()]
        if self.kind == "burst":
            return cmd + ["--ops", "burst", "--model", self.task["model"],
                          *_shape_flags(self.task)]
        if self.kind == "comm":
            cmd += ["--ops", "allreduce,allgather" if self.gather else "allreduce"]
            if self.max_bytes:
                cmd += ["--max-bytes", str(self.max_bytes)]
            return cmd
        cmd += ["--ops", "pushpull", "--ps-clients", self.ps_clients or PS_CLIENTS[0]]
        if self.nservers:
            cmd += ["--nservers", str(self.nservers)]
        part = self.partition_bytes or DEFAULT_PARTITION_BYTES
        if self.partition_bytes is not None:
            cmd += ["--partition-bytes", str(part)]
        # powers of two up to one partition, and the partition itself (what the fit takes);
        # then two partitions and the largest task's gradient, all their partitions in flight
        # at once (what the model's pipeline of partitions costs beyond the fit)
        sizes = [part] + [m for m in (2 * part, self.max_bytes or 0) if m > part]
        return cmd + ["--max-bytes", str(1 << (part.bit_length() - 1)),
                      "--sizes", ",".join(map(str, sorted(set(sizes))))]


def _shape_flags(task: dict) -> list[str]:
    """The task's input shape as the profiler's and comm_bench's flags."""
    return [arg for key, flag in (("image_size", "--image-size"),
                                  ("sentence_len", "--sentence-len"),
                                  ("num_classes", "--num-classes")) if key in task
            for arg in (flag, str(task[key]))]


def _gradient_bytes(model: str) -> int:
    """An upper bound of a model's gradient bytes without building it: the sizes the suite
    knows, else 256 MiB (comm_bench's default range)."""
    known = {"resnet18": 46_800_000, "resnet50": 102_300_000, "bert_tiny": 17_700_000,
             "bert_base": 440_000_000, "bert": 1_341_000_000, "vgg16": 553_500_000,
             "mobilenet_v2": 14_000_000, "squeezenet1_1": 5_000_000}
    return known.get(model, 256 << 20)


def _largest_gradient(cells: list) -> dict[str, int]:
    """Per network, the largest gradient bytes (``_gradient_bytes``) of ``cells``' tasks."""
    largest: dict[str, int] = {}
    for c in cells:
        largest[c.network.name] = max(largest.get(c.network.name, 0),
                                      _gradient_bytes(c.task["model"]))
    return largest


def basis(cell):
    """The cell whose calibration ``cell``'s prediction reads: itself, or with the sweep's
    ``extrapolate`` (and more than one worker) the same cell at the sweep's smallest worker
    count above one (whether that cell is run or skipped)."""
    sweep = cell.sweep
    if not sweep.extrapolate or cell.nworkers < 2:
        return cell
    base = min((n for n in sweep.nworkers if n > 1), default=cell.nworkers)
    return cell if base == cell.nworkers else replace(cell, nworkers=base)


def jobs(cells: list) -> tuple[list[Job], list[str]]:
    """The calibration jobs ``cells`` need (their ``basis`` cells'), in order (profiles
    first), and notes."""
    out, notes, seen = [], [], set()
    cells = [basis(c) for c in cells]
    rdma = sorted({c.network.name for c in cells if c.network.kind != "net"})
    if rdma:
        notes.append(f"calibrate: network(s) {', '.join(rdma)} are a real cluster's: calibrate "
                     f"them by hand (python -m ddlbench.measure.profiler and comm_bench under the "
                     f"launcher) and name the files under predict:")
    local = [c for c in cells if c.network.kind == "net" and c.engine == "torch"]

    def add(job):
        if job.name not in seen:
            seen.add(job.name)
            out.append(job)
    # one profile per name: the first cell's, with servers where any of its cells has them
    # (the first such cell's: its interference beside push/pulls, ``interference_ps``)
    profiles: dict = {}
    for c in local:
        job = profile_job(c)
        if job.name not in profiles or (job.ps_clients and not profiles[job.name].ps_clients):
            profiles[job.name] = job
    for job in profiles.values():
        add(job)
    for c in local:
        job = codec_job(c)
        if job is not None:
            add(job)
    largest = _largest_gradient(local)
    gathers = {(c.network.name, c.nworkers) for c in local
               if compression.ALLGATHER
               in compression.lookup(c.method.get("compressor", "none")).issues}
    for c in local:
        if c.nworkers > 1:
            top = 1 << max(12, (largest[c.network.name] - 1).bit_length())
            add(Job("comm", c.network, c.nworkers, max_bytes=top,
                    gather=(c.network.name, c.nworkers) in gathers))
    for c in local:
        if c.nworkers > 1 and c.architecture != "ps":
            add(burst_job(c))
    gradient = _largest_gradient([c for c in local if c.architecture == "ps"])
    for c in local:
        if c.architecture == "ps" and not c.one_machine:   # (on one machine: no server)
            add(Job("pushpull", c.network, c.nworkers, nservers=c.method.get("nservers"),
                    ps_clients=c.method.get("ps_clients", PS_CLIENTS[0]),
                    partition_bytes=c.method.get("partition_bytes"),
                    max_bytes=gradient[c.network.name]))
    return out, notes


def profile_job(cell) -> Job:
    """The profile of the cell's task on its network and worker count (the sweep's threads);
    a parameter-server cell's with its servers (their count as the training script takes it
    on one machine), clients and partition: the profiler also times the interference beside
    their push/pull. Either is the same job by name (``jobs`` runs the one with servers). A
    parameter-server cell on one machine runs no server (docs/DESIGN.md section 6): its
    profile has none either."""
    if cell.architecture != "ps" or cell.nworkers < 2 or cell.one_machine:
        return Job("profile", cell.network, cell.nworkers, task=cell.task,
                   task_name=cell.sweep.task_name(cell.task), threads=cell.sweep.threads)
    m = cell.method
    return Job("profile", cell.network, cell.nworkers, task=cell.task,
               task_name=cell.sweep.task_name(cell.task), threads=cell.sweep.threads,
               nservers=m.get("nservers") or default_nservers(cell.nworkers),
               ps_clients=m.get("ps_clients", PS_CLIENTS[0]),
               partition_bytes=m.get("partition_bytes"))


def profile_file(cell, folder: str | None) -> str:
    """The calibration profile of ``cell`` (its task, network and worker count) in the
    results ``folder`` (None: a placeholder naming it, as a dry run shows it): what a setting
    ``mgwfbp_profile: calibration`` hands the run (``config.job_args``)."""
    job = profile_job(cell)
    return job.path(folder) if folder else f"<calibration>/{job.name}.json"


def burst_job(cell) -> Job:
    """The burst of the cell's model on its network and worker count."""
    return Job("burst", cell.network, cell.nworkers, task=cell.task,
               task_name=cell.sweep.task_name(cell.task))


def codec_job(cell) -> Job | None:
    """The codec timing a cell's prediction needs (None: no compressor)."""
    compressor = cell.method.get("compressor", "none")
    if compressor == "none":
        return None
    # what its codec's time depends on: the compressor's own options, as the cell sets them;
    # timed as its declared codec class (its own id unless it declares another's)
    declared = compression.lookup(compressor)
    return Job("codec", cell.network, cell.nworkers, task=cell.task,
               task_name=cell.sweep.task_name(cell.task), threads=cell.sweep.threads,
               compressor=declared.codec_class or compressor, codec_options=tuple(
                   (s.name, cell.method[s.name]) for s in declared.Options.specs()
                   if s.name in cell.method))


def done(entries: list[dict], folder: str) -> set[str]:
    """Jobs with a finished line and their file still there."""
    return {e["job"] for e in entries if e.get("kind") == "calibration"
            and e.get("status") == "ok"
            and os.path.exists(os.path.join(folder, CALIBRATION, f"{e['job']}.json"))}


def run(sweep, cells: list, folder: str, logs: str, inflight, mode: str = "none",
        ran: list | None = None) -> dict:
    """Run the jobs not done yet; each one store line. Returns {status: count}; those that
    ran and finished are appended to ``ran``."""
    path = store.store_path(folder)
    todo, notes = jobs(cells)
    for note in notes:
        if mode != "none":
            print(f"benchmarks.py: {note}", file=sys.stderr)
    finished = done(store.read(path)[0], folder)
    counts = {"ok": 0, "failed": 0, "timeout": 0, "skipped": 0}
    for job in todo:
        if job.name in finished:
            counts["skipped"] += 1
            continue
        entry = _run(sweep, job, folder, logs, inflight, mode)
        store.append(path, entry)
        counts[entry["status"]] = counts.get(entry["status"], 0) + 1
        if ran is not None and entry["status"] == "ok":
            ran.append(job)
    return counts


def _run(sweep, job: Job, folder: str, logs: str, inflight, mode: str) -> dict:
    """Run one job as a try is run; its store line."""
    from .runner import run_command
    os.makedirs(os.path.join(folder, CALIBRATION), exist_ok=True)
    out = job.path(folder)
    if os.path.exists(out):
        os.unlink(out)
    if mode != "none":
        print(f"calibrate: {job.name}", file=sys.stderr, flush=True)
    res = run_command(sweep, job.command(out), {}, os.path.join(logs, f"{job.name}.log"),
                      inflight, job.name)
    status = res["status"]
    if status == "ok" and not os.path.exists(out):
        status, res["reason"] = "failed", "no output file"
    entry = {"kind": "calibration", "job": job.name, "status": status,
             "file": os.path.relpath(out, folder), "seconds": res["seconds"],
             "command": res["command"], "log": res["log"], "cpu_steal": res["cpu_steal"]}
    if status != "ok":
        entry["reason"] = res.get("reason")
        entry["log_tail"] = res.get("log_tail")
    return entry


def pace_job(job_cells: list, try_index: int, attempt: int = 1) -> Job:
    """The pace probe before try ``try_index`` (its ``attempt``) of the job of ``job_cells``
    (named as the job's log is)."""
    from .config import job_name
    cell = job_cells[0]
    return Job("pace", cell.network, cell.nworkers, task=cell.task,
               task_name=cell.sweep.task_name(cell.task), threads=cell.sweep.threads,
               tag=f"{job_name(job_cells)}_try{try_index}"
               + (f"_attempt{attempt}" if attempt > 1 else ""))


def compute_s(path: str) -> float:
    """A profile's compute per iteration (forward, backward and optimizer step), seconds."""
    from ..measure.profile_file import read_profile
    prof = read_profile(path)
    return float(prof["forward_s"]) + sum(float(x) for x in prof["backward_s"]) + \
        float(prof.get("optimizer_s") or 0.0)


def pace(sweep, cells: list, job_cells: list, try_index: int, attempt: int, folder: str,
         logs: str, inflight, mode: str = "none") -> list[dict]:
    """A sweep's pace probe (``pace: true``) before one job: the profiler, briefly, at the
    job's placement (``PACE_ITERS``); the machine's pace is its compute over the calibration
    profile's, and each of the job's cells gets a prediction for this try from the same files
    with every compute time scaled by it. Returns the store lines: the probe's, then one
    ``kind: prediction`` line per cell with its ``try``, ``attempt`` and ``pace`` (none when
    the probe failed; the cell keeps its prediction from before the tries)."""
    from ..errors import UsageError, first_line
    local = [c for c in job_cells if c.network.kind == "net" and c.engine == "torch"]
    if not local:
        return []
    finished = done(store.read(store.store_path(folder))[0], folder)
    first = local[0]
    prof = profile_job(first)
    if prof.name not in finished:
        return []
    job = pace_job(job_cells, try_index, attempt)
    entry = _run(sweep, job, folder, logs, inflight, mode)
    lines = [entry]
    if entry["status"] != "ok":
        return lines
    try:
        factor = compute_s(job.path(folder)) / compute_s(prof.path(folder))
    except (UsageError, ValueError, TypeError, KeyError, ZeroDivisionError) as err:
        entry.update(status="failed", reason=f"unreadable probe: {first_line(err)}")
        return lines
    entry["pace"] = factor
    by_net = _network_files(cells, finished, folder)
    for c in local:
        line = _prediction(sweep, c, folder, finished, by_net, factor)
        line.update({"try": try_index, "attempt": attempt, "pace": factor})
        lines.append(line)
    return lines


def link_s(path: str) -> dict[int, float]:
    """A comm_bench file's all-reduce: size in bytes -> its time, seconds."""
    from ..errors import UsageError, read_json
    body = read_json(path, f"comm_bench file {path}")
    try:
        out = {int(r["size_bytes"]): float(r["time_s"]) for res in body.get("results", [])
               if res.get("op") == "allreduce" for r in res.get("rows", [])}
    except (AttributeError, KeyError, TypeError, ValueError, OverflowError):
        out = {}     # not a comm_bench record's form
    if not out or not all(math.isfinite(t) and t > 0 for t in out.values()):
        raise UsageError(f"{path}: no all-reduce times (each > 0)")
    return out


def check(sweep, ran: list, folder: str, logs: str, inflight,
          mode: str = "none") -> list[dict]:
    """The calibration check (``calibration_check``), after the tries: each profile and comm
    job that ran in this session (``ran``) timed again briefly, at the same placement and
    network: a profile's compute alone (as a pace probe), a comm job's all-reduce at its
    power-of-two sizes within ``CHECK_BYTES``. A probe's ``ratio`` is its time over the
    calibration's (the sum over the sizes both have); ``off`` when it is further than the
    tolerance either way (a calibration taken in a slow or a fast minute: its cells'
    predictions share it).
    Returns the probes' store lines (a failed probe says why, and checks nothing)."""
    from ..errors import UsageError, first_line
    tol = sweep.calibration_check
    lines = []
    for job in ran if tol else []:
        if job.kind not in ("profile", "comm"):
            continue
        probe = Job("check", job.network, job.nworkers, of=job)
        entry = _run(sweep, probe, folder, logs, inflight, mode)
        entry["checks"] = job.name
        lines.append(entry)
        if entry["status"] != "ok":
            continue
        try:
            if job.kind == "profile":
                was, now = compute_s(job.path(folder)), compute_s(probe.path(folder))
            else:
                before, after = link_s(job.path(folder)), link_s(probe.path(folder))
                both = sorted(set(before) & set(after))
                if not both:
                    raise UsageError("no all-reduce size in both files")
                was, now = sum(before[m] for m in both), sum(after[m] for m in both)
                entry["sizes"] = both
            ratio = now / was
        except (OSError, UsageError, ValueError, TypeError, KeyError,
                ZeroDivisionError) as err:
            entry.update(status="failed", reason=f"unreadable probe: {first_line(err)}")
            continue
        entry.update(calibrated_s=was, now_s=now, ratio=ratio,
                     off=not 1 / (1 + tol) <= ratio <= 1 + tol)
    return lines


def recalibrate(sweep, cells: list, probes: list[dict], folder: str, logs: str, inflight,
                mode: str = "none") -> list[dict]:
    """Each job whose probe was off (``check``) run once more, now, and the cells that read it
    predicted again (``recalibrated``: those jobs; the latest prediction is the one reported).
    The calibration it replaces is kept beside it (``<job>.before-check.json``) and put back
    if the new run fails: its cells keep their predictions. Appends the store lines (each
    job's, then the predictions) and returns them."""
    off = {p["checks"] for p in probes if p.get("off")}
    path = store.store_path(folder)
    lines, again = [], []
    for job in (j for j in jobs(cells)[0] if j.name in off):
        out = job.path(folder)
        kept = out[:-len(".json")] + ".before-check.json"
        os.replace(out, kept)
        entry = dict(_run(sweep, job, folder, logs, inflight, mode), recalibrated=True)
        if entry["status"] == "ok":
            again.append(job)
        else:
            os.replace(kept, out)
        store.append(path, entry)
        lines.append(entry)
    names = [j.name for j in again]
    for line in predictions(sweep, [c for c in cells if uses(c, again)], folder) if again \
            else []:
        line["recalibrated"] = names
        store.append(path, line)
        lines.append(line)
    return lines


def _network_files(cells: list, finished: set, folder: str) -> dict:
    """network name -> its finished comm and push/pull files."""
    by_net: dict = {}
    for job in jobs(cells)[0]:
        if job.kind in ("comm", "pushpull") and job.name in finished:
            by_net.setdefault(job.network.name, []).append(job.path(folder))
    return by_net


def predictions(sweep, cells: list, folder: str) -> list[dict]:
    """Each local cell's prediction from the calibration files alone (one store line each;
    a cell whose files are missing gets a line saying which)."""
    finished = done(store.read(store.store_path(folder))[0], folder)
    by_net = _network_files(cells, finished, folder)
    return [_prediction(sweep, c, folder, finished, by_net) for c in cells
            if c.network.kind == "net" and c.engine == "torch"]


def uses(cell, ran: list) -> bool:
    """Whether a cell's prediction reads any of the calibration jobs ``ran``: its profile,
    codec and burst, or its network's comm and push/pull files (``_network_files``)."""
    cell = basis(cell)
    own = {j.name for j in (profile_job(cell), codec_job(cell), burst_job(cell))
           if j is not None}
    return any(j.name in own or (j.kind in ("comm", "pushpull")
                                 and j.network.name == cell.network.name) for j in ran)


def _prediction(sweep, c, folder: str, finished: set, by_net: dict, pace: float = 1.0) -> dict:
    """One cell's prediction line (``pace``: its compute this many times the profile's)."""
    from ..errors import UsageError, first_line
    from .predicted import Predictor
    b = basis(c)
    prof = profile_job(b)
    codec = codec_job(b)
    burst = burst_job(b)
    files = by_net.get(c.network.name, []) + (
        [burst.path(folder)] if burst.name in finished else [])
    line = {"kind": "prediction", "hash": c.hash, "cell": c.name}
    missing = [j.name for j in (prof, codec) if j is not None and j.name not in finished]
    if missing:
        line["reason"] = f"calibration job {missing[0]} did not finish"
        return line
    p = Predictor(sweep, profile=prof.path(folder), network=",".join(files) or None,
                  codec=codec.path(folder) if codec is not None else None, pace=pace,
                  calibrated_at=b.nworkers)
    try:
        e = p.predict(c)
    except UsageError as err:
        line["reason"] = str(err)
    except Exception as err:  # noqa: BLE001 - a prediction never takes the sweep down
        line["reason"] = f"the model failed: {type(err).__name__}: {first_line(err)}"
    else:
        line.update(throughput=e["throughput"], predicted=e["predicted"],
                    metrics=e["record"]["timeline"]["mean"])
    return line

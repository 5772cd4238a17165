"""Running a sweep: which folder, which tries are left and in what order, the progress
display, the loop.

Tries run round-robin over the cells: try 0 of every cell, then try 1, ...; within a round the
cells run in an order shuffled by the sweep's seed (each cell's place is the SHA-256 of seed,
round and cell hash), so slow drift and background load fall on every method alike. The seed
is the sweep file's ``seed``, else the one recorded in the store's header, else one chosen
from the store folder's name when it starts (so ``--dry-run`` shows the very order), and each
header records it. The store is the truth: a restarted sweep runs the tries it does not hold,
in the same order. With ``shared_jobs`` the methods of one task, network and worker count run
a round's tries as one job, in that order (``jobs``); with ``adaptive``, rounds of one more
try follow for the cells whose interval is still too wide (``extra_round``).
"""
from __future__ import annotations

import hashlib
import os
import re
import signal
import socket
import statistics
import sys
import time
from dataclasses import dataclass

from ..errors import UsageError, say
from . import aggregate, calibrate, runner, store
from .config import PROGRAM_ENV, Cell, Sweep, suite_version, task_key


@dataclass
class Planned:
    cell: Cell
    try_index: int
    attempt: int


@dataclass
class Plan:
    folder: str
    logs: str
    resumed: bool
    cells: list            # the cells selected (after --only)
    todo: list             # Planned tries to run now
    skipped: int           # tries already finished in the store
    entries: list          # the store's lines as read
    rerun_failed: bool = False
    seed: int = 0          # the order of each round (order_seed)
    seed_source: str = ""  # where the seed came from, in words


_DIR_RE = r"^(\d{4}-\d{2}-\d{2})(?:\.(\d+))?-%s$"


def _dated_folders(root: str, name: str) -> list[str]:
    if not os.path.isdir(root):
        return []
    pat = re.compile(_DIR_RE % re.escape(name))
    found = []
    for d in os.listdir(root):
        m = pat.match(d)
        if m and os.path.isfile(os.path.join(root, d, store.STORE)):
            found.append(((m.group(1), int(m.group(2) or 1)), os.path.join(root, d)))
    return [f for _, f in sorted(found)]


def _new_folder(root: str, name: str) -> str:
    day = time.strftime("%Y-%m-%d")
    folder = os.path.join(root, f"{day}-{name}")
    seq = 1
    while os.path.exists(folder):
        seq += 1
        folder = os.path.join(root, f"{day}.{seq}-{name}")
    return folder


def order_seed(sweep: Sweep, entries: list[dict], folder: str) -> tuple[int, str]:
    """The seed of the tries' order and where it came from: the sweep file's ``seed``, else
    the latest one the store's headers recorded, else one from the folder's name (a new
    store: chosen when it starts, the same for a dry run)."""
    if sweep.seed is not None:
        return sweep.seed, "the sweep file's seed"
    for e in reversed(store.headers(entries)):
        if isinstance(e.get("seed"), int) and not isinstance(e.get("seed"), bool):
            return e["seed"], "recorded in the store"
    name = os.path.basename(os.path.normpath(folder))
    return int(hashlib.sha256(name.encode()).hexdigest()[:8], 16), \
        "chosen for this store from its folder's name"


def round_order(cells: list[Cell], seed: int, round_index: int) -> list[Cell]:
    """The cells in the order round ``round_index`` runs them: sorted by the SHA-256 of seed,
    round and cell hash (a permutation that does not depend on which other cells there are, so
    --only and resumes keep it)."""
    def place(c: Cell) -> str:
        return hashlib.sha256(f"{seed}:{round_index}:{c.hash}".encode()).hexdigest()
    return sorted(cells, key=place)


def pending(cells: list[Cell], tries: int, entries: list[dict],
            rerun_failed: bool, seed: int = 0) -> tuple[list[Planned], int]:
    """The tries the store does not hold (or, with ``rerun_failed``, holds as failed), round
    by round (try 0 of every cell, then try 1, ...), each round in ``round_order``; and how
    many are done."""
    eff = store.latest(entries)
    todo, skipped = [], 0
    for i in range(tries):
        for cell in round_order(cells, seed, i):
            e = eff.get((cell.hash, i))
            if e is None:
                todo.append(Planned(cell, i, 1))
            elif e.get("status") != "ok" and rerun_failed:
                todo.append(Planned(cell, i, int(e.get("attempt", 1)) + 1))
            else:
                skipped += 1
    return todo, skipped


def jobs(todo: list[Planned]) -> list[list[Planned]]:
    """The tries grouped into jobs, in the order they run: a try of a cell that shares jobs
    (``shared_jobs``, ``Cell.shares``) joins the first job of the same round and attempt
    whose cells it ``can_join``; otherwise it starts one. A job runs where its first try was
    planned; its tries keep their planned order (so each round's shuffle orders the jobs and
    the methods within each)."""
    out: list[list[Planned]] = []
    open_jobs: dict[tuple, list[list[Planned]]] = {}
    for t in todo:
        if t.cell.shares:
            key = (t.try_index, t.attempt, t.cell.job_key())
            for job in open_jobs.get(key, []):
                if t.cell.can_join([x.cell for x in job]):
                    job.append(t)
                    break
            else:
                out.append([t])
                open_jobs.setdefault(key, []).append(out[-1])
        else:
            out.append([t])
    return out


def extra_round(sweep: Sweep, cells: list[Cell], entries: list[dict],
                seed: int) -> list[Planned]:
    """Adaptive tries (the sweep's ``adaptive``): the next round of tries the store asks for,
    in ``round_order``: for the first round k from ``tries`` to ``max_tries`` - 1 with any,
    the cells that hold every try before k but not k, some of them successful, whose 95%
    interval over their tries is wider than +-target of their median
    (``aggregate.too_wide``). Made from the store alone, so a resumed sweep asks for the same
    tries. Empty when nothing is left to add (or the sweep is not adaptive)."""
    if not sweep.adaptive:
        return []
    eff = store.latest(entries)
    for k in range(sweep.tries, sweep.adaptive["max_tries"]):
        wanted = []
        for cell in cells:
            lines = [eff.get((cell.hash, i)) for i in range(k)]
            if None in lines or (cell.hash, k) in eff:
                continue
            interval = aggregate.cell_interval(lines, cell.hash)
            # (a cell without a successful try is failing, not noisy: no more of it)
            if interval is not None and aggregate.too_wide(interval,
                                                           sweep.adaptive["target"]):
                wanted.append(cell)
        if wanted:
            return [Planned(c, k, 1) for c in round_order(wanted, seed, k)]
    return []


def plan(sweep: Sweep, only=None, results: str | None = None, fresh: bool = False,
         rerun_failed: bool = False) -> Plan:
    cells = [c for c in sweep.cells() if only is None or only(c.axes())]
    if not cells:
        raise UsageError("--only matches no cell of this sweep")
    if results:
        folder = os.path.abspath(results)
        if os.path.isfile(folder):
            folder = os.path.dirname(folder)
        candidates = [folder]
    else:
        candidates = [] if fresh else _dated_folders(sweep.results_root, sweep.name)[-1:]
    for folder in candidates:
        entries, _ = store.read(store.store_path(folder))
        seed, source = order_seed(sweep, entries, folder)
        todo, skipped = pending(cells, sweep.tries, entries, rerun_failed, seed)
        if todo or results or (entries and extra_round(sweep, cells, entries, seed)):
            return Plan(folder, _logs(sweep, folder), bool(entries), cells, todo, skipped,
                        entries, rerun_failed, seed, source)
    folder = _new_folder(sweep.results_root, sweep.name)
    seed, source = order_seed(sweep, [], folder)
    todo, skipped = pending(cells, sweep.tries, [], rerun_failed, seed)
    return Plan(folder, _logs(sweep, folder), False, cells, todo, skipped, [], rerun_failed,
                seed, source)


def _logs(sweep: Sweep, folder: str) -> str:
    return os.path.join(sweep.logs_root, os.path.basename(os.path.normpath(folder)))


def estimate(p: Plan, sweep: Sweep) -> tuple[float, int]:
    """Seconds the plan should take, and how many of its runs had no history to go on."""
    by_hash: dict[str, list[float]] = {}
    by_shape: dict[tuple, list[float]] = {}
    every: list[float] = []
    for e in p.entries:
        if e.get("kind") != "try" or e.get("seconds") is None:
            continue
        s = float(e["seconds"])
        by_hash.setdefault(e["hash"], []).append(s)
        cfg = e["config"]
        by_shape.setdefault((task_key(cfg["task"]), int(cfg["nworkers"])), []).append(s)
        every.append(s)
    total, guessed = 0.0, 0
    for t in p.todo:
        hist = (by_hash.get(t.cell.hash) or by_shape.get((task_key(t.cell.task),
                                                          t.cell.nworkers)) or every)
        if hist:
            total += statistics.fmean(hist)
        else:
            total += sweep.estimate_s
            guessed += 1
    return total, guessed


def fmt_duration(s: float) -> str:
    s = int(round(s))
    if s < 60:
        return f"{s} s"
    if s < 3600:
        return f"{s // 60} min {s % 60:02d} s"
    return f"{s // 3600} h {(s % 3600) // 60:02d} min"


class Progress:
    """A tqdm bar (current cell, done/failed/skipped, ETA from the runs so far) when stderr is
    a terminal, plain lines otherwise, nothing with --quiet."""

    def __init__(self, total: int, skipped: int, mode: str):
        self.total, self.skipped, self.mode = total, skipped, mode
        self.done = self.failed = 0
        self.seconds: list[float] = []
        self.bar = None
        if mode == "bar":
            import tqdm
            tqdm.tqdm.monitor_interval = 0  # no monitor thread: children are forked
            self.bar = tqdm.tqdm(total=total, unit="run", file=sys.stderr, smoothing=0,
                                 dynamic_ncols=True, leave=True,
                                 bar_format="{l_bar}{bar}| {n_fmt}/{total_fmt} "
                                            "[{elapsed}<{remaining}]{postfix}")
            self._postfix()

    def _postfix(self):
        self.bar.set_postfix_str(f"done {self.done}, failed {self.failed}, "
                                 f"skipped {self.skipped}", refresh=True)

    def start(self, job: list[Planned]) -> None:
        if self.bar is not None:
            t, more = job[0], len(job) - 1
            self.bar.set_description_str(f"{t.cell.name}{f' (+{more})' if more else ''} try "
                                         f"{t.try_index}", refresh=True)

    def finish(self, t: Planned, entry: dict) -> None:
        self.done += 1
        self.seconds.append(entry.get("seconds", 0.0))
        ok = entry["status"] == "ok"
        if not ok:
            self.failed += 1
        if ok:
            msg = f"{entry['throughput']:.1f} {entry.get('unit', '')}"
        else:
            msg = f"{entry['status'].upper()}: {entry.get('reason')} (log: {entry['log']})"
        line = f"[{self.done}/{self.total}] {t.cell.name} try {t.try_index}: {msg}"
        if self.bar is not None:
            if not ok:
                self.bar.write(line, file=sys.stderr)
            self._postfix()
            self.bar.update(1)
        elif self.mode == "lines":
            left = self.total - self.done
            eta = fmt_duration(statistics.fmean(self.seconds) * left) if left else "0 s"
            print(f"{line} ({entry.get('seconds', 0):.0f} s; failed {self.failed}, "
                  f"skipped {self.skipped}; ETA {eta})", file=sys.stderr, flush=True)

    def more(self, n: int) -> None:
        """``n`` more runs than planned (adaptive tries)."""
        self.total += n
        if self.bar is not None and n:
            self.bar.total = self.total
            self.bar.refresh()

    def close(self):
        if self.bar is not None:
            self.bar.close()


class _Stop(BaseException):
    pass


def _on_term(signum, _frame):
    raise _Stop(signum)


def _make_folder(folder: str) -> None:
    try:
        os.makedirs(folder, exist_ok=True)
    except OSError as e:  # checked at load (the name's length) and before (writable): a race
        raise UsageError(f"cannot make the results folder {folder}: {e.strerror or e}") \
            from None


def _reap(sweep: Sweep, inflight: runner.Inflight, mode: str) -> None:
    """Stop a run an interrupted sweep left going, and say so."""
    left = inflight.reap(sweep.kill_grace)
    if left and mode != "none":
        print(f"benchmarks.py: a run of an interrupted sweep was still going "
              f"({left['cell']} try {left['try']}); stopped it "
              f"({left['killed']} process(es))", file=sys.stderr, flush=True)


def _header(sweep: Sweep, seed: int, source: str, argv: list[str] | None) -> dict:
    """The store's line that starts this session."""
    header = {"kind": "sweep", **sweep.header(), "seed": seed, "seed_source": source,
              "cells": [c.hash for c in sweep.cells()],
              "suite_version": suite_version(), "started": runner._now(),
              "host": socket.gethostname(), "pid": os.getpid(),
              "argv": list(argv or [])}
    if os.environ.get(PROGRAM_ENV):
        header["program"] = os.environ[PROGRAM_ENV]
    return header


def _calibrate(sweep: Sweep, p: Plan, path: str, inflight: runner.Inflight, mode: str,
               ran: list) -> int:
    """The calibration jobs still to run, then a prediction for each cell without one (or
    whose jobs ran again); returns calibrate.run's count."""
    calibrated = calibrate.run(sweep, p.cells, p.folder, p.logs, inflight, mode, ran)
    known = {e["hash"] for e in store.read(path)[0]
             if e.get("kind") == "prediction" and e.get("throughput") is not None
             and e.get("try") is None}
    # a cell is predicted again when a job it reads ran again (its file deleted)
    for line in calibrate.predictions(sweep, [c for c in p.cells if c.hash not in known
                                              or calibrate.uses(c, ran)], p.folder):
        store.append(path, line)
    return calibrated


def _run_job(sweep: Sweep, p: Plan, path: str, job: list[Planned], inflight: runner.Inflight,
             mode: str, progress: Progress, counts: dict) -> None:
    """One job's tries (after its pace probe, with ``pace``), each into the store."""
    progress.start(job)
    first = job[0]
    if sweep.pace:    # the machine's pace just before the job
        for line in calibrate.pace(sweep, p.cells, [t.cell for t in job],
                                   first.try_index, first.attempt, p.folder,
                                   p.logs, inflight, mode):
            store.append(path, line)
    entries = runner.run_cells(sweep, [t.cell for t in job], first.try_index,
                               first.attempt, p.folder, p.logs, inflight,
                               calibrate.profile_file(first.cell, p.folder))
    for t, entry in zip(job, entries):
        store.append(path, entry)
        counts[entry["status"]] = counts.get(entry["status"], 0) + 1
        progress.finish(t, entry)


def _run_rounds(sweep: Sweep, p: Plan, path: str, todo: list[Planned], seed: int,
                inflight: runner.Inflight, mode: str, progress: Progress,
                counts: dict) -> None:
    """The tries in ``todo`` job by job, then adaptive rounds while the store asks for any."""
    while todo:
        for job in jobs(todo):
            _run_job(sweep, p, path, job, inflight, mode, progress, counts)
        # adaptive tries: another round for the cells whose interval is too wide
        todo = extra_round(sweep, p.cells, store.read(path)[0], seed)
        progress.more(len(todo))
        counts["extra"] = counts.get("extra", 0) + len(todo)


def _check_calibration(sweep: Sweep, p: Plan, path: str, ran: list,
                       inflight: runner.Inflight, mode: str) -> None:
    """After the tries: probe the calibration jobs run in this session and calibrate again
    those the machine's pace has drifted from, saying so."""
    probes = calibrate.check(sweep, ran, p.folder, p.logs, inflight, mode)
    for line in probes:
        store.append(path, line)
        if line.get("off") and mode != "none":
            print(f"benchmarks.py: calibration check: {line['checks']} took "
                  f"{line['ratio']:.2f} times as long now as in the calibration: "
                  f"calibrating it again", file=sys.stderr, flush=True)
    redone = calibrate.recalibrate(sweep, p.cells, probes, p.folder, p.logs, inflight,
                                   mode)
    if redone and mode != "none":
        failed = [e["job"] for e in redone if e.get("kind") == "calibration"
                  and e["status"] != "ok"]
        print(f"benchmarks.py: calibration check: "
              f"{sum(e['kind'] == 'prediction' for e in redone)} cell(s) predicted "
              f"again" + (f"; calibrating {', '.join(failed)} again failed (its "
                          f"first calibration stands)" if failed else ""),
              file=sys.stderr, flush=True)


def execute(sweep: Sweep, p: Plan, mode: str, argv: list[str] | None = None) -> dict:
    """Run the plan's tries one after the other; every finished try is in the store before the
    next starts. Returns counts of this session's runs."""
    _make_folder(p.folder)
    path = store.store_path(p.folder)
    counts = {"ok": 0, "failed": 0, "timeout": 0}
    with store.Lock(p.folder):
        inflight = runner.Inflight(p.folder)
        _reap(sweep, inflight, mode)
        # The plan was made before taking the lock: read the store again.
        entries, unreadable = store.read(path)
        if unreadable:  # left in the file as they are: a resume rewrites nothing
            say(f"benchmarks.py: {unreadable} unreadable line(s) in {path} skipped")
        seed, source = order_seed(sweep, entries, p.folder)
        todo, skipped = pending(p.cells, sweep.tries, entries, p.rerun_failed, seed)
        store.append(path, _header(sweep, seed, source, argv))
        ran: list = []     # calibration jobs run in this session: checked after the tries
        if sweep.calibrate:
            counts["calibration"] = _calibrate(sweep, p, path, inflight, mode, ran)
        if not todo:   # every planned try is done: adaptive tries may be left
            todo = extra_round(sweep, p.cells, entries, seed)
            counts["extra"] = len(todo)
        progress = Progress(len(todo), skipped, mode)
        old = signal.signal(signal.SIGTERM, _on_term)
        try:
            _run_rounds(sweep, p, path, todo, seed, inflight, mode, progress, counts)
            _check_calibration(sweep, p, path, ran, inflight, mode)
        finally:
            signal.signal(signal.SIGTERM, old)
            progress.close()
    counts["skipped"] = skipped
    return counts

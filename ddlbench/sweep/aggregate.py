"""From the store's lines to a table: rows (network, task, method, engine), a column per worker
count, and in each cell the successful tries' throughputs aggregated.

Aggregation (docs/DESIGN.md section 8 and the original suite): ``mean`` (mean +- population std over
the successful tries, as the original's numpy did), ``median`` (median +- the same std), or
``olympic`` (MLPerf style: drop the fastest and the slowest try, then mean +- std of the rest;
needs 3 successful tries). A cell with fewer than ``min_ok`` successful tries (or fewer than 3
under olympic) is marked ``(k/n ok)`` and left out of speedups, never silently averaged.
Speedup S(P) = thr(P) / thr(1) and efficiency S(P) / P use the same row's 1-worker cell of the
same sweep.

Noise (docs/DESIGN.md section 15, "Medians and intervals"): every cell also gets the median of
its successful tries and a 95% interval for it, a bootstrap over the tries (3 or more: 2000
resamples seeded by the cell's hash) or, with 1 or 2 tries, over the timing rounds of their
records; ``ranking`` tells, per group of cells (network, task, workers), the best median and
the methods whose intervals overlap it (tied); ``noise_floor`` compares the methods at 1
worker, where they all do the same work.
"""
from __future__ import annotations

import hashlib
import json
import math
import random
import statistics
from collections import Counter
from dataclasses import dataclass, field

from . import store
from .config import MODEL_NAMES, RDMA_LABELS, method_label, task_key


@dataclass
class Stat:
    values: list            # throughputs of the successful tries (latest attempt of each)
    expected: int           # tries the sweep asked for
    statuses: Counter       # status -> count over recorded tries
    center: float | None = None
    spread: float | None = None
    marked: bool = False    # too few successful tries to be trusted
    # The median of the successful tries and its 95% interval (``median_interval``); basis
    # "tries" (a bootstrap over them), "rounds" (over their timing rounds), "model" (a
    # prediction: the figure itself, no interval), None (none).
    median: float | None = None
    low: float | None = None
    high: float | None = None
    basis: str | None = None

    @property
    def ok(self) -> int:
        return len(self.values)

    def text(self) -> str:
        if not self.values:
            recorded = sum(self.statuses.values())
            if not recorded:
                return "-"
            return "timeout" if self.statuses.get("timeout") == recorded else "failed"
        s = f"{self.center:.1f} +- {self.spread:.2f}"
        return s + (f" ({self.ok}/{self.expected} ok)" if self.marked else "")


@dataclass
class Row:
    network: str
    connection: str
    model: str
    batch_size: int
    task: str
    label: str
    engine: str
    architecture: str
    unit: str = ""
    cells: dict = field(default_factory=dict)   # nworkers -> Stat
    hashes: dict = field(default_factory=dict)  # nworkers -> cell hash
    compressor: str = "none"
    method_id: str = ""         # the method's id (the label may carry settings)
    labelled: bool = False      # the label is the sweep file's own (label: ...)
    original_name: str = ""     # its name in the original's tables (``original_names``)

    @property
    def dnn(self) -> str:
        return MODEL_NAMES.get(self.model, self.model)

    @property
    def method(self) -> str:
        return self.label if self.engine == "torch" else f"{self.label} ({self.engine})"

    @property
    def original_method(self) -> str:
        """The method's name in the original's tables and figures (BSP-A2A, ByteScheduler-PS,
        ...: ``original_names``), the engine as in ``method``."""
        name = self.original_name or self.label
        return name if self.engine == "torch" else f"{name} ({self.engine})"

    @property
    def original_task(self) -> str:
        """The original's task name, model and batch size: ``resnet50_64``, ``bert_8``."""
        return f"{self.model}_{self.batch_size}"

    def speedup(self, n: int) -> tuple[float, float] | None:
        base, cell = self.cells.get(1), self.cells.get(n)
        if not base or not cell or base.marked or cell.marked or not base.values \
                or not cell.values or not base.center:
            return None
        s = cell.center / base.center
        return s, s / n


@dataclass
class Table:
    rows: list
    counts: list            # worker counts, ascending
    noun: str               # CPU or GPU
    aggregate: str
    min_ok: int
    tries: int
    header: dict | None
    tries_used: list        # the store lines behind the table, in table order
    superseded: int         # tries of other configurations of the same cells, left out
    unreadable: int = 0
    predictions: dict = field(default_factory=dict)   # hash -> a calibrated sweep's prediction
    paced: dict = field(default_factory=dict)   # (hash, try, attempt) -> a try's paced one
    calibration: list = field(default_factory=list)   # the calibration jobs' and probes' lines


def aggregate(values: list[float], how: str) -> tuple[float, float, bool]:
    """(center, spread, enough) of the successful tries' throughputs."""
    if how == "olympic":
        if len(values) >= 3:
            kept = sorted(values)[1:-1]
            return statistics.fmean(kept), _pstdev(kept), True
        return statistics.fmean(values), _pstdev(values), False
    if how == "median":
        return statistics.median(values), _pstdev(values), True
    return statistics.fmean(values), _pstdev(values), True


def _pstdev(values: list[float]) -> float:
    return statistics.pstdev(values) if len(values) > 1 else 0.0


# ------------------------------------------------------------------ medians and intervals

CONFIDENCE = 0.95
BOOTSTRAP_RESAMPLES = 2000
BOOTSTRAP_MIN_TRIES = 3     # fewer successful tries: the interval is over timing rounds


def _rounds(lines: list[dict]) -> list[list[float]] | None:
    """Each successful try's per-round total throughputs (its record's
    ``result.total_throughput``), in the order of ``build``'s successful values; None when a
    try has fewer than two (no record, an older one, a throughput read from the log)."""
    out = []
    for e in lines:
        if e.get("status") != "ok" or e.get("throughput") is None:
            continue
        rounds = ((e.get("record") or {}).get("result") or {}).get("total_throughput")
        if not (isinstance(rounds, list) and len(rounds) >= 2 and all(
                isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
                for v in rounds)):
            return None     # (a NaN round too: the tries' throughputs give the interval)
        out.append([float(v) for v in rounds])
    return out


def _percentiles(samples: list[float]) -> tuple[float, float]:
    """The central CONFIDENCE range of the bootstrap's statistics: with 2000 of them the
    51st smallest and the 51st largest (50 below, 50 above)."""
    ranked = sorted(samples)
    k = int(round((1.0 - CONFIDENCE) / 2.0 * len(ranked)))
    return ranked[k], ranked[len(ranked) - 1 - k]


def median_interval(values: list[float], rounds: list[list[float]] | None,
                    key: str) -> tuple[float, float | None, float | None, str | None]:
    """(median, low, high, basis) of a cell's successful tries' throughputs ``values``.

    3 or more tries: a bootstrap over the tries, 2000 resamples (with replacement, as many as
    there are tries), the median of each, and their 2.5th and 97.5th percentiles (basis
    "tries"). 1 or 2 tries whose records hold per-round throughputs (``rounds``, two or more
    each): each resample draws every try's rounds again and takes their mean (a try's
    throughput is the mean of its rounds), then the median over the tries (basis "rounds":
    the variation within a run, not between runs). Otherwise no interval (None, basis None).
    The generator is seeded by ``key`` (the cell's hash): the same store, the same figures."""
    center = statistics.median(values)
    rng = random.Random(int(hashlib.sha256(f"bootstrap:{key}".encode()).hexdigest()[:16], 16))
    n = len(values)
    if n >= BOOTSTRAP_MIN_TRIES:
        stats = [statistics.median(rng.choices(values, k=n))
                 for _ in range(BOOTSTRAP_RESAMPLES)]
        return (center, *_percentiles(stats), "tries")
    if rounds is not None and len(rounds) == n:
        stats = [statistics.median([statistics.fmean(rng.choices(r, k=len(r))) for r in rounds])
                 for _ in range(BOOTSTRAP_RESAMPLES)]
        return (center, *_percentiles(stats), "rounds")
    return center, None, None, None


def cell_interval(lines: list[dict], key: str) -> tuple | None:
    """``median_interval`` of one cell's store lines (the latest of each try; ``key`` its
    hash); None without a successful try. A predicted cell (``--predict-only``: the model's
    figure, nothing measured) has no noise to bound: its "interval" is the figure itself, basis
    "model", so a predicted sweep ranks its methods by the model alone (two are tied only
    where the model gives them the same figure); the model's own error is the validation's
    business (docs/MODEL.md)."""
    ok = [float(e["throughput"]) for e in lines
          if e.get("status") == "ok" and e.get("throughput") is not None]
    if not ok:
        return None
    if all("predicted" in e for e in lines if e.get("status") == "ok"):
        center = statistics.median(ok)
        return center, center, center, "model"
    return median_interval(ok, _rounds(lines), key)


def too_wide(interval: tuple | None, target: float) -> bool:
    """Whether a cell's 95% interval is wider than +-``target`` of its median (or it has no
    interval at all): adaptive tries add a try to such a cell."""
    if interval is None or interval[1] is None:
        return True
    median, low, high, _ = interval
    return (high - low) / 2.0 > target * median


@dataclass
class Ranking:
    """Of a group of cells (same network, task and workers; one per row): the row with the
    best median among the trusted cells, and the other rows whose cells cannot be told from
    it (their intervals overlap the best one's, or one of the two has none)."""
    best: Row | None
    tied: list
    contenders: int

    @property
    def distinguishable(self) -> bool:
        """A best that the data tell apart from every other method (or that has no rival)."""
        return self.best is not None and not self.tied


def ranking(rows: list[Row], n: int) -> Ranking:
    cells = [(r, r.cells[n]) for r in rows
             if n in r.cells and r.cells[n].values and not r.cells[n].marked]
    if not cells:
        return Ranking(None, [], 0)
    best, top = max(cells, key=lambda rs: rs[1].median)  # the first in table order on a tie
    tied = [r for r, s in cells if r is not best and not _apart(top, s)]
    return Ranking(best, tied, len(cells))


def _apart(a: Stat, b: Stat) -> bool:
    """Whether two cells' intervals do not overlap (False when either has none)."""
    if a.basis is None or b.basis is None:
        return False
    return a.low > b.high or b.low > a.high


def groups(t: "Table") -> dict[tuple, list[Row]]:
    """(network, task) -> its rows, in table order."""
    out: dict[tuple, list[Row]] = {}
    for r in t.rows:
        out.setdefault((r.network, r.task), []).append(r)
    return out


@dataclass
class NoiseFloor:
    """At 1 worker, on one network and task (and engine), the all-to-all methods without a
    compressor do the same work: the spread of their medians is noise."""
    rows: list              # the rows compared, table order
    high: Row               # the largest median's
    low: Row                # the smallest median's

    @property
    def ratio(self) -> float:
        return self.high.cells[1].median / self.low.cells[1].median


def alone_the_same(r: Row) -> bool:
    """Whether ``r``'s method, with 1 worker, does what every other such method does: an
    all-to-all method without a compressor (a PS method still talks to its server, a
    compressor still compresses)."""
    return r.architecture != "ps" and r.compressor == "none"


def noise_floor(t: "Table") -> list[NoiseFloor]:
    """Per network, task and engine with two or more such methods' trusted 1-worker cells."""
    found: dict[tuple, list[Row]] = {}
    for r in t.rows:
        s = r.cells.get(1)
        if not alone_the_same(r) or s is None or not s.values or s.marked or not s.median:
            continue
        found.setdefault((r.network, r.task, r.engine), []).append(r)
    out = []
    for rows in found.values():
        if len(rows) >= 2:
            out.append(NoiseFloor(rows, max(rows, key=lambda r: r.cells[1].median),
                                  min(rows, key=lambda r: r.cells[1].median)))
    return out


def original_names(rows: list[Row]) -> None:
    """Set each row's ``original_name``: the sweep file's label where it gave one (the paper
    preset's MG-WFBP, BSP-PS); else the method's display name (ByteScheduler-A2A for
    ``bytescheduler partition=4000000 credit=16000000``) where the table has that method,
    on that engine, under this one label only and no row is labelled with that name; else the
    label, which then tells two settings of one method apart."""
    from .. import methods
    labels: dict[tuple, set] = {}
    for r in rows:
        if not r.labelled:
            labels.setdefault((r.method_id, r.engine), set()).add(r.label)
    taken = {r.label for r in rows if r.labelled}
    for r in rows:
        r.original_name = r.label
        if r.labelled or r.method_id not in methods.names() \
                or len(labels[(r.method_id, r.engine)]) != 1:
            continue
        display = methods.lookup(r.method_id).display
        if display and display not in taken:
            r.original_name = display


def single_throughputs(t: "Table", task_of=None) -> dict[str, float]:
    """One 1-worker throughput per task, as the original's table and figures had (its
    ``single_throughputs``, typed in per task): the table's statistic over the successful
    1-worker tries of every row that does the same work alone (``alone_the_same``: all-to-all
    without a compressor) on any network, of cells with enough successful tries. ``task_of``
    (row -> key; default the row's task key) groups the rows. Tasks without such a cell are
    left out."""
    task_of = task_of or (lambda r: r.task)
    pooled: dict[str, list[float]] = {}
    for r in t.rows:
        s = r.cells.get(1)
        if alone_the_same(r) and s is not None and s.values and not s.marked:
            pooled.setdefault(task_of(r), []).extend(s.values)
    return {task: aggregate(values, t.aggregate)[0] for task, values in pooled.items()}


def build(entries: list[dict], aggregate_how: str | None = None, min_ok: int | None = None,
          unreadable: int = 0) -> Table:
    usable = [e for e in entries if e.get("kind") != "try" or store.has_cell(e)]
    unreadable += len(entries) - len(usable)
    entries = usable
    heads = store.headers(entries)
    header = heads[-1] if heads else None
    how = aggregate_how or (header or {}).get("aggregate") or "mean"
    current = set((header or {}).get("cells") or [])
    eff = store.latest(entries)
    # Which configuration (hash) fills each table position.
    order_seen: dict[str, int] = {}
    for i, e in enumerate(entries):
        if e.get("kind") == "try":
            order_seen[e["hash"]] = i
    by_hash: dict[str, list[dict]] = {}
    for (h, _), e in eff.items():
        by_hash.setdefault(h, []).append(e)
    positions: dict[tuple, str] = {}
    for h, lines in by_hash.items():
        pos = _position(lines[0])
        other = positions.get(pos)
        if other is None or _prefer(h, other, current, order_seen):
            positions[pos] = h
    chosen = set(positions.values())
    superseded = sum(len(v) for h, v in by_hash.items() if h not in chosen)

    tries = int((header or {}).get("tries") or 0)
    if min_ok is None:
        min_ok = int((header or {}).get("min_ok") or max(1, math.ceil(max(tries, 1) / 2)))
    rows: dict[tuple, Row] = {}
    used = []
    for pos, h in positions.items():
        lines = sorted(by_hash[h], key=lambda e: int(e["try"]))
        first = lines[0]
        cfg = first["config"]
        rkey, n = pos[:-1], pos[-1]
        row = rows.get(rkey)
        if row is None:
            row = rows[rkey] = _row(first, header)
        ok = [float(e["throughput"]) for e in lines
              if e.get("status") == "ok" and e.get("throughput") is not None]
        for e in lines:
            if e.get("unit") and not row.unit:
                row.unit = e["unit"]
        expected = max(tries, len(lines))
        stat = Stat(ok, expected, Counter(e.get("status") for e in lines))
        if ok:
            stat.center, stat.spread, enough = aggregate(ok, how)
            stat.marked = len(ok) < min_ok or not enough
            stat.median, stat.low, stat.high, stat.basis = cell_interval(lines, h)
        else:
            stat.marked = True
        row.cells[int(cfg["nworkers"])] = stat
        row.hashes[int(cfg["nworkers"])] = h
        used.extend(lines)
    ordered = sorted(rows.values(), key=lambda r: _row_order(r, header, order_seen))
    original_names(ordered)
    index = {id(r): i for i, r in enumerate(ordered)}
    row_of = {}
    for r in ordered:
        for n, h in r.hashes.items():
            row_of[h] = (index[id(r)], n)
    used.sort(key=lambda e: (*row_of[e["hash"]], int(e["try"])))
    counts = sorted({n for r in ordered for n in r.cells})
    nouns = {e.get("noun") for e in used if e.get("noun")}
    noun = "GPU" if "GPU" in nouns else "CPU" if nouns else "GPU"
    predictions = {e["hash"]: e for e in entries
                   if e.get("kind") == "prediction" and "try" not in e}
    paced = {(e["hash"], e["try"], e.get("attempt", 1)): e for e in entries
             if e.get("kind") == "prediction" and "try" in e}
    calibration = [e for e in entries if e.get("kind") == "calibration"]
    return Table(ordered, counts, noun, how, min_ok, tries, header, used, superseded,
                 unreadable, predictions, paced, calibration)


def paced_line(t: Table, e: dict) -> dict:
    """A try's paced prediction line (``pace: true``), {} without one."""
    return t.paced.get((e["hash"], e["try"], e.get("attempt", 1))) or {}


def paced_of(t: Table, e: dict) -> float | None:
    """A try's paced prediction, None without one."""
    return paced_line(t, e).get("throughput")


def paced_prediction(t: Table, h: str) -> float | None:
    """A cell's paced prediction: the table's statistic (``aggregate``) over the paced
    predictions of the tries its measured figure is made of; None unless every one has one."""
    ok = [e for e in t.tries_used if e["hash"] == h and e.get("status") == "ok"
          and e.get("throughput") is not None]
    values = [paced_of(t, e) for e in ok]
    if not values or any(v is None for v in values):
        return None
    return aggregate(values, t.aggregate)[0]


def predicted_vs_measured(t: Table) -> list[tuple]:
    """(row, workers, measured, predicted line) for every table cell with a prediction line;
    measured None where the cell has no trusted figure."""
    out = []
    for r in t.rows:
        for n in t.counts:
            h = r.hashes.get(n)
            line = t.predictions.get(h) if h else None
            if line is None:
                continue
            s = r.cells.get(n)
            measured = s.center if s is not None and s.values and not s.marked else None
            out.append((r, n, measured, line))
    return out


def _position(e: dict) -> tuple:
    cfg = e["config"]
    # the whole task: two tasks one task_key names (other args, num_classes) are two rows
    return (cfg["network"]["name"], json.dumps(cfg["task"], sort_keys=True, default=str),
            e.get("label") or method_label(cfg["method"]), cfg.get("engine", "torch"),
            int(cfg["nworkers"]))


def _prefer(h: str, other: str, current: set, order_seen: dict) -> bool:
    if (h in current) != (other in current):
        return h in current
    return order_seen.get(h, -1) > order_seen.get(other, -1)


def _row(e: dict, header: dict | None = None) -> Row:
    cfg = e["config"]
    net = cfg["network"]
    # the sweep file's label of the network, which the store's header keeps
    labelled = {n.get("name"): n.get("label") for n in (header or {}).get("networks") or []}
    connection = (e.get("connection") or labelled.get(net["name"])
                  or _connection(net))
    task = cfg["task"]
    # the store's config holds the method's settings, not the sweep file's label
    label = e.get("label") or method_label(cfg["method"])
    return Row(network=net["name"], connection=connection, model=task["model"],
               batch_size=int(task["batch_size"]), task=task_key(task), label=label,
               engine=cfg.get("engine", "torch"),
               architecture=e.get("architecture") or "a2a", unit=e.get("unit") or "",
               compressor=str(cfg["method"].get("compressor", "none")),
               method_id=str(cfg["method"]["method"]),
               labelled=label != method_label(cfg["method"]))


def _connection(net: dict) -> str:
    if net.get("label"):
        return net["label"]
    if net.get("kind") == "rdma":
        return RDMA_LABELS.get(int(net["profile"]), net["name"])
    if net.get("profile") == "loopback":
        return net["name"]
    return f"{net['profile']} (emulated)"


def _row_order(r: Row, header: dict | None, order_seen: dict) -> tuple:
    """The sweep file's order of networks, tasks, methods and engines; rows of configurations
    no longer in it come after, in the order they were first recorded."""
    def where(items, value):
        try:
            return items.index(value)
        except ValueError:
            return len(items)
    h = header or {}
    nets = [n["name"] for n in h.get("networks", [])]
    tasks = [task_key(t) for t in h.get("tasks", [])]
    labels = [method_label(m) for m in h.get("methods", [])]
    engines = list(h.get("engines", []))
    first = min(order_seen.get(x, 0) for x in r.hashes.values())
    return (where(nets, r.network), where(tasks, r.task), where(labels, r.label),
            where(engines, r.engine), first)


def load(path: str, aggregate_how: str | None = None, min_ok: int | None = None) -> Table:
    entries, bad = store.read(store.store_path(path))
    return build(entries, aggregate_how, min_ok, bad)


# -------------------------------------------------------------- where the time goes

@dataclass
class Breakdown:
    """A cell's iteration on its slowest rank, mean over the successful tries whose record
    has the timeline's metrics (milliseconds): compute, communication, the part of it hidden
    behind compute, exposed time (communication or waiting outside compute), the rest;
    ``observed`` False when the method communicates outside the suite's collectives (DDP,
    Horovod): its communication is then unknown and its exposed time only its waits."""
    tries: int
    iteration_ms: float
    compute_ms: float
    comm_ms: float
    hidden_ms: float
    exposed_ms: float
    observed: bool

    @property
    def other_ms(self) -> float:
        return max(0.0, self.iteration_ms - self.compute_ms - self.exposed_ms)

    @property
    def overlap(self) -> float | None:
        """Hidden over all communication, as the record's (None: none, or not observed)."""
        return self.hidden_ms / self.comm_ms if self.observed and self.comm_ms > 0 else None


def timeline_of(e: dict) -> dict | None:
    """A try's ``timeline`` section with metrics (None: failed, an older record, or nothing
    recorded)."""
    if e.get("status") != "ok":
        return None
    tl = (e.get("record") or {}).get("timeline")
    return tl if isinstance(tl, dict) and isinstance(tl.get("mean"), dict) else None


def breakdown(t: Table, row: Row, n: int) -> Breakdown | None:
    h = row.hashes.get(n)
    sections = [tl for e in t.tries_used if e["hash"] == h
                for tl in [timeline_of(e)] if tl is not None]
    if not sections:
        return None

    def mean_ms(key):
        return 1e3 * statistics.fmean(float(s["mean"][key]) for s in sections)
    return Breakdown(len(sections), mean_ms("iteration_s"), mean_ms("compute_s"),
                     mean_ms("comm_s"), mean_ms("hidden_s"), mean_ms("exposed_s"),
                     all(s.get("comm_observed", True) for s in sections))

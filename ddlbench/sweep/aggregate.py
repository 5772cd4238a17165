"""From the store's lines to a table: rows (network, task, method, engine), a column per worker
count, and in each cell the successful tries' throughputs aggregated.

Aggregation (docs/DESIGN.md section 8 and the original suite): ``mean`` (mean +- population std over
the successful tries, as the original's numpy did), ``median`` (median +- the same std), or
``olympic`` (MLPerf style: drop the fastest and the slowest try, then mean +- std of the rest;
needs 3 successful tries). A cell with fewer than ``min_ok`` successful tries (or fewer than 3
under olympic) is marked ``(k/n ok)`` and left out of speedups, never silently averaged.
Speedup S(P) = thr(P) / thr(1) and efficiency S(P) / P use the same row's 1-worker cell of the
same sweep.
"""
from __future__ import annotations

import math
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

    @property
    def dnn(self) -> str:
        return MODEL_NAMES.get(self.model, self.model)

    @property
    def method(self) -> str:
        return self.label if self.engine == "torch" else f"{self.label} ({self.engine})"

    @property
    def original_method(self) -> str:
        """The method's name in the original's tables and figures (BSP-A2A, MG-WFBP, ...)
        where the row is a method with no settings of its own, else the row's label; the
        engine as in ``method``."""
        from .. import methods
        name = methods.lookup(self.label).display if self.label in methods.names() \
            else self.label
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
            row = rows[rkey] = _row(first)
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
        else:
            stat.marked = True
        row.cells[int(cfg["nworkers"])] = stat
        row.hashes[int(cfg["nworkers"])] = h
        used.extend(lines)
    ordered = sorted(rows.values(), key=lambda r: _row_order(r, header, order_seen))
    index = {id(r): i for i, r in enumerate(ordered)}
    row_of = {}
    for r in ordered:
        for n, h in r.hashes.items():
            row_of[h] = (index[id(r)], n)
    used.sort(key=lambda e: (*row_of[e["hash"]], int(e["try"])))
    counts = sorted({n for r in ordered for n in r.cells})
    nouns = {e.get("noun") for e in used if e.get("noun")}
    noun = "GPU" if "GPU" in nouns else "CPU" if nouns else "GPU"
    predictions = {e["hash"]: e for e in entries if e.get("kind") == "prediction"}
    return Table(ordered, counts, noun, how, min_ok, tries, header, used, superseded,
                 unreadable, predictions)


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
    return (cfg["network"]["name"], task_key(cfg["task"]), e.get("label") or
            method_label(cfg["method"]), cfg.get("engine", "torch"), int(cfg["nworkers"]))


def _prefer(h: str, other: str, current: set, order_seen: dict) -> bool:
    if (h in current) != (other in current):
        return h in current
    return order_seen.get(h, -1) > order_seen.get(other, -1)


def _row(e: dict) -> Row:
    cfg = e["config"]
    net = cfg["network"]
    connection = e.get("connection") or _connection(net)
    task = cfg["task"]
    return Row(network=net["name"], connection=connection, model=task["model"],
               batch_size=int(task["batch_size"]), task=task_key(task),
               label=e.get("label") or method_label(cfg["method"]),
               engine=cfg.get("engine", "torch"),
               architecture=e.get("architecture") or "a2a", unit=e.get("unit") or "")


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

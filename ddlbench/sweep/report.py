"""Reports of a results store, made from the store alone (``benchmarks.py report RESULTS``).

In the store's folder: ``README.md`` (the original suite's table, speedups and scaling
efficiency, failed tries), ``original/README.md`` (the original's results README, in its
exact layout, beside the original's figures ``original/*.png``, and its network comparison),
``results.csv`` (every try), ``plots/*.png`` and ``manifest.json``
(the sweep definition and the environments the runs reported); for a calibrated sweep each
cell's prediction beside its measurement (README, CSV, ``plots/predicted_vs_measured.png``).
"""
from __future__ import annotations

import csv
import datetime
import io
import json
import math
import os
import statistics

from . import store
from ..model import score
from .aggregate import (BOOTSTRAP_MIN_TRIES, BOOTSTRAP_RESAMPLES, Stat, Table, alone_the_same,
                        breakdown, build, groups, noise_floor, paced_line, paced_prediction,
                        predicted_vs_measured, ranking, timeline_of, too_wide)

CSV_COLUMNS = ["network", "connection", "model", "batch_size", "method", "architecture",
               "engine", "nworkers", "try", "attempt", "status", "throughput",
               "throughput_std", "unit", "seconds", "reason", "hash", "log",
               # the timeline's means on the slowest rank (the record's `timeline`)
               "iteration_ms", "compute_ms", "comm_ms", "exposed_ms", "overlap",
               "comm_observed", "trace",
               # the try's cell: its median, 95% interval, what the interval is over
               # (tries or rounds) and its standing in its group (best, tied or empty)
               "cell_median", "cell_low", "cell_high", "cell_interval", "cell_standing"]


def _plural(noun: str, n: int) -> str:
    return f"{n} {noun}{'s' if n > 1 else ''}"


def _md(cells: list[str]) -> str:
    return "| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |"


def throughput_table(t: Table) -> str:
    """The original's table: DNN, BS, CONNECTION, METHOD, then one column per worker count."""
    head = ["DNN", "BS", "CONNECTION", "METHOD"] + [_plural(t.noun, n) for n in t.counts]
    lines = [_md(head), "|" + "|".join(" --- " for _ in head) + "|"]
    for r in t.rows:
        cells = [r.dnn, str(r.batch_size), r.connection, r.method]
        cells += [r.cells[n].text() if n in r.cells else "-" for n in t.counts]
        lines.append(_md(cells))
    return "\n".join(lines) + "\n"


BEST, TIED = "(best)", "(tied)"


def interval_text(s: Stat, mark: str = "") -> str:
    """A cell's ``median [low, high]``: ``(rounds)`` when the interval is over timing rounds,
    ``[-]`` without one, the (k/n ok) mark, then ``mark`` (best or tied)."""
    if not s.values:
        return s.text()
    if s.basis == "model":
        return f"{s.median:.1f} (predicted)" + (f" {mark}" if mark else "")
    text = f"{s.median:.1f} " + (f"[{s.low:.1f}, {s.high:.1f}]" if s.basis else "[-]")
    if s.basis == "rounds":
        text += " (rounds)"
    if s.marked:
        text += f" ({s.ok}/{s.expected} ok)"
    return text + (f" {mark}" if mark else "")


def marks(t: Table) -> dict[tuple[int, int], str]:
    """(row index, workers) -> BEST or TIED: per group of cells (network, task, workers) with
    two or more trusted cells, the best median is BEST when its interval is apart from every
    other one's; else it and the cells whose intervals overlap it are TIED."""
    index = {id(r): i for i, r in enumerate(t.rows)}
    out = {}
    for rows in groups(t).values():
        for n in t.counts:
            rk = ranking(rows, n)
            if rk.contenders < 2:
                continue
            if rk.distinguishable:
                out[(index[id(rk.best)], n)] = BEST
            else:
                for r in [rk.best, *rk.tied]:
                    out[(index[id(r)], n)] = TIED
    return out


def interval_table(t: Table) -> str:
    """The median of each cell's successful tries and its 95% interval, ties marked."""
    head = ["DNN", "BS", "CONNECTION", "METHOD"] + [_plural(t.noun, n) for n in t.counts]
    lines = [_md(head), "|" + "|".join(" --- " for _ in head) + "|"]
    mark = marks(t)
    for i, r in enumerate(t.rows):
        cells = [r.dnn, str(r.batch_size), r.connection, r.method]
        cells += [interval_text(r.cells[n], mark.get((i, n), "")) if n in r.cells else "-"
                  for n in t.counts]
        lines.append(_md(cells))
    return "\n".join(lines) + "\n"


def noise_floor_line(t: Table) -> str:
    """One line: per network, task (and engine) with two or more all-to-all methods without a
    compressor at 1 worker, the max/min ratio of their medians and which cells; '' when there
    is none."""
    parts = []
    for f in noise_floor(t):
        r = f.high
        where = f"{r.dnn}, batch {r.batch_size}, {r.connection}"
        if r.engine != "torch":
            where += f", engine {r.engine}"
        parts.append(f"{where}: {f.ratio:.3f} ({f.high.method} {f.high.cells[1].median:.1f} / "
                     f"{f.low.method} {f.low.cells[1].median:.1f}; of "
                     f"{', '.join(x.method for x in f.rows)})")
    if not parts:
        return ""
    return ("Noise floor: at 1 worker the all-to-all methods without a compressor do the same "
            "work, so the max/min ratio of their medians is noise: " + "; ".join(parts) + ".")


def contention_lines(t: Table) -> list[str]:
    """What the records say of cores: processes that shared them (not pinned: more than the
    machine's cores), and tries run with pinning off."""
    shared: dict[tuple, dict] = {}
    labels = {h: r.label for r in t.rows for h in r.hashes.values()}
    off = 0
    for e in t.tries_used:
        pl = ((e.get("record") or {}).get("environment") or {}).get("placement")
        if not isinstance(pl, dict):
            continue
        if pl.get("pinning") in ("shared", "workers"):
            key = (pl["pinning"], pl.get("workers"), pl.get("servers") or 0,
                   pl.get("machine_cores"))
            where = shared.setdefault(key, {})
            where.setdefault(int(e["config"]["nworkers"]), set()).add(labels[e["hash"]])
        elif pl.get("pinning") == "off":
            off += 1
    out = []
    for (how, workers, servers, cores), where in sorted(shared.items(), key=str):
        who = _plural("worker", workers) + (f" and {_plural('server', servers)}" if servers
                                            else "")
        every = {n: {r.label for r in t.rows if n in r.cells} for n in where}
        cells = " and ".join(
            f"{n}-worker cells" + ("" if where[n] == every[n] else
                                   f" of {_join(sorted(where[n]))}") for n in sorted(where))
        if how == "workers":
            out.append(f"{_plural('worker', workers)} pinned to cores of their own and "
                       f"{_plural('parameter server', servers)} on all {cores} cores (the "
                       f"{cells}): a server sums only under a parameter-server method, whose "
                       f"figures then include its contention for the workers' cores.")
            continue
        out.append(f"{who} share {cores} cores: compute contention is part of every figure "
                   f"of theirs (the {cells}).")
    if off:
        out.append(f"Pinning was off in {off} {'try' if off == 1 else 'tries'} (--no-pin or "
                   f"DDLBENCH_PIN=0): their processes shared the machine's cores.")
    return out


def adaptive_line(t: Table) -> str | None:
    """What adaptive tries did (a sweep file's ``adaptive``): how many tries they added, to
    how many cells, and which cells are still wider than the target at the maximum."""
    adaptive = (t.header or {}).get("adaptive")
    if not adaptive:
        return None
    target, most = adaptive["target"], adaptive["max_tries"]
    extra = [e for e in t.tries_used if int(e["try"]) >= t.tries]
    wide = []
    for r in t.rows:
        for n, stat in sorted(r.cells.items()):
            interval = (stat.median, stat.low, stat.high, stat.basis) if stat.ok else None
            if sum(stat.statuses.values()) >= most and too_wide(interval, target):
                wide.append(f"{r.dnn} {r.method} at {n} on {r.connection}")
    line = (f"Adaptive tries: a cell whose interval was wider than +-{target * 100:g}% of its "
            f"median got another try, up to {most}: {len(extra)} extra "
            f"{'try' if len(extra) == 1 else 'tries'} in "
            f"{len({e['hash'] for e in extra})} cell(s)")
    if wide:
        line += f"; still wider after {most}: {', '.join(wide)}"
    return line + "."


def intervals_section(t: Table) -> list[str]:
    """README lines: the medians and intervals, how they are made, the noise floor."""
    out = ["## Medians and 95% intervals", "",
           f"The median of each cell's successful tries and a 95% interval for it: with "
           f"{BOOTSTRAP_MIN_TRIES} or more successful tries a bootstrap over the tries "
           f"({BOOTSTRAP_RESAMPLES} resamples, the median of each, their 2.5th and 97.5th "
           f"percentiles; seeded by the cell's hash, so the same store gives the same "
           f"figures); with fewer, marked (rounds), the same over the timing rounds of its "
           f"tries (each try's rounds drawn again, their mean the try's throughput), which "
           f"holds the variation within a run only, not between runs; [-]: no interval (no "
           f"per-round figures). In each group of cells (same network, task and workers) the "
           f"best median is marked (best) when its interval is apart from every other "
           f"method's; otherwise it and the methods whose intervals overlap it are marked "
           f"(tied): these tries cannot tell them apart.", "",
           interval_table(t).rstrip("\n"), ""]
    adaptive = adaptive_line(t)
    if adaptive:
        out += [adaptive, ""]
    floor = noise_floor_line(t)
    if floor:
        out += [floor, ""]
    return out


def conclusion(t: Table) -> list[str]:
    """README lines: what the sweep says, one paragraph per network, task and worker count
    with two or more methods to compare, made from the data alone: the best method (or the
    methods tied best: their intervals overlap), the slowest and by how much, where the
    communication went (exposed and hidden, from the runs' timelines) and, for a calibrated
    sweep, how close the model came and whether it picked the same best."""
    out = []
    for rows in groups(t).values():
        for n in t.counts:
            rk = ranking(rows, n)
            if rk.contenders < 2:
                continue
            first = rows[0]
            unit = (first.unit or "samples/sec").replace("/sec", "/s")
            where = (f"**{first.dnn}, batch {first.batch_size}, {first.connection}, "
                     f"{_plural('worker', n)}**")
            best = rk.best
            top = best.cells[n].median
            if rk.distinguishable:
                runner_up = max((r for r in rows if r is not best and n in r.cells
                                 and r.cells[n].values and not r.cells[n].marked),
                                key=lambda r: r.cells[n].median)
                lead = 100 * (top / runner_up.cells[n].median - 1)
                why = ("by the model's prediction" if best.cells[n].basis == "model" else
                       "its interval apart from every other method's")
                head = (f"{best.method} is fastest ({top:.1f} {unit}), {lead:.0f}% ahead of "
                        f"{runner_up.method}, {why}")
            else:
                names = [best.method, *(r.method for r in rk.tied)]
                why = (", the model predicts the same figure" if best.cells[n].basis == "model"
                       else " the highest median; their intervals overlap")
                head = f"{_join(names)} are tied best ({top:.1f} {unit}{why})"
            trusted = [r for r in rows if n in r.cells and r.cells[n].values
                       and not r.cells[n].marked]
            slow = min(trusted, key=lambda r: r.cells[n].median)
            parts = [head]
            if slow is not best and slow not in rk.tied:
                parts.append(f"{slow.method} is slowest ({slow.cells[n].median:.1f}, "
                             f"{100 * (1 - slow.cells[n].median / top):.0f}% below)")
            seen = []
            if n == 1 and all(alone_the_same(r) for r in trusted):
                # nobody to talk to: nothing is exposed or hidden, whatever the trace says
                low = min(r.cells[n].median for r in trusted)
                parts.append(f"with 1 worker there is no communication: the {top / low:.3f} "
                             f"max/min ratio of their medians is noise and each method's own "
                             f"bookkeeping")
            else:
                seen = [(r, breakdown(t, r, n)) for r in trusted]
                seen = [(r, b) for r, b in seen
                        if b is not None and b.observed and b.comm_ms > 0]
            if seen:
                worst = max(seen, key=lambda rb: rb[1].exposed_ms)
                most = max(seen, key=lambda rb: rb[1].overlap or 0.0)
                w, b = worst
                parts.append(f"{w.method} exposes {b.exposed_ms:.0f} ms of its "
                             f"{b.iteration_ms:.0f} ms iteration to communication "
                             f"({100 * (b.overlap or 0):.0f}% of {b.comm_ms:.0f} ms hidden)")
                if most[0] is not w and most[1].overlap:
                    parts.append(f"{most[0].method} hides the most "
                                 f"({100 * most[1].overlap:.0f}% of {most[1].comm_ms:.0f} ms)")
            preds = {id(r): (t.predictions.get(r.hashes.get(n)) or {}).get("throughput")
                     for r in trusted}
            errors = [abs(preds[id(r)] / r.cells[n].median - 1) for r in trusted
                      if preds[id(r)]]
            if errors:
                picked = max((r for r in trusted if preds[id(r)]), key=lambda r: preds[id(r)])
                agree = ("the same best" if picked is best or picked in rk.tied
                         else f"{picked.method} as best")
                parts.append(f"the model, calibrated before the runs, came within "
                             f"{100 * statistics.median(errors):.0f}% (median over "
                             f"{_plural('method', len(errors))}) and picked {agree}")
            out.append(f"{where}: " + "; ".join(parts) + ".")
    if not out:
        return []
    scored = best_method_score(predicted_vs_measured(t)) if t.predictions else None
    lead = ([f"The model's answer to the question: {score.headline(scored)} (Predicted vs "
             f"measured, below).", ""] if scored and scored["groups"] else [])
    return ["## What this sweep says", "", *lead,
            "Made from the data below (medians, 95% intervals, the runs' timelines and, where "
            "calibrated, the model's predictions):", "", *(x for p in out for x in (p, ""))]


def _join(names: list[str]) -> str:
    return names[0] if len(names) == 1 else ", ".join(names[:-1]) + " and " + names[-1]


def original_table(t: Table, date: str, images: list[str] | tuple = (),
                   compare: str = "") -> str:
    """The original suite's results README in its exact layout (its plots.py): the date line,
    its table (DNN, BS, CONNECTION, METHOD, the 1-GPU column, then 'mean +- std' with 3 and 2
    decimals per worker count, its spacing and trailing blanks), then its figures block
    (``images``: file names beside the README, linked as ``./NAME``). As the original's, the
    1-GPU column is one figure per task (``plots.original_singles``: measured here, where the
    original typed one in); beyond it, a cell with too few successful tries keeps its (k/n ok)
    mark, a missing cell is '-' and a failed one 'failed' or 'timeout' (the original printed
    nan). ``compare`` (``compare_section``), when given, follows the figures."""
    from . import plots
    names, singles = plots.original_task_names(t), plots.original_singles(t)
    counts = [n for n in t.counts if n != 1]
    head = ["DNN", "BS", "CONNECTION", "METHOD", f"1 {t.noun}"]
    head += [f"{n} {t.noun}s" for n in counts]
    lines = [f"# Results generated on {date}", "", "|  " + " | ".join(head) + " |",
             "|" + "-------------- | " * len(head)]
    for r in t.rows:
        one = singles.get(names[r.task])
        cells = [r.dnn, str(r.batch_size), r.connection, r.original_method,
                 f"{one:.1f}" if one is not None else "-"]
        for n in counts:
            s = r.cells.get(n)
            if s is None or not s.values:
                cells.append(s.text() if s else "-")
            else:
                cells.append(f"{s.center:.3f} +- {s.spread:.2f}"
                             + (f" ({s.ok}/{s.expected} ok)" if s.marked else ""))
        lines.append("| " + "".join(f"{c} | " for c in cells))
    figures = "".join(f'<img src="./{p}" align=center/>\n' for p in images)
    out = "\n".join(lines) + "\n\n# Figures\n<div align=\"center\">\n" + figures + "</div>"
    return out + ("\n\n" + compare.rstrip("\n") if compare else "")


def compare_section(t: Table, images: dict[str, str] | None = None) -> str:
    """The original's compare_rdma (which printed these ratios and drew nothing) for
    ``original/README.md``: per task with results on two or more networks, its figure
    (``images``: task -> file name beside the README, where drawn) and a table of
    thr(network) / thr(the network before it) per method and worker count; for the other
    tasks a line saying why there is none."""
    from . import plots
    images = images or {}
    connection = {r.network: r.connection for r in t.rows}
    nets = plots.networks_by_task(t)
    ratios = plots.compare_series(t)
    out = ["# Network comparison", "",
           "Throughput on each network over the network before it (the original's compare_rdma: "
           "10GbE with TCP/IP, then 100GbE with TCP/IP, then 100GbIB with RDMA; other networks "
           "after, in the sweep's order), per method and worker count, from cells with enough "
           "successful tries.", ""]
    counts = [n for n in t.counts if n != 1]
    for task, networks in nets.items():
        if task not in ratios:
            if len(networks) > 1:
                why = (f"no method has enough successful tries at one worker count on two of "
                       f"its networks ({', '.join(networks)})")
            elif networks:
                why = f"its results are on one network only ({networks[0]})"
            else:
                why = "it has no results to compare"
            out += [f"{task}: no comparison figure, {why}.", ""]
            continue
        out += [f"{task}:", ""]
        if task in images:
            out += [f'<img src="./{images[task]}" align=center/>', ""]
        head = ["METHOD", "NETWORKS"] + [f"{n} {t.noun}s" for n in counts]
        out += ["|  " + " | ".join(head) + " |",
                "|" + "-------------- | " * len(head)]
        for a, b, series in ratios[task]:
            if not series:
                out.append("| - | " + f"{connection[b]} / {connection[a]} | "
                           + "- | " * len(counts))
            for method, pts in series.items():
                got = dict(pts)
                cells = [method, f"{connection[b]} / {connection[a]}"]
                cells += [f"{got[n]:.3f}" if n in got else "-" for n in counts]
                out.append("| " + "".join(f"{c} | " for c in cells))
        out.append("")
    return "\n".join(out)


def speedup_table(t: Table) -> str:
    """S(P) = thr(P)/thr(1) and efficiency S(P)/P against the row's own 1-worker cell."""
    counts = [n for n in t.counts if n != 1]
    head = ["DNN", "BS", "CONNECTION", "METHOD"] + [_plural(t.noun, n) for n in counts]
    lines = [_md(head), "|" + "|".join(" --- " for _ in head) + "|"]
    for r in t.rows:
        cells = [r.dnn, str(r.batch_size), r.connection, r.method]
        for n in counts:
            s = r.speedup(n)
            cells.append("-" if s is None else f"{s[0]:.2f}x ({100 * s[1]:.1f}%)")
        lines.append(_md(cells))
    return "\n".join(lines) + "\n"


def engine_table(t: Table) -> str:
    """Each torch-engine row over the same row on every other engine (same network, task and
    method): thr(torch) / thr(other) per worker count; above 1 the torch engine is faster.
    Empty when the sweep has one engine."""
    torch_rows = {(r.network, r.task, r.label): r for r in t.rows if r.engine == "torch"}
    pairs = [(torch_rows[(r.network, r.task, r.label)], r) for r in t.rows
             if r.engine != "torch" and (r.network, r.task, r.label) in torch_rows]
    if not pairs:
        return ""
    head = ["DNN", "BS", "CONNECTION", "METHOD", "VS"] + [_plural(t.noun, n) for n in t.counts]
    lines = [_md(head), "|" + "|".join(" --- " for _ in head) + "|"]
    for mine, other in pairs:
        cells = [mine.dnn, str(mine.batch_size), mine.connection, mine.label, other.engine]
        for n in t.counts:
            a, b = mine.cells.get(n), other.cells.get(n)
            ok = a and b and not a.marked and not b.marked and a.center and b.center
            cells.append(f"{a.center / b.center:.2f}" if ok else "-")
        lines.append(_md(cells))
    return "\n".join(lines) + "\n"


def console(t: Table) -> str:
    """What benchmarks.py prints: the throughput table, then the engine ratios (several
    engines) and the speedups (when there are 1-worker cells)."""
    parts = [throughput_table(t),
             "Median [95% interval]; (tied): not told apart from the best (README.md: how)\n"
             + interval_table(t)]
    floor = noise_floor_line(t)
    if floor:
        parts.append(floor + "\n")
    engines = engine_table(t)
    if engines:
        parts.append(engines)
    if 1 in t.counts:
        parts.append(speedup_table(t))
    return "\n".join(parts)


def summary_counts(t: Table) -> dict:
    counts = {"ok": 0, "failed": 0, "timeout": 0}
    for e in t.tries_used:
        counts[e.get("status", "failed")] = counts.get(e.get("status", "failed"), 0) + 1
    cells = (t.header or {}).get("cells") or [h for r in t.rows for h in r.hashes.values()]
    done = {(e["hash"], int(e["try"])) for e in t.tries_used}
    counts["not run"] = sum(1 for h in cells for i in range(t.tries) if (h, i) not in done)
    return counts


def _intro_lines(t: Table) -> list[str]:
    """The title and the paragraph on what was run and how the tables count it."""
    name = (t.header or {}).get("name", "sweep")
    c = summary_counts(t)
    agg = {"mean": "mean +- std (population std, as the original)",
           "median": "median +- std (population std)",
           "olympic": "olympic: the fastest and the slowest try dropped, mean +- std of the "
                      "rest"}[t.aggregate]
    predicted = bool((t.header or {}).get("predicted"))
    out = [f"# Sweep {name}" + (" (predicted)" if predicted else ""), ""]
    if predicted:
        out += ["**Predicted by the performance model, not measured** (`benchmarks.py "
                "--predict-only`: ddlbench/model/cell.py from each task's profile and each "
                "network's description; every cell's inputs are in results.jsonl under "
                "`predicted`). Nothing was run: no cell has tries or an interval, the methods "
                "are ranked by the model's figures alone ((best) is the highest prediction; "
                "(tied) only where two are equal), and how far the model is from measurements "
                "is docs/MODEL.md's.", ""]
    tries_text = f"{t.tries} tries per cell" if t.tries else "tries as recorded"
    out.append(f"{len(t.rows)} rows x {len(t.counts)} worker counts, {tries_text}: "
               f"{c['ok']} tries ok, {c['failed']} failed, {c['timeout']} timed out, "
               f"{c['not run']} not run.")
    out.append("")
    out.append(f"Throughput: total {' and '.join(sorted({r.unit for r in t.rows if r.unit})) or 'samples/sec'}"
               f" over all workers, {agg} over the successful tries. A cell with fewer than "
               f"{t.min_ok} successful tries{' (or fewer than 3)' if t.aggregate == 'olympic' else ''}"
               f" is marked (k/n ok) and left out of speedups.")
    if t.superseded:
        out.append(f"{t.superseded} {'try' if t.superseded == 1 else 'tries'} of other configurations of the same cells (an older "
                   f"suite version or sweep file) are in the store but not in these tables.")
    if t.unreadable:
        out.append(f"{t.unreadable} unreadable line(s) in the store were skipped.")
    return out


def _engines_section(t: Table) -> list[str]:
    engines = engine_table(t)
    if not engines:
        return []
    return ["## Engines side by side", "",
            "thr(torch engine) / thr(other engine) for the same network, task, method and "
            "workers, from this sweep's tries (above 1: the torch engine is faster).", "",
            engines.rstrip("\n"), ""]


def _speedup_section(t: Table) -> list[str]:
    if 1 not in t.counts:
        return ["No speedups: this sweep has no 1-worker cells to measure them against.", ""]
    return ["## Speedup and scaling efficiency", "",
            "S(P) = thr(P) / thr(1) (efficiency S(P)/P in brackets), thr(1) being the same "
            "row's 1-worker throughput measured in this sweep.", "",
            speedup_table(t).rstrip("\n"), ""]


def _time_section(t: Table) -> list[str]:
    times = time_table(t)
    if not times:
        return []
    return ["## Where the time goes", "",
            "Each cell's iteration on its slowest rank, mean over its tries (the runs' "
            "timelines): compute (forward, backward, optimizer), communication (the union "
            "of its collectives and push/pulls), exposed (communication or waiting while "
            "nothing computes), hidden = the part of communication under compute. DDP "
            "(without a trace file) and Horovod communicate outside the suite's "
            "collectives: not observed, their exposed time is their waits only.", "", times.rstrip("\n"), ""]


def _failed_section(t: Table) -> list[str]:
    bad = [e for e in t.tries_used if e.get("status") != "ok"]
    if not bad:
        return []
    out = ["## Failed tries", "",
           _md(["cell", "try", "status", "reason", "last log line", "log"]),
           "| --- | --- | --- | --- | --- | --- |"]
    for e in bad:
        last = next((ln.strip() for ln in reversed(e.get("log_tail") or [])
                     if ln.strip() and not ln.startswith("# benchmarks.py")), "")
        out.append(_md([e["cell"], str(e["try"]), e.get("status", "?"),
                        str(e.get("reason") or ""), f"`{last[:160]}`" if last else "",
                        str(e.get("log") or "")]))
    out.append("")
    return out


def _plots_section(plots: list[str] | None) -> list[str]:
    if not plots:
        return []
    return (["## Plots", ""]
            + [f"![{os.path.splitext(os.path.basename(p))[0]}]({p})" for p in plots] + [""])


def _files_section() -> list[str]:
    return ["## Files", "",
            "- `results.jsonl`: the store, one JSON line per finished try (the source of all "
            "of this; `benchmarks.py report` remakes it)",
            "- `results.csv`: every try, with its cell's median, interval and standing",
            "- `manifest.json`: the sweep and its environments",
            "- `records/`: each run's own JSON record (and, with `timeline:` on, its Chrome "
            "trace: `python -m ddlbench.timeline FILE` summarises it)", ""]


def algorithm_lines(t: Table) -> list[str]:
    """A paragraph naming the table's methods that change the algorithm (their declared
    ``changes_algorithm``, periodic averaging): their throughput is not synchronous SGD's, and
    nothing here says how well they train; [] when there are none."""
    from .. import methods
    changed = {}
    for r in t.rows:
        try:
            how = methods.lookup(r.method_id).changes_algorithm if r.method_id else None
        except Exception:  # a method that cannot be loaded here: nothing declared
            how = None
        if how:
            changed.setdefault(r.method, how)
    if not changed:
        return []
    named = "; ".join(f"{name}: {how}" for name, how in changed.items())
    return [f"Not synchronous SGD: {named}. These change the algorithm: their figures are "
            f"the speed of another training algorithm, and the suite, which trains on fake "
            f"data, says nothing of their model quality.", ""]


def markdown(t: Table, plots: list[str] | None = None) -> str:
    """README.md of a results folder: what ran, the conclusion, then one section each."""
    out = _intro_lines(t)
    changed = algorithm_lines(t)
    if changed:
        out += [""] + changed
    out += contention_lines(t)
    out += [""] + conclusion(t)
    out += ["## Throughput", "", throughput_table(t).rstrip("\n"), ""]
    out += intervals_section(t)
    out += prediction_section(t, next((p for p in plots or [] if p.endswith(
        "predicted_vs_measured.png")), None))
    out += _engines_section(t)
    out += _speedup_section(t)
    out += check_section(t)
    out += _time_section(t)
    out += _failed_section(t)
    out += _plots_section(plots)
    out += _files_section()
    return "\n".join(out)


def csv_text(t: Table) -> str:
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    # a calibrated sweep: each try also gets its cell's prediction and the try's error
    extra = ["predicted", "predicted_error"] if t.predictions else []
    if t.paced:   # pace: true: the try's own prediction, its compute at the probe's pace
        extra += ["pace", "paced_predicted", "paced_error"]
    w.writerow(CSV_COLUMNS + extra)
    rows_by_hash = {h: r for r in t.rows for h in r.hashes.values()}
    mark = marks(t)
    standing = {r.hashes[n]: mark.get((i, n), "").strip("()") for i, r in enumerate(t.rows)
                for n in r.hashes}
    for e in t.tries_used:
        r = rows_by_hash[e["hash"]]
        st = r.cells[int(e["config"]["nworkers"])]
        cells = []
        if extra:
            pred = (t.predictions.get(e["hash"]) or {}).get("throughput")
            thr = e.get("throughput")
            cells = [_num(pred), _num((pred - thr) / thr) if pred is not None and thr else ""]
            if t.paced:
                line = paced_line(t, e)
                paced = line.get("throughput")
                cells += [_num(line.get("pace")), _num(paced),
                          _num((paced - thr) / thr) if paced is not None and thr else ""]
        w.writerow([r.network, r.connection, r.model, r.batch_size, r.label, r.architecture,
                    r.engine, e["config"]["nworkers"], e["try"], e.get("attempt", 1),
                    e.get("status"), _num(e.get("throughput")), _num(e.get("throughput_std")),
                    e.get("unit") or r.unit, _num(e.get("seconds")), e.get("reason") or "",
                    e["hash"], e.get("log") or "", *_timeline_cells(e), _num(st.median),
                    _num(st.low), _num(st.high), st.basis or "", standing[e["hash"]], *cells])
    return buf.getvalue()


def prediction_section(t: Table, image: str | None = None) -> list[str]:
    """README lines: every cell's prediction beside its measurement, and the error."""
    pairs = predicted_vs_measured(t)
    if not pairs:
        return []
    paced = bool(t.paced)
    out = ["## Predicted vs measured", "",
           "Each cell predicted before any try ran"
           + (" (those marked (r): after, see below)" if any(
               line.get("recalibrated") for *_, line in pairs) else "")
           + ", from this sweep's calibration alone "
           "(`calibration/`: the profiler's layer-wise profile at the cell's worker count, "
           "comm_bench's alpha-beta fits on its network; ddlbench/sweep/calibrate.py): "
           "error = (predicted - measured) / measured."
           + (" Paced: each try predicted again just before it ran, every compute time "
              "scaled by a pace probe (a short profiler run at its placement, over the "
              "calibration's profile), the same statistic over the tries." if paced else ""),
           "",
           _md(["DNN", "BS", "CONNECTION", "METHOD", "workers", "measured", "predicted",
                "error", *(("paced", "paced error") if paced else ()), "bound by"]),
           "|" + " --- |" * (11 if paced else 9)]
    errors, paced_errors, again, by_workers = [], [], 0, {}
    for r, n, measured, line in pairs:
        pred = line.get("throughput")
        if pred is None:
            cells = ["-", f"none: {line.get('reason', '')}", ""]
        elif measured is None:
            cells = ["-", f"{pred:.1f}", ""]
        else:
            err = (pred - measured) / measured
            errors.append(abs(err))
            by_workers.setdefault(n, []).append(abs(err))
            cells = [f"{measured:.1f}", f"{pred:.1f}", f"{100 * err:+.1f}%"]
        if pred is not None and line.get("recalibrated"):
            cells[1] += " (r)"
            again += 1
        if paced:
            q = paced_prediction(t, r.hashes[n])
            if q is None or measured is None:
                cells += ["-", ""]
            else:
                paced_errors.append(abs(q - measured) / measured)
                cells += [f"{q:.1f}", f"{100 * (q - measured) / measured:+.1f}%"]
        bound = ((line.get("predicted") or {}).get("bottleneck") or "") if pred else ""
        out.append(_md([r.dnn, str(r.batch_size), r.connection, r.method, str(n), *cells,
                        bound]))
    out.append("")
    best = best_method_score(pairs)
    if best["groups"]:
        out[2:2] = [score.headline(best) + " (a group: one model, batch, network and worker "
                    "count; the methods measured in it). Per group: " + "; ".join(
                        f"{g['group']}: {g['pick']}" + ("" if g["exact"] else
                                                        f" (best {g['best']}, "
                                                        f"{100 * g['shortfall']:.1f}% short)")
                        for g in best["rows"]) + ".", ""]
    if again:
        out += ["(r): predicted again after the tries, from a calibration job run again because "
                "its probe was off (Calibration check, below); still from no timed run.", ""]
    for label, errs in (("", errors), ("Paced: median ", paced_errors)):
        if errs:
            out += [f"{label or 'Median '}|error| {_error_summary(errs)}.", ""]
    base = {(line.get("predicted") or {}).get("calibrated_at") for *_, line in pairs} - {None}
    if base:
        out += [f"Extrapolated (extrapolate: true): calibrated at {_n_workers(base)} only; "
                "the cells of more workers predicted from that calibration (the measured "
                "ring's steps at more workers, the compute slowed by the workers sharing the "
                "cores). Median |error| by workers: " + "; ".join(
                    f"{n}: {_error_summary(by_workers[n])}" for n in sorted(by_workers))
                + ".", ""]
    if image:
        out += [f"![predicted vs measured]({image})", ""]
    return out


def best_method_score(pairs) -> dict:
    """``score.best_method`` over ``predicted_vs_measured``'s pairs with a measured figure, a
    group per model, batch, network and worker count."""
    rows = [{"group": f"{r.dnn} bs{r.batch_size} {r.connection} P={n}", "method": r.method,
             "predicted": line.get("throughput"), "measured": measured}
            for r, n, measured, line in pairs]
    return score.best_method(score.grouped(rows, lambda x: x["group"]))


def _n_workers(counts) -> str:
    return f"{', '.join(str(n) for n in sorted(counts))} workers"


def check_section(t: Table) -> list[str]:
    """README lines: the calibration check's probes (``calibration_check``) against the
    calibration, and the CPU time the hypervisor stole during the calibration and the tries."""
    probes = [e for e in t.calibration if e.get("checks")]
    if not probes:
        return []
    tol = float((t.header or {}).get("calibration_check") or 0)
    out = ["## Calibration check", "",
           "After the tries, each profile's compute (forward, backward and step, alone) and "
           "each network's all-reduce (the sum over its 1-16 MiB sizes) timed again at the "
           "calibration's placement: the time after the tries over the calibration's. A probe "
           f"more than {100 * tol:.0f}% off either way is marked: the calibration (or the "
           "probe) ran in a slow or a fast minute. Its job then ran once more and the cells "
           "that read it were predicted again ((r) above).",
           "", _md(["calibration job", "calibrated", "after the tries", "ratio", ""]),
           "|" + " --- |" * 5]
    off = 0
    redone = {e["job"]: e["status"] for e in t.calibration if e.get("recalibrated")}
    for e in probes:
        if e.get("ratio") is None:
            out.append(_md([e["checks"], "-", f"none: {e.get('reason') or e.get('status')}",
                            "", ""]))
            continue
        off += bool(e.get("off"))
        redo = redone.get(e["checks"])
        mark = "" if not e.get("off") else "**off**" + (
            "" if redo is None else ": calibrated again" if redo == "ok" else
            f": calibrating again {redo}, the first calibration stands")
        out.append(_md([e["checks"], f"{1e3 * e['calibrated_s']:.1f} ms",
                        f"{1e3 * e['now_s']:.1f} ms", f"{e['ratio']:.2f}", mark]))
    timed = sum(e.get("ratio") is not None for e in probes)
    out += ["", f"{off} of {_plural('probe', timed)} off by more than {100 * tol:.0f}%."]
    steal = _steal_line(t)
    return out + ([steal] if steal else []) + [""]


def _steal_line(t: Table) -> str | None:
    """The hypervisor's steal during the calibration jobs and the tries (median, max)."""
    parts = []
    for what, lines in (("the calibration jobs", [
            e for e in t.calibration
            if not e.get("checks") and not str(e.get("job")).endswith(".pace")]),
                        ("the tries", t.tries_used)):
        vals = [float(e["cpu_steal"]) for e in lines if e.get("cpu_steal") is not None]
        if vals:
            parts.append(f"{what} a median {100 * statistics.median(vals):.1f}% "
                         f"(max {100 * max(vals):.1f}%)")
    if not parts:
        return None
    return ("CPU time stolen by the hypervisor (of all CPUs' time, /proc/stat): during "
            + " and during ".join(parts) + ".")


def _error_summary(errors: list[float]) -> str:
    """``x% over N cells, 90th percentile y%`` of absolute relative errors."""
    ranked = sorted(errors)
    p90 = ranked[min(len(ranked) - 1, math.ceil(0.9 * len(ranked)) - 1)]
    return (f"{100 * statistics.median(errors):.1f}% over {_plural('cell', len(errors))}, "
            f"90th percentile {100 * p90:.1f}%")


def _timeline_cells(e: dict) -> list[str]:
    tl = timeline_of(e)
    if tl is None:
        return ["", "", "", "", "", "", e.get("trace") or ""]
    m = tl["mean"]
    return [*(_num(1e3 * m[k]) for k in ("iteration_s", "compute_s", "comm_s", "exposed_s")),
            _num(m.get("overlap")), str(bool(tl.get("comm_observed", True))).lower(),
            e.get("trace") or ""]


def time_table(t: Table) -> str:
    """Where each cell's iteration goes on its slowest rank (the runs' timelines, mean over
    the tries): '' when no try recorded one."""
    head = ["DNN", "BS", "CONNECTION", "METHOD", t.noun + "s", "iteration ms", "compute ms",
            "communication ms", "exposed ms", "hidden"]
    lines = []
    for r in t.rows:
        for n in t.counts:
            b = breakdown(t, r, n)
            if b is None:
                continue
            comm = f"{b.comm_ms:.1f}" if b.observed else "not observed"
            hidden = "-" if b.overlap is None else f"{100 * b.overlap:.0f}%"
            lines.append(_md([r.dnn, str(r.batch_size), r.connection, r.method, str(n),
                              f"{b.iteration_ms:.1f}", f"{b.compute_ms:.1f}", comm,
                              f"{b.exposed_ms:.1f}", hidden]))
    if not lines:
        return ""
    return "\n".join([_md(head), "|" + "|".join(" --- " for _ in head) + "|", *lines]) + "\n"


def _num(v) -> str:
    return "" if v is None else repr(float(v))


def manifest(t: Table, entries: list[dict]) -> dict:
    envs: list[dict] = []
    counts: list[int] = []
    for e in t.tries_used:
        env = (e.get("record") or {}).get("environment")
        if not env:
            continue
        if env in envs:
            counts[envs.index(env)] += 1
        else:
            envs.append(env)
            counts.append(1)
    heads = store.headers(entries)
    started = [e["started"] for e in t.tries_used if e.get("started")]
    finished = [e["finished"] for e in t.tries_used if e.get("finished")]
    return {
        "sweep": t.header,
        "sweep_starts": [{k: h.get(k) for k in ("started", "host", "pid", "suite_version",
                                                "argv")} for h in heads],
        "suite_versions": sorted({h.get("suite_version") for h in heads if h.get("suite_version")}),
        "git_commits": sorted({e.get("git_commit") for e in envs if e.get("git_commit")}),
        "environments": [dict(env, tries=n) for env, n in zip(envs, counts)],
        "tries": summary_counts(t),
        "first_started": min(started) if started else None,
        "last_finished": max(finished) if finished else None,
        "aggregate": t.aggregate,
        "min_ok": t.min_ok,
    }


ORIGINAL_DIR = "original"   # the original-format README and figures, in the store's folder


def write_all(folder: str, aggregate_how: str | None = None, min_ok: int | None = None,
              plots: bool = True, entries: list[dict] | None = None,
              unreadable: int = 0) -> Table:
    """(Re)make every report file in ``folder`` from its store."""
    path = store.store_path(folder)
    bad = unreadable
    if entries is None:
        entries, bad = store.read(path)
    t = build(entries, aggregate_how, min_ok, bad)
    files, originals, compares = [], [], {}
    original = os.path.join(folder, ORIGINAL_DIR)
    if plots and t.rows:
        from . import plots as plotting
        files = plotting.draw(t, os.path.join(folder, "plots"))
        files = [os.path.relpath(f, folder) for f in files]
        drawn, drawn_compares = plotting.draw_original(t, original)
        originals = [os.path.basename(f) for f in drawn]
        compares = {os.path.basename(f)[:-len("-compare_rdma.png")]: os.path.basename(f)
                    for f in drawn_compares}
    _write(os.path.join(folder, "README.md"), markdown(t, files))
    os.makedirs(original, exist_ok=True)
    # The original's layout: its README beside its figures (results/<date>/ there).
    _write(os.path.join(original, "README.md"),
           original_table(t, datetime.date.today().isoformat(), originals,
                          compare_section(t, compares) if t.rows else ""))
    if os.path.isfile(os.path.join(folder, "original.md")):  # where older reports wrote it
        os.unlink(os.path.join(folder, "original.md"))
    _write(os.path.join(folder, "results.csv"), csv_text(t))
    _write(os.path.join(folder, "manifest.json"),
           json.dumps(manifest(t, entries), indent=2, sort_keys=True) + "\n")
    return t


def _write(path: str, text: str) -> None:
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        f.write(text)
    os.replace(tmp, path)

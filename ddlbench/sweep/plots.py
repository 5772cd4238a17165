"""PNG plots like the original suite's ``plots.py`` (matplotlib, Agg backend: no display).

Per network and task: a grouped bar chart, x = worker counts, one bar per method (error bars:
the std across tries; all-to-all methods in shades of blue, parameter-server methods in shades
of orange; a cell marked for too few successful tries is hatched), and above each group the
best bar's speedup over its own 1-worker throughput, only where the best is told apart from
the others (its median's 95% interval apart from theirs: ``aggregate.ranking``; tied groups
say "tied" under the axis); a line plot of scaling efficiency; and,
where the runs recorded timelines, a stacked bar per method and worker count of where the
iteration goes (compute, exposed communication and waits, the rest).
The original's own figures, in its style and file names, beside the original's results README
(``original/README.md``): ``draw_original``.
"""
from __future__ import annotations

import os
import re

from .. import methods
from .aggregate import (Table, breakdown, predicted_vs_measured, ranking,
                        single_throughputs)


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9.=+-]+", "-", text).strip("-")


def draw(t: Table, folder: str) -> list[str]:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib import cm

    os.makedirs(folder, exist_ok=True)
    for old in os.listdir(folder):  # plots of rows no longer in the store
        if old.endswith(".png"):
            os.unlink(os.path.join(folder, old))
    groups: dict[tuple, list] = {}
    for r in t.rows:
        groups.setdefault((r.network, r.task), []).append(r)
    files = []
    for (network, task), rows in groups.items():
        counts = sorted({n for r in rows for n in r.cells})
        a2a = [r for r in rows if r.architecture != "ps"]
        ps = [r for r in rows if r.architecture == "ps"]
        colours = {}
        for family, members in ((cm.Blues, a2a), (cm.Oranges, ps)):
            for i, r in enumerate(members):
                colours[id(r)] = family(0.45 + 0.5 * (i + 1) / (len(members) + 1))
        first = rows[0]
        title = f"{first.dnn}, batch {first.batch_size} per worker, {first.connection}"
        unit = first.unit or "samples/sec"

        path = os.path.join(folder, f"{_slug(network)}_{_slug(task)}_throughput.png")
        _draw_throughput(plt, t, rows, counts, colours, title, unit, path)
        files.append(path)
        path = os.path.join(folder, f"{_slug(network)}_{_slug(task)}_time.png")
        if draw_time(t, rows, counts, title, path):
            files.append(path)

        path = os.path.join(folder, f"{_slug(network)}_{_slug(task)}_efficiency.png")
        if _draw_efficiency(plt, t, rows, counts, colours, title, path):
            files.append(path)
    files += _scatter(t, folder, plt)
    return files


def _draw_throughput(plt, t: Table, rows: list, counts: list, colours: dict, title: str,
                     unit: str, path: str) -> None:
    """One network and task's bars of throughput per worker count, the best marked."""
    fig, ax = plt.subplots(figsize=(max(6.0, 1.2 + 0.35 * len(rows) * len(counts)), 4.2))
    width = 0.8 / max(1, len(rows))
    for i, r in enumerate(rows):
        xs, ys, errs, hatches = [], [], [], []
        for j, n in enumerate(counts):
            s = r.cells.get(n)
            if s is None or not s.values:
                continue
            xs.append(j - 0.4 + width * (i + 0.5))
            ys.append(s.center)
            errs.append(s.spread)
            hatches.append("//" if s.marked else "")
        bars = ax.bar(xs, ys, width, yerr=errs, capsize=2, label=r.method,
                      color=colours[id(r)], edgecolor="black", linewidth=0.4)
        for bar, hatch in zip(bars, hatches):
            bar.set_hatch(hatch)
    top = ax.get_ylim()[1]
    tied = []
    for j, n in enumerate(counts):
        label = best_label(rows, n)
        if label is None:
            if ranking(rows, n).tied:
                tied.append(str(n))
            continue
        s = label[0].cells[n]
        ax.text(j, s.center + s.spread + 0.02 * top, label[1], ha="center", va="bottom",
                fontsize=8)
    ax.set_ylim(0, top * 1.1)
    ax.set_xticks(range(len(counts)))
    ax.set_xticklabels([str(n) for n in counts])
    ax.set_xlabel(f"# of {t.noun}s")
    ax.set_ylabel(f"Throughput ({unit})")
    ax.set_title(title, fontsize=10)
    # Outside the axes, right of the plot: a legend inside covers the tallest bars.
    ax.legend(fontsize=7, ncol=2 if len(rows) > 8 else 1, loc="upper left",
              bbox_to_anchor=(1.01, 1.0), borderaxespad=0.0)
    notes = []
    if any(s.marked and s.values for r in rows for s in r.cells.values()):
        notes.append("hatched: too few successful tries")
    if tied:
        notes.append(f"no best at {', '.join(tied)} {t.noun}(s): the leaders' 95% "
                     f"intervals overlap")
    if notes:
        ax.text(1.0, -0.14, "; ".join(notes), transform=ax.transAxes, ha="right",
                va="top", fontsize=7)
    ax.grid(axis="y", linestyle=":", linewidth=0.5)
    fig.tight_layout()
    fig.savefig(path, dpi=110, bbox_inches="tight")
    plt.close(fig)


def _draw_efficiency(plt, t: Table, rows: list, counts: list, colours: dict, title: str,
                     path: str) -> bool:
    """One network and task's scaling efficiency per worker count; False (nothing drawn)
    without 1-worker cells to measure it against."""
    curves = []
    for r in rows:
        pts = [(n, r.speedup(n)) for n in counts]
        pts = [(n, 100.0 * s[1]) for n, s in pts if s is not None]
        if pts:
            curves.append((r, pts))
    if not curves:  # no 1-worker cells to measure efficiency against: no empty plot
        return False
    fig, ax = plt.subplots(figsize=(6.0, 4.0))
    for r, pts in curves:
        ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=r.method,
                color=colours[id(r)], linestyle="--" if r.architecture == "ps" else "-")
    ax.axhline(100.0, color="grey", linewidth=0.6, linestyle=":")
    highest = max([ln.get_ydata().max() for ln in ax.get_lines()[:-1]] or [100.0])
    ax.set_xscale("log", base=2)
    ax.set_xticks(counts)
    ax.set_xticklabels([str(n) for n in counts])
    ax.set_xlabel(f"# of {t.noun}s")
    ax.set_ylabel("Scaling efficiency (%)")
    ax.set_ylim(0, max(110.0, 1.1 * float(highest)))
    ax.set_title(title, fontsize=10)
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0),
                  borderaxespad=0.0)
    ax.grid(linestyle=":", linewidth=0.5)
    fig.tight_layout()
    fig.savefig(path, dpi=110, bbox_inches="tight")
    plt.close(fig)
    return True


def best_label(rows: list, n: int) -> tuple | None:
    """(row, text) of the label over the best bar of the group at ``n`` workers: its speedup
    over its own 1-worker throughput; None at 1 worker, without a speedup, or when the best is
    not told apart from another method (``aggregate.ranking``)."""
    if n == 1:
        return None
    rk = ranking(rows, n)
    if rk.best is None or not rk.distinguishable:
        return None
    sp = rk.best.speedup(n)
    return None if sp is None else (rk.best, f"{sp[0]:.1f}x")


TIME_PARTS = (("compute", "compute_ms", "#4C72B0"),
              ("exposed communication and waits", "exposed_ms", "#C44E52"),
              ("other", "other_ms", "#BBBBBB"))


def draw_time(t: Table, rows: list, counts: list, title: str, path: str) -> bool:
    """Where the iteration goes, one stacked bar per method and worker count (grouped by
    worker count): compute, exposed communication and waits, the rest; a method whose
    communication is not observed (DDP, Horovod) is hatched. False (nothing drawn) when no
    cell has a timeline."""
    bars = [(n, r, b) for n in counts for r in rows for b in [breakdown(t, r, n)] if b]
    if not bars:
        return False
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch
    fig, ax = plt.subplots(figsize=(max(6.0, 1.5 + 0.45 * len(bars)), 4.4))
    xs, x, last = [], 0.0, None
    for n, _, _ in bars:
        if last is not None and n != last:
            x += 0.6  # a gap between worker counts
        xs.append(x)
        x, last = x + 1.0, n
    bottom = [0.0] * len(bars)
    for label, attr, colour in TIME_PARTS:
        heights = [getattr(b, attr) for _, _, b in bars]
        drawn = ax.bar(xs, heights, 0.8, bottom=bottom, label=label, color=colour,
                       edgecolor="black", linewidth=0.4)
        for patch, (_, _, b) in zip(drawn, bars):
            if not b.observed:
                patch.set_hatch("//")
        bottom = [a + h for a, h in zip(bottom, heights)]
    ax.set_xticks(xs)
    ax.set_xticklabels([f"{r.method} ({n})" for n, r, _ in bars], rotation=60, ha="right",
                       fontsize=7)
    ax.set_xlim(-1.0, max(xs[-1] + 1.0, 4.0))  # a lone bar stays a bar's width
    ax.set_xlabel(f"method (# of {t.noun}s)")
    ax.set_ylabel("Time per iteration, slowest rank (ms)")
    ax.set_title(title, fontsize=10)
    handles = [Patch(facecolor=colour, edgecolor="black", linewidth=0.4, label=label)
               for label, _, colour in TIME_PARTS]
    if any(not b.observed for _, _, b in bars):
        handles.append(Patch(facecolor="white", edgecolor="black", linewidth=0.4, hatch="//",
                             label="communication not observed:\nexposed = waits only"))
    ax.legend(handles=handles, fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0),
              borderaxespad=0.0)
    ax.grid(axis="y", linestyle=":", linewidth=0.5)
    fig.tight_layout()
    fig.savefig(path, dpi=110, bbox_inches="tight")
    plt.close(fig)
    return True


# ----------------------------------------------------------- the original's own figures
#
# The original's plots.py (HKBU-HPML/ddl-benchmarks) drew, per connection and task, one
# grouped bar chart '<dnn>_<bs>-rdma<r>.png' beside its results README: x = number of GPUs
# (its 4, 8, 16, 32; no 1-GPU group), one bar per method with the std as error bar, all-to-all
# methods orange (#F55a11) and parameter-server ones yellow (#F1B111), told apart by a hatch per
# method, black edges, above each group the largest speedup over the single-GPU throughput
# ('%.1fx', rotated), the legend upper left, title '<DNN> (BS=<bs>) on <connection>', labels
# '# of GPUs' and 'Throughput (Samples per second)', dotted grid, font size 14. Its
# compare_rdma() drew nothing: it printed, per method and task, throughput on 100GbE over
# 10GbE and on 100GbIB over 100GbE. Here that comparison is a figure too.

# the original's colours by architecture; each method's hatch is its declaration's
# (``Method.hatch``: the original's for its seven methods)
COLOURS = {"a2a": "#F55a11", "ps": "#F1B111"}
_SPARE_HATCHES = ["xx", "--", "||", "\\\\", "//", "...", "x", "o"]
# compare_rdma's order of its connections, slowest first: 10GbE, 100GbE, 100GbIB.
RDMA_ORDER = {"rdma0": 0, "rdma2": 1, "rdma1": 2}


def original_task_names(t: Table) -> dict[str, str]:
    """The suite's task key -> the original's task name (``resnet50_64``); where two of the
    sweep's tasks share a model and batch size, their own keys tell them apart."""
    bases: dict[str, set] = {}
    for r in t.rows:
        bases.setdefault(r.original_task, set()).add(r.task)
    return {r.task: r.original_task if len(bases[r.original_task]) == 1 else _slug(r.task)
            for r in t.rows}


def original_groups(t: Table) -> list[tuple[str, list]]:
    """(file name, rows) per network and task in table order: the original's
    ``<task>-rdma<r>.png`` on its rdma networks, ``<task>-<network>.png`` on the others."""
    names = original_task_names(t)
    groups: dict[str, list] = {}
    for r in t.rows:
        groups.setdefault(f"{names[r.task]}-{_slug(r.network)}.png", []).append(r)
    return list(groups.items())


def original_series(rows: list) -> dict[str, list[tuple[int, float, float]]]:
    """{method as the original names it: [(workers, mean, std), ...]}: what one original-style
    figure plots. Worker counts above 1 (the original had no 1-GPU group); a cell with no
    successful try or too few (marked in the tables) is left out; a method with nothing left is
    not in the figure."""
    out = {}
    for r in rows:
        pts = [(n, s.center, s.spread) for n, s in sorted(r.cells.items())
               if n != 1 and s.values and not s.marked]
        if pts:
            out[r.original_method] = pts
    return out


def original_singles(t: Table) -> dict[str, float]:
    """The original's task name -> its one 1-GPU throughput (``single_throughputs``): the
    table's 1-GPU column and the base of the figures' speedup labels."""
    names = original_task_names(t)
    return single_throughputs(t, task_of=lambda r: names[r.task])


def original_speedups(rows: list, single: float | None) -> dict[int, tuple[str, float]]:
    """{workers: (method, speedup)}: the label above each group, as the original's
    record_rects: the largest of the group's plotted throughputs over the task's one 1-GPU
    throughput ``single`` (``original_singles``; None: no labels)."""
    best: dict[int, tuple[str, float]] = {}
    if not single:
        return best
    for method, pts in original_series(rows).items():
        for n, mean, _ in pts:
            if n not in best or mean / single > best[n][1]:
                best[n] = (method, mean / single)
    return best


def _networks_in_compare_order(t: Table) -> list[str]:
    order = list(dict.fromkeys(r.network for r in t.rows))
    return sorted(order, key=lambda n: (0, RDMA_ORDER[n]) if n in RDMA_ORDER
                  else (1, order.index(n)))


def networks_by_task(t: Table) -> dict[str, list[str]]:
    """The original's task name -> the networks with something to plot for it (compare
    order: the original's 10GbE, 100GbE, 100GbIB, then the other networks in table order)."""
    names = original_task_names(t)
    out: dict[str, list[str]] = {names[r.task]: [] for r in t.rows}  # tasks in table order
    for net in _networks_in_compare_order(t):
        for r in t.rows:
            nets = out[names[r.task]]
            if r.network == net and net not in nets and original_series([r]):
                nets.append(net)
    return out


def compare_series(t: Table) -> dict[str, list[tuple[str, str, dict]]]:
    """The original's compare_rdma: {task: [(network a, network b, {method: [(workers,
    thr_b / thr_a), ...]}), ...]}, each network over the one before it (networks_by_task's
    order), per method (same label and engine on both) and worker count where both cells
    have enough successful tries. Only tasks with results on two or more networks. (The
    original also dropped its largest worker count here; all are kept.)"""
    names = original_task_names(t)
    rows = {(r.network, names[r.task], r.label, r.engine): r for r in t.rows}
    out = {}
    for task, nets in networks_by_task(t).items():
        if len(nets) < 2:
            continue
        pairs = []
        for a, b in zip(nets, nets[1:]):
            series = {}
            for r in t.rows:
                if r.network != b or names[r.task] != task:
                    continue
                other = rows.get((a, task, r.label, r.engine))
                if other is None:
                    continue
                mine = dict((n, v) for n, v, _ in original_series([r]).get(r.original_method, []))
                base = dict((n, v) for n, v, _ in
                            original_series([other]).get(other.original_method, []))
                pts = [(n, mine[n] / base[n]) for n in sorted(mine) if base.get(n)]
                if pts:
                    series[r.original_method] = pts
            pairs.append((a, b, series))
        if any(series for _, _, series in pairs):
            out[task] = pairs
    return out


def _style(rows: list) -> dict[str, tuple[str, str]]:
    """method name -> (colour, hatch), by the row's method id, whatever its label: the
    original's colour of its architecture (``COLOURS``) and the method's declared hatch
    (``Method.hatch``: the original's METHOD_HACHES for its seven methods). A second row of
    one method (other settings, told apart by their labels), or a method without a hatch,
    gets a spare hatch."""
    out, spare, hatched = {}, iter(_SPARE_HATCHES * 4), set()
    for r in rows:
        if r.original_method in out:
            continue
        known = r.method_id in methods.names()
        hatch = methods.lookup(r.method_id).hatch if known else None
        if hatch is None or r.method_id in hatched:
            hatch = next(spare, "")
        hatched.add(r.method_id)
        out[r.original_method] = (COLOURS["ps" if r.architecture == "ps" else "a2a"], hatch)
    return out


def _bars(ax, series: dict, style: dict, legend_inside: bool = True) -> tuple[list, dict]:
    """The original's grouped bars on ax: returns (worker counts, {(method, workers): bar})."""
    counts = sorted({n for pts in series.values() for n, *_ in pts})
    width = 0.9 / max(1, len(series))
    where = {}
    for i, (method, pts) in enumerate(series.items()):
        xs = [counts.index(p[0]) - 0.45 + width * (i + 0.5) for p in pts]
        errs = [p[2] for p in pts] if all(len(p) > 2 for p in pts) else None
        colour, hatch = style[method]
        bars = ax.bar(xs, [p[1] for p in pts], width, yerr=errs, color=colour,
                      edgecolor="black", hatch=hatch, ecolor="black", capsize=2, label=method)
        for p, bar in zip(pts, bars):
            where[(method, p[0])] = bar
    ax.grid(linestyle=":")
    ax.set_xticks(range(len(counts)))
    ax.set_xticklabels([str(n) for n in counts])
    if legend_inside:
        ax.legend(loc=2, ncol=1, fontsize="x-large")
    else:  # ratios near 1 fill the height: the legend goes right of the plot
        ax.legend(loc=2, ncol=1, fontsize="large", bbox_to_anchor=(1.01, 1.0),
                  borderaxespad=0.0)
    return counts, where


def _font(ax, size: float = 14.0) -> None:
    for item in [ax.title, ax.xaxis.label, ax.yaxis.label] + ax.get_xticklabels() \
            + ax.get_yticklabels():
        item.set_fontsize(size)


# The original's plots.py: fixed tops per task (its figures' scales; bert_8 is BERT-Large at
# batch 8, bert_base_64 BERT-Base at 64, resnet50_64 ResNet-50 at 64).
ORIGINAL_YLIMITS = {"resnet50_64": 9000.0, "bert_8": 450.0, "bert_base_64": 5800.0}


def original_ylim(task: str, top: float) -> float:
    """The top of an original-style figure of ``task`` (the original's task name), whose
    highest bar with its error reaches ``top``: the original's fixed limit for its three tasks
    (``ORIGINAL_YLIMITS``), where the bars fit under it (the original cut them; here the
    figure then grows as for the other tasks), else ``top * 1.3`` (room for the legend)."""
    fixed = ORIGINAL_YLIMITS.get(task)
    return fixed if fixed is not None and top <= fixed else top * 1.3


def draw_original(t: Table, folder: str) -> tuple[list[str], list[str]]:
    """The original's figures into ``folder`` (emptied of old ones first): per network and
    task ``<task>-rdma<r>.png`` (``<task>-<network>.png`` elsewhere), and per task with
    results on two or more networks ``<task>-compare_rdma.png``. Returns (per-network files,
    comparison files); a group with nothing to plot makes no file."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    os.makedirs(folder, exist_ok=True)
    for old in os.listdir(folder):
        if old.endswith(".png"):
            os.unlink(os.path.join(folder, old))
    files, compares = [], []
    names, singles = original_task_names(t), original_singles(t)
    for name, rows in original_groups(t):
        series = original_series(rows)
        if not series:
            continue
        fig, ax = plt.subplots()
        counts, where = _bars(ax, series, _style(rows))
        top = max(p[1] + p[2] for pts in series.values() for p in pts)
        single = singles.get(names[rows[0].task])
        for n, (method, sp) in original_speedups(rows, single).items():
            bar = where.get((method, n))
            if bar is not None:  # above its error bar (the original: at 1.03 x the bar)
                err = dict((p[0], p[2]) for p in series[method])[n]
                ax.text(bar.get_x() + bar.get_width() / 2.0,
                        max(bar.get_height() * 1.03, bar.get_height() + err + 0.01 * top),
                        f"{sp:.1f}x", ha="center", va="bottom", rotation=90)
        ax.set_ylim(0, original_ylim(names[rows[0].task], top))
        first = rows[0]
        ax.set_title(f"{first.dnn} (BS={first.batch_size}) on {first.connection}")
        ax.set_xlabel(f"# of {t.noun}s")
        ax.set_ylabel("Throughput (Samples per second)")
        _font(ax)
        path = os.path.join(folder, name)
        fig.savefig(path, bbox_inches="tight")
        plt.close(fig)
        files.append(path)

    connection = {r.network: r.connection for r in t.rows}
    first_of = {}
    for r in t.rows:
        first_of.setdefault(names[r.task], r)
    for task, pairs in compare_series(t).items():
        pairs = [p for p in pairs if p[2]]
        fig, axes = plt.subplots(len(pairs), 1, figsize=(6.4, 4.8 * len(pairs)), squeeze=False,
                                 gridspec_kw={"hspace": 0.35})
        style = _style([r for r in t.rows if names[r.task] == task])
        first = first_of[task]
        for ax, (a, b, series) in zip(axes[:, 0], pairs):
            _bars(ax, series, style, legend_inside=False)
            ax.axhline(1.0, color="black", linewidth=0.8, zorder=0)
            top = max(v for pts in series.values() for _, v in pts)
            ax.set_ylim(0, max(1.0, top) * 1.3)
            ax.set_title(f"{first.dnn} (BS={first.batch_size}): {connection[b]} over "
                         f"{connection[a]}")
            ax.set_xlabel(f"# of {t.noun}s")
            ax.set_ylabel("Throughput ratio")
            _font(ax)
        path = os.path.join(folder, f"{task}-compare_rdma.png")
        fig.savefig(path, bbox_inches="tight")
        plt.close(fig)
        compares.append(path)
    return files, compares


def _scatter(t: Table, folder: str, plt) -> list[str]:
    """A calibrated sweep's predicted vs measured throughput, one point per cell (a2a blue,
    PS orange), the diagonal and +-15% beside it."""
    pairs = [(measured, line["throughput"], r.architecture)
             for r, _, measured, line in predicted_vs_measured(t)
             if measured is not None and line.get("throughput") is not None]
    if not pairs:
        return []
    fig, ax = plt.subplots(figsize=(5.0, 5.0))
    for arch, colour in (("a2a", "tab:blue"), ("ps", "tab:orange")):
        xs = [m for m, _, a in pairs if (a == "ps") == (arch == "ps")]
        ys = [p for m, p, a in pairs if (a == "ps") == (arch == "ps")]
        if xs:
            ax.scatter(xs, ys, s=18, color=colour, label=arch.upper())
    top = 1.1 * max(max(m, p) for m, p, _ in pairs)
    ax.plot([0, top], [0, top], color="black", linewidth=0.8)
    for f in (0.85, 1.15):
        ax.plot([0, top], [0, top * f], color="grey", linewidth=0.5, linestyle="--")
    ax.set_xlim(0, top)
    ax.set_ylim(0, top)
    ax.set_xlabel("measured (samples/s, all workers)")
    ax.set_ylabel("predicted")
    ax.set_title("Predicted vs measured (dashed: +-15%)")
    ax.legend(loc="upper left")
    fig.tight_layout()
    path = os.path.join(folder, "predicted_vs_measured.png")
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return [path]

"""PNG plots like the original suite's ``plots.py`` (matplotlib, Agg backend: no display).

Per network and task: a grouped bar chart, x = worker counts, one bar per method (error bars:
the std across tries; all-to-all methods in shades of blue, parameter-server methods in shades
of orange; a cell marked for too few successful tries is hatched), and above each group the
best bar's speedup over its own 1-worker throughput; and a line plot of scaling efficiency.
"""
from __future__ import annotations

import os
import re

from .aggregate import Table


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
        for j, n in enumerate(counts):
            if n == 1:
                continue
            best = None
            for r in rows:
                s = r.cells.get(n)
                if s is None or not s.values or s.marked:
                    continue
                if best is None or s.center > best[1].center:
                    best = (r, s)
            if best is None:
                continue
            sp = best[0].speedup(n)
            if sp is None:
                continue
            ax.text(j, best[1].center + best[1].spread + 0.02 * top, f"{sp[0]:.1f}x",
                    ha="center", va="bottom", fontsize=8)
        ax.set_ylim(0, top * 1.1)
        ax.set_xticks(range(len(counts)))
        ax.set_xticklabels([str(n) for n in counts])
        ax.set_xlabel(f"# of {t.noun}s")
        ax.set_ylabel(f"Throughput ({unit})")
        ax.set_title(title, fontsize=10)
        # Outside the axes, right of the plot: a legend inside covers the tallest bars.
        ax.legend(fontsize=7, ncol=2 if len(rows) > 8 else 1, loc="upper left",
                  bbox_to_anchor=(1.01, 1.0), borderaxespad=0.0)
        if any(s.marked and s.values for r in rows for s in r.cells.values()):
            ax.text(1.0, -0.14, "hatched: too few successful tries", transform=ax.transAxes,
                    ha="right", va="top", fontsize=7)
        ax.grid(axis="y", linestyle=":", linewidth=0.5)
        fig.tight_layout()
        path = os.path.join(folder, f"{_slug(network)}_{_slug(task)}_throughput.png")
        fig.savefig(path, dpi=110, bbox_inches="tight")
        plt.close(fig)
        files.append(path)

        curves = []
        for r in rows:
            pts = [(n, r.speedup(n)) for n in counts]
            pts = [(n, 100.0 * s[1]) for n, s in pts if s is not None]
            if pts:
                curves.append((r, pts))
        if not curves:  # no 1-worker cells to measure efficiency against: no empty plot
            continue
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
        path = os.path.join(folder, f"{_slug(network)}_{_slug(task)}_efficiency.png")
        fig.savefig(path, dpi=110, bbox_inches="tight")
        plt.close(fig)
        files.append(path)
    return files

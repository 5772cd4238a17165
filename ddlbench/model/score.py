"""Which method is fastest, scored: the model's answer to the suite's question against the
measured (or published) answer, group by group.

A *group* is one question a user asks: one model, network and worker count (and batch), with
the methods that were measured there. For each group the model's pick is the method it
predicts fastest; it is scored

- **exact**: the pick is the measured best (where several methods tie for the highest
  prediction, the pick is the tied method measured slowest: a tie-break earns nothing);
- **within**: the pick's *measured* throughput is at least (1 - ``WITHIN``) of the measured
  best's (2%: a user who follows the model loses at most 2%);
- **tau**: Kendall's tau-b between the predicted and measured throughputs of the group's
  methods (1: the same order; 0: no relation; -1: reversed), ties counted as tau-b counts
  them.

``best_method`` scores every group and sums: groups, exact, within, and the median and mean
tau over the groups that have one; beside them, the groups where the model's highest
predictions tie, and the counts had each tie broken in the model's favour (exact_tied,
within_tied), so that neither reading is hidden. The median |error| of throughput stays beside it in every
report; this is the headline because it is the question. Pure Python, no torch.

**Interval ties** (``overlaps``, ``interval_ties``): where each prediction carries an interval
(``ddlbench.model.cell.Answer.interval``), the methods whose interval overlaps the pick's
are tied with it: the model cannot tell them apart (``predict --advise`` marks them so).
``interval_ties`` counts the groups whose measured best lies among the pick and its ties.
"""
from __future__ import annotations

import statistics

# a pick is "within" when its measured throughput is at least (1 - WITHIN) of the best's
WITHIN = 0.02
# predictions this close to the highest are the same answer (a PS method on one machine is
# predicted as its all-reduce analogue, exactly): the model cannot tell them apart, so its pick
# among them is scored as the one measured slowest (no credit for a lucky tie-break)
TIE = 1e-9


def kendall_tau(xs, ys) -> float | None:
    """Kendall's tau-b of two equally long sequences: (concordant - discordant) pairs over
    sqrt((n0 - ties in x) (n0 - ties in y)), n0 = n (n - 1) / 2. None when it is undefined
    (fewer than two items, or one sequence constant)."""
    xs, ys = list(xs), list(ys)
    if len(xs) != len(ys):
        raise ValueError("kendall_tau needs two sequences of the same length")
    n = len(xs)
    concordant = discordant = tied_x = tied_y = 0
    for i in range(n):
        for j in range(i + 1, n):
            dx, dy = xs[i] - xs[j], ys[i] - ys[j]
            if dx == 0 and dy == 0:
                tied_x += 1
                tied_y += 1
            elif dx == 0:
                tied_x += 1
            elif dy == 0:
                tied_y += 1
            elif (dx > 0) == (dy > 0):
                concordant += 1
            else:
                discordant += 1
    n0 = n * (n - 1) // 2
    denominator = ((n0 - tied_x) * (n0 - tied_y)) ** 0.5
    if not denominator:
        return None
    return (concordant - discordant) / denominator


def _top(values: dict) -> str:
    """The key of the highest value; ties go to the first key in sorted order (stable)."""
    return max(sorted(values), key=lambda k: values[k])


def overlaps(a, b) -> bool:
    """Whether the intervals ``a`` and ``b`` ([low, high] each) share a point (touching
    counts)."""
    return a[0] <= b[1] and b[0] <= a[1]


def interval_ties(groups: dict) -> dict:
    """``groups``: key -> (predicted, intervals, measured), each method -> throughput (an
    interval: [low, high]). Per group the pick (``group_score``'s) and the methods whose
    interval overlaps the pick's (the pick among them: ``tied``); ``best_tied`` counts the
    groups whose measured best is among them. The result: groups, best_tied, tied_median
    (the median count of tied methods, the pick included) and methods_median (of the groups'
    methods), rows."""
    rows = []
    for key in sorted(groups, key=str):
        predicted, intervals, measured = groups[key]
        got = group_score(predicted, measured)
        if got is None:
            continue
        pick = intervals[got["pick"]]
        tied = [m for m in got["methods"] if overlaps(intervals[m], pick)]
        rows.append({"group": key, "pick": got["pick"], "best": got["best"], "tied": tied,
                     "methods": got["methods"], "best_tied": got["best"] in tied})
    return {"groups": len(rows), "best_tied": sum(r["best_tied"] for r in rows),
            "tied_median": statistics.median(len(r["tied"]) for r in rows) if rows else None,
            "methods_median": statistics.median(len(r["methods"]) for r in rows) if rows
            else None, "rows": rows}


def group_score(predicted: dict, measured: dict, within: float = WITHIN) -> dict | None:
    """One group's score over the methods in both ``predicted`` and ``measured`` (method ->
    throughput): pick (predicted best), best (measured best), exact, within, shortfall (1 -
    the pick's measured throughput / the best's), tau, methods. None with fewer than two
    methods (no question to answer)."""
    names = sorted(set(predicted) & set(measured))
    if len(names) < 2:
        return None
    top = max(predicted[m] for m in names)
    tied = [m for m in names if predicted[m] >= top * (1 - TIE)]
    pick = min(tied, key=lambda m: (measured[m], m))
    lucky = max(tied, key=lambda m: (measured[m], m))
    best = _top({m: measured[m] for m in names})

    def short(m):
        return 1 - measured[m] / measured[best] if measured[best] else 0.0
    return {"pick": pick, "best": best, "exact": pick == best,
            "within": short(pick) <= within + 1e-12, "shortfall": short(pick),
            "tied": tied, "exact_tied": lucky == best,
            "within_tied": short(lucky) <= within + 1e-12,
            "tau": kendall_tau([predicted[m] for m in names], [measured[m] for m in names]),
            "methods": names}


def best_method(groups: dict, within: float = WITHIN) -> dict:
    """Score ``groups`` (key -> (predicted, measured), each method -> throughput). The result:
    groups (how many were scored), exact, within (counts), tau_median, tau_mean (None when no
    group has a tau), within_level, and rows (key, the group's score) in key order. Keys are
    kept as given (tuples or strings)."""
    rows = []
    for key in sorted(groups, key=str):
        predicted, measured = groups[key]
        got = group_score(predicted, measured, within)
        if got is not None:
            rows.append({"group": key, **got})
    taus = [r["tau"] for r in rows if r["tau"] is not None]
    return {"groups": len(rows), "exact": sum(r["exact"] for r in rows),
            "within": sum(r["within"] for r in rows), "within_level": within,
            "exact_tied": sum(r["exact_tied"] for r in rows),
            "within_tied": sum(r["within_tied"] for r in rows),
            "tied_groups": sum(len(r["tied"]) > 1 for r in rows),
            "tau_median": statistics.median(taus) if taus else None,
            "tau_mean": statistics.fmean(taus) if taus else None, "rows": rows}


def grouped(rows, key, method: str = "method", predicted: str = "predicted",
            measured: str = "measured") -> dict:
    """``best_method``'s input from flat rows (dicts): ``key(row)`` names the group; each row
    gives its method, predicted and measured throughput under the names given. Rows missing
    either figure are left out."""
    out: dict = {}
    for r in rows:
        p, m = r.get(predicted), r.get(measured)
        if p is None or m is None:
            continue
        pair = out.setdefault(key(r), ({}, {}))
        pair[0][r[method]] = p
        pair[1][r[method]] = m
    return out


def headline(score: dict, against: str = "measured") -> str:
    """One line: the pick's score (exact, within) and the median Kendall's tau."""
    n = score["groups"]
    if not n:
        return "best method: no group with two methods or more to score"
    tau = score["tau_median"]
    ties = (f" ({score['exact_tied']}/{n} and {score['within_tied']}/{n} where the model's "
            f"ties in {score['tied_groups']} groups break luckily)" if score["tied_groups"]
            else "")
    return (f"best method: the model picks the {against} best in {score['exact']}/{n} groups "
            f"exactly, {score['within']}/{n} within {100 * score['within_level']:g}% of the "
            f"best's throughput{ties}; median Kendall's tau "
            f"{'-' if tau is None else f'{tau:.2f}'}")

"""``python -m ddlbench.timeline``: a merged trace summarised (each rank's mean overlap metrics,
the longest exposed communication spans) or two traces compared side by side (docs/DESIGN.md
section 8).

    python -m ddlbench.timeline trace.json [--top N] [--json]
    python -m ddlbench.timeline wfbp.json fusion.json [--per-rank] [--labels X,Y] [--json]

Metrics are ``overlap``'s means over the recorded iterations, in the JSON form in seconds (as in
the run record), on the console in milliseconds; spans in microseconds (as in the trace). Bad
input is one line on stderr and exit code 2.
"""
from __future__ import annotations

import json
import os
import sys

from ..errors import EXIT_USAGE, ArgumentParser, UsageError
from . import COMM, exposed_spans, overlap, read_trace

PROG = "ddlbench.timeline"

# (key in overlap's means, label, unit on the console)
METRICS = (("iteration_s", "iteration", "ms"), ("compute_s", "compute", "ms"),
           ("wait_s", "wait", "ms"), ("comm_s", "communication", "ms"),
           ("hidden_s", "hidden", "ms"), ("exposed_s", "exposed", "ms"),
           ("overlap", "overlap", "%"), ("idle_s", "idle", "ms"),
           ("iterations", "iterations", ""))


# ----------------------------------------------------------------------------- pure: the data

def summarize(obj, top: int = 10, what: str | None = None) -> dict:
    """One trace's summary (``obj`` the trace-event object, or a file's path: read one event
    at a time): every rank's mean metrics and iterations, the slowest rank (longest mean
    iteration), the ``top`` longest exposed communication spans of all workers (longest first;
    among equals, earlier, then the lower rank; a parameter server's process, without
    iterations, is listed with none and its spans are not a worker's exposed time). A
    UsageError when no rank has an iteration span. ``what`` names the trace (the path, else
    "the trace")."""
    what = what or ("the trace" if isinstance(obj, dict) else str(obj))
    ranks, spans, count = [], [], 0
    per_rank, meta = read_trace(obj, what)
    for r in per_rank:
        m = overlap(r["events"])
        ranks.append({"rank": r["rank"], "name": r["name"],
                      "iterations": m["iterations"] if m else 0,
                      "mean": m["mean"] if m else None})
        if m:   # a parameter server's process has no iterations, nor compute to hide behind
            # A rank's ``top`` longest hold all of its spans among the ``top`` longest of all.
            spans += [{"rank": r["rank"], **s}
                      for s in exposed_spans(r["events"], top if top >= 0 else None)]
            count += sum(1 for e in r["events"] if e[1] == COMM and e[4] is not None)
    measured = [r for r in ranks if r["mean"] is not None]
    if not measured:
        raise UsageError(f"{what} has no iteration spans (cat \"iteration\"): nothing to measure")
    spans.sort(key=lambda s: (-s["exposed_us"], s["start_us"]))
    return {"trace": what, "metadata": meta if isinstance(meta, dict) else {},
            "slowest_rank": max(measured, key=lambda r: r["mean"]["iteration_s"])["rank"],
            "ranks": ranks, "comm_spans": count, "exposed": spans[:top]}


def _value(row: dict | None, key: str):
    if row is None or row["mean"] is None:
        return None
    return row["iterations"] if key == "iterations" else row["mean"][key]


def _side_by_side(a: dict | None, b: dict | None) -> dict:
    out = {}
    for key, _, _ in METRICS:
        va, vb = _value(a, key), _value(b, key)
        both = va is not None and vb is not None
        out[key] = {"a": va, "b": vb, "diff": vb - va if both else None,
                    "ratio": vb / va if both and va != 0 else None}
    return out


def compare(a: dict, b: dict, labels=("A", "B"), per_rank: bool = False) -> dict:
    """Two summaries side by side: each metric of each one's slowest rank (and, with
    ``per_rank``, of each rank of either) in A, in B, B-A and B/A (None where a side has no
    value, or A is 0)."""
    by_rank = [{}, {}]      # each side's first row of each rank (a look-up: linear in ranks)
    for side, s in zip(by_rank, (a, b)):
        for r in s["ranks"]:
            side.setdefault(r["rank"], r)

    def row(s, rank):
        return by_rank[s is b].get(rank)

    out = {"labels": list(labels), "traces": [a["trace"], b["trace"]],
           "slowest": {"ranks": [a["slowest_rank"], b["slowest_rank"]],
                       "metrics": _side_by_side(row(a, a["slowest_rank"]),
                                                row(b, b["slowest_rank"]))}}
    if per_rank:
        ranks = list(dict.fromkeys([r["rank"] for r in a["ranks"]] +
                                   [r["rank"] for r in b["ranks"]]))
        out["per_rank"] = [{"rank": k, "metrics": _side_by_side(row(a, k), row(b, k))}
                           for k in ranks]
    return out


# ---------------------------------------------------------------------------- pure: the text

def _fmt(key: str, v, signed: bool = False) -> str:
    if v is None:
        return "-"
    if key == "iterations":
        return f"{v:+d}" if signed else str(v)
    scale = 100 if key == "overlap" else 1e3
    return f"{v * scale:+.3f}" if signed else f"{v * scale:.3f}"


def _table(header: list[str], rows: list[list[str]], left: int = 1) -> list[str]:
    """The first ``left`` columns left-aligned, the others right-aligned."""
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    return ["  ".join(c.ljust(w) if i < left else c.rjust(w)
                      for i, (c, w) in enumerate(zip(r, widths))).rstrip()
            for r in [header, *rows]]


def meta_line(s: dict) -> str:
    """The trace's metadata in one line: its run, its clock, each rank's offset to rank 0's
    clock and the offset's uncertainty."""
    meta = dict(s["metadata"])
    clock = meta.pop("clock", None)
    offsets = meta.pop("offsets_us", None) or {}
    uncertainty = meta.pop("uncertainty_us", None) or {}
    parts = [f"{len(s['ranks'])} rank{'s' if len(s['ranks']) != 1 else ''}"]
    if meta:
        parts.append(", ".join(f"{k}={v}" for k, v in meta.items()))
    if clock:
        parts.append(f"clock: {clock}")
    if isinstance(offsets, dict) and offsets:
        unc = uncertainty if isinstance(uncertainty, dict) else {}
        parts.append("offsets to rank 0: " + ", ".join(
            f"rank {k} {v:+.1f} us" + (f" (+-{unc[k]:.1f})" if isinstance(unc.get(k), (int, float))
                                       else "")
            if isinstance(v, (int, float)) else f"rank {k} {v}" for k, v in offsets.items()))
    return f"{s['trace']}: " + "; ".join(parts)


def _tensor(args) -> str:
    args = args or {}
    for k in ("tensor", "names", "name", "key"):
        if args.get(k) is not None:
            return str(args[k])
    return "-"


def format_summary(s: dict, top: int) -> str:
    lines = [meta_line(s), ""]
    header = ["rank"] + [f"{label} {unit}".strip() for _, label, unit in METRICS]
    rows = []
    for r in s["ranks"]:
        rows.append([r["name"]] + [_fmt(k, _value(r, k) if k != "iterations"
                                        else r["iterations"]) for k, _, _ in METRICS]
                    + (["<- slowest"] if r["rank"] == s["slowest_rank"] else [""]))
    lines += _table(header + [""], rows)
    lines.append("")
    n, total = len(s["exposed"]), s["comm_spans"]
    if total == 0:
        lines.append("No communication spans in the trace.")
        return "\n".join(lines)
    lines.append(f"Longest exposed communication ({n} of {total} spans, all ranks; "
                 f"--top {top}):")
    rows = [[str(x["rank"]), str(x["name"]), str(x["thread"]), _tensor(x["args"]),
             str((x["args"] or {}).get("bytes", "-")), f"{x['duration_us'] / 1e3:.3f}",
             f"{x['exposed_us'] / 1e3:.3f}"] for x in s["exposed"]]
    lines += _table(["rank", "name", "thread", "tensor", "bytes", "duration ms", "exposed ms"],
                    rows, left=4)
    return "\n".join(lines)


def format_compare(c: dict) -> str:
    la, lb = c["labels"]
    ra, rb = c["slowest"]["ranks"]
    lines = [f"A = {la} (slowest rank {ra}), B = {lb} (slowest rank {rb})"]

    def block(title, metrics):
        rows = [[f"{label} {unit}".strip()] + [_fmt(k, metrics[k]["a"]), _fmt(k, metrics[k]["b"]),
                                              _fmt(k, metrics[k]["diff"], signed=True),
                                              "-" if metrics[k]["ratio"] is None
                                              else f"{metrics[k]['ratio']:.3f}"]
                for k, label, unit in METRICS]
        return ["", *_table([title, la, lb, "B-A", "B/A"], rows)]

    lines += block("slowest rank", c["slowest"]["metrics"])
    for r in c.get("per_rank", []):
        lines += block(f"rank {r['rank']}", r["metrics"])
    return "\n".join(lines)


# ----------------------------------------------------------------------------- the command

def parse_args(argv):
    p = ArgumentParser(prog=f"python -m {PROG}", raise_errors=True,
                       description="Summarise a merged timeline trace (--timeline PATH), or "
                                   "compare two side by side.")
    p.add_argument("traces", nargs="+", metavar="TRACE",
                   help="one trace to summarise, or two (A B) to compare")
    p.add_argument("--json", action="store_true", help="print one JSON object instead")
    p.add_argument("--top", type=int, default=None, metavar="N",
                   help="exposed communication spans to list (10; one trace)")
    p.add_argument("--per-rank", action="store_true",
                   help="compare every rank, not only each trace's slowest (two traces)")
    p.add_argument("--labels", default=None, metavar="X,Y",
                   help="names of the two traces (their file names)")
    args = p.parse_args(argv)
    if len(args.traces) > 2:
        raise UsageError(f"give one trace to summarise or two to compare, got "
                         f"{len(args.traces)}")
    if len(args.traces) == 1:
        for flag, given in (("--per-rank", args.per_rank), ("--labels", args.labels)):
            if given:
                raise UsageError(f"{flag} compares two traces; give two")
        if args.top is not None and args.top < 0:
            raise UsageError(f"--top must be >= 0, got {args.top}")
    else:
        if args.top is not None:
            raise UsageError("--top lists one trace's spans; it has no effect when comparing")
        if args.labels is not None:
            labels = args.labels.split(",")
            if len(labels) != 2 or not all(x.strip() for x in labels):
                raise UsageError(f"--labels takes two names, X,Y; got {args.labels!r}")
            args.labels = [x.strip() for x in labels]
    return args


def _labels(paths) -> list[str]:
    names = [os.path.basename(p) or p for p in paths]
    return names if names[0] != names[1] else list(paths)


def main(argv=None) -> int:
    try:
        args = parse_args(sys.argv[1:] if argv is None else argv)
        summaries = [summarize(p, 10 if args.top is None else args.top, p)
                     for p in args.traces]
        if len(summaries) == 1:
            s = summaries[0]
            text = json.dumps(s, indent=2) if args.json \
                else format_summary(s, 10 if args.top is None else args.top)
        else:
            c = compare(*summaries, labels=args.labels or _labels(args.traces),
                        per_rank=args.per_rank)
            text = json.dumps(c, indent=2) if args.json else format_compare(c)
    except UsageError as e:
        print(f"{PROG}: error: {e}", file=sys.stderr, flush=True)
        return EXIT_USAGE
    except RecursionError:  # a value nested deeper than printing it goes (the decoder's limit)
        print(f"{PROG}: error: {' or '.join(args.traces)}: values nested too deeply to print",
              file=sys.stderr, flush=True)
        return EXIT_USAGE
    print(text)
    return 0

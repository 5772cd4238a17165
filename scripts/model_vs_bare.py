"""The model's committed predictions against paired runs, as ratios to the bare loop.

A run of ``ddlbench.overhead --nworkers P --json M.json`` times each method round by round
beside a bare loop (forward, backward, step; no communication) on the same workers; its
``method/bare`` ratio is the method's throughput at the run's own pace. ``predict --output``
writes ``vs_bare`` (``ddlbench.model.cell.alone_s`` over the iteration): the same ratio as the
model has it. This script sets them side by side, per model and method, with the median
|error| (predicted / measured - 1) and the ratios between methods the issue's bars name.

    PYTHONPATH=. .venv/bin/python scripts/model_vs_bare.py \\
        --predictions docs/predictions/paired-*.json --measured run-r18.json run-bt.json

Only the predictions' files are read for the model (committed before the runs: the script
recomputes nothing), and only methods present in both. Bad input: one line, a non-zero exit."""
from __future__ import annotations

import argparse
import json
import statistics
import sys

PAIRS = (("zero", "fsdp2"), ("zero", "ddp"), ("hier", "fusion"), ("localsgd", "ddp"))


def _load(path: str) -> dict:
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError) as e:
        raise SystemExit(f"model_vs_bare: cannot read {path}: {e}")


def predicted(paths) -> dict:
    """(model, method) -> the predicted ratio to the bare loop."""
    out = {}
    for path in paths:
        data = _load(path)
        for p in data.get("predictions", []):
            if "vs_bare" not in p:
                raise SystemExit(f"model_vs_bare: {path} has no vs_bare (written by an older "
                                 f"predict)")
            out[(data["model"], p["method"])] = p["vs_bare"]
    return out


def measured(paths) -> dict:
    """(model, method) -> (median method/bare, its interval or None)."""
    out = {}
    for path in paths:
        data = _load(path)
        if data.get("mode") != "overhead":
            raise SystemExit(f"model_vs_bare: {path} is not an overhead run's --json")
        for name, fig in data["methods"].items():
            out[(data["model"], name)] = (fig["ratio"]["method/bare"],
                                         fig["interval"]["method/bare"])
    return out


def table(pred: dict, meas: dict) -> list[tuple]:
    """Rows (model, method, predicted, measured, interval, error %) for the cells in both."""
    rows = []
    for key in sorted(set(pred) & set(meas)):
        m, ci = meas[key]
        rows.append((*key, pred[key], m, ci, 100 * (pred[key] / m - 1)))
    return rows


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--predictions", nargs="+", required=True)
    p.add_argument("--measured", nargs="+", required=True)
    args = p.parse_args(argv)
    pred, meas = predicted(args.predictions), measured(args.measured)
    rows = table(pred, meas)
    if not rows:
        raise SystemExit("model_vs_bare: no (model, method) is in both the predictions and "
                         "the runs")
    print(f"{'model':10s} {'method':10s} {'predicted':>9s} {'measured':>9s} "
          f"{'interval':>16s} {'error':>7s}")
    for model, method, pr, m, ci, e in rows:
        band = "-" if ci is None else f"[{ci[0]:.3f},{ci[1]:.3f}]"
        print(f"{model:10s} {method:10s} {pr:9.3f} {m:9.3f} {band:>16s} {e:+6.1f}%")
    errs = [abs(r[-1]) for r in rows]
    print(f"median |error| over {len(rows)} cells: {statistics.median(errs):.1f}%  "
          f"(signed median {statistics.median(r[-1] for r in rows):+.1f}%)")
    for model in sorted({r[0] for r in rows}):
        for a, b in PAIRS:
            if all((model, x) in pred and (model, x) in meas for x in (a, b)):
                print(f"{model:10s} {a}/{b}: predicted {pred[(model, a)] / pred[(model, b)]:.3f}"
                      f", measured {meas[(model, a)][0] / meas[(model, b)][0]:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""The model against one GPU (issue 44 item 5): the ratio of ``wfbp`` to the bare loop that
``ddlbench.overhead --cuda`` measured, beside the one the performance model predicts from the
profiler's profile of the same model and batch (its two resources, host and device:
``simulate.Launch``). Run by scripts/gpu_check.sh after both:

    python scripts/launch_check.py OUTDIR [MODEL ...]

reads ``OUTDIR/profile_<model>.json`` and ``OUTDIR/overhead_<model>.json`` for each model
(default: those with both files), prints one line per model and exits 1 if a prediction is
more than 10% off the measured ratio (or nothing could be compared), 0 otherwise.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from dataclasses import replace

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from ddlbench.model import predict, simulate  # noqa: E402

TOLERANCE = 0.10


def predicted_ratio(prof: dict, method: str = "wfbp") -> float:
    """``method``'s iteration at one worker over the bare loop's, both replayed from ``prof``:
    the bare loop is the same replay with nothing to send and no host work of a method's."""
    work = predict.workload_of(prof, prof.get("optimizer_s") or 0.0)
    link = simulate.Link(prof["alpha_s"], prof["beta_s_per_byte"])
    bare_work = replace(work, host=simulate.NO_HOST,
                        launch=None if work.launch is None else replace(work.launch, hook_s=0.0))
    bare = simulate.predict(method, bare_work, simulate.Link(0.0, 0.0), nworkers=1)
    used = simulate.predict(method, work, link, nworkers=1)
    return bare.iteration_s / used.iteration_s


def compare(outdir: str, model: str, method: str = "wfbp") -> tuple[float, float]:
    """(predicted, measured) ratio of ``method`` to the bare loop for ``model``."""
    with open(os.path.join(outdir, f"profile_{model}.json")) as f:
        prof = json.load(f)
    with open(os.path.join(outdir, f"overhead_{model}.json")) as f:
        measured = json.load(f)["methods"][method]["ratio"]["method/bare"]
    return predicted_ratio(prof, method), measured


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("outdir")
    p.add_argument("models", nargs="*")
    args = p.parse_args(argv)
    models = args.models or sorted(
        name[len("profile_"):-len(".json")] for name in os.listdir(args.outdir)
        if name.startswith("profile_") and name.endswith(".json")
        and os.path.exists(os.path.join(args.outdir, f"overhead_{name[8:]}")))
    if not models:
        print(f"launch_check: no profile_<model>.json with its overhead_<model>.json in "
              f"{args.outdir}", file=sys.stderr)
        return 1
    worst = 0.0
    for model in models:
        pred, meas = compare(args.outdir, model)
        error = abs(pred - meas) / meas
        worst = max(worst, error)
        print(f"{model}: wfbp / bare loop at one GPU: predicted {pred:.3f}, measured {meas:.3f} "
              f"({100 * error:.1f}% off; within {100 * TOLERANCE:.0f}%: "
              f"{'yes' if error <= TOLERANCE else 'NO'})")
    return 0 if worst <= TOLERANCE else 1


if __name__ == "__main__":
    sys.exit(main())

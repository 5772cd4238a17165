"""Issue 44's GPU bars (the lean host path), decided from ``ddlbench.overhead --cuda --json``
records: run by scripts/gpu_host_path.sh after its overhead runs, or alone:

    python scripts/host_path_bars.py OUTDIR
    python scripts/host_path_bars.py --methods MODEL    (what gpu_host_path.sh runs on MODEL)

reads ``OUTDIR/overhead_bert.json`` (BERT-Large, batch 8) and ``OUTDIR/overhead_resnet50.json``
(ResNet-50, batch 64) and prints one line per bar: the median ratio with its sign-test interval
(``-`` under 6 rounds), ``met`` where the median reaches the bar (``shown`` where the whole
interval does), ``NOT met`` where it does not, ``missing`` where the record or the method is not
there. Exits 1 unless every bar is met, 2 on unreadable input. The prediction's bar (within 10%
of the measured wfbp / bare loop) is scripts/launch_check.py's. ``--methods MODEL`` prints the
methods the bars need on MODEL, and the baseline (DDP) beside them, comma-separated.
"""
from __future__ import annotations

import json
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from ddlbench import methods  # noqa: E402  (the registry: no torch)

# the all-to-all methods of the registry: the all-reduce ones and the baseline they are held to
ALL_TO_ALL = methods.selected("all", with_servers=False)
ALLREDUCE = [m for m in ALL_TO_ALL if not methods.lookup(m).baseline]
BASELINE = [m for m in ALL_TO_ALL if methods.lookup(m).baseline]

# (model record, method, ratio, bar, what the issue says)
BARS = [("bert", "wfbp", "method/bare", 0.85, "BERT-Large bs 8: wfbp / bare loop"),
        ("bert", "wfbp", "method/ddp_match", 0.95,
         "BERT-Large bs 8: wfbp / DDP with per-tensor buckets"),
        ("bert", "bspa2a", "method/ddp_match", 0.98, "BERT-Large bs 8: bspa2a / DDP, one bucket")]
BARS += [("resnet50", m, "method/bare", 0.97, f"ResNet-50 bs 64: {m} / bare loop")
         for m in ALLREDUCE]


def methods_for(model: str) -> list[str]:
    """The methods whose figures on ``model`` the bars read, in their order, then the
    baseline."""
    need = [m for name, m, *_ in BARS if name == model]
    return list(dict.fromkeys(need + BASELINE)) if need else []


def verdicts(outdir: str) -> list[tuple[str, str]]:
    """(line, verdict) per bar; verdict one of met, shown, NOT met, missing."""
    records: dict = {}
    for model in sorted({b[0] for b in BARS}):
        path = os.path.join(outdir, f"overhead_{model}.json")
        if os.path.exists(path):
            with open(path) as f:
                records[model] = json.load(f)["methods"]
    out = []
    for model, method, ratio, bar, what in BARS:
        fig = records.get(model, {}).get(method)
        if fig is None:
            out.append((f"{what} >= {bar:.2f}: no figure (overhead_{model}.json, {method})",
                        "missing"))
            continue
        median = fig["ratio"][ratio]
        ci = fig.get("interval", {}).get(ratio)
        verdict = ("shown" if ci is not None and ci[0] >= bar else "met") if median >= bar \
            else "NOT met"
        shown = "-" if ci is None else f"[{ci[0]:.3f}, {ci[1]:.3f}]"
        out.append((f"{what} >= {bar:.2f}: {median:.3f} {shown}", verdict))
    return out


def main(argv: list[str]) -> int:
    if len(argv) == 2 and argv[0] == "--methods" and methods_for(argv[1]):
        print(",".join(methods_for(argv[1])))
        return 0
    if len(argv) != 1 or not os.path.isdir(argv[0]):
        print("usage: python scripts/host_path_bars.py OUTDIR | --methods "
              f"{'|'.join(sorted({b[0] for b in BARS}))}", file=sys.stderr)
        return 2
    try:
        lines = verdicts(argv[0])
    except (OSError, ValueError, KeyError, TypeError) as e:
        print(f"host_path_bars: error: unreadable record: {e}", file=sys.stderr)
        return 2
    for line, verdict in lines:
        print(f"{line}: {verdict}")
    return 0 if all(v in ("met", "shown") for _, v in lines) else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

"""A stand-in for ``python -m ddlbench.measure.comm_bench`` in the calibration-check tests
(calibrate.COMM_BENCH).

Takes comm_bench's flags, imports no torch, and writes (``--output``) an all-reduce record:
rows at the powers of two from ``--min-bytes`` to ``--max-bytes``, each ``alpha + beta m``
times a factor, and that fit (alpha and beta times the factor). FAKE_FITS is a JSON object
from a ``--network`` to its [alpha, beta]; FAKE_LINK one from a part of the output file's
name to its factor, or to "fail" (exit 1, no file). A name no key matches gets factor 1.
"""
import argparse
import json
import os
import sys

from tests.fake_profiler import factor_for


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--output", required=True)
    ap.add_argument("--network", required=True)
    ap.add_argument("--nworkers", type=int, required=True)
    ap.add_argument("--min-bytes", type=int, default=1024)
    ap.add_argument("--max-bytes", type=int, required=True)
    args, _ = ap.parse_known_args()
    factor = factor_for("FAKE_LINK", args.output)
    if factor == "fail":
        print("RuntimeError: the fake comm_bench was told to fail", file=sys.stderr)
        return 1
    alpha, beta = json.loads(os.environ["FAKE_FITS"])[args.network]
    rows, m = [], 1
    while m <= args.max_bytes:
        if m >= args.min_bytes:
            rows.append({"size_bytes": m, "time_s": factor * (alpha + beta * m)})
        m *= 2
    with open(args.output, "w") as f:
        json.dump({"kind": "comm_bench", "nworkers": args.nworkers, "results": [
            {"op": "allreduce", "nworkers": args.nworkers, "rows": rows,
             "fit": {"alpha_s": factor * alpha, "beta_s_per_byte": factor * beta}}]}, f)
    return 0


if __name__ == "__main__":
    sys.exit(main())

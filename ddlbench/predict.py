"""Predict each method's iteration from a profile: ``python -m ddlbench.predict``.

    python -m ddlbench.profiler --model resnet18 --image-size 64 --batch-size 16 \\
        --nworkers 2 --output resnet18.json
    python -m ddlbench.predict --profile resnet18.json --method all
    python -m ddlbench.predict --profile resnet18.json --alpha 1e-4 --beta 8e-9 --nworkers 8

The profile (the profiler's JSON: forward time, per-tensor backward times and bytes in backward
order, and the alpha and beta it fitted on the all-reduces of the run it measured) goes through
``ddlbench.simulate``: one steady-state iteration per method, one message stream. ``--alpha`` and
``--beta`` (seconds per message, per byte, as comm_bench fits them for the worker count to
predict) replace the profile's; ``--nworkers`` only scales the throughput (the link's figures
must be those of that many workers). Prints per method the predicted iteration, throughput,
compute, exposed communication, overlap and what bounds it; ``--output`` writes them as JSON,
``--traces DIR`` each method's predicted trace (``python -m ddlbench.timeline`` reads them, beside
a measured one). Modelled: bspa2a, wfbp, fusion, ddp, mgwfbp, bytescheduler (issue 18 adds
the parameter-server methods and compressors). The optimizer's step is the profile's
(``optimizer_s``, which the profiler times with the training script's optimizer flags), or
``--optimizer-ms``.
"""
from __future__ import annotations

import json
import os
import sys

from . import simulate, timeline
from .errors import EXIT_USAGE, ArgumentParser, UsageError, check_writable
from .measure.profile_file import read_profile
from .planning import (BYTESCHEDULER_CREDIT, BYTESCHEDULER_PARTITION, DDP_DEFAULT_BUCKET_MB,
                       DEFAULT_MIN_GROUP_ELEMENTS, HOROVOD_DEFAULT_THRESHOLD)


def parse_args(argv=None):
    p = ArgumentParser(prog="python -m ddlbench.predict", description=__doc__.split("\n")[0],
                       raise_errors=True)
    p.add_argument("--profile", required=True, help="the profiler's JSON (--output FILE)")
    p.add_argument("--method", default="all",
                   help=f"comma-separated, or all ({', '.join(simulate.METHODS)})")
    p.add_argument("--alpha", type=float, default=None, help="seconds per message")
    p.add_argument("--beta", type=float, default=None, help="seconds per byte")
    p.add_argument("--nworkers", type=int, default=None,
                   help="workers the link's figures are for (default: the profile's)")
    p.add_argument("--batch-size", type=int, default=None,
                   help="per-worker batch (default: the profile's)")
    p.add_argument("--optimizer-ms", type=float, default=None,
                   help="the optimizer's step per iteration (default: the profile's, else 0)")
    p.add_argument("--threshold", type=float, default=HOROVOD_DEFAULT_THRESHOLD,
                   help="fusion's buffer in bytes")
    p.add_argument("--bucket-cap-mb", type=float, default=DDP_DEFAULT_BUCKET_MB)
    p.add_argument("--min-group", type=int, default=DEFAULT_MIN_GROUP_ELEMENTS, metavar="ELEMENTS",
                   help="MG-WFBP's small-group merge (fp32 elements; 0: off)")
    p.add_argument("--partition", type=int, default=BYTESCHEDULER_PARTITION,
                   help="ByteScheduler's chunk size in elements")
    p.add_argument("--credit", type=int, default=BYTESCHEDULER_CREDIT,
                   help="ByteScheduler's credit window in elements")
    p.add_argument("--output", default=None, help="write the predictions here as JSON")
    p.add_argument("--traces", default=None, metavar="DIR",
                   help="write each method's predicted trace here (METHOD.trace.json)")
    return p.parse_args(argv)


def check(args) -> list[str]:
    """The methods to predict; every problem one UsageError."""
    if (args.alpha is None) != (args.beta is None):
        raise UsageError("--alpha and --beta go together")
    for flag, value in (("--alpha", args.alpha), ("--beta", args.beta),
                        ("--optimizer-ms", args.optimizer_ms), ("--threshold", args.threshold),
                        ("--min-group", args.min_group)):
        if value is not None and not value >= 0:
            raise UsageError(f"{flag} must be >= 0, got {value}")
    for flag, value in (("--nworkers", args.nworkers), ("--batch-size", args.batch_size),
                        ("--bucket-cap-mb", args.bucket_cap_mb), ("--partition", args.partition),
                        ("--credit", args.credit)):
        if value is not None and not value > 0:
            raise UsageError(f"{flag} must be positive, got {value}")
    names = list(simulate.METHODS) if args.method == "all" else \
        [m.strip() for m in args.method.split(",") if m.strip()]
    for name in names:
        if name not in simulate.METHODS:
            raise UsageError(f"cannot predict method {name!r} yet; modelled: "
                             f"{', '.join(simulate.METHODS)}")
    if not names:
        raise UsageError("--method names no method")
    if args.output:
        check_writable(args.output)
    if args.traces:
        check_writable(args.traces, "--traces", folder=True)
    return names


def workload_of(prof: dict, optimizer_s: float = 0.0) -> simulate.Workload:
    return simulate.Workload(forward_s=float(prof["forward_s"]),
                             backward_s=[float(x) for x in prof["backward_s"]],
                             nbytes=[t["bytes"] for t in prof["tensors"]],
                             optimizer_s=optimizer_s,
                             names=[t["name"] for t in prof["tensors"]])


def run(args) -> int:
    names = check(args)
    prof = read_profile(args.profile)
    optimizer_s = (args.optimizer_ms / 1e3 if args.optimizer_ms is not None
                   else float(prof.get("optimizer_s") or 0.0))
    work = workload_of(prof, optimizer_s)
    link = simulate.Link(prof["alpha_s"] if args.alpha is None else args.alpha,
                         prof["beta_s_per_byte"] if args.beta is None else args.beta)
    nworkers = args.nworkers or int(prof.get("nworkers") or 1)
    batch = args.batch_size or int((prof.get("workload") or {}).get("batch_size") or 1)
    settings = {"threshold": args.threshold, "bucket_cap_mb": args.bucket_cap_mb,
                "min_group_bytes": args.min_group * 4, "partition": args.partition,
                "credit": args.credit}
    unit = "img" if "image_size" in (prof.get("workload") or {}) else "sen"
    print(f"Predicted: {prof['model']}, batch {batch} per worker, {nworkers} worker(s), "
          f"alpha {link.alpha * 1e6:.2f} us, beta {link.beta * 1e9:.4f} ns/B, "
          f"forward {work.forward_s * 1e3:.1f} ms, backward {sum(work.backward_s) * 1e3:.1f} ms, "
          f"{len(work.nbytes)} tensors, {sum(work.nbytes) / 1e6:.3f} MB")
    header = ["method", "messages", "iteration ms", f"{unit}/s total", "compute ms",
              "exposed ms", "overlap %", "bound by"]
    rows, out = [], []
    for name in names:
        p = simulate.predict(name, work, link, **settings)
        m = p.metrics
        rows.append([name, str(len(p.message_bytes)), f"{p.iteration_s * 1e3:.2f}",
                     f"{p.throughput(batch, nworkers):.1f}", f"{m['compute_s'] * 1e3:.2f}",
                     f"{m['exposed_s'] * 1e3:.2f}",
                     "-" if m["overlap"] is None else f"{100 * m['overlap']:.1f}", p.bottleneck])
        out.append({"method": name, "messages": len(p.message_bytes),
                    "message_bytes": p.message_bytes,
                    "iteration_s": p.iteration_s,
                    "throughput": p.throughput(batch, nworkers), "metrics": m,
                    "bottleneck": p.bottleneck})
        if args.traces:
            os.makedirs(args.traces, exist_ok=True)
            timeline.write(os.path.join(args.traces, f"{name}.trace.json"),
                           simulate.trace(p, {"model": prof["model"], "nworkers": nworkers}))
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    for r in [header, *rows]:
        print("  ".join(c.ljust(w) if i in (0, 7) else c.rjust(w)
                        for i, (c, w) in enumerate(zip(r, widths))).rstrip())
    if args.output:
        with open(args.output, "w") as f:
            json.dump({"profile": args.profile, "model": prof["model"], "nworkers": nworkers,
                       "batch_size": batch, "alpha_s": link.alpha,
                       "beta_s_per_byte": link.beta, "optimizer_s": work.optimizer_s,
                       "predictions": out}, f, indent=1)
    return 0


def main(argv=None) -> int:
    try:
        return run(parse_args(argv))
    except UsageError as e:
        print(f"ddlbench: error: {e}", file=sys.stderr)
        return EXIT_USAGE


if __name__ == "__main__":
    sys.exit(main())

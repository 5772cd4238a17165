"""A stand-in for ``python -m ddlbench.train`` in sweep tests (DDLBENCH_SWEEP_PROGRAM).

Takes the training script's flags, imports no torch, and behaves by method name:
- ``...:Hang``: starts its "workers" (child processes) and never finishes; it and its
  children ignore SIGTERM, so only a SIGKILL of the whole group stops them;
- ``...:Crash``: fails like a crashing method (exit 1, a RuntimeError line) unless
  FAKE_TRAIN_FIXED=1;
- a comma-separated list: each method in turn, as in a shared job ('{method}' in --output);
- anything else: starts nworkers - 1 child "workers", sleeps FAKE_TRAIN_SECONDS (default 0),
  prints the original's log lines and writes a run record (--output) whose throughput is a
  fixed function of method, model and nworkers, so two sweeps give the same numbers, and
  the suite's variables it inherited (``inherited``).
Each start appends "method nworkers" to the file FAKE_TRAIN_CALLS, when set. The methods
FAKE_TRAIN_NOISY names get 0.9, 1.0, 1.1 times their figure in tries 0, 1, 2 (1.0 later).
"""
import argparse
import json
import os
import re
import signal
import subprocess
import sys
import time


NOISE = {0: 0.9, 1: 1.0, 2: 1.1}


def throughput(method: str, model: str, nworkers: int) -> float:
    factor = 1.0 + (sum(map(ord, method)) % 7) / 10.0 + (sum(map(ord, model)) % 3) / 20.0
    return round(100.0 * factor * nworkers * 0.9 ** (nworkers - 1), 3)


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--nworkers", type=int, default=1)
    p.add_argument("--model", default="resnet50")
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--method", default="fusion")
    p.add_argument("--output", default=None)
    p.add_argument("--network", default="local")
    p.add_argument("--num-iters", type=int, default=2)
    args, _ = p.parse_known_args()
    calls = os.environ.get("FAKE_TRAIN_CALLS")
    if calls:
        with open(calls, "a") as f:
            f.write(f"{args.method} {args.nworkers}\n")
    for method in args.method.split(","):
        args.method = method
        code = one(args)
        if code:
            return code
    return 0


def one(args) -> int:
    """One method's run (a job of several runs each in turn, as the training script does)."""
    output = args.output.replace("{method}", args.method) if args.output else None
    marker = output or "fake"
    print(f"Model: {args.model}\nMethod: {args.method} (fake)\nBatch size: {args.batch_size}",
          flush=True)
    if args.method.endswith(":Hang"):
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        code = ("import signal, time\nsignal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
                "while True: time.sleep(1)")
        for _ in range(max(1, args.nworkers - 1)):
            subprocess.Popen([sys.executable, "-c", code, marker])
        print("Running warmup...", flush=True)
        while True:
            time.sleep(1)
    if args.method.endswith(":Crash") and os.environ.get("FAKE_TRAIN_FIXED") != "1":
        print("Running warmup...", flush=True)
        print("Traceback (most recent call last):\nRuntimeError: test-crash: deliberate "
              "failure", file=sys.stderr, flush=True)
        return 1
    seconds = float(os.environ.get("FAKE_TRAIN_SECONDS", "0"))
    workers = [subprocess.Popen([sys.executable, "-c", f"import time; time.sleep({seconds})",
                                 marker]) for _ in range(args.nworkers - 1)]
    print("Running warmup...", flush=True)
    time.sleep(seconds)
    total = throughput(args.method, args.model, args.nworkers)
    if args.method in os.environ.get("FAKE_TRAIN_NOISY", "").split(","):
        # tries 0, 1, 2 at 0.9, 1.0 and 1.1 times the figure, later ones at 1.0 (the try from
        # the record's path, records/<cell>_try<N>...)
        found = re.search(r"_try(\d+)", output or "")
        total = round(total * NOISE.get(int(found.group(1)) if found else 0, 1.0), 3)
    for i in range(args.num_iters):
        print(f"Iter #{i}: {total / args.nworkers:.1f} img/sec per CPU", flush=True)
    for w in workers:
        w.wait()
    print(f"Img/sec per CPU: {total / args.nworkers:.1f} +-0.0")
    print(f"Total img/sec on {args.nworkers} CPU(s): {total:.1f} +-0.0", flush=True)
    if output:
        record = {
            "config": {"model": args.model, "batch_size": args.batch_size,
                       "method": args.method, "nworkers": args.nworkers,
                       "network": args.network},
            "result": {"unit": "img/sec", "total_throughput": [total] * args.num_iters,
                       "throughput": {"mean": total, "std": 0.0, "p50": total, "p90": total,
                                      "min": total, "max": total}},
            "environment": {"device": "cpu", "launcher": "fake", "suite_version": "fake",
                            "python": sys.version.split()[0], "torch": None},
            "method": {"method": args.method, "architecture": "a2a"},
            # What of the suite's own settings this run inherited (the sweep's environment).
            "inherited": {k: v for k, v in os.environ.items()
                          if k.startswith(("DDLBENCH_NET", "BYTESCHEDULER_", "DMLC_",
                                           "HOROVOD_FUSION", "OMP_"))
                          or k in ("iters", "extra_args", "timeline")},
        }
        tmp = output + ".tmp"
        with open(tmp, "w") as f:
            json.dump(record, f)
        os.replace(tmp, output)
    return 0


if __name__ == "__main__":
    sys.exit(main())

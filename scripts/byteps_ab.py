#!/usr/bin/env python3
"""Real BytePS against the suite's parameter-server engine, side by side in one run.

    .venv/bin/python scripts/byteps_ab.py [--workers 2,4] [--servers 1,2] [--rounds 2]
        [--method wfbpps] [--model resnet18 --image-size 64 --batch-size 16] [--net 1gbit]
        [--modes shipped,fair] [--timeline] [--out DIR]

For every (workers, servers) pair it runs, in the BytePS environment's Python (the same torch
2.0.1 on both sides; `make byteps-env` builds it), the method through
``./byteps/byteps_launch.sh`` twice per round in alternating order (A B, then B A):
``engine=byteps`` (BytePS's scheduler and servers, every worker a BytePS worker of its own)
and the suite's engine with the same servers on this machine (``ps_force_servers=1``) and every
worker pushing (``ps_clients=process``, as on the BytePS lane); with ``--net PROFILE`` both
over an emulated cluster, every worker and server on a host of its own (as root). BytePS
runs in each of ``--modes``: ``fair`` (the launcher's default: BYTEPS_SERVER_ENGINE_THREAD=1,
BYTEPS_OMP_THREAD_PER_GPU=1, BYTEPS_ZMQ_NTHREADS=1, OMP_WAIT_POLICY=PASSIVE, its processes
pinned as the suite's, the idle compress loops not started) and ``shipped``
(``DDLBENCH_BYTEPS_FAIR=0``: the lane as shipped before, none of that); each round runs every
BytePS mode and the suite once, in rotating order. It prints
the median throughput of each, their ratio, and each side's bytes per server for one worker's
step: the suite's from its record (its partitions' placement), BytePS's from its servers' own
counts (the patch's line at shutdown: the pushes each summed, divided by the workers and the
steps run). With ``--timeline`` each pair then runs once more, both sides writing a trace
(BytePS's own trace read onto the suite's timeline), and it prints each side's mean step:
compute, communication, exposed, and each communication row's busy time per step. Records
and traces are kept under ``--out``. Not a test: a benchmark whose figures go in
docs/RESULTS.md with this command.
"""
from __future__ import annotations

import argparse
import collections
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)   # ddlbench.timeline reads the traces (--timeline)
LAUNCHER = os.path.join(REPO, "byteps", "byteps_launch.sh")


def byteps_python() -> str:
    out = subprocess.run([os.path.join(REPO, "byteps", "legacy_env.sh"), "python"],
                         capture_output=True, text=True)
    if out.returncode != 0:
        sys.exit(out.stderr.strip() or "the BytePS environment is not built: make byteps-env")
    return out.stdout.strip()


# the patch's line from each BytePS server at shutdown
SERVER_LINE = re.compile(r"ddl-benchmarks: BytePS server (\d+) received (\d+) pushes of (\d+) "
                         r"bytes")
WARMUP = 2


def run(py: str, engine: str, workers: int, servers: int, args, record: str,
        trace: str | None = None) -> tuple[dict, str]:
    """One run's record and its output; ``engine``: torch, or byteps-MODE (``--modes``)."""
    hosts = os.path.join(args.out, f"hosts{workers}")
    with open(hosts, "w") as f:
        f.write(f"localhost slots={workers}\n")
    variables = {"nworkers": str(workers), "nservers": str(servers), "hostfile": hosts,
                 "method": args.method, "dnn": args.model, "bs": str(args.batch_size),
                 "image_size": str(args.image_size), "iters": str(args.iters),
                 "extra_args": f"--num-warmup-batches {WARMUP} --num-batches-per-iter "
                               f"{args.batches} --output {record}"
                               + (f" --net {args.net}" if args.net else "")
                               + (f" --timeline {trace}" if trace else "")}
    if engine.startswith("byteps"):
        variables.update(engine="byteps", BYTEPS_PY=py,
                         DDLBENCH_BYTEPS_FAIR="0" if engine == "byteps-shipped" else "1")
    else:
        variables.update(PY=py, ps_force_servers="1", ps_clients="process")
    env = {k: v for k, v in os.environ.items()
           if k not in ("engine", "PY", "BYTEPS_PY", "DDLBENCH_NET", "DDLBENCH_BYTEPS_FAIR")}
    proc = subprocess.run(["bash", LAUNCHER], cwd=REPO, env={**env, **variables},
                          capture_output=True, text=True, timeout=1800)
    if proc.returncode != 0:
        sys.exit(f"{engine} {workers}w {servers}s failed:\n{proc.stderr[-3000:]}")
    with open(record) as f:
        return json.load(f), proc.stdout + proc.stderr


def byteps_per_server(output: str, workers: int, steps: int) -> list[int]:
    """BytePS's bytes per server for one worker's step, from its servers' lines."""
    pushed = {int(m.group(1)): int(m.group(3)) for m in SERVER_LINE.finditer(output)}
    return [pushed[s] // (workers * steps) for s in sorted(pushed)]


def rows_per_step(trace: str) -> tuple[dict, dict]:
    """From a trace: the slowest rank's mean step (the record's timeline means) and, over the
    workers, each communication row's busy time per recorded step (the union of its spans:
    time with at least one of them in flight)."""
    from ddlbench.timeline import COMM, ITERATION, overlap, read_trace
    ranks, _ = read_trace(trace, trace)
    busy: dict = collections.Counter()
    steps = 0
    means = []
    for r in ranks:
        its = sum(1 for e in r["events"] if e[1] == ITERATION)
        if not its:
            continue   # a server's process
        steps += its
        means.append(overlap(r["events"])["mean"])
        spans = collections.defaultdict(list)
        for e in r["events"]:
            if e[1] == COMM and e[4] is not None:
                # a row's lanes ("push_pull 2", ...) are the row
                spans[re.sub(r" \d+$", "", e[2])].append((e[3], e[4]))
        for row, intervals in spans.items():
            end = float("-inf")
            for t0, t1 in sorted(intervals):
                if t1 > end:
                    busy[row] += t1 - max(t0, end)
                    end = t1
    slowest = max(means, key=lambda m: m["iteration_s"])
    return slowest, {row: t / steps / 1000.0 for row, t in busy.most_common()}


def mb(n: int) -> str:
    return f"{n / 1e6:.2f}"


def main(argv=None) -> int:
    args = parse_args(argv)
    py = byteps_python()
    steps = WARMUP + args.iters * args.batches
    sides = [f"byteps-{m}" for m in args.modes] + ["torch"]
    print("| workers | servers | " + " | ".join(f"BytePS {m} (samples/s)" for m in args.modes)
          + " | suite (samples/s) | " + " | ".join(f"{m} / suite" for m in args.modes)
          + " | MB per server, one worker's step: " + " | ".join(f"BytePS {m}" for m in args.modes)
          + " | suite |")
    print("| ---: | ---: | " + "---: | " * (2 * len(args.modes) + 1) + "--- | " * len(args.modes)
          + "--- |")
    traced = []
    for w in (int(x) for x in args.workers.split(",")):
        for s in (int(x) for x in args.servers.split(",")):
            thr = {side: [] for side in sides}
            per_server = {}
            for r in range(args.rounds):
                k = r % len(sides)   # each round in another order: a rotation of the sides
                for side in sides[k:] + sides[:k]:
                    rec, output = run(py, side, w, s, args,
                                      os.path.join(args.out, f"{side}-{w}w{s}s-{r}.json"))
                    thr[side].append(rec["result"]["throughput"]["mean"])
                    per_server[side] = (rec["method"].get("bytes_per_server") if side == "torch"
                                        else byteps_per_server(output, w, steps))
            med = {side: statistics.median(v) for side, v in thr.items()}
            b = med["torch"]
            print(f"| {w} | {s} | "
                  + " | ".join(f"{med[x]:.1f} ({', '.join(f'{v:.1f}' for v in thr[x])})"
                               for x in sides)
                  + " | " + " | ".join(f"{med[x] / b:.2f}" for x in sides[:-1]) + " | "
                  + " | ".join(" / ".join(map(mb, per_server[x] or [])) for x in sides)
                  + " |", flush=True)
            if args.timeline:
                for side in sides:
                    trace = os.path.join(args.out, f"{side}-{w}w{s}s-trace.json")
                    run(py, side, w, s, args,
                        os.path.join(args.out, f"{side}-{w}w{s}s-traced.json"), trace)
                    traced.append((w, s, side, *rows_per_step(trace)))
    if traced:
        print_traced(traced)
    print(f"(records: {args.out})")
    return 0


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--workers", default="2,4")
    p.add_argument("--servers", default="1,2")
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--method", default="wfbpps")
    p.add_argument("--model", default="resnet18")
    p.add_argument("--image-size", type=int, default=64)
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--iters", type=int, default=3)
    p.add_argument("--batches", type=int, default=5)
    p.add_argument("--net", default=None, help="an emulated network profile (default: the "
                   "loopback)")
    p.add_argument("--modes", default="shipped,fair",
                   help="BytePS's lane as shipped before (shipped) and as the launcher now "
                        "runs it (fair): one or both")
    p.add_argument("--timeline", action="store_true", help="then one traced run of each side "
                   "per pair, their steps compared")
    p.add_argument("--out", default=None)
    args = p.parse_args(argv)
    args.modes = [m for m in args.modes.split(",") if m]
    if not args.modes or any(m not in ("shipped", "fair") for m in args.modes):
        p.error(f"--modes takes shipped, fair or both, got {','.join(args.modes)!r}")
    args.out = args.out or tempfile.mkdtemp(prefix="byteps-ab-")
    os.makedirs(args.out, exist_ok=True)
    return args


def print_traced(traced) -> None:
    print("\nOne traced run each: the slowest rank's mean step (ms), and the time per "
          "step each communication row is busy, the workers' mean (ms)")
    print("| workers | servers | side | step | compute | communication | exposed | "
          "rows busy per step |")
    print("| ---: | ---: | --- | ---: | ---: | ---: | ---: | --- |")
    for w, s, side, m, rows in traced:
        busy = ", ".join(f"{row} {t:.1f}" for row, t in rows.items())
        name = "suite" if side == "torch" else "BytePS " + side.split("-", 1)[1]
        print(f"| {w} | {s} | {name} | {m['iteration_s'] * 1e3:.1f} | "
              f"{m['compute_s'] * 1e3:.1f} | {m['comm_s'] * 1e3:.1f} | "
              f"{m['exposed_s'] * 1e3:.1f} | {busy} |")


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""Real BytePS against the suite's parameter-server engine, side by side in one run.

    .venv/bin/python scripts/byteps_ab.py [--workers 2,4] [--servers 1,2] [--rounds 2]
        [--method wfbpps] [--model resnet18 --image-size 64 --batch-size 16] [--net 1gbit]
        [--out DIR]

For every (workers, servers) pair it runs, in the BytePS environment's Python (the same torch
2.0.1 on both sides; `make byteps-env` builds it), the method through
``./byteps/byteps_launch.sh`` twice per round in alternating order (A B, then B A):
``engine=byteps`` (BytePS's scheduler and servers, every worker a BytePS worker of its own)
and the suite's engine with the same servers on this machine (``ps_force_servers=1``) and every
worker pushing (``ps_clients=process``, as on the BytePS lane); with ``--net PROFILE`` both
over an emulated cluster, every worker and server on a host of its own (as root). It prints
the median
throughput of each, their ratio, and the suite's bytes per server (BytePS places its keys by
its own hash and does not count them). Records are kept under ``--out``. Not a test: a
benchmark whose figures go in docs/RESULTS.md with this command.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LAUNCHER = os.path.join(REPO, "byteps", "byteps_launch.sh")


def byteps_python() -> str:
    out = subprocess.run([os.path.join(REPO, "byteps", "legacy_env.sh"), "python"],
                         capture_output=True, text=True)
    if out.returncode != 0:
        sys.exit(out.stderr.strip() or "the BytePS environment is not built: make byteps-env")
    return out.stdout.strip()


def run(py: str, engine: str, workers: int, servers: int, args, record: str) -> dict:
    hosts = os.path.join(args.out, f"hosts{workers}")
    with open(hosts, "w") as f:
        f.write(f"localhost slots={workers}\n")
    variables = {"nworkers": str(workers), "nservers": str(servers), "hostfile": hosts,
                 "method": args.method, "dnn": args.model, "bs": str(args.batch_size),
                 "image_size": str(args.image_size), "iters": str(args.iters),
                 "extra_args": f"--num-warmup-batches 2 --num-batches-per-iter "
                               f"{args.batches} --output {record}"
                               + (f" --net {args.net}" if args.net else "")}
    if engine == "byteps":
        variables.update(engine="byteps", BYTEPS_PY=py)
    else:
        variables.update(PY=py, ps_force_servers="1", ps_clients="process")
    env = {k: v for k, v in os.environ.items()
           if k not in ("engine", "PY", "BYTEPS_PY", "DDLBENCH_NET")}
    proc = subprocess.run(["bash", LAUNCHER], cwd=REPO, env={**env, **variables},
                          capture_output=True, text=True, timeout=1800)
    if proc.returncode != 0:
        sys.exit(f"{engine} {workers}w {servers}s failed:\n{proc.stderr[-3000:]}")
    with open(record) as f:
        return json.load(f)


def main(argv=None) -> int:
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
    p.add_argument("--out", default=None)
    args = p.parse_args(argv)
    args.out = args.out or tempfile.mkdtemp(prefix="byteps-ab-")
    os.makedirs(args.out, exist_ok=True)
    py = byteps_python()
    print("| workers | servers | BytePS (samples/s) | suite (samples/s) | BytePS / suite | "
          "suite bytes per server per step |")
    print("| ---: | ---: | ---: | ---: | ---: | --- |")
    for w in (int(x) for x in args.workers.split(",")):
        for s in (int(x) for x in args.servers.split(",")):
            thr = {"byteps": [], "torch": []}
            per_server = None
            for r in range(args.rounds):
                order = ("byteps", "torch") if r % 2 == 0 else ("torch", "byteps")
                for engine in order:
                    rec = run(py, engine, w, s, args,
                              os.path.join(args.out, f"{engine}-{w}w{s}s-{r}.json"))
                    thr[engine].append(rec["result"]["throughput"]["mean"])
                    if engine == "torch":
                        per_server = rec["method"].get("bytes_per_server")
            a, b = statistics.median(thr["byteps"]), statistics.median(thr["torch"])
            print(f"| {w} | {s} | {a:.1f} | {b:.1f} | {a / b:.2f} | {per_server} |",
                  flush=True)
    print(f"(records: {args.out})")
    return 0


if __name__ == "__main__":
    sys.exit(main())

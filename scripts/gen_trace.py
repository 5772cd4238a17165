"""A synthetic merged timeline trace of a given size, as a run's ``--timeline PATH`` writes.

    python scripts/gen_trace.py OUT.json --mb 200 [--ranks 4] [--seed 0] [--params 160]

For timing and checking ``python -m ddlbench.timeline`` on traces as large as long GPU runs
make (issue 47). Each rank records what the suite's recorder does in a data-parallel run:
per iteration a forward and a backward (compute), a ``ready`` instant per parameter during the
backward, asynchronous all-reduces of gradient buckets (several in flight at once: the trace's
lane rows), a compressor's encode and decode of some buckets, a scheduler's queue spans, and the
step (a wait) holding the optimizer (compute); every few iterations a timing round's closing
``synchronize``. Ranks' clocks are offset from rank 0's; the trace goes through
``ddlbench.timeline.trace`` and ``write`` as a run's does. Deterministic for a seed; the number
of iterations is chosen so that the file comes to about ``--mb`` megabytes.
"""
from __future__ import annotations

import argparse
import os
import random
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from ddlbench import timeline as tl  # noqa: E402

ROUND = 10          # iterations per timing round (a synchronize closes each)
BUCKETS = 12        # all-reduces per iteration


def rank_events(rank: int, iterations: int, params: int, rng: random.Random,
                offset_us: float) -> list:
    """One rank's recorded events, ``iterations`` steps from ``offset_us`` on its own clock."""
    ev = []
    t = offset_us + rng.uniform(0, 50)
    main = tl.MAIN
    for i in range(iterations):
        it0 = t
        fwd = rng.uniform(8_000, 12_000)
        bwd = rng.uniform(16_000, 24_000)
        ev.append(("forward", tl.COMPUTE, main, t, t + fwd, None))
        t += fwd
        b0 = t
        ev.append(("backward", tl.COMPUTE, main, t, t + bwd, None))
        # Gradients become ready through the backward, last layers first.
        for p in range(params):
            at = b0 + bwd * (p + rng.random()) / params
            ev.append((f"layer{params - p}.weight", tl.READY, "gradients", at, None,
                       {"bytes": 4 * rng.randrange(64, 1 << 20)}))
        # Buckets handed to the transport during the backward (the last one at its end);
        # a collective takes longer than the gap to the next: several are in flight at once.
        comm_end = b0 + bwd
        for k in range(BUCKETS):
            start = b0 + bwd * (k + 1) / BUCKETS - rng.uniform(0, 300)
            nbytes = 4 * rng.randrange(1 << 16, 1 << 22)
            if k % 4 == 3:      # a compressed bucket: encode, queue, decode after
                enc = rng.uniform(100, 400)
                ev.append(("encode", tl.CODEC, "compressor", start, start + enc,
                           {"elements": nbytes // 4, "bytes": nbytes, "bytes_out": nbytes // 8}))
                start += enc
            queued = rng.uniform(0, 500) if k % 3 == 0 else 0.0
            if queued:
                ev.append((f"bucket {k}", tl.QUEUE, "scheduler queue", start, start + queued,
                           None))
                start += queued
            dur = rng.uniform(1_500, 6_000)
            ev.append(("allreduce", tl.COMM, "allreduce", start, start + dur,
                       {"bytes": nbytes, "tensor": tl.tensors_label(
                           [f"layer{params - j}.weight" for j in range(k, k + 3)])}))
            if k % 4 == 3:
                dec = rng.uniform(50, 200)
                ev.append(("decode", tl.CODEC, "compressor", start + dur, start + dur + dec,
                           {"elements": nbytes // 4, "bytes": nbytes, "bytes_in": nbytes // 8}))
            comm_end = max(comm_end, start + dur)
        t = b0 + bwd
        step_end = max(t + rng.uniform(300, 800), comm_end + rng.uniform(200, 600))
        opt = rng.uniform(200, 500)
        ev.append(("step", tl.WAIT, main, t, step_end, None))
        ev.append(("optimizer", tl.COMPUTE, main, step_end - opt, step_end, None))
        t = step_end + rng.uniform(20, 80)          # loop overhead
        ev.append(("iteration", tl.ITERATION, main, it0, t, {"index": i}))
        if i % ROUND == ROUND - 1:
            sync = rng.uniform(50, 400)
            ev.append(("synchronize", tl.WAIT, main, t, t + sync, None))
            t += sync
    return ev


def make(iterations: int, ranks: int, params: int, seed: int) -> dict:
    rng = random.Random(seed)
    per_rank = []
    for r in range(ranks):
        offset = 0.0 if r == 0 else rng.uniform(-5e5, 5e5)
        per_rank.append({"rank": r, "events": rank_events(r, iterations, params, rng, offset),
                         "offset_us": offset, "uncertainty_us": rng.uniform(0, 20)})
    return tl.trace(per_rank, meta={"method": "wfbp", "model": "synthetic",
                                    "nworkers": ranks})


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("out")
    p.add_argument("--mb", type=float, default=10.0, help="about this many megabytes (10)")
    p.add_argument("--ranks", type=int, default=4)
    p.add_argument("--params", type=int, default=160, help="parameters per rank (160)")
    p.add_argument("--seed", type=int, default=0)
    a = p.parse_args(argv)
    probe = 20
    tl.write(a.out, make(probe, a.ranks, a.params, a.seed))
    per_iteration = os.path.getsize(a.out) / probe
    iterations = max(1, round(a.mb * 1e6 / per_iteration))
    tl.write(a.out, make(iterations, a.ranks, a.params, a.seed))
    print(f"{a.out}: {os.path.getsize(a.out) / 1e6:.1f} MB, {a.ranks} ranks x {iterations} "
          f"iterations")
    return 0


if __name__ == "__main__":
    sys.exit(main())

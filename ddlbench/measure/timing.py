"""The measurement protocol of docs/DESIGN.md section 8, and the original suite's log lines.

Warm-up batches, then timing rounds of several batches each. Every rank times each round; the
round's time is the slowest rank's (an all-reduce MAX after the round, outside the timed part);
per-worker throughput of a round = batch * batches / time, total = P times that.
"""
from __future__ import annotations

import math
import statistics
import time

import torch
import torch.distributed as dist

from .. import runtime

ROUND_UNITS = {"sen": "sentences"}  # the unit on the original's Iter lines

try:  # resident memory, for the flat-memory check
    import psutil
except ImportError:  # pragma: no cover - psutil is in requirements.txt
    psutil = None


def rss_bytes() -> int | None:
    return psutil.Process().memory_info().rss if psutil else None


def percentile(values: list[float], q: float) -> float:
    """Linear-interpolation percentile (as numpy's default), q in [0, 100]."""
    xs = sorted(values)
    if len(xs) == 1:
        return xs[0]
    pos = (len(xs) - 1) * q / 100.0
    lo, hi = math.floor(pos), math.ceil(pos)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def summary(values: list[float]) -> dict:
    return {"mean": statistics.fmean(values),
            "std": statistics.pstdev(values) if len(values) > 1 else 0.0,
            "p50": percentile(values, 50), "p90": percentile(values, 90),
            "min": min(values), "max": max(values)}


def slowest(ctx, seconds: float) -> float:
    t = torch.tensor([seconds], dtype=torch.float64,
                     device=ctx.device if ctx.backend == "nccl" else "cpu")
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return float(t.item())


def machine_totals(ctx, rates: list[float]) -> list[dict]:
    """Each worker machine's total throughput as the original's PS scripts printed it: its
    first worker's own rounds (``rates``: this worker's, before the slowest-rank maximum),
    times the workers, mean and 1.96 x std; machines in the order of their first ranks
    (collective: every worker calls it)."""
    import torch.distributed as dist

    from ..hosts.placement import machine_id
    every: list = [None] * ctx.size
    dist.all_gather_object(every, (machine_id(), rates))
    first: dict = {}
    for rank, (machine, own) in enumerate(every):
        first.setdefault(machine, (rank, own))
    out = []
    for machine, (rank, own) in first.items():
        conf = 1.96 * (statistics.pstdev(own) if len(own) > 1 else 0.0)
        out.append({"machine": machine, "rank": rank,
                    "mean": ctx.size * statistics.fmean(own), "conf": ctx.size * conf})
    return out


def run(ctx, train_step, finish, *, batch_size: int, warmup: int, batches_per_iter: int,
        iters: int, unit: str, log, on_warm=None, timeline=None,
        per_machine: bool = False) -> dict:
    """Time ``train_step`` (one batch) as the protocol says; ``finish`` completes any work a
    method leaves in flight. Prints the original's lines through ``log`` (rank 0 only).
    ``timeline`` (``ddlbench.timeline.Timeline``) records the timed rounds: each step an
    iteration, each round's closing ``finish`` a wait. ``per_machine`` (the PS methods): on
    several worker machines, one ``Total`` line per machine from its own rounds, as the
    original's BytePS scripts printed (``machine_totals``), in place of the one line."""
    from ..timeline import NULL, WAIT
    timeline = timeline or NULL
    noun = ctx.device_noun
    for _ in range(warmup):
        train_step()
    finish()
    runtime.synchronize(ctx.device)
    if on_warm:
        on_warm()
    timeline.start()
    log("Running benchmark...")
    # The original's round lines spelled BERT's unit out ("sentences/sec"); its summary lines
    # say "Sen/sec".
    round_unit = ROUND_UNITS.get(unit, unit)
    round_times, rates, rss, own = [], [], [], []
    for i in range(iters):
        start = time.perf_counter()
        for _ in range(batches_per_iter):
            with timeline.iteration():
                train_step()
        with timeline.span("synchronize", WAIT):
            finish()
            runtime.synchronize(ctx.device)
        mine = time.perf_counter() - start
        own.append(batch_size * batches_per_iter / mine)
        elapsed = slowest(ctx, mine)
        rate = batch_size * batches_per_iter / elapsed
        round_times.append(elapsed)
        rates.append(rate)
        rss.append(rss_bytes())
        log(f"Iter #{i}: {rate:.1f} {round_unit}/sec per {noun}")
    timeline.stop()
    mean = statistics.fmean(rates)
    conf = 1.96 * (statistics.pstdev(rates) if len(rates) > 1 else 0.0)
    log(f"{unit.capitalize()}/sec per {noun}: {mean:.1f} +-{conf:.1f}")
    machines = machine_totals(ctx, own) if per_machine else []
    if len(machines) > 1:
        for m in machines:
            log(f"Total {unit}/sec on {ctx.size} {noun}(s): {m['mean']:.1f} +-{m['conf']:.1f}")
    else:
        log(f"Total {unit}/sec on {ctx.size} {noun}(s): {ctx.size * mean:.1f} "
            f"+-{ctx.size * conf:.1f}")
    totals = [ctx.size * r for r in rates]
    return {
        "unit": f"{unit}/sec",
        "round_seconds": round_times,
        "per_worker_throughput": rates,
        "total_throughput": totals,
        "throughput": summary(totals),
        "round_time": summary(round_times),
        "per_worker_mean": mean,
        "per_worker_conf": conf,
        "rss_bytes_per_round": rss,
        # the Total lines printed per worker machine (PS methods on several), else None
        "machine_totals": machines if len(machines) > 1 else None,
    }

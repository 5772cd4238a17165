"""Pool the paired rounds of several ``ddlbench.overhead --json`` runs (docs/RESULTS.md, "the peers in one job, round by round").

    python scripts/pool_rounds.py RUN.json [RUN.json ...]

For every method in all the runs and each reference (``ddp_match``, ``bare``): the rounds'
paired throughput ratios of all the runs together, their median with its sign-test interval
(``ddlbench.stats.median_interval``), the rounds where the method was ahead and the
one-sided sign test's p (the chance of at least as many ahead were each round a coin toss).
Runs whose records have no ``round_s`` (before it was written) are refused."""
import json
import os
import statistics
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from ddlbench.stats import median_interval, sign_tail  # noqa: E402


def pooled(records: list[dict]) -> dict:
    """{method: {reference: {rounds, ahead, median, interval, p}}} over the records."""
    out: dict = {}
    for rec in records:
        for name, fig in rec["methods"].items():
            times = fig.get("round_s")
            if times is None:
                raise ValueError(f"{name}: the record has no round_s (written before it was kept)")
            for ref in ("ddp_match", "bare"):
                ratios = out.setdefault(name, {}).setdefault(ref, [])
                ratios.extend(r / m for m, r in zip(times["method"], times[ref]))
    result: dict = {}
    for name, refs in out.items():
        for ref, ratios in refs.items():
            n, ahead = len(ratios), sum(x > 1.0 for x in ratios)
            result.setdefault(name, {})[ref] = {
                "rounds": n, "ahead": ahead, "median": statistics.median(ratios),
                "interval": median_interval(ratios),
                "p": sign_tail(n, ahead)}
    return result


def main(paths: list[str]) -> int:
    if not paths:
        print("usage: python scripts/pool_rounds.py RUN.json [RUN.json ...]", file=sys.stderr)
        return 2
    try:
        records = []
        for path in paths:
            with open(path) as f:
                records.append(json.load(f))
        result = pooled(records)
    except (OSError, ValueError, KeyError) as e:
        print(f"pool_rounds: error: {e}", file=sys.stderr)
        return 2
    for name, refs in result.items():
        for ref, r in refs.items():
            ci = r["interval"]
            print(f"{name:>14} / {ref:<9} {r['median']:.3f} "
                  f"{'-' if ci is None else f'[{ci[0]:.3f}, {ci[1]:.3f}]'}  ahead in "
                  f"{r['ahead']} of {r['rounds']} rounds (one-sided p = {r['p']:.2g})")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

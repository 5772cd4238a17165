#!/usr/bin/env python3
"""Sweep method x task x nworkers x network and report throughput as the original suite did.

    python benchmarks.py --config quick          # a few minutes on a 2-core CPU machine
    python benchmarks.py --config paper          # the survey's grid, on a cluster (mpi launcher)
    python benchmarks.py --config quick --dry-run
    python benchmarks.py --report results/quick/results.jsonl

Each run is its own process group with a timeout; results are appended to
results/<name>/results.jsonl one line per try, logs go to logs/<name>/, and the Markdown table
(results/<name>/report.md) is printed at the end. See ddlbench/sweep.py for the file format.
"""
from __future__ import annotations

import argparse
import os
import sys

from ddlbench import sweep
from ddlbench.errors import EXIT_USAGE, UsageError


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--config", default="paper",
                   help=f"sweep file, or a preset in configs/ ({', '.join(sweep.presets())})")
    p.add_argument("--results", default=None, help="results JSONL (default results/<name>/)")
    p.add_argument("--dry-run", action="store_true", help="print the runs, start nothing")
    p.add_argument("--report", default=None, metavar="JSONL",
                   help="only print the table of an existing results file")
    args = p.parse_args(argv)
    try:
        if args.report:
            if not os.path.isfile(args.report):
                raise UsageError(f"results file {args.report} not found")
            print(sweep.report(sweep.read_results(args.report)), end="")
            return 0
        cfg = sweep.load(sweep.resolve_config(args.config))
        results = args.results or os.path.join(cfg.results, "results.jsonl")
        cells = cfg.cells()
        total = len(cells) * cfg.tries
        print(f"sweep {cfg.name}: {len(cells)} cells x {cfg.tries} tries = {total} runs "
              f"({cfg.launcher} launcher); results -> {os.path.relpath(results)}", flush=True)
        if args.dry_run:
            for cell in cells:
                cmd, env = sweep.command(cfg, cell, "<record.json>")
                prefix = " ".join(f"{k}={v!r}" for k, v in env.items())
                print(f"{cell.key}: {prefix + ' ' if prefix else ''}{' '.join(cmd)}")
            return 0
        done = failed = 0
        for cell in cells:
            for t in range(cfg.tries):
                entry = sweep.run_cell(cfg, cell, t)
                sweep.append_result(results, entry)
                done += 1
                if entry["status"] == "ok":
                    thr = entry["record"]["result"]["throughput"]["mean"]
                    unit = entry["record"]["result"]["unit"]
                    msg = f"{thr:.1f} {unit}"
                else:
                    failed += 1
                    msg = f"{entry['status'].upper()}: {entry['reason']} (log: {entry['log']})"
                print(f"[{done}/{total}] {cell.key} try {t}: {msg} ({entry['seconds']:.0f} s)",
                      flush=True)
        table = sweep.report([e for e in sweep.read_results(results) if e["sweep"] == cfg.name])
        with open(os.path.join(os.path.dirname(results), "report.md"), "w") as f:
            f.write(table)
        print()
        print(table, end="")
        if failed:
            print(f"\n{failed} of {total} runs failed; their logs are listed above", file=sys.stderr)
        return 0 if failed == 0 else 1
    except UsageError as e:
        print(f"benchmarks.py: error: {e}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        print("benchmarks.py: interrupted; finished runs are kept in the results file",
              file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())

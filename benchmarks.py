#!/usr/bin/env python3
"""Sweep network x task x method x engine x nworkers and report throughput as the original did.

    python benchmarks.py --config quick            # a few minutes on a 2-core CPU machine
    python benchmarks.py --config emulated         # small models over emulated 5/1 Gbit links
    python benchmarks.py --config paper            # the survey's grid, on a cluster
    python benchmarks.py --config quick --dry-run  # the plan and its estimated time
    python benchmarks.py --config quick --only "method=wfbp|ddp,nworkers>=2"
    python benchmarks.py --config quick --rerun-failed
    python benchmarks.py report results/2025-01-31-quick      # remake every report file

Each try runs in its own process group with a timeout; a crash or a timeout is recorded with
its reason and the tail of its log, and the sweep goes on. Every finished try is one line of
results/<date>-<name>/results.jsonl, written before the next starts; started again (also after
kill -9) the sweep resumes the latest unfinished folder of that name and runs only the tries
not yet recorded. Tries run round-robin over the cells (try 0 of every cell, then try 1, ...),
each round in an order shuffled by the sweep's seed (recorded in the store), so that drift
and background load fall on every method alike. Reports in the same folder: README.md
(tables), results.csv, plots/, manifest.json. Sweep file format: ddlbench/sweep/__init__.py.
"""
from __future__ import annotations

import argparse
import os
import sys

from ddlbench.errors import EXIT_USAGE, ArgumentParser, UsageError, check_writable


def _run_parser() -> argparse.ArgumentParser:
    from ddlbench.sweep import config
    p = ArgumentParser(prog="benchmarks.py", description=__doc__.split("\n")[0],
                       epilog="benchmarks.py report RESULTS --help: the report command")
    p.add_argument("--config", default="paper",
                   help=f"sweep file, or a preset in configs/ ({', '.join(config.presets())})")
    p.add_argument("--only", metavar="EXPR", default=None,
                   help="run only the cells matching EXPR, e.g. 'method=wfbp|fusion,nworkers>=2' "
                        "(axes: network model bs method label compressor engine nworkers arch)")
    for flag, text in (("--rerun-failed", "run failed and timed-out tries again (default: "
                                          "they count as done)"),
                       ("--dry-run", "print the runs still to do and the estimated time; "
                                     "start nothing")):
        p.add_argument(flag, action="store_true", help=text)
    p.add_argument("--predict-only", action="store_true",
                   help="run nothing: predict every cell with the performance model (profiles "
                        "and network descriptions: the sweep file's predict:) into "
                        "results/<date>-<name>-predicted/")
    p.add_argument("--results", default=None, metavar="DIR",
                   help="results folder to use (default: the latest unfinished "
                        "results/<date>-<name>/, else a new one)")
    p.add_argument("--fresh", action="store_true",
                   help="start a new results folder even if the latest one is unfinished")
    p.add_argument("--quiet", action="store_true",
                   help="batch jobs: no progress display, no tables; errors and one summary line")
    p.add_argument("--progress", choices=("auto", "bar", "lines"), default="auto",
                   help="progress bar, one line per run, or auto (a bar on a terminal)")
    p.add_argument("--report", default=None, metavar="RESULTS", help=argparse.SUPPRESS)
    return p


def _report_parser() -> argparse.ArgumentParser:
    p = ArgumentParser(prog="benchmarks.py report",
                       description="Remake README.md, results.csv, plots/ and "
                                   "manifest.json of a results folder from its store "
                                   "alone, and print the tables.")
    p.add_argument("results", help="results folder, or its results.jsonl")
    p.add_argument("--aggregate", choices=("mean", "median", "olympic"), default=None,
                   help="how tries combine (default: the sweep file's, else mean)")
    p.add_argument("--min-ok", type=int, default=None,
                   help="successful tries a cell needs not to be marked (default: the sweep's)")
    p.add_argument("--no-plots", action="store_true", help="skip the PNG plots")
    p.add_argument("--quiet", action="store_true", help="write the files, print nothing")
    return p


def report_main(argv: list[str]) -> int:
    from ddlbench.sweep import report, store
    args = _report_parser().parse_args(argv)
    target = args.results
    if not os.path.exists(target):
        raise UsageError(f"results {target} not found")
    folder = target if os.path.isdir(target) else os.path.dirname(os.path.abspath(target))
    path = store.store_path(target)
    if not os.path.isfile(path):
        raise UsageError(f"no results store {path}")
    if args.min_ok is not None and args.min_ok <= 0:
        raise UsageError(f"--min-ok must be positive, got {args.min_ok}")
    entries, bad = store.read(path)
    if not any(e.get("kind") == "try" for e in entries):
        raise UsageError(f"{path} holds no finished try")
    t = report.write_all(folder, args.aggregate, args.min_ok, plots=not args.no_plots,
                         entries=entries, unreadable=bad)
    if bad:
        print(f"benchmarks.py: {bad} unreadable line(s) in {path} skipped", file=sys.stderr)
    if not args.quiet:
        print(report.console(t), end="")
    return 0


def _progress_mode(args) -> str:
    """none (--quiet), bar or lines; auto is a bar on a terminal."""
    mode = "none" if args.quiet else args.progress
    if mode == "auto":
        mode = "bar" if sys.stderr.isatty() else "lines"
    return mode


def _print_plan(sweep, p, mode: str, dry_run: bool, rel: str) -> None:
    """The sweep file's notes, a test override, and the line on what is left to run."""
    from ddlbench.sweep import config
    for note in sweep.notes:
        print(f"benchmarks.py: {note}", file=sys.stderr)
    if os.environ.get(config.PROGRAM_ENV) and mode != "none":
        print(f"benchmarks.py: test override: python -m {os.environ[config.PROGRAM_ENV]} "
              f"replaces the training script", file=sys.stderr)
    nruns = len(p.cells) * sweep.tries
    if mode != "none" or dry_run:
        state = "resuming" if p.resumed else "new"
        print(f"sweep {sweep.name}: {len(p.cells)} cells x {sweep.tries} tries = {nruns} runs; "
              f"{len(p.todo)} to run, {p.skipped} already done; results -> {rel} ({state})",
              flush=True)


def _print_order(sweep, p) -> None:
    """--dry-run: the order of the tries, adaptive rounds, and the calibration and pace jobs."""
    from ddlbench.sweep import execute
    print(f"order: round-robin, try 0 of every cell, then try 1, ...; each round shuffled "
          f"by seed {p.seed} ({p.seed_source})")
    if sweep.adaptive:
        a = sweep.adaptive
        print(f"adaptive: then rounds of one more try for the cells whose 95% interval is "
              f"wider than +-{a['target'] * 100:g}% of their median, up to {a['max_tries']} "
              f"tries each (not counted below)")
    if sweep.calibrate:
        from ddlbench.sweep import calibrate
        jobs, _ = calibrate.jobs(p.cells)
        done = calibrate.done(p.entries, p.folder)
        left = [j.name for j in jobs if j.name not in done]
        print(f"calibrate: {_n(len(left), 'job')} to run before the tries"
              + (f" ({', '.join(left)})" if left else ""))
        if sweep.pace:
            print(f"pace: a short profiler run before each of the "
                  f"{_n(len(execute.jobs(p.todo)), 'job')} (not counted below)")


def _dry_run(sweep, p) -> int:
    """--dry-run: the order, each job's command and the estimated time; starts nothing."""
    from ddlbench.sweep import calibrate, execute, runner
    _print_order(sweep, p)
    for job in execute.jobs(p.todo):
        t = job[0]
        record = "<record>.json" if len(job) == 1 else "<records>/{method}.json"
        cmd, env = runner.job_command(sweep, [x.cell for x in job], record,
                                      calibrate.profile_file(t.cell, None))
        again = f" (attempt {t.attempt})" if t.attempt > 1 else ""
        names = ", ".join(x.cell.name for x in job)
        print(f"{names} try {t.try_index}{again}: {runner.describe(cmd, env)}")
    seconds, guessed = execute.estimate(p, sweep)
    basis = (f"{len(p.todo) - guessed} from this store's history, {guessed} guessed at "
             f"{sweep.estimate_s:g} s each (estimate_s)")
    print(f"estimated time: {execute.fmt_duration(seconds)} for {len(p.todo)} runs "
          f"({basis})")
    return 0


def _interrupted(p, e: BaseException) -> int:
    """Ctrl-C (130) or SIGTERM (143): say so and report what the store holds."""
    from ddlbench.sweep import execute, report, store
    print("benchmarks.py: interrupted; every finished try is in the store, the run in "
          "progress was stopped and will run again next time", file=sys.stderr)
    if os.path.isfile(store.store_path(p.folder)):
        report.write_all(p.folder, plots=False)
    return 143 if isinstance(e, execute._Stop) else 130


def _finish(sweep, p, mode: str, counts: dict, rel: str) -> int:
    """The reports, the tables (unless --quiet) and the summary; 1 when a try of the sweep
    failed or timed out."""
    from ddlbench.sweep import report, store
    t = report.write_all(p.folder)
    selected = {c.hash for c in p.cells}
    eff = store.latest(store.read(store.store_path(p.folder))[0])
    bad = sum(1 for (h, i), e in eff.items()
              if h in selected and i < sweep.tries and e.get("status") != "ok")
    if mode != "none":
        print()
        print(report.console(t))
    ran = sum(counts[k] for k in ("ok", "failed", "timeout"))
    extra = f", {counts['extra']} of them adaptive" if counts.get("extra") else ""
    print(f"benchmarks.py: {_n(ran, 'run')} now ({counts['ok']} ok, {counts['failed']} failed, "
          f"{counts['timeout']} timed out{extra}), {counts['skipped']} already done; reports in "
          f"{os.path.join(rel, 'README.md')}", file=sys.stderr)
    if bad:
        print(f"benchmarks.py: {_n(bad, 'try', 'tries')} of this sweep failed or timed out "
              f"(see the README's 'Failed tries'; --rerun-failed runs them again)",
              file=sys.stderr)
    return 1 if bad else 0


def run_main(argv: list[str]) -> int:
    from ddlbench.sweep import config, execute, select
    args = _run_parser().parse_args(argv)
    if args.report:
        return report_main([args.report])
    sweep = config.load(config.resolve_config(args.config), runs=not args.predict_only)
    only = select.parse(args.only) if args.only else None
    mode = _progress_mode(args)
    if args.predict_only:
        return predict_main(sweep, only, args)
    p = execute.plan(sweep, only, args.results, args.fresh, args.rerun_failed)
    rel = _show(p.folder)
    _print_plan(sweep, p, mode, args.dry_run, rel)
    if args.dry_run:
        return _dry_run(sweep, p)
    for what, folder in (("results folder", p.folder), ("logs folder", p.logs)):
        check_writable(folder, what, folder=True)
    try:
        counts = execute.execute(sweep, p, mode, argv)
    except (KeyboardInterrupt, execute._Stop) as e:
        return _interrupted(p, e)
    return _finish(sweep, p, mode, counts, rel)


def predict_main(sweep, only, args) -> int:
    """--predict-only: every selected cell predicted (ddlbench/sweep/predicted.py), reported
    like a measured sweep, in a folder of its own."""
    import time
    from ddlbench.sweep import predicted, report
    cells = [c for c in sweep.cells() if only is None or only(c.axes())]
    if not cells:
        raise UsageError("--only matches no cell of this sweep")
    folder = os.path.abspath(args.results) if args.results else os.path.join(
        sweep.results_root, f"{time.strftime('%Y-%m-%d')}-{sweep.name}-predicted")
    check_writable(folder, "results folder", folder=True)
    began = time.perf_counter()
    n, notes = predicted.run(sweep, cells, folder)
    for note in sweep.notes + notes:
        print(f"benchmarks.py: {note}", file=sys.stderr)
    t = report.write_all(folder, plots=not args.quiet)
    if not args.quiet:
        print(report.console(t), end="")
    print(f"benchmarks.py: {_n(n, 'cell')} predicted in {time.perf_counter() - began:.1f} s "
          f"(nothing run); reports in {os.path.join(_show(folder), 'README.md')}",
          file=sys.stderr)
    return 0


def _n(count: int, one: str, many: str | None = None) -> str:
    return f"{count} {one if count == 1 else many or one + 's'}"


def _show(path: str) -> str:
    rel = os.path.relpath(path)
    return path if rel.startswith("..") else rel


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        if argv and argv[0] == "report":
            return report_main(argv[1:])
        if argv and argv[0] == "run":
            argv = argv[1:]
        return run_main(argv)
    except UsageError as e:
        print(f"benchmarks.py: error: {e}", file=sys.stderr)
        return EXIT_USAGE


if __name__ == "__main__":
    sys.exit(main())

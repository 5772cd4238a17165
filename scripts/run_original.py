"""The original suite's own driver against this one (issue 46): run the original's
``benchmarks.py`` (HKBU-HPML/ddl-benchmarks, a checkout of it given as ORIGINAL; never copied
into this project) from the root of this checkout, then its ``plots.py`` for its table and
figures, exactly as written except for the module-level settings a user of the original edits
at the top of the file (worker counts, networks, tasks, tries), which this script sets on the
imported modules:

    python scripts/run_original.py ORIGINAL [--nworkers 4,8] [--rdmas 0]
        [--tasks resnet50:16,bert_tiny:8] [--tries 2] [--report]

Its commands then run this suite's launchers (``cd mgwfbp; ... ./horovod_mpi_cj.sh``, ``cd byteps;
... ./launch.sh``, ``cd byteps;./stop.sh`` after each PS method) on the hosts of
``configs/cluster<N>``: edit those as a user of the original would (for instance to the host
file of ``python -m ddlbench.netem cluster up --hosts 2 --slots 4``) and run this script on the
launch host (``python -m ddlbench.netem cluster exec -- python scripts/run_original.py ...``).
Small workloads through the launchers' variables in the environment: ``image_size=32 senlen=16
iters=1 extra_args="--num-warmup-batches 1 --num-batches-per-iter 2"``. The logs go to
``logs/pcie/`` and ``exp.log`` here, as the original's; ``--report`` writes ``results/<date>/``
with the original's ``plots.py``, whose 1-GPU figures are hard-coded for its own three tasks:
other tasks get 0 there. The original builds shell lines from these settings (``shell=True``):
every model is checked against this suite's models and every number is a number before
anything runs; ORIGINAL must be the original's checkout (a file only it has, not this one), and
a broken one is one line.
"""
from __future__ import annotations

import argparse
import os
import re
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
from ddlbench.errors import EXIT_USAGE, ArgumentParser, UsageError, first_line  # noqa: E402

SETTINGS = ("nworkers", "rdmas", "tasks", "NUM_OF_TRIES")
# Files of the original's checkout that this suite does not have (its identity: a folder with a
# benchmarks.py of something else, this checkout included, is not it)
ORIGINAL_ONLY = ("plots.py", "synclog.sh", "mgwfbp/hv_distributed_optimizer.py")
# What the original's commands put in a shell line (its gen_cmd, run with shell=True): a model
# name of this suite's launchers (checked against the models), numbers as numbers
MODEL = re.compile(r"[A-Za-z][A-Za-z0-9_]{0,63}")


def _ints(text: str, flag: str, low: int, high: int) -> list[int]:
    values = [v.strip() for v in text.split(",")]
    if not all(re.fullmatch(r"[0-9]{1,7}", v) and low <= int(v) <= high for v in values):
        raise UsageError(f"{flag} takes integers from {low} to {high}"
                         f"{'' if flag == '--tries' else ', comma-separated'}, got {text[:60]!r}")
    return [int(v) for v in values]


def _tasks(text: str) -> list[tuple[str, int]]:
    import models
    out = []
    for task in text.split(","):
        model, _, batch = task.strip().partition(":")
        if not MODEL.fullmatch(model) or not re.fullmatch(r"[0-9]{1,5}", batch) \
                or not 1 <= int(batch) <= 65536:
            raise UsageError(f"--tasks takes model:batch pairs (a model name, a batch from 1 "
                             f"to 65536), got {task[:60]!r}")
        models.check(model)
        out.append((model, int(batch)))
    return out


def _original(path: str) -> str:
    """``path`` if it is a checkout of the original (its benchmarks.py and a file only the
    original has), else a UsageError."""
    if not path.strip():
        raise UsageError("ORIGINAL is empty: give the path of a checkout of "
                         "HKBU-HPML/ddl-benchmarks")
    full = os.path.abspath(path)
    if os.path.isdir(full) and (os.path.samefile(full, ROOT) or
                                os.path.isfile(os.path.join(full, "ddlbench", "__init__.py"))):
        raise UsageError(f"{path} is this suite's checkout, not the original "
                         f"(HKBU-HPML/ddl-benchmarks)")
    if not os.path.isfile(os.path.join(full, "benchmarks.py")):
        raise UsageError(f"{path} has no benchmarks.py (a checkout of HKBU-HPML/ddl-benchmarks)")
    if not any(os.path.isfile(os.path.join(full, f)) for f in ORIGINAL_ONLY):
        raise UsageError(f"{path} is not a checkout of HKBU-HPML/ddl-benchmarks: it has none of "
                         f"{', '.join(ORIGINAL_ONLY)}")
    return full


def parse_args(argv=None):
    p = ArgumentParser(description=__doc__.split("\n\n")[0], raise_errors=True)
    p.add_argument("original", help="a checkout of HKBU-HPML/ddl-benchmarks")
    p.add_argument("--nworkers", default="4,8")
    p.add_argument("--rdmas", default="0")
    p.add_argument("--tasks", default="resnet50:16,bert_tiny:8", help="model:batch,...")
    p.add_argument("--tries", default="2", help="the original's NUM_OF_TRIES")
    p.add_argument("--report", action="store_true",
                   help="then the original's plots.py: results/<date>/README.md and figures")
    args = p.parse_args(argv)
    args.settings = {"nworkers": _ints(args.nworkers, "--nworkers", 1, 1048576),
                     "rdmas": _ints(args.rdmas, "--rdmas", 0, 2),
                     "tasks": _tasks(args.tasks),
                     "NUM_OF_TRIES": _ints(args.tries, "--tries", 1, 1000)[0]}
    if len(args.tries.split(",")) > 1:
        raise UsageError(f"--tries takes one integer, got {args.tries[:60]!r}")
    args.original = _original(args.original)
    return args


def _load(original: str, report: bool):
    """The original's modules, imported unmodified (a broken one: a UsageError)."""
    sys.path.insert(0, original)
    try:
        import benchmarks as driver       # the original's module, unmodified
        plots = None
        if report:
            import plots                  # its `from benchmarks import *` copied the old ones
    except Exception as e:   # its own error, whatever it is: one line
        raise UsageError(f"the original's modules in {original} do not import: "
                         f"{type(e).__name__}: {first_line(e)}") from None
    missing = [n for n in (*SETTINGS, "main") if not hasattr(driver, n)]
    if missing:
        raise UsageError(f"{original}/benchmarks.py is not the original's: it has no "
                         f"{', '.join(missing)}")
    return driver, plots


def _run(args) -> int:
    os.chdir(ROOT)                      # its commands are relative: cd mgwfbp, cd byteps
    os.makedirs(os.path.join("logs", "pcie"), exist_ok=True)
    if args.report:
        os.environ.setdefault("MPLBACKEND", "Agg")
        os.makedirs("results", exist_ok=True)
    original, plots = _load(args.original, args.report)
    for module in filter(None, (original, plots)):
        for name in SETTINGS:
            setattr(module, name, args.settings[name])
    if plots is not None:
        plots.single_throughputs.update({f"{m}_{b}": plots.single_throughputs.get(f"{m}_{b}", 0)
                                         for m, b in args.settings["tasks"]})
    original.main()
    if plots is not None:
        plots.generate_result("./results")
    return 0


def main(argv=None) -> int:
    try:
        return _run(parse_args(argv))
    except UsageError as e:
        print(f"run_original.py: error: {e}", file=sys.stderr)
        return EXIT_USAGE
    except Exception as e:    # the original's own run failing: one line, not its traceback
        print(f"run_original.py: error: the original's run failed: {type(e).__name__}: "
              f"{first_line(e)}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())

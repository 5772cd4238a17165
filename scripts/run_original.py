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
other tasks get 0 there.
"""
from __future__ import annotations

import argparse
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SETTINGS = ("nworkers", "rdmas", "tasks", "NUM_OF_TRIES")


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("original", help="a checkout of HKBU-HPML/ddl-benchmarks")
    p.add_argument("--nworkers", default="4,8")
    p.add_argument("--rdmas", default="0")
    p.add_argument("--tasks", default="resnet50:16,bert_tiny:8", help="model:batch,...")
    p.add_argument("--tries", type=int, default=2, help="the original's NUM_OF_TRIES")
    p.add_argument("--report", action="store_true",
                   help="then the original's plots.py: results/<date>/README.md and figures")
    args = p.parse_args(argv)
    try:
        args.settings = {
            "nworkers": [int(x) for x in args.nworkers.split(",")],
            "rdmas": [int(x) for x in args.rdmas.split(",")],
            "tasks": [(t.split(":")[0], int(t.split(":")[1])) for t in args.tasks.split(",")],
            "NUM_OF_TRIES": args.tries}
    except (ValueError, IndexError):
        p.error("--nworkers and --rdmas take integers, --tasks model:batch pairs")
    if not os.path.isfile(os.path.join(args.original, "benchmarks.py")):
        p.error(f"{args.original} has no benchmarks.py (a checkout of HKBU-HPML/ddl-benchmarks)")
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    os.chdir(ROOT)                      # its commands are relative: cd mgwfbp, cd byteps
    os.makedirs(os.path.join("logs", "pcie"), exist_ok=True)
    sys.path.insert(0, os.path.abspath(args.original))
    import benchmarks as original       # the original's module, unmodified
    for name in SETTINGS:
        setattr(original, name, args.settings[name])
    if args.report:
        os.environ.setdefault("MPLBACKEND", "Agg")
        os.makedirs("results", exist_ok=True)
        import plots                    # its `from benchmarks import *` copied the old ones
        for name in SETTINGS:
            setattr(plots, name, args.settings[name])
        plots.single_throughputs.update({f"{m}_{b}": plots.single_throughputs.get(f"{m}_{b}", 0)
                                         for m, b in args.settings["tasks"]})
        original.main()
        plots.generate_result("./results")
    else:
        original.main()
    return 0


if __name__ == "__main__":
    sys.exit(main())

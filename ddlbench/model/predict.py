"""Predict each method's iteration from a profile: ``python -m ddlbench.model.predict``.

    python -m ddlbench.measure.profiler --model resnet18 --image-size 64 --batch-size 16 \\
        --nworkers 2 --output resnet18.json
    python -m ddlbench.model.predict --profile resnet18.json --method all
    python -m ddlbench.model.predict --profile configs/profiles/h200_resnet50_bs64.json \\
        --topology cloud-100g --nworkers 8,64,1024 --advise

The profile (the profiler's JSON: forward time, per-tensor backward times, shapes and bytes in
backward order, the optimizer's step, and the alpha and beta it fitted on the all-reduces of the
run it measured) goes through ``ddlbench.model.simulate``: one steady-state iteration per method and
worker count. The network is ``--topology``: a topology (``configs/topology/NAME.yaml``, a name of
one, or any such file: nodes, devices per node, links, ring or hierarchical all-reduce,
parameter servers) or ``python -m ddlbench.measure.comm_bench --output`` files (comma-separated,
one per
worker count; ``--ops pushpull`` for the PS methods), from which every collective's alpha-beta
follows per worker count (``ddlbench.model.topology``). Without it, the profile's own alpha and beta
(or ``--alpha``/``--beta``) cost every all-reduce, for the all-reduce methods only.

Prints per worker count and method the predicted iteration, throughput, compute, exposed
communication, overlap and what bounds it, then a method x workers throughput table (the
original suite's results layout); ``--output`` writes them as JSON, ``--traces DIR`` each
prediction's trace (``python -m ddlbench.timeline`` reads them beside a measured one).
``--compressor`` (any registered, with its options' flags) costs what the compressor declares it
sends (``compression.Compressor.sends_for``) with its encode and decode time per element from
``--codec FILE`` (``python -m ddlbench.measure.codec_bench --output``).
``--device-throughput X`` rescales the profile's compute so that one worker trains X samples/s
(another device, same shape). ``--advise`` searches each method's settings with the simulator
and prints them ranked, with the speedup over DDP at its defaults.

The methods' options are the training script's flags, generated from the registry
(``ddlbench.methods``: the same names, flags, checks and defaults, a plugin's included), and a
method's options (``options_of``) are what its rule reads (``ddlbench.methods.rules``).

Each prediction is ``ddlbench.model.cell.predict``'s, the one path the sweep and the validation
take too: a PS method whose workers fit one machine of the topology runs as its local
all-reduce (no server; ``--ps-force-servers``: servers anyway), and MG-WFBP plans on the link it
is costed on, or with ``--mgwfbp-ab table`` the original's table for the worker count and
``--ab-network`` (as the original planned it).
"""
from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import time
from dataclasses import fields, replace

import compression

from .. import methods, timeline
from . import cell, score, simulate, topology
from ..errors import ArgumentParser, UsageError, check_writable, open_to_write, read_json, run_cli
from ..options import LIMITS, add_flags
from ..measure.profile_file import MAX_BETA, MAX_TIME_S, read_profile
from ..methods import PS
from ..methods.rules import MIB
from ..planning import DEFAULT_PARTITION_BYTES, original_alpha_beta

# The largest worker count predicted: the suite's bound on --nworkers (options.LIMITS, 2**20),
# far above the 1024 workers the model is made for.
MAX_WORKERS = LIMITS["--nworkers"]
# Upper bounds of the other sizes (beyond them a prediction is of nothing that can run).
BOUNDS = {"--batch-size": LIMITS["--batch-size"],
          "--num-batches-per-iter": LIMITS["--num-batches-per-iter"],
          "--nservers": LIMITS["--nservers"], "--device-throughput": 1e9}
BOUND_WHY = {"--batch-size": "the training script's bound",
             "--num-batches-per-iter": "the training script's bound",
             "--nservers": "the training script's bound",
             "--device-throughput": "samples/s of one worker",
             "--alpha": "seconds a message's start costs", "--beta": "seconds per byte",
             "--optimizer-ms": "a day", "--issue-us": "a day"}
# The upper bounds of the figures of the model (a profile's bounds, profile_file), and the
# slowest device: beyond them a prediction is inf, nan or a number of hundreds of digits.
BOUNDS.update({"--alpha": 10.0, "--beta": MAX_BETA, "--optimizer-ms": MAX_TIME_S * 1e3,
               "--issue-us": MAX_TIME_S * 1e6})
LEAST = {"--device-throughput": (1e-3, "a sample in 1000 s")}


def parse_args(argv=None):
    p = ArgumentParser(prog="python -m ddlbench.model.predict", description=__doc__.split("\n")[0],
                       raise_errors=True)
    p.add_argument("--profile", required=True, help="the profiler's JSON (--output FILE)")
    p.add_argument("--model", default=None,
                   help="the model the profile must be of (a check; default: the profile's)")
    p.add_argument("--method", default="all",
                   help=f"comma-separated, or all ({', '.join(simulate.METHODS)})")
    p.add_argument("--topology", default=None,
                   help="topology YAML (or the name of one in configs/topology: "
                        f"{', '.join(topology.names())}) or comm_bench JSON files")
    # the flag's old name: refused with one line (check)
    p.add_argument("--network", dest="old_network", default=None, help=argparse.SUPPRESS)
    p.add_argument("--extrapolate", action="store_true",
                   help="comm_bench files: cost worker counts they lack with the ring's "
                        "per-step alpha and beta of the nearest measured count; the profile's "
                        "compute: the workers sharing the cores at more workers than it was "
                        "measured at (as a calibrated sweep's extrapolation)")
    p.add_argument("--cores", type=int, default=None,
                   help="the cores all the workers share, on one machine (default: the "
                        "profile's machine, as the profiler records it; 0: not shared)")
    p.add_argument("--threads", type=int, default=None,
                   help="torch threads per worker (default: the profile's, else 1)")
    p.add_argument("--alpha", type=float, default=None, help="seconds per message")
    p.add_argument("--beta", type=float, default=None, help="seconds per byte")
    p.add_argument("--nworkers", default=None,
                   help=f"worker counts, comma-separated, each at most {MAX_WORKERS} "
                        f"(default: the profile's)")
    p.add_argument("--batch-size", type=int, default=None,
                   help="per-worker batch (default: the profile's)")
    p.add_argument("--device-throughput", type=float, default=None, metavar="SAMPLES_PER_S",
                   help="rescale the profile's compute to this one-worker throughput (at "
                        "most 1e9)")
    p.add_argument("--no-interference", action="store_true",
                   help="ignore the profile's CPU interference (compute and communication "
                        "slowing each other)")
    p.add_argument("--optimizer-ms", type=float, default=None,
                   help="the optimizer's step per iteration (default: the profile's, else 0)")
    p.add_argument("--issue-us", type=float, default=None,
                   help="the training thread's time to issue one collective, in us (the "
                        "bucketed all-reduce methods'; default: the profile's host.issue_s, "
                        "else 0)")
    # the methods' options, as the training script has them (their declarations' flags)
    add_flags(p.add_argument_group("methods' options (each: the methods declaring it and their "
                                   "defaults; --nservers: default the network's servers)"),
              methods.option_owners())
    p.add_argument("--ab-network", default=None, choices=("rdma0", "rdma1", "rdma2"),
                   help="--mgwfbp-ab table: the network whose table (as DDLBENCH_NETWORK: "
                        "rdma1 and rdma2 the 56Gbps one; default: the 10Gbps one)")
    p.add_argument("--num-batches-per-iter", type=int, default=None, metavar="STEPS",
                   help="predict a timing round of the training script's protocol (STEPS "
                        "steps, then synchronize: ByteScheduler's next forward loses its "
                        "overlap there) to compare with a run; default: steady state")
    p.add_argument("--ps-force-servers", action="store_true",
                   help="the PS methods push to servers even when the workers fit one "
                        "machine (default: there they run as a local all-reduce, as BytePS)")
    p.add_argument("--compressor", default="none",
                   help=f"one of {', '.join(compression.COMPRESSORS)}")
    add_flags(p, compression.option_owners())
    p.add_argument("--codec", default=None, metavar="FILE",
                   help="codec_bench --output JSON: encode/decode time per element")
    p.add_argument("--advise", action="store_true",
                   help="search each method's settings and rank the methods")
    p.add_argument("--output", default=None, help="write the predictions here as JSON")
    p.add_argument("--traces", default=None, metavar="DIR",
                   help="write each prediction's trace here (METHOD_PWORKERS.trace.json)")
    return p.parse_args(argv)


def _counts(text) -> list[int] | None:
    if text is None:
        return None
    try:
        counts = [int(x) for x in str(text).split(",") if x.strip()]
    except ValueError:
        raise UsageError(f"--nworkers takes comma-separated worker counts, got {text!r}") \
            from None
    if not counts or any(c < 1 for c in counts):
        raise UsageError(f"--nworkers takes positive worker counts, got {text!r}")
    if max(counts) > MAX_WORKERS:
        raise UsageError(f"--nworkers takes worker counts up to {MAX_WORKERS}, got "
                         f"{max(counts)}")
    return sorted(set(counts))


def _shown(value) -> str:
    """A number in a message: an integer as written (a huge one shortened), a float as %g."""
    if isinstance(value, int):
        return str(value) if value < 10 ** 15 else f"{value:.3g}"
    return f"{value:g}"


def _finite(flag: str, value) -> None:
    """One line for an infinite or undefined number (inf, nan): no setting is one."""
    if value is not None and not math.isfinite(value):
        raise UsageError(f"{flag} must be a finite number, got {value}")


def _bounded(flag: str, value) -> None:
    """One line for a number beyond its flag's bounds (``BOUNDS``, ``LEAST``)."""
    if value is not None and value > BOUNDS.get(flag, math.inf):
        raise UsageError(f"{flag} must be at most {_shown(BOUNDS[flag])} "
                         f"({BOUND_WHY[flag]}), got {_shown(value)}")
    least, why = LEAST.get(flag, (None, ""))
    if value is not None and least is not None and value < least:
        raise UsageError(f"{flag} must be at least {_shown(least)} ({why}), got "
                         f"{_shown(value)}")


def check(args) -> list[str]:
    """The methods to predict; every problem one UsageError."""
    if args.old_network is not None:
        raise UsageError("--network is now --topology (a topology file or name, or comm_bench "
                         "files)")
    if (args.alpha is None) != (args.beta is None):
        raise UsageError("--alpha and --beta go together")
    if args.alpha is not None and args.topology:
        raise UsageError("--alpha/--beta or --topology, not both")
    for flag, value in (("--alpha", args.alpha), ("--beta", args.beta),
                        ("--optimizer-ms", args.optimizer_ms), ("--issue-us", args.issue_us),
                        ("--cores", args.cores)):
        _finite(flag, value)
        if value is not None and not value >= 0:
            raise UsageError(f"{flag} must be >= 0, got {value}")
        _bounded(flag, value)
    _check_method_options(args)
    for flag, value in (("--batch-size", args.batch_size), ("--nservers", args.nservers),
                        ("--num-batches-per-iter", args.num_batches_per_iter),
                        ("--device-throughput", args.device_throughput),
                        ("--threads", args.threads)):
        _finite(flag, value)
        if value is not None and not value > 0:
            raise UsageError(f"{flag} must be positive, got {value}")
        _bounded(flag, value)
    if args.ab_network is not None and args.mgwfbp_ab != "table":
        raise UsageError("--ab-network names the original's table: it goes with --mgwfbp-ab "
                         "table")
    args.counts = _counts(args.nworkers)
    compression.check_options(args.compressor, **compressor_options(args))
    names = list(simulate.METHODS) if args.method == "all" else \
        [m.strip() for m in args.method.split(",") if m.strip()]
    for name in names:
        if name not in simulate.METHODS:
            raise UsageError(f"cannot predict method {name!r}; modelled: "
                             f"{', '.join(simulate.METHODS)}")
    if not names:
        raise UsageError("--method names no method")
    if args.method == "all":
        # what the network and the compressor allow
        if not args.topology:
            names = [m for m in names if m not in simulate.PS_METHODS]
        taken = simulate.COMPRESSORS_OF
        names = [m for m in names if args.compressor in taken[m]]
    else:
        for m in names:
            allowed = simulate.COMPRESSORS_OF[m]
            if args.compressor not in allowed:
                raise UsageError(f"method {m} does not take compressor {args.compressor} "
                                 f"(it takes {', '.join(allowed)})")
    if args.method != "all" and not args.topology:
        ps = [m for m in names if m in simulate.PS_METHODS]
        if ps:
            raise UsageError(f"{', '.join(ps)} need(s) --topology (a topology, or comm_bench "
                             f"files with --ops pushpull)")
    if args.output:
        check_writable(args.output)
    if args.traces:
        check_writable(args.traces, "--traces", folder=True)
    return names


def _check_method_options(args) -> None:
    """The methods' option flags checked as the training script checks them (each
    declaration's one line), after one line for a number that is none (inf, nan)."""
    for name, (spec, _) in methods.option_owners().items():
        value = getattr(args, name)
        if isinstance(value, float):
            _finite(spec.flag, value)
        problem = spec.problem(value)
        if problem:
            raise UsageError(problem)


def options_of(args, method: str):
    """``method``'s options from the flags (``Options.resolve``, as a run builds them: a flag
    not given is the method's default)."""
    return simulate.method_class(method).Options.resolve(vars(args))


def measured_over(prof: dict) -> str:
    """The network a profile's all-reduces crossed: its emulated link (``net``), else its
    label."""
    net = prof.get("net")
    if isinstance(net, dict) and net.get("profile"):
        return f"{net['profile']}{' (emulated)' if net.get('emulated') else ''}"
    return str(prof.get("network", "an unnamed network"))


def interference_of(prof: dict, ps: bool = False) -> dict:
    """The profile's CPU interference as ``simulate.Compute``'s slowdowns (a slowdown measured below
    0, noise, counts as 0; none where the profiler measured none). With ``ps`` (a
    parameter-server method) the one beside push/pulls where the profile has it
    (``interference_ps``: the servers sum on the workers' cores), else the all-reduces'. Of
    push/pulls through one client per machine the compute slowdown is rank 0's, a machine's
    leader (docs/DESIGN.md section 3: it sums its machine's gradients and pushes them on its
    own cores while it computes, and the others wait for its pulls): over loopback on 2
    workers the leader's backward took 287 ms beside WFBP-PS's push/pulls, the other's 201."""
    measured = prof.get("interference_ps") if ps else None
    measured = prof.get("interference") if measured is None else measured
    if measured is not None and not isinstance(measured, dict):
        raise UsageError(f"the profile's interference must be an object or null, got "
                         f"{measured!r}")
    measured = dict(measured or {})
    ranks = measured.get("per_rank")
    if measured.get("op") == "pushpull" and measured.get("ps_clients") == "machine" and ranks:
        if not (isinstance(ranks[0], list) and ranks[0]):
            raise UsageError(f"the profile's interference_ps per_rank must list each rank's "
                             f"slowdowns, got {ranks!r}")
        measured["compute_slowdown"] = ranks[0][0]
    slowdowns = {}
    for key in ("compute_slowdown", "comm_slowdown"):
        x = measured.get(key)      # None: not measured
        if x is None:
            continue
        if isinstance(x, bool) or not isinstance(x, (int, float)) or not -1 < x < float("inf"):
            raise UsageError(f"the profile's interference {key} must be a number above -1, "
                             f"got {x!r}")
        slowdowns[key] = max(0.0, float(x))
    return slowdowns


def workload_of(prof: dict, optimizer_s: float = 0.0, interference: bool = True,
                ps: bool = False) -> simulate.Compute:
    """The simulator's workload from a profile; with ``interference`` its CPU interference
    (``interference_of``; ``ps``: a parameter-server method's)."""
    shapes = [tuple(t["shape"]) if t.get("shape") else (max(1, t["bytes"] // 4),)
              for t in prof["tensors"]]
    slowdowns = interference_of(prof, ps) if interference else {}
    # each tensor's share of the forward (ByteScheduler's replay), where the profiler timed it
    shares = prof.get("forward_tensor_s")
    host = prof.get("host")    # the methods' copies, divides and issues, where measured
    if host is not None and not isinstance(host, dict):
        raise UsageError(f"the profile's host must be an object or null, got {host!r}")
    rates = {f.name: (host or {}).get(f.name) for f in fields(simulate.Host)}
    for k, x in rates.items():
        if x is not None and (isinstance(x, bool) or not isinstance(x, (int, float))
                              or not 0 <= x <= MAX_TIME_S):
            raise UsageError(f"the profile's host {k} must be a number from 0 to "
                             f"{MAX_TIME_S:g}, got {x!r}")
    return simulate.Compute(forward_s=float(prof["forward_s"]),
                             backward_s=[float(x) for x in prof["backward_s"]],
                             nbytes=[t["bytes"] for t in prof["tensors"]],
                             optimizer_s=optimizer_s,
                             names=[t["name"] for t in prof["tensors"]], shapes=shapes,
                             forward_tensor_s=(None if shares is None
                                               else [float(x) for x in shares]),
                             host=simulate.Host(**{k: float(x) for k, x in rates.items()
                                                   if x is not None}),
                             launch=launch_of(prof), **slowdowns)


def launch_of(prof: dict) -> simulate.Launch | None:
    """The host's side of an accelerator's step (the profile's ``launch``, in the profile's
    tensor order), or None (a CPU profile, or one from before it was measured)."""
    x = prof.get("launch")
    if not x:
        return None
    if not isinstance(x, dict) or not isinstance(x.get("backward_s"), list) or \
            len(x["backward_s"]) != len(prof["tensors"]):
        raise UsageError("the profile's launch needs the host's forward_s and one backward_s "
                         "per tensor")
    try:
        return simulate.Launch(float(x["forward_s"]), [float(v) for v in x["backward_s"]],
                               float(x.get("optimizer_s", 0.0)), float(x.get("hook_s", 0.0)))
    except (KeyError, TypeError, ValueError) as e:
        raise UsageError(f"the profile's launch is malformed: {e}") from None


def slowest_rank(prof: dict, nworkers: int) -> float:
    """How many times rank 0's compute the slowest rank's is, in a profile measured at
    ``nworkers`` ranks (every rank profiling at once, the run's placement): in a synchronous
    step the others wait for the slowest (docs/DESIGN.md section 3). From every rank's passes
    (``rank_passes_s``, the ranks meeting before each, as a run's steps do): the mean of each
    step's slowest over rank 0's mean; from a profile with only each rank's mean
    (``rank_compute_s``), the slowest mean over rank 0's. At least 1; 1 for a profile without
    them or measured at another worker count (the spread of P ranks says nothing of another
    P's)."""
    if nworkers < 2:
        return 1.0
    passes = _step_passes(prof, nworkers)
    if passes:
        n = min(len(p) for p in passes)
        return max(1.0, sum(max(p[i] for p in passes) for i in range(n))
                   / sum(passes[0][:n]))
    ranks = prof.get("rank_compute_s")
    if not ranks or len(ranks) != nworkers:
        return 1.0
    return max(1.0, max(ranks) / ranks[0])


def machine_of(prof: dict, nworkers: int, *, cores: int | None = None,
               threads: int | None = None, calibrated_at: int | None = None,
               pace: float = 1.0) -> cell.Machine:
    """The machine ``cell.predict`` adjusts a cell of ``nworkers`` for (the one rule the
    command line and the sweep share): ``cores`` and ``threads`` as given, else the profile's
    (``machine``: the profiler records them), else cores not known (nothing shared; ``cores``
    0: the same, said) and 1 thread; the slowest rank of the profile at the worker count it
    was measured at (``calibrated_at``, else the cell's own)."""
    rec = prof.get("machine") or {}
    if not isinstance(rec, dict):
        raise UsageError(f"the profile's machine must be an object or null, got {rec!r}")
    if cores is None:
        cores = rec.get("cores")
    cores = cores or None        # 0: not one machine's (each worker a machine of its own)
    threads = threads or rec.get("threads") or 1
    at = calibrated_at or nworkers
    return cell.Machine(cores=cores, threads=int(threads), calibrated_at=calibrated_at,
                        pace=pace, slowest_rank=slowest_rank(prof, at))


def spread_of(prof: dict, network: str | None = None) -> cell.Spread:
    """The inputs' spread (``cell.Spread``): the compute's from the profile's repeated passes
    (``rank_passes_s``: each step's slowest rank, its fastest and slowest step over their
    mean: the ends of what was recorded, since a run's pace moves between runs more than the
    steps' mean says), the links' from comm_bench files (``network``, comma-separated: each
    all-reduce size's fastest and slowest round over its time, the median over the sizes);
    a topology file's links take the ranges its provenance states (``cell.predict`` reads
    them from the network itself), so none here."""
    sources, compute, link = [], (1.0, 1.0), (1.0, 1.0)
    passes = prof.get("rank_passes_s")
    if passes and all(isinstance(p, list) and p for p in passes):
        n = min(len(p) for p in passes)
        steps = [max(float(p[i]) for p in passes) for i in range(n)]
        mean = sum(steps) / n
        if n >= 2 and mean > 0:
            compute = (min(1.0, min(steps) / mean), max(1.0, max(steps) / mean))
            sources.append(f"compute x[{compute[0]:.3f}, {compute[1]:.3f}]: the profile's "
                           f"{n} steps (fastest, slowest)")
    files = [f for f in (network or "").split(",") if f.endswith(".json")]
    ratios = []
    for path in files:
        body = read_json(path, f"comm_bench file {path}")
        for res in body.get("results", []) if isinstance(body, dict) else []:
            for r in res.get("rows", []) if res.get("op") == "allreduce" else []:
                st, t = r.get("time_stats_s") or {}, r.get("time_s")
                if t and st.get("min") and st.get("max"):
                    ratios.append((st["min"] / t, st["max"] / t))
    if ratios:
        link = (min(1.0, statistics.median(r[0] for r in ratios)),
                max(1.0, statistics.median(r[1] for r in ratios)))
        sources.append(f"links x[{link[0]:.3f}, {link[1]:.3f}]: comm_bench's rounds "
                       f"(fastest and slowest, median over {len(ratios)} sizes)")
    elif files:
        sources.append("links: no recorded spread in the comm_bench files")
    return cell.Spread(compute, link, tuple(sources))


def _step_passes(prof: dict, nworkers: int) -> list | None:
    """Every rank's passes (``rank_passes_s``) in a profile of ``nworkers`` ranks, else None."""
    passes = prof.get("rank_passes_s")
    return passes if passes and len(passes) == nworkers else None


def rescaled(work: simulate.Compute, batch: int, throughput: float) -> simulate.Compute:
    """``work`` with every compute time scaled so one worker trains ``throughput`` samples/s
    (its iteration ``batch / throughput``); the shape of the profile, the per-tensor forward
    and the interference slowdowns are kept."""
    return scaled(work, batch / throughput / work.compute_s)


def scaled(work: simulate.Compute, f: float, host: bool = False) -> simulate.Compute:
    """``work`` with every compute time ``f`` times as long (and, with ``host``, its host
    copies, divides, issues and launches too: the whole machine's pace, ``cell.adjusted``);
    the shape of the profile and the interference slowdowns are kept."""
    if host:
        return cell.adjusted(work, simulate.NO_CODEC, {"compute": f, "kappa": 1.0,
                                                       "mu": 1.0})[0]
    shares = work.forward_tensor_s
    return replace(work, forward_s=work.forward_s * f, backward_s=[x * f for x in work.backward_s],
                   optimizer_s=work.optimizer_s * f,
                   forward_tensor_s=None if shares is None else [x * f for x in shares])


def compressor_options(args) -> dict:
    """Every compressor option's value from the flags (the compressors' own ``Options``
    flags; None: the compressor's default)."""
    return {spec.name: getattr(args, spec.name) for spec in compression.specs()}


def _codec_times(path: str | None, model: str,
                 compressor: str) -> tuple[float, float, float]:
    """(encode, decode, encode done when a bucket is waited for) seconds per dense element,
    from ``codec_bench --output``; a file from before the last was written has 0 for
    it."""
    if path is None or compressor == "none":
        return 0.0, 0.0, 0.0
    # the compressor whose figures its codec costs (its declared codec class; else its own)
    compressor = compression.lookup(compressor).codec_class or compressor
    data = read_json(path, f"--codec {path}")
    models = data.get("models") if isinstance(data, dict) else None
    entry = None
    if isinstance(models, dict):
        of = models.get(model)
        if of is None and len(models) == 1:     # a bench of another model name: its only one
            of = next(iter(models.values()))
        entry = ((of or {}).get("compressors") or {}).get(compressor)
    if not isinstance(entry, dict) or "encode_s_per_element" not in entry:
        raise UsageError(f"--codec {path} has no {compressor} timing for model {model} "
                         f"(write one with python -m ddlbench.measure.codec_bench --model {model} "
                         f"--compressor {compressor} --output FILE)")
    return (float(entry["encode_s_per_element"]), float(entry["decode_s_per_element"]),
            float(entry.get("encode_at_wait_s_per_element") or 0.0))


class Setting:
    """Everything a method's prediction depends on besides the profile: the worker count and
    the network's costs for it, and the method's settings. Without a network, the all-reduce
    link is --alpha/--beta or the profile's own fit (``given``, at every worker count)."""

    def __init__(self, args, prof, network, nworkers):
        self.args, self.nworkers, self.network = args, nworkers, network
        self.given = self.source = None
        if network is None and args.alpha is not None:
            self.given, self.source = simulate.Link(args.alpha, args.beta), "--alpha/--beta"
        elif network is None:
            self.given = simulate.Link(prof["alpha_s"], prof["beta_s_per_byte"])
            self.source = "the profile's alpha-beta"
        self.link = self.given or network.link("allreduce", nworkers)
        # the PS methods' CPU interference (``interference_of``), where the profile has one
        self.ps_interference = ({} if getattr(args, "no_interference", False)
                                else interference_of(prof, ps=True))
        # the machine (cores, threads, the slowest rank; with --extrapolate the workers
        # sharing the cores beyond the profile's count) and the inputs' spread
        self.machine = machine_of(
            prof, nworkers, cores=getattr(args, "cores", None),
            threads=getattr(args, "threads", None),
            calibrated_at=int(prof.get("nworkers") or 1) if args.extrapolate else None)
        self.spread = spread_of(prof, args.topology)

    def spread_note(self) -> str:
        """Where the intervals come from, in words (``cell.spread_note``)."""
        return cell.spread_note(self.spread, self.network)

    @property
    def has_interval(self) -> bool:
        """Whether the cells here have an interval (a recorded spread or stated ranges)."""
        return self.spread_note() != cell.NO_SPREAD

    def allgather(self):
        return self.network.link("allgather", self.nworkers) if self.network else self.link

    def pushes(self, method: str) -> bool:
        """Whether ``method`` pushes to servers here (a PS method off one machine, or
        forced)."""
        return (simulate.method_class(method).architecture == PS and
                cell.local_method(method, self.nworkers, self.network,
                                  force_servers=self.args.ps_force_servers) is None)

    def servers(self, nservers):
        """The servers' links (an early check that the network has them)."""
        return self.network.ps(self.nworkers, nservers, self.args.ps_clients)


def _plans_on_table(args, method: str) -> bool:
    """Whether ``method`` plans its grouping with the original's alpha-beta table under the
    flags (the option its rule names, ``Rule.plan_ab``: MG-WFBP's ``--mgwfbp-ab``)."""
    option = simulate.method_class(method).rule.plan_ab
    return option is not None and getattr(options_of(args, method), option) == "table"


def run_one(method: str, work, setting: Setting, codec, values: dict | None = None,
            options=None):
    """``method``'s prediction at ``setting`` (``run_cell``'s, without its interval)."""
    return run_cell(method, work, setting, codec, values, options, spread=False).prediction


def run_cell(method: str, work, setting: Setting, codec, values: dict | None = None,
             options=None, spread: bool = True) -> cell.Answer:
    """``method`` at ``setting`` by ``ddlbench.model.cell.predict``, the one path the sweep
    and the validation take too: the prediction, where its network came from, notes. Its
    options: ``options`` (default: the flags', ``options_of``) with ``values`` (option name
    -> value, an ``--advise`` grid's) applied by ``dataclasses.replace``."""
    args = setting.args
    if options is None:
        options = options_of(args, method)
    options = simulate.options_for(method, options, **(values or {}))
    return cell.predict(method, work, setting.nworkers, options, machine=setting.machine,
                        spread=setting.spread, interval=spread,
                        batches_per_iter=args.num_batches_per_iter, network=setting.network,
                        link=setting.given, link_source=setting.source, codec=codec,
                        force_servers=args.ps_force_servers,
                        ps_interference=setting.ps_interference,
                        table_network=args.ab_network)


# --------------------------------------------------------------------------- advice

def _grid(method: str, setting: Setting, work) -> list[dict]:
    """The option values ``--advise`` tries for ``method`` (option name -> value, applied to
    its options by ``dataclasses.replace``): its rule's grid (``rules.Rule.advise``), for a
    parameter-server method crossed with the servers and partitions the network allows."""
    cls = simulate.method_class(method)
    own = cls.rule.advise(sum(work.nbytes))
    if cls.architecture == PS:
        if hasattr(setting.network, "default_nservers"):
            machines = setting.network.default_nservers(setting.nworkers)
            counts = sorted({1, machines, 2 * machines,
                             *(k for k in (machines // 2, machines // 4) if k >= 1)})
        else:
            counts = [None]      # measured push/pull: the servers it was measured with
        parts = (1 << 20, DEFAULT_PARTITION_BYTES, 16 << 20)
        own = [{"nservers": k, "partition_bytes": p, **s}
               for k in counts for p in parts for s in own]
    return own


def _describe(values: dict) -> str:
    """An ``--advise`` grid's option values in a few words."""
    parts = []
    for key, value in values.items():
        if value is None:
            continue
        if key == "threshold":
            parts.append(f"threshold {value / MIB:g} MiB")
        elif key == "partition_bytes":
            parts.append(f"partition {value / MIB:g} MiB")
        elif key == "mgwfbp_min_group":
            parts.append(f"min group {value} el.")
        elif key == "bucket_cap_mb":
            parts.append(f"bucket cap {value:g} MiB")
        elif key in ("partition", "credit"):
            parts.append(f"{key} {value / 1e6:g}M el.")
        elif key == "nservers":
            parts.append(f"{value} server{'s' if value != 1 else ''}")
        else:
            parts.append(f"{key} {value}")
    return ", ".join(parts) or "-"


def _reason(p) -> str:
    m = p.metrics
    comm = m["comm_s"] * 1e3
    hidden = "-" if m["overlap"] is None else f"{100 * m['overlap']:.0f}%"
    n = len(p.message_bytes)
    cls = simulate.method_class(p.method)
    what = "unit" if cls.architecture == PS and cls.rule.grouping is not None else "message"
    return (f"{n} {what}{'s' if n != 1 else ''}, {comm:.1f} ms of communication, {hidden} "
            f"hidden, {m['exposed_s'] * 1e3:.1f} ms exposed")


def baseline() -> str:
    """The method ``--advise`` compares the others with (torch DDP: ``Method.baseline``)."""
    return next(mid for mid, cls in methods.registry().items() if cls.baseline)


def advise(names, work, setting, codec, batch) -> list[dict]:
    """Per method the best of its settings grid (on its options from the flags); ranked, with
    the speedup over DDP at its defaults: the synchronous-SGD methods first, then those that
    change the algorithm (``Method.changes_algorithm``: periodic averaging), ranked apart
    (nothing here knows what they cost in model quality)."""
    ddp = run_one(baseline(), work, setting, simulate.NO_CODEC,
                  options=simulate.options_for(baseline()))
    rows = []
    for name in names:
        best = None
        for s in _grid(name, setting, work):
            p = run_one(name, work, setting, codec, s)
            if best is None or p.iteration_s < best[1].iteration_s:
                best = (s, p)
        s, p = best
        answer = run_cell(name, work, setting, codec, s)     # its interval too
        rows.append({"method": name, "settings": s, "iteration_s": p.iteration_s,
                     "throughput": p.throughput(batch, setting.nworkers),
                     "interval": list(answer.interval(batch, setting.nworkers)),
                     "speedup_vs_ddp": ddp.iteration_s / p.iteration_s,
                     "bottleneck": p.bottleneck, "reason": _reason(p),
                     "changes_algorithm": simulate.method_class(name).changes_algorithm})
    rows.sort(key=lambda r: (r["changes_algorithm"] is not None, r["iteration_s"]))
    return tied(rows)


BEST, TIED = "(best)", "(tied)"     # as the sweep's report marks measurements


def tied(rows: list[dict]) -> list[dict]:
    """``rows`` (ranked, fastest first) with each one's ``standing``: BEST for the fastest
    synchronous-SGD method, TIED for each other one whose [low, high] interval overlaps the
    best's (the model cannot tell them apart), else ""; the methods that change the algorithm
    are ranked apart and marked among themselves alike."""
    for apart in (False, True):
        group = [r for r in rows if (r["changes_algorithm"] is not None) == apart]
        if not group:
            continue
        group[0]["standing"] = BEST
        for r in group[1:]:
            r["standing"] = TIED if score.overlaps(r["interval"], group[0]["interval"]) else ""
    return rows


def beyond(setting, prof: dict) -> str | None:
    """A line when ``setting``'s worker count lies beyond the counts its constants were
    validated or measured at (a topology's ``validated_workers``, comm_bench files' largest
    count, the profile's own all-reduce fit's workers), or when none is stated; else None."""
    net, n = setting.network, setting.nworkers
    if isinstance(net, topology.Topology):
        limit, what = net.validated_workers, f"{net.name}'s constants were validated at"
        if limit is None:
            return (f"{net.name} states no worker count its constants were validated at "
                    f"(validated_workers): {n} workers is a prediction nothing has checked")
    elif net is not None:
        limit, what = net.max_workers, f"{net.name} was measured at"
    elif setting.source == "the profile's alpha-beta":
        limit, what = int(prof.get("nworkers") or 1), "the profile's alpha-beta was fitted at"
    else:
        return None
    if n <= limit:
        return None
    return (f"{n} workers lies beyond the {limit} workers {what}: an extrapolation, "
            f"its ranking unchecked")


# --------------------------------------------------------------------------- output

def _table(header, rows, left=(0,)) -> list[str]:
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    return ["  ".join(c.ljust(w) if i in left else c.rjust(w)
                      for i, (c, w) in enumerate(zip(r, widths))).rstrip()
            for r in [header, *rows]]


def run(args) -> int:
    names = check(args)
    prof = read_profile(args.profile)
    if args.model is not None and prof["model"] != args.model:
        raise UsageError(f"profile {args.profile} is of model {prof['model']}, not "
                         f"{args.model}")
    work, batch = _workload_for(args, prof)
    network = topology.load(args.topology, args.extrapolate) if args.topology else None
    if args.method == "all":
        # (a method with collectives of its own needs a network that prices them; on the
        # groups of the placement, one that knows machines)
        names = [m for m in names if cell.priced_on(m, network)]
    counts = args.counts or [int(prof.get("nworkers") or 1)]
    enc, dec, enc_wait = _codec_times(args.codec, prof["model"], args.compressor)
    codec = simulate.Codec(args.compressor, 1, compressor_options(args), enc, dec,
                           encode_at_wait_s_per_element=enc_wait)
    # every worker count's costs first: a network that lacks one is an error before any output
    settings = [Setting(args, prof, network, n) for n in counts]
    for setting in settings:
        if any(setting.pushes(m) for m in names):
            setting.servers(args.nservers)
        if any(_plans_on_table(args, m) for m in names):
            original_alpha_beta(setting.nworkers, args.ab_network)
        if codec.gathers:
            setting.allgather()
    unit = "img" if "image_size" in (prof.get("workload") or {}) else "sen"
    _print_preamble(args, prof, names, work, batch, network, settings[0], unit)
    out, matrix = [], {}
    began = time.perf_counter()
    for setting in settings:
        out += _predict_at(args, prof, names, setting, work, codec, batch, unit, matrix)
    if len(counts) > 1:
        best = " at the best settings" if args.advise else ""
        print(f"\nPredicted {unit}/s (total over all workers){best}:")
        rows = [[name, *(f"{matrix[name][c]:.1f}" for c in counts)] for name in matrix]
        print("\n".join(_table(["method", *(f"{c} workers" for c in counts)], rows)))
    print(f"\n({time.perf_counter() - began:.2f} s to predict)")
    if args.output:
        _write(args, prof, counts, batch, network, work, out)
    return 0


def _workload_for(args, prof) -> tuple:
    """(the replay's workload, the batch per worker) from the profile and the flags that
    change it (--optimizer-ms, --no-interference, --issue-us, --batch-size,
    --device-throughput)."""
    optimizer_s = (args.optimizer_ms / 1e3 if args.optimizer_ms is not None
                   else float(prof.get("optimizer_s") or 0.0))
    work = workload_of(prof, optimizer_s, interference=not args.no_interference)
    if args.issue_us is not None:
        work = replace(work, host=replace(work.host, issue_s=args.issue_us / 1e6))
    batch = args.batch_size or int((prof.get("workload") or {}).get("batch_size") or 1)
    if args.device_throughput:
        work = rescaled(work, batch, args.device_throughput)
    return work, batch


def _print_preamble(args, prof, names, work, batch, network, setting, unit) -> None:
    """What is predicted: the workload, compressor and network, and the CPU interference."""
    where = (network.describe() if network is not None else
             "the profile's alpha-beta" if args.alpha is None else "--alpha/--beta")
    print(f"Predicted: {prof['model']}, batch {batch} per worker, compute "
          f"{work.compute_s * 1e3:.1f} ms an iteration ({batch / work.compute_s:.1f} {unit}/s "
          f"on one worker), {len(work.nbytes)} tensors, {sum(work.nbytes) / 1e6:.3f} MB; "
          f"compressor {args.compressor}; network: {where}")
    if work.compute_slowdown or work.comm_slowdown:
        print(f"CPU interference (the profile's, measured over {measured_over(prof)}): compute "
              f"x{1 + work.compute_slowdown:.2f} beside communication, communication "
              f"x{1 + work.comm_slowdown:.2f} beside compute (it is the network's: profile "
              f"over the one you predict, the profiler's --net; --no-interference: without)")
    x = setting.ps_interference
    if prof.get("interference_ps") and x and any(m in simulate.PS_METHODS for m in names):
        print(f"CPU interference beside push/pulls (the PS methods'): compute "
              f"x{1 + x.get('compute_slowdown', 0.0):.2f}, communication "
              f"x{1 + x.get('comm_slowdown', 0.0):.2f}")


def _predict_at(args, prof, names, setting, work, codec, batch, unit, matrix) -> list:
    """One worker count's predictions (or, with --advise, its ranking), printed as a table;
    each method's throughput noted in ``matrix``; the entries of the JSON output."""
    nworkers = setting.nworkers
    print(f"\n{nworkers} worker(s): all-reduce alpha {setting.link.alpha * 1e6:.2f} us, "
          f"beta {setting.link.beta * 1e9:.4f} ns/B")
    machine = setting.machine
    slow, at = machine.slowest_rank, machine.calibrated_at or nworkers
    if slow != 1.0:
        who = "each step's slowest" if _step_passes(prof, at) else "the slowest"
        print(f"{who} of the profile's {at} ranks computes x{slow:.3f} rank 0's: the "
              f"replay takes its pace")
    shared = machine.factors(nworkers)["sharing"]
    if shared != 1.0:
        print(f"extrapolated from the profile's {at} workers: {nworkers} workers of "
              f"{machine.threads} thread(s) share {machine.cores} cores, compute x{shared:.3f}")
    if args.advise:
        ranked = advise(names, work, setting, codec, batch)
        rows = [[f"{r['method']} {r['standing']}".strip(), _describe(r["settings"]),
                 f"{r['throughput']:.1f}", "[{:.1f},{:.1f}]".format(*r["interval"]),
                 f"{r['speedup_vs_ddp']:.2f}x", r["bottleneck"], r["reason"]] for r in ranked]
        print(f"[low,high] {unit}/s: {setting.spread_note()}; (tied): its interval overlaps "
              f"the best's, the model cannot tell them apart")
        print("\n".join(_table(["method", "best settings", f"{unit}/s total", "[low,high]",
                                "vs DDP default", "bound by", "why"], rows,
                               left=(0, 1, 5, 6))))
        far = beyond(setting, prof)
        if far:
            print(f"  {far}")
        apart = [r["method"] for r in ranked if r["changes_algorithm"] is not None]
        if apart:
            print(f"  changes the algorithm (not synchronous SGD; ranked after the others, "
                  f"nothing claimed of model quality): {', '.join(apart)}")
        for r in ranked:
            matrix.setdefault(r["method"], {})[nworkers] = r["throughput"]
        return [{"nworkers": nworkers, "slowest_rank": slow, "beyond": far,
                 "interval_from": setting.spread_note(), "advice": ranked}]
    rows, out, notes = [], [], []
    bare = cell.alone_s(work, machine, nworkers)
    for name in names:
        answer = run_cell(name, work, setting, codec)
        p, m = answer.prediction, answer.prediction.metrics
        notes += [f"{name}: {note}" for note in answer.notes]
        lo, hi = answer.interval(batch, nworkers)
        rows.append([name, str(len(p.message_bytes)), f"{p.iteration_s * 1e3:.2f}",
                     f"{p.throughput(batch, nworkers):.1f}", f"{m['compute_s'] * 1e3:.2f}",
                     f"{m['exposed_s'] * 1e3:.2f}",
                     "-" if m["overlap"] is None else f"{100 * m['overlap']:.1f}", p.bottleneck,
                     *([f"[{lo:.1f},{hi:.1f}]"] if setting.has_interval else [])])
        matrix.setdefault(name, {})[nworkers] = p.throughput(batch, nworkers)
        out.append({"method": name, "nworkers": nworkers, "compressor": args.compressor,
                    "messages": len(p.message_bytes), "message_bytes": p.message_bytes,
                    "iteration_s": p.iteration_s, "slowest_rank": slow,
                    "bare_s": bare, "vs_bare": bare / p.iteration_s,
                    "throughput": p.throughput(batch, nworkers), "interval": [lo, hi],
                    "interval_from": answer.spread_note, "machine": answer.machine,
                    "metrics": m, "bottleneck": p.bottleneck, "ps_local": answer.ps_local,
                    "notes": list(answer.notes)})
        if args.traces:
            os.makedirs(args.traces, exist_ok=True)
            timeline.write(os.path.join(args.traces, f"{name}_{nworkers}.trace.json"),
                           simulate.trace(p, {"model": prof["model"], "nworkers": nworkers}))
    print(f"[low,high] {unit}/s: {setting.spread_note()}")
    print("\n".join(_table(["method", "messages", "iteration ms", f"{unit}/s total",
                            "compute ms", "exposed ms", "overlap %", "bound by",
                            *(["[low,high]"] if setting.has_interval else [])],
                           rows, left=(0, 7))))
    print("".join(f"  {note}\n" for note in notes), end="")
    return out


def _write(args, prof, counts, batch, network, work, out) -> None:
    """The predictions (or the advice) as JSON, in --output."""
    link = None if network else Setting(args, prof, None, 1).link
    with open_to_write(args.output) as f:
        json.dump({"profile": args.profile, "model": prof["model"], "nworkers": counts,
                   "batch_size": batch, "network": args.topology,
                   "compressor": args.compressor, "optimizer_s": work.optimizer_s,
                   "compute_slowdown": work.compute_slowdown,
                   "comm_slowdown": work.comm_slowdown,
                   "compute_s": work.compute_s,
                   "alpha_s": None if link is None else link.alpha,
                   "beta_s_per_byte": None if link is None else link.beta,
                   ("advice" if args.advise else "predictions"): out}, f, indent=1)


def main(argv=None) -> int:
    return run_cli(run, parse_args, argv)


if __name__ == "__main__":
    sys.exit(main())

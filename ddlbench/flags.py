"""The training script's command line: its flags (``parse_args``) and the checks that refuse
bad input in one line before any process is spawned (``check``).

The method's and the compressors' options are flags declared by the methods and compressors
themselves (``ddlbench.methods``, ``compression``); this module only collects them. What a run
then reads of them is ``ddlbench.run_config.RunConfig``, built once from the checked flags.
"""
from __future__ import annotations

import argparse
import re
from typing import NamedTuple

import compression

from . import methods
from .methods import PS
from .errors import ArgumentParser, UsageError, check_writable, say
from .hosts.placement import dmlc_workers, launcher_rank
from .measure import workload
from .options import BATCHES_PER_ITER, add_flags, add_network_flags

ENGINES = methods.ENGINES
PROG = "python -m ddlbench.train"
# The first line of --help (the training script's).
DESCRIPTION = "The shared training script, run by every launcher: ``python -m ddlbench.train``."


class _Help(argparse.ArgumentDefaultsHelpFormatter):
    """Defaults in the help, except for flags whose default each method decides."""

    def _get_help_string(self, action):
        return action.help if action.default is None else super()._get_help_string(action)


def parse_args(argv=None) -> argparse.Namespace:
    p = ArgumentParser(prog=PROG, description=DESCRIPTION,
                       formatter_class=_Help, raise_errors=True)
    _workload_flags(p.add_argument_group("workload"))
    _timing_flags(p.add_argument_group("timing (docs/DESIGN.md section 8)"))
    _method_flags(p.add_argument_group("synchronisation (each option: the methods declaring "
                                       "it and their defaults)"))
    _optimizer_flags(p.add_argument_group("optimizer"))
    _run_flags(p.add_argument_group("run"))
    _verify_flags(p.add_argument_group("verification"))
    args = p.parse_args(argv)
    args.given = _given(p, argv)
    _job_settings(args)
    return args


def _workload_flags(w) -> None:
    w.add_argument("--model", default="resnet50",
                   help="torchvision classification model, or bert / bert_base / bert_tiny")
    w.add_argument("--batch-size", type=int, default=64, help="per-worker batch size")
    w.add_argument("--sentence-len", type=int, default=64, help="BERT sequence length")
    w.add_argument("--vocab-size", type=int, default=None,
                   help="BERT vocabulary (word embeddings, masked-LM output) in place of the "
                        "model's (30522, padded to 30528 for bert and bert_base)")
    w.add_argument("--image-size", type=int, default=None,
                   help="CNN input size in pixels (default: 224, 299 for inception_v3)")
    w.add_argument("--num-classes", type=int, default=1000)


def _timing_flags(t) -> None:
    t.add_argument("--num-warmup-batches", type=int, default=10)
    t.add_argument("--num-batches-per-iter", type=int, default=BATCHES_PER_ITER)
    t.add_argument("--num-iters", type=int, default=10, help="timing rounds")


def _method_flags(m) -> None:
    m.add_argument("--method", default=methods.DEFAULT,
                   help=f"method id ({', '.join(methods.names())}) or module:Class, or a "
                        f"comma-separated list or 'all': a benchmark then times each in turn "
                        f"in this job ('{{method}}' in --output), --verify verifies each")
    add_flags(m, methods.option_owners())
    m.add_argument("--compressor", default="none",
                   help=f"{', '.join(compression.COMPRESSORS)}; with --verify a "
                        f"comma-separated list. Methods that take one: {_takers()}")
    add_flags(m, compression.option_owners())
    m.add_argument("--engine", default="torch", choices=ENGINES,
                   help="torch (every method, torch.distributed), horovod (real Horovod "
                        "0.28.1 in the environment `make horovod-env` builds: "
                        f"{', '.join(methods.names('horovod'))}, fp16; under mpirun or "
                        "horovodrun) or byteps (real BytePS 0.2.5 with the project's CPU "
                        "patch, in the environment `make byteps-env` builds: "
                        f"{', '.join(methods.names('byteps'))}; under "
                        "byteps/byteps_launch.sh engine=byteps) or deepspeed (real DeepSpeed "
                        "0.19.8's ZeRO-1/2 on Gloo: "
                        f"{', '.join(methods.names('deepspeed'))}; run by the Python "
                        "`scripts/deepspeed_env.sh python` prints) or torchft (real torchft "
                        f"0.2.0: {', '.join(methods.names('torchft'))}; run by the Python "
                        "`scripts/torchft_env.sh python` prints)")
    m.add_argument("--backend", default="auto", choices=("auto", "nccl", "gloo"))


def _optimizer_flags(o) -> None:
    o.add_argument("--optimizer", default="auto", choices=workload.OPTIMIZERS,
                   help="auto: the original's for the model, SGD for CNNs, AdamW (eps 1e-8) "
                        "for BERT; original-ps: its parameter-server scripts', SGD at lr 0.01 "
                        "for every model, not scaled by the workers")
    o.add_argument("--lr", type=float, default=None,
                   help="learning rate (default: the original's, SGD 0.01 x workers, Adam and "
                        "AdamW 2e-5)")
    o.add_argument("--momentum", type=float, default=None,
                   help="SGD's momentum (default: 0, the original's)")
    o.add_argument("--weight-decay", type=float, default=0.0)


def _run_flags(r) -> None:
    r.add_argument("--nworkers", type=int, default=dmlc_workers(),
                   help="local workers to spawn (default 1; under a launcher: its world size)")
    r.add_argument("--no-cuda", action="store_true", help="run on the CPU even if CUDA exists")
    r.add_argument("--cudnn-benchmark", action="store_true",
                   help="torch.backends.cudnn.benchmark = True (cuDNN picks each "
                        "convolution's fastest algorithm), as the original's scripts and "
                        "Horovod's synthetic benchmark; its launchers set it (no effect on "
                        "the CPU)")
    r.add_argument("--seed", type=int, default=42)
    r.add_argument("--output", default=None, help="write the JSON run record here (rank 0)")
    add_network_flags(r, label="label of the network this run uses, for the record and tables")
    r.add_argument("--slots", type=int, default=None, metavar="S",
                   help="workers per emulated host (default: one process per host under "
                        "--net, one machine on the loopback): a host's workers share its link "
                        "and push to the parameter servers as one machine; servers get hosts "
                        "of their own")
    r.add_argument("--ps-force-servers", action="store_true",
                   help="a PS method starts parameter servers even when the workers are on "
                        "one machine (which otherwise runs none: a local reduce and "
                        "broadcast, as BytePS)")
    r.add_argument("--job-id", default=None,
                   help="label of this job on every process's command line (the PS launcher "
                        "finds and stops its processes by it)")
    r.add_argument("--timeout", type=float, default=300.0,
                   help="seconds a collective may wait for a peer before the run fails")
    r.add_argument("--threads", type=int, default=None,
                   help="CPU threads per worker (default: the cores it is pinned to, else "
                        "cores / local workers)")
    r.add_argument("--no-pin", action="store_true",
                   help="the local spawner does not pin each process to cores of its own "
                        "(env DDLBENCH_PIN=0; comm_bench and the profiler take it too)")
    r.add_argument("--timeline", default=None, metavar="PATH",
                   help="write the timed rounds' Chrome trace (trace-event JSON, all ranks "
                        "merged; Perfetto, chrome://tracing) here (rank 0); with --verify, "
                        "the verified steps' ('{method}' in the path is replaced)")
    r.add_argument("--timeline-iters", type=int, default=None, metavar="N",
                   help="record only the first N timed iterations (trace and overlap "
                        "metrics; 0 records nothing)")
    r.add_argument("--trace-collectives", default=None, metavar="PREFIX",
                   help="write each rank's sequence of collectives to PREFIX.RANK.json")


def _verify_flags(v) -> None:
    v.add_argument("--verify", type=int, default=0, metavar="STEPS",
                   help="run STEPS steps beside the float64 reference and exit non-zero if "
                        "parameters differ beyond tolerance")
    v.add_argument("--rtol", type=float, default=None)
    v.add_argument("--atol", type=float, default=None)
    v.add_argument("--dtype", default="float32", choices=("float32", "float64"),
                   help="parameters and data; float64 makes runs of different engines or "
                        "collective orders comparable step after step (rounding differences "
                        "stay far below any tolerance instead of growing through training)")
    v.add_argument("--save-params", default=None, metavar="NPZ",
                   help="with --verify: rank 0 writes the parameters after the last step to "
                        "this .npz (name -> array; '{method}' in the path is replaced), e.g. "
                        "to compare engines or torch versions")


def _given(parser: argparse.ArgumentParser, argv) -> set[str]:
    """The destinations the command line set (not a default, not an environment fallback):
    a flag that the chosen method or mode would ignore is refused rather than ignored. (Every
    default replaced by a marker through argparse's public ``set_defaults``, the line parsed
    again, the defaults put back.)"""
    defaults = vars(parser.parse_args([]))
    unset = object()
    parser.set_defaults(**dict.fromkeys(defaults, unset))
    try:
        ns = parser.parse_args(argv)
    finally:
        parser.set_defaults(**defaults)
    return {k for k, v in vars(ns).items() if v is not unset}


def _takers() -> str:
    """Which methods take which compressors, from their declarations."""
    parts = []
    for name, cls in methods.registry().items():
        taken = [c for c in compression.COMPRESSORS if c != "none" and cls.accepts(c) is None]
        if taken:
            every = len(taken) == len(compression.COMPRESSORS) - 1
            parts.append(name + ("" if every else f" ({', '.join(taken)})"))
    return ", ".join(parts)


def _job_settings(args) -> None:
    """How many parameter servers the job has, decided before anything starts. A PS job whose
    workers are on one machine (``one_machine``) runs none unless ``--ps-force-servers``:
    ``ps_local``, a local reduce and broadcast (as BytePS with one worker machine). Otherwise
    the local spawner starts one per worker machine (on one machine, forced: one per 4
    workers) for a PS method that was not told; under a launcher the count must be given (the
    launcher's processes include them)."""
    from .hosts import placement
    from .planning import default_nservers
    if args.engine == "byteps":
        # BytePS's servers (byteps.server) are its launcher's processes, not ranks of the job
        args.nservers, args.nservers_given, args.ps_local = 0, False, False
        args.one_machine = one_machine(args)
        return
    if args.nservers == 0 and "nservers" not in args.given:
        args.nservers = None    # DMLC_NUM_SERVER=0: a BytePS job with no server
    args.nservers_given = args.nservers is not None
    wants = any(_is_ps(m) for m in args.method.split(","))
    args.one_machine = one_machine(args)
    args.ps_local = (wants and args.one_machine and not args.ps_force_servers
                     and not args.nservers)
    if args.nservers is None:
        hosts = 1 if args.one_machine else machines(args)
        args.nservers = (default_nservers(args.nworkers or 1, hosts)
                         if wants and not args.ps_local and placement.detect() is None else 0)


def machines(args) -> int:
    """How many machines the suite's local spawner puts the workers on
    (``launch.local.machines``)."""
    from .launch import local
    return local.machines(args.nworkers or 1, args.slots, args.net)


def one_machine(args, env=None) -> bool:
    """Whether the job's workers are all on one machine (``launch.local.one_machine``)."""
    from .launch import local
    return local.one_machine(args.nworkers or 1, args.slots, args.net, env)


def _is_ps(method: str) -> bool:
    method = method.strip()
    return method == "all" or methods.architecture(method) == methods.PS


# Flags a verification would ignore (it times nothing and writes no record).
# (--timeline PATH records the verified steps: one trace per method, '{method}' in the path.)
NOT_WITH_VERIFY = ("num_warmup_batches", "num_batches_per_iter", "num_iters", "output")


def check(args, probe_engine: bool = True, read_profile: bool = True) -> None:
    """Reject bad input before any process is spawned. ``read_profile`` False: the
    ``--mgwfbp-profile`` file is not read (a sweep's preflight of a run planning from its
    calibration's profile, made only before the tries)."""
    workload.check_workload(args, positive=("--num-batches-per-iter", "--num-iters",
                                            "--timeout", "--nworkers", "--lr", "--threads",
                                            "--slots"),
                            nonneg=("--num-warmup-batches", "--verify", "--momentum",
                                    "--weight-decay", "--rtol", "--atol", "--seed",
                                    "--timeline-iters"))
    from . import netem
    from .launch import local
    local.check_slots(args.slots)
    netem.check(args.net)  # a known profile or rate; root and iproute2 unless loopback
    options = {**methods.option_owners(), **compression.option_owners()}
    for name, (spec, _) in options.items():
        if name != "nservers" or args.nservers_given:
            problem = spec.problem(getattr(args, name))
            if problem:
                raise UsageError(problem)
    _check_ignored(args)
    _check_paths(args)
    if getattr(args, "mgwfbp_profile", None) and read_profile and _plans_from_profile(args):
        from .measure.profile_file import check_profile
        check_profile(args.mgwfbp_profile, args.model)  # not after the workers' start-up
    if args.engine in LANE_ENVIRONMENTS:
        _check_lane(args, probe_engine)
    names = method_list(args)
    if args.save_params and not args.verify:
        raise UsageError("--save-params needs --verify STEPS (it saves the verified parameters)")
    if len(runs(args)) > 1:
        for flag, path, each in (("--save-params", args.save_params, "one file each"),
                                 ("--timeline", args.timeline, "one trace each"),
                                 ("--output", args.output, "one record each")):
            if path and "{method}" not in path:
                raise UsageError(f"{flag} with several methods or compressors needs "
                                 f"'{{method}}' in the path ({each})")
    if len(names) > 1 and not args.verify:
        _check_several(args, names)
    _check_servers(args, names)
    if len(compressor_list(args)) > 1 and not args.verify:
        raise UsageError("several compressors at once only with --verify; a benchmark times one")
    if args.verify:
        for name in compressor_list(args):
            if name != "none":
                compression.reference_of(name)  # one line for one that declares none
    runs(args)  # methods that cannot take a compressor
    _check_refused(args, names)
    _check_optimizer(args)


def _plans_from_profile(args) -> bool:
    """Whether a chosen method reads ``--mgwfbp-profile`` (a verification of others ignores
    it)."""
    owners = methods.option_owners().get("mgwfbp_profile", (None, []))[1]
    return bool({owner for owner, _ in owners} & set(method_list(args)))


def _check_servers(args, names: list[str]) -> None:
    """A PS method has servers, or its workers are on one machine (a local reduce and
    broadcast); servers on one machine only with --ps-force-servers (BytePS used none
    there)."""
    if args.engine == "byteps":
        return  # BytePS's servers are its launcher's processes, not ranks of this job
    ps = [n for n in names if methods.lookup(n, args.engine).architecture == methods.PS]
    if not ps:
        if args.ps_force_servers:
            every = [n for n in methods.names(args.engine) if methods.architecture(n) == PS]
            raise UsageError(f"--ps-force-servers is a setting of the PS methods "
                             f"({', '.join(every)}), not of {', '.join(names)}")
        return
    if args.nservers == 0 and not args.ps_local:
        raise UsageError(f"method {ps[0]} needs parameter servers: --nservers S (under a "
                         f"launcher, S of its processes become servers)")
    if args.nservers_given and args.one_machine and not args.ps_force_servers:
        raise UsageError(f"--nservers {args.nservers}: the {args.nworkers or 1} worker(s) are "
                         f"on one machine, where a PS job runs no server (a local reduce and "
                         f"broadcast, as BytePS); add --ps-force-servers to start servers "
                         f"anyway")


# The paths a run writes, by flag: '{method}' in them is replaced by each method's id.
PATH_FLAGS = ("--output", "--timeline", "--save-params")


def _check_paths(args) -> None:
    """Each path the run writes can be written (one line naming its flag) and holds no
    placeholder but '{method}' (another would stay in the file's name as written)."""
    for flag in PATH_FLAGS:
        path = getattr(args, flag[2:].replace("-", "_"))
        if not path:
            continue
        unknown = [p for p in re.findall(r"\{[^{}]*\}", path) if p != "{method}"]
        if unknown:
            raise UsageError(f"{flag} {path}: {unknown[0]} is not a placeholder; the only one "
                             f"is {{method}} (each method's id)")
        check_writable(path, flag)
    if args.trace_collectives:
        check_writable(f"{args.trace_collectives}.0.json", "--trace-collectives")


def _check_several(args, names: list[str]) -> None:
    """A benchmark of several methods times them one after the other in this one job (each
    with a replica, warm-up and record of its own, '{method}' in their paths): one set of
    Horovod settings per job. (Parameter-server methods share the job's servers; each
    record counts its method's own traffic.)"""
    if args.engine != "torch":
        raise UsageError("several methods in one benchmark job only with --engine torch "
                         f"({methods.LANES[args.engine]}'s settings are the job's)")


def _check_ignored(args) -> None:
    """A flag the run would ignore is an error: timing flags and --output under --verify (it
    times nothing and writes no record), and, for a benchmark, an option that none of the
    chosen methods or compressors declares (its record would claim a setting that did
    nothing). A verification often runs one command line over several methods: there such an
    option is named in a note and ignored."""
    if args.verify:
        ignored = [n for n in NOT_WITH_VERIFY if n in args.given]
        if ignored:
            raise UsageError(f"--{ignored[0].replace('_', '-')} has no effect with --verify "
                             f"(a verification times nothing and writes no record)")
    notes = []
    for owners, chosen in ((methods.option_owners(), method_list(args)),
                           (compression.option_owners(), compressor_list(args))):
        for name, (spec, declared) in owners.items():
            ids = [owner for owner, _ in declared]
            if name in args.given and not set(ids) & set(chosen):
                line = f"{spec.flag} is an option of {', '.join(ids)}, not of {', '.join(chosen)}"
                if not args.verify:
                    raise UsageError(line)
                notes.append(line)
    if notes and launcher_rank() == "0":
        say(f"ddlbench: note: {'; '.join(notes)} (ignored)")


def resolvable(args) -> dict:
    """The flags' values as a method's ``Options.resolve`` takes them: no server (a PS job on
    one machine) leaves the PS methods' nservers option unset."""
    return {**vars(args), "nservers": args.nservers or None}


def _check_refused(args, names: list[str]) -> None:
    """What a chosen method cannot run with, one line here, not from every worker after the
    job's start: its options (``Method.refuses``), and machines of the suite's local spawner
    (``--slots``) holding different numbers of workers for a method that needs them even
    (``Method.even_machines``; under a launcher the constructor checks the placement)."""
    from .launch import local
    from .methods.base import uneven_machines
    values = resolvable(args)
    hosts = local.hosts_of(args.nworkers, slots=args.slots) if args.slots and args.nworkers \
        else []
    sizes = [hosts.count(h) for h in sorted(set(hosts))]
    for name in names:
        method = methods.lookup(name, args.engine)
        refused = method.refuses(method.Options.resolve(values)) or (
            uneven_machines(method.id, sizes) if method.even_machines else None)
        if refused:
            raise UsageError(refused)


def _check_optimizer(args) -> None:
    """--momentum is SGD's: with Adam or AdamW (chosen, or --optimizer auto's for BERT) it
    would do nothing, so it is refused."""
    name = workload.optimizer_name(workload.OptimizerSpec.of(args))
    if args.momentum is not None and name != "sgd":
        how = (f"--optimizer auto chose {name}, the original's for {args.model}"
               if args.optimizer == "auto" else f"the optimizer is {name}")
        raise UsageError(f"--momentum is a setting of SGD, but {how}; add --optimizer sgd")


# The real-framework lanes: the module their engine imports, the script that builds and names
# their environment, and where they run instead; ``spawned``: the suite's local spawner runs
# it (in the environment's Python), as the torch engine, not a launcher of the framework's
class Lane(NamedTuple):
    module: str
    env_script: str     # relative to the repository
    where: str
    spawned: bool = False


LANE_ENVIRONMENTS = {
    "horovod": Lane("horovod.torch", "horovod/legacy_env.sh",
                    "Horovod 0.28.1 runs in its own torch 2.0.1 environment; build it with `make "
                    "horovod-env` and start through nworkers=N engine=horovod "
                    "./horovod/horovod_mpi_cj.sh"),
    "byteps": Lane("byteps.torch", "byteps/legacy_env.sh",
                   "BytePS 0.2.5 runs in its own environment; build it with `make byteps-env` "
                   "and start through nworkers=N engine=byteps ./byteps/byteps_launch.sh"),
    "deepspeed": Lane("deepspeed", "scripts/deepspeed_env.sh",
                      "DeepSpeed 0.19.8 runs in its own environment; build it with `make "
                      "deepspeed-env` and run the training script with its Python: "
                      "\"$(scripts/deepspeed_env.sh python)\" -m ddlbench.train --engine "
                      "deepspeed ...", spawned=True),
    "torchft": Lane("torchft", "scripts/torchft_env.sh",
                    "torchft 0.2.0 runs in its own environment; build it with `make "
                    "torchft-env` and run the training script with its Python: "
                    "\"$(scripts/torchft_env.sh python)\" -m ddlbench.train --engine "
                    "torchft ...", spawned=True),
}


def _check_lane(args, probe_engine: bool) -> None:
    """--engine horovod or byteps: the framework imports here (a sweep checks in this
    environment and runs in the lane's: ``probe_engine`` False), every method has a mapping,
    and the lane's own checks (``ddlbench.methods.<engine>.check``)."""
    import importlib

    from .hosts import placement
    engine = args.engine
    module, _, where, _ = LANE_ENVIRONMENTS[engine]
    if probe_engine:
        try:
            importlib.import_module(module)
        except Exception as e:  # ImportError, or a build against another torch failing to load
            detail = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else 'no detail'}"
            raise UsageError(f"--engine {engine} is unavailable in this Python ({detail}): "
                             f"{where}") from None
    names = method_list(args)
    for name in names:
        methods.lookup(name, engine)  # one line for a method without a mapping
    lane = importlib.import_module(f"{__package__}.methods.{engine}")
    lane.check(args, names, compressor_list(args),
               under_launcher=placement.detect() is not None or not probe_engine)


def with_servers(args) -> bool:
    """Whether the job can run PS methods: it has servers, or no server is needed (one
    machine)."""
    return (args.nservers > 0 or getattr(args, "ps_local", False)
            or getattr(args, "engine", "torch") == "byteps")


def method_list(args) -> list[str]:
    return methods.selected(args.method, args.engine, with_servers=with_servers(args))


def compressor_list(args) -> list[str]:
    """The compressors named by --compressor (a clear line for an unknown one)."""
    names = []
    for c in (c.strip() for c in args.compressor.split(",")):
        if c and c not in names:
            compression.lookup(c)
            names.append(c)
    return names or ["none"]


def runs(args) -> list[tuple[str, str]]:
    """(method, compressor) pairs to run. 'all' leaves out methods that cannot take a
    compressor other than none; a method named explicitly that cannot is an error."""
    return methods.pairs(args.method, compressor_list(args), args.engine,
                         with_servers=with_servers(args))



def main(argv=None) -> int:
    """``python -m ddlbench.flags ARGS...``: the training script's parsing and checks of ARGS
    (the engine's import included), nothing started: exit 0, or one line and exit 2. A
    launcher that starts processes of its own before the workers (byteps/byteps_launch.sh:
    BytePS's scheduler and servers) checks the workers' flags with it first."""
    from .errors import run_cli
    return run_cli(lambda args: check(args) or 0, parse_args, argv)


if __name__ == "__main__":
    import sys
    sys.exit(main())

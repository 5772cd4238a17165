"""The shared training script, run by every launcher: ``python -m ddlbench.train``.

Run by hand with ``--nworkers N`` it spawns N local workers itself; started by mpirun, torchrun
or srun it joins that job. Each worker then, top to bottom:

1. sets up torch.distributed (NCCL on CUDA, Gloo on CPU) from its launcher's environment;
2. builds the model and makes one fake batch on its device (different data on each rank);
3. broadcasts rank 0's initial parameters and buffers;
4. wraps a plain torch optimizer with the chosen synchronisation method;
5. either verifies the method against single-process SGD on the averaged gradient
   (``--verify STEPS``) or times it (warm-up, then rounds of batches), printing the original
   suite's log lines and writing one JSON record (``--output``).
"""
from __future__ import annotations

import argparse
import json
import os
import socket
import sys

from .errors import UsageError

ENGINES = ("torch", "horovod", "byteps")


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m ddlbench.train", description=__doc__.split("\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    w = p.add_argument_group("workload")
    w.add_argument("--model", default="resnet50",
                   help="torchvision classification model, or bert / bert_base / bert_tiny")
    w.add_argument("--batch-size", type=int, default=64, help="per-worker batch size")
    w.add_argument("--sentence-len", type=int, default=64, help="BERT sequence length")
    w.add_argument("--image-size", type=int, default=None,
                   help="CNN input size in pixels (default: 224, 299 for inception_v3)")
    w.add_argument("--num-classes", type=int, default=1000)
    t = p.add_argument_group("timing (DESIGN.md section 8)")
    t.add_argument("--num-warmup-batches", type=int, default=10)
    t.add_argument("--num-batches-per-iter", type=int, default=10)
    t.add_argument("--num-iters", type=int, default=10, help="timing rounds")
    m = p.add_argument_group("synchronisation")
    m.add_argument("--method", default="fusion",
                   help="method id (bspa2a, wfbp, fusion, ddp, ...) or module:Class; "
                        "with --verify a comma-separated list or 'all'")
    m.add_argument("--threshold", type=float, default=None,
                   help="fusion threshold in bytes (Horovod semantics: 0 = one message per "
                        "tensor; default 64 MiB)")
    m.add_argument("--bucket-cap-mb", type=float, default=None, help="DDP bucket size (25)")
    m.add_argument("--compressor", default="none",
                   help="none, fp16, topk, eftopk, signum, efsignum, powersgd (README: "
                        "Compressors; the bucketed methods bspa2a, wfbp, fusion, mgwfbp); with "
                        "--verify a comma-separated list")
    m.add_argument("--density", type=float, default=0.001,
                   help="TopK: fraction of each bucket's elements sent")
    m.add_argument("--powersgd-rank", type=int, default=4, help="PowerSGD rank")
    m.add_argument("--powersgd-dense-steps", type=int, default=0, metavar="N",
                   help="PowerSGD: all-reduce dense for the first N steps (DDP's hook: 1000; "
                        "here compression starts at the first step)")
    m.add_argument("--partition", type=int,
                   default=os.environ.get("BYTESCHEDULER_PARTITION", 4_000_000),
                   help="ByteScheduler partition size in elements (env BYTESCHEDULER_PARTITION)")
    m.add_argument("--credit", type=int,
                   default=os.environ.get("BYTESCHEDULER_CREDIT", 16_000_000),
                   help="ByteScheduler credit window in elements (env BYTESCHEDULER_CREDIT)")
    m.add_argument("--mgwfbp-profile", default=None, metavar="JSON",
                   help="MG-WFBP: plan from this profile (backward times, alpha, beta) instead "
                        "of measuring on this cluster")
    m.add_argument("--mgwfbp-min-group", type=int, default=0, metavar="ELEMENTS",
                   help="MG-WFBP: also merge any group smaller than this (the original: 8192)")
    m.add_argument("--nservers", type=int, default=_env_int("DMLC_NUM_SERVER"),
                   help="parameter servers, extra processes that only sum (ranks after the "
                        "workers); default for a PS method on one machine: 1 per 4 workers "
                        "(env DMLC_NUM_SERVER)")
    m.add_argument("--partition-bytes", type=int, default=4_096_000,
                   help="parameter server: partition size in bytes (BytePS's 4,096,000)")
    m.add_argument("--engine", default="torch", choices=ENGINES,
                   help="torch (every method, torch.distributed) or horovod (real Horovod "
                        "0.28.1 in the environment `make horovod-env` builds: wfbp, fusion, "
                        "bspa2a, mgwfbp, fp16; under mpirun or horovodrun)")
    m.add_argument("--backend", default="auto", choices=("auto", "nccl", "gloo"))
    o = p.add_argument_group("optimizer")
    o.add_argument("--optimizer", default="sgd", choices=("sgd", "adam"))
    o.add_argument("--lr", type=float, default=None, help="learning rate (0.01 x workers)")
    o.add_argument("--momentum", type=float, default=0.9)
    o.add_argument("--weight-decay", type=float, default=0.0)
    r = p.add_argument_group("run")
    r.add_argument("--nworkers", type=int, default=_env_int("DMLC_NUM_WORKER"),
                   help="local workers to spawn (default 1; under a launcher: its world size)")
    r.add_argument("--no-cuda", action="store_true", help="run on the CPU even if CUDA exists")
    r.add_argument("--seed", type=int, default=42)
    r.add_argument("--output", default=None, help="write the JSON run record here (rank 0)")
    r.add_argument("--network", default=os.environ.get("DDLBENCH_NETWORK", "local"),
                   help="label of the network this run uses, for the record and tables")
    r.add_argument("--net", default=os.environ.get("DDLBENCH_NET") or "loopback",
                   metavar="PROFILE",
                   help="emulated network between the local processes (env DDLBENCH_NET): "
                        "loopback, 1gbit, 2.5gbit, 5gbit, ... (configs/networks.yaml), "
                        "rate=R[,burst=B] or target=R,speedup=S; needs root and iproute2")
    r.add_argument("--job-id", default=None,
                   help="label of this job on every process's command line (the PS launcher "
                        "finds and stops its processes by it)")
    r.add_argument("--timeout", type=float, default=300.0,
                   help="seconds a collective may wait for a peer before the run fails")
    r.add_argument("--threads", type=int, default=None,
                   help="CPU threads per worker (default: cores / local workers)")
    r.add_argument("--trace-collectives", default=None, metavar="PREFIX",
                   help="write each rank's sequence of collectives to PREFIX.RANK.json")
    v = p.add_argument_group("verification")
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
    args = p.parse_args(argv)
    args.nservers_given = args.nservers is not None
    if args.nservers is None:
        # A job that runs a PS method and was not told how many servers: on one machine, the
        # suite spawns one per 4 workers. Under a launcher the count must be given (the
        # launcher's processes include them).
        from . import launch, ps
        wants = any(_is_ps(m) for m in args.method.split(","))
        args.nservers = (ps.default_nservers(args.nworkers or 1)
                         if wants and launch.detect() is None else 0)
    return args


def _env_int(key):
    value = os.environ.get(key)
    if value in (None, ""):
        return None
    try:
        return int(value)
    except ValueError:
        raise SystemExit(f"ddlbench: error: environment variable {key}={value!r} is not an "
                         f"integer") from None


def _is_ps(method: str) -> bool:
    from . import strategies
    method = method.strip()
    if method == "all":
        return True
    try:
        return strategies.lookup(method).architecture == "ps"
    except UsageError:
        return False


def check(args, probe_engine: bool = True) -> None:
    """Reject bad input before any process is spawned."""
    positive = {"--batch-size": args.batch_size, "--sentence-len": args.sentence_len,
                "--num-batches-per-iter": args.num_batches_per_iter,
                "--num-iters": args.num_iters, "--num-classes": args.num_classes,
                "--timeout": args.timeout}
    for flag, value in positive.items():
        if value <= 0:
            raise UsageError(f"{flag} must be positive, got {value:g}")
    if args.image_size is not None and args.image_size <= 0:
        raise UsageError(f"--image-size must be positive, got {args.image_size}")
    if args.num_warmup_batches < 0 or args.verify < 0:
        raise UsageError("--num-warmup-batches and --verify must be >= 0")
    if args.nworkers is not None and args.nworkers <= 0:
        raise UsageError(f"--nworkers must be positive, got {args.nworkers}")
    from . import netem
    netem.check(args.net)  # a known profile or rate; root and iproute2 unless loopback
    if args.threshold is not None and args.threshold < 0:
        raise UsageError(f"--threshold must be >= 0 bytes, got {args.threshold:g}")
    if args.bucket_cap_mb is not None and args.bucket_cap_mb <= 0:
        raise UsageError(f"--bucket-cap-mb must be positive, got {args.bucket_cap_mb:g}")
    if args.lr is not None and args.lr <= 0:
        raise UsageError(f"--lr must be positive, got {args.lr:g}")
    if args.nservers < 0 or (args.nservers == 0 and args.nservers_given):
        raise UsageError(f"--nservers must be positive, got {args.nservers}")
    if args.partition_bytes <= 0:
        raise UsageError(f"--partition-bytes must be positive, got {args.partition_bytes}")
    for flag, value in (("--partition", args.partition), ("--credit", args.credit)):
        if value <= 0:  # ByteScheduler's settings, also from BYTESCHEDULER_PARTITION/_CREDIT
            raise UsageError(f"{flag} must be a positive number of elements, got {value}")
    if args.engine != "torch" and probe_engine:  # (a sweep checks in this env, runs in Horovod's)
        _check_engine(args.engine)
    if args.engine == "horovod":
        from . import horovod_engine, launch
        horovod_engine.check(args, method_list(args), compressor_list(args),
                             under_launcher=launch.detect() is not None or not probe_engine)
    methods = method_list(args)
    if args.save_params and not args.verify:
        raise UsageError("--save-params needs --verify STEPS (it saves the verified parameters)")
    if args.save_params and len(runs(args)) > 1 and "{method}" not in args.save_params:
        raise UsageError("--save-params with several methods or compressors needs '{method}' "
                         "in the path")
    if len(methods) > 1 and not args.verify:
        raise UsageError("several methods at once only with --verify; a benchmark times one")
    from . import strategies
    for name in methods:
        if strategies.lookup(name).architecture == "ps" and args.nservers == 0:
            raise UsageError(f"method {name} needs parameter servers: --nservers S (under a "
                             f"launcher, S of its processes become servers)")
    compressors = compressor_list(args)
    if len(compressors) > 1 and not args.verify:
        raise UsageError("several compressors at once only with --verify; a benchmark times one")
    runs(args)  # methods that cannot take a compressor
    import models
    if args.model not in models.names():
        models.build(args.model)  # raises the UsageError listing what exists


def _check_engine(engine: str) -> None:
    module = {"horovod": "horovod.torch", "byteps": "byteps.torch"}[engine]
    try:
        __import__(module)
    except Exception as e:  # ImportError, or a build against another torch failing to load
        detail = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else 'no detail'}"
        if engine == "horovod":
            raise UsageError(
                f"--engine horovod is unavailable in this Python ({detail}): Horovod 0.28.1 "
                f"runs in its own torch 2.0.1 environment; build it with `make horovod-env` "
                f"and start through nworkers=N engine=horovod ./horovod/horovod_mpi_cj.sh") from None
        raise UsageError(
            f"--engine {engine} is unavailable: {module} does not import ({detail}); BytePS "
            f"does not build against torch >= 2.1 (DESIGN.md section 10): use --engine torch, "
            f"which carries every method") from None
    if engine == "horovod":
        return
    raise UsageError(f"--engine {engine}: {module} imports, but the suite's {engine} adapter "
                     f"is not part of this version; use --engine torch")


def method_list(args) -> list[str]:
    from . import strategies
    names = []
    # 'all' means every method this job can run: the PS methods only when it has servers.
    every = [n for n in strategies.names()
             if args.nservers > 0 or strategies.lookup(n).architecture != "ps"]
    if args.engine == "horovod":
        from .horovod_engine import METHODS
        every = list(METHODS)
    for m in (m.strip() for m in args.method.split(",")):
        for name in (every if m == "all" else [m] if m else []):
            if name not in names:
                names.append(name)
    return names


def compressor_list(args) -> list[str]:
    """The compressors named by --compressor, each checked with --density and the PowerSGD
    options (a clear line for a bad one)."""
    import compression
    names = []
    for c in (c.strip() for c in args.compressor.split(",")):
        if c and c not in names:
            names.append(c)
    for c in names or ["none"]:
        compression.check_options(c, args.density, powersgd_rank=args.powersgd_rank,
                                  powersgd_dense_steps=args.powersgd_dense_steps)
    return names or ["none"]


def takes_compressor(name: str, engine: str = "torch", compressor: str | None = None) -> bool:
    """A method takes a compressor when it reduces its own buckets through one and can say
    what they are (``groups()``, which --verify needs): the all-reduce methods, less the
    compressors a method refuses (``refuses_compressors``). On Horovod every method takes
    Horovod's fp16 (other compressors are refused in check())."""
    if engine == "horovod":
        return True
    from . import strategies
    cls = strategies.lookup(name)
    return (cls.architecture == "a2a" and hasattr(cls, "groups")
            and compressor not in getattr(cls, "refuses_compressors", {}))


def runs(args) -> list[tuple[str, str]]:
    """(method, compressor) pairs to run. 'all' leaves out methods that cannot take a
    compressor other than none; a method named explicitly that cannot is an error."""
    explicit = {m.strip() for m in args.method.split(",")} - {"all"}
    pairs = []
    for name in method_list(args):
        for comp in compressor_list(args):
            if comp != "none" and not takes_compressor(name, args.engine, comp):
                if name in explicit:
                    from . import strategies
                    why = getattr(strategies.lookup(name), "refuses_compressors", {}).get(
                        comp, "it does not reduce its gradients through the suite's buckets")
                    able = [m for m in strategies.names() if takes_compressor(m, compressor=comp)]
                    raise UsageError(f"method {name!r} cannot take --compressor {comp}: {why}; "
                                     f"use one of {', '.join(able)}")
                continue
            pairs.append((name, comp))
    return pairs


def main(argv=None) -> int:
    from . import launch
    argv = list(sys.argv[1:] if argv is None else argv)
    return launch.run_job(argv, "ddlbench.train", parse_args, check, worker)


def worker(args, placement) -> int:
    from . import engine

    if engine.is_server(placement, args.nservers):
        # Ranks after the workers are parameter servers: they only sum (DESIGN.md section 6).
        return engine.serve(placement, args.nservers, timeout_s=args.timeout)

    import torch
    import torch.distributed as dist

    import compression

    from . import measure, netem, record, strategies
    from .comm import Comm
    from .verify import Reference, default_tolerance

    ctx = engine.init(placement, use_cuda=not args.no_cuda, backend=args.backend,
                      timeout_s=args.timeout, threads=args.threads, nservers=args.nservers,
                      partition_bytes=args.partition_bytes, engine=args.engine,
                      method=args.method, threshold=args.threshold)

    def log(line):
        if ctx.is_root:
            print(line, flush=True)

    lr = args.lr if args.lr is not None else 0.01 * ctx.size

    def make_optimizer(params):
        if args.optimizer == "adam":
            return torch.optim.Adam(params, lr=lr, weight_decay=args.weight_decay)
        return torch.optim.SGD(params, lr=lr, momentum=args.momentum,
                               weight_decay=args.weight_decay)

    def build():
        """Model with rank 0's initial state, the optimizer, one fake batch on the device."""
        work, batch = replica(args, ctx)
        return work, make_optimizer(work.model.parameters()), batch

    def make_compressor(name):
        return compression.create(name, args.density, powersgd_rank=args.powersgd_rank,
                                  powersgd_dense_steps=args.powersgd_dense_steps)

    def make_strategy(name, work, optimizer, comm, batch, compressor):
        settings = {"threshold": args.threshold, "bucket_cap_mb": args.bucket_cap_mb,
                    "compressor_obj": compressor,
                    "density": args.density, "partition": args.partition,
                    "credit": args.credit, "mgwfbp_profile": args.mgwfbp_profile,
                    "mgwfbp_min_group": args.mgwfbp_min_group, "model_name": args.model,
                    "powersgd_rank": args.powersgd_rank, "compressor": compressor.name}
        strategy = strategies.create(name, work.model, optimizer, comm, settings,
                                     engine=args.engine)

        def forward_backward():
            work.loss(work.model, batch).backward()

        strategy.calibrate(forward_backward)
        optimizer.zero_grad(set_to_none=True)
        comm.reset_stats()
        return strategy

    try:
        if args.verify:
            rtol, atol = default_tolerance(args.optimizer, lr)
            rtol = rtol if args.rtol is None else args.rtol
            atol = atol if args.atol is None else args.atol
            failed = []
            for name, comp in runs(args):
                work, optimizer, batch = build()
                comm = Comm(ctx.rank, ctx.size, trace=bool(args.trace_collectives), ps=ctx.ps)
                strategy = make_strategy(name, work, optimizer, comm, batch, make_compressor(comp))
                ref_math = None
                if comp != "none":
                    # The compressor's mathematics, written apart from the exchange path.
                    from compression.reference import ReferenceMath
                    ref_math = ReferenceMath(comp, ctx.size, dtype=strategy.params[0].dtype,
                                             density=args.density,
                                             powersgd_rank=args.powersgd_rank,
                                             powersgd_dense_steps=args.powersgd_dense_steps,
                                             fp16_divide="after" if args.engine == "horovod"
                                             else "before")
                    name = f"{name}+{comp}"
                reference = Reference(work.model, make_optimizer, ctx, rtol=rtol, atol=atol,
                                      compression=ref_math)
                after = getattr(strategy, "groups_after_step", False)
                for step in range(1, args.verify + 1):
                    # The buckets this step uses: asked before it (a method may re-plan after
                    # a step), or after it from a method that decides them during backward.
                    groups = strategy.groups() if ref_math is not None and not after else None
                    work.loss(strategy.module, batch).backward()
                    strategy.step()
                    strategy.synchronize()
                    if ref_math is not None and after:
                        groups = strategy.groups()
                    reference.step(groups)
                    max_abs, worst = reference.compare()
                    spread = reference.replica_spread()
                    ok = worst <= 1.0 and spread == 0.0
                    allowance = reference.max_allowance()
                    extra = (f", compressor allowance <= {allowance:.1e}"
                             if allowance is not None else "")
                    extra += (", replicas identical" if spread == 0.0
                              else f", replicas differ by up to {spread:.3e}")
                    log(f"verify {name} step {step}: max |param - reference| = {max_abs:.3e} "
                        f"({worst:.3f} of tolerance, rtol {rtol:g} atol {atol:g}{extra}) "
                        f"{'OK' if ok else 'FAIL'}")
                    if not ok and name not in failed:
                        failed.append(name)
                    strategy.zero_grad()
                if args.save_params and ctx.is_root:
                    _save_params(args.save_params.replace("{method}", name), work.model)
                reference.close()
                strategy.close()
                _write_trace(args, ctx, comm, name)
            log(f"verify: {ctx.size} worker(s), {args.model}: "
                + ("all methods match the reference" if not failed
                   else f"FAILED: {', '.join(failed)}"))
            return 1 if failed else 0

        work, optimizer, batch = build()
        comm = Comm(ctx.rank, ctx.size, trace=bool(args.trace_collectives), ps=ctx.ps)
        compressor = make_compressor(args.compressor)
        strategy = make_strategy(args.method, work, optimizer, comm, batch, compressor)
        compressor.reset_stats()
        stats = work.stats()
        log(f"Model: {args.model}")
        log(f"Method: {args.method} ({strategy.display or strategy.name}), engine {args.engine}, "
            f"backend {ctx.backend}, compressor {args.compressor}")
        log(f"Batch size: {args.batch_size}")
        log(f"Number of {ctx.device_noun}s: {ctx.size}")
        log(f"Parameters: {stats['parameters']}, gradient bytes: {stats['gradient_bytes']}, "
            f"tensors: {stats['tensors']}")

        def train_step():
            work.loss(strategy.module, batch).backward()
            strategy.step()
            strategy.zero_grad()

        rss_warm = {}

        def on_warm():
            comm.reset_stats()
            compressor.reset_stats()
            rss_warm["bytes"] = measure.rss_bytes()

        log("Running warmup...")
        result = measure.run(ctx, train_step, strategy.synchronize, batch_size=args.batch_size,
                             warmup=args.num_warmup_batches,
                             batches_per_iter=args.num_batches_per_iter, iters=args.num_iters,
                             unit=work.unit, log=log, on_warm=on_warm)
        timed_steps = args.num_iters * args.num_batches_per_iter
        comm_stats = comm.stats()
        per_iter = {k: {op: v / timed_steps for op, v in d.items()}
                    for k, d in comm_stats.items()}
        comp_stats = None
        if compressor.counts.get("payload_bytes"):
            # Only when the method exchanged through it: Horovod compresses inside its own
            # optimizer, the PS methods push dense, and DDP and ByteScheduler send dense
            # gradients their own way without a compressor.
            comp_stats = compressor.stats(timed_steps)
            log(compression_line(args, comp_stats))
        hosts = [None] * ctx.size
        dist.all_gather_object(hosts, socket.gethostname())
        rss_all = [None] * ctx.size
        dist.all_gather_object(rss_all, {"after_warmup": rss_warm.get("bytes"),
                                         "per_round": result["rss_bytes_per_round"],
                                         "peak": _peak_rss()})
        servers = None
        if strategy.architecture == "ps":
            push = per_iter["payload_bytes"].get("push", 0)
            pull = per_iter["payload_bytes"].get("pull", 0)
            log(f"Parameter servers: {ctx.nservers}, partition {args.partition_bytes} bytes; "
                f"per worker per iteration {push / 1e6:.3f} MB pushed, {pull / 1e6:.3f} MB "
                f"pulled (gradient {stats['gradient_bytes'] / 1e6:.3f} MB)")
            if ctx.is_root:
                servers = ctx.ps.server_stats()
        _write_trace(args, ctx, comm, args.method)
        if ctx.is_root and args.output:
            rec = {
                "config": {k: v for k, v in vars(args).items() if k != "output"}
                | {"nworkers": ctx.size, "nservers": ctx.nservers, "lr": lr},
                "method": strategy.describe(),
                "model": stats,
                "result": result,
                "communication_per_iteration": per_iter,
                "compression_per_iteration": comp_stats,
                "memory": {"rss_bytes_per_worker": rss_all},
                "servers": servers,
                "environment": record.manifest(ctx, hosts),
                "network": args.network,
                "net": netem.run_info(args.net),  # profile, configured and probed rate
            }
            record.write_atomic(args.output, rec)
        strategy.close()
        return 0
    finally:
        # After a failure nobody waits for the servers: they see the connections close.
        engine.shutdown(ctx, clean=sys.exc_info()[0] is None)


def _save_params(path: str, model) -> None:
    import numpy as np
    arrays = {n: p.detach().cpu().double().numpy() for n, p in model.named_parameters()}
    tmp = path + ".tmp.npz"
    np.savez(tmp, **arrays)
    os.replace(tmp, path)


def replica(args, ctx):
    """This rank's model, with rank 0's initial parameters and buffers, in training mode on
    the device, and one fake batch of its own (different data on each rank)."""
    import torch
    import torch.distributed as dist

    import models
    torch.manual_seed(args.seed)
    work = models.build(args.model, image_size=args.image_size,
                        sentence_len=args.sentence_len, num_classes=args.num_classes)
    dtype = getattr(torch, getattr(args, "dtype", "float32"))
    work.model.to(ctx.device, dtype=dtype).train()
    with torch.no_grad():
        for t in list(work.model.parameters()) + list(work.model.buffers()):
            dist.broadcast(t.data, 0)
    gen = torch.Generator().manual_seed(args.seed * 1000 + ctx.rank)
    return work, _cast(work.make_batch(args.batch_size, ctx.device, gen), dtype)


def _cast(batch, dtype):
    """The floating-point tensors of a batch in ``dtype`` (token ids and labels stay)."""
    import torch
    if isinstance(batch, torch.Tensor):
        return batch.to(dtype) if batch.is_floating_point() else batch
    if isinstance(batch, dict):
        return {k: _cast(v, dtype) for k, v in batch.items()}
    if isinstance(batch, (tuple, list)):
        return type(batch)(_cast(v, dtype) for v in batch)
    return batch


def compression_line(args, st: dict) -> str:
    """Rank 0's figures: bytes per worker per iteration beside the dense fp32 figure (the same
    on every rank), and rank 0's encode/decode time per iteration."""
    mb = 1e6
    return (f"Compression: {args.compressor}: per worker per iteration "
            f"{st['payload_bytes'] / mb:.3f} MB handed to collectives "
            f"(dense fp32 {st['dense_payload_bytes'] / mb:.3f} MB, ratio "
            f"{st['compression_ratio']:.1f}x), {st['wire_sent_bytes'] / mb:.3f} MB sent and "
            f"{st['wire_received_bytes'] / mb:.3f} MB received (dense "
            f"{st['dense_wire_bytes'] / mb:.3f} MB each way, ring model); "
            f"encode {st['encode_s'] * 1e3:.2f} ms, decode {st['decode_s'] * 1e3:.2f} ms")


def _peak_rss() -> int:
    import resource
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def _write_trace(args, ctx, comm, name) -> None:
    if args.trace_collectives and comm.trace is not None:
        path = f"{args.trace_collectives}.{name.replace(':', '_')}.{ctx.rank}.json"
        with open(path, "w") as f:
            json.dump(comm.trace, f)


if __name__ == "__main__":
    from ddlbench import compat
    sys.exit(compat.finish(main()))

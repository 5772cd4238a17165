"""The shared training script, run by every launcher: ``python -m ddlbench.train``.

Run by hand with ``--nworkers N`` it spawns N local workers itself; started by mpirun, torchrun
or srun it joins that job. ``main`` parses and checks the flags (``ddlbench.flags``); each
worker builds the run's configuration from them once (``ddlbench.run_config.RunConfig``) and
then, top to bottom (``worker`` and ``benchmark``):

1. sets up torch.distributed (NCCL on CUDA, Gloo on CPU) from its launcher's environment;
2. builds the model and makes one fake batch on its device (different data on each rank),
   with rank 0's initial parameters and buffers;
3. wraps a plain torch optimizer with the chosen synchronisation method;
4. either verifies the method against single-process SGD on the averaged gradient
   (``--verify STEPS``, ``ddlbench.verify``) or times it (warm-up, then rounds of batches),
   printing the original suite's log lines (``ddlbench.run_log``) and writing one JSON record
   (``--output``).
"""
from __future__ import annotations

import sys

from . import methods
from .flags import check, parse_args
from .run_config import RunConfig

__all__ = ["main", "worker", "benchmark", "parse_args", "check"]


def main(argv=None) -> int:
    """Parse and check the flags, then spawn the local workers or join the launcher's job;
    each worker runs ``worker``."""
    from .launch.job import run_job
    argv = list(sys.argv[1:] if argv is None else argv)
    return run_job(argv, "ddlbench.train", parse_args, check, worker)


# -- one worker, top to bottom -------------------------------------------------------------------

def worker(args, placement) -> int:
    """This process's part of the job: the run's configuration from the checked flags, then
    the runtime (a parameter server serves; a worker verifies or benchmarks)."""
    from . import runtime, verify
    config = RunConfig.of(args)

    def run(ctx) -> int:
        if config.verify:
            return verify.run(config, ctx)
        return benchmark(config, ctx)
    return runtime.start(placement, config.job, run)


def benchmark(config: RunConfig, ctx) -> int:
    """Time each method of the job in turn (usually one): the start-up (imports, process
    group, servers, emulated network) is paid once, everything measured is each method's own
    (its own record and trace paths, '{method}' replaced)."""
    for index, name in enumerate(config.method_ids):
        _benchmark(config.for_method(name, index), ctx)
    return 0


def _benchmark(config: RunConfig, ctx) -> None:
    """Build the replica and the method, time it, write the record."""
    from . import run_log, session
    from .measure import flops, overlap, record, timing, workload

    def log(line):
        if ctx.is_root:
            print(line, flush=True)

    (name, compressor), = config.runs
    run = session.build(config, ctx, name, compressor)
    tl = run.comm.timeline
    with run.watch(config), run.method as method:
        run.calibrate()
        model = run.work.stats()
        run_log.print_header(log, config, ctx, method, model)
        if method.architecture == methods.PS and not ctx.nservers:
            from .methods.ps import NO_SERVERS
            log(f"Parameter servers: {NO_SERVERS}")
        warm = {}
        servers = run.servers_recorded(config, ctx)
        # the servers' counters so far (rank 0; every worker waits for them): the record
        # gives this method's own
        before = record.server_counters(ctx, method.architecture == methods.PS)

        def on_warm():  # what the timed rounds count starts here
            run.comm.reset_stats()
            warm["rss"] = timing.rss_bytes()
            warm["clock"] = overlap.align(ctx.device if ctx.backend == "nccl" else None)
            if servers:
                overlap.servers_start(ctx.ps, ctx.rank)
            if run_log.sentence_line(config):  # the original's, before "Running benchmark..."
                log(run_log.sentence_line(config))

        log("Running warmup...")
        result = timing.run(ctx, run.train_step, method.synchronize,
                            batch_size=config.spec.batch_size, warmup=config.warmup,
                            batches_per_iter=config.batches_per_iter, iters=config.iters,
                            unit=run.work.unit, log=log, on_warm=on_warm, timeline=tl,
                            per_machine=method.architecture == methods.PS)
        steps = config.iters * config.batches_per_iter
        tl.events += method.library_timeline()
        served = overlap.servers_stop(ctx.ps, ctx.rank) if servers else None
        spent = overlap.collect(tl, ctx.rank, ctx.size, warm["clock"], config.timeline,
                                meta={"method": config.method, "model": config.spec.model,
                                      "nworkers": ctx.size, "net": config.net},
                                servers=served, server_iterations=steps)
        if spent is not None:
            log(run_log.overlap_line(config, spent))
        traffic = run.comm.stats(steps)
        compressed = run.comm.compression_stats(steps)
        run_log.print_traffic(log, config, ctx, method, model, traffic, compressed)
        # Counted once, by rank 0, after the timed rounds (the others wait in the record's
        # first collective).
        counted = flops.achieved(flops.count(run.spec), result) if ctx.is_root else None
        if counted is not None:
            run_log.print_flops(log, ctx, run.work.unit, counted)
        rec = record.run_record(config.record(), ctx, net=config.net, network=config.network,
                                lr=run.lr, options=method.options.as_dict(),
                                method=method.describe(), model=model, result=result,
                                communication=traffic, compression=compressed,
                                rss_after_warmup=warm.get("rss"),
                                optimizer=workload.optimizer_info(run.optimizer_spec,
                                                                  run.optimizer),
                                flops=counted, timeline=spent, servers_before=before)
        run.write_trace(config.trace_collectives, config.method)
    if ctx.is_root and config.output:
        record.write_atomic(config.output, rec)


if __name__ == "__main__":
    from ddlbench.errors import finish
    sys.exit(finish(main()))

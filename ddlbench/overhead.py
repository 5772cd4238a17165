"""What a method costs on one worker: the suite's 1-worker loop against a bare PyTorch loop.

    python -m ddlbench.overhead --model resnet18 --image-size 64 --batch-size 16 \
        --methods bspa2a,wfbp,fusion,ddp --rounds 10 --batches 10

Both loops run in this one process on the same model, data and optimizer settings, with
their timing rounds interleaved (bare, method, method, bare, ...) so that the machine's drift
hits both alike. The bare loop is forward, backward, ``optimizer.step()``,
``zero_grad(set_to_none=True)`` and nothing else. Prints, per method, the bare loop's throughput
and the ratio of throughputs (method / bare; 1.0 means no overhead), medians over rounds.
``--cuda`` runs both on GPU 0 (NCCL), each round timed to its last kernel; ``--optimizer`` is
the training script's (default: SGD with momentum 0.9, ``--optimizer auto`` as a benchmark has
it). So on a GPU one command gives the plain loop's throughput and each method's cost beside it:

    python -m ddlbench.overhead --cuda --model bert --batch-size 8 --optimizer auto \
        --methods wfbp,ddp --rounds 6

``--timeline`` measures instead what the timeline costs a method (docs/DESIGN.md section 8):
one model and method, its timed rounds rotating through three modes in every order: nothing
recorded (as ``--timeline-iters 0``), the counters every benchmark keeps (spans in memory, the
metrics computed after the round, outside its time), and a trace file's full recording (the
same plus a hook per parameter for the gradient-ready instants, registered for the round only).
Prints the throughput ratios counters / nothing and full / nothing, medians over the rounds.
"""
from __future__ import annotations

import statistics
import sys
import time

from .errors import EXIT_USAGE, ArgumentParser, UsageError
from .measure.workload import OPTIMIZERS


def main(argv=None) -> int:
    p = ArgumentParser(prog="python -m ddlbench.overhead", description=__doc__.split("\n")[0])
    p.add_argument("--model", default="resnet18")
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--image-size", type=int, default=None)
    p.add_argument("--sentence-len", type=int, default=64)
    p.add_argument("--methods", default="bspa2a,wfbp,fusion,ddp")
    p.add_argument("--rounds", type=int, default=10)
    p.add_argument("--batches", type=int, default=10)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--optimizer", default="sgd", choices=OPTIMIZERS,
                   help="as the training script's (auto: SGD for CNNs, AdamW for BERT)")
    p.add_argument("--momentum", type=float, default=0.9, help="SGD's")
    p.add_argument("--cuda", action="store_true", help="run on GPU 0 with NCCL")
    p.add_argument("--timeline", action="store_true",
                   help="measure the timeline's cost (nothing / counters / full trace) "
                        "instead of the method's against a bare loop")
    args = p.parse_args(argv)
    try:
        return run(args)
    except UsageError as e:
        print(f"ddlbench: error: {e}", file=sys.stderr)
        return EXIT_USAGE


def run(args) -> int:
    import torch
    import torch.distributed as dist

    from . import methods
    from .engine.comm import Comm

    if args.batch_size <= 0 or args.rounds <= 0 or args.batches <= 0:
        raise UsageError("--batch-size, --rounds and --batches must be positive")
    names = [m for m in args.methods.split(",") if m]
    for name in names:
        methods.lookup(name)
    if args.cuda and not torch.cuda.is_available():
        raise UsageError("--cuda: torch sees no CUDA GPU here")
    args.device = torch.device("cuda", 0) if args.cuda else torch.device("cpu")
    if args.cuda:
        torch.cuda.set_device(args.device)
    dist.init_process_group("nccl" if args.cuda else "gloo", store=dist.HashStore(), rank=0,
                            world_size=1)
    where = torch.cuda.get_device_name(args.device) if args.cuda \
        else f"threads {torch.get_num_threads()}"
    print(f"{args.model} bs {args.batch_size}, 1 worker, {args.rounds} rounds x "
          f"{args.batches} batches, {where}")
    if args.timeline:
        print(f"{'method':>10} {'none s/round':>13} {'counters/none':>14} {'full/none':>10}")
    else:
        print(f"{'method':>10} {'bare s/round':>13} {'bare samples/s':>15} "
              f"{'method s/round':>15} {'ratio (median)':>15}")
    try:
        for name in names:
            compare = _timeline_cost if args.timeline else _compare
            compare(args, name, methods.lookup(name), Comm(0, 1))
    finally:
        dist.destroy_process_group()
    return 0


def _build(args):
    import torch

    import models

    from .measure import workload
    torch.manual_seed(0)
    work = models.build(args.model, image_size=args.image_size, sentence_len=args.sentence_len)
    work.model.to(args.device).train()
    batch = work.make_batch(args.batch_size, args.device, torch.Generator().manual_seed(0))
    settings = workload.OptimizerSpec(model=args.model, flag=args.optimizer,
                                      momentum=args.momentum)
    opt = workload.make_optimizer(settings, work.model.parameters(),
                                  workload.learning_rate(settings, 1))
    return work, batch, opt


def _timed(step, n, device) -> float:
    """Seconds for ``n`` steps, to the last kernel on a GPU."""
    from .engine import synchronize
    synchronize(device)
    start = time.perf_counter()
    for _ in range(n):
        step()
    synchronize(device)
    return time.perf_counter() - start


MODES = ("none", "counters", "full")


def _timeline_cost(args, name, cls, comm) -> None:
    """One method's rounds rotating through the timeline's modes, and its line."""
    import itertools

    from . import timeline
    from .session import Run

    work, batch, opt = _build(args)
    tl = comm.timeline
    tl.watch_optimizer(opt)
    with cls(work.model, opt, comm) as method:
        run = Run(work, batch, opt, 0.01, comm, method)

        def step():
            with tl.iteration():
                run.train_step()

        _timed(step, args.warmup, args.device)
        method.synchronize()
        times = {m: [] for m in MODES}
        orders = list(itertools.permutations(MODES))
        for r in range(args.rounds):
            for mode in orders[r % len(orders)]:
                tl.trace_file = mode == "full"
                handles = tl.watch_gradients(work.model) if mode == "full" else []
                if mode != "none":
                    tl.start()
                t = _timed(step, args.batches, args.device)
                with tl.span("synchronize", timeline.WAIT):
                    method.synchronize()
                times[mode].append(t)
                tl.stop()
                recorded = timeline.overlap(tl.events) if mode != "none" else None
                if mode != "none" and (recorded or {}).get("iterations") != args.batches:
                    raise RuntimeError(f"the {mode} rounds recorded {recorded}")
                for h in handles:
                    h.remove()
        counters = [n / c for n, c in zip(times["none"], times["counters"])]
        full = [n / f for n, f in zip(times["none"], times["full"])]
        print(f"{name:>10} {statistics.median(times['none']):13.4f} "
              f"{statistics.median(counters):14.3f} {statistics.median(full):10.3f}",
              flush=True)


def _compare(args, name, cls, comm) -> None:
    """One method's rounds interleaved with the bare loop's, and its line."""
    bare_work, bare_batch, bare_opt = _build(args)
    work, batch, opt = _build(args)
    with cls(work.model, opt, comm) as method:
        def bare_step():
            bare_work.loss(bare_work.model, bare_batch).backward()
            bare_opt.step()
            bare_opt.zero_grad(set_to_none=True)

        def method_step():
            work.loss(method.module, batch).backward()
            method.step()
            method.zero_grad()

        _timed(bare_step, args.warmup, args.device)
        _timed(method_step, args.warmup, args.device)
        method.synchronize()
        bare_t, method_t = [], []
        for r in range(args.rounds):
            # Alternate which loop goes first, so neither always inherits the other's caches.
            if r % 2 == 0:
                bare_t.append(_timed(bare_step, args.batches, args.device))
            method_t.append(_timed(method_step, args.batches, args.device))
            method.synchronize()
            if r % 2 == 1:
                bare_t.append(_timed(bare_step, args.batches, args.device))
        ratios = [b / m for b, m in zip(bare_t, method_t)]  # throughput ratio method/bare
        bare = statistics.median(bare_t)
        print(f"{name:>10} {bare:13.4f} {args.batches * args.batch_size / bare:15.1f} "
              f"{statistics.median(method_t):15.4f} {statistics.median(ratios):15.3f}",
              flush=True)


if __name__ == "__main__":
    sys.exit(main())

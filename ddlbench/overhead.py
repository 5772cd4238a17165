"""What a method costs on one worker: the suite's 1-worker loop against a bare PyTorch loop.

    python -m ddlbench.overhead --model resnet18 --image-size 64 --batch-size 16 \
        --methods bspa2a,wfbp,fusion,ddp --rounds 10 --batches 10

Four loops run in this one process on the same model, data and optimizer settings, with their
timing rounds interleaved (bare, method, raw, ddp, then the reverse, ...) so that the machine's
drift hits all alike:

- bare: forward, backward, ``optimizer.step()``, ``zero_grad(set_to_none=True)`` and nothing else;
- the method, as its 1-worker benchmark runs it (its options: the training script's flags);
- raw hook: the bare loop plus, on every parameter, a ``register_post_accumulate_grad_hook`` that
  starts a raw ``all_reduce(p.grad, async_op=True)``, all waited before ``optimizer.step()``: the
  floor any method of Python gradient hooks can reach;
- ddp: the suite's ``ddp`` sending the method's messages: one bucket per tensor
  (``--bucket-cap-mb 0``) for WFBP, MG-WFBP (before its calibration) and the other per-tensor
  methods, the fusion threshold's bytes for a method fusing by one, one bucket holding
  everything for BSP, its own cap for ``ddp``.

Prints, per method, the bare loop's throughput, the ratio of throughputs (method / bare; 1.0
means no overhead), the number of gradient tensors and, per tensor, each loop's extra time over
the bare loop per iteration in microseconds (``us/tensor`` the method's, ``raw us/tensor``,
``ddp us/tensor``), the method's extra time over the raw hook loop's per tensor (``us-raw``:
what the method's hooks and thread cost beyond the bare collective call), the throughput ratio
method / ddp, the DDP reference's cap and the buckets it reduced; medians over rounds, each
ratio (and ``us-raw``) the median of the rounds' paired figures with its distribution-free
interval (``ci``: order statistics of a sign test, at least 95%; from 6 rounds on).
``--json PATH`` writes the same figures as one JSON object, again after each method (a later
method's failure or time limit loses none of the earlier ones' figures). ``--vocab-size`` gives
BERT a smaller vocabulary (as the training script's): BERT-Tiny's step is mostly its
30522-word output layer, and at 1000 words it is short enough that microseconds per tensor
show:

    python -m ddlbench.overhead --model bert_tiny --vocab-size 1000 --batch-size 8 \
        --methods wfbp --rounds 40 --batches 10

``--nworkers N`` runs the same on N local workers (pinned to cores of their own where they fit;
``--threads``), every loop's rounds starting on all of them together and each round's time the
slowest worker's: the method against DDP sending the same messages in the same job, round by
round, the paired comparison a sweep's separate jobs cannot give. There ``us/tensor`` is the
extra time over a loop without communication, exposed communication included:

    python -m ddlbench.overhead --nworkers 2 --model resnet18 --image-size 64 \
        --batch-size 16 --methods wfbp,fusion,bspa2a --rounds 30 --batches 4
``--net`` and ``--slots`` (the training script's) run the workers as emulated machines of S
workers each over an emulated network, so a method on the placement's groups is compared with
DDP (and, through it, with another method) round by round on a cluster's layout:

    python -m ddlbench.overhead --nworkers 4 --slots 2 --net 1gbit --model resnet18 \
        --image-size 64 --batch-size 16 --methods hier,fusion --threshold 8388608 --rounds 10

``--cuda`` runs all on GPU 0 (NCCL), each round timed to its last kernel; ``--optimizer`` is
the training script's (default: SGD with momentum 0.9, ``--optimizer auto`` as a benchmark has
it). So on a GPU one command gives the plain loop's throughput and each method's cost beside it:

    python -m ddlbench.overhead --cuda --model bert --batch-size 8 --optimizer auto \
        --methods wfbp,ddp --rounds 6

``--timeline`` measures instead what the timeline costs a method (docs/DESIGN.md section 8):
one model and method, its timed rounds rotating through three modes in every order: nothing
recorded (as ``--timeline-iters 0``), the counters every benchmark keeps (spans in memory, the
metrics computed after the round, outside its time; each collective's completion discovered
at the recorder's next event), and a trace file's full recording (the same plus a hook per
parameter for the gradient-ready instants, registered for the round only, and each collective's
completion stamped by a callback on its future).
Prints the throughput ratios counters / nothing and full / nothing, medians over the rounds
(``--json`` also keeps every round's seconds per mode).
"""
from __future__ import annotations

import statistics
import sys
import time

from . import methods
from .errors import ArgumentParser, UsageError, check_writable
from .measure import workload
from .measure.workload import OPTIMIZERS
from .options import add_flags, add_network_flags
from .stats import median_interval


def parse_args(argv=None):
    p = ArgumentParser(prog="python -m ddlbench.overhead", description=__doc__.split("\n")[0])
    p.add_argument("--model", default="resnet18")
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--image-size", type=int, default=None)
    p.add_argument("--sentence-len", type=int, default=64)
    p.add_argument("--vocab-size", type=int, default=None,
                   help="BERT's vocabulary in place of the model's, as the training script's "
                        "(a smaller one shortens the step, so that per-tensor costs show)")
    p.add_argument("--methods", default="bspa2a,wfbp,fusion,ddp")
    p.add_argument("--rounds", type=int, default=10)
    p.add_argument("--batches", type=int, default=10)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--nworkers", type=int, default=None,
                   help="workers of the job (default 1): each runs every loop, the rounds in "
                        "step; a round's time is its slowest worker's")
    p.add_argument("--slots", type=int, default=None, metavar="S",
                   help="workers per emulated host, as the training script's --slots (with "
                        "--net: machines of S workers, so methods on the placement's groups, "
                        "such as hier, run as on a cluster)")
    add_network_flags(p)
    p.add_argument("--threads", type=int, default=None,
                   help="torch threads per worker (default: one worker keeps torch's own, "
                        "OMP_NUM_THREADS; several pinned workers one per core)")
    p.add_argument("--optimizer", default="sgd", choices=OPTIMIZERS,
                   help="as the training script's (auto: SGD for CNNs, AdamW for BERT)")
    p.add_argument("--momentum", type=float, default=0.9, help="SGD's")
    p.add_argument("--cuda", action="store_true", help="run on GPU 0 with NCCL "
                   "(with --nworkers: GPU LOCAL_RANK)")
    p.add_argument("--timeline", action="store_true",
                   help="measure the timeline's cost (nothing / counters / full trace) "
                        "instead of the method's against a bare loop")
    p.add_argument("--json", metavar="PATH",
                   help="also write the figures as one JSON object (per method: throughputs, "
                        "ratios, microseconds per tensor, tensors, the DDP reference's buckets)")
    add_flags(p.add_argument_group("the methods' options (each: the methods declaring it and "
                                   "their defaults)"), methods.option_owners())
    return p.parse_args(argv)


def check(args) -> None:
    """Bad input, before any worker starts: one line (``UsageError``)."""
    workload.check_workload(args, positive=("--rounds", "--batches", "--nworkers", "--threads",
                                            "--slots"),
                            nonneg=("--warmup", "--momentum"))
    from . import netem
    netem.check(args.net)  # a known profile or rate; root and iproute2 unless loopback
    names = [m.strip() for m in args.methods.split(",") if m.strip()]
    if not names:
        raise UsageError(f"--methods {args.methods!r} names no method; give one or more, "
                         f"comma-separated ({', '.join(methods.names())})")
    for name in names:
        methods.lookup(name).Options.resolve(vars(args))
    if args.json:
        check_writable(args.json, "--json")


def main(argv=None) -> int:
    from .launch.job import run_job
    argv = list(sys.argv[1:] if argv is None else argv)
    return run_job(argv, "ddlbench.overhead", parse_args, check, worker)


def worker(args, placement) -> int:
    """One worker's part: joins the job (Gloo, or NCCL with ``--cuda``) and runs every
    method's rounds."""
    import torch

    from . import runtime
    if args.cuda and not torch.cuda.is_available():
        raise UsageError("--cuda: torch sees no CUDA GPU here")
    # one worker keeps torch's own thread count (OMP_NUM_THREADS), as a bare loop would have
    threads = args.threads or (torch.get_num_threads() if placement.world_size == 1 else None)
    job = runtime.Job(use_cuda=args.cuda, threads=threads)
    return runtime.start(placement, job, lambda ctx: run(args, ctx))


def run(args, ctx) -> int:
    import torch

    from .runtime.comm import Comm

    names = [m.strip() for m in args.methods.split(",") if m.strip()]
    args.device = ctx.device
    where = torch.cuda.get_device_name(ctx.device) if ctx.device.type == "cuda" \
        else f"threads {torch.get_num_threads()}"
    say = print if ctx.is_root else (lambda *a, **k: None)
    vocab = "" if args.vocab_size is None else f" (vocabulary {args.vocab_size})"
    say(f"{args.model}{vocab} bs {args.batch_size}, {ctx.size} worker{'s' if ctx.size > 1 else ''} "
        f"({ctx.backend}), {args.rounds} rounds x {args.batches} batches, {where}")
    _header(args.timeline, say)
    figures = {}
    for name in names:
        compare = _timeline_cost if args.timeline else _compare
        figures[name] = compare(args, name, methods.lookup(name), Comm(ctx.rank, ctx.size), say)
        if args.json and ctx.is_root:  # after every method: a later one's failure loses none
            _write_json(args, where, ctx.size, figures)
    return 0


def _header(timeline: bool, say=print) -> None:
    if timeline:
        say(f"{'method':>10} {'none s/round':>13} {'counters/none':>14} {'full/none':>10}")
        return
    # us/tensor: (method - bare) seconds per iteration / gradient tensors; raw: the bare loop
    # with a raw all-reduce hook per parameter; us-raw: the method's extra time over the raw
    # hook loop's, per tensor, round by round; ddp: DDP at the cap sending the same messages
    # ci(...): the distribution-free interval of that median (a sign test, >= 95%)
    say(f"{'method':>10} {'bare s/round':>13} {'bare samples/s':>15} "
        f"{'method s/round':>15} {'ratio (median)':>15} {'ci(ratio)':>15} {'tensors':>8} "
        f"{'us/tensor':>10} {'raw us/tensor':>14} {'us-raw':>8} {'ci(us-raw)':>17} "
        f"{'ddp us/tensor':>14} {'method/ddp':>11} "
        f"{'ci(method/ddp)':>15} {'ddp cap MiB':>12} {'ddp buckets':>12}", flush=True)


def _write_json(args, where: str, nworkers: int, figures: dict) -> None:
    from .measure import record
    record.write_atomic(args.json, {
        "mode": "timeline" if args.timeline else "overhead", "model": args.model,
        "batch_size": args.batch_size, "image_size": args.image_size,
        "sentence_len": args.sentence_len, "vocab_size": args.vocab_size,
        "optimizer": args.optimizer,
        "rounds": args.rounds, "batches": args.batches, "warmup": args.warmup,
        "nworkers": nworkers, "slots": args.slots, "net": args.net, "network": args.network,
        "threshold": args.threshold, "device": where, "methods": figures})


def _build(args):
    import torch

    import models

    from .measure import workload
    torch.manual_seed(0)
    work = models.build(args.model, image_size=args.image_size, sentence_len=args.sentence_len,
                        vocab_size=args.vocab_size)
    work.model.to(args.device).train()
    batch = work.make_batch(args.batch_size, args.device, torch.Generator().manual_seed(0))
    settings = workload.OptimizerSpec(model=args.model, flag=args.optimizer,
                                      momentum=args.momentum)
    opt = workload.make_optimizer(settings, work.model.parameters(),
                                  workload.learning_rate(settings, 1))
    return work, batch, opt


def _timed(step, n, device) -> float:
    """Seconds for ``n`` steps, to the last kernel on a GPU."""
    from .runtime import synchronize
    synchronize(device)
    start = time.perf_counter()
    for _ in range(n):
        step()
    synchronize(device)
    return time.perf_counter() - start


MODES = ("none", "counters", "full")


def _timeline_cost(args, name, cls, comm, say=print) -> dict:
    """One method's rounds rotating through the timeline's modes, and its line."""
    import itertools

    from . import timeline
    from .session import Run

    work, batch, opt = _build(args)
    tl = comm.timeline
    tl.watch_optimizer(opt)
    with cls(work.model, opt, comm, cls.Options.resolve(vars(args)),
             model_name=args.model) as method:
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
                _together(comm)
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
        fig = _timeline_figures(_slowest(comm, times))
        say(f"{name:>10} {fig['none_s_per_round']:13.4f} {fig['counters/none']:14.3f} "
            f"{fig['full/none']:10.3f}", flush=True)
    return fig


def _timeline_figures(times: dict) -> dict:
    """Each mode's throughput over the unrecorded rounds' (time of the round without the
    timeline / time of the round with it: below 1 where recording costs), the median over the
    rounds, and every mode's seconds per round (``round_s``, in the rounds' order)."""
    med = statistics.median
    return {"none_s_per_round": med(times["none"]),
            "counters/none": med(n / c for n, c in zip(times["none"], times["counters"])),
            "full/none": med(n / f for n, f in zip(times["none"], times["full"])),
            "round_s": times}


MIB = 1024 * 1024


def _compare(args, name, cls, comm, say=print) -> dict:
    """One method's rounds interleaved with the three references' (the bare loop, the raw hook
    loop, DDP sending the same messages), its line, and its figures."""
    import contextlib
    with contextlib.ExitStack() as stack:
        steps, syncs, ref, tensors = _loops(args, cls, comm, stack)
        times = _slowest(comm, _rounds(args, steps, syncs, comm))
        buckets = _ddp_buckets(ref.ddp)
    fig = _figures(args, times, tensors, nworkers=comm.size)
    fig["ddp_reference"] = {"bucket_cap_mb": ref.bucket_cap_mb, "buckets": buckets,
                            "first_bucket_bytes": ref.first_bucket_bytes}
    us = fig["us_per_tensor"]
    ci = {k: "-" if v is None else f"[{v[0]:.1f},{v[1]:.1f}]" if k.endswith("us/tensor")
          else f"[{v[0]:.3f},{v[1]:.3f}]" for k, v in fig["interval"].items()}
    say(f"{name:>10} {fig['bare_s_per_round']:13.4f} {fig['samples_per_s']['bare']:15.1f} "
        f"{fig['method_s_per_round']:15.4f} {fig['ratio']['method/bare']:15.3f} "
        f"{ci['method/bare']:>15} {tensors:8d} {us['method']:10.2f} {us['raw_hook']:14.2f} "
        f"{us['method-raw_hook']:8.1f} {ci['method-raw_hook us/tensor']:>17} "
        f"{us['ddp_match']:14.2f} {fig['ratio']['method/ddp_match']:11.3f} "
        f"{ci['method/ddp_match']:>15} {ref.bucket_cap_mb:12g} "
        f"{'?' if buckets is None else buckets:>12}", flush=True)
    return fig


def _loops(args, cls, comm, stack):
    """The four loops' steps (bare, method, raw_hook, ddp_match), the synchronize after a
    round of each, the matching DDP and the number of gradient tensors; the methods and hooks
    closed by ``stack``."""
    from .methods.ddp import DDP
    options = cls.Options.resolve(vars(args))
    work, batch, opt = _build(args)
    method = stack.enter_context(cls(work.model, opt, comm, options, model_name=args.model))
    ref_work, ref_batch, ref_opt = _build(args)
    cap = _matching_cap(cls, options, ref_work.model)
    ref = stack.enter_context(DDP(ref_work.model, ref_opt, comm,
                                  DDP.Options.resolve({"bucket_cap_mb": cap})))
    tensors = sum(1 for p in work.model.parameters() if p.requires_grad)
    steps = {"bare": _bare_step(args), "method": _method_step(work, batch, method),
             "raw_hook": _raw_hook_step(args, stack),
             "ddp_match": _method_step(ref_work, ref_batch, ref)}
    return steps, {"method": method.synchronize, "ddp_match": ref.synchronize}, ref, tensors


def _bare_step(args):
    """Forward, backward, ``optimizer.step()``, ``zero_grad(set_to_none=True)``."""
    work, batch, opt = _build(args)

    def step():
        work.loss(work.model, batch).backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    return step


def _method_step(work, batch, method):
    def step():
        work.loss(method.module, batch).backward()
        method.step()
        method.zero_grad()
    return step


def _raw_hook_step(args, stack):
    """The bare loop plus, on every parameter, a hook that starts a raw asynchronous
    all-reduce of its gradient as it is accumulated; all waited before ``optimizer.step()``:
    the floor of any method of Python gradient hooks."""
    import torch.distributed as dist
    work, batch, opt = _build(args)
    pending = []

    def hook(p):
        pending.append(dist.all_reduce(p.grad, async_op=True))
    handles = [p.register_post_accumulate_grad_hook(hook)
               for p in work.model.parameters() if p.requires_grad]
    stack.callback(lambda: [h.remove() for h in handles])

    def step():
        work.loss(work.model, batch).backward()
        for w in pending:
            w.wait()
        pending.clear()
        opt.step()
        opt.zero_grad(set_to_none=True)
    return step


def _matching_cap(cls, options, model) -> float:
    """DDP's ``bucket_cap_mb`` sending the messages method ``cls`` sends: DDP's own setting;
    else from the method's fusion threshold (``fusion_threshold``, what it packs by): one
    bucket for an infinite one (a cap above every gradient byte: DDP's bucket closes only once
    it holds its cap), else its bytes (0: one per tensor, as WFBP and MG-WFBP before its
    calibration; DDP's bucket takes the tensor that crosses its cap, fusion's leaves it for
    the next); one bucket per tensor for a method without one."""
    from .methods.ddp import DDP
    if issubclass(cls, DDP):
        return float(options.bucket_cap_mb)
    nbytes = [p.numel() * p.element_size() for p in model.parameters() if p.requires_grad]
    fusion = getattr(cls, "fusion_threshold", None)
    threshold = 0.0 if fusion is None else float(fusion(options, nbytes))
    if threshold == float("inf"):
        return float(sum(nbytes) // MIB + 1)
    return threshold / MIB


def _ddp_buckets(ddp) -> int | None:
    """The buckets DDP reduced in its last logged step (torch's DDP logging data; after the
    rebuild of its first step), None where this torch does not say."""
    try:
        data = ddp._get_ddp_logging_data()
    except Exception:
        return None
    if data.get("num_buckets_reduced"):
        return int(data["num_buckets_reduced"])
    rebuilt = data.get("rebuilt_bucket_sizes")
    return len(rebuilt.split(",")) if rebuilt else None


def _rounds(args, steps, syncs, comm=None) -> dict:
    """Seconds per round of each loop, the rounds interleaved, the order reversed every other
    round so that no loop always inherits the same one's caches. At least two warm-up steps:
    DDP rebuilds its buckets after its first. With several workers every round starts on all
    of them together (``_together``)."""
    for loop, step in steps.items():
        _timed(step, max(args.warmup, 2), args.device)
        syncs.get(loop, lambda: None)()
    times = {loop: [] for loop in steps}
    order = list(steps)
    for r in range(args.rounds):
        for loop in order if r % 2 == 0 else order[::-1]:
            _together(comm)
            times[loop].append(_timed(steps[loop], args.batches, args.device))
            syncs.get(loop, lambda: None)()
    return times


def _together(comm) -> None:
    """With several workers, a barrier: each timed round starts on every worker at once (a
    loop without collectives, the bare one, would otherwise drift apart)."""
    if comm is not None and comm.size > 1:
        import torch.distributed as dist
        dist.barrier(group=comm.group)


def _slowest(comm, times: dict) -> dict:
    """Each round's time as the job's: its slowest worker's (the same on every worker)."""
    if comm is None or comm.size == 1:
        return times
    import torch.distributed as dist
    every: list = [None] * comm.size
    dist.all_gather_object(every, times, group=comm.group)
    return {loop: [max(w[loop][r] for w in every) for r in range(len(rounds))]
            for loop, rounds in times.items()}


def _figures(args, times, tensors, nworkers: int = 1) -> dict:
    """Medians over the rounds: throughputs, throughput ratios with their intervals, and each
    loop's extra time over the bare loop per iteration and gradient tensor, in microseconds;
    with every loop's seconds per round (``round_s``, in the rounds' order: runs can be
    pooled)."""
    med = statistics.median
    bare = times["bare"]
    samples = args.batches * args.batch_size * nworkers

    def ratios(loop, base):  # throughput loop / base, round by round
        return [b / t for t, b in zip(times[loop], times[base])]

    def ratio(loop, base):
        return med(ratios(loop, base))

    def extra(loop, base):  # loop's extra time over base per iteration and tensor, in us
        return [(t - b) / args.batches / tensors * 1e6 for t, b in zip(times[loop], times[base])]

    def us(loop):
        return med(extra(loop, "bare"))
    return {"tensors": tensors, "bare_s_per_round": med(bare),
            "method_s_per_round": med(times["method"]),
            "samples_per_s": {loop: samples / med(t) for loop, t in times.items()},
            "ratio": {"method/bare": ratio("method", "bare"),
                      "method/ddp_match": ratio("method", "ddp_match"),
                      "raw_hook/bare": ratio("raw_hook", "bare"),
                      "ddp_match/bare": ratio("ddp_match", "bare")},
            "interval": {"method/bare": median_interval(ratios("method", "bare")),
                         "method/ddp_match": median_interval(ratios("method", "ddp_match")),
                         "method-raw_hook us/tensor": median_interval(extra("method",
                                                                            "raw_hook"))},
            "us_per_tensor": {**{loop: us(loop) for loop in times if loop != "bare"},
                              "method-raw_hook": med(extra("method", "raw_hook"))},
            "round_s": times}


if __name__ == "__main__":
    from ddlbench.errors import finish
    sys.exit(finish(main()))

"""Where a per-gradient all-reduce's host time goes at one worker (docs/RESULTS.md, "GPU on a second H200").

    python scripts/issue_probe.py MODEL BATCH        (e.g. bert 8, resnet50 64; GPU 0 if any)

One process, one rank (NCCL on GPU 0, else Gloo), the benchmark's optimizer (``--optimizer
auto``), eight loops on copies of the same model, their timing rounds interleaved (forward and
backward order alternating) as ``ddlbench.overhead`` does: ``bare`` (forward, backward, step,
``zero_grad(set_to_none=True)``); ``kept`` (the same with ``set_to_none=False``: the gradients
stay, are zeroed in place and accumulated into); ``views`` (the same with the gradients views
into one flat buffer, zeroed by one fused call, as the bucketed methods hold them, as DDP's
``gradient_as_bucket_view``: docs/RESULTS.md, 2026-12-06, measured both at the bare loop's pace
or faster); ``noop`` (a Python hook per gradient that does nothing: the hook's own dispatch);
``raw`` (the
hook starts ``dist.all_reduce(grad, async_op=True)``, the step waits for them all); ``suite``
(the hook starts the suite's ``compression.NoCompression().reduce_async`` on the counted
collectives with the timeline recording, the step waits); ``wfbp`` and ``bspa2a`` (the
methods themselves). Prints
``profiler.measure_issue`` (the issue alone, the device idle), the time the hooks spent issuing
and the step spent waiting in the last round, and per loop ms per iteration, the throughput
ratio to ``bare`` and the extra time per gradient tensor, the medians of the rounds' paired
figures (5 rounds of 10; ``ROUNDS=N`` in the environment for more, and from 6 the extra time's
sign-test interval, ``ddlbench.stats.median_interval``, as ``ddlbench.overhead`` gives).
``KINDS=bare,kept`` runs only those loops (``bare`` always, the reference); ``VOCAB=N`` gives
BERT an N-word vocabulary (as ``--vocab-size``)."""
import argparse
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

import compression  # noqa: E402
from ddlbench import compat, methods, overhead, stats  # noqa: E402
from ddlbench.measure import profiler  # noqa: E402
from ddlbench.runtime.comm import Comm  # noqa: E402

ROUNDS = int(os.environ.get("ROUNDS", 5))   # more rounds: an interval (from 6 on)
BATCHES = 10
KINDS = ("bare", "kept", "views", "noop", "raw", "suite", "wfbp", "bspa2a")


def main() -> int:
    kinds = ["bare"] + [k for k in os.environ.get("KINDS", ",".join(KINDS)).split(",")
                        if k and k != "bare"]
    if len(sys.argv) != 3 or not sys.argv[2].isdigit() or not set(kinds) <= set(KINDS):
        print("usage: [KINDS=bare,kept,...] python scripts/issue_probe.py MODEL BATCH "
              f"(loops: {','.join(KINDS)})", file=sys.stderr)
        return 2
    vocab = os.environ.get("VOCAB")
    cuda = torch.cuda.is_available()
    args = argparse.Namespace(model=sys.argv[1], batch_size=int(sys.argv[2]), image_size=None,
                              sentence_len=64, optimizer="auto", momentum=0.9, cuda=cuda,
                              vocab_size=int(vocab) if vocab else None,
                              device=torch.device("cuda", 0) if cuda else torch.device("cpu"))
    if cuda:
        torch.cuda.set_device(args.device)
    dist.init_process_group("nccl" if cuda else "gloo", store=dist.HashStore(), rank=0,
                            world_size=1)
    try:
        comm = Comm(0, 1)
        print(args.model, args.batch_size, "measure_issue",
              profiler.measure_issue(device=args.device))
        loops = {kind: _loop(args, kind, comm) for kind in kinds}
        _report(args, loops)
    finally:
        dist.destroy_process_group()
    return 0


def _loop(args, kind, comm):
    """(step, its counters, gradient tensors) for one kind of loop."""
    work, batch, opt = overhead._build(args)
    if kind in ("wfbp", "bspa2a"):
        method = methods.lookup(kind)(work.model, opt, comm)
        method.start()   # as a run has it: its communication thread issues (a daemon)

        def method_step():
            work.loss(method.module, batch).backward()
            method.step()
            method.zero_grad()
        return method_step, None, len(method.params)
    params = [p for p in work.model.parameters() if p.requires_grad]
    codec = compression.NoCompression()
    pending, acc = [], {"issue": 0.0, "wait": 0.0}

    def hook(p):
        if kind == "noop":
            return
        start = time.perf_counter()
        if kind == "raw":
            pending.append(dist.all_reduce(p.grad, async_op=True))
        else:
            pending.append(codec.reduce_async((0,), p.grad.view(-1), comm, shapes=[p.shape]))
        acc["issue"] += time.perf_counter() - start

    if kind not in ("bare", "kept", "views"):
        for p in params:
            compat.on_grad_ready(p, hook)
    zero = lambda: opt.zero_grad(set_to_none=kind != "kept")  # noqa: E731
    if kind == "views":
        flat = torch.zeros(sum(p.numel() for p in params), dtype=params[0].dtype,
                           device=params[0].device)
        for p, v in zip(params, flat.split([p.numel() for p in params])):
            p.grad = v.view(p.shape)
        zero = flat.zero_

    def step():
        work.loss(work.model, batch).backward()
        start = time.perf_counter()
        for w in pending:
            w.wait()
        acc["wait"] += time.perf_counter() - start
        pending.clear()
        opt.step()
        zero()
    return step, acc, len(params)


def _report(args, loops) -> None:
    kinds = list(loops)
    for kind in kinds:
        overhead._timed(loops[kind][0], 5, args.device)
    times = {kind: [] for kind in kinds}
    for r in range(ROUNDS):
        for kind in (kinds if r % 2 == 0 else kinds[::-1]):
            step, acc, _ = loops[kind]
            if acc is not None:
                acc.update(issue=0.0, wait=0.0)
            times[kind].append(overhead._timed(step, BATCHES, args.device))
    for kind in [k for k in ("raw", "suite") if k in loops]:
        acc = loops[kind][1]
        print(f"{kind:>6} last round: issue {acc['issue'] / BATCHES * 1e3:.2f} ms/iter, "
              f"wait {acc['wait'] / BATCHES * 1e3:.2f} ms/iter")
    bare, n = statistics.median(times["bare"]), loops["bare"][2]
    for kind in kinds:
        t = statistics.median(times[kind])
        # paired per round: the ratio to the same round's bare loop, the extra time per tensor
        ratios = [b / x for x, b in zip(times[kind], times["bare"])]
        extra = [(x - b) / BATCHES / n * 1e6 for x, b in zip(times[kind], times["bare"])]
        ci = stats.median_interval(extra)
        print(f"{kind:>6} {t / BATCHES * 1e3:8.2f} ms/iter  ratio {statistics.median(ratios):.3f}"
              f"  extra/tensor {statistics.median(extra):7.1f} us"
              + ("" if ci is None else f" [{ci[0]:.1f}, {ci[1]:.1f}]"))

if __name__ == "__main__":
    sys.exit(main())

"""What each compressor sends, and what encoding and decoding cost, for a model's gradients.

    python -m ddlbench.measure.codec_bench --model resnet50 bert_base --nworkers 8

No training and no process group: the gradients are random tensors of the model's shapes,
grouped into the buckets the fusion method would use (``--threshold``, default 64 MiB as the
original ran its compressors), and each compressor runs its real ``reduce_async``/``wait``
against ``SimComm``, a stand-in for the ``Comm`` of P workers that all hold the same gradient:
an all-reduce multiplies by P, an all-gather repeats the tensor P times. Bytes are therefore
counted from the tensors the compressor actually hands over, exactly as in a run; times are
encode and decode only (communication excluded), on this machine's CPU unless ``--cuda``.
``--output FILE`` also writes them as JSON (per model, per compressor, with the time per dense
gradient element and the settings), for the performance model (docs/DESIGN.md section 7).
"""
from __future__ import annotations

import sys

import torch

import compression

from ..errors import EXIT_USAGE, ArgumentParser, UsageError, check_writable
from ..options import add_flags
from ..runtime.comm import Comm
from . import record


class _Done:
    def wait(self):
        return True


class SimComm(Comm):
    """``Comm``'s counting with P simulated workers that all hold the same tensor."""

    def __init__(self, size: int):
        super().__init__(rank=0, size=size)

    def allreduce(self, tensor, async_op=True):
        self.count("allreduce", tensor.numel(), tensor.dtype)
        tensor.mul_(self.size)
        return _Done()

    def allgather(self, output, tensor, async_op=True):
        self.count("allgather", tensor.numel(), tensor.dtype)
        output.view(self.size, -1).copy_(tensor.view(1, -1))
        return _Done()

    def broadcast(self, tensor, src=0, async_op=False):
        self.count("broadcast", tensor.numel(), tensor.dtype, root=self.rank == src)
        return _Done()

    def barrier(self):
        pass


def model_buckets(model_name: str, threshold: float, device="cpu"):
    """(parameter indices, shapes) per bucket of the model's gradients in fusion buckets,
    backward order."""
    import models

    from ..planning import plan_buckets
    work = models.build(model_name)
    params = [p for p in work.model.parameters() if p.requires_grad]
    order = list(reversed(range(len(params))))
    groups = plan_buckets([params[i].numel() * 4 for i in order], threshold)
    buckets = [[order[j] for j in g] for g in groups]
    shapes = [[tuple(params[i].shape) for i in b] for b in buckets]
    return buckets, shapes


def measure(name: str, buckets, shapes, nworkers: int, iters: int, options: dict,
            device: str = "cpu", seed: int = 0) -> dict:
    """Per-iteration figures of compressor ``name`` (``options``: its option values) over
    ``iters`` iterations after one warm-up."""
    comp = compression.create(name, **options)
    comm = SimComm(nworkers)
    gen = torch.Generator().manual_seed(seed)
    grads = [torch.randn(sum(torch.Size(s).numel() for s in sh), generator=gen).to(device)
             for sh in shapes]
    flats = [torch.empty_like(g) for g in grads]
    for it in range(iters + 1):
        if it == 1:  # the first iteration warms up (allocations, Q initialisation)
            comm.reset_stats()
        pend = []
        for b, sh, g, f in zip(buckets, shapes, grads, flats):
            f.copy_(g)
            pend.append(comp.reduce_async(tuple(b), f, comm, shapes=[torch.Size(s) for s in sh]))
        for p in pend:
            p.wait()
    return comm.compression_stats(iters)


def _mb(x):
    return f"{x / 1e6:.3f}"


def main(argv=None) -> int:
    p = ArgumentParser(prog="python -m ddlbench.measure.codec_bench",
                       description=__doc__.split("\n")[0])
    p.add_argument("--model", nargs="+", default=["resnet50", "bert_base"])
    p.add_argument("--compressor", nargs="+", default=list(compression.COMPRESSORS))
    p.add_argument("--nworkers", type=int, default=8)
    add_flags(p, compression.option_owners())
    p.add_argument("--threshold", type=float, default=64 * 1024 * 1024, help="bucket bytes")
    p.add_argument("--iters", type=int, default=3, help="timed iterations (after one warm-up)")
    p.add_argument("--threads", type=int, default=1, help="torch CPU threads")
    p.add_argument("--no-timing", action="store_true", help="bytes only (one iteration)")
    p.add_argument("--cuda", action="store_true")
    p.add_argument("--output", metavar="FILE",
                   help="also write the figures as JSON: per model, per compressor, with "
                        "dense_elements and encode/decode seconds per element, and the settings")
    args = p.parse_args(argv)
    try:
        options = {spec.name: spec.default if getattr(args, spec.name) is None
                   else getattr(args, spec.name) for spec in compression.specs()}
        for name in args.compressor:
            compression.check_options(name, **options)
        if args.nworkers < 1 or args.iters < 1 or args.threads < 1:
            raise UsageError("--nworkers, --iters and --threads must be positive")
        if args.cuda and not torch.cuda.is_available():
            raise UsageError("--cuda: no CUDA device here")
        if args.output:
            check_writable(args.output)
    except UsageError as e:
        print(f"ddlbench: error: {e}", file=sys.stderr)
        return EXIT_USAGE
    torch.set_num_threads(args.threads)
    device = "cuda" if args.cuda else "cpu"
    iters = 1 if args.no_timing else args.iters
    report = {"settings": {"nworkers": args.nworkers, "threshold": args.threshold,
                           "density": options["density"],
                           "powersgd_rank": options["powersgd_rank"],
                           "powersgd_dense_steps": options["powersgd_dense_steps"],
                           "device": device, "threads": args.threads, "iters": iters,
                           "timing": not args.no_timing},
              "models": {}}
    for model_name in args.model:
        buckets, shapes = model_buckets(model_name, args.threshold)
        n = sum(torch.Size(s).numel() for sh in shapes for s in sh)
        figures = {}
        report["models"][model_name] = {
            "dense_elements": n, "bucket_shapes": [[list(s) for s in sh] for sh in shapes],
            "compressors": figures}
        print(f"\n{model_name}: {n} parameters, {len(shapes)} bucket(s) of at most "
              f"{args.threshold:g} bytes, {args.nworkers} workers, density "
              f"{options['density']:g}, PowerSGD rank {options['powersgd_rank']}; {device}, "
              f"{args.threads} thread(s)")
        print("| compressor | payload MB | sent MB | received MB | dense fp32 sent MB | "
              "ratio (payload) | ratio (sent) | encode ms | decode ms |")
        print("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
        for name in args.compressor:
            st = measure(name, buckets, shapes, args.nworkers, iters, options, device)
            figures[name] = {**st, "dense_elements": n,
                             "encode_s_per_element": st["encode_s"] / n if n else None,
                             "encode_at_wait_s_per_element": (st["encode_at_wait_s"] / n
                                                              if n else None),
                             "decode_s_per_element": st["decode_s"] / n if n else None}
            timing = ("-", "-") if args.no_timing else (f"{st['encode_s'] * 1e3:.1f}",
                                                         f"{st['decode_s'] * 1e3:.1f}")
            sent_ratio = (f"{st['dense_wire_bytes'] / st['wire_sent_bytes']:.1f}"
                          if st["wire_sent_bytes"] else "-")
            print(f"| {name} | {_mb(st['payload_bytes'])} | {_mb(st['wire_sent_bytes'])} | "
                  f"{_mb(st['wire_received_bytes'])} | {_mb(st['dense_wire_bytes'])} | "
                  f"{st['compression_ratio']:.1f} | {sent_ratio} | {timing[0]} | {timing[1]} |",
                  flush=True)
    print("\nMB = 10^6 bytes per worker per iteration. payload: handed to collectives; "
          "sent/received: ring model (all-reduce 2(P-1)/P x M, all-gather (P-1) x m each way); "
          "ratio (payload): dense fp32 payload / payload; ratio (sent): dense fp32 sent / sent. "
          "encode/decode: compressor time per iteration, communication excluded.")
    if args.output:
        record.write_atomic(args.output, report)
        print(f"wrote {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

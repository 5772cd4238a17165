"""The benchmark's log lines on rank 0 (the original suite's header, then the traffic, overlap,
FLOPs and compression figures of the timed rounds), from the run's ``RunConfig``."""
from __future__ import annotations

from . import methods, timeline


def print_header(log, config, ctx, method, model: dict) -> None:
    """The original suite's header lines, and the method that runs."""
    log(f"Model: {config.spec.model}")
    log(f"Method: {config.method} ({method.display or method.id}), engine {config.engine}, "
        f"backend {ctx.backend}, compressor {config.compressor}")
    log(f"Batch size: {config.spec.batch_size}")
    log(f"Number of {ctx.device_noun}s: {ctx.size}")
    log(f"Parameters: {model['parameters']}, gradient bytes: {model['gradient_bytes']}, "
        f"tensors: {model['tensors']}")


def sentence_line(config) -> str | None:
    """The line the original's BERT scripts printed after the warm-up, before "Running
    benchmark..." (for BERT-Base too, word for word); None for the other models."""
    from .measure.workload import is_bert
    if not is_bert(config.spec.model):
        return None
    return f"BERT Large Pretraining, Sentence len: {config.spec.sentence_len}"


def print_traffic(log, config, ctx, method, model: dict, traffic: dict,
                   compressed: dict | None) -> None:
    """What went over the wire per worker per iteration: the compressor's figures, the
    parameter servers' pushes and pulls."""
    if compressed is not None:
        log(compression_line(config, compressed))
    if method.architecture == methods.PS:
        push = traffic["payload_bytes"].get("push", 0)
        pull = traffic["payload_bytes"].get("pull", 0)
        from .methods.ps import servers_line
        log(f"Parameter servers: {servers_line(ctx.nservers)}, partition "
            f"{config.job.partition_bytes} bytes; "
            f"per worker per iteration {push / 1e6:.3f} MB pushed, {pull / 1e6:.3f} MB "
            f"pulled (gradient {model['gradient_bytes'] / 1e6:.3f} MB)")


def overlap_line(config, section: dict) -> str:
    """Where the slowest rank's iteration time went (``Overlap: ...``)."""
    if section["mean"] is None:
        return "Overlap: no iteration recorded (--timeline-iters 0)"
    line = timeline.summary_line(section["mean"], section["slowest_rank"])
    if not section["comm_observed"]:
        line += (f" (communication not observable: {config.method} does it outside the suite's "
                 f"collectives)")
    if config.timeline:
        line += f"; trace: {config.timeline}"
    return line


def print_flops(log, ctx, unit: str, counted: dict) -> None:
    """The FLOPs per sample and the FLOP/s achieved (no 'Total' in it: the original's parser
    reads every line holding that word)."""
    per_sample = counted["forward_backward_per_sample"]
    if per_sample is None:
        return
    rate = counted["achieved_flops_per_second"]
    log(f"FLOPs: {per_sample / 1e9:.3f} GFLOP per {unit} forward+backward "
        f"({counted['forward_per_sample'] / 1e9:.3f} forward); achieved "
        f"{rate['per_worker'] / 1e12:.3f} TFLOP/s per {ctx.device_noun}, "
        f"{rate['total'] / 1e12:.3f} TFLOP/s on {ctx.size} {ctx.device_noun}(s)")

def compression_line(config, st: dict) -> str:
    """Rank 0's figures: bytes per worker per iteration beside the dense fp32 figure (the same
    on every rank), and rank 0's encode/decode time per iteration."""
    mb = 1e6
    return (f"Compression: {config.compressor}: per worker per iteration "
            f"{st['payload_bytes'] / mb:.3f} MB handed to collectives "
            f"(dense fp32 {st['dense_payload_bytes'] / mb:.3f} MB, ratio "
            f"{st['compression_ratio']:.1f}x), {st['wire_sent_bytes'] / mb:.3f} MB sent and "
            f"{st['wire_received_bytes'] / mb:.3f} MB received (dense "
            f"{st['dense_wire_bytes'] / mb:.3f} MB each way, ring model); "
            f"encode {st['encode_s'] * 1e3:.2f} ms, decode {st['decode_s'] * 1e3:.2f} ms")



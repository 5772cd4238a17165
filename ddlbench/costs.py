"""The one cost model of bytes on the wire: what a worker sends per collective (ring algorithms,
docs/DESIGN.md section 3), the nccl-tests bus-bandwidth factors derived from it, and the
collectives each compressor starts for a bucket (section 7), as formulas: no torch."""
from __future__ import annotations

import math

from .errors import UsageError

# A message's size is counted as nccl-tests counts it: for all-reduce the tensor every rank
# holds (M), for all-gather the gathered output (P x the m bytes each rank contributes), for
# broadcast the tensor. Under the ring algorithms each worker sends (and receives)
#   all-reduce  2(P-1)/P * M     (reduce-scatter then all-gather, P-1 steps each)
#   all-gather  (P-1)/P * P*m = (P-1) * m
#   broadcast   (P-1) * M from the root (a pipelined chain from the root sends M per hop;
#               counted at the root, the other ranks 0)
# and push/pull through parameter servers moves the message itself each way.


def bus_factor(op: str, world: int) -> float:
    """busbw / algbw: the fraction of a message each worker's link carries per collective
    (nccl-tests). Push/pull: each worker sends the whole message and receives the whole sum;
    latency (ping-pong): the message crosses one link each way."""
    if op in ("pushpull", "latency") or world <= 1:
        return 1.0 if op in ("pushpull", "latency") else 0.0
    if op == "allreduce":
        return 2 * (world - 1) / world
    if op == "allgather":
        return (world - 1) / world
    raise ValueError(f"no bus-bandwidth factor for {op!r}")


def sent_bytes(op: str, nbytes: int, world: int, root: bool = True) -> int:
    """Bytes one worker sends for one collective whose *own* tensor has ``nbytes`` (for
    all-gather: what this rank contributes; for broadcast: the tensor, sent by the root)."""
    if op == "allreduce":
        return int(round(nbytes * bus_factor(op, world)))
    if op == "allgather":
        return nbytes * (world - 1)
    if op == "broadcast":
        return nbytes * (world - 1) if root else 0
    if op in ("push", "pull"):
        return nbytes if op == "push" else 0
    raise ValueError(f"no wire model for {op!r}")


def ring_link(op: str, alpha: float, beta: float, world: int) -> dict | None:
    """The per-step ring alpha/beta implied by a per-message fit ``alpha + beta * size``:
    all-reduce is 2(P-1) steps of size/P bytes, all-gather (P-1) steps of size/P bytes."""
    if world <= 1 or op not in ("allreduce", "allgather"):
        return None
    steps = 2 * (world - 1) if op == "allreduce" else world - 1
    return {"alpha_s": alpha / steps, "beta_s_per_byte": beta * world / steps}


# -- what a compressor sends (docs/DESIGN.md section 7) ---------------------------------------
# The same arithmetic as compression/__init__.py (topk_count, powersgd_plan, the encodings),
# written without torch for the performance model; tests/test_compression_costs.py holds the
# two to exactly the same collectives.

COMPRESSOR_IDS = ("none", "fp16", "topk", "eftopk", "signum", "signavg", "efsignum",
                  "powersgd")
# the compressors whose collectives are all-gathers (``compressed_messages``)
ALLGATHER_COMPRESSORS = ("topk", "eftopk", "signum", "signavg", "efsignum")
INDEX_BYTES = 4   # TopK's indices are int32
WORD_BYTES = 4    # signs travel 32 per int32 word
HALF_BYTES = 2    # fp16 sends half precision whatever the gradient's dtype


def _check_compressor(compressor: str) -> None:
    if compressor not in COMPRESSOR_IDS:
        raise UsageError(f"unknown compressor {compressor!r}; known: {', '.join(COMPRESSOR_IDS)}")


def _bucket_numels(shapes) -> list[int]:
    if not shapes:
        raise UsageError("a bucket holds at least one tensor; got no shapes")
    return [math.prod(shape) for shape in shapes]


def topk_count(n: int, density: float) -> int:
    """TopK's k for a bucket of n elements: density x n rounded, at least 1, at most n."""
    return min(n, max(1, round(density * n)))


def powersgd_plan(shape: tuple[int, ...], rank: int) -> tuple[int, int, int] | None:
    """(rows, cols, r) when PowerSGD sends a gradient of this shape as rank-r factors (rows =
    the first dimension); None when it goes dense: 1-D (or 0-D) tensors and matrices whose
    factors would not be smaller, r(rows + cols) >= rows x cols."""
    if len(shape) < 2:
        return None
    rows = shape[0]
    cols = math.prod(shape) // rows if rows else 0
    r = min(rank, rows, cols)
    if r <= 0 or r * (rows + cols) >= rows * cols:
        return None
    return rows, cols, r


def codec_elements(compressor: str, shapes: list[tuple[int, ...]]) -> int:
    """The dense elements a compressor's encode and decode pass over for one bucket: the whole
    flat bucket, for every compressor (what ``Comm.clock`` records, and what compression.bench's
    ``encode_s_per_element`` and ``decode_s_per_element`` are per)."""
    _check_compressor(compressor)
    return sum(_bucket_numels(shapes))


def compressed_messages(compressor: str, shapes: list[tuple[int, ...]], nworkers: int, *,
                        density: float = 0.001, powersgd_rank: int = 4,
                        element_bytes: int = 4) -> list[tuple[str, int]]:
    """The collectives compressor ``compressor`` starts for ONE bucket holding gradients of
    ``shapes`` (``element_bytes`` each: the gradient's dtype) among ``nworkers`` workers, per
    iteration in the steady state, in the order it issues them: (op, size) with op
    "allreduce" (size: the bytes of the tensor every rank holds) or "allgather" (size: the
    GATHERED output, nworkers x each rank's contribution, as nccl-tests and comm_bench count;
    ``Comm``'s payload counts the contribution, size / nworkers).

    - none: the bucket, all-reduced; fp16: the bucket in half, all-reduced;
    - topk, eftopk: k = topk_count(n, density) values (element_bytes) all-gathered, then their
      int32 indices all-gathered;
    - signum, signavg: ceil(n / 32) int32 words, all-gathered;
    - efsignum: the words all-gathered, then one scale (element_bytes) per tensor all-gathered;
    - powersgd (rank r): every tensor with a plan (``powersgd_plan``) contributes its P factor
      (rows x r) to one all-reduce; every other tensor goes into one dense all-reduce after it;
      the Q factors (cols x r) of the planned tensors follow in one all-reduce, issued when the
      bucket is waited for (so a method that starts every bucket first issues all Ps and dense
      parts before the first Q). Its dense warm-up steps are not modelled (steady state).
    """
    _check_compressor(compressor)
    numels = _bucket_numels(shapes)
    n = sum(numels)
    if nworkers < 1:
        raise UsageError(f"nworkers must be positive, got {nworkers}")
    if element_bytes < 1:
        raise UsageError(f"element_bytes must be positive, got {element_bytes}")
    if compressor == "none":
        return [("allreduce", n * element_bytes)]
    if compressor == "fp16":
        return [("allreduce", n * HALF_BYTES)]
    if compressor in ("topk", "eftopk"):
        if not 0 < density <= 1:
            raise UsageError(f"density must be in (0, 1], got {density}")
        k = topk_count(n, density)
        return [("allgather", nworkers * k * element_bytes),
                ("allgather", nworkers * k * INDEX_BYTES)]
    words = (n + 31) // 32
    if compressor in ("signum", "signavg"):
        return [("allgather", nworkers * words * WORD_BYTES)]
    if compressor == "efsignum":
        return [("allgather", nworkers * words * WORD_BYTES),
                ("allgather", nworkers * len(shapes) * element_bytes)]
    # powersgd
    if powersgd_rank < 1:
        raise UsageError(f"powersgd_rank must be positive, got {powersgd_rank}")
    plans = [powersgd_plan(tuple(shape), powersgd_rank) for shape in shapes]
    low = [plan for plan in plans if plan is not None]
    dense = [numel for numel, plan in zip(numels, plans) if plan is None]
    out = []
    if low:
        out.append(("allreduce", sum(rows * r for rows, _, r in low) * element_bytes))
    if dense:
        out.append(("allreduce", sum(dense) * element_bytes))
    if low:
        out.append(("allreduce", sum(cols * r for _, cols, r in low) * element_bytes))
    return out


def issued_at_wait(compressor: str, shapes: list[tuple[int, ...]],
                   powersgd_rank: int = 4) -> int:
    """How many of ``compressed_messages``' collectives for one bucket (its last ones) the
    compressor issues only when the bucket is waited for, not when it is handed over:
    PowerSGD's Q all-reduce (it needs the reduced P), when the bucket has a planned matrix; 0
    for every other compressor."""
    _check_compressor(compressor)
    if compressor != "powersgd":
        return 0
    return int(any(powersgd_plan(tuple(s), powersgd_rank) is not None for s in shapes))


def ring_collective(op: str, alpha_step: float, beta_step: float, world: int) -> tuple[float,
                                                                                     float]:
    """The per-message (alpha, beta) of a ring collective among ``world`` workers whose steps
    each cost ``alpha_step + beta_step * (size / world)``: the inverse of ``ring_link``
    (all-reduce 2(P-1) steps, all-gather P-1, per byte of the message as counted above)."""
    if world <= 1:
        return 0.0, 0.0
    steps = 2 * (world - 1) if op == "allreduce" else world - 1
    return steps * alpha_step, steps * beta_step / world

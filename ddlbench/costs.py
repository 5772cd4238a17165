"""The one cost model of bytes on the wire: what a worker sends per collective (ring algorithms,
docs/DESIGN.md section 3), and the nccl-tests bus-bandwidth factors derived from it."""
from __future__ import annotations

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

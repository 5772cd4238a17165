"""The job's side of the timeline: rank clocks aligned to rank 0's, every rank's overlap metrics
and events gathered, the parameter servers' recording turned on and off and their events
fetched, the merged trace written by rank 0 (``ddlbench.timeline`` records and computes)."""
from __future__ import annotations

import statistics

from ..timeline import (COMM, COMPUTE, Timeline, measure, now_us, overlap, trace,
                        transport_queues, union, write)

ALIGN_ROUNDS = 7


def align(device=None, group=None, rounds: int = ALIGN_ROUNDS) -> tuple[float, float]:
    """This rank's clock minus rank 0's, in microseconds, and its uncertainty: after each of
    ``rounds`` barriers every rank reads its clock and all gather the readings; the offset is
    the median difference to rank 0, the uncertainty half the spread of those differences
    (barrier exits are not simultaneous: that skew is in the spread). ``device``: where the
    group's tensors live (CUDA under NCCL)."""
    import torch
    import torch.distributed as dist
    if not dist.is_initialized() or dist.get_world_size(group) == 1:
        return 0.0, 0.0
    world = dist.get_world_size(group)
    diffs = []
    for _ in range(rounds):
        dist.barrier(group=group)
        mine = torch.tensor([now_us()], dtype=torch.float64, device=device)
        out = [torch.zeros(1, dtype=torch.float64, device=device) for _ in range(world)]
        dist.all_gather(out, mine, group=group)
        diffs.append(float(mine) - float(out[0]))
    return statistics.median(diffs), (max(diffs) - min(diffs)) / 2


def servers_start(ps, rank: int, rounds: int = ALIGN_ROUNDS) -> None:
    """The timed rounds start with the servers recording (``--timeline PATH`` with parameter
    servers): worker 0 measures their clocks against its own (``server_clocks``) and turns
    their timelines on, answered once they record; then every worker waits for it (a barrier
    over the workers' group), so no push of the timed rounds reaches an unrecorded server.
    Collective over the workers."""
    import torch.distributed as dist
    if rank == 0:
        ps.server_clocks(rounds)
        ps.timeline_on()
    if dist.is_initialized() and dist.get_world_size() > 1:
        dist.barrier()


def servers_stop(ps, rank: int) -> list[dict] | None:
    """After the timed rounds: worker 0 turns the servers' recording off and fetches their
    events (``ps.server_events``: what ``trace`` merges, one process each); None elsewhere.
    Servers know no iterations: they record from the start of the timed rounds to here, even
    under ``--timeline-iters N`` (which limits the workers' recording only)."""
    if rank != 0:
        return None
    ps.timeline_off()
    return ps.server_events()


def server_section(servers: list[dict], iterations: int) -> list[dict]:
    """The record's account of each server's recording: its clock offset to rank 0's, and
    how long it spent summing per timed iteration (the union of its ``sum`` spans over the
    ``iterations`` its recording covered), in ms."""
    out = []
    for s in servers:
        sums = [(e[3], e[4]) for e in s["events"] if e[0] == "sum" and e[1] == COMPUTE]
        busy_us = measure(union(sums))
        out.append({"rank": s["rank"], "name": s.get("name"), "offset_us": s["offset_us"],
                    "uncertainty_us": s["uncertainty_us"], "iterations": iterations,
                    "pushes_recorded": len(sums),
                    "busy_ms_per_iteration": busy_us / 1e3 / iterations if iterations else None})
    return out


def transport_threads() -> int:
    """How many collectives the workers' process group runs at once: Gloo's worker threads
    (torch's default for ProcessGroupGloo, 2, which the engine keeps), NCCL's single stream."""
    import torch.distributed as dist
    return 2 if dist.get_backend() == "gloo" else 1


def collect(tl: Timeline, rank: int, world: int, offset: tuple[float, float] = (0.0, 0.0),
            path: str | None = None, meta: dict | None = None,
            servers: list[dict] | None = None, server_iterations: int = 0) -> dict | None:
    """After the timed rounds, on every worker (collective): each rank's metrics gathered, the
    merged trace written to ``path`` by rank 0, with ``servers`` (rank 0's, from
    ``servers_stop``: one more process each, after the workers) when given. Returns the
    record's ``timeline`` section on rank 0 (None elsewhere); its ``servers`` is
    ``server_section`` of them over ``server_iterations``, null without servers recorded."""
    import torch.distributed as dist
    mine = overlap(tl.events)
    summary = {"rank": rank, "mean": mine["mean"] if mine else None,
               "iterations": mine["iterations"] if mine else 0,
               "comm_spans": sum(1 for e in tl.events if e[1] == COMM),
               "offset_us": offset[0], "uncertainty_us": offset[1]}
    several = world > 1 and dist.is_initialized()
    threads = transport_threads() if several else 1
    payload = {"rank": rank, "events": transport_queues(tl.events, threads),
               "offset_us": offset[0], "uncertainty_us": offset[1]} if path else None
    if several:
        summaries: list = [None] * world
        dist.all_gather_object(summaries, summary)
        if path:
            ranks: list | None = [None] * world if rank == 0 else None
            dist.gather_object(payload, ranks, dst=0)
    else:
        summaries, ranks = [summary], [payload]
    if rank != 0:
        return None
    if path:
        meta = {**(meta or {}), "transport": {
            "backend": dist.get_backend() if several else None, "threads": threads,
            "queued_us": "inferred: collectives run in the order handed over, on this many "
                         "threads of the process group"}}
        write(path, trace(ranks + (servers or []), meta))
    measured = [s for s in summaries if s["mean"] is not None]
    slowest = max(measured, key=lambda s: s["mean"]["iteration_s"]) if measured else None
    return {"recorded_iterations": summary["iterations"],
            "comm_observed": world == 1 or all(s["comm_spans"] > 0 for s in summaries),
            "slowest_rank": slowest["rank"] if slowest else None,
            "mean": slowest["mean"] if slowest else None,
            "per_rank": {str(s["rank"]): s["mean"] for s in summaries},
            "clock": {str(s["rank"]): {"offset_us": s["offset_us"],
                                       "uncertainty_us": s["uncertainty_us"]}
                      for s in summaries},
            "servers": server_section(servers, server_iterations) if servers else None,
            "trace": path}

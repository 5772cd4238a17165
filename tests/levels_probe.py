"""Four Gloo ranks (``python tests/levels_probe.py OUT.json``) on several placements of
machines: reduce-scatter and all-gather by the ``two-level`` carrier (collectives.TWO_LEVEL) through
``Comm``, beside what a single process computes. The tensors hold small integers, so every sum
is exact in any order: rank 0 writes, per placement, whether each rank's result equals the
reference exactly, and the bytes ``Comm`` counted per group layout."""
import json
import socket
import sys

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

WORLD = 4
NUMEL = 4 * 6 * 5      # divisible by P and by every machine size
PLACEMENTS = {"2x2": [[0, 1], [2, 3]], "2x2 interleaved": [[0, 3], [1, 2]],
              "4x1": [[0], [1], [2], [3]], "1x4": [[0, 1, 2, 3]]}


def data(rank: int) -> torch.Tensor:
    return torch.arange(NUMEL, dtype=torch.float32) % 7 + 10 * rank


def run(rank: int, port: int, out: str) -> None:
    from ddlbench.runtime.comm import Comm
    from ddlbench.runtime.groups import Groups
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=WORLD)
    found = {}
    every = torch.stack([data(r) for r in range(WORLD)])
    total = every.sum(0)
    shard = NUMEL // WORLD
    for name, machines in PLACEMENTS.items():
        comm = Comm(rank, WORLD, groups=Groups(rank, WORLD, None, machines=machines))
        comm.levels()
        comm.reset_stats()
        out_rs = torch.empty(shard)
        comm.reduce_scatter(out_rs, data(rank), async_op=True, carrier="two-level").wait()
        gathered = torch.full((NUMEL,), -1.0)
        mine = data(rank)[rank * shard:(rank + 1) * shard].clone()
        comm.allgather(gathered, mine, async_op=True, carrier="two-level").wait()
        blocking = torch.full((NUMEL,), -1.0)
        comm.allgather(blocking, mine, async_op=False, carrier="two-level")
        reference = torch.cat([data(r)[r * shard:(r + 1) * shard] for r in range(WORLD)])
        facts = {"rs": bool(torch.equal(out_rs, total[rank * shard:(rank + 1) * shard])),
                 "ag": bool(torch.equal(gathered, reference)),
                 "ag_blocking": bool(torch.equal(blocking, reference)),
                 "by_group": {k: dict(v) for k, v in comm.wire_by_group.items()},
                 "sent": dict(comm.wire_sent)}
        every_facts = [None] * WORLD
        dist.all_gather_object(every_facts, facts)
        found[name] = every_facts
    if rank == 0:
        with open(out, "w") as f:
            json.dump(found, f)
    dist.destroy_process_group()


if __name__ == "__main__":
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        free = s.getsockname()[1]
    mp.spawn(run, args=(free, sys.argv[1]), nprocs=WORLD)

"""A job that measures what each declared collective really sends: run as ``python
tests/collective_probe.py OUT.json`` in a network namespace of its own (so the loopback's
counters see only this job), it starts 4 Gloo ranks and, on groups of 2, 3 and 4 of them,
issues every declared collective and carrier through ``Comm`` twice, reading the loopback's
transmitted bytes (``/proc/net/dev``) before and after; rank 0 writes, per (collective,
carrier, group size), the kernel's bytes and the bytes ``Comm`` counted from the declarations
(summed over the group's ranks); and, per group size, whether reduce-scatter's ``a2a`` carrier
equals the sum of the ranks' shards in rank order bit for bit (as a single process sums), whether
its ``ring`` carrier is that sum to rounding, whether its ``native`` carrier equals the all-reduce's chunk bit for bit (Gloo's is one), and whether
the two carriers agree bit for bit."""
import json
import os
import socket
import sys

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

WORLD = 4
NUMEL = 1 << 20        # 4 MiB of fp32 per message (divisible by 2, 3 x 4, 4)
REPEAT = 2
CASES = (("allreduce", None), ("reduce_scatter", "a2a"), ("reduce_scatter", "native"),
         ("reduce_scatter", "ring"),
         ("allgather", None), ("all_to_all", None), ("broadcast", None))


def lo_sent() -> int:
    for line in open("/proc/net/dev"):
        name, _, counters = line.partition(":")
        if name.strip() == "lo":
            return int(counters.split()[8])
    raise RuntimeError("no loopback in /proc/net/dev")


def issue(comm, op: str, carrier, group, x: torch.Tensor):
    size = group.size
    n = x.numel() - x.numel() % (size * size)
    x = x[:n]
    if op == "allreduce":
        comm.allreduce(x.clone(), async_op=False, group=group)
    elif op == "reduce_scatter":
        out = torch.empty(n // size)
        comm.reduce_scatter(out, x, async_op=False, carrier=carrier, group=group)
        return out
    elif op == "allgather":
        comm.allgather(torch.empty(n), x[:n // size].clone(), async_op=False, group=group)
    elif op == "all_to_all":
        comm.all_to_all(torch.empty(n), x, async_op=False, group=group)
    else:
        comm.broadcast(x.clone(), src=0, group=group)
    return None


def bitwise(comm, group, x: torch.Tensor, rank: int) -> dict:
    """Reduce-scatter's carriers against the rank-order sum and the all-reduce's chunk."""
    size = group.size
    n = x.numel() - x.numel() % size
    x = x[:n]
    every = torch.empty(size * n)
    comm.allgather(every, x, async_op=False, group=group)
    shard = slice(rank * (n // size), (rank + 1) * (n // size))
    in_order = every.view(size, n)[0, shard].clone()
    for j in range(1, size):
        in_order.add_(every.view(size, n)[j, shard])
    summed = x.clone()
    comm.allreduce(summed, async_op=False, group=group)
    a2a, native = torch.empty(n // size), torch.empty(n // size)
    comm.reduce_scatter(a2a, x, async_op=False, carrier="a2a", group=group)
    comm.reduce_scatter(native, x, async_op=False, carrier="native", group=group)
    ring = torch.empty(n // size)
    comm.reduce_scatter(ring, x, async_op=False, carrier="ring", group=group)
    return {"a2a_is_rank_order": torch.equal(a2a, in_order),
            "ring_close_to_a2a": torch.allclose(ring, a2a, rtol=1e-5, atol=1e-5),
            "native_is_allreduce_chunk": torch.equal(native, summed[shard]),
            "a2a_is_native": torch.equal(a2a, native),
            "a2a_close_to_native": torch.allclose(a2a, native, rtol=1e-5, atol=1e-5)}


def worker(rank: int, port: int, out: str) -> None:
    from ddlbench.runtime.comm import Comm
    from ddlbench.runtime.groups import Group
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=WORLD)
    comm = Comm(rank, WORLD)
    torch.manual_seed(rank)
    x = torch.randn(NUMEL)
    rows = []
    equal = {}
    for size in (2, 3, 4):
        ranks = list(range(size))
        handle = dist.new_group(ranks) if size < WORLD else None
        group = Group(f"first{size}", tuple(ranks), ranks.index(rank) if rank < size else -1,
                      handle, "gloo")
        for op, carrier in CASES:
            dist.barrier()
            before = lo_sent()
            dist.barrier()
            counted = comm.wire_sent[op]
            if rank < size:
                for _ in range(REPEAT):
                    issue(comm, op, carrier, group, x)
            dist.barrier()
            kernel = lo_sent() - before
            mine = [comm.wire_sent[op] - counted]
            every = [None] * WORLD
            dist.all_gather_object(every, mine)
            rows.append({"op": op, "carrier": carrier, "size": size,
                         "kernel_bytes": kernel / REPEAT,
                         "declared_bytes": sum(m[0] for m in every) / REPEAT})
        equal[size] = bitwise(comm, group, x, rank) if rank < size else None
    every = [None] * WORLD
    dist.all_gather_object(every, equal)
    if rank == 0:
        with open(out, "w") as f:
            json.dump({"rows": rows, "bitwise": every}, f)
    dist.destroy_process_group()


def main() -> None:
    out = sys.argv[1]
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.start_processes(worker, args=(port, out), nprocs=WORLD, start_method="spawn")


if __name__ == "__main__":
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    main()

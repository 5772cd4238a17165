"""The hidden helper subcommands ``_recv``, ``_send`` and ``_allreduce`` that probes run on a host.

``probe.py`` starts each as ``python -m ddlbench.netem _SUBCOMMAND ...`` inside a host's
namespace; the first line a helper prints (``listening PORT``, ``store PORT``) tells the prober
where to connect, its last line (JSON) is the result.
"""
from __future__ import annotations

import json
import socket
import time


def add_parsers(sub) -> None:
    """Add the helpers' subcommands to ``sub`` (the command line's subparsers)."""
    r = sub.add_parser("_recv")
    r.add_argument("--address", required=True)
    s = sub.add_parser("_send")
    s.add_argument("--address", required=True)
    s.add_argument("--port", type=int, required=True)
    s.add_argument("--seconds", type=float, required=True)
    ar = sub.add_parser("_allreduce")
    for flag in ("--rank", "--world", "--bytes", "--iters", "--warmup", "--port"):
        ar.add_argument(flag, type=int, default=0)
    ar.add_argument("--address", required=True)


WARMUP_FRACTION = 0.2      # the first part of a stream (TCP slow start) is not timed


def _cmd_recv(a) -> int:
    srv = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    srv.bind((a.address, 0))
    srv.listen(1)
    print(f"listening {srv.getsockname()[1]}", flush=True)
    srv.settimeout(60)
    conn, _ = srv.accept()
    conn.settimeout(60)
    buf = bytearray(4 << 20)
    total = conn.recv_into(buf)    # the clock starts at the first byte
    t0 = time.perf_counter()
    samples = [(t0, total)]        # (time, bytes received so far) after each read
    while True:
        n = conn.recv_into(buf)
        if not n:
            break
        total += n
        samples.append((time.perf_counter(), total))
    # Payload bytes per segment and the IP packet size, to count what the link carries
    # (a veth's tbf also counts the 14-byte Ethernet header).
    mss = conn.getsockopt(socket.IPPROTO_TCP, socket.TCP_MAXSEG)
    mtu = conn.getsockopt(socket.IPPROTO_IP, getattr(socket, "IP_MTU", 14))  # (Linux: 14)
    t_end, b_end = samples[-1]
    start = t0 + WARMUP_FRACTION * (t_end - t0)
    t_w, b_w = next((t, b) for t, b in samples if t >= start)
    if t_end - t_w <= 0:          # too few reads to leave out the start
        t_w, b_w = samples[0]
    print(json.dumps({"bytes": b_end - b_w, "seconds": t_end - t_w, "total_bytes": total,
                      "total_seconds": t_end - t0, "mss": mss, "mtu": mtu}), flush=True)
    return 0


def _cmd_send(a) -> int:
    deadline = time.monotonic() + 30
    while True:
        try:
            conn = socket.create_connection((a.address, a.port), timeout=5)
            break
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)
    chunk = memoryview(bytearray(1 << 20))
    end = time.monotonic() + a.seconds
    while time.monotonic() < end:
        conn.sendall(chunk)
    conn.shutdown(socket.SHUT_WR)
    conn.recv(1)  # the receiver closes after it has read everything
    conn.close()
    return 0


def _cmd_allreduce(a) -> int:
    import datetime

    import torch
    import torch.distributed as dist
    torch.set_num_threads(1)
    timeout = datetime.timedelta(seconds=120)
    if a.rank == 0:
        store = dist.TCPStore(a.address, 0, a.world, True, timeout=timeout,
                              wait_for_workers=False)
        print(f"store {store.port}", flush=True)
    else:
        store = dist.TCPStore(a.address, a.port, a.world, False, timeout=timeout)
    dist.init_process_group("gloo", store=store, rank=a.rank, world_size=a.world,
                            timeout=timeout)
    t = torch.empty(a.bytes // 4)
    times = []
    for i in range(a.warmup + a.iters):
        t.fill_(1.0)
        dist.barrier()
        start = time.perf_counter()
        dist.all_reduce(t)
        took = torch.tensor([time.perf_counter() - start], dtype=torch.float64)
        dist.all_reduce(took, op=dist.ReduceOp.MAX)
        if t[0].item() != a.world or t[-1].item() != a.world:
            raise SystemExit(f"all-reduce gave {t[0].item()}, expected {a.world}")
        if i >= a.warmup:
            times.append(took.item())
    dist.destroy_process_group()
    if a.rank == 0:
        print(json.dumps({"times": times}), flush=True)
    return 0


COMMANDS = {"_recv": _cmd_recv, "_send": _cmd_send, "_allreduce": _cmd_allreduce}

"""Communication micro-benchmark, and the alpha-beta model fitted to it.
``python -m ddlbench.measure.comm_bench``:

    python -m ddlbench.measure.comm_bench --nworkers 4                      # 1 KiB .. 256 MiB
    python -m ddlbench.measure.comm_bench --nworkers 2 --model resnet50 --output ab.json
    nworkers=4 ... mpirun/torchrun/srun ... python -m ddlbench.measure.comm_bench   # joins the job

Like the training script, run by hand with ``--nworkers N`` it spawns N local workers; started by
mpirun, torchrun or srun it joins that job. For each collective and message size it runs
``--warmup`` untimed operations, then ``--iters`` timed ones, each waited for; an operation's time
is the slowest rank's, and a size's time is the median of those (``--stat mean`` for the mean, as
nccl-tests reports; the median shrugs off a worker descheduled on a shared machine). One line per
size, nccl-tests style:

- ``size``: bytes of the message: for all-reduce, reduce-scatter and all-to-all the tensor
  every rank holds, for all-gather the gathered output (P x the bytes each rank sends), as
  nccl-tests counts them; ``count``: fp32 elements of that message;
- ``algbw = size / time``; ``busbw = algbw * 2(P-1)/P`` for all-reduce and ``algbw * (P-1)/P``
  for reduce-scatter, all-gather and all-to-all (the collective's declared bus factor,
  ``ddlbench.collectives``, docs/DESIGN.md section 3; reduce-scatter by any carrier: the
  collective's factor, so a carrier that moves more shows as a lower busbw); GB/s = 1e9
  bytes/s;
- after each collective's table: the fitted alpha and beta, then per size the fitted model's
  time and its relative error ``err = (fit - time) / time``, and the worst ``|err|``.

The model is the one MG-WFBP plans with (docs/DESIGN.md sections 3 and 4): one message of ``M`` bytes
costs ``alpha + beta * M``, alpha in seconds per message and beta in seconds per byte, fitted per
(P, network, backend) and collective by least squares. The default fit minimises *relative*
residuals (``sum ((alpha + beta M - t) / t)^2``): sizes span six orders of magnitude, and a plain
least-squares fit would let the largest messages set alpha. ``--fit absolute`` gives plain least
squares. Both are constrained to alpha, beta >= 0. For reference the record also gives the
per-step ring values these imply (all-reduce ``alpha = 2(P-1) a``, ``beta = 2(P-1)/P b``;
all-gather ``alpha = (P-1) a``, ``beta = (P-1)/P b`` per gathered byte).

Sizes: powers of two from ``--min-bytes`` to ``--max-bytes``, plus ``--sizes``, plus, with
``--model``, the sizes of that model's gradient tensors and of its fusion buckets at
``--threshold`` (whole gradient at the 64 MiB default for small models), plus, with
``--mgwfbp-profile``, the MG-WFBP groups planned from that profile. ``--ops pushpull`` (with
``--nservers``) measures push/pull through parameter servers: each message cut into the
servers' ``--partition-bytes`` partitions, all pushed at once and their sums pulled back; the fit
is of the messages up to one partition, and the larger ones give the performance model its
queueing cost for partitions in flight together (``topology.Measured``). ``--ops latency``
is the original's OSU test (``osu_latency``): ping-pong between ranks 0 and 1, the time of a
size being half the round trip (one-way latency), with the same table and fit (the
point-to-point alpha and beta); the other ranks wait.

``--ops burst`` (with ``--model``) all-reduces the model's gradient tensors, in backward order,
as a per-tensor method issues them: all started at once (asynchronous, as WFBP's hooks start
them while the backward runs ahead) and then waited for, against the same messages one at a time
(each waited for before the next, as the simulator's one FIFO channel has them), the two
alternating over ``--iters`` rounds; it prints both medians (means with ``--stat mean``), their
ratio and the burst's excess per message, and records them with the message sizes: the
performance model's all-reduce link at that P takes a per-message and a queueing cost from them
(``topology.Measured``). On this 2-core machine with 2 workers pinned to a core each,
BERT-Tiny's 46 tensors took 1.6-1.8 times as long in a burst on one day (Gloo's threads waking
in turns on the one core) and about as long on another, when one at a time was itself 1.7 times
the sum of the per-size medians; unpinned about as long or less.
"""
from __future__ import annotations

import argparse
import sys
import time

from ..collectives import COLLECTIVES, bus_factor, carried_as, declared, operations, ring_link
from ..collectives import split as split_op
from ..planning import DEFAULT_MIN_GROUP_ELEMENTS
from ..errors import ArgumentParser, UsageError, check_writable
from ..options import add_network_flags, add_ps_flags, check_flags

# the declared collectives (``ddlbench.collectives``), reduce-scatter also by carrier
# (``reduce_scatter`` alone: the backend's default one), then the point-to-point and PS tests
OPS = (*operations(), "pushpull", "latency", "burst")
KIB = 1024
MIB = 1024 * 1024
DEFAULT_MIN_BYTES = KIB
DEFAULT_MAX_BYTES = 256 * MIB
ELEMENT_BYTES = 4  # fp32
_UNITS = {"": 1, "B": 1, "K": KIB, "KB": KIB, "KIB": KIB, "M": MIB, "MB": MIB, "MIB": MIB,
          "G": 1024 * MIB, "GB": 1024 * MIB, "GIB": 1024 * MIB}
MAX_SIZE = 16 * 1024 * MIB  # one message: beyond this the buffers alone exhaust memory

# --------------------------------------------------------------------------- sizes

def parse_size(text: str) -> int:
    """``4096``, ``1K``, ``64KiB``, ``256M``, ``1G`` -> bytes (binary units)."""
    s = str(text).strip().upper()
    digits = s.rstrip("BKMGI")
    unit = s[len(digits):]
    try:
        value = float(digits)
    except ValueError:
        raise UsageError(f"bad size {text!r}: expected bytes such as 4096, 1K, 64KiB, 256M")
    if unit not in _UNITS or not 0 < value * _UNITS.get(unit, 1) <= MAX_SIZE:
        raise UsageError(f"bad size {text!r}: expected a size from 1 byte to 16G, such as "
                         f"4096, 1K, 256M")
    return max(1, int(value * _UNITS[unit]))


def pow2_sizes(lo: int, hi: int) -> list[int]:
    """Powers of two from the smallest >= lo up to hi (inclusive)."""
    sizes, s = [], 1
    while s < lo:
        s *= 2
    while s <= hi:
        sizes.append(s)
        s *= 2
    return sizes


def message_size(op: str, nbytes: int, world: int) -> int:
    """The nearest message the collective can carry in fp32: all-reduce whole elements,
    all-gather, reduce-scatter and all-to-all whole elements per rank (nccl-tests rounds the
    same way)."""
    base = split_op(op)[0]
    parts = base in COLLECTIVES and declared(base).parts   # (pushpull, latency: no parts)
    unit = ELEMENT_BYTES * (world if parts else 1)
    return max(unit, nbytes // unit * unit)


def backward_bytes(name: str, image_size=None, sentence_len: int = 64,
                   num_classes: int = 1000) -> list[int]:
    """Byte sizes of a model's gradient tensors, in (reverse registration, the usual)
    backward order."""
    import models
    work = models.build(name, image_size=image_size, sentence_len=sentence_len,
                        num_classes=num_classes)
    return [p.numel() * p.element_size() for p in reversed(list(work.model.parameters()))
            if p.requires_grad]


def model_sizes(name: str, image_size=None, sentence_len: int = 64, num_classes: int = 1000,
                threshold: float = 64 * MIB) -> list[int]:
    """Byte sizes of a model's gradient tensors and of its fusion buckets at ``threshold``."""
    from ..planning import plan_buckets
    backward = backward_bytes(name, image_size, sentence_len, num_classes)
    buckets = [sum(backward[i] for i in g) for g in plan_buckets(backward, threshold)]
    return sorted(set(backward) | set(buckets))


# --------------------------------------------------------------------------- measuring

def time_collective(op: str, nbytes: int, *, group=None, device=None, warmup: int = 5,
                    iters: int = 20, ps=None) -> dict:
    """Time one collective on a message of ``nbytes`` (see ``message_size``): ``warmup``
    untimed operations, then ``iters`` timed one by one (each waited for, the device
    synchronised). An operation's time is the slowest rank's; returns ``{"mean", "median",
    "min", "max"}`` of those, in seconds. Every rank of ``group`` must call it alike.
    ``pushpull`` (a job with parameter servers, ``ps`` its client): the message cut into the
    servers' partitions, every partition pushed and its sum pulled back, as a PS method does
    with one fused gradient."""
    import statistics

    import torch
    import torch.distributed as dist

    from .. import runtime
    device = device or torch.device("cpu")
    world = dist.get_world_size(group)
    nbytes = message_size(op, nbytes, world)
    count = nbytes // ELEMENT_BYTES
    if op == "allreduce":
        buf = torch.zeros(count, dtype=torch.float32, device=device)

        def once():
            dist.all_reduce(buf, group=group)
    elif op == "allgather":
        out = torch.zeros(count, dtype=torch.float32, device=device)
        src = torch.zeros(count // world, dtype=torch.float32, device=device)
        from ..runtime.comm import all_gather_single as gather

        def once():
            gather(out, src, group=group)
    elif split_op(op)[0] in ("reduce_scatter", "all_to_all"):
        once = _through_comm(op, count, world, device, group)
    elif op == "pushpull":
        if ps is None:
            raise UsageError("pushpull needs parameter servers: --nservers S")
        buf = torch.zeros(count, dtype=torch.float32, device=device)
        parts = ps.open([(count, torch.float32)])[0]

        def once():
            for h in [ps.push_pull(part, buf[part.start:part.end]) for part in parts]:
                h.wait()
    elif op == "latency":
        if world < 2:
            raise UsageError("--ops latency (ping-pong) needs at least 2 workers")
        once = _ping_pong(count, device, group)
    else:
        raise UsageError(f"unknown collective {op!r}; known: {', '.join(OPS)}")
    for _ in range(warmup):
        once()
    runtime.synchronize(device)
    dist.barrier(group=group)
    times = []
    for _ in range(iters):
        start = time.perf_counter()
        once()
        runtime.synchronize(device)
        times.append(time.perf_counter() - start)
    if op == "pushpull":
        ps.close()
    if op == "latency":  # OSU: one-way latency is half the round trip
        times = [x / 2 for x in times]
        _check_echo(count, device, group)
    (times,) = _slowest_rank([times], device, group)
    return {"mean": statistics.fmean(times), "median": statistics.median(times),
            "min": min(times), "max": max(times)}


def _through_comm(op: str, count: int, world: int, device, group):
    """One reduce-scatter (by its carrier) or all-to-all of ``count`` fp32 elements, issued
    through ``Comm`` as the methods issue it."""
    import torch
    import torch.distributed as dist

    from ..runtime.comm import Comm
    base, carrier = split_op(op)
    comm = Comm(dist.get_rank(group), world, group=group)
    buf = torch.zeros(count, dtype=torch.float32, device=device)
    if base == "all_to_all":
        out = torch.zeros(count, dtype=torch.float32, device=device)
        return lambda: comm.all_to_all(out, buf, async_op=False)
    out = torch.zeros(count // world, dtype=torch.float32, device=device)
    return lambda: comm.reduce_scatter(out, buf, async_op=False, carrier=carrier)


def _slowest_rank(times: list[list[float]], device, group) -> list[list[float]]:
    """Each timed operation's time on the slowest rank (a maximum over ``group``). Collective."""
    import torch
    import torch.distributed as dist
    t = torch.tensor(times, dtype=torch.float64,
                     device=device if dist.get_backend(group) == "nccl" else "cpu")
    dist.all_reduce(t, op=dist.ReduceOp.MAX, group=group)
    return [[float(x) for x in row] for row in t.cpu()]


def _ping_pong(count: int, device, group):
    """One round trip of ``count`` fp32 elements: rank 0 sends and waits for the echo, rank 1
    echoes, every other rank does nothing."""
    import torch
    import torch.distributed as dist
    buf = torch.zeros(count, dtype=torch.float32, device=device)
    me, peers = dist.get_rank(group), _pair(group)
    return lambda: _ping_pong_into(buf, me, peers, group)


def _check_echo(count: int, device, group) -> None:
    """After the timing, one ping-pong of known values: the echo must be what was sent (the
    timed messages were real messages of that size)."""
    import torch
    import torch.distributed as dist
    me = dist.get_rank(group)
    sent = torch.arange(count, dtype=torch.float32, device=device)
    buf = sent.clone() if me == 0 else torch.zeros(count, dtype=torch.float32, device=device)
    _ping_pong_into(buf, me, _pair(group), group)
    if me == 0 and not torch.equal(buf, sent):
        raise RuntimeError(f"ping-pong of {count * ELEMENT_BYTES} B: the echo differs from "
                           "what was sent")


def _pair(group) -> tuple[int, int]:
    """The global ranks of the group's ranks 0 and 1 (what send and recv address)."""
    import torch.distributed as dist
    return tuple(dist.get_global_rank(group, r) if group is not None else r for r in (0, 1))


def _ping_pong_into(buf, me: int, peers: tuple[int, int], group) -> None:
    import torch.distributed as dist
    first, second = peers
    if me == 0:
        dist.send(buf, second, group=group)
        dist.recv(buf, second, group=group)
    elif me == 1:
        dist.recv(buf, first, group=group)
        dist.send(buf, first, group=group)


# --------------------------------------------------------------------------- the model

def fit_alpha_beta(sizes: list[float], seconds: list[float],
                   relative: bool = True) -> tuple[float, float]:
    """Least-squares (alpha, beta) of ``t = alpha + beta * size``, both constrained >= 0.

    ``relative``: minimise ``sum ((alpha + beta*size - t) / t)^2`` (every size counts alike);
    otherwise plain ``sum (alpha + beta*size - t)^2``. Needs two sizes or more (one size gives
    alpha = t, beta = 0)."""
    if len(sizes) != len(seconds) or not sizes:
        raise ValueError("fit_alpha_beta needs as many times as sizes, at least one")
    if any(t <= 0 for t in seconds) and relative:
        raise ValueError("relative fit needs positive times")
    scale = float(max(sizes)) or 1.0  # sizes scaled to <= 1 keep the normal equations tame
    xs = [s / scale for s in sizes]
    ws = [1.0 / (t * t) if relative else 1.0 for t in seconds]
    s0 = sum(ws)
    s1 = sum(w * x for w, x in zip(ws, xs))
    s2 = sum(w * x * x for w, x in zip(ws, xs))
    y0 = sum(w * t for w, t in zip(ws, seconds))
    y1 = sum(w * x * t for w, x, t in zip(ws, xs, seconds))
    det = s0 * s2 - s1 * s1
    if len(set(sizes)) >= 2 and det > 0:
        a = (y0 * s2 - y1 * s1) / det
        b = (s0 * y1 - s1 * y0) / det
    else:
        a, b = y0 / s0, 0.0
    if a < 0:   # best fit through the origin
        a, b = 0.0, (y1 / s2 if s2 > 0 else 0.0)
    if b < 0:   # best constant
        a, b = y0 / s0, 0.0
    return max(a, 0.0), max(b, 0.0) / scale


def predict(alpha: float, beta: float, nbytes: float) -> float:
    return alpha + beta * nbytes


def relative_errors(alpha: float, beta: float, sizes, seconds) -> list[float]:
    """(prediction - measurement) / measurement, per size."""
    return [(predict(alpha, beta, s) - t) / t for s, t in zip(sizes, seconds)]


def _fitted_rows(op: str, rows: list[dict], ps, relative: bool) -> tuple[list[dict], bool]:
    """The rows the alpha-beta fit is made from, and whether relative errors are minimised:
    all rows as asked, but for push/pull the messages of one partition (at least two of them)
    by absolute errors. A larger message is several partitions whose pushes and pulls
    overlap, a pipeline the performance model replays itself from one partition's push and
    pull (docs/DESIGN.md section 6): fitted to them, beta would count that overlap twice. And
    there beta is what matters (how long a partition holds the links), so the fit follows the
    large partitions, where the bytes are: small messages that pass within a link's burst or
    a latency would otherwise pull beta down (an emulated 1 Gbit/s link measured 33 ns/B at
    1-4 MB, fitted 19 by relative errors, 33 by absolute)."""
    if op != "pushpull" or ps is None:
        return rows, relative
    one = [r for r in rows if r["size_bytes"] <= ps.partition_bytes]
    return (one, False) if len(one) >= 2 else (rows, relative)


def measure(op: str, sizes: list[int], *, group=None, device=None, warmup: int = 5,
            iters: int = 20, relative: bool = True, stat: str = "median",
            network: str | None = None, log=None, ps=None) -> dict:
    """Time ``op`` over ``sizes`` and fit the model: the rows, the fit and its errors.
    ``stat``: which per-operation statistic is a size's time (median or mean).
    Collective: every rank calls it; every rank returns the same numbers."""
    _statistic(stat)
    import torch.distributed as dist
    world = dist.get_world_size(group)
    msgs = sorted({message_size(op, s, world) for s in sizes})
    base, carrier = split_op(op)
    backend = dist.get_backend(group)
    if base == "reduce_scatter":
        carrier = declared(base).carrier(carrier, backend).name
    rows = []
    if log:
        log(header(op, world, stat))
    for nbytes in msgs:
        stats = time_collective(op, nbytes, group=group, device=device, warmup=warmup,
                                iters=iters, ps=ps)
        t = stats[stat]
        algbw = nbytes / t / 1e9 if t > 0 else float("inf")
        rows.append({"size_bytes": nbytes, "count": nbytes // ELEMENT_BYTES, "type": "float",
                     "time_s": t, "time_stats_s": stats, "algbw_GBps": algbw,
                     "busbw_GBps": algbw * bus_factor(base, world)})
        if log:
            log(format_row(rows[-1]))
    fitted, relative = _fitted_rows(op, rows, ps, relative)
    sizes_b = [r["size_bytes"] for r in fitted]
    alpha, beta = fit_alpha_beta(sizes_b, [r["time_s"] for r in fitted], relative=relative)
    errs = relative_errors(alpha, beta, [r["size_bytes"] for r in rows],
                           [r["time_s"] for r in rows])
    for r, e in zip(rows, errs):
        r["fit_s"] = predict(alpha, beta, r["size_bytes"])
        r["fit_error"] = e
    worst = max(fitted, key=lambda r: abs(r["fit_error"]))
    result = {"op": op, "nworkers": world,
              "backend": "gloo (push/pull)" if op == "pushpull" else backend,
              "network": network, "rows": rows,
              "fit": {"alpha_s": alpha, "beta_s_per_byte": beta,
                      "method": "relative least squares" if relative else "least squares",
                      "sizes": "all" if fitted is rows else "up to one partition",
                      "worst_abs_error": abs(worst["fit_error"]),
                      "worst_error_size_bytes": worst["size_bytes"],
                      "ring_link": ring_link(carried_as(base, carrier, backend) if carrier
                                             else base, alpha, beta, world)}}
    if carrier:
        result["carrier"] = carrier
    if ps is not None and op == "pushpull":
        result.update(nservers=ps.nservers, partition_bytes=ps.partition_bytes,
                      ps_clients=ps.clients, pushers=ps.pushers)
    if log:
        log("\n".join(format_table_tail(result)))
    return result


def _statistic(stat: str):
    """The function of ``--stat`` (median or mean) over a list of times."""
    import statistics
    if stat not in ("median", "mean"):
        raise UsageError(f"unknown statistic {stat!r}: median or mean")
    return statistics.median if stat == "median" else statistics.fmean


def measure_burst(nbytes: list[int], *, group=None, device=None, warmup: int = 5,
                  iters: int = 20, stat: str = "median", network: str | None = None,
                  log=None) -> dict:
    """All-reduce messages of ``nbytes`` (in order) all started at once, then waited for
    (``burst``), and one at a time, each waited for (``one_at_a_time``): ``warmup`` untimed
    rounds of each, then ``iters`` timed rounds alternating the two; a round's time is the
    slowest rank's, the result each mode's ``stat`` (median or mean) over its rounds.
    Collective: every rank calls it alike."""
    center = _statistic(stat)
    import torch
    import torch.distributed as dist

    from .. import runtime
    device = device or torch.device("cpu")
    bufs = [torch.zeros(max(1, n // ELEMENT_BYTES), dtype=torch.float32, device=device)
            for n in nbytes]

    def one_at_a_time():
        for b in bufs:
            dist.all_reduce(b, group=group)

    def burst():
        for w in [dist.all_reduce(b, group=group, async_op=True) for b in bufs]:
            w.wait()
    modes = {"one_at_a_time": one_at_a_time, "burst": burst}
    times: dict = {name: [] for name in modes}
    for k in range(warmup + iters):
        for name, fn in modes.items():
            runtime.synchronize(device)
            dist.barrier(group=group)
            start = time.perf_counter()
            fn()
            runtime.synchronize(device)
            if k >= warmup:
                times[name].append(time.perf_counter() - start)
    rounds = _slowest_rank([times["one_at_a_time"], times["burst"]], device, group)
    one, all_at_once = (center(row) for row in rounds)
    result = {"op": "burst", "nworkers": dist.get_world_size(group),
              "backend": dist.get_backend(group), "network": network,
              "messages": len(nbytes), "bytes": sum(nbytes), "sizes": list(nbytes),
              "iters": iters, "stat": stat,
              "one_at_a_time_s": one, "burst_s": all_at_once,
              "rounds_s": {"one_at_a_time": list(rounds[0]), "burst": list(rounds[1])},
              "ratio": all_at_once / one if one > 0 else None,
              "excess_per_message_s": (all_at_once - one) / len(nbytes)}
    if log:
        log(format_burst(result))
    return result


# --------------------------------------------------------------------------- output

def format_burst(r: dict) -> str:
    ratio = f"x{r['ratio']:.2f}" if r["ratio"] is not None else "x-"
    return (f"# burst, P = {r['nworkers']}: {r['messages']} all-reduces, "
            f"{r['bytes'] / 1e6:.2f} MB, {r.get('stat', 'median')} of {r['iters']} rounds "
            f"(the slowest rank's): "
            f"one at a time {r['one_at_a_time_s'] * 1e3:.2f} ms, all started at once "
            f"{r['burst_s'] * 1e3:.2f} ms ({ratio}; "
            f"{r['excess_per_message_s'] * 1e3:+.3f} ms a message)")


def header(op: str, world: int, stat: str = "median") -> str:
    base, carrier = split_op(op)
    size_note = ("bytes gathered (P x sent)" if base == "allgather" else "bytes each rank holds")
    bus = {"pushpull": "1 (each worker hands size to push/pull and gets size back)",
           "latency": "1 (one link each way)"}.get(op) or declared(base).bus_text
    if carrier:
        how = declared(base).carrier(carrier).how
        size_note += f"; carried by {carrier}: {how}"
    if op == "latency":
        return (f"# latency, OSU-style ping-pong between ranks 0 and 1 of P = {world}: size = "
                f"bytes each way; time = one-way latency (half the round trip), {stat} over "
                f"operations; algbw = size/time; busbw = algbw * {bus}\n"
                + _columns())
    return (f"# {op}, P = {world}: size = {size_note}; time = {stat} over operations of the "
            f"slowest rank's time; algbw = size/time; "
            f"busbw = algbw * {bus}\n" + _columns())


def _columns() -> str:
    return (f"#{'size':>12} {'count':>11} {'type':>6} {'time':>11} {'algbw':>8} {'busbw':>8}\n"
            f"#{'(B)':>12} {'(elements)':>11} {'':>6} {'(us)':>11} {'(GB/s)':>8} {'(GB/s)':>8}")


def format_row(r: dict) -> str:
    return (f" {r['size_bytes']:12d} {r['count']:11d} {r['type']:>6} {r['time_s'] * 1e6:11.1f} "
            f"{r['algbw_GBps']:8.3f} {r['busbw_GBps']:8.3f}")


def format_table_tail(result: dict) -> list[str]:
    """The fit, then its prediction error per size."""
    f = result["fit"]
    lines = [f"# fit {result['op']} (P = {result['nworkers']}, network {result['network']}, "
             f"backend {result['backend']}; {f['method']}): t = alpha + "
             f"beta * size, alpha = {f['alpha_s'] * 1e6:.2f} us, beta = "
             f"{f['beta_s_per_byte'] * 1e9:.4f} ns/B ({_bandwidth(f['beta_s_per_byte'])}); "
             f"worst |err| = {f['worst_abs_error'] * 100:.1f}% at {f['worst_error_size_bytes']} B"
             + ("; fitted to messages of one partition (larger ones pipeline theirs)"
                if f.get("sizes") == "up to one partition" else ""),
             f"#{'size':>12} {'time':>11} {'fit':>11} {'err':>7}",
             f"#{'(B)':>12} {'(us)':>11} {'(us)':>11} {'(%)':>7}"]
    for r in result["rows"]:
        lines.append(f" {r['size_bytes']:12d} {r['time_s'] * 1e6:11.1f} {r['fit_s'] * 1e6:11.1f} "
                     f"{r['fit_error'] * 100:+7.1f}")
    return lines


def _bandwidth(beta: float) -> str:
    return f"1/beta = {1 / beta / 1e9:.3f} GB/s" if beta > 0 else "1/beta = inf"


# --------------------------------------------------------------------------- command line

def parse_args(argv=None) -> argparse.Namespace:
    p = ArgumentParser(prog="python -m ddlbench.measure.comm_bench",
                       description=__doc__.split("\n")[0],
                       raise_errors=True, formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--ops", default="allreduce,allgather",
                   help=f"comma-separated collectives: {', '.join(OPS)}")
    p.add_argument("--min-bytes", default="1K", help="smallest power-of-two size")
    p.add_argument("--max-bytes", default="256M", help="largest power-of-two size")
    p.add_argument("--sizes", default="", help="extra sizes, comma-separated (e.g. 3000,1.5M)")
    p.add_argument("--model", default=None,
                   help="also the sizes of this model's gradient tensors and fusion buckets")
    p.add_argument("--image-size", type=int, default=None)
    p.add_argument("--sentence-len", type=int, default=64)
    p.add_argument("--num-classes", type=int, default=1000)
    p.add_argument("--threshold", type=float, default=64 * MIB,
                   help="fusion threshold (bytes) for --model's bucket sizes")
    p.add_argument("--mgwfbp-profile", default=None, metavar="JSON",
                   help="also the sizes of the MG-WFBP groups planned from this profile")
    p.add_argument("--mgwfbp-min-group", type=int, default=DEFAULT_MIN_GROUP_ELEMENTS,
                   metavar="ELEMENTS", help="MG-WFBP's small-group merge (0: off)")
    p.add_argument("--warmup", type=int, default=5, help="untimed operations per size")
    p.add_argument("--iters", type=int, default=20, help="timed operations per size")
    p.add_argument("--fit", default="relative", choices=("relative", "absolute"),
                   help="least squares of relative or absolute errors (pushpull: absolute, "
                        "over the messages of one partition, always)")
    p.add_argument("--stat", default="median", choices=("median", "mean"),
                   help="a size's time: median (robust on a shared machine) or mean "
                        "(nccl-tests) over the timed operations")
    p.add_argument("--nworkers", type=int, default=None,
                   help="local workers to spawn (default 1; under a launcher: its world size)")
    p.add_argument("--no-cuda", action="store_true")
    p.add_argument("--backend", default="auto", choices=("auto", "nccl", "gloo"))
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--timeout", type=float, default=300.0)
    add_network_flags(p)
    add_ps_flags(p, nservers_default=None, what="pushpull: ",
                 nservers_help="parameter servers for --ops pushpull (default on one machine: "
                               "one per 4 workers)")
    p.add_argument("--slots", type=int, default=None, metavar="S",
                   help="workers per emulated host, as the training script's --slots")
    p.add_argument("--output", default=None, help="write the JSON record here (rank 0)")
    args = p.parse_args(argv)
    if args.nservers is None:
        # Servers are spawned here only for push/pull, and only with no launcher around.
        from ..hosts.placement import detect
        from ..planning import default_nservers
        wants = "pushpull" in args.ops.split(",") and detect() is None
        args.nservers = default_nservers(args.nworkers or 1) if wants else 0
    return args


def check(args) -> tuple[list[str], list[int]]:
    ops = [o.strip() for o in args.ops.split(",") if o.strip()]
    bad = [o for o in ops if o not in OPS]
    if not ops or bad:
        raise UsageError(f"--ops: unknown collective(s) {', '.join(bad) or '(none given)'}; "
                         f"known: {', '.join(OPS)}")
    check_flags(args, positive=("--iters", "--timeout", "--threads", "--nworkers",
                                "--image-size", "--sentence-len", "--num-classes",
                                "--partition-bytes", "--slots"),
                nonneg=("--warmup", "--threshold", "--mgwfbp-min-group", "--nservers"))
    if args.output:
        check_writable(args.output)
    if "burst" in ops and not args.model:
        raise UsageError("--ops burst all-reduces a model's gradient tensors: give --model")
    if "pushpull" in ops and args.nservers == 0:
        raise UsageError("--ops pushpull needs parameter servers: --nservers S (under a "
                         "launcher, S of its processes become servers)")
    from .. import netem
    netem.check(args.net)
    lo, hi = parse_size(args.min_bytes), parse_size(args.max_bytes)
    if lo > hi:
        raise UsageError(f"--min-bytes {args.min_bytes} is larger than --max-bytes {args.max_bytes}")
    sizes = set(pow2_sizes(lo, hi))
    sizes |= {parse_size(s) for s in args.sizes.split(",") if s.strip()}
    if args.model and any(op != "burst" for op in ops):
        sizes |= set(model_sizes(args.model, args.image_size, args.sentence_len,
                                 args.num_classes, args.threshold))
    elif args.model:
        # A burst builds the model in each worker (no forward: the input does not matter);
        # the launching process only checks the name (building it here, torch and
        # transformers imported first, took 4 of a BERT-Tiny burst job's 13 s)
        import models
        models.check(args.model)
    if args.mgwfbp_profile:
        from .profile_file import read_profile
        from ..planning import merge_groups
        prof = read_profile(args.mgwfbp_profile)
        nbytes = [t["bytes"] for t in prof["tensors"]]
        groups = merge_groups(prof["backward_s"], nbytes, prof["alpha_s"],
                              prof["beta_s_per_byte"], args.mgwfbp_min_group * ELEMENT_BYTES)
        sizes |= {sum(nbytes[i] for i in g) for g in groups}
    if not sizes:
        raise UsageError("no message sizes: widen --min-bytes/--max-bytes or give --sizes")
    return ops, sorted(sizes)


def main(argv=None) -> int:
    from ..launch.job import run_job
    argv = list(sys.argv[1:] if argv is None else argv)
    return run_job(argv, "ddlbench.measure.comm_bench", parse_args, check, worker,
                   check_under_launcher=False)


def worker(args, placement) -> int:
    from .. import netem, runtime
    from . import record
    ops, sizes = check(args)

    def run(ctx) -> int:
        def log(line):
            if ctx.is_root:
                print(line, flush=True)

        log(f"# ddlbench comm_bench: {ctx.size} worker(s), backend {ctx.backend}, device "
            f"{ctx.device.type}, network {args.network}; warm-up {args.warmup}, "
            f"iterations {args.iters}")
        results = []
        for op in ops:
            if op == "burst":
                results.append(measure_burst(
                    backward_bytes(args.model, args.image_size, args.sentence_len,
                                   args.num_classes), device=ctx.device, warmup=args.warmup,
                    iters=args.iters, stat=args.stat, network=args.network, log=log))
                continue
            results.append(measure(op, sizes, device=ctx.device, warmup=args.warmup,
                                   iters=args.iters, relative=args.fit == "relative",
                                   stat=args.stat, network=args.network, log=log,
                                   ps=ctx.ps))
        environment = record.environment(ctx)
        if ctx.is_root and args.output:
            rec = {"kind": "comm_bench", "nworkers": ctx.size, "network": args.network,
                   "backend": ctx.backend, "device": ctx.device.type,
                   "warmup": args.warmup, "iters": args.iters,
                   "config": {k: v for k, v in vars(args).items() if k != "output"},
                   "results": results,
                   "net": netem.run_info(args.net),
                   "environment": environment}
            record.write_atomic(args.output, rec)
        return 0
    return runtime.start(placement, runtime.Job.of(args), run)


if __name__ == "__main__":
    from ddlbench.errors import finish
    sys.exit(finish(main()))

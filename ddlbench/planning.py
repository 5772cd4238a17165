"""Pure planning: fusion buckets by a byte threshold, MG-WFBP's merge rule with the
iteration-time recurrences it is built on and the original's alpha-beta tables (docs/DESIGN.md
sections 3 and 4), and the parameter servers' defaults (section 6)."""
from __future__ import annotations

from .errors import UsageError

DEFAULT_PARTITION_BYTES = 4_096_000   # BytePS's partition size
# bspps's fusion threshold: every gradient of any model of the suite in one unit
BSP_PS_THRESHOLD = 536_870_912
# fusion's buffer: Horovod's HOROVOD_FUSION_THRESHOLD default, in bytes
HOROVOD_DEFAULT_THRESHOLD = 64 * 1024 * 1024
# torch DDP's bucket_cap_mb default, and the first bucket's cap it rebuilds with at that default
# (torch.distributed._DEFAULT_FIRST_BUCKET_BYTES)
DDP_DEFAULT_BUCKET_MB = 25.0
DDP_FIRST_BUCKET_BYTES = 1024 * 1024
# ByteScheduler's published runs' settings, in elements (docs/DESIGN.md section 5)
BYTESCHEDULER_PARTITION = 4_000_000
BYTESCHEDULER_CREDIT = 16_000_000
# MG-WFBP's small-group merge: the original always merged groups under this many elements.
DEFAULT_MIN_GROUP_ELEMENTS = 8192

# The original suite's MG-WFBP alpha-beta tables (HKBU-HPML/ddl-benchmarks at 565964a,
# mgwfbp/hv_distributed_optimizer.py, _generate_groups_mgwfbp, lines 226-248): workers ->
# (alpha in seconds, beta in seconds per BYTE: it costs a message of n elements as
# alpha + beta * n * 4, or * 2 under --fp16, lines 249 and 274). Its MG-WFBP always planned with
# them: its benchmark scripts hand the optimizer profiled layer times, and its communication
# benchmark runs only without them (line 95). It chose the "56Gbps" table under its --rdma flag,
# which its launcher mgwfbp/horovod_mpi_cj.sh passes for rdma=1 and rdma=2, else "10Gbps"; any
# other worker count is a KeyError there. Products are written as the original wrote them.
ORIGINAL_AB_TABLES: dict[str, dict[int, tuple[float, float]]] = {
    "10Gbps": {
        2: (2.554691138304671e-06, 9.837548167872609e-11),
        4: (4.204298980348825e-05, 2.0589360830118177e-10),
        8: (0.0005230272768511732, 8.570746975492128e-10),
        16: (0.0009080981007148093, 7.395651186836712e-10),
        32: (0.0013476410788581382 * 3, 8.643300782166769e-10),
        64: (0.0023476410788581382 * 3, 9.643300782166769e-10),
    },
    "56Gbps": {
        2: (2.554691138304671e-06, 9.837548167872609e-11),
        4: (4.204298980348825e-05, 2.0589360830118177e-10),
        8: (9.75367204301171e-05, 3.0568230536676206e-10),
        16: (0.00023583677659915685 * 3, 4.0594787739537565e-10),
        32: (0.00040632079996292579, 1.5 * 3.2713239529771973e-10),
        64: (0.00080632079996292579, 1.8 * 3.2713239529771973e-10),
    },
}


def original_ab_table(network: str | None) -> str:
    """The name of the original's table for a network label (``DDLBENCH_NETWORK``): "56Gbps"
    for rdma1 and rdma2 (the original's --rdma), "10Gbps" for anything else (rdma0, and any run
    the original would have started without --rdma)."""
    return "56Gbps" if network in ("rdma1", "rdma2") else "10Gbps"


def original_alpha_beta(nworkers: int, network: str | None) -> tuple[str, float, float]:
    """(table name, alpha seconds, beta seconds per byte) the original planned MG-WFBP with for
    ``nworkers`` workers on ``network``. One worker sends nothing: alpha = beta = 0 (the
    original's tables start at 2 workers and it never ran MG-WFBP on one; a sweep's 1-worker
    column still needs the run). Any other count missing from the table: one line naming the
    table's counts (the original failed there with a KeyError)."""
    name = original_ab_table(network)
    table = ORIGINAL_AB_TABLES[name]
    if nworkers == 1:
        return name, 0.0, 0.0
    if nworkers not in table:
        raise UsageError(
            f"--mgwfbp-ab table: the original's {name} alpha-beta table has no entry for "
            f"{nworkers} worker(s), only for {', '.join(map(str, sorted(table)))}; use "
            f"--mgwfbp-ab measured")
    alpha, beta = table[nworkers]
    return name, alpha, beta


# Who pushes to the parameter servers (docs/DESIGN.md section 6): one client per machine
# (the default, as BytePS) or per worker process.
PS_CLIENTS = ("machine", "process")
DEFAULT_PS_CLIENTS = PS_CLIENTS[0]

# Which server holds a partition (docs/DESIGN.md section 6): ``least-loaded`` (the default),
# each key in key order on the server with the fewest bytes so far (ties: the lowest server);
# ``key-mod``, server ``key mod S``, the original suite's and BytePS's kind of rule (BytePS
# hashes the key, djb2), kept for comparison.
PS_PLACEMENTS = ("least-loaded", "key-mod")
DEFAULT_PS_PLACEMENT = PS_PLACEMENTS[0]

# How a scheduling server picks the next pending push (docs/DESIGN.md section 6):
# ``fewest-pushes`` is BytePS 0.2.x's (server/queue.h): the key with the fewest pushes received
# in its current round first (a round's last push zeroes the count), ties by arrival;
# ``lowest-key`` the suite's earlier rule: the lowest key first, ties by arrival.
SERVER_RULES = ("fewest-pushes", "lowest-key")
DEFAULT_SERVER_RULE = SERVER_RULES[0]
# A scheduling server's summing threads (BYTEPS_SERVER_ENGINE_THREAD; the original's
# launch.sh set 8, BytePS's own default is 4), each with its own queue.
DEFAULT_ENGINE_THREADS = 8


class Placer:
    """Places keys on ``nservers`` servers by ``rule`` (``PS_PLACEMENTS``) as they come:
    ``server(key, nbytes)`` at a key's first sight, the same server after. Torch-free: the
    engine's plan and the model's push/pull use it alike."""

    def __init__(self, nservers: int, rule: str = DEFAULT_PS_PLACEMENT):
        if rule not in PS_PLACEMENTS:
            raise UsageError(f"parameter-server placement must be {' or '.join(PS_PLACEMENTS)}, "
                             f"got {rule!r}")
        if nservers < 1:
            raise UsageError(f"placement needs at least one server, got {nservers}")
        self.rule = rule
        self.load = [0] * nservers       # bytes placed on each server so far
        self.of: dict[int, int] = {}     # key -> server

    def server(self, key: int, nbytes: int) -> int:
        s = self.of.get(key)
        if s is None:
            if self.rule == "key-mod":
                s = key % len(self.load)
            else:
                s = min(range(len(self.load)), key=lambda i: (self.load[i], i))
            self.of[key] = s
            self.load[s] += int(nbytes)
        return s


def place(nbytes: list[int], nservers: int, rule: str = DEFAULT_PS_PLACEMENT) -> list[int]:
    """The server of each key 0..n-1 of ``nbytes`` bytes, placed in key order."""
    placer = Placer(nservers, rule)
    return [placer.server(k, b) for k, b in enumerate(nbytes)]


def default_nservers(nworkers: int, hosts: int = 1) -> int:
    """One server per worker machine; on one machine one per 4 workers, at least 1."""
    if hosts > 1:
        return hosts
    return max(1, -(-nworkers // 4))


def plan_buckets(nbytes: list[int], threshold: float, keys: list | None = None) -> list[list[int]]:
    """Split positions 0..n-1 (in backward order) into consecutive groups of at most
    ``threshold`` bytes; threshold 0 gives one group per tensor. ``keys`` (e.g. dtypes) that
    differ also close a group."""
    groups: list[list[int]] = []
    current: list[int] = []
    total = 0
    for i, n in enumerate(nbytes):
        fits = current and total + n <= threshold and (keys is None or keys[i] == keys[current[0]])
        if current and not fits:
            groups.append(current)
            current, total = [], 0
        current.append(i)
        total += n
    if current:
        groups.append(current)
    return groups


def ddp_buckets(nbytes: list[int], cap_bytes: float,
                first_bytes: float | None = None) -> list[list[int]]:
    """torch DDP's rebuilt buckets of positions 0..n-1 (gradient-ready order), by its rule
    (``_compute_bucket_assignment_by_size``): a tensor joins the open bucket, which closes
    once it holds at least its limit, so the tensor that crosses the limit is in it (unlike
    ``plan_buckets``). The first bucket's limit is ``first_bytes`` (default ``cap_bytes``),
    every later one's ``cap_bytes``. One dtype and device throughout, as the suite's models."""
    groups: list[list[int]] = []
    current: list[int] = []
    total = 0
    for i, n in enumerate(nbytes):
        current.append(i)
        total += n
        limit = cap_bytes if groups or first_bytes is None else first_bytes
        if total >= limit:
            groups.append(current)
            current, total = [], 0
    if current:
        groups.append(current)
    return groups


def ddp_first_bucket_bytes(cap_mb: float) -> float:
    """The first bucket's cap of a DDP built with ``bucket_cap_mb=cap_mb`` as the suite's
    ``ddp`` builds it (``methods.ddp``: torch's defaults at the default cap), by the rule of
    torch 2.14: 1 MiB at the default cap, ``cap_mb`` otherwise (a cap given explicitly covers
    the first bucket too)."""
    return DDP_FIRST_BUCKET_BYTES if cap_mb == DDP_DEFAULT_BUCKET_MB else cap_mb * 1024 * 1024


def _comm_starts(ready: list[float], tc: list[float]) -> list[float]:
    """tauc of docs/DESIGN.md section 3, forward indices: tauc[L-1] = ready[L-1];
    tauc[l] = max(tauc[l+1] + tc[l+1], ready[l])."""
    n = len(ready)
    tauc = [0.0] * n
    tauc[n - 1] = ready[n - 1]
    for l in range(n - 2, -1, -1):
        tauc[l] = max(tauc[l + 1] + tc[l + 1], ready[l])
    return tauc


def _forward_view(backward_s, nbytes):
    """Backward-order lists to the forward indices of docs/DESIGN.md (l = 0 next to the input):
    backward position b is layer l = L-1-b. Returns tb, sizes, ready = taub + tb."""
    n = len(nbytes)
    tb = [float(backward_s[n - 1 - l]) for l in range(n)]
    size = [int(nbytes[n - 1 - l]) for l in range(n)]
    taub = [0.0] * n
    for l in range(n - 2, -1, -1):
        taub[l] = taub[l + 1] + tb[l + 1]
    return tb, size, [taub[l] + tb[l] for l in range(n)]


def merge_groups(backward_s: list[float], nbytes: list[int], alpha: float, beta: float,
                 min_group_bytes: int = 0) -> list[list[int]]:
    """MG-WFBP's merge rule, exactly as docs/DESIGN.md section 4 states it.

    Inputs in *backward order* (position 0 = the first gradient ready, the layer next to the
    output): ``backward_s[b]`` the backward time of tensor b (the gap since the previous one was
    ready), ``nbytes[b]`` its size; ``alpha`` seconds per message and ``beta`` seconds per byte
    (one message of M bytes costs ``alpha + beta*M``); ``min_group_bytes`` the original's
    small-group option (0 = off).

    The rule is written in forward indices, l = 0 next to the input; backward position b is
    l = L-1-b. With taub[L-1] = 0, taub[l] = taub[l+1] + tb[l+1] (when l's backward starts),
    tc[l] = alpha + beta*bytes(l) and tauc from section 3 (when l's message starts), walk
    l = L-1 down to 1: merge l into l-1 when ``taub[l-1] + tb[l-1] < tauc[l] + alpha`` (l-1 is
    ready before l's message would have paid its start-up cost), or, the option, when l's group
    so far is smaller than ``min_group_bytes``. A merge sets tc[l] = 0, moves l's bytes to l-1,
    sets tc[l-1] = alpha + beta*bytes(l-1) and recomputes tauc; otherwise the group closes at l.
    Tensor 0 ends the last group.

    Interpretation choices: the comparison is strict (a tie does not merge); "bytes(l-1)" after
    a merge is the whole group's bytes so far, and the small-group test looks at that same
    running total, checked only when the timing rule did not merge.

    Returns the groups as lists of backward positions, in backward order (consecutive runs
    covering 0..L-1): the first group is the first to be sent."""
    n = len(nbytes)
    if len(backward_s) != n:
        raise ValueError(f"{len(backward_s)} backward times for {n} tensors")
    if n == 0:
        return []
    _, size, ready = _forward_view(backward_s, nbytes)
    tc = [alpha + beta * s for s in size]
    tauc = _comm_starts(ready, tc)
    groups, current = [], []
    for l in range(n - 1, 0, -1):
        current.append(n - 1 - l)
        merge = ready[l - 1] < tauc[l] + alpha or size[l] < min_group_bytes
        if merge:
            size[l - 1] += size[l]
            size[l] = 0
            tc[l] = 0.0
            tc[l - 1] = alpha + beta * size[l - 1]
            tauc = _comm_starts(ready, tc)
        else:
            groups.append(current)
            current = []
    current.append(n - 1)
    groups.append(current)
    return groups


def schedule_time(backward_s: list[float], nbytes: list[int], groups: list[list[int]],
                  alpha: float, beta: float) -> float:
    """Predicted time from the start of the backward pass until the last message is done
    (``tauc[0] + tc[0]`` of docs/DESIGN.md section 3) when ``groups`` (backward positions, as
    ``merge_groups`` returns them) are each sent as one message of ``alpha + beta*bytes``
    after their last tensor is ready, one message at a time. Add the forward time for an
    iteration's time. ``[[0], [1], ...]`` is WFBP."""
    n = len(nbytes)
    if n == 0:
        return 0.0
    _, _, ready = _forward_view(backward_s, nbytes)
    tc = [0.0] * n
    for g in groups:
        l = n - 1 - max(g)  # the group goes when its last tensor (lowest l) is ready
        tc[l] = alpha + beta * sum(nbytes[b] for b in g)
    tauc = _comm_starts(ready, tc)
    return tauc[0] + tc[0]


def chunk_table(sizes: list[int], partition: int) -> list[tuple[int, int, int]]:
    """ByteScheduler's chunks: (tensor, start, end) of every chunk, in priority order (tensor
    index, then chunk index). A tensor of more than ``partition`` elements gets
    ceil(numel / partition) chunks."""
    if partition <= 0:
        raise ValueError("partition must be positive")
    table = []
    for i, n in enumerate(sizes):
        for start in range(0, max(n, 1), partition):
            table.append((i, start, min(n, start + partition)))
    return table

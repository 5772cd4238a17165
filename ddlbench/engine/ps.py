"""The parameter-server architecture's transport and summation server, BytePS style.

See docs/DESIGN.md section 6.

A job with servers has ``W + S`` processes: ranks ``0..W-1`` are workers, ranks ``W..W+S-1``
are servers. All of them join one Gloo process group used only for push and pull (point-to-point
sends and receives); the workers also form their own default group for everything else
(initial broadcast, timing, verification), so the all-to-all methods never see the servers.

Protocol, per *session* (one method object's lifetime):

- **Plan.** Every worker cuts the same list of units (a tensor, or a fused group of tensors)
  into partitions of ``partition_bytes`` and numbers them: the key. Partition ``key`` lives on
  server ``key mod S`` (round-robin by key). Worker 0 sends each server the keys it owns (key,
  elements, dtype); a server allocates one accumulator per key and one receive buffer per worker.
- **Push.** A worker sends a small header ``[PUSH, key]`` then the partition's data with tag
  ``TAG_DATA + key``. Headers from one worker arrive in the order it sent them; the data is
  matched by its key's tag, never by arrival order, so workers may push in any order
  (priority scheduling) without deadlock. A server runs one receiving thread per worker, so a
  slow worker never blocks the others' pushes.
- **Sum and pull.** The server adds each push into the key's accumulator (the first push of an
  iteration copies); when all W have arrived it sends the sum to every worker with the key's tag.
  A worker posts the pull (a receive into the same memory it pushed from) right after the push:
  the sum can only arrive after the server has read every push, so receiving in place is safe.
  Workers divide by W and apply their optimizer locally; servers keep no state across
  iterations but their buffers. An accumulator is reused for the next iteration only after its
  previous sums have been sent.
- **End.** Each worker ends the session with ``[END, -1]``; worker 0 ends the job with a
  shutdown message on the control tag.

Failure: a peer that dies closes its sockets, and the pending receive of whoever waits on it
fails at once. A server prints one line naming the worker and exits 1; a worker raises
``PSError`` naming the server, which the job entry turns into one line and exit 1. Every wait
on data has the job's ``--timeout``, so nothing hangs forever.

GPU workers stage each partition through a pinned host buffer (servers run on the CPU, as
BytePS's summation servers do).
"""
from __future__ import annotations

import datetime
import os
import threading
from dataclasses import dataclass

import torch
import torch.distributed as dist

from ..errors import PSError, first_line, say

# Message kinds, first word of a header.
OP_PUSH, OP_END, OP_STATS, OP_PLAN, OP_SHUTDOWN = range(5)
# Tags (Gloo slots). Data of key k uses TAG_DATA + k.
TAG_CONTROL, TAG_HEADER, TAG_PLAN, TAG_STATS = 1, 2, 3, 4
TAG_DATA = 16

_DTYPES = [torch.float32, torch.float16, torch.bfloat16, torch.float64]
_IDLE = datetime.timedelta(days=1)    # a server waiting for the next message: peers that die
#                                       are noticed at once (closed socket), hangs by workers


@dataclass(frozen=True)
class Partition:
    key: int
    unit: int
    start: int   # element offsets in the unit's flat data
    end: int
    server: int

    @property
    def numel(self) -> int:
        return self.end - self.start


def partition_elements(partition_bytes: int, element_size: int) -> int:
    return max(1, int(partition_bytes) // element_size)


def plan(units: list[tuple[int, torch.dtype]], partition_bytes: int,
         nservers: int) -> list[list[Partition]]:
    """Partitions of every unit ``(numel, dtype)``: consecutive slices of at most
    ``partition_bytes``, numbered in unit order, server ``key mod nservers``."""
    out, key = [], 0
    for u, (numel, dtype) in enumerate(units):
        step = partition_elements(partition_bytes, _element_size(dtype))
        parts = []
        for start in range(0, max(numel, 1), step):
            parts.append(Partition(key, u, start, min(numel, start + step), key % nservers))
            key += 1
        out.append(parts)
    return out


def _element_size(dtype: torch.dtype) -> int:
    return torch.empty((), dtype=dtype).element_size()


def _rss() -> int:
    import psutil
    return psutil.Process().memory_info().rss


# ------------------------------------------------------------------------------- worker side

class Handle:
    """One partition's push and pull in flight."""

    def __init__(self, client: "PSClient", part: Partition, data: torch.Tensor, header,
                 sends, recv, staging):
        self.client, self.part, self.data = client, part, data
        self._header, self._sends, self._recv, self._staging = header, sends, recv, staging
        # A Gloo completion can be waited for once; a scheduler may ask from two threads.
        self._lock = threading.Lock()

    def wait_push(self) -> None:
        """The server has taken this push (credit can be returned)."""
        with self._lock:
            for w in self._sends:
                self.client._wait(w, self.part.server, "push")
            self._sends = []

    def wait(self) -> None:
        """The pulled sum is in ``data``."""
        self.wait_push()
        if self._recv is not None:
            self.client._wait(self._recv, self.part.server, "pull")
            self._recv = None
            if self._staging is not None:
                self.data.copy_(self._staging)


class PSClient:
    """A worker's end of the parameter-server group."""

    def __init__(self, pg, rank: int, nworkers: int, nservers: int, partition_bytes: int,
                 timeout_s: float):
        self.pg = pg
        self.rank = rank
        self.nworkers = nworkers
        self.nservers = nservers
        self.partition_bytes = int(partition_bytes)
        self.timeout = datetime.timedelta(seconds=timeout_s)
        self._staging: dict[int, torch.Tensor] = {}
        self._open = False

    def server_rank(self, server: int) -> int:
        return self.nworkers + server

    def server_name(self, server: int) -> str:
        return f"parameter server {server} (rank {self.server_rank(server)})"

    def _wait(self, work, server: int, what: str) -> None:
        try:
            work.wait(self.timeout)
        except Exception as e:  # a closed connection, or the timeout
            # The server may have stopped because another worker died: the launcher's line
            # names the first process of the job that failed.
            raise PSError(f"{what} to/from {self.server_name(server)} failed: "
                          f"{first_line(e)} (the server, or a process it served, stopped)"
                          ) from None

    def _send(self, tensor, server: int, tag: int):
        try:
            return self.pg.send([tensor], self.server_rank(server), tag)
        except Exception as e:
            raise PSError(f"cannot send to {self.server_name(server)}: {first_line(e)}") from None

    def _recv(self, tensor, server: int, tag: int):
        try:
            return self.pg.recv([tensor], self.server_rank(server), tag)
        except Exception as e:
            raise PSError(f"cannot receive from {self.server_name(server)}: "
                          f"{first_line(e)}") from None

    # -- sessions -------------------------------------------------------------------------------
    def open(self, units: list[tuple[int, torch.dtype]]) -> list[list[Partition]]:
        """Start a session for these units; worker 0 tells each server its keys."""
        if self._open:
            raise RuntimeError("a parameter-server session is already open on this worker")
        parts = plan(units, self.partition_bytes, self.nservers)
        if self.rank == 0:
            owned: list[list[list[int]]] = [[] for _ in range(self.nservers)]
            for u, unit_parts in enumerate(parts):
                code = _DTYPES.index(units[u][1])
                for p in unit_parts:
                    owned[p.server].append([p.key, p.numel, code])
            works = []
            for s in range(self.nservers):
                ctrl = torch.tensor([OP_PLAN, len(owned[s])], dtype=torch.int64)
                works.append((s, self._send(ctrl, s, TAG_CONTROL), ctrl))
                if owned[s]:
                    table = torch.tensor(owned[s], dtype=torch.int64)
                    works.append((s, self._send(table, s, TAG_PLAN), table))
            for s, w, _ in works:
                self._wait(w, s, "plan")
        self._staging.clear()
        self._open = True
        return parts

    def push_pull(self, part: Partition, data: torch.Tensor) -> Handle:
        """Push ``data`` (the partition's slice, contiguous) and post the pull of the sum into
        the same memory."""
        staging = None
        wire = data
        if data.device.type != "cpu":
            staging = self._staging.get(part.key)
            if staging is None:
                staging = torch.empty(data.numel(), dtype=data.dtype, pin_memory=True)
                self._staging[part.key] = staging
            staging.copy_(data)
            wire = staging
        header = torch.tensor([OP_PUSH, part.key], dtype=torch.int64)
        s = part.server
        sends = [self._send(header, s, TAG_HEADER), self._send(wire, s, TAG_DATA + part.key)]
        recv = self._recv(wire, s, TAG_DATA + part.key)
        return Handle(self, part, data, header, sends, recv, staging)

    def close(self) -> None:
        """End this worker's session on every server."""
        if not self._open:
            return
        self._open = False
        self._tell_all(OP_END)

    def _tell_all(self, op: int, tag: int = TAG_HEADER) -> None:
        msgs = [torch.tensor([op, -1], dtype=torch.int64) for _ in range(self.nservers)]
        works = [(s, self._send(m, s, tag)) for s, m in enumerate(msgs)]
        for s, w in works:
            self._wait(w, s, "message")

    def server_stats(self) -> list[dict]:
        """Each server's memory and traffic so far (worker 0, inside a session)."""
        out = []
        for s in range(self.nservers):
            req = torch.tensor([OP_STATS, -1], dtype=torch.int64)
            reply = torch.zeros(5, dtype=torch.int64)
            w1 = self._send(req, s, TAG_HEADER)
            w2 = self._recv(reply, s, TAG_STATS)
            self._wait(w1, s, "stats request")
            self._wait(w2, s, "stats")
            rss, peak, received, sent, start = (int(x) for x in reply)
            out.append({"server": s, "rank": self.server_rank(s), "rss_bytes": rss,
                        "rss_bytes_at_start": start, "peak_rss_bytes": peak,
                        "bytes_received": received, "bytes_sent": sent})
        return out

    def shutdown(self) -> None:
        """Worker 0: tell every server the job is over."""
        self.close()
        if self.rank == 0:
            self._tell_all(OP_SHUTDOWN, TAG_CONTROL)


# ------------------------------------------------------------------------------- server side

class _Key:
    def __init__(self, numel: int, dtype: torch.dtype):
        self.acc = torch.empty(numel, dtype=dtype)
        self.count = 0
        self.sends: list = []
        self.lock = threading.Lock()


class Server:
    """One summation server: ``run()`` serves sessions until worker 0 shuts the job down."""

    def __init__(self, pg, rank: int, nworkers: int, nservers: int, timeout_s: float):
        self.pg = pg
        self.rank = rank
        self.index = rank - nworkers
        self.nworkers = nworkers
        self.nservers = nservers
        self.timeout = datetime.timedelta(seconds=timeout_s)
        self.bytes_received = 0
        self.bytes_sent = 0
        self._count_lock = threading.Lock()
        self.rss_at_start = _rss()  # before any buffer: what the summing itself adds is above

    def _die(self, message: str) -> None:
        say(f"ddlbench: parameter server {self.index} (rank {self.rank}): {message}")
        # Threads blocked in receives cannot be interrupted; the process ends here, and the
        # workers waiting on it see their connections close.
        os._exit(1)

    def _wait(self, work, peer: int, what: str, timeout=None) -> None:
        try:
            work.wait(timeout or self.timeout)
        except Exception as e:
            self._die(f"{what} from/to worker {peer} failed: {first_line(e)}")

    def _send(self, tensor, peer: int, tag: int):
        try:
            return self.pg.send([tensor], peer, tag)
        except Exception as e:  # the peer's connection is gone
            self._die(f"sending to worker {peer} failed: {first_line(e)}")

    def _recv(self, tensor, peer: int, tag: int, what: str, timeout=None) -> None:
        """Receive from ``peer`` and wait; a dead peer or the timeout ends the server."""
        try:
            work = self.pg.recv([tensor], peer, tag)
        except Exception as e:
            self._die(f"{what} from worker {peer} failed: {first_line(e)}")
        self._wait(work, peer, what, timeout)

    def run(self) -> int:
        torch.set_num_threads(1)
        while True:
            ctrl = torch.zeros(2, dtype=torch.int64)
            self._recv(ctrl, 0, TAG_CONTROL, "control message", _IDLE)
            op, n = (int(x) for x in ctrl)
            if op == OP_SHUTDOWN:
                return 0
            if op != OP_PLAN:
                self._die(f"protocol error: control message {op} from worker 0")
            table = torch.zeros((n, 3), dtype=torch.int64)
            if n:
                self._recv(table, 0, TAG_PLAN, "plan")
            keys = {int(k): _Key(int(numel), _DTYPES[int(code)]) for k, numel, code in table}
            self._session(keys)

    def _session(self, keys: dict[int, _Key]) -> None:
        largest = max((k.acc.numel() for k in keys.values()), default=0)
        dtype = next(iter(keys.values())).acc.dtype if keys else torch.float32
        threads = []
        for w in range(self.nworkers):
            t = threading.Thread(target=self._serve_worker, args=(w, keys, largest, dtype),
                                 name=f"ps-worker-{w}", daemon=True)
            t.start()
            threads.append(t)
        for t in threads:
            t.join()
        for k in keys.values():
            for w, work in k.sends:
                self._wait(work, w, "pull")

    def _serve_worker(self, w: int, keys: dict[int, _Key], largest: int, dtype) -> None:
        try:
            scratch = {}
            header = torch.zeros(2, dtype=torch.int64)
            while True:
                self._recv(header, w, TAG_HEADER, "message", _IDLE)
                op, key = (int(x) for x in header)
                if op == OP_END:
                    return
                if op == OP_STATS:
                    self._send_stats(w)
                    continue
                if op != OP_PUSH or key not in keys:
                    self._die(f"protocol error: message {op} for key {key} from worker {w}")
                k = keys[key]
                buf = scratch.get(k.acc.dtype)
                if buf is None:
                    buf = scratch[k.acc.dtype] = torch.empty(largest, dtype=k.acc.dtype)
                data = buf[:k.acc.numel()]
                self._recv(data, w, TAG_DATA + key, f"push of key {key}")
                nbytes = data.numel() * data.element_size()
                with k.lock:
                    if k.count == 0:
                        # The previous iteration's sums of this key have reached every worker
                        # (this worker pushed again only after pulling); reclaim the buffer.
                        for peer, work in k.sends:
                            self._wait(work, peer, f"pull of key {key}")
                        k.sends = []
                        k.acc.copy_(data)
                    else:
                        k.acc.add_(data)
                    k.count += 1
                    if k.count == self.nworkers:
                        k.count = 0
                        k.sends = [(peer, self._send(k.acc, peer, TAG_DATA + key))
                                   for peer in range(self.nworkers)]
                        sent = nbytes * self.nworkers
                    else:
                        sent = 0
                with self._count_lock:
                    self.bytes_received += nbytes
                    self.bytes_sent += sent
        except SystemExit:
            raise
        except BaseException as e:  # anything unexpected ends the server, with its reason
            self._die(f"serving worker {w}: {type(e).__name__}: {first_line(e)}")

    def _send_stats(self, w: int) -> None:
        import resource
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
        with self._count_lock:
            reply = torch.tensor([_rss(), peak, self.bytes_received, self.bytes_sent,
                                  self.rss_at_start], dtype=torch.int64)
        self._wait(self._send(reply, w, TAG_STATS), w, "stats")


def connect(store, rank: int, world_size: int, timeout_s: float):
    """The push/pull process group over all ``W + S`` processes (Gloo, CPU tensors)."""
    return dist.ProcessGroupGloo(dist.PrefixStore("ddlbench-ps/", store), rank, world_size,
                                 datetime.timedelta(seconds=timeout_s))

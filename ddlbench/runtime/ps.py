"""The parameter-server architecture's transport and summation server, BytePS style.

See docs/DESIGN.md section 6.

A job with servers has ``W + S`` processes: ranks ``0..W-1`` are workers, ranks ``W..W+S-1``
are servers. All of them join one Gloo process group used only for push and pull (point-to-point
sends and receives); the workers also form their own default group for everything else
(initial broadcast, timing, verification), so the all-to-all methods never see the servers.

Protocol, per *session* (one method object's lifetime):

- **Plan.** Every worker cuts the same list of units (a tensor, or a fused group of tensors)
  into partitions of ``partition_bytes`` and numbers them: the key. The keys are placed on the
  servers in key order, each on the server with the fewest bytes so far (``least-loaded``, the
  default; ties: the lowest server), or on server ``key mod S`` (``key-mod``, for comparison:
  the original's and, by its hash, BytePS's kind of rule); every worker plans alike, so the
  placement is the same on each. Worker 0 sends each server the keys it owns (key,
  elements, dtype); a server allocates one accumulator per key and, as pushes come, one
  receive buffer per worker and key (its memory: the keys' bytes times 1 + the pushers).
- **Push.** A worker sends a small header ``[PUSH, key]`` (on the session's header tag) then
  the partition's data with tag ``TAG_DATA + key``. Headers from one worker arrive in the order
  it sent them; the data is matched by its key's tag, never by arrival order, so workers may
  push in any order (priority scheduling) without deadlock. A server runs one receiving thread
  per worker, so a slow worker never blocks the others' pushes, and keeps its receives posted
  ahead (``_Inbox``), so a push never waits for the server to post one.
- **Sum and pull.** The server adds each push into the key's accumulator (the first push of an
  iteration copies); when all W have arrived it sends the sum to every worker with the key's tag.
  A worker posts the pull (a receive into the same memory it pushed from) right after the push:
  the sum can only arrive after the server has read every push, so receiving in place is safe.
  Workers divide by W and apply their optimizer locally; servers keep no state across
  iterations but their buffers. An accumulator is reused for the next iteration only after its
  previous sums have been sent.
- **End.** Each worker ends the session with ``[END, -1]``; worker 0 ends the job with a
  shutdown message on the control tag.
- **Asking a server** (worker 0, inside a session; served by the thread of peer 0, replies on
  ``TAG_STATS``): ``[STATS, -1]`` its memory and traffic; ``[CLOCK, -1]`` its clock (float64
  microseconds, ``timeline.now_us``, sent at once: worker 0 measures the offset NTP style);
  ``[TIMELINE_ON, -1]`` / ``[TIMELINE_OFF, -1]`` start / stop recording (replied once done);
  ``[EVENTS, -1]`` its recorded events (the length, then the JSON list as bytes).

The server's timeline (``--timeline PATH`` only; off otherwise, costing one attribute test per
push): per push a ``receive`` span (the header's arrival to the data's, on the row ``receive
from worker P`` of that peer's thread) and a ``sum`` span (the push added into its key's
accumulator, on the thread that sums: the peer's, or ``priority sum`` with server-side scheduling,
``priority sum I`` with several summing threads);
per completed round a ``send`` span (the sum's sends to every pusher, from issue until all have
completed: Gloo's sends have no future, so a watcher thread waits for them in issue order).

Clients, ``ps_clients`` (docs/DESIGN.md section 6):

- ``machine`` (the default, as BytePS): the workers of one machine first sum locally; only the
  machine's *leader* (its lowest rank) pushes the machine's sum and pulls the total, which it
  hands back to the machine's other workers. The servers see one pusher per machine: with 32
  workers on 8 machines, 8 pushes per partition, not 32. Local summing runs over this same
  group (point-to-point, matched by key as the servers do), so workers of a machine may also
  push in any order; the leader keeps one receiving thread per local worker and one thread that
  waits for the servers' sums and returns them.
- ``process``: every worker is a client of the servers (one push per worker per partition).

The pushers travel in the plan: the servers count and answer exactly those ranks.

No server (``LocalReduce``): a job whose workers are all on one machine runs as BytePS did with
one worker machine, a local reduce and broadcast: the ``machine`` protocol with no server
behind the leader (worker 0), whose sum of a key is then the total it sends back.

Server-side scheduling (a rule in the plan; BytePS's ``BYTEPS_SERVER_ENABLE_SCHEDULE=1``,
what the original's ``bytescheduler=1`` switched on): the receiving threads only take pushes
in; ``engine_threads`` summing threads (BytePS's ``BYTEPS_SERVER_ENGINE_THREAD``) sum them, a
key always on the same thread (the one with the fewest bytes so far at the key's first push,
as BytePS's server assigns its engine threads), each thread popping its pending pushes by the
rule (``ServerQueue``): ``fewest-pushes``, BytePS 0.2.x's, the key with the fewest pushes
received in its current round first (a round's last push zeroes its count), ties by arrival;
or ``lowest-key``, the suite's earlier rule, the lowest key first, ties by arrival. Without
scheduling a push is summed by the thread that received it, in arrival order.

Failure: a peer that dies closes its sockets, and the pending receive of whoever waits on it
fails at once. A server prints one line naming the worker and exits 1; a worker raises
``PSError`` naming the server, which the job entry turns into one line and exit 1. Every wait
on data has the job's ``--timeout``, so nothing hangs forever.

GPU workers stage each partition through a pinned host buffer (servers run on the CPU, as
BytePS's summation servers do).
"""
from __future__ import annotations

import datetime
import heapq
import json
from collections import deque
import os
import queue
import threading
from dataclasses import dataclass

import torch
import torch.distributed as dist

from ..errors import PSError, first_line, say
from ..planning import (DEFAULT_ENGINE_THREADS, DEFAULT_PS_PLACEMENT, PS_CLIENTS, SERVER_RULES,
                        Placer)
from ..timeline import COMM, COMPUTE, NULL, Timeline, now_us

# Message kinds, first word of a header.
OP_PUSH, OP_END, OP_STATS, OP_PLAN, OP_SHUTDOWN = range(5)
# Worker 0's questions to a server inside a session (the timeline's; replies on TAG_STATS).
OP_TIMELINE_ON, OP_TIMELINE_OFF, OP_EVENTS, OP_CLOCK = range(5, 9)
ASKING = frozenset({OP_STATS, OP_TIMELINE_ON, OP_TIMELINE_OFF, OP_EVENTS, OP_CLOCK})
# Tags (Gloo slots). Data of key k uses TAG_DATA + k; the headers of session s (a method's
# lifetime, counted alike by every process of the job from 0) use header_tag(s).
TAG_CONTROL, TAG_PLAN, TAG_STATS, TAG_PUSHERS = 1, 3, 4, 5
TAG_DATA = 16
HEADER_TAGS = 1 << 30
# Header receives a summer keeps posted per peer beyond one per key (worker 0's questions).
SPARE_HEADERS = 8


def header_tag(session: int) -> int:
    """The headers' tag in ``session``: each session has its own, so the header receives a
    summer still had posted when its peers ended one can never take the next one's messages."""
    return HEADER_TAGS + session

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


def plan(units: list[tuple[int, torch.dtype]], partition_bytes: int, nservers: int,
         placement: str = DEFAULT_PS_PLACEMENT) -> list[list[Partition]]:
    """Partitions of every unit ``(numel, dtype)``: consecutive slices of at most
    ``partition_bytes``, numbered in unit order, placed on the servers in key order by
    ``placement`` (``planning.PS_PLACEMENTS``: the least-loaded server by bytes, or
    ``key mod nservers``)."""
    cuts, key = [], 0
    for u, (numel, dtype) in enumerate(units):
        size = _element_size(dtype)
        step = partition_elements(partition_bytes, size)
        parts = []
        for start in range(0, max(numel, 1), step):
            end = min(numel, start + step)
            parts.append((key, u, start, end, (end - start) * size))
            key += 1
        cuts.append(parts)
    placer = Placer(nservers, placement)
    return [[Partition(k, u, a, b, placer.server(k, nbytes)) for k, u, a, b, nbytes in parts]
            for parts in cuts]


def _rule_code(schedule: str | None) -> int:
    """A server rule as the plan's control message carries it (0: no scheduling)."""
    if schedule is None:
        return 0
    if schedule not in SERVER_RULES:
        raise ValueError(f"unknown server rule {schedule!r} (one of {', '.join(SERVER_RULES)})")
    return 1 + SERVER_RULES.index(schedule)


def _element_size(dtype: torch.dtype) -> int:
    return torch.empty((), dtype=dtype).element_size()


def _rss() -> int:
    import psutil
    return psutil.Process().memory_info().rss


# ------------------------------------------------------------------------------- worker side

class Handle:
    """One partition's push and pull in flight (to a server, or to the machine's leader)."""

    def __init__(self, wait, peer: int, data: torch.Tensor, header, sends, recv, staging):
        # wait(work, peer, what): waits for a Gloo completion, a clear error otherwise
        self._waiter, self.peer, self.data = wait, peer, data
        self._header, self._sends, self._recv, self._staging = header, sends, recv, staging
        # A Gloo completion can be waited for once; a scheduler may ask from two threads.
        self._lock = threading.Lock()

    def wait_push(self) -> None:
        """The push was taken (credit can be returned)."""
        with self._lock:
            for w in self._sends:
                self._waiter(w, self.peer, "push")
            self._sends = []

    def wait(self) -> None:
        """The pulled sum is in ``data``."""
        self.wait_push()
        if self._recv is not None:
            self._waiter(self._recv, self.peer, "pull")
            self._recv = None
            if self._staging is not None:
                self.data.copy_(self._staging)


def _stage(staging: dict, key: int, data: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
    """What goes on the wire for ``data``: itself on the CPU, else a pinned host copy (kept per
    key and reused)."""
    if data.device.type == "cpu":
        return data, None
    buf = staging.get(key)
    if buf is None:
        buf = staging[key] = torch.empty(data.numel(), dtype=data.dtype, pin_memory=True)
    buf.copy_(data)
    return buf, buf


def _push_pull(key: int, data: torch.Tensor, staging: dict, lock, peer: int, wait, send,
               recv, header_tag: int) -> Handle:
    """Push ``data`` to ``peer`` (a server, or the machine's leader) as the protocol says, a
    header (on the session's ``header_tag``) then the data on the key's tag, and post the pull
    of the sum into the same memory; ``send``/``recv(tensor, tag)`` talk to ``peer``, ``wait``
    is the Handle's."""
    wire, staged = _stage(staging, key, data)
    header = torch.tensor([OP_PUSH, key], dtype=torch.int64)
    with lock:  # a header and its data leave together (pushes come from several threads)
        sends = [send(header, header_tag), send(wire, TAG_DATA + key)]
    return Handle(wait, peer, data, header, sends, recv(wire, TAG_DATA + key), staged)


class PSClient:
    """A worker's end of the parameter-server group."""

    clients = PS_CLIENTS[1]

    def __init__(self, pg, rank: int, nworkers: int, nservers: int, partition_bytes: int,
                 timeout_s: float, pushers: list[int] | None = None):
        self.pg = pg
        self.rank = rank
        self.nworkers = nworkers
        self.nservers = nservers
        # The worker ranks that push (every worker, or each machine's leader).
        self.pushers = list(range(nworkers)) if pushers is None else sorted(pushers)
        self.partition_bytes = int(partition_bytes)
        self.timeout = datetime.timedelta(seconds=timeout_s)
        self._staging: dict[int, torch.Tensor] = {}
        self._open = False
        self._push_lock = threading.Lock()
        self.session = -1           # sessions opened so far, less one: the current one
        self.clocks: list[tuple[float, float]] | None = None   # server_clocks' last answer

    @property
    def header_tag(self) -> int:
        return header_tag(self.session)

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
    def open(self, units: list[tuple[int, torch.dtype]], schedule: str | None = None,
             placement: str = DEFAULT_PS_PLACEMENT,
             engine_threads: int = DEFAULT_ENGINE_THREADS) -> list[list[Partition]]:
        """Start a session for these units, placed by ``placement``; worker 0 tells each
        server its keys (and ``schedule``, the rule by which its ``engine_threads`` summing
        threads serve pending pushes, ``SERVER_RULES``; None: in arrival order)."""
        if self._open:
            raise RuntimeError("a parameter-server session is already open on this worker")
        rule = _rule_code(schedule)
        parts = plan(units, self.partition_bytes, self.nservers, placement)
        self.session += 1
        if self.rank == 0:
            owned: list[list[list[int]]] = [[] for _ in range(self.nservers)]
            for u, unit_parts in enumerate(parts):
                code = _DTYPES.index(units[u][1])
                for p in unit_parts:
                    owned[p.server].append([p.key, p.numel, code])
            works = []
            pushers = torch.tensor(self.pushers, dtype=torch.int64)
            for s in range(self.nservers):
                ctrl = torch.tensor([OP_PLAN, len(owned[s]), len(self.pushers),
                                     rule, self.session, max(1, int(engine_threads))],
                                    dtype=torch.int64)
                works.append((s, self._send(ctrl, s, TAG_CONTROL), ctrl))
                works.append((s, self._send(pushers, s, TAG_PUSHERS), pushers))
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
        s = part.server
        return _push_pull(part.key, data, self._staging, self._push_lock, s, self._wait,
                          lambda t, tag: self._send(t, s, tag),
                          lambda t, tag: self._recv(t, s, tag), self.header_tag)

    def close(self) -> None:
        """End this worker's session on every server."""
        if not self._open:
            return
        self._open = False
        self._tell_all(OP_END, self.header_tag)

    def _tell_all(self, op: int, tag: int) -> None:
        msgs = [torch.tensor([op, -1], dtype=torch.int64) for _ in range(self.nservers)]
        works = [(s, self._send(m, s, tag)) for s, m in enumerate(msgs)]
        for s, w in works:
            self._wait(w, s, "message")

    def _ask(self, server: int, op: int, reply: torch.Tensor, what: str) -> torch.Tensor:
        """Worker 0 asks a server something inside a session: the answer, in ``reply``."""
        req = torch.tensor([op, -1], dtype=torch.int64)
        w1 = self._send(req, server, self.header_tag)
        w2 = self._recv(reply, server, TAG_STATS)
        self._wait(w1, server, f"{what} request")
        self._wait(w2, server, what)
        return reply

    def server_stats(self) -> list[dict]:
        """Each server's memory and traffic so far (worker 0, inside a session)."""
        out = []
        for s in range(self.nservers):
            reply = self._ask(s, OP_STATS, torch.zeros(6, dtype=torch.int64), "stats")
            rss, peak, received, sent, start, pushes = (int(x) for x in reply)
            out.append({"server": s, "rank": self.server_rank(s), "rss_bytes": rss,
                        "rss_bytes_at_start": start, "peak_rss_bytes": peak,
                        "bytes_received": received, "bytes_sent": sent,
                        "pushes_received": pushes, "pushers": len(self.pushers)})
        return out

    # -- the servers' timeline (worker 0, inside a session) -------------------------------------
    def timeline_on(self) -> None:
        """Every server starts recording (a fresh event list); returns once they all do."""
        for s in range(self.nservers):
            self._ask(s, OP_TIMELINE_ON, torch.zeros(1, dtype=torch.int64), "timeline start")

    def timeline_off(self) -> None:
        """Every server stops recording (its events are kept until the next start)."""
        for s in range(self.nservers):
            self._ask(s, OP_TIMELINE_OFF, torch.zeros(1, dtype=torch.int64), "timeline stop")

    def server_clocks(self, rounds: int = 7) -> list[tuple[float, float]]:
        """Each server's clock minus this worker's, in microseconds, and its uncertainty, NTP
        style: ``rounds`` ping-pongs (t0, the server's reading ts, t1); of the round with the
        shortest round trip, offset ts - (t0 + t1) / 2 and uncertainty (t1 - t0) / 2."""
        out = []
        for s in range(self.nservers):
            best = None
            for _ in range(max(1, rounds)):
                req = torch.tensor([OP_CLOCK, -1], dtype=torch.int64)
                reply = torch.zeros(1, dtype=torch.float64)
                t0 = now_us()
                w2 = self._recv(reply, s, TAG_STATS)
                w1 = self._send(req, s, self.header_tag)
                self._wait(w1, s, "clock request")
                self._wait(w2, s, "clock")
                t1 = now_us()
                if best is None or t1 - t0 < best[0]:
                    best = (t1 - t0, float(reply[0]) - (t0 + t1) / 2)
            out.append((best[1], best[0] / 2))
        self.clocks = out
        return out

    def server_events(self) -> list[dict]:
        """Each server's recorded events, in the recorder's tuple form on its own clock, with
        its clock offset to this worker's (``server_clocks``' last measure, taken now if
        none): ``{"rank", "name", "events", "offset_us", "uncertainty_us"}``, what
        ``timeline.trace`` merges."""
        clocks = self.clocks or self.server_clocks()
        out = []
        for s in range(self.nservers):
            n = int(self._ask(s, OP_EVENTS, torch.zeros(1, dtype=torch.int64), "events")[0])
            events = []
            if n:
                buf = torch.empty(n, dtype=torch.uint8)
                self._wait(self._recv(buf, s, TAG_STATS), s, "events")
                events = [tuple(e) for e in json.loads(buf.numpy().tobytes())]
            out.append({"rank": self.server_rank(s), "name": f"server {s} (rank "
                        f"{self.server_rank(s)})", "events": events,
                        "offset_us": clocks[s][0], "uncertainty_us": clocks[s][1]})
        return out

    def shutdown(self) -> None:
        """Worker 0: tell every server the job is over."""
        self.close()
        if self.rank == 0:
            self._tell_all(OP_SHUTDOWN, TAG_CONTROL)


# ---------------------------------------------------------------------- what summers share

class _Round:
    """One round of a key on a machine's leader: its own data, the push to the servers, the
    sum back."""

    def __init__(self):
        self.own: torch.Tensor | None = None
        self.server: Handle | None = None
        self.forwarded = threading.Event()
        self.done = threading.Event()


class _Key:
    def __init__(self, numel: int, dtype: torch.dtype):
        self.acc = torch.empty(numel, dtype=dtype)
        self.count = 0
        self.sends: list = []   # (peer, work): the last round's sum, sent from acc
        self.lock = threading.Lock()
        self.round = _Round()


class _Summer:
    """What a summation server and a machine's leader share: one receiving thread per peer
    that pushes to it, each push added into its key's accumulator, the round's last push
    completing it. A failure ends the process with one line (threads blocked in receives
    cannot be interrupted; the peers see their connections close)."""

    timeline: Timeline = NULL   # a server's own recorder (NULL: never records)

    def __init__(self, pg, timeout_s: float, who: str):
        self.pg = pg
        self.who = who
        self.timeout = datetime.timedelta(seconds=timeout_s)
        self.bytes_received = 0
        self.bytes_sent = 0
        self.pushes = 0
        self._count_lock = threading.Lock()
        self._send_order = threading.Lock()   # recorded sends: issue order = watcher's order
        self._watched: "queue.Queue | None" = None

    def _die(self, message: str) -> None:
        say(f"ddlbench: {self.who}: {message}")
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

    def _post(self, tensor, peer: int, tag: int, what: str):
        """Post a receive from ``peer``: its work (a refusal ends the process)."""
        try:
            return self.pg.recv([tensor], peer, tag)
        except Exception as e:
            self._die(f"{what} from worker {peer} failed: {first_line(e)}")

    def _recv(self, tensor, peer: int, tag: int, what: str, timeout=None) -> None:
        """Receive from ``peer`` and wait; a dead peer or the timeout ends the process."""
        self._wait(self._post(tensor, peer, tag, what), peer, what, timeout)

    def _add(self, key: int, k: _Key, data: torch.Tensor, expected: int, own=None,
             added=None):
        """Add one push into the key's accumulator: (whether it completed the round, the
        round). The first push of a round copies, once the previous round's sums have left
        (a peer pushes again only after pulling, so they are on their way). ``own``: a
        leader's own tensor, where the round's total goes. ``added()``: called under the key's
        lock once the addition ended (so before the round's sum can be sent). The push is
        counted under the key's lock too: once a pusher has the round's sum, every push of the
        round is in the counters (worker 0 asks them right after its last pull)."""
        with k.lock:
            if k.count == 0:
                for peer, work in k.sends:
                    self._wait(work, peer, f"pull of key {key}")
                k.sends = []
                k.round = _Round()
                k.acc.copy_(data)
            else:
                k.acc.add_(data)
            k.count += 1
            rnd = k.round
            if own is not None:
                rnd.own = own
            complete = k.count == expected
            if complete:
                k.count = 0
            if added is not None:
                added()
            with self._count_lock:
                self.pushes += 1
                self.bytes_received += data.numel() * data.element_size()
        return complete, rnd

    def _send_sum(self, key: int, k: _Key, peers: list[int]) -> None:
        """Send the key's sum to ``peers``; a push of the next round waits for these sends.
        (Counted before they go: a pusher may have its sum and worker 0 ask before this thread
        runs again.)"""
        with self._count_lock:
            self.bytes_sent += k.acc.numel() * k.acc.element_size() * len(peers)
        tl = self.timeline
        if tl.enabled:
            self._send_recorded(tl, key, k, peers)
        else:
            with k.lock:
                k.sends = [(peer, self._send(k.acc, peer, TAG_DATA + key)) for peer in peers]

    # -- recording (a server's timeline, while on) ----------------------------------------------
    def _summed(self, tl: Timeline, row: str, key: int, k: _Key, data: torch.Tensor,
                expected: int, peer: int):
        """``_add`` as a ``sum`` span on ``row`` (the thread that sums), recorded under the
        key's lock: before the round's sum can be sent, so before a pusher can have it (and
        worker 0 stop the timeline), and with the end the lock saw (a thread descheduled after
        releasing the lock must not make its sum look later than the send it allowed)."""
        t0 = now_us()
        return self._add(key, k, data, expected, added=lambda: tl.events.append(
            ("sum", COMPUTE, row, t0, now_us(), {"key": key, "peer": peer})))

    def _send_recorded(self, tl: Timeline, key: int, k: _Key, peers: list[int]) -> None:
        """``_send_sum`` as one ``send`` span from the sends' issue until all completed. Gloo's
        sends have no future, so the watcher thread waits for them (in issue order: sends to a
        peer complete in order), closing the span; the next round's first push waits for the
        watcher instead of the sends (a Gloo completion can be waited for once)."""
        nbytes = k.acc.numel() * k.acc.element_size()
        with self._send_order:
            if self._watched is None:
                self._watch()
            with k.lock:
                # stamped before the sends go: a peer may have its sum (and a worker its
                # iteration over) before this thread gets to the next line
                t0 = now_us()
                works = [(peer, self._send(k.acc, peer, TAG_DATA + key)) for peer in peers]
                span = tl.comm("send", _Sends(self, key, works), "send", start_us=t0, key=key,
                               bytes=nbytes, peers=list(peers))
                sent = _Sent(span)
                k.sends = [(peer, sent) for peer in peers[:1]]
            self._watched.put(sent)

    def _watch(self) -> None:
        """Start the thread that waits for recorded sends (once)."""
        if self._watched is None:
            self._watched = queue.Queue()
            threading.Thread(target=self._watching, name="ps-sends", daemon=True).start()

    def _watching(self) -> None:
        try:
            while True:
                sent = self._watched.get()
                sent.span.wait(self.timeout)     # (a failed send ends the process)
                sent.done.set()
                self._watched.task_done()
        except SystemExit:
            raise
        except BaseException as e:
            self._die(f"waiting for sends: {type(e).__name__}: {first_line(e)}")

    def _serve_peer(self, peer: int, keys: dict[int, _Key], expected: int, on_complete,
                    session: int, on_ask=None, scheduler=None) -> None:
        """Receive ``peer``'s pushes until it ends the session; sum each one here, or hand it
        to the ``scheduler`` (server-side scheduling: a ``PrioritySummer``). ``on_ask(peer,
        op)`` answers worker 0's questions (``ASKING``)."""
        try:
            inbox = _Inbox(self, peer, keys, session)
            tl, row = self.timeline, f"receive from worker {peer}"
            while True:
                op, key = inbox.header()
                if op == OP_END:
                    return inbox.end()
                if op in ASKING and on_ask is not None:
                    on_ask(peer, op)
                    continue
                if op != OP_PUSH or key not in keys:
                    self._die(f"protocol error: message {op} for key {key} from worker {peer}")
                k = keys[key]
                t0 = now_us() if tl.enabled else None   # the header's arrival
                data = inbox.data(key)
                if t0 is not None:
                    _received(tl, row, t0, key, data, peer)
                if scheduler is not None:   # it keeps the data until it has summed it
                    scheduler.put(peer, key, data)
                    continue
                if t0 is None:
                    complete, rnd = self._add(key, k, data, expected)
                else:
                    complete, rnd = self._summed(tl, row, key, k, data, expected, peer)
                if complete:
                    on_complete(key, k, rnd)
        except SystemExit:
            raise
        except BaseException as e:  # anything unexpected ends the process, with its reason
            self._die(f"serving worker {peer}: {type(e).__name__}: {first_line(e)}")

    def _serve_all(self, peers: list[int], keys: dict[int, _Key], expected: int, on_complete,
                   session: int, on_ask=None, scheduler=None) -> list[threading.Thread]:
        threads = []
        for peer in peers:
            t = threading.Thread(target=self._serve_peer,
                                 args=(peer, keys, expected, on_complete, session, on_ask,
                                       scheduler),
                                 name=f"ps-peer-{peer}", daemon=True)
            t.start()
            threads.append(t)
        return threads

    def _drain(self, keys: dict[int, _Key]) -> None:
        for key, k in keys.items():
            for peer, work in k.sends:
                self._wait(work, peer, f"pull of key {key}")
            k.sends = []


class _Inbox:
    """The receives a summer keeps posted for one pushing peer, so that the peer's sends never
    wait for them. Gloo sends a message only once its receiver has posted the receive (a
    notice travels back to the sender first); a receive posted only when the previous message
    had arrived made each push wait for that notice, and on a link busy with the sums going
    back the notice queues behind them: pushes and pulls took turns instead of overlapping.

    - *Headers*: one receive per key plus ``SPARE_HEADERS`` posted at the start, each posted
      again as soon as its header was read: a peer's headers of a whole round find theirs
      posted (those left when the peer ends the session stay posted on that session's tag,
      which no later message uses).
    - *Data*: a peer pushes every key once a round. The round's first header posts the
      receives of all keys, each into the peer's buffer for the key (which, with server-side
      scheduling, the priority summer keeps until it has summed it): from then on the peer's pushes
      flow without waiting. A buffer is free again by then: the peer pushes again only after
      pulling every sum of the round.
    """

    def __init__(self, summer: "_Summer", peer: int, keys: dict[int, _Key], session: int):
        self.summer, self.peer, self.keys = summer, peer, keys
        self.tag = header_tag(session)
        self.ring = [torch.zeros(2, dtype=torch.int64)
                     for _ in range(len(keys) + SPARE_HEADERS)]
        self.works = [summer._post(h, peer, self.tag, "message") for h in self.ring]
        self.next = 0
        self.buffers: dict[int, torch.Tensor] = {}
        self.posted: dict[int, object] = {}   # key -> the receive of this round's push

    def header(self) -> tuple[int, int]:
        """The next message's header (waits as long as the peer is alive)."""
        i = self.next
        self.summer._wait(self.works[i], self.peer, "message", _IDLE)
        op, key = (int(x) for x in self.ring[i])
        if op != OP_END:
            self.works[i] = self.summer._post(self.ring[i], self.peer, self.tag, "message")
        self.next = (i + 1) % len(self.ring)
        return op, key

    def _buffer(self, key: int) -> torch.Tensor:
        buf = self.buffers.get(key)
        if buf is None:
            buf = self.buffers[key] = torch.empty_like(self.keys[key].acc)
        return buf

    def data(self, key: int) -> torch.Tensor:
        """The push of ``key`` this round, received."""
        if not self.posted:
            for k in self.keys:
                self.posted[k] = self.summer._post(self._buffer(k), self.peer, TAG_DATA + k,
                                                   f"push of key {k}")
        work = self.posted.pop(key, None)
        if work is None:
            self.summer._die(f"protocol error: worker {self.peer} pushed key {key} twice in "
                             f"one round")
        self.summer._wait(work, self.peer, f"push of key {key}")
        return self._buffer(key)

    def end(self) -> None:
        if self.posted:   # (their tags are the next session's too)
            self.summer._die(f"protocol error: worker {self.peer} ended the session with "
                             f"{len(self.posted)} key(s) of its round not pushed")


def _received(tl: Timeline, row: str, t0: float, key: int, data: torch.Tensor,
              peer: int) -> None:
    """A ``receive`` span: from the header's arrival (``t0``) to the data's (now)."""
    tl.events.append(("receive", COMM, row, t0, now_us(),
                      {"key": key, "bytes": data.numel() * data.element_size(), "peer": peer}))


class _Sends:
    """A round's sends to its pushers as one work (no future: the timeline closes its span
    when it is waited for)."""

    def __init__(self, summer: _Summer, key: int, works: list):
        self.summer, self.key, self.works = summer, key, works

    def wait(self, timeout=None) -> None:
        for peer, work in self.works:
            self.summer._wait(work, peer, f"pull of key {self.key}", timeout)


class _Sent:
    """A recorded round's sends as ``k.sends`` holds them: done once the watcher saw them
    complete."""

    def __init__(self, span):
        self.span = span
        self.done = threading.Event()

    def wait(self, timeout=None) -> None:
        seconds = None if timeout is None else timeout.total_seconds()
        if not self.done.wait(seconds):
            raise TimeoutError("the sum's sends did not complete")


# ------------------------------------------------------------------------------- server side

SERVED_KEPT = 1 << 16


class ServerQueue:
    """One summing thread's pending pushes, popped by ``rule`` (``SERVER_RULES``; facts of
    BytePS 0.2.x's ``server/queue.h`` with the suite's heap fix, docs/DESIGN.md section 6):

    - ``fewest-pushes``: each key counts the pushes received in its current round (a push
      raises the count when it is queued; the round's ``expected``-th push zeroes it, as
      BytePS's ``ClearCounter``); the pending push of the key with the lowest count comes
      first, ties by arrival (a key's own pushes in arrival order);
    - ``lowest-key``: the pending push of the lowest key first, ties by arrival.

    Not thread-safe: its owner locks. ``put(key, item)``, ``pop() -> (key, item)``, each
    O(log n) (BytePS's is a heap too): a heap of (rank, version, key) with one live entry per
    waiting key, pushed again whenever the key's rank changes; stale entries are skipped."""

    def __init__(self, rule: str, expected: int):
        if rule not in SERVER_RULES:
            raise ValueError(f"unknown server rule {rule!r}")
        self.rule, self.expected = rule, int(expected)
        self.count: dict[int, int] = {}
        self.waiting: dict[int, deque] = {}     # key -> its pending (arrival, item)
        self.arrivals = 0
        self._heap: list = []                   # (rank, version, key); live: version current
        self._version: dict[int, int] = {}

    def __len__(self) -> int:
        return sum(len(q) for q in self.waiting.values())

    def _rank(self, key: int) -> tuple:
        head = self.waiting[key][0][0]
        return (self.count.get(key, 0), head) if self.rule == SERVER_RULES[0] else (key, head)

    def _rerank(self, key: int) -> None:
        v = self._version[key] = self._version.get(key, 0) + 1
        heapq.heappush(self._heap, (self._rank(key), v, key))

    def put(self, key: int, item) -> None:
        n = self.count.get(key, 0) + 1
        self.count[key] = 0 if n >= self.expected else n
        self.waiting.setdefault(key, deque()).append((self.arrivals, item))
        self.arrivals += 1
        self._rerank(key)

    def pop(self):
        while True:
            _, v, key = heapq.heappop(self._heap)   # IndexError when empty, as min() raised
            if key in self.waiting and self._version[key] == v:
                break
        q = self.waiting[key]
        _, item = q.popleft()
        if q:
            self._rerank(key)
        else:
            del self.waiting[key]
            if not self.waiting:
                self._heap.clear()     # every entry left is stale
        return key, item


class PrioritySummer:
    """Server-side scheduling: pending pushes summed by ``threads`` summing threads (BytePS's
    engine threads), each popping its own ``ServerQueue`` by ``rule``. A key is summed always
    by one thread, the one with the fewest bytes so far at the key's first push (as BytePS's
    server assigns its engine threads), so a key's pushes are summed in its queue's order.
    ``served`` lists the (key, peer) of the last ``SERVED_KEPT`` pushes in the order they were
    popped."""

    def __init__(self, summer: "_Summer", keys: dict[int, _Key], expected: int, on_complete,
                 rule: str = SERVER_RULES[0], threads: int = 1):
        self.summer, self.keys, self.expected, self.on_complete = (summer, keys, expected,
                                                                   on_complete)
        self.rule, self.nthreads = rule, max(1, int(threads))
        self.served: deque = deque(maxlen=SERVED_KEPT)
        self._queues = [ServerQueue(rule, expected) for _ in range(self.nthreads)]
        self._load = [0] * self.nthreads
        self._thread_of: dict[int, int] = {}
        self._done = False
        self._cv = threading.Lock()            # guards the queues; each thread waits on its own
        self._wake = [threading.Condition(self._cv) for _ in range(self.nthreads)]
        self._threads = [threading.Thread(target=self._run, args=(i,), daemon=True,
                                          name=f"ps-priority-sum-{i}")
                         for i in range(self.nthreads)]
        for t in self._threads:
            t.start()

    def pending(self) -> int:
        with self._cv:
            return sum(len(q) for q in self._queues)

    def put(self, peer: int, key: int, data: torch.Tensor) -> None:
        with self._cv:
            i = self._thread_of.get(key)
            if i is None:
                i = self._thread_of[key] = min(range(self.nthreads),
                                               key=lambda j: (self._load[j], j))
                self._load[i] += data.numel() * data.element_size()
            self._queues[i].put(key, (peer, data))
            self._wake[i].notify()

    def _next(self, i: int):
        """Thread ``i``'s next push to sum, (key, peer, data); None once finished and empty."""
        q = self._queues[i]
        with self._cv:
            while not len(q) and not self._done:
                self._wake[i].wait()
            if not len(q):
                return None
            key, (peer, data) = q.pop()
            self.served.append((key, peer))
        return key, peer, data

    def _run(self, i: int) -> None:
        row = "priority sum" if self.nthreads == 1 else f"priority sum {i}"
        try:
            while True:
                item = self._next(i)
                if item is None:
                    return
                key, peer, data = item
                tl = self.summer.timeline
                if tl.enabled:
                    complete, rnd = self.summer._summed(tl, row, key, self.keys[key], data,
                                                        self.expected, peer)
                else:
                    complete, rnd = self.summer._add(key, self.keys[key], data, self.expected)
                if complete:
                    self.on_complete(key, self.keys[key], rnd)
        except SystemExit:
            raise
        except BaseException as e:
            self.summer._die(f"priority summer: {type(e).__name__}: {first_line(e)}")

    def finish(self) -> None:
        """Every receiving thread has ended: sum what is pending, then stop."""
        with self._cv:
            self._done = True
            for wake in self._wake:
                wake.notify()
        for t in self._threads:
            t.join()


class Server(_Summer):
    """One summation server: ``run()`` serves sessions until worker 0 shuts the job down."""

    def __init__(self, pg, rank: int, nworkers: int, nservers: int, timeout_s: float):
        self.rank = rank
        self.index = rank - nworkers
        super().__init__(pg, timeout_s, f"parameter server {self.index} (rank {rank})")
        self.nworkers = nworkers
        self.nservers = nservers
        self.scheduler: PrioritySummer | None = None   # the session's, with server-side scheduling
        self.rss_at_start = _rss()  # before any buffer: what the summing itself adds is above
        # Off until worker 0 turns it on (--timeline PATH: the timed rounds).
        self.timeline = Timeline(rank)

    @property
    def served(self):
        """The (key, peer) of the pushes the priority summer summed, in order (None without
        server-side scheduling)."""
        return self.scheduler.served if self.scheduler else None

    def run(self) -> int:
        torch.set_num_threads(1)
        while True:
            ctrl = torch.zeros(6, dtype=torch.int64)
            self._recv(ctrl, 0, TAG_CONTROL, "control message", _IDLE)
            op, n, npushers, rule, session, threads = (int(x) for x in ctrl)
            if op == OP_SHUTDOWN:
                return 0
            if op != OP_PLAN or not 1 <= npushers <= self.nworkers or not (
                    0 <= rule <= len(SERVER_RULES)):
                self._die(f"protocol error: control message {op} from worker 0")
            pushers = torch.zeros(npushers, dtype=torch.int64)
            self._recv(pushers, 0, TAG_PUSHERS, "plan")
            table = torch.zeros((n, 3), dtype=torch.int64)
            if n:
                self._recv(table, 0, TAG_PLAN, "plan")
            keys = {int(k): _Key(int(numel), _DTYPES[int(code)]) for k, numel, code in table}
            schedule = SERVER_RULES[rule - 1] if rule else None
            self._session(keys, [int(p) for p in pushers], schedule, session, threads)

    def _session(self, keys: dict[int, _Key], pushers: list[int], schedule: str | None = None,
                 session: int = 0, threads: int = 1) -> None:
        """Every pusher's pushes of every key summed; each round's sum sent to every pusher.
        With ``schedule`` (a rule of ``SERVER_RULES``) the sums are made by ``threads``
        summing threads, pending pushes in the rule's order (``PrioritySummer``)."""
        def complete(key, k, _round):
            self._send_sum(key, k, pushers)

        self.scheduler = scheduler = (PrioritySummer(self, keys, len(pushers), complete,
                                                     schedule, threads)
                                      if schedule else None)
        for t in self._serve_all(pushers, keys, len(pushers), complete, session, self._answer,
                                 scheduler):
            t.join()
        if scheduler:
            scheduler.finish()
        self._drain(keys)

    def _answer(self, peer: int, op: int) -> None:
        """Worker 0's question ``op`` (``ASKING``), answered on ``TAG_STATS``."""
        if op == OP_STATS:
            return self._send_stats(peer)
        tl = self.timeline
        if op == OP_CLOCK:
            reply = torch.tensor([now_us()], dtype=torch.float64)
        elif op == OP_TIMELINE_ON:
            self._watch()
            tl.start()
            reply = torch.zeros(1, dtype=torch.int64)
        elif op == OP_TIMELINE_OFF:
            tl.stop()
            # every send recorded so far closes its span (the pushers pull what they pushed,
            # so they complete), so that the events asked next are whole
            if self._watched is not None:
                self._watched.join()
            reply = torch.tensor([len(tl.events)], dtype=torch.int64)
        else:   # OP_EVENTS: the length, then the JSON list as bytes (none when empty)
            text = json.dumps(list(tl.events)).encode() if tl.events else b""
            reply = torch.tensor([len(text)], dtype=torch.int64)
            works = [self._send(reply, peer, TAG_STATS)]
            if text:
                payload = torch.frombuffer(bytearray(text), dtype=torch.uint8)
                works.append(self._send(payload, peer, TAG_STATS))
            for w in works:
                self._wait(w, peer, "events")
            return
        self._wait(self._send(reply, peer, TAG_STATS), peer, "reply")

    def _send_stats(self, w: int) -> None:
        import resource
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
        with self._count_lock:
            reply = torch.tensor([_rss(), peak, self.bytes_received, self.bytes_sent,
                                  self.rss_at_start, self.pushes], dtype=torch.int64)
        self._wait(self._send(reply, w, TAG_STATS), w, "stats")


# ------------------------------------------------------------------------ one client per machine

class MachineClient(_Summer):
    """``ps_clients=machine``: a worker's end when the workers of a machine push as one.

    ``members`` are the worker ranks of this machine; the lowest is the leader, which holds
    ``client`` (its ``PSClient``: it alone pushes to and pulls from the servers). The other
    workers push to the leader and pull the total from it, with the servers' protocol (header,
    then data on the key's tag). The leader adds its own data and its workers' pushes into one
    accumulator per key; the round's last contribution pushes the machine's sum to the server
    (from whichever thread brought it), and a returning thread waits for each pull, copies the
    total into the leader's own data and sends it to the machine's other workers.
    """
    clients = PS_CLIENTS[0]
    has_servers = True   # (LocalReduce: none; the machine's sum is the total)

    def __init__(self, pg, rank: int, members: list[int], client: PSClient | None,
                 nservers: int, partition_bytes: int, timeout_s: float):
        super().__init__(pg, timeout_s, f"worker {rank}")
        self.rank = rank
        self.members = sorted(members)
        self.leader = self.members[0]
        self.is_leader = rank == self.leader
        if self.has_servers and self.is_leader != (client is not None):
            raise ValueError("the machine's leader, and only it, holds the servers' client")
        self.client = client
        self.nservers = nservers
        self.partition_bytes = int(partition_bytes)
        self._staging: dict[int, torch.Tensor] = {}
        self._push_lock = threading.Lock()
        self._open = False
        self.session = -1           # as PSClient's (the machine's pushes use its tags)

    def _die(self, message: str) -> None:
        say(f"ddlbench: worker {self.rank}: error: {message} (as its machine's leader)")
        os._exit(1)

    @property
    def pushers(self) -> list[int] | None:
        return self.client.pushers if self.client is not None else None

    # -- errors on a worker -------------------------------------------------------------------
    def _leader_wait(self, work, peer: int, what: str) -> None:
        try:
            work.wait(self.timeout)
        except Exception as e:
            raise PSError(f"{what} to/from worker {peer}, this machine's leader, failed: "
                          f"{first_line(e)} (it, or a process it waited for, stopped)"
                          ) from None

    def _to_leader(self, op):
        """``op(tensor, tag)`` with the leader (Gloo's send or recv); a refusal is a PSError
        naming it."""
        def call(tensor, tag):
            try:
                return op([tensor], self.leader, tag)
            except Exception as e:
                raise PSError(f"cannot reach worker {self.leader}, this machine's leader: "
                              f"{first_line(e)}") from None
        return call

    def _event(self, event: threading.Event, key: int, what: str) -> None:
        if not event.wait(self.timeout.total_seconds()):
            raise PSError(f"no {what} of key {key} within {self.timeout.total_seconds():g} s "
                          f"(a worker of this machine or a server is stuck)")

    # -- sessions -------------------------------------------------------------------------------
    def open(self, units: list[tuple[int, torch.dtype]], schedule: str | None = None,
             placement: str = DEFAULT_PS_PLACEMENT,
             engine_threads: int = DEFAULT_ENGINE_THREADS) -> list[list[Partition]]:
        if self._open:
            raise RuntimeError("a parameter-server session is already open on this worker")
        self._open = True
        self._staging.clear()
        self.session += 1
        if not self.is_leader:
            return plan(units, self.partition_bytes, max(1, self.nservers), placement)
        parts = self._open_servers(units, schedule, placement, engine_threads)
        self._parts = {p.key: p for unit in parts for p in unit}
        self._keys = {p.key: _Key(p.numel, units[p.unit][1]) for p in self._parts.values()}
        self._pulls: "queue.Queue" = queue.Queue()
        self._threads = self._serve_all(self.members[1:], self._keys, len(self.members),
                                        self._forward, self.session)
        self._returner = threading.Thread(target=self._return_sums, name="ps-machine-return",
                                          daemon=True)
        self._returner.start()
        return parts

    def _open_servers(self, units, schedule, placement, engine_threads) -> list[list[Partition]]:
        """The leader opens the session on the servers: the partitions."""
        return self.client.open(units, schedule, placement, engine_threads)

    def push_pull(self, part: Partition, data: torch.Tensor):
        if not self.is_leader:
            return _push_pull(part.key, data, self._staging, self._push_lock, self.leader,
                              self._leader_wait, self._to_leader(self.pg.send),
                              self._to_leader(self.pg.recv), header_tag(self.session))
        wire, _ = _stage(self._staging, part.key, data)
        k = self._keys[part.key]
        complete, rnd = self._add(part.key, k, wire, len(self.members), own=data)
        if complete:
            self._forward(part.key, k, rnd)
        return _LeaderHandle(self, part.key, rnd)

    def _forward(self, key: int, k: _Key, rnd: _Round) -> None:
        """The machine's sum of this round is complete: push it (the pull lands in place)."""
        rnd.server = self.client.push_pull(self._parts[key], k.acc)
        rnd.forwarded.set()
        self._pulls.put((key, k, rnd))

    def _return_sums(self) -> None:
        try:
            while True:
                item = self._pulls.get()
                if item is None:
                    return
                key, k, rnd = item
                if rnd.server is not None:
                    rnd.server.wait()
                rnd.own.copy_(k.acc)  # (the round completed: the leader's own push is in it)
                self._send_sum(key, k, self.members[1:])
                rnd.done.set()
        except PSError as e:
            self._die(str(e))
        except BaseException as e:
            self._die(f"returning sums: {type(e).__name__}: {first_line(e)}")

    def close(self) -> None:
        if not self._open:
            return
        self._open = False
        if not self.is_leader:
            end = torch.tensor([OP_END, -1], dtype=torch.int64)
            try:
                work = self.pg.send([end], self.leader, header_tag(self.session))
            except Exception as e:
                raise PSError(f"cannot reach worker {self.leader}, this machine's leader: "
                              f"{first_line(e)}") from None
            self._leader_wait(work, self.leader, "end of session")
            return
        for t in self._threads:
            t.join()
        self._pulls.put(None)
        self._returner.join()
        self._drain(self._keys)
        self._close_servers()

    def _close_servers(self) -> None:
        self.client.close()

    def server_stats(self) -> list[dict]:
        return self.client.server_stats()

    # The servers' timeline: worker 0 (always a leader) asks through its client.
    def timeline_on(self) -> None:
        self.client.timeline_on()

    def timeline_off(self) -> None:
        self.client.timeline_off()

    def server_clocks(self, rounds: int = 7) -> list[tuple[float, float]]:
        return self.client.server_clocks(rounds)

    def server_events(self) -> list[dict]:
        return self.client.server_events()

    def shutdown(self) -> None:
        self.close()
        if self.client is not None:
            self.client.shutdown()


class LocalReduce(MachineClient):
    """A PS job whose workers are all on one machine, as BytePS ran it with one worker machine:
    no server, a local reduce and broadcast. Worker 0, the machine's leader, sums every
    worker's push of a key (matched by key, as a server does: the workers push in any order)
    and sends the total back to the others; every worker then holds the sum, which the
    methods divide by the number of workers as after a pull. The methods are unchanged: the
    partitions are planned as for one server (``Partition.server`` 0 is the leader). Nothing
    is asked of servers: no statistics, clocks or timeline events."""
    has_servers = False
    nservers = 0

    def __init__(self, pg, rank: int, nworkers: int, partition_bytes: int, timeout_s: float):
        super().__init__(pg, rank, list(range(nworkers)), None, 0, partition_bytes, timeout_s)

    @property
    def pushers(self) -> list[int]:
        return []   # nobody pushes to a server

    def _open_servers(self, units, schedule, placement, engine_threads) -> list[list[Partition]]:
        return plan(units, self.partition_bytes, 1)   # (schedule: there is no server)

    def _forward(self, key: int, k: _Key, rnd: _Round) -> None:
        """The machine's sum is the total: hand it to the returning thread."""
        rnd.server = None
        rnd.forwarded.set()
        self._pulls.put((key, k, rnd))

    def _close_servers(self) -> None:
        pass

    def server_stats(self) -> list[dict]:
        return []

    def timeline_on(self) -> None:
        pass

    def timeline_off(self) -> None:
        pass

    def server_clocks(self, rounds: int = 7) -> list[tuple[float, float]]:
        return []

    def server_events(self) -> list[dict]:
        return []

    def shutdown(self) -> None:
        self.close()


class _LeaderHandle:
    """The leader's own push: taken once the machine's sum went to the server, done once the
    total is back in its data."""

    def __init__(self, owner: MachineClient, key: int, rnd: _Round):
        self.owner, self.key, self.rnd = owner, key, rnd

    def wait_push(self) -> None:
        self.owner._event(self.rnd.forwarded, self.key, "push to the servers")
        if self.rnd.server is not None:
            self.rnd.server.wait_push()

    def wait(self) -> None:
        self.owner._event(self.rnd.done, self.key, "sum from the servers")


def machines(ids: list[str]) -> list[list[int]]:
    """Ranks grouped by machine id, machines in order of their first rank."""
    groups: dict[str, list[int]] = {}
    for rank, name in enumerate(ids):
        groups.setdefault(name, []).append(rank)
    return list(groups.values())


def connect(store, rank: int, world_size: int, timeout_s: float):
    """The push/pull process group over all ``W + S`` processes (Gloo, CPU tensors)."""
    return dist.ProcessGroupGloo(dist.PrefixStore("ddlbench-ps/", store), rank, world_size,
                                 datetime.timedelta(seconds=timeout_s))

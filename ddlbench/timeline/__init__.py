"""Where iteration time goes: a per-rank recorder of what ran when, the overlap metrics read from
it, and the merged Chrome trace of ``--timeline PATH`` (docs/DESIGN.md section 8). Pure: no torch;
the job's side (clock offsets, gathering the ranks) is ``ddlbench.measure.overlap``.

**Recording.** Each worker holds one ``Timeline``. It is on for the timed rounds only (all of
them, or the first ``--timeline-iters N`` iterations) and keeps its events in memory, as tuples
``(name, cat, thread, start_us, end_us, args)`` on this rank's ``time.perf_counter`` clock; an
instant has ``end_us None``. Categories:

- ``iteration``: one training step (forward, backward, ``step()``, ``zero_grad()``), its index
  in ``args``; and ``round``: a timing round's closing ``synchronize()``;
- ``compute`` on the training thread: ``forward``, ``backward``, ``optimizer`` (the optimizer's
  own ``step``, through its step hooks, wherever a method calls it);
- ``wait`` on the training thread: ``step`` (the method's ``step()``; its optimizer update inside
  is compute again), ``synchronize``, and waits a method imposes inside compute (ByteScheduler's
  forward pre-hook);
- ``comm``: a collective or a push/pull, from the moment it is handed to the transport until it
  completes, on a thread row per kind of operation. With a trace file a callback on its future
  stamps the completion; otherwise (the counters every benchmark keeps) the completion is
  *discovered*, as NCCL's watchdog discovers it for its flight recorder (a Python callback
  per collective costs the transport's thread the GIL: about 40 us a collective on this machine,
  more than the rest of the recording together): the recorder asks the works in flight
  (``is_completed``, in issue order) whenever it records anything and when one is waited for, so
  a span ends at the first event after its completion (at the latest when it is waited for; the
  span's ``pending_us`` says when it was last seen incomplete). A work that cannot be asked (a
  push/pull, a server's sends) ends when it is waited for;
- ``codec``: a compressor's encode and decode (the dense gradient's elements and bytes; an
  encode also ``bytes_out``, what it produced for the collectives that follow, a decode
  ``bytes_in``, what they brought back);
- ``queue``: a chunk waiting in a method's own scheduler, from its gradient's readiness until the
  method hands it to the transport (ByteScheduler: priority and credit decide when), on the
  ``scheduler queue`` row; not communication (the metrics ignore it);
- ``ready`` instants: a gradient accumulated (trace files only: one hook per parameter).

**Metrics** (``overlap``), per iteration, from these events alone: at each moment the training
thread is in its innermost span, which is compute or wait (or neither: loop overhead);
communication is the union of comm spans on any thread.

- ``compute_s``: compute time; ``wait_s``: time the training thread waited;
- ``comm_s``: communication time (union of comm spans);
- ``hidden_s``: communication while computing; ``exposed_s``: communication or waiting while
  not computing, ``|comm U wait| - hidden``;
- ``overlap``: hidden / communication (None without communication);
- ``idle_s``: the iteration's time covered by none of them.

Communication inside DDP's reducer and Horovod's background thread is not handed to the suite's
``Comm``: for those methods (without a compressor) the metrics say so instead of guessing. With a
trace file (``trace_file``) DDP routes its buckets through ``Comm`` with a comm hook.

**Trace.** ``trace`` puts every rank's events on rank 0's clock (offsets measured over the
workers' group at the start of the timed rounds: ``ddlbench.measure.overlap``) into one
trace-event JSON object (the format
Perfetto, chrome://tracing and Holistic Trace Analysis read): one process per rank, one thread row
per stream of work, spans as complete events (``ph: X``), instants as ``ph: i``, timestamps in
microseconds; the metadata holds each rank's offset and its uncertainty.

**Reading** (``load``, ``read``, ``exposed_spans``): a trace file back into each rank's events
in the recorder's form, and the communication a rank's training thread was not computing
through; ``python -m ddlbench.timeline`` (``cli.py``) summarises one trace and compares two.
Traces of long runs reach hundreds of megabytes: a file is decoded one event at a time
into the recorder's tuples, and the metrics look at each event about once (spans sorted
by start, each iteration's found by bisection), not once per iteration. An event's times must
be finite numbers and a span's ``dur`` >= 0.
"""
from __future__ import annotations

import bisect
import collections
import heapq
import json
import math
import os
import re
import stat
import statistics
import threading
import time
from contextlib import contextmanager

from ..errors import UsageError

MAIN = "training"           # the training thread's row
COMPUTE, WAIT, COMM, CODEC = "compute", "wait", "comm", "codec"
ITERATION, ROUND, READY, QUEUE = "iteration", "round", "ready", "queue"


def now_us() -> float:
    return time.perf_counter_ns() / 1000.0


class Timeline:
    """One rank's recorder. ``enabled`` is False outside the recorded window: every call is
    then a test and a return."""

    def __init__(self, rank: int = 0, limit: int | None = None, trace_file: bool = False):
        self.rank = rank
        # A trace file will be written (--timeline PATH): methods may then observe what they
        # otherwise leave to their library (DDP's buckets, through a comm hook).
        self.trace_file = trace_file
        self.enabled = False
        self.limit = limit          # iterations to record (None: every timed one)
        self.iterations = 0
        self.events: list = []
        # collectives in flight, in issue order: [name, thread, start, args, work, last seen
        # incomplete, end where it was waited for]; the completions are discovered (_poll)
        self._pending: collections.deque = collections.deque()
        self._lock = threading.Lock()

    # -- the recorded window ------------------------------------------------------------------
    def start(self) -> None:
        self._pending.clear()
        self.events = []
        self.iterations = 0
        self.enabled = self.limit != 0

    def stop(self) -> None:
        """Stop recording; a collective still in flight ends now (a window closes after its
        round's wait, so none should be)."""
        self.enabled = False
        self._poll(flush=True)

    @contextmanager
    def iteration(self):
        """One training step; recording ends after ``limit`` of them."""
        with self.span("iteration", ITERATION, index=self.iterations):
            yield
        if self.enabled:
            self.iterations += 1
            if self.limit is not None and self.iterations >= self.limit:
                self.enabled = False

    # -- events ---------------------------------------------------------------------------------
    @contextmanager
    def span(self, name: str, cat: str, thread: str = MAIN, **args):
        """A span around the block; yields its arguments (a dict the block may add to; None
        while not recording)."""
        if not self.enabled:
            yield None
            return
        if self._pending:
            self._poll()
        t0 = now_us()
        try:
            yield args
        finally:
            self.events.append((name, cat, thread, t0, now_us(), args or None))
            if self._pending:
                self._poll()

    def instant(self, name: str, cat: str, thread: str = MAIN, **args) -> None:
        if self.enabled:
            self.events.append((name, cat, thread, now_us(), None, args or None))
            if self._pending:
                self._poll()

    def past(self, name: str, cat: str, thread: str, start_us: float, **args) -> None:
        """A span that began at ``start_us`` and ends now: work a library did on this thread
        that the recorder sees only once it is over (FSDP2's HSDP all-reduce, from its hook)."""
        if self.enabled:
            self.events.append((name, cat, thread, start_us, now_us(), args or None))
            if self._pending:
                self._poll()

    def comm(self, name: str, work, thread: str, start_us: float | None = None, **args):
        """A collective handed to the transport now (or at ``start_us``, stamped before it was
        issued: a transport may complete it before this call). Its span ends when ``work``
        completes: with a trace file (``trace_file``: someone will read the spans) exactly, by
        a callback on its future; otherwise, the counters every benchmark keeps, when it is
        discovered complete (a torch ``Work``: ``_poll``), for a fraction of the callback's
        cost. A work that can be neither asked nor followed ends when it is waited for.
        Returns ``work`` or a wrapper whose ``wait()`` closes the span."""
        if not self.enabled or work is None:
            return work
        t0 = now_us() if start_us is None else start_us
        events = self.events
        if self.trace_file:
            try:
                future = work.get_future()
            except (AttributeError, RuntimeError):
                future = None
            if future is not None and hasattr(future, "add_done_callback"):
                future.add_done_callback(lambda _f: events.append(
                    (name, COMM, thread, t0, now_us(), args or None)))
                return work
        if not hasattr(work, "is_completed"):
            return _Closing(work, lambda: events.append((name, COMM, thread, t0, now_us(),
                                                         args or None)))
        entry = [name, thread, t0, args, work, None, None]
        with self._lock:
            self._pending.append(entry)
        self._poll()
        return _Polled(work, self, entry)

    def _poll(self, flush: bool = False) -> None:
        """Close the spans of the collectives in flight that have completed, in issue order
        up to the first one still running (one process group completes in order; one that
        completes out of order is closed with the one before it, or at its own wait); that one
        is noted as seen incomplete now. ``flush``: close them all."""
        with self._lock:
            pending = self._pending
            while pending:
                entry = pending[0]
                if not (flush or entry[6] is not None or entry[4].is_completed()):
                    entry[5] = now_us()
                    return
                pending.popleft()
                self._close(entry)

    def _close(self, entry) -> None:
        name, thread, t0, args, _work, seen, end = entry
        if seen is not None:
            args["pending_us"] = seen
        self.events.append((name, COMM, thread, t0, now_us() if end is None else end,
                            args or None))

    # -- hooks ----------------------------------------------------------------------------------
    def watch_optimizer(self, optimizer) -> list:
        """Optimizer steps as compute spans, whoever calls them (handles to remove)."""
        starts: dict = {}

        def pre(_opt, _args, _kwargs):
            if self.enabled:
                starts[threading.get_ident()] = now_us()

        def post(_opt, _args, _kwargs):
            t0 = starts.pop(threading.get_ident(), None)
            if t0 is not None and self.enabled:
                thread = MAIN if threading.current_thread() is threading.main_thread() \
                    else threading.current_thread().name
                self.events.append(("optimizer", COMPUTE, thread, t0, now_us(), None))

        return [optimizer.register_step_pre_hook(pre), optimizer.register_step_post_hook(post)]

    def watch_gradients(self, model) -> list:
        """A ``ready`` instant per accumulated gradient (name, bytes): trace files only."""
        from .. import compat
        handles = []
        for name, p in model.named_parameters():
            if p.requires_grad:
                nbytes = p.numel() * p.element_size()
                handles.append(compat.on_grad_ready(
                    p, lambda _p, n=name, b=nbytes: self.instant(n, READY, "gradients",
                                                                 bytes=b)))
        return handles


class NullTimeline(Timeline):
    """A timeline that never records."""

    def start(self) -> None:
        self.enabled = False


class _Polled:
    """A collective whose completion the recorder discovers: waiting for it closes its span
    (and those of the collectives issued before it) at the latest."""

    def __init__(self, work, timeline: Timeline, entry):
        self._work, self._timeline, self._entry = work, timeline, entry

    def wait(self, *args, **kwargs):
        tl = self._timeline
        if tl._pending:
            tl._poll()          # those already complete end before the wait, not after it
        out = self._work.wait(*args, **kwargs)
        if self._entry[6] is None:
            self._entry[6] = now_us()   # it ends here, whenever the poll gets to it
        if tl._pending:
            tl._poll()
        return out

    def __getattr__(self, name):
        return getattr(self._work, name)


class _Closing:
    """A transport's work without a future: the span closes when it is waited for."""

    def __init__(self, work, close):
        self._work, self._close, self._closed = work, close, False

    def wait(self, *args, **kwargs):
        out = self._work.wait(*args, **kwargs)
        if not self._closed:
            self._closed = True
            self._close()
        return out

    def __getattr__(self, name):
        return getattr(self._work, name)


# ------------------------------------------------------------------------------- the metrics

def union(intervals) -> list[tuple[float, float]]:
    """Sorted, disjoint intervals covering the same points."""
    out: list = []
    for a, b in sorted(i for i in intervals if i[1] > i[0]):
        if out and a <= out[-1][1]:
            if b > out[-1][1]:
                out[-1] = (out[-1][0], b)
        else:
            out.append((a, b))
    return out


def measure(intervals) -> float:
    return sum(b - a for a, b in intervals)


def intersect(xs, ys) -> list[tuple[float, float]]:
    """Intersection of two sorted disjoint interval lists."""
    out, i, j = [], 0, 0
    while i < len(xs) and j < len(ys):
        a, b = max(xs[i][0], ys[j][0]), min(xs[i][1], ys[j][1])
        if a < b:
            out.append((a, b))
        if xs[i][1] < ys[j][1]:
            i += 1
        else:
            j += 1
    return out


def innermost(spans) -> dict[str, list[tuple[float, float]]]:
    """For properly nested spans ``(start, end, label)`` of one thread: the intervals where each
    label is the innermost span's, as sorted disjoint lists."""
    points = sorted({p for s in spans for p in s[:2]})
    # Outer spans first among those starting together (longest first), so a stack holds the
    # nesting; a span ends at its end point.
    starts: dict = {}
    for s in sorted(spans, key=lambda s: (s[0], -(s[1] - s[0]))):
        starts.setdefault(s[0], []).append(s)
    out: dict = {}
    stack: list = []
    for k, p in enumerate(points):
        stack = [s for s in stack if s[1] > p]
        stack.extend(starts.get(p, []))
        if stack and k + 1 < len(points):
            label = stack[-1][2]
            nxt = points[k + 1]
            segs = out.setdefault(label, [])
            if segs and segs[-1][1] == p:
                segs[-1] = (segs[-1][0], nxt)
            else:
                segs.append((p, nxt))
    return out


def _is_main(e) -> bool:
    """A span of the training thread that decides what it was doing (compute or wait)."""
    return e[2] == MAIN and e[1] in (COMPUTE, WAIT) and e[4] is not None


def _is_comm(e) -> bool:
    return e[1] == COMM and e[4] is not None


def iteration_metrics(events, start: float, end: float) -> dict:
    """The metrics of one iteration ``[start, end]`` (microseconds) from one rank's events."""
    return _window_metrics([e for e in events if _is_main(e) and e[4] > start and e[3] < end],
                           [e for e in events if _is_comm(e) and e[4] > start and e[3] < end],
                           start, end)


def _window_metrics(main, comm, start: float, end: float) -> dict:
    """``iteration_metrics`` of the training thread's compute and wait spans ``main`` (in the
    events' order: among spans alike, the later is the inner) and the comm spans ``comm`` that
    overlap ``[start, end]``."""
    def clip(e):
        return max(e[3], start), min(e[4], end)

    labels = innermost([(*clip(e), e[1]) for e in main])
    compute, wait = labels.get(COMPUTE, []), labels.get(WAIT, [])
    comm = union(clip(e) for e in comm)
    hidden = measure(intersect(comm, compute))
    comm_wait = measure(intersect(comm, wait))
    c, w, m = measure(compute), measure(wait), measure(comm)
    busy = c + w + m - hidden - comm_wait
    us = 1e-6
    return {"iteration_s": (end - start) * us, "compute_s": c * us, "wait_s": w * us,
            "comm_s": m * us, "hidden_s": hidden * us,
            "exposed_s": (m + w - comm_wait - hidden) * us,
            "overlap": hidden / m if m > 0 else None,
            "idle_s": max(0.0, (end - start) - busy) * us}


class _Sweep:
    """The spans (events with an end) that overlap each of a series of windows ``[start, end]``
    given in order of start, in the events' order, each span looked at about once: spans sorted
    by start once, a window's new ones found by bisection, and those that began before the
    window kept aside only while they may still reach into a later one."""

    def __init__(self, spans):
        self.spans = sorted(enumerate(spans), key=lambda x: x[1][3])
        self.starts = [x[1][3] for x in self.spans]
        self.done = 0           # spans[:done] began before the last window's start
        self.open: list = []    # of those, the ones ending after it

    def overlapping(self, start: float, end: float) -> list:
        """The spans with ``end_us > start`` and ``start_us < end``; ``start`` at least the
        previous call's."""
        spans, starts = self.spans, self.starts
        began = bisect.bisect_left(starts, start, self.done)
        self.open = [x for x in self.open if x[1][4] > start]
        self.open += [x for x in spans[self.done:began] if x[1][4] > start]
        self.done = began
        inside = spans[began:bisect.bisect_left(starts, end, began)] if end > start else []
        out = [x for x in self.open if x[1][3] < end] + [x for x in inside if x[1][4] > start]
        out.sort(key=lambda x: x[0])
        return [x[1] for x in out]


def overlap(events) -> dict | None:
    """Per-iteration metrics of one rank's events and their means (None: no iteration span).
    Each event is looked at about once, whatever the number of iterations."""
    iters = sorted((e for e in events if e[1] == ITERATION and e[4] is not None),
                   key=lambda e: e[3])
    if not iters:
        return None
    main = _Sweep([e for e in events if _is_main(e)])
    comm = _Sweep([e for e in events if _is_comm(e)])
    per = [_window_metrics(main.overlapping(e[3], e[4]), comm.overlapping(e[3], e[4]),
                           e[3], e[4]) for e in iters]
    keys = [k for k in per[0] if k != "overlap"]
    mean = {k: statistics.fmean(p[k] for p in per) for k in keys}
    mean["overlap"] = mean["hidden_s"] / mean["comm_s"] if mean["comm_s"] > 0 else None
    return {"iterations": len(per), "mean": mean, "per_iteration": per}


def summary_line(m: dict, rank: int) -> str:
    """``Overlap: ...`` for the console, the slowest rank's means."""
    ms = {k: v * 1e3 for k, v in m.items() if k.endswith("_s")}
    hidden = f"{m['overlap'] * 100:.0f}% hidden" if m["overlap"] is not None else \
        "no communication"
    return (f"Overlap: compute {ms['compute_s']:.1f} ms, communication {ms['comm_s']:.1f} ms, "
            f"exposed {ms['exposed_s']:.1f} ms ({hidden}); iteration {ms['iteration_s']:.1f} "
            f"ms on rank {rank}, the slowest")


def trace(per_rank: list[dict], meta: dict | None = None) -> dict:
    """The trace-event JSON object of every rank's events (``{"rank", "events", "offset_us",
    "uncertainty_us"}`` each), on rank 0's clock, starting at 0."""
    shifted = [[(e[0], e[1], e[2], e[3] - r["offset_us"],
                 None if e[4] is None else e[4] - r["offset_us"], e[5]) for e in r["events"]]
               for r in per_rank]
    origin = min((e[3] for evs in shifted for e in evs), default=0.0)
    out = []
    for r, evs in zip(per_rank, shifted):
        pid = r["rank"]
        out.append({"ph": "M", "name": "process_name", "pid": pid, "tid": 0, "ts": 0,
                    "args": {"name": r.get("name", f"rank {pid}")}})
        out.append({"ph": "M", "name": "process_sort_index", "pid": pid, "tid": 0, "ts": 0,
                    "args": {"sort_index": pid}})
        tids: dict = {}
        for name, cat, thread, t0, t1, args in lanes(evs):
            tid = tids.get(thread)
            if tid is None:
                tid = tids[thread] = len(tids) + 1
                out.append({"ph": "M", "name": "thread_name", "pid": pid, "tid": tid, "ts": 0,
                            "args": {"name": thread}})
            ts = round(t0 - origin, 3)
            ev = {"name": name, "cat": cat, "pid": pid, "tid": tid, "ts": ts}
            if t1 is None:
                ev.update(ph="i", s="t")
            else:
                # the end rounded as the start is: spans back to back stay so
                ev.update(ph="X", dur=round(max(0.0, round(t1 - origin, 3) - ts), 3))
            if args:
                ev["args"] = args
            out.append(ev)
    return {"traceEvents": out, "displayTimeUnit": "ms",
            "metadata": {"clock": "time.perf_counter, microseconds, rank 0's clock",
                         "offsets_us": {str(r["rank"]): r["offset_us"] for r in per_rank},
                         "uncertainty_us": {str(r["rank"]): r["uncertainty_us"]
                                            for r in per_rank},
                         **(meta or {})}}


# The suite's collectives on the workers' process group (push/pull go to the servers instead).
COLLECTIVES = ("allreduce", "allgather", "broadcast")


def transport_queues(events, threads: int) -> list:
    """The events with each collective's time queued inside the transport, inferred (its span
    runs from the hand-over to completion). The process group runs its collectives in the order
    handed over on ``threads`` worker threads (Gloo: 2, torch's default; NCCL: one stream): a
    collective starts when handed over or, all threads busy, when the earliest of them
    completes its own. ``args["queued_us"]`` gets that wait where it is not zero. The union of
    the spans, and so every metric, is the same with or without it: a collective waits only
    while ``threads`` others run."""
    free = [float("-inf")] * max(1, threads)
    queued = {}
    ops = sorted((i for i, e in enumerate(events)
                  if e[1] == COMM and e[0] in COLLECTIVES and e[4] is not None),
                 key=lambda i: events[i][3])
    for i in ops:
        _, _, _, t0, t1, _ = events[i]
        start = max(t0, heapq.heappop(free))
        heapq.heappush(free, t1)
        if start > t0:
            queued[i] = start - t0
    return [e if i not in queued else (*e[:5], {**(e[5] or {}), "queued_us": round(queued[i], 3)})
            for i, e in enumerate(events)]


def tensors_label(names: list[str]) -> str:
    """What a collective of these gradient tensors is called on the timeline (``tensor``)."""
    if len(names) == 1:
        return names[0]
    return f"{names[0]} .. {names[-1]} ({len(names)} tensors)"


def lanes(events) -> list:
    """The events sorted by start, each span on a row where it nests in or follows the spans
    before it: operations in flight at once (asynchronous collectives, pushes) go to rows
    ``THREAD 2``, ``THREAD 3``, ... as trace viewers need."""
    rows: dict = {}    # (thread, lane) -> stack of open (start, end)
    out = []
    for e in sorted(events, key=lambda e: (e[3], -((e[4] or e[3]) - e[3]))):
        name, cat, thread, t0, t1, args = e
        end = t0 if t1 is None else t1
        lane = 0
        while True:
            stack = rows.setdefault((thread, lane), [])
            while stack and stack[-1][1] <= t0:
                stack.pop()
            if not stack or end <= stack[-1][1]:
                break
            lane += 1
        if t1 is not None:
            stack.append((t0, t1))
        out.append((name, cat, thread if lane == 0 else f"{thread} {lane + 1}", t0, t1, args))
    return out


def write(path: str, obj: dict) -> None:
    """The trace file ``path``, whole or not at all; its missing folders made (as ``--output``
    makes a record's: the command's check let the path through, ``errors.check_writable``)."""
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "w") as f:
        json.dump(obj, f)
    os.replace(tmp, path)


# ------------------------------------------------------------------------------- reading back

_LANE = re.compile(r"(.+) ([2-9]|[1-9][0-9]+)")
_SPACE = re.compile(r"[ \t\n\r]*")      # JSON's whitespace


def load(path) -> dict:
    """The trace-event object in file ``path``; a UsageError (one line) when it cannot be read,
    is not JSON (or is nested too deeply to decode), or is not an object with a ``traceEvents``
    list."""
    return _checked(_parsed(_text(path), path), path)


def _text(path) -> str:
    """File ``path`` as JSON decodes bytes (UTF-8, -16 or -32). A device, pipe or socket
    (``/dev/zero``) is refused before anything is read: its read need not end."""
    try:
        with open(path, "rb") as f:
            if not stat.S_ISREG(os.fstat(f.fileno()).st_mode):
                raise UsageError(f"{path} is not a regular file (a device, pipe or socket); "
                                 "give a trace file")
            data = f.read()
    except FileNotFoundError:
        raise UsageError(f"{path}: no such file") from None
    except IsADirectoryError:
        raise UsageError(f"{path} is a folder; give a trace file") from None
    except OSError as e:
        raise UsageError(f"{path} cannot be read ({e.strerror or e})") from None
    try:
        return data.decode(json.detect_encoding(data), "surrogatepass")
    except UnicodeDecodeError as e:
        raise UsageError(f"{path} is not JSON ({str(e).splitlines()[0]})") from None


def _parsed(text: str, path):
    """What ``json.loads`` makes of ``text``; a UsageError naming ``path`` when it is not JSON
    or is nested deeper than the decoder goes."""
    try:
        return json.JSONDecoder().decode(text)
    except ValueError as e:
        raise UsageError(f"{path} is not JSON ({str(e).splitlines()[0]})") from None
    except RecursionError:
        raise UsageError(f"{path} is JSON nested too deeply to decode") from None


def _checked(obj, what) -> dict:
    if not isinstance(obj, dict) or not isinstance(obj.get("traceEvents"), list):
        raise UsageError(f"{what} is not a trace-event object (a JSON object with a "
                         "traceEvents list)")
    return obj


def _event(e: dict, index: int, what) -> str:
    return f"{what}: traceEvents[{index}] ({e.get('ph')!r} {e.get('name')!r})"


def _number(e: dict, key: str, index: int, what) -> float:
    """Event ``e``'s ``key`` (ts or dur) as a finite float (a dur also >= 0); a UsageError
    naming the event otherwise."""
    v = e.get(key)
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise UsageError(f"{_event(e, index, what)} has no numeric {key}")
    try:
        f = float(v)
    except OverflowError:       # an integer beyond any float
        f = math.inf
    if not math.isfinite(f):
        shown = repr(v) if len(repr(v)) <= 24 else f"{repr(v)[:21]}..."
        raise UsageError(f"{_event(e, index, what)} has {key} {shown}, not a finite number")
    if key == "dur" and f < 0:
        raise UsageError(f"{_event(e, index, what)} has a negative dur ({v!r})")
    return f


def _unhashable(e: dict, key: str, index: int, what) -> UsageError | None:
    v = e.get(key)
    if isinstance(v, (list, dict)):
        return UsageError(f"{_event(e, index, what)} has a {key} that is a JSON "
                          f"{'array' if isinstance(v, list) else 'object'}, not a number or a "
                          "string")
    return None


class _Reader:
    """``read``'s work, one trace event at a time (``add``, in the file's order), keeping only
    the recorder's tuples; ``finish`` gives the ranks. Bad input is a UsageError raised by
    ``finish``, as reading the whole list first would: the first element that is not an event
    object (or whose pid cannot be a process), else the first bad event of the first process in
    pid order. ``fresh``: the events' ``args`` objects belong to nobody else (decoded for this
    reader), kept rather than copied."""

    INF = math.inf

    def __init__(self, what, fresh: bool = False):
        self.what, self.fresh = what, fresh
        self.error = None           # the first element that is not an event, or None
        self.failed: dict = {}      # pid -> its first bad event's UsageError
        self.procs: dict = {}       # pid -> process name
        self.rows: dict = {}        # (pid, tid) -> row name
        self.order: dict = {}       # pid -> [(name, cat, tid, t0, t1, args)] in the file's order
        self.strings: dict = {}     # one str object for the names and categories alike

    def add(self, i: int, e) -> None:
        if self.error is not None:
            return
        if not isinstance(e, dict):
            self.error = UsageError(f"{self.what}: traceEvents[{i}] is not an object")
            return
        ph = e.get("ph")
        if ph == "M":
            args = e.get("args") if isinstance(e.get("args"), dict) else {}
            name = e.get("name")
            if name == "process_name" and "name" in args:
                self.error = _unhashable(e, "pid", i, self.what)
                if self.error is None:
                    self.procs[e.get("pid")] = str(args["name"])
            elif name == "thread_name" and "name" in args:
                self.error = _unhashable(e, "pid", i, self.what) or \
                    _unhashable(e, "tid", i, self.what)
                if self.error is None:
                    self.rows[(e.get("pid"), e.get("tid"))] = str(args["name"])
            return
        if ph not in ("X", "i", "I"):
            return
        pid = e.get("pid")
        if isinstance(pid, (list, dict)):
            self.error = _unhashable(e, "pid", i, self.what)
            return
        events = self.order.setdefault(pid, [])
        if pid in self.failed:
            return
        inf = self.INF
        try:
            tid = e.get("tid")
            if isinstance(tid, (list, dict)):
                raise _unhashable(e, "tid", i, self.what)
            t0 = e.get("ts")
            if t0.__class__ is not float or not -inf < t0 < inf:
                t0 = _number(e, "ts", i, self.what)
            if ph == "X":
                dur = e.get("dur")
                if dur.__class__ is not float or not 0.0 <= dur < inf:
                    dur = _number(e, "dur", i, self.what)
                t1 = t0 + dur
                if not t1 < inf:
                    raise UsageError(f"{_event(e, i, self.what)} ends past the largest number "
                                     f"(ts {t0!r} + dur {dur!r})")
            else:
                t1 = None
        except UsageError as err:
            self.failed[pid] = err
            events.clear()
            return
        strings = self.strings
        name, cat, args = e.get("name", ""), e.get("cat"), e.get("args")
        if name.__class__ is str:
            name = strings.setdefault(name, name)
        if cat.__class__ is str:
            cat = strings.setdefault(cat, cat)
        if not (isinstance(args, dict) and args):
            args = None
        elif not self.fresh or args.__class__ is not dict:
            args = dict(args)
        events.append((name, cat, tid, t0, t1, args))

    def finish(self) -> list[dict]:
        if self.error is not None:
            raise self.error
        order, rows = self.order, self.rows
        for pid in self.procs:
            order.setdefault(pid, [])
        out = []
        names_of: dict = {}         # pid -> its rows' names (one pass: linear in the ranks)
        for (p, _), name in rows.items():
            names_of.setdefault(p, set()).add(name)
        numeric = [p for p in order if isinstance(p, int)]
        others = [p for p in order if not isinstance(p, int)]
        for pid in sorted(numeric) + sorted(others, key=str):
            if pid in self.failed:
                raise self.failed[pid]
            names = names_of.get(pid, set())
            threads: dict = {}      # (type, tid) -> row: 1 and 1.0 are the same key, not name
            events = order[pid]
            for k, (name, cat, tid, t0, t1, args) in enumerate(events):
                row = threads.get((tid.__class__, tid))
                if row is None:
                    row = rows.get((pid, tid), str(tid))
                    lane = _LANE.fullmatch(row)
                    if lane and lane.group(1) in names:
                        row = lane.group(1)
                    threads[(tid.__class__, tid)] = row
                events[k] = (name, cat, row, t0, t1, args)
            out.append({"rank": pid, "name": self.procs.get(pid, f"rank {pid}"),
                        "events": events})
        return out


def _scan(s: str, what):
    """``(reader, top)`` of JSON text ``s`` holding one object: ``top`` its members but the
    last ``traceEvents`` list, whose elements went to ``reader`` as they were decoded (each
    alone: the list is never whole in memory); ``reader`` None when that list is absent. None
    where ``s`` is not such an object (then decoding it whole says why). A JSONDecodeError or
    RecursionError where an element or value is not JSON."""
    decode = json.JSONDecoder().raw_decode
    space = _SPACE.match
    top: dict = {}
    reader = None
    i = space(s, 0).end()
    if s[i:i + 1] != "{":
        return None
    i = space(s, i + 1).end()
    if s[i:i + 1] == "}":
        i += 1
    else:
        while True:
            if s[i:i + 1] != '"':
                return None
            key, i = decode(s, i)
            i = space(s, i).end()
            if s[i:i + 1] != ":":
                return None
            i = space(s, i + 1).end()
            if key == "traceEvents" and s[i:i + 1] == "[":
                top.pop(key, None)
                reader = _Reader(what, fresh=True)      # a later one replaces it, as in JSON
                i = space(s, i + 1).end()
                if s[i:i + 1] != "]":
                    n = 0
                    while True:
                        e, i = decode(s, i)
                        reader.add(n, e)
                        n += 1
                        i = space(s, i).end()
                        c = s[i:i + 1]
                        if c == ",":
                            i = space(s, i + 1).end()
                        elif c == "]":
                            break
                        else:
                            return None
                i += 1
            else:
                top[key], i = decode(s, i)
                if key == "traceEvents":
                    reader = None
            i = space(s, i).end()
            c = s[i:i + 1]
            if c == ",":
                i = space(s, i + 1).end()
            elif c == "}":
                i += 1
                break
            else:
                return None
    if space(s, i).end() != len(s):
        return None
    return reader, top


def read_trace(path_or_obj, what=None) -> tuple[list[dict], object]:
    """``read``'s ranks and the trace's ``metadata`` (None without): what a summary needs. A
    file is decoded one event at a time (``_scan``), its events never all in memory as JSON
    objects; one that is not a trace-event object as ``trace`` writes them is decoded whole
    (``load``'s errors)."""
    if isinstance(path_or_obj, dict):
        obj = _checked(path_or_obj, what or "the trace")
        reader = _Reader(what or "the trace")
        for i, e in enumerate(obj["traceEvents"]):
            reader.add(i, e)
        return reader.finish(), obj.get("metadata")
    path = path_or_obj
    what = what or str(path)
    text = _text(path)
    try:
        scanned = _scan(text, what)
    except ValueError:
        scanned = None          # decoding it whole says what is wrong
    except RecursionError:
        raise UsageError(f"{path} is JSON nested too deeply to decode") from None
    if scanned is None or scanned[0] is None:
        obj = _checked(_parsed(text, path), path)
        del text
        return read_trace(obj, what)
    del text
    reader, top = scanned
    return reader.finish(), top.get("metadata")


def read(path_or_obj, what: str | None = None) -> list[dict]:
    """Each process of a trace (a file's path, or the object ``trace`` made) as
    ``{"rank", "name", "events"}``, ranks in pid order, events in the recorder's tuple form
    ``(name, cat, thread, start_us, end_us, args)`` in the file's order: spans (``ph: X``) end
    at ``ts + dur``, instants (``ph: i``/``I``) have end None, times on the trace's clock.
    Metadata events (``ph: M``) name processes and rows; other ``ph`` values are ignored.

    Rows ``lanes`` added are folded back into their thread: a row named ``BASE k`` (k an integer
    >= 2) is read as thread ``BASE`` when the same process also has a row named ``BASE`` (``lanes``
    opens row k only while the base row holds a span, so its base row is always there). A
    thread really named so beside a thread ``BASE`` cannot be told apart and is folded too.
    Bad input is a UsageError naming ``what`` (the path, else "the trace"): an event without
    a finite ``ts``, a span without a finite ``dur`` >= 0, JSON nested too deeply to decode."""
    return read_trace(path_or_obj, what)[0]


def exposed_spans(events, n: int | None = 10) -> list[dict]:
    """One rank's communication spans (``cat`` comm) by the part of each not covered by compute
    (the training thread's innermost compute intervals, as ``iteration_metrics`` finds them),
    longest exposed first (earlier first among equals), at most ``n`` (None: all):
    ``{"name", "thread", "start_us", "duration_us", "exposed_us", "args"}`` each."""
    main = [(e[3], e[4], e[1]) for e in events if _is_main(e)]
    compute = innermost(main).get(COMPUTE, [])
    ends = [b for _, b in compute]
    spans = ({"name": name, "thread": thread, "start_us": t0, "duration_us": t1 - t0,
              "exposed_us": (t1 - t0) - measure(_covered(t0, t1, compute, ends)),
              "args": args}
             for name, cat, thread, t0, t1, args in events if cat == COMM and t1 is not None)
    order = lambda s: (-s["exposed_us"], s["start_us"])     # noqa: E731
    if n is None or n < 0:
        return sorted(spans, key=order)[:n]
    return heapq.nsmallest(n, spans, key=order)     # sorted(...)[:n], keeping only n


def _covered(t0: float, t1: float, intervals, ends) -> list[tuple[float, float]]:
    """``intersect([(t0, t1)], intervals)`` (nothing unless ``t1 > t0``) of sorted disjoint
    ``intervals`` whose ends are ``ends``, from the first ending after ``t0``: those before add
    nothing."""
    out: list = []
    if not t1 > t0:
        return out
    for j in range(bisect.bisect_right(ends, t0), len(intervals)):
        a, b = max(t0, intervals[j][0]), min(t1, intervals[j][1])
        if a < b:
            out.append((a, b))
        if t1 < intervals[j][1]:
            break
    return out


NULL = NullTimeline()


def of(comm) -> Timeline:
    """``comm``'s timeline; a stand-in without one (a test's hand-made Comm) records nothing."""
    return getattr(comm, "timeline", NULL)

"""The performance model's schedules written again without an event simulator: the section 3
recurrences of docs/DESIGN.md (the replay's training thread as a running clock) and
ByteScheduler's scheduler as a priority queue of arrivals and completions, without CPU
interference. ``ddlbench.model.simulate`` runs every schedule on one event simulator whose CPU
interference is a parameter; tests/test_simulate.py swaps these in for the simulator's schedule
functions (same signatures, same results) and holds the simulator, at zero interference, to them.
They are the plain replay the model had before its two paths became one (issue 43)."""
import heapq

from ddlbench import timeline
from ddlbench.model.simulate import ISSUER_ROW


def training(work, groups, wait_all, send, send_late, transport, host):
    """``simulate._schedule`` on one resource (no ``launch``) without interference: (the
    iteration's end, the training thread's spans, the transport's events, the host work's
    spans)."""
    fwd_end = t = work.forward_s
    done, left, spans = [], list(groups), []

    def host_work(name, seconds):
        nonlocal t
        if seconds:
            spans.append((name, timeline.MAIN, t, t + seconds))
            t += seconds

    issuer = 0.0  # when the communication thread is free

    def hand_over(g):
        host_work(host.pack_name(g), host.pack(g))
        done.append(send(g, t)[1])

    def hand_to_thread(g):
        """The gradient hook hands ``g`` to the communication thread, which encodes and
        issues it after the groups before it."""
        nonlocal issuer
        start = max(t, issuer)
        seconds = host.pack(g)
        if seconds:
            transport.events.append((host.pack_name(g), timeline.CODEC, ISSUER_ROW, start * 1e6,
                                     (start + seconds) * 1e6, None))
        issuer = start + seconds
        done.append(send(g, issuer)[1])
    for b, tb in enumerate(work.backward_s):
        t += tb
        while left and not wait_all and max(left[0]) <= b:
            (hand_to_thread if host.threaded else hand_over)(left.pop(0))
    bwd_end = t
    for g in left:
        hand_over(g)
    for i, (g, d) in enumerate(zip(groups, done)):
        t = max(t, d)
        host_work(host.at_wait_name(g), host.at_wait(g))
        late = send_late(i, t)
        t = t if late is None else max(t, late)
        host_work(host.finish_name(g), host.finish(g))
    host_work("copy out of buckets", host.after_all())
    last_end = t
    end, main, compute = last_end + work.optimizer_s, timeline.MAIN, timeline.COMPUTE
    return end, [("forward", compute, main, 0.0, fwd_end),
                 ("backward", compute, main, fwd_end, bwd_end),
                 ("step", timeline.WAIT, main, bwd_end, end),
                 ("optimizer", compute, main, last_end, end)], transport.events, spans


def bytescheduler_threads(work, transport, plan, fwd, tb, opt, iterations):
    """``simulate._bytescheduler_threads`` without interference: (each iteration's start,
    every event)."""
    table, chunks_of, credit, element_bytes, names, ps = plan
    us, main, n = 1e6, timeline.MAIN, len(tb)
    s = Scheduler(transport, table, credit, element_bytes, opt, names, ps)
    t, starts, events = 0.0, [], []
    for it in range(iterations):
        starts.append(t)
        f0 = t
        for l in range(n):
            if it > 0:
                ready = s.update_done(it - 1, l)
                if ready > t:
                    events.append(("forward pre-hook", timeline.WAIT, main, t * us,
                                   ready * us, None))
                    t = ready
            t += fwd[l]
        events.append(("forward", timeline.COMPUTE, main, f0 * us, t * us, None))
        b0 = t
        for l in range(n - 1, -1, -1):
            t += tb[l]
            s.ready(it, l, t, chunks_of[l])
        events.append(("backward", timeline.COMPUTE, main, b0 * us, t * us, None))
    # the last iteration's forward start closes the one before it: run the schedule that far
    for l in range(n):
        s.update_done(iterations - 1, l)
    return starts, events + s.events + transport.events


class Scheduler:
    """ByteScheduler's side of the replay: chunks queue by priority (front layers first) as
    their tensor's gradient is ready; the dispatcher hands the best to the transport while the
    credit (elements in flight) is positive, subtracting its size; the credit comes back when
    the transport has taken the chunk (all-reduce: done; PS: pushed); when a tensor's chunks
    are all done the completer thread updates it."""

    def __init__(self, transport, table, credit, element_bytes, opt_s, names, ps):
        self.transport, self.table = transport, table
        self.credit, self.element_bytes, self.opt_s, self.names = \
            credit, element_bytes, opt_s, names
        self.ps = ps
        self.queue: list = []            # (tensor, chunk index, iteration, ready time)
        self.arrivals: list = []         # (ready time, seq, tensor, chunk index, iteration)
        self.inflight: list = []         # (time, seq, kind, size, iteration, tensor)
        self.left: dict = {}             # (iteration, tensor) -> chunks not yet done
        self.done: dict = {}             # (iteration, tensor) -> when its update ended
        self.completer = 0.0
        self.events: list = []
        self.now = 0.0
        self.seq = 0

    def ready(self, it, tensor, t, chunks):
        self.left[(it, tensor)] = len(chunks)
        for c in chunks:
            self.seq += 1
            heapq.heappush(self.arrivals, (t, self.seq, tensor, c, it))

    def _dispatch(self):
        while self.credit > 0 and self.queue:
            tensor, c, it, ready = heapq.heappop(self.queue)
            _, begin, end = self.table[c]
            size = end - begin
            self.credit -= size
            label = f"{self.names[tensor]}[{begin}:{end}]"
            nbytes = size * self.element_bytes
            if self.ps:
                taken, finish, _ = self.transport.send(self.now, [(c, nbytes)], label)
            else:
                taken, finish, _ = self.transport.send(self.now, [(size,)], label)
            for when, kind in ((taken, "credit"), (finish, "done")):
                self.seq += 1
                heapq.heappush(self.inflight, (when, self.seq, kind, size, it, tensor))
            us = 1e6
            self.events.append((label, timeline.QUEUE, "scheduler queue", ready * us,
                                self.now * us, None))

    def step(self) -> bool:
        """Process the next arrival or completion; False when there is none."""
        nxt_a = self.arrivals[0][0] if self.arrivals else None
        nxt_c = self.inflight[0][0] if self.inflight else None
        if nxt_a is None and nxt_c is None:
            return False
        if nxt_c is None or (nxt_a is not None and nxt_a <= nxt_c):
            t, _, tensor, c, it = heapq.heappop(self.arrivals)
            self.now = max(self.now, t)
            heapq.heappush(self.queue, (tensor, c, it, t))
        else:
            t, _, kind, size, it, tensor = heapq.heappop(self.inflight)
            self.now = max(self.now, t)
            if kind == "credit":
                self.credit += size
            else:
                self.left[(it, tensor)] -= 1
                if self.left[(it, tensor)] == 0:
                    start = max(t, self.completer)
                    self.completer = start + self.opt_s[tensor]
                    self.done[(it, tensor)] = self.completer
                    us = 1e6
                    self.events.append(("optimizer", timeline.COMPUTE, "completer", start * us,
                                        self.completer * us, None))
        self._dispatch()
        return True

    def update_done(self, it, tensor) -> float:
        while (it, tensor) not in self.done:
            if not self.step():
                raise RuntimeError("a tensor's update never came")  # pragma: no cover
        return self.done[(it, tensor)]

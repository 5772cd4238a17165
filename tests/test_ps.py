"""The parameter-server architecture: partition plan, the PS methods against the
single-process reference (with servers, and on one machine without any), bytes on the wire,
failures of servers and workers, the launcher."""
import os
import signal
import subprocess
import sys
import threading
import time

import psutil
import pytest
import torch

from ddlbench import planning
from ddlbench.errors import UsageError
from ddlbench.runtime import ps
from ddlbench.hosts.hostfile import Host
from ddlbench.launch import pslaunch

from . import traces
from .conftest import (MOMENTUM_SGD, QUICK_TIMING, REPO, SMALL_CNN, TINY_BERT, describe, env,
                       run, train, verify_lines)

PS_METHODS = ["bspps", "wfbpps", "byteschedulerps", "byteschedulerps-worker"]
# Servers on one machine: BytePS ran none there, the suite only when forced.
FORCE = "--ps-force-servers"
LAUNCHER = f"{REPO}/byteps/byteps_launch.sh"
FAKE_SSH = f"{REPO}/tests/fake_ssh.sh"
# Small partitions and a small credit window, so that tensors are cut, spread over both
# servers, and the window throttles dispatch.
CNN_PS = [*SMALL_CNN, "--partition-bytes", "262144", "--credit", "200000"]
BERT_PS = [*TINY_BERT, "--partition-bytes", "65536", "--credit", "50000"]


# ------------------------------------------------------------------------ the partition plan

def test_plan_cuts_units_and_spreads_keys_round_robin():
    # fp32: 40 bytes = 10 elements per partition; 3 servers; key-mod placement.
    parts = ps.plan([(25, torch.float32), (10, torch.float32), (3, torch.float64)], 40, 3,
                    "key-mod")
    got = [[(p.key, p.start, p.end, p.server) for p in unit] for unit in parts]
    assert got == [[(0, 0, 10, 0), (1, 10, 20, 1), (2, 20, 25, 2)],
                   [(3, 0, 10, 0)],
                   [(4, 0, 3, 1)]]          # float64: 5 elements per partition, 3 fit in one
    assert [p.unit for unit in parts for p in unit] == [0, 0, 0, 1, 2]


def test_plan_places_each_key_on_the_least_loaded_server():
    """The default: keys in key order, each on the server with the fewest bytes so far (ties:
    the lowest). Partitions of 40, 40, 20, 40 and 24 bytes on 3 servers: key 3 goes to server
    2 (20 bytes there, 40 on the others), key 4 to server 0 (40, 40, 60)."""
    units = [(25, torch.float32), (10, torch.float32), (3, torch.float64)]
    parts = ps.plan(units, 40, 3)
    assert [(p.key, p.server) for unit in parts for p in unit] == [
        (0, 0), (1, 1), (2, 2), (3, 2), (4, 0)]
    assert parts == ps.plan(units, 40, 3, "least-loaded")
    assert planning.place([40, 40, 20, 40, 24], 3) == [0, 1, 2, 2, 0]
    assert planning.place([40, 40, 20, 40, 24], 3, "key-mod") == [0, 1, 2, 0, 1]
    with pytest.raises(UsageError, match="placement must be least-loaded or key-mod"):
        planning.place([1], 2, "hash")


def test_more_servers_than_partitions_leaves_some_idle():
    parts = ps.plan([(5, torch.float32)], 4096, 4)
    assert [(p.key, p.server, p.numel) for unit in parts for p in unit] == [(0, 0, 5)]


def test_default_server_count():
    assert [planning.default_nservers(w) for w in (1, 4, 5, 8, 9)] == [1, 1, 2, 2, 3]
    assert planning.default_nservers(16, hosts=4) == 4


def test_launcher_placement_fills_slots_and_puts_servers_on_dedicated_hosts():
    hosts = [Host("a", 2), Host("b", 2), Host("c", 4), Host("s1", 1), Host("s2", 1)]
    # Servers on the hosts without workers, round-robin, as the original's own server hosts.
    workers, servers, note = pslaunch.placement(hosts, 5, 3)
    assert workers == ["a", "a", "b", "b", "c"]
    assert servers == ["s1", "s2", "s1"] and note is None
    # Named server hosts win; colocated: round-robin over the worker machines.
    assert pslaunch.placement(hosts, 5, 2, server_hosts=["c", "x"])[1] == ["c", "x"]
    assert pslaunch.placement(hosts, 5, 4, "colocated")[1] == ["a", "b", "c", "a"]
    # Every host holds workers: colocated, and a note says why.
    workers, servers, note = pslaunch.placement(hosts[:3], 8, 2)
    assert servers == ["a", "b"] and "share the worker machines" in note


def test_dmlc_variables_mean_what_they_mean_to_byteps():
    """DMLC_NUM_WORKER counts machines and DMLC_WORKER_ID is the machine; the process's rank
    comes from its place on the machine (or the suite launcher's explicit rank)."""
    from ddlbench.hosts import placement
    base = {"DMLC_PS_ROOT_URI": "h0", "DMLC_PS_ROOT_PORT": "1234", "DMLC_NUM_WORKER": "2",
            "DMLC_NUM_SERVER": "2", "BYTEPS_LOCAL_SIZE": "4"}
    p = placement.detect(dict(base, DMLC_ROLE="worker", DMLC_WORKER_ID="1",
                              BYTEPS_LOCAL_RANK="2"))
    assert (p.rank, p.world_size, p.launcher) == (6, 10, "dmlc")
    p = placement.detect(dict(base, DMLC_ROLE="server", DDLBENCH_SERVER_ID="1"))
    assert (p.rank, p.world_size) == (9, 10)
    assert placement.dmlc_workers(base) == 8
    # Machines of different sizes: the suite's launcher says the rank and the count.
    uneven = dict(base, DDLBENCH_NUM_WORKER="5", DDLBENCH_WORKER_RANK="4", DMLC_ROLE="worker",
                  DMLC_WORKER_ID="1", BYTEPS_LOCAL_RANK="0", BYTEPS_LOCAL_SIZE="1")
    assert (placement.detect(uneven).rank, placement.detect(uneven).world_size) == (4, 7)
    with pytest.raises(UsageError, match="counts machines"):
        placement.detect(dict(base, DMLC_ROLE="worker", DMLC_WORKER_ID="2"))


def test_machines_group_ranks_by_host_in_rank_order():
    assert ps.machines(["a", "a", "b", "b"]) == [[0, 1], [2, 3]]
    assert ps.machines(["b", "a", "b"]) == [[0, 2], [1]]
    from ddlbench.launch.local import hosts_of
    # --slots 2 with 4 workers and 2 servers: two worker hosts, a host per server.
    assert hosts_of(6, nservers=2, slots=2) == [0, 0, 1, 1, 2, 3]
    assert hosts_of(5, nservers=1, slots=2) == [0, 0, 1, 1, 2]
    assert hosts_of(3, nservers=1) == [0, 1, 2]    # no --slots: one process per host


# ------------------------------------------------------------------ server-side scheduling

class _Work:
    def __init__(self, fetch=None):
        self.fetch = fetch

    def wait(self, timeout=None):
        if self.fetch is not None:
            self.fetch()


class _ScriptedGroup:
    """A stand-in for the push/pull group of one server: what each peer sends arrives from
    per-(peer, tag) queues the test fills; the server's sends are logged, the first one held
    until the test opens ``gate``."""

    def __init__(self):
        import queue
        import threading
        self.inbox: dict = {}
        self._queue = queue.Queue
        self.sent: list = []
        self.gate = threading.Event()
        self.first_send = threading.Event()

    def deliver(self, peer, tag, tensor):
        self.inbox.setdefault((peer, tag), self._queue()).put(tensor)

    def recv(self, tensors, peer, tag):
        def fetch():
            tensors[0].copy_(self.inbox.setdefault((peer, tag), self._queue()).get(timeout=30))
        return _Work(fetch)

    def send(self, tensors, peer, tag):
        self.sent.append((tag - ps.TAG_DATA, tensors[0].clone()))
        if not self.first_send.is_set():
            self.first_send.set()
            assert self.gate.wait(30)
        return _Work()


@pytest.mark.parametrize("schedule,expected", [("lowest-key", [5, 0, 1, 2, 3, 4]),
                                               ("fewest-pushes", [5, 4, 3, 2, 1, 0]),
                                               (None, [5, 4, 3, 2, 1, 0])])
def test_server_sums_pending_pushes_in_priority_order(schedule, expected):
    """Pushes arrive in reverse priority order (key 5 first). The first is summed at once and
    its sum held on the wire while keys 4..0 queue up: with the lowest-key rule the server
    then serves them lowest key (front layer) first; with BytePS's fewest-pushes rule one
    pusher's push completes its key's round on arrival (the count back to 0), so every key
    ties and they go in arrival order, as without scheduling."""
    import threading
    import time
    group = _ScriptedGroup()
    server = ps.Server(group, rank=1, nworkers=1, nservers=1, timeout_s=30)
    keys = {k: ps._Key(4, torch.float32) for k in range(6)}
    push = lambda key: (group.deliver(0, ps.header_tag(0), torch.tensor([ps.OP_PUSH, key])),
                        group.deliver(0, ps.TAG_DATA + key, torch.full((4,), float(key))))
    push(5)
    session = threading.Thread(target=server._session, args=(keys, [0], schedule))
    session.start()
    assert group.first_send.wait(30)           # key 5's sum is on its way, held there
    for key in (4, 3, 2, 1, 0):
        push(key)
    group.deliver(0, ps.header_tag(0), torch.tensor([ps.OP_END, -1]))
    if schedule:
        deadline = time.monotonic() + 30
        while server.scheduler.pending() < 5 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert server.scheduler.pending() == 5
    else:
        time.sleep(0.2)                       # (the receiving thread itself is held)
    group.gate.set()
    session.join(30)
    assert not session.is_alive()
    assert [key for key, _ in group.sent] == expected
    assert all(torch.equal(t, torch.full((4,), float(key))) for key, t in group.sent)
    if schedule:
        assert list(server.served) == [(k, 0) for k in expected]


class _PostingGroup:
    """A server's push/pull group that logs every receive as it is *posted* (Gloo sends a
    message only once its receive is posted) and completes it when the test delivers."""

    def __init__(self):
        import queue
        self.posted: list = []      # (peer, tag), in posting order
        self.inbox: dict = {}
        self.sent: list = []
        self._queue = queue.Queue

    def _q(self, peer, tag):
        return self.inbox.setdefault((peer, tag), self._queue())

    def deliver(self, peer, tag, tensor):
        self._q(peer, tag).put(tensor)

    def recv(self, tensors, peer, tag):
        self.posted.append((peer, tag))
        q = self._q(peer, tag)
        return _Work(lambda: tensors[0].copy_(q.get(timeout=30)))

    def send(self, tensors, peer, tag):
        self.sent.append((peer, tag - ps.TAG_DATA, tensors[0].clone()))
        return _Work()


def _wait_for(cond, what):
    deadline = time.monotonic() + 30
    while not cond():
        assert time.monotonic() < deadline, what
        time.sleep(0.005)


@pytest.mark.parametrize("schedule", [None, "fewest-pushes"])
def test_a_server_posts_its_receives_before_the_pushes_come(schedule):
    """Session 1 of a server (its second), 2 pushers, 3 keys, 2 rounds. At the start a header
    receive per key + SPARE_HEADERS for each pusher, on the session's own header tag; a
    pusher's first push header of a round posts the data receives of all 3 keys at once (its
    later pushes find theirs posted), each header read posts one more header receive; the sums
    are right. A key pushed twice in a round, or a round left unfinished, is a protocol error
    naming the worker."""
    group = _PostingGroup()
    server = ps.Server(group, rank=2, nworkers=2, nservers=1, timeout_s=30)
    keys = {k: ps._Key(4, torch.float32) for k in range(3)}
    tag, ring = ps.header_tag(1), 3 + ps.SPARE_HEADERS
    session = threading.Thread(target=server._session, args=(keys, [0, 1], schedule, 1))
    session.start()
    _wait_for(lambda: len(group.posted) == 2 * ring, "the header receives")
    assert sorted(group.posted) == sorted([(p, tag) for p in (0, 1)] * ring)
    data = lambda p: [t - ps.TAG_DATA for q, t in group.posted if q == p and t != tag]
    for r in range(2):
        for i, key in enumerate((2, 0, 1)):
            group.deliver(0, tag, torch.tensor([ps.OP_PUSH, key]))
            _wait_for(lambda: len(data(0)) == 3 * (r + 1), "worker 0's data receives")
            assert sorted(data(0)[3 * r:]) == [0, 1, 2] and len(data(1)) == 3 * r
            group.deliver(0, ps.TAG_DATA + key, torch.full((4,), 10.0 * r + key))
        for key in (0, 1, 2):
            group.deliver(1, tag, torch.tensor([ps.OP_PUSH, key]))
            group.deliver(1, ps.TAG_DATA + key, torch.full((4,), 100.0))
        _wait_for(lambda: len(group.sent) == 6 * (r + 1), "the sums")
    for p in (0, 1):
        assert [t for q, t in group.posted if q == p].count(tag) == ring + 6
        group.deliver(p, tag, torch.tensor([ps.OP_END, -1]))
    session.join(30)
    assert not session.is_alive()
    sums = {(p, key): t for p, key, t in group.sent[6:]}
    assert sorted(sums) == [(p, k) for p in (0, 1) for k in range(3)]
    assert all(torch.equal(t, torch.full((4,), 110.0 + key)) for (_, key), t in sums.items())


@pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")
@pytest.mark.parametrize("second,message", [
    (ps.OP_PUSH, "protocol error: worker 0 pushed key 1 twice in one round"),
    (ps.OP_END, "protocol error: worker 0 ended the session with 1 key(s) of its round not "
                "pushed")])
def test_a_server_refuses_a_round_pushed_wrong(monkeypatch, second, message):
    """(The real _die prints the line and ends the process; here it records the line and
    ends the receiving thread.)"""
    group = _PostingGroup()
    server = ps.Server(group, rank=1, nworkers=1, nservers=1, timeout_s=30)
    died = []

    def die(msg):
        died.append(msg)
        raise SystemExit(1)
    monkeypatch.setattr(server, "_die", die)
    keys = {k: ps._Key(4, torch.float32) for k in range(2)}
    tag = ps.header_tag(0)
    group.deliver(0, tag, torch.tensor([ps.OP_PUSH, 1]))
    group.deliver(0, ps.TAG_DATA + 1, torch.ones(4))
    group.deliver(0, tag, torch.tensor([second, 1 if second == ps.OP_PUSH else -1]))
    session = threading.Thread(target=server._session, args=(keys, [0]))
    session.start()
    session.join(30)
    assert not session.is_alive() and died == [message]


# ------------------------------------------------------------ the scheduling server's rule

@pytest.mark.parametrize("rule,popped", [("fewest-pushes", [1, 0, 2, 2]),
                                         ("lowest-key", [0, 1, 2, 2])])
def test_the_server_queue_pops_as_its_rule_says(rule, popped):
    """The issue's example: pushes of keys 2, 2, 1, 0 pending (4 pushers, no round
    complete). BytePS's rule pops the keys with the fewest pushes first (1 and 0, one push
    each, by arrival), then key 2's two; the lowest-key rule 0, 1, 2, 2."""
    q = ps.ServerQueue(rule, expected=4)
    for n, key in enumerate((2, 2, 1, 0)):
        q.put(key, n)
    assert len(q) == 4
    got = [q.pop() for _ in range(4)]
    assert [k for k, _ in got] == popped
    assert [n for k, n in got if k == 2] == [0, 1]          # a key's own: by arrival
    assert len(q) == 0


def test_a_rounds_last_push_zeroes_its_keys_count():
    """2 pushers: key 5's second push completes its round (count back to 0, as BytePS's
    ClearCounter), so its pending pushes go before key 1's (one push so far), and key 5's
    next round counts from 0 again."""
    q = ps.ServerQueue("fewest-pushes", expected=2)
    for key in (1, 5, 5):
        q.put(key, key)
    assert [q.pop()[0] for _ in range(3)] == [5, 5, 1]
    q.put(5, "next")        # key 1 still has 1 push this round; key 5 now has 1 too: by arrival
    q.put(1, "second")       # key 1's round complete: 0
    assert [q.pop() for _ in range(2)] == [(1, "second"), (5, "next")]


def _rule_by_scan(rule, expected, ops):
    """The server rule read plainly (a scan of every waiting key per pop), for ``ops``: ("put",
    key) or ("pop",); returns what each pop gave."""
    count, waiting, out, arrivals = {}, {}, [], 0
    for op in ops:
        if op[0] == "put":
            n = count.get(op[1], 0) + 1
            count[op[1]] = 0 if n >= expected else n
            waiting.setdefault(op[1], []).append(arrivals)
            arrivals += 1
        elif waiting:
            rank = ((lambda k: (count.get(k, 0), waiting[k][0])) if rule == "fewest-pushes"
                    else (lambda k: (k, waiting[k][0])))
            key = min(waiting, key=rank)
            out.append((key, waiting[key].pop(0)))
            if not waiting[key]:
                del waiting[key]
    return out


@pytest.mark.parametrize("rule", ["fewest-pushes", "lowest-key"])
def test_the_server_queues_heap_pops_as_the_rule_reads(rule):
    """ServerQueue's heap (O(log n) a pop) gives, over 3000 random puts and pops of 40 keys at
    3 pushers, exactly the pops of the rule applied by scanning every waiting key."""
    import random
    rng = random.Random(7)
    ops = [("put", rng.randrange(40)) if rng.random() < 0.55 else ("pop",) for _ in range(3000)]
    q, got = ps.ServerQueue(rule, expected=3), []
    for op in ops:
        if op[0] == "put":
            q.put(op[1], q.arrivals)
        elif len(q):
            got.append(q.pop())
    assert len(got) > 1000
    assert got == _rule_by_scan(rule, 3, ops)


def test_a_scheduling_server_sums_by_bytepss_rule():
    """A server with 3 pushers and BytePS's rule on one summing thread, held while it sums the
    first push (key 3 from worker 0); then pushes of keys 2 (workers 0 and 1), 1 and 0
    (worker 0) queue up. Released, it sums 1, 0, 2, 2 (fewest pushes of the round first, ties
    by arrival); every round's sum is right."""
    group = _PostingGroup()
    server = ps.Server(group, rank=3, nworkers=3, nservers=1, timeout_s=30)
    gate, first = threading.Event(), threading.Event()
    add = server._add

    def held(*args, **kw):
        if not first.is_set():
            first.set()
            assert gate.wait(30)
        return add(*args, **kw)
    server._add = held
    keys = {k: ps._Key(4, torch.float32) for k in range(4)}
    tag = ps.header_tag(0)
    session = threading.Thread(target=server._session,
                               args=(keys, [0, 1, 2], "fewest-pushes", 0, 1))
    session.start()

    def push(peer, key):
        group.deliver(peer, tag, torch.tensor([ps.OP_PUSH, key]))
        group.deliver(peer, ps.TAG_DATA + key, torch.full((4,), 10.0 * peer + key))
    push(0, 3)
    assert first.wait(30)
    for n, (peer, key) in enumerate([(0, 2), (1, 2), (0, 1), (0, 0)]):
        push(peer, key)
        _wait_for(lambda: server.scheduler.pending() == n + 1, "the pushes queued")
    gate.set()
    _wait_for(lambda: len(server.served) == 5, "the queued pushes summed")
    assert list(server.served) == [(3, 0), (1, 0), (0, 0), (2, 0), (2, 1)]
    for peer, key in [(1, 3), (1, 1), (1, 0), (2, 3), (2, 2), (2, 1), (2, 0)]:
        push(peer, key)
    for peer in range(3):
        group.deliver(peer, tag, torch.tensor([ps.OP_END, -1]))
    session.join(30)
    assert not session.is_alive()
    sums = {(p, key): t for p, key, t in group.sent}
    assert sorted(sums) == [(p, k) for p in range(3) for k in range(4)]
    assert all(torch.equal(t, torch.full((4,), 30.0 + 3 * key)) for (_, key), t in sums.items())


def test_a_server_spreads_its_keys_over_its_summing_threads_by_bytes():
    """4 summing threads: each key, at its first push, goes to the thread with the fewest bytes
    so far (ties: the lowest), as BytePS's server assigns its engine threads; a key stays on
    its thread."""
    summer = ps.PrioritySummer(ps._Summer(None, 30, "test"), {}, 2, None, "fewest-pushes", 4)
    summer.finish()                                   # (no thread sums: the queues are kept)
    for key, numel in [(0, 100), (1, 10), (2, 10), (3, 10), (4, 5), (1, 10), (5, 1)]:
        summer.put(0, key, torch.zeros(numel))
    assert summer._thread_of == {0: 0, 1: 1, 2: 2, 3: 3, 4: 1, 5: 2}
    assert summer.pending() == 7


# ------------------------------------------------------------- correctness, 1-4 workers

# Model x worker count (1-4) x server count (1, 2) x who pushes, pairwise for the suite's time
# budget: every worker count, both server counts with an odd and an even number of workers,
# each model with one and with two servers.
# Every run checks all four PS methods for 3 momentum-SGD steps, with random per-rank delays in
# the gradient hooks when there are several workers (pushes then leave in a different order on
# each worker). Clients per machine (the default) on one machine (one pusher summing 2-3
# workers) and on 2 logical machines of 2 workers (--slots 2: two pushers, each summing two);
# clients per process with 3 workers on 2 servers.
# The 3-worker CNN row also runs the other placement and byteschedulerps's other server rule
# (the suite's lowest-key, on one summing thread); the 2 machines of the BERT row byteschedulerps
# with BytePS's rule (the default) over 8 summing threads.
MATRIX = [("cnn", 2, 1, [FORCE]),
          ("cnn", 3, 2, ["--ps-clients", "process", FORCE, "--ps-placement", "key-mod",
                         "--server-rule", "lowest-key", "--engine-threads", "1"]),
          ("bert", 1, 2, [FORCE]), ("bert", 3, 1, [FORCE]), ("bert", 4, 2, ["--slots", "2"])]


@pytest.mark.timeout(600)
@pytest.mark.parametrize("model,nworkers,nservers,extra", MATRIX)
def test_ps_methods_equal_the_reference(tmp_path, model, nworkers, nservers, extra):
    workload = CNN_PS if model == "cnn" else BERT_PS
    jitter = {"DDLBENCH_TEST_HOOK_JITTER_MS": 10} if nworkers > 1 else {}
    traced = model == "cnn"  # each method's trace at 2 and 3 workers
    proc = train(*workload, "--verify", "3", "--method", ",".join(PS_METHODS), *MOMENTUM_SGD,
                 "--nworkers", str(nworkers), "--nservers", str(nservers), "--no-cuda",
                 *extra, *(traces.verify_timeline(tmp_path) if traced else []),
                 timeout=540, **jitter)
    assert proc.returncode == 0, describe(proc)
    if traced:
        traces.check_verify_traces(tmp_path, proc.stdout, PS_METHODS, nworkers, 3)
    lines = verify_lines(proc.stdout)
    assert set(lines) == set(PS_METHODS), describe(proc)
    for method in PS_METHODS:
        steps = lines[method]
        assert [s for s, *_ in steps] == [1, 2, 3], method
        assert all(ok for *_, ok in steps), (method, steps)
    assert "replicas differ" not in proc.stdout


# (--method all with no --nservers on one machine, no server: test_verify.py's AdamW run.)


@pytest.mark.timeout(300)
def test_more_servers_than_partitions_is_still_correct():
    proc = train(*TINY_BERT, "--verify", "2", "--method", "bspps", "--nworkers", "2",
                 "--nservers", "3", "--partition-bytes", str(10 ** 9), "--no-cuda", FORCE,
                 timeout=280)
    assert proc.returncode == 0, describe(proc)
    assert all(ok for *_, ok in verify_lines(proc.stdout)["bspps"])


# ---------------------------------------------------------------- what a benchmark records

# (method, extra flags, pushers): per process, each of the 2 workers pushes; per machine,
# on one machine, worker 0 alone pushes the machine's sum; on 2 logical machines of 2
# workers (--slots 2), workers 0 and 2.
# The first two also write their timeline (tests/test_timeline.py lists which tests carry
# which method's); bspps shows a run without a trace file records nothing on the servers, in a
# job that times wfbpps next on the same servers: each record counts its own method's traffic.
RECORD_CASES = [("wfbpps", ["--ps-clients", "process", FORCE], 2, [0, 1]),
                ("byteschedulerps-worker", [FORCE], 3, [0]),
                ("bspps,wfbpps", ["--slots", "2"], 4, [0, 2])]


# What each method of RECORD_CASES did, with 2 servers (the record's ``method.algorithm``).
RECORD_ALGORITHM = {
    "wfbpps": {"worker_schedule": "from_hooks", "server_schedule": "arrival", "servers": 2,
               "threshold_bytes": 0},
    "byteschedulerps-worker": {"worker_schedule": "bytescheduler",
                               "server_schedule": "priority", "servers": 2,
                               "threshold_bytes": None},
    "bspps": {"worker_schedule": "after_backward", "server_schedule": "arrival", "servers": 2,
              "threshold_bytes": None}}


def _check_ps_record(proc, rec, extra, nworkers, pushers):
    """One PS method's record: bytes per iteration, partitions, pushers, and the servers'
    counters of its own steps (warm-up 1 + 2 rounds of 2)."""
    grad = rec["model"]["gradient_bytes"]
    per_iter = rec["communication_per_iteration"]
    # Each worker hands its whole gradient to push/pull and gets the whole sum, every
    # iteration (to the servers, or to its machine's leader).
    assert per_iter["payload_bytes"] == {"push": grad, "pull": grad}
    parts = rec["method"]["partitions"]
    assert per_iter["calls"]["push"] == parts
    assert rec["config"]["nservers"] == 2 and rec["method"]["nservers"] == 2
    assert rec["method"]["algorithm"] == RECORD_ALGORITHM[rec["config"]["method"]]
    assert rec["method"]["parameter_servers"] == "2"
    assert rec["method"]["partition_bytes"] == 65536
    assert rec["method"]["ps_clients"] == ("process" if "process" in extra else "machine")
    assert rec["method"]["pushers"] == pushers
    assert rec["method"]["pushes_per_partition"] == len(pushers)
    servers = rec["servers"]
    assert [s["rank"] for s in servers] == [nworkers, nworkers + 1]
    # Every push of every step so far (warm-up 1 + 2 rounds of 2) reached a server: exactly
    # one per pusher per partition, and every sum went back to each pusher.
    steps = 1 + 2 * 2
    assert sum(s["pushes_received"] for s in servers) == len(pushers) * parts * steps
    assert sum(s["bytes_received"] for s in servers) == len(pushers) * grad * steps
    assert sum(s["bytes_sent"] for s in servers) == len(pushers) * grad * steps
    assert all(s["pushers"] == len(pushers) for s in servers)
    # and each server carried what the plan put on it (method.bytes_per_server, its
    # --ps-placement), per pusher and step
    per_server = rec["method"]["bytes_per_server"]
    assert sum(per_server) == grad and rec["method"]["ps_placement"] == "least-loaded"
    assert [s["bytes_received"] for s in servers] == [len(pushers) * b * steps
                                                      for b in per_server]
    assert all(s["rss_bytes"] >= s["rss_bytes_at_start"] > 0 for s in servers)
    assert "Parameter servers: 2, partition 65536 bytes" in proc.stdout


def _check_total_lines(stdout, method, rec, machines):
    """One ``Total`` line per worker machine, as the original's BytePS scripts printed (each
    machine's first worker's own rounds); on one machine the protocol's line, the record's."""
    part = stdout.split(f"Method: {method} (")[1].split("\nMethod: ")[0]
    totals = [float(ln.split(": ")[-1].split()[0]) for ln in part.splitlines() if "Total" in ln]
    assert len(totals) == machines, part
    res = rec["result"]
    if machines == 1:
        assert res["machine_totals"] is None
        assert totals[0] == pytest.approx(res["throughput"]["mean"], abs=0.051)
        return
    assert [m["rank"] for m in res["machine_totals"]] == [0, 2]   # --slots 2: ranks 0 and 2
    assert totals == [pytest.approx(m["mean"], abs=0.051) for m in res["machine_totals"]]
    # each machine's own rounds are no slower than the slowest rank's, the protocol's
    assert all(m["mean"] >= res["throughput"]["mean"] * (1 - 1e-9) for m in res["machine_totals"])


@pytest.mark.timeout(300)
@pytest.mark.parametrize("method,extra,nworkers,pushers", RECORD_CASES)
def test_record_counts_pushed_and_pulled_bytes(tmp_path, load_json, method, extra, nworkers,
                                               pushers):
    out = tmp_path / ("rec_{method}.json" if "," in method else "rec.json")
    trace = tmp_path / "trace.json"
    # A benchmark takes only its method's options: the credit is byteschedulerps-worker's.
    workload = BERT_PS if method == "byteschedulerps-worker" else BERT_PS[:-2]
    traced = "," not in method
    proc = train(*workload, *QUICK_TIMING, "--method", method, "--nworkers", str(nworkers),
                 "--nservers", "2", "--no-cuda", "--output", str(out), *extra,
                 *(["--timeline", str(trace)] if traced else []), timeout=280)
    assert proc.returncode == 0, describe(proc)
    for name in method.split(","):
        rec = load_json(str(out).replace("{method}", name))
        _check_ps_record(proc, rec, extra, nworkers, pushers)
        _check_total_lines(proc.stdout, name, rec, len(pushers) if "--slots" in extra else 1)
    if not traced:   # the counters alone; the servers recorded nothing
        assert rec["timeline"]["trace"] is None and rec["timeline"]["servers"] is None
        assert rec["timeline"]["recorded_iterations"] == 4 and rec["timeline"]["comm_observed"]
        return
    grad, parts = rec["model"]["gradient_bytes"], rec["method"]["partitions"]
    # The timeline of the 4 timed steps: every worker's push/pull of every partition, once a
    # step, whoever it goes to (its server, or its machine's leader); pushes may go in a
    # different order on each worker (the servers match them by key).
    rows = traces.check_run_trace(trace, nworkers, 4, same_collectives=False)
    traces.check_record(rec["timeline"], nworkers, 4, trace)
    for rank in range(nworkers):
        pushes = [e for (p, _), evs in rows.items() if p == rank for e in evs
                  if e.get("cat") == "comm"]
        assert sorted(e["args"]["key"] for e in pushes) == sorted(list(range(parts)) * 4)
        assert sum(e["args"]["bytes"] for e in pushes) == 4 * grad


def _children_alive(proc):
    try:
        return [c for c in psutil.Process(proc.pid).children(recursive=True) if c.is_running()]
    except psutil.NoSuchProcess:
        return []


def _start_long_run(nworkers, nservers, method, clients="machine"):
    args = [sys.executable, "-m", "ddlbench.train", *TINY_BERT, "--method", method,
            "--nworkers", str(nworkers), "--nservers", str(nservers), "--no-cuda",
            "--num-warmup-batches", "1000000", "--timeout", "60", "--ps-clients", clients,
            FORCE]
    return subprocess.Popen(args, cwd=REPO, env=env(), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)


def _rank_process(proc, rank, deadline_s=120):
    """The spawned process with RANK=rank, once it is warming up."""
    deadline = time.monotonic() + deadline_s
    while time.monotonic() < deadline:
        for c in _children_alive(proc):
            try:
                if c.environ().get("RANK") == str(rank):
                    return c
            except psutil.Error:
                pass
        time.sleep(0.5)
    raise AssertionError("rank never started")


def _kill_and_collect(proc, victim, settle_s=3):
    # Let the job get into its training loop: rank 0 says so, then a few steps.
    head = []
    for line in proc.stdout:
        head.append(line)
        if line.startswith("Running warmup"):
            break
    time.sleep(settle_s)
    assert proc.poll() is None, (head, proc.communicate())
    victim.kill()
    start = time.monotonic()
    try:
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    return out, err, time.monotonic() - start


def _error_line(err, who, *words):
    return any(line.startswith(f"ddlbench: {who}: ") and all(w in line for w in words)
               for line in err.splitlines())


@pytest.mark.timeout(240)
@pytest.mark.parametrize("method,clients", [("wfbpps", "machine"),
                                            ("byteschedulerps-worker", "process")])
def test_a_dead_server_stops_every_worker_naming_it(method, clients):
    proc = _start_long_run(2, 1, method, clients)
    server = _rank_process(proc, 2)
    pids = [c.pid for c in _children_alive(proc)]
    out, err, took = _kill_and_collect(proc, server)
    assert proc.returncode != 0
    assert took < 30, err
    # Every client of the server names it; per machine, worker 1 pushes through worker 0,
    # its machine's leader, and names that.
    assert _error_line(err, "worker 0", "error:", "parameter server 0 (rank 2)"), err
    if clients == "process":
        assert _error_line(err, "worker 1", "error:", "parameter server 0 (rank 2)"), err
    else:
        assert _error_line(err, "worker 1", "error:", "worker 0, this machine's leader"), err
    assert "Traceback" not in err, err
    assert not [p for p in pids if psutil.pid_exists(p) and
                psutil.Process(p).status() != psutil.STATUS_ZOMBIE]


@pytest.mark.timeout(240)
@pytest.mark.parametrize("clients", ["process", "machine"])
def test_a_dead_worker_stops_the_servers_and_the_other_workers(clients):
    proc = _start_long_run(2, 2, "wfbpps", clients)
    worker = _rank_process(proc, 1)
    pids = [c.pid for c in _children_alive(proc)]
    out, err, took = _kill_and_collect(proc, worker)
    assert proc.returncode != 0
    assert took < 30, err
    # Whoever it pushed to names the worker it lost, at once (before the spawner stops
    # anything): each server, or per machine its leader, whose servers then name it.
    lost = "worker 1" if clients == "process" else "worker 0"
    for s, rank in ((0, 2), (1, 3)):
        assert _error_line(err, f"parameter server {s} (rank {rank})", f"{lost} failed"), err
    if clients == "machine":
        assert _error_line(err, "worker 0", "error:", "worker 1 failed"), err
    assert not [p for p in pids if psutil.pid_exists(p) and
                psutil.Process(p).status() != psutil.STATUS_ZOMBIE]


# ---------------------------------------------------------------------------- bad input

@pytest.mark.parametrize("args,message", [
    (["--nservers", "0"], "--nservers must be positive, got 0"),
    (["--nservers", "-2"], "--nservers must be positive, got -2"),
    (["--partition-bytes", "0"], "--partition-bytes must be at least 4096 bytes, got 0"),
    (["--compressor", "topk"], "cannot take --compressor topk"),
])
def test_bad_ps_input_is_one_line(args, message):
    proc = train(*TINY_BERT, "--method", "wfbpps", "--nworkers", "2", *args, timeout=120)
    assert proc.returncode == 2, describe(proc)
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("ddlbench: error: "), describe(proc)
    assert message in lines[0]


def test_ps_method_without_servers_under_a_launcher_is_refused():
    # As if started by mpirun -np 2 on two machines with no --nservers: no process is left to
    # be a server (on one machine none would be needed).
    e = dict(OMPI_COMM_WORLD_RANK="0", OMPI_COMM_WORLD_SIZE="2",
             OMPI_COMM_WORLD_LOCAL_SIZE="1", MASTER_ADDR="127.0.0.1")
    proc = train(*TINY_BERT, "--method", "bspps", timeout=120, **e)
    assert proc.returncode == 2, describe(proc)
    assert proc.stderr.strip() == ("ddlbench: error: method bspps needs parameter servers: "
                                   "--nservers S (under a launcher, S of its processes become "
                                   "servers)")


def test_unknown_host_in_the_config_is_one_line(tmp_path):
    hf = tmp_path / "hosts"
    hf.write_text("localhost slots=1\nno-such-host.invalid slots=1\n")
    proc = run(["bash", LAUNCHER], timeout=60, hostfile=str(hf), nworkers="2", dnn="bert_tiny")
    assert proc.returncode == 2, describe(proc)
    assert proc.stderr.strip() == (f"ddlbench: error: unknown host 'no-such-host.invalid' in "
                                   f"host file {hf}")


@pytest.mark.parametrize("var,value,message", [
    ("nservers", "0", "nservers must be a positive integer, got '0'"),
    ("partition_bytes", "-5", "partition_bytes must be an integer >= 4096, got '-5'"),
    ("bytescheduler", "2", "bytescheduler must be 0 or 1, got '2'"),
])
def test_launcher_bad_env_is_one_line(var, value, message):
    proc = run(["bash", LAUNCHER], timeout=60, nworkers="2", **{var: value})
    assert proc.returncode == 2, describe(proc)
    assert proc.stderr.strip() == f"byteps/byteps_launch.sh: error: {message}"


# ------------------------------------------------------------------------------ launchers

SMALL_ENV = dict(dnn="bert_tiny", bs="4", senlen="16", iters="2",
                 extra_args="--num-warmup-batches 1 --num-batches-per-iter 2 --timeout 60 "
                            "--no-cuda")


@pytest.mark.timeout(300)
def test_launcher_on_localhost_spawns_workers_and_no_server(tmp_path, load_json):
    """One machine (configs/cluster2: localhost): the original's ByteScheduler-PS runs as
    BytePS did there, with no server (a local reduce and broadcast), whatever nservers says."""
    out = tmp_path / "rec.json"
    proc = run(["bash", LAUNCHER], timeout=280, hostfile=f"{REPO}/configs/cluster2",
               nworkers="2", nservers="1", bytescheduler="1",
               **dict(SMALL_ENV, extra_args=SMALL_ENV["extra_args"] + f" --output {out}"))
    assert proc.returncode == 0, describe(proc)
    rec = load_json(out)
    assert rec["config"]["method"] == "byteschedulerps"
    assert rec["config"]["nservers"] == 0 and rec["servers"] is None
    assert rec["method"]["algorithm"] == {"worker_schedule": "from_hooks",
                                          "server_schedule": None, "servers": 0,
                                          "threshold_bytes": 0}
    assert rec["method"]["parameter_servers"] == ONE_MACHINE
    assert f"Parameter servers: {ONE_MACHINE}" in proc.stdout.splitlines()
    assert f"ddlbench: note: {pslaunch.ONE_MACHINE_NOTE}" in proc.stderr.splitlines()
    assert "--nworkers 2 --job-id" in proc.stderr and "--nservers" not in proc.stderr


ONE_MACHINE = "none (one machine: local reduce and broadcast, as BytePS)"


@pytest.mark.timeout(300)
def test_a_one_machine_ps_job_starts_no_server_and_verifies():
    """Every PS method on one machine (2 workers on the loopback, 3 on --slots 3): no server
    process (the job's processes are its workers), the local reduce and broadcast, and the
    parameters of single-process SGD on the averaged gradient, with pushes in a different
    order on each worker (jitter in the hooks)."""
    for nworkers, extra in ((2, []), (3, ["--slots", "3"])):
        proc = train(*BERT_PS, "--verify", "2", "--method", ",".join(PS_METHODS),
                     *MOMENTUM_SGD, "--nworkers", str(nworkers), "--no-cuda", *extra,
                     timeout=280, DDLBENCH_TEST_HOOK_JITTER_MS=10)
        assert proc.returncode == 0, describe(proc)
        assert f"verify: parameter servers: {ONE_MACHINE}" in proc.stdout.splitlines()
        lines = verify_lines(proc.stdout)
        assert set(lines) == set(PS_METHODS), describe(proc)
        for method in PS_METHODS:
            assert [s for s, *_ in lines[method]] == [1, 2], method
            assert all(ok for *_, ok in lines[method]), (method, lines[method])
        assert f"{nworkers} worker(s)" in proc.stdout


def test_servers_on_one_machine_need_the_force_flag():
    proc = train(*TINY_BERT, "--method", "wfbpps", "--nworkers", "2", "--nservers", "1",
                 "--no-cuda", timeout=120)
    assert proc.returncode == 2, describe(proc)
    assert proc.stderr.strip() == (
        "ddlbench: error: --nservers 1: the 2 worker(s) are on one machine, where a PS job "
        "runs no server (a local reduce and broadcast, as BytePS); add --ps-force-servers to "
        "start servers anyway")


def test_the_one_machine_rule():
    """Which jobs have their workers on one machine (docs/DESIGN.md section 6)."""
    from ddlbench import flags

    def one(argv, env=None):
        args = flags.parse_args(["--method", "wfbpps", *argv])
        return flags.one_machine(args, env or {})
    assert one(["--nworkers", "4"])                          # the loopback
    assert one(["--nworkers", "4", "--slots", "4"])
    assert not one(["--nworkers", "4", "--slots", "2"])      # 2 emulated hosts
    assert not one(["--nworkers", "2", "--net", "1gbit"])    # one host per worker
    assert one(["--nworkers", "1", "--net", "1gbit"])
    dmlc = dict(DMLC_ROLE="worker", DMLC_PS_ROOT_URI="h", DMLC_PS_ROOT_PORT="1",
                DMLC_NUM_SERVER="0", DMLC_WORKER_ID="0", BYTEPS_LOCAL_SIZE="4")
    assert one([], dict(dmlc, DMLC_NUM_WORKER="1"))
    assert not one([], dict(dmlc, DMLC_NUM_WORKER="2"))
    mpi = dict(OMPI_COMM_WORLD_RANK="0", OMPI_COMM_WORLD_SIZE="4")
    assert one([], dict(mpi, OMPI_COMM_WORLD_LOCAL_SIZE="4"))
    assert not one([], dict(mpi, OMPI_COMM_WORLD_LOCAL_SIZE="2"))
    # the PS launcher's: a host file with one host, remote or local, or all of this machine
    hosts = [Host("127.0.0.2", 4)]
    assert pslaunch.one_machine(hosts, ["127.0.0.2"] * 4, [], 4)
    two = [Host("127.0.0.2", 4), Host("127.0.0.3", 4)]
    assert not pslaunch.one_machine(two, ["127.0.0.2"] * 4 + ["127.0.0.3"] * 4, [], 8)
    local = [Host("localhost", 2), Host("127.0.0.1", 2)]
    assert pslaunch.one_machine(local, ["localhost"] * 2 + ["127.0.0.1"] * 2, [], 4)
    assert not pslaunch.one_machine(local, [], ["--slots", "2"], 4)


# (rule, the keys of parameters 0..5 of b.weight b.bias c.weight c.bias a.weight a.bias)
@pytest.mark.parametrize("rule,keys", [
    # BytePS's: keys in sorted parameter-name order, as the original declared them
    ("fewest-pushes", [3, 2, 5, 4, 1, 0]),
    # the suite's earlier rule: keys front layers first
    ("lowest-key", [0, 1, 2, 3, 4, 5])])
def test_the_original_byteschedulerps_pushes_from_hooks_for_a_priority_server(rule, keys):
    """byteschedulerps (the original's): one push per tensor, each from its gradient hook,
    all before step() (no credit window holds any back), in backward order, the session
    opened with the server rule and its engine threads, keys numbered as the rule wants
    them: sorted parameter names (a.bias, a.weight, b.bias, ...) for BytePS's fewest-pushes,
    front layers first for lowest-key. The record names rule, threads, order and placement.
    (The servers' order: test_server_sums_pending_pushes_in_priority_order and
    test_the_server_queue_pops_as_bytepss.)"""
    from collections import OrderedDict

    from torch import nn

    from ddlbench import methods
    from ddlbench.runtime.comm import Comm
    client = _RecordingClient()
    model = nn.Sequential(OrderedDict(b=nn.Linear(4, 8), c=nn.Linear(8, 8), a=nn.Linear(8, 2)))
    params = list(model.parameters())
    opt = torch.optim.SGD(params, lr=0.1)
    method = methods.create("byteschedulerps", model, opt, Comm(0, 1, ps=client),
                            {"server_rule": rule, "engine_threads": 3})
    with method:
        assert (client.schedule, client.engine_threads) == (rule, 3)
        assert client.placement == "least-loaded"
        by_key = sorted(range(6), key=lambda i: keys[i])
        assert client.units == [(params[i].numel(), params[i].dtype) for i in by_key]
        model(torch.randn(3, 4)).sum().backward()
        _wait_for(lambda: len(client.pushed) == 6, "six pushes before step()")
        assert client.pushed == [keys[i] for i in (5, 4, 3, 2, 1, 0)]
        method.step()
        d = method.describe()
        assert d["algorithm"] == {
            "worker_schedule": "from_hooks", "server_schedule": "priority", "servers": 1,
            "threshold_bytes": 0}
        assert d["server_rule"].startswith(rule + ": ") and d["engine_threads"] == 3
        assert d["ps_placement"] == "least-loaded"
        assert d["key_order"].startswith("sorted parameter names" if rule == "fewest-pushes"
                                         else "model.parameters() order")


class _RecordingClient:
    """A worker's end of ``nservers`` servers that records the session and the pushes."""
    partition_bytes, clients, pushers = 4096000, "machine", [0]

    def __init__(self, nservers=1):
        self.nservers = nservers
        self.pushed, self.units, self.schedule = [], None, None

    def open(self, units, schedule=None, placement="least-loaded", engine_threads=1):
        self.units, self.schedule = list(units), schedule
        self.placement, self.engine_threads = placement, engine_threads
        return ps.plan(units, self.partition_bytes, self.nservers, placement)

    def push_pull(self, part, data):
        self.pushed.append(part.key)
        return _Work()

    def close(self):
        pass


# Bytes per server per worker-step with 2 servers and BytePS's 4,096,000-byte partitions, as
# each method plans them for the model (method.bytes_per_server): byteschedulerps keys its
# tensors in sorted parameter-name order (BytePS's rule), wfbpps in push order (backward).
# Least-loaded: SqueezeNet 1.1 2.34/2.60 MB and ResNet-18 23.46/23.30 MB for byteschedulerps
# (the figures); key-mod puts every bias on one server and every weight on the other
# for SqueezeNet (0.02/4.93 MB for wfbpps, as the issue measured).
PLACED = [("squeezenet1_1", "byteschedulerps", "least-loaded", [2342944, 2599040]),
          ("squeezenet1_1", "wfbpps", "least-loaded", [2473312, 2468672]),
          ("squeezenet1_1", "wfbpps", "key-mod", [15776, 4926208]),
          ("squeezenet1_1", "byteschedulerps", "key-mod", [15776, 4926208]),
          ("resnet18", "byteschedulerps", "least-loaded", [23459840, 23298208]),
          ("resnet18", "wfbpps", "least-loaded", [23329952, 23428096]),
          ("resnet18", "wfbpps", "key-mod", [23358880, 23399168]),
          ("resnet18", "byteschedulerps", "key-mod", [21929472, 24828576])]


@pytest.mark.parametrize("model_name,method_id,placement,per_server", PLACED)
def test_bytes_per_server_as_placed(model_name, method_id, placement, per_server):
    """The method's own plan (its units opened on a recording client of 2 servers) and the
    record's bytes_per_server; every gradient byte on exactly one server; the model prices
    the same bytes on each server (its pushes of one iteration, from the parameters' sizes
    and names in backward order)."""
    import models
    from ddlbench import methods
    from ddlbench.runtime.comm import Comm
    model = models.build(model_name).model
    grad = sum(p.numel() * p.element_size() for p in model.parameters())
    client = _RecordingClient(nservers=2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    method = methods.create(method_id, model, opt, Comm(0, 1, ps=client),
                            {"ps_placement": placement})
    with method:
        d = method.describe()
    assert client.placement == placement
    assert d["bytes_per_server"] == per_server and sum(per_server) == grad
    assert d["ps_placement"] == placement
    from ddlbench.model import simulate
    named = list(model.named_parameters())[::-1]
    work = simulate.Compute(0.01, [1e-4] * len(named),
                            [p.numel() * p.element_size() for _, p in named],
                            names=[n for n, _ in named])
    links = simulate.ServerLinks(1e-5, 1e-9, 0.0, nservers=2, pushers=1)
    prediction = simulate.predict(method_id, work, None, servers=links, ps_placement=placement)
    priced = [0, 0]
    for name, _, _, _, _, args in prediction.events:
        if name == "push":
            priced[args["server"]] += args["bytes"]
    assert priced == per_server


@pytest.mark.timeout(300)
def test_launcher_over_ssh_uses_the_dmlc_variables(tmp_path, load_json):
    """Two 'remote' hosts (127.0.0.2 and 127.0.0.3 through a stand-in for ssh): one worker and
    one server each, started with the DMLC_* variables, rendezvous on the first host."""
    hf = tmp_path / "hosts"
    hf.write_text("127.0.0.2 slots=1\n127.0.0.3 slots=1\n")
    out = tmp_path / "rec.json"
    log = tmp_path / "ssh.log"
    proc = run(["bash", LAUNCHER], timeout=280, hostfile=str(hf), nworkers="2",
               threshold="536870912", SSH=FAKE_SSH, FAKE_SSH_LOG=str(log),
               **dict(SMALL_ENV, extra_args=SMALL_ENV["extra_args"] + f" --output {out}"))
    assert proc.returncode == 0, describe(proc)
    rec = load_json(out)
    assert rec["config"]["method"] == "bspps" and rec["config"]["nservers"] == 2
    assert rec["environment"]["launcher"] == "dmlc"
    assert [s["rank"] for s in rec["servers"]] == [2, 3]
    # One ssh to each host to see that it answers (all at once), one to choose the port on the
    # first host, then one worker and one server per host (started one after the other, but
    # each ssh logs when it runs: their order may vary).
    calls = log.read_text().splitlines()
    assert sorted(calls[:2]) == ["127.0.0.2", "127.0.0.3"] and calls[2] == "127.0.0.2", calls
    assert sorted(calls[3:]) == ["127.0.0.2 DMLC_ROLE=server", "127.0.0.2 DMLC_ROLE=worker",
                                 "127.0.0.3 DMLC_ROLE=server", "127.0.0.3 DMLC_ROLE=worker"], calls


@pytest.mark.timeout(300)
def test_interrupting_the_launcher_leaves_no_process(tmp_path):
    hf = tmp_path / "hosts"
    hf.write_text("127.0.0.2 slots=1\n127.0.0.3 slots=1\n")
    e = env(hostfile=str(hf), nworkers="2", SSH=FAKE_SSH, dnn="bert_tiny", bs="4", senlen="16",
            extra_args="--num-warmup-batches 1000000 --timeout 60 --no-cuda --job-id pstest1")
    proc = subprocess.Popen(["bash", LAUNCHER], cwd=REPO, env=e, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)

    def job_processes():
        return [p for p in psutil.process_iter(["cmdline"])
                if "--job-id pstest1" in " ".join(p.info["cmdline"] or [])
                and "ddlbench.train" in " ".join(p.info["cmdline"] or [])]
    try:
        deadline = time.monotonic() + 120
        while len(job_processes()) < 4 and time.monotonic() < deadline:
            time.sleep(0.5)
        assert len(job_processes()) >= 4, proc.stderr.read() if proc.poll() is not None else ""
        time.sleep(5)
        proc.send_signal(signal.SIGINT)
        proc.wait(timeout=60)
        assert proc.returncode != 0
        deadline = time.monotonic() + 30
        while job_processes() and time.monotonic() < deadline:
            time.sleep(0.5)
        assert job_processes() == []
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        for p in job_processes():
            p.kill()

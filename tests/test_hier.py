"""``hier``, the hierarchical all-reduce on the groups of the placement: right against the
single-process reference on 2 emulated machines x 2 slots (momentum SGD, buckets of several
sizes, some padded), a failed collective of its pipeline named with its stage, bucket and
group, its bytes per worker per group those of its declared collectives, the model's pipeline
(each step a FIFO of its own) against its recurrence written apart, and a job whose machines
hold different numbers of workers refused in one line."""
import re

from ddlbench import collectives

from .conftest import MOMENTUM_SGD, TINY_BERT, describe, train, verify_lines
from .test_group_plugin import TOPOLOGY   # 2 machines x 2 devices, 1 Gbit/s between them

MACHINES = ["--nworkers", "4", "--slots", "2"]   # 2 emulated machines x 2 slots
THRESHOLD = ["--threshold", "300000"]


def test_hier_verifies_and_sends_its_declared_bytes_on_two_machines(
        two_machines_hsdp_hier_zero1, load_json):
    """(Its bytes: hier's record of conftest's timed job on 2 machines x 2.)"""
    proc = train(*TINY_BERT, *MACHINES, *MOMENTUM_SGD, *THRESHOLD, "--verify", "3",
                 "--method", "hier,tests.hier_serial:HierSerial,"
                 "tests.broken_methods:HierAcrossFails", timeout=300)
    for method in ("hier", "tests.hier_serial:HierSerial"):   # (the serial form RESULTS times)
        assert [ok for *_, ok in verify_lines(proc.stdout)[method]] == [True] * 3, describe(proc)
    # a stage's failed collective names the stage, the bucket and the group
    assert proc.returncode != 0
    assert re.search(r"test-hier-across-fails-across: could not issue bucket 0 \(.*\): "
                     r"CollectiveFailed: method test-hier-across-fails: the reduce-scatter of "
                     r"bucket 0 \(.*\) on group machine \(ranks [02], [13]\) failed: "
                     r"RuntimeError: injected: connection closed by peer", proc.stderr), \
        describe(proc)

    proc, job = two_machines_hsdp_hier_zero1
    assert proc.returncode == 0, describe(proc)
    rec = load_json(job / "hier.json")
    assert rec["method"]["groups"]["machine"] == [[0, 1], [2, 3]]
    assert rec["method"]["groups"]["across"] == [[0, 2], [1, 3]]
    buckets = rec["method"]["bucket_bytes"]
    assert len(buckets) > 2
    # each bucket padded to whole elements per local worker (l = 2), then: inside the machine
    # (l-1)/l of it reduce-scattered and as much all-gathered, across 2(n-1)/n of its half
    padded = [-(-b // 8) * 8 for b in buckets]
    inside = sum(collectives.sent_bytes("reduce_scatter", b, 2, carrier="a2a", backend="gloo")
                 + collectives.sent_bytes("allgather", b // 2, 2) for b in padded)
    across = sum(collectives.sent_bytes("allreduce", b // 2, 2) for b in padded)
    assert inside == sum(padded) and across == sum(padded) // 2
    by_group = rec["communication_per_iteration"]["wire_sent_bytes_by_group"]
    assert sum(by_group["machine"].values()) == inside
    assert by_group["across"] == {"allreduce": across}
    assert rec["communication_per_iteration"]["wire_sent_bytes"].get("allreduce") == across


def test_hier_refuses_machines_of_different_sizes():
    proc = train(*TINY_BERT, "--nworkers", "3", "--slots", "2", "--verify", "1",
                 "--method", "hier", timeout=300)
    assert proc.returncode != 0
    assert ("method hier needs as many workers on every machine (its shards must match "
            "across machines); this job's machines hold 2, 1") in proc.stderr, describe(proc)


def test_hier_is_predicted_as_fusion_over_the_hierarchical_all_reduce_pipelined(tmp_path):
    """The model replays hier's buckets (fusion's) with its declared collectives on the
    topology's groups, pipelined: at 4 workers on 2 x 2 with one message exactly fusion's time
    when the topology's all-reduce is the hierarchical one, with several messages faster (a
    bucket's all-reduce across overlaps the next one's reduce-scatter), and faster than the
    flat ring's; a measured network, which knows no machines, cannot price it (one line)."""
    import pytest

    from ddlbench.errors import UsageError
    from ddlbench.model import cell, simulate, topology
    ring, hier = tmp_path / "ring.yaml", tmp_path / "hier.yaml"
    ring.write_text(TOPOLOGY)
    hier.write_text(TOPOLOGY + "allreduce: hierarchical\n")
    ring, hier = topology.Topology(str(ring)), topology.Topology(str(hier))
    work = simulate.Compute(forward_s=0.02, backward_s=[0.004, 0.003, 0.002, 0.001],
                            nbytes=[4 << 20, 1 << 20, 65536, 6 << 20], optimizer_s=0.002)
    for threshold in (0.0, 2e6, 64e6):
        options = simulate.options_for("hier", None, threshold=threshold)
        got = cell.predict("hier", work, 4, options, network=ring).prediction
        same = cell.predict("fusion", work, 4, options, network=hier).prediction
        flat = cell.predict("fusion", work, 4, options, network=ring).prediction
        assert got.groups == same.groups
        if len(got.groups) == 1:
            assert got.iteration_s == pytest.approx(same.iteration_s, rel=1e-12)
        else:
            assert got.iteration_s < same.iteration_s * (1 - 1e-3)
        assert got.iteration_s < flat.iteration_s
    assert cell.on_machines("hier") and not cell.on_machines("fusion")
    with pytest.raises(UsageError, match="method hier runs reduce_scatter @machine, allreduce "
                                         "@across, allgather @machine per message"):
        cell.predict("hier", work, 4, link=simulate.Link(1e-4, 1e-9))


def test_a_pipelined_exchange_follows_the_stage_recurrence():
    """Each step of a pipelined exchange is a FIFO of its own: message m's step k starts when
    its step k-1 is done and step k is free of message m-1 (a waiting step pays the link's
    queueing cost), written apart here; the channel takes the next message once the first
    step is done."""
    import pytest

    from ddlbench.model import simulate
    links = [simulate.Link(0.001, 1e-8, queued_s=0.0005), simulate.Link(0.002, 4e-8),
             simulate.Link(0.0015, 1e-8, queued_s=0.0002)]
    steps = tuple((op, share, link) for op, share, link in
                  zip(("reduce_scatter", "allreduce", "allgather"), (1.0, 0.5, 1.0), links))
    t = simulate._AllReduce(links[0], simulate.NO_CODEC, 1, steps=steps, pipelined=True)
    ready = [0.0, 0.001, 0.0011, 0.05]
    sizes = [400_000, 100_000, 800_000, 8]
    got = [t.send(r, [(n // 4,)], None)[1] for r, n in zip(ready, sizes)]
    stage, lane, want, spans = [0.0] * 3, 0.0, [], []
    for r, n in zip(ready, sizes):
        at = max(r, lane)
        for k, (_op, share, link) in enumerate(steps):
            waits = stage[k] > at
            at = max(at, stage[k])
            end = at + link.alpha + link.beta * n * share + (link.queued_s if waits else 0.0)
            spans.append((at, end))
            stage[k] = at = end
        lane = stage[0]
        want.append(at)
    assert got == pytest.approx(want, rel=1e-12, abs=0)
    assert [x / 1e6 for e in t.events for x in e[3:5]] == pytest.approx(
        [x for span in spans for x in span], rel=1e-12)
    serial = simulate._AllReduce(links[0], simulate.NO_CODEC, 1, steps=steps)
    last = [serial.send(r, [(n // 4,)], None)[1] for r, n in zip(ready, sizes)][-2]
    assert got[-2] < last - 0.002    # the third message's steps overlapped the second's

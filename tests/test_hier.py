"""``hier``, the hierarchical all-reduce on the groups of the placement: right against the
single-process reference on 2 emulated machines x 2 slots (momentum SGD, buckets of several
sizes, some padded), its bytes per worker per group those of its declared collectives, and a
job whose machines hold different numbers of workers refused in one line."""
from ddlbench import collectives

from .conftest import MOMENTUM_SGD, QUICK_TIMING, TINY_BERT, describe, train, verify_lines
from .test_group_plugin import TOPOLOGY   # 2 machines x 2 devices, 1 Gbit/s between them

MACHINES = ["--nworkers", "4", "--slots", "2"]   # 2 emulated machines x 2 slots
THRESHOLD = ["--threshold", "300000"]


def test_hier_verifies_and_sends_its_declared_bytes_on_two_machines(tmp_path, load_json):
    proc = train(*TINY_BERT, *MACHINES, *MOMENTUM_SGD, *THRESHOLD, "--verify", "3",
                 "--method", "hier", timeout=300)
    assert proc.returncode == 0, describe(proc)
    assert [ok for *_, ok in verify_lines(proc.stdout)["hier"]] == [True] * 3

    out = tmp_path / "hier.json"
    proc = train(*TINY_BERT, *MACHINES, *QUICK_TIMING, *THRESHOLD, "--method", "hier",
                 "--output", str(out), timeout=300)
    assert proc.returncode == 0, describe(proc)
    rec = load_json(out)
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


def test_hier_is_predicted_as_fusion_over_the_hierarchical_all_reduce(tmp_path):
    """The model replays hier's buckets (fusion's) with its declared collectives on the
    topology's groups: at 4 workers on 2 x 2 exactly fusion's time when the topology's
    all-reduce is the hierarchical one, and faster than the flat ring's; a measured network,
    which knows no machines, cannot price it (one line)."""
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
        assert got.iteration_s == pytest.approx(same.iteration_s, rel=1e-12)
        assert got.iteration_s < flat.iteration_s
    assert cell.on_machines("hier") and not cell.on_machines("fusion")
    with pytest.raises(UsageError, match="method hier runs reduce_scatter @machine, allreduce "
                                         "@across, allgather @machine per message"):
        cell.predict("hier", work, 4, link=simulate.Link(1e-4, 1e-9))

"""The declared collectives (ddlbench.collectives): their byte formulas, carriers and group
layouts as exact figures, a collective nobody declared refused, and the declaration held to
what the kernel really sent on Gloo for every collective and carrier at 2, 3 and 4 ranks."""
import json
import os
import shutil
import subprocess
import sys

import pytest

from ddlbench import collectives as C
from ddlbench.errors import UsageError

from .conftest import REPO, describe

MB = 1_000_000


def test_bytes_each_rank_sends_at_four_ranks():
    # the module's table at P = 4, for a 1 MB message (all-gather: 250 kB contributed)
    assert C.sent_bytes("allreduce", MB, 4) == 1_500_000
    assert C.sent_bytes("reduce_scatter", MB, 4, carrier="a2a", backend="gloo") == 750_000
    assert C.sent_bytes("reduce_scatter", MB, 4, carrier="native", backend="gloo") == 1_500_000
    assert C.sent_bytes("reduce_scatter", MB, 4, carrier="native", backend="nccl") == 750_000
    assert C.sent_bytes("allgather", MB // 4, 4) == 750_000
    assert C.sent_bytes("all_to_all", MB, 4) == 750_000
    assert C.sent_bytes("broadcast", MB, 4, root=True) == 3 * MB
    assert C.sent_bytes("broadcast", MB, 4, root=False) == 0
    assert (C.sent_bytes("push", MB, 4), C.sent_bytes("pull", MB, 4)) == (MB, 0)
    assert C.sent_bytes("allreduce", MB, 1) == 0
    assert [C.bus_factor(op, 4) for op in C.RING_OPS] == [1.5, 0.75, 0.75, 0.75]
    assert C.bus_factor("pushpull", 8) == C.bus_factor("latency", 2) == 1.0


def test_carriers_default_per_backend_and_run_as_what_they_move():
    rs = C.declared("reduce_scatter")
    assert rs.carrier(backend="gloo").name == "a2a"
    assert rs.carrier(backend="nccl").name == "native"
    assert C.carried_as("reduce_scatter", backend="gloo") == "all_to_all"
    assert C.carried_as("reduce_scatter", "native", "gloo") == "allreduce"
    assert C.carried_as("reduce_scatter", "native", "nccl") == "reduce_scatter"
    assert C.carried_as("allgather", backend="gloo") == "allgather"
    assert C.carried_as("reduce_scatter", "ring", "gloo") == "reduce_scatter"
    with pytest.raises(UsageError, match="collective reduce_scatter has no carrier 'tree'; "
                                         "declared: a2a, native, ring"):
        rs.carrier("tree")


def test_ring_steps_invert():
    # all-reduce 2(P-1) steps of M/P, the others P-1: per-message alpha and beta and back
    for op, steps in (("allreduce", 6), ("reduce_scatter", 3), ("allgather", 3),
                      ("all_to_all", 3)):
        alpha, beta = C.ring_collective(op, 1e-5, 1e-9, 4)
        assert (alpha, beta) == pytest.approx((steps * 1e-5, steps * 1e-9 / 4))
        step = C.ring_link(op, alpha, beta, 4)
        assert (step["alpha_s"], step["beta_s_per_byte"]) == pytest.approx((1e-5, 1e-9))
    assert C.ring_link("broadcast", 1.0, 1.0, 4) is None


def test_an_undeclared_collective_cannot_be_issued_or_priced():
    with pytest.raises(UsageError, match="collective 'gather' is not declared"):
        C.sent_bytes("gather", MB, 4)
    with pytest.raises(UsageError, match="collective 'scan' is not declared"):
        C.ring_collective("scan", 1.0, 1.0, 4)
    from ddlbench.runtime.comm import Comm
    import torch
    with pytest.raises(UsageError, match="collective 'gather' is not declared"):
        Comm(0, 1).count("gather", 10, torch.float32)


def test_layouts_group_every_rank_once():
    two_by_two = [[0, 1], [2, 3]]
    assert C.layout_groups("world", two_by_two) == [[0, 1, 2, 3]]
    assert C.layout_groups("machine", two_by_two) == [[0, 1], [2, 3]]
    assert C.layout_groups("across", two_by_two) == [[0, 2], [1, 3]]
    uneven = [[0, 1, 2], [3]]   # host files may give machines different slots
    assert C.layout_groups("across", uneven) == [[0, 3], [1], [2]]
    assert [C.layout_size(layout, 8, 4) for layout in C.LAYOUTS] == [8, 4, 2]
    assert [C.layout_size(layout, 3, 4) for layout in C.LAYOUTS] == [3, 3, 1]
    with pytest.raises(UsageError, match="unknown group layout 'grid'"):
        C.layout_groups("grid", two_by_two)


def _netns_reason():
    if os.geteuid() != 0:
        return "counts the kernel's bytes in a network namespace of its own: needs root"
    if shutil.which("unshare") is None or shutil.which("ip") is None:
        return "unshare (util-linux) and ip (iproute2) are needed for a namespace of its own"
    return None


@pytest.mark.skipif(_netns_reason() is not None, reason=_netns_reason() or "")
def test_the_declared_bytes_are_what_gloo_sends(tmp_path):
    """Every declared collective and carrier on 2, 3 and 4 Gloo ranks: the loopback's
    transmitted bytes (a namespace of the test's own, nothing else on it) equal what Comm
    counted from the declaration within 2%; reduce-scatter's a2a carrier is the rank-order sum
    bit for bit and its native carrier the all-reduce's chunk bit for bit (Gloo's is an
    all-reduce: twice the bytes), so the two agree bit for bit at 2 ranks, not beyond."""
    out = tmp_path / "probe.json"
    proc = subprocess.run(["unshare", "-n", "sh", "-c", 'ip link set lo up && exec "$0" "$@"',
                           sys.executable, os.path.join(REPO, "tests", "collective_probe.py"),
                           str(out)], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, describe(proc)
    found = json.loads(out.read_text())
    rows = found["rows"]
    assert len(rows) == 21
    for row in rows:
        assert row["declared_bytes"] > 0
        assert row["kernel_bytes"] == pytest.approx(row["declared_bytes"], rel=0.02), row
    by = {(r["op"], r["carrier"], r["size"]): r["declared_bytes"] for r in rows}
    for p in (2, 3, 4):
        # native on Gloo sends an all-reduce's bytes, twice the a2a carrier's
        assert by[("reduce_scatter", "native", p)] == by[("allreduce", None, p)]
        assert by[("reduce_scatter", "native", p)] == 2 * by[("reduce_scatter", "a2a", p)]
        # the ring sends what the all-to-all sends, (P-1)/P of the tensor, to one neighbour
        assert by[("reduce_scatter", "ring", p)] == by[("reduce_scatter", "a2a", p)]
    same = {}
    for rank, sizes in enumerate(found["bitwise"]):
        for size, facts in sizes.items():
            if rank >= int(size):
                assert facts is None
                continue
            assert facts["a2a_is_rank_order"] and facts["native_is_allreduce_chunk"], facts
            assert facts["a2a_close_to_native"] and facts["ring_close_to_a2a"], facts
            same.setdefault(int(size), []).append(facts["a2a_is_native"])
    # the two sums differ only in their order: two terms commute exactly; at four ranks Gloo's
    # ring starts rank r's shard at rank r+2, not at rank 0
    assert same[2] == [True, True] and False in same[4]


def test_the_carriers_in_levels_give_the_flat_result_and_the_declared_bytes(tmp_path):
    """Reduce-scatter and all-gather by the ``two-level`` carrier on 4 Gloo ranks placed as 2
    machines x 2 (in rank order and interleaved), 4 x 1 and 1 x 4: every rank's result equals
    the single-process one exactly (integer-valued data: exact in any order), asynchronous
    and blocking alike, and each level's bytes are its declaration's on its group: inside the
    machine (l-1)/l of the tensor, across (n-1)/n of its 1/l chunk; (P-1)/P in all, as flat."""
    out = tmp_path / "levels.json"
    proc = subprocess.run([sys.executable, os.path.join(REPO, "tests", "levels_probe.py"),
                           str(out)], cwd=REPO, capture_output=True, text=True, timeout=300,
                          env={**os.environ, "PYTHONPATH": REPO})
    assert proc.returncode == 0, describe(proc)
    found = json.loads(out.read_text())
    message = 4 * 4 * 6 * 5                      # the probe's tensor, fp32 bytes
    shapes = {"2x2": (2, 2), "2x2 interleaved": (2, 2), "4x1": (4, 1), "1x4": (1, 4)}
    assert set(found) == set(shapes)
    for name, (n, l) in shapes.items():
        rs = {"machine": C.sent_bytes("reduce_scatter", message, l),
              "across": C.sent_bytes("reduce_scatter", message // l, n)}
        ag = {"machine": 2 * C.sent_bytes("allgather", message // l, l),     # twice: async,
              "across": 2 * C.sent_bytes("allgather", message // 4, n)}       # blocking
        for facts in found[name]:
            assert facts["rs"] and facts["ag"] and facts["ag_blocking"], (name, facts)
            assert facts["by_group"] == {g: {"reduce_scatter": rs[g], "allgather": ag[g]}
                                         for g in ("machine", "across")}, name
            assert facts["sent"] == {"reduce_scatter": 3 * message // 4,
                                     "allgather": 2 * 3 * message // 4}
    # at 2 x 2, what crosses the machines from a worker: a third of the flat a2a's (n-1)/n of
    # a 1/l chunk, 1/4 of the tensor, where the flat one sends 3/4, two of its three shards
    # to the other machine
    assert C.sent_bytes("reduce_scatter", message // 2, 2) == message // 4


def test_a_carrier_in_levels_is_priced_by_its_levels_only():
    ops = C.operations()
    assert "reduce_scatter:two-level" not in ops and "allgather:two-level" not in ops
    with pytest.raises(UsageError, match="runs in levels .reduce_scatter @machine, "
                                         "reduce_scatter @across.: each is counted and priced"):
        C.carried_as("reduce_scatter", "two-level", "gloo")
    levels = C.declared("allgather").carrier("two-level").levels
    assert [(x.op, x.layout, x.shard_of) for x in levels] == [
        ("allgather", "across", "machine"), ("allgather", "machine", None)]

"""``zero``, ZeRO-1/2 sharded data parallel, and ``hsdp``, its hybrid form: right against the single-process
reference (momentum SGD and AdamW; 3 and 4 workers; 2 emulated machines x 2 slots, sharded on
the whole job and on each machine), the all-gathers' prefetch changing when parameters arrive,
not what they are; per worker per step the bytes of its declared collectives and 1/P of DDP's
optimizer state; a span per reduce-scatter and all-gather on its group; a failed collective
named with its bucket and group."""
import os

import numpy as np
import pytest

from ddlbench import collectives

from .conftest import (MOMENTUM_SGD, QUICK_TIMING, REPO, TINY_BERT, describe,
                       only_no_across_failed, train, verify_lines)

ADAMW = ["--optimizer", "adamw"]
BUCKETS = ["--threshold", "300000"]          # several buckets, most padded
MACHINES = ["--nworkers", "4", "--slots", "2"]


def _verified(proc, name="zero", steps=3):
    assert proc.returncode == 0, describe(proc)
    assert [ok for *_, ok in verify_lines(proc.stdout)[name]] == [True] * steps, describe(proc)


@pytest.mark.parametrize("workers, flags", [
    (1, [*MOMENTUM_SGD]),                                     # one worker: stepped in place
    (3, [*MOMENTUM_SGD]),                                     # stage 2, prefetched gathers
    (4, [*ADAMW, "--zero-stage", "1", "--gather-prefetch", "0", "--rs-carrier", "ring"]),
])
def test_zero_verifies(workers, flags):
    _verified(train(*TINY_BERT, "--nworkers", str(workers), *flags, *BUCKETS, "--verify", "3",
                    "--method", "zero", timeout=300))


IN_LEVELS = "tests.zero_variants:ZeroInLevels"


@pytest.fixture(scope="module")
def two_machines_adamw():
    """One verification on 2 machines x 2 (AdamW): zero with the default carriers, and zero
    with both in two levels (tests/zero_variants.py: the options of --rs-carrier two-level
    --ag-carrier two-level), each named by its verify lines."""
    return train(*TINY_BERT, *MACHINES, *ADAMW, *BUCKETS, "--verify", "3",
                 "--method", f"zero,{IN_LEVELS}", timeout=300)


def test_zero_and_hsdp_verify_on_two_machines_with_a_span_per_collective(
        two_machines_adamw, two_machines_sgd_verified, load_json):
    """zero sharded on the whole job (AdamW; ``two_machines_adamw``'s job), and hsdp (sharded
    on each machine, the shards all-reduced across; momentum SGD, traced; conftest's
    ``two_machines_sgd_verified``, whose job fails for test_fsdp's NoAcross alone): the
    timeline has a span for every reduce-scatter and all-gather on the machine group and every
    all-reduce across."""
    _verified(two_machines_adamw)
    proc, path = two_machines_sgd_verified
    assert only_no_across_failed(proc), describe(proc)
    assert [ok for *_, ok in verify_lines(proc.stdout)["hsdp"]] == [True] * 3, describe(proc)
    events = load_json(path / "hsdp.json")
    events = events["traceEvents"] if isinstance(events, dict) else events
    spans = {}
    for e in events:
        if e.get("ph") == "X" and e["name"] in ("reduce_scatter", "allreduce", "allgather"):
            key = (e["pid"], e["name"], e["args"].get("group"))
            spans[key] = spans.get(key, 0) + 1
    per_worker = {(name, group): n for (pid, name, group), n in spans.items() if pid == 0}
    buckets = per_worker[("reduce_scatter", "machine")] // 3
    assert buckets > 2
    assert per_worker == {("reduce_scatter", "machine"): 3 * buckets,
                          ("allreduce", "across"): 3 * buckets,
                          ("allgather", "machine"): 3 * buckets}
    assert {pid for pid, *_ in spans} == {0, 1, 2, 3}
    assert set(spans.values()) == {3 * buckets}


def test_prefetched_gathers_change_when_not_what(tmp_path):
    """The all-gathers overlapping the next forward (each module waits for its own) give the
    very parameters the step waiting for them gives, bit for bit: zero with --gather-prefetch
    1 and, in the same job, zero with the options of --gather-prefetch 0
    (tests/zero_variants.py), each verified."""
    waited = "tests.zero_variants:ZeroGatherWaited"
    proc = train(*TINY_BERT, "--nworkers", "2", *MOMENTUM_SGD, *BUCKETS, "--verify", "3",
                 "--method", f"zero,{waited}", "--gather-prefetch", "1", "--save-params",
                 str(tmp_path / "{method}.npz"), timeout=300)
    _verified(proc)
    _verified(proc, waited)
    saved = {prefetch: dict(np.load(tmp_path / f"{name}.npz"))
             for prefetch, name in (("0", waited), ("1", "zero"))}
    assert saved["0"].keys() == saved["1"].keys()
    assert all(np.array_equal(saved["0"][k], saved["1"][k]) for k in saved["0"])


@pytest.mark.parametrize("workers, carrier, beside_ddp", [
    (2, "a2a", False), (3, "a2a", True), (4, "ring", False), (2, "native", False)])
def test_zero_bytes_and_optimizer_state_per_worker(workers, carrier, beside_ddp, tmp_path,
                                                   load_json):
    """Per worker per step: a reduce-scatter of each padded bucket ((P-1)/P G by all-to-all
    or by the ring; Gloo's native one is an all-reduce, 2(P-1)/P G) and an all-gather of its shard ((P-1)/P G),
    2(P-1)/P G in all with a2a, where DDP's all-reduce sends as much; Adam's state 1/P of
    DDP's."""
    out = tmp_path / ("{method}.json" if beside_ddp else "zero.json")
    proc = train(*TINY_BERT, "--nworkers", str(workers), *ADAMW, *QUICK_TIMING, *BUCKETS,
                 "--rs-carrier", carrier, "--method", "zero,ddp" if beside_ddp else "zero",
                 "--output", str(out), timeout=300)
    assert proc.returncode == 0, describe(proc)
    zero = load_json(str(out).replace("{method}", "zero"))
    assert zero["method"]["rs_carrier"] == carrier
    padded = zero["method"]["padded_bytes"]
    assert all(b % (4 * workers) == 0 for b in padded)
    sent = zero["communication_per_iteration"]["wire_sent_bytes"]
    assert sent == {
        "reduce_scatter": sum(collectives.sent_bytes("reduce_scatter", b, workers,
                                                     carrier=carrier, backend="gloo")
                              for b in padded),
        "allgather": sum(collectives.sent_bytes("allgather", b // workers, workers)
                         for b in padded)}
    gradient = sum(zero["method"]["bucket_bytes"])
    factor = (3 if carrier == "native" else 2) * (workers - 1) / workers
    assert sum(sent.values()) == pytest.approx(factor * gradient, rel=0.02)
    assert zero["method"]["memory"]["gradient_bytes"] == sum(padded) // workers  # stage 2
    # Adam's two moments (fp32) and a step count per shard: about 2 G / P
    state = zero["method"]["memory"]["optimizer_state_bytes"]
    assert state == pytest.approx(2 * sum(padded) / workers, rel=0.01)
    if beside_ddp:
        ddp = load_json(str(out).replace("{method}", "ddp"))
        ddp_sent = sum(ddp["communication_per_iteration"]["wire_sent_bytes"].values())
        assert sum(sent.values()) == pytest.approx(ddp_sent, rel=0.02)
        assert state == pytest.approx(ddp["method"]["memory"]["optimizer_state_bytes"] / workers,
                                      rel=0.05)


def test_hsdp_bytes_by_group(tmp_path, load_json):
    """HSDP on 2 machines x 2: inside the machine (l-1)/l of each padded bucket
    reduce-scattered and as much all-gathered, across 2(n-1)/n of its 1/l shard."""
    out = tmp_path / "hsdp.json"
    proc = train(*TINY_BERT, *MACHINES, *QUICK_TIMING, *BUCKETS, "--method", "hsdp",
                 "--zero-stage", "1", "--output", str(out), timeout=300)
    assert proc.returncode == 0, describe(proc)
    rec = load_json(out)
    assert rec["method"]["groups"]["machine"] == [[0, 1], [2, 3]]
    assert rec["method"]["shard_workers"] == 2
    padded = rec["method"]["padded_bytes"]
    by_group = rec["communication_per_iteration"]["wire_sent_bytes_by_group"]
    assert by_group["machine"] == {"reduce_scatter": sum(padded) // 2,
                                   "allgather": sum(padded) // 2}
    assert by_group["across"] == {"allreduce": sum(padded) // 2}
    # stage 1 keeps every gradient (its padded buffers) besides the shards
    assert rec["method"]["memory"]["gradient_bytes"] == sum(padded) + sum(padded) // 2


def test_a_failed_collective_names_its_bucket_and_group():
    proc = train(*TINY_BERT, "--nworkers", "2", "--verify", "3",
                 "--method", "tests.broken_methods:ZeroGatherFails", timeout=300)
    assert proc.returncode != 0
    assert ("CollectiveFailed: method test-zero-gather-fails: the all-gather of bucket 0 (" in proc.stderr
            and ") on group world (ranks 0, 1) failed: RuntimeError: injected: connection "
                "closed by peer" in proc.stderr), describe(proc)


def test_hsdp_refuses_machines_of_different_sizes():
    proc = train(*TINY_BERT, "--nworkers", "3", "--slots", "2", "--verify", "1",
                 "--method", "hsdp", timeout=300)
    assert proc.returncode != 0
    assert ("method hsdp needs as many workers on every machine (its shards must match "
            "across machines); this job's machines hold 2, 1"
            in proc.stderr), describe(proc)


def test_zero_in_levels_verifies_and_sends_the_declared_bytes_by_group(two_machines_adamw,
                                                                       tmp_path, load_json):
    """zero with both collectives in two levels (``--rs-carrier two-level --ag-carrier
    two-level``) on 2 machines x 2: right against the reference (AdamW, stage 2, prefetched
    gathers, whose second level runs when each module waits); per step, per padded bucket of B bytes, inside
    the machine B/2 reduce-scattered and B/2 all-gathered, across only B/4 each way (the flat
    all-to-all sends 3B/4 a worker, B/2 of it to the other machine); a span for each level on
    its group; and the model runs the same four steps on the same groups. (The verification:
    ``two_machines_adamw``'s job; the flags' options are the timed run's record's.)"""
    _verified(two_machines_adamw, IN_LEVELS)
    out, trace = tmp_path / "zero.json", tmp_path / "zero-trace.json"
    proc = train(*TINY_BERT, *MACHINES, *MOMENTUM_SGD, *QUICK_TIMING, *BUCKETS, "--method", "zero",
                 "--rs-carrier", "two-level", "--ag-carrier", "two-level", "--zero-stage", "1",
                 "--output", str(out), "--timeline", str(trace), timeout=300)
    assert proc.returncode == 0, describe(proc)
    rec = load_json(out)
    assert rec["method"]["rs_carrier"] == rec["method"]["ag_carrier"] == "two-level"
    assert rec["method"]["shard_workers"] == 4
    padded = rec["method"]["padded_bytes"]
    assert len(padded) > 2 and all(b % 16 == 0 for b in padded)
    by_group = rec["communication_per_iteration"]["wire_sent_bytes_by_group"]
    assert by_group == {"machine": {"reduce_scatter": sum(padded) // 2,
                                    "allgather": sum(padded) // 2},
                        "across": {"reduce_scatter": sum(padded) // 4,
                                   "allgather": sum(padded) // 4}}
    events = load_json(trace)
    events = events["traceEvents"] if isinstance(events, dict) else events
    rows = {(e["name"], e["args"].get("group")) for e in events
            if e.get("ph") == "X" and e["pid"] == 0 and e["name"] in ("reduce_scatter",
                                                                      "allgather")}
    assert rows == {("reduce_scatter", "machine"), ("reduce_scatter", "across"),
                    ("allgather", "across"), ("allgather", "machine")}
    from ddlbench.methods import lookup
    from ddlbench.model import cell, topology
    network = topology.load(os.path.join(REPO, "docs", "predictions", "emulated-2x2-1gbit.yaml"))
    options = lookup("zero").Options(rs_carrier="two-level", ag_carrier="two-level")
    links = cell.declared_links("zero", 4, network, options)
    assert [(op, share) for op, share, *_ in links["steps"]] == [("reduce_scatter", 1.0),
                                                                ("reduce_scatter", 0.5)]
    assert [(op, share) for op, share, *_ in links["gather"]] == [("allgather", 0.5),
                                                                 ("allgather", 1.0)]
    assert links["optimizer_share"] == 0.25


def test_hsdp_refuses_the_carriers_in_levels():
    proc = train(*TINY_BERT, *MACHINES, "--verify", "1", "--method", "hsdp",
                 "--rs-carrier", "two-level", timeout=120)
    assert proc.returncode == 2, describe(proc)
    assert proc.stderr.strip().splitlines()[-1] == (
        "ddlbench: error: method hsdp shards on the machine: its collectives there have no "
        "level to split (--rs-carrier and --ag-carrier two-level are zero's)")

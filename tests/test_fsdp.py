"""torch's sharded data parallel as peer methods: ``fsdp2`` (FSDP2's ``fully_shard``, both
``--reshard-after-forward`` settings) and ``ddp_zero1`` (DDP with ``ZeroRedundancyOptimizer``)
right against the single-process reference (momentum SGD on 3 workers, AdamW on 2 emulated
machines x 2 slots), an FSDP2 that sums instead of averaging caught, FSDP2's bytes per worker
per step counted at its collectives equal to 3(P-1)/P G at P = 2, 3, 4 (its reduce-scatter runs
as an all-reduce on Gloo), its collectives on the timeline, and bad input refused in one line;
``fsdp2_hsdp`` (FSDP2's HSDP on a 2-D mesh of the placement's groups) right on 2 emulated
machines x 2 (momentum SGD; AdamW with ZeRO-3's resharding, in fsdp2's job; without its
all-reduce across machines it fails), its bytes by
group those of its collectives' declarations and 2(l-1)/l G + 2(n-1)/n G/l + (l-1)/l G, each
collective a span on its group, the model's messages the counted ones, unequal machines refused."""
import json

import pytest

from ddlbench.methods.fsdp import FSDP2, FSDP2HSDP

from .conftest import (MOMENTUM_SGD, QUICK_TIMING, SMALL_CNN, TINY_BERT, describe,
                       only_no_across_failed, train, verify_lines)
from .test_hostile import WouldRun, no_runs  # noqa: F401 (the fixture)
from .test_hostile_cases import one_line

MACHINES = ["--nworkers", "4", "--slots", "2"]   # 2 emulated machines x 2 slots


class Summed(FSDP2):
    """FSDP2 summing the gradients instead of averaging them: --verify must fail it."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        for name in [*self.units, ""]:
            unit = self.model.get_submodule(name)
            unit.set_force_sum_reduction_for_comms(True)   # (Gloo has no PREMUL_SUM)
            unit.set_gradient_divide_factor(1.0)


def test_both_verify_with_momentum_sgd_on_three_workers_and_a_summing_fsdp2_fails():
    proc = train(*SMALL_CNN, "--nworkers", "3", *MOMENTUM_SGD, "--verify", "2",
                 "--method", f"fsdp2,ddp_zero1,{__name__}:Summed", timeout=300)
    lines = verify_lines(proc.stdout)
    for method in ("fsdp2", "ddp_zero1"):
        assert [ok for *_, ok in lines.get(method, [])] == [True] * 2, describe(proc)
    summed = lines.get(f"{__name__}:Summed")
    assert summed and not summed[0][3] and summed[0][2] > 100, describe(proc)
    assert proc.returncode == 1, describe(proc)


def test_all_verify_with_adamw_on_two_machines_zero3_and_fsdp2s_collectives_are_spans(tmp_path):
    """fsdp2, ddp_zero1 and fsdp2_hsdp (one job: its start costs most) with AdamW on 2 machines
    x 2 and --reshard-after-forward 1, 3 steps; fsdp2's collectives on the timeline."""
    trace = tmp_path / "tl_{method}.json"
    proc = train(*TINY_BERT, *MACHINES, "--optimizer", "adamw", "--verify", "3",
                 "--reshard-after-forward", "1", "--timeline", str(trace),
                 "--method", "fsdp2,ddp_zero1,fsdp2_hsdp", timeout=300)
    assert proc.returncode == 0, describe(proc)
    lines = verify_lines(proc.stdout)
    for method in ("fsdp2", "ddp_zero1", "fsdp2_hsdp"):
        assert [ok for *_, ok in lines.get(method, [])] == [True] * 3, describe(proc)
    with open(str(trace).replace("{method}", "fsdp2")) as f:
        events = json.load(f)["traceEvents"]
    units = ["bert.encoder.layer.0", "bert.encoder.layer.1", "root"]
    for rank in range(4):
        spans = [e for e in events if e.get("pid") == rank and e.get("cat") == "comm"]
        for op, per_step in (("allgather", 2), ("reduce_scatter", 1)):   # ZeRO-3: 2 gathers
            labels = sorted(e["args"]["tensor"] for e in spans if e["name"] == op)
            assert labels == sorted(units * per_step * 3), (rank, op, labels)
        gathered = sum(e["args"]["bytes"] for e in spans if e["name"] == "allgather")
        reduced = sum(e["args"]["bytes"] for e in spans if e["name"] == "reduce_scatter")
        assert gathered * 4 == 2 * reduced   # each gather: this worker's 1/4 (padded rows)
        waits = [e for e in events if e.get("pid") == rank and e.get("cat") == "wait"
                 and e["name"] in ("allgather", "reduce_scatter")]
        assert len(waits) == len(spans)      # the training thread waits for each


@pytest.fixture(scope="module")
def two_machines_timed(tmp_path_factory):
    """One timed job on 2 emulated machines x 2 slots: fsdp2 (its bytes at P = 4: its
    collectives are on the whole job, which the machines do not change) and fsdp2_hsdp (its
    bytes by group and its timeline), each with a record and a trace of its own."""
    path = tmp_path_factory.mktemp("two_machines")
    proc = train(*TINY_BERT, *MACHINES, *QUICK_TIMING, "--method", "fsdp2,fsdp2_hsdp",
                 "--output", str(path / "rec_{method}.json"),
                 "--timeline", str(path / "tl_{method}.json"), timeout=300)
    return proc, path


@pytest.mark.parametrize("workers", [2, 3, 4])
def test_fsdp2_sends_three_times_p_minus_one_over_p_of_the_gradient(workers, tmp_path,
                                                                   load_json, request):
    """(At P = 4: the job of ``two_machines_timed``.)"""
    zero1 = workers == 3   # (and ddp_zero1's bytes, once)
    if workers == 4:
        proc, tmp_path = request.getfixturevalue("two_machines_timed")
        out = tmp_path / "rec_{method}.json"
    else:
        out = tmp_path / ("rec_{method}.json" if zero1 else "rec_fsdp2.json")
        proc = train(*TINY_BERT, "--nworkers", str(workers), *QUICK_TIMING,
                     "--method", "fsdp2,ddp_zero1" if zero1 else "fsdp2", "--output", str(out),
                     timeout=300)
    assert proc.returncode == 0, describe(proc)
    rec = load_json(str(out).replace("{method}", "fsdp2"))
    gradient = rec["model"]["gradient_bytes"]
    sent = rec["communication_per_iteration"]["wire_sent_bytes"]
    p = workers
    assert sent["allgather"] == pytest.approx((p - 1) / p * gradient, rel=0.02)
    assert sent["reduce_scatter"] == pytest.approx(2 * (p - 1) / p * gradient, rel=0.02)
    assert sum(sent.values()) == pytest.approx(3 * (p - 1) / p * gradient, rel=0.02)
    assert rec["communication_per_iteration"]["calls"] == {"allgather": 3, "reduce_scatter": 3}
    assert rec["method"]["units"] == ["bert.encoder.layer.0", "bert.encoder.layer.1", "(root)"]

    if not zero1:
        return
    zero = load_json(str(out).replace("{method}", "ddp_zero1"))
    sent = zero["communication_per_iteration"]["wire_sent_bytes"]
    parts = zero["method"]["zero_partitions"]
    assert sum(parts) * 4 == gradient and len(parts) == p
    assert sent == {"allreduce": round(2 * (p - 1) / p * gradient),
                    "broadcast": (p - 1) * parts[0] * 4}   # rank 0's record


def test_bad_input_is_one_line(no_runs, capfd):  # noqa: F811 (the fixture)
    from ddlbench import train as train_script
    tiny = ["--no-cuda", *TINY_BERT]
    line = one_line(train_script.main, [*tiny, "--method", "fsdp2",
                                        "--reshard-after-forward", "2"], capfd)
    assert "--reshard-after-forward must be 0 or 1, got 2" in line, line
    line = one_line(train_script.main, [*tiny, "--method", "fsdp2", "--compressor", "fp16"],
                    capfd)
    assert "method 'fsdp2' cannot take --compressor fp16" in line, line


def test_an_optimizer_that_cannot_be_rebuilt_is_refused_in_one_line():
    import torch

    from ddlbench.errors import UsageError
    from ddlbench.methods.fsdp import rebuilt_optimizer
    p, stranger = torch.nn.Parameter(torch.ones(3)), torch.nn.Parameter(torch.ones(2))
    new = torch.nn.Parameter(torch.zeros(3))
    rebuilt = rebuilt_optimizer("fsdp2", torch.optim.SGD([{"params": [p], "lr": 0.5}],
                                                         momentum=0.9), {id(p): new})
    assert rebuilt.param_groups[0]["params"] == [new]
    assert (rebuilt.param_groups[0]["lr"], rebuilt.param_groups[0]["momentum"]) == (0.5, 0.9)
    with pytest.raises(UsageError, match="the optimizer's group 0 holds 1 tensor.s. that are "
                                         "not"):
        rebuilt_optimizer("fsdp2", torch.optim.SGD([p, stranger]), {id(p): new})
    stepped = torch.optim.AdamW([p])
    p.grad = torch.ones(3)
    stepped.step()
    with pytest.raises(UsageError, match="must not have stepped yet .AdamW holds state."):
        rebuilt_optimizer("fsdp2", stepped, {id(p): new})


# ------------------------------------------------------- fsdp2_hsdp: FSDP2's HSDP, 2-D mesh

class NoAcross(FSDP2HSDP):
    """FSDP2's HSDP without its all-reduce across machines (each machine averages its own
    workers' gradients): --verify must fail it."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        for name in [*self.units, ""]:
            self.model.get_submodule(name).set_requires_all_reduce(False)


def test_fsdp2_hsdp_verifies_on_two_machines_and_one_without_its_all_reduce_fails(
        two_machines_sgd_verified):
    """Momentum SGD, 3 steps (AdamW: the ZeRO-3 job above): conftest's
    ``two_machines_sgd_verified``, with hsdp, which fails for NoAcross alone."""
    proc, _ = two_machines_sgd_verified
    lines = verify_lines(proc.stdout)
    assert [ok for *_, ok in lines.get("fsdp2_hsdp", [])] == [True] * 3, describe(proc)
    alone = lines.get(f"{__name__}:NoAcross")
    assert alone and not alone[0][3], describe(proc)
    assert proc.returncode == 1 and only_no_across_failed(proc), describe(proc)


HSDP_TOPOLOGY = """
nodes: 2
devices_per_node: 2
intra_node: {bandwidth: 8GB/s, latency: 2us}
inter_node: {bandwidth: 1gbit, latency: 30us}
backend: gloo
"""


def test_fsdp2_hsdp_bytes_by_group_its_spans_and_the_models_messages(two_machines_timed,
                                                                    tmp_path, load_json):
    """2 machines x 2 (l = n = 2), per worker per step: the reduce-scatter inside the machine
    (an all-reduce on Gloo, 2(l-1)/l G), the all-reduce of the 1/l shard across machines
    (2(n-1)/n G/l) and the all-gather inside ((l-1)/l G), each on its group's row of the
    timeline, a span per unit; the model's messages (one per unit: its reduce-scatter and
    the all-reduce of its shard) are the counted ones, its all-gathers the gathered bytes."""
    from ddlbench import collectives
    from ddlbench.model import predict
    proc, job = two_machines_timed
    out, trace = job / "rec_fsdp2_hsdp.json", job / "tl_fsdp2_hsdp.json"
    assert proc.returncode == 0, describe(proc)
    rec = load_json(out)
    assert rec["method"]["mesh"] == [2, 2]
    assert (rec["method"]["groups"]["machine"], rec["method"]["groups"]["across"]) == \
        ([[0, 1], [2, 3]], [[0, 2], [1, 3]])
    g, comm = rec["model"]["gradient_bytes"], rec["communication_per_iteration"]
    payload = comm["payload_bytes"]
    assert comm["wire_sent_bytes_by_group"] == {
        "machine": {"reduce_scatter": collectives.sent_bytes(
                        "reduce_scatter", payload["reduce_scatter"], 2, carrier="native",
                        backend="gloo"),
                    "allgather": collectives.sent_bytes("allgather", payload["allgather"], 2)},
        "across": {"allreduce": collectives.sent_bytes("allreduce", payload["allreduce"], 2)}}
    by_group = comm["wire_sent_bytes_by_group"]
    assert by_group["machine"]["reduce_scatter"] == pytest.approx(2 * 1 / 2 * g, rel=0.02)
    assert by_group["across"]["allreduce"] == pytest.approx(2 * 1 / 2 * g / 2, rel=0.02)
    assert by_group["machine"]["allgather"] == pytest.approx(1 / 2 * g, rel=0.02)
    assert comm["calls"] == {"allgather": 3, "reduce_scatter": 3, "allreduce": 3}

    units = ["bert.encoder.layer.0", "bert.encoder.layer.1", "root"]
    events = json.loads(trace.read_text())["traceEvents"]
    per_unit: dict[str, int] = {}
    for rank in range(4):
        spans = [e for e in events if e.get("pid") == rank and e.get("cat") == "comm"]
        for op, group in (("reduce_scatter", "machine"), ("allreduce", "across"),
                          ("allgather", "machine")):
            mine = [e for e in spans if e["name"] == op]
            assert sorted(e["args"]["tensor"] for e in mine) == sorted(units * 4), (rank, op)
            assert {e["args"]["group"] for e in mine} == {group}, (rank, op)
            if rank == 0:
                for e in mine:   # (the same bytes every step: the last step's stand)
                    per_unit[e["args"]["tensor"], op] = e["args"]["bytes"]
        waits = [e for e in events if e.get("pid") == rank and e.get("cat") == "wait"
                 and e["name"] in ("allgather", "reduce_scatter", "allreduce")]
        assert len(waits) == len(spans) == 3 * 3 * 4

    # the model, on a profile of the same model's tensors (backward order)
    from .conftest import tiny_bert_model
    from .test_predict import _profile
    params = [(n, p) for n, p in tiny_bert_model().named_parameters() if p.requires_grad][::-1]
    path, _ = _profile(tmp_path, tensors=[{"name": n, "shape": list(p.shape),
                                           "bytes": p.numel() * 4} for n, p in params],
                       backward_s=[1e-4] * len(params), nworkers=4)
    topology = tmp_path / "2x2.yaml"
    topology.write_text(HSDP_TOPOLOGY)
    got, traces = tmp_path / "p.json", tmp_path / "traces"
    assert predict.main(["--profile", str(path), "--topology", str(topology), "--nworkers",
                         "4", "--method", "fsdp2_hsdp", "--output", str(got), "--traces",
                         str(traces)]) == 0
    (p,) = json.loads(got.read_text())["predictions"]
    # a message's bytes as the counter books them: the gather by what this worker contributes
    counted = sorted(per_unit[u, "reduce_scatter"] + per_unit[u, "allreduce"]
                     + per_unit[u, "allgather"] for u in units)
    assert sorted(p["message_bytes"]) == counted
    assert sum(p["message_bytes"]) == sum(payload.values())
    replay = json.loads((traces / "fsdp2_hsdp_4.trace.json").read_text())["traceEvents"]
    gathered = sum(e["args"]["bytes"] for e in replay
                   if e.get("cat") == "comm" and e["name"] == "allgather")
    assert gathered == 2 * payload["allgather"]   # (nccl-tests' size: the gathered output)


def test_fsdp2_hsdp_refuses_machines_of_different_sizes():
    proc = train(*TINY_BERT, "--nworkers", "3", "--slots", "2", "--verify", "1",
                 "--method", "fsdp2_hsdp", timeout=300)
    assert proc.returncode != 0
    assert ("method fsdp2_hsdp needs as many workers on every machine (its shards must match "
            "across machines); this job's machines hold 2, 1" in proc.stderr), describe(proc)

"""MG-WFBP: the merge rule on hand-worked inputs, the profiler, profile files, and the method
proven equal to single-process SGD (docs/DESIGN.md sections 2-4)."""
import json
import math
import re
import sys

import pytest
import torch
import torch.distributed as dist
from torch import nn

from ddlbench.measure import profiler
from ddlbench.model import predict, simulate
from ddlbench.measure import profile_file
from ddlbench.runtime.comm import Comm
from ddlbench.errors import UsageError
from ddlbench.methods import create
from ddlbench.planning import DEFAULT_MIN_GROUP_ELEMENTS as DEFAULT_MIN_GROUP
from ddlbench.planning import merge_groups, original_alpha_beta, schedule_time

from . import traces
from .conftest import (SMALL_CNN, TINY_BERT, TINY_BERT_VOCAB, describe, run, tiny_bert_model,
                       train, verify_lines)

# --------------------------------------------------------------------------- the merge rule
# Inputs are in backward order (position 0 = first gradient ready). The hand calculations use
# the forward indices of docs/DESIGN.md, l = L-1-b, ready[l] = taub[l] + tb[l]. Numbers are exact
# in binary, so every comparison below is exact.


def test_everything_merges():
    # tb 1 each, 128 B each, alpha 10, beta 1/128: tc = 11 per tensor.
    # ready[3..0] = 1, 2, 3, 4; tauc[3] = 1.
    # l=3: ready[2]=2 < tauc[3]+10 = 11 -> merge; tc[2] = 10+256/128 = 12, tauc[2] = max(1, 2) = 2
    # l=2: ready[1]=3 < 2+10 -> merge; tauc[1] = max(2, 3) = 3
    # l=1: ready[0]=4 < 3+10 -> merge; one message of 512 B: tc = 14, done at 4 + 14 = 18.
    tb, nbytes = [1.0] * 4, [128] * 4
    groups = merge_groups(tb, nbytes, 10.0, 1 / 128)
    assert groups == [[0, 1, 2, 3]]
    assert schedule_time(tb, nbytes, groups, 10.0, 1 / 128) == 18.0
    # WFBP: tauc[3..0] = 1, 12, 23, 34; done at 34 + 11 = 45.
    assert schedule_time(tb, nbytes, [[0], [1], [2], [3]], 10.0, 1 / 128) == 45.0


def test_nothing_merges():
    # tb 5 each, tc = 1 + 128/128 = 2: ready[2..0] = 5, 10, 15; tauc[2] = 5, tauc[1] = 10.
    # l=2: ready[1]=10 < 5+1? no.  l=1: ready[0]=15 < 10+1? no.
    assert merge_groups([5.0] * 3, [128] * 3, 1.0, 1 / 128) == [[0], [1], [2]]


def test_mixed():
    # backward tb [1, 1, 8, 1, 6], bytes [512, 512, 4096, 512, 512], alpha 2, beta 1/1024.
    # forward l = 4..0: ready = 1, 2, 10, 11, 17; tc = 2.5, 2.5, 6, 2.5, 2.5.
    # l=4: ready[3]=2 < tauc[4]+2 = 3 -> merge: bytes[3] = 1024, tc[3] = 3,
    #      tauc[3] = max(1, 2) = 2, tauc[2] = max(2+3, 10) = 10
    # l=3: ready[2]=10 < 2+2? no -> group {b0, b1}
    # l=2: ready[1]=11 < 10+2 -> merge: bytes[1] = 4608, tc[1] = 6.5, tauc[1] = max(10, 11) = 11
    # l=1: ready[0]=17 < 11+2? no -> group {b2, b3}; tensor 0 alone ends the last group.
    tb, nbytes = [1.0, 1.0, 8.0, 1.0, 6.0], [512, 512, 4096, 512, 512]
    groups = merge_groups(tb, nbytes, 2.0, 1 / 1024)
    assert groups == [[0, 1], [2, 3], [4]]
    # tauc[0] = max(11 + 6.5, 17) = 17.5, plus tc[0] = 2.5: 20; WFBP: tauc[0] = 18.5, 21.
    assert schedule_time(tb, nbytes, groups, 2.0, 1 / 1024) == 20.0
    assert schedule_time(tb, nbytes, [[b] for b in range(5)], 2.0, 1 / 1024) == 21.0


def test_tauc_is_recomputed_after_a_merge():
    # tb [1, 1, 3], 1024 B each, alpha 1.5, beta 1/512: tc = 3.5; ready[2..0] = 1, 2, 5.
    # l=2: ready[1]=2 < 1+1.5 -> merge; recomputed tauc[1] = max(1+0, 2) = 2.
    # l=1: ready[0]=5 < 2+1.5? no -> close. (With the stale tauc[1] = max(1+3.5, 2) = 4.5,
    # 5 < 6 would have merged everything.)
    assert merge_groups([1.0, 1.0, 3.0], [1024] * 3, 1.5, 1 / 512) == [[0, 1], [2]]


def test_a_tie_does_not_merge():
    # ready[1] = 2 equals tauc[2] + alpha = 1 + 1: the rule's "<" is strict.
    assert merge_groups([1.0, 1.0], [64, 64], 1.0, 0.0) == [[0], [1]]


@pytest.mark.parametrize("min_group,expected", [
    (0, [[0], [1], [2]]),      # the option off: as test_nothing_merges
    (192, [[0, 1], [2]]),      # b0's 128 B < 192 -> merged; the group's 256 B are not
    (256, [[0, 1], [2]]),      # "smaller than": 256 is not < 256
    (257, [[0, 1, 2]]),        # 128 < 257, then the group's 256 < 257
    (10 ** 9, [[0, 1, 2]]),
])
def test_small_group_option(min_group, expected):
    assert merge_groups([5.0] * 3, [128] * 3, 1.0, 1 / 128, min_group) == expected


def test_edges():
    assert merge_groups([], [], 1.0, 1.0) == []
    assert merge_groups([3.0], [4], 1.0, 1.0) == [[0]]
    assert schedule_time([3.0], [4], [[0]], 1.0, 0.5) == 3.0 + 1.0 + 2.0
    with pytest.raises(ValueError):
        merge_groups([1.0], [4, 4], 1.0, 1.0)


# --------------------------------------------------------------------------- --mgwfbp-ab table
# The original's tables (HKBU-HPML/ddl-benchmarks, mgwfbp/hv_distributed_optimizer.py lines
# 226-241: p_alpha_beta_10Gbps, p_alpha_beta_56Gbps), written here again as the original wrote
# them: (alpha s, beta s/B). Its launcher passed --rdma, the 56Gbps table, for rdma=1 and 2.
ORIGINAL_10G = {
    2: (2.554691138304671e-06, 9.837548167872609e-11),
    4: (4.204298980348825e-05, 2.0589360830118177e-10),
    8: (0.0005230272768511732, 8.570746975492128e-10),
    16: (0.0009080981007148093, 7.395651186836712e-10),
    32: (0.0013476410788581382 * 3, 8.643300782166769e-10),
    64: (0.0023476410788581382 * 3, 9.643300782166769e-10)}
ORIGINAL_56G = {
    2: (2.554691138304671e-06, 9.837548167872609e-11),
    4: (4.204298980348825e-05, 2.0589360830118177e-10),
    8: (9.75367204301171e-05, 3.0568230536676206e-10),
    16: (0.00023583677659915685 * 3, 4.0594787739537565e-10),
    32: (0.00040632079996292579, 1.5 * 3.2713239529771973e-10),
    64: (0.00080632079996292579, 1.8 * 3.2713239529771973e-10)}


@pytest.mark.parametrize("network,name,table", [
    ("rdma0", "10Gbps", ORIGINAL_10G), ("rdma1", "56Gbps", ORIGINAL_56G),
    ("rdma2", "56Gbps", ORIGINAL_56G),
    (None, "10Gbps", ORIGINAL_10G), ("1gbit", "10Gbps", ORIGINAL_10G)])  # no --rdma there
@pytest.mark.parametrize("nworkers", [2, 4, 8, 16, 32, 64])
def test_table_lookup_is_the_originals(network, name, table, nworkers):
    assert original_alpha_beta(nworkers, network) == (name, *table[nworkers])


def test_table_one_worker_sends_nothing():
    assert original_alpha_beta(1, "rdma1") == ("56Gbps", 0.0, 0.0)


@pytest.mark.parametrize("nworkers", [3, 5, 12, 128])
def test_table_lacks_the_worker_count(nworkers):
    with pytest.raises(UsageError) as e:
        original_alpha_beta(nworkers, "rdma1")
    assert str(e.value) == (
        f"--mgwfbp-ab table: the original's 56Gbps alpha-beta table has no entry for "
        f"{nworkers} worker(s), only for 2, 4, 8, 16, 32, 64; use --mgwfbp-ab measured")


# Backward order: tb 100, 300, 1000, 20 us; bytes 1e6, 4000, 4e6, 400; forward l = 3..0:
# ready = 100, 400, 1400, 1420 us. 8 workers, small-group merge off.
TABLE_TB = [100e-6, 300e-6, 1000e-6, 20e-6]
TABLE_BYTES = [1_000_000, 4_000, 4_000_000, 400]


@pytest.mark.parametrize("network,groups", [
    # 56Gbps: alpha 97.54 us, beta 0.30568 ns/B; tc[3] = 97.54 + 305.68 = 403.22, tauc[3] = 100.
    # l=3: 400 < 100 + 97.54? no.  tauc[2] = max(100 + 403.22, 400) = 503.22.
    # l=2: 1400 < 503.22 + 97.54? no.  tc[2] = 97.54 + 1.22; tauc[1] = max(601.98, 1400) = 1400.
    # l=1: 1420 < 1400 + 97.54 -> merge.
    ("rdma1", [[0], [1], [2, 3]]),
    # 10Gbps: alpha 523.03 us, beta 0.85707 ns/B. l=3: 400 < 100 + 523.03 -> merge; the group's
    # 1004000 B: tc[2] = 523.03 + 860.50 = 1383.53, tauc[2] = 400, tauc[1] = 1783.53.
    # l=2: 1400 < 400 + 523.03? no.  l=1: 1420 < 1783.53 + 523.03 -> merge.
    ("rdma0", [[0, 1], [2, 3]]),
])
def test_table_alpha_beta_plan_by_hand(network, groups):
    _, alpha, beta = original_alpha_beta(8, network)
    assert merge_groups(TABLE_TB, TABLE_BYTES, alpha, beta) == groups
    if network == "rdma1":
        # b0 goes at 100 us (403.22 us), b1 at 503.22 (98.76 us), b2+b3 at 1420 us: 4000400 B.
        assert schedule_time(TABLE_TB, TABLE_BYTES, groups, alpha, beta) == pytest.approx(
            1420e-6 + alpha + beta * 4_000_400, rel=1e-12)


# --------------------------------------------------------------------------- in one process

def _world_of_one():
    if not dist.is_initialized():
        dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)


def _mlp():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(10, 20), nn.ReLU(), nn.Linear(20, 30), nn.ReLU(),
                         nn.Linear(30, 5))


def _profile(model, model_name, backward_s, alpha, beta, order=None):
    """A hand-made profile of ``model``: tensors in reverse registration order unless told."""
    named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    order = list(reversed(range(len(named)))) if order is None else order
    return {"format": profiler.PROFILE_FORMAT, "version": 1, "model": model_name,
            "tensors": [{"name": named[i][0], "shape": list(named[i][1].shape),
                         "bytes": named[i][1].numel() * named[i][1].element_size()}
                        for i in order],
            "backward_s": list(backward_s), "forward_s": 0.5, "alpha_s": alpha,
            "beta_s_per_byte": beta, "nworkers": 8, "backend": "nccl", "device": "cuda",
            "network": "rdma1"}


# The MLP's backward order is parameters 5, 4, 3, 2, 1, 0: bytes 20, 600, 120, 2400, 80, 800.
# tb [1, .5, 4, .5, 4, .5], alpha 2, beta 0 (tc = 2): ready[5..0] = 1, 1.5, 5.5, 6, 10, 10.5.
# l=5: 1.5 < 1+2 merge (tauc[4] = 1.5); l=4: 5.5 < 3.5? no; l=3: 6 < 5.5+2 merge (tauc[2] = 6);
# l=2: 10 < 8? no; l=1: 10.5 < 10+2 merge.  Groups b{0,1} b{2,3} b{4,5}.
MLP_TB = [1.0, 0.5, 4.0, 0.5, 4.0, 0.5]


@pytest.mark.parametrize("min_group,groups,bucket_bytes", [
    (0, [[5, 4], [3, 2], [1, 0]], [620, 2520, 880]),
    # --mgwfbp-min-group 200 elements = 800 B: the first group (620 B) also takes b2 (740 B,
    # still small) and b3 by the rule (6 < 5.5+2); then 10 < 8? no, 3140 B is not small.
    (200, [[5, 4, 3, 2], [1, 0]], [3140, 880]),
])
def test_strategy_plans_from_a_profile_file(tmp_path, capsys, min_group, groups, bucket_bytes):
    _world_of_one()
    path = tmp_path / "prof.json"
    path.write_text(json.dumps(_profile(_mlp(), "mlp", MLP_TB, 2.0, 0.0)))
    model = _mlp()
    s = create("mgwfbp", model, torch.optim.SGD(model.parameters(), lr=0.1), Comm(0, 1),
               {"mgwfbp_profile": str(path), "mgwfbp_min_group": min_group}, model_name="mlp")
    s.calibrate(lambda: pytest.fail("a profile file means no measuring"))
    d = s.describe()
    assert d["bucket_bytes"] == bucket_bytes and d["buckets"] == len(groups)
    assert d["mgwfbp"]["groups"] == groups and d["mgwfbp"]["group_bytes"] == bucket_bytes
    assert d["mgwfbp"]["source"] == f"profile {path}"
    assert (d["mgwfbp"]["ab"], d["mgwfbp"]["ab_table"]) == ("measured", None)  # the default
    assert (d["mgwfbp"]["alpha_s"], d["mgwfbp"]["profile_nworkers"]) == (2.0, 8)
    assert "threshold_bytes" not in d
    out = capsys.readouterr().out
    assert f"group bytes in order: {bucket_bytes}" in out
    s.close()


def test_profile_order_is_the_plan_order(tmp_path):
    """The plan follows the profile's tensor order, not the model's registration order."""
    _world_of_one()
    order = [4, 5, 2, 3, 0, 1]  # weights before biases
    path = tmp_path / "prof.json"
    # tc = 1; tb 3 each: nothing merges (ready gaps 3 > alpha 1); the small-group merge off
    # (by default it would take the whole tiny MLP into one group).
    path.write_text(json.dumps(_profile(_mlp(), "mlp", [3.0] * 6, 1.0, 0.0, order=order)))
    model = _mlp()
    s = create("mgwfbp", model, torch.optim.SGD(model.parameters(), lr=0.1), Comm(0, 1),
               {"mgwfbp_profile": str(path), "mgwfbp_min_group": 0}, model_name="mlp")
    s.calibrate(None)
    assert [[piece.param for piece in b] for b in s.plan().buckets] == [[i] for i in order]
    s.close()


@pytest.mark.parametrize("change,message", [
    (lambda p: p.update(model="resnet18"),
     "is for model resnet18, but this run trains mlp"),
    (lambda p: (p["tensors"].pop(), p["backward_s"].pop()), "(5 tensors there, 6 here): it has no tensor '0.weight'"),
    (lambda p: p["tensors"][0].update(shape=[6]), "tensor '4.bias' is [6] (20 B) there, [5] (20 B)"),
    (lambda p: p["tensors"][0].update(name="4.gamma"), "it has no tensor '4.bias'"),
    (lambda p: p.update(format="something"), "is not an MG-WFBP profile"),
    (lambda p: p["backward_s"].pop(), "6 tensors but 5 backward times"),
    (lambda p: p.update(alpha_s=-1.0), "must be finite numbers >= 0"),
])
def test_a_profile_that_does_not_fit_is_refused(tmp_path, change, message):
    _world_of_one()
    prof = _profile(_mlp(), "mlp", MLP_TB, 2.0, 0.0)
    change(prof)
    path = tmp_path / "prof.json"
    path.write_text(json.dumps(prof))
    model = _mlp()
    s = create("mgwfbp", model, torch.optim.SGD(model.parameters(), lr=0.1), Comm(0, 1),
               {"mgwfbp_profile": str(path)}, model_name="mlp")
    with pytest.raises(UsageError) as e:
        s.calibrate(None)
    assert message in str(e.value) and "\n" not in str(e.value)
    s.close()


def test_missing_profile_file(tmp_path):
    with pytest.raises(UsageError, match="cannot read MG-WFBP profile .*nope.json"):
        profile_file.read_profile(str(tmp_path / "nope.json"))


def _table_method(tmp_path, nworkers, min_group=0):
    """MG-WFBP with --mgwfbp-ab table on the MLP's profile file. The Comm says ``nworkers``
    (the table's key) in this world of one: the lookup is all it is used for before training."""
    _world_of_one()
    path = tmp_path / "prof.json"
    path.write_text(json.dumps(_profile(_mlp(), "mlp", MLP_TB, 2.0, 0.0)))
    model = _mlp()
    return create("mgwfbp", model, torch.optim.SGD(model.parameters(), lr=0.1),
                  Comm(0, nworkers), {"mgwfbp_profile": str(path), "mgwfbp_ab": "table",
                                      "mgwfbp_min_group": min_group}, model_name="mlp")


def test_table_alpha_beta_in_the_record_and_console(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("DDLBENCH_NETWORK", "rdma1")
    s = _table_method(tmp_path, 8)
    s.calibrate(lambda: pytest.fail("a profile file means no measuring"))
    alpha, beta = ORIGINAL_56G[8]
    d = s.describe()["mgwfbp"]
    assert d["ab"] == "table"
    assert d["ab_table"] == {"table": "56Gbps", "nworkers": 8, "network": "rdma1",
                             "alpha_s": alpha, "beta_s_per_byte": beta}
    assert (d["alpha_s"], d["beta_s_per_byte"]) == (alpha, beta)  # not the profile's 2.0, 0.0
    # MLP_TB's gaps (0.5 to 4 s) dwarf alpha 97.5 us: nothing merges.
    assert d["groups"] == [[5], [4], [3], [2], [1], [0]]
    out = capsys.readouterr().out
    assert "alpha-beta table: alpha 97.54 us, beta 0.3057 ns/B, the original's 56Gbps table " \
           "for 8 workers, network rdma1)" in out
    s.close()


def test_table_refuses_a_worker_count_it_lacks(tmp_path, monkeypatch):
    monkeypatch.delenv("DDLBENCH_NETWORK", raising=False)
    s = _table_method(tmp_path, 3)
    with pytest.raises(UsageError) as e:
        s.calibrate(None)
    assert str(e.value).startswith("--mgwfbp-ab table: the original's 10Gbps alpha-beta table "
                                   "has no entry for 3 worker(s), only for 2, 4, 8, 16, 32, 64")
    s.close()


class _Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3)
        self.bn = nn.BatchNorm2d(4)
        self.drop = nn.Dropout(0.5)
        self.fc = nn.Linear(4, 2)

    def forward(self, x):
        return self.fc(self.drop(self.bn(self.conv(x))).mean((2, 3)))


def test_profiler_measures_in_backward_order_and_leaves_no_trace():
    _world_of_one()     # measure_host times the issue of a collective
    torch.manual_seed(0)
    net = _Net().train()
    x = torch.randn(2, 3, 8, 8)
    calls = []

    def forward_backward():
        calls.append(1)
        net(x).sum().backward()

    buffers = [b.clone() for b in net.buffers()]
    rng = torch.get_rng_state()
    steps = []
    m = profiler.measure_layers(net, forward_backward, warmup=2, iters=3,
                                step=lambda: steps.append(len(calls)))
    assert len(calls) == 5 and steps == [0, 1, 2, 3, 4]     # the ranks meet before each pass
    # each measured pass: its forward and its backward to the last gradient
    assert len(m["passes_s"]) == 3 and all(t > 0 for t in m["passes_s"])
    # Parameters: conv.w 0, conv.b 1, bn.w 2, bn.b 3, fc.w 4, fc.b 5; autograd reaches the fc
    # first and the conv last.
    assert sorted(m["order"][:2]) == [4, 5] and sorted(m["order"][4:]) == [0, 1]
    assert sorted(m["order"]) == list(range(6))
    assert len(m["backward_s"]) == 6 and all(t >= 0 for t in m["backward_s"])
    assert m["forward_s"] > 0 and sum(m["backward_s"]) > 0
    assert all(torch.equal(a, b) for a, b in zip(buffers, net.buffers()))  # BN stats restored
    assert torch.equal(torch.get_rng_state(), rng)                         # dropout RNG too
    assert all(p.grad is None for p in net.parameters())

    # the methods' own copies and divides: timed on the model's real gradients, which it
    # clears, leaving the parameters as they were
    params = [p.detach().clone() for p in net.parameters()]
    h = profiler.measure_host(net, forward_backward, iters=3)
    assert h["bytes"] == sum(p.numel() * 4 for p in net.parameters()) and h["iters"] == 3
    assert h["copy_s_per_byte"] > 0 and h["divide_s_per_byte"] > 0
    assert all(p.grad is None for p in net.parameters())
    assert all(torch.equal(a, b) for a, b in zip(params, net.parameters()))

    # the host's side (an accelerator's; on a CPU the same passes on the host's clock): the
    # forward's and each tensor's launch in the profile's order, a hook's cost, the
    # optimizer's; it leaves no trace but the optimizer's steps
    opt = torch.optim.SGD(net.parameters(), lr=0.0)
    calls.clear()
    launch = profiler.measure_launch(net, forward_backward, m["order"], optimizer=opt,
                                     warmup=1, iters=3)
    assert len(calls) == 2 * (1 + 3)                 # without and with the method's hooks
    assert set(launch) == {"forward_s", "backward_s", "hook_s", "optimizer_s", "iters"}
    assert len(launch["backward_s"]) == 6 and all(t >= 0 for t in launch["backward_s"])
    assert launch["forward_s"] > 0 and launch["hook_s"] >= 0 and launch["optimizer_s"] > 0
    assert all(p.grad is None for p in net.parameters())
    assert all(torch.equal(a, b) for a, b in zip(params, net.parameters()))  # lr 0
    assert all(torch.equal(a, b) for a, b in zip(buffers, net.buffers()))

    # CPU interference (the profiler's multi-worker step), here in a world of one: its phases,
    # figures and bookkeeping; it too leaves no trace
    _world_of_one()
    calls.clear()
    x = profiler.measure_interference(net, forward_backward, 4096, iters=2, comm_iters=3)
    assert x["bytes"] == 4096 and x["iters"]["compute_alone"] == 2
    assert x["iters"]["comm_alone"] == 3 and x["iters"]["comm_beside_compute"] >= 3
    assert x["iters"]["compute_beside_comm"] <= len(calls) - 3
    assert x["compute_s"] > 0 and x["comm_s"] > 0 and x["comm_beside_compute_s"] > 0
    # the slowdowns as documented, from the record's own figures (a world of one: the ranks'
    # means are this rank's): the time beside the other over the time alone, less 1; compute's
    # None only where no pass ended before the last all-reduce
    comm = x["comm_beside_compute_s"] / x["comm_s"] - 1.0
    assert type(x["comm_slowdown"]) is float and math.isfinite(x["comm_slowdown"]), x
    assert x["comm_slowdown"] == pytest.approx(comm, rel=1e-12, abs=1e-12), x
    if x["iters"]["compute_beside_comm"] == 0:
        assert x["compute_slowdown"] is None and x["compute_beside_comm_s"] is None, x
    else:
        compute = x["compute_beside_comm_s"] / x["compute_s"] - 1.0
        assert type(x["compute_slowdown"]) is float and math.isfinite(x["compute_slowdown"]), x
        assert x["compute_slowdown"] == pytest.approx(compute, rel=1e-12, abs=1e-12), x
    assert x["per_rank"] == [[x["compute_slowdown"], x["comm_slowdown"]]], x
    assert 0 < x["seconds"] < 60
    assert all(torch.equal(a, b) for a, b in zip(buffers, net.buffers()))
    assert torch.equal(torch.get_rng_state(), rng)
    assert all(p.grad is None for p in net.parameters())
    assert profiler.interference_bytes([40, 4 << 30, 8]) == 25 * 1024 * 1024



# --------------------------------------------------------------------------- end to end

def _model_profile(model_name, backward_s_of, alpha, beta):
    import models
    kw = (dict(sentence_len=16, vocab_size=TINY_BERT_VOCAB) if model_name == "bert_tiny"
          else dict(image_size=32))
    model = models.build(model_name, **kw).model
    n = len([p for p in model.parameters() if p.requires_grad])
    prof = _profile(model, model_name, [backward_s_of(b) for b in range(n)], alpha, beta)
    return prof


# Every 4th tensor takes 3 ms, the others 0.2 ms; alpha 1 ms, beta 1 ns/B: groups of a few
# tensors, several groups, on both models.
def _tb(b):
    return 3e-3 if b % 4 == 3 else 2e-4


@pytest.fixture(scope="module")
def profiles(tmp_path_factory):
    d = tmp_path_factory.mktemp("profiles")
    out = {}
    for name in ("resnet18", "bert_tiny"):
        prof = _model_profile(name, _tb, 1e-3, 1e-9)
        path = d / f"{name}.json"
        path.write_text(json.dumps(prof))
        nbytes = [t["bytes"] for t in prof["tensors"]]
        # the method's default small-group merge (the original's 8192 elements of fp32)
        groups = merge_groups(prof["backward_s"], nbytes, 1e-3, 1e-9, 4 * DEFAULT_MIN_GROUP)
        out[name] = (str(path), [sum(nbytes[b] for b in g) for g in groups])
    return out


def _printed_groups(stdout):
    found = re.findall(r"group bytes in order: (\[[0-9, ]*\])", stdout)
    assert len(found) == 1, stdout
    return json.loads(found[0])


# The matrix of the issue (1-4 workers x small CNN / tiny BERT x SGD-momentum / Adam), pairwise
# for the suite's time budget: every worker count, every model x optimizer pair, each pair with
# several workers; both methods in one process per cell. MG-WFBP plans from a profile file (its
# measured planning is tested below), ByteScheduler runs with small partitions and credit so
# that every model is cut into many chunks and the window is full. One cell plans with the
# original's table (--mgwfbp-ab table; rdma2 picks its 56Gbps table) instead of the profile's
# alpha and beta.
@pytest.mark.parametrize("nworkers,model,optimizer,ab", [
    (1, "cnn", "sgd", "measured"), (2, "cnn", "adam", "table"), (3, "cnn", "sgd", "measured"),
    (3, "bert", "adam", "measured"), (4, "bert", "sgd", "measured")])
def test_three_steps_match_the_reference(tmp_path, profiles, nworkers, model, optimizer, ab):
    from .test_bytescheduler import CREDIT, PARTITION
    name = "resnet18" if model == "cnn" else "bert_tiny"
    path, expected_bytes = profiles[name]
    assert len(expected_bytes) > 4 and any(
        len(g) > 1 for g in merge_groups(*_groups_inputs(path)))  # a real mix of groups
    if ab == "table":
        tb, nbytes, _, _ = _groups_inputs(path)
        _, alpha, beta = original_alpha_beta(nworkers, "rdma2")
        expected_bytes = [sum(nbytes[b] for b in g)
                          for g in merge_groups(tb, nbytes, alpha, beta, 4 * DEFAULT_MIN_GROUP)]
    workload = SMALL_CNN if model == "cnn" else TINY_BERT
    traced = model == "cnn" and nworkers in (2, 3)  # both methods' traces at 2 and 3 workers
    opt = (["--optimizer", "adam", "--weight-decay", "0.01", "--lr", "0.001"]
           if optimizer == "adam" else ["--optimizer", "sgd", "--momentum", "0.9"])
    proc = train(*workload, *opt, "--verify", "3", "--method", "mgwfbp,bytescheduler",
                 "--mgwfbp-profile", path, "--mgwfbp-ab", ab, "--partition", str(PARTITION),
                 "--credit", str(CREDIT), "--nworkers", str(nworkers),
                 *(traces.verify_timeline(tmp_path) if traced else []), timeout=600,
                 DDLBENCH_NETWORK="rdma2")
    assert proc.returncode == 0, describe(proc)
    assert _printed_groups(proc.stdout) == expected_bytes
    if traced:
        rows = traces.check_verify_traces(tmp_path, proc.stdout, ["mgwfbp", "bytescheduler"],
                                          nworkers, 3)["mgwfbp"]
        # one all-reduce per merged group, of its bytes, each step
        assert [b for _, _, b in traces.collectives(rows, 0)] == expected_bytes * 3
    assert f"; alpha-beta {ab}: alpha " in proc.stdout
    if ab == "table":
        assert f"the original's 56Gbps table for {nworkers} workers, network rdma2)" \
            in proc.stdout
    lines = verify_lines(proc.stdout)
    assert sorted(lines) == ["bytescheduler", "mgwfbp"], describe(proc)
    for method, steps in lines.items():
        assert [s[0] for s in steps] == [1, 2, 3], method
        for step, max_abs, frac, ok in steps:
            if optimizer == "adam":  # ddlbench/verify.py: Adam's tolerance is 5% of lr
                assert ok and max_abs < 0.05 * 0.001, (method, step, max_abs)
            else:  # fp32 reordering only
                assert ok and frac < 0.5 and max_abs < 1e-6, (method, step, max_abs, frac)


def _groups_inputs(path):
    with open(path) as f:
        prof = json.load(f)
    return (prof["backward_s"], [t["bytes"] for t in prof["tensors"]], prof["alpha_s"],
            prof["beta_s_per_byte"])


def test_measured_plan_is_rank0s_on_every_rank(tmp_path):
    """No profile file: every rank profiles and fits alpha/beta, rank 0's groups are used by
    all. Hook jitter differs per rank; the collective sequences must still be identical, one
    all-reduce per printed group per step, and calibration adds no method collective."""
    prefix = str(tmp_path / "trace")
    proc = train(*TINY_BERT, "--verify", "2", "--method", "mgwfbp", "--nworkers", "2",
                 "--trace-collectives", prefix, timeout=300, DDLBENCH_TEST_HOOK_JITTER_MS=5,
                 DDLBENCH_MGWFBP_WARMUP=1, DDLBENCH_MGWFBP_ITERS=3, DDLBENCH_MGWFBP_COMM_ITERS=2)
    assert proc.returncode == 0, describe(proc)
    assert all(ok for *_, ok in verify_lines(proc.stdout)["mgwfbp"])
    assert "(measured; alpha-beta measured: alpha " in proc.stdout
    assert "fitted on 2 worker(s)" in proc.stdout
    group_bytes = _printed_groups(proc.stdout)
    traces = []
    for rank in range(2):
        with open(f"{prefix}.mgwfbp.{rank}.json") as f:
            traces.append([tuple(x) for x in json.load(f)])
    assert traces[0] == traces[1]
    assert traces[0] == [("allreduce", b // 4, "float32") for b in group_bytes] * 2


def test_profiler_cli_writes_a_profile_the_method_accepts_and_another_model_refuses(
        tmp_path, load_json):
    path = tmp_path / "bert_tiny.json"
    proc = run([sys.executable, "-m", "ddlbench.measure.profiler", *TINY_BERT, "--nworkers", "1",
                "--warmup", "1", "--iters", "3", "--comm-iters", "2", "--timeout", "60",
                "--output", str(path)], timeout=300)
    assert proc.returncode == 0, describe(proc)
    prof = load_json(path)
    model = tiny_bert_model()
    order = profile_file.match_profile(prof, model, "bert_tiny", str(path))
    n = len(list(model.parameters()))
    assert sorted(order) == list(range(n)) and len(prof["backward_s"]) == n
    assert prof["nworkers"] == 1 and prof["backend"] == "gloo"
    assert prof["workload"]["batch_size"] == 4 and prof["workload"]["sentence_len"] == 16
    assert prof["iterations"] == {"warmup": 1, "measured": 3}
    assert prof["alpha_s"] >= 0 and prof["beta_s_per_byte"] >= 0
    # the optimizer's step, timed last, for the performance model (BERT: AdamW)
    assert prof["optimizer"] == "AdamW" and prof["optimizer_s"] > 0
    assert prof["interference"] is None     # nothing to interfere with on one worker
    assert prof["launch"] is None           # a CPU: the host computes (one resource)
    # the methods' own copies and divides, timed on the model's gradients
    host = prof["host"]
    assert host["bytes"] == sum(t["bytes"] for t in prof["tensors"]) and host["iters"] == 5
    assert 0 < host["copy_s_per_byte"] < 1e-6 and 0 < host["divide_s_per_byte"] < 1e-6
    # and the issue of one collective (a bucket's launch: tens of microseconds here)
    assert 0 < host["issue_s"] < 0.01 and host["issue_iters"] == 50
    assert "# the methods' own work on " in proc.stdout and " us to issue a collective" \
        in proc.stdout
    # the performance model replays it as written
    work = predict.workload_of(prof, prof["optimizer_s"])
    assert 0 < host["outer_step_s_per_byte"] < 1e-6      # DiLoCo's outer step
    assert work.host == simulate.Host(host["copy_s_per_byte"], host["divide_s_per_byte"],
                                      host["issue_s"], host["outer_step_s_per_byte"])
    assert work.compute_s == pytest.approx(prof["forward_s"] + sum(prof["backward_s"])
                                           + prof["optimizer_s"])
    # each tensor's share of the forward (ByteScheduler's replay), in the same order: every
    # tensor here is owned by a module that runs (the tied decoder's weight counts for the
    # word embeddings, which run first), so none is 0; what follows the last module (the
    # loss) is left over
    shares = prof["forward_tensor_s"]
    assert len(shares) == n and all(x > 0 for x in shares)
    assert 0 < sum(shares) <= prof["forward_s"] + 1e-9
    names = [t["name"] for t in prof["tensors"]]
    assert all(shares[names.index(f"bert.embeddings.{e}_embeddings.weight")] > 0
               for e in ("word", "position", "token_type"))
    assert "# forward by tensor: " in proc.stdout
    assert work.forward_tensor_s == shares
    bad = tmp_path / "bad.json"
    # every rank's compute (one here: rank 0's, the profile's own)
    assert prof["rank_compute_s"] == pytest.approx([prof["forward_s"] + sum(prof["backward_s"])])
    assert len(prof["rank_passes_s"]) == 1 and len(prof["rank_passes_s"][0]) == \
        prof["iterations"]["measured"] and all(x > 0 for x in prof["rank_passes_s"][0])
    assert predict.slowest_rank(prof, 1) == 1.0
    for passes in ([[0.1, 0.0]], [0.1], [[0.1], [0.1, 0.2]], [["x"]], []):
        bad.write_text(json.dumps({**prof, "rank_passes_s": passes}))
        with pytest.raises(UsageError, match=r"malformed 'rank_passes_s' \(per rank, its passes' "
                                             r"times > 0, as many for every rank\)$"):
            profile_file.read_profile(str(bad))
    # an accelerator's profile: the host's side, replayed as a resource of its own
    launch = {"forward_s": 0.01, "backward_s": [0.001] * n, "optimizer_s": 0.002,
              "hook_s": 1e-5, "iters": 3}
    bad.write_text(json.dumps({**prof, "launch": launch}))
    assert predict.workload_of(profile_file.read_profile(str(bad))).launch == \
        simulate.Launch(0.01, [0.001] * n, 0.002, 1e-5)
    for broken in ({**launch, "backward_s": [0.001]}, {**launch, "hook_s": -1.0}, [0.1]):
        bad.write_text(json.dumps({**prof, "launch": broken}))
        with pytest.raises(UsageError, match=r"malformed 'launch' \(the host's forward_s, one "
                                             r"backward_s per tensor"):
            profile_file.read_profile(str(bad))
    bad.write_text(json.dumps({**prof, "rank_compute_s": [0.0]}))
    with pytest.raises(UsageError, match=r"malformed 'rank_compute_s' \(one time > 0 per rank\)$"):
        profile_file.read_profile(str(bad))
    assert predict.rescaled(work, 4, 4 / work.compute_s / 2).forward_tensor_s == \
        pytest.approx([2 * x for x in shares])
    bad.write_text(json.dumps({**prof, "forward_tensor_s": [prof["forward_s"]] * n}))
    with pytest.raises(UsageError, match=r"^MG-WFBP profile .*: malformed 'forward_tensor_s' "
                                         r"\(one time >= 0 per tensor, summing to at most "
                                         r"forward_s\)$"):
        profile_file.read_profile(str(bad))
    # an instant network: the compute, and the issue of each tensor's all-reduce by the
    # communication thread as each is ready, one after another (the last one's after the
    # backward)
    t, issuer = work.forward_s, 0.0
    for tb in work.backward_s:
        t += tb
        issuer = max(issuer, t) + host["issue_s"]
    assert simulate.predict("wfbp", work, simulate.Link(0.0, 0.0)).iteration_s == \
        pytest.approx(max(t, issuer) + work.optimizer_s)
    # The printed groups are the rule's on the written profile.
    nbytes = [t["bytes"] for t in prof["tensors"]]
    groups = merge_groups(prof["backward_s"], nbytes, prof["alpha_s"], prof["beta_s_per_byte"],
                          4 * DEFAULT_MIN_GROUP)  # --min-group's default, fp32
    assert f"MG-WFBP groups: {len(groups)} (bytes, backward order): " \
           f"{[sum(nbytes[b] for b in g) for g in groups]}" in proc.stdout

    # Bad input: the profile of another model. One line, non-zero exit, nothing trained.
    proc = train(*SMALL_CNN, "--verify", "1", "--method", "mgwfbp", "--mgwfbp-profile",
                 str(path), "--nworkers", "2", timeout=300)
    assert proc.returncode == 2, describe(proc)
    err = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert err == [f"ddlbench: error: MG-WFBP profile {path} is for model bert_tiny, but this "
                   f"run trains resnet18; write one for it with python -m ddlbench.measure.profiler "
                   f"--model resnet18 --output FILE"], describe(proc)
    assert "verify" not in proc.stdout


def test_the_profiler_records_every_ranks_compute(tmp_path, load_json):
    """Every rank profiles at once and the profile holds each one's forward and backward
    seconds in rank order (rank 0's are the profile's own); the model replays the slowest.
    With a parameter server (an extra process) the interference is timed beside all-reduces
    and beside push/pulls of every gradient tensor through it (``interference_ps``)."""
    path = tmp_path / "two.json"
    proc = run([sys.executable, "-m", "ddlbench.measure.profiler", *TINY_BERT, "--nworkers", "2",
                "--nservers", "1", "--partition-bytes", "65536", "--warmup", "0", "--iters",
                "1", "--interference-iters", "1", "--comm-iters", "1", "--alpha", "0",
                "--beta", "0", "--timeout", "60", "--output", str(path)], timeout=300)
    assert proc.returncode == 0, describe(proc)
    prof = load_json(path)
    x, ps = prof["interference"], prof["interference_ps"]
    assert x["op"] == "allreduce" and ps["op"] == "pushpull"
    assert (ps["nservers"], ps["ps_clients"], ps["partition_bytes"]) == (1, "machine", 65536)
    assert ps["bytes"] == sum(t["bytes"] for t in prof["tensors"])
    assert ps["iters"]["compute_alone"] == 1 and ps["iters"]["comm_alone"] == 1
    assert len(ps["per_rank"]) == 2 and ps["comm_s"] > 0 and ps["compute_s"] > 0
    assert "beside push/pulls of" in proc.stdout
    ranks = prof["rank_compute_s"]
    assert prof["nworkers"] == 2 and len(ranks) == 2 and all(x > 0 for x in ranks)
    assert ranks[0] == pytest.approx(prof["forward_s"] + sum(prof["backward_s"]))
    # and every rank's passes (one here): rank 0's is its forward and backward
    passes = prof["rank_passes_s"]
    assert [len(p) for p in passes] == [1, 1] and passes[0][0] == pytest.approx(ranks[0])
    assert predict.slowest_rank(prof, 2) == pytest.approx(max(passes[0][0], passes[1][0])
                                                          / passes[0][0])

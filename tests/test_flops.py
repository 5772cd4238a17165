"""FLOPs per sample (ddlbench/measure/flops.py) against counts worked out by hand."""

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import models
from ddlbench import compat
from ddlbench.measure import flops


def test_two_linear_layers_by_hand():
    # 10 -> 20 -> 5: forward 2*10*20 + 2*20*5 = 600 per sample (a multiply-add is 2; the bias
    # adds are not counted). Backward: the first layer's weight gradient only (its input needs
    # none), 400; the second's input and weight gradients, 200 + 200.
    model = nn.Sequential(nn.Linear(10, 20), nn.ReLU(), nn.Linear(20, 5)).to("meta")

    def make_batch(n, device, gen):
        return torch.randn(n, 10, generator=gen).to(device), torch.zeros(n, dtype=torch.long,
                                                                        device=device)

    def loss(module, batch):
        x, y = batch
        return F.cross_entropy(module(x), y)

    work = models.Workload("mlp", model, "img", make_batch, loss, {})
    assert flops.count_workload(work, compat.flop_counter_mode()) == (600, 600 + 400 + 400)


def _args(**kw):
    from ddlbench.measure import workload
    base = dict(model="resnet18", image_size=32, sentence_len=16, num_classes=1000)
    return workload.Spec(**{**base, **kw})


def test_small_cnn_by_the_convolution_formula():
    """resnet18 at 32 px, the tests' CNN: forward = sum over convolutions of 2 Cin/groups Cout
    kh kw Hout Wout, plus 2 in out for the classifier; backward = twice that, less the first
    convolution's input gradient (the image needs none)."""
    with torch.device("meta"):
        work = models.build("resnet18", image_size=32)
    terms = []

    def formula(m, _, out):
        if isinstance(m, nn.Conv2d):
            kh, kw = m.kernel_size
            terms.append(2 * m.in_channels // m.groups * m.out_channels * kh * kw
                         * out.shape[2] * out.shape[3])
        else:
            terms.append(2 * m.in_features * m.out_features)
    for m in work.model.modules():
        if isinstance(m, (nn.Conv2d, nn.Linear)):
            m.register_forward_hook(formula)
    with torch.no_grad():  # (eval: batch norm takes one sample; the shapes are the same)
        work.model.eval()(torch.empty(1, 3, 32, 32, device="meta"))
    forward = sum(terms)
    assert forward == 75046912
    counted = flops.count(_args())
    assert counted["forward_per_sample"] == forward
    assert counted["forward_backward_per_sample"] == 3 * forward - terms[0]
    assert "FlopCounterMode" in counted["counted"] and counted["count_seconds"] > 0


def test_bert_counts_on_the_meta_device():
    """BERT's SDPA mask preparation calls .item(), which the meta device refuses; the count
    builds it with eager attention. Forward and backward: about 3 x forward (the input ids
    need no gradient)."""
    counted = flops.count(_args(model="bert_tiny"))
    fwd, both = counted["forward_per_sample"], counted["forward_backward_per_sample"]
    assert fwd > 0 and both == pytest.approx(3 * fwd, rel=0.01)


def test_torch_without_a_counter(monkeypatch):
    """torch 2.0 (the Horovod lane) has no FLOP counter: the record says so, no figure."""
    monkeypatch.setattr(compat, "flop_counter_mode", lambda: None)
    monkeypatch.setattr(flops, "_counted", {})   # (not this process's earlier count)
    counted = flops.count(_args())
    assert counted["forward_backward_per_sample"] is None
    assert counted["counted"].startswith("not counted: torch ")
    result = {"throughput": {"mean": 10.0}, "per_worker_mean": 5.0}
    assert flops.achieved(counted, result)["achieved_flops_per_second"] is None


def test_a_workload_is_counted_once_per_process(monkeypatch):
    """The methods of a shared job share the workload: the second count is the first's (a
    copy: a record's changes do not reach the next), not a second pass of the counter."""
    calls = []
    monkeypatch.setattr(flops, "_counted", {})
    monkeypatch.setattr(flops, "_count", lambda spec: calls.append(spec) or {"n": len(calls)})
    spec = _args()
    first = flops.count(spec)
    first["n"] = 99
    assert flops.count(spec) == {"n": 1} and calls == [spec]

"""Bucket planning (Horovod's threshold semantics) and the fusion buffers it implies."""
import math

import pytest
import torch
from torch import nn

from ddlbench.runtime.comm import Comm
from ddlbench.methods import create
from ddlbench.planning import plan_buckets


def test_threshold_zero_is_one_bucket_per_tensor():
    assert plan_buckets([4, 8, 16], 0) == [[0], [1], [2]]


def test_infinite_threshold_is_one_bucket():
    assert plan_buckets([4, 8, 16], math.inf) == [[0, 1, 2]]


def test_consecutive_packing_up_to_the_threshold():
    # 10+20 fits 30; 5 would overflow; a 100-byte tensor travels alone.
    assert plan_buckets([10, 20, 5, 100, 7, 8], 30) == [[0, 1], [2], [3], [4, 5]]
    assert plan_buckets([10, 20, 5, 100, 7, 8], 35) == [[0, 1, 2], [3], [4, 5]]


def test_keys_close_a_bucket():
    assert plan_buckets([4, 4, 4, 4], 100, keys=["a", "a", "b", "b"]) == [[0, 1], [2, 3]]


def test_empty():
    assert plan_buckets([], 10) == []


def _mlp():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(10, 20), nn.ReLU(), nn.Linear(20, 30), nn.ReLU(),
                         nn.Linear(30, 5))


@pytest.mark.parametrize("method,threshold,expected,buffer", [
    # Backward order (reverse registration) in bytes: 20, 600, 120, 2400, 80, 800.
    ("wfbp", None, [20, 600, 120, 2400, 80, 800], 0),
    ("fusion", 0, [20, 600, 120, 2400, 80, 800], 0),
    ("fusion", 1000, [740, 2400, 880], 880),   # the 2400-byte tensor travels alone, in place
    ("fusion", None, [4020], 4020),            # Horovod's 64 MiB default
    ("bspa2a", None, [4020], 4020),
])
def test_buckets_in_backward_order(method, threshold, expected, buffer):
    model = _mlp()
    s = create(method, model, torch.optim.SGD(model.parameters(), lr=0.1), Comm(0, 1),
               {"threshold": threshold})
    d = s.describe()
    assert d["bucket_bytes"] == expected
    assert d["buckets"] == len(expected)
    assert d["max_fusion_buffer_bytes"] == buffer
    if threshold:
        assert d["max_fusion_buffer_bytes"] <= threshold
    s.close()


def test_one_worker_step_equals_plain_sgd():
    """World size 1 through the whole bucket machinery: the update is plain SGD's."""
    import torch.distributed as dist
    if not dist.is_initialized():
        dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    x = torch.randn(8, 10)
    for method in ("wfbp", "fusion", "bspa2a"):
        model, ref = _mlp(), _mlp()
        s = create(method, model, torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9),
                   Comm(0, 1), {"threshold": 1000})
        ref_opt = torch.optim.SGD(ref.parameters(), lr=0.1, momentum=0.9)
        for _ in range(3):
            model(x).pow(2).mean().backward()
            s.step()
            s.zero_grad()
            ref(x).pow(2).mean().backward()
            ref_opt.step()
            ref_opt.zero_grad()
        for p, q in zip(model.parameters(), ref.parameters()):
            assert torch.equal(p, q), method
        s.close()

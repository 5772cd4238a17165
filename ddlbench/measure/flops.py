"""FLOPs per sample of the workload, counted once per run by torch's FLOP counter on the meta
device (the original suite read them from nvprof), and the FLOP/s a run achieved."""
from __future__ import annotations

import time

# Samples in the counted batch: 2, since batch norm refuses one sample per channel in training
# (resnet18 at 32 px ends on 1 x 1 maps). Every counted operation is linear in the batch.
COUNT_BATCH = 2
HOW = ("torch.utils.flop_counter.FlopCounterMode, one training step of a replica on the meta "
       "device (no data, no arithmetic; BERT with eager attention, whose matrix products are "
       "the ones SDPA counts), divided by its batch; matrix products and convolutions only "
       "(a multiply-add is 2 FLOPs), the loss's elementwise work and the optimizer step not "
       "counted")


_counted: dict = {}   # spec -> its count, this process's (a job's methods share a workload)


def count(spec) -> dict:
    """FLOPs of one sample's forward pass and of its forward and backward passes, for the
    model, image size or sentence length of ``spec`` (a ``workload.Spec``); ``None`` where
    torch has no counter (torch 2.0, the Horovod lane). Counted once per process and spec:
    the methods of a shared job read the first count (0.2 s each on ResNet-18, between every
    two methods' timed rounds), its ``count_seconds`` included."""
    if spec not in _counted:
        _counted[spec] = _count(spec)
    return dict(_counted[spec])


def _count(spec) -> dict:
    import torch

    from .. import compat
    counter_mode = compat.flop_counter_mode()
    if counter_mode is None:
        return {"forward_per_sample": None, "forward_backward_per_sample": None,
                "counted": f"not counted: torch {torch.__version__} has no "
                           f"torch.utils.flop_counter", "count_seconds": 0.0}
    start = time.perf_counter()
    with torch.device("meta"):
        work = spec.build(attention="eager")
    forward, both = count_workload(work, counter_mode)
    return {"forward_per_sample": forward, "forward_backward_per_sample": both,
            "counted": HOW, "count_seconds": time.perf_counter() - start}


def count_workload(work, counter_mode) -> tuple:
    """(forward, forward + backward) FLOPs per sample of one training step of ``work`` (a
    ``models.Workload`` on the meta device), counted by ``counter_mode``."""
    import torch
    work.model.train()
    batch = work.make_batch(COUNT_BATCH, torch.device("meta"), torch.Generator().manual_seed(0))
    with counter_mode(display=False) as counter:
        loss = work.loss(work.model, batch)
        forward = counter.get_total_flops()
        loss.backward()
        both = counter.get_total_flops()
    return _per_sample(forward), _per_sample(both)


def _per_sample(flops: int):
    return flops // COUNT_BATCH if flops % COUNT_BATCH == 0 else flops / COUNT_BATCH


def achieved(counted: dict, result: dict) -> dict:
    """The record's ``flops``: the counts and the FLOP/s the timed rounds achieved, mean
    throughput (samples/s) x forward+backward FLOPs per sample, per worker and in total."""
    per_sample = counted["forward_backward_per_sample"]
    rate = None
    if per_sample is not None:
        rate = {"per_worker": result["per_worker_mean"] * per_sample,
                "total": result["throughput"]["mean"] * per_sample}
    return {**counted, "achieved_flops_per_second": rate}

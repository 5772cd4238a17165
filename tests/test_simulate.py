"""The performance model's replay (ddlbench/model/simulate.py) against docs/DESIGN.md section 3's
closed forms, on hand-made inputs: exact up to float rounding."""
import contextlib
import dataclasses
import random

import pytest

from ddlbench.model import simulate as sim
from ddlbench import timeline
from ddlbench.errors import UsageError
from ddlbench.planning import ddp_buckets, merge_groups, plan_buckets, schedule_time

from . import model_reference
from .traces import check_trace

METHODS = sorted(sim.GROUPINGS)


def _work(seed, n=12, optimizer_s=0.004):
    rng = random.Random(seed)
    return sim.Compute(forward_s=rng.uniform(0.01, 0.05),
                        backward_s=[rng.uniform(1e-4, 5e-3) for _ in range(n)],
                        nbytes=[rng.choice([512, 4096, 65536, 1 << 20, 4 << 20])
                                for _ in range(n)],
                        optimizer_s=optimizer_s, names=[f"t{b}" for b in range(n)])


LINKS = [sim.Link(1e-3, 1e-9), sim.Link(5e-5, 8e-9), sim.Link(2e-3, 1e-10)]


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("link", LINKS, ids=["1ms-1GBps", "50us-125MBps", "2ms-10GBps"])
def test_every_grouping_is_the_recurrence_of_section_3(seed, link):
    work = _work(seed)
    for method in METHODS:
        p = sim.predict(method, work, link, threshold=1 << 21, bucket_cap_mb=1.5)
        expected = work.forward_s + schedule_time(work.backward_s, work.nbytes, p.groups,
                                                  link.alpha, link.beta) + work.optimizer_s
        assert p.iteration_s == pytest.approx(expected, rel=1e-12, abs=1e-15), method


def test_each_method_sends_the_groups_it_would():
    work, link = _work(1), LINKS[0]
    n = len(work.nbytes)
    assert sim.groups_of("bspa2a", work, link) == [list(range(n))]
    assert sim.groups_of("wfbp", work, link) == [[b] for b in range(n)]
    assert sim.groups_of("fusion", work, link, threshold=1 << 21) == \
        plan_buckets(work.nbytes, 1 << 21)
    # DDP's rule: a bucket closes once it holds the cap (the crossing tensor in it); a cap
    # given explicitly caps the first bucket too
    assert sim.groups_of("ddp", work, link, bucket_cap_mb=1.5) == \
        ddp_buckets(work.nbytes, 1.5 * 1024 * 1024)
    assert sim.groups_of("mgwfbp", work, link) == \
        merge_groups(work.backward_s, work.nbytes, link.alpha, link.beta, 8192 * 4)
    # the defaults: Horovod's 64 MiB buffer holds this model in one message; DDP's 25 MiB
    # too, after torch's first bucket of 1 MiB
    assert sim.groups_of("fusion", work, link) == [list(range(n))]
    assert sim.groups_of("ddp", work, link) == ddp_buckets(work.nbytes, 25 << 20, 1 << 20)
    assert len(sim.groups_of("ddp", work, link)) == 2


def test_ddp_buckets_are_torchs():
    """planning.ddp_buckets against torch's own assignment (the one DDP's reducer rebuilds its
    buckets with) on random sizes and caps, and against what a 2-worker DDP run of ResNet-18
    formed (its rebuilt bucket sizes, torch 2.14, at the default cap and at 25 MiB given)."""
    torch = pytest.importorskip("torch")
    import torch.distributed as dist
    rng = random.Random(7)
    for _ in range(200):
        sizes = [4 * rng.choice([1, 100, 1000, 10_000, 100_000, 1_000_000]) * rng.randint(1, 5)
                 for _ in range(rng.randint(1, 30))]
        cap, first = rng.choice([1, 2, 25]) << 20, rng.choice([None, 1 << 18, 1 << 20])
        limits = [cap] if first is None else [first, cap]
        ref, _ = dist._compute_bucket_assignment_by_size(
            [torch.empty(n // 4) for n in sizes], limits, [False] * len(sizes),
            list(range(len(sizes))))
        assert ddp_buckets(sizes, cap, first) == ref, (sizes, limits)
    # ResNet-18's gradients in the order they are ready (its parameters reversed)
    torchvision = pytest.importorskip("torchvision")
    sizes = [p.numel() * 4 for p in torchvision.models.resnet18().parameters()][::-1]

    def bucket_bytes(groups):
        return [sum(sizes[i] for i in g) for g in groups]
    assert bucket_bytes(ddp_buckets(sizes, 25 << 20, 1 << 20)) == [2052000, 28852224, 15853824]
    assert bucket_bytes(ddp_buckets(sizes, 25 << 20)) == [30904224, 15853824]
    assert bucket_bytes(plan_buckets(sizes, 25 << 20)) != [30904224, 15853824]


def test_bsp_by_hand():
    work = sim.Compute(0.5, [0.25, 0.125, 0.25], [1000, 2000, 1000], optimizer_s=0.125)
    link = sim.Link(0.5, 0.001)
    p = sim.predict("bspa2a", work, link)
    # tf + sum(tb) + (alpha + beta M) + optimizer, numbers exact in binary
    assert p.iteration_s == 0.5 + 0.625 + (0.5 + 4.0) + 0.125
    m = p.metrics
    assert m["compute_s"] == pytest.approx(1.25) and m["comm_s"] == pytest.approx(4.5)
    assert m["hidden_s"] == 0 and m["overlap"] == 0
    assert m["exposed_s"] == pytest.approx(4.5)
    # wfbp by hand: messages of 1.5, 2.5, 1.5 s ready at 0.75, 0.875, 1.125: FIFO ends 2.25,
    # 4.75, 6.25; the optimizer then.
    w = sim.predict("wfbp", work, link)
    assert w.iteration_s == pytest.approx(6.25 + 0.125)
    assert [(e[3] / 1e6, e[4] / 1e6) for e in w.events if e[1] == timeline.COMM] == \
        [pytest.approx((0.75, 2.25)), pytest.approx((2.25, 4.75)), pytest.approx((4.75, 6.25))]
    assert w.metrics["hidden_s"] == pytest.approx(1.125 - 0.75)


def test_all_compute_and_all_communication_extremes():
    work = _work(2)
    free = sim.Link(0.0, 0.0)
    for method in METHODS:
        p = sim.predict(method, work, free)
        assert p.iteration_s == pytest.approx(work.compute_s, rel=1e-12), method
        assert p.metrics["exposed_s"] == pytest.approx(0, abs=1e-12)
        assert p.bottleneck == "compute-bound"
    comm_only = sim.Compute(0.0, [0.0] * 5, [1000] * 5)
    link = sim.Link(0.01, 1e-6)
    for method in METHODS:
        p = sim.predict(method, comm_only, link, threshold=2000, bucket_cap_mb=2000 / 2 ** 20)
        # every message back to back on one stream: its start-ups and all the bytes
        assert p.iteration_s == pytest.approx(len(p.groups) * 0.01 + 5000 * 1e-6), method
        assert p.metrics["overlap"] == 0
    assert sim.predict("wfbp", comm_only, link).bottleneck == "latency-bound"
    assert sim.predict("bspa2a", comm_only, sim.Link(1e-6, 1e-3)).bottleneck == \
        "bandwidth-bound"


@pytest.mark.parametrize("seed", range(6))
def test_more_bandwidth_never_predicts_slower(seed):
    work = _work(seed, n=20)
    rng = random.Random(seed)
    alpha = rng.uniform(1e-5, 1e-3)
    for method in ("bspa2a", "wfbp", "fusion", "ddp"):  # mgwfbp re-plans per link
        times = [sim.predict(method, work, sim.Link(alpha, beta), threshold=1 << 21).iteration_s
                 for beta in (1e-8, 1e-9, 1e-10, 0.0)]
        assert times == sorted(times, reverse=True), (method, times)
    # MG-WFBP's plan is the rule's best guess, not an optimum; its time still never exceeds
    # what the same groups would cost on the slower link
    for slow, fast in ((1e-8, 1e-9), (1e-9, 1e-10)):
        p = sim.predict("mgwfbp", work, sim.Link(alpha, fast))
        same = sim.replay(work, sim.Link(alpha, slow), p.groups)
        assert p.iteration_s <= same.iteration_s


def test_two_channels_start_a_message_when_either_is_free():
    work = sim.Compute(0.0, [1.0, 0.0, 0.0], [1000, 1000, 1000])
    link = sim.Link(0.0, 0.001)   # 1 s a message
    one = sim.replay(work, link, [[0], [1], [2]], channels=1)
    two = sim.replay(work, link, [[0], [1], [2]], channels=2)
    starts = lambda p: [e[3] / 1e6 for e in p.events if e[1] == timeline.COMM]  # noqa: E731
    assert starts(one) == pytest.approx([1, 2, 3]) and one.iteration_s == pytest.approx(4)
    assert starts(two) == pytest.approx([1, 1, 2]) and two.iteration_s == pytest.approx(3)


def test_a_message_costs_the_links_per_message_and_queueing_costs_by_hand():
    """per_message_s on every message, queued_s on one its channel was busy for when it was
    handed over (both from comm_bench's burst, ``topology.Measured``)."""
    link = sim.Link(0.0, 0.001, per_message_s=0.25, queued_s=0.5)   # 1 s a 1000-byte message
    # gradients 2 s apart: each message finds the channel free
    spaced = sim.replay(sim.Compute(0.0, [2.0, 2.0, 2.0], [1000] * 3), link, [[0], [1], [2]])
    starts = lambda p: [t / 1e6 for e in p.events if e[1] == timeline.COMM  # noqa: E731
                        for t in e[3:5]]
    assert starts(spaced) == pytest.approx([2, 3.25, 4, 5.25, 6, 7.25])
    # all ready at once (a burst): the first 1.25 s, the two that waited 1.75 s each
    burst = sim.replay(sim.Compute(0.0, [1.0, 0.0, 0.0], [1000] * 3), link, [[0], [1], [2]])
    assert starts(burst) == pytest.approx([1, 2.25, 2.25, 4.0, 4.0, 5.75])
    assert burst.iteration_s == pytest.approx(5.75)
    # on two channels only the third waits
    two = sim.replay(sim.Compute(0.0, [1.0, 0.0, 0.0], [1000] * 3), link, [[0], [1], [2]],
                     channels=2)
    assert starts(two) == pytest.approx([1, 2.25, 1, 2.25, 2.25, 4.0])
    # every collective that waited: PowerSGD's P of the second message behind the first's;
    # the Qs issued in the step, the first behind that P, the second on a free channel
    codec = sim.Codec("powersgd", 2, {"powersgd_rank": 1})
    one = sim.replay(sim.Compute(0.0, [1.0, 0.0], [4 * 64] * 2, shapes=[(8, 8)] * 2),
                     sim.Link(0.0, 0.0, per_message_s=0.25, queued_s=0.5), [[0], [1]],
                     codec=codec)
    assert starts(one) == pytest.approx([1, 1.25, 1.25, 2.0, 2.0, 2.75, 2.75, 3.0])
    # a message never costs less than nothing; the plain time is the measured one
    cheap = sim.Link(1e-3, 0.0, per_message_s=-0.5e-3, queued_s=-2e-3)
    assert (cheap.time(10), cheap.time(10, queued=True), cheap.measured(10)) == \
        (pytest.approx(0.5e-3), 0.0, 1e-3)


def test_powersgds_q_is_encoded_and_all_reduced_in_the_step_by_hand():
    """The bucketed methods wait for each bucket in the step, and PowerSGD computes and
    all-reduces its Q only then (it needs the reduced P): per bucket, the P encoded and
    all-reduced by the communication thread the hook handed it to, then in the step the Q
    encode on the training thread, the Q all-reduce (behind whatever the channel holds) and
    the decode. DDP's thread does P, Q and both encodes in a row on the channel, as before."""
    # two 8 x 8 matrices (64 elements) 1 s of backward apart; a collective 0.5 s; encode 1 s
    # per matrix, 0.5 s of it at wait; decode 0.25 s
    work = sim.Compute(0.0, [1.0, 1.0], [4 * 64] * 2, shapes=[(8, 8)] * 2)
    codec = sim.Codec("powersgd", 2, {"powersgd_rank": 1}, encode_s_per_element=1 / 64,
                      decode_s_per_element=0.25 / 64, encode_at_wait_s_per_element=0.5 / 64)
    link = sim.Link(0.5, 0.0)
    spans = lambda p, kind: sorted((e[3] / 1e6, e[4] / 1e6, e[0], e[2])  # noqa: E731
                                   for e in p.events if e[1] == kind)
    wfbp = sim.predict("wfbp", work, link, codec=codec, nworkers=2)
    # the thread: P encoded 1.0-1.5 and 2.0-2.5 (the backward ends at 2.0), the Ps 1.5-2.0
    # and 2.5-3.0; the step from 2.0: Q encode to 2.5, Q all-reduce behind the second P
    # (3.0-3.5), decode to 3.75, then the second Q encode, all-reduce and decode
    assert [s[:2] for s in spans(wfbp, timeline.COMM)] == [(1.5, 2.0), (2.5, 3.0), (3.0, 3.5),
                                                           (4.25, 4.75)]
    assert spans(wfbp, timeline.CODEC) == [
        (1.0, 1.5, "encode", "issue"), (2.0, 2.5, "encode", "issue"),
        (2.0, 2.5, "encode", timeline.MAIN), (3.5, 3.75, "decode", timeline.MAIN),
        (3.75, 4.25, "encode", timeline.MAIN), (4.75, 5.0, "decode", timeline.MAIN)]
    assert wfbp.iteration_s == pytest.approx(5.0)
    assert wfbp.message_bytes == [4 * 8 + 4 * 8] * 2          # P (8 x 1) and Q (8 x 1)
    with _recurrences():
        assert sim.replay(work, link, wfbp.groups, method="wfbp", codec=codec,
                          nworkers=2).iteration_s == pytest.approx(5.0)
    # without a part at wait the whole encode is the thread's (1.0-2.0, 2.0-3.0; the Ps
    # 2.0-2.5 and 3.0-3.5); the first Q waits for the second P (to 4.0), then decode, Q, decode
    whole = dataclasses.replace(codec, encode_at_wait_s_per_element=0.0)
    assert sim.predict("wfbp", work, link, codec=whole, nworkers=2).iteration_s == \
        pytest.approx(4.0 + 0.25 + 0.5 + 0.25)
    # DDP (one bucket): its thread encodes 2 s, P 0.5, Q 0.5 and decodes 0.5 in a row
    ddp = sim.predict("ddp", work, link, codec=codec, nworkers=2)
    assert [s[:2] for s in spans(ddp, timeline.COMM)] == [(4.0, 4.5), (4.5, 5.0)]
    assert ddp.iteration_s == pytest.approx(5.5)
    with pytest.raises(UsageError, match="at most the whole encode"):
        dataclasses.replace(codec, encode_at_wait_s_per_element=2 / 64)


def test_the_predicted_trace_reads_back_with_the_same_metrics():
    work = _work(3)
    for method in METHODS:
        p = sim.predict(method, work, LINKS[0])
        obj = sim.trace(p, {"model": "hand-made"})
        rows = check_trace(obj)
        comm = [e for (_, name), evs in rows.items() if name.startswith("allreduce")
                for e in evs]
        assert len(comm) == len(p.groups) and obj["metadata"]["predicted"]
        # one stream: no message overlaps the previous one
        spans = sorted((e["ts"], e["ts"] + e["dur"]) for e in comm)
        assert all(a[1] <= b[0] + 1e-3 for a, b in zip(spans, spans[1:])), method
        back = timeline.overlap(timeline.read(obj)[0]["events"])["mean"]
        for key, value in p.metrics.items():
            if value is not None:   # the trace rounds times to the nanosecond
                assert back[key] == pytest.approx(value, abs=1e-8), (method, key)


@pytest.mark.parametrize("make,message", [
    (lambda: sim.predict("magic", _work(0), LINKS[0]), "cannot predict method 'magic'"),
    (lambda: sim.Compute(0.1, [0.1], [10, 20]), "one backward time per tensor"),
    (lambda: sim.Compute(0.1, [-0.1], [10]), "must be finite and >= 0"),
    (lambda: sim.Link(-1.0, 0.0), "alpha and beta must be >= 0"),
    (lambda: sim.Link(0.0, 0.0, queued_s=float("nan")), "per-message and queueing costs must"),
    (lambda: sim.replay(_work(0, n=3), LINKS[0], [[0, 1]]), "cover every tensor"),
])
def test_bad_input_is_one_clear_line(make, message):
    with pytest.raises(UsageError, match=message):
        make()


# ---------------------------------------------------------------------------- ByteScheduler

def test_bytescheduler_without_partition_credit_or_forward_is_wfbp():
    """One chunk per tensor and credit for everything: each chunk leaves as soon as it is ready,
    in the order of readiness, as WFBP's messages; with no forward and no optimizer the next
    iteration's first module waits for the last message: WFBP's iteration."""
    for seed in range(3):
        w = _work(seed, optimizer_s=0.0)
        work = sim.Compute(0.0, w.backward_s, w.nbytes, names=w.names)
        for link in LINKS:
            p = sim.predict("bytescheduler", work, link, partition=10 ** 9, credit=10 ** 12)
            wfbp = sim.predict("wfbp", work, link)
            assert p.iteration_s == pytest.approx(wfbp.iteration_s, rel=1e-12)
            assert p.message_bytes == work.nbytes[::-1]     # front layers first


def test_bytescheduler_extremes_and_the_next_forward():
    work = _work(4, optimizer_s=0.0)
    free = sim.predict("bytescheduler", work, sim.Link(0.0, 0.0), partition=50000)
    assert free.iteration_s == pytest.approx(work.compute_s, rel=1e-12)
    comm_only = sim.Compute(0.0, [0.0] * 4, [40000] * 4)
    link = sim.Link(0.01, 1e-6)
    p = sim.predict("bytescheduler", comm_only, link, partition=4000, credit=8000)
    # 10,000 elements a tensor: chunks of 4,000, 4,000 and 2,000, back to back: start-ups
    # and bytes
    assert p.message_bytes == [16000, 16000, 8000] * 4
    assert p.iteration_s == pytest.approx(12 * 0.01 + 160000 * 1e-6)
    # three 4 MiB back layers, then a small front one: WFBP sends the front last, so the next
    # forward waits for everything; ByteScheduler's 1 MB chunks, one in flight, let the front
    # one overtake, and the next forward overlaps the back layers' chunks
    work = sim.Compute(0.03, [0.01, 0.001, 0.001, 0.001], [4 << 20] * 3 + [4096])
    link = sim.Link(1e-4, 1e-9)
    bs = sim.predict("bytescheduler", work, link, partition=250000, credit=250000)
    wfbp = sim.predict("wfbp", work, link)
    assert bs.iteration_s < 0.9 * wfbp.iteration_s
    assert bs.metrics["overlap"] > 2 * wfbp.metrics["overlap"]
    waits = [e for e in bs.events if e[0] == "forward pre-hook"]
    assert waits and all(e[1] == timeline.WAIT for e in waits)


def test_bytescheduler_priority_lets_a_front_layer_overtake():
    """Credit for one chunk at a time: tensor 0 (front, ready last) goes before the chunks of
    tensor 1 still queued when it is ready."""
    # backward order: tensor 1 (back) ready at 0.1 s, tensor 0 (front) at 0.15 s
    work = sim.Compute(0.0, [0.1, 0.05], [16000, 800], names=["back", "front"])
    link = sim.Link(0.0, 1e-5)   # 4,000-byte chunk: 0.04 s
    p = sim.predict("bytescheduler", work, link, partition=1000, credit=1)
    order = [e[5]["tensor"] for e in sorted(p.history, key=lambda e: e[3])
             if e[0] == "allreduce"]
    # back[0:1000] goes at 0.1 s, back[1000:2000] at 0.14; front is ready at 0.15 and goes
    # next (0.18), before back's chunks still queued
    assert order[:4] == ["back[0:1000]", "back[1000:2000]", "front[0:200]", "back[2000:3000]"]


def test_bytescheduler_timing_round_by_hand():
    """A round of the measurement protocol: B steps from a clean start, then synchronize. The
    steady state overlaps tensor 1's update with tensor 0's forward; the round's first step waits
    for nothing and its synchronize for everything."""
    # forward order l0, l1, l2: 1 s forward and backward each; all-reduces 1, 2, 2 s; credit
    # for one chunk at a time, so tensor 0 (ready last) overtakes tensor 1
    work = sim.Compute(3.0, [1.0, 1.0, 1.0], [8, 8, 4])
    link = sim.Link(0.0, 0.25)
    steady = sim.predict("bytescheduler", work, link, credit=1)
    # step 1: forward 0-3, backward 3-6, all-reduces l2 4-6, l0 6-7, l1 7-9; step 2 from 6:
    # l0's update at 7, its forward 7-8, l1's at 9, forward 9-11, backward 11-14, l2 12-14,
    # l0 14-15, l1 15-17; step 3 from 14 waits the same way: 8 s a step
    assert steady.iteration_s == pytest.approx(8.0)
    two = sim.predict("bytescheduler", work, link, credit=1, batches_per_iter=2)
    assert two.iteration_s == pytest.approx(17.0 / 2)        # synchronize until l1's 17 s
    # the recurrences without the event simulator replay the same round
    with _recurrences():
        assert sim.bytescheduler(work, link, credit=1, batches_per_iter=2).iteration_s \
            == pytest.approx(17.0 / 2)
    assert two.metrics["iteration_s"] == pytest.approx((6 + 8) / 2)
    assert [(e[3] / 1e6, e[4] / 1e6) for e in two.events if e[0] == "synchronize"] == \
        [pytest.approx((14.0, 17.0))]
    one = sim.predict("bytescheduler", work, link, credit=1, batches_per_iter=1)
    assert one.iteration_s == pytest.approx(9.0)
    # the worker-side PS variant takes it too; a round of no steps is refused
    assert sim.predict("byteschedulerps-worker", work, None, servers=sim.ServerLinks(0.0, 0.25, 0.0),
                       batches_per_iter=1).iteration_s > 0
    for bad in (0, 1.5, True):
        with pytest.raises(UsageError, match="batches per timing round must be a whole number"):
            sim.predict("bytescheduler", work, link, batches_per_iter=bad)


# ---------------------------------------------------------------------------- compressors

def test_a_compressor_costs_its_collectives_and_its_codec():
    """fp16 halves every message (the recurrence on half the bytes); encode and decode add
    their time per dense element to each message; TopK all-gathers what it declares
    (``sends_for``), on the all-gather link."""
    import compression
    work = _work(5)
    link = LINKS[1]
    for method in ("wfbp", "fusion", "bspa2a", "mgwfbp"):
        plain = sim.predict(method, work, link, threshold=1 << 21)
        half = sim.predict(method, work, link, threshold=1 << 21,
                           codec=sim.Codec("fp16", nworkers=4))
        expected = work.forward_s + schedule_time(
            work.backward_s, [b // 2 for b in work.nbytes], plain.groups, link.alpha,
            link.beta) + work.optimizer_s
        assert half.groups == plain.groups
        assert half.iteration_s == pytest.approx(expected, rel=1e-12), method
        assert half.message_bytes == [sum(work.nbytes[b] for b in g) // 2 for g in plain.groups]
    comm_only = sim.Compute(0.0, [0.0] * 3, [4000, 8000, 400], shapes=[(10, 100), (2000,),
                                                                       (100,)])
    codec = sim.Codec("topk", nworkers=4, options={"density": 0.01}, encode_s_per_element=1e-6,
                      decode_s_per_element=2e-6, allgather=sim.Link(0.5, 1e-3))
    p = sim.predict("bspa2a", comm_only, link, codec=codec)
    ops = compression.declared("topk", {"density": 0.01}).sends_for(comm_only.shapes, 4)
    ops = list(ops.collectives)
    # one message of 3100 elements: k = 31 fp32 values and 31 int32 indices from 4 workers
    assert ops == [("allgather", 4 * 31 * 4), ("allgather", 4 * 31 * 4)]
    assert p.iteration_s == pytest.approx(3100 * 3e-6 + sum(0.5 + 1e-3 * size
                                                            for _, size in ops))
    codecs = [e for e in p.events if e[1] == timeline.CODEC]
    assert [e[0] for e in codecs] == ["encode", "decode"]
    assert p.message_bytes == [sum(size for _, size in ops)]


def test_methods_refuse_the_compressors_they_do_not_take():
    work = _work(0)
    with pytest.raises(UsageError, match="bytescheduler does not take compressor powersgd"):
        sim.predict("bytescheduler", work, LINKS[0], codec=sim.Codec("powersgd"))
    with pytest.raises(UsageError, match="wfbpps does not take compressor fp16"):
        sim.predict("wfbpps", work, None, codec=sim.Codec("fp16"),
                    servers=sim.ServerLinks(0.0, 1e-9, 1e-9))
    with pytest.raises(UsageError, match="all-gather link"):
        sim.predict("wfbp", work, LINKS[0], codec=sim.Codec("signum", nworkers=2))


# ---------------------------------------------------------------------------- parameter servers

PS_METHODS = ("bspps", "wfbpps", "byteschedulerps", "byteschedulerps-worker")


def test_push_and_pull_pipeline_by_hand():
    """8 partitions of 1 KiB, 2 servers, 4 pushers; a push holds the uplink 0.25 s and its
    server's downlink 1 s (4 copies), a pull the reverse. Server 0 takes partitions 0, 2, 4, 6,
    server 1 the others; the servers' links bound the pushes (the last pushed at 4.25 s, the
    servers' share n M / (k B) = 4 s plus the first push's offset) and the last pull then takes
    its server's uplink 1 s: 5.25 s."""
    comm_only = sim.Compute(0.0, [0.0], [8 * 1024], names=["g"])
    servers = sim.ServerLinks(0.0, 2 ** -12, 2 ** -12, nservers=2, pushers=4)
    p = sim.predict("bspps", comm_only, None, servers=servers, partition_bytes=1024)
    assert p.iteration_s == 5.25
    pushes = sorted((e[5]["key"], e[5]["server"], e[3] / 1e6, e[4] / 1e6)
                    for e in p.events if e[0] == "push")
    assert pushes == [(0, 0, 0.0, 1.0), (1, 1, 0.25, 1.25), (2, 0, 0.5, 2.0),
                      (3, 1, 0.75, 2.25), (4, 0, 1.0, 3.0), (5, 1, 1.25, 3.25),
                      (6, 0, 1.5, 4.0), (7, 1, 1.75, 4.25)]
    # one pusher and fast servers: the worker's own link, M/B each way, pipelined
    one = sim.ServerLinks(0.0, 2 ** -12, 0.0, nservers=2, pushers=1)
    q = sim.predict("bspps", comm_only, None, servers=one, partition_bytes=1024)
    assert q.iteration_s == 8 * 0.25 + 0.25


def test_the_local_sum_crosses_the_leaders_link_in_order_each_way():
    """One client per machine: each partition crosses the leader's intra-node link inward
    (``local``: 0.5 s a KiB, then its 0.125 s latency) before its push and outward after its
    pull, each way a FIFO of its own. One pusher, fast servers, pushes and pulls 0.25 s: the
    4 partitions are in at 0.5, 1.0, 1.5, 2.0 s (+0.125), pushed and pulled 0.5 s later, and
    out in turn, the last at 2.625 + 0.5 + 0.125 = 3.25 s: the leader's link is the
    bottleneck, M b_local, plus one partition's other stages and both latencies. A large
    message costs max(M/B, n M/(k B), M b_local) per direction."""
    comm_only = sim.Compute(0.0, [0.0], [4 * 1024])
    one = sim.ServerLinks(0.0, 2 ** -12, 0.0)
    local = sim.Link(0.125, 2 ** -11)
    p = sim.predict("bspps", comm_only, None, servers=one, local=local, partition_bytes=1024)
    assert p.iteration_s == 3.25
    assert sorted(e[3] / 1e6 for e in p.events if e[0] == "push") == [0.625, 1.125, 1.625,
                                                                      2.125]
    # without the local sum the uplink is the bottleneck: 4 pushes, then the last pull
    assert sim.predict("bspps", comm_only, None, servers=one,
                       partition_bytes=1024).iteration_s == 1.25
    M, part = 64 << 20, 1 << 16
    big = sim.Compute(0.0, [0.0], [M])
    for lb in (5e-10, 2e-9, 8e-9):
        servers = sim.ServerLinks(0.0, 1e-9, 1e-10, nservers=2, pushers=8)
        q = sim.predict("bspps", big, None, servers=servers, local=sim.Link(0.0, lb),
                        partition_bytes=part)
        bound = max(M * 1e-9, 8 * M * 1e-10 / 2, M * lb)
        assert bound < q.iteration_s <= bound + 3 * part * max(1e-9, 8e-10, lb) + 1e-12


def test_a_push_queued_behind_another_costs_its_queueing_cost():
    """queued_s_per_byte: a push that waits for the uplink behind another's holds it that much
    longer per byte; the first of a burst, and a push whose uplink is free when its gradient
    is ready, do not. One pusher, fast servers, 1 KiB partitions of 0.25 s each way: 4
    partitions at once are 5 stages (1.25 s) and 3 queued pushes (3 x 0.125 s); the same 4
    handed over 1 s apart (wfbpps, each tensor's gradient 1 s after the one before) queue
    nothing: each ends 0.5 s after its gradient."""
    comm_only = sim.Compute(0.0, [0.0], [4 * 1024])
    plain = sim.ServerLinks(0.0, 2 ** -12, 0.0)
    queued = sim.ServerLinks(0.0, 2 ** -12, 0.0, queued_s_per_byte=2 ** -13)
    assert sim.predict("bspps", comm_only, None, servers=plain,
                       partition_bytes=1024).iteration_s == 1.25
    assert sim.predict("bspps", comm_only, None, servers=queued,
                       partition_bytes=1024).iteration_s == 1.25 + 3 * 0.125
    assert queued.message(4 * 1024, 1024) == 1.25 + 3 * 0.125
    spaced = sim.Compute(0.0, [1.0] * 4, [1024] * 4)
    for servers in (plain, queued):
        assert sim.predict("wfbpps", spaced, None, servers=servers,
                           partition_bytes=1024).iteration_s == 4.5
    for bad in (-1e-9, float("nan"), float("inf")):
        with pytest.raises(UsageError, match="queueing cost must be a number >= 0"):
            sim.ServerLinks(0.0, 0.0, 0.0, queued_s_per_byte=bad)


@pytest.mark.parametrize("k", [1, 2, 4])
def test_ps_large_messages_cost_the_section_3_formula(k):
    """max(M/B, n M/(k B)) per direction: with small partitions the iteration of bspps on a
    comm-only workload approaches it (plus one partition's pull)."""
    M, n, part = 64 << 20, 8, 1 << 16
    comm_only = sim.Compute(0.0, [0.0], [M])
    for wb, sb in ((1e-9, 1e-9), (1e-9, 1e-10), (4e-9, 1e-10)):
        servers = sim.ServerLinks(0.0, wb, sb, nservers=k, pushers=n)
        p = sim.predict("bspps", comm_only, None, servers=servers, partition_bytes=part)
        bound = max(M * wb, n * M * sb / k)
        assert bound < p.iteration_s <= bound + 2 * part * max(wb, n * sb) + 1e-12


def test_ps_methods_extremes_and_schedule():
    work = _work(6)
    free = sim.ServerLinks(0.0, 0.0, 0.0, nservers=3, pushers=4)
    for method in PS_METHODS:
        p = sim.predict(method, work, None, servers=free)
        # the worker-side ByteScheduler-PS updates on its completer thread, beside the
        # backward: only the front layer's update (ready last) delays the next forward
        front = work.optimizer_s * work.nbytes[-1] / sum(work.nbytes)
        compute = work.compute_s - (work.optimizer_s - front
                                    if method == "byteschedulerps-worker" else 0.0)
        assert p.iteration_s == pytest.approx(compute, rel=1e-12), method
        assert p.bottleneck == "compute-bound"
    slow = sim.ServerLinks(1e-4, 1e-9, 1e-9, nservers=1, pushers=4)
    bsp = sim.predict("bspps", work, None, servers=slow)
    wfbp = sim.predict("wfbpps", work, None, servers=slow)
    # bspps pushes after the backward: nothing hidden; wfbpps pushes from the hooks
    assert bsp.metrics["hidden_s"] == pytest.approx(0, abs=1e-12)
    assert wfbp.metrics["hidden_s"] > 0 and wfbp.iteration_s < bsp.iteration_s
    assert bsp.bottleneck == "server-bound"
    first_push = min(e[3] for e in bsp.events if e[0] == "push") / 1e6
    assert first_push == pytest.approx(work.forward_s + sum(work.backward_s))
    # every partition pushed and pulled once per iteration, keys round-robin on the servers
    keys = sorted(e[5]["key"] for e in wfbp.events if e[0] == "push")
    assert keys == list(range(len(keys))) and len(keys) >= len(work.nbytes)
    bs = sim.predict("byteschedulerps-worker", work, None, servers=slow, credit=10 ** 12)
    assert bs.method == "byteschedulerps-worker" and bs.iteration_s > 0
    # the original's ByteScheduler-PS: WFBP-PS's workers (the model has no server priority)
    orig = sim.predict("byteschedulerps", work, None, servers=slow)
    assert orig.iteration_s == pytest.approx(wfbp.iteration_s, rel=1e-12)


@pytest.mark.parametrize("method", PS_METHODS)
def test_ps_more_bandwidth_never_predicts_slower(method):
    work = _work(7, n=16)
    times = [sim.predict(method, work, None,
                         servers=sim.ServerLinks(1e-4, beta, beta / 2, nservers=2,
                                                 pushers=4)).iteration_s
             for beta in (1e-8, 1e-9, 1e-10, 0.0)]
    assert times == sorted(times, reverse=True), times
    more = [sim.predict(method, work, None,
                        servers=sim.ServerLinks(1e-4, 1e-9, 1e-8, nservers=k,
                                                pushers=4)).iteration_s for k in (1, 2, 4)]
    assert more == sorted(more, reverse=True), more


def test_ps_needs_its_servers():
    with pytest.raises(UsageError, match="needs the parameter servers"):
        sim.predict("bspps", _work(0), LINKS[0])
    with pytest.raises(UsageError, match="at least one server"):
        sim.ServerLinks(0.0, 0.0, 0.0, nservers=0)


# ---------------------------------------------------------------------------- CPU interference

def _slowed(work, kappa, mu):
    return dataclasses.replace(work, compute_slowdown=kappa, comm_slowdown=mu)


def _spans(p, cat=timeline.COMM):
    return [(e[3] / 1e6, e[4] / 1e6) for e in sorted(p.events, key=lambda e: e[3])
            if e[1] == cat]


def test_interference_by_hand():
    """Gradient 0 ready at 0.5 s, its 1 s message beside the 1 s backward of tensor 1.
    kappa = 1, mu = 0.5: from 0.5 s compute runs at 1/2, communication at 2/3; the message
    ends at 0.5 + 1.5 = 2.0 s, when 0.75 s of the backward is done; its last 0.25 s runs
    alone (2.25 s), then message 1 alone, 1 s: 3.25 s (2.5 s without interference)."""
    work = sim.Compute(0.0, [0.5, 1.0], [1000, 1000], optimizer_s=0.25)
    link = sim.Link(0.0, 0.001)
    plain = sim.predict("wfbp", work, link)
    assert plain.iteration_s == 2.75
    p = sim.predict("wfbp", _slowed(work, 1.0, 0.5), link)
    assert p.iteration_s == 3.25 + 0.25
    assert _spans(p) == [(0.5, 2.0), (2.25, 3.25)]
    assert _spans(p, timeline.COMPUTE) == [(0.0, 0.0), (0.0, 2.25), (3.25, 3.5)]
    assert p.metrics["hidden_s"] == 1.5 and p.metrics["compute_s"] == 2.5
    # kappa alone: the message ends at 1.5 s with half the backward done, the rest alone: 2 s
    assert _spans(sim.predict("wfbp", _slowed(work, 1.0, 0.0), link)) == [(0.5, 1.5), (2, 3)]
    # mu alone: the message takes 1.5 s wall beside the backward (ends 1.5 s), then idles
    q = sim.predict("wfbp", _slowed(work, 0.0, 1.0), link)
    assert _spans(q) == [(0.5, 2.0), (2.0, 3.0)] and q.iteration_s == 3.25


def test_interference_bytescheduler_by_hand():
    """Two tensors, B (back, ready first) and A (front); one chunk each, messages of 1 s (B)
    and 2 s (A); forward 0.5 s (A) and 1 s (B), updates 0.5 s (B) and 1 s (A), kappa = mu = 1.
    In steady state an iteration starts as A leaves (its backward done) and its forward waits
    for A's update: B's message, half done, ends alone at 0.5 s; B's update on the completer
    beside A's message, both at half speed, to 1.5 s; A's message's last 1.5 s alone, to 3 s;
    A's update alone, to 4 s; the forward (1.5 s) and B's backward (1 s) alone, to 6.5 s; B's
    message beside A's 0.5 s backward, both at half speed, to 7.5 s, when A leaves half of
    B's message done. 7.5 s an iteration, 6.5 s without interference."""
    work = sim.Compute(1.5, [1.0, 0.5], [1000, 2000], optimizer_s=1.5, names=["B", "A"])
    link = sim.Link(0.0, 0.001)
    assert sim.predict("bytescheduler", work, link).iteration_s == pytest.approx(6.5)
    p = sim.predict("bytescheduler", _slowed(work, 1.0, 1.0), link)
    assert p.iteration_s == pytest.approx(7.5)
    lo = min(e[3] for e in p.events if e[1] == timeline.ITERATION) / 1e6
    rel = lambda spans: [pytest.approx((a - lo, b - lo), abs=1e-9)  # noqa: E731
                         for a, b in spans]
    assert rel(_spans(p)) == [(-1.0, 0.5), (0.5, 3.0), (6.5, 8.0)]
    # the forward (from its wait), the updates, the backward
    assert rel(_spans(p, timeline.COMPUTE)) == [(0.0, 5.5), (0.5, 1.5), (3.0, 4.0),
                                                 (5.5, 7.5)]
    assert [(e[3] / 1e6 - lo, e[4] / 1e6 - lo) for e in p.events
            if e[0] == "forward pre-hook"] == [pytest.approx((0.0, 4.0))]


def test_bsp_is_not_slowed_by_interference():
    """bspa2a and bspps communicate after the backward, with nothing to compute beside
    them: the same iteration whatever kappa and mu."""
    servers = sim.ServerLinks(1e-4, 1e-9, 5e-10, nservers=2, pushers=4)
    for seed in range(3):
        work = _work(seed)
        for kappa, mu in ((1.0, 0.0), (0.0, 1.0), (0.5, 2.0)):
            for method in ("bspa2a", "bspps"):
                kw = {"servers": servers} if method == "bspps" else {}
                link = None if method == "bspps" else LINKS[seed]
                plain = sim.predict(method, work, link, **kw)
                p = sim.predict(method, _slowed(work, kappa, mu), link, **kw)
                assert p.iteration_s == pytest.approx(plain.iteration_s, rel=1e-12)
                assert p.metrics["hidden_s"] == pytest.approx(0, abs=1e-12)


@pytest.mark.parametrize("seed", range(3))
def test_the_stretch_is_the_overlap(seed):
    """One channel: the training thread computes throughout the forward and backward, so the
    compute's wall time is its work plus kappa/(1+kappa) of the time communication hid under
    it, and communication's is its messages' time plus mu/(1+mu) of the same."""
    work = _slowed(_work(seed), 0.7, 0.3)
    link = LINKS[seed]
    for method in METHODS:
        p = sim.predict(method, work, link, threshold=1 << 21, bucket_cap_mb=1.5)
        m = p.metrics
        messages = sum(link.time(b) for b in p.message_bytes)
        assert m["compute_s"] == pytest.approx(work.compute_s + m["hidden_s"] * 0.7 / 1.7,
                                               rel=1e-9), method
        assert m["comm_s"] == pytest.approx(messages + m["hidden_s"] * 0.3 / 1.3, rel=1e-9)


PS_LINK = sim.ServerLinks(1e-4, 1e-9, 5e-10, nservers=2, pushers=4)


def _every(method, work, link, **kw):
    if method in PS_METHODS:
        return sim.predict(method, work, None, servers=PS_LINK, **kw)
    # a method with an exchange of its own (and a sharding method's gathers after the
    # optimizer): each collective on the link, a shard at half
    rule = sim.method_class(method).rule
    steps, gather = (tuple((s.op, 0.5 if s.shard_of else 1.0, link) for s in declared)
                     for declared in (rule.exchange, rule.gather))
    return sim.predict(method, work, link, steps=steps, gather=gather, **kw)


@pytest.mark.parametrize("seed", range(3))
def test_more_interference_never_predicts_faster(seed):
    """Monotone in kappa and in mu, for every method at its defaults. (ByteScheduler with
    small chunks and little credit is not monotone, in the network's speed either: a
    priority scheduler's anomalies.)"""
    work, link = _work(seed, n=10), LINKS[seed]
    for method in sim.METHODS:
        overlaps = _every(method, work, link).metrics["hidden_s"] > 0
        for axis in (0, 1):
            times = []
            for x in (0.0, 0.2, 1.0, 3.0):
                kappa, mu = (x, 0.5) if axis == 0 else (0.5, x)
                times.append(_every(method, _slowed(work, kappa, mu), link).iteration_s)
            assert all(b >= a * (1 - 1e-12) for a, b in zip(times, times[1:])), \
                (method, axis, times)
            # more of it costs more where anything overlaps (not BSP, nor one bucket)
            assert (times[-1] > times[0] * 1.01) == overlaps, (method, axis, times)


@pytest.mark.parametrize("seed", range(4))
def test_without_interference_the_cosimulation_is_the_replay(seed):
    """kappa = mu = 0: the event simulator gives every method's plain replay (the section 3
    recurrences, tests/model_reference.py), events and all, on random workloads, channels
    and transports."""
    work, link = _work(seed), LINKS[seed % 3]

    def both(run):
        with _recurrences():
            a = run()
        _same(a, run())
    for method in sim.GROUPINGS:
        groups = sim.groups_of(method, work, link)
        for channels in (1, 2):
            both(lambda: sim.replay(work, link, groups, channels, method))
    for method in ("bspps", "wfbpps"):
        groups = sim.groups_of(method, work, None)
        both(lambda: sim.replay(work, None, groups, method=method, servers=PS_LINK))
    for partition, credit in ((4_000_000, 16_000_000), (50_000, 100_000), (100_000, 1)):
        both(lambda: sim.bytescheduler(work, link, partition, credit, channels=1 + seed % 2))
    both(lambda: sim.bytescheduler(work, None, servers=PS_LINK, credit=1 << 20))


@contextlib.contextmanager
def _recurrences():
    """The schedules by the recurrences without the event simulator (tests/model_reference.py)
    in place of the simulator's, for the with block."""
    saved = sim._schedule, sim._bytescheduler_threads
    sim._schedule = model_reference.training
    sim._bytescheduler_threads = model_reference.bytescheduler_threads
    try:
        yield
    finally:
        sim._schedule, sim._bytescheduler_threads = saved


def _same(a, b):
    assert b.iteration_s == pytest.approx(a.iteration_s, rel=1e-12, abs=1e-15)
    assert a.message_bytes == b.message_bytes
    key = lambda e: (e[2], e[3], e[0])  # noqa: E731
    ea, eb = sorted(a.events, key=key), sorted(b.events, key=key)
    assert [e[:3] for e in ea] == [e[:3] for e in eb]
    assert [e[3:5] for e in eb] == [pytest.approx(e[3:5], abs=1e-6) for e in ea]
    for k, v in a.metrics.items():
        assert b.metrics[k] == pytest.approx(v, abs=1e-12), k


def test_interfering_predictions_are_valid_timelines():
    work = _slowed(_work(8), 0.4, 0.25)
    for method in sim.METHODS:
        p = _every(method, work, LINKS[1])
        rows = check_trace(sim.trace(p))
        assert rows and p.iteration_s > 0
        back = timeline.overlap(timeline.read(sim.trace(p))[0]["events"])["mean"]
        for key, value in p.metrics.items():
            if value is not None:   # the trace rounds times to the nanosecond
                assert back[key] == pytest.approx(value, rel=1e-6, abs=1e-8), (method, key)


@pytest.mark.parametrize("kappa,mu", [(-0.1, 0.0), (0.0, float("nan")), (float("inf"), 0.0)])
def test_interference_must_be_finite_and_not_negative(kappa, mu):
    with pytest.raises(UsageError, match="interference slowdowns must be finite and >= 0"):
        sim.Compute(0.1, [0.1], [10], compute_slowdown=kappa, comm_slowdown=mu)


def test_predict_takes_the_profiles_interference(tmp_path, capsys):
    """predict.workload_of reads the profiler's ``interference`` (a slowdown measured below 0
    counts as 0; --no-interference ignores it); the predictions change only where something
    overlaps."""
    import json

    from ddlbench.model import predict
    from ddlbench.measure.profile_file import PROFILE_FORMAT, PROFILE_VERSION
    prof = {"format": PROFILE_FORMAT, "version": PROFILE_VERSION, "model": "hand-made",
            "workload": {"batch_size": 8},
            "tensors": [{"name": f"t{i}", "shape": [n // 4], "bytes": n}
                        for i, n in enumerate([4096, 1 << 20, 65536, 4 << 20])],
            "backward_s": [0.002, 0.004, 0.001, 0.006], "forward_s": 0.01,
            "alpha_s": 1e-3, "beta_s_per_byte": 1e-9, "nworkers": 2,
            "interference": {"compute_slowdown": 0.5, "comm_slowdown": -0.01, "bytes": 4096}}
    work = predict.workload_of(prof, 0.002)
    assert (work.compute_slowdown, work.comm_slowdown) == (0.5, 0.0)
    assert not predict.workload_of(prof, interference=False).interferes
    assert not predict.workload_of({**prof, "interference": None}).interferes
    with pytest.raises(UsageError, match="interference compute_slowdown must be a number"):
        predict.workload_of({**prof, "interference": {"compute_slowdown": "x"}})
    path = tmp_path / "prof.json"
    path.write_text(json.dumps(prof))
    out = {}
    for flags in ([], ["--no-interference"]):
        assert predict.main(["--profile", str(path), "--method", "bspa2a,wfbp",
                             "--output", str(tmp_path / "p.json"), *flags]) == 0
        capsys.readouterr()
        got = json.loads((tmp_path / "p.json").read_text())["predictions"]
        out[bool(flags)] = {p["method"]: p["iteration_s"] for p in got}
    assert out[False]["bspa2a"] == pytest.approx(out[True]["bspa2a"], rel=1e-12)
    assert out[False]["wfbp"] > out[True]["wfbp"]


def test_ps_and_compressed_traces_read_back_with_the_same_metrics():
    """The PS methods' pushes and pulls, and a compressor's codec spans, are a trace the
    timeline tool reads back with the simulator's metrics."""
    work = _work(8)
    servers = sim.ServerLinks(1e-4, 1e-9, 2e-10, nservers=2, pushers=4)
    cases = [sim.predict(m, work, None, servers=servers) for m in PS_METHODS]
    cases.append(sim.predict("fusion", work, LINKS[1], threshold=1 << 21, codec=sim.Codec(
        "topk", 4, {"density": 0.01}, 1e-9, 1e-9, sim.Link(1e-4, 1e-9))))
    for p in cases:
        obj = sim.trace(p)
        rows = check_trace(obj)
        names = {name.split(" ")[0] for (_, name) in rows}
        assert ({"push", "pull"} <= names) if p.method in PS_METHODS else "allreduce" in names
        back = timeline.overlap(timeline.read(obj)[0]["events"])["mean"]
        for key, value in p.metrics.items():
            if value is not None:
                assert back[key] == pytest.approx(value, abs=1e-8), (p.method, key)


def test_bytescheduler_forward_by_tensor_by_hand():
    """Two tensors, B (back, ready first, 2 chunks) and A (front, 1 chunk); 1 s a chunk on
    one channel, credit for one chunk; tb 1.5 s (B) and 0.5 s (A); updates 1 s (B) and 0.5 s
    (A). In steady state A is ready at 0: B's first chunk runs from -0.5 to 0.5, then A's (to
    1.5, updated to 2), then B's second (to 2.5, updated to 3.5). The forward waits for A to
    2 s. Shared by backward time (B 1.5 s, A 0.5 s) A's forward ends at 2.5 s and B's waits
    to 3.5 s: 3.5 + 1.5 + 2 = 7 s an iteration. The profile's per-tensor forward (B 0.4 s, A
    1.2 s, the other 0.4 s shared 1:3: B 0.5 s, A 1.5 s) ends A's at 3.5 s, when B's update
    is done: no second wait, 3.5 + 0.5 + 2 = 6 s."""
    old = sim.Compute(2.0, [1.5, 0.5], [2000, 1000], optimizer_s=1.5, names=["B", "A"])
    new = dataclasses.replace(old, forward_tensor_s=[0.4, 1.2])
    link = sim.Link(0.0, 0.001)
    waits = {}
    for work, want in ((old, 7.0), (new, 6.0)):
        p = sim.predict("bytescheduler", work, link, partition=250, credit=250)
        assert p.iteration_s == pytest.approx(want)
        lo = min(e[3] for e in p.events if e[1] == timeline.ITERATION) / 1e6
        waits[want] = [pytest.approx((e[3] / 1e6 - lo, e[4] / 1e6 - lo), abs=1e-9)
                       for e in p.events if e[0] == "forward pre-hook"]
        # the optimizer's updates: A's, then B's, whatever the forward
        assert [(e[3] / 1e6 - lo, e[4] / 1e6 - lo) for e in p.events
                if e[0] == "optimizer"] == [pytest.approx((1.5, 2.0)), pytest.approx((2.5, 3.5))]
    assert waits == {7.0: [(0.0, 2.0), (2.5, 3.5)], 6.0: [(0.0, 2.0)]}
    # the recurrences without the event simulator take the same pieces
    with _recurrences():
        assert sim.predict("bytescheduler", new, link, partition=250,
                           credit=250).iteration_s == pytest.approx(6.0)
    with pytest.raises(UsageError, match="forward_tensor_s"):
        dataclasses.replace(old, forward_tensor_s=[1.5, 1.0])     # more than forward_s
    with pytest.raises(UsageError, match="forward_tensor_s"):
        dataclasses.replace(old, forward_tensor_s=[0.5])
    with pytest.raises(UsageError, match="forward_tensor_s"):
        dataclasses.replace(old, forward_tensor_s=[0.5, float("nan")])


@pytest.mark.parametrize("seed", range(3))
def test_bytescheduler_forward_by_tensor_in_proportion_to_backward_is_the_old_share(seed):
    """Per-tensor forward times in proportion to the backward times, whatever their sum, give
    the replay that shared the whole forward by backward time; all 0, an even share."""
    work = _work(seed)
    link = LINKS[seed]
    base = sim.bytescheduler(work, link, partition=1 << 18, credit=1 << 19)
    for c in (0.3, 1.0):
        part = [x * c * work.forward_s / sum(work.backward_s) for x in work.backward_s]
        p = sim.bytescheduler(dataclasses.replace(work, forward_tensor_s=part), link,
                              partition=1 << 18, credit=1 << 19)
        assert p.iteration_s == pytest.approx(base.iteration_s, rel=1e-12)
        assert p.metrics == pytest.approx(base.metrics, rel=1e-9, abs=1e-12)
    even = dataclasses.replace(work, backward_s=[1e-3] * len(work.nbytes))
    assert sim.bytescheduler(dataclasses.replace(even, forward_tensor_s=[0.0] * 12), link
                             ).iteration_s == pytest.approx(
        sim.bytescheduler(even, link).iteration_s, rel=1e-12)


def test_the_model_replays_every_registered_method_with_the_compressors_it_takes():
    """simulate (layer 0) cannot import the method registry, so it names the methods and the
    compressors each takes itself: held here to the registry, pair by pair."""
    import compression
    from ddlbench import methods
    assert sorted(sim.METHODS) == sorted(methods.names())
    assert {m for m in sim.METHODS if methods.lookup(m).architecture == "ps"} \
        == set(sim.PS_METHODS)
    for m in sim.METHODS:
        taken = sim.COMPRESSORS_OF[m]
        assert sorted(c for c in compression.COMPRESSORS if methods.takes(m, c)) \
            == sorted(taken), m


# --------------------------------------------------------------------------- the methods' own work

HOST = sim.Host(copy_s_per_byte=2 ** -12, divide_s_per_byte=2 ** -13)


def _hosted(work, host=HOST):
    return dataclasses.replace(work, host=host)


def test_the_methods_copies_and_divides_by_hand():
    """Tensors of 1, 2 and 1 KiB, ready at 0.75, 0.875 and 1.125 s; a message of M bytes costs
    0.5 + M/1024 s; a copy 1/4096 s a byte, a divide 1/8192. Every number exact in binary.
    The bucketed methods keep their gradients as views into the buckets (no copies); the
    all-reduce ones average in the collective (on its channel, after the sum, as Gloo's
    ReduceOp.AVG), the PS ones divide in the step; DDP copies in and out."""
    work = _hosted(sim.Compute(0.5, [0.25, 0.125, 0.25], [1024, 2048, 1024],
                                optimizer_s=0.125))
    link = sim.Link(0.5, 2 ** -10)
    # bspa2a: the backward (1.125 s), the message (4.5 s) and its average (0.5 s) on the
    # channel, the optimizer; nothing packed or unpacked
    b = sim.predict("bspa2a", work, link, nworkers=2)
    assert b.iteration_s == 1.125 + 4.5 + 0.5 + 0.125
    assert [(e[0], e[2]) for e in b.events if e[1] == timeline.CODEC] == [("average",
                                                                           "allreduce")]
    # one worker: nothing to average
    assert sim.predict("bspa2a", work, link).iteration_s == 1.125 + 4.5 + 0.125
    # wfbp: messages 0.75-2.25 (averaged to 2.375), 2.375-4.875 (to 5.125), 5.125-6.625 (to
    # 6.75): the average holds the channel; nothing on the training thread
    w = sim.predict("wfbp", work, link, nworkers=2)
    assert _spans(w) == [(0.75, 2.25), (2.375, 4.875), (5.125, 6.625)]
    assert w.iteration_s == 6.75 + 0.125
    assert _spans(w, timeline.CODEC) == [(2.25, 2.375), (4.875, 5.125), (6.625, 6.75)]
    # fusion at 3 KiB: [t0, t1] ready at 0.875 s, its message to 4.375, averaged to 4.75; t2's
    # message from 4.75 to 6.25, averaged to 6.375
    f = sim.predict("fusion", work, link, nworkers=2, threshold=3072)
    assert f.groups == [[0, 1], [2]]
    assert _spans(f) == [(0.875, 4.375), (4.75, 6.25)]
    assert f.iteration_s == 6.375 + 0.125
    assert [e[0] for e in f.events if e[1] == timeline.CODEC] == ["average"] * 2
    # the backward is not delayed: no pack in it
    assert f.metrics["compute_s"] == pytest.approx(0.5 + 0.625 + 0.125)
    # ddp, one bucket: the copy into it and its divide (1.5 s) before the message, the copy
    # back (1 s) after it
    d = sim.predict("ddp", work, link, nworkers=2)
    assert d.iteration_s == 1.125 + 1.5 + 4.5 + 1 + 0.125
    # a compressor averages itself: no divide anywhere
    fp16 = sim.Codec("fp16", 2)
    assert sim.predict("bspa2a", work, link, codec=fp16, nworkers=2).iteration_s == \
        sim.predict("bspa2a", work, link, codec=fp16).iteration_s
    # the PS methods divide their pulled units in the step (training thread): bspps, one unit,
    # its push and pull (2 s each), the divide (0.5 s), no copies
    servers = sim.ServerLinks(0.0, 2 ** -11, 0.0)
    ps = sim.predict("bspps", work, None, servers=servers, nworkers=2, partition_bytes=1 << 20)
    assert ps.iteration_s == 1.125 + 2 * 2 + 0.5 + 0.125
    assert [(e[0], e[2]) for e in ps.events if e[1] == timeline.CODEC] == \
        [("divide", "training")]


def test_the_codec_runs_where_the_method_calls_its_compressor():
    """The bucketed methods' gradient hooks hand each group to their communication thread,
    which encodes it (fp16's encode: 1/1024 s an element) before issuing it, one group after
    another; the step decodes (1/2048 s an element) each message on the training thread; DDP's
    codec runs on its own thread, on the channel around the bucket's all-reduce. Messages of M
    bytes (half in fp16) cost 0.5 + M/1024 s."""
    work = sim.Compute(0.5, [0.25, 0.125, 0.25], [1024, 2048, 1024], optimizer_s=0.125)
    link = sim.Link(0.5, 2 ** -10)
    codec = sim.Codec("fp16", 2, encode_s_per_element=2 ** -10, decode_s_per_element=2 ** -11)
    # wfbp: t0 ready at 0.75 s, encoded to 1.0, sent to 2.0; t1 ready 0.875, encoded from 1.0
    # to 1.5, sent 2.0-3.5; t2 ready 1.125, encoded 1.5-1.75, sent 3.5-4.5; the backward is
    # not delayed; each decoded as it is done: to 2.125, 3.75 and 4.625; the optimizer
    w = sim.predict("wfbp", work, link, codec=codec, nworkers=2)
    assert _spans(w) == [(1.0, 2.0), (2.0, 3.5), (3.5, 4.5)]
    assert w.iteration_s == 4.625 + 0.125
    assert [e[4] / 1e6 for e in w.events if e[0] == "backward"] == [1.125]
    codecs = sorted((e for e in w.events if e[1] == timeline.CODEC), key=lambda e: e[3])
    assert [(e[0], e[2], e[3] / 1e6, e[4] / 1e6) for e in codecs] == [
        ("encode", "issue", 0.75, 1.0), ("encode", "issue", 1.0, 1.5),
        ("encode", "issue", 1.5, 1.75), ("decode", timeline.MAIN, 2.0, 2.125),
        ("decode", timeline.MAIN, 3.5, 3.75), ("decode", timeline.MAIN, 4.5, 4.625)]
    # ddp, one bucket at the backward's end (1.125 s): encode 1 s, all-reduce 2.5 s, decode
    # 0.5 s on its channel
    d = sim.predict("ddp", work, link, codec=codec, nworkers=2)
    assert d.iteration_s == 1.125 + 1.0 + 2.5 + 0.5 + 0.125
    assert [(e[0], e[2]) for e in d.events if e[1] == timeline.CODEC] == \
        [("encode", "allreduce"), ("decode", "allreduce")]


def test_issuing_each_collective_by_hand():
    """The bucketed all-reduce methods spend 1/16 s here on each collective they issue, before
    the message starts: on their communication thread for what the gradient hooks hand over
    (the backward goes on), on the training thread for BSP's one message in the step (the
    hand-made workload above: a message of M bytes costs 0.5 + M/1024 s). DDP (its reducer)
    and the PS methods do not."""
    work = _hosted(sim.Compute(0.5, [0.25, 0.125, 0.25], [1024, 2048, 1024],
                                optimizer_s=0.125), sim.Host(issue_s=0.0625))
    link = sim.Link(0.5, 2 ** -10)
    # wfbp: t0 ready at 0.75 s, issued to 0.8125, its message to 2.3125; t1 ready at 0.875,
    # issued to 0.9375, its message 2.3125-4.8125; t2 ready at 1.125, issued to 1.1875, its
    # message to 6.3125; the optimizer
    w = sim.predict("wfbp", work, link)
    assert _spans(w) == [(0.8125, 2.3125), (2.3125, 4.8125), (4.8125, 6.3125)]
    assert _spans(w, timeline.CODEC) == [(0.75, 0.8125), (0.875, 0.9375), (1.125, 1.1875)]
    assert {(e[0], e[2]) for e in w.events if e[1] == timeline.CODEC} == {("issue", "issue")}
    assert [e[4] / 1e6 for e in w.events if e[0] == "backward"] == [1.125]
    assert w.iteration_s == 6.3125 + 0.125
    # one thread issues: two groups ready at once are issued one after the other
    late = sim.predict("fusion", dataclasses.replace(work, backward_s=[0.25, 0.0, 0.0]), link,
                       threshold=0)
    assert _spans(late, timeline.CODEC) == [(0.75, 0.8125), (0.8125, 0.875), (0.875, 0.9375)]
    # bspa2a: one message, issued in the step after the backward
    assert sim.predict("bspa2a", work, link).iteration_s == 1.125 + 0.0625 + 4.5 + 0.125
    free = dataclasses.replace(work, host=sim.NO_HOST)
    assert sim.predict("ddp", work, link).iteration_s == \
        sim.predict("ddp", free, link).iteration_s
    servers = sim.ServerLinks(0.0, 2 ** -11, 0.0)
    for method in ("bspps", "wfbpps"):
        assert sim.predict(method, work, None, servers=servers).iteration_s == \
            sim.predict(method, free, None, servers=servers).iteration_s


def _issue_schedule(work, groups, codec, issue_s, threaded):
    """An instant network's iteration when each collective costs ``issue_s`` to issue: the
    groups handed over (``threaded``: by the hooks to one communication thread, as each is
    ready, one after another; else by the step after the backward), then the step issues each
    group's late collectives (PowerSGD's Q) on the training thread, in order."""
    t = work.forward_s
    ready = []
    for b, tb in enumerate(work.backward_s):
        t += tb
        ready.append(t)
    issuer = 0.0 if threaded else t
    done = []
    for g in groups:
        early, late = codec.phases([work.shapes[b] for b in g])
        issuer = max(issuer, ready[max(g)] if threaded else issuer) + issue_s * len(early)
        done.append((issuer, late))
    for when, late in done:
        t = max(t, when) + issue_s * len(late)
    return t + work.optimizer_s


@pytest.mark.parametrize("compressor", ["none", "fp16", "powersgd", "topk"])
def test_an_instant_network_costs_the_issues_alone(compressor):
    """All compute, an instant link: every bucketed method's iteration is the compute and the
    issue of each collective its compressor starts, by its communication thread beside the
    backward for what its hooks hand over, by the step for BSP's and for what a compressor
    issues when the bucket is waited for (PowerSGD's Q), on one channel and on two, with or
    without interference; DDP's is the compute alone."""
    work = _hosted(_work(1, n=6), sim.Host(issue_s=1e-4))
    work = dataclasses.replace(work, shapes=[(8, 4), (32,), (4, 4), (16, 2), (3,), (4, 8)],
                               nbytes=[128, 128, 64, 128, 12, 128])
    instant = sim.Link(0.0, 0.0)
    codec = sim.Codec(compressor, 2, allgather=instant)
    for method in METHODS:
        groups = sim.groups_of(method, work, instant, threshold=256)
        if method == "ddp":
            expected = work.compute_s
        else:
            hooks = not sim.method_class(method).rule.after_backward
            expected = _issue_schedule(work, groups, codec, 1e-4, hooks)
        for channels, simulator in ((1, False), (2, False), (1, True)):
            with contextlib.nullcontext() if simulator else _recurrences():
                p = sim.replay(work, instant, groups, channels, method, codec=codec,
                               nworkers=2)
            assert p.iteration_s == pytest.approx(expected, rel=1e-12), \
                (method, channels, simulator)
        if method in ("wfbp", "fusion"):  # the thread's issues hide under the backward
            issued = sum(len(codec.collectives([work.shapes[b] for b in g])) for g in groups)
            assert expected < work.compute_s + 1e-4 * issued


def test_without_the_host_rates_nothing_changes():
    """A workload without host rates (a profile that did not measure them) predicts what the
    model did before: the section 3 recurrence, whatever the workers."""
    work, link = _work(3), LINKS[0]
    for method in METHODS:
        p = sim.predict(method, work, link, nworkers=4, threshold=1 << 21)
        assert p.iteration_s == pytest.approx(
            work.forward_s + schedule_time(work.backward_s, work.nbytes, p.groups, link.alpha,
                                           link.beta) + work.optimizer_s, rel=1e-12)
        assert not [e for e in p.events if e[1] == timeline.CODEC]


@pytest.mark.parametrize("seed", range(3))
def test_bytescheduler_divides_each_tensor_before_its_update(seed):
    """ByteScheduler sends each tensor in place (no copies) and its completer divides it before
    the update: the replay equals the one whose optimizer step is longer by the divide of
    every byte (the completer's share of it is by bytes). Not on one worker, nor with a
    compressor; ByteScheduler-PS divides too."""
    work, link = _work(seed), LINKS[seed]
    hosted = _hosted(work)
    longer = dataclasses.replace(work, optimizer_s=work.optimizer_s
                                 + HOST.divide_s_per_byte * sum(work.nbytes))
    for kw in ({"partition": 50_000, "credit": 100_000}, {}):
        assert sim.bytescheduler(hosted, link, nworkers=2, **kw).iteration_s == \
            pytest.approx(sim.bytescheduler(longer, link, **kw).iteration_s, rel=1e-12)
        assert sim.bytescheduler(hosted, link, **kw).iteration_s == \
            pytest.approx(sim.bytescheduler(work, link, **kw).iteration_s, rel=1e-12)
    fp16 = sim.Codec("fp16", 2)
    assert sim.bytescheduler(hosted, link, codec=fp16, nworkers=2).iteration_s == \
        pytest.approx(sim.bytescheduler(work, link, codec=fp16).iteration_s, rel=1e-12)
    assert sim.bytescheduler(hosted, None, servers=PS_LINK, nworkers=2).iteration_s == \
        pytest.approx(sim.bytescheduler(longer, None, servers=PS_LINK).iteration_s, rel=1e-12)


@pytest.mark.parametrize("seed", range(3))
def test_the_cosimulation_does_the_same_host_work(seed):
    """kappa = mu = 0: the event simulator packs, divides and unpacks as the plain replay (the
    recurrences, tests/model_reference.py) does, for every method, on one and two channels and
    on the servers."""
    work, link = _hosted(_work(seed), sim.Host(2e-10, 1e-10)), LINKS[seed]   # 5 and 10 GB/s
    for method in (*sim.GROUPINGS, "bytescheduler"):
        for channels in (1, 2):
            if method == "bytescheduler":
                with _recurrences():
                    plain = sim.bytescheduler(work, link, channels=channels, nworkers=3)
                _same(plain, sim.bytescheduler(work, link, channels=channels, nworkers=3))
                continue
            groups = sim.groups_of(method, work, link, threshold=1 << 21)
            with _recurrences():
                a = sim.replay(work, link, groups, channels, method, nworkers=3)
            b = sim.replay(work, link, groups, channels, method, nworkers=3)
            _same(a, b)
            assert a.iteration_s > sim.replay(dataclasses.replace(work, host=sim.NO_HOST),
                                              link, groups, channels, method,
                                              nworkers=3).iteration_s
    for method in ("bspps", "wfbpps"):
        groups = sim.groups_of(method, work, None)
        with _recurrences():
            plain = sim.replay(work, None, groups, method=method, servers=PS_LINK, nworkers=3)
        _same(plain, sim.replay(work, None, groups, method=method, servers=PS_LINK,
                                nworkers=3))


def test_host_work_under_interference_is_compute():
    """Under CPU interference the method's own work on the training thread is compute, slowed
    like the backward: DDP's copy into its bucket (1/4096 s a byte) in its hooks, buckets of
    4 KiB: t0 (4 KiB) alone, t1 and t2 (512 B each) together. t0's copy (1 s) runs before any
    message is in flight; its 4 s message then runs from 1.5 s, so with kappa = 1 t1's and t2's
    backward take twice their time (to 2.5 s) and so does their copy (0.25 s: to 3.0 s)."""
    base = sim.Compute(0.0, [0.5, 0.25, 0.25], [4096, 512, 512])
    link = sim.Link(0.0, 2 ** -10)
    copied = _hosted(base, sim.Host(copy_s_per_byte=2 ** -12))
    cap = 4096 / 2 ** 20

    def backward_end(p):
        return [e[4] for e in p.events if e[0] == "backward"][0] / 1e6
    p = sim.predict("ddp", _slowed(copied, 1.0, 0.0), link, bucket_cap_mb=cap)
    assert p.groups == [[0], [1, 2]]
    assert backward_end(p) == pytest.approx(3.0)
    # without interference: 1.5 + 0.25 + 0.25 + 0.25
    assert backward_end(sim.predict("ddp", copied, link, bucket_cap_mb=cap)) == 2.25
    # the second bucket's message (1 s) after t0's (to 5.5 s), then the copies back of all
    # 5 KiB (1.25 s), nothing in flight
    assert p.iteration_s == pytest.approx(5.5 + 1 + 1.25)


def test_predict_takes_the_profiles_host(tmp_path, capsys):
    """predict.workload_of reads the profiler's ``host`` rates (absent or null: free); python
    -m ddlbench.model.predict replays with them: bspa2a on 2 workers is slower by exactly the
    average of every byte (its gradients are views into the bucket: no pack, no unpack) and the
    issue of its one message."""
    import json

    from ddlbench.model import predict
    from ddlbench.measure.profile_file import PROFILE_FORMAT, PROFILE_VERSION
    sizes = [4096, 1 << 20, 65536, 4 << 20]
    prof = {"format": PROFILE_FORMAT, "version": PROFILE_VERSION, "model": "hand-made",
            "workload": {"batch_size": 8},
            "tensors": [{"name": f"t{i}", "shape": [n // 4], "bytes": n}
                        for i, n in enumerate(sizes)],
            "backward_s": [0.002, 0.004, 0.001, 0.006], "forward_s": 0.01,
            "alpha_s": 1e-3, "beta_s_per_byte": 1e-9, "nworkers": 2,
            "host": {"copy_s_per_byte": 2e-10, "divide_s_per_byte": 1e-10, "bytes": 1,
                     "issue_s": 1e-3}}
    assert predict.workload_of(prof).host == sim.Host(2e-10, 1e-10, 1e-3)
    assert predict.scaled(predict.workload_of(prof), 2.0, host=True).host == \
        sim.Host(4e-10, 2e-10, 2e-3)
    assert predict.scaled(predict.workload_of(prof), 2.0).host == sim.Host(2e-10, 1e-10, 1e-3)
    assert predict.workload_of({**prof, "host": None}).host == sim.NO_HOST
    with pytest.raises(UsageError, match="^the profile's host copy_s_per_byte must be a "
                                         "number from 0 to 86400, got 'x'$"):
        predict.workload_of({**prof, "host": {"copy_s_per_byte": "x"}})
    with pytest.raises(UsageError, match="^the profile's host divide_s_per_byte must be a "
                                         "number from 0 to 86400, got -1.0$"):
        predict.workload_of({**prof, "host": {"divide_s_per_byte": -1.0}})
    with pytest.raises(UsageError, match="host copy, divide and issue times must be finite"):
        sim.Host(-1.0, 0.0, 0.0)
    out = {}
    for key, host in (("with", prof["host"]), ("without", None)):
        path = tmp_path / f"{key}.json"
        path.write_text(json.dumps({**prof, "host": host}))
        assert predict.main(["--profile", str(path), "--method", "bspa2a", "--nworkers", "2",
                             "--output", str(tmp_path / "p.json")]) == 0
        capsys.readouterr()
        out[key] = json.loads((tmp_path / "p.json").read_text())["predictions"][0]
    assert out["with"]["iteration_s"] - out["without"]["iteration_s"] == \
        pytest.approx(sum(sizes) * 1e-10 + 1e-3, rel=1e-9)
    # --issue-us gives a profile without host rates an issue time, or replaces the profile's
    # (wfbp: one per tensor, the network instant; the communication thread issues each as it
    # is ready, 1-4 ms apart, so only the last one's, after the backward, is exposed)
    path = tmp_path / "without.json"
    for issue_us, expected in ((None, 0.0), ("250", 250e-6)):
        flags = ["--issue-us", issue_us] if issue_us else []
        assert predict.main(["--profile", str(path), "--method", "wfbp", "--alpha", "0",
                             "--beta", "0", *flags, "--output", str(tmp_path / "p.json")]) == 0
        capsys.readouterr()
        got = json.loads((tmp_path / "p.json").read_text())["predictions"][0]["iteration_s"]
        assert got == pytest.approx(0.01 + 0.013 + expected, rel=1e-12), issue_us
    for bad, message in (("-1", "--issue-us must be >= 0, got -1.0"),
                         ("inf", "--issue-us must be a finite number, got inf")):
        assert predict.main(["--profile", str(path), "--issue-us", bad]) == 2
        assert message in capsys.readouterr().err


@pytest.mark.parametrize("copy,divide,issue", [(-1e-9, 0.0, 0.0), (0.0, float("nan"), 0.0),
                                               (float("inf"), 0.0, 0.0), (0.0, 0.0, -1e-6),
                                               (0.0, 0.0, float("inf"))])
def test_host_rates_must_be_finite_and_not_negative(copy, divide, issue):
    with pytest.raises(UsageError, match="^host copy, divide and issue times must be finite "
                                         "and >= 0, got "):
        sim.Host(copy, divide, issue)


# -- two resources: the host's launch side of an accelerator's step (issue 44 item 5) ----------

def _launch_work(launch):
    n = 10
    return sim.Compute(forward_s=0.010, backward_s=[0.002] * n, nbytes=[4000] * n,
                       optimizer_s=0.003, names=[f"t{b}" for b in range(n)], launch=launch)


def test_a_launch_bound_step_is_the_hosts_chain():
    """Launch-bound (the host slower than the device at every layer): the iteration is the
    training thread's own time, launches plus each gradient hook of a method that has Python
    hooks (its communication thread issues off it); the device's compute, the collectives and
    the optimizer hide under it. BSP and DDP run no Python hook per gradient."""
    launch = sim.Launch(forward_s=0.020, backward_s=[0.005] * 10, optimizer_s=0.006,
                        hook_s=0.0001)
    work, link = _launch_work(launch), sim.Link(1e-4, 1e-9)
    host = 0.020 + 0.050 + 0.006
    for method, hooks in (("wfbp", 10), ("fusion", 10), ("mgwfbp", 10), ("bspa2a", 0),
                          ("ddp", 0)):
        p = sim.predict(method, work, link, nworkers=2)
        assert p.iteration_s == pytest.approx(host + hooks * 0.0001, rel=1e-12), method
        rows = {e[2] for e in p.events}
        assert sim.DEVICE_ROW in rows and timeline.MAIN in rows
        # the device ran tensor 9's backward no earlier than the host launched it
        device_bwd = [e for e in p.events if e[2] == sim.DEVICE_ROW and e[0] == "backward"]
        assert device_bwd[0][4] == pytest.approx((0.020 + 0.050 + hooks * 0.0001) * 1e6)


def test_a_device_bound_step_is_the_one_resource_replay():
    """With the host far ahead of the device and no host work of the method's, the two
    resources give the one-resource replay's iteration (CPU profiles have no launch and
    replay as before)."""
    fast = sim.Launch(forward_s=1e-4, backward_s=[1e-5] * 10, optimizer_s=1e-5)
    for link in (sim.Link(1e-4, 1e-9), sim.Link(2e-3, 1e-7)):
        for method in ("wfbp", "fusion", "bspa2a", "ddp", "mgwfbp"):
            one = sim.predict(method, _launch_work(None), link, nworkers=2)
            two = sim.predict(method, _launch_work(fast), link, nworkers=2)
            assert two.iteration_s == pytest.approx(one.iteration_s, rel=1e-12), method


def test_with_free_launches_the_two_resources_are_the_one_resource_replay():
    """One schedule: the one-resource replay (a CPU profile) is the host/device one with the
    host infinitely far ahead. Every launch free and no host work of the method's, the two
    resources give the one-resource iteration to the last bit, for every grouped method, on
    one and two channels, with and without CPU interference."""
    free = sim.Launch(0.0, [0.0] * 10, 0.0, 0.0)
    for kappa, mu in ((0.0, 0.0), (0.3, 0.15)):
        cpu = dataclasses.replace(_launch_work(None), compute_slowdown=kappa, comm_slowdown=mu)
        gpu = dataclasses.replace(cpu, launch=free)
        for link in (sim.Link(1e-4, 1e-9), sim.Link(2e-3, 1e-7)):
            for method in sim.GROUPINGS:
                for channels in (1, 2):
                    one = sim.predict(method, cpu, link, channels, nworkers=2)
                    two = sim.predict(method, gpu, link, channels, nworkers=2)
                    assert two.iteration_s == one.iteration_s, (method, channels, kappa)
                    assert sim.DEVICE_ROW in {e[2] for e in two.events}


def test_the_host_waits_for_its_communication_thread_in_the_step():
    """The step drains the communication thread (every bucket issued before the training
    thread goes on): a slow issue delays the host's optimizer launch, and so the iteration
    of a launch-bound step, by what the thread had left when the backward's launches ended."""
    launch = sim.Launch(forward_s=0.020, backward_s=[0.005] * 10, optimizer_s=0.006)
    work = dataclasses.replace(_launch_work(launch), host=sim.Host(issue_s=0.030))
    p = sim.predict("wfbp", work, sim.Link(1e-4, 1e-9), nworkers=2)
    # the thread issues bucket b from the host's hook at 0.020 + 0.005 (b + 1), 30 ms each:
    # bucket 0 from 0.025, the last done at 0.025 + 10 * 0.030
    assert p.iteration_s == pytest.approx(0.025 + 0.300 + 0.006, rel=1e-12)
    step = [e for e in p.events if e[2] == timeline.MAIN and e[0] == "step"]
    assert step[0][3:5] == pytest.approx((0.070 * 1e6, 0.325 * 1e6))


def test_launch_times_are_checked():
    with pytest.raises(UsageError, match="one backward time per tensor"):
        _launch_work(sim.Launch(0.01, [0.001] * 3))
    with pytest.raises(UsageError, match="finite and >= 0"):
        sim.Launch(0.01, [0.001, -1.0])


# -- ByteScheduler on host and device (issue 58 item 4) --------------------------------------------

def _bs_work(launch, n=10, **kw):
    """No optimizer time and one worker (no divide): the updates cost the device nothing."""
    return sim.Compute(forward_s=0.010, backward_s=[0.002] * n,
                       nbytes=[40000 * (1 + b % 3) for b in range(n)], optimizer_s=0.0,
                       names=[f"t{b}" for b in range(n)], launch=launch, **kw)


def _bs_both(cpu, gpu, **kw):
    """ByteScheduler's iteration, all-reduce and PS, without and with the launch."""
    ps = sim.ServerLinks(1e-4, 2e-9, 1e-9)
    for link in (sim.Link(1e-4, 1e-9), sim.Link(2e-3, 1e-7)):
        for partition, credit in ((4000, 8000), (100000, 1), (10 ** 9, 10 ** 12)):
            yield tuple(sim.predict("bytescheduler", w, link, partition=partition,
                                    credit=credit, **kw) for w in (cpu, gpu))
    yield tuple(sim.predict("byteschedulerps-worker", w, None, servers=ps, **kw)
                for w in (cpu, gpu))


def test_bytescheduler_with_free_launches_is_the_one_resource_replay():
    """Every launch and hook free: the host is never behind, so each piece ends on the device
    when the training thread would have computed it, each tensor is ready for the dispatcher
    when the device computed it (its hook ran at once), and each update is launched the moment
    its chunks are reduced. The updates cost nothing here (no optimizer time, one worker: no
    divide), so the device running them between pieces, where the CPU's completer runs them
    beside the training thread, moves nothing: a module's forward starts at max(the previous
    piece's end, its update's) either way. Hence the same iteration to the last bit, in steady
    state and for a timing round, with and without CPU interference, all-reduce and PS."""
    free = sim.Launch(0.0, [0.0] * 10, 0.0, 0.0)
    for kappa, mu in ((0.0, 0.0), (0.3, 0.15)):
        cpu = _bs_work(None, compute_slowdown=kappa, comm_slowdown=mu)
        for bpi in (None, 3):
            for one, two in _bs_both(cpu, dataclasses.replace(cpu, launch=free),
                                     batches_per_iter=bpi):
                assert two.iteration_s == one.iteration_s, (kappa, bpi, one.method)
                assert sim.DEVICE_ROW in {e[2] for e in two.events}


def test_bytescheduler_device_bound_is_the_one_resource_replay():
    """The host far ahead of the device (each piece launched well before the device gets to
    it, hooks included): the device's pieces end as the training thread's would, and each
    tensor is ready when computed. The updates' launches are free: a forward that waits for
    its update would otherwise wait for that launch too (the host's latency on the critical
    path), and they cost the device nothing, as above."""
    fast = sim.Launch(forward_s=1e-4, backward_s=[1e-5] * 10, optimizer_s=0.0, hook_s=1e-5)
    for one, two in _bs_both(_bs_work(None), _bs_work(fast)):
        assert two.iteration_s == pytest.approx(one.iteration_s, rel=1e-12), one.method


def test_bytescheduler_updates_run_on_the_device_between_pieces():
    """By hand, host free, instant network, no forward, backward 1 s per tensor, the
    optimizer 2 s (1 s per tensor, equal bytes). One resource: the completer updates each
    tensor beside the backward (tensor 1's from 1 to 2 while tensor 0's backward runs), the
    next forward waits for tensor 0's update (2 to 3): 3 s an iteration. On a device the
    updates take turns with the backward (one device, one stream): each iteration it runs
    both updates of the previous one (tensor 1's, whose chunks were reduced as tensor 0's
    backward began, then tensor 0's) and the backward, 1 + 1 + 2 = 4 s."""
    def work(launch):
        return sim.Compute(forward_s=0.0, backward_s=[1.0, 1.0], nbytes=[4000, 4000],
                           optimizer_s=2.0, launch=launch)
    link = sim.Link(0.0, 0.0)
    assert sim.predict("bytescheduler", work(None), link).iteration_s == pytest.approx(3.0)
    p = sim.predict("bytescheduler", work(sim.Launch(0.0, [0.0, 0.0])), link)
    assert p.iteration_s == pytest.approx(4.0)
    start = next(e[3] for e in p.events if e[1] == timeline.ITERATION) / 1e6
    device = sorted((e[0], e[3] / 1e6 - start, e[4] / 1e6 - start) for e in p.events
                    if e[2] == sim.DEVICE_ROW and e[0] != "forward")
    assert device == [("backward", 2.0, 4.0), ("optimizer", 0.0, 1.0), ("optimizer", 1.0, 2.0)]


def test_bytescheduler_launch_bound_is_the_hosts_chain():
    """Host-bound (large hooks, a device of microseconds, an instant network and servers), by
    hand: each iteration is the training thread's launches, the forward's 10 ms, the
    backward's 3 + 2 + 1 ms and 3 Python hooks of 4 ms, then the front tensor's update,
    launched by the completer the moment the last hook ran (its chunks reduce at once), in
    its even share of the optimizer's launch (6 ms / 3, whatever its bytes), before the next
    forward may be launched: 10 + 6 + 12 + 2 = 30 ms. The other updates were launched during
    the backward; the PS variant is the same schedule."""
    launch = sim.Launch(forward_s=0.010, backward_s=[0.003, 0.002, 0.001], optimizer_s=0.006,
                        hook_s=0.004)
    work = sim.Compute(forward_s=3e-6, backward_s=[1e-6] * 3, nbytes=[4000, 8000, 12000],
                       optimizer_s=3e-6, names=["c", "b", "a"], launch=launch)
    for p in (sim.predict("bytescheduler", work, sim.Link(0.0, 0.0)),
              sim.predict("byteschedulerps-worker", work, None,
                          servers=sim.ServerLinks(0.0, 0.0, 0.0))):
        assert p.iteration_s == pytest.approx(0.030, rel=1e-12), p.method
        # the host's forward pre-hook waits that update's launch, 2 ms
        waits = [e for e in p.events if e[2] == timeline.MAIN and e[0] == "forward pre-hook"]
        assert [e[4] - e[3] for e in waits] == [pytest.approx(2000.0)]
        assert {"completer", sim.DEVICE_ROW} <= {e[2] for e in p.events}


def test_a_sharding_method_gathers_before_the_forward_or_under_it():
    """Rule.gather in the replay (one resource, no interference): the previous step's
    all-gathers start with the iteration, the last group first; without prefetch the forward
    waits for all, with it each group's share of the forward (in proportion to its backward)
    for its own; each group is reduce-scattered once its backward is done, and the optimizer
    takes its share. Exact figures by hand."""
    F, b, n, O = 0.02, [0.004, 0.006], [4_000_000, 1_000_000], 0.008
    work = sim.Compute(forward_s=F, backward_s=b, nbytes=n, optimizer_s=O)
    ag, rs = sim.Link(1e-3, 1e-8), sim.Link(2e-3, 2e-9)
    kw = dict(steps=(("reduce_scatter", 1.0, rs),), gather=(("allgather", 1.0, ag),),
              optimizer_share=0.25)
    one = sim.replay(work, LINKS[0], [[0, 1]], **kw)
    assert one.iteration_s == pytest.approx(ag.time(sum(n)) + F + sum(b) + rs.time(sum(n))
                                            + O / 4, rel=1e-12)
    late, early = (sim.replay(work, LINKS[0], [[0], [1]], prefetch=p, **kw) for p in (False, True))
    a1, a0 = ag.time(n[1]), ag.time(n[0])        # group 1 (the front layer) is gathered first
    f1, f0 = F * b[1] / sum(b), F * b[0] / sum(b)
    for p, forward_end in ((late, a1 + a0 + F), (early, max(a1 + f1, a1 + a0) + f0)):
        t0 = forward_end + b[0]                  # group 0's reduce-scatter starts
        end = max(forward_end + sum(b), t0 + rs.time(n[0])) + rs.time(n[1])
        assert p.iteration_s == pytest.approx(end + O / 4, rel=1e-12)
    waits = [e for e in early.events if e[0] == "allgather wait"]
    assert [(e[3], e[4]) for e in waits] == [(0.0, pytest.approx(a1 * 1e6))]
    assert sorted(e[0] for e in early.events if e[1] == timeline.COMM) == \
        ["allgather", "allgather", "reduce_scatter", "reduce_scatter"]


def test_a_periodic_method_is_one_syncing_step_in_h():
    """Rule.period: H - 1 steps of compute alone and one whose buckets are all-reduced after
    the step, averaged; H = 1 is the syncing step itself; ddp_localsgd (torch's averager)
    sends every parameter as one message, localsgd's cost with everything in one bucket."""
    work = _work(1)
    link = LINKS[1]
    synced = sim.predict("localsgd", work, link, period=1).iteration_s
    assert synced == sim.replay(work, link, [list(range(len(work.nbytes)))],
                                method="localsgd").iteration_s
    for h in (2, 4, 16):
        got = sim.predict("localsgd", work, link, period=h).iteration_s
        assert got == pytest.approx((synced + (h - 1) * work.compute_s) / h, rel=1e-12)
        assert sim.predict("diloco", work, link, period=h).iteration_s == got
        # torch's averager: one message of every parameter, priced as localsgd's in one bucket
        torch_local = sim.predict("ddp_localsgd", work, link, period=h)
        assert torch_local.message_bytes == [sum(work.nbytes)]
        assert torch_local.iteration_s == sim.predict(
            "localsgd", work, link, period=h, threshold=sum(work.nbytes)).iteration_s

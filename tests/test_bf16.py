"""The bf16 compressor (docs/DESIGN.md section 7): g/P rounded to bfloat16 once, all-reduced
(summed) in bfloat16, cast back. Its declaration is what it hands over (a copy that sends fp32
but declares bf16 is caught), its decoding, --verify on every method that takes it with an
allowance of bfloat16's rounding and no more (a copy that forgets the division and one that
rounds toward zero both fail), its recorded bytes, and the model's price for it."""
import json

import pytest
import torch

import compression
from ddlbench.measure.codec_bench import SimComm
from ddlbench.model import predict

from .conftest import QUICK_TIMING, TINY_BERT, describe, train, verify_lines
from .test_compression_costs import RecordingComm

SHAPES = [(64, 3, 7, 7), (64,), (10, 512), (33,)]


def _handed_over(comp, shapes, nworkers):
    """(op, bytes) of what ``comp`` hands ``RecordingComm`` for one bucket of ``shapes``."""
    comm = RecordingComm(nworkers)
    g = torch.randn(sum(torch.Size(s).numel() for s in shapes),
                    generator=torch.Generator().manual_seed(1))
    comp.reduce_async(tuple(range(len(shapes))), g, comm, [torch.Size(s) for s in shapes]).wait()
    return [(op, size) for _, op, size, _ in comm.record]


class _SendsFP32(compression.BF16):
    """Sends g/P in fp32 but declares bfloat16 (what it declares is inherited)."""
    wire = "float32"


@pytest.mark.parametrize("nworkers", [1, 3])
def test_bf16_declares_half_of_fp32_and_hands_over_what_it_declares(nworkers):
    n = sum(torch.Size(s).numel() for s in SHAPES)
    sends = compression.declared("bf16").sends_for(SHAPES, nworkers, 4)
    assert sends.collectives == ((compression.ALLREDUCE, 2 * n),) and sends.at_wait == 0
    dense = compression.declared("none").sends_for(SHAPES, nworkers, 4)
    assert 2 * sends.collectives[0][1] == dense.collectives[0][1]
    # float64 gradients: still 2 bytes an element on the wire
    assert compression.declared("bf16").sends_for(SHAPES, nworkers, 8) == sends
    assert _handed_over(compression.create("bf16"), SHAPES, nworkers) == list(sends.collectives)
    # a copy that sends fp32 but declares bf16 is caught by the same comparison
    broken = _SendsFP32()
    assert broken.sends_for(SHAPES, nworkers, 4) == sends
    assert _handed_over(broken, SHAPES, nworkers) == [(compression.ALLREDUCE, 4 * n)]


def test_bf16_decodes_identical_workers_to_one_rounding_of_g_over_p():
    g = torch.randn(4000, generator=torch.Generator().manual_seed(3))
    t = g.clone()
    compression.create("bf16").reduce_async((0, 1), t, SimComm(3), [(40, 50), (2000,)]).wait()
    # SimComm's all-reduce is 3 x the bfloat16 tensor, in bfloat16
    assert torch.equal(t, (g / 3).bfloat16().mul_(3).float())
    assert not torch.equal(t, g)   # bfloat16 rounds where fp32 would not


def test_the_reference_allows_bf16_rounding():
    """Per element (P-1) x (2^-8 x sum |b_i| + 2^-134), b_i = g_i/P rounded to bfloat16 once:
    the P bfloat16 values summed exactly in float64 are the average."""
    from compression.reference import ReferenceMath
    gen = torch.Generator().manual_seed(5)
    xs = [torch.randn(1000, generator=gen, dtype=torch.float64) for _ in range(3)]
    avg, bound = ReferenceMath("bf16", 3).aggregate([0], xs, [(1000,)])
    sent = [(x.float() / 3).bfloat16().double() for x in xs]
    assert torch.equal(avg, sum(sent))
    assert torch.equal(bound, 2 * (2.0 ** -8 * sum(b.abs() for b in sent) + 2.0 ** -134))


BROKEN = ("tests.broken_methods:FusionBF16NoDivide", "tests.broken_methods:FusionBF16Truncates",
          "tests.broken_methods:FusionBF16TorchOrder")


def test_bf16_verifies_on_every_method_that_takes_it_and_broken_ones_fail():
    """3 workers, momentum SGD, 2 steps: wfbp, fusion, bspa2a, ddp (its comm hook) and
    bytescheduler (chunk by chunk) within bfloat16's rounding, which is seen (the difference
    is not 0); a bf16 that forgets the division fails by about P - 1 = 2 of the update (over
    100x the tolerance) and one that rounds toward zero (one bfloat16 ulp, twice the rounding
    allowed) fails too. torch's bf16_compress_hook order (cast, then divide the bfloat16 copy:
    two roundings at P = 3) is told apart from the suite's bf16 as well."""
    methods = ["wfbp", "fusion", "bspa2a", "ddp", "bytescheduler"]
    proc = train(*TINY_BERT, "--verify", "2", "--optimizer", "sgd", "--momentum", "0.9",
                 "--compressor", "bf16", "--nworkers", "3", "--threshold", "100000",
                 "--bucket-cap-mb", "0.2", "--partition", "20000", "--credit", "80000",
                 "--method", ",".join(methods + list(BROKEN)), timeout=600)
    assert proc.returncode == 1, describe(proc)
    lines = verify_lines(proc.stdout)
    for method in methods:
        rows = lines[f"{method}+bf16"]
        assert [(step, ok) for step, *_, ok in rows] == [(1, True), (2, True)], (method, rows)
        assert all(max_abs > 0 for _, max_abs, _, _ in rows), (method, rows)
    no_divide = lines[f"{BROKEN[0]}+bf16"]
    assert all(not ok and frac > 100 for _, _, frac, ok in no_divide), no_divide
    truncates = lines[f"{BROKEN[1]}+bf16"]
    assert not any(ok for *_, ok in truncates), truncates
    torch_order = lines[f"{BROKEN[2]}+bf16"]
    assert not all(ok for *_, ok in torch_order), torch_order
    assert "allowance" in proc.stdout and "replicas identical" in proc.stdout


def test_bf16_is_recorded_at_half_of_fp32_and_predicted_so(tmp_path, load_json):
    out = tmp_path / "rec.json"
    proc = train(*TINY_BERT, "--method", "fusion", "--threshold", "400000", "--compressor",
                 "bf16", "--nworkers", "2", *QUICK_TIMING, "--output", str(out), timeout=600)
    assert proc.returncode == 0, describe(proc)
    rec = load_json(out)
    buckets = rec["method"]["bucket_bytes"]
    assert len(buckets) > 1 and rec["method"]["compressor"] == "bf16"
    figures = rec["compression_per_iteration"]
    # per bucket of n fp32 elements: n bfloat16 elements all-reduced, as declared
    declared = sum(compression.declared("bf16").sends_for([(b // 4,)], 2, 4).collectives[0][1]
                   for b in buckets)
    assert figures["payload_bytes"] == declared == sum(buckets) // 2
    assert rec["communication_per_iteration"]["payload_bytes"] == {"allreduce": declared}
    assert 2 * figures["payload_bytes"] == figures["dense_payload_bytes"]

    # the model prices its declared all-reduces: half of fp32's bytes, fp16's time
    sizes = [4096, 1 << 20, 65536, 4 << 20]
    prof = {"format": "ddlbench-mgwfbp-profile", "version": 1, "model": "hand-made",
            "workload": {"batch_size": 8, "image_size": 32},
            "tensors": [{"name": f"layer{i}.weight", "shape": [n // 4], "bytes": n}
                        for i, n in enumerate(sizes)],
            "backward_s": [0.002, 0.004, 0.001, 0.006], "forward_s": 0.01,
            "alpha_s": 1e-3, "beta_s_per_byte": 1e-9, "nworkers": 2, "backend": "gloo",
            "device": "cpu", "network": "local"}
    (tmp_path / "prof.json").write_text(json.dumps(prof))

    def predicted(comp):
        pred = tmp_path / f"{comp}.json"
        assert predict.main(["--profile", str(tmp_path / "prof.json"), "--method", "wfbp",
                             "--compressor", comp, "--nworkers", "4", "--optimizer-ms", "0",
                             "--output", str(pred)]) == 0
        [p] = load_json(pred)["predictions"]
        return p

    bf16, fp16, dense = predicted("bf16"), predicted("fp16"), predicted("none")
    assert bf16["compressor"] == "bf16"
    assert bf16["message_bytes"] == [n // 2 for n in dense["message_bytes"]]
    assert bf16["iteration_s"] == fp16["iteration_s"] < dense["iteration_s"]

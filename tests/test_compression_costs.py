"""Each compressor's declaration (``Compressor.sends_for``, the torch-free figures of what it
sends, which the performance model prices) equals exactly what the real compressor hands to
collectives, and when (handed over or waited for: docs/DESIGN.md section 7), and
codec_bench's ``--output`` JSON agrees with it."""
import json

import pytest
import torch

import compression
from ddlbench.measure import codec_bench as bench
from ddlbench.measure.codec_bench import SimComm
from ddlbench.errors import UsageError


class RecordingComm(SimComm):
    """SimComm that records (bucket, op, bytes, issued when waited for) per collective: an
    all-reduce's tensor, an all-gather's gathered output (P x each rank's contribution)."""

    def __init__(self, size):
        super().__init__(size)
        self.bucket = None
        self.waiting = False
        self.record = []

    def allreduce(self, tensor, async_op=True):
        self.record.append((self.bucket, "allreduce", tensor.numel() * tensor.element_size(),
                            self.waiting))
        return super().allreduce(tensor, async_op)

    def allgather(self, output, tensor, async_op=True):
        assert output.numel() == self.size * tensor.numel()
        self.record.append((self.bucket, "allgather", output.numel() * output.element_size(),
                            self.waiting))
        return super().allgather(output, tensor, async_op)


def real_messages(name, buckets, nworkers, dtype=torch.float32, **options):
    """Per bucket, the (op, bytes) the compressor hands over in its second iteration, with
    every bucket started before any is waited for (as the bucketed methods and the bench do),
    and how many of them (its last) it issued when waited for."""
    comp = compression.create(name, **options)
    comm = RecordingComm(nworkers)
    gen = torch.Generator().manual_seed(7)
    grads = [torch.randn(sum(torch.Size(s).numel() for s in shapes), generator=gen,
                         dtype=dtype) for shapes in buckets]
    keys = []
    start = 0
    for shapes in buckets:
        keys.append(tuple(range(start, start + len(shapes))))
        start += len(shapes)
    for _ in range(2):  # a warm-up iteration, then the one recorded
        comm.record = []
        pending = []
        comm.waiting = False
        for b, (key, shapes, g) in enumerate(zip(keys, buckets, grads)):
            comm.bucket = b
            pending.append(comp.reduce_async(key, g.clone(), comm,
                                             [torch.Size(s) for s in shapes]))
        comm.waiting = True
        for b, p in enumerate(pending):
            comm.bucket = b
            p.wait()
    out = []
    for b in range(len(buckets)):
        mine = [(op, size, late) for bucket, op, size, late in comm.record if bucket == b]
        lates = [late for _, _, late in mine]
        assert lates == sorted(lates), "a collective issued when waited for comes last"
        out.append(([(op, size) for op, size, _ in mine], sum(lates)))
    return out


CONV = (64, 3, 7, 7)
BIAS = (64,)
LINEAR = (10, 512)
TINY = (2, 128)        # rank 4: 4 x 130 >= 256, PowerSGD sends it dense
SQUARE = (3, 3)        # rank 3 at most: 3 x 6 >= 9, dense too
BUCKETS = {
    "conv": [[CONV]],
    "bias": [[BIAS]],
    "linear": [[LINEAR]],
    "tiny matrix": [[TINY]],
    "odd sizes": [[(33,)], [(1,)], [()], [(1, 1)], [(5, 7, 1, 1)]],
    "mixed": [[CONV, BIAS, LINEAR, TINY, SQUARE, (31,)]],
    "several buckets": [[LINEAR, BIAS], [CONV], [TINY, SQUARE], [BIAS, (1000, 16)]],
    # r(rows + cols) == rows x cols exactly, for ranks 1, 2, 4 and 16: dense (no gain); and
    # one element more: compressed.
    "boundary": [[(2, 2), (4, 4), (8, 8), (32, 32)], [(2, 3), (4, 5), (8, 9), (32, 33)]],
}
# (density, rank): the defaults; many values and rank 1; everything sent and a rank past some
# matrices' sides (then r = min(rank, rows, cols), or dense).
SETTINGS = [(0.001, 4), (0.3, 1), (1.0, 16)]


def declaration(name, shapes, nworkers, element_bytes=4, **options):
    return compression.declared(name, options).sends_for(shapes, nworkers, element_bytes)


def formula(name, buckets, nworkers, density, rank, element_bytes=4):
    """Per bucket, the declared (op, size) list and how many are issued when waited for."""
    out = []
    for shapes in buckets:
        sends = declaration(name, shapes, nworkers, element_bytes, density=density,
                            powersgd_rank=rank)
        out.append((list(sends.collectives), sends.at_wait))
    return out


def test_the_declarations_refuse_what_is_no_bucket():
    with pytest.raises(UsageError, match="unknown compressor 'zip'; known: none, fp16, topk"):
        compression.declared("zip")
    with pytest.raises(UsageError, match="^a bucket holds at least one tensor; got no shapes$"):
        declaration("topk", [], 2)
    with pytest.raises(UsageError, match="^nworkers must be positive, got 0$"):
        declaration("none", [(4,)], 0)
    with pytest.raises(UsageError, match=r"^--density must be in \(0, 1\], got 0$"):
        declaration("topk", [(4,)], 2, density=0)
    for name in compression.COMPRESSORS:
        sends = declaration(name, [CONV, BIAS], 2)
        assert sends.codec_elements == 64 * 3 * 49 + 64 and sends.codec_class == name
        assert sends.dense_tail == (name == "powersgd")   # the bias goes dense
    # the defaults are the compressors' Options, declared once
    assert compression.declared("topk").density == compression.TopK.Options().density == 0.001
    assert compression.declared("powersgd").rank == 4


@pytest.mark.parametrize("nworkers", [1, 2, 5])
@pytest.mark.parametrize("density,rank", SETTINGS)
@pytest.mark.parametrize("name", list(compression.COMPRESSORS))
def test_the_formula_is_exactly_what_each_compressor_hands_over(name, density, rank, nworkers):
    for label, buckets in BUCKETS.items():
        real = real_messages(name, buckets, nworkers, density=density, powersgd_rank=rank)
        assert formula(name, buckets, nworkers, density, rank) == real, label


@pytest.mark.parametrize("name", list(compression.COMPRESSORS))
def test_the_formula_with_float64_gradients(name):
    """element_bytes: the gradient's dtype (fp16 sends half, TopK's indices and the sign
    words stay int32)."""
    buckets = BUCKETS["mixed"] + BUCKETS["several buckets"]
    real = real_messages(name, buckets, 3, dtype=torch.float64, density=0.01, powersgd_rank=2)
    assert formula(name, buckets, 3, 0.01, 2, element_bytes=8) == real


@pytest.fixture(scope="module")
def small_model_buckets():
    """resnet18's fusion buckets (11.7 M parameters, 62 tensors) at a 1 MB threshold: 22."""
    _, shapes = bench.model_buckets("resnet18", 1e6)
    return shapes


@pytest.mark.parametrize("name", list(compression.COMPRESSORS))
def test_the_formula_on_a_real_models_buckets(name, small_model_buckets):
    assert len(small_model_buckets) > 3
    real = real_messages(name, small_model_buckets, 5)
    assert formula(name, small_model_buckets, 5, 0.001, 4) == real


def test_bench_output_payload_is_the_formula_summed_over_buckets(tmp_path, capsys):
    out = tmp_path / "bench.json"
    names = ["topk", "efsignum", "powersgd"]
    assert bench.main(["--model", "squeezenet1_1", "--nworkers", "3", "--threshold", "1e6",
                       "--iters", "1", "--density", "0.01", "--compressor", *names,
                       "--output", str(out)]) == 0
    report = json.loads(out.read_text())
    assert report["settings"] == {"nworkers": 3, "threshold": 1e6, "density": 0.01,
                                  "powersgd_rank": 4, "powersgd_dense_steps": 0,
                                  "device": "cpu", "threads": 1, "iters": 1, "timing": True}
    model = report["models"]["squeezenet1_1"]
    assert set(model["compressors"]) == set(names)
    shapes = [[tuple(s) for s in sh] for sh in model["bucket_shapes"]]
    n = sum(declaration("none", sh, 3).codec_elements for sh in shapes)
    assert n == 1235496
    for name, st in model["compressors"].items():
        messages = [m for sh in shapes
                    for m in declaration(name, sh, 3, density=0.01).collectives]
        # Comm's payload counts what each rank hands over: an all-gather's contribution.
        payload = sum(size // 3 if op == "allgather" else size for op, size in messages)
        assert st["payload_bytes"] == payload, name
        assert st["dense_elements"] == n and st["dense_payload_bytes"] == 4 * n
        assert st["encode_s_per_element"] == pytest.approx(st["encode_s"] / n)
        assert st["decode_s_per_element"] == pytest.approx(st["decode_s"] / n)
        assert st["encode_s"] > 0 and st["decode_s"] > 0
        # the encode done when a bucket is waited for: PowerSGD's Q, a part of its encode
        assert st["encode_at_wait_s_per_element"] == pytest.approx(st["encode_at_wait_s"] / n)
        if name == "powersgd":
            assert 0 < st["encode_at_wait_s"] < st["encode_s"]
        else:
            assert st["encode_at_wait_s"] == 0, name


def test_bench_output_that_cannot_be_written_is_one_line(tmp_path, capsys):
    assert bench.main(["--model", "squeezenet1_1", "--output", str(tmp_path)]) == 2
    out, err = capsys.readouterr()
    lines = err.strip().splitlines()
    assert out == "" and len(lines) == 1, err
    assert lines[0].startswith("ddlbench: error: --output ") and "folder" in lines[0]

"""Gradient compressors (docs/DESIGN.md section 7): their mathematics in-process, then every
compressor through the training script beside the float64 reference, broken ones caught,
the figures of a run, the launcher, and convergence on a separable problem."""
import math

import pytest
import torch

import compression
from ddlbench.measure import codec_bench as bench
from ddlbench.measure.codec_bench import SimComm
from compression.reference import ReferenceMath
from ddlbench import train as train_script

from .conftest import REPO, describe, run, train, verify_lines

COMPRESSORS = ["fp16", "topk", "eftopk", "signum", "signavg", "efsignum", "efsignum_scaled",
               "powersgd"]
# 0.73 M parameters in 52 tensors, no BatchNorm: every compressor x method x workers fits.
SMALL = ["--model", "squeezenet1_1", "--image-size", "32", "--num-classes", "10",
         "--batch-size", "4"]
# 200 kB: several fusion buckets, re-planned after the first step.
THRESHOLD = "200000"


# ---------------------------------------------------------------------------- signs, packed

@pytest.mark.parametrize("n", [1, 31, 32, 33, 1000003])
def test_packing_then_unpacking_signs_is_exact(n):
    g = torch.Generator().manual_seed(n)
    x = torch.randn(n, generator=g)
    x[torch.randint(n, (max(1, n // 10),), generator=g)] = 0.0
    if n > 2:
        x[1] = -0.0  # >= 0: votes +1, like +0
    words = compression.pack_signs(x)
    assert words.dtype == torch.int32 and words.numel() == (n + 31) // 32
    assert torch.equal(compression.unpack_signs(words, n), x >= 0)
    # Element 32 w + j is bit j of word w; the tail of the last word is zero.
    w = int(words[-1]) & 0xFFFFFFFF
    tail = n - 32 * (words.numel() - 1)
    assert w >> tail == 0
    assert all(((w >> j) & 1) == int(x[32 * (words.numel() - 1) + j] >= 0) for j in range(tail))


@pytest.mark.parametrize("workers", [1, 2, 3, 4, 5])
@pytest.mark.parametrize("n", [33, 1000003])
def test_majority_vote_from_packed_words_equals_the_float_vote(workers, n):
    g = torch.Generator().manual_seed(workers * n)
    xs = [torch.randn(n, generator=g) for _ in range(workers)]
    xs[0][: n // 3] = 0.0
    words = torch.stack([compression.pack_signs(x) for x in xs])
    float_vote = torch.sign(sum(torch.where(x >= 0, 1.0, -1.0).double() for x in xs))
    vote = compression.majority_vote(words, n)
    assert torch.equal(vote.double(), float_vote)
    if workers % 2 == 0:
        assert (vote == 0).any()  # ties exist with an even number of voters


# ---------------------------------------------------------------------------- TopK

@pytest.mark.parametrize("n,density,k", [(1000, 0.001, 1), (100, 0.29, 29), (5, 0.01, 1),
                                         (10, 1.0, 10), (1000003, 0.001, 1000),
                                         (3, 0.5, 2)])
def test_topk_count(n, density, k):
    assert compression.topk_count(n, density) == k


@pytest.mark.parametrize("n", [1, 7, 1000, 100003])
def test_topk_keeps_exactly_the_k_largest_magnitudes(n):
    g = torch.Generator().manual_seed(n)
    x = torch.randn(n, generator=g)
    for density in (0.001, 0.01, 0.3, 1.0):
        k = compression.topk_count(n, density)
        idx = compression.topk_indices(x, k)
        assert idx.numel() == k and idx.unique().numel() == k
        chosen = torch.zeros(n, dtype=torch.bool)
        chosen[idx] = True
        if k < n:
            # Every kept magnitude >= every dropped one.
            assert x[chosen].abs().min() >= x[~chosen].abs().max()
        assert torch.equal(chosen.nonzero().view(-1), torch.sort(idx).values)


def test_topk_ties_at_the_boundary_go_to_the_lower_index():
    x = torch.tensor([1.0, -3.0, 2.0, 3.0, -2.0, 2.0, 0.5, -2.0])
    assert compression.topk_indices(x, 2).tolist() == [1, 3]
    assert compression.topk_indices(x, 3).tolist() == [1, 2, 3]
    assert compression.topk_indices(x, 5).tolist() == [1, 2, 3, 4, 5]
    big = torch.ones(100003)
    big[50000] = 2.0
    assert compression.topk_indices(big, 4).tolist() == [0, 1, 2, 50000]


def test_error_feedback_topk_loses_nothing_each_step():
    comp = compression.create("eftopk", density=0.01)
    shapes = [torch.Size([40, 25]), torch.Size([1000])]
    g = torch.Generator().manual_seed(0)
    residual = torch.zeros(2000)
    for step in range(6):
        grad = torch.randn(2000, generator=g)
        corrected = grad + residual
        values, idx = comp.encode((0, 1), grad, shapes)
        assert values.numel() == idx.numel() == 20 and idx.dtype == torch.int32
        sent = torch.zeros(2000).index_put_((idx.long(),), values)
        residual = comp._residual.get((0, 1), grad, shapes)
        # Exactly: what was sent plus what is kept is the corrected gradient.
        assert torch.equal(sent + residual, corrected), step
        assert torch.equal(sent[idx.long()], corrected[idx.long()])
        assert (residual[idx.long()] == 0).all()


def test_signavg_averages_the_signs_where_signum_votes():
    """The original's signSGD (signavg): the mean of the workers' signs, exactly, where signum
    takes their majority; a zero counts +1 in both. Its reference (compression/reference.py,
    written apart) gives the same figures."""
    from compression.reference import ReferenceMath
    # 3 workers, 4 elements: votes (+,+,-), (-,-,-), (+,-,0 -> +), (0 -> +, 0 -> +, -)
    xs = [torch.tensor([1.0, -2.0, 3.0, 0.0]), torch.tensor([0.5, -1.0, -1.0, 0.0]),
          torch.tensor([-4.0, -0.1, 0.0, -7.0])]
    words = [compression.pack_signs(x) for x in xs]   # what each worker sends

    def on_each_worker(name):
        out = []
        for rank, x in enumerate(xs):
            t = x.clone()
            comm = _Gathered(words, rank)
            compression.create(name).reduce_async((0,), t, comm, [t.shape]).wait()
            out.append(t.tolist())
        return out
    avg, vote = on_each_worker("signavg"), on_each_worker("signum")
    third = torch.tensor(1 / 3, dtype=torch.float32).item()   # the fp32 gradient's 1/3
    assert avg == [[third, -1.0, third, third]] * 3
    assert vote == [[1.0, -1.0, 1.0, 1.0]] * 3
    ref, bound = ReferenceMath("signavg", 3).aggregate([0], [x.double() for x in xs], [(4,)])
    assert bound is None
    assert torch.allclose(torch.tensor(avg[0], dtype=torch.float64), ref, rtol=0, atol=1e-7)
    assert ref.tolist() == [1 / 3, -1.0, 1 / 3, 1 / 3]


class _Gathered(SimComm):
    """Worker ``rank``'s all-gather among workers whose payloads are ``rows``: it sends its
    own row (checked) and receives every row, in rank order."""

    def __init__(self, rows, rank):
        super().__init__(len(rows))
        self.rows, self.rank = rows, rank

    def allgather(self, output, tensor, async_op=True):
        assert torch.equal(tensor, self.rows[self.rank])
        output.copy_(torch.cat(self.rows))
        return super().allgather(torch.empty_like(output), tensor, async_op)


def test_the_originals_error_feedback_signum_sends_unscaled_signs_and_keeps_c_minus_sign():
    """The original's EFSignCompressor: the sign bits of c = g + residual, no scale; the new
    residual c - sign(c) exactly (0 where c is 0); the result the mean of the workers' signs."""
    comp = compression.create("efsignum")
    shapes = [torch.Size([30, 10]), torch.Size([7])]
    g = torch.Generator().manual_seed(1)
    residual = torch.zeros(307)
    for step in range(4):
        grad = torch.randn(307, generator=g)
        grad[:5] = -residual[:5]   # c exactly 0 there: sent as +1, residual 0
        corrected = grad + residual
        (words,) = comp.encode((4, 5), grad, shapes)
        assert words.numel() == 10
        signs = compression.unpack_signs(words, 307).float() * 2 - 1
        assert torch.equal(signs, torch.where(corrected >= 0, 1.0, -1.0)), step
        residual = comp._residual.get((4, 5), grad, shapes)
        assert torch.equal(residual, corrected - torch.sign(corrected)), step
        assert torch.equal(residual[:5], torch.zeros(5)), step
    # two workers: the mean of their signs, in {-1, 0, 1}
    a, b = torch.tensor([1.0, -2.0, 3.0, -4.0]), torch.tensor([5.0, 6.0, -7.0, -8.0])
    rows = [compression.pack_signs(a), compression.pack_signs(b)]
    outs = []
    for rank, x in enumerate((a, b)):
        t = x.clone()
        compression.create("efsignum").reduce_async((0,), t, _Gathered(rows, rank)).wait()
        outs.append(t)
    assert all(torch.equal(t, torch.tensor([1.0, 0.0, 0.0, -1.0])) for t in outs)
    ref, bound = ReferenceMath("efsignum", 2).aggregate([0], [a.double(), b.double()], [(4,)])
    assert torch.equal(ref, outs[0].double()) and bound is None


def test_error_feedback_signum_scaled_loses_nothing_but_rounding_each_step():
    comp = compression.create("efsignum_scaled")
    shapes = [torch.Size([30, 10]), torch.Size([7])]
    sizes = [300, 7]
    g = torch.Generator().manual_seed(1)
    residual = torch.zeros(307)
    for step in range(6):
        grad = torch.randn(307, generator=g)
        corrected = grad + residual
        words, scales = comp.encode((4, 5), grad, shapes)
        assert words.numel() == 10 and scales.numel() == 2
        signs = compression.unpack_signs(words, 307).float() * 2 - 1
        # One scale per tensor: the mean |corrected| over it.
        for s, part in zip(scales, corrected.split(sizes)):
            assert float(s) == pytest.approx(float(part.abs().double().mean()), rel=1e-7)
        sent = signs * torch.repeat_interleave(scales, torch.tensor(sizes))
        residual = comp._residual.get((4, 5), grad, shapes)
        # residual = corrected - sent, rounded once in fp32.
        assert torch.equal(residual, corrected - sent), step
        err = (sent.double() + residual.double() - corrected.double()).abs()
        assert (err <= 2.0 ** -24 * corrected.double().abs().clamp_min(sent.double().abs())).all()


def test_residual_follows_a_tensor_into_its_new_bucket():
    """Fusion re-plans its buckets after the first step: error feedback must not drop the
    residual of the tensors that moved."""
    comp = compression.create("eftopk", density=0.1)
    a, b = torch.Size([6]), torch.Size([4])
    x = torch.arange(1.0, 11.0)
    comp.encode((0, 1), x.clone(), [a, b])
    kept = comp._residual.get((0, 1), x, [a, b]).clone()
    # Now each tensor travels alone, in the other order.
    assert torch.equal(comp._residual.get((1,), torch.zeros(4), [b]), kept[6:])
    assert torch.equal(comp._residual.get((0,), torch.zeros(6), [a]), kept[:6])


# ---------------------------------------------------------------------------- bytes

def test_an_encode_done_when_waited_for_is_counted_in_the_encode_and_apart():
    """Comm.clock(at_wait=True): the seconds go to encode_s and to encode_at_wait_s (what
    the performance model does in the step: PowerSGD's Q); a decode is never at wait."""
    import time
    comm = SimComm(2)
    x = torch.zeros(4)
    with comm.clock("encode_s", x):
        time.sleep(0.01)
    early = comm.seconds["encode_s"]
    with comm.clock("encode_s", x, at_wait=True):
        time.sleep(0.02)
    late = comm.seconds["encode_at_wait_s"]
    with comm.clock("decode_s", x, at_wait=True):
        pass
    assert early >= 0.01 and late >= 0.02
    assert comm.seconds["encode_s"] == early + late
    assert comm.seconds["encode_at_wait_s"] == late
    comm.count_dense(4)
    st = comm.compression_stats()
    assert (st["encode_s"], st["encode_at_wait_s"]) == (early + late, late)


def test_bytes_are_counted_from_the_exchanged_tensors():
    """Each compressor's payload per worker, exactly, and the ring-model figures that Comm
    counts for the same collectives; on the timeline, its encode spans read the dense bytes
    and produce the payload, its decode reads what the collectives brought (every worker's
    payload after an all-gather) and writes the dense bytes."""
    shapes = [torch.Size([10, 50]), torch.Size([500])]  # 1000 elements in one bucket
    expected_payload = {
        "none": 4000,
        "fp16": 2000,
        "topk": 10 * 4 + 10 * 4,          # k = 10 values (fp32) + 10 indices (int32)
        "eftopk": 80,
        "signum": 32 * 4,                 # ceil(1000 / 32) words
        "signavg": 32 * 4,                # the same words
        "efsignum": 32 * 4,               # the same words (the original's: no scale)
        "efsignum_scaled": 32 * 4 + 2 * 4,  # + one fp32 scale per tensor
        # rank 2 on 10 x 50: P 10x2 and Q 50x2; the 1-D tensor goes dense (500).
        "powersgd": (20 + 100 + 500) * 4,
    }
    for name, payload in expected_payload.items():
        comp = compression.create(name, density=0.01, powersgd_rank=2)
        comm = SimComm(4)
        comm.timeline.start()
        t = torch.randn(1000)
        comp.reduce_async((0, 1), t, comm, shapes).wait()
        encodes = [e[5] for e in comm.timeline.events if e[0] == "encode"]
        assert all(a["bytes"] == 4000 for a in encodes), name
        assert sum(a["bytes_out"] for a in encodes) == (payload if name != "none" else 0), name
        decodes = [e[5] for e in comm.timeline.events if e[0] == "decode"]
        gathers = 4 if name in ("topk", "eftopk", "signum", "signavg", "efsignum",
                                "efsignum_scaled") else 1
        assert [(a["bytes"], a["bytes_in"]) for a in decodes] == [(4000, payload * gathers)], \
            name
        st = comm.compression_stats()  # the compressor counts through Comm
        assert st["payload_bytes"] == payload, name
        assert sum(comm.stats()["payload_bytes"].values()) == payload
        assert st["wire_sent_bytes"] == pytest.approx(sum(comm.stats()["wire_sent_bytes"].values()),
                                                      abs=1)
        assert st["wire_received_bytes"] == st["wire_sent_bytes"]
        assert st["dense_payload_bytes"] == 4000 and st["dense_wire_bytes"] == 6000
        assert st["compression_ratio"] == 4000 / payload
        assert st["encode_s"] >= 0 and st["decode_s"] >= 0
    gathered = {"topk": 3 * 80, "signum": 3 * 128, "signavg": 3 * 128,  # (P-1) m each way
                "efsignum": 3 * 128}
    for name, wire in gathered.items():
        comp = compression.create(name, density=0.01)
        comm = SimComm(4)
        comp.reduce_async((0, 1), torch.randn(1000), comm, shapes).wait()
        assert comm.compression_stats()["wire_sent_bytes"] == wire


def test_powersgd_leaves_vectors_and_unprofitable_matrices_dense():
    assert compression.powersgd_plan((64,), 4) is None
    assert compression.powersgd_plan((2, 128), 4) is None      # 2 x 130 >= 256
    assert compression.powersgd_plan((64, 3, 3, 3), 4) == (64, 27, 4)
    assert compression.powersgd_plan((10, 512), 4) == (10, 512, 4)
    assert compression.powersgd_plan((10, 512), 16) is None     # rank 10: 10 x 522 >= 5120
    assert compression.powersgd_plan((512, 512), 300) is None   # 300 x 1024 >= 512 x 512


# ------------------------------------------------------ decoding, with identical workers

def test_decoding_with_identical_workers():
    """With P workers that all hold g, the average of the decoded gradients is the decoding
    of g's own message."""
    g = torch.randn(4000, generator=torch.Generator().manual_seed(3))
    shapes = [torch.Size([40, 50]), torch.Size([2000])]

    def once(name, **kw):
        t = g.clone()
        compression.create(name, **kw).reduce_async((0, 1), t, SimComm(3), shapes).wait()
        return t

    assert torch.equal(once("none"), g * 3 / 3)
    assert torch.equal(once("fp16"), (g / 3).half().mul_(3).float())
    top = once("topk", density=0.01)
    idx = compression.topk_indices(g, 40)
    assert torch.equal(top.nonzero().view(-1), idx)
    assert torch.equal(top[idx], (g[idx] + g[idx] + g[idx]) / 3)  # 3 copies scatter-added
    assert torch.equal(once("signum"), torch.where(g >= 0, 1.0, -1.0))
    assert torch.equal(once("signavg"), torch.where(g >= 0, 1.0, -1.0))
    assert torch.equal(once("efsignum"), torch.where(g >= 0, 1.0, -1.0))  # no scale
    ef = once("efsignum_scaled")
    scales = [g[:2000].abs().double().mean(), g[2000:].abs().double().mean()]
    assert torch.allclose(ef[:2000].double(), torch.sign(g[:2000]).double() * scales[0])
    assert torch.allclose(ef[2000:].double(), torch.sign(g[2000:]).double() * scales[1])
    # PowerSGD of rank 2 reproduces a matrix of rank 2 (up to rounding); the vector is dense.
    gen = torch.Generator().manual_seed(4)
    g[:2000] = (torch.randn(40, 2, generator=gen) @ torch.randn(2, 50, generator=gen)).view(-1)
    low = once("powersgd", powersgd_rank=2)
    assert torch.allclose(low[:2000], g[:2000], rtol=0, atol=1e-5)
    assert torch.equal(low[2000:], g[2000:] * 3 / 3)


def test_reference_topk_with_density_one_is_the_dense_average():
    xs = [torch.randn(500, dtype=torch.float64, generator=torch.Generator().manual_seed(i))
          .float().double() for i in range(3)]
    dense, _ = ReferenceMath("none", 3).aggregate([0], xs, [torch.Size([500])])
    for name in ("topk", "eftopk"):
        ref = ReferenceMath(name, 3, density=1.0)
        for _ in range(2):
            avg, bound = ref.aggregate([0], xs, [torch.Size([500])])
            assert torch.equal(avg, dense) and bound is None


def test_bench_prints_bytes_per_iteration_for_every_compressor(capsys):
    """The benchmark script on a small model (its own assertions compare the compressor's count
    with Comm's for every row)."""
    assert bench.main(["--model", "squeezenet1_1", "--nworkers", "4", "--no-timing"]) == 0
    out = capsys.readouterr().out
    rows = [ln.split(" | ") for ln in out.splitlines() if ln.startswith("| ")][2:]
    assert [r[0][2:] for r in rows] == list(compression.COMPRESSORS)
    dense = float(rows[0][1])
    assert dense == pytest.approx(1235496 * 4 / 1e6, abs=1e-3)  # squeezenet1_1, 1000 classes
    assert float(rows[1][1]) == pytest.approx(dense / 2, abs=1e-3)  # fp16


@pytest.mark.parametrize("args,message", [
    (["--density", "1.5"], "--density must be in (0, 1], got 1.5"),
    (["--compressor", "topk", "zip"], "unknown compressor 'zip'"),
    (["--powersgd-rank", "0"], "--powersgd-rank must be positive, got 0"),
    (["--nworkers", "0"], "--nworkers, --iters and --threads must be positive"),
])
def test_bench_bad_input_is_one_line_and_nonzero(capsys, args, message):
    assert bench.main(["--model", "squeezenet1_1", *args]) == 2
    out, err = capsys.readouterr()
    lines = err.strip().splitlines()
    assert out == "" and len(lines) == 1, err
    assert lines[0].startswith("ddlbench: error: ") and message in lines[0], err


# ---------------------------------------------------------------------------- bad input

@pytest.mark.parametrize("args,message", [
    (["--density", "0"], "--density must be in (0, 1], got 0.0"),
    (["--density", "-0.5"], "--density must be in (0, 1], got -0.5"),
    (["--density", "1.01", "--compressor", "topk"], "--density must be in (0, 1], got 1.01"),
    (["--compressor", "zip"], "unknown compressor 'zip'; known: none, fp16, topk, eftopk, "
                              "signum, signavg, efsignum, efsignum_scaled, powersgd"),
    (["--compressor", "topk,zip", "--verify", "1"], "unknown compressor 'zip'"),
    (["--compressor", "powersgd", "--powersgd-rank", "0"],
     "--powersgd-rank must be positive, got 0"),
    (["--compressor", "powersgd", "--powersgd-rank", "-3"],
     "--powersgd-rank must be positive, got -3"),
    (["--powersgd-dense-steps", "-1"], "--powersgd-dense-steps must be >= 0, got -1"),
    (["--compressor", "powersgd", "--method", "bytescheduler"],
     "method 'bytescheduler' cannot take --compressor powersgd: PowerSGD factorises whole "
     "matrices"),
    (["--compressor", "topk,fp16"], "several compressors at once only with --verify"),
])
def test_bad_compressor_input_is_one_line_and_nonzero(capsys, args, message):
    code = train_script.main(["--model", "bert_tiny", "--nworkers", "2", *args])
    out, err = capsys.readouterr()
    assert code == 2 and out == ""
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("ddlbench: error: ") and message in lines[0], err


def test_bad_powersgd_rank_exits_nonzero_from_the_command_line():
    proc = train("--model", "bert_tiny", "--compressor", "powersgd", "--powersgd-rank", "0",
                 "--nworkers", "2", timeout=120)
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.strip() == "ddlbench: error: --powersgd-rank must be positive, got 0"


# ----------------------------------------------------- every compressor, 1-4 workers, verified

def _check_verified(proc, names, steps=3):
    assert proc.returncode == 0, describe(proc)
    lines = verify_lines(proc.stdout)
    assert sorted(lines) == sorted(names), describe(proc)
    for name, rows in lines.items():
        assert [r[0] for r in rows] == list(range(1, steps + 1)), name
        for step, max_abs, frac, ok in rows:
            assert ok, (name, step)
            if name.endswith(("topk", "signum", "signavg")) or "+" not in name:
                # Exact selections on the same fp32 values: fp32 reordering only, as dense.
                assert frac < 0.5 and max_abs < 1e-6, (name, step, max_abs, frac)
    for line in proc.stdout.splitlines():
        if line.startswith("verify ") and " step " in line:
            assert "replicas identical" in line, line
    assert "all methods match the reference" in proc.stdout
    return lines


@pytest.mark.parametrize("nworkers,methods,density", [
    (1, "fusion", "0.05"), (2, "wfbp,ddp", "0.05"), (3, "bspa2a", "1.0"), (4, "fusion", "0.05"),
    (3, "bytescheduler", "0.05")])
def test_every_compressor_matches_its_reference(nworkers, methods, density):
    """With 3 workers TopK runs at density 1.0 beside the dense method: it is then the dense
    average (fp32 reordering only, the same assertion as for dense methods). DDP runs with
    small buckets (0.2 MB after its first 1 MiB one): many buckets, rebuilt by DDP after the
    first step, each through the compressor in its comm hook. ByteScheduler cuts tensors into
    chunks of 50,000 elements (squeezenet's largest has 262,144), each compressed alone, in
    rank 0's order under a small credit window; it refuses PowerSGD."""
    names = COMPRESSORS if density != "1.0" else ["none"] + COMPRESSORS
    if methods == "bytescheduler":
        names = [c for c in names if c != "powersgd"]
    methods = methods.split(",")
    proc = train(*SMALL, "--verify", "3", "--method", ",".join(methods),
                 "--threshold", THRESHOLD, "--bucket-cap-mb", "0.2",
                 "--partition", "50000", "--credit", "200000",
                 "--compressor", ",".join(names), "--density", density,
                 "--nworkers", str(nworkers), timeout=900)
    lines = _check_verified(proc, [f"{m}+{c}" if c != "none" else m
                                   for m in methods for c in names])
    for method in methods:
        if nworkers > 1:
            # fp16: the half sums round, within the allowance the reference derived for them.
            assert any(max_abs > 0 for _, max_abs, _, _ in lines[f"{method}+fp16"])
        if "powersgd" not in names:
            continue
        allowance = [float(ln.split("compressor allowance <= ")[1].split(",")[0])
                     for ln in proc.stdout.splitlines() if f"{method}+powersgd step" in ln]
        # PowerSGD's allowance stays far below a step (lr ~ 1e-2 x gradient ~ 1e-3).
        assert len(allowance) == 3 and max(allowance) < 1e-4, allowance


def test_powersgd_in_float64_matches_its_reference_to_rounding():
    """In float64 the compressor and the reference compute in one precision: PowerSGD, under
    fusion and under DDP's comm hook, must stay within 1e-12 relative (1e-14 absolute) plus an
    allowance of order 1e-13 over 5 steps, where fp32 needs ~1e-5 (see compression/reference.py).
    A PowerSGD that forgets its warm start is right on step 1 and caught from step 2."""
    broken = "tests.broken_methods:FusionPowerSGDColdStart"
    proc = train(*SMALL, "--verify", "5", "--dtype", "float64", "--rtol", "1e-12",
                 "--atol", "1e-14", "--method", f"fusion,ddp,{broken}",
                 "--threshold", THRESHOLD, "--bucket-cap-mb", "0.2", "--compressor", "powersgd",
                 "--nworkers", "3", timeout=900)
    assert proc.returncode == 1, describe(proc)
    lines = verify_lines(proc.stdout)
    for name in ("fusion+powersgd", "ddp+powersgd"):
        assert [ok for *_, ok in lines[name]] == [True] * 5, (name, lines[name])
        assert max(max_abs for _, max_abs, _, _ in lines[name]) < 1e-12, lines[name]
    allowance = [float(ln.split("compressor allowance <= ")[1].split(",")[0])
                 for ln in proc.stdout.splitlines() if "+powersgd step" in ln]
    assert len(allowance) == 15 and max(allowance) < 1e-12, allowance
    rows = lines[f"{broken}+powersgd"]
    assert rows[0][3] and all(not ok and frac > 1e3 for _, _, frac, ok in rows[1:]), rows
    assert f"FAILED: {broken}+powersgd" in proc.stdout


def test_verify_buckets_must_cover_every_parameter_exactly_once():
    from ddlbench.verify import _tiles
    assert _tiles([(0, 5), (5, 10)], 10) and _tiles([(0, 10)], 10) and _tiles([(0, 0)], 0)
    assert not _tiles([(0, 5), (6, 10)], 10)      # a gap
    assert not _tiles([(0, 6), (5, 10)], 10)      # an overlap
    assert not _tiles([(0, 10), (0, 10)], 10)     # twice
    assert not _tiles([(0, 5)], 10) and not _tiles([], 10)


BROKEN = {"FusionTopKWithoutOffsets": "topk", "FusionEFTopKKeepsSent": "eftopk",
          "FusionSignumLocalOnly": "signum", "FusionPowerSGDSumsQ": "powersgd"}


def test_verify_catches_broken_compressors():
    """tests/broken_methods.py: a TopK whose indices lose their tensor's offset in the bucket,
    an error feedback that keeps what it sent, a vote that keeps only the local signs, a
    PowerSGD that never divides by the workers. One run: every broken method against every
    reference (a mismatched pair fails too, and is not looked at)."""
    methods = [f"tests.broken_methods:{b}" for b in BROKEN]
    proc = train(*SMALL, "--verify", "2", "--method", ",".join(methods), "--threshold", THRESHOLD,
                 "--compressor", ",".join(BROKEN.values()), "--density", "0.05",
                 "--nworkers", "2", timeout=900)
    assert proc.returncode == 1, describe(proc)
    lines = verify_lines(proc.stdout)
    for broken, comp in BROKEN.items():
        rows = lines[f"tests.broken_methods:{broken}+{comp}"]
        # Error feedback that keeps what it sent is right on step 1 and wrong from step 2.
        wrong = rows[1:] if comp == "eftopk" else rows
        assert wrong and all(not ok and frac > 10 for _, _, frac, ok in wrong), (broken, rows)
    assert "FAILED" in proc.stdout


def test_mpi_launcher_runs_a_compressor_and_the_record_has_its_figures(tmp_path, load_json):
    """compressor= and density= through horovod/horovod_mpi_cj.sh; the run record's bytes per
    worker per iteration, exactly, beside the dense figure, and the encode/decode times."""
    out = tmp_path / "rec.json"
    proc = run(["bash", f"{REPO}/horovod/horovod_mpi_cj.sh"], timeout=300, nworkers="2",
               dnn="squeezenet1_1", bs="4", image_size="32", method="fusion", iters="2",
               threshold=THRESHOLD, compressor="eftopk", density="0.01",
               extra_args=f"--num-classes 10 --num-warmup-batches 1 --num-batches-per-iter 2 "
                          f"--timeout 60 --output {out}")
    assert proc.returncode == 0, describe(proc)
    assert "--compressor eftopk --density 0.01" in proc.stderr
    rec = load_json(out)
    st = rec["compression_per_iteration"]
    buckets = rec["method"]["bucket_bytes"]
    assert len(buckets) > 1
    # k per bucket from its size; values fp32 + indices int32, all-gathered.
    payload = sum(8 * compression.topk_count(b // 4, 0.01) for b in buckets)
    assert st["payload_bytes"] == payload
    assert st["wire_sent_bytes"] == st["wire_received_bytes"] == payload  # (P-1) m, P = 2
    assert st["dense_payload_bytes"] == rec["model"]["gradient_bytes"]
    assert st["dense_wire_bytes"] == rec["model"]["gradient_bytes"]  # 2(P-1)/P M, P = 2
    assert st["compression_ratio"] == pytest.approx(rec["model"]["gradient_bytes"] / payload)
    assert st["encode_s"] > 0 and st["decode_s"] > 0
    comm = rec["communication_per_iteration"]
    assert comm["payload_bytes"] == {"allgather": payload}
    assert comm["wire_sent_bytes"] == {"allgather": payload}
    assert rec["method"]["compressor"] == "eftopk" and rec["method"]["density"] == 0.01
    line = [ln for ln in proc.stdout.splitlines() if ln.startswith("Compression: eftopk")]
    assert len(line) == 1 and f"{payload / 1e6:.3f} MB handed to collectives" in line[0]


# ---------------------------------------------------------------------------- convergence
#
# Two real workers (Gloo, one process each), each on its own half of the data: error feedback
# and majority vote only mean something when workers disagree, so this is not run in one
# process. The problem: 8x8 one-channel images in 4 classes, a +1 square in the class's
# quadrant plus N(0, 0.5^2) noise, 512 samples; a two-convolution CNN (1.3 k parameters) in one
# fusion bucket; momentum SGD, lr 0.05, batch 32 per worker, 200 steps. The loss over all 512
# samples starts at ln 4 = 1.386; dense SGD ends near 1e-3.

CONVERGENCE_STEPS = 200
CONVERGENCE_LOSS_BOUND = 0.05


def _separable_data():
    g = torch.Generator().manual_seed(0)
    xs, ys = [], []
    for c in range(4):
        x = 0.5 * torch.randn(128, 1, 8, 8, generator=g)
        r, col = divmod(c, 2)
        x[:, :, 4 * r:4 * r + 4, 4 * col:4 * col + 4] += 1.0
        xs.append(x)
        ys.append(torch.full((128,), c))
    x, y = torch.cat(xs), torch.cat(ys)
    perm = torch.randperm(len(y), generator=g)
    return x[perm], y[perm]


def _convergence_worker(rank, world, store, names, out):
    import torch.distributed as dist
    import torch.nn.functional as F
    from torch import nn

    from ddlbench import compat, errors, methods
    from ddlbench.runtime.comm import Comm
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=world)
    x, y = _separable_data()
    mine_x, mine_y = x[rank::world], y[rank::world]
    results = {}
    for name in names:
        torch.manual_seed(0)
        model = nn.Sequential(nn.Conv2d(1, 8, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
                              nn.Conv2d(8, 16, 3, padding=1), nn.ReLU(),
                              nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(16, 4))
        opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
        comp = compression.create(name, density=0.01)
        strategy = methods.create("fusion", model, opt, Comm(rank, world), compressor=comp)
        g = torch.Generator().manual_seed(100 + rank)
        for _ in range(CONVERGENCE_STEPS):
            i = torch.randint(len(mine_y), (32,), generator=g)
            F.cross_entropy(strategy.module(mine_x[i]), mine_y[i]).backward()
            strategy.step()
            strategy.zero_grad()
        strategy.close()
        with torch.no_grad():
            logits = model(x)
            loss = float(F.cross_entropy(logits, y))
            accuracy = float((logits.argmax(1) == y).float().mean())
            flat = torch.cat([p.reshape(-1) for p in model.parameters()])
            root = flat.clone()
            dist.broadcast(root, 0)
            same = torch.tensor([float(torch.equal(flat, root))])
            dist.all_reduce(same, op=dist.ReduceOp.MIN)
        results[name] = {"loss": loss, "accuracy": accuracy, "replicas_identical": bool(same)}
    if rank == 0:
        torch.save(results, out)
    # End as the entry points do (ddlbench.compat): a worker that returned into the
    # interpreter's teardown after leaving its Gloo group died now and then with SIGABRT
    # ("terminate called without an active exception"), its results already written.
    compat.destroy_process_group()
    errors.finish(0)


def test_compressed_training_converges_on_a_separable_problem(tmp_path):
    import torch.multiprocessing as mp
    names = ["none", "eftopk", "efsignum", "powersgd"]
    out = tmp_path / "results.pt"
    mp.spawn(_convergence_worker, args=(2, str(tmp_path / "store"), names, str(out)), nprocs=2)
    results = torch.load(out)
    for name in names:
        r = results[name]
        assert r["replicas_identical"], (name, r)
        assert r["loss"] < CONVERGENCE_LOSS_BOUND and r["accuracy"] >= 0.99, (name, r)
    assert results["none"]["loss"] < math.log(4) / 100

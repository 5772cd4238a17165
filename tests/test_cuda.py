"""The CUDA path: NCCL with one rank, Gloo with CUDA tensors across ranks sharing one GPU,
device placement and synchronised timing. Skipped on machines without a GPU."""
import pytest
import torch

from .conftest import QUICK_TIMING, SMALL_CNN, TINY_BERT, describe, train, verify_lines

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


def every_method(spec="all"):
    """The methods a job with ``--method SPEC`` verifies: as the training script picks them,
    the parameter-server ones with the servers it starts (none under a cluster's launcher)."""
    from ddlbench import methods
    from ddlbench.hosts import placement
    return methods.selected(spec, with_servers=placement.detect() is None)


def assert_verified(proc, expected, steps=3):
    """Every expected method (or method+compressor) has its ``steps`` verify lines, each OK,
    and there are no others: no line parsed is a failure, not a pass."""
    lines = verify_lines(proc.stdout)
    assert expected and sorted(lines) == sorted(expected), describe(proc)
    for name, got in lines.items():
        assert [s for s, *_ in got] == list(range(1, steps + 1)), (name, got)
        assert all(ok for *_, ok in got), (name, got)
    assert "all methods match the reference" in proc.stdout, describe(proc)


def test_nccl_single_rank_verifies_every_method():
    proc = train(*SMALL_CNN, "--verify", "3", "--method", "all", "--backend", "nccl")
    assert proc.returncode == 0, describe(proc)
    assert_verified(proc, every_method())


@pytest.mark.parametrize("nworkers", [2, 3])
def test_gloo_with_cuda_tensors_on_one_gpu(nworkers):
    # NCCL refuses two ranks on one GPU; the engine picks Gloo for CUDA tensors then.
    proc = train(*TINY_BERT, "--verify", "3", "--method", "all", "--nworkers", str(nworkers))
    assert proc.returncode == 0, describe(proc)
    assert_verified(proc, every_method())


def test_cuda_run_record(tmp_path, load_json):
    out = tmp_path / "rec.json"
    proc = train(*SMALL_CNN, *QUICK_TIMING, "--method", "wfbp", "--output", str(out))
    assert proc.returncode == 0, describe(proc)
    assert "Total img/sec on 1 GPU(s): " in proc.stdout
    rec = load_json(out)
    assert rec["environment"]["device"].startswith("cuda")
    assert rec["environment"]["backend"] == "nccl"
    rounds = rec["result"]["round_seconds"]     # one per --num-iters (QUICK_TIMING: 2)
    assert len(rounds) == int(QUICK_TIMING[QUICK_TIMING.index("--num-iters") + 1])
    assert all(t > 0 for t in rounds), rounds


def test_no_cuda_flag_keeps_the_cpu(tmp_path, load_json):
    out = tmp_path / "rec.json"
    proc = train(*TINY_BERT, *QUICK_TIMING, "--no-cuda", "--output", str(out))
    assert proc.returncode == 0, describe(proc)
    assert load_json(out)["environment"]["device"] == "cpu"


COMPRESSORS = "fp16,topk,eftopk,signum,efsignum,powersgd"


def test_every_compressor_verifies_on_the_gpu():
    """NCCL with one rank, then Gloo with CUDA tensors across 2 ranks on the one GPU: every
    compressor under fusion and DDP (its comm hook), against the float64 reference."""
    for extra in (["--backend", "nccl"], ["--nworkers", "2"]):
        proc = train(*SMALL_CNN, "--verify", "3", "--method", "fusion,ddp", "--threshold",
                     "200000", "--compressor", COMPRESSORS, "--density", "0.05", *extra)
        assert proc.returncode == 0, describe(proc)
        lines = verify_lines(proc.stdout)
        assert len(lines) == 12, describe(proc)   # 2 methods x 6 compressors
        assert_verified(proc, list(lines))


@pytest.mark.parametrize("n", [1, 31, 32, 33, 1000003])
def test_sign_packing_on_the_gpu_equals_the_cpu(n):
    import compression
    x = torch.randn(n, generator=torch.Generator().manual_seed(n))
    x[::7] = 0.0
    words = compression.pack_signs(x.cuda())
    assert words.is_cuda and torch.equal(words.cpu(), compression.pack_signs(x))
    assert torch.equal(compression.unpack_signs(words, n).cpu(), x >= 0)

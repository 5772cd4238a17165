"""Deliberately wrong methods: ``--verify`` must catch each of them."""
import compression
from ddlbench.methods.allreduce import WFBP, Fusion
from ddlbench.methods.hier import Hier
from ddlbench.methods.zero import Zero


class _SumOnly(compression.Compressor):
    id = "sum-only"

    def reduce_async(self, key, tensor, comm, shapes=None):
        return compression.Pending(comm.allreduce(tensor), lambda: None)


class NoAverage(WFBP):
    """Sums the gradients but forgets to divide by the number of workers."""
    id = "test-no-average"

    def __init__(self, model, optimizer, comm, options=None, compressor=None, model_name=None):
        super().__init__(model, optimizer, comm, options, _SumOnly(), model_name)


class _Skip(compression.Compressor):
    id = "skip"

    def __init__(self, inner, skip_key):
        super().__init__()
        self.inner, self.skip_key = inner, skip_key

    def reduce_async(self, key, tensor, comm, shapes=None):
        if key == self.skip_key:
            return compression.Pending(None, lambda: None)
        return self.inner.reduce_async(key, tensor, comm, shapes)


class SkipFirstTensor(WFBP):
    """Never reduces the first parameter's gradient: every rank keeps its local one."""
    id = "test-skip-first-tensor"

    def __init__(self, model, optimizer, comm, options=None, compressor=None, model_name=None):
        super().__init__(model, optimizer, comm, options,
                         _Skip(compression.create("none"), (0,)), model_name)


class Crash(WFBP):
    """Fails in its first step, as a buggy method would."""
    id = "test-crash"

    def step(self):
        raise RuntimeError("test-crash: deliberate failure")


class Hang(WFBP):
    """Never finishes its first step."""
    id = "test-hang"

    def step(self):
        import time
        while True:
            time.sleep(1)


# -- broken compressors: verify with the matching --compressor must fail on each ----------------

class _Broken(Fusion):
    """Fusion with ``BrokenCompressor``, a broken subclass of the compressor it should be run
    with (--compressor ...), in place of the one it was given (with that one's options)."""
    BrokenCompressor = compression.Compressor

    def __init__(self, model, optimizer, comm, options=None, compressor=None, model_name=None):
        broken = self.BrokenCompressor(
            self.BrokenCompressor.Options.resolve(compressor.options.as_dict()))
        super().__init__(model, optimizer, comm, options, broken, model_name)


class _TopKWithoutOffsets(compression.TopK):
    """Sends each selected index relative to the start of its own tensor instead of the
    bucket: in a fused bucket every value lands in the first tensor."""

    def encode(self, key, tensor, shapes=None):
        import torch
        values, idx = super().encode(key, tensor, shapes)
        sizes = [int(torch.Size(s).numel()) for s in shapes]
        ends = torch.tensor(sizes).cumsum(0)
        starts = ends - torch.tensor(sizes)
        which = torch.bucketize(idx.long(), ends, right=True)
        return values, (idx.long() - starts[which]).to(torch.int32)


class FusionTopKWithoutOffsets(_Broken):
    """Run with --compressor topk."""
    id = "test-topk-without-offsets"
    BrokenCompressor = _TopKWithoutOffsets


class _EFTopKKeepsSent(compression.EFTopK):
    """Error feedback that forgets to take what was sent out of the residual: every sent
    value is sent again next step."""

    def encode(self, key, tensor, shapes=None):
        before = tensor + self._residual.get(key, tensor, shapes)
        values, idx = super().encode(key, tensor, shapes)
        self._residual.put(key, before)
        return values, idx


class FusionEFTopKKeepsSent(_Broken):
    """Run with --compressor eftopk."""
    id = "test-eftopk-keeps-sent"
    BrokenCompressor = _EFTopKKeepsSent


class _SizeOne:
    """A Comm that says it has one worker (so nothing is divided by P), everything else the
    real one's."""
    size = 1

    def __init__(self, inner):
        self.inner = inner

    def __getattr__(self, name):
        return getattr(self.inner, name)


class _PowerSGDSumsQ(compression.PowerSGD):
    """Forgets to divide the all-reduced Q by the number of workers (an exchange bug)."""

    def reduce_async(self, key, tensor, comm, shapes=None):
        return super().reduce_async(key, tensor, _SizeOne(comm), shapes)


class FusionPowerSGDSumsQ(_Broken):
    """Run with --compressor powersgd."""
    id = "test-powersgd-sums-q"
    BrokenCompressor = _PowerSGDSumsQ


class _SignumLocalOnly(compression.Signum):
    """Exchanges the packed signs but decodes only its own: no majority vote."""

    def reduce_async(self, key, tensor, comm, shapes=None):
        local = tensor.sign()
        local[local == 0] = 1
        pending = super().reduce_async(key, tensor, comm, shapes)
        return compression.Pending(pending, lambda: tensor.copy_(local))


class FusionSignumLocalOnly(_Broken):
    """Run with --compressor signum."""
    id = "test-signum-local-only"
    BrokenCompressor = _SignumLocalOnly


class _PowerSGDColdStart(compression.PowerSGD):
    """Draws a fresh Q every step instead of warm-starting from the last one (a state bug:
    the first step is right, later ones drift by an amount that depends on the problem)."""

    def reduce_async(self, key, tensor, comm, shapes=None):
        self._q.clear()
        return super().reduce_async(key, tensor, comm, shapes)


class FusionPowerSGDColdStart(_Broken):
    """Run with --compressor powersgd."""
    id = "test-powersgd-cold-start"
    BrokenCompressor = _PowerSGDColdStart


class _BF16NoDivide(compression.BF16):
    """Casts the gradient to bfloat16 without dividing by the workers: the sum, not the
    average."""

    def reduce_async(self, key, tensor, comm, shapes=None):
        return super().reduce_async(key, tensor, _SizeOne(comm), shapes)


class FusionBF16NoDivide(_Broken):
    """Run with --compressor bf16."""
    id = "test-bf16-no-divide"
    BrokenCompressor = _BF16NoDivide


class _BF16Truncates(compression.BF16):
    """Rounds g/P to bfloat16 toward zero (the low 16 bits of the fp32 word dropped) instead of
    to nearest: off by up to one bfloat16 ulp per worker, twice the rounding bf16 is allowed."""

    def reduce_async(self, key, tensor, comm, shapes=None):
        import torch
        share = tensor.float().div(comm.size)
        cut = (share.view(torch.int32) & ~0xFFFF).view(torch.float32)
        tensor.copy_(cut.mul_(comm.size))   # the encoder's division gives back cut exactly
        return super().reduce_async(key, tensor, comm, shapes)


class FusionBF16Truncates(_Broken):
    """Run with --compressor bf16."""
    id = "test-bf16-truncates"
    BrokenCompressor = _BF16Truncates


class _BF16TorchOrder(compression.BF16):
    """torch's ``bf16_compress_hook`` order: the gradient cast to bfloat16 first and the
    bfloat16 copy divided by the workers, a second rounding unless P is a power of two. Not a
    bug in torch, another definition: the suite's bf16 divides first, and its allowance is
    tight enough to tell the two apart at 3 workers."""

    def reduce_async(self, key, tensor, comm, shapes=None):
        import torch
        comm.count_dense(tensor.numel())
        half = tensor.to(torch.bfloat16).div_(comm.size)
        return compression.Pending(comm.allreduce(half), lambda: tensor.copy_(half))


class FusionBF16TorchOrder(_Broken):
    """Run with --compressor bf16."""
    id = "test-bf16-torch-order"
    BrokenCompressor = _BF16TorchOrder


class _Fails:
    """A collective's work whose wait() fails, as a peer lost mid-collective makes it."""

    def wait(self, *_args):
        raise RuntimeError("injected: connection closed by peer")

    def is_completed(self):
        return False


class ZeroGatherFails(Zero):
    """ZeRO whose second step's all-gather of its first bucket fails."""
    id = "test-zero-gather-fails"

    def _gather(self):
        super()._gather()
        if self._steps == 2:
            self._wait_gathers(self.buckets[1:])
            self.buckets[0].gather = _Fails()
            self._wait_gathers()


class HierAcrossFails(Hier):
    """hier whose second step's reduce-scatter of its first bucket fails (its across stage
    finds the failure when it waits)."""
    id = "test-hier-across-fails"

    def _across(self, b):
        if self._steps == 1 and b is self.buckets[0]:
            b.work = _Fails()
        super()._across(b)

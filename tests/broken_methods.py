"""Deliberately wrong methods: ``--verify`` must catch each of them."""
import compression
from ddlbench.strategies.allreduce import WFBP, Fusion


class _SumOnly(compression.Compressor):
    name = "sum-only"

    def reduce_async(self, key, tensor, comm, shapes=None):
        return compression.Pending(comm.allreduce(tensor), lambda: None)


class NoAverage(WFBP):
    """Sums the gradients but forgets to divide by the number of workers."""
    name = "test-no-average"

    def __init__(self, model, optimizer, comm, settings):
        super().__init__(model, optimizer, comm, dict(settings, compressor_obj=_SumOnly()))


class _Skip(compression.Compressor):
    name = "skip"

    def __init__(self, inner, skip_key):
        self.inner, self.skip_key = inner, skip_key

    def reduce_async(self, key, tensor, comm, shapes=None):
        if key == self.skip_key:
            return compression.Pending(None, lambda: None)
        return self.inner.reduce_async(key, tensor, comm, shapes)


class SkipFirstTensor(WFBP):
    """Never reduces the first parameter's gradient: every rank keeps its local one."""
    name = "test-skip-first-tensor"

    def __init__(self, model, optimizer, comm, settings):
        super().__init__(model, optimizer, comm,
                         dict(settings, compressor_obj=_Skip(compression.create("none"), (0,))))


class Crash(WFBP):
    """Fails in its first step, as a buggy method would."""
    name = "test-crash"

    def step(self):
        raise RuntimeError("test-crash: deliberate failure")


class Hang(WFBP):
    """Never finishes its first step."""
    name = "test-hang"

    def step(self):
        import time
        while True:
            time.sleep(1)


# -- broken compressors: verify with the matching --compressor must fail on each ----------------

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


class FusionTopKWithoutOffsets(Fusion):
    """Run with --compressor topk."""
    name = "test-topk-without-offsets"

    def __init__(self, model, optimizer, comm, settings):
        super().__init__(model, optimizer, comm,
                         dict(settings, compressor_obj=_TopKWithoutOffsets(settings["density"])))


class _EFTopKKeepsSent(compression.EFTopK):
    """Error feedback that forgets to take what was sent out of the residual: every sent
    value is sent again next step."""

    def encode(self, key, tensor, shapes=None):
        before = tensor + self._residual.get(key, tensor, shapes)
        values, idx = super().encode(key, tensor, shapes)
        self._residual.put(key, before)
        return values, idx


class FusionEFTopKKeepsSent(Fusion):
    """Run with --compressor eftopk."""
    name = "test-eftopk-keeps-sent"

    def __init__(self, model, optimizer, comm, settings):
        super().__init__(model, optimizer, comm,
                         dict(settings, compressor_obj=_EFTopKKeepsSent(settings["density"])))


class _PowerSGDSumsQ(compression.PowerSGD):
    """Forgets to divide the all-reduced Q by the number of workers (an exchange bug)."""

    def reduce_async(self, key, tensor, comm, shapes=None):
        class _NoDivide:
            size = 1

            def __init__(self, inner):
                self.inner = inner

            def allreduce(self, t, async_op=True):
                return self.inner.allreduce(t, async_op=async_op)

            def allgather(self, out, t, async_op=True):
                return self.inner.allgather(out, t, async_op=async_op)
        return super().reduce_async(key, tensor, _NoDivide(comm), shapes)


class FusionPowerSGDSumsQ(Fusion):
    """Run with --compressor powersgd."""
    name = "test-powersgd-sums-q"

    def __init__(self, model, optimizer, comm, settings):
        super().__init__(model, optimizer, comm,
                         dict(settings, compressor_obj=_PowerSGDSumsQ(settings["powersgd_rank"])))


class _SignumLocalOnly(compression.Signum):
    """Exchanges the packed signs but decodes only its own: no majority vote."""

    def reduce_async(self, key, tensor, comm, shapes=None):
        local = tensor.sign()
        local[local == 0] = 1
        pending = super().reduce_async(key, tensor, comm, shapes)
        return compression.Pending(pending, lambda: tensor.copy_(local))


class FusionSignumLocalOnly(Fusion):
    """Run with --compressor signum."""
    name = "test-signum-local-only"

    def __init__(self, model, optimizer, comm, settings):
        super().__init__(model, optimizer, comm,
                         dict(settings, compressor_obj=_SignumLocalOnly()))


class _PowerSGDColdStart(compression.PowerSGD):
    """Draws a fresh Q every step instead of warm-starting from the last one (a state bug:
    the first step is right, later ones drift by an amount that depends on the problem)."""

    def reduce_async(self, key, tensor, comm, shapes=None):
        self._q.clear()
        return super().reduce_async(key, tensor, comm, shapes)


class FusionPowerSGDColdStart(Fusion):
    """Run with --compressor powersgd."""
    name = "test-powersgd-cold-start"

    def __init__(self, model, optimizer, comm, settings):
        super().__init__(model, optimizer, comm,
                         dict(settings, compressor_obj=_PowerSGDColdStart(
                             settings["powersgd_rank"])))

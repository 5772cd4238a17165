"""Deliberately wrong methods: ``--verify`` must catch each of them."""
import compression
from ddlbench.strategies.allreduce import WFBP


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

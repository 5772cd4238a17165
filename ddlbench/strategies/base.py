"""The interface every synchronisation method implements.

A strategy plays the part of Horovod's ``DistributedOptimizer``: it wraps a model and a plain
torch optimizer, owns every hook and communication handle, and its ``step()`` applies one
synchronous-SGD update computed from the average of all workers' gradients.

The training loop is the same for every method::

    loss = workload.loss(strategy.module, batch)   # forward through strategy.module
    loss.backward()                                 # hooks may start communication here
    strategy.step()                                 # finish what step needs, update
    strategy.zero_grad()

``synchronize()`` finishes anything a method deliberately leaves running past ``step()`` (a
scheduler that overlaps the next forward with the tail of communication); after it, the
parameters are final. The verifier and the timer call it; the loop itself need not.
"""
from __future__ import annotations

import os
import random
import time
from typing import ClassVar

import torch
from torch import nn

from .. import compat
from ..comm import Comm


def given_compressor(settings: dict):
    """The compressor a method was given, or None for ``none``: for methods that send dense
    gradients their own way (DDP's all-reduce, ByteScheduler's chunks) unless compressing."""
    compressor = settings.get("compressor_obj")
    return compressor if compressor is not None and compressor.name != "none" else None


class Strategy:
    name: ClassVar[str] = ""
    display: ClassVar[str] = ""
    architecture: ClassVar[str] = "a2a"
    # A method that takes a compressor says what its buckets are with ``groups()`` (parameter
    # indices, or (index, start, end) slices): --verify asks before each step, or after it
    # when this is True (a method that decides them during backward, as DDP does).
    groups_after_step: ClassVar[bool] = False

    def __init__(self, model: nn.Module, optimizer: torch.optim.Optimizer, comm: Comm,
                 settings: dict):
        self.model = model
        self.optimizer = optimizer
        self.comm = comm
        self.settings = settings
        self.params = [p for p in model.parameters() if p.requires_grad]
        self._handles = []
        self._jitter = _test_jitter(comm.rank)

    @property
    def module(self) -> nn.Module:
        """What the training loop calls forward on (DDP returns its wrapper)."""
        return self.model

    def calibrate(self, forward_backward) -> None:
        """Called once before training with a function that runs one forward and backward
        pass on this rank's batch (no update). Methods that plan from measurements (MG-WFBP's
        per-tensor backward times) measure here; every rank calls it, so collectives are fine.
        Gradients are cleared afterwards by the caller."""

    def step(self) -> None:
        raise NotImplementedError

    def synchronize(self) -> None:
        """Finish all outstanding communication and updates."""

    def zero_grad(self) -> None:
        self.optimizer.zero_grad(set_to_none=True)

    def describe(self) -> dict:
        """Settings and derived facts (groups, buffer sizes) for the run record."""
        return {"method": self.name, "architecture": self.architecture}

    def close(self) -> None:
        for h in self._handles:
            h.remove()
        self._handles.clear()

    # -- helpers for hook-driven strategies -------------------------------------------------
    def _register_ready_hooks(self, callback) -> None:
        """Call ``callback(index)`` when parameter ``index``'s gradient is fully accumulated."""
        for i, p in enumerate(self.params):
            def hook(_p, i=i):
                if self._jitter:
                    self._jitter()
                callback(i)
            self._handles.append(compat.on_grad_ready(p, hook))


def _test_jitter(rank: int):
    """Test-only knob: DDLBENCH_TEST_HOOK_JITTER_MS=J sleeps a random 0..J ms in every gradient
    hook, differently on each rank, to shake out schedules whose collective order depends on
    timing."""
    j = float(os.environ.get("DDLBENCH_TEST_HOOK_JITTER_MS", "0") or 0)
    if j <= 0:
        return None
    rng = random.Random(1000 + rank)
    return lambda: time.sleep(rng.uniform(0, j) / 1000.0)

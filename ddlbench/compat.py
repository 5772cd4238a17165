"""Every torch-version difference the suite works around, in one place.

The suite runs on torch >= 2.1 (its own environment) and, for the real-Horovod lane, on torch
2.0.1 (``make horovod-env``; Horovod 0.28.1 does not build against newer torch). Code that
would use an API newer than 2.0 goes through here instead.
"""
from __future__ import annotations

import torch

TORCH_VERSION = tuple(int(x) for x in torch.__version__.split("+")[0].split(".")[:2])


class _AccumulatorHook:
    """The handle of a gradient-ready hook on torch 2.0: the hook sits on the parameter's
    AccumulateGrad node, which runs once the gradient has been added into ``.grad``. The node
    is kept alive here; without a reference the graph may drop it and the hook with it."""

    def __init__(self, param: torch.Tensor, fn):
        self._node = param.expand_as(param).grad_fn.next_functions[0][0]
        self._handle = self._node.register_hook(lambda *_: fn(param))

    def remove(self) -> None:
        self._handle.remove()
        self._node = None


def on_grad_ready(param: torch.Tensor, fn):
    """Call ``fn(param)`` each time ``param.grad`` has been fully accumulated in a backward
    pass; returns a handle with ``remove()``."""
    if hasattr(param, "register_post_accumulate_grad_hook"):  # torch >= 2.1
        return param.register_post_accumulate_grad_hook(fn)
    return _AccumulatorHook(param, fn)

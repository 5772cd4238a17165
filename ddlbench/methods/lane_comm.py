"""Counting a real framework's collectives through the suite's ``Comm`` (the DeepSpeed and
torchft lanes): the framework's own communication object keeps issuing them, but each
data-moving method of it is wrapped for the method's lifetime, so that every call is counted
as the suite's collectives declare them (``Comm.count``) and put on the timeline; a call of a
collective the suite does not declare, or on a group other than the whole job, is left
uncounted and named (the record's ``uncounted``). Only the framework's calls pass there: the
suite's own (the verifier's, the timing barriers) go to torch.distributed directly.

Nothing here imports torch at module level (the registry imports this package's modules).
"""
from __future__ import annotations


def tensors_in(value) -> list:
    """The tensors in ``value``: itself, or those in (nested) lists and tuples of it."""
    import torch
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, (list, tuple)):
        return [t for v in value for t in tensors_in(v)]
    return []


class CountedBackend:
    """Wraps the methods named in ``calls`` of ``backend`` (name -> (its parameters in order,
    space-separated; the suite's collective it is counted as, None: not declared; the
    parameter holding this rank's own tensor(s))): each call counted through ``Comm.count``
    on the whole job and put on the timeline, labelled ``"<lane> <name>"``; ``restore()``
    takes the wrappers off. How a call names its group, its root and whether it is
    asynchronous are the framework's (``group_size``, ``is_root``, ``is_async``: by default
    torch.distributed's keywords ``group``, ``src`` and ``async_op``)."""

    def __init__(self, backend, comm, calls: dict, lane: str):
        import torch.distributed as dist
        self.backend, self.comm, self.dist, self.calls, self.lane = (backend, comm, dist,
                                                                     calls, lane)
        self.uncounted: dict[str, list[int]] = {}
        self.names = [n for n in calls if hasattr(backend, n)]
        for name in self.names:
            setattr(backend, name, self._wrap(name, getattr(backend, name)))

    def restore(self) -> None:
        for name in self.names:
            self.backend.__dict__.pop(name, None)
        self.names = []

    def group_size(self, call: dict) -> int:
        group = call.get("group")
        return self.comm.size if group is None else self.dist.get_world_size(group)

    def is_root(self, op: str, call: dict) -> bool:
        return op != "broadcast" or self.dist.get_rank() == call.get("src")

    def is_async(self, call: dict) -> bool:
        return bool(call.get("async_op"))

    def _wrap(self, name, fn):
        params, op, arg = self.calls[name]
        params = params.split()

        def counted(*args, **kwargs):
            a = {**dict(zip(params, args)), **kwargs}
            own = tensors_in(a.get(arg))
            nbytes = sum(t.numel() * t.element_size() for t in own)
            if op is None or not own or self.group_size(a) != self.comm.size:
                calls, total = self.uncounted.get(name, [0, 0])
                self.uncounted[name] = [calls + 1, total + nbytes]
                return fn(*args, **kwargs)
            self.comm.count(op, sum(t.numel() for t in own), own[0].dtype,
                            root=self.is_root(op, a),
                            carrier="native" if op == "reduce_scatter" else None)
            return self._issue(op, nbytes, name, self.is_async(a),
                               lambda: fn(*args, **kwargs))
        return counted

    def _issue(self, op: str, nbytes: int, name: str, async_op: bool, issue):
        """Issue the call; while the timeline records, a span from now until it completes on
        the collective's row (a blocking one also a wait on the calling thread)."""
        from ..timeline import COMM, WAIT
        from .fsdp import _thread
        tl = self.comm.timeline
        if not tl.enabled:
            return issue()
        args = {"bytes": nbytes, "tensor": f"{self.lane} {name}"}
        if async_op:
            work = issue()
            return tl.comm(op, work, op, **args) if work is not None else work
        with tl.span(op, WAIT, _thread()), tl.span(op, COMM, op, **args):
            return issue()

    def describe(self) -> dict:
        """The calls left uncounted: name -> {calls, bytes}."""
        return {k: {"calls": c, "bytes": b} for k, (c, b) in self.uncounted.items()}

"""The methods of the real-BytePS lane (``--engine byteps``), on BytePS 0.2.5's own machinery.

- ``wfbpps``: ``bps.DistributedOptimizer``: each gradient push_pulled alone from BytePS's own
  gradient hook, cut into ``BYTEPS_PARTITION_BYTES`` = ``--partition-bytes`` partitions;
  ``step()`` waits for every pull;
- ``byteschedulerps``: the same workers, and servers started with
  ``BYTEPS_SERVER_ENABLE_SCHEDULE=1`` (the original's ``bytescheduler=1``: BytePS's server
  pops pending pushes by its priority rule);
- ``bspps``: after the backward pass, one ``bps.push_pull`` of all gradients flattened (one
  unit, partitioned as above).

BytePS averages (``average=True``). Each class says which BYTEPS_* settings it needs
(``byteps_settings``); ``ddlbench.runtime.byteps`` applies them before ``bps.init()``; the
servers' scheduling is the launcher's to set, and a method refuses to run against servers
that schedule otherwise. Each implements the torch engine's method of the same id, with its
options; the suite's own PS engine stays the reference (``--verify`` checks both against
single-process SGD). Nothing here may use torch APIs newer than 2.0.

The ``Comm`` gets what each step hands to BytePS (payload bytes and tensor count);
how BytePS partitions them is its own business and is not counted.
"""
from __future__ import annotations

import os

from ..errors import UsageError, say
from ..planning import DEFAULT_SERVER_RULE
from .base import BucketPlan, LaneMethod, check_one_dense_method
from .ps import (BSPPS, WFBPPS, ByteSchedulerPS, FROM_HOOKS, AFTER_BACKWARD, algorithm,
                 servers_line)

SERVER_SCHEDULE = "BYTEPS_SERVER_ENABLE_SCHEDULE"


def _bps():
    import byteps.torch as bps
    return bps


def check(args, methods: list[str], compressors: list[str], under_launcher: bool) -> None:
    """The input checks of an --engine byteps run, each a clear line."""
    from ..runtime.byteps import schedule_heap_problem
    heap = schedule_heap_problem()
    if heap:
        raise UsageError(heap)
    check_one_dense_method("byteps", methods, compressors,
                           ": BytePS reads its settings once, at bps.init()")
    from . import lookup
    for name in methods:
        cls = lookup(name, "byteps")
        cls.check_options(cls.Options.resolve({**vars(args), "nservers": None}))
    if not under_launcher and (args.nworkers or 1) > 1:
        raise UsageError("--engine byteps starts under BytePS's launcher, with its scheduler "
                         "and servers: nworkers=N engine=byteps ./byteps/byteps_launch.sh")


class _BytePSMethod(LaneMethod):
    """A method of the torch engine (``implements``) on BytePS's machinery: same id, options
    and meaning; ``byteps_settings`` are the BYTEPS_* variables it needs at ``bps.init()``;
    ``server_schedule`` the servers' BYTEPS_SERVER_ENABLE_SCHEDULE it needs."""

    engine = "byteps"
    server_schedule = False
    worker_schedule = FROM_HOOKS

    @classmethod
    def accepts(cls, compressor: str) -> str | None:
        return None if compressor == "none" else "the BytePS lane sends dense gradients"

    @classmethod
    def byteps_settings(cls, options) -> dict[str, str]:
        return {"BYTEPS_PARTITION_BYTES": str(int(options.partition_bytes))}

    @classmethod
    def check_options(cls, options) -> None:
        """One line for a setting BytePS cannot follow."""
        if options.threshold not in (0, 0.0):
            raise UsageError(f"--engine byteps runs {cls.id} with one unit per tensor "
                             f"(--threshold 0): BytePS 0.2.5 fuses nothing")

    def __init__(self, model, optimizer, comm, options=None, compressor=None, model_name=None):
        super().__init__(model, optimizer, comm, options, compressor, model_name)
        self.bps = _bps()
        wanted = "1" if self.server_schedule else "0"
        if os.environ.get(SERVER_SCHEDULE, "0") != wanted and self.comm_servers():
            raise UsageError(
                f"{self.id} on BytePS needs servers started with {SERVER_SCHEDULE}={wanted}, "
                f"and this job's have {os.environ.get(SERVER_SCHEDULE, '0')} "
                f"(byteps/byteps_launch.sh sets it from the method)")

    def comm_servers(self) -> int:
        from ..runtime import byteps
        return byteps.nservers()

    def _account(self, tensors) -> None:
        for t in tensors:
            if t is not None:
                self.comm.count("push", t.numel(), t.dtype)
                self.comm.count("pull", t.numel(), t.dtype)

    def plan(self) -> BucketPlan:
        return BucketPlan.of_params([[i] for i in range(len(self.params))], self.params)

    def describe(self) -> dict:
        import torch

        from ..runtime import byteps
        d = super().describe()
        nservers = self.comm_servers()
        d["engine"] = "byteps"
        d["algorithm"] = algorithm(self.worker_schedule, self.server_schedule, nservers,
                                   self._threshold())
        d["parameter_servers"] = servers_line(nservers)
        d["nservers"] = nservers
        d["ps_clients"] = "process"
        d["partition_bytes"] = int(self.options.partition_bytes)
        # BytePS places keys by its own hash (BYTEPS_KEY_HASH_FN), whatever --ps-placement says
        d["ps_placement"] = "BytePS's hash (BYTEPS_KEY_HASH_FN, djb2 by default)"
        d["byteps"] = {**byteps.environment(), "torch": torch.__version__,
                       "settings": byteps.recorded_settings()}
        return d

    def _threshold(self):
        return 0.0

    def library_timeline(self) -> list:
        """BytePS's own trace of the recorded steps (``--timeline PATH``): its push_pulls and
        their partitions' stages (``runtime.byteps.read_trace``)."""
        from ..runtime import byteps
        from ..timeline import ITERATION
        tl = self.comm.timeline
        if not tl.trace_file:
            return []
        steps = [e for e in tl.events if e[1] == ITERATION]
        window = (min(e[3] for e in steps), max(e[4] for e in steps)) if steps else None
        events = byteps.read_trace(window)
        if events is None:
            if self.bps.rank() == 0:
                say("ddlbench: note: BytePS traced nothing (it traces 2 timed steps or "
                    "more): the timeline has no BytePS spans")
            return []
        sizes = self._traced_bytes()
        for e in events:
            if e[0] == "push_pull" and e[5]["tensor"] in sizes:
                e[5]["bytes"] = sizes[e[5]["tensor"]]
        return events

    def _traced_bytes(self) -> dict[str, int]:
        """The bytes of each tensor this method push_pulls, by the name BytePS traces it under
        (``bps.DistributedOptimizer``'s: "Gradient." and the parameter's name)."""
        return {f"Gradient.{n}": p.numel() * p.element_size()
                for n, p in self.model.named_parameters() if p.requires_grad}


# what bspps's one flattened gradient is called in BytePS (and on its trace)
FLAT = "ddlbench.bspps"


class BytePSBSPPS(_BytePSMethod):
    implements = BSPPS
    display = "BSP-PS (one BytePS push_pull)"
    worker_schedule = AFTER_BACKWARD

    @classmethod
    def check_options(cls, options) -> None:
        if options.threshold is not None and options.threshold != float("inf"):
            raise UsageError("--engine byteps runs bspps as one unit (no --threshold): "
                             "BytePS 0.2.5 fuses nothing")

    def __init__(self, model, optimizer, comm, options=None, compressor=None, model_name=None):
        super().__init__(model, optimizer, comm, options, compressor, model_name)
        self.check_options(self.options)

    def plan(self) -> BucketPlan:
        return BucketPlan.of_params([list(range(len(self.params)))], self.params)

    def _threshold(self):
        return None

    def _traced_bytes(self) -> dict[str, int]:
        return {FLAT: sum(p.numel() * p.element_size() for p in self.params)}

    def step(self) -> None:
        import torch
        grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in self.params]
        flat = torch.cat([g.reshape(-1) for g in grads])
        self._account([flat])
        from byteps.torch.ops import push_pull_async_inplace
        self.bps.synchronize(push_pull_async_inplace(flat, average=True, name=FLAT))
        offset = 0
        for p in self.params:
            n = p.numel()
            if p.grad is None:
                p.grad = flat[offset:offset + n].view_as(p).clone()
            else:
                p.grad.copy_(flat[offset:offset + n].view_as(p))
            offset += n
        self.optimizer.step()


class BytePSWFBPPS(_BytePSMethod):
    implements = WFBPPS
    display = "WFBP-PS (BytePS)"

    def __init__(self, model, optimizer, comm, options=None, compressor=None, model_name=None):
        super().__init__(model, optimizer, comm, options, compressor, model_name)
        self.check_options(self.options)
        self.dopt = self.bps.DistributedOptimizer(
            self.optimizer, named_parameters=list(self.model.named_parameters()))

    def step(self) -> None:
        self._account([p.grad for p in self.params])
        self.dopt.step()

    def zero_grad(self) -> None:
        self.dopt.zero_grad()

    def close(self) -> None:
        super().close()
        self.dopt._handles.clear()  # nothing outstanding after step(); drop references


class BytePSByteSchedulerPS(BytePSWFBPPS):
    implements = ByteSchedulerPS
    display = "ByteScheduler-PS (BytePS server scheduling)"
    server_schedule = True

    @classmethod
    def check_options(cls, options) -> None:
        super().check_options(options)
        if options.server_rule != DEFAULT_SERVER_RULE:
            raise UsageError(f"--engine byteps runs BytePS's own server rule "
                             f"({DEFAULT_SERVER_RULE}); --server-rule {options.server_rule} "
                             f"runs on --engine torch")

    def __init__(self, model, optimizer, comm, options=None, compressor=None, model_name=None):
        super().__init__(model, optimizer, comm, options, compressor, model_name)
        from ..runtime.byteps import SCHEDULE_HEAP
        if (self.bps.rank() == 0 and self.comm_servers()
                and os.environ.get(SCHEDULE_HEAP) == "original"):
            say(SCHEDULE_NOTE)


# BytePS 0.2.5's servers, kept by BYTEPS_SERVER_SCHEDULE_HEAP=original, pop from a stale heap
# (byteps/cpu_only.patch fixes it; docs/DESIGN.md section 10): what such a run says first
SCHEDULE_NOTE = ("ddlbench: note: BYTEPS_SERVER_SCHEDULE_HEAP=original: the servers schedule "
                 "from BytePS 0.2.5's stale heap, which now and then returns a partition summed "
                 "over one worker only (scripts/byteps_schedule_repro.sh): time it, but its "
                 "--verify passes or fails by timing")

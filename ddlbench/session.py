"""One method on one rank, set up from the run's configuration (``run_config.RunConfig``): the
replica, its optimizer, the compressor, the counting ``Comm`` and the method object (shared by
the benchmark and --verify)."""
from __future__ import annotations

import inspect
import json
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import compression

from . import methods
from .errors import open_to_write
from .runtime.comm import Comm
from .measure import workload
from .timeline import COMPUTE, WAIT

if TYPE_CHECKING:
    from .run_config import RunConfig


@dataclass
class Run:
    work: object           # models.Workload
    batch: object
    optimizer: object
    lr: float
    comm: Comm
    method: methods.Method
    # what the replica and its optimizer are (None for a run built by hand, as overhead's)
    spec: workload.Spec | None = None
    optimizer_spec: workload.OptimizerSpec | None = None
    # the hooks watch() put on the optimizer and the gradients (removed by unwatch())
    hooks: list = field(default_factory=list, repr=False)

    def forward_backward(self) -> None:
        """One forward and backward pass on this rank's batch, outside the method."""
        self.work.loss(self.work.model, self.batch).backward()

    def train_step(self, zero_grad: bool = True) -> None:
        """One training step through the method (its parts on the timeline while it
        records); ``zero_grad=False`` leaves the gradients for a verifier to read."""
        tl = self.comm.timeline
        with tl.span("forward", COMPUTE):
            loss = self.work.loss(self.method.module, self.batch)
        with tl.span("backward", COMPUTE):
            loss.backward()
        with tl.span("step", WAIT):
            self.method.step()
        if zero_grad:
            self.method.zero_grad()

    def watch(self, config: RunConfig) -> "Run":
        """Put on the timeline what the options ask: at most ``--timeline-iters`` steps, the
        optimizer's steps and, with a trace file, each gradient's ready instant. The hooks stay
        until ``unwatch()``; as a context manager (``with run.watch(config):``) the run removes
        them at the block's end."""
        tl = self.comm.timeline
        tl.limit = config.timeline_iters
        # the optimizer the method steps (a sharding method's own, over its shards)
        self.hooks += tl.watch_optimizer(self.method.optimizer)
        if config.timeline:
            self.hooks += tl.watch_gradients(self.work.model)
        return self

    def unwatch(self) -> None:
        """Remove the hooks ``watch`` registered (again: nothing)."""
        while self.hooks:
            self.hooks.pop().remove()

    def __enter__(self) -> "Run":
        return self

    def __exit__(self, *exc) -> bool:
        self.unwatch()
        return False

    def servers_recorded(self, config: RunConfig, ctx) -> bool:
        """Whether the parameter servers record too (``--timeline PATH`` with a PS method):
        their receives, sums and sends are rows of the trace, from the start of the recorded
        steps to their end (servers know no iterations, so ``--timeline-iters N`` limits the
        workers only). Nothing changes on the wire without it. (A job on one machine has no
        server to record.)"""
        return (bool(config.timeline) and ctx.ps is not None and ctx.nservers > 0
                and config.timeline_iters != 0 and self.method.architecture == methods.PS)

    def calibrate(self) -> None:
        """The method's calibration (MG-WFBP measures here), leaving no gradient and no count
        behind."""
        self.method.calibrate(self.forward_backward)
        self.optimizer.zero_grad(set_to_none=True)
        self.comm.reset_stats()

    def write_trace(self, prefix: str | None, name: str) -> None:
        """``--trace-collectives PREFIX``: this rank's sequence of collectives, as JSON."""
        if prefix and self.comm.trace is not None:
            path = f"{prefix}.{name.replace(':', '_')}.{self.comm.rank}.json"
            with open_to_write(path) as f:     # its folders made, as --output's
                json.dump(self.comm.trace, f)


def build(config: RunConfig, ctx, method_id: str, compressor_id: str) -> Run:
    """The run of ``method_id`` (one of ``config``'s methods) with ``compressor_id`` on this
    rank, not yet started (use it as ``with run.method:``)."""
    cls = methods.lookup(method_id, config.engine)
    spec, optimizer_spec = config.spec, config.optimizer
    work, batch = workload.replica(spec, ctx)
    lr = workload.learning_rate(optimizer_spec, ctx.size)
    optimizer = workload.make_optimizer(optimizer_spec, work.model.parameters(), lr)
    comm = Comm(ctx.rank, ctx.size, trace=bool(config.trace_collectives), ps=ctx.ps,
                trace_file=bool(config.timeline), groups=getattr(ctx, "groups", None))
    compressor = compression.create(compressor_id, **config.compressor_options)
    # a method whose constructor takes ``batch_size`` (a framework that wants it: DeepSpeed's
    # config) gets the batch per worker
    extra = ({"batch_size": spec.batch_size}
             if "batch_size" in inspect.signature(cls.__init__).parameters else {})
    method = cls(work.model, optimizer, comm, config.options[method_id], compressor,
                 model_name=spec.model, **extra)
    return Run(work, batch, optimizer, lr, comm, method, spec, optimizer_spec)

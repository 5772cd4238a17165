"""Parameter-server methods (docs/DESIGN.md sections 2 and 6): BSP-PS, WFBP-PS, ByteScheduler-PS.

Gradients are grouped into units in backward order by a fusion threshold in bytes (BytePS-like
semantics: ``bspps`` defaults to 536,870,912, one unit for any model the suite has, pushed after
the whole backward; ``wfbpps`` defaults to 0, one unit per tensor, pushed from its gradient hook
the moment it is ready; ``--threshold`` overrides either). Each unit is cut into
``--partition-bytes`` partitions, pushed to their servers and pulled back summed
(``ddlbench.runtime.ps``); ``step()`` waits for the pulls, divides by the number of workers and applies
the optimizer.

Unlike all-reduce, nothing here needs the workers to agree on an order: a server matches pushes
by key, so each worker pushes a unit as soon as it is complete on that worker. The units are
planned once, in reverse registration order (the order autograd usually produces gradients),
and must be the same on every worker because the servers hold one buffer per partition; they
are not re-planned from observed order as the all-reduce methods' buckets are.
"""
from __future__ import annotations

from dataclasses import dataclass

from ..errors import UsageError
from ..model import rules
from ..options import COUNT, Options, count_at_least, one_of, option
from ..planning import (BSP_PS_THRESHOLD, DEFAULT_PARTITION_BYTES, DEFAULT_PS_CLIENTS,
                        PS_CLIENTS)
from ..timeline import tensors_label
from . import threads
from .allreduce import BSPA2A, WFBP, Bucket, GradViews, threshold_option
from .base import PS, BucketPlan, Method
from .bytescheduler import ByteScheduler, credit_option



def nservers_option():
    return option(None, COUNT, "parameter servers, extra processes that only sum (ranks after "
                  "the workers); default for a PS method on one machine: 1 per 4 workers",
                  env="DMLC_NUM_SERVER")


def ps_clients_option():
    return option(DEFAULT_PS_CLIENTS, PS_CLIENTS_KIND, "who pushes to the parameter servers: machine (the "
                  "workers of a machine sum locally and one of them pushes, as BytePS) or "
                  "process (every worker pushes)", env="DDLBENCH_PS_CLIENTS")


PS_CLIENTS_KIND = one_of(*PS_CLIENTS)


# Below this every push is a handful of elements: the run crawls (messages per iteration =
# gradient bytes / partition, each a round trip to a server).
PARTITION_BYTES = count_at_least(4096, "bytes")


def partition_bytes_option():
    return option(DEFAULT_PARTITION_BYTES, PARTITION_BYTES,
                  "parameter server: partition size in bytes (BytePS's 4,096,000)")


@dataclass(frozen=True)
class BSPPSOptions(Options):
    threshold: float = threshold_option(float(BSP_PS_THRESHOLD), "PS fusion threshold in bytes")
    nservers: int | None = nservers_option()
    partition_bytes: int = partition_bytes_option()
    ps_clients: str = ps_clients_option()


@dataclass(frozen=True)
class WFBPPSOptions(Options):
    threshold: float = threshold_option(0.0, "PS fusion threshold in bytes (0: one unit per "
                                        "tensor)")
    nservers: int | None = nservers_option()
    partition_bytes: int = partition_bytes_option()
    ps_clients: str = ps_clients_option()


SWITCH = one_of("1", "0")


@dataclass(frozen=True)
class ByteSchedulerPSOptions(Options):
    server_schedule: str = option(
        "1", SWITCH, "1: servers sum pending pushes in priority order, front layers first "
        "(BytePS's server scheduling, what the original's bytescheduler=1 switched on); 0: "
        "in arrival order, only the workers' credit window schedules",
        env="BYTEPS_SERVER_ENABLE_SCHEDULE")
    credit: int = credit_option()
    nservers: int | None = nservers_option()
    partition_bytes: int = partition_bytes_option()
    ps_clients: str = ps_clients_option()


def ps_clients(client) -> dict:
    """The record's account of who pushed: per machine or per process, and the pushers (as
    rank 0, always one of them, knows them)."""
    pushers = client.pushers
    return {"ps_clients": client.clients, "pushers": pushers,
            "pushes_per_partition": len(pushers) if pushers is not None else None}


def require_servers(name: str, comm) -> None:
    if comm.ps is None:
        raise UsageError(f"method {name} needs parameter servers: start the job with "
                         f"--nservers S (S >= 1 extra processes)")


class BucketedPS(threads.HandsOver, GradViews, Method):
    """Units pushed whole (in partitions) and pulled back summed; the gradients of a unit of
    several tensors are views into its buffer (``GradViews``), so the pulled sums land in
    them. A hook hands a complete unit to the method's communication thread
    (``threads.Issuer``), which posts its pushes and pulls; the step waits for it, then
    pushes what no hook completed (all of BSP-PS's units)."""
    architecture = PS
    launcher = "byteps/byteps_launch.sh"
    overlap = True

    def __init__(self, model, optimizer, comm, options=None, compressor=None, model_name=None):
        from ..planning import plan_buckets
        super().__init__(model, optimizer, comm, options, compressor, model_name)
        require_servers(self.id, comm)
        self.threshold = float(self.options.threshold)
        order = list(reversed(range(len(self.params))))
        nbytes = [self.params[i].numel() * self.params[i].element_size() for i in order]
        keys = [(self.params[i].dtype, self.params[i].device) for i in order]
        groups = [[order[j] for j in g] for g in plan_buckets(nbytes, self.threshold, keys)]
        self.buckets = [Bucket(self.params, g) for g in groups]
        self.unit_of = {i: u for u, b in enumerate(self.buckets) for i in b.members}
        self.parts = comm.ps.open([(b.numel, b.params[0].dtype) for b in self.buckets])
        self._launched: set[int] = set()
        self._adopt_views()
        self._watch_grads()
        self._issuer = None
        if self.overlap:
            device = self.params[0].device if self.params else None
            self._issuer = threads.Issuer(f"{self.id or 'ps'}-issue", self._launch,
                                          describe=self._unit_name, device=device)
            self._register_ready_hooks(self._on_ready)

    def _unit_name(self, u: int) -> str:
        names = [self.param_names[i] for i in self.buckets[u].members]
        return f"unit {u} ({tensors_label(names)})"

    def _on_ready(self, i: int) -> None:
        u = self.unit_of[i]
        b = self.buckets[u]
        b.ready += 1
        if b.ready == len(b.members):
            self._launched.add(u)
            self._issuer.hand(u)

    def _launch(self, u: int) -> None:
        b = self.buckets[u]
        self._launched.add(u)
        b.flat = flat = b.pack()
        b.pending = [self.comm.push_pull(part, flat[part.start:part.end])
                     for part in self.parts[u]]

    def _finish(self, b: Bucket) -> int | None:
        """Wait for the unit's pulls, average it in place; the parameter whose gradient was
        replaced after the unit was packed, if any."""
        for h in b.pending:
            h.wait()
        if self.comm.size > 1:
            b.flat.div_(self.comm.size)
        return b.settle()

    def step(self) -> None:
        if self._issuer is not None:
            self._issuer.drain()
        if self._foreign is not None:
            self._settle_in_flight()  # the others are not pushed
            self._launched.clear()
            self._refuse_replaced(self._foreign, "before backward")
        for u in range(len(self.buckets)):
            if u not in self._launched:
                self._launch(u)
        replaced = self._finish_all()
        self._launched.clear()
        if replaced is not None:
            self._refuse_replaced(replaced, "after its unit was pushed")
        self.optimizer.step()

    def plan(self) -> BucketPlan:
        return BucketPlan.of_params([b.members for b in self.buckets], self.params)

    def describe(self) -> dict:
        d = super().describe()
        parts = [p for unit in self.parts for p in unit]
        per_server = [0] * self.comm.ps.nservers
        for p, b in ((p, self.buckets[p.unit]) for p in parts):
            per_server[p.server] += p.numel * b.params[0].element_size()
        d.update({
            "threshold_bytes": self.threshold if self.threshold != float("inf") else None,
            "units": len(self.buckets),
            "unit_bytes": [b.nbytes for b in self.buckets],
            **ps_clients(self.comm.ps),
            "nservers": self.comm.ps.nservers,
            "partition_bytes": self.comm.ps.partition_bytes,
            "partitions": len(parts),
            "bytes_per_server": per_server,
            "compressor": "none",
        })
        return d

    def close(self) -> None:
        try:
            super().close()
        finally:
            self.comm.ps.close()


class BSPPS(BucketedPS):
    id = "bspps"
    display = "BSP-PS"
    summary = ("after the whole backward, the fused gradient (one unit up to `--threshold` "
               "bytes) is pushed to the parameter servers in `--partition-bytes` partitions "
               "and the sums pulled back")
    Options = BSPPSOptions
    overlap = False
    # BytePS with one worker machine runs no server: a local all-reduce (its docs'
    # best-practice.md; the original's launch.sh: DMLC_NUM_WORKER = nworkers/4)
    model = rules.Rule(grouping=rules.buckets(BSP_PS_THRESHOLD), after_backward=True,
                       fixed={"threshold": float(BSP_PS_THRESHOLD)}, one_machine=BSPA2A.id)
    hatch = "///"


class WFBPPS(BucketedPS):
    id = "wfbpps"
    display = "WFBP-PS"
    summary = ("each gradient pushed from its hook the moment it is ready (`--threshold` "
               "fuses)")
    Options = WFBPPSOptions
    overlap = True
    model = rules.Rule(grouping=rules.buckets(0.0), one_machine=WFBP.id)
    hatch = "\\\\\\"


class ByteSchedulerPS(ByteScheduler):
    """ByteScheduler over the parameter servers (docs/DESIGN.md sections 5 and 6).

    The A2A scheduler's partition + priority + credit rules, per-tensor updates and forward
    pre-hooks, with two differences that the transport allows or needs:

    - **No negotiation.** Servers match pushes by key, so every worker dispatches by its own
      readiness; nothing is broadcast.
    - **Credit returns when the server has taken a push**, not when the sum comes back (as in
      BytePS, whose server acknowledges a push on receipt). Returning it on the pull would
      deadlock under jitter: worker A could hold its window on chunks that worker B, whose
      window holds others, has not pushed yet.

    Chunks are the PS partitions: each tensor is cut into ``--partition-bytes`` pieces (the
    unit a server sums), so ``--partition`` (A2A, in elements) does not apply here;
    ``--credit`` is in elements as for the A2A scheduler.
    """
    id = "byteschedulerps"
    display = "ByteScheduler-PS"
    summary = ("the ByteScheduler rules (priority, `--credit` window, per-layer update, next "
               "forward overlapping) over push/pull of `--partition-bytes` partitions; the "
               "servers sum pending pushes front layers first (`--server-schedule`)")
    architecture = PS
    Options = ByteSchedulerPSOptions
    launcher = "byteps/byteps_launch.sh"
    launcher_vars = {"bytescheduler": "1"}
    model = rules.Rule(scheduler=True, advise=rules.credit_grid, one_machine=ByteScheduler.id)
    hatch = "++"
    negotiated = False
    credit_on_completion = False

    @classmethod
    def accepts(cls, compressor: str) -> str | None:
        return Method.accepts(compressor)

    def __init__(self, model, optimizer, comm, options=None, compressor=None, model_name=None):
        require_servers(self.id, comm)
        super().__init__(model, optimizer, comm, options, compressor, model_name)
        self._credit = threads.QueueWorker("bytescheduler-credit", self._return_credit,
                                           on_error=self._failed)

    def start(self) -> None:
        super().start()
        self._credit.start()

    def _partition(self) -> int:
        from ..runtime import ps
        size = self.params[0].element_size() if self.params else 4
        return ps.partition_elements(self.comm.ps.partition_bytes, size)

    def _chunk_table(self) -> list[tuple[int, int, int]]:
        # Keys in registration order, front layers first: the servers' priority order.
        self.parts = self.comm.ps.open([(p.numel(), p.dtype) for p in self.params],
                                       schedule=self.options.server_schedule == "1")
        self._part_of = [p for unit in self.parts for p in unit]
        return [(p.unit, p.start, p.end) for p in self._part_of]

    def _start_chunk(self, chunk: int, data):
        handle = self.comm.push_pull(self._part_of[chunk], data)
        self._credit.put((chunk, handle))
        return handle

    def _return_credit(self, item) -> None:
        chunk, handle = item
        handle.wait_push()
        with self._cv:
            self.window.done(chunk)
            self._cv.notify_all()

    def describe(self) -> dict:
        d = super().describe()
        d.pop("negotiation_messages_per_iteration", None)
        d.pop("negotiation_bytes_per_iteration", None)
        d.update({
            "order_agreement": "none needed: servers match pushes by key",
            "credit_returned": "when the server has taken the push",
            "server_schedule": ("pending pushes summed in priority order (lowest key: front "
                                "layers first)" if self.options.server_schedule == "1"
                                else "arrival order"),
            **ps_clients(self.comm.ps),
            "nservers": self.comm.ps.nservers,
            "partition_bytes": self.comm.ps.partition_bytes,
            "partitions": len(self._part_of),
        })
        return d

    def close(self) -> None:
        try:
            super().close()
        finally:
            try:
                self._credit.stop()
            finally:
                self.comm.ps.close()

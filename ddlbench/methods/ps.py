"""Parameter-server methods (docs/DESIGN.md sections 2 and 6): BSP-PS, WFBP-PS, ByteScheduler-PS
(the original's: WFBP-PS workers, servers scheduling by priority) and the suite's worker-side
ByteScheduler over push/pull (``byteschedulerps-worker``).

Gradients are grouped into units in backward order by a fusion threshold in bytes (BytePS-like
semantics: ``bspps`` has none by default, every gradient in one unit whatever the model's size,
pushed after the whole backward; ``wfbpps`` and ``byteschedulerps`` default to 0, one unit per
tensor, pushed from its gradient hook the moment it is ready; ``--threshold`` overrides any).
Each unit is cut into
``--partition-bytes`` partitions, pushed to their servers and pulled back summed
(``ddlbench.runtime.ps``); ``step()`` waits for the pulls, divides by the number of workers and applies
the optimizer.

On one machine (the job's workers on one host, ``--ps-force-servers`` not given) there is no
server: the transport is a local reduce and broadcast (``ddlbench.runtime.ps.LocalReduce``), as
BytePS ran with one worker machine; the methods are the same.

Unlike all-reduce, nothing here needs the workers to agree on an order: a server matches pushes
by key, so each worker pushes a unit as soon as it is complete on that worker. The units are
planned once, in reverse registration order (the order autograd usually produces gradients),
and must be the same on every worker because the servers hold one buffer per partition; they
are not re-planned from observed order as the all-reduce methods' buckets are.
"""
from __future__ import annotations

from dataclasses import dataclass

from ..errors import UsageError
from ..options import COUNT, Options, count_at_least, one_of, option
from ..planning import (DEFAULT_ENGINE_THREADS, DEFAULT_PARTITION_BYTES, DEFAULT_PS_CLIENTS,
                        DEFAULT_PS_PLACEMENT, DEFAULT_SERVER_RULE, PS_CLIENTS, PS_PLACEMENTS,
                        SERVER_RULES)
from ..timeline import tensors_label
from . import rules, threads
from .allreduce import BSPA2A, WFBP, Bucket, GradViews, threshold_option
from .base import PS, BucketPlan, Method
from .bytescheduler import ByteScheduler, credit_option



def nservers_option():
    return option(None, COUNT, "parameter servers, extra processes that only sum (ranks after "
                  "the workers); default: one per worker machine, none when the workers are "
                  "on one machine (a local reduce and broadcast, as BytePS; "
                  "--ps-force-servers: 1 per 4 workers there)", env="DMLC_NUM_SERVER")


def ps_clients_option():
    return option(DEFAULT_PS_CLIENTS, PS_CLIENTS_KIND, "who pushes to the parameter servers: machine (the "
                  "workers of a machine sum locally and one of them pushes, as BytePS) or "
                  "process (every worker pushes)", env="DDLBENCH_PS_CLIENTS")


PS_CLIENTS_KIND = one_of(*PS_CLIENTS)
PS_PLACEMENT_KIND = one_of(*PS_PLACEMENTS)
SERVER_RULE_KIND = one_of(*SERVER_RULES)


def ps_placement_option():
    return option(DEFAULT_PS_PLACEMENT, PS_PLACEMENT_KIND, "which server holds a partition: "
                  "least-loaded (each key, in key order, on the server with the fewest bytes "
                  "so far) or key-mod (server key mod S, the original's kind of rule; BytePS "
                  "hashes the key); the torch engine's (BytePS places by its own hash)",
                  env="DDLBENCH_PS_PLACEMENT")


def server_rule_option():
    return option(DEFAULT_SERVER_RULE, SERVER_RULE_KIND, "how a server picks the next pending "
                  "push: fewest-pushes (BytePS 0.2.x's: the key with the fewest pushes of its "
                  "round received first, ties by arrival; keys in sorted parameter-name order, "
                  "as the original declared them) or lowest-key (the suite's earlier rule: keys "
                  "front layers first, the lowest first)", env="DDLBENCH_SERVER_RULE")


def engine_threads_option():
    return option(DEFAULT_ENGINE_THREADS, COUNT, "a scheduling server's summing threads, each "
                  "with its own queue (BytePS's engine threads; the original set 8)",
                  env="BYTEPS_SERVER_ENGINE_THREAD")


# Below this every push is a handful of elements: the run crawls (messages per iteration =
# gradient bytes / partition, each a round trip to a server).
PARTITION_BYTES = count_at_least(4096, "bytes")


def partition_bytes_option():
    return option(DEFAULT_PARTITION_BYTES, PARTITION_BYTES,
                  "parameter server: partition size in bytes (BytePS's 4,096,000)")


@dataclass(frozen=True)
class BSPPSOptions(Options):
    threshold: float | None = threshold_option(None, "PS fusion threshold in bytes (default "
                                               "none: every gradient in one unit)")
    nservers: int | None = nservers_option()
    partition_bytes: int = partition_bytes_option()
    ps_clients: str = ps_clients_option()
    ps_placement: str = ps_placement_option()


@dataclass(frozen=True)
class WFBPPSOptions(Options):
    threshold: float = threshold_option(0.0, "PS fusion threshold in bytes (0: one unit per "
                                        "tensor)")
    nservers: int | None = nservers_option()
    partition_bytes: int = partition_bytes_option()
    ps_clients: str = ps_clients_option()
    ps_placement: str = ps_placement_option()


@dataclass(frozen=True)
class ByteSchedulerPSOptions(WFBPPSOptions):
    server_rule: str = server_rule_option()
    engine_threads: int = engine_threads_option()


SWITCH = one_of("1", "0")


@dataclass(frozen=True)
class ByteSchedulerWorkerOptions(Options):
    server_schedule: str = option(
        "1", SWITCH, "1: servers sum pending pushes in priority order, the lowest key "
        "(front layers) first (the suite's lowest-key rule, switched as BytePS's server "
        "scheduling); 0: in arrival order, only the workers' credit window schedules", env="BYTEPS_SERVER_ENABLE_SCHEDULE")
    credit: int = credit_option()
    nservers: int | None = nservers_option()
    partition_bytes: int = partition_bytes_option()
    ps_clients: str = ps_clients_option()
    ps_placement: str = ps_placement_option()


# The record's ``algorithm`` (what a PS run did, in the terms the original's runs are compared
# in): how the workers push, how the servers sum, how many servers, the fusion threshold.
AFTER_BACKWARD = "after_backward"   # every unit pushed once the whole backward is done
FROM_HOOKS = "from_hooks"           # a unit pushed from the hook that completes it; step()
#                                     waits for every pull; no credit window
WORKER_SCHEDULER = "bytescheduler"  # priority + credit window, per-layer update, next forward
#                                     overlapping the pulls
NO_SERVERS = "none (one machine: local reduce and broadcast, as BytePS)"


def algorithm(worker_schedule: str, server_schedule: bool, nservers: int,
              threshold: float | None) -> dict:
    """The record's ``algorithm`` of a PS run: ``servers`` 0 is a run without any (one
    machine), whose ``server_schedule`` is then None; ``threshold_bytes`` None: no threshold
    (every gradient in one unit, or, for the worker-side scheduler, none applies)."""
    if threshold is not None and threshold == float("inf"):
        threshold = None
    return {"worker_schedule": worker_schedule,
            "server_schedule": (None if not nservers else
                                "priority" if server_schedule else "arrival"),
            "servers": nservers,
            "threshold_bytes": None if threshold is None else int(threshold)}


# What the record says of a scheduling server's rule and of the keys' order under it.
RULE_WORDS = {
    "fewest-pushes": "fewest-pushes: the key with the fewest pushes of its round received "
                     "first, ties by arrival (BytePS 0.2.x's server/queue.h)",
    "lowest-key": "lowest-key: the lowest key first, ties by arrival (the suite's own rule)"}
KEY_ORDER_WORDS = {"fewest-pushes": "sorted parameter names (as the original declared them "
                                    "to BytePS)",
                   "lowest-key": "model.parameters() order, front layers first"}


def per_server_bytes(parts, params, nservers: int) -> list[int]:
    """The bytes of each server's partitions (``parts``' ``unit`` indexes ``params``)."""
    out = [0] * nservers
    for p in parts if nservers else ():
        out[p.server] += p.numel * params[p.unit].element_size()
    return out


def servers_line(nservers: int) -> str:
    """What the record's ``parameter_servers`` and the log say of the servers."""
    return str(nservers) if nservers else NO_SERVERS


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
    pushes what no hook completed (all of BSP-PS's units).

    ``server_schedule``: the servers sum pending pushes by a rule (BytePS's
    ``BYTEPS_SERVER_ENABLE_SCHEDULE=1``; the rule is the options' ``server_rule``); the
    units' keys are then numbered as that rule wants them (``key_order``), else in the order
    the units are pushed. The keys are placed on the servers by ``--ps-placement``."""
    architecture = PS
    launcher = "byteps/byteps_launch.sh"
    overlap = True
    worker_schedule = FROM_HOOKS
    server_schedule = False
    # the model pushes the units this class's fusion_threshold gives, as the method does
    rule = rules.Rule(grouping=rules.fused, one_machine=WFBP.id)

    @classmethod
    def fusion_threshold(cls, options, nbytes: list[int]) -> float:
        """The bytes a unit holds at most (``planning.plan_buckets``), from the method's
        ``options`` (no threshold: every gradient in one unit) and its gradients' bytes; the
        method plans its units with it and the model's rule (``rules.fused``) calls it.
        Torch-free."""
        return float("inf") if options.threshold is None else float(options.threshold)

    def __init__(self, model, optimizer, comm, options=None, compressor=None, model_name=None):
        from ..planning import plan_buckets
        super().__init__(model, optimizer, comm, options, compressor, model_name)
        require_servers(self.id, comm)
        order = list(reversed(range(len(self.params))))
        nbytes = [self.params[i].numel() * self.params[i].element_size() for i in order]
        self.threshold = float(self.fusion_threshold(self.options, nbytes))
        keys = [(self.params[i].dtype, self.params[i].device) for i in order]
        groups = [[order[j] for j in g] for g in plan_buckets(nbytes, self.threshold, keys)]
        self.buckets = [Bucket(self.params, g) for g in groups]
        self.unit_of = {i: u for u, b in enumerate(self.buckets) for i in b.members}
        self.parts = self._open(comm.ps)
        self._launched: set[int] = set()
        self._adopt_views()
        self._watch_grads()
        self._issuer = None
        if self.overlap:
            device = self.params[0].device if self.params else None
            self._issuer = threads.Issuer(f"{self.id or 'ps'}-issue", self._launch,
                                          describe=self._unit_name, device=device)
            self._register_ready_hooks(self._on_ready)

    def _open(self, client) -> list:
        """The session's partitions of each unit (in ``self.buckets``' order), the units
        opened (so keyed and placed) in ``key_order``."""
        from dataclasses import replace
        units = [(b.numel, b.params[0].dtype) for b in self.buckets]
        names = [[self.param_names[i] for i in b.members] for b in self.buckets]
        order = self.key_order(self.options, names)
        rule = self.server_rule(self.options)
        extra = {} if rule is None else {"schedule": rule,
                                         "engine_threads": self.engine_threads(self.options)}
        opened = client.open([units[u] for u in order], placement=self.options.ps_placement,
                             **extra)
        parts: list = [None] * len(units)
        for pos, u in enumerate(order):
            parts[u] = [replace(p, unit=u) for p in opened[pos]]
        return parts

    @classmethod
    def server_rule(cls, options) -> str | None:
        """The servers' rule (``planning.SERVER_RULES``); None: they sum in arrival order."""
        if not cls.server_schedule:
            return None
        return getattr(options, "server_rule", DEFAULT_SERVER_RULE)

    @classmethod
    def engine_threads(cls, options) -> int:
        return int(getattr(options, "engine_threads", 1))

    @classmethod
    def key_order(cls, options, names: list[list[str]]) -> list[int]:
        """The units (given in push order, backward: their tensors' ``names`` each) in the
        order their keys are numbered: push order without server scheduling; with it, as the
        rule wants them: ``lowest-key``, front layers first (the reverse); ``fewest-pushes``,
        BytePS's, the sorted parameter names, as the original declared its tensors to BytePS
        (``for name in sorted(...)``; a fused unit by its first name). Torch-free: the model
        numbers its keys with it."""
        n = len(names)
        rule = cls.server_rule(options)
        if rule is None:
            return list(range(n))
        if rule == SERVER_RULES[1]:
            return list(range(n))[::-1]
        return sorted(range(n), key=lambda u: min(names[u]) if names[u] else "")

    @classmethod
    def algorithm(cls, options, nservers: int) -> dict:
        """The record's ``algorithm`` of this method with ``options`` and ``nservers``."""
        return algorithm(cls.worker_schedule, cls.server_schedule, nservers, options.threshold)

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
        nservers = self.comm.ps.nservers
        per_server = [0] * nservers
        for b, unit in zip(self.buckets, self.parts):
            for p in unit if nservers else ():
                per_server[p.server] += p.numel * b.params[0].element_size()
        d.update({
            "algorithm": self.algorithm(self.options, nservers),
            "parameter_servers": servers_line(nservers),
            "threshold_bytes": self.threshold if self.threshold != float("inf") else None,
            "units": len(self.buckets),
            "unit_bytes": [b.nbytes for b in self.buckets],
            **ps_clients(self.comm.ps),
            "nservers": nservers,
            "partition_bytes": self.comm.ps.partition_bytes,
            "partitions": len(parts),
            "bytes_per_server": per_server,
            "ps_placement": self.options.ps_placement,
            "compressor": "none",
        })
        rule = self.server_rule(self.options)
        if rule is not None and nservers:
            d.update({"server_rule": RULE_WORDS[rule],
                      "engine_threads": self.engine_threads(self.options),
                      "key_order": KEY_ORDER_WORDS[rule]})
        return d

    def close(self) -> None:
        try:
            super().close()
        finally:
            self.comm.ps.close()


class BSPPS(BucketedPS):
    id = "bspps"
    display = "BSP-PS"
    summary = ("after the whole backward, the fused gradient (one unit; `--threshold` bytes "
               "cuts it) is pushed to the parameter servers in `--partition-bytes` partitions "
               "and the sums pulled back")
    Options = BSPPSOptions
    overlap = False
    worker_schedule = AFTER_BACKWARD
    # BSP is one unit by definition (the original's BSP-PS fused up to 536870912 elements,
    # more than any model it ran). BytePS with one worker machine runs no server: a local
    # all-reduce (its docs' best-practice.md; the original's launch.sh: DMLC_NUM_WORKER =
    # nworkers/4).
    rule = rules.Rule(grouping=rules.fused, after_backward=True, one_machine=BSPA2A.id)
    hatch = "///"


class WFBPPS(BucketedPS):
    id = "wfbpps"
    display = "WFBP-PS"
    summary = ("each gradient pushed from its hook the moment it is ready (`--threshold` "
               "fuses)")
    Options = WFBPPSOptions
    overlap = True
    hatch = "\\\\\\"


class ByteSchedulerPS(WFBPPS):
    """ByteScheduler-PS as the original ran it: its ``bytescheduler=1`` on ``byteps/launch.sh``
    only set ``BYTEPS_SERVER_ENABLE_SCHEDULE=1``, and its workers ran the WFBP-PS script. So
    the workers are WFBP-PS's (one push per tensor from its hook, ``step()`` waits for every
    pull: no credit window, no worker-side partitioning or priority, no next forward
    overlapping the pulls), and the servers sum pending pushes by BytePS 0.2.x's rule
    (``--server-rule fewest-pushes``, the default: the key with the fewest pushes of its round
    received first, ties by arrival, over ``--engine-threads`` summing threads; keys in sorted
    parameter-name order) or the suite's earlier one (``lowest-key``: front layers first)
    (``ddlbench.runtime.ps.PrioritySummer``). On one machine (no server) it is WFBP-PS.
    The worker-side ByteScheduler over push/pull is ``byteschedulerps-worker``."""
    id = "byteschedulerps"
    display = "ByteScheduler-PS"
    summary = ("the original's: WFBP-PS workers (each gradient pushed from its hook, no "
               "credit window) and servers that sum pending pushes by BytePS's rule, fewest "
               "pushes first (`--server-rule`; BytePS's server-side scheduling)")
    Options = ByteSchedulerPSOptions
    launcher_vars = {"bytescheduler": "1"}   # (its options: WFBP-PS's and the servers')
    server_schedule = True
    # The model has no server-side priority: it replays the workers' schedule (WFBP-PS's
    # rule, inherited).
    hatch = "++"


class ByteSchedulerPSWorker(ByteScheduler):
    """The suite's worker-side ByteScheduler over the parameter servers (docs/DESIGN.md
    sections 5 and 6); an addition, not the survey's ByteScheduler-PS (``byteschedulerps``).

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
    id = "byteschedulerps-worker"
    display = "ByteScheduler-PS (worker-side)"
    summary = ("the suite's addition: the ByteScheduler rules (priority, `--credit` window, "
               "per-layer update, next forward overlapping) over push/pull of "
               "`--partition-bytes` partitions; the servers sum pending pushes front layers "
               "first (`--server-schedule`)")
    architecture = PS
    Options = ByteSchedulerWorkerOptions
    launcher = "byteps/byteps_launch.sh"
    rule = rules.Rule(scheduler=True, advise=rules.credit_grid, one_machine=ByteScheduler.id)
    hatch = "xx"
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
        # Keys in registration order, front layers first: the servers' priority order (the
        # suite's lowest-key rule, on one summing thread).
        scheduled = self.options.server_schedule == "1"
        self.parts = self.comm.ps.open([(p.numel(), p.dtype) for p in self.params],
                                       schedule=SERVER_RULES[1] if scheduled else None,
                                       placement=self.options.ps_placement, engine_threads=1)
        self._part_of = [p for unit in self.parts for p in unit]
        return [(p.unit, p.start, p.end) for p in self._part_of]

    def _transport_average(self):
        return None  # the servers sum; the completer divides

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

    @classmethod
    def algorithm(cls, options, nservers: int) -> dict:
        """The record's ``algorithm`` of this method with ``options`` and ``nservers``."""
        return algorithm(WORKER_SCHEDULER, options.server_schedule == "1", nservers, None)

    def describe(self) -> dict:
        d = super().describe()
        d.pop("negotiation_messages_per_iteration", None)
        d.pop("negotiation_bytes_per_iteration", None)
        nservers = self.comm.ps.nservers
        d.update({
            "algorithm": self.algorithm(self.options, nservers),
            "parameter_servers": servers_line(nservers),
            "order_agreement": "none needed: servers match pushes by key",
            "credit_returned": "when the server has taken the push",
            "server_schedule": ("pending pushes summed in priority order (lowest key: front "
                                "layers first)" if self.options.server_schedule == "1"
                                else "arrival order") if nservers else None,
            "server_rule": (RULE_WORDS[SERVER_RULES[1]] if nservers
                            and self.options.server_schedule == "1" else None),
            "ps_placement": self.options.ps_placement,
            **ps_clients(self.comm.ps),
            "nservers": nservers,
            "partition_bytes": self.comm.ps.partition_bytes,
            "partitions": len(self._part_of),
            "bytes_per_server": per_server_bytes(self._part_of, self.params, nservers),
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

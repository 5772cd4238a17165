"""How the performance model replays a method: the rule each ``Method`` declares as ``rule``.

The model never names a method. A method's class declares a ``Rule`` (torch-free, as its options
are), and ``ddlbench.model`` reads the rules from the registry (``ddlbench.methods``): which
messages the method sends (``grouping``), on which schedule (``scheduler``: ByteScheduler's
chunks, priority and credit instead of whole messages; its partition and credit, or a PS
method's ``partition_bytes``, are the method's options), when (``after_backward``: only once
the whole backward is done), who does the host work (``reducer``: torch DDP's, copies into
buckets and divides before each all-reduce and issues from C++), which option values
``--advise`` searches (``advise``), the option saying where the grouping's alpha and beta come
from (``plan_ab``: "measured", on the link the cell is costed on, or the original's "table";
``ddlbench.model.cell`` reads it) and, for a parameter-server method, the all-reduce method
BytePS runs as when its workers fit one machine (``one_machine``), and, for a method that does
not all-reduce each message on the whole job, the collectives it runs instead (``exchange``: each a
``Step``, a collective declared in ``ddlbench.collectives`` on a group layout, on the message or
a shard of it; the model prices each on the network's link for that layout), and, for a method
that shards the optimizer (ZeRO), the collectives each message runs after the optimizer
(``gather``: the all-gather of the updated shards, a second place for communication in the
schedule, before or overlapping the next forward as the option ``prefetch`` names says) and
the group whose 1/s shard the optimizer steps (``optimizer_shard``). The method's architecture
(``Method.architecture``) says whether its messages are all-reduced or pushed and pulled; what
compressors it takes, ``Method.accepts``.

A grouping is a function ``(method, work, link, options) -> groups``: ``method`` the method's
class, ``work`` the replay's ``simulate.Compute`` (``nbytes``, ``backward_s`` in backward
order), ``link`` the all-reduce's ``simulate.Link`` (None for the PS methods), ``options`` the
method's resolved ``Options`` instance (what ``RunConfig.of`` builds for a run; the model's
defaults are the declared ones); groups are lists of backward positions, in the order the
messages leave. What a method computes from its options to plan its buckets is one torch-free
classmethod of its class that its own code calls too (``fusion_threshold``,
``merge_min_bytes``), so a subclass that overrides it (a plugin's own option) is replayed as it
runs. Pure: only ``ddlbench.planning`` and ``ddlbench.collectives``.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Callable

from ..collectives import LAYOUTS, WORLD, declared
from ..planning import ddp_buckets, ddp_first_bucket_bytes, merge_groups, plan_buckets

MIB = 1024 * 1024


def _one_grid(total_bytes: int) -> list[dict]:
    return [{}]


@dataclass(frozen=True)
class Step:
    """One collective of a message's exchange: ``op`` (declared in ``ddlbench.collectives``)
    on this worker's group of ``layout``, on the whole message or, with ``shard_of``, on 1/l
    of it, l the size of this worker's group of that layout (the shard a reduce-scatter there
    left). Sizes as nccl-tests counts them: an all-gather's is the gathered output."""
    op: str
    layout: str = WORLD
    shard_of: str | None = None
    # the carrier it runs by where its collective declares several (None: the backend's
    # default); a network prices ``op:carrier`` as comm_bench measures it
    carrier: str | None = None
    # the method's option that names the carrier instead, its value "auto" for the backend's
    # default (``chosen``: the step a run with those options takes)
    carrier_option: str | None = None
    # the collective the method's counters book it as where another stands in for it in the
    # model (``ddp_zero1``'s broadcasts of every rank's 1/P, priced as an all-gather); None:
    # ``op``. ``Comm`` counts an all-gather by what this worker contributes, the rest whole
    counted_as: str | None = None

    @property
    def counted_op(self) -> str:
        """The collective ``Comm`` counts this step as."""
        return self.counted_as or self.op

    def __post_init__(self):
        declared(self.op).carrier(self.carrier, None)   # undeclared: one line
        if self.counted_as is not None:
            declared(self.counted_as)
        for layout in (self.layout, self.shard_of or WORLD):
            if layout not in LAYOUTS:
                raise TypeError(f"a step's group layout is one of {', '.join(LAYOUTS)}, "
                                f"not {layout!r}")

    @property
    def priced_as(self) -> str:
        """The operation a network prices (``topology.OPS``)."""
        return self.op if self.carrier is None else f"{self.op}:{self.carrier}"

    def chosen(self, options) -> "Step":
        """This step as a run with the method's ``options`` takes it: the carrier its
        ``carrier_option`` names ("auto": the declared one)."""
        if self.carrier_option is None or options is None:
            return self
        name = getattr(options, self.carrier_option)
        return self if name == "auto" else replace(self, carrier=name)

    def levels(self) -> tuple["Step", ...]:
        """The steps this one runs as: itself, or, where its carrier runs in levels
        (``collectives.Carrier.levels``), each level as a step of its own."""
        carrier = declared(self.op).carrier(self.carrier, None)
        if not carrier.levels:
            return (self,)
        if self.layout != WORLD or self.shard_of is not None:
            from ..errors import UsageError
            raise UsageError(f"{self.op}'s carrier {carrier.name} runs in levels on the whole "
                             f"job, not on a step @{self.layout}")
        return tuple(Step(x.op, x.layout, x.shard_of) for x in carrier.levels)


@dataclass(frozen=True)
class Rule:
    """What the model needs of a method (see the module's docstring)."""
    grouping: Callable | None = None
    scheduler: bool = False
    after_backward: bool = False
    reducer: bool = False
    # option values --advise tries (option name -> value), given the gradient's total bytes
    advise: Callable[[int], list[dict]] = _one_grid
    one_machine: str | None = None
    # the option naming where the grouping's alpha and beta come from ("measured" or "table")
    plan_ab: str | None = None
    # the collectives each message runs, in order (empty: the compressor's on the whole job)
    exchange: tuple[Step, ...] = ()
    # a sharding method's: the collectives each message runs after the optimizer (its updated
    # shards' all-gather), the layout of the group whose 1/s shard the optimizer steps, and
    # the option saying whether the gathers overlap the next forward ("1") or not
    gather: tuple[Step, ...] = ()
    optimizer_shard: str | None = None
    prefetch: str | bool | None = None
    # a periodic method's: the classmethod (on the method, of its options) giving the steps
    # between two syncs; the model then runs H - 1 steps without communication and one whose
    # messages wait for the whole step (the sync after the optimizer)
    period: str | None = None
    # where the method divides each reduced message by P: on the 1/s shard of the group of
    # this layout (None: the whole message), and in ``step()`` on the training thread once
    # every message is reduced (ZeRO's) rather than after the collectives on their thread
    divide_shard: str | None = None
    divide_in_step: bool = False
    # the option saying whether each message's parameters are gathered again (``gather``'s
    # collectives) before its backward (FSDP2's ZeRO-3, ``reshard_after_forward``: "1")
    regather: str | None = None
    # a periodic method's own work on each message it syncs besides the collective, as the
    # profile's host figures per byte (``simulate.Host`` field names), on the training thread
    # before the collective (packing) and after it (unpacking, an outer optimizer's step)
    sync_before: tuple[str, ...] = ()
    sync_after: tuple[str, ...] = ()
    # the exchange's steps run as a pipeline: each on a thread and process group of its own,
    # so one message's later step overlaps the next message's earlier one (hier's)
    pipelined: bool = False

    def __post_init__(self):
        if (self.grouping is None) != self.scheduler:
            raise TypeError("a model rule has either a grouping or the scheduler, not both")
        if (self.exchange or self.gather) and self.scheduler:
            raise TypeError("a declared exchange is per message: it needs a grouping")
        if self.period and not self.after_backward:
            raise TypeError("a periodic rule's sync waits for the whole step: after_backward")
        if self.gather and not self.exchange:
            raise TypeError("a rule that gathers shards after the optimizer declares the "
                            "exchange that made them")
        if self.pipelined and len(self.exchange) < 2:
            raise TypeError("a pipelined exchange has steps to overlap: two or more")
        if self.regather and not self.gather:
            raise TypeError("a rule that gathers parameters again before the backward "
                            "declares the gather")
        for layout in (self.divide_shard,):
            if layout is not None and layout not in LAYOUTS:
                raise TypeError(f"a divide's group layout is one of {', '.join(LAYOUTS)}, "
                                f"not {layout!r}")

    def steps(self, options, after_optimizer: bool = False) -> tuple[Step, ...]:
        """The collectives a message runs with ``options`` (None: the declared carriers): its
        exchange (``after_optimizer``: its gather), each step's carrier as the options choose
        it, a carrier in levels as its levels."""
        declared_steps = self.gather if after_optimizer else self.exchange
        return tuple(x for s in declared_steps for x in s.chosen(options).levels())

    def groups(self, method: type, work, link, options) -> list[list[int]]:
        """The messages (all-reduce) or units (PS) ``method`` sends per iteration with
        ``options`` (an instance of ``method.Options``)."""
        if self.grouping is None:
            raise TypeError("a scheduler rule has no fixed grouping")
        return self.grouping(method, work, link, options)


# --------------------------------------------------------------------------- groupings

def one_message(method, work, link, options) -> list[list[int]]:
    """Every gradient in one message (BSP)."""
    return [list(range(len(work.nbytes)))]


def per_tensor(method, work, link, options) -> list[list[int]]:
    """One message per gradient tensor (WFBP)."""
    return [[b] for b in range(len(work.nbytes))]


def fused(method, work, link, options) -> list[list[int]]:
    """Consecutive gradients in buckets of at most the method's fusion threshold
    (``method.fusion_threshold(options, nbytes)``, the bytes its own code packs by), as
    ``planning.plan_buckets`` packs them."""
    return plan_buckets(work.nbytes, float(method.fusion_threshold(options, list(work.nbytes))))


def ddp(method, work, link, options) -> list[list[int]]:
    """torch DDP's rebuilt buckets in gradient order: each closes once it holds
    ``bucket_cap_mb``, the first at 1 MiB at the default cap (``planning.ddp_buckets``)."""
    cap_mb = float(options.bucket_cap_mb)
    return ddp_buckets(work.nbytes, cap_mb * MIB, ddp_first_bucket_bytes(cap_mb))


def units(method, work, link, options) -> list[list[int]]:
    """FSDP's units: the tensors of each repeated block (a name with an index component,
    ``layer.3.``, ``layer1.0.``: a module of a ModuleList or Sequential), a message each once
    its last gradient is ready, and the root's (every other tensor) last, when the backward
    ends. Without names, one unit."""
    names = work.names
    if names is None:
        return [list(range(len(work.nbytes)))]
    blocks: dict[str, list[int]] = {}
    root = []
    for b, name in enumerate(names):
        parts = name.split(".")
        index = next((k for k, part in enumerate(parts[:-1]) if part.isdigit()), None)
        if index is None:
            root.append(b)
        else:
            blocks.setdefault(".".join(parts[:index + 1]), []).append(b)
    return sorted(blocks.values(), key=max) + ([root] if root else [])


def merged(method, work, link, options) -> list[list[int]]:
    """MG-WFBP's merge of consecutive gradients by the link's alpha and beta
    (``planning.merge_groups``), small groups merged below ``method.merge_min_bytes(options)``
    (fp32)."""
    return merge_groups(work.backward_s, work.nbytes, link.alpha, link.beta,
                        int(method.merge_min_bytes(options)))


# --------------------------------------------------------------------------- --advise's grids

def threshold_grid(total_bytes: int) -> list[dict]:
    """Fusion thresholds from 0 (per tensor) to everything in one message."""
    return [{"threshold": float(t)} for t in
            sorted({0, *(m * MIB for m in (1, 2, 4, 8, 16, 32, 64, 128)), total_bytes})]


def bucket_cap_grid(total_bytes: int) -> list[dict]:
    return [{"bucket_cap_mb": float(m)} for m in (1, 2, 5, 10, 25, 50, 100, 200)]


def min_group_grid(total_bytes: int) -> list[dict]:
    """MG-WFBP's small-group merge, in elements (0: off)."""
    return [{"mgwfbp_min_group": e} for e in (0, 8192, 65536, 1 << 20)]


def partition_credit_grid(total_bytes: int) -> list[dict]:
    """ByteScheduler's partition and credit, in elements (fp32)."""
    elements = max(1, total_bytes // 4)
    return [{"partition": p, "credit": c}
            for p in (250_000, 1_000_000, 4_000_000, 16_000_000)
            for c in sorted({p, 2 * p, 4 * p, 8 * p, max(p, elements)})]


def credit_grid(total_bytes: int) -> list[dict]:
    """ByteScheduler-PS's credit, in elements (its partitions are the PS's)."""
    elements = max(1, total_bytes // 4)
    return [{"credit": c} for c in sorted({1_000_000, 4_000_000, 16_000_000, elements})]

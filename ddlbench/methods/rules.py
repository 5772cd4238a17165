"""How the performance model replays a method: the rule each ``Method`` declares as ``model``.

The model never names a method. A method's class declares a ``Rule`` (torch-free, as its options
are), and ``ddlbench.model`` reads the rules from the registry (``ddlbench.methods``): which
messages the method sends (``grouping``), on which schedule (``scheduler``: ByteScheduler's
chunks, priority and credit instead of whole messages), when (``after_backward``: only once the
whole backward is done), who does the host work (``reducer``: torch DDP's, copies into buckets
and divides before each all-reduce and issues from C++), which settings ``--advise`` searches
(``advise``), which setting is fixed by the method's definition (``fixed``) and, for a
parameter-server method, the all-reduce method BytePS runs as when its workers fit one machine
(``one_machine``). The method's architecture (``Method.architecture``) says whether its messages
are all-reduced or pushed and pulled; what compressors it takes, ``Method.accepts``.

A grouping is a function ``(work, link, settings) -> groups``: ``work`` the replay's
``simulate.Compute`` (``nbytes``, ``backward_s`` in backward order), ``link`` the all-reduce's
``simulate.Link`` (None for the PS methods), ``settings`` the simulator's names of the method's
settings (``threshold`` bytes, ``bucket_cap_mb``, ``min_group_bytes``); groups are lists of
backward positions, in the order the messages leave. Pure: only ``ddlbench.planning``.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

from ..planning import (DDP_DEFAULT_BUCKET_MB, DEFAULT_MIN_GROUP_ELEMENTS, ddp_buckets,
                        ddp_first_bucket_bytes, merge_groups, plan_buckets)

MIB = 1024 * 1024
# MG-WFBP's small-group merge: the original's elements, of fp32
MGWFBP_MIN_GROUP_BYTES = DEFAULT_MIN_GROUP_ELEMENTS * 4


def _one_grid(total_bytes: int) -> list[dict]:
    return [{}]


@dataclass(frozen=True)
class Rule:
    """What the model needs of a method (see the module's docstring)."""
    grouping: Callable | None = None
    scheduler: bool = False
    after_backward: bool = False
    reducer: bool = False
    advise: Callable[[int], list[dict]] = _one_grid
    fixed: dict = field(default_factory=dict)
    one_machine: str | None = None
    # the settings it takes beside the grouping's (ByteScheduler's partition and credit, the
    # PS methods' partition_bytes): the simulator's names
    settings: tuple[str, ...] = ()

    def __post_init__(self):
        if (self.grouping is None) != self.scheduler:
            raise TypeError("a model rule has either a grouping or the scheduler, not both")

    def groups(self, work, link, settings: dict) -> list[list[int]]:
        """The messages (all-reduce) or units (PS) sent per iteration."""
        if self.grouping is None:
            raise TypeError("a scheduler rule has no fixed grouping")
        return self.grouping(work, link, {**settings, **self.fixed})


# --------------------------------------------------------------------------- groupings

def one_message(work, link, settings) -> list[list[int]]:
    """Every gradient in one message (BSP)."""
    return [list(range(len(work.nbytes)))]


def per_tensor(work, link, settings) -> list[list[int]]:
    """One message per gradient tensor (WFBP)."""
    return [[b] for b in range(len(work.nbytes))]


def buckets(default_threshold: float) -> Callable:
    """Consecutive gradients in buckets of at most ``threshold`` bytes (``planning.plan_buckets``,
    as the methods pack them), ``default_threshold`` unless the settings give one."""
    def grouping(work, link, settings):
        return plan_buckets(work.nbytes, float(settings.get("threshold", default_threshold)))
    grouping.__qualname__ = f"buckets({default_threshold:g})"
    return grouping


def ddp(work, link, settings) -> list[list[int]]:
    """torch DDP's rebuilt buckets in gradient order: each closes once it holds
    ``bucket_cap_mb``, the first at 1 MiB at the default cap (``planning.ddp_buckets``)."""
    cap_mb = float(settings.get("bucket_cap_mb", DDP_DEFAULT_BUCKET_MB))
    return ddp_buckets(work.nbytes, cap_mb * MIB, ddp_first_bucket_bytes(cap_mb))


def merged(work, link, settings) -> list[list[int]]:
    """MG-WFBP's merge of consecutive gradients by the link's alpha and beta
    (``planning.merge_groups``)."""
    return merge_groups(work.backward_s, work.nbytes, link.alpha, link.beta,
                        int(settings.get("min_group_bytes", MGWFBP_MIN_GROUP_BYTES)))


# --------------------------------------------------------------------------- --advise's grids

def threshold_grid(total_bytes: int) -> list[dict]:
    """Fusion thresholds from 0 (per tensor) to everything in one message."""
    return [{"threshold": float(t)} for t in
            sorted({0, *(m * MIB for m in (1, 2, 4, 8, 16, 32, 64, 128)), total_bytes})]


def bucket_cap_grid(total_bytes: int) -> list[dict]:
    return [{"bucket_cap_mb": float(m)} for m in (1, 2, 5, 10, 25, 50, 100, 200)]


def min_group_grid(total_bytes: int) -> list[dict]:
    return [{"min_group_bytes": 4 * e} for e in (0, 8192, 65536, 1 << 20)]


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


# --------------------------------------------------------------------------- settings

# the options the simulator reads under their own names
SIMULATED = ("threshold", "bucket_cap_mb", "partition", "credit", "partition_bytes")


def simulator_settings(values: dict) -> dict:
    """The simulator's settings from a method's option values (option name -> value, as the
    training script, the sweep and the launchers name them; None: not set): MG-WFBP's
    ``mgwfbp_min_group`` elements become ``min_group_bytes`` (fp32), its ``mgwfbp_ab`` (where
    the merge's alpha and beta come from: "measured" or the original's "table") ``plan_ab``
    (``ddlbench.model.cell`` reads it)."""
    out = {k: values[k] for k in SIMULATED if values.get(k) is not None}
    if values.get("mgwfbp_min_group") is not None:
        out["min_group_bytes"] = 4 * int(values["mgwfbp_min_group"])
    if values.get("mgwfbp_ab") is not None:
        out["plan_ab"] = str(values["mgwfbp_ab"])
    return out

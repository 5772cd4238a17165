"""The collectives a method may issue, each declared once: what a message's size counts, the
bytes each rank sends, the bus factor, the latency steps and, per backend, how it is carried.

Read by every side of the suite, so they cannot disagree: ``runtime.comm.Comm`` issues only a
declared collective with one of its declared carriers and counts its bytes from here; its
timeline spans name the collective, the carrier and the group; ``measure.comm_bench`` (``--ops``)
reports algbw and busbw with these factors; the performance model prices a message with the
same steps and factors (``ring_collective``, ``ring_link``). No torch here.

Sizes are counted as nccl-tests counts them (docs/DESIGN.md section 3): a message of ``M``
bytes is, for all-reduce, reduce-scatter, all-to-all and broadcast, the tensor every rank hands
in; for all-gather the gathered output (P x the ``m`` bytes each rank contributes). Under the
ring (and pairwise) algorithms each rank sends

=================  =========================  ============  ==========================
collective         bytes each rank sends      bus factor    latency steps
=================  =========================  ============  ==========================
allreduce          2(P-1)/P * M               2(P-1)/P      2(P-1)
reduce_scatter     (P-1)/P * M                (P-1)/P       P-1
allgather          (P-1)/P * M = (P-1) * m    (P-1)/P       P-1
all_to_all         (P-1)/P * M                (P-1)/P       P-1
broadcast          (P-1) * M from the root    1             P-1
push, pull         M each way (servers)       1             1
=================  =========================  ============  ==========================

A *carrier* is how a backend carries a collective; where it is another collective of the table
(``runs_as``; ``"*"``: on every backend), its bytes and price are that one's. Measured on Gloo (torch 2.14.1, loopback
bytes, 4 ranks, 16 MiB): ``reduce_scatter_tensor`` sends 6.01 M in all, an all-reduce's (the
ideal is 3.00 M), while ``all_to_all_single`` and a local sum in rank order send 3.00 M and give
the same result bit for bit: so reduce-scatter's ``a2a`` carrier is the default on Gloo and its
``native`` carrier runs as an all-reduce there; on NCCL the native one is the default.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

from .errors import UsageError

# the carrier a collective takes when none is asked for, where no backend says otherwise
NATIVE = "native"
A2A = "a2a"
RING = "ring"
TWO_LEVEL = "two-level"

# -- groups by layout ---------------------------------------------------------------------------
# A method asks for the groups it needs by layout, never by rank lists; the job builds them from
# where its ranks are (``runtime.groups``), the model from the topology (machines x devices).
WORLD = "world"        # every worker of the job
MACHINE = "machine"    # the workers of my machine
ACROSS = "across"      # one worker per machine: those with my local index
LAYOUTS = (WORLD, MACHINE, ACROSS)


@dataclass(frozen=True)
class Level:
    """One level of a carrier in levels: the declared collective ``op`` on this worker's group
    of ``layout``, on the whole message or, with ``shard_of``, on 1/l of it (l the size of
    the group of that layout), as a method's ``rules.Step``."""
    op: str
    layout: str
    shard_of: str | None = None


@dataclass(frozen=True)
class Carrier:
    """How a collective is carried out: ``how`` in words; ``runs_as`` backend -> the declared
    collective it moves bytes as on that backend (its bytes, steps and price are that one's);
    a backend not named moves the collective's own bytes. A carrier in ``levels`` is the
    collective on the whole job carried as other declared collectives on the groups of the
    placement, one after the other (each by its backend's default carrier); its bytes,
    spans and price are theirs."""
    name: str
    how: str
    runs_as: dict = field(default_factory=dict)   # backend ("*": any) -> collective
    levels: tuple = ()                             # Level, ... in the order they run


@dataclass(frozen=True)
class Collective:
    """One declared collective (see the module's table)."""
    name: str
    summary: str
    size: str                          # what a message's size counts
    bus: Callable[[int], float]        # busbw / algbw at P ranks
    steps: Callable[[int], int]        # the algorithm's latency steps at P ranks
    carriers: tuple[Carrier, ...] = (Carrier(NATIVE, "the backend's own"),)
    defaults: dict = field(default_factory=dict)   # backend -> carrier name
    gathers: bool = False              # the message is P x each rank's contribution
    parts: bool = False                # each rank's tensor is P equal parts (shards, chunks)
    rooted: bool = False               # only the root sends (broadcast)
    bus_text: str = "(P-1)/P"          # ``bus`` as a formula, for tables' headers

    def carrier(self, name: str | None = None, backend: str | None = None) -> Carrier:
        """The carrier ``name``, else this backend's default, else the first declared."""
        if name is None:
            name = self.defaults.get(backend, self.carriers[0].name)
        for c in self.carriers:
            if c.name == name:
                return c
        raise UsageError(f"collective {self.name} has no carrier {name!r}; declared: "
                         f"{', '.join(c.name for c in self.carriers)}")

    def message(self, own_bytes: int, world: int) -> int:
        """The message's size (nccl-tests) when this rank hands in ``own_bytes``."""
        return own_bytes * world if self.gathers else own_bytes


def _ring2(p: int) -> float:
    return 2 * (p - 1) / p


def _ring(p: int) -> float:
    return (p - 1) / p


COLLECTIVES: dict[str, Collective] = {c.name: c for c in (
    Collective("allreduce", "every rank's tensor summed into every rank",
               "the tensor each rank holds", _ring2, lambda p: 2 * (p - 1),
               bus_text="2(P-1)/P"),
    Collective("reduce_scatter", "the sum of shard r of every rank's tensor into rank r",
               "the tensor each rank holds (P equal shards)", _ring, lambda p: p - 1, parts=True,
               carriers=(Carrier(A2A, "all-to-all of the shards, then a local sum in rank "
                                      "order", runs_as={"*": "all_to_all"}),
                         Carrier(NATIVE, "the backend's own (reduce_scatter_single, else "
                                         "reduce_scatter_tensor); on Gloo an all-reduce and "
                                         "a chunk", runs_as={"gloo": "allreduce"}),
                         Carrier(RING, "P - 1 point-to-point steps of a ring, each rank "
                                       "sending one shard to the next and adding the one it "
                                       "receives (NCCL's ring reduce-scatter); on a shared "
                                       "NIC only the ranks at a machine's edge cross it"),
                         Carrier(TWO_LEVEL, "two levels (MiCS's hierarchical communication): a "
                                       "reduce-scatter inside the machine, then one of that "
                                       "1/l across machines, the shards ordered first so that "
                                       "rank r still receives shard r; only 1/l of the tensor "
                                       "crosses the machines, (n-1)/n of it from each worker",
                                 levels=(Level("reduce_scatter", MACHINE),
                                         Level("reduce_scatter", ACROSS, MACHINE)))),
               defaults={"gloo": A2A, "nccl": NATIVE}),
    Collective("allgather", "every rank's shard gathered into every rank",
               "the gathered output (P x each rank's shard)", _ring, lambda p: p - 1,
               gathers=True, parts=True,
               carriers=(Carrier(NATIVE, "the backend's own"),
                         Carrier(TWO_LEVEL, "two levels (MiCS's hierarchical communication): the "
                                       "shards gathered across machines (the workers with my "
                                       "local index), then those 1/l chunks inside the "
                                       "machine, put back in rank order; the second level "
                                       "is issued when the first is waited for",
                                 levels=(Level("allgather", ACROSS, MACHINE),
                                         Level("allgather", MACHINE))))),
    Collective("all_to_all", "chunk j of every rank's tensor to rank j",
               "the tensor each rank holds (P equal chunks)", _ring, lambda p: p - 1,
               parts=True),
    Collective("broadcast", "the root's tensor to every rank", "the tensor",
               lambda p: 1.0, lambda p: p - 1, rooted=True, bus_text="1"),
    Collective("push", "a partition to its parameter server", "the partition",
               lambda p: 1.0, lambda p: 1, bus_text="1"),
    Collective("pull", "a partition's sum back from its server", "the partition",
               lambda p: 0.0, lambda p: 1, bus_text="0"),
)}
# the all-reduce family's collectives the model prices with a ring (not push/pull, broadcast)
RING_OPS = ("allreduce", "reduce_scatter", "allgather", "all_to_all")


def operations() -> tuple[str, ...]:
    """Every operation a network prices and comm_bench measures: each declared collective of
    the all-reduce family (``RING_OPS``), and, for one with several carriers, each as
    ``op:carrier`` (not a carrier in levels: its levels are priced and measured)."""
    out = []
    for op in RING_OPS:
        out.append(op)
        carriers = [c for c in COLLECTIVES[op].carriers if not c.levels]
        if len(carriers) > 1:
            out += [f"{op}:{c.name}" for c in carriers]
    return tuple(out)


def declared(op: str) -> Collective:
    """The declaration of ``op``; a collective nobody declared cannot be issued or priced."""
    found = COLLECTIVES.get(op)
    if found is None:
        raise UsageError(f"collective {op!r} is not declared (ddlbench.collectives); "
                         f"declared: {', '.join(COLLECTIVES)}")
    return found


def split(op: str) -> tuple[str, str | None]:
    """A collective named with its carrier, ``reduce_scatter:a2a``, as (collective, carrier);
    ``allreduce`` as (``allreduce``, None)."""
    name, _, carrier = op.partition(":")
    return name, carrier or None


def carried_as(op: str, carrier: str | None = None, backend: str | None = None) -> str:
    """The declared collective whose bytes and price ``op`` has with ``carrier`` on
    ``backend`` (itself unless the carrier runs as another there)."""
    c = declared(op).carrier(carrier, backend)
    if c.levels:
        raise UsageError(f"{op}'s carrier {c.name} runs in levels ("
                         f"{', '.join(f'{x.op} @{x.layout}' for x in c.levels)}): each is "
                         f"counted and priced on its own group")
    return c.runs_as.get(backend) or c.runs_as.get("*") or op


def bus_factor(op: str, world: int) -> float:
    """busbw / algbw: the fraction of a message each rank's link carries per collective
    (nccl-tests). ``pushpull`` and ``latency`` (comm_bench's push/pull and ping-pong): the
    message crosses the link once each way."""
    if op in ("pushpull", "latency"):
        return 1.0
    c = declared(op)
    if world <= 1:
        return 0.0
    return c.bus(world)


def sent_bytes(op: str, nbytes: int, world: int, root: bool = True,
               carrier: str | None = None, backend: str | None = None) -> int:
    """Bytes one rank sends for one collective whose *own* tensor has ``nbytes`` (all-gather:
    what this rank contributes; broadcast: the tensor, sent by the root; push: the partition,
    pull: nothing), carried by ``carrier`` on ``backend`` (its declared ``runs_as``)."""
    c = declared(op)
    message = c.message(nbytes, world)
    moved = declared(carried_as(op, carrier, backend))
    if moved.rooted:
        return message * (world - 1) if root else 0
    if moved.name in ("push", "pull"):
        return message if moved.name == "push" else 0
    if world <= 1:
        return 0
    return int(round(message * moved.bus(world)))


def ring_link(op: str, alpha: float, beta: float, world: int) -> dict | None:
    """The per-step ring alpha/beta implied by a per-message fit ``alpha + beta * size``: the
    collective's steps (``Collective.steps``) of size/P bytes each."""
    if world <= 1 or op not in RING_OPS:
        return None
    steps = declared(op).steps(world)
    return {"alpha_s": alpha / steps, "beta_s_per_byte": beta * world / steps}


def ring_collective(op: str, alpha_step: float, beta_step: float, world: int) -> tuple[float,
                                                                                     float]:
    """The per-message (alpha, beta) of a ring collective among ``world`` ranks whose steps
    each cost ``alpha_step + beta_step * (size / world)``: the inverse of ``ring_link``."""
    if world <= 1:
        return 0.0, 0.0
    steps = declared(op).steps(world)
    return steps * alpha_step, steps * beta_step / world


def layout_groups(layout: str, machines: list[list[int]]) -> list[list[int]]:
    """The groups of ``layout`` over a job whose ranks sit on ``machines`` (ranks grouped by
    machine, each machine's in local order): every rank is in exactly one group."""
    if layout == WORLD:
        return [sorted(r for m in machines for r in m)]
    if layout == MACHINE:
        return [list(m) for m in machines]
    if layout == ACROSS:
        depth = max(len(m) for m in machines)
        return [[m[j] for m in machines if len(m) > j] for j in range(depth)]
    raise UsageError(f"unknown group layout {layout!r}; known: {', '.join(LAYOUTS)}")


def layout_size(layout: str, nworkers: int, per_machine: int) -> int:
    """A group's size under ``layout`` for ``nworkers`` workers, ``per_machine`` a machine
    (full machines, as the model's topologies place them)."""
    if layout not in LAYOUTS:
        raise UsageError(f"unknown group layout {layout!r}; known: {', '.join(LAYOUTS)}")
    machines = -(-nworkers // per_machine)
    return {WORLD: nworkers, MACHINE: min(per_machine, nworkers), ACROSS: machines}[layout]

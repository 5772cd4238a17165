"""The job's process groups by layout (the whole job, my machine, one rank per machine), built
once, when a method first asks for them, from where the ranks sit.

Where the ranks sit is what the job already knows: every worker's machine
(``hosts.placement.machine_id``: the emulated host of ``--slots``/``--net``, else the host name, the
same for mpirun host files, torchrun and Slurm), gathered once. Building a group is collective:
every rank must ask for the same layouts in the same order, which holds when a method asks in
its constructor (every rank builds the same methods in the same order).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch.distributed as dist

from ..collectives import LAYOUTS, MACHINE, WORLD, layout_groups
from ..hosts.placement import machine_id


@dataclass(frozen=True)
class Group:
    """One process group of this rank: its ``layout``, the job ranks in it in group order,
    this rank's index there, torch's handle (None: the job's default group) and backend."""
    layout: str
    ranks: tuple[int, ...]
    rank: int
    handle: object = None
    backend: str | None = None

    @property
    def size(self) -> int:
        return len(self.ranks)


class Groups:
    """The groups of one job for rank ``rank`` of ``size`` (``handle``: the job's process
    group, None for torch's default; ``machines``: ranks grouped by machine, else gathered
    from ``placement.machine_id`` when first needed)."""

    def __init__(self, rank: int, size: int, handle=None, machines: list[list[int]] | None = None):
        self.rank, self.size, self.handle = rank, size, handle
        self._machines = machines
        backend = dist.get_backend(handle) if size > 1 and dist.is_initialized() else None
        self.world = Group(WORLD, tuple(range(size)), rank, handle, backend)
        self._built: dict[str, Group] = {WORLD: self.world}
        self._channels: dict[tuple[str, int], Group] = {}

    @property
    def machines(self) -> list[list[int]]:
        """Ranks grouped by machine, machines in order of their first rank."""
        if self._machines is None:
            if self.size == 1:
                self._machines = [[0]]
            else:
                from .ps import machines
                ids: list = [None] * self.size
                dist.all_gather_object(ids, machine_id(), group=self.handle)
                self._machines = machines(ids)
        return self._machines

    def get(self, layout: str, channel: int = 0) -> Group:
        """This rank's group of ``layout`` (built on first asking, on every rank). ``channel``
        > 0: another process group of the same ranks, for collectives another thread issues
        (each process group must see its collectives in one order on every rank; two threads
        issuing on one group could not promise it), as NCCL gives a second stream its own
        communicator. Channel 0 is the one ``describe`` reports; the others hold its ranks."""
        if channel:
            found = self._channels.get((layout, channel))
            if found is None:
                found = self._channels[(layout, channel)] = self._build(layout, fresh=True)
            return found
        found = self._built.get(layout)
        if found is None:
            found = self._built[layout] = self._build(layout)
        return found

    def _build(self, layout: str, fresh: bool = False) -> Group:
        every = layout_groups(layout, self.machines)
        mine = next(g for g in every if self.rank in g)
        if len(mine) == self.size and not fresh:
            return Group(layout, tuple(mine), mine.index(self.rank), self.handle,
                         self.world.backend)
        handle = None
        if any(len(g) > 1 for g in every):   # (groups of one need no process group)
            handle, _ = dist.new_subgroups_by_enumeration(every, backend=self.world.backend)
        return Group(layout, tuple(mine), mine.index(self.rank),
                     handle if len(mine) > 1 else None, self.world.backend)

    def describe(self) -> dict | None:
        """The layouts built, each as its groups of job ranks (for the record); None when
        only the whole job was."""
        if len(self._built) == 1:
            return None
        return {layout: layout_groups(layout, self.machines) for layout in self._built}


__all__ = ["Group", "Groups", "LAYOUTS", "MACHINE", "WORLD"]

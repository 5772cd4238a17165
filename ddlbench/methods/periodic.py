"""Periodic averaging: local SGD and DiLoCo. Every worker steps its own optimizer on its own
gradient for ``--period`` H steps, with no communication; then the replicas are brought
together. These change the algorithm (``changes_algorithm``): between syncs the replicas
differ, and what is averaged is parameters, not gradients.

- ``localsgd`` (local SGD; torch's ``PeriodicModelAverager`` with post-local SGD, after its
  warm-up): after every H-th step the parameters are averaged over the job, an all-reduce of
  flat buckets of parameters (``planning.plan_buckets`` at ``--threshold`` bytes, as tensor
  fusion packs gradients) divided by P. Optimizer state (momentum, Adam's moments) stays local,
  as with torch's averager. At H = 1 with SGD (momentum, Nesterov, weight decay included) this
  is synchronous SGD: the update is linear in the gradient and in the momentum buffer, the
  parameters start every step equal, so the average of the P updated replicas is the update
  of the average gradient with the average buffer, which follows the averaged gradient's
  recurrence (``--verify`` holds it to the single-process optimizer then). Adam's update is
  not linear: not at any H.
- ``diloco`` (DiLoCo, Douillard et al. 2023): the same inner steps from the global parameters
  saved at the last sync; after every H-th step the pseudo-gradient, global minus local
  parameters, is averaged over the job (the same buckets), and an outer optimizer, SGD with
  Nesterov momentum (the paper's: ``--outer-lr`` 0.7, ``--outer-momentum`` 0.9), steps the
  global parameters with it; every worker then continues from the new global parameters. The
  inner optimizer's state stays local.

Bytes: one all-reduce of the parameters' G bytes every H steps, ``2(P-1)/P G / H`` per worker
per step on the ring. The sync happens after the steps counted from the method's first
(warm-up included) that are multiples of H: a timed round of a multiple of H steps after a
warm-up of a multiple of H holds whole periods ending on a sync; the record divides the bytes
of the timed steps by their number, exact when that number is a multiple of H (the default
timing, 10 rounds of 10 steps at H = 4: 25 syncs in 100 steps, rounds alternating 2 and 3).

Default H = 4: the period of torch's own post-local SGD example (``PeriodicModelAverager(
period=4)``) and of the issue's benchmark cell; local SGD's papers use 4 to 16, DiLoCo's 500
(with ``--period``). The all-reduces go through ``Comm`` (counted, traced, spans on the
timeline labelled with their tensors). No compressor: what is averaged is parameters.

``--verify`` (``reference``: ``ddlbench.methods.periodic_reference``, written apart): a float64
simulation of P replicas on the captured local gradients; see that module for the tolerance.
"""
from __future__ import annotations

from dataclasses import dataclass, replace

from ..options import COUNT, NONNEG, POSITIVE, option
from ..planning import plan_buckets
from ..timeline import tensors_label
from . import rules
from .allreduce import FusionOptions
from .base import Method
from .ddp import DDPOptions, _build_ddp

COPY = "copy_s_per_byte"   # the profile's host figure a bucket's pack or unpack costs per byte
NOT_PARAMETERS = ("it averages parameters every --period steps, not gradients through a "
                  "compressor")


def period_option():
    """``--period`` H, declared alike by every periodic method (``ddp_localsgd`` too)."""
    return option(4, COUNT, "periodic averaging: local steps between two syncs (H)",
                  metavar="H")


@dataclass(frozen=True)
class PeriodicOptions(FusionOptions):
    period: int = period_option()


@dataclass(frozen=True)
class DiLoCoOptions(PeriodicOptions):
    outer_lr: float = option(0.7, POSITIVE, "DiLoCo: the outer optimizer's learning rate "
                                            "(Nesterov SGD on the averaged pseudo-gradient)")
    outer_momentum: float = option(0.9, NONNEG, "DiLoCo: the outer optimizer's Nesterov "
                                                "momentum (0: plain SGD)")


class _EveryPeriod:
    """What every periodic method (``ddp_localsgd`` too) answers alike, torch-free (the model
    and the registry read them): no compressor, the steps between two syncs."""

    @classmethod
    def accepts(cls, compressor: str) -> str | None:
        return None if compressor == "none" else NOT_PARAMETERS

    @classmethod
    def sync_period(cls, options) -> int:
        """Steps between two syncs (H), from the resolved options."""
        return int(options.period)


class _LocalSGDReference(_EveryPeriod):
    """The reference of averaging the parameters: at H = 1 with SGD, synchronous SGD itself
    (the module docstring): the averaged gradient's reference; else the simulation of P
    replicas (``LocalSGDMath``)."""
    reference = "ddlbench.methods.periodic_reference:LocalSGDMath"

    @classmethod
    def reference_for(cls, options, optimizer: str) -> str:
        return "" if cls.sync_period(options) == 1 and optimizer == "sgd" else cls.reference


class _Periodic(_EveryPeriod, Method):
    """H local steps, then ``_sync()``: the parameters' buckets all-reduced and averaged."""

    Options = PeriodicOptions
    changes_algorithm = "the replicas step apart; parameters averaged every `--period` steps"
    # the model: buckets of parameters all-reduced after the step, one step in H; each packed
    # into its buffer before (a copy) and copied back after
    rule = rules.Rule(grouping=rules.fused, after_backward=True, period="sync_period",
                      sync_before=(COPY,), sync_after=(COPY,))

    @classmethod
    def fusion_threshold(cls, options, nbytes: list[int]) -> float:
        """The bytes a bucket of parameters holds at most (``planning.plan_buckets``);
        torch-free."""
        return float(options.threshold)

    def __init__(self, model, optimizer, comm, options=None, compressor=None, model_name=None):
        super().__init__(model, optimizer, comm, options, compressor, model_name)
        import torch
        self.period = self.sync_period(self.options)
        self.threshold = self.fusion_threshold(
            self.options, [p.numel() * p.element_size() for p in self.params])
        # backward order (the reverse of registration), as the gradient buckets are packed
        order = list(reversed(range(len(self.params))))
        keys = [(self.params[i].dtype, self.params[i].device) for i in order]
        nbytes = [self.params[i].numel() * self.params[i].element_size() for i in order]
        planned = plan_buckets(nbytes, self.threshold, keys)
        self.groups = [[order[j] for j in g] for g in planned]
        self.bucket_bytes = [sum(nbytes[j] for j in g) for g in planned]
        # the averages' buffers: none at one worker, where nothing is averaged (``_sync``)
        self.flats = [torch.empty(sum(self.params[i].numel() for i in g),
                                  dtype=self.params[g[0]].dtype, device=self.params[g[0]].device)
                      for g in self.groups] if comm.size > 1 else []
        self.labels = [tensors_label([self.param_names[i] for i in g]) for g in self.groups]
        self.steps = 0
        self.syncs = 0

    # -- the step -------------------------------------------------------------------------
    def step(self) -> None:
        self.optimizer.step()
        self.steps += 1
        if self.steps % self.period == 0:
            self._sync()
            self.syncs += 1

    def _sync(self) -> None:
        raise NotImplementedError

    def _average(self, tensors_of) -> list:
        """Per bucket, ``tensors_of(i)`` of its parameters packed into its flat buffer, the
        buffers all-reduced over the job (started together, waited in order) and divided by
        P; the averaged buffers, in bucket order."""
        import torch
        comm = self.comm
        for g, flat in zip(self.groups, self.flats):
            torch.cat([tensors_of(i).reshape(-1) for i in g], out=flat)
        average = comm.average_op()
        works = []
        for flat, label in zip(self.flats, self.labels):
            with comm.about(label):
                works.append(comm.allreduce(flat, op=average))
        for flat, work in zip(self.flats, works):
            work.wait()
            if average is None:
                flat.div_(comm.size)
        return self.flats

    def _unpack(self, flats, into) -> None:
        """Copy the flat buffers back into ``into(i)`` for every parameter index i."""
        from ..compat import copy_all
        dsts, srcs = [], []
        for g, flat in zip(self.groups, flats):
            offset = 0
            for i in g:
                dst = into(i)
                n = dst.numel()
                dsts.append(dst)
                srcs.append(flat[offset:offset + n].view_as(dst))
                offset += n
        copy_all(dsts, srcs)

    def describe(self) -> dict:
        d = super().describe()
        d.update({"period": self.period, "steps": self.steps, "syncs": self.syncs,
                  "threshold_bytes": self.threshold if self.threshold != float("inf") else None,
                  "buckets": len(self.groups),
                  "bucket_bytes": self.bucket_bytes,
                  "changes_algorithm": self.changes_algorithm})
        return d


class LocalSGD(_LocalSGDReference, _Periodic):
    id = "localsgd"
    display = "LocalSGD"
    summary = ("every worker steps its own optimizer on its own gradient; every `--period` "
               "steps the parameters are averaged over the job (all-reduce of "
               "`--threshold`-byte buckets): local SGD")

    def _sync(self) -> None:
        import torch
        if self.comm.size == 1:   # one replica is its own average
            return
        with torch.no_grad():
            flats = self._average(lambda i: self.params[i].detach())
            self._unpack(flats, lambda i: self.params[i].detach())


class DiLoCo(_Periodic):
    id = "diloco"
    display = "DiLoCo"
    summary = ("inner steps as `localsgd`; every `--period` steps the pseudo-gradients (global "
               "minus local parameters) are averaged and an outer Nesterov SGD (`--outer-lr`, "
               "`--outer-momentum`) steps the global parameters, where every worker restarts: "
               "DiLoCo")
    Options = DiLoCoOptions
    changes_algorithm = ("an outer optimizer on the averaged pseudo-gradients every `--period` "
                         "steps")
    reference = "ddlbench.methods.periodic_reference:DiLoCoMath"
    # the model: per bucket the pseudo-gradient (a subtraction, priced as a copy) packed, then
    # after the all-reduce unpacked into the outer gradients, the outer step and the
    # parameters copied back from the global ones
    rule = replace(_Periodic.rule, sync_before=(COPY, COPY),
                   sync_after=(COPY, "outer_step_s_per_byte", COPY))

    def __init__(self, model, optimizer, comm, options=None, compressor=None, model_name=None):
        super().__init__(model, optimizer, comm, options, compressor, model_name)
        import torch
        # the global parameters (every replica's at the last sync) and their outer optimizer
        self.global_params = [p.detach().clone() for p in self.params]
        momentum = float(self.options.outer_momentum)
        self.outer = torch.optim.SGD(self.global_params, lr=float(self.options.outer_lr),
                                     momentum=momentum, nesterov=momentum > 0)

    def _sync(self) -> None:
        import torch
        with torch.no_grad():
            for g in self.global_params:
                if g.grad is None:
                    g.grad = torch.empty_like(g)
            if self.comm.size == 1:   # one replica's pseudo-gradient is its average: no buffer
                for g, p in zip(self.global_params, self.params):
                    torch.sub(g, p.detach(), out=g.grad)
            else:
                flats = self._average(lambda i: self.global_params[i] - self.params[i].detach())
                self._unpack(flats, lambda i: self.global_params[i].grad)
            self.outer.step()
            from ..compat import copy_all
            copy_all([p.detach() for p in self.params], self.global_params)

    def describe(self) -> dict:
        d = super().describe()
        d.update({"outer_lr": float(self.options.outer_lr),
                  "outer_momentum": float(self.options.outer_momentum),
                  "outer_nesterov": float(self.options.outer_momentum) > 0,
                  "global_copy_bytes": sum(g.numel() * g.element_size()
                                           for g in self.global_params)})
        return d


# -- torch's own local SGD as the peer ------------------------------------------------------------

@dataclass(frozen=True)
class DDPLocalSGDOptions(DDPOptions):
    period: int = period_option()


class _AveragerDist:
    """``torch.distributed`` as torch's ``model_averaging.utils`` sees it while the averager
    runs (``_averager_collectives``): its ``all_reduce`` of the flat parameters goes through
    ``Comm`` (counted, traced, labelled with the parameters' names), all else is torch's."""

    def __init__(self, comm, group, label):
        self.comm, self.group, self.label = comm, group, label
        self.calls = 0

    def __getattr__(self, name):
        import torch.distributed as dist
        return getattr(dist, name)

    def all_reduce(self, tensor, op=None, group=None, async_op=False):
        import torch.distributed as dist
        if group is not self.group or op not in (None, dist.ReduceOp.SUM):
            raise RuntimeError(f"torch's PeriodicModelAverager all-reduced on group {group} "
                               f"with op {op}: the method expects a sum on its own group")
        self.calls += 1
        with self.comm.about(self.label):
            return self.comm.allreduce(tensor, async_op=async_op)


class _AveragerCollectives:
    """While inside, torch's averaging utilities issue their collectives through ``proxy``."""

    def __init__(self, proxy):
        from torch.distributed.algorithms.model_averaging import utils
        self.utils, self.proxy = utils, proxy

    def __enter__(self):
        self.saved, self.utils.dist = self.utils.dist, self.proxy

    def __exit__(self, *_exc):
        self.utils.dist = self.saved


class DDPLocalSGD(_LocalSGDReference, Method):
    id = "ddp_localsgd"
    display = "DDP+PeriodicModelAverager"
    summary = ("torch DDP with torch's `post_localSGD_hook` (each worker's gradients reduced "
               "on its own group of one: local steps) and torch's `PeriodicModelAverager`, "
               "which all-reduces the parameters as one flat buffer after every `--period`-th "
               "step: `localsgd` as torch runs it")
    Options = DDPLocalSGDOptions
    changes_algorithm = LocalSGD.changes_algorithm
    # the model: localsgd's, with the parameters in one message (torch packs them all)
    rule = rules.Rule(grouping=rules.one_message, after_backward=True, period="sync_period")

    @classmethod
    def averager_warmup(cls, period: int) -> int:
        """The averager's ``warmup_steps``: it averages after its calls (counted from 0)
        ``warmup_steps``, ``warmup_steps + H``, ...; H - 1 puts the averages after steps H,
        2H, ... (counted from 1), as ``localsgd``'s."""
        return period - 1

    def __init__(self, model, optimizer, comm, options=None, compressor=None, model_name=None):
        super().__init__(model, optimizer, comm, options, compressor, model_name)
        import warnings

        import torch.distributed as dist
        from torch.distributed.algorithms.ddp_comm_hooks.post_localSGD_hook import (
            PostLocalSGDState, post_localSGD_hook)
        from torch.distributed.algorithms.model_averaging.averagers import (
            PeriodicModelAverager)
        self.period = self.sync_period(self.options)
        self.bucket_cap_mb = float(self.options.bucket_cap_mb)
        world = comm.group if comm.group is not None else dist.group.WORLD
        # every worker a group of its own (collective: every rank builds them all); the
        # hook's default, the machine's group, needs CUDA's device count
        ranks = dist.get_process_group_ranks(world)
        self.own_group, _ = dist.new_subgroups_by_enumeration(
            [[r] for r in ranks], backend=dist.get_backend(world))
        device = self.params[0].device
        self.ddp, self.first_bucket_bytes = _build_ddp(model, self.bucket_cap_mb, device,
                                                       comm.group)
        # local steps from the first: no warm-up of synchronous DDP steps
        self.state = PostLocalSGDState(process_group=world, subgroup=self.own_group,
                                       start_localSGD_iter=0)
        self.ddp.register_comm_hook(self.state, post_localSGD_hook)
        with warnings.catch_warnings():   # its advice at H = 1 (use DDP alone)
            warnings.simplefilter("ignore", UserWarning)
            self.averager = PeriodicModelAverager(period=self.period,
                                                  warmup_steps=self.averager_warmup(self.period),
                                                  process_group=world)
        self._dist = _AveragerDist(comm, world, lambda: tensors_label(self.param_names))
        self.steps = 0

    @property
    def module(self):
        return self.ddp

    def step(self) -> None:
        self.optimizer.step()
        # torch's call, after the step, while the gradients are set (it averages only the
        # parameters that have one)
        with _AveragerCollectives(self._dist):
            self.averager.average_parameters(self.model.parameters())
        self.steps += 1

    def describe(self) -> dict:
        d = super().describe()
        d.update({"period": self.period, "steps": self.steps, "syncs": self._dist.calls,
                  "warmup_steps": self.averager.warmup_steps, "start_localSGD_iter": 0,
                  "bucket_cap_mb": self.bucket_cap_mb,
                  "first_bucket_bytes": self.first_bucket_bytes,
                  "averaged_bytes": sum(p.numel() * p.element_size() for p in self.params),
                  "bytes_counted_from": "PeriodicModelAverager's all-reduce",
                  "changes_algorithm": self.changes_algorithm})
        return d

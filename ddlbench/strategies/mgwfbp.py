"""MG-WFBP (DESIGN.md section 4): buckets chosen by the merge rule from measured backward times.

The strategy is the bucketed all-reduce engine of ``allreduce.py`` (buckets started strictly in
bucket order on every rank) with its buckets planned once, before training, in ``calibrate``:

1. profile: per-tensor backward times and the forward time from gradient hooks
   (``ddlbench.profiler``; 5 warm-up and 50 measured iterations unless the environment says
   ``DDLBENCH_MGWFBP_WARMUP`` / ``DDLBENCH_MGWFBP_ITERS``), and alpha/beta from a short
   all-reduce micro-benchmark over this model's tensor sizes (``DDLBENCH_MGWFBP_COMM_ITERS``
   timed all-reduces per size, default 10) - or all of it read from ``--mgwfbp-profile FILE``
   (``python -m ddlbench.profiler --output FILE`` writes one), so a plan can be made for
   another cluster; only rank 0 reads it (it need exist only on rank 0's host); a profile of
   another model is refused with one line, on every rank, with a non-zero exit;
2. rank 0 runs ``merge_groups`` and broadcasts the groups (with the profile they came from);
   every rank plans the same buckets from them. The groups are printed (bytes, in order) and
   kept in the run record (``describe()``).

While calibrating, the strategy's own gradient hooks do nothing: no method collective runs.
The base class's rebuild of the buckets from rank 0's first-step order is off: the plan already
follows the order rank 0 measured.
"""
from __future__ import annotations

import os

import torch
import torch.distributed as dist

from .. import profiler
from ..errors import UsageError
from . import register
from .allreduce import BucketedAllReduce


# --------------------------------------------------------------------------- the merge rule

def _comm_starts(ready: list[float], tc: list[float]) -> list[float]:
    """tauc of DESIGN.md section 3, forward indices: tauc[L-1] = ready[L-1];
    tauc[l] = max(tauc[l+1] + tc[l+1], ready[l])."""
    n = len(ready)
    tauc = [0.0] * n
    tauc[n - 1] = ready[n - 1]
    for l in range(n - 2, -1, -1):
        tauc[l] = max(tauc[l + 1] + tc[l + 1], ready[l])
    return tauc


def _forward_view(backward_s, nbytes):
    """Backward-order lists to the forward indices of DESIGN.md (l = 0 next to the input):
    backward position b is layer l = L-1-b. Returns tb, sizes, ready = taub + tb."""
    n = len(nbytes)
    tb = [float(backward_s[n - 1 - l]) for l in range(n)]
    size = [int(nbytes[n - 1 - l]) for l in range(n)]
    taub = [0.0] * n
    for l in range(n - 2, -1, -1):
        taub[l] = taub[l + 1] + tb[l + 1]
    return tb, size, [taub[l] + tb[l] for l in range(n)]


def merge_groups(backward_s: list[float], nbytes: list[int], alpha: float, beta: float,
                 min_group_bytes: int = 0) -> list[list[int]]:
    """MG-WFBP's merge rule, exactly as DESIGN.md section 4 states it.

    Inputs in *backward order* (position 0 = the first gradient ready, the layer next to the
    output): ``backward_s[b]`` the backward time of tensor b (the gap since the previous one was
    ready), ``nbytes[b]`` its size; ``alpha`` seconds per message and ``beta`` seconds per byte
    (one message of M bytes costs ``alpha + beta*M``); ``min_group_bytes`` the original's
    small-group option (0 = off).

    The rule is written in forward indices, l = 0 next to the input; backward position b is
    l = L-1-b. With taub[L-1] = 0, taub[l] = taub[l+1] + tb[l+1] (when l's backward starts),
    tc[l] = alpha + beta*bytes(l) and tauc from section 3 (when l's message starts), walk
    l = L-1 down to 1: merge l into l-1 when ``taub[l-1] + tb[l-1] < tauc[l] + alpha`` (l-1 is
    ready before l's message would have paid its start-up cost), or, the option, when l's group
    so far is smaller than ``min_group_bytes``. A merge sets tc[l] = 0, moves l's bytes to l-1,
    sets tc[l-1] = alpha + beta*bytes(l-1) and recomputes tauc; otherwise the group closes at l.
    Tensor 0 ends the last group.

    Interpretation choices: the comparison is strict (a tie does not merge); "bytes(l-1)" after
    a merge is the whole group's bytes so far, and the small-group test looks at that same
    running total, checked only when the timing rule did not merge.

    Returns the groups as lists of backward positions, in backward order (consecutive runs
    covering 0..L-1): the first group is the first to be sent."""
    n = len(nbytes)
    if len(backward_s) != n:
        raise ValueError(f"{len(backward_s)} backward times for {n} tensors")
    if n == 0:
        return []
    _, size, ready = _forward_view(backward_s, nbytes)
    tc = [alpha + beta * s for s in size]
    tauc = _comm_starts(ready, tc)
    groups, current = [], []
    for l in range(n - 1, 0, -1):
        current.append(n - 1 - l)
        merge = ready[l - 1] < tauc[l] + alpha or size[l] < min_group_bytes
        if merge:
            size[l - 1] += size[l]
            size[l] = 0
            tc[l] = 0.0
            tc[l - 1] = alpha + beta * size[l - 1]
            tauc = _comm_starts(ready, tc)
        else:
            groups.append(current)
            current = []
    current.append(n - 1)
    groups.append(current)
    return groups


def schedule_time(backward_s: list[float], nbytes: list[int], groups: list[list[int]],
                  alpha: float, beta: float) -> float:
    """Predicted time from the start of the backward pass until the last message is done
    (``tauc[0] + tc[0]`` of DESIGN.md section 3) when ``groups`` (backward positions, as
    ``merge_groups`` returns them) are each sent as one message of ``alpha + beta*bytes``
    after their last tensor is ready, one message at a time. Add the forward time for an
    iteration's time. ``[[0], [1], ...]`` is WFBP."""
    n = len(nbytes)
    if n == 0:
        return 0.0
    _, _, ready = _forward_view(backward_s, nbytes)
    tc = [0.0] * n
    for g in groups:
        l = n - 1 - max(g)  # the group goes when its last tensor (lowest l) is ready
        tc[l] = alpha + beta * sum(nbytes[b] for b in g)
    tauc = _comm_starts(ready, tc)
    return tauc[0] + tc[0]


# --------------------------------------------------------------------------- the strategy

def _env_int(name: str, default: int) -> int:
    value = os.environ.get(name, "")
    if value == "":
        return default
    try:
        v = int(value)
    except ValueError:
        raise UsageError(f"environment variable {name}={value!r} is not an integer") from None
    if v < 0:
        raise UsageError(f"environment variable {name} must be >= 0, got {v}")
    return v


class MGWFBPPlanning:
    """The planning half of MG-WFBP, shared by this engine's strategy and the Horovod lane's
    (``strategies/horovod.py``, which hands the groups to Horovod's grouped all-reduce).
    Needs ``self.params``, ``self.model``, ``self.comm``; call ``_init_planning`` first."""

    def _init_planning(self, settings) -> None:
        self._planned: list[list[int]] | None = None  # groups of parameter indices
        self.plan_info: dict = {}
        self.profile_path = settings.get("mgwfbp_profile")
        self.min_group = int(settings.get("mgwfbp_min_group") or 0)
        if self.min_group < 0:
            raise UsageError(f"--mgwfbp-min-group must be >= 0, got {self.min_group}")
        self.model_name = settings.get("model_name")

    def _plan_groups(self, forward_backward) -> list[list[int]]:
        """Profile (or read the profile), run the merge rule on rank 0, share its groups;
        prints them on rank 0. Returns the groups of parameter indices, in backward order."""
        plan = self._make_plan(forward_backward)
        if "error" in plan:
            raise UsageError(plan["error"])
        self._planned = plan["groups"]
        self.plan_info = plan["info"]
        if self.comm.rank == 0:
            info = self.plan_info
            print(f"MG-WFBP: {len(self._planned)} groups from {len(self.params)} tensors "
                  f"({info['source']}; alpha {info['alpha_s'] * 1e6:.2f} us, beta "
                  f"{info['beta_s_per_byte'] * 1e9:.4f} ns/B, fitted on "
                  f"{info['profile_nworkers']} worker(s)); group bytes in order: "
                  f"{info['group_bytes']}", flush=True)
            print(f"MG-WFBP: predicted backward + communication {info['predicted_s']['mgwfbp'] * 1e3:.3f} ms "
                  f"(WFBP {info['predicted_s']['wfbp'] * 1e3:.3f} ms, backward alone "
                  f"{info['predicted_s']['backward'] * 1e3:.3f} ms)", flush=True)
        return self._planned

    def _make_plan(self, forward_backward) -> dict:
        """Rank 0's plan (or the error it met), on every rank."""
        device = self.params[0].device if self.params else torch.device("cpu")
        plan = None
        if self.profile_path:
            if self.comm.rank == 0:
                try:
                    prof = profiler.read_profile(self.profile_path)
                    order = profiler.match_profile(prof, self.model, self.model_name,
                                                   self.profile_path)
                    plan = self._plan_from(prof, order, f"profile {self.profile_path}")
                except UsageError as e:
                    plan = {"error": str(e)}
        else:
            prof = profiler.make_profile(
                self.model, self.model_name or "model", forward_backward, device=device,
                group=self.comm.group,
                warmup=_env_int("DDLBENCH_MGWFBP_WARMUP", profiler.DEFAULT_WARMUP),
                iters=max(1, _env_int("DDLBENCH_MGWFBP_ITERS", profiler.DEFAULT_ITERS)),
                comm_warmup=profiler.DEFAULT_COMM_WARMUP,
                comm_iters=max(1, _env_int("DDLBENCH_MGWFBP_COMM_ITERS",
                                           profiler.DEFAULT_COMM_ITERS)))
            if self.comm.rank == 0:
                order = profiler.match_profile(prof, self.model, None, "measured here")
                plan = self._plan_from(prof, order, "measured")
        box = [plan]
        src = 0 if self.comm.group is None else dist.get_global_rank(self.comm.group, 0)
        dist.broadcast_object_list(box, src=src, group=self.comm.group)
        return box[0]

    def _plan_from(self, prof: dict, order: list[int], source: str) -> dict:
        nbytes = [t["bytes"] for t in prof["tensors"]]
        tb = prof["backward_s"]
        alpha, beta = prof["alpha_s"], prof["beta_s_per_byte"]
        element = self.params[0].element_size() if self.params else 4
        positions = merge_groups(tb, nbytes, alpha, beta, self.min_group * element)
        groups = [[order[b] for b in g] for g in positions]
        info = {
            "source": source, "alpha_s": alpha, "beta_s_per_byte": beta,
            "profile_nworkers": prof.get("nworkers"), "profile_backend": prof.get("backend"),
            "profile_network": prof.get("network"), "min_group_elements": self.min_group,
            "forward_s": prof["forward_s"],
            "tensor_order": [t["name"] for t in prof["tensors"]],
            "backward_s": list(tb),
            "groups": groups,
            "group_bytes": [sum(nbytes[b] for b in g) for g in positions],
            "predicted_s": {
                "backward": sum(tb),
                "wfbp": schedule_time(tb, nbytes, [[b] for b in range(len(nbytes))], alpha, beta),
                "mgwfbp": schedule_time(tb, nbytes, positions, alpha, beta)},
        }
        return {"groups": groups, "info": info}


@register
@register
class MGWFBP(MGWFBPPlanning, BucketedAllReduce):
    name = "mgwfbp"
    display = "MG-WFBP"

    def __init__(self, model, optimizer, comm, settings):
        self._calibrating = False
        self._init_planning(settings)
        super().__init__(model, optimizer, comm, settings)
        self.rebuild = False

    def _threshold(self, settings) -> float:
        return 0.0  # until calibrated: one bucket per tensor, as WFBP

    def _groups(self, order: list[int]) -> list[list[int]]:
        if self._planned is None:
            return super()._groups(order)
        # Groups never mix dtypes or devices (one flat buffer per bucket); split if they would.
        out = []
        for g in self._planned:
            current = []
            for i in g:
                if current and (self.params[i].dtype, self.params[i].device) != \
                        (self.params[current[0]].dtype, self.params[current[0]].device):
                    out.append(current)
                    current = []
                current.append(i)
            out.append(current)
        return out

    def _on_ready(self, i: int) -> None:
        if self._calibrating:
            return
        super()._on_ready(i)

    # -- calibration ------------------------------------------------------------------------
    def calibrate(self, forward_backward) -> None:
        self._calibrating = True
        try:
            groups = self._plan_groups(forward_backward)
        finally:
            self._calibrating = False
        self._plan([i for g in groups for i in g])

    def describe(self) -> dict:
        d = super().describe()
        d.pop("threshold_bytes", None)
        d["mgwfbp"] = self.plan_info
        return d

"""MG-WFBP: buckets chosen by the merge rule (docs/DESIGN.md section 4) from measured times.

The method is the bucketed all-reduce engine of ``allreduce.py`` (buckets started strictly in
bucket order on every rank) with its buckets planned once, before training, in ``calibrate``:

1. profile: per-tensor backward times and the forward time from gradient hooks
   (``ddlbench.measure.profiler``; 5 warm-up and 50 measured iterations unless ``--mgwfbp-warmup`` /
   ``--mgwfbp-iters`` say otherwise, or the environment's ``DDLBENCH_MGWFBP_WARMUP`` /
   ``DDLBENCH_MGWFBP_ITERS``), and alpha/beta from a short all-reduce micro-benchmark over
   this model's tensor sizes (``--mgwfbp-comm-iters`` timed all-reduces per size, default 10)
   - or all of it read from ``--mgwfbp-profile FILE``
   (``python -m ddlbench.measure.profiler --output FILE`` writes one), so a plan can be made for
   another cluster; only rank 0 reads it (it need exist only on rank 0's host); a profile of
   another model is refused with one line, on every rank, with a non-zero exit.
   ``--mgwfbp-ab table`` takes alpha and beta instead from the original suite's tables
   (``planning.original_alpha_beta``: by this run's worker count and ``DDLBENCH_NETWORK``,
   which the launchers export as rdma0/rdma1/rdma2), as the original did, and runs no
   micro-benchmark; ``measured`` (the default) is the above;
2. rank 0 runs ``merge_groups`` and broadcasts the groups (with the profile they came from);
   every rank plans the same buckets from them. The groups are printed (bytes, in order) and
   kept in the run record (``describe()``).

While calibrating, the method's own gradient hooks do nothing: no method collective runs.
The base class's rebuild of the buckets from rank 0's first-step order is off: the plan already
follows the order rank 0 measured. Until calibrated the buckets are WFBP's (one per tensor, no
buffer); planning the merged groups gives each group its flat buffer, and its gradients become
views into it (as every bucketed method's: ``allreduce.GradViews``).
"""
from __future__ import annotations

import os
from dataclasses import dataclass

from ..measure import profile_file, profiler
from ..errors import UsageError
from ..options import COUNT, COUNT0, NAME, Options, one_of, option
from ..planning import (DEFAULT_MIN_GROUP_ELEMENTS, merge_groups, original_alpha_beta,
                        schedule_time)
from . import rules
from .allreduce import BucketedAllReduce

# --mgwfbp-ab: where alpha and beta come from.
AB_SOURCES = ("table", "measured")
AB_SOURCE = one_of(*AB_SOURCES)


@dataclass(frozen=True)
class MGWFBPOptions(Options):
    mgwfbp_profile: str | None = option(
        None, NAME, "MG-WFBP: plan from this profile (backward times, alpha, beta) instead of "
        "measuring on this cluster", metavar="JSON")
    mgwfbp_min_group: int = option(
        DEFAULT_MIN_GROUP_ELEMENTS, COUNT0,
        "MG-WFBP: also merge any group smaller than this, as the original (0: off)",
        metavar="ELEMENTS")
    mgwfbp_warmup: int = option(
        profiler.DEFAULT_WARMUP, COUNT0, "MG-WFBP calibration: untimed iterations",
        env="DDLBENCH_MGWFBP_WARMUP", metavar="N")
    mgwfbp_iters: int = option(
        profiler.DEFAULT_ITERS, COUNT, "MG-WFBP calibration: measured iterations",
        env="DDLBENCH_MGWFBP_ITERS", metavar="N")
    mgwfbp_comm_iters: int = option(
        profiler.DEFAULT_COMM_ITERS, COUNT, "MG-WFBP calibration: timed all-reduces per size "
        "for the alpha-beta fit", env="DDLBENCH_MGWFBP_COMM_ITERS", metavar="N")
    mgwfbp_ab: str = option(
        "measured", AB_SOURCE, "MG-WFBP: alpha (s) and beta (s/byte) measured (the all-reduce "
        "micro-benchmark or --mgwfbp-profile) or from the original's table for this worker "
        "count and network (DDLBENCH_NETWORK rdma1/rdma2: its 56Gbps table, else 10Gbps)",
        env="DDLBENCH_MGWFBP_AB", metavar="table|measured")


# --------------------------------------------------------------------------- the method

class MGWFBPPlanning:
    """The planning half of MG-WFBP, shared by this engine's method and the Horovod lane's
    (``methods/horovod.py``, which hands the groups to Horovod's grouped all-reduce).
    Needs ``self.params``, ``self.model``, ``self.comm``, ``self.options`` (MGWFBPOptions) and
    ``self.model_name``; call ``_init_planning`` first."""

    @classmethod
    def merge_min_bytes(cls, options, element_size: int = 4) -> int:
        """The merge's small-group bound in bytes (``planning.merge_groups``' ``min_group``):
        ``--mgwfbp-min-group`` elements of ``element_size`` bytes. The plan and the model's rule
        (``rules.merged``) read it. Torch-free."""
        return int(options.mgwfbp_min_group) * element_size

    def _init_planning(self) -> None:
        self._planned: list[list[int]] | None = None  # groups of parameter indices
        self.plan_info: dict = {}
        self.profile_path = self.options.mgwfbp_profile
        self.min_group = self.options.mgwfbp_min_group
        self.ab = self.options.mgwfbp_ab

    def _table_ab(self) -> dict | None:
        """``--mgwfbp-ab table``: the original's alpha and beta for this run (its worker count,
        ``DDLBENCH_NETWORK``), else None; one line for a worker count the table lacks. Every
        rank computes it (the same on each) before any collective."""
        if self.ab != "table":
            return None
        network = os.environ.get("DDLBENCH_NETWORK") or None
        name, alpha, beta = original_alpha_beta(self.comm.size, network)
        return {"table": name, "nworkers": self.comm.size, "network": network,
                "alpha_s": alpha, "beta_s_per_byte": beta}

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
            if info["ab"] == "table":
                t = info["ab_table"]
                where = (f"the original's {t['table']} table for {t['nworkers']} workers"
                         if t["nworkers"] > 1 else "1 worker sends nothing")
                where += f", network {t['network'] or 'unset'}"
            else:
                where = f"fitted on {info['profile_nworkers']} worker(s)"
            print(f"MG-WFBP: {len(self._planned)} groups from {len(self.params)} tensors "
                  f"({info['source']}; alpha-beta {info['ab']}: alpha "
                  f"{info['alpha_s'] * 1e6:.2f} us, beta {info['beta_s_per_byte'] * 1e9:.4f} "
                  f"ns/B, {where}); group bytes in order: {info['group_bytes']}", flush=True)
            print(f"MG-WFBP: predicted backward + communication {info['predicted_s']['merged'] * 1e3:.3f} ms "
                  f"(WFBP {info['predicted_s']['per_tensor'] * 1e3:.3f} ms, backward alone "
                  f"{info['predicted_s']['backward'] * 1e3:.3f} ms)", flush=True)
        return self._planned

    def _make_plan(self, forward_backward) -> dict:
        """Rank 0's plan (or the error it met), on every rank."""
        import torch
        import torch.distributed as dist
        device = self.params[0].device if self.params else torch.device("cpu")
        table = self._table_ab()
        plan = None
        if self.profile_path:
            if self.comm.rank == 0:
                try:
                    prof = profile_file.read_profile(self.profile_path)
                    order = profile_file.match_profile(prof, self.model, self.model_name,
                                                   self.profile_path)
                    plan = self._plan_from(prof, order, f"profile {self.profile_path}",
                                           table)
                except UsageError as e:
                    plan = {"error": str(e)}
        else:
            prof = profiler.make_profile(
                self.model, self.model_name or "model", forward_backward, device=device,
                group=self.comm.group, warmup=self.options.mgwfbp_warmup,
                iters=self.options.mgwfbp_iters, comm_warmup=profiler.DEFAULT_COMM_WARMUP,
                comm_iters=self.options.mgwfbp_comm_iters,
                # the table's alpha and beta: no micro-benchmark (nor did the original run one)
                alpha=None if table is None else table["alpha_s"],
                beta=None if table is None else table["beta_s_per_byte"])
            if self.comm.rank == 0:
                order = profile_file.match_profile(prof, self.model, None, "measured here")
                plan = self._plan_from(prof, order, "measured", table)
        box = [plan]
        src = 0 if self.comm.group is None else dist.get_global_rank(self.comm.group, 0)
        dist.broadcast_object_list(box, src=src, group=self.comm.group)
        return box[0]

    def _plan_from(self, prof: dict, order: list[int], source: str,
                   table: dict | None = None) -> dict:
        """The plan from a profile (``source`` says where it came from); with ``table`` (see
        ``_table_ab``) its alpha and beta instead of the profile's."""
        nbytes = [t["bytes"] for t in prof["tensors"]]
        tb = prof["backward_s"]
        if table is None:
            alpha, beta = prof["alpha_s"], prof["beta_s_per_byte"]
        else:
            alpha, beta = table["alpha_s"], table["beta_s_per_byte"]
        element = self.params[0].element_size() if self.params else 4
        positions = merge_groups(tb, nbytes, alpha, beta,
                                 self.merge_min_bytes(self.options, element))
        groups = [[order[b] for b in g] for g in positions]
        info = {
            "source": source, "ab": "measured" if table is None else "table",
            "ab_table": table, "alpha_s": alpha, "beta_s_per_byte": beta,
            "profile_nworkers": prof.get("nworkers"), "profile_backend": prof.get("backend"),
            "profile_network": prof.get("network"), "min_group_elements": self.min_group,
            "forward_s": prof["forward_s"],
            "tensor_order": [t["name"] for t in prof["tensors"]],
            "backward_s": list(tb),
            "groups": groups,
            "group_bytes": [sum(nbytes[b] for b in g) for g in positions],
            "predicted_s": {
                "backward": sum(tb),
                "per_tensor": schedule_time(tb, nbytes, [[b] for b in range(len(nbytes))],
                                            alpha, beta),
                "merged": schedule_time(tb, nbytes, positions, alpha, beta)},
        }
        return {"groups": groups, "info": info}


class MGWFBP(MGWFBPPlanning, BucketedAllReduce):
    id = "mgwfbp"
    display = "MG-WFBP"
    summary = ("buckets chosen by the MG-WFBP merge rule from measured per-tensor backward "
               "times and an alpha-beta model (fitted, or the original's tables)")
    Options = MGWFBPOptions
    rule = rules.Rule(grouping=rules.merged, advise=rules.min_group_grid, plan_ab="mgwfbp_ab")
    hatch = "**"
    rebuild = False  # the plan already follows the order rank 0 measured

    def __init__(self, model, optimizer, comm, options=None, compressor=None, model_name=None):
        self._calibrating = False
        self._planned = None  # until calibrated: one bucket per tensor, as WFBP
        super().__init__(model, optimizer, comm, options, compressor, model_name)
        self._init_planning()

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

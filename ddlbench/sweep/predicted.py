"""A sweep's cells predicted by the performance model instead of run: ``benchmarks.py
--predict-only`` (docs/DESIGN.md section 15).

Each cell's prediction is one store line of the same kind a run makes (``kind: try``, status
ok, its throughput, and a ``record`` whose ``timeline`` holds the predicted metrics, so the
reports' tables, speedups, "where the time goes" and plots come out as for a measured sweep),
marked ``predicted`` with everything it was made from: the profile, the network description
and the method's settings, and what the model decided (``ps_local``: the all-reduce a PS cell
on one machine ran as; ``notes``). Each cell is ``ddlbench.model.cell.predict``'s, the path the
command line and ``python -m ddlbench.model.validation`` take too. The store goes to
``<results>/<date>-<name>-predicted/``, never beside measured tries.

What a cell is predicted from (the sweep file's optional ``predict:`` mapping)::

    predict:
      networks: {rdma0: survey-10gbe, local: my-comm-bench.json}  # network -> topology/files
      profiles: {resnet50: configs/profiles/h200_resnet50_bs64.json}  # model (or model_BS)
      device_throughput: survey     # or {resnet50: 253.1}: one worker's samples/s (rescales)
      codec: codec.json             # codec_bench --output (encode/decode per element)

Defaults: the networks ``rdma0``/``rdma1``/``rdma2`` are the survey's cluster
(``configs/topology/survey-10gbe``, ``-100gib``, ``-100gbe``); a task's profile is the shipped
``configs/profiles/*.json`` of its model and batch size; no rescaling; no codec time. Anything
missing is one line naming the cell. Horovod-engine cells are left out (the model does not tell
engines apart), with a note.
"""
from __future__ import annotations

import glob
import json
import os

from ..model import cell as cell_model
from ..model import predict, simulate, survey, topology
from ..errors import UsageError
from ..options import BATCHES_PER_ITER
from ..measure.profile_file import read_profile

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SURVEY_TOPOLOGIES = {0: "survey-10gbe", 1: "survey-100gib", 2: "survey-100gbe"}
PROFILES = os.path.join(REPO, "configs", "profiles")


def _path(p: str) -> str:
    return p if os.path.isabs(p) or os.path.exists(p) else os.path.join(REPO, p)


class Predictor:
    """Predictions of one sweep's cells; profiles and networks read once."""

    def __init__(self, sweep, profile: str | None = None, network: str | None = None,
                 codec: str | None = None, pace: float = 1.0, calibrated_at: int | None = None):
        """``profile``, ``network`` and ``codec``: use these for every cell (a calibrated
        sweep's own files) instead of the sweep file's ``predict:`` and the defaults.
        ``pace``: the machine's compute takes this many times the profile's (a calibrated
        sweep's pace probe, ddlbench/sweep/calibrate.py): every compute, codec and host time
        is scaled by it, the network's fits are not. ``calibrated_at``: the worker count the
        files were measured at (a calibrated sweep's); a cell of more workers is then
        extrapolated from them (the network's measured ring, ``topology.Measured``'s
        ``extrapolate``; the compute by ``sharing``)."""
        if not 0 < pace < float("inf"):
            raise UsageError(f"a pace must be a positive number, got {pace!r}")
        self.sweep, self.pace, self.calibrated_at = sweep, pace, calibrated_at
        self.conf = sweep.predict or {}
        self.given_profile, self.given_network, self.given_codec = profile, network, codec
        self._profiles: dict = {}
        self._networks: dict = {}

    def network(self, cell) -> tuple[str, topology.Network]:
        net = cell.network
        spec = self.given_network or (self.conf.get("networks") or {}).get(net.name)
        if spec is None and net.kind == "rdma":
            spec = SURVEY_TOPOLOGIES.get(int(net.profile))
        if spec is None:
            raise UsageError(f"cell {cell.name}: no network description for network "
                             f"{net.name}; give one under predict: networks: (a topology in "
                             f"configs/topology/ or comm_bench --output files)")
        if spec not in self._networks:
            self._networks[spec] = topology.load(spec if not spec.endswith(
                (".yaml", ".yml", ".json")) else ",".join(_path(s) for s in spec.split(",")),
                extrapolate=self.calibrated_at is not None)
        return spec, self._networks[spec]

    def profile(self, cell) -> tuple[str, dict]:
        model, batch = cell.task["model"], int(cell.task["batch_size"])
        given = self.conf.get("profiles") or {}
        path = self.given_profile or given.get(f"{model}_{batch}") or given.get(model)
        if path is None:
            for candidate in sorted(glob.glob(os.path.join(PROFILES, "*.json"))):
                try:
                    prof = read_profile(candidate)
                except UsageError:
                    continue
                if prof["model"] == model and \
                        int((prof.get("workload") or {}).get("batch_size") or 0) == batch:
                    path = candidate
                    break
        if path is None:
            raise UsageError(f"cell {cell.name}: no profile of {model} at batch {batch}; "
                             f"write one with python -m ddlbench.measure.profiler --model {model} "
                             f"--batch-size {batch} --output FILE and name it under predict: "
                             f"profiles:")
        path = _path(path)
        if path not in self._profiles:
            self._profiles[path] = read_profile(path)
        prof = self._profiles[path]
        if prof["model"] != model:
            raise UsageError(f"cell {cell.name}: profile {path} is of model {prof['model']}, "
                             f"not {model}")
        pbatch = int((prof.get("workload") or {}).get("batch_size") or 0)
        if pbatch != batch:
            raise UsageError(f"cell {cell.name}: profile {path} was measured at batch {pbatch}, "
                             f"the task trains batch {batch}")
        return path, prof

    def device_throughput(self, cell) -> float | None:
        dt = self.conf.get("device_throughput")
        model = cell.task["model"]
        if dt == "survey":
            return survey.single_gpu(model)
        if isinstance(dt, dict):
            return dt.get(model)
        return None

    def predict(self, cell) -> dict:
        """The cell's store line: its workload from the profile (rescaled to the device,
        at the machine's and the slowest rank's pace) and its prediction by the model's one
        path (``ddlbench.model.cell.predict``: the one-machine rule, the PS clients, MG-WFBP's
        plan and the 1-worker cells are decided there)."""
        path, prof = self.profile(cell)
        spec, net = self.network(cell)
        m = cell.method
        batch, P = int(cell.task["batch_size"]), cell.nworkers
        work, rate, machine = self.workload(cell, prof)
        compressor = m.get("compressor", "none")
        codec_file = self.given_codec or (_path(self.conf["codec"]) if self.conf.get("codec")
                                          else None)
        enc, dec, enc_wait = predict._codec_times(codec_file, prof["model"], compressor)
        # the cell's options as its run resolves them (the rule reads them)
        options = simulate.method_class(m["method"]).Options.resolve(m)
        # the run's timing round (a method whose next forward overlaps the last step's tail,
        # ByteScheduler's, loses that at the synchronize ending it; the others ignore it)
        rounds = int(self.sweep.timing.get("batches_per_iter", BATCHES_PER_ITER))
        answer = cell_model.predict(
            m["method"], work, P, options, machine=machine,
            spread=predict.spread_of(prof, spec), batches_per_iter=rounds, network=net,
            codec=simulate.Codec(compressor, P, m, enc, dec,
                                 encode_at_wait_s_per_element=enc_wait),
            ps_interference=predict.interference_of(prof, ps=True),
            one_machine=cell.one_machine,
            table_network=(cell.network.name if cell.network.kind == "rdma" else None))
        p = answer.prediction
        unit = "img/sec" if "image_size" in (prof.get("workload") or {}) or \
            prof["model"] not in ("bert", "bert_base", "bert_tiny") else "sen/sec"
        device = str(prof.get("device") or "")
        return {"kind": "try", "sweep": self.sweep.name, "hash": cell.hash, "cell": cell.name,
                "try": 0, "attempt": 1, "config": cell.config(), "label": cell.label,
                "architecture": cell.architecture, "status": "ok",
                "throughput": p.throughput(batch, P), "throughput_std": 0.0, "unit": unit,
                "interval": list(answer.interval(batch, P)),
                "noun": "GPU" if device.startswith("cuda") else "CPU",
                "predicted": {"profile": os.path.relpath(path, REPO) if path.startswith(REPO)
                              else path, "network": spec,
                              "codec": codec_file if compressor != "none" else None,
                              "device_throughput": rate, "pace": self.pace,
                              "slowest_rank": machine.slowest_rank,
                              **({"calibrated_at": self.calibrated_at,
                                  "sharing": answer.machine["sharing"]}
                                 if self.calibrated_at not in (None, P) else {}),
                              "cores": machine.cores, "threads": machine.threads,
                              "gil_s": answer.machine["gil_s"],
                              "interval_from": answer.spread_note,
                              "iteration_s": p.iteration_s,
                              "messages": len(p.message_bytes), "bottleneck": p.bottleneck,
                              "ps_local": answer.ps_local, "notes": list(answer.notes)},
                "record": {"timeline": {"mean": p.metrics, "comm_observed": True}}}

    def workload(self, cell, prof: dict) -> tuple:
        """(the cell's ``simulate.Compute``, the device throughput it was rescaled to or None,
        the ``cell.Machine`` the model adjusts it for): the profile's compute with its
        all-reduce interference (the PS cells' beside push/pulls is the model's to swap in),
        rescaled to the device; the machine's pace, the slowest rank's and, extrapolated from
        fewer workers (``calibrated_at``), the workers sharing the cores are the model's
        (``ddlbench.model.cell.predict``, the one path: ``predict.machine_of``'s machine,
        this sweep's threads per worker, a local cell's cores this machine's)."""
        batch = int(cell.task["batch_size"])
        work = predict.workload_of(prof, float(prof.get("optimizer_s") or 0.0))
        rate = self.device_throughput(cell)
        if rate:
            work = predict.rescaled(work, batch, rate)
        # a local cell's workers share this machine's cores, whatever device the profile
        # names; a cluster's (rdma) cells the profile's machine
        cores = None
        if cell.network.kind == "net":
            from ..hosts import pinning
            cores = len(pinning.available_cores())
        machine = predict.machine_of(prof, cell.nworkers, cores=cores,
                                     threads=int(self.sweep.threads or 1),
                                     calibrated_at=self.calibrated_at, pace=self.pace)
        return work, rate, machine


def run(sweep, cells: list, folder: str) -> tuple[int, list[str]]:
    """Predict ``cells`` into a new store in ``folder``; (cells predicted, notes)."""
    from . import store
    predictor = Predictor(sweep)
    notes, lines = [], []
    left = sorted({c.engine for c in cells if c.engine != "torch"})
    if left:
        notes.append(f"engine(s) {', '.join(left)} left out: the model does not tell engines "
                     f"apart")
    cells = [c for c in cells if c.engine == "torch"]
    for cell in cells:               # every problem before anything is written
        lines.append(predictor.predict(cell))
    os.makedirs(folder, exist_ok=True)
    path = store.store_path(folder)
    if os.path.exists(path):
        os.remove(path)              # predictions are remade whole, never mixed
    header = {"kind": "sweep", **sweep.header(), "engines": ["torch"],
              "cells": [c.hash for c in cells], "tries": 1, "min_ok": 1, "predicted": True}
    store.append(path, header)
    for line in lines:
        store.append(path, line)
    with open(os.path.join(folder, "predicted.json"), "w") as f:
        json.dump({"sweep": sweep.name, "cells": len(lines),
                   "predict": sweep.predict or {}}, f, indent=1)
    return len(lines), notes

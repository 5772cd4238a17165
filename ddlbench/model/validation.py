"""The performance model against the survey's published table (issue 18):
``python -m ddlbench.model.validation survey``.

    python -m ddlbench.model.validation survey                              # topology files
    python -m ddlbench.model.validation survey --network-source original --output v.json \\
        --markdown v.md

Every published multi-GPU cell (``configs/reference/survey_results.yaml``,
``ddlbench.model.survey``)
is predicted by ``ddlbench.model.simulate`` and compared with the measurement:

- **compute**: the model's H200 layer-wise profile (``configs/profiles/``), every time scaled by
  one factor so that one worker runs at the survey's 1-GPU throughput (``predict.rescaled``: the
  iteration is batch / 1-GPU figure). That is the only thing taken from the table; nothing is
  fitted to its multi-GPU cells. The per-GPU batch is the cell's; where it differed from the
  profile's, the profile's shape would be scaled to the cell's batch (the same call) and the cell
  says so (the survey's batches are the profiles': 64, 8, 64). No optimizer step: the profiles
  have none (0 s), so it sits inside the rescaled compute, which reproduces the 1-GPU figure.
- **one path**: every cell is ``ddlbench.model.cell.predict``'s, the function the CLI and the
  sweep (``benchmarks.py --config paper --predict-only``) call too, on the same inputs: a cell
  predicted here and by the paper preset has the same number.
- **network**: ``topology`` (default): the cell's network from ``configs/topology/survey-*.yaml``
  (8 machines x 4 GPUs on PCIe 3.0; 10GbE TCP, 100Gb InfiniBand RDMA, TCP over the 100Gb
  fabric), for all-reduce (``link("allreduce", P)``) and push/pull (``ps(P)``: one client per
  machine, one server per worker machine, plus ``local_reduce(P)``). ``original``: every
  all-reduce (a PS cell's on one machine included) costs the original's fitted alpha-beta
  (``planning.ORIGINAL_AB_TABLES``: "10Gbps" for rdma 0, "56Gbps" for rdma 1 and 2); a worker
  count missing from the table leaves the cell not modelled. The original has no push/pull
  table: the PS cells with servers keep the topology file's under both sources.
- **methods**: the table's seven, by the YAML's ids, with the settings of the suite's paper
  preset (``configs/paper.yaml``, ``preset_settings``): BSP-A2A ``bspa2a`` (one all-reduce after
  the backward), WFBP-A2A ``wfbp`` (Horovod over NCCL with fusion threshold 0: one all-reduce
  per tensor), MG-WFBP ``mgwfbp`` (groups under 8192 elements merged; ``mgwfbp_ab: table``:
  the merge planned with the original's alpha-beta table for the cell's P and rdma, as the
  original planned it whatever the network, the messages costed on the cell's link),
  ByteScheduler-A2A ``bytescheduler`` (partition 4M, credit 16M elements), BSP-PS ``bspps``,
  WFBP-PS ``wfbpps`` and ByteScheduler-PS ``byteschedulerps`` (partitions of 4,096,000 bytes),
  each in the preset's timing round (``timing: batches_per_iter``, 10: ByteScheduler's next
  forward loses its overlap at the synchronize ending it).
- **one worker machine, PS**: the original's byteps/launch.sh sets DMLC_NUM_WORKER to
  nworkers/4, 1 at 4 GPUs, and BytePS then "will not use the parameter servers or schedulers at
  all" and "is basically doing NCCL allreduce" (bytedance/byteps docs/best-practice.md). So a PS
  cell whose workers fit in one machine is predicted as a local all-reduce (``cell``'s rule):
  the replay of the all-reduce method its rule names (``Rule.one_machine``: ``bspps`` ->
  ``bspa2a``, ``wfbpps`` and ``byteschedulerps`` -> ``wfbp``, at that method's settings) on
  the cell's all-reduce link (the topology's intra-node ring; under ``original`` the table's);
  the row says so (``ps_local``).
- **odd cells**: configs/reference/survey_results.yaml notes that on 100GbE (rdma 2) ResNet-50
  and BERT-Large with BSP-PS and WFBP-PS at 8-32 GPUs are within 2% of their 10GbE figures and
  "look like 10GbE runs". Those 12 cells are kept, flagged (``odd``), and every median is also
  given without them.

Prints a row per cell (published, predicted, error = (predicted - published) / published, flags
``local:<method>`` and ``odd``), the median |error| per network, method and model and overall
with the 90th percentile (linear interpolation, numpy's default), each also without the odd
cells, and the survey's qualitative findings checked on the predictions and on the published
table alike (PASS/FAIL with the numbers). ``--output`` writes all of it as JSON (``summary``
and ``summary_without_odd``), ``--markdown`` the summary tables as Markdown.
"""
from __future__ import annotations

import functools
import json
import os
import statistics
import sys
import time

from .. import methods, yamlfile
from . import cell as cell_model
from . import predict, rules, simulate, survey, topology
from ..errors import ArgumentParser, UsageError, check_writable, open_to_write, run_cli
from ..measure.profile_file import read_profile
from ..options import BATCHES_PER_ITER
from ..planning import ORIGINAL_AB_TABLES, original_ab_table

PROFILE_DIR = os.path.join(survey.REPO, "configs", "profiles")
# the survey's models: their H200 profiles
PROFILES = {"resnet50": "h200_resnet50_bs64.json", "bert": "h200_bert_bs8.json",
            "bert_base": "h200_bert_base_bs64.json"}
# the original's rdma switch: the survey's networks as topology files
TOPOLOGIES = {0: "survey-10gbe", 1: "survey-100gib", 2: "survey-100gbe"}
SHORT = {0: "10GbE", 1: "100GbIB", 2: "100GbE"}
SOURCES = ("topology", "original")
# the survey's runs as the suite's paper preset runs them (``preset_settings``)
PRESET = os.path.join(survey.REPO, "configs", "paper.yaml")
PS_CLIENTS = "machine"
# BytePS on one worker machine runs non-distributed, "basically doing NCCL allreduce"
# (bytedance/byteps docs/best-practice.md; the original's launch.sh: DMLC_NUM_WORKER =
# nworkers/4): each PS method's nearest all-reduce method (its rule's ``one_machine``), replayed
# on the cell's all-reduce link (``ddlbench.model.cell``)
PS_LOCAL_NOTE = ("PS cells on one worker machine (4 GPUs): BytePS with DMLC_NUM_WORKER=1 (the "
                 "original's launch.sh: nworkers/4) uses no server and runs a local NCCL "
                 "all-reduce (bytedance/byteps docs/best-practice.md), predicted as {pairs} on "
                 "the cell's all-reduce link (the topology's intra-node ring; under the "
                 "original source the original's table)")
ODD_NOTE = ("100GbE BSP-PS and WFBP-PS cells of ResNet-50 and BERT-Large at 8-32 GPUs, within "
            "2% of their 10GbE figures: they look like 10GbE runs "
            "(configs/reference/survey_results.yaml)")


def survey_methods(architecture: str) -> tuple[str, ...]:
    """The survey table's methods of one architecture, in its order."""
    return tuple(m for m in survey.methods() if methods.lookup(m).architecture == architecture)


@functools.lru_cache(maxsize=4)
def preset_settings(path: str = PRESET) -> dict[str, dict]:
    """method -> the simulator's settings of the survey's runs as the paper preset
    (``configs/paper.yaml``) runs them: each method's options at their defaults, then as its
    ``methods:`` entry sets them (MG-WFBP's ``mgwfbp_ab: table``, ByteScheduler's partition
    and credit, BSP-PS's threshold), and the preset's timing round (``timing:
    batches_per_iter``, ByteScheduler's; the others finish every iteration in it). So
    ``benchmarks.py --config paper --predict-only`` and this validation predict a cell alike."""
    doc = yamlfile.load(path, "the paper preset")
    entries = doc.get("methods") if isinstance(doc, dict) else None
    timing = (doc.get("timing") if isinstance(doc, dict) else None) or {}
    if not isinstance(entries, list) or not isinstance(timing, dict):
        raise UsageError(f"the paper preset {path} needs a 'methods' list and a 'timing' "
                         f"mapping")
    rounds = int(timing.get("batches_per_iter", BATCHES_PER_ITER))
    out = {}
    for entry in entries:
        entry = {"method": entry} if isinstance(entry, str) else entry
        if not isinstance(entry, dict) or not isinstance(entry.get("method"), str):
            raise UsageError(f"the paper preset {path}: a method entry {entry!r} names no "
                             f"method")
        specs = methods.lookup(entry["method"]).Options.specs()
        values = {s.name: entry.get(s.name, s.default) for s in specs}
        out[entry["method"]] = {**rules.simulator_settings(values), "batches_per_iter": rounds}
    return out


def settings_of(method: str) -> dict:
    """The simulator's settings of ``method`` in the survey's runs: the paper preset's
    (``preset_settings``); a method the preset lacks at its defaults, in the preset's timing
    round."""
    preset = preset_settings()
    if method in preset:
        return dict(preset[method])
    rounds = next(iter(preset.values()), {}).get("batches_per_iter", BATCHES_PER_ITER)
    return {**cell_model.default_settings(method), "batches_per_iter": rounds}


def ps_local_analogue() -> dict[str, str]:
    """PS method -> the all-reduce method BytePS runs as on one machine (its rule's)."""
    return {m: cls.model.one_machine for m, cls in methods.registry().items()
            if cls.model is not None and cls.model.one_machine}


class NotModelled(Exception):
    """A cell the simulator cannot predict; the message says why."""


# --------------------------------------------------------------------------- inputs

def workloads(batches: dict) -> dict:
    """(model, batch) -> (simulate.Compute rescaled to the survey's 1-GPU figure, note or None), for
    every model and per-GPU batch (``batches``: model -> batches of its cells). The optimizer
    step is 0 (none profiled)."""
    out = {}
    for model in batches:
        if model not in PROFILES:
            continue
        prof = read_profile(os.path.join(PROFILE_DIR, PROFILES[model]))
        if prof["model"] != model:
            raise UsageError(f"profile {PROFILES[model]} is of model {prof['model']}, not "
                             f"{model}")
        base = predict.workload_of(prof, 0.0)
        profiled = int((prof.get("workload") or {}).get("batch_size") or 0)
        for batch in sorted(batches[model]):
            note = None
            if batch != profiled:
                note = (f"the table's batch {batch} differs from the profile's {profiled}: "
                        f"compute scaled to batch {batch} / 1-GPU throughput, the profile's "
                        f"shape and bytes kept")
            out[(model, batch)] = (predict.rescaled(base, batch, survey.single_gpu(model)),
                                   note)
    return out


def a2a_link(cell: dict, source: str, networks: dict, tables=None) -> tuple[simulate.Link, str]:
    """The all-reduce link of ``cell`` and where it comes from, in words."""
    p, rdma = cell["nworkers"], cell["rdma"]
    if source == "original":
        tables = ORIGINAL_AB_TABLES if tables is None else tables
        name = original_ab_table(f"rdma{rdma}")
        table = tables.get(name, {})
        if p not in table:
            raise NotModelled(f"the original's {name} alpha-beta table has no entry for "
                              f"{p} workers (only {', '.join(map(str, sorted(table)))})")
        alpha, beta = table[p]
        return simulate.Link(alpha, beta), f"original {name} table, P = {p}"
    return networks[rdma].link("allreduce", p), TOPOLOGIES[rdma]


def is_odd(cell: dict) -> bool:
    """Whether ``cell`` is one the table's YAML notes as looking like a 10GbE run (``odd``)."""
    return all(cell[k] in v for k, v in survey.odd().items())


def predict_cell(cell: dict, work: simulate.Compute, source: str, networks: dict,
                 tables=None) -> cell_model.Answer:
    """The model's prediction for ``cell`` (``ddlbench.model.cell.predict``: the survey's
    settings, one client per machine, the topology's servers; under the ``original`` source
    the original's table costs every all-reduce, a PS cell's on one machine included)."""
    method, p = cell["method"], cell["nworkers"]
    if method not in simulate.METHODS:
        raise NotModelled(f"method {method} is not modelled by the simulator")
    net = networks[cell["rdma"]]
    try:
        link = where = None
        if source == "original" and (
                methods.lookup(method).architecture == methods.A2A
                or cell_model.local_method(method, p, net) is not None):
            link, where = a2a_link(cell, source, networks, tables)
        return cell_model.predict(method, work, p, settings_of(method), network=net,
                                  link=link, link_source=where, ps_clients=PS_CLIENTS,
                                  table_network=f"rdma{cell['rdma']}")
    except UsageError as e:
        raise NotModelled(str(e)) from None


# --------------------------------------------------------------------------- statistics

def percentile(values, q: float) -> float:
    """The q-th percentile (0-100) by linear interpolation between order statistics (numpy's
    default)."""
    xs = sorted(values)
    if not xs:
        raise ValueError("no values")
    pos = (len(xs) - 1) * q / 100
    lo = int(pos)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def summary(rows: list[dict]) -> dict:
    """Median |error| per network, method and model, overall, and the 90th percentile."""
    def group(key):
        out = {}
        for r in rows:
            out.setdefault(r[key], []).append(abs(r["error"]))
        return {k: {"cells": len(v), "median_abs_error": statistics.median(v)}
                for k, v in out.items()}
    errors = [abs(r["error"]) for r in rows]
    by_network = group("rdma")
    return {"cells": len(rows),
            "by_network": {SHORT.get(k, str(k)): v for k, v in sorted(by_network.items())},
            "by_method": {m: v for m, v in sorted(group("method").items(),
                                                  key=lambda kv: _method_rank(kv[0]))},
            "by_model": group("model"),
            "overall": {"median_abs_error": statistics.median(errors) if errors else None,
                        "p90_abs_error": percentile(errors, 90) if errors else None}}


def _method_rank(method: str) -> int:
    order = tuple(survey.methods())
    return order.index(method) if method in order else len(order)


# --------------------------------------------------------------------------- findings

def findings(thr: dict, single: dict) -> list[dict]:
    """The survey's qualitative findings (``survey.findings``: which methods, models and
    thresholds) on throughputs ``thr`` ((model, rdma, method, P) -> samples/s over all GPUs;
    cells missing are skipped); ``single`` the 1-GPU figure per model. Each: id, claim, passed
    (True, False, None when no cell applies), detail, numbers."""
    said = survey.findings()
    keys = sorted({(m, r, p) for m, r, _, p in thr})
    return [_above(thr, keys, **said["above"]), _best(thr, keys, **said["best"]),
            _scales_worst(thr, single, **said["scales_worst"]),
            _close(thr, keys, **said["close"])]


def _display(method: str) -> str:
    return methods.lookup(method).display


def _pairs(thr, keys, a: str, b: str) -> list:
    """(cell, throughput of a, of b) wherever both were measured."""
    return [(k, thr[(k[0], k[1], a, k[2])], thr[(k[0], k[1], b, k[2])])
            for k in keys if (k[0], k[1], a, k[2]) in thr and (k[0], k[1], b, k[2]) in thr]


def _above(thr, keys, method: str, over: str) -> dict:
    """(1) ``method`` above ``over`` on most cells."""
    pairs = _pairs(thr, keys, method, over)
    wins = [k for k, w, b in pairs if w > b]
    ratios = [w / b for _, w, b in pairs]
    return _finding(
        1, f"{_display(method)} above {_display(over)} on most cells", pairs, len(wins),
        f"{method} > {over} on {len(wins)} of {len(pairs)} (model, network, P) cells; median "
        f"{method}/{over} {_med(ratios)}", {"wins": len(wins), "cells": len(pairs),
                                            "median_ratio": _num_med(ratios)})


def _best(thr, keys, method: str, rdma: list, tie: float) -> dict:
    """(2) ``method`` the best all-to-all method on networks ``rdma``: at least (1 - tie) of
    the best all-to-all throughput of its cell (ties at the table's noise count)."""
    a2a = survey_methods(methods.A2A)
    fast = [k for k in keys if k[1] in rdma
            and all((k[0], k[1], m, k[2]) in thr for m in a2a)]
    best, won, strict = {}, 0, 0
    for m, r, p in fast:
        top = max(a2a, key=lambda x: thr[(m, r, x, p)])
        best[top] = best.get(top, 0) + 1
        won += thr[(m, r, method, p)] >= (1 - tie) * thr[(m, r, top, p)]
        strict += top == method
    tally = ", ".join(f"{m} {best[m]}" for m in a2a if m in best)
    nets = ", ".join(map(str, rdma))
    return _finding(
        2, f"{_display(method)} the best all-to-all method on the fast networks (rdma {nets})",
        fast, won,
        f"{method} within {100 * tie:g}% of the best of {', '.join(a2a)} on {won} of "
        f"{len(fast)} cells on rdma {nets.replace(', ', ' and ')} (strictly highest on "
        f"{strict}); highest per cell: {tally or '-'}",
        {"wins": won, "strict": strict, "cells": len(fast), "best": best})


def _scales_worst(thr, single, model: str, nworkers: int) -> dict:
    """(3) ``model`` scales worst: lowest throughput / (P x 1-GPU) at ``nworkers`` GPUs."""
    groups = sorted({(r, meth) for m, r, meth, p in thr if p == nworkers})
    lowest, compared, eff = 0, 0, {}
    for r, meth in groups:
        e = {m: thr[(m, r, meth, nworkers)] / (nworkers * single[m])
             for m in single if (m, r, meth, nworkers) in thr}
        for m, v in e.items():
            eff.setdefault(m, []).append(v)
        if model in e and len(e) > 1:
            compared += 1
            lowest += min(e, key=e.get) == model
    medians = {m: statistics.median(v) for m, v in eff.items()}
    name = survey.model_name(model)
    return _finding(
        3, f"{name} scales worst (lowest throughput / ({nworkers} x 1-GPU) at {nworkers} GPUs)",
        range(compared), lowest,
        f"{model} lowest of the models on {lowest} of {compared} (network, method) pairs at "
        f"{nworkers} GPUs; median efficiency " + ", ".join(f"{m} {100 * v:.0f}%"
                                                         for m, v in sorted(medians.items())),
        {"wins": lowest, "cells": compared, "median_efficiency": medians})


def _close(thr, keys, method: str, to: str, within: float) -> dict:
    """(4) ``method`` (PS, one server per worker machine) within ``within`` of ``to``."""
    pairs = _pairs(thr, keys, method, to)
    close = [k for k, s, a in pairs if abs(s / a - 1) <= within]
    ratios = [s / a for _, s, a in pairs]
    return _finding(
        4, f"PS with one server per worker machine close to A2A ({_display(method)} within "
           f"{100 * within:.0f}% of {_display(to)} on most cells)", pairs, len(close),
        f"|{method}/{to} - 1| <= {within:g} on {len(close)} of {len(pairs)} (model, network, P) "
        f"cells; median {method}/{to} {_med(ratios)}, range "
        f"{_fmt(min(ratios)) if ratios else '-'}-{_fmt(max(ratios)) if ratios else '-'}",
        {"wins": len(close), "cells": len(pairs), "median_ratio": _num_med(ratios)})


def _finding(number, claim, cells, wins, detail, numbers) -> dict:
    n = len(cells)
    return {"id": number, "claim": claim, "passed": None if not n else wins > n / 2,
            "detail": detail, "numbers": numbers}


def _num_med(values):
    return statistics.median(values) if values else None


def _fmt(x: float) -> str:
    return f"{x:.2f}"


def _med(values) -> str:
    return "-" if not values else _fmt(statistics.median(values))


def verdict(f: dict) -> str:
    return "n/a" if f["passed"] is None else "PASS" if f["passed"] else "FAIL"


# --------------------------------------------------------------------------- the run

def _key(c: dict) -> dict:
    return {k: c[k] for k in ("model", "batch_size", "rdma", "network", "method", "original",
                              "nworkers")}


def _row(c: dict, works: dict, source: str, networks: dict, tables) -> dict:
    """One predicted cell's row (NotModelled: why not)."""
    if (c["model"], c["batch_size"]) not in works:
        raise NotModelled(f"no profile of model {c['model']}")
    if c["rdma"] not in networks:
        raise NotModelled(f"no topology for rdma {c['rdma']}")
    work, note = works[(c["model"], c["batch_size"])]
    answer = predict_cell(c, work, source, networks, tables)
    pred = answer.prediction
    got = pred.throughput(c["batch_size"], c["nworkers"])
    row = {**_key(c), "published": c["throughput"], "predicted": got,
           "error": (got - c["throughput"]) / c["throughput"],
           "iteration_s": pred.iteration_s, "network_model": answer.network,
           "bottleneck": pred.bottleneck}
    if answer.notes:
        row["model_notes"] = list(answer.notes)
    if note:
        row["batch_note"] = note
    if c.get("note"):
        row["note"] = c["note"]
    if answer.ps_local is not None:
        row["ps_local"] = answer.ps_local
    if is_odd(c):
        row["odd"] = True
    return row


def validate(source: str = "topology", cells: list[dict] | None = None, tables=None) -> dict:
    """Predict every cell (default: all the survey's) from ``source`` ("topology" or
    "original"; ``tables`` replaces the original's alpha-beta tables). The result: rows
    (modelled cells), not_modelled (with reasons), summary, findings on the predictions and on
    the published table, runtime."""
    if source not in SOURCES:
        raise UsageError(f"unknown network source {source!r}: {', '.join(SOURCES)}")
    began = time.perf_counter()
    cells = survey.cells() if cells is None else cells
    batches: dict = {}
    for c in cells:
        batches.setdefault(c["model"], set()).add(c["batch_size"])
    works = workloads(batches)
    networks = {r: topology.load(TOPOLOGIES[r]) for r in sorted({c["rdma"] for c in cells})
                if r in TOPOLOGIES}
    rows, skipped = [], []
    for c in cells:
        try:
            rows.append(_row(c, works, source, networks, tables))
        except NotModelled as e:
            skipped.append({**_key(c), "published": c["throughput"], "reason": str(e)})
    single = {m: survey.single_gpu(m) for m in batches}
    published = {(c["model"], c["rdma"], c["method"], c["nworkers"]): c["throughput"]
                 for c in cells}
    predicted = {(r["model"], r["rdma"], r["method"], r["nworkers"]): r["predicted"]
                 for r in rows}
    return {"kind": "survey-validation", "network_source": source,
            "profiles": {m: f"configs/profiles/{PROFILES[m]}" for m in batches
                         if m in PROFILES},
            "single_gpu": single,
            "compute": "each profile's times scaled so one worker runs at the survey's 1-GPU "
                       "throughput (predict.rescaled); optimizer step 0 (none profiled)",
            "network": ("topology files " + ", ".join(TOPOLOGIES.values()) if source ==
                        "topology" else "all-reduce: the original's alpha-beta tables "
                        "(10Gbps for rdma 0, 56Gbps for 1 and 2); PS: the topology files"),
            "settings": {m: settings_of(m) for m in survey.methods()},
            "ps_clients": PS_CLIENTS,
            "ps_single_machine": {"note": PS_LOCAL_NOTE.format(pairs=", ".join(
                                      f"{a} -> {b}" for a, b in ps_local_analogue().items())),
                                  "analogue": ps_local_analogue(),
                                  "cells": sum(1 for r in rows if "ps_local" in r)},
            "odd_cells": {"note": ODD_NOTE, "rule": {k: list(v) for k, v in survey.odd().items()},
                          "cells": sum(1 for r in rows if r.get("odd"))},
            "rows": rows, "not_modelled": skipped, "summary": summary(rows),
            "summary_without_odd": summary([r for r in rows if not r.get("odd")]),
            "findings": {"predicted": findings(predicted, single),
                         "published": findings(published, single)},
            "runtime_s": time.perf_counter() - began}


# --------------------------------------------------------------------------- output

def _table(header, rows, left=(0,)) -> list[str]:
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    return ["  ".join(c.ljust(w) if i in left else c.rjust(w)
                      for i, (c, w) in enumerate(zip(r, widths))).rstrip()
            for r in [header, *rows]]


def _pct(x) -> str:
    return "-" if x is None else f"{100 * x:.1f}%"


def _signed(x) -> str:
    return f"{100 * x:+.1f}%"


def _flags(row: dict) -> str:
    out = []
    if "ps_local" in row:
        out.append(f"local:{row['ps_local']}")
    if row.get("odd"):
        out.append("odd")
    return ",".join(out)


def _summary_rows(s: dict, w: dict, key: str) -> list[list[str]]:
    """One line per group: cells and median of all cells, then without the odd ones."""
    out = []
    for k, v in s[key].items():
        x = w[key].get(k)
        out.append([k, str(v["cells"]), _pct(v["median_abs_error"]),
                    str(x["cells"]) if x else "0", _pct(x["median_abs_error"] if x else None)])
    return out


def report(result: dict) -> str:
    rows = [[r["model"], SHORT.get(r["rdma"], str(r["rdma"])), r["method"], str(r["nworkers"]),
             f"{r['published']:.1f}", f"{r['predicted']:.1f}", _signed(r["error"]),
             r["bottleneck"], _flags(r)] for r in result["rows"]]
    lines = [f"The performance model against the survey's table (network source: "
             f"{result['network_source']}: {result['network']}); {result['compute']}.", ""]
    lines += _table(["model", "network", "method", "P", "published", "predicted", "error",
                     "bound by", "flags"], rows, left=(0, 1, 2, 7, 8))
    lines += ["", f"flags: local:<method> = {result['ps_single_machine']['note']}.",
              f"       odd = {result['odd_cells']['note']}."]
    if result["not_modelled"]:
        lines += ["", f"Not modelled ({len(result['not_modelled'])} cells):"]
        lines += [f"  {c['model']} {SHORT.get(c['rdma'], c['rdma'])} {c['method']} "
                  f"P={c['nworkers']}: {c['reason']}" for c in result["not_modelled"]]
    s, w = result["summary"], result["summary_without_odd"]
    lines += ["", f"Median |error| over {s['cells']} cells, and without the "
                  f"{result['odd_cells']['cells']} odd cells ({w['cells']} cells):"]
    for title, key in (("network", "by_network"), ("method", "by_method"),
                       ("model", "by_model")):
        lines += _table([title, "cells", "median |error|", "cells w/o odd",
                         "median w/o odd"], _summary_rows(s, w, key))
        lines.append("")
    lines.append(f"overall: median |error| {_pct(s['overall']['median_abs_error'])}, 90th "
                 f"percentile {_pct(s['overall']['p90_abs_error'])}")
    lines.append(f"without the odd cells: median |error| "
                 f"{_pct(w['overall']['median_abs_error'])}, 90th percentile "
                 f"{_pct(w['overall']['p90_abs_error'])}")
    lines += ["", "The survey's findings (published table | predictions):"]
    for pub, pre in zip(result["findings"]["published"], result["findings"]["predicted"]):
        lines.append(f"({pub['id']}) {pub['claim']}")
        lines.append(f"    published: {verdict(pub)}: {pub['detail']}")
        lines.append(f"    predicted: {verdict(pre)}: {pre['detail']}")
    lines += ["", f"({result['runtime_s']:.2f} s)"]
    return "\n".join(lines)


def markdown(result: dict) -> str:
    """The summary tables and the findings as Markdown."""
    s, w = result["summary"], result["summary_without_odd"]
    out = [f"Network source `{result['network_source']}` ({result['network']}); "
           f"{s['cells']} cells modelled, {len(result['not_modelled'])} not. Odd cells: "
           f"{result['odd_cells']['cells']}, {_cell(result['odd_cells']['note'])}. "
           f"{_cell(result['ps_single_machine']['note'])}.", ""]
    for title, key in (("network", "by_network"), ("method", "by_method"),
                       ("model", "by_model")):
        out += [f"| {title} | cells | median abs. error | cells w/o odd | median w/o odd |",
                "| --- | ---: | ---: | ---: | ---: |"]
        out += ["| " + " | ".join(r) + " |" for r in _summary_rows(s, w, key)]
        out.append("")
    out += [f"Overall: median abs. error {_pct(s['overall']['median_abs_error'])}, 90th "
            f"percentile {_pct(s['overall']['p90_abs_error'])}; without the odd cells "
            f"{_pct(w['overall']['median_abs_error'])}, 90th percentile "
            f"{_pct(w['overall']['p90_abs_error'])}.", "",
            "| finding | published table | predictions |", "| --- | --- | --- |"]
    for pub, pre in zip(result["findings"]["published"], result["findings"]["predicted"]):
        out.append(f"| ({pub['id']}) {_cell(pub['claim'])} | {verdict(pub)}: "
                   f"{_cell(pub['detail'])} | {verdict(pre)}: {_cell(pre['detail'])} |")
    return "\n".join(out) + "\n"


def _cell(text: str) -> str:
    """``text`` inside a Markdown table cell."""
    return text.replace("|", "\\|")


def parse_args(argv=None):
    p = ArgumentParser(prog="python -m ddlbench.model.validation",
                       description=__doc__.split("\n")[0], raise_errors=True)
    p.add_argument("command", choices=["survey"],
                   help="survey: every cell of configs/reference/survey_results.yaml")
    p.add_argument("--network-source", default="topology", choices=SOURCES,
                   help="topology: configs/topology/survey-*.yaml; original: the original's "
                        "alpha-beta tables for the all-reduce methods")
    p.add_argument("--output", default=None, metavar="JSON", help="write everything as JSON")
    p.add_argument("--markdown", default=None, metavar="FILE",
                   help="write the summary tables as Markdown")
    return p.parse_args(argv)


def run(args) -> int:
    if args.output:
        check_writable(args.output)
    if args.markdown:
        check_writable(args.markdown, "--markdown")
    result = validate(args.network_source)
    print(report(result))
    if args.output:
        with open_to_write(args.output) as f:
            json.dump(result, f, indent=1)
    if args.markdown:
        with open_to_write(args.markdown) as f:
            f.write(markdown(result))
    return 0


def main(argv=None) -> int:
    return run_cli(run, parse_args, argv)


if __name__ == "__main__":
    sys.exit(main())

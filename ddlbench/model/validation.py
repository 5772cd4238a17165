"""The performance model against the survey's published table:
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
table alike (PASS/FAIL with the numbers and the threshold each needs: ``findings``).

**Every constant's source** (``constant_figures``; ``--no-constants`` leaves it out): the topology
files give each constant's kind and source (``topology.KINDS``); with every constant of kind
``chosen`` (picked after comparing with a published table) at its datasheet value the cells are
predicted again, and that figure is printed first (the second line), before the shipped one;
then each chosen constant alone at its datasheet value and at its shipped value x 0.75 and x
1.25 (a link's bandwidth and efficiency together, as its rate), with the median |error| and the
findings that fail at each. The passes share the workloads and every cell a changed constant
does not reach (``validate``'s ``memo``). ``--output`` writes all of it as JSON (``summary``,
``summary_without_odd``, ``constants``), ``--markdown`` the summary tables as Markdown, the
datasheet figure first.
"""
from __future__ import annotations

import dataclasses
import functools
import json
import os
import statistics
import sys
import time

from .. import methods, yamlfile
from . import cell as cell_model
from . import predict, score, simulate, survey, topology
from ..errors import ArgumentParser, UsageError, check_writable, open_to_write, run_cli
from ..measure.profile_file import read_profile
from ..options import BATCHES_PER_ITER
from ..planning import ORIGINAL_AB_TABLES, original_ab_table
from ..stats import sign_tail

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
    """method -> the settings of the survey's runs as the paper preset (``configs/paper.yaml``)
    runs them: each method's option values at their defaults, then as its ``methods:`` entry
    sets them (MG-WFBP's ``mgwfbp_ab: table``, ByteScheduler's partition and credit, BSP-PS's
    threshold), and the preset's timing round (``batches_per_iter``, from ``timing:``,
    ByteScheduler's; the others finish every iteration in it). So ``benchmarks.py --config
    paper --predict-only`` and this validation predict a cell alike."""
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
        out[entry["method"]] = {**values, "batches_per_iter": rounds}
    return out


def settings_of(method: str) -> dict:
    """The settings of ``method`` in the survey's runs (its option values and
    ``batches_per_iter``): the paper preset's (``preset_settings``); a method the preset lacks
    at its defaults, in the preset's timing round."""
    preset = preset_settings()
    if method in preset:
        return dict(preset[method])
    rounds = next(iter(preset.values()), {}).get("batches_per_iter", BATCHES_PER_ITER)
    return {**simulate.options_for(method).as_dict(), "batches_per_iter": rounds}


def ps_local_analogue() -> dict[str, str]:
    """PS method -> the all-reduce method BytePS runs as on one machine (its rule's)."""
    return {m: cls.rule.one_machine for m, cls in methods.registry().items()
            if cls.rule is not None and cls.rule.one_machine}


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
                 tables=None, intervals: bool = True) -> cell_model.Answer:
    """The model's prediction for ``cell`` (``ddlbench.model.cell.predict``: the survey's
    settings, one client per machine, the topology's servers; under the ``original`` source
    the original's table costs every all-reduce, a PS cell's on one machine included), with
    its interval from the topology's stated ranges (``intervals`` False: the point alone)."""
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
        values = settings_of(method)
        rounds = values.pop("batches_per_iter")
        return cell_model.predict(method, work, p, simulate.options_for(method, **values),
                                  interval=intervals, batches_per_iter=rounds, network=net,
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


def best_method_score(rows: list[dict]) -> dict:
    """``score.best_method`` of the rows, a group per (model, network, P): does the model pick
    the published best method, and does it order the methods as the table does."""
    return score.best_method(score.grouped(
        rows, lambda r: f"{r['model']} {SHORT.get(r['rdma'], r['rdma'])} P={r['nworkers']}",
        measured="published"))


def interval_ties(rows: list[dict]) -> dict:
    """``score.interval_ties`` of the rows, grouped as ``best_method_score``: in how many
    groups the published best lies among the model's pick and the methods whose intervals
    (the topology's stated ranges) overlap the pick's."""
    groups: dict = {}
    for r in rows:
        key = f"{r['model']} {SHORT.get(r['rdma'], r['rdma'])} P={r['nworkers']}"
        pred, iv, pub = groups.setdefault(key, ({}, {}, {}))
        pred[r["method"]], iv[r["method"]], pub[r["method"]] = (r["predicted"], r["interval"],
                                                                r["published"])
    return score.interval_ties(groups)


def _method_rank(method: str) -> int:
    order = tuple(survey.methods())
    return order.index(method) if method in order else len(order)


# --------------------------------------------------------------------------- findings

# A finding passes when it holds as strongly as its words say, and no more loosely. Each of the
# survey's four is a claim over "most" cells (or pairs), so its count must be a majority that a
# coin toss would not give: at least ``majority(n)`` of n, the smallest count a one-sided sign
# test rejects chance (p = 1/2) with at ``SIGN_LEVEL`` (24 of 36 cells, 17 of 24, 15 of 21:
# two thirds or more; a bare majority, 19 of 36, is what a coin gives 43% of the time, and
# what the check asked before, so it could not fail). (1) also needs WFBP's gain
# to be larger than the table's noise: the median WFBP/BSP ratio above 1 + the YAML's tie
# margin of finding (2) (1%: "ties at the table's noise"); a median above 1 alone follows from
# the count. (3) also needs BERT-Large's median scaling efficiency to be the lowest of the
# models'. (4) needs the count alone: a majority within the band puts the median ratio there.
SIGN_LEVEL = 0.05


def majority(n: int, level: float = SIGN_LEVEL) -> int:
    """The smallest k with P(Binomial(n, 1/2) >= k) <= ``level``: the count of n that a
    one-sided sign test takes as "most", not chance (n + 1 when none is: too few cells)."""
    return next(k for k in range(n + 2) if sign_tail(n, k) <= level)


def findings(thr: dict, single: dict) -> list[dict]:
    """The survey's qualitative findings (``survey.findings``: which methods, models and
    thresholds) on throughputs ``thr`` ((model, rdma, method, P) -> samples/s over all GPUs;
    cells missing are skipped); ``single`` the 1-GPU figure per model. Each: id, claim, passed
    (True, False, None when no cell applies; the thresholds above), detail, threshold (in
    words), numbers (``need``: the count it needed)."""
    said = survey.findings()
    keys = sorted({(m, r, p) for m, r, _, p in thr})
    return [_above(thr, keys, **said["above"], noise=said["best"]["tie"]),
            _best(thr, keys, **said["best"]),
            _scales_worst(thr, single, **said["scales_worst"]),
            _close(thr, keys, **said["close"])]


def _display(method: str) -> str:
    return methods.lookup(method).display


def _pairs(thr, keys, a: str, b: str) -> list:
    """(cell, throughput of a, of b) wherever both were measured."""
    return [(k, thr[(k[0], k[1], a, k[2])], thr[(k[0], k[1], b, k[2])])
            for k in keys if (k[0], k[1], a, k[2]) in thr and (k[0], k[1], b, k[2]) in thr]


def _above(thr, keys, method: str, over: str, noise: float = 0.0) -> dict:
    """(1) ``method`` above ``over`` on most cells, its median gain above ``noise``."""
    pairs = _pairs(thr, keys, method, over)
    wins = [k for k, w, b in pairs if w > b]
    ratios = [w / b for _, w, b in pairs]
    median = _num_med(ratios)
    return _finding(
        1, f"{_display(method)} above {_display(over)} on most cells", pairs, len(wins),
        f"{method} > {over} on {len(wins)} of {len(pairs)} (model, network, P) cells; median "
        f"{method}/{over} {_med(ratios)}", {"wins": len(wins), "cells": len(pairs),
                                            "median_ratio": median},
        median is not None and median > 1 + noise, f"median {method}/{over} > {1 + noise:g}")


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
        {"wins": won, "strict": strict, "cells": len(fast), "best": best}, True, None)


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
        {"wins": lowest, "cells": compared, "median_efficiency": medians},
        model in medians and min(medians, key=medians.get) == model,
        f"{model}'s median efficiency the lowest")


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
        {"wins": len(close), "cells": len(pairs), "median_ratio": _num_med(ratios)}, True,
        None)


def _finding(number, claim, cells, wins, detail, numbers, size_ok: bool,
             size: str | None) -> dict:
    """A finding's verdict: ``wins`` of the ``cells`` at least ``majority`` of them, and the
    size condition (``size_ok``, in words ``size``; None: none)."""
    n = len(cells)
    need = majority(n)
    threshold = (f">= {need} of {n} (a sign test at {100 * SIGN_LEVEL:g}%)"
                 + (f" and {size}" if size else ""))
    return {"id": number, "claim": claim,
            "passed": None if not n else bool(wins >= need and size_ok),
            "detail": detail, "threshold": threshold, "numbers": {**numbers, "need": need}}


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


def _row(c: dict, works: dict, source: str, networks: dict, tables, memo=None,
         intervals: bool = True) -> dict:
    """One predicted cell's row (NotModelled: why not), with its interval (``interval``:
    [low, high] throughput) unless ``intervals`` is False; ``memo``: see ``_answer``."""
    if (c["model"], c["batch_size"]) not in works:
        raise NotModelled(f"no profile of model {c['model']}")
    if c["rdma"] not in networks:
        raise NotModelled(f"no topology for rdma {c['rdma']}")
    work, note = works[(c["model"], c["batch_size"])]
    answer = _answer(c, work, source, networks, tables, memo, intervals)
    pred = answer.prediction
    got = pred.throughput(c["batch_size"], c["nworkers"])
    row = {**_key(c), "published": c["throughput"], "predicted": got,
           "error": (got - c["throughput"]) / c["throughput"],
           "iteration_s": pred.iteration_s, "network_model": answer.network,
           "bottleneck": pred.bottleneck}
    if intervals:
        row["interval"] = list(answer.interval(c["batch_size"], c["nworkers"]))
        row["interval_from"] = answer.spread_note
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


def _batches(cells: list[dict]) -> dict:
    batches: dict = {}
    for c in cells:
        batches.setdefault(c["model"], set()).add(c["batch_size"])
    return batches


def shipped_networks(cells: list[dict]) -> dict:
    """rdma -> the survey's topology file of that network, for the networks of ``cells``."""
    return {r: topology.load(TOPOLOGIES[r]) for r in sorted({c["rdma"] for c in cells})
            if r in TOPOLOGIES}


def _signature(c: dict, net) -> tuple | None:
    """What a cell's prediction reads from its network: the all-reduce link and the
    machine's size, and for a parameter-server method the servers and the local sum too. Two
    networks with the same signature predict the cell alike. None: not known (no reuse)."""
    p = c["nworkers"]
    try:
        sig = (net.link("allreduce", p), getattr(net, "devices_per_node", None))
        if methods.lookup(c["method"]).architecture == methods.PS:
            sig += (net.ps(p, None, PS_CLIENTS), net.local_reduce(p))
        return sig
    except UsageError:
        return None


def _answer(c, work, source, networks, tables, memo, intervals=True) -> cell_model.Answer:
    """``predict_cell``, through ``memo`` (a dict, or None: none) keyed on what the prediction
    reads: the cell's model, batch, method and P, the source, the network's name, the
    original's table (MG-WFBP plans with it; under ``original`` it costs the all-reduce) and
    the network's ``_signature``; with ``intervals``, that of its ends (``Topology.ends``)
    too. A pass with some constants changed predicts again only the cells those constants
    reach; a point-only pass reuses an earlier pass's points."""
    if memo is None or tables is not None:
        return predict_cell(c, work, source, networks, tables, intervals)
    net = networks[c["rdma"]]
    sig = _signature(c, net)
    ends = net.ends() if intervals and hasattr(net, "ends") else None
    ends_sig = tuple(_signature(c, e) for e in ends) if ends else ()
    if sig is None or None in ends_sig:
        return predict_cell(c, work, source, networks, tables, intervals)
    key = (c["model"], c["batch_size"], c["method"], c["nworkers"], source, net.name,
           original_ab_table(f"rdma{c['rdma']}"),
           a2a_link(c, source, networks)[0] if source == "original" else None, sig)
    full = key + (ends_sig,)
    if intervals and full not in memo:
        memo[full] = predict_cell(c, work, source, networks, tables)
        memo.setdefault(key, dataclasses.replace(memo[full], iteration_range=None,
                                                 spread_note=cell_model.NO_SPREAD))
    if key not in memo:
        memo[key] = predict_cell(c, work, source, networks, tables, intervals=False)
    return memo[full] if intervals else memo[key]


def validate(source: str = "topology", cells: list[dict] | None = None, tables=None, *,
             networks: dict | None = None, works: dict | None = None,
             memo: dict | None = None, intervals: bool = True) -> dict:
    """Predict every cell (default: all the survey's) from ``source`` ("topology" or
    "original"; ``tables`` replaces the original's alpha-beta tables). The result: rows
    (modelled cells), not_modelled (with reasons), summary, findings on the predictions and on
    the published table, runtime. ``networks`` (rdma -> Network) replaces the topology files
    (``shipped_networks``), ``works`` the cells' workloads (``workloads``), and ``memo`` (a
    dict kept between calls) reuses the cells a call's networks predict as an earlier's did;
    ``intervals`` (default) gives each row its interval from the topology's stated ranges and
    the result ``interval_ties`` (False: the points alone, a third of the time)."""
    if source not in SOURCES:
        raise UsageError(f"unknown network source {source!r}: {', '.join(SOURCES)}")
    began = time.perf_counter()
    cells = survey.cells() if cells is None else cells
    batches = _batches(cells)
    works = workloads(batches) if works is None else works
    networks = shipped_networks(cells) if networks is None else networks
    rows, skipped = [], []
    for c in cells:
        try:
            rows.append(_row(c, works, source, networks, tables, memo, intervals))
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
            "best_method": best_method_score(rows),
            **({"interval_ties": interval_ties(rows)} if intervals else {}),
            "summary_without_odd": summary([r for r in rows if not r.get("odd")]),
            "findings": {"predicted": findings(predicted, single),
                         "published": findings(published, single)},
            "runtime_s": time.perf_counter() - began}


# ---------------------------------------------------------------- every constant's source

# The points at which each chosen constant is tried besides its shipped value: its datasheet
# value, and the shipped value x 0.75 and x 1.25.
FACTORS = (0.75, 1.25)
RATE = ("bandwidth", "efficiency")


def _rate_text(bandwidth, efficiency) -> str:
    """A link's rate as the file writes its parts: ``3.9GB/s x 1``."""
    return f"{bandwidth} x {float(efficiency):g}"


def chosen_constants(networks: dict) -> list[dict]:
    """The constants of kind ``chosen`` in ``networks`` (rdma -> Topology), one entry per
    constant: a link's bandwidth and efficiency count as one, its rate (their product; the
    datasheet reading replaces both), and a constant with the same field, value and datasheet
    value in several files or sections (the survey's intra-node link in all three files, the
    100GbE single stream of workers and servers) is one, varied in all at once. Each: constant
    (in words), field, where (file and section), shipped and datasheet (as written),
    shipped_value and datasheet_value (SI), sources, and ``members`` (rdma, the datasheet's
    overrides, and the (path, shipped value) scaled for the factors)."""
    groups: dict = {}
    for rdma, net in sorted(networks.items()):
        if not isinstance(net, topology.Topology):
            continue
        by_section: dict = {}
        for key, prov in net.provenance.items():
            if prov.kind == "chosen":
                section, _, field = key.rpartition(".")
                by_section.setdefault(section, {})[field] = prov
        for section, chosen in sorted(by_section.items()):
            pre = f"{section}." if section else ""
            rate = section and set(chosen) & set(RATE)
            fields = [f for f in sorted(chosen) if f not in RATE] + (["rate"] if rate else [])
            for field in fields:
                if field == "rate":
                    link = net.link_of(section)
                    got = {"bandwidth": link.bandwidth, "efficiency": link.efficiency}
                    ds = {f: chosen[f].datasheet_value if f in chosen else got[f] for f in RATE}
                    shipped_v, ds_v = got["bandwidth"] * got["efficiency"], \
                        ds["bandwidth"] * ds["efficiency"]
                    written = {f: net.written(pre + f) if pre + f in net.values else got[f]
                               for f in RATE}
                    shown = _rate_text(written["bandwidth"], written["efficiency"])
                    ds_shown = _rate_text(*(chosen[f].datasheet if f in chosen else written[f]
                                            for f in RATE))
                    ds_over = {pre + f: chosen[f].datasheet_value for f in RATE if f in chosen}
                    scaled = (pre + "bandwidth" if pre + "bandwidth" in net.values
                              else pre + "efficiency")
                    base = net.values[scaled]
                    sources = [chosen[f].source for f in RATE if f in chosen]
                else:
                    prov = chosen[field]
                    shipped_v, ds_v = net.values[pre + field], prov.datasheet_value
                    shown, ds_shown = net.written(pre + field), str(prov.datasheet)
                    ds_over = {pre + field: ds_v}
                    scaled, base = pre + field, shipped_v
                    sources = [prov.source]
                key = (field, round(shipped_v, 12), round(ds_v, 12))
                g = groups.setdefault(key, {
                    "field": field, "where": [], "shipped": shown, "datasheet": ds_shown,
                    "shipped_value": shipped_v, "datasheet_value": ds_v, "sources": [],
                    "members": []})
                g["where"].append(f"{net.name} {section or 'top level'}")
                g["sources"] += [x for x in sources if x not in g["sources"]]
                g["members"].append((rdma, ds_over, (scaled, base)))
    out = []
    for g in groups.values():
        sections = sorted({w.split(" ", 1)[1] for w in g["where"]})
        what = "rate (bandwidth x efficiency)" if g["field"] == "rate" else g["field"]
        out.append({"constant": f"{' and '.join(sections)} {what}", **g})
    return out


def _variant(networks: dict, members, point) -> dict:
    """``networks`` with a chosen constant at ``point`` ("datasheet" or a factor on its shipped
    value) in every file and section it is in."""
    nets = dict(networks)
    for rdma, ds_over, (scaled, base) in members:
        over = ds_over if point == "datasheet" else {scaled: base * point}
        nets[rdma] = nets[rdma].variant({**nets[rdma].overrides, **over})
    return nets


def _point_name(point) -> str:
    return point if isinstance(point, str) else f"x{point:g}"


def provenance_table(networks: dict, models=()) -> dict:
    """topology (file -> constant -> its value as written, kind, source, and datasheet value
    for kind chosen) and profiles (file -> constant -> kind, source), for the networks and the
    models' profiles."""
    nets = {}
    for rdma, net in sorted(networks.items()):
        if isinstance(net, topology.Topology):
            nets[net.name] = {k: {"value": net.written(k), **net.provenance[k].as_dict()}
                              if k in net.provenance else {"value": net.written(k),
                                                           "kind": None}
                              for k in net.values}
    profiles = {}
    for model in models:
        if model in PROFILES:
            path = os.path.join(PROFILE_DIR, PROFILES[model])
            given, missing = topology.profile_provenance(read_profile(path), path)
            profiles[PROFILES[model]] = {**{k: v.as_dict() for k, v in given.items()},
                                         **{k: {"kind": None} for k in missing}}
    return {"topology": nets, "profiles": profiles}


def constant_figures(source: str = "topology", cells: list[dict] | None = None,
                     tables=None, *, works: dict | None = None, memo: dict | None = None,
                     shipped: dict | None = None) -> dict:
    """The figure with datasheet values beside the shipped one, and each chosen constant's
    sensitivity: the survey's cells predicted with every constant of kind ``chosen`` in the
    topology files at its datasheet value (``datasheet``: summaries and findings), and each
    chosen constant (``chosen_constants``) alone at its datasheet value, x 0.75 and x 1.25,
    the others as shipped (``chosen``: the median |error| at each, the shipped one beside, and
    which findings pass). ``works``, ``memo`` and ``shipped`` (a ``validate`` result of the
    shipped files) save what an earlier pass computed; a pass predicts again only the cells a
    changed constant reaches."""
    began = time.perf_counter()
    cells = survey.cells() if cells is None else cells
    works = workloads(_batches(cells)) if works is None else works
    memo = {} if memo is None else memo
    networks = shipped_networks(cells)

    def run(nets):
        return validate(source, cells, tables, networks=nets, works=works, memo=memo,
                        intervals=False)
    base = shipped if shipped is not None else run(networks)
    ds_nets = {r: net.variant(net.datasheet_values()) for r, net in networks.items()}
    ds = run(ds_nets)
    groups = chosen_constants(networks)
    rows = []
    for g in groups:
        medians = {"shipped": base["summary"]["overall"]["median_abs_error"]}
        passed = {"shipped": [f["passed"] for f in base["findings"]["predicted"]]}
        picks = {"shipped": _picks(base)}
        for point in ("datasheet", *FACTORS):
            name = _point_name(point)
            try:
                got = run(_variant(networks, g["members"], point))
            except UsageError:           # e.g. an efficiency above 1
                medians[name], passed[name], picks[name] = None, None, None
                continue
            medians[name] = got["summary"]["overall"]["median_abs_error"]
            passed[name] = [f["passed"] for f in got["findings"]["predicted"]]
            picks[name] = _picks(got)
        rows.append({**{k: v for k, v in g.items() if k != "members"},
                     "median_abs_error": medians, "findings_passed": passed,
                     "best_method": picks})
    kinds: dict = {}
    for net in networks.values():
        for k in net.values:
            kind = net.provenance[k].kind if k in net.provenance else "none given"
            kinds[kind] = kinds.get(kind, 0) + 1
    return {"note": "datasheet: every constant of kind chosen in the topology files at its "
                    "datasheet value (provenance), the others as shipped; chosen: each such "
                    "constant alone at its datasheet value and at its shipped value x 0.75 and "
                    "x 1.25",
            "kinds": dict(sorted(kinds.items())),
            "datasheet": {"network": [n.describe() for n in ds_nets.values()],
                          "summary": ds["summary"], "best_method": ds["best_method"],
                          "summary_without_odd": ds["summary_without_odd"],
                          "findings": ds["findings"]["predicted"]},
            "shipped": {"summary": base["summary"], "best_method": base["best_method"],
                        "summary_without_odd": base["summary_without_odd"]},
            "chosen": rows, "provenance": provenance_table(networks, sorted(_batches(cells))),
            "runtime_s": time.perf_counter() - began}


def _picks(result: dict) -> dict:
    """A pass's best-method counts: groups, exact, within."""
    b = result["best_method"]
    return {k: b[k] for k in ("groups", "exact", "within")}


def survey_result(source: str = "topology", constants: bool = True) -> dict:
    """``validate`` of every cell, with ``constant_figures`` under ``constants`` (unless
    ``constants`` is False), the passes sharing their workloads and cells."""
    cells = survey.cells()
    works = workloads(_batches(cells))
    memo: dict = {}
    result = validate(source, cells, works=works, memo=memo)
    if constants:
        result["constants"] = constant_figures(source, cells, works=works, memo=memo,
                                               shipped=result)
    return result


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


def _headline(result: dict) -> str | None:
    """The two figures, the datasheet one first (None without ``constants``)."""
    c = result.get("constants")
    if not c:
        return None
    ds, sh = c["datasheet"]["summary"], c["shipped"]["summary"]
    return (f"Median |error| over {ds['cells']} cells: {_pct(ds['overall']['median_abs_error'])} "
            f"with datasheet values (every constant of kind chosen at its datasheet value; "
            f"90th percentile {_pct(ds['overall']['p90_abs_error'])}), "
            f"{_pct(sh['overall']['median_abs_error'])} with the shipped constants (90th "
            f"percentile {_pct(sh['overall']['p90_abs_error'])})")


def ties_line(ties: dict) -> str:
    """One line: in how many groups the published best is among the interval-tied picks."""
    return (f"the published best is among the tied picks (the model's pick and the methods "
            f"whose intervals, from the topology files' stated ranges, overlap it) in "
            f"{ties['best_tied']}/{ties['groups']} groups; a group's tied picks are a median "
            f"{ties['tied_median']:g} of its {ties['methods_median']:g} methods")


def _best_lines(result: dict) -> list[str]:
    """The headline: the best-method score with the shipped constants, and with datasheet
    values when the result has them; beside it, how often the published best is among the
    interval-tied picks."""
    lines = [score.headline(result["best_method"], "published") + " (shipped constants)"]
    if result.get("interval_ties"):
        lines.append(ties_line(result["interval_ties"]) + " (shipped constants)")
    c = result.get("constants")
    if c:                    # as the median's figures: the datasheet one first
        lines.insert(0, score.headline(c["datasheet"]["best_method"], "published")
                     + " (datasheet values)")
    return lines


def _group_rows(b: dict) -> list[list[str]]:
    return [[str(r["group"]), r["best"], r["pick"] + ("" if r["exact"] else " *"),
             _pct(r["shortfall"]), "-" if r["tau"] is None else f"{r['tau']:.2f}"]
            for r in b["rows"]]


def _kinds(c: dict) -> str:
    return ", ".join(f"{n} {k}" for k, n in sorted(c["kinds"].items(), key=lambda kv: -kv[1]))


def _failing(passed: dict, point: str) -> str:
    got = passed.get(point)
    if got is None:
        return "-"
    bad = [f"({i})" for i, ok in enumerate(got, 1) if ok is False]
    return " ".join(bad) or "none"


POINTS = ("datasheet", "x0.75", "shipped", "x1.25")


def _sensitivity_rows(c: dict) -> list[list[str]]:
    return [[g["constant"], ", ".join(dict.fromkeys(w.split(" ")[0] for w in g["where"])),
             g["shipped"],
             g["datasheet"], *(_pct(g["median_abs_error"].get(p)) for p in POINTS),
             "; ".join(f"{p} {_failing(g['findings_passed'], p)}" for p in POINTS
                       if _failing(g["findings_passed"], p) not in ("none", "-"))
             or "none"]
            for g in c["chosen"]]


def _compare_rows(c: dict, key: str) -> list[list[str]]:
    ds, sh = c["datasheet"]["summary"][key], c["shipped"]["summary"][key]
    return [[k, str(v["cells"]), _pct(ds[k]["median_abs_error"] if k in ds else None),
             _pct(v["median_abs_error"])] for k, v in sh.items()]


def _constants_report(result: dict) -> list[str]:
    c = result["constants"]
    ds, sh = c["datasheet"], c["shipped"]
    lines = ["", f"Every constant's source (provenance in the topology files; "
                 f"ddlbench/model/topology.py KINDS): {_kinds(c)}.",
             f"With datasheet values (every constant of kind chosen at its datasheet value, "
             f"the others as shipped): median |error| "
             f"{_pct(ds['summary']['overall']['median_abs_error'])}, 90th percentile "
             f"{_pct(ds['summary']['overall']['p90_abs_error'])}; without the odd cells "
             f"{_pct(ds['summary_without_odd']['overall']['median_abs_error'])}.",
             f"With the shipped constants: median |error| "
             f"{_pct(sh['summary']['overall']['median_abs_error'])}, 90th percentile "
             f"{_pct(sh['summary']['overall']['p90_abs_error'])}; without the odd cells "
             f"{_pct(sh['summary_without_odd']['overall']['median_abs_error'])}.", ""]
    for title, key in (("network", "by_network"), ("method", "by_method"),
                       ("model", "by_model")):
        lines += _table([title, "cells", "datasheet values", "shipped"], _compare_rows(c, key))
        lines.append("")
    lines.append("Each chosen constant alone at its datasheet value and at its shipped value "
                 "x 0.75 and x 1.25, the others as shipped: median |error| over "
                 f"{sh['summary']['cells']} cells, and the findings that fail:")
    lines += _table(["constant", "in", "shipped", "datasheet", "at datasheet", "x0.75",
                     "shipped", "x1.25", "findings failing"], _sensitivity_rows(c),
                    left=(0, 1, 2, 3, 8))
    for g in c["chosen"]:
        lines.append(f"  {g['constant']}: " + " | ".join(g["sources"]))
    lines += ["", "The survey's findings with datasheet values:"]
    for f in ds["findings"]:
        lines.append(f"({f['id']}) {verdict(f)}: {f['detail']} (needs {f['threshold']})")
    lines.append(f"({c['runtime_s']:.2f} s for the datasheet figure and the sensitivity)")
    return lines


def report(result: dict) -> str:
    rows = [[r["model"], SHORT.get(r["rdma"], str(r["rdma"])), r["method"], str(r["nworkers"]),
             f"{r['published']:.1f}", f"{r['predicted']:.1f}", _signed(r["error"]),
             r["bottleneck"], _flags(r)] for r in result["rows"]]
    lines = [f"The performance model against the survey's table (network source: "
             f"{result['network_source']}: {result['network']}); {result['compute']}."]
    lines += _best_lines(result)
    head = _headline(result)
    if head:
        lines.append(head + "; the rows below are the shipped constants'.")
    lines.append("")
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
    lines += ["", "Best method per group (the published best, the model's pick, the pick's "
                  "shortfall from the best's published throughput, Kendall's tau of the "
                  "group's methods):"]
    lines += _table(["group", "published best", "model's pick", "shortfall", "tau"],
                    _group_rows(result["best_method"]), left=(0, 1, 2))
    lines += ["", "The survey's findings (published table | predictions; a finding passes with "
                  "the count and the size stated after 'needs'):"]
    for pub, pre in zip(result["findings"]["published"], result["findings"]["predicted"]):
        lines.append(f"({pub['id']}) {pub['claim']}")
        lines.append(f"    published: {verdict(pub)}: {pub['detail']}")
        lines.append(f"    predicted: {verdict(pre)}: {pre['detail']}")
        needs = dict.fromkeys([pub["threshold"], pre["threshold"]])
        lines.append(f"    needs: {' | '.join(needs)}")
    if result.get("constants"):
        lines += _constants_report(result)
    lines += ["", f"({result['runtime_s']:.2f} s)"]
    return "\n".join(lines)


def markdown(result: dict) -> str:
    """The summary tables and the findings as Markdown (with ``constants``: the datasheet
    figure first, then the shipped one, and each chosen constant's sensitivity)."""
    s, w = result["summary"], result["summary_without_odd"]
    c = result.get("constants")
    out = [line + "." for line in _best_lines(result)] + [""]
    if c:
        out += [_headline(result) + ".", ""]
    out += [f"Network source `{result['network_source']}` ({result['network']}); "
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
            f"{_pct(w['overall']['p90_abs_error'])}.", ""]
    ds_findings = c["datasheet"]["findings"] if c else None
    out += ["| finding | needs | published table | predictions |"
            + (" predictions, datasheet values |" if c else ""),
            "| --- | --- | --- | --- |" + (" --- |" if c else "")]
    for i, (pub, pre) in enumerate(zip(result["findings"]["published"],
                                       result["findings"]["predicted"])):
        extra = (f" {verdict(ds_findings[i])}: {_cell(ds_findings[i]['detail'])} |"
                 if c else "")
        out.append(f"| ({pub['id']}) {_cell(pub['claim'])} | {_cell(pre['threshold'])} | "
                   f"{verdict(pub)}: {_cell(pub['detail'])} | {verdict(pre)}: "
                   f"{_cell(pre['detail'])} |{extra}")
    if c:
        out += ["", f"Every constant's source: {_kinds(c)} (provenance in the topology "
                    f"files). Median abs. error with datasheet values (every constant of kind "
                    f"chosen at its datasheet value) and with the shipped constants:", "",
                "| | cells | datasheet values | shipped |", "| --- | ---: | ---: | ---: |"]
        for key in ("by_network", "by_method", "by_model"):
            out += ["| " + " | ".join(r) + " |" for r in _compare_rows(c, key)]
        ds, sh = c["datasheet"]["summary"], c["shipped"]["summary"]
        out += [f"| **overall** | {sh['cells']} | {_pct(ds['overall']['median_abs_error'])} | "
                f"{_pct(sh['overall']['median_abs_error'])} |",
                f"| **90th percentile** | {sh['cells']} | "
                f"{_pct(ds['overall']['p90_abs_error'])} | "
                f"{_pct(sh['overall']['p90_abs_error'])} |", "",
                "Each chosen constant alone at its datasheet value and at its shipped value "
                "x 0.75 and x 1.25, the others as shipped (median abs. error):", "",
                "| constant | in | shipped | datasheet | at datasheet | x0.75 | shipped | x1.25 "
                "| findings failing |", "| --- | --- | --- | --- | ---: | ---: | ---: | ---: "
                "| --- |"]
        out += ["| " + " | ".join(_cell(x) for x in r) + " |" for r in _sensitivity_rows(c)]
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
    p.add_argument("--no-constants", action="store_true",
                   help="leave out the figure with datasheet values and each chosen "
                        "constant's sensitivity (the shipped figure alone, one pass)")
    return p.parse_args(argv)


def run(args) -> int:
    if args.output:
        check_writable(args.output)
    if args.markdown:
        check_writable(args.markdown, "--markdown")
    result = survey_result(args.network_source, constants=not args.no_constants)
    print(report(result))
    if args.output:
        with open_to_write(args.output) as f:
            json.dump(result, f, indent=1)
    if args.markdown:
        with open_to_write(args.markdown) as f:
            f.write(markdown(result))
    failed = failing_findings(result)
    for line in failed:
        print(f"validation: {line}", file=sys.stderr)
    return 1 if failed else 0


def failing_findings(result: dict) -> list[str]:
    """One line per declared finding that fails on the predictions (shipped constants): the
    command exits 1 when there is any. (A finding failing on the published table is in the
    report; on the whole table each passes, ``tests/test_validation.py``.)"""
    return [f"finding ({f['id']}) fails on the predictions: {f['detail']} (needs "
            f"{f['threshold']})" for f in result["findings"]["predicted"]
            if f["passed"] is False]


def main(argv=None) -> int:
    return run_cli(run, parse_args, argv)


if __name__ == "__main__":
    sys.exit(main())

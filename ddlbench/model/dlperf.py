"""DLPerf's published throughputs predicted before any comparison (issue 45, item 4):
``python -m ddlbench.model.dlperf``.

    python -m ddlbench.model.dlperf            # print every prediction
    python -m ddlbench.model.dlperf --write    # rewrite configs/reference/dlperf_predictions.json
    python -m ddlbench.model.dlperf --check    # exit 1 unless that file is what the model gives

The model's second published source (docs/DLPERF.md): OneFlow's DLPerf report, 4 nodes x 8
Tesla V100-SXM2 on NVLink with one 100Gb EDR InfiniBand adapter per node, ResNet-50 and
BERT-Base in FP32 under several frameworks (``configs/reference/dlperf_results.yaml``, every
published number and where it comes from). The cluster is
``configs/topology/dlperf-v100-edr.yaml``, from hardware facts only. Each modelled column (a
framework whose gradient exchange is one of the suite's methods: Horovod's tensor fusion
``fusion`` or a DistributedDataParallel ``ddp``, with the settings and sources the YAML gives)
is predicted at 8, 16 and 32 GPUs:

- **compute**: the model's H200 layer-wise profile (``configs/profiles/``: ResNet-50 batch 64,
  BERT-Base batch 64 at sequence length 64), every time scaled by one factor so that one worker
  runs at that column's own published 1-GPU throughput at the column's batch
  (``predict.rescaled``: the iteration is batch / 1-GPU figure); the profile's shape and
  gradient bytes are kept. The 1-GPU figure is the only published number the predictions use.
- **one path**: every cell is ``ddlbench.model.cell.predict``'s, as the CLI's, the sweep's and
  the survey validation's.
- **nothing compared**: this module does not read a published multi-GPU figure. The
  predictions file holds the inputs and the predictions only, so that it can be committed
  before the comparison; a constant changed after that is reported as chosen after comparing.
"""
from __future__ import annotations

import functools
import json
import os
import sys

from . import cell as cell_model
from . import predict, simulate, topology
from .. import yamlfile
from ..errors import ArgumentParser, UsageError, open_to_write, run_cli
from ..measure.profile_file import read_profile

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
REFERENCE = os.path.join(REPO, "configs", "reference", "dlperf_results.yaml")
PREDICTIONS = os.path.join(REPO, "configs", "reference", "dlperf_predictions.json")
TOPOLOGY = "dlperf-v100-edr"
PROFILE_DIR = os.path.join(REPO, "configs", "profiles")
# the report's models: the suite's fp32 H200 profiles of them
PROFILES = {"resnet50": "h200_resnet50_bs64.json", "bert_base": "h200_bert_base_bs64.json"}
WHAT = "DLPerf results"
CELL_FIELDS = {"table": str, "framework": str, "batch_size": int, "nodes": int, "nworkers": int,
               "throughput": (int, float)}
NOTE = ("Predicted before any comparison with the published multi-GPU figures (issue 45, item "
        "4): the only published numbers used are each column's 1-GPU throughput (the compute's "
        "rescale). A constant changed after the comparison is reported as chosen after "
        "comparing.")
COMPUTE = ("each profile's times scaled so one worker runs at the column's published 1-GPU "
           "throughput at the column's batch (predict.rescaled); the profile's shape and "
           "gradient bytes kept; optimizer step 0 (none profiled: it sits inside the rescaled "
           "compute)")


# --------------------------------------------------------------------------- the reference

@functools.lru_cache(maxsize=4)
def load(path: str = REFERENCE) -> dict:
    """The reference file, checked: ``tables``, ``frameworks`` and ``cells`` (each cell a
    table, a framework column of it, the batch, nodes, nworkers and the published
    throughput)."""
    doc = yamlfile.load(path, WHAT)
    where = f"{WHAT} {path}"
    if not isinstance(doc, dict):
        raise UsageError(f"{where} is not a mapping")
    tables, frameworks, cells = doc.get("tables"), doc.get("frameworks"), doc.get("cells")
    if not (isinstance(tables, dict) and isinstance(frameworks, dict)
            and isinstance(cells, list)):
        raise UsageError(f"{where} needs 'tables', 'frameworks' (mappings) and 'cells' (a list)")
    for name, t in tables.items():
        if not (isinstance(t, dict) and t.get("model") in PROFILES
                and isinstance(t.get("columns"), list)):
            raise UsageError(f"{where}: table {name!r} needs a model of {', '.join(PROFILES)} "
                             f"and its columns")
        for fw in t["columns"]:
            if fw not in frameworks:
                raise UsageError(f"{where}: table {name!r} names framework {fw!r}, not in "
                                 f"'frameworks'")
    for name, fw in frameworks.items():
        if not isinstance(fw, dict) or not isinstance(fw.get("modelled"), bool):
            raise UsageError(f"{where}: framework {name!r} needs 'modelled' (true or false)")
        if fw["modelled"]:
            if not isinstance(fw.get("method"), str) or not isinstance(fw.get("settings"), dict):
                raise UsageError(f"{where}: modelled framework {name!r} needs a method and "
                                 f"settings per model")
            simulate.method_class(fw["method"])  # a UsageError for a method not modelled
    for i, c in enumerate(cells, 1):
        if not isinstance(c, dict):
            raise UsageError(f"{where}: cell {i} is not a mapping")
        for key, kinds in CELL_FIELDS.items():
            if not isinstance(c.get(key), kinds) or isinstance(c.get(key), bool):
                raise UsageError(f"{where}: cell {i} has no valid {key!r}")
        if c["table"] not in tables or c["framework"] not in tables[c["table"]]["columns"]:
            raise UsageError(f"{where}: cell {i} names table {c['table']!r} and framework "
                             f"{c['framework']!r}, not a column of a table")
    return {"source": doc.get("source") or {}, "tables": tables, "frameworks": frameworks,
            "cells": tuple(cells)}


def single_gpu(table: str, framework: str, path: str = REFERENCE) -> float:
    """The column's published 1-GPU throughput (samples/s of one GPU): its compute's rescale."""
    ones = [c for c in load(path)["cells"] if c["table"] == table
            and c["framework"] == framework and c["nworkers"] == 1]
    if len(ones) != 1:
        raise UsageError(f"{WHAT}: table {table} column {framework} has {len(ones)} 1-GPU "
                         f"figures, not one")
    return float(ones[0]["throughput"])


def to_predict(path: str = REFERENCE) -> list[dict]:
    """The cells the model predicts, in the published order: every multi-GPU cell of a
    modelled column, as (table, model, framework, label, method, settings, batch_size, nodes,
    nworkers), without its published throughput."""
    ref = load(path)
    out = []
    for c in ref["cells"]:
        fw = ref["frameworks"][c["framework"]]
        if not fw["modelled"] or c["nworkers"] == 1:
            continue
        model = ref["tables"][c["table"]]["model"]
        if model not in fw["settings"]:
            raise UsageError(f"{WHAT}: framework {c['framework']} gives no settings for {model}")
        out.append({"table": c["table"], "model": model, "framework": c["framework"],
                    "label": str(fw.get("label", c["framework"])), "method": fw["method"],
                    "settings": dict(fw["settings"][model]), "batch_size": c["batch_size"],
                    "nodes": c["nodes"], "nworkers": c["nworkers"]})
    return out


def not_modelled(path: str = REFERENCE) -> dict[str, str]:
    """framework -> why its columns are not predicted."""
    return {name: str(fw.get("why", "")) for name, fw in load(path)["frameworks"].items()
            if not fw["modelled"]}


# --------------------------------------------------------------------------- the model

@functools.lru_cache(maxsize=8)
def _profile_work(model: str) -> tuple[simulate.Compute, int]:
    prof = read_profile(os.path.join(PROFILE_DIR, PROFILES[model]))
    if prof["model"] != model:
        raise UsageError(f"profile {PROFILES[model]} is of model {prof['model']}, not {model}")
    batch = int((prof.get("workload") or {}).get("batch_size") or 0)
    return predict.workload_of(prof, 0.0), batch


def workload(model: str, batch: int, single: float) -> simulate.Compute:
    """``model``'s H200 profile with every compute time scaled so that one worker trains
    ``single`` samples/s at ``batch`` samples per iteration (``predict.rescaled``)."""
    return predict.rescaled(_profile_work(model)[0], batch, single)


def _round(x: float, digits: int = 6) -> float:
    """``x`` to ``digits`` significant digits: the file's numbers, stable across runs."""
    return float(f"{x:.{digits}g}")


def predict_all(path: str = REFERENCE, network: str = TOPOLOGY) -> dict:
    """Every modelled cell's prediction (``to_predict``) on the topology ``network``, with the
    inputs it used; no published multi-GPU figure is read."""
    ref = load(path)
    net = topology.load(network)
    rows = []
    for c in to_predict(path):
        single = single_gpu(c["table"], c["framework"], path)
        work = workload(c["model"], c["batch_size"], single)
        answer = cell_model.predict(c["method"], work, c["nworkers"], c["settings"],
                                    network=net)
        pred = answer.prediction
        got = pred.throughput(c["batch_size"], c["nworkers"])
        rows.append({**c, "single_gpu": single, "predicted": round(got, 2),
                     "predicted_efficiency": _round(got / (c["nworkers"] * single), 4),
                     "iteration_s": _round(pred.iteration_s),
                     "compute_s": _round(c["batch_size"] / single),
                     "bottleneck": pred.bottleneck, "network_model": answer.network,
                     **({"model_notes": list(answer.notes)} if answer.notes else {})})
    profiles = {m: f"configs/profiles/{PROFILES[m]}" for m in sorted({r["model"] for r in rows})}
    batch_notes = {m: (f"profiled at batch {_profile_work(m)[1]}; a column's other batch "
                       f"scales the compute to batch / its 1-GPU figure, the profile's shape "
                       f"and bytes kept") for m in profiles}
    return {"kind": "dlperf-predictions", "note": NOTE,
            "source": dict(ref["source"]),
            "reference": os.path.relpath(path, REPO),
            "topology": network_constants(net),
            "profiles": profiles, "profile_batches": batch_notes, "compute": COMPUTE,
            "not_modelled": not_modelled(path),
            "predictions": rows}


def network_constants(net: topology.Topology) -> dict:
    """The topology's constants the predictions used (bytes/s, seconds), as the file states
    them: a change of any of them shows in the predictions file."""
    def link(x):
        return {"bandwidth_bytes_per_s": x.bandwidth, "latency_s": x.latency,
                "efficiency": x.efficiency}
    return {"name": net.name, "file": os.path.relpath(net.path, REPO), "nodes": net.nodes,
            "devices_per_node": net.devices_per_node, "allreduce": net.algorithm,
            "intra_node": link(net.intra), "inter_node": link(net.inter)}


def written(path: str = PREDICTIONS) -> dict:
    """The committed predictions file."""
    with open(path) as f:
        return json.load(f)


def stale(result: dict, path: str = PREDICTIONS) -> list[str]:
    """How the file at ``path`` differs from ``result`` (a fresh ``predict_all``), one line per
    difference; [] when it is what the model gives now."""
    try:
        old = written(path)
    except (OSError, ValueError) as e:
        return [f"{os.path.relpath(path, REPO)}: {e}"]
    fresh = json.loads(json.dumps(result))
    out = [f"{k}: differs" for k in sorted(set(old) | set(fresh))
           if k != "predictions" and old.get(k) != fresh.get(k)]
    a, b = old.get("predictions") or [], fresh["predictions"]
    if len(a) != len(b):
        out.append(f"predictions: {len(a)} in the file, {len(b)} now")
    for x, y in zip(a, b):
        if x != y:
            key = f"{y['table']} {y['framework']} P={y['nworkers']}"
            fields = sorted(k for k in set(x) | set(y) if x.get(k) != y.get(k))
            out.append(f"{key}: " + ", ".join(f"{k} {x.get(k)!r} -> {y.get(k)!r}"
                                              for k in fields))
    return out


# --------------------------------------------------------------------------- output

def report(result: dict) -> str:
    rows = [[r["model"], r["framework"], r["method"], _setting(r["settings"]),
             str(r["batch_size"]), str(r["nworkers"]), f"{r['single_gpu']:g}",
             f"{r['predicted']:.2f}", f"{100 * r['predicted_efficiency']:.1f}%",
             f"{1e3 * r['iteration_s']:.1f}", r["bottleneck"]]
            for r in result["predictions"]]
    header = ["model", "framework", "method", "setting", "batch", "P", "1 GPU", "predicted",
              "eff.", "iter ms", "bound by"]
    widths = [max(len(x[i]) for x in [header, *rows]) for i in range(len(header))]
    left = (0, 1, 2, 3, 10)
    t = result["topology"]
    net = ", ".join(f"{k.replace('_', '-')} {8 * v['bandwidth_bytes_per_s'] / 1e9:g} Gbit/s x "
                    f"{v['efficiency']:g}, {1e6 * v['latency_s']:g} us"
                    for k, v in (("intra_node", t["intra_node"]), ("inter_node", t["inter_node"])))
    lines = [f"DLPerf's cells as the model predicts them on {t['name']} ({t['nodes']} x "
             f"{t['devices_per_node']}, {t['allreduce']} all-reduce; {net}); "
             f"{result['compute']}.", ""]
    lines += ["  ".join(c.ljust(w) if i in left else c.rjust(w)
                        for i, (c, w) in enumerate(zip(r, widths))).rstrip()
              for r in [header, *rows]]
    lines += ["", "eff. = predicted / (P x the column's 1-GPU figure). Not modelled: "
              + "; ".join(f"{k} ({v})" for k, v in result["not_modelled"].items()) + ".",
              "", result["note"]]
    return "\n".join(lines)


def _setting(settings: dict) -> str:
    if "bucket_cap_mb" in settings:
        return f"bucket {settings['bucket_cap_mb']:.6g} MiB"
    if "threshold" in settings:
        return f"threshold {settings['threshold'] / 2 ** 20:.6g} MiB"
    return ", ".join(f"{k} {v}" for k, v in settings.items()) or "-"


def parse_args(argv=None):
    p = ArgumentParser(prog="python -m ddlbench.model.dlperf",
                       description=__doc__.split("\n")[0], raise_errors=True)
    what = p.add_mutually_exclusive_group()
    what.add_argument("--write", action="store_true",
                      help=f"write the predictions to {os.path.relpath(PREDICTIONS, REPO)}")
    what.add_argument("--check", action="store_true",
                      help="exit 1 unless the committed predictions are what the model gives")
    return p.parse_args(argv)


def run(args) -> int:
    result = predict_all()
    if args.check:
        diff = stale(result)
        for line in diff:
            print(line)
        print(f"{os.path.relpath(PREDICTIONS, REPO)}: "
              f"{'stale' if diff else 'what the model gives now'}")
        return 1 if diff else 0
    print(report(result))
    if args.write:
        with open_to_write(PREDICTIONS) as f:
            json.dump(result, f, indent=1)
            f.write("\n")
        print(f"\nwrote {os.path.relpath(PREDICTIONS, REPO)}")
    return 0


def main(argv=None) -> int:
    return run_cli(run, parse_args, argv)


if __name__ == "__main__":
    sys.exit(main())

"""The survey's published throughputs as data: ``configs/reference/survey_results.yaml``.

Shi et al. 2020 (the original repository's ``results/2020-05-29/README.md``; the YAML's header
says where from, what each field means and which cells are odd). ``cells()`` gives the 252
multi-GPU cells: model, batch_size (per GPU), rdma, network (the table's label), method (the
suite's id), original (the table's name), nworkers, throughput and std (samples/s, total over
all GPUs), and note on odd cells. ``single_gpu(model)`` gives the table's 1-GPU figure (samples/s
of one GPU). No torch, nothing but the YAML reader.
"""
from __future__ import annotations

import functools
import os

from .. import yamlfile
from ..errors import UsageError

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PATH = os.path.join(REPO, "configs", "reference", "survey_results.yaml")
WHAT = "survey results"
# field -> accepted types, for every cell of the file
CELL_FIELDS = {"model": (str,), "batch_size": (int,), "rdma": (int,), "method": (str,),
               "original": (str,), "nworkers": (int,), "throughput": (int, float),
               "std": (int, float)}


@functools.lru_cache(maxsize=4)
def _load(path: str) -> tuple[dict, dict, tuple[dict, ...]]:
    """(models, networks, cells) of the file, checked; cached per path."""
    doc = yamlfile.load(path, WHAT)
    where = f"{WHAT} {path}"
    if not isinstance(doc, dict):
        raise UsageError(f"{where} is not a mapping")
    models, networks, cells = doc.get("models"), doc.get("networks"), doc.get("cells")
    if not (isinstance(models, dict) and isinstance(networks, dict) and isinstance(cells, list)):
        raise UsageError(f"{where} needs 'models', 'networks' (mappings) and 'cells' (a list)")
    for name, entry in models.items():
        if not (isinstance(entry, dict) and _number(entry.get("single_gpu"))):
            raise UsageError(f"{where}: model {name!r} has no number 'single_gpu'")
    for rdma, entry in networks.items():
        if not (isinstance(entry, dict) and isinstance(entry.get("label"), str)):
            raise UsageError(f"{where}: network {rdma!r} has no 'label'")
    out = []
    for i, cell in enumerate(cells, 1):
        if not isinstance(cell, dict):
            raise UsageError(f"{where}: cell {i} is not a mapping")
        for key, kinds in CELL_FIELDS.items():
            value = cell.get(key)
            if not isinstance(value, kinds) or isinstance(value, bool):
                raise UsageError(f"{where}: cell {i} has no valid {key!r}")
        if cell["model"] not in models:
            raise UsageError(f"{where}: cell {i} names model {cell['model']!r}, not in 'models'")
        if cell["rdma"] not in networks:
            raise UsageError(f"{where}: cell {i} names rdma {cell['rdma']}, not in 'networks'")
        out.append({**cell, "network": networks[cell["rdma"]]["label"]})
    return models, networks, tuple(out)


def _number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def cells(path: str = PATH) -> list[dict]:
    """Every published multi-GPU cell, in the published order (network, model, method,
    GPUs); each a new dict with ``network`` (the table's label) added."""
    return [{key: list(value) if isinstance(value, list) else value
             for key, value in cell.items()} for cell in _load(path)[2]]


def model_name(model: str, path: str = PATH) -> str:
    """The table's name of ``model`` (``BERT-Large`` for bert)."""
    entry = _load(path)[0].get(model) or {}
    return str(entry.get("original", model))


def methods(path: str = PATH) -> list[str]:
    """The table's methods (suite ids), in the published order."""
    return list(dict.fromkeys(c["method"] for c in _load(path)[2]))


@functools.lru_cache(maxsize=4)
def findings(path: str = PATH) -> dict:
    """The survey's four findings as the YAML states them (``findings``): the methods, models,
    networks and thresholds each claim is about."""
    doc = yamlfile.load(path, WHAT)
    found = doc.get("findings") if isinstance(doc, dict) else None
    shapes = {"above": ("method", "over"), "best": ("method", "rdma", "tie"),
              "scales_worst": ("model", "nworkers"), "close": ("method", "to", "within")}
    if not isinstance(found, dict) or sorted(found) != sorted(shapes):
        raise UsageError(f"{WHAT} {path}: 'findings' must map {', '.join(shapes)}")
    for name, keys in shapes.items():
        if not (isinstance(found[name], dict) and sorted(found[name]) == sorted(keys)):
            raise UsageError(f"{WHAT} {path}: finding {name!r} needs exactly {', '.join(keys)}")
    return found


@functools.lru_cache(maxsize=4)
def odd(path: str = PATH) -> dict:
    """field -> values: the cells the YAML notes as odd (``odd``: each field's value listed)."""
    doc = yamlfile.load(path, WHAT)
    rule = doc.get("odd") if isinstance(doc, dict) else None
    if not (isinstance(rule, dict) and rule and all(k in CELL_FIELDS and isinstance(v, list)
                                                    for k, v in rule.items())):
        raise UsageError(f"{WHAT} {path}: 'odd' must map cell fields to lists of values")
    return {k: tuple(v) for k, v in rule.items()}


def single_gpu(model: str, path: str = PATH) -> float:
    """The table's 1-GPU figure of ``model`` (a suite model id: resnet50, bert, bert_base):
    samples/s of one GPU."""
    models = _load(path)[0]
    if model not in models:
        raise UsageError(f"the survey has no 1-GPU figure for {model!r}; it has "
                         f"{', '.join(models)}")
    return float(models[model]["single_gpu"])

"""Reference data for the performance model (issue 18): the survey's published table
(configs/reference/survey_results.yaml, read by ddlbench.model.survey) and the H200 layer-wise profiles
(configs/profiles/h200_*.json), converted from shared/reference/h200-layerwise.json.

The conversion lives here: ``python -m tests.test_reference_data`` rewrites the three profiles
from the reference, with the tensor shapes of the suite's own models (built on the meta device,
their parameter names and sizes checked against the reference's). The tests check, without torch
but for one shape check, that the stored files are that conversion and keep the reference's
figures exactly.
"""
import itertools
import json
import math
import os
import sys

import pytest

from ddlbench.errors import UsageError
from ddlbench.measure.profile_file import PROFILE_FORMAT, PROFILE_VERSION, read_profile

from .conftest import REPO

SHARED = os.path.join(os.path.dirname(REPO), "shared")
REFERENCE = os.path.join(SHARED, "reference", "h200-layerwise.json")
PROFILES = os.path.join(REPO, "configs", "profiles")
FP32 = 4

# file -> what the reference's README says of its key, and what the suite calls it
SPECS = {
    "h200_resnet50_bs64.json": {
        "key": "resnet50_64", "model": "resnet50", "unit": "img",
        "workload": {"batch_size": 64, "image_size": 224, "num_classes": 1000},
        "tensors": 161, "numel": 25_557_032, "throughput": 2012.0,
        "throughput_note": "2012 img/s (fp32; bf16 + channels_last: 3925 img/s)",
        "survey_single_gpu": 253.1},
    "h200_bert_bs8.json": {
        "key": "bert_8", "model": "bert", "unit": "sen",
        "workload": {"batch_size": 8, "sentence_len": 64, "layers": 24, "hidden": 1024,
                     "vocab_size": 30528},
        "tensors": 398, "numel": 336_232_258, "throughput": 224.0,
        "throughput_note": "224 sequences/s (fp32)", "survey_single_gpu": 49.0},
    "h200_bert_base_bs64.json": {
        "key": "bert_base_64", "model": "bert_base", "unit": "sen",
        "workload": {"batch_size": 64, "sentence_len": 64, "layers": 12, "hidden": 768,
                     "vocab_size": 30528},
        "tensors": 206, "numel": 110_111_042, "throughput": 946.0,
        "throughput_note": "946 sequences/s (fp32)", "survey_single_gpu": 212.8},
}


# --------------------------------------------------------------------------- the conversion

def convert(ref: dict, spec: dict, shapes: dict[str, list[int]]) -> dict:
    """The suite's profile (ddlbench/measure/profile_file.py, as python -m ddlbench.measure.profiler
    --output writes it) of one key of h200-layerwise.json; ``shapes``: name -> shape."""
    names, numel = ref["order_backward"], ref["numel"]
    batch = spec["workload"]["batch_size"]
    step_s = ref["tf_s"] + ref["tb_total_s"]
    return {
        "format": PROFILE_FORMAT, "version": PROFILE_VERSION, "model": spec["model"],
        "workload": dict(spec["workload"]),
        "tensors": [{"name": n, "shape": list(shapes[n]), "bytes": k * FP32}
                    for n, k in zip(names, numel)],
        "backward_s": list(ref["tb_s"]), "forward_s": ref["tf_s"],
        "alpha_s": 0.0, "beta_s_per_byte": 0.0,
        "nworkers": 1, "backend": None, "device": "cuda", "network": None,
        "iterations": {"warmup": 5, "measured": 20},
        "comm_fit": {"alpha_s": 0.0, "beta_s_per_byte": 0.0, "given": True},
        "throughput": spec["throughput"],
        "provenance": {
            "source": f"shared/reference/h200-layerwise.json, key {spec['key']!r} (described "
                      "by the README.md beside it)",
            "device": "one NVIDIA H200",
            "torch": "2.11",
            "setting": "fp32, cudnn.benchmark on, fake data on the device",
            "measured": "as MG-WFBP's profiler does: a hook on every parameter's gradient "
                        "synchronises the device and stamps the time; backward_s[i] is the gap "
                        "since the previous stamp (the first since the start of backward), "
                        "forward_s the forward pass; 5 warm-up and 20 measured iterations, "
                        "medians (the suite's profiler takes means)",
            "tb_total_s": ref["tb_total_s"], "tf_s": ref["tf_s"],
            "conversion": "tests/test_reference_data.py (python -m tests.test_reference_data):"
                          " tensors named and ordered by order_backward, bytes = 4 x numel "
                          f"(fp32), shapes from models.build({spec['model']!r}), whose "
                          "parameter names and sizes are the reference's exactly (no renaming);"
                          " backward_s = tb_s, forward_s = tf_s",
            "network": "none measured: alpha_s and beta_s_per_byte are 0; give python -m "
                       "ddlbench.model.predict --alpha/--beta (or fit them with ddlbench.measure.comm_bench)",
            "optimizer": "the optimizer's step was not measured: no optimizer_s (python -m "
                         "ddlbench.model.predict takes --optimizer-ms)",
            "throughput": "whole-step samples/s on the same GPU, plain PyTorch loop: "
                          + spec["throughput_note"],
            "profile_step_s": step_s,
            "profile_throughput": round(batch / step_s, 1),
            "profile_note": "forward + backward here take longer than the whole step above "
                            "(which includes the optimizer's step too): the measurement "
                            "synchronises the device at every gradient, the likely cause",
            "survey_single_gpu": spec["survey_single_gpu"],
            "survey_note": "the survey's 1-GPU figure, samples/s "
                           "(configs/reference/survey_results.yaml); see configs/profiles/"
                           "README.md to rescale to another device",
            "constants": constants(spec),
        },
    }


def constants(spec: dict) -> dict:
    """Every constant's kind and source (ddlbench.model.topology.KINDS, read by
    topology.profile_provenance): the compute measured on the H200, no network."""
    ref = f"shared/reference/h200-layerwise.json, key {spec['key']!r}"
    none = ("no network measured: 0 stands for a free network; give python -m "
            "ddlbench.model.predict --topology (a topology or comm_bench files) or --alpha/--beta")
    return {
        "forward_s": {"kind": "measured", "source": f"one NVIDIA H200, {ref} (tf_s): the "
                      "forward pass, median of 20 iterations"},
        "backward_s": {"kind": "measured", "source": f"one NVIDIA H200, {ref} (tb_s): each "
                       "gradient's gap since the previous stamp, median of 20 iterations"},
        "throughput": {"kind": "measured", "source": "one NVIDIA H200: whole-step samples/s "
                       "of a plain PyTorch loop, fp32 (the README.md beside the reference)"},
        "alpha_s": {"kind": "unmeasured", "source": none},
        "beta_s_per_byte": {"kind": "unmeasured", "source": none},
        "comm_fit": {"kind": "unmeasured", "source": "alpha_s and beta_s_per_byte as given "
                     "(0 and 0): " + none},
        "provenance.survey_single_gpu": {
            "kind": "original", "source": "the survey table's 1-GPU column, which the "
            "original's plots.py hard-codes (single_throughputs; "
            "configs/reference/survey_results.yaml)"},
    }


def _reference() -> dict:
    with open(REFERENCE) as f:
        return json.load(f)


def _stored(filename: str) -> dict:
    return read_profile(os.path.join(PROFILES, filename))


def write_profiles() -> None:
    """Convert the reference into configs/profiles/ (needs torch, transformers, torchvision)."""
    import torch

    import models
    from ddlbench.measure.profile_file import write_profile
    ref = _reference()
    for filename, spec in SPECS.items():
        entry = ref[spec["key"]]
        with torch.device("meta"):
            work = models.build(spec["model"])
        params = {n: p for n, p in work.model.named_parameters() if p.requires_grad}
        sizes = {n: p.numel() for n, p in params.items()}
        assert sorted(entry["order_backward"]) == sorted(params), spec["model"]
        assert dict(zip(entry["order_backward"], entry["numel"])) == sizes, spec["model"]
        assert {p.dtype for p in params.values()} == {torch.float32}
        assert spec["workload"] == {"batch_size": spec["workload"]["batch_size"],
                                    **work.details}, spec["model"]
        shapes = {n: list(p.shape) for n, p in params.items()}
        write_profile(os.path.join(PROFILES, filename), convert(entry, spec, shapes))
        print(f"wrote configs/profiles/{filename}")


# --------------------------------------------------------------------------- the profiles

@pytest.mark.parametrize("filename", list(SPECS))
def test_a_profile_loads_and_keeps_the_reference_s_figures(filename):
    spec, prof = SPECS[filename], _stored(filename)
    assert prof["model"] == spec["model"] and prof["workload"] == spec["workload"]
    tensors = prof["tensors"]
    assert len(tensors) == len(prof["backward_s"]) == spec["tensors"]
    assert len({t["name"] for t in tensors}) == len(tensors)
    assert sum(t["bytes"] for t in tensors) == FP32 * spec["numel"]
    assert all(math.prod(t["shape"]) * FP32 == t["bytes"] for t in tensors)
    prov = prof["provenance"]
    assert abs(sum(prof["backward_s"]) - prov["tb_total_s"]) < 1e-9
    assert prof["forward_s"] == prov["tf_s"]
    assert prof["alpha_s"] == prof["beta_s_per_byte"] == 0.0
    assert prof["throughput"] == spec["throughput"] and "optimizer_s" not in prof
    assert prov["survey_single_gpu"] == _survey().single_gpu(spec["model"])


@pytest.mark.parametrize("filename", list(SPECS))
def test_a_profile_is_the_conversion_of_the_reference(filename):
    if not os.path.exists(REFERENCE):
        pytest.skip(f"no {REFERENCE} (shared/ beside the clone)")
    spec, prof = SPECS[filename], _stored(filename)
    ref = _reference()[spec["key"]]
    assert len(ref["order_backward"]) == spec["tensors"] and sum(ref["numel"]) == spec["numel"]
    assert abs(sum(prof["backward_s"]) - ref["tb_total_s"]) < 1e-9
    assert prof["forward_s"] == ref["tf_s"]
    assert [t["name"] for t in prof["tensors"]] == ref["order_backward"]
    assert [t["bytes"] for t in prof["tensors"]] == [FP32 * k for k in ref["numel"]]
    shapes = {t["name"]: t["shape"] for t in prof["tensors"]}
    assert prof == convert(ref, spec, shapes)


def test_the_profiles_fit_the_suite_s_models():
    """The one torch check: every profile matches its model, names and shapes (meta device:
    no memory, no initialisation)."""
    torch = pytest.importorskip("torch")
    pytest.importorskip("transformers")
    import models
    from ddlbench.measure.profile_file import match_profile
    for filename, spec in SPECS.items():
        path = os.path.join(PROFILES, filename)
        prof = read_profile(path)
        with torch.device("meta"):
            work = models.build(spec["model"])
        order = match_profile(prof, work.model, spec["model"], path)
        assert sorted(order) == list(range(spec["tensors"]))
        assert prof["workload"] == {"batch_size": spec["workload"]["batch_size"],
                                    **work.details}


# --------------------------------------------------------------------------- the survey

def _survey():
    from ddlbench.model import survey
    return survey


MODELS = ("resnet50", "bert", "bert_base")
BATCH = {"resnet50": 64, "bert": 8, "bert_base": 64}
NETWORKS = {0: "10GbE with TCP/IP", 1: "100GbIB with RDMA", 2: "100GbE with TCP/IP"}
METHODS = ("bspa2a", "wfbp", "mgwfbp", "bytescheduler", "bspps", "wfbpps", "byteschedulerps")
NWORKERS = (4, 8, 16, 32)


def test_the_survey_has_every_published_cell_once():
    cells = _survey().cells()
    # 63 published rows (3 networks x 3 models x 7 methods) of 4 multi-GPU cells each
    assert len(cells) == 252 == len(NETWORKS) * len(MODELS) * len(METHODS) * len(NWORKERS)
    keys = [(c["model"], c["rdma"], c["method"], c["nworkers"]) for c in cells]
    assert len(set(keys)) == len(keys)
    assert set(keys) == set(itertools.product(MODELS, NETWORKS, METHODS, NWORKERS))
    for c in cells:
        assert c["batch_size"] == BATCH[c["model"]] and c["network"] == NETWORKS[c["rdma"]]
        assert c["throughput"] > 0 and c["std"] >= 0


def test_the_survey_keeps_the_published_figures():
    survey = _survey()
    assert survey.single_gpu("resnet50") == 253.1
    assert survey.single_gpu("bert") == 49.0
    assert survey.single_gpu("bert_base") == 212.8
    cells = {(c["model"], c["rdma"], c["method"], c["nworkers"]): c for c in survey.cells()}
    for key, throughput, std in ((("resnet50", 0, "bspa2a", 4), 925.020, 4.42),
                                 (("resnet50", 1, "mgwfbp", 32), 7876.460, 14.15),
                                 (("bert", 1, "mgwfbp", 32), 400.160, 1.88),
                                 (("bert", 0, "bspps", 8), 28.367, 0.21),
                                 (("bert_base", 2, "byteschedulerps", 32), 4516.998, 140.77)):
        assert (cells[key]["throughput"], cells[key]["std"]) == (throughput, std), key
    odd = cells[("bert", 0, "bytescheduler", 8)]
    assert (odd["throughput"], odd["std"], odd["note"]) == (30.4, 0.0, ["zero-std"])
    assert sum("zero-std" in c.get("note", ()) for c in cells.values()) == 6
    assert sum("fewer-lines" in c.get("note", ()) for c in cells.values()) == 8
    with pytest.raises(UsageError, match="resnet50, bert, bert_base"):
        survey.single_gpu("vgg16")


def test_the_survey_s_methods_are_the_suite_s():
    """Every method id is registered, displayed by the original's name, in the original's
    architecture (the registry is read without torch)."""
    from ddlbench import methods
    registered = methods.names()
    for c in _survey().cells():
        assert c["method"] in registered, c
        assert methods.lookup(c["method"]).display == c["original"], c
        assert methods.architecture(c["method"]) == ("ps" if c["original"].endswith("-PS")
                                                     else "a2a"), c


def test_the_survey_loader_names_a_malformed_file(tmp_path):
    survey = _survey()
    bad = tmp_path / "bad.yaml"
    bad.write_text("models: {resnet50: {single_gpu: 1}}\nnetworks: {0: {label: x}}\n"
                   "cells:\n  - {model: resnet50, rdma: 0}\n")
    with pytest.raises(UsageError, match="cell 1 has no valid 'batch_size'"):
        survey.cells(str(bad))
    bad.write_text("models: {}\nnetworks: {}\ncells: [")
    with pytest.raises(UsageError, match="malformed YAML"):
        survey.cells(str(bad))


if __name__ == "__main__":
    if sys.argv[1:] != ["--write"]:
        sys.exit("usage: python -m tests.test_reference_data --write  (rewrites "
                 "configs/profiles/h200_*.json from shared/reference/h200-layerwise.json)")
    write_profiles()

"""DLPerf, the model's second published source (issue 45, item 4): the reference file holds the
report's three FP32 tables as published, the topology file is the cluster, the predictions read
no published multi-GPU figure, and the committed predictions file is what the model gives now
(so a constant changed after it was written shows here)."""
import os

import pytest
import yaml

from ddlbench.errors import UsageError
from ddlbench.model import cell, dlperf, topology

from .conftest import REPO

ROWS = [(1, 1), (1, 8), (2, 16), (4, 32)]
COLUMNS = {
    "resnet50_fp32_bs128": ["oneflow", "ngc_mxnet", "ngc_tf1", "ngc_pytorch", "mxnet", "tf2",
                            "pytorch", "paddle"],
    "bert_base_fp32_bs32": ["oneflow", "ngc_tf1", "ngc_pytorch", "paddle", "oneflow_noclip",
                            "mxnet_noclip"],
    "bert_base_fp32_bsmax": ["oneflow", "ngc_tf1", "ngc_pytorch", "paddle", "oneflow_noclip",
                             "mxnet_noclip"],
}
MODELLED = {"ngc_pytorch": "ddp", "pytorch": "ddp", "ngc_tf1": "fusion", "ngc_mxnet": "fusion",
            "mxnet": "fusion", "mxnet_noclip": "fusion"}
# (table, framework, GPUs) -> the report's figure, as printed: each table's corners and a few
# inside (reports/dlperf_benchmark_test_report_v1.md at 9c9d9e2b).
PRINTED = {
    ("resnet50_fp32_bs128", "oneflow", 1): "397.64",
    ("resnet50_fp32_bs128", "ngc_tf1", 16): "5099.42",
    ("resnet50_fp32_bs128", "ngc_pytorch", 32): "10917.09",
    ("resnet50_fp32_bs128", "tf2", 1): "321.80",
    ("resnet50_fp32_bs128", "paddle", 32): "9348.17",
    ("bert_base_fp32_bs32", "oneflow", 1): "152.89",
    ("bert_base_fp32_bs32", "ngc_pytorch", 16): "1499.40",
    ("bert_base_fp32_bs32", "mxnet_noclip", 32): "3671.45",
    ("bert_base_fp32_bsmax", "oneflow", 1): "156.02",
    ("bert_base_fp32_bsmax", "ngc_tf1", 8): "855.45",
    ("bert_base_fp32_bsmax", "mxnet_noclip", 32): "4340.89",
}
BSMAX = {"oneflow": 96, "ngc_tf1": 48, "ngc_pytorch": 48, "paddle": 96, "oneflow_noclip": 96,
         "mxnet_noclip": 64}


def test_the_reference_holds_the_three_fp32_tables_every_cell_once():
    ref = dlperf.load()
    assert {t: v["columns"] for t, v in ref["tables"].items()} == COLUMNS
    assert len(ref["cells"]) == 80
    got = {}
    for c in ref["cells"]:
        key = (c["table"], c["framework"], c["nodes"], c["nworkers"])
        assert key not in got
        got[key] = c
    assert set(got) == {(t, f, n, p) for t, cols in COLUMNS.items() for f in cols
                        for n, p in ROWS}
    for (t, f, _, _), c in got.items():
        expected = 128 if t == "resnet50_fp32_bs128" else 32 if t == "bert_base_fp32_bs32" \
            else BSMAX[f]
        assert c["batch_size"] == expected
    # the digits as printed: the file's text has them, and they parse to the figure
    text = open(dlperf.REFERENCE).read()
    for (t, f, p), printed in PRINTED.items():
        (n,) = [n for n, q in ROWS if q == p]
        assert got[(t, f, n, p)]["throughput"] == float(printed)
        assert f"throughput: {printed}}}" in text
    assert ref["source"]["commit"] == "9c9d9e2b096e08f6452b5ff338ee1e39ec18f7a3"


def test_the_modelled_columns_and_their_settings():
    ref = dlperf.load()
    assert {k: v["method"] for k, v in ref["frameworks"].items() if v["modelled"]} == MODELLED
    assert set(dlperf.not_modelled()) == {"oneflow", "oneflow_noclip", "paddle", "tf2"}
    cells = dlperf.to_predict()
    assert len(cells) == 33 and {c["nworkers"] for c in cells} == {8, 16, 32}
    settings = {(c["framework"], c["model"]): c["settings"] for c in cells}
    # apex DDP: message_size elements of fp32, in MiB; torch DDP's default; Horovod 0.19's 64 MB
    assert settings[("ngc_pytorch", "resnet50")] == {"bucket_cap_mb": 1e7 * 4 / 2 ** 20}
    assert settings[("ngc_pytorch", "bert_base")] == {"bucket_cap_mb": 2.5e8 * 4 / 2 ** 20}
    assert settings[("pytorch", "resnet50")] == {"bucket_cap_mb": 25.0}
    assert all(s == {"threshold": 64 * 2 ** 20} for (f, _), s in settings.items()
               if MODELLED[f] == "fusion")
    assert "throughput" not in cells[0]


def test_the_cluster_is_4_nodes_of_8_gpus_on_edr():
    net = topology.load(dlperf.TOPOLOGY)
    assert (net.nodes, net.devices_per_node, net.algorithm) == (4, 8, "ring")
    assert net.inter.bandwidth == 100e9 / 8 and net.inter.efficiency == 0.99
    assert net.intra.bandwidth == 150e9
    # across nodes the ring steps at the NIC; inside one, at NVLink
    big = 64 * 2 ** 20
    assert net.link("allreduce", 16).time(big) > 10 * net.link("allreduce", 8).time(big)


def test_one_worker_runs_at_the_column_s_1_gpu_figure():
    net = topology.load(dlperf.TOPOLOGY)
    for t, table in dlperf.load()["tables"].items():
        for f in table["columns"]:
            fw = dlperf.load()["frameworks"][f]
            if not fw["modelled"]:
                continue
            single = dlperf.single_gpu(t, f)
            batch = next(c["batch_size"] for c in dlperf.load()["cells"]
                         if c["table"] == t and c["framework"] == f)
            work = dlperf.workload(table["model"], batch, single)
            got = cell.predict(fw["method"], work, 1, fw["settings"][table["model"]],
                               network=net).throughput(batch, 1)
            assert got == pytest.approx(single, rel=1e-9)


def test_the_predictions_read_no_published_multi_gpu_figure(tmp_path):
    raw = yaml.safe_load(open(dlperf.REFERENCE))
    for c in raw["cells"]:
        if c["nworkers"] > 1:
            c["throughput"] = 1.0
    path = tmp_path / "scrambled.yaml"
    path.write_text(yaml.safe_dump(raw))
    assert dlperf.predict_all(str(path))["predictions"] == dlperf.predict_all()["predictions"]


def test_the_committed_predictions_are_what_the_model_gives_now():
    result = dlperf.predict_all()
    assert dlperf.stale(result) == [], ("configs/reference/dlperf_predictions.json differs from "
                                        "the model: rewrite it with python -m "
                                        "ddlbench.model.dlperf --write, and report any constant "
                                        "changed after the comparison as chosen after comparing")
    saved = dlperf.written()
    assert len(saved["predictions"]) == 33
    # inputs and predictions only: no published multi-GPU figure, no error
    keys = {k for r in saved["predictions"] for k in r}
    assert not keys & {"published", "throughput", "error"}
    assert all(0 < r["predicted_efficiency"] <= 1 for r in saved["predictions"])


def test_a_changed_constant_shows_as_stale(tmp_path):
    result = dlperf.predict_all()
    result["predictions"][0]["predicted"] += 1
    result["topology"]["inter_node"]["efficiency"] = 0.9
    diff = dlperf.stale(result)
    assert any(line.startswith("topology") for line in diff)
    assert any("predicted" in line for line in diff)
    assert dlperf.main(["--check"]) == 0


def test_a_bad_reference_is_one_line(tmp_path):
    raw = yaml.safe_load(open(dlperf.REFERENCE))
    raw["cells"][0]["framework"] = "nobody"
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(raw))
    with pytest.raises(UsageError, match="not a column"):
        dlperf.load(str(path))


def test_the_files_are_where_the_docs_say():
    for rel in ("configs/reference/dlperf_results.yaml",
                "configs/reference/dlperf_predictions.json",
                "configs/topology/dlperf-v100-edr.yaml", "docs/DLPERF.md"):
        assert os.path.exists(os.path.join(REPO, rel)), rel

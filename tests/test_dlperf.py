"""DLPerf, the model's second published source (issue 45, item 4): the reference file holds the
report's three FP32 tables as published, the topology file is the cluster, the predictions read
no published multi-GPU figure, and the committed predictions file is what the model gives now
(so a constant changed after it was written shows here)."""
import os

import pytest
import yaml

from ddlbench.errors import UsageError
from ddlbench.model import cell, dlperf, simulate, topology

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
            options = simulate.options_for(fw["method"], **fw["settings"][table["model"]])
            got = cell.predict(fw["method"], work, 1, options,
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


# --------------------------------------------------------------------------- the comparison
# (written after the predictions were committed in 8cd2fda)

def _published_by_hand():
    """(table, framework, P) -> throughput, read from the reference's YAML directly."""
    raw = yaml.safe_load(open(dlperf.REFERENCE))
    return {(c["table"], c["framework"], c["nworkers"]): c["throughput"] for c in raw["cells"]}


def test_the_comparison_is_the_committed_file_against_the_published_figures(tmp_path):
    import json
    import statistics

    from ddlbench.model import validation

    published = _published_by_hand()
    saved = json.load(open(dlperf.PREDICTIONS))["predictions"]
    result = dlperf.compare()
    rows = result["rows"]
    assert len(rows) == len(saved) == 33
    for row, p in zip(rows, saved):
        key = (p["table"], p["framework"], p["nworkers"])
        assert (row["table"], row["framework"], row["nworkers"]) == key
        pub, pred = published[key], p["predicted"]
        one = published[(p["table"], p["framework"], 1)]
        assert row["published"] == pub and row["predicted"] == pred  # the file's, not rerun
        assert row["error"] == (pred - pub) / pub
        assert row["published_efficiency"] == pub / (p["nworkers"] * one)
        assert row["predicted_efficiency"] == pred / (p["nworkers"] * one)
    errors = [(p["predicted"] - published[(p["table"], p["framework"], p["nworkers"])])
              / published[(p["table"], p["framework"], p["nworkers"])] for p in saved]
    overall = result["summary"]["overall"]
    assert overall["median_abs_error"] == statistics.median(abs(e) for e in errors)
    assert overall["p90_abs_error"] == validation.percentile([abs(e) for e in errors], 90)
    assert overall["median_error"] == statistics.median(errors)
    assert overall["over_predicted"] == sum(e > 0 for e in errors)
    # the baseline: linear scaling, P x the 1-GPU figure, against the same published figures
    linear = [abs(p["nworkers"] * published[(p["table"], p["framework"], 1)]
                  / published[(p["table"], p["framework"], p["nworkers"])] - 1) for p in saved]
    assert overall["linear_median_abs_error"] == pytest.approx(statistics.median(linear))
    s = result["summary"]
    assert set(s["by_workers"]) == {"8", "16", "32"}
    assert set(s["by_table"]) == set(COLUMNS) and set(s["by_framework"]) == set(MODELLED)
    for key in ("by_table", "by_framework", "by_method", "by_model", "by_workers",
                "by_placement"):
        assert sum(v["cells"] for v in s[key].values()) == 33
    assert s["by_placement"]["inside one node"]["cells"] == 11
    for p in (8, 16, 32):
        mine = [abs(e) for e, q in zip(errors, saved) if q["nworkers"] == p]
        assert s["by_workers"][str(p)]["median_abs_error"] == statistics.median(mine)
    # the command: the same numbers in --output, the tables in --markdown
    out, md = tmp_path / "c.json", tmp_path / "c.md"
    assert dlperf.main(["--compare", "--output", str(out), "--markdown", str(md)]) == 0
    assert json.load(open(out))["rows"] == json.loads(json.dumps(rows))
    assert "| NGC PyTorch |" in md.read_text()
    assert dlperf.main(["--output", str(out)]) == 2  # --output goes with --compare


def test_the_comparison_refuses_predictions_the_model_no_longer_gives(tmp_path, monkeypatch,
                                                                     capsys):
    import json

    # a predictions file edited after the fact
    doc = json.load(open(dlperf.PREDICTIONS))
    doc["predictions"][0]["predicted"] += 1
    edited = tmp_path / "edited.json"
    edited.write_text(json.dumps(doc, indent=1))
    with pytest.raises(dlperf.StalePredictions, match="not what the model gives now"):
        dlperf.compare(str(edited))
    # a constant changed after the predictions: the committed file no longer matches
    real = topology.load

    def changed(spec, *a, **k):
        net = real(spec, *a, **k)
        return net.variant({"inter_node.efficiency": 0.9}) if spec == dlperf.TOPOLOGY else net
    monkeypatch.setattr(dlperf.topology, "load", changed)
    with pytest.raises(dlperf.StalePredictions):
        dlperf.compare()
    capsys.readouterr()
    assert dlperf.main(["--compare"]) == 2
    out, err = capsys.readouterr()
    assert out == "" and len(err.strip().splitlines()) == 1
    assert "no comparison" in err

"""benchmarks.py: sweep files, runs in their own process groups, results and the table."""
import json
import sys

import psutil
import pytest

from ddlbench import sweep
from ddlbench.errors import UsageError

from .conftest import REPO, describe, run


def write_config(tmp_path, **overrides):
    cfg = {
        "name": "t", "launcher": "local", "networks": ["local"],
        "tasks": [{"model": "bert_tiny", "batch_size": 4, "sentence_len": 16}],
        "methods": ["wfbp"], "nworkers": [1, 2], "tries": 2,
        "timing": {"warmup": 1, "batches_per_iter": 2, "iters": 2}, "timeout": 120,
        "extra_args": "--timeout 30",
        "results": str(tmp_path / "results"), "logs": str(tmp_path / "logs"),
    }
    cfg.update(overrides)
    path = tmp_path / "sweep.yaml"
    path.write_text(json.dumps(cfg))  # JSON is YAML
    return path


def bench(*args, timeout=600):
    return run([sys.executable, "benchmarks.py", *args], timeout=timeout)


def test_quick_sweep_records_every_try_and_prints_the_table(tmp_path):
    cfg = write_config(tmp_path)
    proc = bench("--config", str(cfg))
    assert proc.returncode == 0, describe(proc)
    entries = sweep.read_results(str(tmp_path / "results" / "results.jsonl"))
    assert len(entries) == 4 and all(e["status"] == "ok" for e in entries)
    assert sorted((e["nworkers"], e["try"]) for e in entries) == [(1, 0), (1, 1), (2, 0), (2, 1)]
    by_n = {}
    for e in entries:
        assert e["record"]["config"]["nworkers"] == e["nworkers"]
        by_n.setdefault(e["nworkers"], []).append(e["record"]["result"]["throughput"]["mean"])
        assert (tmp_path / "logs" / f"{e['cell']}_try{e['try']}.log").exists()
    import statistics
    expected = [f"{statistics.fmean(by_n[n]):.1f} +- {statistics.pstdev(by_n[n]):.2f}"
                for n in (1, 2)]
    table = (tmp_path / "results" / "report.md").read_text()
    assert table.splitlines()[0] == "| DNN | BS | CONNECTION | METHOD | 1 CPU | 2 CPUs |"
    assert table.splitlines()[2] == f"| BERT-Tiny | 4 | local | wfbp | {expected[0]} | {expected[1]} |"
    assert table in proc.stdout
    s = sweep.speedups(entries)[("local", "bert_tiny", 4, "wfbp")]
    assert s[1]["speedup"] == 1.0
    assert s[2]["speedup"] == pytest.approx(statistics.fmean(by_n[2]) / statistics.fmean(by_n[1]))


def test_failing_and_hanging_runs_do_not_stop_the_sweep(tmp_path):
    cfg = write_config(tmp_path, nworkers=[2], tries=1, timeout=45,
                       methods=["tests.broken_methods:Crash", "tests.broken_methods:Hang",
                                "wfbp"])
    proc = bench("--config", str(cfg))
    assert proc.returncode == 1, describe(proc)
    entries = {e["method"]["method"]: e for e in
               sweep.read_results(str(tmp_path / "results" / "results.jsonl"))}
    crash = entries["tests.broken_methods:Crash"]
    assert crash["status"] == "failed" and crash["reason"].startswith("exit code")
    assert any("test-crash: deliberate failure" in ln for ln in crash["log_tail"])
    hang = entries["tests.broken_methods:Hang"]
    assert hang["status"] == "timeout" and hang["reason"] == "killed after 45 s"
    assert entries["wfbp"]["status"] == "ok"
    # Nothing of the killed run is left behind.
    leftovers = [p for p in psutil.process_iter(["cmdline"])
                 if str(tmp_path) in " ".join(p.info["cmdline"] or [])]
    assert leftovers == []
    table = (tmp_path / "results" / "report.md").read_text()
    assert "| tests.broken_methods:Hang | failed |" in table


def test_report_from_a_hand_written_store_is_exact():
    def entry(method, n, thr, status="ok"):
        e = {"sweep": "s", "network": "rdma0", "task": {"model": "resnet50", "batch_size": 64},
             "method": {"method": method}, "nworkers": n, "status": status}
        if status == "ok":
            e["record"] = {"result": {"throughput": {"mean": thr}},
                           "environment": {"device": "cuda:0"}}
        return e
    entries = [entry("wfbp", 1, 250.0), entry("wfbp", 4, 900.0), entry("wfbp", 4, 1000.0),
               entry("bspa2a", 1, 240.0), entry("bspa2a", 4, 0, status="failed")]
    assert sweep.report(entries) == (
        "| DNN | BS | CONNECTION | METHOD | 1 GPU | 4 GPUs |\n"
        "| --- | --- | --- | --- | --- | --- |\n"
        "| ResNet-50 | 64 | 10GbE with TCP/IP | wfbp | 250.0 +- 0.00 | 950.0 +- 50.00 |\n"
        "| ResNet-50 | 64 | 10GbE with TCP/IP | bspa2a | 240.0 +- 0.00 | failed |\n")
    s = sweep.speedups(entries)
    assert s[("rdma0", "resnet50", 64, "wfbp")][4] == {"speedup": 3.8, "efficiency": 0.95}


def test_malformed_yaml_is_one_line(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: x\ntasks: [unclosed\n")
    proc = bench("--config", str(bad))
    assert proc.returncode == 2
    err = proc.stderr.strip().splitlines()
    assert len(err) == 1 and "malformed YAML" in err[0], proc.stderr
    assert proc.stdout == ""


def test_every_problem_is_listed_and_nothing_starts(tmp_path):
    cfg = write_config(tmp_path, colour="red", nworkers=[0, 2], tries=0,
                       methods=["wfbp", "nosuch"],
                       tasks=[{"model": "nonet", "batch_size": -1, "pixels": 3}])
    proc = bench("--config", str(cfg))
    assert proc.returncode == 2
    err = proc.stderr.strip()
    assert len(err.splitlines()) == 1
    for problem in ["unknown key 'colour'", "nworkers entry 0", "tries must be a positive",
                    "unknown method 'nosuch'", "unknown model 'nonet'",
                    "batch_size must be a positive integer", "unknown key 'pixels'"]:
        assert problem in err, problem
    assert "7 problem(s)" in err
    assert not (tmp_path / "results").exists() and not (tmp_path / "logs").exists()


def test_mpi_sweep_rejects_missing_slots(tmp_path):
    with pytest.raises(UsageError, match="holds example hosts"):
        sweep.load(str(write_config(tmp_path, launcher="mpi", networks=["rdma0"],
                                    nworkers=[2, 8])))
    with pytest.raises(UsageError, match="with launcher mpi use rdma0"):
        sweep.load(str(write_config(tmp_path, launcher="mpi", networks=["local"],
                                    nworkers=[2])))


def test_mpi_sweep_runs_through_the_shell_launcher(tmp_path):
    cfg = write_config(tmp_path, launcher="mpi", networks=["rdma0"], nworkers=[2], tries=1)
    proc = bench("--config", str(cfg))
    assert proc.returncode == 0, describe(proc)
    [e] = sweep.read_results(str(tmp_path / "results" / "results.jsonl"))
    assert e["status"] == "ok" and e["record"]["environment"]["launcher"] == "mpi"
    assert "horovod_mpi_cj.sh" in e["command"] and "nworkers=2" in e["command"]
    assert "| BERT-Tiny | 4 | 10GbE with TCP/IP | wfbp |" in proc.stdout


def test_presets_load():
    quick = sweep.load(sweep.resolve_config("quick"))
    assert quick.launcher == "local" and quick.nworkers == [1, 2, 4]
    with pytest.raises(UsageError, match="example hosts"):
        sweep.load(sweep.resolve_config("paper"))  # needs a real cluster's host files
    with pytest.raises(UsageError, match="sweep config 'nope' not found"):
        sweep.resolve_config("nope")

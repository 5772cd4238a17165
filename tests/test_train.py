"""The training script: log lines, the run record, bad input."""
import os

import pytest

from ddlbench.measure.timing import percentile

from .conftest import QUICK_TIMING, SMALL_CNN, TINY_BERT, describe, run, train


def original_rule(text):
    """The original benchmarks.py: lines with 'Total', float(line.split(': ')[-1].split()[0])."""
    return [float(line.split(": ")[-1].split()[0]) for line in text.splitlines()
            if line.find("Total") >= 0]


@pytest.mark.parametrize("method", ["bspa2a", "wfbp", "fusion", "ddp"])
def test_benchmark_run_prints_the_original_lines_and_writes_the_record(tmp_path, load_json,
                                                                       method):
    out = tmp_path / "rec.json"
    threshold = ["--threshold", "1000000"] if method == "fusion" else []  # fusion's option
    proc = train(*SMALL_CNN, *QUICK_TIMING, "--method", method, "--nworkers", "2",
                 *threshold, "--output", str(out))
    assert proc.returncode == 0, describe(proc)
    lines = proc.stdout.splitlines()
    iters = [ln for ln in lines if ln.startswith("Iter #")]
    assert [ln.split(":")[0] for ln in iters] == ["Iter #0", "Iter #1"]
    assert all(ln.endswith("img/sec per CPU") for ln in iters)
    # the original's order of lines: warm-up, benchmark, the rounds
    assert lines.index("Running warmup...") < lines.index("Running benchmark...") \
        < lines.index(iters[0])
    assert any(ln.startswith("Img/sec per CPU: ") and " +-" in ln for ln in lines)
    totals = original_rule(proc.stdout)
    assert len(totals) == 1
    assert "Total img/sec on 2 CPU(s): " in proc.stdout

    rec = load_json(out)
    result = rec["result"]
    # The printed total is the record's mean total throughput, rounded as printed.
    assert totals[0] == pytest.approx(round(result["throughput"]["mean"], 1), abs=0.051)
    # throughput = P * batch * batches / slowest round time, for every round.
    for seconds, total in zip(result["round_seconds"], result["total_throughput"]):
        assert total == pytest.approx(2 * 4 * 2 / seconds)
    assert len(result["round_seconds"]) == 2
    model = rec["model"]
    assert model["tensors"] == 62 and model["parameters"] == 11689512
    assert model["gradient_bytes"] == 4 * model["parameters"]
    # Every gradient byte is all-reduced exactly once per iteration; ring wire bytes 2(P-1)/P M.
    comm = rec["communication_per_iteration"]
    assert comm["payload_bytes"]["allreduce"] == model["gradient_bytes"]
    assert comm["wire_sent_bytes"]["allreduce"] == pytest.approx(model["gradient_bytes"], abs=1)
    env = rec["environment"]
    assert env["backend"] == "gloo" and env["hosts"] == [env["hostname"]] * 2
    assert env["torch"] and env["launcher"] == "local"
    assert rec["config"]["nworkers"] == 2 and rec["config"]["method"] == method
    assert rec["method"]["method"] == method


def test_fusion_buckets_respect_the_threshold_and_bert_counts(tmp_path, load_json):
    out = tmp_path / "rec.json"
    proc = train(*TINY_BERT, *QUICK_TIMING, "--method", "fusion", "--threshold", "1000000",
                 "--nworkers", "3", "--output", str(out))
    assert proc.returncode == 0, describe(proc)
    assert "Total sen/sec on 3 CPU(s): " in proc.stdout
    iters = [ln for ln in proc.stdout.splitlines() if ln.startswith("Iter #")]
    assert iters and all(ln.endswith(" sentences/sec per CPU") for ln in iters)  # the original's
    rec = load_json(out)
    m = rec["method"]
    big = [b for b in m["bucket_bytes"] if b > 1000000]
    # Only a lone tensor larger than the threshold may exceed it, and it needs no buffer.
    assert m["max_fusion_buffer_bytes"] <= 1000000
    assert sum(m["bucket_bytes"]) == rec["model"]["gradient_bytes"]
    assert m["buckets"] == len(m["bucket_bytes"]) > 1 and big
    comm = rec["communication_per_iteration"]
    assert comm["payload_bytes"]["allreduce"] == rec["model"]["gradient_bytes"]
    assert comm["calls"]["allreduce"] == m["buckets"]
    assert comm["wire_sent_bytes"]["allreduce"] == pytest.approx(
        rec["model"]["gradient_bytes"] * 2 * 2 / 3, abs=m["buckets"])


def test_single_worker_runs_in_process(tmp_path, load_json):
    out = tmp_path / "rec.json"
    proc = train(*TINY_BERT, *QUICK_TIMING, "--method", "wfbp", "--output", str(out))
    assert proc.returncode == 0, describe(proc)
    rec = load_json(out)
    assert rec["environment"]["launcher"] == "single" and rec["config"]["nworkers"] == 1
    assert rec["communication_per_iteration"]["wire_sent_bytes"]["allreduce"] == 0


@pytest.mark.parametrize("args,message", [
    (["--model", "resnet5000"], "unknown model 'resnet5000'"),
    (["--method", "magic"], "unknown method 'magic'"),
    (["--batch-size", "0"], "--batch-size must be positive, got 0"),
    (["--batch-size", "-3"], "--batch-size must be positive, got -3"),
    (["--nworkers", "0"], "--nworkers must be positive, got 0"),
    (["--compressor", "zip"], "unknown compressor 'zip'"),
    (["--density", "1.5"], "--density must be in (0, 1], got 1.5"),
    (["--threshold", "-1"], "--threshold must be >= 0 bytes"),
    (["--method", "nosuchmodule:Thing"], "cannot load method 'nosuchmodule:Thing'"),
    (["--engine", "horovod"], "--engine horovod is unavailable"),
    (["--engine", "byteps"], "argument --engine: invalid choice: 'byteps'"),
])
def test_bad_input_is_one_line_and_nonzero_and_writes_nothing(tmp_path, args, message):
    out = tmp_path / "rec.json"
    proc = train(*TINY_BERT, "--nworkers", "2", *args, "--output", str(out), timeout=120)
    assert proc.returncode == 2, describe(proc)
    err = proc.stderr.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("ddlbench: error: ") and message in err[0], err
    assert proc.stdout == ""
    assert not out.exists() and os.listdir(tmp_path) == []


def test_nworkers_must_match_the_launcher(tmp_path):
    proc = run(["torchrun", "--standalone", "--nproc-per-node", "2", "-m", "ddlbench.train",
                *TINY_BERT, "--nworkers", "3", "--verify", "1"], timeout=120)
    assert proc.returncode != 0
    assert "--nworkers 3, but the torchrun launcher started 2 processes" in proc.stderr


def test_percentile_matches_linear_interpolation():
    assert percentile([1.0, 2.0, 3.0, 4.0], 50) == 2.5
    assert percentile([10.0, 0.0, 5.0], 90) == pytest.approx(9.0)
    assert percentile([7.0], 90) == 7.0


def test_bert_vocabulary_is_padded_to_a_multiple_of_8_as_the_original():
    import models
    for name in ("bert", "bert_base"):  # the configs the models are built from
        assert models.bert_config(name).vocab_size == 30528, name  # 30522 padded, as there

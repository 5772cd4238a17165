"""The training script: log lines, the run record, bad input."""
import os

import pytest

from ddlbench.errors import UsageError
from ddlbench.measure.timing import percentile

from . import traces
from .conftest import QUICK_TIMING, SMALL_CNN, TINY_BERT, describe, run, train


def original_rule(text):
    """The original benchmarks.py: lines with 'Total', float(line.split(': ')[-1].split()[0])."""
    return [float(line.split(": ")[-1].split()[0]) for line in text.splitlines()
            if line.find("Total") >= 0]


SHARED_JOB = ["bspa2a", "wfbp", "fusion", "ddp"]


@pytest.fixture(scope="module")
def shared_job(tmp_path_factory):
    """One job timing four methods in turn (--method a,b,...: a record and a trace each),
    2 workers: the process, and what each method's part of its output and files is."""
    folder = tmp_path_factory.mktemp("shared_job")
    proc = train(*SMALL_CNN, *QUICK_TIMING, "--method", ",".join(SHARED_JOB), "--nworkers",
                 "2", "--threshold", "1000000",  # fusion's option: the others have none
                 "--output", str(folder / "{method}.json"),
                 "--timeline", str(folder / "{method}.trace.json"))
    assert proc.returncode == 0, describe(proc)
    # each method's part of the log: from its "Model:" header line to the next one
    starts = [i for i, ln in enumerate(proc.stdout.splitlines()) if ln.startswith("Model: ")]
    lines = proc.stdout.splitlines()
    parts = [lines[a:b] for a, b in zip(starts, starts[1:] + [len(lines)])]
    assert [p[1].split(" (")[0] for p in parts] == [f"Method: {m}" for m in SHARED_JOB]
    return folder, dict(zip(SHARED_JOB, parts))


@pytest.mark.parametrize("method", SHARED_JOB)
def test_benchmark_run_prints_the_original_lines_and_writes_the_record(shared_job, load_json,
                                                                       method):
    folder, parts = shared_job
    out, trace = folder / f"{method}.json", folder / f"{method}.trace.json"
    lines = parts[method]
    stdout = "\n".join(lines)
    iters = [ln for ln in lines if ln.startswith("Iter #")]
    assert [ln.split(":")[0] for ln in iters] == ["Iter #0", "Iter #1"]
    assert all(ln.endswith("img/sec per CPU") for ln in iters)
    # the original's order of lines: warm-up, benchmark, the rounds
    assert lines.index("Running warmup...") < lines.index("Running benchmark...") \
        < lines.index(iters[0])
    assert not any(ln.startswith("BERT Large Pretraining") for ln in lines)  # BERT's only
    assert any(ln.startswith("Img/sec per CPU: ") and " +-" in ln for ln in lines)
    totals = original_rule(stdout)
    assert len(totals) == 1
    assert "Total img/sec on 2 CPU(s): " in stdout

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
    # timed in turn in one job: which, and where in it
    assert rec["config"]["job"] == {"methods": SHARED_JOB, "index": SHARED_JOB.index(method)}
    assert rec["config"]["timeline"] == str(trace)
    # --optimizer auto for a CNN: the original's SGD, no momentum, 0.01 x workers
    assert rec["optimizer"] == {"class": "SGD", "flag": "auto", "auto": True, "lr": 0.02,
                                "lr_given": False, "momentum": 0.0, "betas": None, "eps": None,
                                "weight_decay": 0.0}
    # resnet18 at 32 px: tests/test_flops.py works the figures out by hand
    flops = rec["flops"]
    assert (flops["forward_per_sample"], flops["forward_backward_per_sample"]) == (75046912,
                                                                                220323840)
    rate = flops["achieved_flops_per_second"]
    assert rate["total"] == pytest.approx(2 * rate["per_worker"])
    assert rate["total"] == pytest.approx(result["throughput"]["mean"] * 220323840)
    # The timeline of the 4 timed steps (DDP's buckets through the suite's all-reduce hook,
    # which a trace file turns on)
    rows = traces.check_run_trace(trace, 2, 4)
    traces.check_record(rec["timeline"], 2, 4, trace)
    if method == "bspa2a":   # one all-reduce of the whole gradient per step, after backward
        assert [(n, b) for _, n, b in traces.collectives(rows, 0)] == \
            [("allreduce", model["gradient_bytes"])] * 4
        # averaged by the all-reduce itself (ReduceOp.AVG: Gloo on torch >= 2.8): no division
        # after it, so no decode span on the compressor's row
        assert not [e for e in rows.get((0, "compressor"), []) if e["name"] == "decode"]
    if method in ("fusion", "ddp"):   # one per bucket
        assert len(traces.collectives(rows, 0)) == 4 * rec["method"]["buckets"] > 4
    if method == "ddp":   # torch's default buckets: 1 MiB first, then 25 MiB (the simulator's
        # planning.ddp_buckets: each closes once it holds its cap, test_simulate)
        assert rec["method"]["first_bucket_bytes"] == 1 << 20
        assert [b for _, _, b in traces.collectives(rows, 0)] == \
            [2052000, 28852224, 15853824] * 4
        # its end-of-backward wait for the all-reduces: a wait, in backward
        main = rows[(0, traces.MAIN)]
        waits = [e for e in main if e["name"] == "all-reduces"]
        backwards = [e for e in main if e["name"] == "backward"]
        assert len(waits) == len(backwards) == 4 and all(e["cat"] == "wait" for e in waits)
        for w, b in zip(waits, backwards):
            assert b["ts"] <= w["ts"] and w["ts"] + w["dur"] <= b["ts"] + b["dur"] + 1


def test_fusion_buckets_respect_the_threshold_and_bert_counts(tmp_path, load_json):
    out, trace = tmp_path / "rec.json", tmp_path / "trace.json"
    proc = train(*TINY_BERT, *QUICK_TIMING, "--method", "fusion", "--threshold", "200000",
                 "--nworkers", "3", "--output", str(out), "--timeline", str(trace))
    assert proc.returncode == 0, describe(proc)
    assert "Total sen/sec on 3 CPU(s): " in proc.stdout
    iters = [ln for ln in proc.stdout.splitlines() if ln.startswith("Iter #")]
    assert iters and all(ln.endswith(" sentences/sec per CPU") for ln in iters)  # the original's
    # the original's BERT line, once, after the warm-up and just before the timed rounds
    lines = proc.stdout.splitlines()
    assert lines.count("BERT Large Pretraining, Sentence len: 16") == 1, describe(proc)
    at = lines.index("BERT Large Pretraining, Sentence len: 16")
    assert lines.index("Running warmup...") < at and lines[at + 1] == "Running benchmark..."
    rec = load_json(out)
    assert rec["model"]["vocab_size"] == 1024 and rec["config"]["vocab_size"] == 1024
    m = rec["method"]
    big = [b for b in m["bucket_bytes"] if b > 200000]
    # Only a lone tensor larger than the threshold may exceed it, and it needs no buffer.
    assert m["max_fusion_buffer_bytes"] <= 200000
    assert sum(m["bucket_bytes"]) == rec["model"]["gradient_bytes"]
    assert m["buckets"] == len(m["bucket_bytes"]) > 1 and big
    comm = rec["communication_per_iteration"]
    assert comm["payload_bytes"]["allreduce"] == rec["model"]["gradient_bytes"]
    assert comm["calls"]["allreduce"] == m["buckets"]
    assert comm["wire_sent_bytes"]["allreduce"] == pytest.approx(
        rec["model"]["gradient_bytes"] * 2 * 2 / 3, abs=m["buckets"])
    # Its timeline: on 3 workers, one all-reduce per bucket, the buckets' bytes
    rows = traces.check_run_trace(trace, 3, 4)
    traces.check_record(rec["timeline"], 3, 4, trace)
    assert sorted(b for _, _, b in traces.collectives(rows, 2)) == sorted(m["bucket_bytes"] * 4)


def test_single_worker_runs_in_process(tmp_path, load_json):
    out = tmp_path / "rec.json"
    proc = train(*TINY_BERT, *QUICK_TIMING, "--method", "wfbp", "--output", str(out))
    assert proc.returncode == 0, describe(proc)
    rec = load_json(out)
    assert rec["environment"]["launcher"] == "single" and rec["config"]["nworkers"] == 1
    assert rec["communication_per_iteration"]["wire_sent_bytes"]["allreduce"] == 0
    # --optimizer auto for BERT: the original's AdamW, lr 2e-5 whatever the workers
    assert rec["optimizer"] == {"class": "AdamW", "flag": "auto", "auto": True, "lr": 2e-5,
                                "lr_given": False, "momentum": None, "betas": [0.9, 0.999],
                                "eps": 1e-8, "weight_decay": 0.0}
    # FLOPs counted once (tiny BERT: a fraction of a second), FLOP/s = throughput x FLOPs
    flops = rec["flops"]
    per_sample = flops["forward_backward_per_sample"]
    assert 0 < flops["forward_per_sample"] < per_sample and flops["count_seconds"] > 0
    rate = flops["achieved_flops_per_second"]
    assert rate["per_worker"] == rate["total"] == pytest.approx(
        rec["result"]["throughput"]["mean"] * per_sample)
    line = [ln for ln in proc.stdout.splitlines() if ln.startswith("FLOPs: ")]
    assert line == [f"FLOPs: {per_sample / 1e9:.3f} GFLOP per sen forward+backward "
                    f"({flops['forward_per_sample'] / 1e9:.3f} forward); achieved "
                    f"{rate['per_worker'] / 1e12:.3f} TFLOP/s per CPU, "
                    f"{rate['total'] / 1e12:.3f} TFLOP/s on 1 CPU(s)"], proc.stdout


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
    (["--engine", "byteps"], "--engine byteps is unavailable in this Python"),
    (["--engine", "mxnet"], "argument --engine: invalid choice: 'mxnet'"),
    (["--vocab-size", "0"], "--vocab-size must be positive, got 0"),
])
def test_bad_input_is_one_line_and_nonzero_and_writes_nothing(tmp_path, args, message):
    out = tmp_path / "rec.json"
    proc = train(*TINY_BERT, "--nworkers", "2", *args, "--output", str(out), timeout=120)
    assert proc.returncode == 2, describe(proc)
    err = proc.stderr.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("ddlbench: error: ") and message in err[0], err
    assert proc.stdout == ""
    assert not out.exists() and os.listdir(tmp_path) == []


@pytest.mark.parametrize("args,message", [
    (["--method", "wfbp,fusion", "--output", "rec.json"],
     "--output with several methods or compressors needs '{method}' in the path (one record "
     "each)"),
    (["--method", "wfbp,fusion", "--timeline", "t.json"],
     "--timeline with several methods or compressors needs '{method}' in the path"),
    (["--method", "wfbp,fusion", "--engine", "horovod", "--output", "r_{method}.json"],
     "several methods in one benchmark job only with --engine torch"),
])
def test_a_job_of_several_methods_refuses_bad_input(tmp_path, monkeypatch, capsys, args,
                                                    message):
    import ddlbench.flags
    import ddlbench.train as train_script
    monkeypatch.chdir(tmp_path)
    if "horovod" in args:  # as if Horovod were importable: the job's shape is refused first
        monkeypatch.setattr(ddlbench.flags, "_check_lane", lambda *a: None)
    code = train_script.main([*TINY_BERT, "--nworkers", "2", *args])
    out, err = capsys.readouterr()
    assert code == 2 and out == ""
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("ddlbench: error: ") and message in lines[0], err
    assert os.listdir(tmp_path) == []


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


def test_the_survey_cnns_known_without_torchvision_are_torchvisions():
    import models
    assert set(models.SURVEY_CNNS) <= set(models.cnn_names())
    models.check("squeezenet1_1")  # not in the list: asked of torchvision
    with pytest.raises(UsageError, match="unknown model 'resnet17'"):
        models.check("resnet17")


# --optimizer auto: the original's per model family (HKBU-HPML/ddl-benchmarks: its
# imagenet_benchmark.py scripts ran optim.SGD(lr=0.01 x workers), its BERT scripts in horovod/
# and mgwfbp/ transformers' AdamW(lr=2e-5, eps=1e-8), weight decay 0, lr not scaled).
@pytest.mark.parametrize("argv,nworkers,expected", [
    (["--model", "resnet50"], 4,
     {"class": "SGD", "lr": 0.04, "momentum": 0.0, "weight_decay": 0.0, "eps": None}),
    (["--model", "bert"], 4,
     {"class": "AdamW", "lr": 2e-5, "eps": 1e-8, "betas": [0.9, 0.999], "weight_decay": 0.0,
      "momentum": None}),
    (["--model", "bert_base"], 1, {"class": "AdamW", "lr": 2e-5, "weight_decay": 0.0}),
    (["--model", "bert_tiny"], 8, {"class": "AdamW", "lr": 2e-5}),
    # explicit flags win over the model family
    (["--model", "bert", "--optimizer", "sgd"], 2, {"class": "SGD", "lr": 0.02, "momentum": 0.0}),
    (["--model", "resnet50", "--optimizer", "adamw"], 2,
     {"class": "AdamW", "lr": 2e-5, "eps": 1e-8, "weight_decay": 0.0}),
    (["--model", "resnet50", "--optimizer", "adam"], 2, {"class": "Adam", "lr": 2e-5}),
    (["--model", "resnet50", "--momentum", "0.9", "--lr", "0.1", "--weight-decay", "1e-4"], 3,
     {"class": "SGD", "lr": 0.1, "momentum": 0.9, "weight_decay": 1e-4, "lr_given": True}),
    (["--model", "bert", "--lr", "1e-3", "--weight-decay", "0.01"], 3,
     {"class": "AdamW", "lr": 1e-3, "weight_decay": 0.01, "lr_given": True}),
    # the original's byteps/ scripts: SGD 0.01 for every model, not scaled by the workers
    (["--model", "bert", "--optimizer", "original-ps"], 4,
     {"class": "SGD", "lr": 0.01, "momentum": 0.0, "weight_decay": 0.0}),
    (["--model", "resnet50", "--optimizer", "original-ps", "--momentum", "0.9"], 8,
     {"class": "SGD", "lr": 0.01, "momentum": 0.9}),
])
def test_optimizer_choice_and_its_record(argv, nworkers, expected):
    import torch

    from ddlbench.measure import workload
    from ddlbench.train import parse_args
    args = parse_args(argv)
    spec = workload.OptimizerSpec.of(args)
    lr = workload.learning_rate(spec, nworkers)
    opt = workload.make_optimizer(spec, [torch.nn.Parameter(torch.zeros(2))], lr)
    info = workload.optimizer_info(spec, opt)
    assert info["auto"] == ("--optimizer" not in argv)
    assert info["flag"] == args.optimizer
    assert info["lr_given"] == ("--lr" in argv)
    for key, value in expected.items():
        assert info[key] == (pytest.approx(value) if isinstance(value, float) else value), key


@pytest.mark.parametrize("argv,message", [
    (["--momentum", "0.9"], "--momentum is a setting of SGD, but --optimizer auto chose adamw, "
                            "the original's for bert_tiny; add --optimizer sgd"),
    (["--optimizer", "adam", "--momentum", "0"], "--momentum is a setting of SGD, but the "
                                                 "optimizer is adam; add --optimizer sgd"),
])
def test_momentum_without_sgd_is_refused(argv, message):
    proc = train(*TINY_BERT, *argv, timeout=120)
    assert proc.returncode == 2, describe(proc)
    assert proc.stderr.strip().splitlines() == [f"ddlbench: error: {message}"]

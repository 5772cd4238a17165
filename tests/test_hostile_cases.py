"""Hostile input, third round (issue 47): an image too small for the model, a sweep name too long
for a folder, counts without a bound, infinite or negative numbers for the performance model,
duplicate YAML keys, a path flag named wrongly or holding an unknown placeholder. Each is one line
naming the flag or key and what is allowed, exit code 2, before anything starts.

Checked in this process (the commands' own ``main``, with spawning and workers replaced by an
exception), one case end to end in a subprocess."""
import os
import re
import subprocess
import sys
import time

import pytest

import benchmarks
import models
from ddlbench import train, yamlfile
from ddlbench.errors import ArgumentParser, UsageError, check_writable
from ddlbench.measure import profiler
from ddlbench.model import predict
from ddlbench.sweep import config

from .conftest import REPO, env
from .test_hostile import WouldRun, no_runs  # noqa: F401 (the fixture)

PROFILE = os.path.join(REPO, "configs", "profiles", "h200_resnet50_bs64.json")
TINY = ["--no-cuda", "--model", "bert_tiny", "--sentence-len", "16", "--batch-size", "4"]


def one_line(fn, argv, capfd) -> str:
    """The one line ``fn(argv)`` writes on stderr as it exits with code 2 (anything else
    fails the test)."""
    try:
        rc = fn(argv)
    except WouldRun:
        raise AssertionError(f"{argv}: accepted") from None
    except SystemExit as e:
        rc = e.code
    out, err = capfd.readouterr()
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert rc == 2 and len(lines) == 1 and "Traceback" not in err and not out, \
        f"{argv}: exit {rc}, stdout:\n{out}\nstderr:\n{err}"
    return lines[0]


def accepted(fn, argv, capfd) -> None:
    with pytest.raises(WouldRun):
        fn(argv)
    capfd.readouterr()


# ----------------------------------------------------------------- 1. an image too small

def test_an_image_too_small_is_one_line_before_any_worker_starts():
    """End to end: no traceback per rank, nothing spawned (the check is the launcher's)."""
    proc = subprocess.run([sys.executable, "-m", "ddlbench.train", "--no-cuda", "--model",
                           "inception_v3", "--image-size", "32", "--nworkers", "2"], cwd=REPO,
                          env=env(), capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and proc.stdout == "", proc.stdout
    assert proc.stderr == ("ddlbench: error: --image-size 32 is too small for inception_v3: the "
                           "smallest image it accepts is 75 px\n"), proc.stderr


@pytest.mark.parametrize("fn", [train.main, profiler.main], ids=["train", "profiler"])
def test_an_image_too_small_names_the_smallest_the_model_accepts(fn, capfd, no_runs):
    line = one_line(fn, ["--no-cuda", "--model", "squeezenet1_1", "--image-size", "1",
                         "--batch-size", "2"], capfd)
    assert line == ("ddlbench: error: --image-size 1 is too small for squeezenet1_1: the "
                    "smallest image it accepts is 17 px")
    # batch normalisation in training: a batch of one needs a larger image
    line = one_line(fn, ["--no-cuda", "--model", "resnet18", "--image-size", "32",
                         "--batch-size", "1"], capfd)
    assert line.startswith("ddlbench: error: --image-size 32 is too small for resnet18: the "
                           "smallest image it accepts is 33 px with --batch-size 1 (1 px with "
                           "a batch of 2 or more"), line
    for argv in (["--model", "inception_v3", "--image-size", "75", "--batch-size", "2"],
                 ["--model", "resnet18", "--image-size", "32", "--batch-size", "4"],
                 ["--model", "squeezenet1_1", "--image-size", "17", "--batch-size", "2"],
                 ["--model", "bert_tiny", "--sentence-len", "16", "--batch-size", "1"]):
        accepted(fn, ["--no-cuda", *argv], capfd)


def test_the_meta_forward_finds_what_the_model_accepts():
    assert models.smallest_image("squeezenet1_1") == 17
    assert models.smallest_image("squeezenet1_1", 1) == 17
    with pytest.raises(UsageError, match=r"^--image-size 299: vit_b_16 does not accept images "
                                         r"of 299 px \(Wrong image height"):
        models.check_input("vit_b_16", 299, 8)
    models.check_input("vit_b_16", 224, 8)
    models.check_input("regnet_x_400mf", 1, 2)  # from the table: RegNets do not build on meta
    with pytest.raises(UsageError, match="smallest image it accepts is 33 px with --batch-size 1"):
        models.check_input("regnet_y_400mf", 32, 1)


def test_the_table_of_smallest_images_is_the_meta_forwards():
    """Each entry of models.SMALLEST_IMAGE (known without torch) is the boundary the meta
    forward finds: that size is taken, one pixel less is refused."""
    assert set(models.SMALLEST_IMAGE) == set(models.SURVEY_CNNS)
    for name, sizes in models.SMALLEST_IMAGE.items():
        for batch, size in zip((1, 2), sizes):
            assert models._problem(name, size, batch) is None, (name, batch, size)
            assert size == 1 or models._problem(name, size - 1, batch) is not None, \
                (name, batch, size)


# ----------------------------------------------------------------- 2. a sweep name too long

SWEEP = ("timeout: 60\nnetworks: [local]\ntasks:\n  - {model: bert_tiny, batch_size: 4, "
         "sentence_len: 16}\nmethods: [wfbp]\nnworkers: [1]\n")


def _sweep(tmp_path, text: str):
    path = tmp_path / "s.yaml"
    path.write_text(text)
    return str(path)


def test_a_sweep_name_too_long_for_its_folder_is_refused_at_load(tmp_path, capfd):
    results, logs = tmp_path / "results", tmp_path / "logs"
    head = f"results: {results}\nlogs: {logs}\n"
    path = _sweep(tmp_path, f"name: {'a' * 250}\n{head}{SWEEP}")
    line = one_line(benchmarks.main, ["--config", path, "--quiet"], capfd)
    assert line.endswith(": 1 problem(s): name is 250 characters long; at most 229 (the results "
                         "folder <date>.<n>-<name>-predicted must fit a file name's 255 bytes)")
    assert not results.exists() and not logs.exists()
    # the longest name allowed makes folders that fit
    sweep = config.load(_sweep(tmp_path, f"name: {'a' * 229}\n{head}{SWEEP}"),
                        preflight=False)
    os.makedirs(results / f"2025-01-31.9999-{sweep.name}-predicted")


def test_a_label_too_long_for_the_cells_files_is_refused(tmp_path):
    text = SWEEP.replace("methods: [wfbp]", "methods: [{method: wfbp, label: " + "L" * 240 + "}]")
    with pytest.raises(UsageError, match=r"its files' names \(records/<cell>_try999_attempt999"
                                         r"\.trace\.json\) would be up to \d+ bytes, more than a "
                                         r"file name's 255: shorten"):
        config.load(_sweep(tmp_path, text), preflight=False)


def test_a_path_with_a_name_too_long_is_refused_before_any_work(tmp_path):
    with pytest.raises(UsageError, match=r"^results folder .*: the name b{37}\.\.\. is 300 bytes "
                                         r"long; a file name is at most 255$"):
        check_writable(str(tmp_path / ("b" * 300) / "x"), "results folder", folder=True)
    assert os.listdir(tmp_path) == []


# ----------------------------------------------------------------- 4. counts without a bound

def test_tries_and_the_sweeps_size_are_bounded(tmp_path, capfd):
    began = time.monotonic()
    path = _sweep(tmp_path, f"tries: 1000000000000\nresults: {tmp_path / 'r'}\n{SWEEP}")
    line = one_line(benchmarks.main, ["--config", path, "--dry-run"], capfd)
    assert line.endswith("1 problem(s): tries must be a positive integer, at most 1000, "
                         "got 1000000000000"), line
    # 800,000 runs: 80 tasks x 5 methods x 20 worker counts x 100 tries
    tasks = "".join(f"  - {{model: bert_tiny, batch_size: {b}, sentence_len: 16}}\n"
                    for b in range(1, 81))
    grid = (f"networks: [local]\ntasks:\n{tasks}methods: [wfbp, fusion, ddp, bspa2a, mgwfbp]\n"
            f"nworkers: [{', '.join(str(n) for n in range(1, 21))}]\n")
    path = _sweep(tmp_path, grid + "tries: 100\n")
    line = one_line(benchmarks.main, ["--config", path, "--dry-run"], capfd)
    assert line.endswith("1 problem(s): the sweep is 800000 runs (8000 cells x 100 tries); at "
                         "most 100000: fewer tries, or split it into several sweep files"), line
    with pytest.raises(UsageError, match=r"the grid is 16000 cells \(1 networks x 80 tasks x 5 "
                                         r"methods x 2 engines x 20 nworkers\); a sweep has at "
                                         r"most 10000 cells"):
        config.load(_sweep(tmp_path, grid + "engines: [torch, horovod]\n"), preflight=False)
    with pytest.raises(UsageError, match=r"adaptive max_tries must be an integer above tries "
                                         r"\(5\) and at most 1000, got 1001"):
        config.load(_sweep(tmp_path, SWEEP + "adaptive: {target: 0.03, max_tries: 1001}\n"),
                    preflight=False)
    # 1000 cells (skip leaves 10 of the 80 tasks) x 101 adaptive tries: refused, though the
    # tries alone would fit
    with pytest.raises(UsageError, match=r"the sweep is 101000 runs \(1000 cells x 101 adaptive "
                                         r"max_tries\); at most 100000"):
        config.load(_sweep(tmp_path, grid + "tries: 2\nskip: ['bs>10']\n"
                           "adaptive: {target: 0.03, max_tries: 101}\n"), preflight=False)
    assert time.monotonic() - began < 20
    config.load(_sweep(tmp_path, SWEEP + "tries: 1000\n"), preflight=False)  # at the bound



# ----------------------------------------------------------------- 5. smaller ones

@pytest.mark.parametrize("args,message", [
    (["--device-throughput", "inf"], "--device-throughput must be a finite number, got inf"),
    (["--device-throughput", "1e300"],
     "--device-throughput must be at most 1e+09 (samples/s of one worker), got 1e+300"),
    (["--alpha", "inf", "--beta", "1e-9"], "--alpha must be a finite number, got inf"),
    (["--threshold", "-inf"], "--threshold must be a finite number, got -inf"),
    (["--nworkers", "1000000000000"],
     "--nworkers takes worker counts up to 1048576, got 1000000000000"),
    (["--nworkers", "8,1048577"], "--nworkers takes worker counts up to 1048576, got 1048577"),
    (["--batch-size", str(10 ** 15)],
     "--batch-size must be at most 65536 (the training script's bound), got 1e+15"),
    (["--alpha", "1e-6", "--beta", "-1e-9"], "--beta must be >= 0, got -1e-09"),
    (["--alpha", "1e-6", "--beta=-1e-9"], "--beta must be >= 0, got -1e-09"),
])
def test_the_performance_model_refuses_what_no_run_can_be(args, message, capfd):
    line = one_line(predict.main, ["--profile", PROFILE, "--method", "ddp", *args], capfd)
    assert line == f"ddlbench: error: {message}"


def test_the_performance_model_takes_its_bounds():
    for args in (["--nworkers", "1,1048576"], ["--batch-size", "65536"],
                 ["--device-throughput", "1e9"], ["--alpha", "0", "--beta", "1e-9"]):
        predict.check(predict.parse_args(["--profile", PROFILE, "--method", "ddp", *args]))


def test_a_negative_number_reaches_a_numeric_flag():
    p = ArgumentParser(prog="x", raise_errors=True)
    p.add_argument("--beta", type=float)
    p.add_argument("--n", type=int)
    p.add_argument("--name")
    p.add_argument("rest", nargs="*")
    assert p.parse_args(["--beta", "-1e-9", "--n", "-3"]).beta == -1e-9
    assert p.parse_args(["--beta", "-.5E+2"]).beta == -50.0
    with pytest.raises(UsageError, match="argument --n: invalid int value: '-1e3'"):
        p.parse_args(["--n", "-1e3"])
    with pytest.raises(UsageError, match="argument --name: expected one argument"):
        p.parse_args(["--name", "-1e5"])  # a word flag: as argparse has it
    assert p.parse_args(["--", "--beta", "-1"]).rest == ["--beta", "-1"]


def test_a_duplicate_yaml_key_is_refused_naming_it_and_both_lines(tmp_path, capfd):
    path = _sweep(tmp_path, f"name: dup\nresults: {tmp_path / 'r'}\n{SWEEP}tries: 3\n"
                            f"tries: 5\n")
    line = one_line(benchmarks.main, ["--config", path, "--dry-run"], capfd)
    assert line == (f"benchmarks.py: error: sweep file {path}: key 'tries' is given twice, at "
                    f"lines 9 and 10 (YAML would keep the last silently); give it once")
    nested = tmp_path / "t.yaml"
    nested.write_text("a:\n  - {k: 1}\n  - {k: 2,\n     k: 3}\n")
    with pytest.raises(UsageError, match=r"key 'k' is given twice, at lines 3 and 4"):
        yamlfile.load(str(nested), "topology file")
    # not duplicates: keys of other types, keys of other mappings, keys beside a merge
    fine = tmp_path / "f.yaml"
    fine.write_text("base: &b {x: 1, y: 2}\none:\n  <<: *b\n  x: 3\ntwo: {1: a, '1': b}\n"
                    "three: {x: 1}\n")
    assert yamlfile.load(str(fine), "f")["one"] == {"x": 3, "y": 2}


def test_every_shipped_yaml_file_gives_each_key_once():
    for folder, _, files in os.walk(os.path.join(REPO, "configs")):
        for name in files:
            if name.endswith((".yaml", ".yml")):
                yamlfile.load(os.path.join(folder, name), "file")


def test_each_path_flag_is_named_and_takes_only_the_method_placeholder(tmp_path, capfd,
                                                                        no_runs):
    line = one_line(train.main, [*TINY, "--timeline", "/proc/x.json"], capfd)
    assert line.startswith("ddlbench: error: --timeline /proc/x.json cannot be written"), line
    line = one_line(train.main, [*TINY, "--verify", "1", "--save-params", "/proc/x.npz"], capfd)
    assert line.startswith("ddlbench: error: --save-params /proc/x.npz cannot be written"), line
    bogus = str(tmp_path / "newdir" / "{bogus}.json")
    line = one_line(train.main, [*TINY, "--output", bogus], capfd)
    assert line == (f"ddlbench: error: --output {bogus}: {{bogus}} is not a placeholder; the "
                    f"only one is {{method}} (each method's id)")
    line = one_line(train.main, [*TINY, "--timeline", str(tmp_path / "{x}{method}.json")], capfd)
    assert "{x} is not a placeholder" in line
    assert os.listdir(tmp_path) == []
    accepted(train.main, [*TINY, "--method", "wfbp,ddp", "--output",
                          str(tmp_path / "newdir" / "{method}.json")], capfd)
    assert os.listdir(tmp_path) == []


# ------------------------------------------------- issue 61: the input checks of the new surfaces

SQUEEZE = ["--model", "squeezenet1_1", "--image-size", "32", "--batch-size", "2", "--methods",
           "wfbp", "--rounds", "1", "--batches", "1", "--warmup", "0"]


@pytest.fixture
def no_overhead_runs(monkeypatch, no_runs):  # noqa: F811 (the fixture)
    """The overhead command, too, stopped where its worker would start."""
    from ddlbench import overhead

    def refuse(*_a, **_k):
        raise WouldRun()
    monkeypatch.setattr(overhead, "worker", refuse)
    return overhead


@pytest.mark.parametrize("extra,message", [
    (["--image-size", "1"], "--image-size 1 is too small for squeezenet1_1: the smallest image "
                            "it accepts is 17 px"),
    (["--image-size", "100000"], "--image-size must be at most 8192, got 100000"),
    (["--warmup", "-5"], "--warmup must be a finite number >= 0, got -5"),
    (["--momentum", "nan"], "--momentum must be a finite number >= 0, got nan"),
    (["--batches", "1000000000000"], "--batches must be at most 1048576, got 1000000000000"),
    (["--rounds", "0"], "--rounds must be positive, got 0"),
    (["--threads", "0"], "--threads must be positive, got 0"),
    (["--vocab-size", "1000"], "--vocab-size applies to the BERT models, not squeezenet1_1"),
])
def test_the_overhead_command_takes_the_training_scripts_checks(extra, message, capfd,
                                                                 no_overhead_runs):
    """Defect 1: one checker (``measure.workload.check_workload``) for the three commands."""
    line = one_line(no_overhead_runs.main, [*SQUEEZE, *extra], capfd)
    assert line == f"ddlbench: error: {message}"


def test_the_overhead_command_refuses_an_empty_method_list(capfd, no_overhead_runs):
    for methods in ("", ",", " , "):
        line = one_line(no_overhead_runs.main, [*SQUEEZE, "--methods", methods], capfd)
        assert line.startswith(f"ddlbench: error: --methods {methods!r} names no method; give "
                               f"one or more, comma-separated (wfbp, "), line
    accepted(no_overhead_runs.main, [*SQUEEZE, "--methods", " wfbp, ddp"], capfd)
    accepted(no_overhead_runs.main, [*SQUEEZE, "--batches", "1048576"], capfd)  # at the bound


def test_the_three_commands_share_one_workload_checker(monkeypatch, no_overhead_runs):
    from ddlbench.measure import workload
    called = []

    def spy(args, positive=(), nonneg=()):
        called.append(args.model)
        raise UsageError("stop")
    monkeypatch.setattr(workload, "check_workload", spy)
    for check, parse, argv in (
            (train.check, train.parse_args, ["--model", "a"]),
            (profiler.check, profiler.parse_args, ["--model", "b"]),
            (no_overhead_runs.check, no_overhead_runs.parse_args, ["--model", "c"])):
        with pytest.raises(UsageError, match="^stop$"):
            check(parse(argv))
    assert called == ["a", "b", "c"]


def test_trace_params_and_collective_files_make_their_folders(tmp_path):
    """Defect 2: --timeline into a folder that does not exist yet is made, as --output's
    (the check lets the path through: ``check_writable``)."""
    from ddlbench import timeline, verify
    path = tmp_path / "nodir" / "deeper" / "x.json"
    check_writable(str(path), "--timeline")
    timeline.write(str(path), {"traceEvents": []})
    assert timeline.load(str(path)) == {"traceEvents": []}
    import torch
    verify._save_params(str(tmp_path / "p" / "x.npz"), [("w", torch.ones(2))])
    assert os.listdir(tmp_path / "p") == ["x.npz"]
    from ddlbench.session import Run

    class Comm:
        trace, rank = [["all_reduce", 4]], 0
    Run.write_trace(type("R", (), {"comm": Comm})(), str(tmp_path / "c" / "t"), "wfbp")
    assert os.listdir(tmp_path / "c") == ["t.wfbp.0.json"]


DEEP = "[" * 200000 + "]" * 200000


def test_deeply_nested_json_is_one_line_in_every_reader(tmp_path, capfd, no_runs):
    """Defect 6: the profile readers (predict --profile, --mgwfbp-profile: before any worker
    starts) give one line; a results.jsonl line is skipped with a warning, the others kept."""
    deep = tmp_path / "deep.json"
    deep.write_text(DEEP)
    line = one_line(predict.main, ["--profile", str(deep), "--method", "wfbp"], capfd)
    assert line == f"ddlbench: error: MG-WFBP profile {deep} is not valid JSON: nested too " \
                   f"deeply to read"
    line = one_line(train.main, [*TINY, "--method", "mgwfbp", "--mgwfbp-profile", str(deep)],
                    capfd)
    assert line.endswith("is not valid JSON: nested too deeply to read"), line
    from ddlbench.errors import read_json
    with pytest.raises(UsageError, match="^comm_bench file x is not valid JSON: nested too "):
        read_json(str(deep), "comm_bench file x")
    folder = _store(tmp_path, [_TRY, DEEP, dict(_TRY, **{"try": 1, "throughput": 7.0})])
    from ddlbench.sweep import store
    entries, bad = store.read(store.store_path(folder))
    assert [e["throughput"] for e in entries] == [5.0, 7.0] and bad == 1
    assert benchmarks.main(["report", folder, "--quiet", "--no-plots"]) == 0
    err = capfd.readouterr().err
    assert err == f"benchmarks.py: 1 unreadable line(s) in {folder}/results.jsonl skipped\n"
    assert "6.0" in open(os.path.join(folder, "README.md")).read()  # both tries' median


_TRY = {"kind": "try", "hash": "h", "try": 0, "status": "ok", "throughput": 5.0,
        "unit": "img/sec", "config": {"network": {"name": "local", "kind": "net",
                                                  "profile": "loopback"},
                                      "task": {"model": "resnet18", "batch_size": 2},
                                      "method": {"method": "wfbp"}, "nworkers": 1}}


def _store(tmp_path, lines) -> str:
    import json
    folder = tmp_path / "results"
    folder.mkdir()
    (folder / "results.jsonl").write_text("".join(
        (x if isinstance(x, str) else json.dumps(x)) + "\n" for x in lines))
    return str(folder)


def test_a_nan_throughput_in_the_store_is_skipped_not_a_crash(tmp_path, capfd):
    """Defect 7: NaN and Infinity (which Python's JSON reader takes) are unreadable lines; a
    record's per-round NaN leaves that cell's interval to its tries."""
    folder = _store(tmp_path, [_TRY, dict(_TRY, **{"try": 1, "throughput": float("nan")}),
                               dict(_TRY, **{"try": 2, "throughput": float("inf")}),
                               dict(_TRY, **{"try": 3, "throughput": 7.0, "record": {
                                   "result": {"total_throughput": [7.0, float("nan")]}}})])
    assert benchmarks.main(["report", folder, "--quiet", "--no-plots"]) == 0
    err = capfd.readouterr().err
    assert err == f"benchmarks.py: 2 unreadable line(s) in {folder}/results.jsonl skipped\n"
    from ddlbench.sweep import aggregate
    (row,) = aggregate.load(folder).rows
    assert sorted(row.cells[1].values) == [5.0, 7.0]


def _profile(tmp_path, **changes) -> str:
    import json
    with open(PROFILE) as f:
        prof = json.load(f)
    prof.update(changes)
    path = tmp_path / "p.json"
    path.write_text(json.dumps(prof))
    return str(path)


R50 = ["--no-cuda", "--model", "resnet50", "--batch-size", "2", "--image-size", "64",
       "--method", "mgwfbp"]


@pytest.mark.parametrize("changes", [{"alpha_s": float("nan")}, {"beta_s_per_byte": float("inf")},
                                     {"forward_s": 1e308}, {"backward_s": [1e308] * 161}],
                         ids=["alpha nan", "beta inf", "forward 1e308", "backward 1e308"])
def test_a_profile_with_figures_no_run_has_is_refused_by_both_readers(changes, tmp_path, capfd,
                                                                      no_runs):
    """Defect 10: the same checker (``read_profile``) for predict and --mgwfbp-profile."""
    path = _profile(tmp_path, **changes)
    message = (f"ddlbench: error: MG-WFBP profile {path}: times, alpha and beta must be finite "
               f"numbers >= 0 (a time at most 86400 s, beta at most 1 s/B)")
    assert one_line(predict.main, ["--profile", path, "--method", "wfbp"], capfd) == message
    assert one_line(train.main, [*R50, "--mgwfbp-profile", path], capfd) == message


def test_a_missing_or_foreign_mgwfbp_profile_is_found_at_the_argument_check(tmp_path, capfd,
                                                                            no_runs):
    began = time.monotonic()
    missing = str(tmp_path / "missing.json")
    line = one_line(train.main, [*R50, "--mgwfbp-profile", missing], capfd)
    assert line == f"ddlbench: error: cannot read MG-WFBP profile {missing}: No such file or " \
                   f"directory"
    line = one_line(train.main, [*TINY, "--method", "mgwfbp", "--mgwfbp-profile", PROFILE], capfd)
    assert line.startswith(f"ddlbench: error: MG-WFBP profile {PROFILE} is for model resnet50, "
                           f"but this run trains bert_tiny"), line
    assert time.monotonic() - began < 20
    accepted(train.main, [*R50, "--mgwfbp-profile", PROFILE], capfd)
    # a verification of other methods ignores the flag (a note), and does not read the file
    accepted(train.main, [*TINY, "--method", "wfbp", "--verify", "1", "--mgwfbp-profile",
                          missing], capfd)


@pytest.mark.parametrize("profile,message", [
    ("/nonexistent.json", "cannot read MG-WFBP profile /nonexistent.json: No such file or "
                          "directory"),
    (PROFILE, f"MG-WFBP profile {PROFILE} is for model resnet50, but this run trains "
              f"bert_tiny"),
    ("configs/profiles/h200_bert_bs8.json", "MG-WFBP profile configs/profiles/h200_bert_bs8.json "
                                            "is for model bert, but this run trains bert_tiny"),
])
def test_a_sweeps_mgwfbp_profile_is_checked_before_any_try(profile, message, tmp_path, capfd,
                                                           no_runs, monkeypatch):
    """Defect 11: the preflight reads it (a relative path from the repository, where the runs
    start), before any try."""
    monkeypatch.chdir(tmp_path)
    text = SWEEP.replace("methods: [wfbp]", "methods: [{method: mgwfbp, mgwfbp_profile: "
                                            f"{profile}}}]")
    path = _sweep(tmp_path, f"results: {tmp_path / 'r'}\n{text}")
    line = one_line(benchmarks.main, ["--config", path, "--dry-run"], capfd)
    assert re.search(r": 1 problem\(s\): the training script refuses cell local_bert_tiny\S+"
                     r"_mgwfbp\S+_n1: " + re.escape(message), line), line
    assert not (tmp_path / "r").exists()


def _synthetic_trace(ranks: int) -> dict:
    """``ranks`` processes, each named, with one named row and two spans."""
    events = []
    for r in range(ranks):
        events += [{"ph": "M", "name": "process_name", "pid": r, "args": {"name": f"rank {r}"}},
                   {"ph": "M", "name": "thread_name", "pid": r, "tid": 0,
                    "args": {"name": "training"}},
                   {"ph": "X", "name": "it", "cat": "iteration", "pid": r, "tid": 0,
                    "ts": 0.0, "dur": 10.0},
                   {"ph": "X", "name": "ar", "cat": "comm", "pid": r, "tid": 0, "ts": 1.0,
                    "dur": 5.0}]
    return {"traceEvents": events}


def test_the_timeline_tool_is_linear_in_the_ranks():
    """Defect 19: 30,000 ranks read and compared rank by rank in seconds (each rank's rows
    were found by a pass over every rank's, and compare looked each rank up in a list: 9e8
    steps, minutes)."""
    from ddlbench import timeline
    from ddlbench.timeline import cli
    trace = _synthetic_trace(30000)
    began = time.monotonic()
    ranks = timeline.read(trace)
    assert len(ranks) == 30000 and ranks[-1]["rank"] == 29999
    assert {e[2] for e in ranks[7]["events"]} == {"training"}
    summary = cli.summarize(trace, top=1, what="t")
    both = cli.compare(summary, summary, per_rank=True)
    assert len(both["per_rank"]) == 30000
    assert time.monotonic() - began < 30


def test_the_timeline_tool_refuses_a_device(tmp_path):
    """Defect 20: /dev/zero is refused unread (it read without bound: a MemoryError)."""
    proc = subprocess.run([sys.executable, "-m", "ddlbench.timeline", "/dev/zero"], cwd=REPO,
                          env=env(), capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr == ("ddlbench.timeline: error: /dev/zero is not a regular file (a "
                           "device, pipe or socket); give a trace file\n"), proc.stderr
    from ddlbench.errors import read_json
    with pytest.raises(UsageError, match="^cannot read x: not a regular file"):
        read_json("/dev/zero", "x")


@pytest.mark.parametrize("args,message", [
    (["--device-throughput", "1e-300"],
     "--device-throughput must be at least 0.001 (a sample in 1000 s), got 1e-300"),
    (["--advise", "--alpha", "1e-5", "--beta", "1e300"],
     "--beta must be at most 1 (seconds per byte), got 1e+300"),
    (["--alpha", "1e300", "--beta", "1e-9"],
     "--alpha must be at most 10 (seconds a message's start costs), got 1e+300"),
    (["--optimizer-ms", "1e300"], "--optimizer-ms must be at most 8.64e+07 (a day), got 1e+300"),
])
def test_the_performance_model_prints_no_inf_or_nan(args, message, capfd):
    """Defect 21: out of range is one line; at the bounds every figure is finite."""
    line = one_line(predict.main, ["--profile", PROFILE, "--method", "ddp", *args], capfd)
    assert line == f"ddlbench: error: {message}"


def test_the_performance_model_at_its_bounds_prints_finite_figures(capfd):
    assert predict.main(["--profile", PROFILE, "--method", "wfbp,ddp,mgwfbp", "--advise",
                         "--alpha", "10", "--beta", "1", "--device-throughput", "1e-3",
                         "--optimizer-ms", "86400000", "--nworkers", "1,64"]) == 0
    out = capfd.readouterr().out
    assert "ms of communication" in out
    assert not re.search(r"\b(inf|nan)\b", out, re.I), out


def test_an_echoed_value_is_bounded(tmp_path, capfd, no_runs):
    """Defect 22: a 20,000-character value is echoed as its head and tail (one place:
    ``UsageError``, and the parser's own line)."""
    value = "x" * 20000
    line = one_line(train.main, ["--method", value], capfd)
    assert line.startswith("ddlbench: error: unknown method 'xxx") and len(line) < 700, line
    assert "x...[19783 characters]...x" in line and line.endswith("zero, hsdp"), line
    line = one_line(predict.main, ["--profile", value], capfd)
    assert len(line) < 700, line
    big = " ".join(["word"] * 3000)  # 14,999 characters with spaces: the line is cut instead
    assert len(str(UsageError(big))) < 4100


@pytest.mark.parametrize("name", ["LD_PRELOAD", "LD_AUDIT"])
def test_a_sweep_may_not_set_the_loaders_variables(name, tmp_path, capfd):
    path = _sweep(tmp_path, f"results: {tmp_path / 'r'}\n{SWEEP}env: {{{name}: /tmp/x.so, "
                            f"LD_LIBRARY_PATH: /opt/lib}}\n")
    line = one_line(benchmarks.main, ["--config", path, "--dry-run"], capfd)
    assert line.endswith(f": 1 problem(s): env: {name} is refused: it loads code of its own "
                         f"into every process of every run (set it in the shell that starts "
                         f"the sweep, if it is meant)"), line
    path = _sweep(tmp_path, f"results: {tmp_path / 'r'}\n{SWEEP}env: {{LD_LIBRARY_PATH: /x}}\n")
    assert config.load(path, preflight=False).env == {"LD_LIBRARY_PATH": "/x"}

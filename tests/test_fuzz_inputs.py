"""Fuzzing the surfaces issue 61 found defects on (classes 1, 6 and 10): the overhead command's
flags, checked against the training script's (one checker: what one refuses of the flags they
share, the other refuses too), the performance model's commands (``validation``, ``dlperf``)
and every reader of a user's JSON (profiles, comm_bench files, the results store, the
committed predictions) fed hostile documents: deep nesting, NaN, Infinity, 1e308, wrong types.

Every case is accepted or one line on stderr with exit code 2, never a traceback; an accepted
prediction prints no inf or nan; the argument check of ``--mgwfbp-profile`` refuses exactly the
profiles its reader refuses. Seeded (``DDLBENCH_FUZZ_SEED``), ``DDLBENCH_FUZZ`` cases per test
(default 60); spawning and workers are replaced by an exception (tests/test_hostile.py)."""
import json
import os
import random
import re

import pytest

from ddlbench import overhead, train
from ddlbench.errors import UsageError, read_json
from ddlbench.measure import profile_file
from ddlbench.model import dlperf, predict, topology, validation
from ddlbench.sweep import calibrate, store

from .conftest import REPO
from .test_hostile import NASTY, WouldRun, no_runs, outcome, parser_of  # noqa: F401

CASES = int(os.environ.get("DDLBENCH_FUZZ", "60"))
SEED = int(os.environ.get("DDLBENCH_FUZZ_SEED", "61"))
PROFILE = os.path.join(REPO, "configs", "profiles", "h200_resnet50_bs64.json")


@pytest.fixture
def stopped(monkeypatch, no_runs):  # noqa: F811 (the fixture)
    """The overhead command stopped where its worker would start, and the performance model's
    long computations (a survey of minutes) where they would start."""
    def refuse(*_a, **_k):
        raise WouldRun()
    monkeypatch.setattr(overhead, "worker", refuse)
    monkeypatch.setattr(validation, "survey_result", refuse)
    monkeypatch.setattr(dlperf, "compare", refuse)
    monkeypatch.setattr(dlperf, "predict_all", refuse)


# -- class 1: the overhead command's flags against the training script's --------------------

# overhead flag -> the training script's flag of the same setting (the workload, the timing,
# the job, SGD's momentum)
SHARED = {"--model": "--model", "--batch-size": "--batch-size", "--image-size": "--image-size",
          "--sentence-len": "--sentence-len", "--vocab-size": "--vocab-size",
          "--warmup": "--num-warmup-batches", "--batches": "--num-batches-per-iter",
          "--rounds": "--num-iters", "--nworkers": "--nworkers", "--threads": "--threads",
          "--momentum": "--momentum"}
VALUES = {"--model": ["resnet18", "bert_tiny", "squeezenet1_1", "inception_v3", "nosuch", "",
                      "os:system"],
          "--batch-size": ["1", "2", "4", "0", "-1", "65536", "65537", "1000000000000"],
          "--image-size": ["1", "16", "32", "33", "64", "8192", "8193", "100000", "0", "-3"],
          "--sentence-len": ["1", "16", "16384", "16385", "0"],
          "--vocab-size": ["1", "1000", "0", "-5", "1048576", "1048577", "10000000000"],
          "--warmup": ["0", "1", "-5", "1048576", "1048577"],
          "--batches": ["1", "0", "-1", "1048576", "1048577", "1000000000000"],
          "--rounds": ["1", "2", "0", "-2", "1048577"],
          "--nworkers": ["1", "2", "0", "-1", "100000"],
          "--threads": ["1", "0", "-1", "4096", "4097"],
          "--momentum": ["0", "0.9", "-1", "1e308", "nan", "inf", "-inf"]}


def _shared_argv(rng) -> dict:
    """A few of the shared flags with plausible or hostile values (a model always)."""
    flags = {"--model": rng.choice(VALUES["--model"][:4] if rng.random() < 0.8
                                   else VALUES["--model"])}
    for flag in rng.sample(sorted(set(SHARED) - {"--model"}), rng.randint(1, 3)):
        flags[flag] = rng.choice(VALUES[flag] + NASTY[:6] if rng.random() < 0.3
                                 else VALUES[flag])
    return flags


def _flat(flags: dict, names=None) -> list[str]:
    return [a for k, v in flags.items() for a in ((names or {}).get(k, k), v)]


def test_the_overhead_command_refuses_what_the_training_script_refuses(capfd, stopped):
    """The flags the two commands share decide alike: a run of one is a run of the other, a
    refusal a refusal (both with SGD, whose momentum it is; fewer than 6 threads' worth of
    workers so that a local job fits; one method)."""
    rng = random.Random(f"{SEED}-overhead-shared")
    seen = []
    for _ in range(CASES):
        flags = _shared_argv(rng)
        common = ["--optimizer", "sgd"]
        ours = ["--methods", "wfbp", *common, *_flat(flags)]
        theirs = ["--no-cuda", "--method", "wfbp", *common, *_flat(flags, SHARED)]
        got = outcome(overhead.main, ours, capfd)
        want = outcome(train.main, theirs, capfd)
        assert got == want, f"overhead {ours}: {got}; training script {theirs}: {want}"
        seen.append(got)
    assert "line" in seen and "run" in seen  # the generator reaches both sides


def test_the_overhead_commands_own_flags_are_a_run_or_one_line(tmp_path, capfd, stopped):
    rng = random.Random(f"{SEED}-overhead-own")
    own = {"--methods": ["wfbp", "", ",", "wfbp,nosuch", "ddp, fusion", "all", "bspps",
                         "os:system", "x" * 5000],
           "--json": [str(tmp_path / "o.json"), str(tmp_path / "n" / "o.json"), "/proc/x.json",
                      str(tmp_path), ""],
           "--optimizer": ["sgd", "adam", "auto", "bogus"],
           "--bucket-cap-mb": ["25", "0", "-1", "nan", "inf"],
           "--threshold": ["0", "1048576", "-1", "nan"]}
    seen = []
    for _ in range(CASES):
        argv = ["--model", "resnet18", "--image-size", "33", "--batch-size", "2"]
        for flag in rng.sample(sorted(own), rng.randint(1, 3)):
            argv += [flag, rng.choice(own[flag] + NASTY)]
        seen.append(outcome(overhead.main, argv, capfd))
    assert "line" in seen and "run" in seen
    assert sorted(os.listdir(tmp_path)) in ([], ["n"])  # nothing written but a checked folder


# -- the performance model's commands ---------------------------------------------------------

def test_validation_and_dlperf_flags_are_a_run_or_one_line(tmp_path, capfd, stopped):
    rng = random.Random(f"{SEED}-model-commands")
    paths = [str(tmp_path / "o.json"), str(tmp_path / "d" / "o.md"), "/proc/x", str(tmp_path),
             "x" * 300, ""]
    seen = []
    for _ in range(CASES):
        if rng.random() < 0.5:
            argv = [rng.choice(["survey", "survey", "bogus", ""])]
            for flag, pool in (("--network-source", ["topology", "original", "x", ""]),
                               ("--output", paths + NASTY), ("--markdown", paths + NASTY)):
                if rng.random() < 0.4:
                    argv += [flag, rng.choice(pool)]
            if rng.random() < 0.3:
                argv.append("--no-constants")
            fn = validation.main
        else:
            argv = [f for f in ("--write", "--check", "--compare") if rng.random() < 0.35]
            for flag in ("--output", "--markdown"):
                if rng.random() < 0.3:
                    argv += [flag, rng.choice(paths + NASTY)]
            if "--write" in argv:
                continue  # it would rewrite the committed predictions (after the check)
            fn = dlperf.main
        try:
            seen.append(outcome(fn, argv, capfd))
        except Exception as e:
            raise AssertionError(f"{fn.__module__} {argv}: {type(e).__name__}: {e}") from e
    assert "line" in seen and "run" in seen


# -- classes 6 and 10: every reader of a user's JSON ------------------------------------------

HOSTILE_NUMBERS = [float("nan"), float("inf"), -float("inf"), 1e308, -1, -1e-300, 0, 1e-320,
                   10 ** 400, True, "1", None, [], {}]


def _deep(rng) -> str:
    depth = rng.choice([50, 5000, 200000])
    opener, closer = rng.choice([("[", "]"), ('{"a":', "}")])
    return opener * depth + ("1" if opener != "[" else "") + closer * depth


def _hostile_profile(rng, valid: dict) -> str:
    """A profile file's text: the valid one with a few figures or fields made hostile, text
    that is not a profile, or nesting deeper than a decoder goes."""
    kind = rng.randrange(10)
    if kind == 0:
        return _deep(rng)
    if kind == 1:
        return rng.choice(["", "{", "null", "[]", "{}", "NaN", "1e999", '"x"', "\x00\xff"])
    doc = json.loads(json.dumps(valid))
    for _ in range(rng.randint(1, 3)):
        key = rng.choice(["alpha_s", "beta_s_per_byte", "forward_s", "backward_s", "tensors",
                          "model", "format", "workload", "nworkers", "comm_fit",
                          "forward_tensor_s", "rank_compute_s", "launch", "optimizer_s",
                          "host", "interference"])
        if key == "backward_s" and rng.random() < 0.7 and isinstance(doc.get(key), list):
            times = doc["backward_s"]
            times[rng.randrange(len(times))] = rng.choice(HOSTILE_NUMBERS)
        elif key == "tensors" and rng.random() < 0.7 and isinstance(doc.get(key), list):
            t = rng.choice(doc["tensors"])
            t[rng.choice(["name", "shape", "bytes"])] = rng.choice(HOSTILE_NUMBERS + ["x"])
        elif key == "model":
            doc[key] = rng.choice(["resnet50", "resnet18", "", 7])
        elif key in ("host", "interference") and rng.random() < 0.7:
            field = {"host": ["copy_s_per_byte", "divide_s_per_byte", "issue_s"],
                     "interference": ["compute_slowdown", "comm_slowdown"]}[key]
            doc[key] = {rng.choice(field): rng.choice(HOSTILE_NUMBERS)}
        elif rng.random() < 0.15:
            doc.pop(key, None)
        else:
            doc[key] = rng.choice(HOSTILE_NUMBERS)
    return json.dumps(doc, allow_nan=True)


def _accepted_prints_finite(fn, argv, capfd) -> str:
    """``outcome``, and an accepted prediction's output holds no inf or nan."""
    try:
        rc = fn(argv)
    except WouldRun:
        capfd.readouterr()
        return "run"
    except SystemExit as e:
        rc = e.code
    out, err = capfd.readouterr()
    if rc == 0:
        assert not re.search(r"\b(inf|nan)\b", out, re.I), f"{argv} printed:\n{out}"
        return "run"
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert rc == 2 and len(lines) == 1 and "Traceback" not in err, \
        f"{argv}: exit {rc}, stderr:\n{err}"
    return "line"


def test_hostile_profiles_are_a_finite_prediction_or_one_line(tmp_path, capfd, stopped):
    """predict --profile and the training script's --mgwfbp-profile (at its argument check,
    before any worker) over the same files: one line, or a prediction of finite figures; the
    training script refuses exactly what the profile reader refuses."""
    with open(PROFILE) as f:
        valid = json.load(f)
    rng = random.Random(f"{SEED}-profiles")
    seen = []
    for k in range(CASES):
        path = str(tmp_path / f"p{k}.json")
        with open(path, "w", encoding="utf-8", errors="surrogateescape") as f:
            f.write(_hostile_profile(rng, valid))
        method = rng.choice(["wfbp", "ddp", "mgwfbp", "all"])
        seen.append(_accepted_prints_finite(
            predict.main, ["--profile", path, "--method", method, "--model", "resnet50"],
            capfd))
        try:  # the reader's verdict, and the model the run trains
            readable = "run" if profile_file.read_profile(path)["model"] == "resnet50" \
                else "line"
        except UsageError:
            readable = "line"
        got = outcome(train.main, ["--no-cuda", "--model", "resnet50", "--batch-size", "2",
                                   "--image-size", "64", "--method", "mgwfbp",
                                   "--mgwfbp-profile", path], capfd)
        assert got == readable, f"--mgwfbp-profile {path}: {got}, its reader: {readable}"
    assert "line" in seen and "run" in seen


def test_hostile_json_files_are_a_value_or_one_usage_error(tmp_path):
    """The shared reader (``errors.read_json``) and those built on it: a value or one
    UsageError naming the file, never a RecursionError, MemoryError or ValueError."""
    rng = random.Random(f"{SEED}-json")
    readers = [lambda p: read_json(p, f"file {p}"), dlperf.written, calibrate.link_s,
               topology.load, profile_file.read_profile]
    texts = ["", "{", "[1,", "NaN", "1e999", '{"results": NaN}', '{"results": [{"op": '
             '"allreduce", "rows": [{"size_bytes": 1e999, "time_s": NaN}]}]}', "\x00",
             '{"kind": "comm_bench", "results": [{"op": "allreduce", "rows": NaN}]}']
    paths = ["/dev/zero", str(tmp_path / "missing.json"), str(tmp_path)]
    for k in range(CASES):
        path = str(tmp_path / f"j{k}.json")
        text = _deep(rng) if rng.random() < 0.4 else rng.choice(texts)
        with open(path, "w") as f:
            f.write(text)
        for read in readers:
            for target in [path] + ([rng.choice(paths)] if k < 10 else []):
                try:
                    read(target)
                except UsageError as e:
                    assert "\n" not in str(e) and len(str(e)) < 4100
                except Exception as e:
                    raise AssertionError(f"{read} {target} {text[:40]!r}: "
                                         f"{type(e).__name__}: {e}") from e


def test_a_store_with_hostile_lines_keeps_every_good_one(tmp_path):
    """results.jsonl with deep, NaN, Infinity and ill-typed lines between good tries: every
    good try read, every other line counted unreadable, nothing raised."""
    rng = random.Random(f"{SEED}-store")
    good = {"kind": "try", "hash": "h", "try": 0, "status": "ok", "throughput": 5.0,
            "config": {"network": {"name": "local", "kind": "net", "profile": "loopback"},
                       "task": {"model": "m", "batch_size": 2}, "method": {"method": "wfbp"},
                       "nworkers": 1}}
    for k in range(max(1, CASES // 10)):
        lines, goods, bads = [], 0, 0
        for i in range(rng.randint(5, 30)):
            if rng.random() < 0.5:
                lines.append(json.dumps(dict(good, **{"try": i})))
                goods += 1
            else:
                # (a shallow object of no known kind is a later writer's line: ignored, not
                # counted; one too deep to read is counted)
                bad = rng.choice(["[" * 50 + "]" * 50, '{"a":' * 200000 + "1" + "}" * 200000,
                                  "[" * 200000 + "]" * 200000, "NaN", "[1, 2]", '"x"', "{",
                                  json.dumps(dict(good, throughput=rng.choice(
                                      [float("nan"), float("inf"), -1.0, "fast", True])))])
                lines.append(bad)
                bads += 1
        path = tmp_path / f"s{k}.jsonl"
        path.write_text("\n".join(lines) + "\n")
        entries, unreadable = store.read(str(path))
        assert len(entries) == goods and unreadable == bads

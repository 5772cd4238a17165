"""The keys of a sweep file are declared once (ddlbench/sweep/config.py, class Sweep): the
package docstring lists them as declared, a key left out takes its declared default, and a
wrong value of any key checked by its kind is one problem naming the key in the declared
phrase. No subprocesses; each file is loaded without the preflight."""
import os
import re

import pytest
import yaml

from ddlbench import sweep
from ddlbench.errors import UsageError
from ddlbench.sweep import config

HEAD = "tasks: [{model: resnet18, batch_size: 4}]\nmethods: [wfbp]\n"
REQUIRED = {"tasks", "methods"}


def _load(tmp_path, text: str = ""):
    path = tmp_path / "s.yaml"
    path.write_text(HEAD + text)
    return config.load(str(path), preflight=False, runs=False)


def _problem(tmp_path, text: str) -> str:
    """The one problem of a sweep file with ``text`` (the file's path and count removed)."""
    with pytest.raises(UsageError) as e:
        _load(tmp_path, text)
    msg = str(e.value)
    assert "\n" not in msg and (" problem(s): " not in msg or " 1 problem(s): " in msg), msg
    return msg.split(": ", 1)[1].removeprefix("1 problem(s): ")


def test_the_docstring_lists_the_declared_keys():
    block = sweep.__doc__.split("::\n\n", 1)[1].split("\n\n", 1)[0]
    assert block == config.describe(), \
        "ddlbench/sweep/__init__.py: put config.describe()'s text in the docstring's key list"
    assert re.findall(r"^    (\w+):", block, re.M) == [k.name for k in config.keys()]


# A key's attribute when the file leaves the key out, where it is not the declared default.
WORKED_OUT = {"name": "s",
              "networks": [config.Network("local", "net", "loopback", "local")],
              "results": os.path.join(config.REPO, "results"),
              "logs": os.path.join(config.REPO, "logs"), "timeline": 0,
              "calibration_check": 0.0}


def test_each_key_left_out_takes_its_default(tmp_path):
    loaded = _load(tmp_path)
    names = {k.name for k in config.keys()}
    assert set(WORKED_OUT) <= names and REQUIRED <= names
    for k in config.keys():
        if k.name not in REQUIRED:
            expected = WORKED_OUT.get(k.name, k.spec.default)
            assert getattr(loaded, k.attr) == expected, k.name
    bare = tmp_path / "bare.yaml"
    bare.write_text("nworkers: [1]\n")
    with pytest.raises(UsageError, match=r": 3 problem\(s\): tasks is required; methods is "
                                          r"required; no method left to run$"):
        config.load(str(bare), preflight=False, runs=False)
    assert _load(tmp_path, "calibrate: true").calibration_check == config.CHECK_TOLERANCE
    # what the results store records of a sweep (its first line)
    assert set(loaded.header()) == {
        "name", "file", "networks", "tasks", "methods", "engines", "nworkers", "tries",
        "min_ok", "aggregate", "timing", "timeout", "extra_args", "env", "timeline",
        "calibrate", "extrapolate", "pace", "calibration_check", "seed", "shared_jobs",
        "adaptive"}
    assert loaded.header()["min_ok"] == 3


# Wrong values (YAML text) of every key checked by its kind.
BAD = {
    "name": ["a b", "-x"],
    "extends": ["[base]", "nowhere"],
    "tries": ["0", "-1", "1.5", "'5'", "true", "null"],
    "min_ok": ["0", "x", "true"],
    "aggregate": ["max", "1", "null"],
    "threads": ["0", "two", "true"],
    "timeout": ["0", "-1", ".nan", "x", "null"],
    "kill_grace": ["-1", ".nan", "x"],
    "hostfile": ["3", "null", "[a]"],
    "extra_args": ["3", "[--lr]", "true"],
    "results": ["3", "null"],
    "logs": ["3", "{a: 1}"],
    "estimate_s": ["0", "x"],
    "timeline": ["0", "-1", "'yes'", "1.5"],
    "calibrate": ["1", "'true'", "null"],
    "extrapolate": ["1", "'yes'"],
    "pace": ["1", "'yes'"],
    "calibration_check": ["-0.1", "true", "'x'", ".inf"],
    "seed": ["-1", "1.5", "'x'"],
    "shared_jobs": ["1", "'x'"],
}
# A right value that a key declared before refuses.
AGAINST = {"min_ok": ("min_ok: 6", "min_ok must be an integer from 1 to tries (5), got 6"),
           "extrapolate": ("extrapolate: true", "extrapolate: true needs calibrate: true"),
           "pace": ("pace: true", "pace: true needs calibrate: true"),
           "calibration_check": ("calibration_check: 0.2",
                                 "calibration_check needs calibrate: true")}


def test_every_kind_checked_key_has_bad_values_here():
    assert set(BAD) == {k.name for k in config.keys() if k.spec.kind is not None}


@pytest.mark.parametrize("name,text", [(k, v) for k, vs in BAD.items() for v in vs])
def test_a_bad_value_is_one_problem_naming_the_key(tmp_path, name, text):
    problem = _problem(tmp_path, f"{name}: {text}\n")
    assert re.match(rf"{name}[ :]", problem), problem
    [k] = [k for k in config.keys() if k.name == name]
    if k.spec.kind is not config.ANY:    # name and extends: checked apart
        assert problem == k.spec.sweep_problem(yaml.safe_load(text)), problem


@pytest.mark.parametrize("name", sorted(AGAINST))
def test_a_value_another_key_refuses_is_one_problem(tmp_path, name):
    text, words = AGAINST[name]
    assert _problem(tmp_path, text).startswith(words)


# Wrong values of the sub-keys a key's mapping declares (timing, predict, adaptive).
SUB_BAD = {("timing", "warmup"): ("{warmup: -1}", "timing: warmup must be an integer >= 0"),
           ("timing", "batches_per_iter"): ("{batches_per_iter: 0}",
                                            "timing: batches_per_iter must be an integer >= 1"),
           ("timing", "iters"): ("{iters: x}", "timing: iters must be an integer >= 1"),
           ("predict", "networks"): ("{networks: {a: 1}}", "predict: networks must be a "
                                                          "mapping of names to paths"),
           ("predict", "profiles"): ("{profiles: [a]}", "predict: profiles must be a mapping"),
           ("predict", "device_throughput"): ("{device_throughput: {m: 0}}",
                                              "predict: device_throughput must be 'survey'"),
           ("predict", "codec"): ("{codec: 3}", "predict: codec must be a path, got 3"),
           ("adaptive", "target"): ("{target: 0, max_tries: 9}",
                                    "adaptive target must be a fraction between 0 and 1"),
           ("adaptive", "max_tries"): ("{target: 0.03, max_tries: 5}",
                                       "adaptive max_tries must be an integer above tries (5)")}


def test_every_sub_key_has_a_bad_value_here():
    assert set(SUB_BAD) == {(name, s.name) for name, options in (
        ("timing", config.Timing), ("predict", config.Predict),
        ("adaptive", config.Adaptive)) for s in options.specs()}


@pytest.mark.parametrize("where", sorted(SUB_BAD), ids="-".join)
def test_a_bad_sub_key_is_one_problem_naming_it(tmp_path, where):
    text, words = SUB_BAD[where]
    assert _problem(tmp_path, f"{where[0]}: {text}\n").startswith(words)

"""The hostile matrix kept as a fuzz test (issue 47): seeded, generated cases over the flags of
``train``, ``predict``, ``timeline``, ``comm_bench``, the profiler and ``netem probe``, over
trace files and over sweep files. Each case is accepted (exit 0, or stopped where work would
start: spawning and workers are replaced by an exception, as in tests/test_hostile.py) or one
line on stderr with exit code 2; never a traceback, never a stray file, no process or network
namespace left behind.

``DDLBENCH_FUZZ=N`` runs N cases per test (default 60: 420 cases, about half a minute);
``DDLBENCH_FUZZ_SEED`` picks another seed. A failing case prints its command line."""
import argparse
import json
import os
import random
import subprocess
import sys

import pytest

import benchmarks
from ddlbench import train
from ddlbench.measure import comm_bench, profiler
from ddlbench.model import predict
from ddlbench.netem import cli as netem_cli
from ddlbench.sweep import config
from ddlbench.timeline import cli as timeline_cli

from .conftest import REPO, env
from .test_hostile import NASTY, WouldRun, no_runs, outcome, parser_of  # noqa: F401

CASES = int(os.environ.get("DDLBENCH_FUZZ", "60"))
SEED = int(os.environ.get("DDLBENCH_FUZZ_SEED", "47"))
PROFILE = os.path.join(REPO, "configs", "profiles", "h200_resnet50_bs64.json")
PLAUSIBLE = ["1", "2", "3", "4", "8", "16", "0.5", "1e-3", "64", "1000", "resnet18", "bert_tiny",
             "wfbp", "fusion,ddp", "none", "fp16", "loopback", "{tmp}/out.json", "{tmp}"]
TINY = ["--no-cuda", "--model", "bert_tiny", "--sentence-len", "16", "--batch-size", "4"]


def _options(parser) -> tuple[list, list]:
    """(flags taking a value with their choices, switches) of a parser."""
    valued, switches = [], []
    for a in parser._actions:
        if not a.option_strings or a.option_strings[0] in ("--help", "-h"):
            continue
        if a.nargs == 0:
            switches.append(a.option_strings[0])
        else:
            valued.append((a.option_strings[-1], list(a.choices or [])))
    return valued, switches


def _value(rng, choices) -> str:
    pool = rng.choice((NASTY, PLAUSIBLE, [str(c) for c in choices] or PLAUSIBLE))
    return rng.choice(pool)


def _argv(rng, parser, base, tmp) -> list[str]:
    valued, switches = _options(parser)
    argv = list(base)
    for flag, choices in rng.sample(valued, min(len(valued), rng.randint(1, 3))):
        argv += [flag, _value(rng, choices)]
    argv += [s for s in switches if rng.random() < 0.15]
    return [a.replace("{tmp}", str(tmp)) for a in argv]


def _children() -> set[int]:
    """This process's child processes (pids), from /proc."""
    me, kids = os.getpid(), set()
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/stat") as f:
                if int(f.read().rsplit(")", 1)[1].split()[1]) == me:
                    kids.add(int(pid))
        except (OSError, ValueError, IndexError):
            pass
    return kids


def _namespaces_of(pid: int) -> list[str]:
    """The emulated networks whose state file names ``pid`` as their owner (a run creates
    none without writing one first: ddlbench/netem/state.py)."""
    from ddlbench.netem.state import _read_states
    return [name for name, state in _read_states() if state.get("owner_pid") == pid]


@pytest.fixture
def left_behind(tmp_path, monkeypatch):
    """Run four folders down in ``tmp_path`` (a stray ``touch X`` lands there, a relative
    ``../../../x`` stays inside); afterwards no new child process, no network namespace left
    by this process, no stray file."""
    cwd = tmp_path / "a" / "b" / "c" / "d"
    cwd.mkdir(parents=True)
    monkeypatch.chdir(cwd)
    kids = _children()
    yield
    assert _children() <= kids
    assert not _namespaces_of(os.getpid())
    assert not os.path.exists(cwd / "X")


def _netem_probe(argv):
    return netem_cli.main(["probe", *argv])


@pytest.mark.parametrize("name,fn,parse,base", [
    ("train", train.main, train.parse_args, TINY),
    ("predict", predict.main, predict.main, ["--profile", PROFILE, "--method", "wfbp"]),
    ("comm_bench", comm_bench.main, comm_bench.parse_args, ["--ops", "allreduce"]),
    ("profiler", profiler.main, profiler.parse_args, ["--model", "bert_tiny"]),
    ("netem probe", _netem_probe, lambda a: netem_cli.parse_args(["probe", *a]), []),
])
def test_generated_flags_are_a_run_or_one_line(name, fn, parse, base, tmp_path, capfd, no_runs,
                                               left_behind, monkeypatch):
    def refuse(*_a, **_k):
        raise WouldRun()
    monkeypatch.setattr(netem_cli, "Cluster", refuse)  # a probe accepted: it would start one
    parser = parser_of(parse) if name != "netem probe" else _probe_parser()
    rng = random.Random(f"{SEED}-{name}")
    seen = []
    for _ in range(CASES):
        argv = _argv(rng, parser, base, tmp_path)
        try:
            seen.append(outcome(fn, argv, capfd))
        except Exception as e:  # the traceback a user would have seen, or a wrong exit
            raise AssertionError(f"{name} {argv}: {type(e).__name__}: {e}") from e
    assert "line" in seen  # the generator reaches the checks


def _probe_parser():
    """``netem probe``'s own subparser."""
    root = parser_of(lambda a: netem_cli.parse_args(a))
    sub = next(a for a in root._actions if isinstance(a, argparse._SubParsersAction))
    return sub.choices["probe"]


# -- trace files ------------------------------------------------------------------------------

FIELD_VALUES = {"name": ["x", "", "allreduce", 7, None, "\u00e9" * 300],
                "ph": ["X", "B", "E", "i", "M", "?", 1, None],
                "ts": [0, 1.5, -1, 1e308, float("nan"), "x", None, 10 ** 30, True],
                "dur": [0, 2, -1e308, float("inf"), "1", None, [1]],
                "cat": ["comm", "compute", "wait", 3, None], "pid": [0, 1, -1, "a", None],
                "tid": ["training", 0, None, {}],
                "args": [{}, {"bytes": "x"}, [], None, {"a": {"b": [1]}}]}


@pytest.fixture(scope="module")
def valid_trace(tmp_path_factory) -> dict:
    """A merged two-rank trace as a run writes it (scripts/gen_trace.py)."""
    path = tmp_path_factory.mktemp("trace") / "valid.json"
    subprocess.run([sys.executable, os.path.join(REPO, "scripts", "gen_trace.py"), str(path),
                    "--mb", "0.05", "--ranks", "2"], check=True, capture_output=True, timeout=60)
    with open(path) as f:
        return json.load(f)


def _trace(rng, path, valid: dict) -> None:
    """A trace file: the valid one, the valid one with a few events damaged or dropped, its
    metadata damaged, text that is not a trace, or nesting deeper than a decoder goes."""
    kind = rng.randrange(8)
    if kind == 0:
        text = rng.choice(["", "{", "null", "[]", "{}", "\x00\xff", "[1, 2", '"x"', "1e999"])
    elif kind == 1:
        depth = rng.choice([10, 100, 5000])
        text = "[" * depth + "]" * depth
    else:
        doc = json.loads(json.dumps(valid))
        events = doc["traceEvents"]
        for _ in range(0 if kind == 2 else rng.randint(1, 3)):
            e = rng.choice(events)
            key = rng.choice(sorted(FIELD_VALUES))
            if rng.random() < 0.2:
                e.pop(key, None)
            else:
                e[key] = rng.choice(FIELD_VALUES[key])
        if kind == 7:
            doc[rng.choice(["metadata", "traceEvents"])] = rng.choice([None, {}, [], "x", 1])
        text = json.dumps(doc, allow_nan=True)
    with open(path, "w", encoding="utf-8", errors="surrogateescape") as f:
        f.write(text)


def test_generated_traces_are_a_summary_or_one_line(tmp_path, capfd, left_behind,
                                                     valid_trace):
    rng = random.Random(f"{SEED}-timeline")
    parser = parser_of(timeline_cli.parse_args)
    seen = []
    for k in range(CASES):
        traces = []
        for j in range(rng.choice([1, 1, 2])):
            traces.append(str(tmp_path / f"t{k}_{j}.json"))
            _trace(rng, traces[-1], valid_trace)
        if rng.random() < 0.1:
            traces.append(str(tmp_path / "missing.json"))
        argv = traces + _argv(rng, parser, [], tmp_path)[:2]
        try:
            seen.append(outcome(timeline_cli.main, argv, capfd))
        except Exception as e:
            raise AssertionError(f"timeline {argv}: {type(e).__name__}: {e}") from e
    assert "line" in seen and "run" in seen


# -- sweep files ------------------------------------------------------------------------------

def _sweep_value(rng, key: str | None = None):
    """A value for a sweep key: one of the generic ones, or (half the time, for the keys that
    hold lists and mappings) one shaped for that key, so its own checks are reached."""
    if key in KEY_VALUES and rng.random() < 0.7:
        return json.loads(json.dumps(rng.choice(KEY_VALUES[key])))
    return rng.choice([None, 0, -1, 1, 2, 1.5, 10 ** 15, float("nan"), float("inf"), "",
                       "x" * 300, "loopback", "resnet18", "wfbp", [], [1], ["wfbp", "ddp"],
                       [[1]], {}, {"a": 1}, {"name": "r18", "dnn": "resnet18", "bs": 2}, True,
                       "$(touch X)", [{"name": "lo", "kind": "net"}], "{bogus}"])


TASK = {"model": "bert_tiny", "batch_size": 4, "sentence_len": 16}
# Values shaped for the keys whose generic values never pass their first check: labels that file
# names reduce to the same text or to nothing, tasks that differ only where a cell's name does
# not look, settings of BytePS and the loader, bounds (issue 61's classes 3, 4, 9, 12)
KEY_VALUES = {
    "methods": [[{"method": "wfbp", "label": "\u2603"}, {"method": "ddp", "label": "\u00fc"}],
                [{"method": "wfbp", "label": "a b"}, {"method": "ddp", "label": "a-b"}],
                [{"method": "wfbp", "label": "a"}, {"method": "wfbp", "label": "b"}],
                [{"method": "fusion", "threshold": 0}, {"method": "fusion", "threshold": 1}],
                ["wfbpps", {"method": "ddp", "label": ""}], ["wfbp", "wfbp"]],
    "tasks": [[TASK, dict(TASK, num_classes=3)], [TASK, dict(TASK, args="--lr 0.1")],
              [dict(TASK, args="--lr 0.1"), dict(TASK, args="--lr  0.1")], [TASK, TASK],
              [dict(TASK, model="x;touch X")], [dict(TASK, batch_size=0)]],
    "networks": [["loopback"], [{"net": "loopback", "label": "\u2603"}], ["loopback", "lo"],
                 [{"rdma": 0}], [{"net": "rate=nan"}], ["loopback", "loopback"]],
    "nworkers": [[1, 2], [2, 1], [0], [10 ** 7], [1, 1], ["2"]],
    "engines": [["torch"], ["byteps"], ["torch", "horovod"], ["mxnet"], ["torch", "torch"]],
    "skip": [["nworkers=2"], ["bogus"], ["method=\u2603"], ["model=bert_tiny"], [""]],
    "env": [{"BYTEPS_SERVER_SCHEDULE_HEAP": "bogus"}, {"BYTEPS_SERVER_SCHEDULE_HEAP": "original"},
            {"LD_PRELOAD": "x"}, {"OMP_NUM_THREADS": 1}, {"": "x"}, {"A B": "1"}],
    "timing": [{"warmup": 0, "batches_per_iter": 1, "iters": 1}, {"iters": -1}, {"bogus": 1}],
    "predict": [{"device_throughput": "survey"}, {"networks": {"loopback": "x"}}, {"x": 1}],
    "results": ["r", "/proc/x", "a/../../b", "x" * 300],
    "logs": ["l", "/proc/x", "x" * 300],
    "kill_grace": [float("inf"), 600, 601, 1e308, 0],
    "adaptive": [{"target": 0.03, "max_tries": 5}, {"target": float("nan"), "max_tries": 2}],
}


SMALL = {"name": "small", "networks": ["loopback"], "tasks": [TASK], "methods": ["wfbp"],
         "nworkers": [2], "timeout": 60}


def _cells_apart(path: str) -> None:
    """An accepted sweep's cells have a file name each and a hash each (issue 61, class 3: two
    cells sharing a name overwrote each other's record and log)."""
    cells = config.load(path, preflight=False).cells()
    names, hashes = [c.name for c in cells], [c.hash for c in cells]
    assert len(set(names)) == len(names), f"cells share a file name: {names}"
    assert len(set(hashes)) == len(hashes), f"cells share a hash: {names}"


def test_generated_sweep_files_are_a_dry_run_or_one_line(tmp_path, capfd, no_runs, left_behind):
    rng = random.Random(f"{SEED}-sweep")
    # the keys the sweep format declares (its names in the file: results, logs, ...), each
    # with its default
    keys = {k.name: k.spec.default for k in config.keys()}
    assert {"networks", "nworkers", "timing", "engines", "skip", "env", "predict", "results",
            "logs", "methods", "tasks"} <= set(keys)
    base = os.path.join(REPO, "configs", "quick.yaml")
    import yaml
    with open(base) as f:
        quick = yaml.safe_load(f)
    seen = []
    for k in range(CASES):
        # the quick sweep, a small one (its checks cheap: one task, one method, one count) or
        # nothing
        doc = rng.choice([dict(quick), dict(quick), json.loads(json.dumps(SMALL)),
                          json.loads(json.dumps(SMALL)), {}])
        for key in rng.sample(sorted(keys), rng.randint(0, 3)):
            # a nasty value, or the key's own default (or the quick sweep's)
            doc[key] = _sweep_value(rng, key) if rng.random() < 0.6 else \
                quick.get(key, keys[key])
        if rng.random() < 0.6:   # one of the keys with values of their own shape, often
            key = rng.choice(sorted(KEY_VALUES) + ["methods", "tasks"] * 3)  # (the cells' own)
            doc[key] = _sweep_value(rng, key)
        if rng.random() < 0.1:
            doc[rng.choice(["bogus", "", "nworker"])] = 1
        path = tmp_path / f"s{k}.yaml"
        path.write_text(yaml.safe_dump(doc) if rng.random() < 0.95 else "a: [1,\n")
        argv = ["--config", str(path), "--dry-run", "--results", str(tmp_path / f"r{k}")]
        try:
            seen.append(outcome(benchmarks.main, argv, capfd))
            if seen[-1] == "run":
                _cells_apart(str(path))
        except Exception as e:
            raise AssertionError(f"benchmarks.py {argv} with {doc!r}: {type(e).__name__}: "
                                 f"{e}") from e
    assert "line" in seen and "run" in seen


# -- the shell launchers' variables (dry runs and refusals only) ------------------------------

LAUNCHERS = ["byteps/byteps_launch.sh", "torchrun/torchrun_launch.sh",
             "horovod/horovod_mpi_cj.sh"]
LAUNCHER_VARS = {
    "nworkers": ["1", "2", "4", "0", "-1", "nan", "1e3", "99999999999"],
    "dnn": ["bert_tiny", "resnet18", "x;touch X", "$(touch X)", ""],
    "bs": ["4", "0", "-2", "1e2", "x"], "senlen": ["16", "0", "nan"],
    "image_size": ["32", "1", "1e9", "x"], "iters": ["1", "0", "nan"],
    "method": ["wfbpps", "bspps", "byteschedulerps", "wfbp", "fusion", "x;touch X", ""],
    "threshold": ["0", "536870912", "-1", "1e999", "x"], "rdma": ["0", "1", "3", "x"],
    "engine": ["torch", "mxnet", "", "byteps"], "compressor": ["none", "fp16", "topk", "bogus"],
    "nservers": ["1", "0", "x"], "ps_force_servers": ["0", "1", "2"],
    "bytescheduler": ["0", "1", "2"], "job": ["abc", "x;touch X", "a" * 100],
    "extra_args": ["--lr nan", "--compressor fp16", "'unbalanced", "--net 1gbit", "--verify 1",
                   "$(touch X)", "/etc/*"],
    "BYTEPS_SERVER_SCHEDULE_HEAP": ["original", "bogus"],
    # (never the BytePS lane's own Python: a check there imports BytePS, seconds a case)
    "BYTEPS_PY": ["/bin/false", "/bin/true", sys.executable, "/nonexistent/python"],
    "DMLC_NUM_SERVER": ["2", "abc"], "timeline": ["{tmp}/t.json", "/proc/x.json"],
}


def test_generated_launcher_variables_are_a_dry_run_or_one_line(tmp_path, left_behind):
    """Each launcher under dry_run=1 with a few variables drawn from LAUNCHER_VARS: the command
    it would run (exit 0) or one non-empty error line, last, and exit 2 (after the launcher's
    notes, if any); never a traceback, nothing started, no file made (a `touch X` would land in the checkout's root, where the launchers run)."""
    rng = random.Random(f"{SEED}-launchers")
    hosts = tmp_path / "hosts"
    hosts.write_text("localhost slots=4\n")
    seen = []
    for _ in range(max(CASES // 3, 8)):
        script = rng.choice(LAUNCHERS)
        chosen = {k: rng.choice(v) for k, v in
                  rng.sample(sorted(LAUNCHER_VARS.items()), rng.randint(1, 3))}
        if script.startswith("byteps/") and rng.random() < 0.5:   # the BytePS lane's checks
            chosen["engine"] = "byteps"
        if chosen.get("engine") == "byteps" and chosen.get("BYTEPS_PY") in (None, ""):
            chosen["BYTEPS_PY"] = rng.choice(LAUNCHER_VARS["BYTEPS_PY"])
        variables = {k: v.replace("{tmp}", str(tmp_path)) for k, v in chosen.items()}
        e = {k: v for k, v in env().items() if not k.startswith(("BYTEPS_", "DMLC_"))}
        e.update(hostfile=str(hosts), dry_run="1", **variables)
        proc = subprocess.run(["bash", os.path.join(REPO, script)], cwd=REPO, env=e,
                              capture_output=True, text=True, timeout=120,
                              stdin=subprocess.DEVNULL)
        # (a launcher's notes may come first: "threshold=0 ignored", ...)
        lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
        errors = [ln for ln in lines if "error:" in ln]
        case = f"{variables} {script}: exit {proc.returncode}, stderr:\n{proc.stderr[-2000:]}"
        assert "Traceback" not in proc.stderr, case
        assert (proc.returncode == 0 and not errors) or (
            proc.returncode == 2 and len(errors) == 1 and errors[0] == lines[-1]
            and errors[0].split("error:", 1)[1].strip()), case
        assert not os.path.exists(os.path.join(REPO, "X")), case
        seen.append(proc.returncode)
    assert 0 in seen and 2 in seen


# -- netem's cluster commands (refusals only: no cluster is built) ----------------------------

CLUSTER_VALUES = {"--name": ["x", "node", "X", "", "a" * 30, "x;touch X", "-1", "n\u00e9"],
                  "--hosts": ["2", "0", "-1", "65", "1e3", "x", "999999999999"],
                  "--net": ["1gbit", "loopback", "rate=nan", "bogus", "rate=1kbit", ""],
                  "--slots": ["1", "0", "4097", "x"], "--host": ["0", "-1", "99", "x"]}


def test_generated_cluster_commands_are_a_refusal_or_stop_before_building(
        tmp_path, capfd, monkeypatch, left_behind):
    """``netem cluster up/down/status/exec`` with drawn arguments, against a state folder of
    the test's own (no cluster in it): one line and exit 2, a status, or stopped where a
    cluster would be built or a command run; never a traceback."""
    from ddlbench.netem import standing

    def refuse(*_a, **_k):
        raise WouldRun()
    monkeypatch.setenv("DDLBENCH_NETEM_STATE", str(tmp_path / "netem"))
    monkeypatch.setattr(standing, "Cluster", refuse)
    monkeypatch.setattr(os, "execvpe", refuse)
    rng = random.Random(f"{SEED}-cluster")
    seen = []
    for _ in range(CASES):
        verb = rng.choice(["up", "up", "down", "status", "exec"])
        flags = {"up": ["--name", "--hosts", "--net", "--slots"], "down": ["--name"],
                 "status": ["--name"], "exec": ["--name", "--host"]}[verb]
        argv = ["cluster", verb]
        for flag in rng.sample(flags, rng.randint(0, len(flags))):
            argv += [flag, rng.choice(CLUSTER_VALUES[flag])]
        if verb == "up" and "--hosts" not in argv and rng.random() < 0.8:
            argv += ["--hosts", "2"]
        if verb == "exec":
            argv += ["--", rng.choice(["true", "touch X", "$(touch X)"])]
        try:
            seen.append(outcome(netem_cli.main, argv, capfd))
        except Exception as e:
            raise AssertionError(f"netem {argv}: {type(e).__name__}: {e}") from e
    assert "line" in seen

"""Hostile input, third round (issue 47): an image too small for the model, a sweep name too long
for a folder, counts without a bound, infinite or negative numbers for the performance model,
duplicate YAML keys, a path flag named wrongly or holding an unknown placeholder. Each is one line
naming the flag or key and what is allowed, exit code 2, before anything starts.

Checked in this process (the commands' own ``main``, with spawning and workers replaced by an
exception), one case end to end in a subprocess."""
import glob
import os
import re
import signal
import subprocess
import sys
import time
import uuid

import pytest

import benchmarks
import models
from ddlbench import train, yamlfile
from ddlbench.errors import ArgumentParser, UsageError, check_writable
from ddlbench.measure import profiler
from ddlbench.model import predict
from ddlbench.sweep import aggregate, config, store

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


# ----------------------------------------------------------------- issue 61: sweeps, launchers

def _one_line_proc(proc, rc: int = 2) -> str:
    """The one stderr line of a finished command that exited ``rc``, no traceback."""
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip() and not ln.startswith("+ ")]
    assert proc.returncode == rc and len(lines) == 1 and "Traceback" not in proc.stderr, \
        f"exit {proc.returncode}\nstdout:\n{proc.stdout[-2000:]}\nstderr:\n{proc.stderr[-3000:]}"
    return lines[0]


def _launcher(script: str, timeout: float = 120, **variables):
    return subprocess.run(["bash", script], cwd=REPO, env=env(**variables), capture_output=True,
                          text=True, timeout=timeout, stdin=subprocess.DEVNULL)


def test_cells_whose_file_names_would_collide_keep_both_records(tmp_path, monkeypatch):
    """3. Labels that file names reduce to nothing, tasks that differ only in num_classes or
    args: each cell its own record and log (a hash appended); a name no other takes is kept."""
    monkeypatch.setenv(config.PROGRAM_ENV, "tests.fake_train")
    path = _sweep(tmp_path, f"name: clash\nresults: {tmp_path / 'r'}\nlogs: {tmp_path / 'l'}\n"
                            "timeout: 60\ntries: 1\nnetworks: [local]\ntasks:\n"
                            "  - {model: bert_tiny, batch_size: 4, sentence_len: 16}\n"
                            "  - {model: bert_tiny, batch_size: 4, sentence_len: 16, "
                            "num_classes: 3}\n"
                            "methods: [{method: wfbp, label: \"\u2603\"}, "
                            "{method: ddp, label: \"\u00fc\"}, fusion]\nnworkers: [1]\n")
    sweep = config.load(path, preflight=False)
    names = [c.name for c in sweep.cells()]
    assert len(set(names)) == len(names) == 6, names
    assert all(re.fullmatch(r"local_bert_tiny-bs4-len16-h[0-9a-f]{8}_(h[0-9a-f]{8}|fusion)_n1",
                            n) for n in names), names
    # the names of a sweep without a clash are as they were (a stored sweep resumes)
    # one method twice under two labels: the same cells (one hash), refused
    (tmp_path / "twice.yaml").write_text(SWEEP.replace(
        "[wfbp]", "[{method: wfbp, label: a}, {method: wfbp, label: b}]"))
    with pytest.raises(UsageError, match="methods 'a' and 'b' are the same method with the same "
                                         "settings"):
        config.load(str(tmp_path / "twice.yaml"), preflight=False)
    (tmp_path / "plain.yaml").write_text(SWEEP)
    plain = config.load(str(tmp_path / "plain.yaml"), preflight=False)
    assert [c.name for c in plain.cells()] == ["local_bert_tiny-bs4-len16_wfbp_n1"]
    assert benchmarks.main(["--config", path, "--quiet"]) == 0
    [folder] = os.listdir(tmp_path / "r")
    entries, bad = store.read(str(tmp_path / "r" / folder / "results.jsonl"))
    tries = [e for e in entries if e["kind"] == "try"]
    assert bad == 0 and len(tries) == 6 and all(e["status"] == "ok" for e in tries)
    records = os.listdir(tmp_path / "r" / folder / "records")
    logs = [f for _, _, fs in os.walk(tmp_path / "l") for f in fs]
    assert len(records) == 6 and len(logs) == 6, (records, logs)
    # the report keeps the two tasks apart: six rows of one cell each
    table = aggregate.load(str(tmp_path / "r" / folder / "results.jsonl"))
    assert sorted(len(r.cells) for r in table.rows) == [1] * 6


def test_inherited_byteps_variables_do_not_reach_a_sweeps_runs():
    """4. BYTEPS_* of the sweep's environment are dropped (a sweep sets them with env:, then
    recorded and hashed)."""
    inherited = {"BYTEPS_SERVER_SCHEDULE_HEAP": "original", "BYTEPS_PY": "/bin/false",
                 "BYTEPS_PARTITION_BYTES": "7", "PATH": "/bin"}
    child = config.child_environment({}, inherited)
    assert child == {"PATH": "/bin"}
    assert config.child_environment({"BYTEPS_SERVER_SCHEDULE_HEAP": "original"}, inherited) \
        == {"PATH": "/bin", "BYTEPS_SERVER_SCHEDULE_HEAP": "original"}
    assert config.inherited_settings(inherited) == {}


def test_stop_sh_with_a_job_id_on_a_stock_checkout_stops_the_local_job():
    """5. The line every launch prints, on a checkout whose configs/cluster8 holds example
    hosts: this machine's processes of that job stop; another job's live on."""
    target = f"stock-{uuid.uuid4().hex[:8]}"
    sleep = "import time; time.sleep(120)"
    procs = [subprocess.Popen([sys.executable, "-c", sleep, "ddlbench.train", "--job-id", job],
                              cwd=REPO) for job in (target, target + "x")]
    try:
        e = {k: v for k, v in env().items() if k not in ("hostfile", "nworkers")}
        proc = subprocess.run(["bash", "byteps/stop.sh"], cwd=REPO, env=dict(e, job=target),
                              capture_output=True, text=True, timeout=60)
        assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr
        assert proc.stdout == f"stopped the processes of job {target} on localhost\n"
        assert proc.stderr.endswith("example): job " + target + " on this machine only\n")
        procs[0].wait(timeout=10)
        time.sleep(0.3)
        assert procs[1].poll() is None
    finally:
        for p in procs:
            p.kill()
            p.wait()


def test_a_byteps_python_without_byteps_is_one_line_before_anything_starts(tmp_path):
    """8. BYTEPS_PY naming a Python without BytePS, or no Python at all: one line, before
    BytePS's scheduler and servers start."""
    hosts = tmp_path / "hosts"
    hosts.write_text("localhost slots=2\n")
    common = dict(nworkers="2", hostfile=str(hosts), engine="byteps", method="wfbpps",
                  dnn="bert_tiny", bs="4", senlen="16", iters="1")
    line = _one_line_proc(_launcher("byteps/byteps_launch.sh", BYTEPS_PY=sys.executable,
                                    **common))
    assert line.startswith("byteps/byteps_launch.sh: error: --engine byteps is unavailable in "
                           "this Python (ModuleNotFoundError: No module named 'byteps"), line
    line = _one_line_proc(_launcher("byteps/byteps_launch.sh", BYTEPS_PY="/bin/false", **common))
    assert line == ("byteps/byteps_launch.sh: error: /bin/false cannot run the suite (python -m "
                    "ddlbench.methods: exit 1): no output")


def test_a_schedule_heap_that_is_neither_is_refused_naming_both(monkeypatch):
    """9. BYTEPS_SERVER_SCHEDULE_HEAP=bogus (the patch would read it as the patched heap and
    the record would name the typo): the engine's check refuses it (the launcher runs that
    check before BytePS starts, and a sweep's preflight with the cell's env)."""
    from ddlbench import flags
    from ddlbench.runtime import byteps as bps_runtime
    assert bps_runtime.schedule_heap_problem({"BYTEPS_SERVER_SCHEDULE_HEAP": "orignal"}) == (
        "BYTEPS_SERVER_SCHEDULE_HEAP must be patched or original (unset: patched), got "
        "'orignal'")
    for fine in ({}, {"BYTEPS_SERVER_SCHEDULE_HEAP": "original"},
                 {"BYTEPS_SERVER_SCHEDULE_HEAP": "patched"}):
        assert bps_runtime.schedule_heap_problem(fine) is None
    monkeypatch.setenv("BYTEPS_SERVER_SCHEDULE_HEAP", "bogus")
    args = flags.parse_args([*TINY, "--engine", "byteps", "--method", "wfbpps"])
    with pytest.raises(UsageError, match="must be patched or original .* got 'bogus'"):
        flags.check(args, probe_engine=False)


def test_kill_grace_is_bounded_and_a_stopped_sweep_stops_its_run_briefly(tmp_path, capfd):
    """12. kill_grace: .inf (or beyond the bound) is refused at the check; the sweep's own
    stop gives its run at most STOP_GRACE."""
    for value in (".inf", ".nan", "601", "-1"):
        path = _sweep(tmp_path, f"kill_grace: {value}\nresults: {tmp_path / 'r'}\n{SWEEP}")
        line = one_line(benchmarks.main, ["--config", path, "--dry-run"], capfd)
        assert (": 1 problem(s): kill_grace must be a number of seconds from 0 to "
                f"{config.MAX_KILL_GRACE}, got ") in line, line
    config.load(_sweep(tmp_path, f"kill_grace: 600\n{SWEEP}"), preflight=False)
    assert config.STOP_GRACE <= 10


def test_a_sweep_stopped_while_its_run_ignores_sigterm_ends_within_the_bound(tmp_path):
    """12. A run that ignores SIGTERM, kill_grace at its bound: SIGTERM to the sweep ends it
    (and the run) within STOP_GRACE and a few seconds, not kill_grace."""
    path = _sweep(tmp_path, f"name: term\nresults: {tmp_path / 'r'}\nlogs: {tmp_path / 'l'}\n"
                            f"kill_grace: 600\ntries: 1\ntimeout: 300\nnetworks: [local]\n"
                            "tasks:\n  - {model: bert_tiny, batch_size: 4, sentence_len: 16}\n"
                            "methods: ['tests.broken_methods:Hang']\nnworkers: [2]\n")
    proc = subprocess.Popen([sys.executable, "benchmarks.py", "--config", path, "--quiet"],
                            cwd=REPO, env=env(**{config.PROGRAM_ENV: "tests.fake_train"}),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    try:
        inflight = None
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and inflight is None:
            found = glob.glob(str(tmp_path / "r" / "*" / "inflight.json"))
            inflight = found[0] if found else None
            time.sleep(0.2)
        assert inflight, "the run never started"
        time.sleep(1.0)
        began = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=config.STOP_GRACE + 30)
        assert time.monotonic() - began < config.STOP_GRACE + 25
        assert proc.returncode == 143 and "Traceback" not in err, err
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def test_a_second_cluster_up_of_a_name_being_built_is_one_line(tmp_path, monkeypatch, capfd):
    """13. While one `cluster up --name x` builds (it holds the name's lock), a second one at
    the same moment is one line, exit 2; nothing of a cluster is made (no real cluster here)."""
    from ddlbench.netem import cli as netem_cli
    from ddlbench.netem import standing
    monkeypatch.setenv("DDLBENCH_NETEM_STATE", str(tmp_path / "netem"))
    with standing._building("x"):
        line = one_line(netem_cli.main, ["cluster", "up", "--name", "x", "--hosts", "2",
                                         "--net", "1gbit"], capfd)
        assert sorted(os.listdir(tmp_path / "netem" / "clusters")) == [".x.lock"]
    with standing._building("x"):   # the hold ends with its holder, its file with it
        pass
    assert line == ("ddlbench: error: cluster 'x' is being built by another `cluster up --name "
                    "x` at this moment; wait for it (cluster status --name x)")
    assert os.listdir(tmp_path / "netem" / "clusters") == []


def test_a_dead_byteps_jobs_leftovers_are_reaped_and_a_live_jobs_kept(tmp_path):
    """14. What a BytePS launcher killed outright leaves (shared memory, sockets, a trace
    folder) is removed by the next launch's reaping; the files of a job whose processes live
    are kept."""
    import socket as socketlib
    from ddlbench.launch import pslaunch
    dead, live = f"dead{uuid.uuid4().hex[:8]}", f"live{uuid.uuid4().hex[:8]}"
    made = {}
    for job in (dead, live):
        shm = f"/dev/shm/BytePS_ShM_{job}_0_1"
        open(shm, "w").close()
        trace = f"/tmp/ddlbench-byteps-trace-{job}-0-x"
        os.makedirs(os.path.join(trace, "0"))
        sock = socketlib.socket(socketlib.AF_UNIX)
        sock.bind(f"/tmp/socket_send_{job}_0_0")
        sock.close()
        made[job] = [shm, trace, f"/tmp/socket_send_{job}_0_0"]
    holder = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)",
                               "--job-id", live])
    try:
        time.sleep(0.2)
        removed = pslaunch.reap_byteps_leftovers()
        assert set(made[dead]) <= set(removed), removed
        assert not any(os.path.exists(p) for p in made[dead])
        assert all(os.path.exists(p) for p in made[live])
    finally:
        holder.kill()
        holder.wait()
        for p in made[live] + made[dead]:
            subprocess.run(["rm", "-rf", p])


@pytest.mark.parametrize("args,message", [
    (["--tasks", "x;touch pwned;exit 0;:16"], "--tasks takes model:batch pairs (a model name, a "
                                              "batch from 1 to 65536), got 'x;touch pwned;exit "
                                              "0;:16'"),
    (["--tasks", "bert_tiny:$(touch pwned)"], "--tasks takes model:batch pairs"),
    (["--nworkers", "4;touch pwned"], "--nworkers takes integers from 1 to 1048576"),
    (["--rdmas", "3"], "--rdmas takes integers from 0 to 2"),
    (["--tries", "1e3"], "--tries takes integers from 1 to 1000, got '1e3'"),
])
def test_the_original_driver_refuses_what_would_reach_its_shell(tmp_path, args, message):
    """15. Nothing runs: the tasks and numbers the original puts into its shell=True lines are
    checked first; the original must be one (not '' or this checkout), a broken one one
    line."""
    original = tmp_path / "original"
    original.mkdir()
    (original / "benchmarks.py").write_text(
        "nworkers=[4]; rdmas=[0]; tasks=[]; NUM_OF_TRIES=1\n"
        "def main():\n    open('ran', 'w').close()\n")
    (original / "plots.py").write_text("")
    cmd = [sys.executable, os.path.join(REPO, "scripts", "run_original.py"), str(original)]
    line = _one_line_proc(subprocess.run(cmd + args, cwd=tmp_path, env=env(),
                                         capture_output=True, text=True, timeout=60))
    assert line.startswith(f"run_original.py: error: {message}"), line
    assert sorted(os.listdir(tmp_path)) == ["original"]
    assert not any(os.path.exists(os.path.join(REPO, f)) for f in ("pwned", "ran"))


def test_the_original_driver_knows_the_original(tmp_path):
    script = os.path.join(REPO, "scripts", "run_original.py")
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "benchmarks.py").write_text("import no_such_module_here\n")
    (broken / "synclog.sh").write_text("")
    for target, message in (("", "ORIGINAL is empty: give the path of a checkout of "
                                 "HKBU-HPML/ddl-benchmarks"),
                            (REPO, f"{REPO} is this suite's checkout, not the original "
                                   f"(HKBU-HPML/ddl-benchmarks)"),
                            (str(tmp_path), f"{tmp_path} has no benchmarks.py (a checkout of "
                                            f"HKBU-HPML/ddl-benchmarks)"),
                            (str(broken), f"the original's modules in {broken} do not import: "
                                          f"ModuleNotFoundError: No module named "
                                          f"'no_such_module_here'")):
        proc = subprocess.run([sys.executable, script, target], cwd=tmp_path, env=env(),
                              capture_output=True, text=True, timeout=60)
        assert _one_line_proc(proc) == f"run_original.py: error: {message}"
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "benchmarks.py").write_text("def main(): pass\n")
    proc = subprocess.run([sys.executable, script, str(tmp_path / "other")], cwd=tmp_path,
                          env=env(), capture_output=True, text=True, timeout=60)
    assert "is not a checkout of HKBU-HPML/ddl-benchmarks: it has none of plots.py" in \
        _one_line_proc(proc)


def test_engine_byteps_refuses_a_compressor_before_byteps_starts(tmp_path):
    """16. engine=byteps with --compressor fp16: one line from the workers' own check, run in
    the lane's Python before BytePS's scheduler and servers (none of them starts)."""
    from .test_byteps import SCRIPT as LANE
    lane = subprocess.run([LANE, "python"], capture_output=True, text=True, timeout=60)
    if lane.returncode != 0:
        pytest.skip("real BytePS: the environment is not built here")
    hosts = tmp_path / "hosts"
    hosts.write_text("localhost slots=2\n")
    began = time.monotonic()
    proc = _launcher("byteps/byteps_launch.sh", nworkers="2", hostfile=str(hosts),
                     engine="byteps", method="wfbpps", dnn="bert_tiny", bs="4", senlen="16",
                     iters="1", extra_args="--compressor fp16")
    line = _one_line_proc(proc)
    assert line == ("byteps/byteps_launch.sh: error: --engine byteps takes --compressor none, "
                    "not 'fp16' (the compressors run on --engine torch)")
    assert "job ID" not in proc.stderr and time.monotonic() - began < 60


def test_torchrun_launcher_bad_model_is_one_line_and_leaves_nothing(tmp_path):
    """17. nworkers=1 and a flag the training script refuses (dnn=x in the issue; a bad --lr
    here, which is refused without torchvision's import): its one line, before torchrun
    starts (no torchrun traceback, no torchelastic_* folder)."""
    hosts = tmp_path / "hosts"
    hosts.write_text("localhost slots=1\n")
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    proc = _launcher("torchrun/torchrun_launch.sh", nworkers="1", dnn="bert_tiny", bs="4",
                     senlen="16", extra_args="--lr nan", hostfile=str(hosts),
                     TMPDIR=str(scratch))
    assert _one_line_proc(proc) == "torchrun/torchrun_launch.sh: error: --lr must be positive, " \
                                   "got nan"
    assert [f for f in os.listdir(scratch) if f.startswith("torchelastic_")] == []


def test_a_killed_parameter_server_is_named_as_a_server():
    """18. The local spawner names the last nservers processes parameter servers: the line
    about one killed says so, not "worker 3"."""
    code = ("import sys; from ddlbench.launch.local import spawn_local; "
            "sys.exit(spawn_local(3, [], module='tests.killed_rank', nservers=1, pin=False, "
            "grace_s=1.0))")
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=env(),
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 128 + signal.SIGKILL, proc.stderr
    [named] = [ln for ln in proc.stderr.splitlines() if "was killed" in ln]
    assert re.fullmatch(r"ddlbench: parameter server 0 \(rank 2\) \(pid \d+\) was killed by "
                        r"SIGKILL; stopping the others", named), proc.stderr
    assert "worker 2" not in proc.stderr


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
    (["--slots", "0"], "--slots must be positive, got 0"),
    (["--net", "bogus"], "unknown network profile 'bogus'; known: loopback, 1gbit, 2.5gbit, "
                         "5gbit, 10gbe-scaled-200x, 100gbe-scaled-200x (configs/networks.yaml), "
                         "or rate=R[,burst=B], or target=R,speedup=S"),
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


@pytest.mark.parametrize("main", [train.main, profiler.main], ids=["train", "profiler"])
def test_bad_slots_are_one_line_in_the_training_script_and_the_profiler(
        main, capfd, monkeypatch, no_runs):  # noqa: F811 (the fixture)
    """The profiler's --slots (workers per emulated host) is refused as the training script's,
    by the same checks: not a positive integer, or given under a launcher (its host file
    places the workers)."""
    for value, message in (("0", "--slots must be positive, got 0"),
                           ("-2", "--slots must be positive, got -2"),
                           ("two", "argument --slots: invalid int value: 'two'")):
        line = one_line(main, [*TINY, "--nworkers", "2", "--slots", value], capfd)
        assert line == f"ddlbench: error: {message}"
    accepted(main, [*TINY, "--nworkers", "2", "--slots", "1"], capfd)
    for key, value in (("TORCHELASTIC_RUN_ID", "x"), ("RANK", "0"), ("WORLD_SIZE", "2"),
                       ("LOCAL_RANK", "0"), ("LOCAL_WORLD_SIZE", "2")):
        monkeypatch.setenv(key, value)
    line = one_line(main, [*TINY, "--nworkers", "2", "--slots", "1"], capfd)
    assert line == ("ddlbench: error: --slots places the workers of the suite's local spawner; "
                    "under a launcher its host file says which workers share a machine")


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


def test_netem_state_nested_too_deeply_is_not_a_traceback(tmp_path, monkeypatch):
    """A run state file or a standing cluster's description nested too deeply (issue 61, class
    6): the reaper treats the state as half-written (its namespaces found by name), the
    cluster's is one UsageError."""
    from ddlbench.errors import UsageError
    from ddlbench.netem import standing, state
    deep = "[" * 200000 + "]" * 200000
    (tmp_path / "run1.json").write_text(deep)
    monkeypatch.setattr(state, "state_dir", lambda: str(tmp_path))
    assert state._read_states() == [(str(tmp_path / "run1.json"),
                                     {"run_id": "run1", "namespaces": []})]
    folder = tmp_path / "clusters" / "c1"
    folder.mkdir(parents=True)
    (folder / "cluster.json").write_text(deep)
    monkeypatch.setattr(standing, "directory", lambda name: str(tmp_path / "clusters" / name))
    with pytest.raises(UsageError, match="cluster 'c1': unreadable .*nested too deeply"):
        standing.load("c1")

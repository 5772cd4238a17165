"""benchmarks.py: sweep files, fault-isolated runs, the results store, resume, reports.

Most runs here are of tests/fake_train.py (DDLBENCH_SWEEP_PROGRAM), a stand-in for the
training script that takes its flags, needs no torch and can crash or hang on demand; one test
runs the real training script through both launchers.
"""
import collections
import glob
import json
import os
import re
import signal
import subprocess
import sys
import time

import psutil
import pytest

import benchmarks
from ddlbench.sweep import config, report, runner, store
from ddlbench.errors import UsageError

from .conftest import REPO, describe, env

FAKE = "tests.fake_train"


def write_config(tmp_path, name="t", **overrides):
    cfg = {
        "name": name, "networks": ["local"],
        "tasks": [{"model": "resnet18", "batch_size": 4, "image_size": 32}],
        "methods": ["wfbp", "fusion"], "nworkers": [1, 2], "tries": 2,
        "timing": {"warmup": 1, "batches_per_iter": 1, "iters": 2}, "timeout": 60,
        "kill_grace": 1, "extra_args": "--timeout 30",
        "results": str(tmp_path / "results"), "logs": str(tmp_path / "logs"),
    }
    cfg.update(overrides)
    path = tmp_path / f"{name}.yaml"
    path.write_text(json.dumps(cfg))  # JSON is YAML
    return path


def folders(tmp_path):
    return sorted(glob.glob(str(tmp_path / "results" / "*")))


def try_lines(folder):
    entries, bad = store.read(os.path.join(folder, "results.jsonl"))
    assert bad == 0
    return [e for e in entries if e["kind"] == "try"]


def leftovers(marker):
    found = []
    for p in psutil.process_iter(["cmdline"]):
        try:
            if marker in " ".join(p.info["cmdline"] or []) and p.pid != os.getpid() \
                    and p.status() != psutil.STATUS_ZOMBIE:
                found.append(p)
        except psutil.Error:
            pass
    return found


@pytest.fixture
def fake(monkeypatch, tmp_path):
    calls = tmp_path / "calls.txt"
    monkeypatch.setenv(config.PROGRAM_ENV, FAKE)
    monkeypatch.setenv("FAKE_TRAIN_CALLS", str(calls))
    monkeypatch.delenv("FAKE_TRAIN_FIXED", raising=False)
    monkeypatch.delenv("FAKE_TRAIN_SECONDS", raising=False)

    def read_calls():
        return calls.read_text().splitlines() if calls.exists() else []
    return read_calls


# ----------------------------------------------------------------- reports from a fixed store

def _line(h, net, task, method, arch, n, i, status, thr=None, attempt=1, seconds=10.0,
          engine="torch", timeline=None, trace=None):
    nets = {"rdma0": {"name": "rdma0", "kind": "rdma", "profile": 0},
            "rdma2": {"name": "rdma2", "kind": "rdma", "profile": 2},
            "1gbit": {"name": "1gbit", "kind": "net", "profile": "1gbit"}}
    e = {"kind": "try", "sweep": "hand", "hash": h, "cell": f"{net}_{task['model']}_{method}_n{n}",
         "try": i, "attempt": attempt, "label": method, "architecture": arch,
         "config": {"network": nets[net], "task": task, "method": {"method": method},
                    "engine": engine, "nworkers": n},
         "status": status, "seconds": seconds, "log": f"logs/hand/{h}_try{i}.log"}
    if status == "ok":
        e.update(throughput=thr, throughput_std=1.5, unit="img/sec" if "resnet" in
                 task["model"] else "sen/sec", noun="GPU",
                 record={"environment": {"device": "cuda:0", "torch": "2.14.1",
                                         "hosts": ["gpu1"], "git_commit": "abc123"}})
        if timeline:
            e["record"]["timeline"] = timeline
        if trace:
            e["trace"] = trace
    else:
        e.update(reason="exit code 1" if status == "failed" else "killed after 600 s",
                 log_tail=["Traceback (most recent call last):", "RuntimeError: boom"])
    return e


def _timeline(iteration, compute, comm, hidden, exposed, observed=True):
    """A record's timeline section (seconds; binary fractions, so the means are exact)."""
    return {"recorded_iterations": 3, "comm_observed": observed, "slowest_rank": 1,
            "mean": {"iteration_s": iteration, "compute_s": compute, "wait_s": 0.0625,
                     "comm_s": comm, "hidden_s": hidden, "exposed_s": exposed,
                     "overlap": hidden / comm if comm else None, "idle_s": 0.0}}


R50 = {"model": "resnet50", "batch_size": 64}
BERT = {"model": "bert", "batch_size": 8, "sentence_len": 64}


def hand_written_store(folder):
    """Two networks x one task each, wfbp (a2a) and bspps (ps), 1 and 4 GPUs, 3 tries."""
    os.makedirs(folder, exist_ok=True)
    header = {"kind": "sweep", "name": "hand", "tries": 3, "min_ok": 2, "aggregate": "mean",
              "networks": [{"name": "rdma0", "kind": "rdma", "profile": 0},
                           {"name": "1gbit", "kind": "net", "profile": "1gbit"}],
              "tasks": [R50, BERT], "methods": [{"method": "wfbp"}, {"method": "bspps"}],
              "engines": ["torch"], "nworkers": [1, 4],
              "cells": ["c1", "c2", "c3", "c4", "c5", "c6", "c7", "c8"]}
    L = _line
    lines = [
        header,
        # superseded: the same cell under an older configuration (hash not in the header)
        L("old", "rdma0", R50, "wfbp", "a2a", 4, 0, "ok", 5000.0),
        L("c1", "rdma0", R50, "wfbp", "a2a", 1, 0, "ok", 250.0),
        L("c1", "rdma0", R50, "wfbp", "a2a", 1, 1, "ok", 250.0),
        L("c1", "rdma0", R50, "wfbp", "a2a", 1, 2, "failed"),
        # timelines: two tries of c2 (the third's record has none), one of c6 whose method's
        # communication is not observed
        L("c2", "rdma0", R50, "wfbp", "a2a", 4, 0, "ok", 900.0,
          timeline=_timeline(0.5, 0.25, 0.25, 0.125, 0.1875),
          trace="records/c2_try0.trace.json"),
        L("c2", "rdma0", R50, "wfbp", "a2a", 4, 1, "ok", 1000.0,
          timeline=_timeline(0.75, 0.25, 0.5, 0.125, 0.4375)),
        L("c2", "rdma0", R50, "wfbp", "a2a", 4, 2, "ok", 1100.0),
        L("c3", "rdma0", R50, "bspps", "ps", 1, 0, "ok", 240.0),
        L("c3", "rdma0", R50, "bspps", "ps", 1, 1, "ok", 245.0),
        L("c3", "rdma0", R50, "bspps", "ps", 1, 2, "ok", 265.0),
        L("c4", "rdma0", R50, "bspps", "ps", 4, 0, "ok", 800.0),
        L("c4", "rdma0", R50, "bspps", "ps", 4, 1, "failed"),
        L("c4", "rdma0", R50, "bspps", "ps", 4, 2, "failed"),
        L("c5", "1gbit", BERT, "wfbp", "a2a", 1, 0, "ok", 50.0),
        L("c5", "1gbit", BERT, "wfbp", "a2a", 1, 1, "ok", 52.0),
        L("c5", "1gbit", BERT, "wfbp", "a2a", 1, 2, "ok", 54.0),
        L("c6", "1gbit", BERT, "wfbp", "a2a", 4, 0, "ok", 180.0,
          timeline=_timeline(0.5, 0.375, 0.0, 0.0, 0.0625, observed=False)),
        L("c6", "1gbit", BERT, "wfbp", "a2a", 4, 1, "timeout"),
        L("c6", "1gbit", BERT, "wfbp", "a2a", 4, 2, "ok", 180.0),
        L("c8", "1gbit", BERT, "bspps", "ps", 4, 0, "timeout"),
        L("c8", "1gbit", BERT, "bspps", "ps", 4, 1, "timeout"),
        L("c8", "1gbit", BERT, "bspps", "ps", 4, 2, "timeout"),
        # try 2 of c1 run again with --rerun-failed: the later attempt counts
        L("c1", "rdma0", R50, "wfbp", "a2a", 1, 2, "ok", 250.0, attempt=2, seconds=11.0),
    ]
    with open(os.path.join(folder, "results.jsonl"), "w") as f:
        for e in lines:
            f.write(json.dumps(e) + "\n")
        f.write('{"kind": "try", "hash": "c7", "tr')  # a line cut short by a crash
    return folder


EXPECTED_TABLE = """\
| DNN | BS | CONNECTION | METHOD | 1 GPU | 4 GPUs |
| --- | --- | --- | --- | --- | --- |
| ResNet-50 | 64 | 10GbE with TCP/IP | wfbp | 250.0 +- 0.00 | 1000.0 +- 81.65 |
| ResNet-50 | 64 | 10GbE with TCP/IP | bspps | 250.0 +- 10.80 | 800.0 +- 0.00 (1/3 ok) |
| BERT-Large | 8 | 1gbit (emulated) | wfbp | 52.0 +- 1.63 | 180.0 +- 0.00 |
| BERT-Large | 8 | 1gbit (emulated) | bspps | - | timeout |
"""
# Issue 19's medians and 95% intervals, by hand: 3 successful tries give [min, max] (a
# resampled median of 3 is the smallest value with probability 7/27); c4 (1 try) and c6 (2)
# have no per-round figures in their records: no interval. At 1 GPU on rdma0 wfbp's [250, 250]
# lies inside bspps's [240, 265]: tied.
EXPECTED_INTERVALS = """\
Median [95% interval]; (tied): not told apart from the best (README.md: how)
| DNN | BS | CONNECTION | METHOD | 1 GPU | 4 GPUs |
| --- | --- | --- | --- | --- | --- |
| ResNet-50 | 64 | 10GbE with TCP/IP | wfbp | 250.0 [250.0, 250.0] (tied) | 1000.0 [900.0, 1100.0] |
| ResNet-50 | 64 | 10GbE with TCP/IP | bspps | 245.0 [240.0, 265.0] (tied) | 800.0 [-] (1/3 ok) |
| BERT-Large | 8 | 1gbit (emulated) | wfbp | 52.0 [50.0, 54.0] | 180.0 [-] |
| BERT-Large | 8 | 1gbit (emulated) | bspps | - | timeout |
"""
EXPECTED_SPEEDUP = """\
| DNN | BS | CONNECTION | METHOD | 4 GPUs |
| --- | --- | --- | --- | --- |
| ResNet-50 | 64 | 10GbE with TCP/IP | wfbp | 4.00x (100.0%) |
| ResNet-50 | 64 | 10GbE with TCP/IP | bspps | - |
| BERT-Large | 8 | 1gbit (emulated) | wfbp | 3.46x (86.5%) |
| BERT-Large | 8 | 1gbit (emulated) | bspps | - |
"""
# Where the time goes: c2 the mean of its two tries with a timeline (iteration 625 ms, hidden
# 125 of 375 ms of communication: 33%), c6 one try whose communication is not observed.
EXPECTED_TIMES = """\
| DNN | BS | CONNECTION | METHOD | GPUs | iteration ms | compute ms | communication ms | exposed ms | hidden |
| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |
| ResNet-50 | 64 | 10GbE with TCP/IP | wfbp | 4 | 625.0 | 250.0 | 375.0 | 312.5 | 33% |
| BERT-Large | 8 | 1gbit (emulated) | wfbp | 4 | 500.0 | 375.0 | not observed | 62.5 | - |
"""
_H = ("network,connection,model,batch_size,method,architecture,engine,nworkers,try,attempt,"
      "status,throughput,throughput_std,unit,seconds,reason,hash,log,iteration_ms,compute_ms,"
      "comm_ms,exposed_ms,overlap,comm_observed,trace,cell_median,cell_low,cell_high,"
      "cell_interval,cell_standing")
_NT = ",,,,,,,"  # no timeline
# each cell's median, 95% interval, its basis and standing, as EXPECTED_INTERVALS has them
_C = {"c1": ",250.0,250.0,250.0,tries,tied", "c2": ",1000.0,900.0,1100.0,tries,",
      "c3": ",245.0,240.0,265.0,tries,tied", "c4": ",800.0,,,,", "c5": ",52.0,50.0,54.0,tries,",
      "c6": ",180.0,,,,", "c8": ",,,,,"}
_R = "rdma0,10GbE with TCP/IP,resnet50,64"
_B = "1gbit,1gbit (emulated),bert,8"
EXPECTED_CSV = "\n".join([
    _H,
    f"{_R},wfbp,a2a,torch,1,0,1,ok,250.0,1.5,img/sec,10.0,,c1,logs/hand/c1_try0.log{_NT}{_C['c1']}",
    f"{_R},wfbp,a2a,torch,1,1,1,ok,250.0,1.5,img/sec,10.0,,c1,logs/hand/c1_try1.log{_NT}{_C['c1']}",
    f"{_R},wfbp,a2a,torch,1,2,2,ok,250.0,1.5,img/sec,11.0,,c1,logs/hand/c1_try2.log{_NT}{_C['c1']}",
    f"{_R},wfbp,a2a,torch,4,0,1,ok,900.0,1.5,img/sec,10.0,,c2,logs/hand/c2_try0.log,500.0,250.0,250.0,187.5,0.5,true,"
    f"records/c2_try0.trace.json{_C['c2']}",
    f"{_R},wfbp,a2a,torch,4,1,1,ok,1000.0,1.5,img/sec,10.0,,c2,logs/hand/c2_try1.log,750.0,250.0,500.0,437.5,0.25,true,{_C['c2']}",
    f"{_R},wfbp,a2a,torch,4,2,1,ok,1100.0,1.5,img/sec,10.0,,c2,logs/hand/c2_try2.log{_NT}{_C['c2']}",
    f"{_R},bspps,ps,torch,1,0,1,ok,240.0,1.5,img/sec,10.0,,c3,logs/hand/c3_try0.log{_NT}{_C['c3']}",
    f"{_R},bspps,ps,torch,1,1,1,ok,245.0,1.5,img/sec,10.0,,c3,logs/hand/c3_try1.log{_NT}{_C['c3']}",
    f"{_R},bspps,ps,torch,1,2,1,ok,265.0,1.5,img/sec,10.0,,c3,logs/hand/c3_try2.log{_NT}{_C['c3']}",
    f"{_R},bspps,ps,torch,4,0,1,ok,800.0,1.5,img/sec,10.0,,c4,logs/hand/c4_try0.log{_NT}{_C['c4']}",
    f"{_R},bspps,ps,torch,4,1,1,failed,,,img/sec,10.0,exit code 1,c4,logs/hand/c4_try1.log{_NT}{_C['c4']}",
    f"{_R},bspps,ps,torch,4,2,1,failed,,,img/sec,10.0,exit code 1,c4,logs/hand/c4_try2.log{_NT}{_C['c4']}",
    f"{_B},wfbp,a2a,torch,1,0,1,ok,50.0,1.5,sen/sec,10.0,,c5,logs/hand/c5_try0.log{_NT}{_C['c5']}",
    f"{_B},wfbp,a2a,torch,1,1,1,ok,52.0,1.5,sen/sec,10.0,,c5,logs/hand/c5_try1.log{_NT}{_C['c5']}",
    f"{_B},wfbp,a2a,torch,1,2,1,ok,54.0,1.5,sen/sec,10.0,,c5,logs/hand/c5_try2.log{_NT}{_C['c5']}",
    f"{_B},wfbp,a2a,torch,4,0,1,ok,180.0,1.5,sen/sec,10.0,,c6,logs/hand/c6_try0.log,500.0,375.0,0.0,62.5,,false,{_C['c6']}",
    f"{_B},wfbp,a2a,torch,4,1,1,timeout,,,sen/sec,10.0,killed after 600 s,c6,logs/hand/c6_try1.log{_NT}{_C['c6']}",
    f"{_B},wfbp,a2a,torch,4,2,1,ok,180.0,1.5,sen/sec,10.0,,c6,logs/hand/c6_try2.log{_NT}{_C['c6']}",
    f"{_B},bspps,ps,torch,4,0,1,timeout,,,,10.0,killed after 600 s,c8,logs/hand/c8_try0.log{_NT}{_C['c8']}",
    f"{_B},bspps,ps,torch,4,1,1,timeout,,,,10.0,killed after 600 s,c8,logs/hand/c8_try1.log{_NT}{_C['c8']}",
    f"{_B},bspps,ps,torch,4,2,1,timeout,,,,10.0,killed after 600 s,c8,logs/hand/c8_try2.log{_NT}{_C['c8']}",
]) + "\n"


def test_report_from_a_hand_written_store_is_exact(tmp_path, capsys):
    folder = hand_written_store(str(tmp_path / "hand"))
    assert benchmarks.main(["report", folder]) == 0
    out = capsys.readouterr().out
    assert out == EXPECTED_TABLE + "\n" + EXPECTED_INTERVALS + "\n" + EXPECTED_SPEEDUP
    readme = open(os.path.join(folder, "README.md")).read()
    assert EXPECTED_TABLE in readme and EXPECTED_SPEEDUP in readme
    assert EXPECTED_INTERVALS.split("\n", 1)[1] in readme
    assert ("4 rows x 2 worker counts, 3 tries per cell: 15 tries ok, 2 failed, 4 timed out, "
            "3 not run.") in readme
    assert "1 try of other configurations of the same cells" in readme
    assert "1 unreadable line(s) in the store were skipped." in readme
    assert ("| rdma0_resnet50_bspps_n4 | 1 | failed | exit code 1 | `RuntimeError: boom` | "
            "logs/hand/c4_try1.log |") in readme
    assert open(os.path.join(folder, "results.csv")).read() == EXPECTED_CSV
    assert EXPECTED_TIMES in readme
    plots = sorted(os.listdir(os.path.join(folder, "plots")))
    assert plots == ["1gbit_bert-bs8-len64_efficiency.png", "1gbit_bert-bs8-len64_throughput.png",
                     "1gbit_bert-bs8-len64_time.png",
                     "rdma0_resnet50-bs64_efficiency.png", "rdma0_resnet50-bs64_throughput.png",
                     "rdma0_resnet50-bs64_time.png"]
    for p in plots:
        with open(os.path.join(folder, "plots", p), "rb") as f:
            data = f.read()
        assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 10_000, p
        assert f"(plots/{p})" in readme
    manifest = json.load(open(os.path.join(folder, "manifest.json")))
    assert manifest["sweep"]["name"] == "hand"
    assert manifest["git_commits"] == ["abc123"]
    assert manifest["environments"] == [{"device": "cuda:0", "torch": "2.14.1",
                                         "hosts": ["gpu1"], "git_commit": "abc123",
                                         "tries": 15}]
    assert manifest["tries"] == {"ok": 15, "failed": 2, "timeout": 4, "not run": 3}
    # Regenerating gives the same files.
    before = {f: open(os.path.join(folder, f)).read() for f in ("README.md", "results.csv")}
    assert benchmarks.main(["report", os.path.join(folder, "results.jsonl"), "--quiet"]) == 0
    assert {f: open(os.path.join(folder, f)).read() for f in before} == before


# The original's results README (its plots.py layout: two spaces before DNN, 14 dashes and a
# trailing blank per column, 'mean +- std' with 3 and 2 decimals, the figures block), checked by
# hand from the store above: the 1-GPU column is one figure per task, as the original's, the
# mean of the 1-worker tries of the all-to-all rows (wfbp: 250, 250, 250 and 50, 52, 54).
EXPECTED_ORIGINAL = """\
# Results generated on 2026-12-01

|  DNN | BS | CONNECTION | METHOD | 1 GPU | 4 GPUs |
|-------------- | -------------- | -------------- | -------------- | -------------- | -------------- | 
| ResNet-50 | 64 | 10GbE with TCP/IP | WFBP-A2A | 250.0 | 1000.000 +- 81.65 | 
| ResNet-50 | 64 | 10GbE with TCP/IP | BSP-PS | 250.0 | 800.000 +- 0.00 (1/3 ok) | 
| BERT-Large | 8 | 1gbit (emulated) | WFBP-A2A | 52.0 | 180.000 +- 0.00 | 
| BERT-Large | 8 | 1gbit (emulated) | BSP-PS | 52.0 | timeout | 

# Figures
<div align="center">
<img src="./a.png" align=center/>
</div>"""


def test_the_original_layout_from_a_hand_written_store_is_exact(tmp_path):
    from ddlbench.sweep import aggregate, report
    folder = hand_written_store(str(tmp_path / "hand"))
    table = aggregate.load(folder)
    assert report.original_table(table, "2026-12-01", ["a.png"]) == EXPECTED_ORIGINAL
    report.write_all(folder, plots=False)  # the report writes it in original/, dated today
    text = open(os.path.join(folder, "original", "README.md")).read()
    assert text.splitlines()[2:8] == EXPECTED_ORIGINAL.splitlines()[2:8]
    assert text.startswith("# Results generated on 20")


def two_network_store(folder):
    """The store above plus ResNet-50 on rdma2 (listed first in the sweep), so that one task
    has results on two networks: wfbp 250 at 1 GPU and 2000 +- 163.30 at 4, bspps 250 and
    1600 (on rdma0 its 4-GPU cell has too few successful tries)."""
    hand_written_store(folder)
    path = os.path.join(folder, "results.jsonl")
    lines = open(path).read().splitlines()[:-1]  # without the torn line
    header = json.loads(lines[0])
    header["networks"].insert(0, {"name": "rdma2", "kind": "rdma", "profile": 2})
    header["cells"] += ["d1", "d2", "d3", "d4"]
    extra = [_line("d1", "rdma2", R50, "wfbp", "a2a", 1, i, "ok", 250.0) for i in range(3)]
    extra += [_line("d2", "rdma2", R50, "wfbp", "a2a", 4, i, "ok", v)
              for i, v in enumerate((1800.0, 2000.0, 2200.0))]
    extra += [_line("d3", "rdma2", R50, "bspps", "ps", 1, i, "ok", 250.0) for i in range(3)]
    extra += [_line("d4", "rdma2", R50, "bspps", "ps", 4, i, "ok", 1600.0) for i in range(3)]
    with open(path, "w") as f:
        f.write("\n".join([json.dumps(header)] + lines[1:] + [json.dumps(e) for e in extra])
                + "\n")
    return folder


def _linked(folder, text):
    """The figures the original's README links, each a file beside it (as the original's)."""
    import re
    links = re.findall(r'<img src="\./([^"]+)" align=center/>', text)
    assert links and all(os.path.isfile(os.path.join(folder, "original", p)) for p in links), \
        links
    return links


def test_original_figures_one_network_per_task(tmp_path):
    """The original's figures beside its README (original/), in its names:
    '<dnn>_<bs>-rdma<r>.png' (an emulated network by its name); no compare_rdma figure when
    each task ran on one network, and the README says so instead of linking one."""
    from ddlbench.sweep import aggregate, plots
    folder = hand_written_store(str(tmp_path / "hand"))
    report.write_all(folder)
    assert sorted(os.listdir(os.path.join(folder, "original"))) == \
        ["README.md", "bert_8-1gbit.png", "resnet50_64-rdma0.png"]
    assert not os.path.exists(os.path.join(folder, "original.md"))
    text = open(os.path.join(folder, "original", "README.md")).read()
    assert _linked(folder, text) == ["resnet50_64-rdma0.png",
                                     "bert_8-1gbit.png"]
    assert "plots/" not in text and "compare_rdma.png" not in text
    assert "resnet50_64: no comparison figure, its results are on one network only (rdma0)." \
        in text
    assert "bert_8: no comparison figure, its results are on one network only (1gbit)." in text
    # What the figures plot is the table's cells: a marked cell (bspps, 1/3 ok) is left out.
    t = aggregate.load(folder)
    groups = dict(plots.original_groups(t))
    assert list(groups) == ["resnet50_64-rdma0.png", "bert_8-1gbit.png"]
    assert plots.original_series(groups["resnet50_64-rdma0.png"]) == \
        {"WFBP-A2A": [(4, 1000.0, pytest.approx(81.6497, abs=1e-3))]}
    assert plots.original_series(groups["bert_8-1gbit.png"]) == {"WFBP-A2A": [(4, 180.0, 0.0)]}
    # the labels: over the task's one 1-GPU figure (250: wfbp's 1-worker tries)
    assert plots.original_singles(t) == {"resnet50_64": 250.0, "bert_8": 52.0}
    assert plots.original_speedups(groups["resnet50_64-rdma0.png"], 250.0) == \
        {4: ("WFBP-A2A", 4.0)}
    assert plots.compare_series(t) == {}
    for p in os.listdir(os.path.join(folder, "original")):
        if p == "README.md":
            continue
        with open(os.path.join(folder, "original", p), "rb") as f:
            assert f.read(8) == b"\x89PNG\r\n\x1a\n"


def test_original_figures_and_compare_rdma_with_two_networks(tmp_path):
    from ddlbench.sweep import plots
    folder = two_network_store(str(tmp_path / "two"))
    t = report.write_all(folder)
    assert sorted(os.listdir(os.path.join(folder, "original"))) == \
        ["README.md", "bert_8-1gbit.png", "resnet50_64-compare_rdma.png",
         "resnet50_64-rdma0.png", "resnet50_64-rdma2.png"]
    groups = dict(plots.original_groups(t))
    assert list(groups) == ["resnet50_64-rdma2.png", "resnet50_64-rdma0.png",
                            "bert_8-1gbit.png"]
    assert plots.original_series(groups["resnet50_64-rdma2.png"]) == \
        {"WFBP-A2A": [(4, 2000.0, pytest.approx(163.299, abs=1e-3))],
         "BSP-PS": [(4, 1600.0, 0.0)]}
    assert plots.original_singles(t) == {"resnet50_64": 250.0, "bert_8": 52.0}
    assert plots.original_speedups(groups["resnet50_64-rdma2.png"], 250.0) == \
        {4: ("WFBP-A2A", 8.0)}
    # compare_rdma's order is 10GbE (rdma0) before 100GbE (rdma2), whatever the sweep's order;
    # BSP-PS has no ratio: its rdma0 cell has too few successful tries.
    assert plots.networks_by_task(t) == {"resnet50_64": ["rdma0", "rdma2"], "bert_8": ["1gbit"]}
    assert plots.compare_series(t) == \
        {"resnet50_64": [("rdma0", "rdma2", {"WFBP-A2A": [(4, 2.0)]})]}
    text = open(os.path.join(folder, "original", "README.md")).read()
    assert _linked(folder, text) == ["resnet50_64-rdma2.png",
                                     "resnet50_64-rdma0.png",
                                     "bert_8-1gbit.png",
                                     "resnet50_64-compare_rdma.png"]
    assert "| WFBP-A2A | 100GbE with TCP/IP / 10GbE with TCP/IP | 2.000 | " in text
    assert "bert_8: no comparison figure, its results are on one network only (1gbit)." in text
    # Remade from a store with one network left: the old comparison figure goes.
    entries, _ = store.read(os.path.join(folder, "results.jsonl"))
    report.write_all(folder, entries=[e for e in entries if e.get("kind") != "try"
                                      or e["config"]["network"]["name"] == "rdma2"])
    assert sorted(os.listdir(os.path.join(folder, "original"))) == \
        ["README.md", "resnet50_64-rdma2.png"]
    text = open(os.path.join(folder, "original", "README.md")).read()
    assert _linked(folder, text) == ["resnet50_64-rdma2.png"]
    assert "compare_rdma.png" not in text


def test_median_and_olympic_aggregation(tmp_path, capsys):
    folder = hand_written_store(str(tmp_path / "hand"))
    assert benchmarks.main(["report", folder, "--aggregate", "median", "--no-plots"]) == 0
    out = capsys.readouterr().out
    assert "| ResNet-50 | 64 | 10GbE with TCP/IP | bspps | 245.0 +- 10.80 | 800.0 +- 0.00 (1/3 ok) |" in out
    assert "| ResNet-50 | 64 | 10GbE with TCP/IP | wfbp | 250.0 +- 0.00 | 1000.0 +- 81.65 |" in out
    assert benchmarks.main(["report", folder, "--aggregate", "olympic", "--no-plots"]) == 0
    out = capsys.readouterr().out
    # fastest and slowest dropped: [900, 1000, 1100] -> 1000; [240, 245, 265] -> 245
    assert "| ResNet-50 | 64 | 10GbE with TCP/IP | wfbp | 250.0 +- 0.00 | 1000.0 +- 0.00 |" in out
    assert "| ResNet-50 | 64 | 10GbE with TCP/IP | bspps | 245.0 +- 0.00 | 800.0 +- 0.00 (1/3 ok) |" in out
    # two successful tries are too few to drop two: marked, and out of the speedups
    assert "| BERT-Large | 8 | 1gbit (emulated) | wfbp | 52.0 +- 0.00 | 180.0 +- 0.00 (2/3 ok) |" in out
    assert "| BERT-Large | 8 | 1gbit (emulated) | wfbp | - |" in out
    assert benchmarks.main(["report", folder, "--min-ok", "1", "--no-plots"]) == 0
    out = capsys.readouterr().out
    assert "| ResNet-50 | 64 | 10GbE with TCP/IP | bspps | 250.0 +- 10.80 | 800.0 +- 0.00 |" in out
    assert "| ResNet-50 | 64 | 10GbE with TCP/IP | bspps | 3.20x (80.0%) |" in out


def test_engines_side_by_side_without_one_worker_cells(tmp_path, capsys):
    """A sweep over engines at one worker count: the engine ratio table, exact, and no
    speedup table (nothing to divide by) but a line saying why."""
    folder = str(tmp_path / "eng")
    os.makedirs(folder)
    header = {"kind": "sweep", "name": "eng", "tries": 2, "min_ok": 2, "aggregate": "mean",
              "networks": [{"name": "rdma0", "kind": "rdma", "profile": 0}], "tasks": [R50],
              "methods": [{"method": "wfbp"}, {"method": "fusion"}],
              "engines": ["torch", "horovod"], "nworkers": [4],
              "cells": ["t1", "h1", "t2", "h2"]}
    L = _line
    lines = [header,
             L("t1", "rdma0", R50, "wfbp", "a2a", 4, 0, "ok", 900.0),
             L("t1", "rdma0", R50, "wfbp", "a2a", 4, 1, "ok", 1100.0),
             L("h1", "rdma0", R50, "wfbp", "a2a", 4, 0, "ok", 800.0, engine="horovod"),
             L("h1", "rdma0", R50, "wfbp", "a2a", 4, 1, "ok", 800.0, engine="horovod"),
             L("t2", "rdma0", R50, "fusion", "a2a", 4, 0, "ok", 1200.0),
             L("t2", "rdma0", R50, "fusion", "a2a", 4, 1, "ok", 1200.0),
             L("h2", "rdma0", R50, "fusion", "a2a", 4, 0, "ok", 1000.0, engine="horovod"),
             L("h2", "rdma0", R50, "fusion", "a2a", 4, 1, "failed", engine="horovod")]
    with open(os.path.join(folder, "results.jsonl"), "w") as f:
        f.writelines(json.dumps(e) + "\n" for e in lines)
    assert benchmarks.main(["report", folder]) == 0
    out = capsys.readouterr().out
    # No 1-worker cells: a throughput plot, and no (empty) efficiency plot.
    assert os.listdir(os.path.join(folder, "plots")) == ["rdma0_resnet50-bs64_throughput.png"]
    ratios = ("| DNN | BS | CONNECTION | METHOD | VS | 4 GPUs |\n"
              "| --- | --- | --- | --- | --- | --- |\n"
              "| ResNet-50 | 64 | 10GbE with TCP/IP | wfbp | horovod | 1.25 |\n"
              "| ResNet-50 | 64 | 10GbE with TCP/IP | fusion | horovod | - |\n")
    assert ratios in out and "wfbp (horovod) | 800.0 +- 0.00 |" in out
    readme = open(os.path.join(folder, "README.md")).read()
    assert "## Engines side by side" in readme and ratios in readme
    assert "## Speedup" not in readme and "no 1-worker cells" in readme


def test_store_appends_after_a_torn_line(tmp_path):
    path = str(tmp_path / "results.jsonl")
    store.append(path, {"kind": "try", "hash": "a", "try": 0, "status": "ok"})
    with open(path, "a") as f:
        f.write('{"kind": "try", "hash": "b", "tr')  # the writer died mid-line
    store.append(path, {"kind": "try", "hash": "c", "try": 0, "status": "ok"})
    entries, bad = store.read(path)
    assert [e["hash"] for e in entries] == ["a", "c"] and bad == 1


# ---------------------------------------------------------------------------- running sweeps

def test_sweep_runs_every_try_once_and_resumes_into_a_new_folder_when_complete(tmp_path, fake,
                                                                             capsys):
    cfg = write_config(tmp_path)
    assert benchmarks.main(["--config", str(cfg), "--progress", "bar"]) == 0
    cap = capsys.readouterr()
    [folder] = folders(tmp_path)
    assert os.path.basename(folder) == time.strftime("%Y-%m-%d") + "-t"
    lines = try_lines(folder)
    assert len(lines) == 8 and all(e["status"] == "ok" for e in lines)
    assert collections.Counter((e["hash"], e["try"]) for e in lines).most_common(1)[0][1] == 1
    assert len(fake()) == 8
    # the progress bar (tqdm) with its counts; the tables on stdout
    assert "done 8, failed 0, skipped 0" in cap.err and "8/8" in cap.err
    table = open(os.path.join(folder, "README.md")).read()
    assert report.throughput_table(report.build(store.read(
        os.path.join(folder, "results.jsonl"))[0])) in cap.out
    assert "| ResNet-18 | 4 | local | wfbp | 140.0 +- 0.00 | 252.0 +- 0.00 |" in table
    for e in lines:
        assert os.path.exists(e["log"]) and e["record"]["config"]["nworkers"] == \
            e["config"]["nworkers"]
        assert e["log_total"]["value"] == pytest.approx(e["throughput"], abs=0.05)
    # Started again: everything is done, so a new dated folder starts; --results resumes one.
    assert benchmarks.main(["--config", str(cfg), "--quiet"]) == 0
    assert len(folders(tmp_path)) == 2 and folders(tmp_path)[1].endswith(".2-t")
    assert len(fake()) == 16
    assert benchmarks.main(["--config", str(cfg), "--quiet", "--results", folder]) == 0
    assert len(fake()) == 16 and len(try_lines(folder)) == 8


def test_only_and_dry_run(tmp_path, fake, capsys):
    cfg = write_config(tmp_path, methods=["wfbp", "fusion", "ddp"], nworkers=[1, 2, 4],
                       tries=1, estimate_s=7)
    assert benchmarks.main(["--config", str(cfg), "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "9 to run, 0 already done" in out
    assert "estimated time: 1 min 03 s for 9 runs (0 from this store's history, 9 guessed" in out
    assert "local_resnet18-bs4-px32_ddp_n4 try 0:" in out and "--nworkers 4" in out
    assert not (tmp_path / "results").exists() and not (tmp_path / "logs").exists()
    assert fake() == []
    assert benchmarks.main(["--config", str(cfg), "--quiet",
                            "--only", "method=wfbp|ddp,nworkers>=2"]) == 0
    assert sorted(fake()) == ["ddp 2", "ddp 4", "wfbp 2", "wfbp 4"]
    capsys.readouterr()
    # the rest of the sweep, estimated from the history of the runs so far
    assert benchmarks.main(["--config", str(cfg), "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "5 to run, 4 already done" in out and "(5 from this store's history, 0 guessed" in out
    for bad, msg in [("colour=red", "unknown axis 'colour'"), ("nworkers>x", "takes integers"),
                     ("method>2", "needs a numeric axis"), ("method=nosuch", "matches no cell")]:
        assert benchmarks.main(["--config", str(cfg), "--only", bad]) == 2
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and msg in err, err


def test_an_rdma_network_runs_on_its_own_host_files(tmp_path, fake, capsys):
    """{rdma: 0, hostfile: F}: its cells go through the shell launcher on F's hosts ({nworkers}
    filled in), checked before anything starts; the sweep's hostfile stays for other networks."""
    (tmp_path / "hosts2").write_text("localhost slots=2\n")
    own = {"rdma": 0, "hostfile": str(tmp_path / "hosts{nworkers}")}
    cfg = write_config(tmp_path, networks=[own, "rdma2"], methods=["wfbp"], nworkers=[2],
                       tries=1)
    assert benchmarks.main(["--config", str(cfg), "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert f"hostfile={tmp_path}/hosts2 " in out and "rdma=0 " in out
    assert f"hostfile={REPO}/configs/cluster2 " in out and "rdma=2 " in out
    cfg = write_config(tmp_path, networks=[own], methods=["wfbp"], nworkers=[2, 4], tries=1)
    assert benchmarks.main(["--config", str(cfg), "--dry-run"]) == 2
    assert f"host file {tmp_path}/hosts4 not found" in capsys.readouterr().err
    cfg = write_config(tmp_path, networks=[{"net": "1gbit", "hostfile": "x"}], tries=1)
    assert benchmarks.main(["--config", str(cfg), "--dry-run"]) == 2
    assert "hostfile is a path (may contain {nworkers}) for an rdma network" in \
        capsys.readouterr().err
    assert fake() == []


def test_skip_leaves_out_the_cells_its_expressions_match(tmp_path, fake, capsys):
    """A sweep file's skip: (--only expressions, any of which drops a cell): here 1 worker only
    for the methods of the noise floor, on the loopback only."""
    cfg = write_config(tmp_path, networks=["local", "loopback"], nworkers=[1, 2], tries=1,
                       methods=["wfbp", "fusion", "bspa2a"],
                       skip=["nworkers=1,network!=local", "nworkers=1,method=bspa2a"])
    assert sorted(c.name for c in config.load(str(cfg)).cells()) == sorted(
        [f"local_resnet18-bs4-px32_{m}_n1" for m in ("wfbp", "fusion")]
        + [f"{net}_resnet18-bs4-px32_{m}_n2" for net in ("local", "loopback")
           for m in ("wfbp", "fusion", "bspa2a")])
    assert benchmarks.main(["--config", str(cfg), "--quiet"]) == 0
    twice = ["wfbp 2", "fusion 2", "bspa2a 2"] * 2
    assert sorted(fake()) == sorted(["wfbp 1", "fusion 1", *twice])
    for skip, msg in [(["nworkers>x"], "skip entry 'nworkers>x': nworkers takes integers"),
                      ("colour=red", "skip entry 'colour=red': unknown axis 'colour'"),
                      ([3], "skip must be a list of --only expressions"),
                      (["nworkers>=1"], "skip leaves no cell to run")]:
        with pytest.raises(UsageError, match=re.escape(msg)):
            config.load(str(write_config(tmp_path, skip=skip)))


def test_threads_reach_every_run_and_profile_and_the_cell_hash(tmp_path):
    from ddlbench.sweep import calibrate
    plain = config.load(str(write_config(tmp_path, name="p", networks=["loopback"])))
    one = config.load(str(write_config(tmp_path, name="o", networks=["loopback"], threads=1)))
    for c_plain, c_one in zip(plain.cells(), one.cells()):
        cmd = runner.command(one, c_one, "r.json")[0]
        assert cmd[cmd.index("--threads") + 1] == "1", cmd
        assert "--threads" not in runner.command(plain, c_plain, "r.json")[0]
        assert c_one.config()["threads"] == 1 and "threads" not in c_plain.config()
        assert c_one.hash != c_plain.hash
    profiles = [j for j in calibrate.jobs(one.cells())[0] if j.kind == "profile"]
    assert [j.name for j in profiles] == ["resnet18-bs4-px32_n1_t1.profile",
                                          "loopback_resnet18-bs4-px32_n2_t1.profile"]
    for cmd in (j.command("p.json") for j in profiles):
        assert cmd[cmd.index("--threads") + 1] == "1", cmd
    for bad in (0, "two", True):
        with pytest.raises(UsageError, match=f"threads must be a positive integer, got {bad!r}"):
            config.load(str(write_config(tmp_path, threads=bad)))


def test_crash_is_recorded_and_rerun_failed_runs_only_it(tmp_path, fake, monkeypatch, capsys):
    cfg = write_config(tmp_path, methods=["wfbp", "tests.broken_methods:Crash"], nworkers=[1],
                       tries=2)
    assert benchmarks.main(["--config", str(cfg), "--quiet"]) == 1
    err = capsys.readouterr().err
    assert "2 tries of this sweep failed or timed out" in err
    [folder] = folders(tmp_path)
    crashed = [e for e in try_lines(folder) if e["status"] != "ok"]
    assert [(e["label"], e["try"], e["status"], e["reason"]) for e in crashed] == [
        ("tests.broken_methods:Crash", 0, "failed", "exit code 1"),
        ("tests.broken_methods:Crash", 1, "failed", "exit code 1")]
    assert all("RuntimeError: test-crash: deliberate failure" in e["log_tail"] for e in crashed)
    readme = open(os.path.join(folder, "README.md")).read()
    assert "| tests.broken_methods:Crash | failed |" in readme
    assert "`RuntimeError: test-crash: deliberate failure`" in readme
    assert len(fake()) == 4
    # fixed: --rerun-failed runs the two failed tries and nothing else
    monkeypatch.setenv("FAKE_TRAIN_FIXED", "1")
    assert benchmarks.main(["--config", str(cfg), "--quiet", "--rerun-failed"]) == 0
    calls = fake()
    assert calls[4:] == ["tests.broken_methods:Crash 1"] * 2
    assert folders(tmp_path) == [folder]
    lines = try_lines(folder)
    assert len(lines) == 6
    eff = store.latest(lines)
    assert len(eff) == 4 and all(e["status"] == "ok" for e in eff.values())
    assert sorted(e["attempt"] for e in eff.values()) == [1, 1, 2, 2]
    readme = open(os.path.join(folder, "README.md")).read()
    assert "## Failed tries" not in readme and "4 tries ok, 0 failed" in readme


def test_hanging_run_is_killed_at_its_timeout_with_nothing_left(tmp_path, fake, capsys):
    cfg = write_config(tmp_path, methods=["tests.broken_methods:Hang", "wfbp"], nworkers=[3],
                       tries=1, timeout=3, kill_grace=1)
    start = time.monotonic()
    assert benchmarks.main(["--config", str(cfg), "--quiet"]) == 1
    took = time.monotonic() - start
    [folder] = folders(tmp_path)
    by_label = {e["label"]: e for e in try_lines(folder)}
    hang = by_label["tests.broken_methods:Hang"]
    assert hang["status"] == "timeout" and hang["reason"] == "killed after 3 s"
    assert 3 <= hang["seconds"] < 12 and took < 30
    assert "Running warmup..." in hang["log_tail"]
    assert any("stopped the run's process group (3 process(es))" in ln
               for ln in hang["log_tail"])
    assert by_label["wfbp"]["status"] == "ok"
    # the launcher and both workers ignored SIGTERM; SIGKILL of the group got them all
    assert leftovers(str(tmp_path)) == []
    assert "| ResNet-18 | 4 | local | tests.broken_methods:Hang | timeout |" in \
        open(os.path.join(folder, "README.md")).read()


def test_sigkill_mid_run_then_restart_gives_one_record_per_try(tmp_path):
    cfg = write_config(tmp_path, methods=["wfbp", "fusion"], nworkers=[1, 3], tries=2)
    run_env = env(**{config.PROGRAM_ENV: FAKE, "FAKE_TRAIN_SECONDS": "0.8",
                     "FAKE_TRAIN_CALLS": str(tmp_path / "calls.txt")})
    cmd = [sys.executable, "benchmarks.py", "--config", str(cfg), "--quiet"]
    proc = subprocess.Popen(cmd, cwd=REPO, env=run_env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    folder = None
    while time.monotonic() < deadline:
        found = folders(tmp_path)
        if found:
            folder = found[0]
            n = len(try_lines(folder)) if os.path.exists(os.path.join(folder, "results.jsonl")) else 0
            inflight = os.path.join(folder, "inflight.json")
            if n >= 3 and os.path.exists(inflight) and \
                    json.load(open(inflight))["cell"].endswith("_n3"):
                break
        time.sleep(0.05)
    else:
        proc.kill()
        pytest.fail("the sweep never reached its fourth run: " + proc.communicate()[1])
    time.sleep(0.3)  # well inside the run (it takes 0.8 s)
    proc.send_signal(signal.SIGKILL)
    proc.communicate()
    before = try_lines(folder)
    assert 3 <= len(before) < 8
    restarted = subprocess.run(cmd, cwd=REPO, env=run_env, capture_output=True, text=True,
                               timeout=180)
    assert restarted.returncode == 0, describe(restarted)
    assert folders(tmp_path) == [folder]  # resumed, not a new folder
    after = try_lines(folder)
    assert after[:len(before)] == before  # nothing recorded was lost or changed
    keys = [(e["hash"], e["try"]) for e in after]
    assert len(keys) == 8 and len(set(keys)) == 8  # exactly one record per try
    assert leftovers(str(tmp_path)) == []
    # The same report as an uninterrupted sweep of the same cells.
    other = tmp_path / "other"
    other.mkdir()
    cfg2 = write_config(other, methods=["wfbp", "fusion"], nworkers=[1, 3], tries=2)
    clean = subprocess.run([sys.executable, "benchmarks.py", "--config", str(cfg2), "--quiet"],
                           cwd=REPO, env=dict(run_env, FAKE_TRAIN_SECONDS="0"),
                           capture_output=True, text=True, timeout=180)
    assert clean.returncode == 0, describe(clean)
    [folder2] = folders(other)

    def tables(f):
        text = open(os.path.join(f, "README.md")).read()
        return text.split("## Plots")[0]
    assert tables(folder) == tables(folder2)
    assert "8 tries ok, 0 failed, 0 timed out, 0 not run" in tables(folder)


# ------------------------------------------------------------------------- bad sweep files

def test_every_problem_is_listed_and_nothing_starts(tmp_path, fake, capsys):
    cfg = write_config(
        tmp_path, colour="red", nworkers=[0, 2, 3], tries=0,
        engines=["torch", "mxnet", "byteps"],
        networks=["local", {"rdma": 7}, {"net": "5gbit", "speed": 1}],
        methods=["wfbp", "nosuch", {"method": "bspps", "compressor": "topk"},
                 {"method": "wfbp", "credit": 5},
                 {"method": "bytescheduler", "compressor": "powersgd"}],
        tasks=[{"model": "nonet", "batch_size": -1, "pixels": 3}],
        timing={"warmup": 1, "rounds": 3}, timeline="yes")
    assert benchmarks.main(["--config", str(cfg)]) == 2
    cap = capsys.readouterr()
    err = cap.err.strip()
    assert len(err.splitlines()) == 1 and err.startswith("benchmarks.py: error: ")
    expected = ["unknown key 'colour'", "nworkers entry 0", "tries must be a positive",
                "engine 'mxnet'", "rdma must be 0", "unknown key 'speed'",
                "unknown method 'nosuch'", "unknown model 'nonet'",
                "batch_size must be a positive integer", "unknown key 'pixels'",
                "timing: unknown key 'rounds'",
                "method bspps: a parameter-server method takes compressor none only, got 'topk'",
                "method wfbp: credit applies only to bytescheduler, byteschedulerps-worker",
                "method bytescheduler: cannot take compressor 'powersgd'",
                "timeline must be true, false or a positive number of steps to record, "
                "got 'yes'"]
    for problem in expected:
        assert problem in err, problem
    from ddlbench import methods
    unregistered = 0 if "bspps" in methods.names() else 1  # the PS methods may not be here
    assert f"{len(expected) + unregistered} problem(s)" in err
    assert cap.out == ""
    assert not (tmp_path / "results").exists() and not (tmp_path / "logs").exists()
    assert fake() == []


def test_host_file_too_small_and_missing_launcher(tmp_path):
    (tmp_path / "two").write_text("localhost slots=2\n")
    cfg = write_config(tmp_path, networks=["rdma0"], nworkers=[1, 2, 4],
                       hostfile=str(tmp_path / "two"))
    with pytest.raises(UsageError) as e:
        config.load(str(cfg))
    assert str(e.value).endswith(
        f"1 problem(s): 4 workers asked for, but host file {tmp_path / 'two'} has only 2 "
        f"slot(s)")
    with pytest.raises(UsageError, match="holds example hosts"):
        config.load(str(write_config(tmp_path, networks=["rdma1"], nworkers=[2, 8])))


def test_training_script_refusals_are_caught_before_the_sweep(tmp_path):
    # Flags the training script does not know, or values it refuses, surface at load time.
    cfg = write_config(tmp_path, extra_args="--no-such-flag 3")
    with pytest.raises(UsageError, match="the training script refuses cell "
                                         "local_resnet18-bs4-px32_wfbp_n1 and 3 more: "
                                         "unrecognized arguments: --no-such-flag 3"):
        config.load(str(cfg))


def test_malformed_yaml_is_one_line(tmp_path, capsys):
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: x\ntasks: [unclosed\n")
    assert benchmarks.main(["--config", str(bad)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "malformed YAML" in err[0]
    assert benchmarks.main(["report", str(tmp_path / "nothing")]) == 2
    assert "results " in capsys.readouterr().err


def test_a_sweep_file_extends_another(tmp_path, capsys):
    """extends: the base's keys, each replaced whole by the file's own; the name is the file's;
    a missing base, a non-string one and a chain that comes back are one line and exit 2."""
    write_config(tmp_path, "base", tries=3, skip=["nworkers=1"])
    child = tmp_path / "child.yaml"
    child.write_text("extends: base.yaml\nnworkers: [2, 3]\ntries: 1\n")
    base, sweep = config.load(str(tmp_path / "base.yaml"), preflight=False), \
        config.load(str(child), preflight=False)
    assert (sweep.name, sweep.tries, sweep.nworkers) == ("child", 1, [2, 3])
    assert [m["method"] for m in sweep.methods] == ["wfbp", "fusion"] and \
        sweep.timing == base.timing and sweep.tasks == base.tasks
    assert {c.nworkers for c in sweep.cells()} == {2, 3}    # the base's skip, kept
    # the shipped one: model-check's matrix at 3 and 4 workers
    wide = config.load(config.resolve_config("model-check-wide"), runs=False)
    check = config.load(config.resolve_config("model-check"), runs=False)
    assert wide.methods == check.methods and wide.tries == 1 and len(wide.cells()) == 212
    loop = tmp_path / "loop.yaml"
    loop.write_text("extends: child.yaml\n")
    for text, words in (("extends: nowhere\n", "extends: sweep config 'nowhere' not found"),
                        ("extends: [base]\n", "extends must name a sweep file"),
                        ("extends: loop.yaml\n",
                         "child.yaml: extends 'loop.yaml' comes back to a file already extended")):
        child.write_text(text)
        with pytest.raises(UsageError, match=re.escape(words)):
            config.load(str(loop), preflight=False)
    assert benchmarks.main(["--config", str(loop), "--dry-run"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "comes back" in err[0]


# ------------------------------------------------------------------------------- presets

def test_presets():
    quick = config.load(config.resolve_config("quick"), preflight=False)
    assert [n.name for n in quick.networks][0] == "loopback" and quick.nworkers == [1, 2]
    assert quick.calibrate and quick.tries == 3
    # 1 worker only where the methods do identical work (the noise floor), ResNet-18 on the
    # loopback; BERT-Tiny over the loopback only; MG-WFBP plans from the calibration's profile
    assert sorted((c.network.name, c.task["model"], c.label) for c in quick.cells()
                  if c.nworkers == 1) == sorted(
        ("loopback", "resnet18", x) for x in ("wfbp", "fusion", "ddp"))
    assert {(c.network.name, c.task["model"]) for c in quick.cells() if c.nworkers == 2} == {
        ("loopback", "resnet18"), ("loopback", "bert_tiny"), ("1gbit", "resnet18")}
    assert len(quick.cells()) == 3 + 3 * 7
    assert {c.method.get("mgwfbp_profile") for c in quick.cells()
            if c.method["method"] == "mgwfbp"} == {"calibration"}
    old = config.load(config.resolve_config("quick-loopback"), preflight=False)
    assert [n.name for n in old.networks] == ["local"] and old.nworkers == [1, 2, 4]
    emulated = config.load(config.resolve_config("emulated"), preflight=False)
    assert [(n.kind, n.profile) for n in emulated.networks] == [
        ("net", "loopback"), ("net", "5gbit"), ("net", "1gbit")]
    by_net = {c.network.name: runner.command(emulated, c, "r.json")[0]
              for c in emulated.cells() if c.method["method"] == "wfbp" and c.nworkers == 4}
    assert "--net" not in by_net["loopback"]
    assert by_net["5gbit"][-2:] == ["--net", "5gbit"] and "--nworkers" in by_net["5gbit"]
    # Every cell of the compression preset passes the training script's own checks (a method
    # that refuses its compressor would fail here); the 1gbit cells need root and iproute2.
    from ddlbench import netem
    comp = config.load(config.resolve_config("compression"),
                       preflight=netem.unavailable_reason() is None)
    assert len(comp.cells()) == 40
    assert {(c.method["method"], c.method.get("compressor", "none")) for c in comp.cells()} >= {
        ("ddp", "powersgd"), ("bytescheduler", "fp16"), ("fusion", "eftopk")}
    # the standing emulated cluster's host file (python -m ddlbench.netem cluster up)
    cl = config.load(config.resolve_config("emulated-cluster"), preflight=False, runs=False)
    assert [(n.kind, n.profile, n.hostfile) for n in cl.networks] == [
        ("rdma", 0, "/run/ddlbench-netem/clusters/node/hostfile")]
    assert runner.command(cl, cl.cells()[0], "r.json")[1]["hostfile"] == cl.networks[0].hostfile
    with pytest.raises(UsageError, match="example hosts"):
        config.load(config.resolve_config("paper"))  # needs a real cluster's host files
    with pytest.raises(UsageError, match="sweep config 'nope' not found"):
        config.resolve_config("nope")


def test_rdma_cells_go_through_the_shell_launchers(tmp_path):
    sweep = config.load(str(write_config(
        tmp_path, networks=[{"rdma": 2}], nworkers=[2],
        methods=[{"method": "fusion", "threshold": 1048576},
                 {"method": "bytescheduler", "partition": 1000, "credit": 4000}])),
        preflight=False)
    fusion, bsched = sweep.cells()
    cmd, extra = runner.command(sweep, fusion, "/r.json")
    assert cmd[-1].endswith("horovod/horovod_mpi_cj.sh")
    assert extra["rdma"] == "2" and extra["nworkers"] == "2" and extra["threshold"] == "1048576"
    assert extra["hostfile"].endswith("configs/cluster2")
    assert "--output /r.json" in extra["extra_args"]
    cmd, extra = runner.command(sweep, bsched, "/r.json")
    assert cmd[-1].endswith("bytescheduler/horovod_mpi_cj.sh")
    assert extra["partition"] == "1000" and extra["credit"] == "4000"
    assert fusion.hash != bsched.hash and len(fusion.hash) == 16


# ------------------------------------------------------------------- the real training script

def test_real_runs_through_the_local_and_the_mpi_launcher(tmp_path, capsys, monkeypatch):
    monkeypatch.delenv(config.PROGRAM_ENV, raising=False)
    monkeypatch.setenv("PATH", os.path.dirname(sys.executable) + os.pathsep +
                       os.environ.get("PATH", ""))
    cfg = write_config(tmp_path, networks=["local", "rdma0"], methods=["wfbp"], nworkers=[1],
                       tries=1, tasks=[{"model": "bert_tiny", "batch_size": 4,
                                        "sentence_len": 16}], timeout=240, timeline=2)
    assert benchmarks.main(["--config", str(cfg), "--quiet"]) == 0, capsys.readouterr().err
    [folder] = folders(tmp_path)
    by_net = {e["config"]["network"]["name"]: e for e in try_lines(folder)}
    assert set(by_net) == {"local", "rdma0"}
    for net, e in by_net.items():
        assert e["status"] == "ok"
        rec = e["record"]
        assert rec["config"]["model"] == "bert_tiny" and rec["config"]["nworkers"] == 1
        assert e["throughput"] == rec["result"]["throughput"]["mean"] > 0
        # the original's 'Total' line agrees with the record
        assert e["log_total"]["value"] == pytest.approx(e["throughput"], abs=0.05)
        assert e["timing"]["first_iter_s"] > 0
        # timeline: 2 keeps the first 2 timed steps' trace beside the record, outside the hash
        assert e["trace"] == f"records/{e['cell']}_try0.trace.json"
        trace = json.load(open(os.path.join(folder, e["trace"])))
        assert sum(1 for ev in trace["traceEvents"] if ev.get("cat") == "iteration") == 2
        assert rec["timeline"]["recorded_iterations"] == 2
    assert by_net["rdma0"]["record"]["environment"]["launcher"] == "mpi"
    assert "horovod_mpi_cj.sh" in by_net["rdma0"]["command"]
    assert "nworkers=1" in by_net["rdma0"]["command"]
    readme = open(os.path.join(folder, "README.md")).read()
    assert "| BERT-Tiny | 4 | local | wfbp |" in readme
    assert "| BERT-Tiny | 4 | 10GbE with TCP/IP | wfbp |" in readme
    assert "## Where the time goes" in readme
    assert leftovers(str(tmp_path)) == []


def test_a_networks_label_in_the_sweep_file_names_its_connection():
    """The CONNECTION column: the label the sweep file gave the network (kept in the store's
    header), else the network's default name."""
    from ddlbench.sweep import aggregate
    line = {"config": {"network": {"name": "rdma0", "kind": "rdma", "profile": 0},
                       "task": {"model": "resnet50", "batch_size": 64},
                       "method": {"method": "wfbp"}, "nworkers": 2}}
    header = {"networks": [{"name": "rdma0", "kind": "rdma", "profile": 0,
                            "label": "1 Gbit/s emulated hosts over ssh"}]}
    assert aggregate._row(line, header).connection == "1 Gbit/s emulated hosts over ssh"
    assert aggregate._row(line, {"networks": []}).connection == "10GbE with TCP/IP"

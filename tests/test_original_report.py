"""The original-format report of a paper-preset sweep (original/README.md and its figures) in the
original's layout: its seven methods by the original's names (whatever settings the preset gives
them), the original's hatch and colour per method, one 1-GPU figure per task, figures linked as
./X.png beside the README (HKBU-HPML/ddl-benchmarks, plots.py at its last commit)."""
import datetime
import json
import os

import pytest

from ddlbench.sweep import aggregate, config, plots, report

from .conftest import REPO

EXPECTED = os.path.join(REPO, "tests", "data", "original_paper_README.md")

# The original's plots.py: METHOD_NAMES, METHOD_HACHES and METHOD_COLORS of its seven methods,
# in the order it drew them (benchmarks.py's a2amethods + psmethods).
ORIGINAL_STYLE = [  # (method, name, hatch, colour)
    ("bspa2a", "BSP-A2A", "..", "#F55a11"),
    ("wfbp", "WFBP-A2A", "oo", "#F55a11"),
    ("mgwfbp", "MG-WFBP", "**", "#F55a11"),
    ("bytescheduler", "ByteScheduler-A2A", "OO", "#F55a11"),
    ("bspps", "BSP-PS", "///", "#F1B111"),
    ("wfbpps", "WFBP-PS", "\\\\\\", "#F1B111"),
    ("byteschedulerps", "ByteScheduler-PS", "++", "#F1B111"),
]

# Throughputs of the hand-written store, per task and method (the preset's order): at 1 GPU
# the all-to-all methods' tries are base+i-2, base+i, base+i+2 (i their index: the task's one
# 1-GPU figure is their mean, base+1.5), the PS methods' base-20 (not in it); at n GPUs
# base*n*F[i] -10, +0, +10 (mean +- population std 8.16). ResNet-50's BSP-PS at 8 GPUs has one
# successful try of three (marked), BERT-Large's ByteScheduler-PS at 8 GPUs timed out.
F = [0.70, 0.80, 0.90, 0.95, 0.60, 0.75, 0.85]
BASE = {"resnet50": 250.0, "bert": 50.0}


def _tries(model, i, mid, n):
    """(throughputs, statuses) of one cell's three tries."""
    b = BASE[model]
    if n == 1:
        x, spread = (b + i, 2.0) if i < 4 else (b - 20, 0.0)
    else:
        x, spread = b * n * F[i], 10.0
    if (model, mid, n) == ("resnet50", "bspps", 8):
        return [x] * 3, ["ok", "failed", "failed"]
    if (model, mid, n) == ("bert", "byteschedulerps", 8):
        return [x] * 3, ["timeout"] * 3
    return [x - spread, x, x + spread], ["ok"] * 3


def paper_store(folder):
    """The paper preset (configs/paper.yaml) on 10GbE (rdma0), ResNet-50 and BERT-Large at 1, 4
    and 8 GPUs, 3 tries: each store line as the sweep writes it (the cell's config, label and
    hash from the preset's own method entries)."""
    sweep = config.load(os.path.join(REPO, "configs", "paper.yaml"), preflight=False,
                        runs=False)
    sweep.networks = [n for n in sweep.networks if n.name == "rdma0"]
    sweep.tasks = [t for t in sweep.tasks if t["model"] in BASE]
    sweep.nworkers, sweep.tries, sweep.min_ok = [1, 4, 8], 3, 2
    ids = [m["method"] for m in sweep.methods]
    assert ids == [m for m, *_ in ORIGINAL_STYLE]  # the preset's seven, in the original's order
    cells = sweep.cells()
    lines = [{"kind": "sweep", **sweep.header(), "cells": [c.hash for c in cells]}]
    for c in cells:
        model, mid = c.task["model"], c.method["method"]
        values, statuses = _tries(model, ids.index(mid), mid, c.nworkers)
        for k, (v, st) in enumerate(zip(values, statuses)):
            e = {"kind": "try", "sweep": "paper", "hash": c.hash, "cell": c.name, "try": k,
                 "attempt": 1, "label": c.label, "architecture": c.architecture,
                 "config": c.config(), "status": st, "seconds": 10.0,
                 "log": f"logs/{c.name}_try{k}.log"}
            if st == "ok":
                e.update(throughput=v, throughput_std=1.0, noun="GPU",
                         unit="img/sec" if model == "resnet50" else "sen/sec")
            else:
                e["reason"] = "exit code 1" if st == "failed" else "killed after 1800 s"
            lines.append(e)
    os.makedirs(folder, exist_ok=True)
    with open(os.path.join(folder, "results.jsonl"), "w") as f:
        f.write("".join(json.dumps(e) + "\n" for e in lines))
    return folder


@pytest.fixture(scope="module")
def written(tmp_path_factory):
    folder = paper_store(str(tmp_path_factory.mktemp("paper")))
    return folder, report.write_all(folder)


def test_the_original_report_of_the_paper_preset_is_the_hand_checked_file(written):
    folder, _ = written
    with open(os.path.join(folder, "original", "README.md")) as f:
        got = f.read()
    with open(EXPECTED) as f:
        expected = f.read()
    first, rest = got.split("\n", 1)
    assert first == f"# Results generated on {datetime.date.today().isoformat()}"
    assert rest == expected.split("\n", 1)[1]
    # its figures beside it, in the original's names, as the README links them
    assert sorted(os.listdir(os.path.join(folder, "original"))) == \
        ["README.md", "bert_8-rdma0.png", "resnet50_64-rdma0.png"]
    assert not os.path.exists(os.path.join(folder, "original.md"))


def test_the_paper_preset_rows_are_named_as_the_original(written):
    _, t = written
    names = [r.original_method for r in t.rows if r.task == t.rows[0].task]
    assert names == [name for _, name, *_ in ORIGINAL_STYLE]
    # the labels keep the settings (the suite's own tables), the original's names do not
    by_method = {r.method_id: r for r in t.rows}
    assert by_method["bytescheduler"].label.startswith("bytescheduler ")
    assert by_method["bytescheduler"].original_method == "ByteScheduler-A2A"


def test_each_method_has_the_originals_hatch_and_colour(written):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    _, t = written
    expected = {name: (colour, hatch) for _, name, hatch, colour in ORIGINAL_STYLE}
    for _, rows in plots.original_groups(t):
        style = plots._style(rows)
        assert style == expected
        # ... and the bars drawn with them
        fig, ax = plt.subplots()
        try:
            series = plots.original_series(rows)
            plots._bars(ax, series, style)
            drawn = {c.get_label(): (c.patches[0].get_hatch(), c.patches[0].get_facecolor())
                     for c in ax.containers if hasattr(c, "patches")}
        finally:
            plt.close(fig)
        assert drawn == {name: (hatch, matplotlib.colors.to_rgba(colour))
                         for name, (colour, hatch) in expected.items() if name in series}


def test_one_1gpu_figure_per_task_and_the_speedup_labels_over_it(written):
    _, t = written
    singles = plots.original_singles(t)
    assert singles == {"resnet50_64": 251.5, "bert_8": 51.5}
    groups = dict(plots.original_groups(t))
    # the largest bar of each group over the task's figure: ByteScheduler-A2A's 950 and 1900
    assert plots.original_speedups(groups["resnet50_64-rdma0.png"], 251.5) == {
        4: ("ByteScheduler-A2A", pytest.approx(950 / 251.5)),
        8: ("ByteScheduler-A2A", pytest.approx(1900 / 251.5))}
    assert plots.original_speedups(groups["resnet50_64-rdma0.png"], None) == {}


def test_the_original_tasks_figures_have_its_fixed_tops(written, tmp_path, monkeypatch):
    """plots.py's limits: 9000 for resnet50_64, 450 for bert_8, 5800 for bert_base_64; another
    task (or bars above the limit) 1.3 x its highest bar with its error."""
    import matplotlib
    matplotlib.use("Agg")
    from matplotlib.figure import Figure
    _, t = written
    tops = {}
    monkeypatch.setattr(Figure, "savefig", lambda fig, path, **kw: tops.setdefault(
        os.path.basename(path), fig.axes[0].get_ylim()[1]))
    plots.draw_original(t, str(tmp_path))
    assert (tops["resnet50_64-rdma0.png"], tops["bert_8-rdma0.png"]) == (9000.0, 450.0)
    assert plots.original_ylim("bert_base_64", 5000.0) == 5800.0
    assert plots.original_ylim("bert_8", 500.0) == pytest.approx(650.0)  # above: it grows
    assert plots.original_ylim("resnet50_32", 100.0) == pytest.approx(130.0)


def _row(mid, label, labelled=False, engine="torch"):
    return aggregate.Row(network="rdma0", connection="c", model="resnet50", batch_size=64,
                         task="resnet50-bs64", label=label, engine=engine, architecture="a2a",
                         method_id=mid, labelled=labelled)


def test_two_settings_of_one_method_keep_their_labels_and_hatches_apart():
    rows = [_row("bytescheduler", "bytescheduler credit=1"),
            _row("bytescheduler", "bytescheduler credit=2"),
            _row("wfbp", "wfbp"), _row("bspa2a", "BSP-A2A", labelled=True),
            _row("bspa2a", "bspa2a"), _row("mgwfbp", "mgwfbp", engine="horovod")]
    aggregate.original_names(rows)
    assert [r.original_method for r in rows] == [
        "bytescheduler credit=1", "bytescheduler credit=2", "WFBP-A2A", "BSP-A2A",
        "bspa2a",  # BSP-A2A is another row's label: this one keeps its own
        "MG-WFBP (horovod)"]
    hatches = [h for _, h in plots._style(rows).values()]
    assert hatches[0] == "OO" and hatches[1] not in ("OO", "") and len(set(hatches)) == 6

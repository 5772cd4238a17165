"""A method with new collectives on groups of the placement is one file: a hierarchical
all-reduce (reduce-scatter inside each machine, all-reduce of the shard across machines,
all-gather inside the machine) declared in a package of its own, named by DDLBENCH_METHODS,
verified on 2 emulated machines x 2 slots, each collective on its group on the timeline, and
its bytes per worker those its collectives' declarations give, with no file of the suite
touched. The method is docs/DESIGN.md's worked example, read from there."""
import json
import os
import sys

import pytest

from ddlbench import collectives

from .conftest import QUICK_TIMING, REPO, TINY_BERT, describe, run, train, verify_lines
from .test_predict import _profile
from . import traces

def _worked_example() -> str:
    """The method of docs/DESIGN.md section 13's "A method on groups", as written there."""
    text = open(os.path.join(REPO, "docs", "DESIGN.md")).read()
    section = text.split("### A method on groups", 1)[1].split("\n### ", 1)[0]
    return section.split("```python\n", 1)[1].split("```", 1)[0]




def _plugin_env(tmp_path):
    pkg = tmp_path / "grouped"
    pkg.mkdir()
    (pkg / "__init__.py").write_text('"""Methods of my own."""\n')
    (pkg / "hier.py").write_text(_worked_example())
    return {"PYTHONPATH": f"{tmp_path}{os.pathsep}{os.environ.get('PYTHONPATH', '')}",
            "DDLBENCH_METHODS": "grouped.hier"}


def test_a_two_level_method_in_one_file_verifies_and_counts_its_groups(tmp_path, load_json):
    env = _plugin_env(tmp_path)
    machines = ["--nworkers", "4", "--slots", "2"]   # 2 emulated machines x 2 slots
    proc = train(*TINY_BERT, *machines, "--verify", "3", "--method", "hiertest",
                 timeout=300, **env)
    assert proc.returncode == 0, describe(proc)
    assert [ok for _, _, _, ok in verify_lines(proc.stdout)["hiertest"]] == [True] * 3

    out, trace = tmp_path / "rec.json", tmp_path / "trace.json"
    proc = train(*TINY_BERT, *machines, *QUICK_TIMING, "--method", "hiertest",
                 "--output", str(out), "--timeline", str(trace), timeout=300, **env)
    assert proc.returncode == 0, describe(proc)
    rec = load_json(out)
    assert rec["method"]["groups"] == {"world": [[0, 1, 2, 3]], "machine": [[0, 1], [2, 3]],
                                       "across": [[0, 2], [1, 3]]}
    # bytes per worker per step: the declarations at l = 2 per machine, n = 2 machines, for a
    # flat gradient of G bytes (even: no padding at l = 2)
    grad = rec["model"]["gradient_bytes"]
    assert grad % 2 == 0
    by_group = rec["communication_per_iteration"]["wire_sent_bytes_by_group"]
    inside = (collectives.sent_bytes("reduce_scatter", grad, 2, carrier="a2a", backend="gloo")
              + collectives.sent_bytes("allgather", grad // 2, 2))
    across = collectives.sent_bytes("allreduce", grad // 2, 2)
    assert inside == grad and across == grad // 2          # (l-1)/l G twice; 2(n-1)/n G/l
    assert by_group == {"machine": {"reduce_scatter": inside // 2, "allgather": inside // 2},
                        "across": {"allreduce": across}}

    # the timeline: every collective on its group's row, with its group and carrier
    rows = traces.check_trace(json.loads(trace.read_text()))
    seen = {}
    for (_, row), events in rows.items():
        for e in events:
            if e.get("cat") == "comm":
                args = e.get("args", {})
                seen.setdefault((e["name"], row, args.get("group"), args.get("carrier")), 0)
                seen[(e["name"], row, args.get("group"), args.get("carrier"))] += 1
    steps = 2 * 2   # QUICK_TIMING: 2 timed iterations of 2 batches
    assert seen == {("reduce_scatter", "reduce_scatter @machine", "machine", "a2a"): 4 * steps,
                    ("allreduce", "allreduce @across", "across", None): 4 * steps,
                    ("allgather", "allgather @machine", "machine", None): 4 * steps}, seen


TOPOLOGY = """
nodes: 2
devices_per_node: 2
intra_node: {bandwidth: 8GB/s, latency: 2us}
inter_node: {bandwidth: 1gbit, latency: 30us}
"""


def test_the_model_replays_the_declared_exchange_on_the_groups_of_a_topology(tmp_path):
    """On 2 machines x 2 devices the declared exchange (reduce-scatter in the machine,
    all-reduce of the half across, all-gather in the machine) costs what BSP's one all-reduce
    costs on the same cluster with the hierarchical algorithm; on a network that knows no
    machines it is one line."""
    env = _plugin_env(tmp_path)
    path, prof = _profile(tmp_path)
    ring, hier = tmp_path / "ring.yaml", tmp_path / "hier.yaml"
    ring.write_text(TOPOLOGY)
    hier.write_text(TOPOLOGY + "allreduce: hierarchical\n")
    predict = [sys.executable, "-m", "ddlbench.model.predict", "--profile", str(path),
               "--nworkers", "4"]
    got = {}
    for name, topo, method in (("exchange", ring, "hiertest"), ("flat", ring, "bspa2a"),
                               ("hierarchical", hier, "bspa2a")):
        out = tmp_path / f"{name}.json"
        proc = run([*predict, "--topology", str(topo), "--method", method, "--output",
                    str(out)], timeout=120, **env)
        assert proc.returncode == 0, describe(proc)
        (got[name],) = json.loads(out.read_text())["predictions"]
    grad = sum(t["bytes"] for t in prof["tensors"])
    assert got["exchange"]["messages"] == 1
    # the bytes Comm counts: the all-gather by what this worker contributes (its 1/2 shard)
    assert got["exchange"]["message_bytes"] == [grad + grad // 2 + grad // 2]
    assert got["exchange"]["iteration_s"] == pytest.approx(got["hierarchical"]["iteration_s"],
                                                           rel=1e-12)
    assert got["exchange"]["iteration_s"] < got["flat"]["iteration_s"]
    proc = run([*predict, "--alpha", "1e-4", "--beta", "1e-9", "--method", "hiertest"],
               timeout=120, **env)
    assert proc.returncode == 2 and proc.stderr.strip() == (
        "ddlbench: error: method hiertest runs reduce_scatter @machine, allreduce @across, "
        "allgather @machine per message: give a network that prices them (a topology file), "
        "not an all-reduce alpha-beta"), describe(proc)

"""Intervals from the constants' stated ranges (issue 62, item 3): a topology file's provenance
may state a constant's ``range: [low, high]`` (a chosen constant's is at least its shipped and
datasheet values); the one prediction path (``cell.predict``) predicts every cell again with
every ranged constant at its slow ends and at its fast ends, and the interval is [min, max]
of the three; the advisor ties methods whose intervals overlap the best's, and the survey's
validation says how often the published best is among the tied picks. No torch."""
import json
import os
import statistics

import pytest
import yaml

from ddlbench.errors import UsageError
from ddlbench.measure.profile_file import read_profile
from ddlbench.model import cell, predict, simulate, survey, topology, validation

from .conftest import REPO

PROFILE = os.path.join(REPO, "configs", "profiles", "h200_resnet50_bs64.json")
NET = {"nodes": 2, "devices_per_node": 4,
       "intra_node": {"bandwidth": "8GB/s", "latency": "2us"},
       "inter_node": {"bandwidth": "10gbit", "latency": "20us", "efficiency": 0.9}}


def _write(tmp_path, data: dict, name: str = "net.yaml") -> str:
    path = tmp_path / name
    path.write_text(yaml.safe_dump(data))
    return str(path)


def _net(tmp_path, name="net.yaml", inter=None, **provenance) -> dict:
    """NET with ``inter`` replacing inter_node's values and ``provenance`` as its
    provenance."""
    data = json.loads(json.dumps(NET))
    data["inter_node"].update(inter or {})
    if provenance:
        data["inter_node"]["provenance"] = provenance
    return _write(tmp_path, data, name)


@pytest.mark.parametrize("entry, where, message", [
    ({"latency": {"kind": "assumed", "source": "x", "range": ["30us", "50us"]}},
     "inter_node: provenance: latency", "range [30us, 50us] does not contain the value 20us"),
    ({"latency": {"kind": "assumed", "source": "x", "range": ["10gbit", "50us"]}},
     "inter_node: provenance: latency: range low",
     "'10gbit': expected a number and a unit of s, ms, us or ns"),
    ({"bandwidth": {"kind": "assumed", "source": "x", "range": ["5gbit", "12us"]}},
     "inter_node: provenance: bandwidth: range high",
     "'12us': expected a number and a unit, bits as 10gbit"),
    ({"latency": {"kind": "assumed", "source": "x", "range": ["50us", "10us"]}},
     "inter_node: provenance: latency", "range [50us, 10us] has its low end above its high end"),
    ({"latency": {"kind": "assumed", "source": "x", "range": "10us"}},
     "inter_node: provenance: latency", "range must be [low, high] in the value's units"),
    ({"efficiency": {"kind": "assumed", "source": "x", "range": [0.8, 1.2]}},
     "inter_node: provenance: efficiency: range high", "must be a number in (0, 1], got 1.2"),
])
def test_a_bad_range_is_one_line_naming_the_file_and_the_constant(tmp_path, entry, where,
                                                                  message):
    with pytest.raises(UsageError) as e:
        topology.Topology(_net(tmp_path, **entry))
    text = str(e.value)
    assert "\n" not in text and f"topology file {tmp_path / 'net.yaml'}: {where}" in text \
        and message in text, text


def test_a_range_belongs_to_a_link_constant(tmp_path):
    data = {**NET, "provenance": {"nodes": {"kind": "assumed", "source": "x",
                                            "range": [1, 4]}}}
    with pytest.raises(UsageError, match="provenance: nodes: range: a stated range belongs "
                                         "to a link's bandwidth, latency or efficiency"):
        topology.Topology(_write(tmp_path, data))


def test_a_chosen_constant_s_range_reaches_its_datasheet_value(tmp_path):
    """kind chosen: at least [shipped, datasheet] (here the datasheet above the stated
    range); an assumed one its stated range; an override outside a range widens it."""
    net = topology.Topology(_net(tmp_path, bandwidth={
        "kind": "chosen", "source": "a table", "datasheet": "16gbit", "range": ["8gbit", "12gbit"]},
        latency={"kind": "assumed", "source": "about", "range": ["10us", "40us"]}))
    assert net.ranges() == {"inter_node.bandwidth": (1e9, 2e9),
                            "inter_node.latency": (pytest.approx(1e-5), pytest.approx(4e-5))}
    bare = topology.Topology(_net(tmp_path, "bare.yaml", bandwidth={
        "kind": "chosen", "source": "a table", "datasheet": "16gbit"}))
    assert bare.ranges() == {"inter_node.bandwidth": (1.25e9, 2e9)}
    assert net.variant({"inter_node.latency": 1e-4}).ranges()["inter_node.latency"] == \
        (pytest.approx(1e-5), 1e-4)
    assert topology.Topology(_net(tmp_path, "none.yaml")).ranges() == {}


def _work():
    return predict.workload_of(read_profile(PROFILE))


@pytest.mark.parametrize("method", ["wfbp", "bspps"])
def test_the_interval_s_ends_are_the_predictions_at_the_slow_and_fast_ends(tmp_path, method):
    """A range on the inter-node latency and bandwidth: the interval contains the point, is
    wider than the bare file's (the point), and its ends are the predictions on two files
    written with every ranged constant at its slow and at its fast end (read here as files
    of their own, not through ``Topology.ends``); with a compute spread the slow compute goes
    with the slow links."""
    ranged = topology.Topology(_net(tmp_path, latency={
        "kind": "assumed", "source": "about", "range": ["10us", "40us"]}, bandwidth={
        "kind": "assumed", "source": "a test", "range": ["5gbit", "10gbit"]}))
    slow = topology.Topology(_net(tmp_path, "slow.yaml", {"latency": "40us",
                                                          "bandwidth": "5gbit"}))
    fast = topology.Topology(_net(tmp_path, "fast.yaml", {"latency": "10us"}))
    bare = topology.Topology(_net(tmp_path, "bare.yaml"))
    work, batch, p = _work(), 64, 8

    def tp(net, w=work, **kw):
        return cell.predict(method, w, p, network=net, interval=False,
                            **kw).throughput(batch, p)
    got = cell.predict(method, work, p, network=ranged)
    lo, hi = got.interval(batch, p)
    point = got.throughput(batch, p)
    assert point == tp(bare) and bare.ends() is None
    assert cell.predict(method, work, p, network=bare).interval(batch, p) == (point, point)
    assert (lo, hi) == (tp(slow), tp(fast)) and lo < point < hi
    assert "net's stated ranges: inter_node.bandwidth [5 Gbit/s, 10 Gbit/s], " \
           "inter_node.latency [10 us, 40 us]" == got.spread_note
    spread = cell.Spread(compute=(0.9, 1.2), sources=("compute x[0.9, 1.2]: a test",))
    both = cell.predict(method, work, p, network=ranged, spread=spread)

    def at(f):
        return cell.adjusted(work, simulate.NO_CODEC, {"compute": f, "kappa": 1.0,
                                                       "mu": 1.0})[0]
    assert both.interval(batch, p) == (tp(slow, at(1.2)), tp(fast, at(0.9)))
    assert both.spread_note.startswith("compute x[0.9, 1.2]: a test; net's stated ranges")


def _advise(path, out) -> dict:
    assert predict.main(["--profile", PROFILE, "--topology", path, "--nworkers", "8",
                         "--method", "ddp,fusion,bspa2a,wfbp", "--advise", "--output",
                         str(out)]) == 0
    [entry] = json.loads(out.read_text())["advice"]
    return {r["method"]: r["standing"] for r in entry["advice"]}


def test_an_advisor_tie_from_a_stated_range_alone(tmp_path, capsys):
    """ResNet-50 on 2 x 4 workers: DDP best, fusion 0.7% behind, no profile spread. On the bare
    file fusion is apart (the intervals are points); with the inter-node latency stated as
    [10us, 40us] both intervals widen and overlap: tied; bspa2a and wfbp stay apart."""
    assert _advise(_net(tmp_path), tmp_path / "a.json") == {
        "ddp": "(best)", "fusion": "", "bspa2a": "", "wfbp": ""}
    capsys.readouterr()
    ranged = _net(tmp_path, "ranged.yaml", latency={"kind": "assumed", "source": "about",
                                                    "range": ["10us", "40us"]})
    assert _advise(ranged, tmp_path / "b.json") == {
        "ddp": "(best)", "fusion": "(tied)", "bspa2a": "", "wfbp": ""}
    text = capsys.readouterr().out
    assert "[low,high] img/s: ranged's stated ranges: inter_node.latency [10 us, 40 us]" in text
    assert "fusion (tied)" in text


def test_the_survey_says_how_often_the_published_best_is_among_the_tied_picks(
        tmp_path, capsys, monkeypatch):
    """A few cells of every network (bspa2a and bspps at 4 and 8 GPUs): the count printed
    beside the best-method score is recomputed here from the rows' intervals."""
    cells = [c for c in survey.cells() if c["model"] == "resnet50" and c["nworkers"] in (4, 8)
             and c["method"] in ("bspa2a", "bspps", "wfbp")]
    monkeypatch.setattr(validation.survey, "cells", lambda *a: cells)
    out = tmp_path / "v.json"
    assert validation.main(["survey", "--no-constants", "--output", str(out)]) == 0
    text = capsys.readouterr().out
    rows = json.loads(out.read_text())["rows"]
    groups: dict = {}
    for r in rows:
        groups.setdefault((r["rdma"], r["nworkers"]), []).append(r)
    hits, sizes = 0, []
    for g in groups.values():
        top = max(r["predicted"] for r in g)
        pick = min((r for r in g if r["predicted"] >= top * (1 - 1e-9)),
                   key=lambda r: r["published"])
        lo, hi = pick["interval"]
        tied = [r for r in g if r["interval"][0] <= hi and lo <= r["interval"][1]]
        hits += max(r["published"] for r in g) in [r["published"] for r in tied]
        sizes.append(len(tied))
        assert all(r["interval"][0] <= r["predicted"] <= r["interval"][1] for r in g)
    assert len(groups) == 6 and any(r["interval"][0] < r["interval"][1] for r in rows)
    line = (f"the published best is among the tied picks (the model's pick and the methods "
            f"whose intervals, from the topology files' stated ranges, overlap it) in "
            f"{hits}/6 groups; a group's tied picks are a median "
            f"{statistics.median(sizes):g} of its 3 methods (shipped constants)")
    lines = text.splitlines()
    assert lines[2] == line and lines[1].startswith("best method: the model picks")

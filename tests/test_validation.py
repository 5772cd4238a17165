"""python -m ddlbench.model.validation survey: the performance model against the survey's published
table. Predictions are the simulator's on independently built inputs, the medians those of the
listed errors, a worker count missing from the original's tables leaves its cells out, bad
input is one line. No torch."""
import json
import math
import os

import pytest

from ddlbench.model import score, simulate, survey, topology, validation
from ddlbench.planning import ORIGINAL_AB_TABLES, merge_groups

from .conftest import REPO


@pytest.fixture(scope="module")
def full():
    return validation.validate("topology")


def _work(model: str) -> tuple[simulate.Compute, int]:
    """The model's H200 profile, read here, times scaled so one worker runs at the survey's
    1-GPU figure; no optimizer step."""
    with open(os.path.join(REPO, "configs", "profiles", validation.PROFILES[model])) as f:
        prof = json.load(f)
    batch = prof["workload"]["batch_size"]
    fwd, bwd = prof["forward_s"], prof["backward_s"]
    factor = batch / survey.single_gpu(model) / (fwd + sum(bwd) + 0.0)
    shapes = [tuple(t["shape"]) for t in prof["tensors"]]
    work = simulate.Compute(fwd * factor, [x * factor for x in bwd],
                             [t["bytes"] for t in prof["tensors"]], 0.0,
                             [t["name"] for t in prof["tensors"]], shapes)
    return work, batch


def _cell(model, rdma, method, p):
    [cell] = [c for c in survey.cells() if (c["model"], c["rdma"], c["method"], c["nworkers"])
              == (model, rdma, method, p)]
    return cell


# BytePS on one worker machine runs as this all-reduce method (bytedance/byteps
# docs/best-practice.md: non-distributed mode); ByteScheduler-PS is the original's (WFBP-PS
# workers, servers scheduling by priority)
LOCAL = {"bspps": "bspa2a", "wfbpps": "wfbp", "byteschedulerps": "wfbp"}
# the paper preset's settings (configs/paper.yaml): a timing round of 10 batches, MG-WFBP
# planned with the original's table
A2A_SETTINGS = {"bytescheduler": {"partition": 4_000_000, "credit": 16_000_000,
                                  "batches_per_iter": 10},
                "mgwfbp": {"mgwfbp_min_group": 8192}}


def _a2a(method, work, link, p, rdma):
    """The all-reduce method's replay on ``link``; MG-WFBP's merge planned with the original's
    table for P and the network."""
    if method != "mgwfbp":
        return simulate.predict(method, work, link, **A2A_SETTINGS.get(method, {}))
    a, b = ORIGINAL_AB_TABLES["10Gbps" if rdma == 0 else "56Gbps"][p]
    groups = merge_groups(work.backward_s, work.nbytes, a, b, 8192 * 4)
    return simulate.replay(work, link, groups, method="mgwfbp")


def test_cells_are_the_simulators_predictions():
    cases = [("resnet50", 0, "wfbp", 8), ("bert", 1, "mgwfbp", 16),
             ("bert_base", 2, "bytescheduler", 32), ("resnet50", 2, "bspps", 4),
             ("bert", 1, "wfbpps", 4), ("bert_base", 0, "byteschedulerps", 4),
             ("bert_base", 0, "byteschedulerps", 16), ("bert", 2, "wfbpps", 8),
             ("bert", 0, "bspa2a", 32), ("bert_base", 2, "mgwfbp", 8)]
    cells = [_cell(*c) for c in cases]
    rows = {(r["model"], r["rdma"], r["method"], r["nworkers"]): r
            for r in validation.validate("topology", cells)["rows"]}
    original = {(r["model"], r["rdma"], r["method"], r["nworkers"]): r
                for r in validation.validate("original", cells)["rows"]}
    names = {0: "survey-10gbe", 1: "survey-100gib", 2: "survey-100gbe"}
    for model, rdma, method, p in cases:
        work, batch = _work(model)
        net = topology.load(os.path.join(REPO, "configs", "topology", f"{names[rdma]}.yaml"))
        cell = _cell(model, rdma, method, p)
        assert batch == cell["batch_size"]
        table = simulate.Link(*ORIGINAL_AB_TABLES["10Gbps" if rdma == 0 else "56Gbps"][p])
        if method in LOCAL and p <= 4:
            # one machine: a local all-reduce on the cell's all-reduce link (the original's
            # table under that source)
            local = LOCAL[method]
            want = _a2a(local, work, net.link("allreduce", p), p, rdma)
            want_original = _a2a(local, work, table, p, rdma)
        elif method in LOCAL:
            want = simulate.predict(method, work, None, servers=net.ps(p),
                                    local=net.local_reduce(p), partition_bytes=4_096_000)
            want_original = want
        else:
            want = _a2a(method, work, net.link("allreduce", p), p, rdma)
            want_original = _a2a(method, work, table, p, rdma)
        for got, pred in ((rows, want), (original, want_original)):
            row = got[(model, rdma, method, p)]
            assert row["predicted"] == batch * p / pred.iteration_s
            assert row["published"] == cell["throughput"]
            assert row["error"] == (row["predicted"] - row["published"]) / row["published"]
            assert row.get("ps_local") == (LOCAL[method] if method in LOCAL and p <= 4
                                           else None)
            if "ps_local" in row:
                assert "BytePS non-distributed" in row["model_notes"][0]
            if method == "mgwfbp":
                assert "original's" in row["model_notes"][0]
            # the YAML's odd cells: 100GbE BSP-PS/WFBP-PS of ResNet-50 and BERT-Large, 8-32
            assert row.get("odd", False) == ((model, rdma, method, p) == ("bert", 2, "wfbpps", 8))


def _median(xs):
    xs = sorted(xs)
    n = len(xs)
    return xs[n // 2] if n % 2 else (xs[n // 2 - 1] + xs[n // 2]) / 2


def test_medians_are_those_of_the_listed_errors(full):
    rows, s = full["rows"], full["summary"]
    assert len(rows) == 252 and not full["not_modelled"] and s["cells"] == 252
    for r in rows:
        assert r["error"] == (r["predicted"] - r["published"]) / r["published"]
    short = {0: "10GbE", 1: "100GbIB", 2: "100GbE"}
    for key, field, name in (("by_network", "rdma", short.get), ("by_method", "method", str),
                             ("by_model", "model", str)):
        groups = {}
        for r in rows:
            groups.setdefault(name(r[field]), []).append(abs(r["error"]))
        assert set(s[key]) == set(groups)
        for k, errs in groups.items():
            assert s[key][k] == {"cells": len(errs), "median_abs_error": _median(errs)}
    errs = sorted(abs(r["error"]) for r in rows)
    assert s["overall"]["median_abs_error"] == _median(errs)
    pos = (len(errs) - 1) * 0.9
    lo = int(pos)
    assert s["overall"]["p90_abs_error"] == pytest.approx(
        errs[lo] + (errs[lo + 1] - errs[lo]) * (pos - lo), rel=1e-12)
    assert full["runtime_s"] > 0
    # every median again without the odd cells
    kept = [r for r in rows if not r.get("odd")]
    w = full["summary_without_odd"]
    assert w["cells"] == len(kept) == 240
    assert w["overall"]["median_abs_error"] == _median([abs(r["error"]) for r in kept])
    groups = {}
    for r in kept:
        groups.setdefault(r["method"], []).append(abs(r["error"]))
    assert {k: v["median_abs_error"] for k, v in w["by_method"].items()} == \
        {k: _median(v) for k, v in groups.items()}
    assert w["by_network"]["100GbE"]["cells"] == 72 and w["by_network"]["10GbE"]["cells"] == 84
    # the published findings are the table's, whatever the model says
    assert [f["passed"] for f in full["findings"]["published"]] == [True] * 4


def test_ps_cells_on_one_machine_and_odd_cells_are_flagged(full):
    odd = {(r["model"], r["rdma"], r["method"], r["nworkers"]) for r in full["rows"]
           if r.get("odd")}
    assert odd == {(m, 2, meth, p) for m in ("resnet50", "bert") for meth in ("bspps", "wfbpps")
                   for p in (8, 16, 32)}
    assert full["odd_cells"]["cells"] == 12
    local = {(r["model"], r["rdma"], r["method"], r["nworkers"]): r["ps_local"]
             for r in full["rows"] if "ps_local" in r}
    assert local == {(m, r, meth, 4): LOCAL[meth] for m in ("resnet50", "bert", "bert_base")
                     for r in (0, 1, 2) for meth in LOCAL}
    assert full["ps_single_machine"]["cells"] == 27
    assert "DMLC_NUM_WORKER=1" in full["ps_single_machine"]["note"]


def test_one_machine_is_the_topologys_devices_per_node(tmp_path, monkeypatch):
    path = os.path.join(REPO, "configs", "topology", "survey-10gbe.yaml")
    text = open(path).read().replace("devices_per_node: 4", "devices_per_node: 8")
    wide = tmp_path / "wide.yaml"
    wide.write_text(text.replace("nodes: 8", "nodes: 4"))
    monkeypatch.setitem(validation.TOPOLOGIES, 0, str(wide))
    cells = [_cell("resnet50", 0, "wfbpps", p) for p in (4, 8, 16)]
    rows = {r["nworkers"]: r for r in validation.validate("topology", cells)["rows"]}
    assert rows[4]["ps_local"] == rows[8]["ps_local"] == "wfbp" and "ps_local" not in rows[16]
    work, _ = _work("resnet50")
    net = topology.load(str(wide))
    want = simulate.predict("wfbp", work, net.link("allreduce", 8))
    assert rows[8]["predicted"] == 64 * 8 / want.iteration_s


def test_original_source_leaves_out_worker_counts_missing_from_a_table():
    cells = [c for c in survey.cells() if c["model"] == "resnet50" and c["nworkers"] in (8, 16)
             and c["method"] in ("wfbp", "bspps")]
    tables = {name: {p: ab for p, ab in table.items() if p != 8}
              for name, table in ORIGINAL_AB_TABLES.items()}
    got = validation.validate("original", cells, tables=tables)
    left = {(c["rdma"], c["method"], c["nworkers"]) for c in got["not_modelled"]}
    assert left == {(r, "wfbp", 8) for r in (0, 1, 2)}
    assert all("no entry for 8 workers" in c["reason"] for c in got["not_modelled"])
    # the PS cells keep the topology's servers; P = 16 is in the tables
    done = {(r["rdma"], r["method"], r["nworkers"]) for r in got["rows"]}
    assert done == {(r, m, p) for r in (0, 1, 2) for m, p in
                    (("wfbp", 16), ("bspps", 8), ("bspps", 16))}
    assert got["summary"]["cells"] == 9
    # the full tables cover every worker count of the survey
    assert not validation.validate("original", cells)["not_modelled"]


def _table(f_wfbp=1.1, f_bspps=1.5, nets=(0, 1, 2), counts=(4, 8, 16, 32)):
    """Hand-made throughputs: two models, each method a fixed factor of BSP-A2A's (a
    callable: of the cell), BERT-Large scaling worse than ResNet-50."""
    single = {"resnet50": 100.0, "bert": 10.0}
    thr = {}
    for i, (m, base) in enumerate(single.items()):
        for r in nets:
            for p in counts:
                eff = 0.9 if m == "resnet50" else 0.3
                for meth, f in (("bspa2a", 1.0), ("wfbp", f_wfbp), ("mgwfbp", 1.2),
                                ("bytescheduler", 0.5), ("bspps", f_bspps)):
                    f = f(m, r, p) if callable(f) else f
                    thr[(m, r, meth, p)] = base * p * eff * f
    return thr, single


def test_findings_on_hand_made_throughputs():
    thr, single = _table()
    got = {f["id"]: f for f in validation.findings(thr, single)}
    assert got[1]["passed"] and got[1]["numbers"]["wins"] == 24 == got[1]["numbers"]["cells"]
    # rdma 1 and 2: 16 cells, mgwfbp the best of each
    assert got[2]["passed"] and got[2]["numbers"]["cells"] == 16
    assert got[2]["numbers"]["strict"] == 16
    assert got[3]["passed"] and got[3]["numbers"]["cells"] == 15
    assert got[4]["passed"] is False and got[4]["numbers"]["median_ratio"] == pytest.approx(1.5)
    assert validation.findings({}, single)[0]["passed"] is None
    assert got[1]["threshold"].startswith(">= 17 of 24 (a sign test at 5%)")


def test_most_is_a_majority_a_coin_toss_would_not_give():
    """majority(n): the smallest count of n a one-sided sign test at 5% takes as "most"."""
    assert [validation.majority(n) for n in (36, 24, 21, 16, 8)] == [24, 17, 15, 12, 7]
    for n in (8, 21, 24, 36):
        k = validation.majority(n)
        tail = lambda k: sum(math.comb(n, i) for i in range(k, n + 1)) / 2 ** n
        assert tail(k) <= 0.05 < tail(k - 1)
    # a table too small to say "most" cannot pass
    assert validation.majority(4) == 5


def test_a_finding_fails_where_it_does_not_hold():
    """Where a finding holds on a bare majority, or by less than the table's noise, it fails
    (the check before passed any count above n/2: it could not fail)."""
    cells = [(r, p) for r in (0, 1, 2) for p in (4, 8, 16, 32)]
    # (1) WFBP above BSP on 14 of the 24 cells: more than half, but chance could give it
    ahead = set(cells[:7])
    thr, single = _table(f_wfbp=lambda m, r, p: 1.1 if (r, p) in ahead else 0.95)
    one = validation.findings(thr, single)[0]
    assert one["numbers"]["wins"] == 14 and 14 > 24 / 2
    assert one["passed"] is False and one["threshold"].startswith(">= 17 of 24")
    # ... and on every cell, but by 0.5%: within the table's noise (the YAML's tie, 1%)
    thr, single = _table(f_wfbp=1.005)
    one = validation.findings(thr, single)[0]
    assert one["numbers"]["wins"] == 24 and one["passed"] is False
    assert "median wfbp/bspa2a > 1.01" in one["threshold"]
    # (4) BSP-PS within 20% of BSP-A2A on 14 of 24 cells
    thr, single = _table(f_bspps=lambda m, r, p: 0.9 if (r, p) in ahead else 0.7)
    four = validation.findings(thr, single)[3]
    assert four["numbers"]["wins"] == 14 and four["passed"] is False
    thr, single = _table(f_bspps=0.9)
    assert validation.findings(thr, single)[3]["passed"] is True
    # (3) BERT-Large the lowest at 32 GPUs on 9 of the 15 (network, method) pairs
    thr, single = _table()
    better = [k for k in sorted(thr) if k[0] == "bert" and k[3] == 32][:6]
    for key in better:
        thr[key] = single["bert"] * 32 * 2.0      # above every ResNet-50 figure
    three = validation.findings(thr, single)[2]
    assert three["numbers"]["wins"] == 9 and 9 > 15 / 2 and three["passed"] is False


def test_cli_writes_json_and_markdown(tmp_path, capsys):
    out, md = tmp_path / "v.json", tmp_path / "v.md"
    assert validation.main(["survey", "--network-source", "original", "--output", str(out),
                            "--markdown", str(md), "--no-constants"]) == 0
    text = capsys.readouterr().out
    assert "with datasheet values" not in text and "constants" not in json.loads(out.read_text())
    assert "overall: median |error|" in text and "published: PASS" in text
    assert "without the odd cells: median |error|" in text and "local:bspa2a" in text
    got = json.loads(out.read_text())
    assert got["network_source"] == "original" and len(got["rows"]) == 252
    table = md.read_text()
    assert "| network | cells | median abs. error | cells w/o odd | median w/o odd |" in table
    assert "| (4) " in table and "without the odd cells" in table


# a few cheap cells on every network: one machine and two, all-reduce and parameter servers
SMALL = [("resnet50", r, m, p) for r in (0, 1, 2) for m in ("bspa2a", "bspps") for p in (4, 8)]


def _median_of(nets: dict, cells) -> float:
    return validation.validate("topology", cells, networks=nets)["summary"]["overall"][
        "median_abs_error"]


def test_the_datasheet_figure_first_then_the_shipped_and_each_chosen_constant(
        tmp_path, capsys, monkeypatch):
    cells = [_cell(*c) for c in SMALL]
    monkeypatch.setattr(validation.survey, "cells", lambda *a: cells)
    out, md = tmp_path / "v.json", tmp_path / "v.md"
    assert validation.main(["survey", "--output", str(out), "--markdown", str(md)]) == 0
    text = capsys.readouterr().out
    got = json.loads(out.read_text())
    c = got["constants"]
    shipped = {r: topology.load(n) for r, n in validation.TOPOLOGIES.items()}
    # with datasheet values: every chosen constant at its datasheet value, nothing else
    ds = {r: n.variant(n.datasheet_values()) for r, n in shipped.items()}
    assert c["datasheet"]["summary"] == validation.validate("topology", cells,
                                                            networks=ds)["summary"]
    assert c["shipped"]["summary"] == got["summary"]
    # the reuse of earlier passes changes no row
    assert got["rows"] == json.loads(json.dumps(validation.validate("topology", cells)["rows"]))
    # printed first, before the shipped figure, in the text and in the Markdown
    figure = f"{100 * c['datasheet']['summary']['overall']['median_abs_error']:.1f}%"
    # the best-method score leads, the datasheet figure first, then the median |error|
    picks = [c["datasheet"]["best_method"], got["best_method"]]
    assert [b["groups"] for b in picks] == [6, 6]
    assert text.splitlines()[1:3] == [
        score.headline(b, "published") + f" ({kind})"
        for b, kind in zip(picks, ("datasheet values", "shipped constants"))]
    # beside the shipped score, how often the published best is among the interval-tied picks
    assert text.splitlines()[3] == validation.ties_line(got["interval_ties"]) + \
        " (shipped constants)"
    head = text.splitlines()[4]
    assert head.startswith(f"Median |error| over 12 cells: {figure} with datasheet values")
    assert head.index("with datasheet values") < head.index("with the shipped constants")
    assert text.index("With datasheet values") < text.index("With the shipped constants")
    assert md.read_text().startswith("best method: the model picks the published best in ")
    assert f"Median |error| over 12 cells: {figure} with datasheet" in md.read_text()
    # each chosen constant alone at its datasheet value, x 0.75 and x 1.25
    chosen = {g["constant"]: g for g in c["chosen"]}
    assert set(chosen) == {"intra_node latency", "intra_node rate (bandwidth x efficiency)",
                           "inter_node and servers rate (bandwidth x efficiency)"}
    rate = chosen["intra_node rate (bandwidth x efficiency)"]
    assert (rate["shipped"], rate["datasheet"]) == ("3.9GB/s x 1", "15.754GB/s x 0.91")
    assert rate["median_abs_error"]["shipped"] == got["summary"]["overall"]["median_abs_error"]
    assert rate["median_abs_error"]["x0.75"] == _median_of(
        {r: n.variant({"intra_node.bandwidth": 3.9e9 * 0.75}) for r, n in shipped.items()},
        cells)
    stream = chosen["inter_node and servers rate (bandwidth x efficiency)"]
    assert stream["median_abs_error"]["datasheet"] == _median_of(
        {**shipped, 2: shipped[2].variant({f"{s}.{f}": v for s in ("inter_node", "servers")
                                           for f, v in (("bandwidth", 12.5e9),
                                                        ("efficiency", 0.98))})}, cells)
    assert set(stream["findings_passed"]) == {"datasheet", "x0.75", "shipped", "x1.25"}
    line = next(x for x in text.splitlines() if x.startswith("intra_node rate"))
    assert "3.9GB/s x 1" in line and "15.754GB/s x 0.91" in line
    assert "| constant | in | shipped | datasheet | at datasheet | x0.75 | shipped | x1.25 " \
        in md.read_text()
    # every constant's source, in the JSON
    prov = c["provenance"]
    assert prov["topology"]["survey-10gbe"]["intra_node.bandwidth"]["datasheet"] == "15.754GB/s"
    assert prov["topology"]["survey-10gbe"]["inter_node.bandwidth"]["kind"] == "datasheet"
    assert prov["profiles"]["h200_resnet50_bs64.json"]["forward_s"]["kind"] == "measured"
    assert c["kinds"]["chosen"] == 13 and "none given" not in c["kinds"]


@pytest.mark.parametrize("argv, words", [
    (["compare"], "invalid choice: 'compare'"),
    (["survey", "--network-source", "measured"], "invalid choice: 'measured'"),
    (["survey", "--output", "{tmp}"], "is a folder"),
    (["survey", "--markdown", "{tmp}/no/such/../x.md"], "--markdown"),
])
def test_bad_input_is_one_line(argv, words, tmp_path, capsys):
    (tmp_path / "no").write_text("a file where a folder should be")
    argv = [a.replace("{tmp}", str(tmp_path)) for a in argv]
    assert validation.main(argv) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    lines = captured.err.splitlines()
    assert len(lines) == 1 and words in lines[0] and lines[0].startswith("ddlbench: error:")


# ------------------------------------------------------------------ the best method, scored

def test_best_method_is_scored_per_group_of_the_table(full):
    """Every (model, network, P) group of the table is scored: the pick is the method of the
    highest prediction (of those tied for it, the one published slowest), exact when it has
    the highest published figure, within when its published figure is within 2% of the
    highest; recomputed here from the rows, with ties broken both ways."""
    groups = {}
    for r in full["rows"]:
        groups.setdefault((r["model"], r["rdma"], r["nworkers"]), []).append(r)
    counts = {"exact": 0, "within": 0, "exact_tied": 0, "within_tied": 0, "tied_groups": 0}
    for rows in groups.values():
        top = max(r["predicted"] for r in rows)
        tied = [r for r in rows if r["predicted"] >= top * (1 - 1e-9)]
        best = max(r["published"] for r in rows)
        for suffix, pick in (("", min(tied, key=lambda r: r["published"])),
                             ("_tied", max(tied, key=lambda r: r["published"]))):
            counts["exact" + suffix] += pick["published"] == best
            counts["within" + suffix] += pick["published"] >= 0.98 * best
        counts["tied_groups"] += len(tied) > 1
    got = full["best_method"]
    assert got["groups"] == len(groups) == 36
    assert {k: got[k] for k in counts} == counts
    # every 4-GPU group ties a PS method with its all-reduce analogue (one machine)
    assert counts["tied_groups"] >= 12
    assert -1 <= got["tau_median"] <= 1


def _mutated(key: str, factor: float) -> dict:
    """The survey's topology files with one constant times ``factor`` in each."""
    nets = validation.shipped_networks(survey.cells())
    return {r: n.variant({**n.overrides, key: n.values[key] * factor}) for r, n in nets.items()}


def _passed(result) -> list:
    return [f["passed"] for f in result["findings"]["predicted"]]


def test_a_wrong_constant_fails_findings_1_and_2():
    """A wrong model can fail (1) and (2): with the intra-node link's latency x 100 every
    per-tensor message is dear, WFBP falls under BSP and MG-WFBP is no longer the best of the
    all-to-all methods (ResNet-50 on the fast networks: findings (1) and (2) each on 8 cells,
    as shipped both pass)."""
    cells = [c for c in survey.cells() if c["model"] == "resnet50" and c["rdma"] in (1, 2)
             and c["method"] in survey_methods_a2a()]
    works = validation.workloads(validation._batches(cells))
    assert _passed(validation.validate("topology", cells, works=works))[:2] == [True, True]
    wrong = validation.validate("topology", cells, works=works,
                                networks=_mutated("intra_node.latency", 100))
    assert _passed(wrong)[:2] == [False, False]


def survey_methods_a2a():
    return validation.survey_methods(validation.methods.A2A)


def test_a_wrong_profile_fails_finding_3():
    """A wrong model can fail (3): with BERT-Large's gradients a tenth of their bytes it no
    longer scales worst at 32 GPUs (BSP-A2A, BSP-PS and WFBP-A2A on every network)."""
    import dataclasses
    cells = [c for c in survey.cells() if c["nworkers"] == 32
             and c["method"] in ("bspa2a", "bspps", "wfbp")]
    works = validation.workloads(validation._batches(cells))
    assert _passed(validation.validate("topology", cells, works=works))[2] is True
    work, note = works[("bert", 8)]
    works[("bert", 8)] = (dataclasses.replace(work, nbytes=[b / 10 for b in work.nbytes]),
                          note)
    assert _passed(validation.validate("topology", cells, works=works))[2] is False


def test_a_failing_finding_makes_the_command_exit_1(monkeypatch, capsys):
    """(4) on BSP-PS and BSP-A2A (every cell of both): passes as shipped (exit 0); with the
    workers' inter-node link 100 times as fast (the servers' as shipped) BSP-PS falls behind
    BSP-A2A, (4) fails, and the command says so on stderr and exits 1."""
    cells = [c for c in survey.cells() if c["method"] in ("bspa2a", "bspps")]
    monkeypatch.setattr(validation.survey, "cells", lambda *a: cells)
    assert validation.main(["survey", "--no-constants"]) == 0
    assert "fails" not in capsys.readouterr().err
    wrong = _mutated("inter_node.bandwidth", 100)
    monkeypatch.setattr(validation, "shipped_networks", lambda cells: wrong)
    assert validation.main(["survey", "--no-constants"]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("validation: finding (4) fails on the predictions")

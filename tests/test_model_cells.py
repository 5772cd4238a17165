"""The model's numbers do not move when its code is reorganised: every figure of a fixed table
of cells (the survey's 252 under both network sources with their findings; predict on the
shipped H200 profiles over two topologies, worker counts 1-32, five compressors; --advise)
equals the figures the model gave before the refactor (tests/data/model_cells.json).

The survey's four findings are also pinned apart from that snapshot: computed here from the
published table itself (configs/reference/survey_results.yaml, read with yaml, not the suite's
reader), each equal to what the suite's findings code says of the published table, and each
reproduced by the model's predictions."""
import json
import math
import os
import statistics

import pytest
import yaml

from .conftest import REPO
from .model_cells import DATA, cells

SURVEY = os.path.join(REPO, "configs", "reference", "survey_results.yaml")


@pytest.fixture(scope="module")
def fresh():
    """The cells' figures as the model gives them now (once for the module's tests)."""
    return json.loads(json.dumps(cells()))


def _same(a, b, where):
    if isinstance(a, float) or isinstance(b, float):
        assert isinstance(a, (int, float)) and isinstance(b, (int, float)), where
        assert math.isclose(a, b, rel_tol=1e-12, abs_tol=1e-15), f"{where}: {a!r} != {b!r}"
    elif isinstance(a, list):
        assert isinstance(b, list) and len(a) == len(b), f"{where}: {a!r} != {b!r}"
        for i, (x, y) in enumerate(zip(a, b)):
            _same(x, y, f"{where}[{i}]")
    elif isinstance(a, dict):
        assert isinstance(b, dict) and sorted(a) == sorted(b), f"{where}: {a!r} != {b!r}"
        for k in a:
            _same(a[k], b[k], f"{where}.{k}")
    else:
        assert a == b, f"{where}: {a!r} != {b!r}"


def _by_cell(key, rows):
    """predict's rows by (method, workers): the order of --method all is the registry's."""
    return sorted(rows, key=lambda r: (r[0], r[1])) if key.startswith("predict/") else rows


def test_the_model_gives_the_recorded_figures_on_every_cell(fresh):
    expected = json.load(open(DATA))
    got = fresh
    assert sorted(got) == sorted(expected)
    for key in expected:
        _same(_by_cell(key, got[key]), _by_cell(key, expected[key]), key)


def _published():
    """(model, rdma, method, P) -> samples/s over all GPUs, and each model's 1-GPU figure,
    straight from the YAML."""
    with open(SURVEY) as f:
        doc = yaml.safe_load(f)
    thr = {(c["model"], c["rdma"], c["method"], c["nworkers"]): c["throughput"]
           for c in doc["cells"]}
    assert len(thr) == 252
    return thr, {m: e["single_gpu"] for m, e in doc["models"].items()}


def _need(n):
    """The smallest count of n a one-sided sign test at 5% takes as "most"."""
    return next(k for k in range(n + 1) if sum(math.comb(n, i) for i in range(k, n + 1))
                <= 0.05 * 2 ** n)


def _independent_findings():
    """Each finding's (wins, cells, figure, holds) and its detail in the suite's words."""
    thr, single = _published()
    cells_ = sorted({(m, r, p) for m, r, _, p in thr})
    out = {}
    pairs = [(thr[(m, r, "wfbp", p)], thr[(m, r, "bspa2a", p)]) for m, r, p in cells_]
    wins, med = sum(w > b for w, b in pairs), statistics.median(w / b for w, b in pairs)
    out[1] = (wins, len(pairs), med, wins >= _need(len(pairs)) and med > 1.01,
              f"wfbp > bspa2a on {wins} of {len(pairs)} (model, network, P) cells; median "
              f"wfbp/bspa2a {med:.2f}")
    a2a = ("bspa2a", "wfbp", "mgwfbp", "bytescheduler")
    fast = [(m, r, p) for m, r, p in cells_ if r in (1, 2)]
    tops = [max(a2a, key=lambda x: thr[(m, r, x, p)]) for m, r, p in fast]
    near = sum(thr[(m, r, "mgwfbp", p)] >= 0.99 * thr[(m, r, top, p)]
               for (m, r, p), top in zip(fast, tops))
    tally = ", ".join(f"{x} {tops.count(x)}" for x in a2a if x in tops)
    out[2] = (near, len(fast), tops.count("mgwfbp"), near >= _need(len(fast)),
              f"mgwfbp within 1% of the best of {', '.join(a2a)} on {near} of {len(fast)} cells "
              f"on rdma 1 and 2 (strictly highest on {tops.count('mgwfbp')}); highest per "
              f"cell: {tally}")
    groups = sorted({(r, x) for _, r, x, p in thr if p == 32})
    eff = {(m, r, x): thr[(m, r, x, 32)] / (32 * single[m]) for r, x in groups for m in single}
    lowest = sum(min(single, key=lambda m: eff[(m, r, x)]) == "bert" for r, x in groups)
    medians = {m: statistics.median(eff[(m, r, x)] for r, x in groups) for m in single}
    out[3] = (lowest, len(groups), medians,
              lowest >= _need(len(groups)) and min(medians, key=medians.get) == "bert",
              f"bert lowest of the models on {lowest} of {len(groups)} (network, method) pairs "
              f"at 32 GPUs; median efficiency " + ", ".join(
                  f"{m} {100 * v:.0f}%" for m, v in sorted(medians.items())))
    ratios = [thr[(m, r, "bspps", p)] / thr[(m, r, "bspa2a", p)] for m, r, p in cells_]
    close = sum(abs(q - 1) <= 0.2 for q in ratios)
    out[4] = (close, len(ratios), statistics.median(ratios), close >= _need(len(ratios)),
              f"|bspps/bspa2a - 1| <= 0.2 on {close} of {len(ratios)} (model, network, P) "
              f"cells; median bspps/bspa2a {statistics.median(ratios):.2f}, range "
              f"{min(ratios):.2f}-{max(ratios):.2f}")
    return out


def test_the_survey_findings_on_the_published_table():
    """The published table's own figures for each finding (computed here), as the survey
    states them: WFBP above BSP-A2A on 28 of 36 cells; MG-WFBP within 1% of the best
    all-to-all method on 22 of 24 fast-network cells; BERT-Large's efficiency the lowest on 21
    of 21 pairs at 32 GPUs; BSP-PS within 20% of BSP-A2A on 29 of 36. The suite's findings
    code gives the same counts, figures and verdicts on that table."""
    from ddlbench.model import validation
    mine = _independent_findings()
    assert [mine[k][:2] for k in (1, 2, 3, 4)] == [(28, 36), (22, 24), (21, 21), (29, 36)]
    assert [_need(n) for n in (36, 24, 21)] == [24, 17, 15]
    assert mine[1][2] == pytest.approx(1.0650, abs=5e-5) and mine[2][2] == 21
    assert mine[3][2] == pytest.approx({"resnet50": 0.8499, "bert": 0.1193,
                                        "bert_base": 0.5200}, abs=5e-5)
    assert mine[4][2] == pytest.approx(0.9491, abs=5e-5)
    assert all(mine[k][3] for k in mine)          # every finding holds on the published table
    thr, single = _published()
    suite = validation.findings(thr, single)
    assert [f["id"] for f in suite] == [1, 2, 3, 4]
    for f in suite:
        wins, n, figure, holds, detail = mine[f["id"]]
        assert (f["numbers"]["wins"], f["numbers"]["cells"], f["passed"]) == (wins, n, holds), f
        assert f["numbers"]["need"] == _need(n) and f["detail"] == detail, (f, detail)


def test_the_model_reproduces_each_published_finding(fresh):
    """Under both network sources: validate's findings on the published table are the ones
    computed here, and on its predictions each finding holds as it does on the table."""
    mine = _independent_findings()
    for source in ("topology", "original"):
        rows = fresh[f"survey/{source}/findings"]     # predicted (4), then published (4)
        predicted, published = rows[:4], rows[4:]
        assert published == [[k, mine[k][3], mine[k][4]] for k in (1, 2, 3, 4)], source
        assert [(i, ok) for i, ok, _ in predicted] == [(k, mine[k][3]) for k in (1, 2, 3, 4)], (
            source, predicted)

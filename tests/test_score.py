"""ddlbench.model.score: which method is fastest, scored against the measured answer. Worked
examples with answers computed by hand; no torch."""
import math

import pytest

from ddlbench.model import score


def test_kendall_tau_b_by_hand():
    assert score.kendall_tau([1, 2, 3, 4], [10, 20, 30, 40]) == 1.0
    assert score.kendall_tau([1, 2, 3, 4], [4, 3, 2, 1]) == -1.0
    # pairs (1,2) (1,3) (1,4) (2,3) (2,4) (3,4): one discordant, (2,3) -> (3,2)
    assert score.kendall_tau([1, 2, 3, 4], [1, 3, 2, 4]) == pytest.approx(4 / 6)
    # tau-b with a tie in x: (0,1) tied in x only, (0,2) and (1,2) concordant:
    # 2 / sqrt((3 - 1) (3 - 0))
    assert score.kendall_tau([1, 1, 2], [1, 2, 3]) == pytest.approx(2 / math.sqrt(6))
    assert score.kendall_tau([5], [1]) is None
    assert score.kendall_tau([1, 1, 1], [1, 2, 3]) is None
    with pytest.raises(ValueError):
        score.kendall_tau([1, 2], [1])


def test_best_method_on_a_worked_example():
    groups = {
        # the pick is the best: exact and within, same order
        "a": ({"x": 3.0, "y": 2.0, "z": 1.0}, {"x": 30.0, "y": 20.0, "z": 10.0}),
        # the pick y is measured 1.5% under the best x: not exact, within 2%
        "b": ({"x": 1.0, "y": 2.0}, {"x": 100.0, "y": 98.5}),
        # the pick z is measured 10% under the best: neither; order reversed
        "c": ({"x": 1.0, "y": 2.0, "z": 3.0}, {"x": 100.0, "y": 95.0, "z": 90.0}),
        # one method only: no question, not scored
        "d": ({"x": 1.0}, {"x": 1.0}),
        # a method measured but not predicted is left out of the group
        "e": ({"x": 1.0, "y": 2.0}, {"x": 1.0, "y": 2.0, "w": 9.0}),
    }
    got = score.best_method(groups)
    assert got["groups"] == 4 and got["exact"] == 2 and got["within"] == 3
    rows = {r["group"]: r for r in got["rows"]}
    assert set(rows) == {"a", "b", "c", "e"}
    assert (rows["b"]["pick"], rows["b"]["best"]) == ("y", "x")
    assert rows["b"]["shortfall"] == pytest.approx(0.015)
    assert rows["c"]["shortfall"] == pytest.approx(0.10) and not rows["c"]["within"]
    assert [rows[k]["tau"] for k in "abce"] == [1.0, -1.0, -1.0, 1.0]
    assert got["tau_median"] == 0.0 and got["tau_mean"] == 0.0
    assert rows["e"]["methods"] == ["x", "y"]
    line = score.headline(got)
    assert line == ("best method: the model picks the measured best in 2/4 groups exactly, "
                    "3/4 within 2% of the best's throughput; median Kendall's tau 0.00")
    assert got["tied_groups"] == 0 and got["exact_tied"] == 2
    assert "no group" in score.headline(score.best_method({}))


def test_a_tie_in_the_predictions_earns_nothing():
    """x and y predicted equal: the model cannot tell them apart, so its pick is the one
    measured slowest (not exact, 5% short); broken luckily it would be exact."""
    got = score.best_method({"g": ({"x": 2.0, "y": 2.0, "z": 1.0},
                                   {"x": 95.0, "y": 100.0, "z": 50.0})})
    [row] = got["rows"]
    assert row["tied"] == ["x", "y"] and row["pick"] == "x" and row["best"] == "y"
    assert not row["exact"] and not row["within"] and row["shortfall"] == pytest.approx(0.05)
    assert row["exact_tied"] and row["within_tied"]
    assert (got["exact"], got["exact_tied"], got["tied_groups"]) == (0, 1, 1)
    assert score.headline(got) == (
        "best method: the model picks the measured best in 0/1 groups exactly, 0/1 within 2% "
        "of the best's throughput (1/1 and 1/1 where the model's ties in 1 groups break "
        "luckily); median Kendall's tau 0.82")


def test_grouped_reads_flat_rows_and_skips_missing_figures():
    rows = [{"g": 1, "method": "a", "predicted": 2.0, "measured": 1.0},
            {"g": 1, "method": "b", "predicted": 1.0, "measured": 2.0},
            {"g": 2, "method": "a", "predicted": None, "measured": 1.0}]
    got = score.grouped(rows, lambda r: r["g"])
    assert got == {1: ({"a": 2.0, "b": 1.0}, {"a": 1.0, "b": 2.0})}
    assert score.best_method(got)["exact"] == 0


def test_the_blind_tests_first_score_is_what_its_committed_files_give(capsys):
    """configs/reference/blind_ddp: the committed first predictions against the answers read
    after them score 0/4 exactly, 2/4 within 2% (the figures its README reports)."""
    import importlib.util
    import os
    here = os.path.dirname(os.path.abspath(__file__))
    spec = importlib.util.spec_from_file_location(
        "blind_score", os.path.join(here, "..", "scripts", "blind_score.py"))
    blind = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(blind)
    assert blind.main() == 0
    out = capsys.readouterr().out
    assert ("best method: the model picks the published best in 0/4 groups exactly, 2/4 within "
            "2% of the best's throughput; median Kendall's tau -1.00") in out
    assert "median |error| 7.2% over 8 cells" in out
    assert blind.predicted(25)[16] == pytest.approx(5233.5, abs=0.05)

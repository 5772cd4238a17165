"""The model's numbers do not move when its code is reorganised: every figure of a fixed table
of cells (the survey's 252 under both network sources with their findings; predict on the
shipped H200 profiles over two topologies, worker counts 1-32, five compressors; --advise)
equals the figures the model gave before the refactor (tests/data/model_cells.json)."""
import json
import math

from .model_cells import DATA, cells


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


def test_the_model_gives_the_recorded_figures_on_every_cell():
    expected = json.load(open(DATA))
    got = json.loads(json.dumps(cells()))
    assert sorted(got) == sorted(expected)
    for key in expected:
        _same(_by_cell(key, got[key]), _by_cell(key, expected[key]), key)

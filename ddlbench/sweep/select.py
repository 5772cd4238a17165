"""``--only EXPR``: which cells of a sweep to run.

EXPR is a comma-separated list of conditions that must all hold; a condition is
``AXIS OP VALUE`` with OP one of ``= != < <= > >=`` and, for ``=`` and ``!=``, VALUE may list
alternatives with ``|``. Axes: network, model, bs, method, label, compressor, engine, nworkers,
arch (a2a or ps). Numbers compare as numbers (bs, nworkers). Examples::

    --only method=wfbp|fusion
    --only "nworkers>=4,network!=rdma0"
    --only arch=ps,model=bert

A sweep file's ``skip:`` list takes the same expressions: a cell any of them matches is not
part of the sweep (``skip: ["nworkers=1,network!=loopback"]``).
"""
from __future__ import annotations

import re

from ..errors import UsageError

AXES = ("network", "model", "bs", "method", "label", "compressor", "engine", "nworkers", "arch")
NUMERIC = {"bs", "nworkers"}
_TERM = re.compile(r"^\s*([A-Za-z_]+)\s*(!=|<=|>=|=|<|>)\s*(.+?)\s*$")


def parse(expr: str, what: str = "--only"):
    """A predicate over a cell's axes; bad expressions raise one UsageError line (naming
    ``what``: the flag, or the sweep file's ``skip`` entry)."""
    conditions = []
    for part in [p for p in expr.split(",") if p.strip()]:
        m = _TERM.match(part)
        if not m:
            raise UsageError(f"{what}: cannot read {part.strip()!r}; write AXIS=VALUE, "
                             f"AXIS!=A|B or AXIS>=N (axes: {', '.join(AXES)})")
        axis, op, value = m.groups()
        if axis not in AXES:
            raise UsageError(f"{what}: unknown axis {axis!r} (axes: {', '.join(AXES)})")
        values = [v.strip() for v in value.split("|")]
        if op in ("<", "<=", ">", ">="):
            if axis not in NUMERIC or len(values) != 1:
                raise UsageError(f"{what}: {op} needs a numeric axis "
                                 f"({', '.join(sorted(NUMERIC))}) and one value, got "
                                 f"{part.strip()!r}")
        if axis in NUMERIC:
            try:
                values = [int(v) for v in values]
            except ValueError:
                raise UsageError(f"{what}: {axis} takes integers, got {value!r}") from None
        conditions.append((axis, op, values))
    if not conditions:
        raise UsageError(f"{what}: empty expression")

    def keep(axes: dict) -> bool:
        for axis, op, values in conditions:
            have = axes[axis]
            have = int(have) if axis in NUMERIC else str(have)
            if op == "=" and have not in values:
                return False
            if op == "!=" and have in values:
                return False
            if op in ("<", "<=", ">", ">="):
                v = values[0]
                if not {"<": have < v, "<=": have <= v, ">": have > v, ">=": have >= v}[op]:
                    return False
        return True
    return keep

"""Reading the suite's YAML files (sweeps, network profiles): a file that cannot be read or
parsed is one line naming the file, the line and the problem, never a traceback."""
from __future__ import annotations

from .errors import UsageError


def load(path: str, what: str):
    """The parsed contents of the YAML file ``path`` (``what`` names it in messages)."""
    import yaml
    try:
        with open(path) as f:
            return yaml.safe_load(f)
    except OSError as e:
        raise UsageError(f"cannot read {what} {path}: {e.strerror}") from None
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" at line {mark.line + 1}" if mark else ""
        raise UsageError(f"{what} {path}: malformed YAML{where}: "
                         f"{getattr(e, 'problem', None) or e}") from None

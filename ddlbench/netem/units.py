"""Link rates and buffer sizes in tc's units: parsing them from the user, printing them back."""
from __future__ import annotations

import re

from ..errors import UsageError

_RATE_UNITS = {"bit": 1.0, "kbit": 1e3, "mbit": 1e6, "gbit": 1e9, "tbit": 1e12}
_SIZE_UNITS = {"": 1, "b": 1, "k": 1024, "kb": 1024, "kib": 1024, "m": 1024 ** 2, "mb": 1024 ** 2,
               "mib": 1024 ** 2, "g": 1024 ** 3, "gb": 1024 ** 3, "gib": 1024 ** 3}
_NUMBER = r"([+-]?(?:\d+(?:\.\d*)?|\.\d+)(?:e[+-]?\d+)?)"


def parse_rate(text, what: str = "rate") -> float:
    """A link rate in tc's units (``1gbit``, ``2.5gbit``, ``300mbit``) as bits per second."""
    s = str(text).strip().lower()
    m = re.fullmatch(_NUMBER + r"\s*([a-z/]*)", s)
    if not m or m.group(2) not in _RATE_UNITS:
        raise UsageError(f"malformed {what} {str(text)!r}: expected a number and a unit of "
                         f"{', '.join(_RATE_UNITS)} (e.g. 1gbit, 2.5gbit, 300mbit)")
    value = float(m.group(1)) * _RATE_UNITS[m.group(2)]
    if not value > 0 or value == float("inf"):
        raise UsageError(f"{what} must be positive, got {str(text)!r}")
    return value


def parse_size(text, what: str = "size") -> int:
    """Bytes: ``16M``, ``256kb``, ``1048576`` (k/kb = 1024 bytes, as tc counts buffers)."""
    s = str(text).strip().lower()
    m = re.fullmatch(_NUMBER + r"\s*([a-z]*)", s)
    if not m or m.group(2) not in _SIZE_UNITS:
        raise UsageError(f"malformed {what} {str(text)!r}: expected bytes, e.g. 128kb, 16M")
    value = float(m.group(1)) * _SIZE_UNITS[m.group(2)]
    if not value >= 1 or value == float("inf"):
        raise UsageError(f"{what} must be at least one byte, got {str(text)!r}")
    return int(value)


def looks_like_rate(text: str) -> bool:
    """Whether ``text`` is a bare rate (``1gbit``, ``300mbit``) rather than a profile name."""
    return re.fullmatch(_NUMBER + r"\s*[a-z]*bit", text.lower()) is not None


def format_rate(bps: float | None) -> str:
    if bps is None:
        return "unlimited"
    for unit, scale in (("Gbit/s", 1e9), ("Mbit/s", 1e6), ("kbit/s", 1e3)):
        if bps >= scale:
            return f"{bps / scale:.3g} {unit}"
    return f"{bps:.3g} bit/s"

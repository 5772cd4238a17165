"""Errors the user caused (one line, non-zero exit), a failed parameter server, and the helpers
that read integers from the environment and write whole lines to stderr."""
from __future__ import annotations

import os
import sys

EXIT_USAGE = 2


class UsageError(Exception):
    """Bad input (an unknown model, a batch size <= 0, a missing host file, ...)."""


class PSError(RuntimeError):
    """A parameter server failed or could not be reached; the message names it."""


def env_int(key: str, default: int | None = None, env=None, minimum: int | None = None):
    """The integer in environment variable ``key`` (``default`` when unset or empty); anything
    else is a UsageError naming the variable."""
    value = (os.environ if env is None else env).get(key)
    if value is None or value == "":
        return default
    try:
        number = int(value)
    except ValueError:
        raise UsageError(f"environment variable {key}={value!r} is not an integer") from None
    if minimum is not None and number < minimum:
        raise UsageError(f"environment variable {key} must be >= {minimum}, got {number}")
    return number


def say(line: str) -> None:
    """One line on stderr in one write, so that lines of processes sharing the stream (a
    job's workers and servers) never interleave."""
    sys.stderr.flush()
    os.write(2, (line + "\n").encode(errors="replace"))

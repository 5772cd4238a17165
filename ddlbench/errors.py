"""Errors the user caused (one line, non-zero exit; an argument parser that says so in one line),
a failed parameter server, and the helpers that read integers from the environment, check before
any work that a path can be written, name an exception in one line and write whole lines to
stderr; and the end of an entry point (``finish``: here, not in ``compat``, so that a spawner
that only parses and launches never imports torch: 2 s of every local job's start-up)."""
from __future__ import annotations

import argparse
import os
import re
import sys
import tempfile

EXIT_USAGE = 2


class UsageError(Exception):
    """Bad input (an unknown model, a batch size <= 0, a missing host file, ...). Its message
    is ``shortened``: a value the user gave is echoed, but not 20,000 characters of it."""

    def __init__(self, message="", *args):
        super().__init__(shortened(str(message)), *args)


# An error line's bounds: a word (a run without spaces: a value, a path) longer than WORD is
# shown as its head and tail; a line still longer than LINE keeps its head and tail.
WORD, LINE = 400, 4000
_LONG_WORD = re.compile(r"\S{%d,}" % (WORD + 1))


def shortened(text: str) -> str:
    """``text`` with each word longer than ``WORD`` characters cut to its first 160 and last
    60 and the number left out, and the whole cut in its middle beyond ``LINE``: the one place
    that bounds what an error line echoes."""
    def cut(m):
        w = m.group(0)
        return f"{w[:160]}...[{len(w) - 220} characters]...{w[-60:]}"
    text = _LONG_WORD.sub(cut, text)
    if len(text) > LINE:
        text = (f"{text[:LINE * 3 // 4]} ...[{len(text) - LINE} characters]... "
                f"{text[-LINE // 4:]}")
    return text


class ArgumentParser(argparse.ArgumentParser):
    """argparse, with one line for a bad flag (``PROG: error: MESSAGE``, exit code 2, no usage
    block); with ``raise_errors`` a UsageError instead, for a caller that decides who prints it
    (a job's rank 0)."""

    def __init__(self, *args, raise_errors: bool = False, **kwargs):
        super().__init__(*args, **kwargs)
        self.raise_errors = raise_errors

    def parse_known_args(self, args=None, namespace=None):
        return super().parse_known_args(self._negatives_joined(args), namespace)

    def _negatives_joined(self, args):
        """``--beta -1e-9`` as ``--beta=-1e-9`` for a flag that takes a number: argparse takes
        a negative number in exponent form (or -inf) for a flag and says "expected one
        argument"; joined, the value reaches the flag and its own check ("--beta must be >= 0,
        got -1e-09")."""
        args = list(sys.argv[1:] if args is None else args)
        takes_value = {s for a in self._actions
                       if a.nargs is None and a.option_strings and a.type in (int, float)
                       for s in a.option_strings if s.startswith("--")}
        out, options = [], True
        for arg in args:
            if options and out and out[-1] in takes_value and _NEGATIVE.fullmatch(arg):
                out[-1] = f"{out[-1]}={arg}"
            else:
                out.append(arg)
                options = options and arg != "--"  # after "--": positional arguments only
        return out

    def error(self, message):
        if self.raise_errors:
            raise UsageError(message)
        say(f"{self.prog}: error: {shortened(message)}")
        sys.exit(EXIT_USAGE)


# A negative number as float() reads it, exponent form and -inf included (argparse itself
# knows -1 and -1.5 only).
_NEGATIVE = re.compile(r"-((\d+\.?\d*|\.\d+)([eE][-+]?\d+)?|inf|infinity|nan)", re.I)


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


def check_writable(path: str, what: str = "--output", folder: bool = False) -> None:
    """Before any work: ``path`` can become a file (or, with ``folder``, a folder that takes
    files): not a folder (not a file), and its nearest existing folder takes a new file. One
    line naming ``what`` otherwise; nothing is left behind."""
    if os.path.isdir(path) != folder and os.path.exists(path):
        raise UsageError(f"{what} {path} is a {'file' if folder else 'folder'}; give "
                         f"{'a folder' if folder else 'a file name'}")
    directory = os.path.abspath(path) if folder else os.path.dirname(os.path.abspath(path))
    while not os.path.isdir(directory):
        if os.path.exists(directory):
            raise UsageError(f"{what} {path}: {directory} is not a folder")
        directory = os.path.dirname(directory)
    _check_name_lengths(os.path.relpath(os.path.abspath(path), directory), directory, what, path)
    try:
        fd, tmp = tempfile.mkstemp(prefix=".ddlbench-check-", dir=directory)
    except OSError as e:
        raise UsageError(f"{what} {path} cannot be written ({directory}: "
                         f"{e.strerror or e})") from None
    os.close(fd)
    os.unlink(tmp)


def open_to_write(path: str):
    """``open(path, "w")`` after making the folders ``check_writable`` let through (a path
    whose folders do not exist yet is a path the command makes)."""
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    return open(path, "w")


def _check_name_lengths(made: str, directory: str, what: str, path: str) -> None:
    """Each name of ``made`` (the folders and file to be made in ``directory``) within the file
    system's limit of a file name (NAME_MAX, 255 bytes), else one line naming ``what``."""
    try:
        limit = os.pathconf(directory, "PC_NAME_MAX")
    except (OSError, ValueError, AttributeError):
        limit = 255
    for name in made.split(os.sep):
        size = len(os.fsencode(name))
        if size > limit:
            shown = name if len(name) <= 40 else name[:37] + "..."
            raise UsageError(f"{what} {path}: the name {shown} is {size} bytes long; a file "
                             f"name is at most {limit}")


def read_json(path: str, what: str):
    """The JSON document in file ``path``; a file that cannot be read (a device or pipe such as
    /dev/zero is refused unread: its read need not end) or parsed (nested too deeply
    included) is one UsageError naming ``what`` (e.g. "comm_bench file x.json")."""
    import stat
    try:
        with open(path, "rb") as f:
            if not stat.S_ISREG(os.fstat(f.fileno()).st_mode):
                raise UsageError(f"cannot read {what}: not a regular file (a device, pipe or "
                                 f"socket)")
            data = f.read()
    except OSError as e:
        raise UsageError(f"cannot read {what}: {e.strerror or e}") from None
    return parse_json(data, what)


def parse_json(text, what: str):
    """``json.loads(text)`` (str or bytes); text that is not JSON, or is nested deeper than the
    decoder goes (a RecursionError otherwise), is one UsageError naming ``what``. Every reader
    of a user's JSON goes through here (or ``read_json``)."""
    import json
    try:
        return json.loads(text)
    except RecursionError:
        raise UsageError(f"{what} is not valid JSON: nested too deeply to read") from None
    except (ValueError, UnicodeDecodeError) as e:
        raise UsageError(f"{what} is not valid JSON: {first_line(e)}") from None


def first_line(e: BaseException) -> str:
    """An exception in one line: the first line of its message (else its type). Gloo appends
    generic advice to its transport errors; the cause comes before it."""
    text = str(e).strip().splitlines()
    line = text[0] if text else type(e).__name__
    return line.split(" This is typically caused by")[0]


def run_cli(run, parse_args, argv=None) -> int:
    """A command's ``main``: ``run(parse_args(argv))``; bad input (a UsageError, from parsing
    or from the run) is one line on stderr and exit 2."""
    try:
        return run(parse_args(argv))
    except UsageError as e:
        print(f"ddlbench: error: {e}", file=sys.stderr)
        return EXIT_USAGE


def say(line: str) -> None:
    """One line on stderr in one write, so that lines of processes sharing the stream (a
    job's workers and servers) never interleave."""
    sys.stderr.flush()
    os.write(2, (line + "\n").encode(errors="replace"))


_end_hard = False


def end_hard() -> None:
    """Have ``finish`` end this process with ``os._exit`` (``compat.destroy_process_group``
    says why: once a process group was left, the interpreter's teardown can abort)."""
    global _end_hard
    _end_hard = True


def finish(code: int) -> int:
    """The exit of an entry point: returns ``code``, or, after ``end_hard``, flushes the output,
    finalizes MPI where mpi4py started it (mpirun counts a rank without Finalize as failed)
    and ends the process at once with that code."""
    if _end_hard:
        mpi = sys.modules.get("mpi4py.MPI")
        if mpi is not None and mpi.Is_initialized() and not mpi.Is_finalized():
            mpi.Finalize()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    return code

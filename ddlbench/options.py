"""Typed options: a method or a compressor declares each setting once (default, check, help,
command-line flag, environment fallback) and everything else derives from that declaration."""
from __future__ import annotations

import dataclasses
import math
import os
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

from .errors import UsageError


@dataclass(frozen=True)
class Kind:
    """What values an option takes, and how each consumer says so when one is wrong."""
    name: str
    type: type                          # int, float or str: the command line's conversion
    test: Callable[[Any], bool]         # the value is acceptable
    must: str                           # the training script's phrase: "--flag MUST, got v"
    sweep: str                          # the sweep file's phrase: "k must be SWEEP, got v"
    show: Callable[[Any], str] = str    # the value in a message
    checked_on_cli: bool = True         # False: any string the command line gives will do


def _g(v) -> str:
    return f"{v:g}"


def _is_number(v) -> bool:
    """A finite int or float (nan and inf are never a setting: JSON has no word for them)."""
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def _is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


NONNEG = Kind("nonneg", float, lambda v: _is_number(v) and v >= 0, "must be >= 0",
              "a number >= 0", _g)
POSITIVE = Kind("positive", float, lambda v: _is_number(v) and v > 0, "must be positive",
                "a positive number", _g)
FRACTION = Kind("fraction", float, lambda v: _is_number(v) and 0 < v <= 1,
                "must be in (0, 1]", "a number in (0, 1]")
COUNT = Kind("count", int, lambda v: _is_int(v) and v > 0, "must be positive",
             "a positive integer")
COUNT0 = Kind("count0", int, lambda v: _is_int(v) and v >= 0, "must be >= 0",
              "an integer >= 0")


def count_at_least(minimum: int, unit: str) -> Kind:
    """Integers from ``minimum`` up: a size below which a setting only makes a run crawl (one
    message per few elements). Declare the kind once and share it: owners sharing an option
    must share its kind."""
    return Kind(f"count>={minimum}", int, lambda v: _is_int(v) and v >= minimum,
                f"must be at least {minimum} {unit}", f"an integer >= {minimum}")


def one_of(*values: str) -> Kind:
    """One of a few words (``--ps-clients machine|process``). Declare the kind once and share
    it: owners sharing an option must share its kind."""
    words = " or ".join(values)
    return Kind("|".join(values), str, lambda v: v in values, f"must be {words}",
                f"one of {', '.join(values)}")


NAME = Kind("name", str, lambda v: isinstance(v, str) and v != "" and
            not any(c.isspace() for c in v), "must be a name", "a name", checked_on_cli=False)


@dataclass(frozen=True)
class Spec:
    """One declared option. ``name`` is the field, the argparse destination, the sweep key and
    the shell launchers' variable; ``flag`` the training script's flag."""
    name: str
    default: Any
    kind: Kind
    help: str
    flag: str
    env: str | None = None     # environment variable read when the flag is not given
    must: str = ""             # the error phrase, when more precise than the kind's
    metavar: str | None = None

    def problem(self, value) -> str | None:
        """The training script's one line for a bad value (None: fine)."""
        if value is None or not self.kind.checked_on_cli or self.kind.test(value):
            return None
        return f"{self.flag} {self.must or self.kind.must}, got {self.kind.show(value)}"

    def sweep_problem(self, value) -> str | None:
        """The sweep file's phrase for a bad value (None: fine)."""
        if self.kind.test(value):
            return None
        return f"{self.name} must be {self.kind.sweep}, got {value!r}"

    def parse(self, text: str):
        """A value given as text (a launcher or environment variable): checked, converted;
        one line naming the option when it is not a valid value."""
        try:
            value = self.kind.type(text)
        except ValueError:
            value = None
        if value is None or not self.kind.test(value):
            raise UsageError(f"{self.name} must be {self.kind.sweep}, got {text!r}")
        return value

    def format(self, value) -> str:
        """The value as the command line takes it (integral floats without '.0')."""
        if isinstance(value, float) and value.is_integer():
            return str(int(value))
        return str(value)


def option(default, kind: Kind, help: str, *, flag: str | None = None, env: str | None = None,
           must: str = "", metavar: str | None = None):
    """A field of an options dataclass: its default, kind, help text, flag (default
    ``--name-with-dashes``), environment fallback, error phrase and argparse metavar."""
    return field(default=default, metadata={"ddlbench": dict(
        kind=kind, help=help, flag=flag, env=env, must=must, metavar=metavar)})


@dataclass(frozen=True)
class Options:
    """Base of every options dataclass (``@dataclass(frozen=True) class X(Options)``)."""

    @classmethod
    def specs(cls) -> list[Spec]:
        out = []
        for f in dataclasses.fields(cls):
            meta = f.metadata.get("ddlbench")
            if meta is None:
                raise TypeError(f"{cls.__name__}.{f.name} is not declared with option()")
            out.append(Spec(f.name, f.default, meta["kind"], meta["help"],
                            meta["flag"] or "--" + f.name.replace("_", "-"), meta["env"],
                            meta["must"], meta["metavar"]))
        return out

    @classmethod
    def resolve(cls, values: Mapping[str, Any]) -> "Options":
        """The options from ``values`` (a name missing or None: the default), each checked."""
        given = {}
        for spec in cls.specs():
            value = values.get(spec.name)
            if value is None:
                continue
            problem = spec.problem(value)
            if problem:
                raise UsageError(problem)
            given[spec.name] = value
        return cls(**given)

    def as_dict(self) -> dict:
        return dataclasses.asdict(self)


@dataclass(frozen=True)
class NoOptions(Options):
    """A method or compressor with nothing to set."""


def from_environment(spec: Spec, environ: Mapping[str, str] | None = None):
    """The value of the launcher variable named after the option, else of its environment
    fallback, else None (a bad value: one line naming the option)."""
    environ = os.environ if environ is None else environ
    for key in (spec.name, spec.env):
        if key and environ.get(key, "") != "":
            return spec.parse(environ[key])
    return None


def collect(declarations) -> dict[str, tuple[Spec, list[tuple[str, Any]]]]:
    """Every option of ``declarations`` ((owner id, Options class) pairs) by name: its
    declaration and (owner, default) of each owner declaring it. Owners sharing a name must
    declare it alike (kind, flag, environment fallback)."""
    out: dict[str, tuple[Spec, list]] = {}
    for owner, options in declarations:
        for spec in options.specs():
            first, owners = out.setdefault(spec.name, (spec, []))
            if (first.kind, first.flag, first.env) != (spec.kind, spec.flag, spec.env):
                raise TypeError(f"option {spec.name!r} of {owner} is declared unlike that of "
                                f"{owners[0][0]}")
            owners.append((owner, spec.default))
    return out


def add_flags(group, collected, environ: Mapping[str, str] | None = None) -> None:
    """One argparse flag per collected option. Its default: the environment fallback's text
    when set (argparse converts it and the checks see it like a given value), else the default
    its owners share, else None (each owner then applies its own)."""
    environ = os.environ if environ is None else environ
    for name, (spec, owners) in collected.items():
        by_default: dict[str, list[str]] = {}
        for owner, default in owners:
            shown = "none" if default is None else spec.format(default)
            by_default.setdefault(shown, []).append(owner)
        shared = {default for _, default in owners}
        default = next(iter(shared)) if len(shared) == 1 else None
        if spec.env and environ.get(spec.env):
            default = environ[spec.env]
        where = ("; ".join(f"{', '.join(o)}: {d}" for d, o in by_default.items())
                 if len(shared) > 1 else ", ".join(o for o, _ in owners))
        env = f" (env {spec.env})" if spec.env else ""
        group.add_argument(spec.flag, dest=name, type=spec.kind.type, metavar=spec.metavar,
                           default=default, help=f"{spec.help}{env} [{where}]")


# -- the plain flags of the job-level commands (training script, comm_bench, profiler) -----------

# The training script's steps per timing round (``--num-batches-per-iter``, the original's
# default): a round ends in the method's synchronize (docs/DESIGN.md section 8).
BATCHES_PER_ITER = 10

# Upper bounds of workload sizes and counts: beyond them a run only fails later (out of memory)
# or never ends.
LIMITS = {"--batch-size": 1 << 16, "--sentence-len": 1 << 14, "--image-size": 1 << 13,
          "--num-classes": 1 << 24, "--num-batches-per-iter": 1 << 20, "--num-iters": 1 << 20,
          "--num-warmup-batches": 1 << 20, "--verify": 1 << 20, "--warmup": 1 << 20,
          "--iters": 1 << 20, "--comm-warmup": 1 << 20, "--comm-iters": 1 << 20,
          "--nworkers": 1 << 20, "--nservers": 1 << 20, "--threads": 4096,
          "--seed": (1 << 32) - 1, "--timeout": 1e7, "--rounds": 1 << 20, "--batches": 1 << 20,
          "--vocab-size": 1 << 20}


def add_network_flags(parser, *, label: str = "label of the network, for the record",
                      net: str = "") -> None:
    """``--network`` (a label, env DDLBENCH_NETWORK) and ``--net`` (the emulated network the
    local workers run over, ``ddlbench.netem``; env DDLBENCH_NET), as every job command that
    spawns workers takes them; ``net`` ends the help of ``--net``."""
    parser.add_argument("--network", default=os.environ.get("DDLBENCH_NETWORK", "local"),
                        help=label)
    parser.add_argument("--net", default=os.environ.get("DDLBENCH_NET") or "loopback",
                        metavar="PROFILE",
                        help="emulated network between the local workers (env DDLBENCH_NET): "
                             "loopback, 1gbit, 2.5gbit, 5gbit, ... (configs/networks.yaml), "
                             "rate=R[,burst=B] or target=R,speedup=S; needs root and iproute2"
                             + net)


def add_ps_flags(parser, *, nservers_default, nservers_help: str, what: str) -> None:
    """``--nservers``, ``--partition-bytes`` and ``--ps-clients``: the parameter-server setting
    as the training script has it, for the commands that start servers or model them
    (profiler, comm_bench, predict); ``what`` begins the help of the last two."""
    from .planning import DEFAULT_PARTITION_BYTES, DEFAULT_PS_CLIENTS, PS_CLIENTS
    parser.add_argument("--nservers", type=int, default=nservers_default, help=nservers_help)
    parser.add_argument("--partition-bytes", type=int, default=DEFAULT_PARTITION_BYTES,
                        help=f"{what}the servers' partition size in bytes")
    parser.add_argument("--ps-clients", default=DEFAULT_PS_CLIENTS, choices=PS_CLIENTS,
                        help=f"{what}one client per machine (its workers sum locally first, "
                             "as BytePS) or per worker")


def check_flags(args, positive=(), nonneg=()) -> None:
    """One line for the first of the named flags (``--batch-size``, the attribute
    ``batch_size``) whose value is not a finite number, not positive (``positive``) or not
    >= 0 (``nonneg``), or above its limit in LIMITS. Unset (None) values are skipped."""
    for flags, test, phrase in ((positive, lambda v: v > 0, "positive"),
                                (nonneg, lambda v: v >= 0, "a finite number >= 0")):
        for flag in flags:
            value = getattr(args, flag[2:].replace("-", "_"))
            if value is None:
                continue
            if not (_is_number(value) and test(value)):
                raise UsageError(f"{flag} must be {phrase}, got {_shown(value)}")
            if flag in LIMITS and value > LIMITS[flag]:
                raise UsageError(f"{flag} must be at most {_shown(LIMITS[flag])}, got "
                                 f"{_shown(value)}")


def _shown(value) -> str:
    """A number in a message: integers as written (huge ones shortened), floats as %g."""
    if _is_int(value):
        return str(value) if abs(value) < 10 ** 15 else f"{value:.3g}"
    return f"{value:g}"

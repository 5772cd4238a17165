"""Sweep files: parse, check (every problem at once) and expand into cells.

A cell is one point of the grid network x task x method x engine x nworkers; each cell is run
``tries`` times. Its full configuration (everything that changes what is measured) plus the
suite's version is hashed; that hash keys the cell's tries in the results store.

Each key of a sweep file is declared once, as a field of Sweep made with key(): its default,
kind (check and phrase), help, and whether the results store's header records it. load()
reads the keys from those declarations; describe() writes the package docstring's list.
"""
from __future__ import annotations

import collections
import contextlib
import copy
import dataclasses
import functools
import hashlib
import io
import json
import math
import os
import re
import shlex
import subprocess
import tempfile
from dataclasses import dataclass, field
from typing import Any, Callable

import compression

from .. import methods
from ..errors import UsageError
from ..hosts.procs import ENV_NAME
from ..options import (COUNT, COUNT0, Kind, Options, Spec, count_at_least, one_of,
                       option)
from . import select

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# Per-method keys of a sweep file besides the method's options, the compressor and its options.
METHOD_BASE_KEYS = {"method", "label", "args", "optional"}
# The keys of a task entry, in the training script's order of their flags.
TASK_KEYS = ("model", "batch_size", "image_size", "sentence_len", "num_classes", "args")
# torch, and the real frameworks' lanes (flags.LANE_ENVIRONMENTS): horovod (under mpirun) and
# byteps (BytePS's scheduler and servers started by its shell launcher)
ENGINES = methods.ENGINES
AGGREGATES = ("mean", "median", "olympic")
# calibration_check's default: how far a probe after the tries may move from the calibration
# (a slow minute during calibration put the loopback links 2-5 times too slow: DESIGN section 15)
CHECK_TOLERANCE = 0.2
# Bounds of what a sweep file asks for (a sweep beyond them never ends, and its checks alone
# would run for minutes before a line is printed): a cell's tries (adaptive ones included), the
# cells (each is checked through the training script before anything starts, a few ms each; the
# grid of its axes is bounded before skip too) and the runs (cells x tries). The largest
# shipped sweep, paper.yaml, is 315 cells x 5 tries.
MAX_TRIES = 1000
MAX_CELLS = 10_000
MAX_RUNS = 100_000
# kill_grace's bound (seconds): a run that ignores SIGTERM is SIGKILLed this long after it at the
# latest (an unbounded grace hung the sweep on such a run); a sweep stopped itself (SIGTERM,
# Ctrl-C) gives its run at most STOP_GRACE.
MAX_KILL_GRACE = 600
STOP_GRACE = 10.0
# A file name's limit in bytes (NAME_MAX of Linux's file systems, macOS's and Windows'). A sweep
# names folders after itself, <results>/<date>.<n>-<name>-predicted the longest (n: the day's
# n-th folder of that name, up to 9999), and files after its cells,
# records/<cell>_try<N>_attempt<M>.trace.json the longest.
NAME_MAX = 255
LONGEST_FOLDER = "2025-01-31.9999-{name}-predicted"
MAX_NAME = NAME_MAX - len(LONGEST_FOLDER.format(name=""))
LONGEST_CELL_FILE = "{cell}_try999_attempt999.trace.json"
RDMA_LABELS = {0: "10GbE with TCP/IP", 1: "100GbIB with RDMA", 2: "100GbE with TCP/IP"}
MODEL_NAMES = {"resnet50": "ResNet-50", "bert": "BERT-Large", "bert_base": "BERT-Base",
               "bert_tiny": "BERT-Tiny", "resnet18": "ResNet-18", "vgg16": "VGG-16",
               "densenet121": "DenseNet-121", "mobilenet_v2": "MobileNet-V2",
               "inception_v3": "Inception-V3"}
# Test-only: run `python -m MODULE` instead of the training script under the local launcher.
PROGRAM_ENV = "DDLBENCH_SWEEP_PROGRAM"
TRAIN_MODULE = "ddlbench.train"

# The environment of a sweep's runs (docs/DESIGN.md section 15): a cell runs with exactly the
# configuration it records. Inherited variables that would change what a run measures or how
# it is placed are dropped unless the sweep file's `env:` sets them: the suite's own settings
# (DDLBENCH_NET, the options' fallbacks such as BYTESCHEDULER_PARTITION, DMLC_NUM_SERVER, ...),
# Horovod's, a launcher's placement (a sweep started under mpirun or torchrun), and the shell
# launchers' own lower-case variables (dnn, iters, extra_args, timeline, a method's threshold,
# ...: every lower-case name but the proxies'), which the sweep sets for each run itself.
DROPPED_PREFIXES = ("DDLBENCH_", "DMLC_", "BYTESCHEDULER_", "BYTEPS_", "HOROVOD_",
                    "TORCHELASTIC_", "OMPI_COMM_WORLD_")
DROPPED_NAMES = {"RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR",
                 "MASTER_PORT", "SLURM_PROCID", "SLURM_STEP_NUM_TASKS", "SLURM_LOCALID"}
# ... except where things are (caches, state files, which Horovod build) and test hooks:
PASSED_NAMES = {"DDLBENCH_NETEM_STATE", "DDLBENCH_CACHE", "DDLBENCH_NET_PROBE_S", PROGRAM_ENV,
                "HOROVOD_PY", "HOROVOD_MPIRUN"}
# Inherited variables kept that change code or threads or transports: recorded in each cell's
# configuration (and so in its hash).
RECORDED_PREFIXES = ("OMP_", "MKL_", "KMP_", "NCCL_", "GLOO_")
RECORDED_NAMES = {"DDLBENCH_METHODS", "DDLBENCH_COMPRESSORS", "DDLBENCH_NETWORKS"}


# What a sweep file's env: may not set: the dynamic loader's variables that load a library into
# every process (a shared sweep file would run its code). LD_LIBRARY_PATH (where libraries are
# found) and PYTHONPATH stay settable: recorded in the cell like every env: value.
LOADER_NAMES = {"LD_PRELOAD", "LD_AUDIT"}


def _dropped(name: str) -> bool:
    return name not in PASSED_NAMES and name not in RECORDED_NAMES and (
        name.startswith(DROPPED_PREFIXES) or name in DROPPED_NAMES or
        (name.islower() and not name.endswith("_proxy")))


def inherited_settings(environ=None) -> dict[str, str]:
    """The inherited variables a run keeps that change what it measures (recorded)."""
    environ = os.environ if environ is None else environ
    return {k: environ[k] for k in sorted(environ)
            if k in RECORDED_NAMES or k.startswith(RECORDED_PREFIXES)}


def child_environment(sweep_env: dict, environ=None) -> dict[str, str]:
    """The environment a sweep's run starts with: this one without the dropped variables,
    plus the sweep file's ``env:``."""
    environ = os.environ if environ is None else environ
    return {**{k: v for k, v in environ.items() if not _dropped(k)}, **sweep_env}


def suite_version() -> str:
    from .. import __version__
    return __version__


@dataclass(frozen=True)
class Network:
    name: str              # the key in cell names and the --only axis
    kind: str              # "net": local launcher (emulated or loopback); "rdma": shell launcher
    profile: str | int     # net profile name, or rdma 0/1/2
    label: str             # the table's CONNECTION
    hostfile: str | None = None  # rdma: this network's host files (else the sweep's hostfile)

    def config(self) -> dict:
        return {"name": self.name, "kind": self.kind, "profile": self.profile}

    @property
    def emulated(self) -> bool:
        """An emulated network of the local launcher (not the loopback, not a real
        cluster's)."""
        return self.kind == "net" and self.profile != "loopback"

    def net_args(self) -> list[str]:
        """The local launcher's ``--net`` for this network (none unless ``emulated``)."""
        return ["--net", str(self.profile)] if self.emulated else []


@dataclass(frozen=True)
class Cell:
    network: Network
    task: dict
    method: dict
    engine: str
    nworkers: int
    sweep: "Sweep" = field(compare=False, repr=False)

    @property
    def label(self) -> str:
        return method_label(self.method)

    @property
    def architecture(self) -> str:
        return architecture(self.method["method"])

    @property
    def name(self) -> str:
        parts = [self.network.name, self.sweep.task_name(self.task),
                 self.sweep.label_name(self.method)]
        if self.engine != "torch":
            parts.append(self.engine)
        parts.append(f"n{self.nworkers}")
        return "_".join(parts)

    def config(self) -> dict:
        """Everything that changes what this cell measures (and nothing else)."""
        method = {k: v for k, v in self.method.items() if k not in ("label", "optional")}
        cfg = {"network": self.network.config(), "task": dict(self.task), "method": method,
               "engine": self.engine, "nworkers": self.nworkers,
               "timing": dict(self.sweep.timing), "extra_args": self.sweep.extra_args}
        if self.network.kind == "rdma":
            cfg["hostfile"] = self.sweep.hostfile_for(self.nworkers, self.network)
        program = os.environ.get(PROGRAM_ENV)
        if program:
            cfg["program"] = program
        if self.sweep.env:
            cfg["env"] = dict(self.sweep.env)
        if self.sweep.threads is not None:
            cfg["threads"] = self.sweep.threads
        if self.shares:
            # measured in a job with other methods (each its own replica, warm-up and timed
            # rounds, but the process, its allocator and the process group are the job's)
            cfg["shared_job"] = True
        inherited = {k: v for k, v in inherited_settings().items() if k not in self.sweep.env}
        if inherited:
            cfg["environment"] = inherited
        return cfg

    @property
    def one_machine(self) -> bool | None:
        """Whether the run's workers are on one machine (docs/DESIGN.md section 6, "One
        machine": a PS method then runs no server): the local launcher's over the loopback,
        or one worker; an emulated network puts each worker on a host of its own; None for a
        real cluster's (its host file, and the model's topology, say)."""
        if self.nworkers == 1:
            return True
        if self.network.kind == "net":
            return not self.network.emulated
        return None

    @property
    def shares(self) -> bool:
        """Whether this cell's tries run in jobs shared with other methods (``shared_jobs``):
        the local launcher's cells of the torch engine (a job with parameter-server methods
        has servers, idle under the others)."""
        return (self.sweep.shared_jobs and self.network.kind == "net"
                and self.engine == "torch")

    def job_key(self) -> str:
        """Cells that may share a job have equal keys: everything but the method and its own
        settings (which ``can_join`` checks)."""
        m = {k: v for k, v in self.method.items()
             if k not in settings() and k not in ("method", "label", "optional")}
        compressor = {k: v for k, v in self.method.items()
                      if k == "compressor" or k in compression.option_owners()}
        return json.dumps([self.network.config(), self.task, self.engine, self.nworkers, m,
                           compressor], sort_keys=True, default=str)

    def can_join(self, others: list["Cell"]) -> bool:
        """Whether this cell can run in one job with ``others`` (of its ``job_key``): no
        method twice, and every setting given by one of them is given alike by each of the
        others it applies to (the job's command line carries each flag once)."""
        if any(o.method["method"] == self.method["method"] for o in others):
            return False
        owners = settings()
        pairs = [(x, y) for o in others for x, y in ((self, o), (o, self))]
        return not any(k in x.method and y.method["method"] in applies
                       and y.method.get(k) != x.method[k]
                       for x, y in pairs for k, (_, applies) in owners.items())

    @property
    def hash(self) -> str:
        return cell_hash(self.config())

    def axes(self) -> dict:
        """The values --only filters on."""
        return {"network": self.network.name, "model": self.task["model"],
                "bs": self.task["batch_size"], "method": self.method["method"],
                "label": self.label, "compressor": self.method.get("compressor", "none"),
                "engine": self.engine, "nworkers": self.nworkers,
                "arch": self.architecture}


def job_name(cells: list[Cell]) -> str:
    """A job's name in its log's: the cell's own, or for a shared job the cells' network,
    task and workers with every method label (a hash of them where that grows too long)."""
    if len(cells) == 1:
        return cells[0].name
    c = cells[0]
    labels = "+".join(c.sweep.label_name(x.method) for x in cells)
    if len(labels) > 120:
        labels = hashlib.sha256(labels.encode()).hexdigest()[:12]
    return "_".join([c.network.name, c.sweep.task_name(c.task), f"job-{labels}",
                     f"n{c.nworkers}"])


def cell_hash(config: dict, version: str | None = None) -> str:
    blob = json.dumps({"suite_version": version or suite_version(), "cell": config},
                      sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def _safe(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9.=+-]+", "-", text).strip("-")


def identity_hash(value) -> str:
    """8 hex digits of a task's or method's identity (its JSON, keys sorted)."""
    blob = json.dumps(value, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:8]


def unique_names(values: list, name_of: Callable[[Any], str]) -> dict[str, str]:
    """Each value's name in file names (by its identity's JSON): ``name_of(value)``, and where
    that is empty or shared by another value, a short hash of the value appended (``-h`` and
    8 hex digits), so that no two cells' records or logs share a file; a name no other value
    takes stays as it was (a stored sweep resumes under it)."""
    ids = {json.dumps(v, sort_keys=True, default=str): v for v in values}
    plain = {k: name_of(v) for k, v in ids.items()}
    taken = collections.Counter(plain.values())
    return {k: n if n and taken[n] == 1 else "-".join(filter(None, [n, "h" + identity_hash(v)]))
            for (k, v), n in zip(ids.items(), plain.values())}


def task_key(task: dict) -> str:
    parts = [f"{task['model']}-bs{task['batch_size']}"]
    if "image_size" in task:
        parts.append(f"px{task['image_size']}")
    if "sentence_len" in task:
        parts.append(f"len{task['sentence_len']}")
    return "-".join(parts)


# ``mgwfbp_profile: calibration``: MG-WFBP plans from the sweep's calibration profile
FROM_CALIBRATION = "calibration"


def format_value(v) -> str:
    if isinstance(v, float) and v.is_integer():
        return str(int(v))
    return str(v)


def settings() -> dict:
    """Every per-method setting a sweep file may give, by name -> (flag, the method ids it
    applies to): each method's options (from the method registry), the compressor, and the
    compressors' options (for the methods that take a compressor)."""
    out = {name: (spec, {mid for mid, _ in owners})
           for name, (spec, owners) in methods.option_owners().items()}
    takers = {mid for mid, cls in methods.registry().items()
              if any(cls.accepts(c) is None for c in compression.COMPRESSORS if c != "none")}
    out["compressor"] = (None, set(methods.names()))
    for name, (spec, _) in compression.option_owners().items():
        out[name] = (spec, takers)
    return out


def setting_flag(name: str, spec) -> str:
    return "--compressor" if name == "compressor" else spec.flag


def method_label(m: dict) -> str:
    if m.get("label"):
        return str(m["label"])
    extras = [f"{k}={format_value(m[k])}" for k in settings() if k in m]
    if m.get("args"):
        extras.append(str(m["args"]))
    return " ".join([m["method"], *extras])


def architecture(method_id: str) -> str:
    return methods.architecture(method_id)


# -- the keys of a sweep file, each declared once: a field of Sweep (below) -------------------

def _is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_num(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _kind(name: str, test: Callable[[Any], bool], phrase: str) -> Kind:
    """A kind of sweep-file value: its test, and the phrase of the one line a value failing it
    gives ("KEY must be PHRASE, got VALUE")."""
    return Kind(name, str, test, f"must be {phrase}", phrase)


def _words(items, last: str = "and") -> str:
    """``a, b and c``."""
    items = [str(i) for i in items]
    return f"{', '.join(items[:-1])} {last} {items[-1]}" if len(items) > 1 else "".join(items)


ANY = _kind("any", lambda v: True, "anything")   # checked by the key's own check or elsewhere
BOOL = _kind("bool", lambda v: isinstance(v, bool), "true or false")
SECONDS = _kind("seconds", lambda v: _is_num(v) and v > 0, "a positive number of seconds")
GRACE = _kind("grace", lambda v: _is_num(v) and 0 <= v <= MAX_KILL_GRACE,
              f"a number of seconds from 0 to {MAX_KILL_GRACE}")
FLAGS = _kind("flags", lambda v: not v or isinstance(v, str), "a string of training-script flags")
HOSTFILE = _kind("hostfile", lambda v: isinstance(v, str), "a path (may contain {nworkers})")
FOLDER = _kind("folder", lambda v: isinstance(v, str), "a folder path")
STEPS = _kind("steps", lambda v: v is None or isinstance(v, bool) or (_is_int(v) and v > 0),
              "true, false or a positive number of steps to record")
TOLERANCE = _kind("tolerance", lambda v: v is False or (_is_num(v) and 0 <= v < math.inf),
                  "false or a fraction >= 0 (how far a probe may move)")
ROUNDS = count_at_least(1, "round")
PATHS = _kind("paths", lambda v: not v or (isinstance(v, dict) and all(
    isinstance(k, str) and isinstance(p, str) for k, p in v.items())),
               "a mapping of names to paths")
THROUGHPUT = _kind("throughput", lambda v: v is None or v == "survey" or (
    isinstance(v, dict) and all(_is_num(x) and x > 0 for x in v.values())),
                   "'survey' or a mapping of models to positive samples/s")
OPTIONAL_PATH = _kind("path", lambda v: v is None or isinstance(v, str), "a path")
SHARE = _kind("share", lambda v: _is_num(v) and 0 < v < 1,
              "a fraction between 0 and 1 (0.03: +-3% of the median)")
NAME_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*")
TRIES = _kind("tries", lambda v: _is_int(v) and 0 < v <= MAX_TRIES,
              f"a positive integer, at most {MAX_TRIES}")


def _name_problem(name: str, reading) -> str | None:
    if not NAME_PATTERN.fullmatch(name):
        return f"name {name!r}: use letters, digits, '_', '.', '-'"
    if len(name) > MAX_NAME:
        return (f"name is {len(name)} characters long; at most {MAX_NAME} (the results folder "
                f"<date>.<n>-<name>-predicted must fit a file name's {NAME_MAX} bytes)")
    return None


@dataclass(frozen=True)
class Timing(Options):
    """``timing:``, the training script's timing of every run (a key not given: its default)."""
    warmup: int | None = option(None, COUNT0, "batches before the timed rounds",
                                flag="--num-warmup-batches")
    batches_per_iter: int | None = option(None, ROUNDS, "batches per timed round",
                                          flag="--num-batches-per-iter")
    iters: int | None = option(None, ROUNDS, "timed rounds", flag="--num-iters")


TIMING_FLAGS = {s.name: s.flag for s in Timing.specs()}


@dataclass(frozen=True)
class Predict(Options):
    """``predict:``, what ``benchmarks.py --predict-only`` predicts the cells from
    (ddlbench/sweep/predicted.py)."""
    networks: dict | None = option(None, PATHS, "network -> topology or comm_bench files "
                                                "(rdma: the survey's)")
    profiles: dict | None = option(None, PATHS, "model -> profile (default: the shipped one)")
    device_throughput: Any = option(None, THROUGHPUT, "survey or {model: samples/s}: one "
                                                      "worker's compute rescaled")
    codec: str | None = option(None, OPTIONAL_PATH, "codec_bench --output (the codec's "
                                                    "time per element)")


@dataclass(frozen=True)
class Adaptive(Options):
    """``adaptive:``, more rounds of tries for the cells whose 95% interval is too wide."""
    target: float = option(None, SHARE, "the widest interval left alone, its half-width as a "
                                        "fraction of the median (0.03: +-3%)")
    max_tries: int = option(None, COUNT, "a cell's tries at most (more than tries)")


@dataclass
class _Reading:
    """A sweep file being read: its path, the problems and notes so far, and the value of each
    key read so far (None for one refused: the checks against it are left for later)."""
    path: str
    problems: list = field(default_factory=list)
    notes: list = field(default_factory=list)
    got: dict = field(default_factory=dict)

    @property
    def stem(self) -> str:
        return os.path.splitext(os.path.basename(self.path))[0]


@dataclass(frozen=True)
class Key:
    """A key of a sweep file, declared with key() as a field of Sweep."""
    name: str                   # the key in the file
    attr: str                   # Sweep's attribute
    spec: Spec                  # default, kind (the check and its phrase) and help
    example: str | None         # the docstring's value (None: the default's)
    header: Any                 # recorded in Sweep.header(): True, or what of the sweep
    each: Callable | None       # a non-empty list, each entry parsed by this (None: dropped)
    read: Callable | None       # its own parser: (value, reading) -> attribute
    convert: Callable | None    # (checked value, reading) -> attribute
    check: Callable | None      # (attribute, reading) -> a problem, with the keys read before

    def value(self, raw: dict, reading: _Reading):
        """This key's attribute from the file's mapping, checked (problems noted in
        ``reading``): the default where the file does not give the key or its value is
        refused (the keys after it then see None). A key whose default is None takes None
        (null) as not given."""
        default = self.spec.default
        given = raw[self.name] if self.name in raw else copy.deepcopy(default)
        if self.each:
            value = [x for x in (self.each(e, reading)
                                 for e in _list(given, self.name, reading.problems))
                     if x is not None]
        elif self.read:
            value = self.read(given, reading)
        elif not (given is None and default is None) and not self.spec.kind.test(given):
            reading.problems.append(self.spec.sweep_problem(given))
            reading.got[self.name] = None
            return self.convert(default, reading) if self.convert else copy.deepcopy(default)
        else:
            value = self.convert(given, reading) if self.convert else given
            problem = self.check and self.check(value, reading)
            if problem:
                reading.problems.append(problem)
        reading.got[self.name] = value
        return value


def key(default, kind: Kind | None, help: str, *, example: str | None = None, header=True,
        name: str | None = None, each=None, read=None, convert=None, check=None):
    """A field of Sweep that is a key of a sweep file: option()'s default, kind and help (the
    docstring's comment), and the sweep's own: its ``example`` in the docstring (default: the
    default), whether ``header()`` records it (or a function of the sweep: what it records),
    its ``name`` in the file (default: the field's), and how it is read: a list whose entries
    ``each`` parses, or a parser of its own (``read``), or else the kind's check, then
    ``convert`` to the attribute and ``check`` against the keys read before it."""
    declared = option(default, kind, help)
    metadata = {**declared.metadata, "sweep": dict(
        name=name, example=example, header=header, each=each, read=read, convert=convert,
        check=check, default=default)}
    if isinstance(default, (list, dict)):
        return field(default_factory=lambda: copy.deepcopy(default), metadata=metadata)
    return field(default=default, metadata=metadata)


def _list(value, key, problems) -> list:
    if value is None:
        problems.append(f"{key} is required")
        return []
    if not isinstance(value, list) or not value:
        problems.append(f"{key} must be a non-empty list")
        return []
    return value


def _group(name: str, options, value, reading: _Reading) -> dict:
    """The mapping of key ``name``, whose sub-keys ``options`` (an Options class) declares: an
    unknown or ill-valued one is a problem ("NAME: ...")."""
    specs = options.specs()
    if not isinstance(value, dict):
        reading.problems.append(f"{name} must be a mapping ({', '.join(s.name for s in specs)})")
        return {}
    for k in sorted(set(value) - {s.name for s in specs}, key=str):
        reading.problems.append(f"{name}: unknown key {k!r}")
    for s in specs:
        problem = s.sweep_problem(value[s.name]) if s.name in value else None
        if problem:
            reading.problems.append(f"{name}: {problem}")
    return dict(value)


def _timing(value, reading: _Reading) -> dict:
    return _group("timing", Timing, value or {}, reading)


def _predict(value, reading: _Reading) -> dict:
    return _group("predict", Predict, {} if value is None else value, reading)


def _within_tries(min_ok, reading: _Reading) -> str | None:
    """min_ok's problem with tries (none where tries was refused)."""
    tries = reading.got["tries"]
    if min_ok is not None and tries is not None and min_ok > tries:
        return f"min_ok must be an integer from 1 to tries ({tries}), got {min_ok!r}"
    return None


def _adaptive(value, reading: _Reading) -> dict | None:
    """``adaptive: {target: T, max_tries: M}``, both given: T a fraction of the median in
    (0, 1), M more than ``tries``."""
    if value is None or value is False:
        return None
    target, most = Adaptive.specs()
    if not isinstance(value, dict) or set(value) != {target.name, most.name}:
        reading.problems.append(f"adaptive must be a mapping of target (the interval's "
                                f"half-width as a fraction of the median, e.g. 0.03) and "
                                f"max_tries, got {value!r}")
        return None
    tries, problems = reading.got["tries"], [target.sweep_problem(value["target"])]
    most = value["max_tries"]
    if tries is not None and not (_is_int(most) and tries < most <= MAX_TRIES):
        problems.append(f"max_tries must be an integer above tries ({tries!r}) and at most "
                        f"{MAX_TRIES}, got {most!r}")
    problems = [f"adaptive {p}" for p in problems if p]
    reading.problems += problems
    return None if problems else {"target": float(value["target"]),
                                  "max_tries": int(value["max_tries"])}


def _skip(value, reading: _Reading) -> list[str]:
    """``skip:``, a list of --only expressions, each checked."""
    if value is None:
        return []
    items = [value] if isinstance(value, str) else value
    if not isinstance(items, list) or not all(isinstance(e, str) for e in items):
        reading.problems.append("skip must be a list of --only expressions (AXIS=VALUE,...)")
        return []
    out = []
    for e in items:
        try:
            select.parse(e, f"skip entry {e!r}")
            out.append(e)
        except UsageError as err:
            reading.problems.append(str(err))
    return out


def _env(value, reading: _Reading) -> dict[str, str]:
    """``env:``, variable name -> value (a string or a number)."""
    if value is None:
        return {}
    if not isinstance(value, dict):
        reading.problems.append("env must be a mapping of environment variables to values")
        return {}
    out = {}
    for k, v in value.items():
        if not (isinstance(k, str) and ENV_NAME.fullmatch(k)):
            reading.problems.append(f"env: {k!r} is not a variable name")
        elif k in LOADER_NAMES:
            reading.problems.append(f"env: {k} is refused: it loads code of its own into "
                                    f"every process of every run (set it in the shell that "
                                    f"starts the sweep, if it is meant)")
        elif isinstance(v, bool) or not isinstance(v, (str, int, float)) or \
                (isinstance(v, float) and not math.isfinite(v)) or "\0" in str(v):
            reading.problems.append(f"env: {k} must be a string or a number, got {v!r}")
        else:
            out[k] = v if isinstance(v, str) else format_value(v)
    return out


def _root(value: str) -> str:
    return value if os.path.isabs(value) else os.path.join(REPO, value)


def _worker_count(n, reading: _Reading) -> int | None:
    if COUNT.test(n):
        return n
    reading.problems.append(f"nworkers entry {n!r} is not a positive integer")
    return None


def _engine(e, reading: _Reading):
    if not isinstance(e, str) or e not in ENGINES:
        reading.problems.append(f"engine {e!r}: use one of {', '.join(ENGINES)}")
        return None   # (dropped: no cell is made of it)
    return e


def _network(x, reading: _Reading) -> Network | None:
    """A network entry: `rdma0|rdma1|rdma2` or {rdma: 0|1|2} (a real cluster, through the
    shell launchers), `local`, a profile name, or {net: PROFILE} (the local launcher, emulated
    with --net unless the profile is loopback); an optional `label` names it in tables;
    `optional: true` on an emulated one leaves it out, with a note, where this machine cannot
    emulate (not root, no iproute2)."""
    problems, notes, label = reading.problems, reading.notes, None
    if isinstance(x, str):
        m = re.fullmatch(r"rdma(\d+)", x)
        x = {"rdma": int(m.group(1))} if m else {"net": x}
    if not isinstance(x, dict):
        problems.append(f"network {x!r}: a name, {{rdma: 0|1|2}} or {{net: PROFILE}}")
        return None
    for k in sorted(set(x) - {"rdma", "net", "label", "optional", "hostfile"}, key=str):
        problems.append(f"network {x!r}: unknown key {k!r}")
    hostfile = x.get("hostfile")
    if hostfile is not None and ("rdma" not in x or not isinstance(hostfile, str)
                                 or not hostfile.strip()):
        problems.append(f"network {x!r}: hostfile is a path (may contain {{nworkers}}) for an "
                        f"rdma network")
        return None
    label = x.get("label")
    if label is not None and not (isinstance(label, str) and label.strip()):
        problems.append(f"network {x!r}: label must be a non-empty string")
        return None
    if ("rdma" in x) == ("net" in x):
        problems.append(f"network {x!r}: give exactly one of rdma and net")
        return None
    if "rdma" in x:
        r = x["rdma"]
        if r not in RDMA_LABELS or not _is_int(r):
            problems.append(f"network {x!r}: rdma must be 0 (10GbE TCP), 1 (100Gb IB RDMA) or "
                            f"2 (TCP over the 100Gb fabric)")
            return None
        return Network(f"rdma{r}", "rdma", r, str(label or RDMA_LABELS[r]), hostfile)
    profile = x["net"]
    if not isinstance(profile, str) or not re.fullmatch(r"[A-Za-z0-9_.,=+-]+", profile):
        problems.append(f"network {x!r}: net must be a profile name (configs/networks.yaml) "
                        f"or rate=R")
        return None
    if profile in ("local", "loopback"):
        return Network(profile, "net", "loopback", str(label or profile))
    if x.get("optional"):
        from ..netem.links import unavailable_reason
        why = unavailable_reason()
        if why:
            notes.append(f"optional network {profile} left out: {why}")
            return None
    return Network(_safe(profile), "net", profile, str(label or f"{profile} (emulated)"))


def _task(t, reading: _Reading) -> dict | None:
    problems = reading.problems
    if not isinstance(t, dict) or "model" not in t or "batch_size" not in t:
        problems.append(f"task {t!r} needs model and batch_size")
        return None
    if not isinstance(t["model"], str) or not re.fullmatch(r"[A-Za-z0-9_.-]+", t["model"]):
        problems.append(f"task {t!r}: model must be a model name, got {t['model']!r}")
        return None
    for k in sorted(set(t) - set(TASK_KEYS), key=str):
        problems.append(f"task {t['model']}: unknown key {k!r}")
    for k in ("batch_size", "image_size", "sentence_len", "num_classes"):
        if k in t and not (_is_int(t[k]) and t[k] > 0):
            problems.append(f"task {t['model']}: {k} must be a positive integer, got {t[k]!r}")
    if "args" in t and not isinstance(t["args"], str):
        problems.append(f"task {t['model']}: args must be a string of training-script flags")
    return {k: t[k] for k in TASK_KEYS if k in t}


def _method(m, reading: _Reading) -> dict | None:
    problems, notes = reading.problems, reading.notes
    m = {"method": m} if isinstance(m, str) else m
    if not isinstance(m, dict) or not isinstance(m.get("method"), str):
        problems.append(f"method {m!r} needs a method id")
        return None
    mid = m["method"]
    known = settings()
    for k in sorted(set(m) - METHOD_BASE_KEYS - set(known), key=str):
        problems.append(f"method {mid}: unknown key {k!r}")
    try:
        cls = methods.lookup(mid)
    except Exception as e:  # UsageError, or a method module failing to import
        if m.get("optional"):
            notes.append(f"optional method {mid} left out: {str(e).splitlines()[0]}")
            return None
        cls = None  # reported by _check_names
    for k, (spec, applies) in known.items():
        if k not in m or k == "compressor":
            continue
        if cls is not None and mid in methods.registry() and mid not in applies:
            problems.append(f"method {mid}: {k} applies only to {', '.join(sorted(applies))}")
        problem = spec.sweep_problem(m[k])
        if problem:
            problems.append(f"method {mid}: {problem}")
    comp = m.get("compressor", "none")
    if not isinstance(comp, str) or comp == "" or any(c.isspace() for c in comp):
        problems.append(f"method {mid}: compressor must be a name, got {comp!r}")
    elif comp != "none" and cls is not None:
        why = cls.accepts(comp)
        if why is not None and cls.architecture == methods.PS:
            problems.append(f"method {mid}: a parameter-server method takes compressor none "
                            f"only, got {comp!r}")
        elif why is not None:
            problems.append(f"method {mid}: cannot take compressor {comp!r}: {why}")
    if "args" in m and not isinstance(m["args"], str):
        problems.append(f"method {mid}: args must be a string of training-script flags")
    if "label" in m and not (isinstance(m["label"], str) and m["label"].strip()):
        problems.append(f"method {mid}: label must be a non-empty string, got {m['label']!r}")
        return None
    return dict(m)




@dataclass
class Sweep:
    """A sweep file, read and checked: one attribute per key, each declared here once with
    key() (its default, check, help and place in the header), then the file's path and the
    notes its reading left (an optional network or method left out)."""
    name: str = key(None, ANY, f"letters, digits, '_', '.', '-', at most {MAX_NAME} (default: "
                               f"the file's name)",
                    example="quick", convert=lambda v, r: str(v or r.stem), check=_name_problem)
    extends: str | None = key(
        None, ANY, "another sweep file (a preset or a path) whose keys this file's replace, "
                   "each whole (name is never inherited)", example="model-check", header=False)
    networks: list = key(
        ["local"], None,
        "local / loopback / {net: 5gbit}: the local launcher (python -m ddlbench.train "
        "--nworkers N [--net PROFILE])\nrdma0 / {rdma: 1}: a real cluster through the shell "
        "launchers (horovod/horovod_mpi_cj.sh, bytescheduler/..., byteps/...)\n{rdma: 0, "
        "hostfile: F}: the same on the hosts of F (may contain {nworkers}; a standing emulated "
        "cluster's host file)\n{net: 1gbit, optional: true}: left out, with a note, where this "
        "machine cannot emulate (not root, no iproute2)\nlabel: a network's name in tables",
        each=_network,
        header=lambda s: [dict(n.config(), label=n.label) for n in s.networks])
    tasks: list = key(
        None, None, f"required; each a mapping of {_words(TASK_KEYS)} (training-script flags); "
                    f"model and batch_size required",
        example="\n  - {model: resnet18, batch_size: 16, image_size: 32}",
        each=_task)
    methods: list = key(
        None, None, "required; each a method id (docs/DESIGN.md section 2) or a mapping of "
                    "method (the id), its settings (its options and its compressor's, named as "
                    "python -m ddlbench.train --help names them, - as _; compressor), label, "
                    "args (training-script flags) and optional (true: left out, with a note, "
                    "where it cannot load)",
        example="\n  - wfbp\n  - {method: fusion, threshold: 67108864}",
        each=_method)
    nworkers: list = key([1], None, "workers of each cell", each=_worker_count)
    skip: list = key([], None, "--only expressions: the cells they match are left out (here: "
                               "1 worker on the local network only; default: none)",
                     example='["nworkers=1,network!=local"]', read=_skip, header=False)
    engines: list = key(["torch"], None, _words(ENGINES, "or"), each=_engine)
    tries: int = key(5, TRIES, f"runs of each cell, at most {MAX_TRIES} (a sweep: at most "
                               f"{MAX_CELLS} cells, {MAX_RUNS} runs)")
    min_ok: int | None = key(
        None, COUNT, "fewer successful tries: the cell is marked (default: half the tries, "
                     "rounded up)", example="3",
        check=_within_tries,
        header=lambda s: s.min_successes)
    aggregate: str = key("mean", one_of(*AGGREGATES), _words(AGGREGATES, "or"))
    timing: dict = key(
        {}, None, f"the training script's {_words(s.flag for s in Timing.specs())} (a key not "
                  f"given: its default)",
        example="{warmup: 2, batches_per_iter: 5, iters: 3}", read=_timing)
    threads: int | None = key(
        None, COUNT, "CPU threads per worker in every run and profile (default: the cores it "
                     "is pinned to, so 1 worker on 2 cores gets 2)", example="1", header=False)
    timeout: float = key(1800, SECONDS, "seconds per run; then the whole process group is "
                                        "killed", convert=lambda v, r: float(v))
    kill_grace: float = key(15, GRACE, "seconds between SIGTERM and SIGKILL of a timed-out "
                                       f"run (at most {MAX_KILL_GRACE})",
                            convert=lambda v, r: float(v), header=False)
    hostfile: str = key("configs/cluster{nworkers}", HOSTFILE,
                        "rdma networks: the host file of each worker count", header=False)
    extra_args: str = key("", FLAGS, "passed through to the training script",
                          convert=lambda v, r: v or "")
    env: dict = key(
        {}, None, "variables for every run; inherited suite settings (DDLBENCH_*, DMLC_*, "
                  "BYTESCHEDULER_*, BYTEPS_*, HOROVOD_*) are dropped, the rest that matters "
                  "(OMP_*, NCCL_*, GLOO_*) recorded and hashed; LD_PRELOAD and LD_AUDIT are "
                  "refused", example="{OMP_NUM_THREADS: 1}",
        read=_env)
    results_root: str = key("results", FOLDER, "results/<date>-<name>/ (the store and the "
                                               "reports)", name="results", header=False,
                            convert=lambda v, r: _root(v or "results"))
    logs_root: str = key("logs", FOLDER, "logs/<date>-<name>/<cell>_try<N>.log", name="logs",
                         header=False, convert=lambda v, r: _root(v or "logs"))
    estimate_s: float = key(60, SECONDS, "--dry-run's guess for a run with no history in the "
                                         "store", convert=lambda v, r: float(v), header=False)
    # -1 every timed step, N the first N, 0 none
    timeline: int = key(False, STEPS, "true: keep each try's Chrome trace beside its record "
                                      "(records/<cell>_try<N>.trace.json); N: its first N "
                                      "steps", convert=lambda v, r: -1 if v is True else v or 0)
    predict: dict = key(
        {}, None, "benchmarks.py --predict-only: what the model predicts the cells from "
                  "(ddlbench/sweep/predicted.py)\n"
                  + "\n".join(f"{s.name}: {s.help}" for s in Predict.specs()),
        example="\n  networks: {rdma0: survey-10gbe}\n  device_throughput: survey",
        read=_predict, header=False)
    calibrate: bool = key(False, BOOL, "true: profiler and comm_bench first (local networks), "
                                       "then every cell predicted beside its measurement")
    extrapolate: bool = key(
        False, BOOL, "true (with calibrate): calibrate each task and network at the sweep's "
                     "smallest worker count above one only, and predict the larger counts "
                     "from it (the measured ring's steps at more workers, the compute slowed "
                     "by the workers sharing the cores): the model's extrapolation, tested",
        check=lambda v, r: v and not r.got["calibrate"] and
        "extrapolate: true needs calibrate: true (it says which worker count is calibrated)")
    pace: bool = key(
        False, BOOL, "true (with calibrate): a short profiler run before each job and each "
                     "try predicted again at the machine's pace then",
        check=lambda v, r: v and (
            not r.got["calibrate"] and "pace: true needs calibrate: true (the probe is "
            "compared with the calibration's profile)" or r.got["extrapolate"] and
            "pace: true and extrapolate: true do not go together (a probe at more workers "
            "measures the sharing of the cores the extrapolation predicts)"))
    calibration_check: float = key(
        None, TOLERANCE, f"with calibrate (default {CHECK_TOLERANCE:g}; false: none): after the "
                         "tries, each network's all-reduce (1-16 MiB) and each profile's "
                         "compute timed again; a probe off the calibration by more than this "
                         "fraction is reported, its job run again and its cells predicted "
                         "again", example=f"{CHECK_TOLERANCE:g}",
        convert=lambda v, r: float(v if v is not None else
                                   CHECK_TOLERANCE if r.got["calibrate"] else 0),
        check=lambda v, r: v and not r.got["calibrate"] and
        "calibration_check needs calibrate: true (its probes are compared with the "
        "calibration)")
    seed: int | None = key(
        None, COUNT0, "the tries run round-robin (try 0 of every cell, then try 1, ...), each "
                      "round shuffled by this seed; default: the one the store recorded, else "
                      "one chosen when the store starts", example="12345")
    shared_jobs: bool = key(
        False, BOOL, "true: a round's all-to-all tries of one task, network and worker count "
                     "run as one job (--method a,b,...), each method its own replica, warm-up "
                     "and record; the start-up is paid once per job")
    adaptive: dict | None = key(
        None, None, "more rounds of tries for the cells whose 95% interval is too wide "
                    "(default: none)\n" + "\n".join(f"{s.name}: {s.help}"
                                                    for s in Adaptive.specs()),
        example="\n  target: 0.03\n  max_tries: 5", read=_adaptive)
    path: str = ""
    notes: list = field(default_factory=list)

    def _unique(self) -> tuple[dict, dict]:
        """The tasks' and methods' names in file names (``unique_names``), kept while the
        lists are the same objects."""
        key = (tuple(map(id, self.tasks)), tuple(map(id, self.methods)))
        if getattr(self, "_names_key", None) != key:
            self._names = (unique_names(self.tasks, task_key),
                           unique_names(self.methods, lambda m: _safe(method_label(m))))
            self._names_key = key
        return self._names

    def task_name(self, task: dict) -> str:
        """``task_key``, unless another task shares it (then a hash of the task appended)."""
        key = json.dumps(task, sort_keys=True, default=str)
        return self._unique()[0].get(key) or task_key(task)

    def label_name(self, method: dict) -> str:
        """The method's label as file names take it; made unique as ``task_name``."""
        key = json.dumps(method, sort_keys=True, default=str)
        return self._unique()[1].get(key) or _safe(method_label(method))

    def cells(self) -> list[Cell]:
        drop = [select.parse(e, "skip") for e in self.skip]
        every = [Cell(net, task, method, engine, n, self) for net in self.networks
                 for task in self.tasks for method in self.methods for engine in self.engines
                 for n in self.nworkers]
        return [c for c in every if not any(d(c.axes()) for d in drop)]

    def hostfile_for(self, nworkers: int, network: Network | None = None) -> str:
        """The host file of ``nworkers`` on ``network`` (its own ``hostfile``, else the
        sweep's), ``{nworkers}`` filled in."""
        path = (network and network.hostfile) or self.hostfile
        return path.replace("{nworkers}", str(nworkers))

    @property
    def min_successes(self) -> int:
        return self.min_ok if self.min_ok is not None else max(1, math.ceil(self.tries / 2))

    def header(self) -> dict:
        """What the report needs to know about the sweep, stored with the results: the file
        and the keys declared to be recorded."""
        return {"file": self.path, **{
            k.name: k.header(self) if callable(k.header) else getattr(self, k.attr)
            for k in keys() if k.header}}


@functools.cache
def keys() -> tuple[Key, ...]:
    """Every key of a sweep file, in Sweep's order (the docstring's)."""
    out = []
    for f in dataclasses.fields(Sweep):
        if "sweep" in f.metadata:
            sweep = dict(f.metadata["sweep"])
            name, default = sweep.pop("name") or f.name, sweep.pop("default")
            meta = f.metadata["ddlbench"]
            out.append(Key(name, f.name, Spec(name, default, meta["kind"], meta["help"], ""),
                           **sweep))
    return tuple(out)


def describe(width: int = 99, column: int = 31) -> str:
    """The keys as the package's docstring lists them (ddlbench/sweep/__init__.py; a test holds
    the two equal): each with its example (else its default) as YAML, its help beside it from
    ``column`` on (each line of the help a new comment), then the example's nested lines."""
    lines = []
    for k in keys():
        shown = k.example if k.example is not None else _yaml(k.spec.default)
        first, *nested = shown.split("\n")
        left = f"    {k.name}: {first}".rstrip()
        for paragraph in k.spec.help.split("\n"):
            words, lead = paragraph.split(), "# "
            while words:
                line = left.ljust(max(column, len(left) + 2)) + lead + words.pop(0)
                while words and len(line) + 1 + len(words[0]) <= width:
                    line += " " + words.pop(0)
                lines.append(line)
                left, lead = "", "#   "
        lines += [f"    {line}" for line in nested]
    return "\n".join(lines)


def _yaml(value) -> str:
    """A default as the sweep file would write it (flow style)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, list):
        return f"[{', '.join(_yaml(v) for v in value)}]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k}: {_yaml(v)}" for k, v in value.items()) + "}"
    return json.dumps(value) if value == "" or value is None else str(value)


def resolve_config(name_or_path: str) -> str:
    if os.path.isfile(name_or_path):
        return name_or_path
    candidate = os.path.join(REPO, "configs", f"{name_or_path}.yaml")
    if os.path.isfile(candidate):
        return candidate
    raise UsageError(f"sweep config {name_or_path!r} not found (a path, or a preset in "
                     f"configs/: {', '.join(presets())})")


def presets() -> list[str]:
    folder = os.path.join(REPO, "configs")
    skip = {"networks"}  # the emulated-network profiles, not a sweep
    return sorted(f[:-5] for f in os.listdir(folder) if f.endswith(".yaml") and f[:-5] not in skip)




def _read(path: str, within: frozenset = frozenset()) -> dict:
    """The sweep file's mapping, over the one it ``extends`` (a preset name, or a path
    relative to this file's folder): every key this file gives replaces the base's whole
    value; ``name`` is never inherited. A chain that comes back to a file is refused."""
    from ..yamlfile import load as load_yaml
    raw = load_yaml(path, "sweep file")
    if not isinstance(raw, dict):
        raise UsageError(f"{path}: a sweep file is a YAML mapping (name, networks, tasks, "
                         f"methods, nworkers, ...)")
    base = raw.get("extends")
    if base is None:
        return raw
    if not isinstance(base, str) or not base:
        raise UsageError(f"{path}: extends must name a sweep file (a preset in configs/ or a "
                         f"path), got {base!r}")
    here = os.path.realpath(path)
    nearby = os.path.join(os.path.dirname(path), base)
    try:
        base_path = nearby if os.path.isfile(nearby) else resolve_config(base)
    except UsageError as e:
        raise UsageError(f"{path}: extends: {e}") from None
    if os.path.realpath(base_path) in within | {here}:
        raise UsageError(f"{path}: extends {base!r} comes back to a file already extended")
    merged = {k: v for k, v in _read(base_path, within | {here}).items() if k != "name"}
    merged.update(raw)
    return merged


def load(path: str, preflight: bool = True, runs: bool = True) -> Sweep:
    """Parse and check a sweep file. Every problem found is listed in one UsageError, before
    anything starts. ``preflight`` also passes every cell's arguments through the training
    script's own argument parser and checks (so a flag it does not know, or a combination it
    refuses, is caught here and not an hour into the sweep). ``runs`` False: the sweep is only
    predicted (``benchmarks.py --predict-only``): its host files need not be usable and its
    cells need not pass the training script (each setting is still checked on its own)."""
    raw = _read(path)
    reading = _Reading(path)
    known = {k.name for k in keys()}
    reading.problems += [f"unknown key {k!r}" for k in sorted(set(raw) - known, key=str)]
    sweep = Sweep(**{k.attr: k.value(raw, reading) for k in keys()},
                  path=os.path.abspath(path), notes=reading.notes)
    problems = reading.problems
    size = _size_problem(sweep)
    if size:
        problems.append(size)
    elif sweep.networks and sweep.tasks and sweep.methods and sweep.nworkers and \
            not sweep.cells():
        problems.append("skip leaves no cell to run")
    else:
        problems += _file_name_problems(sweep)
    problems += _check_names(sweep.tasks, sweep.methods)
    problems += _check_combinations(sweep, hosts=runs)
    if preflight and runs and not problems:
        problems += _preflight(sweep)
    if problems:
        raise UsageError(f"{path}: {len(problems)} problem(s): " + "; ".join(problems))
    return sweep


def _size_problem(sweep: Sweep) -> str | None:
    """The sweep's size beyond its bounds (MAX_CELLS cells, the grid before skip included;
    MAX_RUNS runs, adaptive tries included), told before a cell is made or checked."""
    axes = {"networks": sweep.networks, "tasks": sweep.tasks, "methods": sweep.methods,
            "engines": sweep.engines, "nworkers": sweep.nworkers}
    grid = math.prod(len(v) for v in axes.values())
    if grid > MAX_CELLS:
        sizes = " x ".join(f"{len(v)} {k}" for k, v in axes.items())
        return (f"the grid is {grid} cells ({sizes}); a sweep has at most {MAX_CELLS} cells, "
                f"before skip too: split it into several sweep files")
    cells = len(sweep.cells()) if grid else 0
    most = sweep.adaptive["max_tries"] if sweep.adaptive else sweep.tries
    tries = "adaptive max_tries" if sweep.adaptive else "tries"
    if cells * most > MAX_RUNS:
        return (f"the sweep is {cells * most} runs ({cells} cells x {most} {tries}); at most "
                f"{MAX_RUNS}: fewer tries, or split it into several sweep files")
    return None


def _file_name_problems(sweep: Sweep) -> list[str]:
    """The cells whose files (records, traces and logs, named after the cell or its shared
    job) would have names longer than a file system takes."""
    problems = []
    for cell in sweep.cells():
        names = [cell.name]
        if cell.shares:  # a shared job's longest name: its labels shortened to 120 characters
            names.append("_".join([cell.network.name, sweep.task_name(cell.task),
                                   "job-" + "x" * 120,
                                   f"n{cell.nworkers}"]))
        longest = max(len(LONGEST_CELL_FILE.format(cell=n).encode()) for n in names)
        if longest > NAME_MAX:
            problems.append(f"cell {cell.name[:60]}...: its files' names (records/"
                            f"{LONGEST_CELL_FILE.replace('{cell}', '<cell>')}) would be up to "
                            f"{longest} bytes, more than a file name's {NAME_MAX}: shorten its "
                            f"network's or method's label")
            break
    return problems


def _check_names(tasks, entries) -> list[str]:
    problems = []
    import models
    for t in tasks:
        try:
            models.check(t["model"])
        except UsageError:
            problems.append(f"unknown model {t['model']!r}")
    for m in entries:
        try:
            methods.lookup(m["method"])
        except UsageError as e:
            problems.append(str(e))
        except Exception as e:
            problems.append(f"method {m['method']}: {type(e).__name__}: {e}")
    for m in entries:
        if "compressor" in m and isinstance(m["compressor"], str):
            try:
                compression.lookup(m["compressor"])
            except UsageError as e:
                problems.append(f"method {m['method']}: {e}")
    return problems


def _check_combinations(sweep: Sweep, hosts: bool = True) -> list[str]:
    """``hosts``: the host files must be usable (not for a sweep that only predicts)."""
    from ..hosts import hostfile
    problems = []
    rdma = [net for net in sweep.networks if net.kind == "rdma"]
    if rdma and hosts:
        for net in rdma:
            for n in sweep.nworkers:
                path = sweep.hostfile_for(n, net)
                full = path if os.path.isabs(path) else os.path.join(REPO, path)
                try:
                    hostfile.check(full, n)
                except UsageError as e:
                    if str(e) not in problems:
                        problems.append(str(e))
        for m in list(sweep.methods):
            script = shell_launcher(m["method"])
            if not os.path.isfile(os.path.join(REPO, script)):
                if m.get("optional"):
                    sweep.methods.remove(m)
                    sweep.notes.append(f"optional method {m['method']} left out: its launcher "
                                       f"{script} is not in this checkout")
                    continue
                problems.append(f"method {m['method']} over an rdma network needs the launcher "
                                f"{script}, which this checkout does not have")
    if not sweep.methods and not any(p.startswith("method") for p in problems):
        problems.append("no method left to run")
    for m in sweep.methods:
        if m.get("mgwfbp_profile") == FROM_CALIBRATION and (
                not sweep.calibrate or sweep.extrapolate
                or any(n.kind != "net" for n in sweep.networks)):
            problems.append(f"method {method_label(m)}: mgwfbp_profile: {FROM_CALIBRATION} "
                            f"plans from the calibration's profile of each cell: it needs "
                            f"calibrate: true, without extrapolate, and only networks the "
                            f"sweep calibrates (local ones, not rdma)")
            break
    same: dict[str, str] = {}
    for m in sweep.methods:
        # labels apart, the same method and settings: the same cells (one hash, one store key)
        key = json.dumps({k: v for k, v in m.items() if k not in ("label", "optional")},
                         sort_keys=True, default=str)
        if key in same and same[key] != method_label(m):
            problems.append(f"methods {same[key]!r} and {method_label(m)!r} are the same method "
                            f"with the same settings (only the labels differ): give it once")
        same.setdefault(key, method_label(m))
    labels: dict[str, dict] = {}
    for m in sweep.methods:
        label = method_label(m)
        if label in labels and labels[label] != m:
            problems.append(f"two different methods share the label {label!r}; give one a "
                            f"label")
        labels[label] = m
    seen = set()
    for x in sweep.networks:
        if x.name in seen:
            problems.append(f"network {x.name} listed twice")
        seen.add(x.name)
    for axis, values in (("tasks", [json.dumps(t, sort_keys=True) for t in sweep.tasks]),
                         ("methods", [json.dumps(m, sort_keys=True) for m in sweep.methods]),
                         ("nworkers", sweep.nworkers), ("engines", sweep.engines)):
        dup = sorted({str(v) for v in values if values.count(v) > 1})
        if dup:
            problems.append(f"{axis}: listed twice: {', '.join(dup)}")
    return problems


def train_args(sweep: Sweep, cell: Cell, record_path: str) -> list[str]:
    """The training script's flags for one cell (every launcher passes these through)."""
    return job_args(sweep, [cell], record_path)


def job_args(sweep: Sweep, cells: list[Cell], record_path: str,
             calibration: str | None = None) -> list[str]:
    """The training script's flags for a job of ``cells`` (one, or several methods of one
    ``job_key`` that ``can_join``: ``--method a,b,...``, each setting once, '{method}' in
    ``record_path``). A setting ``mgwfbp_profile: calibration`` becomes ``calibration``, the
    path of the cells' calibration profile (``calibrate.profile_file``; None: a placeholder):
    MG-WFBP plans from what the sweep measured before the tries, the profile the model's
    prediction reads, as the original planned from a profile taken beforehand, instead of
    profiling again in every run."""
    cell = cells[0]
    t, m = cell.task, cell.method
    args = ["--model", t["model"], "--batch-size", str(t["batch_size"])]
    if "image_size" in t:
        args += ["--image-size", str(t["image_size"])]
    if "sentence_len" in t:
        args += ["--sentence-len", str(t["sentence_len"])]
    if "num_classes" in t:
        args += ["--num-classes", str(t["num_classes"])]
    args += ["--method", ",".join(c.method["method"] for c in cells)]
    for k, (spec, _) in settings().items():
        given = [c.method[k] for c in cells if k in c.method]
        if given and k == "mgwfbp_profile" and given[0] == FROM_CALIBRATION:
            args += [setting_flag(k, spec), calibration or "<calibration profile>"]
        elif given:
            args += [setting_flag(k, spec), format_value(given[0])]
    if cell.engine != "torch":
        args += ["--engine", cell.engine]
    for k, flag in TIMING_FLAGS.items():
        if k in sweep.timing:
            args += [flag, str(sweep.timing[k])]
    if sweep.threads is not None:
        args += ["--threads", str(sweep.threads)]
    args += ["--output", record_path]
    if sweep.timeline:
        # An observation, like the record: not part of the cell's configuration (its hash).
        args += ["--timeline", trace_path(record_path)]
        if sweep.timeline > 0:
            args += ["--timeline-iters", str(sweep.timeline)]
    for extra in (t.get("args"), m.get("args"), sweep.extra_args):
        if extra:
            args += shlex.split(extra)
    return args


def trace_path(record_path: str) -> str:
    """Where a try's Chrome trace goes (``timeline:`` on): beside its record."""
    return os.path.splitext(record_path)[0] + ".trace.json"


def shell_launcher(method_id: str) -> str:
    """The launcher a user runs this method with on a cluster (the method declares it)."""
    try:
        return methods.lookup(method_id).launcher
    except Exception:
        from ..methods.base import DEFAULT_LAUNCHER
        return DEFAULT_LAUNCHER


def _lane_env(engine: str) -> subprocess.CompletedProcess:
    from ..flags import LANE_ENVIRONMENTS
    return subprocess.run([os.path.join(REPO, LANE_ENVIRONMENTS[engine].env_script), "python"],
                          capture_output=True, text=True)


def _lane_env_problem(engine: str) -> str:
    """'' when the environment of ``engine``'s lane (Horovod's, BytePS's, DeepSpeed's) is
    built, else why not (one line)."""
    proc = _lane_env(engine)
    if proc.returncode == 0:
        return ""
    why = (proc.stderr.strip().splitlines() or ["not built"])[-1]
    return re.sub(r"^[\w-]+-env: error: ", f"engine {engine}: ", why)


def lane_python(engine: str) -> str:
    """The Python of ``engine``'s lane environment (a lane the local spawner runs: DeepSpeed's);
    one line when it is not built."""
    proc = _lane_env(engine)
    if proc.returncode != 0:
        raise UsageError(_lane_env_problem(engine))
    return proc.stdout.strip()


@contextlib.contextmanager
def _environment(environ: dict):
    """This process's environment is ``environ`` while inside (the preflight parses a cell's
    flags as its run will, environment fallbacks included)."""
    saved = dict(os.environ)
    os.environ.clear()
    os.environ.update(environ)
    try:
        yield
    finally:
        os.environ.clear()
        os.environ.update(saved)


def _preflight(sweep: Sweep) -> list[str]:
    """Every cell's flags through the training script's parser and checks, in this process."""
    from .. import flags
    problems: dict[str, list[str]] = {}
    seen = set()
    lane_envs: dict[str, str] = {}
    run_environment = child_environment(sweep.env)  # what each cell's run will see
    # A record (and trace) path whose folder does not exist yet, as a run's: checking that it
    # can be written creates nothing (and needs no write access to /dev, as os.devnull did).
    record = os.path.join(tempfile.gettempdir(), f"ddlbench-preflight-{os.getpid()}",
                          "record.json")
    for cell in sweep.cells():
        args = train_args(sweep, cell, record)
        spawned = flags.LANE_ENVIRONMENTS.get(cell.engine, flags.Lane("", "", "")).spawned
        if cell.engine in flags.LANE_ENVIRONMENTS:
            # Horovod's lane starts under mpirun, BytePS's under its shell launcher (which
            # builds an emulated cluster itself: --net rides in the training script's flags),
            # DeepSpeed's under the local spawner as the torch engine (in its own Python)
            if cell.engine == "horovod" and cell.network.emulated:
                problems.setdefault(f"engine horovod runs over the loopback or a real cluster, "
                                    f"not the emulated network {cell.network.name}",
                                    []).append(cell.name)
                continue
            if cell.network.kind == "net" and not spawned:
                local = os.path.join(REPO, f"configs/cluster{cell.nworkers}")
                if not os.path.isfile(local):
                    problems.setdefault(f"engine {cell.engine} on this machine needs the host "
                                        f"file configs/cluster{cell.nworkers}",
                                        []).append(cell.name)
                    continue
            if cell.engine not in lane_envs:
                lane_envs[cell.engine] = _lane_env_problem(cell.engine)
            if lane_envs[cell.engine]:
                problems.setdefault(lane_envs[cell.engine], []).append(cell.name)
                continue
        if cell.network.kind == "net" and (cell.engine == "torch" or spawned):
            args = ["--nworkers", str(cell.nworkers), *args, *cell.network.net_args()]
        elif cell.engine == "byteps":
            args = [*args, *cell.network.net_args()]
        key = tuple(args)
        if key in seen:
            continue
        seen.add(key)
        err = io.StringIO()
        try:
            # in the runs' folder (a relative mgwfbp_profile is the repository's)
            with contextlib.redirect_stderr(err), _environment(run_environment), \
                    contextlib.chdir(REPO):
                # Horovod's engine imports only in its own environment: checked apart.
                parsed = flags.parse_args(args)
                flags.check(parsed, probe_engine=cell.engine == "torch",
                            read_profile=cell.method.get("mgwfbp_profile") != FROM_CALIBRATION)
                if cell.network.kind == "net" and (cell.engine == "torch" or spawned):
                    from ..launch.local import check_capacity
                    check_capacity(cell.nworkers + parsed.nservers)
            continue
        except UsageError as e:
            msg = str(e)
        except SystemExit as e:
            lines = [ln for ln in err.getvalue().splitlines() if ln.strip()]
            msg = (e.code if isinstance(e.code, str) else lines[-1] if lines
                   else f"exit {e.code}")
            msg = re.sub(r"^.*?error: ", "", msg)
        except Exception as e:  # the training script's own bug: still one line
            msg = f"{type(e).__name__}: {e}"
        problems.setdefault(msg, []).append(cell.name)
    out = []
    for msg, cells in problems.items():
        more = f" and {len(cells) - 1} more" if len(cells) > 1 else ""
        out.append(f"the training script refuses cell {cells[0]}{more}: {msg}")
    return out

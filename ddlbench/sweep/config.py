"""Sweep files: parse, check (every problem at once) and expand into cells.

A cell is one point of the grid network x task x method x engine x nworkers; each cell is run
``tries`` times. Its full configuration (everything that changes what is measured) plus the
suite's version is hashed; that hash keys the cell's tries in the results store.
"""
from __future__ import annotations

import contextlib
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

import compression

from .. import methods
from ..errors import UsageError
from ..hosts.procs import ENV_NAME
from . import select

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# Per-method keys of a sweep file besides the method's options, the compressor and its options.
METHOD_BASE_KEYS = {"method", "label", "args", "optional"}
TASK_KEYS = {"model", "batch_size", "image_size", "sentence_len", "num_classes", "args"}
TIMING_KEYS = {"warmup", "batches_per_iter", "iters"}
# what benchmarks.py --predict-only predicts the cells from (ddlbench/sweep/predicted.py)
PREDICT_KEYS = {"networks", "profiles", "device_throughput", "codec"}
TIMING_FLAGS = {"warmup": "--num-warmup-batches", "batches_per_iter": "--num-batches-per-iter",
                "iters": "--num-iters"}
KEYS = {"name", "networks", "tasks", "methods", "nworkers", "engines", "tries", "min_ok",
        "aggregate", "timing", "timeout", "kill_grace", "extra_args", "hostfile", "results",
        "logs", "estimate_s", "env", "timeline", "predict", "calibrate", "pace",
        "calibration_check", "seed", "skip", "threads", "shared_jobs", "adaptive", "extends"}
ADAPTIVE_KEYS = {"target", "max_tries"}
ENGINES = methods.ENGINES
AGGREGATES = ("mean", "median", "olympic")
# calibration_check's default: how far a probe after the tries may move from the calibration
# (a slow minute during calibration put the loopback links 2-5 times too slow: DESIGN section 15)
CHECK_TOLERANCE = 0.2
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
DROPPED_PREFIXES = ("DDLBENCH_", "DMLC_", "BYTESCHEDULER_", "HOROVOD_", "TORCHELASTIC_",
                    "OMPI_COMM_WORLD_")
DROPPED_NAMES = {"RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR",
                 "MASTER_PORT", "SLURM_PROCID", "SLURM_STEP_NUM_TASKS", "SLURM_LOCALID"}
# ... except where things are (caches, state files, which Horovod build) and test hooks:
PASSED_NAMES = {"DDLBENCH_NETEM_STATE", "DDLBENCH_CACHE", "DDLBENCH_NET_PROBE_S", PROGRAM_ENV,
                "HOROVOD_PY", "HOROVOD_MPIRUN"}
# Inherited variables kept that change code or threads or transports: recorded in each cell's
# configuration (and so in its hash).
RECORDED_PREFIXES = ("OMP_", "MKL_", "KMP_", "NCCL_", "GLOO_")
RECORDED_NAMES = {"DDLBENCH_METHODS", "DDLBENCH_NETWORKS"}


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
        parts = [self.network.name, task_key(self.task), _safe(self.label)]
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
    labels = "+".join(_safe(x.label) for x in cells)
    if len(labels) > 120:
        labels = hashlib.sha256(labels.encode()).hexdigest()[:12]
    return "_".join([c.network.name, task_key(c.task), f"job-{labels}", f"n{c.nworkers}"])


def cell_hash(config: dict, version: str | None = None) -> str:
    blob = json.dumps({"suite_version": version or suite_version(), "cell": config},
                      sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def _safe(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9.=+-]+", "-", text).strip("-")


def task_key(task: dict) -> str:
    parts = [f"{task['model']}-bs{task['batch_size']}"]
    if "image_size" in task:
        parts.append(f"px{task['image_size']}")
    if "sentence_len" in task:
        parts.append(f"len{task['sentence_len']}")
    return "-".join(parts)


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


@dataclass
class Sweep:
    name: str
    path: str
    networks: list
    tasks: list
    methods: list
    nworkers: list
    engines: list = field(default_factory=lambda: ["torch"])
    tries: int = 5
    min_ok: int | None = None
    aggregate: str = "mean"
    timing: dict = field(default_factory=dict)
    timeout: float = 1800.0
    kill_grace: float = 15.0
    extra_args: str = ""
    hostfile: str = "configs/cluster{nworkers}"
    results_root: str = ""
    logs_root: str = ""
    estimate_s: float = 60.0
    notes: list = field(default_factory=list)
    env: dict = field(default_factory=dict)  # variables the sweep file sets for every run
    # Keep each try's Chrome trace beside its record: 0 no, -1 every timed step, N the first N.
    timeline: int = 0
    # What --predict-only predicts the cells from (ddlbench/sweep/predicted.py)
    predict: dict = field(default_factory=dict)
    # Run the profiler and comm_bench first and predict every cell (ddlbench/sweep/calibrate.py)
    calibrate: bool = False
    # With calibrate: before each job, a short profiler run at its placement (the machine's
    # pace), and each try's cells predicted again with their compute scaled by it
    pace: bool = False
    # With calibrate: after the tries, the calibration's link and compute timed again briefly;
    # a probe that moved by more than this fraction either way is reported and its job run
    # again (0: no probes)
    calibration_check: float = 0.0
    # The order of each round of tries (ddlbench/sweep/execute.py); None: the store's, or one
    # chosen when the store starts
    seed: int | None = None
    # --only expressions (ddlbench/sweep/select.py): a cell any of them matches is left out
    skip: list = field(default_factory=list)
    # CPU threads of every worker (--threads) in every run and profile; None: the cores each
    # is pinned to (so a 1-worker run on 2 cores computes with 2 threads)
    threads: int | None = None
    # The methods of one task, network and worker count run one job per try (train.py
    # --method a,b,...): the start-up is paid once (ddlbench/sweep/execute.py, jobs)
    shared_jobs: bool = False
    # Adaptive tries (ddlbench/sweep/execute.py, extra_round): {"target": t, "max_tries": m}
    # adds rounds of tries to the cells whose 95% interval is wider than +-t of their median,
    # up to m tries each; None: exactly ``tries``
    adaptive: dict | None = None

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
        """What the report needs to know about the sweep, stored with the results."""
        return {"name": self.name, "file": self.path,
                "networks": [dict(n.config(), label=n.label) for n in self.networks],
                "tasks": self.tasks, "methods": self.methods, "engines": self.engines,
                "nworkers": self.nworkers, "tries": self.tries, "min_ok": self.min_successes,
                "aggregate": self.aggregate, "timing": self.timing, "timeout": self.timeout,
                "extra_args": self.extra_args, "env": self.env, "timeline": self.timeline,
                "calibrate": self.calibrate, "pace": self.pace,
                "calibration_check": self.calibration_check, "seed": self.seed,
                "shared_jobs": self.shared_jobs, "adaptive": self.adaptive}


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


def _is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_num(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


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
    merged.update((k, v) for k, v in raw.items() if k != "extends")
    return merged


def load(path: str, preflight: bool = True, runs: bool = True) -> Sweep:
    """Parse and check a sweep file. Every problem found is listed in one UsageError, before
    anything starts. ``preflight`` also passes every cell's arguments through the training
    script's own argument parser and checks (so a flag it does not know, or a combination it
    refuses, is caught here and not an hour into the sweep). ``runs`` False: the sweep is only
    predicted (``benchmarks.py --predict-only``): its host files need not be usable and its
    cells need not pass the training script (each setting is still checked on its own)."""
    raw = _read(path)
    problems: list[str] = []
    notes: list[str] = []
    for k in sorted(set(raw) - KEYS, key=str):
        problems.append(f"unknown key {k!r}")
    name = str(raw.get("name") or os.path.splitext(os.path.basename(path))[0])
    if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_.-]*", name):
        problems.append(f"name {name!r}: use letters, digits, '_', '.', '-'")

    networks = [n for n in (_network(x, problems, notes) for x in _list(raw, "networks",
                                                                          ["local"],
                                                                   problems)) if n]
    tasks = [t for t in (_task(x, problems) for x in _list(raw, "tasks", None, problems)) if t]
    methods = [m for m in (_method(x, problems, notes)
                           for x in _list(raw, "methods", None, problems)) if m]
    nworkers = _list(raw, "nworkers", [1], problems)
    for n in nworkers:
        if not (_is_int(n) and n > 0):
            problems.append(f"nworkers entry {n!r} is not a positive integer")
    nworkers = [n for n in nworkers if _is_int(n) and n > 0]
    engines = _list(raw, "engines", ["torch"], problems)
    for e in engines:
        if e not in ENGINES:
            problems.append(f"engine {e!r}: use one of {', '.join(ENGINES)}")
    tries = raw.get("tries", 5)
    if not (_is_int(tries) and tries > 0):
        problems.append(f"tries must be a positive integer, got {tries!r}")
        tries = 1
    min_ok = raw.get("min_ok")
    if min_ok is not None and not (_is_int(min_ok) and 0 < min_ok <= tries):
        problems.append(f"min_ok must be an integer from 1 to tries ({tries}), got {min_ok!r}")
        min_ok = None
    aggregate = raw.get("aggregate", "mean")
    if aggregate not in AGGREGATES:
        problems.append(f"aggregate must be one of {', '.join(AGGREGATES)}, got {aggregate!r}")
    timing = raw.get("timing", {}) or {}
    if not isinstance(timing, dict):
        problems.append("timing must be a mapping (warmup, batches_per_iter, iters)")
        timing = {}
    for k in sorted(set(timing) - TIMING_KEYS, key=str):
        problems.append(f"timing: unknown key {k!r}")
    for k in TIMING_KEYS & set(timing):
        low = 0 if k == "warmup" else 1
        if not (_is_int(timing[k]) and timing[k] >= low):
            problems.append(f"timing: {k} must be an integer >= {low}, got {timing[k]!r}")
    timeout = raw.get("timeout", 1800)
    if not (_is_num(timeout) and timeout > 0):
        problems.append(f"timeout must be a positive number of seconds, got {timeout!r}")
        timeout = 1800
    kill_grace = raw.get("kill_grace", 15)
    if not (_is_num(kill_grace) and kill_grace >= 0):
        problems.append(f"kill_grace must be a number of seconds >= 0, got {kill_grace!r}")
        kill_grace = 15
    estimate = raw.get("estimate_s", 60)
    if not (_is_num(estimate) and estimate > 0):
        problems.append(f"estimate_s must be a positive number of seconds, got {estimate!r}")
        estimate = 60
    extra_args = raw.get("extra_args", "") or ""
    if not isinstance(extra_args, str):
        problems.append("extra_args must be a string of training-script flags")
        extra_args = ""
    hostfile = raw.get("hostfile", "configs/cluster{nworkers}")
    if not isinstance(hostfile, str):
        problems.append("hostfile must be a path (may contain {nworkers})")
        hostfile = "configs/cluster{nworkers}"
    for key in ("results", "logs"):
        if key in raw and not isinstance(raw[key], str):
            problems.append(f"{key} must be a folder path")
    env = _env(raw.get("env", {}), problems)
    timeline = raw.get("timeline", False)
    if timeline is True:
        timeline = -1
    elif timeline is False or timeline is None:
        timeline = 0
    elif not (_is_int(timeline) and timeline > 0):
        problems.append(f"timeline must be true, false or a positive number of steps to "
                        f"record, got {timeline!r}")
        timeline = 0

    predict = _predict(raw.get("predict"), problems)
    calibrate = raw.get("calibrate", False)
    if not isinstance(calibrate, bool):
        problems.append(f"calibrate must be true or false, got {calibrate!r}")
        calibrate = False
    pace = raw.get("pace", False)
    if not isinstance(pace, bool):
        problems.append(f"pace must be true or false, got {pace!r}")
        pace = False
    elif pace and not calibrate:
        problems.append("pace: true needs calibrate: true (the probe is compared with the "
                        "calibration's profile)")
    check = raw.get("calibration_check", CHECK_TOLERANCE if calibrate else 0)
    if check is False:
        check = 0
    if isinstance(check, bool) or not isinstance(check, (int, float)) or \
            not 0 <= check < float("inf"):
        problems.append(f"calibration_check must be false or a fraction >= 0 (how far a probe "
                        f"may move), got {check!r}")
        check = 0
    elif check and not calibrate:
        problems.append("calibration_check needs calibrate: true (its probes are compared "
                        "with the calibration)")
    seed = raw.get("seed")
    if seed is not None and not (_is_int(seed) and seed >= 0):
        problems.append(f"seed must be an integer >= 0, got {seed!r}")
        seed = None

    skip = _skip(raw.get("skip"), problems)
    threads = raw.get("threads")
    if threads is not None and not (_is_int(threads) and threads > 0):
        problems.append(f"threads must be a positive integer, got {threads!r}")
        threads = None

    shared_jobs = raw.get("shared_jobs", False)
    if not isinstance(shared_jobs, bool):
        problems.append(f"shared_jobs must be true or false, got {shared_jobs!r}")
        shared_jobs = False

    adaptive = _adaptive(raw.get("adaptive"), tries, problems)

    sweep = Sweep(name=name, path=os.path.abspath(path), networks=networks, tasks=tasks,
                  methods=methods, nworkers=nworkers, engines=engines, tries=tries,
                  min_ok=min_ok, aggregate=aggregate if aggregate in AGGREGATES else "mean",
                  timing=dict(timing), timeout=float(timeout), kill_grace=float(kill_grace),
                  extra_args=extra_args, hostfile=hostfile,
                  results_root=_root(raw.get("results"), "results"),
                  logs_root=_root(raw.get("logs"), "logs"), estimate_s=float(estimate),
                  notes=notes, env=env, timeline=timeline, predict=predict,
                  calibrate=calibrate, pace=pace, calibration_check=float(check), seed=seed,
                  skip=skip, threads=threads,
                  shared_jobs=shared_jobs, adaptive=adaptive)
    if networks and tasks and methods and nworkers and not sweep.cells():
        problems.append("skip leaves no cell to run")
    problems += _check_names(tasks, methods)
    problems += _check_combinations(sweep, hosts=runs)
    if preflight and runs and not problems:
        problems += _preflight(sweep)
    if problems:
        raise UsageError(f"{path}: {len(problems)} problem(s): " + "; ".join(problems))
    return sweep


def _adaptive(raw, tries, problems: list[str]) -> dict | None:
    """The sweep file's ``adaptive: {target: T, max_tries: M}``, checked: T a fraction of the
    median in (0, 1), M more than ``tries``."""
    if raw is None or raw is False:
        return None
    if not isinstance(raw, dict) or set(raw) != ADAPTIVE_KEYS:
        problems.append(f"adaptive must be a mapping of target (the interval's half-width as "
                        f"a fraction of the median, e.g. 0.03) and max_tries, got {raw!r}")
        return None
    target, most = raw["target"], raw["max_tries"]
    ok = True
    if isinstance(target, bool) or not isinstance(target, (int, float)) \
            or not 0 < target < 1:
        problems.append(f"adaptive target must be a fraction between 0 and 1 (0.03: +-3% of "
                        f"the median), got {target!r}")
        ok = False
    if not (_is_int(most) and _is_int(tries) and most > tries):
        problems.append(f"adaptive max_tries must be an integer above tries ({tries!r}), "
                        f"got {most!r}")
        ok = False
    return {"target": float(target), "max_tries": int(most)} if ok else None


def _skip(raw, problems: list[str]) -> list[str]:
    """The sweep file's ``skip:`` list of --only expressions, each checked."""
    if raw is None:
        return []
    items = [raw] if isinstance(raw, str) else raw
    if not isinstance(items, list) or not all(isinstance(e, str) for e in items):
        problems.append("skip must be a list of --only expressions (AXIS=VALUE,...)")
        return []
    out = []
    for e in items:
        try:
            select.parse(e, f"skip entry {e!r}")
            out.append(e)
        except UsageError as err:
            problems.append(str(err))
    return out


def _predict(raw, problems: list[str]) -> dict:
    """The sweep file's ``predict:`` mapping, checked (problems appended)."""
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        problems.append("predict must be a mapping (networks, profiles, device_throughput, "
                        "codec)")
        return {}
    for k in sorted(set(raw) - PREDICT_KEYS, key=str):
        problems.append(f"predict: unknown key {k!r}")
    for key in ("networks", "profiles"):
        value = raw.get(key, {}) or {}
        if not isinstance(value, dict) or not all(isinstance(k, str) and isinstance(v, str)
                                                  for k, v in value.items()):
            problems.append(f"predict: {key} must map names to paths")
    dt = raw.get("device_throughput")
    if dt is not None and dt != "survey" and not (
            isinstance(dt, dict) and all(isinstance(v, (int, float)) and not isinstance(v, bool)
                                         and v > 0 for v in dt.values())):
        problems.append("predict: device_throughput must be 'survey' or map models to "
                        "positive samples/s")
    if raw.get("codec") is not None and not isinstance(raw.get("codec"), str):
        problems.append("predict: codec must be a path")
    return dict(raw)


def _env(value, problems) -> dict[str, str]:
    """The sweep file's ``env:``: variable name -> value (a string or a number)."""
    if value is None:
        return {}
    if not isinstance(value, dict):
        problems.append("env must be a mapping of environment variables to values")
        return {}
    out = {}
    for k, v in value.items():
        if not (isinstance(k, str) and ENV_NAME.fullmatch(k)):
            problems.append(f"env: {k!r} is not a variable name")
        elif isinstance(v, bool) or not isinstance(v, (str, int, float)) or \
                (isinstance(v, float) and not math.isfinite(v)) or "\0" in str(v):
            problems.append(f"env: {k} must be a string or a number, got {v!r}")
        else:
            out[k] = v if isinstance(v, str) else format_value(v)
    return out


def _root(value, default) -> str:
    if not isinstance(value, str) or not value:
        return os.path.join(REPO, default)
    return value if os.path.isabs(value) else os.path.join(REPO, value)


def _list(raw, key, default, problems) -> list:
    value = raw.get(key, default)
    if value is None:
        problems.append(f"{key} is required")
        return []
    if not isinstance(value, list) or not value:
        problems.append(f"{key} must be a non-empty list")
        return []
    return value


def _network(x, problems, notes=None) -> Network | None:
    """A network entry: `rdma0|rdma1|rdma2` or {rdma: 0|1|2} (a real cluster, through the
    shell launchers), `local`, a profile name, or {net: PROFILE} (the local launcher, emulated
    with --net unless the profile is loopback); an optional `label` names it in tables;
    `optional: true` on an emulated one leaves it out, with a note, where this machine cannot
    emulate (not root, no iproute2)."""
    label = None
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
            if notes is not None:
                notes.append(f"optional network {profile} left out: {why}")
            return None
    return Network(_safe(profile), "net", profile, str(label or f"{profile} (emulated)"))


def _task(t, problems) -> dict | None:
    if not isinstance(t, dict) or "model" not in t or "batch_size" not in t:
        problems.append(f"task {t!r} needs model and batch_size")
        return None
    if not isinstance(t["model"], str) or not re.fullmatch(r"[A-Za-z0-9_.-]+", t["model"]):
        problems.append(f"task {t!r}: model must be a model name, got {t['model']!r}")
        return None
    for k in sorted(set(t) - TASK_KEYS, key=str):
        problems.append(f"task {t['model']}: unknown key {k!r}")
    for k in ("batch_size", "image_size", "sentence_len", "num_classes"):
        if k in t and not (_is_int(t[k]) and t[k] > 0):
            problems.append(f"task {t['model']}: {k} must be a positive integer, got {t[k]!r}")
    if "args" in t and not isinstance(t["args"], str):
        problems.append(f"task {t['model']}: args must be a string of training-script flags")
    return {k: t[k] for k in ("model", "batch_size", "image_size", "sentence_len",
                              "num_classes", "args") if k in t}


def _method(m, problems, notes) -> dict | None:
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


def job_args(sweep: Sweep, cells: list[Cell], record_path: str) -> list[str]:
    """The training script's flags for a job of ``cells`` (one, or several methods of one
    ``job_key`` that ``can_join``: ``--method a,b,...``, each setting once, '{method}' in
    ``record_path``)."""
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
        if given:
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


def _horovod_env_problem() -> str:
    """'' when the legacy Horovod environment is built, else why not (one line)."""
    proc = subprocess.run([os.path.join(REPO, "horovod", "legacy_env.sh"), "python"],
                          capture_output=True, text=True)
    if proc.returncode == 0:
        return ""
    why = (proc.stderr.strip().splitlines() or ["not built"])[-1]
    return why.replace("horovod-env: error: ", "engine horovod: ")


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
    from .. import train
    problems: dict[str, list[str]] = {}
    seen = set()
    horovod_env = None
    run_environment = child_environment(sweep.env)  # what each cell's run will see
    # A record (and trace) path whose folder does not exist yet, as a run's: checking that it
    # can be written creates nothing (and needs no write access to /dev, as os.devnull did).
    record = os.path.join(tempfile.gettempdir(), f"ddlbench-preflight-{os.getpid()}",
                          "record.json")
    for cell in sweep.cells():
        args = train_args(sweep, cell, record)
        if cell.engine == "horovod":
            if cell.network.emulated:
                problems.setdefault(f"engine horovod runs over the loopback or a real cluster, "
                                    f"not the emulated network {cell.network.name}",
                                    []).append(cell.name)
                continue
            if cell.network.kind == "net":
                local = os.path.join(REPO, f"configs/cluster{cell.nworkers}")
                if not os.path.isfile(local):
                    problems.setdefault(f"engine horovod on this machine needs the host file "
                                        f"configs/cluster{cell.nworkers}", []).append(cell.name)
                    continue
            if horovod_env is None:
                horovod_env = _horovod_env_problem()
            if horovod_env:
                problems.setdefault(horovod_env, []).append(cell.name)
                continue
        if cell.network.kind == "net" and cell.engine == "torch":
            args = ["--nworkers", str(cell.nworkers), *args, *cell.network.net_args()]
        key = tuple(args)
        if key in seen:
            continue
        seen.add(key)
        err = io.StringIO()
        try:
            with contextlib.redirect_stderr(err), _environment(run_environment):
                # Horovod's engine imports only in its own environment: checked apart.
                parsed = train.parse_args(args)
                train.check(parsed, probe_engine=cell.engine == "torch")
                if cell.network.kind == "net" and cell.engine == "torch":
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

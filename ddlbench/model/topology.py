"""The performance model's network description: what a message costs among P workers, from
a topology file (``Topology``) or from comm_bench measurements (``Measured``), as the
``simulate.Link`` and ``simulate.ServerLinks`` the replay needs (docs/DESIGN.md sections 3
and 6). Pure: no torch, no job.

    net = topology.load("survey-10gbe")         # configs/topology/survey-10gbe.yaml
    net = topology.load("ab2.json,ab4.json")    # comm_bench --output files
    net.link("allreduce", 8)                    # Link(alpha, beta): one all-reduce of M bytes
    net.ps(8, 2, clients="machine")             # ServerLinks for push/pull through 2 servers
    net.local_reduce(8)                         # a machine's local sum under clients machine

**Message sizes** are counted as nccl-tests and comm_bench count them: an all-reduce's M is the
tensor every rank holds, an all-gather's G the gathered output (P x what each rank gives).

**Topology file** (YAML; ``configs/topology/`` holds the shipped ones, each number's source in
its comments and its ``provenance``)::

    name: survey-10gbe        # optional (default: the file's name)
    description: ...          # optional, free text
    nodes: 8                  # machines
    devices_per_node: 4       # workers (devices) per machine; nodes are filled in order
    intra_node:               # a device's link to its peers in a machine (optional with 1)
      bandwidth: 15.754GB/s   # each direction
      latency: 1us
      efficiency: 0.91        # optional, default 1: fraction of line rate after framing
    inter_node:               # a machine's NIC
      bandwidth: 10gbit
      latency: 25us
      efficiency: 0.94
    allreduce: ring           # or hierarchical (default ring)
    backend: gloo             # optional: the collectives' backend; a carrier that runs as
                              # another collective there (collectives.carried_as: Gloo's
                              # native reduce-scatter is an all-reduce, the a2a carrier an
                              # all-to-all) is priced as that one (default: each as itself)
    servers:                  # optional: parameter servers, on hosts of their own
      count: 8                # optional, default one per worker machine (those P spans)
      bandwidth: 10gbit       # a server's NIC; each of bandwidth, latency and efficiency
      latency: 25us           # defaults to inter_node's
      efficiency: 0.94

**Validated workers** (optional): ``validated_workers: 32``, the largest worker count at which
the model on these constants was compared with published or measured figures; the advisor
(``predict --advise``) says when a prediction lies beyond it (a file without it: not stated).

**Provenance** (optional; every shipped file has it for every number): a ``provenance``
mapping at the top level (for ``nodes``, ``devices_per_node``) and inside ``intra_node``,
``inter_node`` and ``servers`` (for their ``bandwidth``, ``latency``, ``efficiency``,
``count``), one entry per number the file gives, beside it::

    inter_node:
      bandwidth: 20gbit
      latency: 25us
      provenance:
        bandwidth:
          kind: chosen        # one of KINDS: measured, datasheet, paper, issue, original,
                              # chosen, assumed, unmeasured
          source: "open-mpi/ompi#9087: one TCP stream over IPoIB ..."   # the reference
          datasheet: 100gbit  # kind chosen only, and required there: what a datasheet-only
                              # reading gives, written as the value is
        latency: {kind: assumed, source: "an estimate ..., about 25 us; range: ...",
                  range: [12.5us, 50us]}   # optional: the range its source states, in the
                                           # value's units (a bandwidth's, a latency's, an
                                           # efficiency's only)

The values read as without it. An unknown kind, a chosen constant without its datasheet value,
a datasheet value on another kind, an entry for a number the section does not give, a range
that is not [low, high] in the value's units, has low > high or does not contain the value:
one line each. ``constants()`` lists the numbers a file gives (SI units), ``missing_provenance()``
those without an entry, ``datasheet_values()`` the chosen ones' datasheet values, ``ranges()``
each constant's range (its stated one; a chosen constant's at least [shipped, datasheet]),
``ends()`` the network with every ranged constant at its slow end and at its fast end (what
``cell.predict`` gives a cell's interval from), and ``variant`` (or ``Topology(path,
overrides)``) the same network with some of them replaced: what ``python -m
ddlbench.model.validation survey`` runs for the datasheet figure and the sensitivity of each
chosen constant.

Bandwidths say bits or bytes explicitly: ``10gbit``, ``2.5Gbit/s`` (bit, kbit, mbit, gbit,
tbit; any case) or ``12GB/s``, ``900MB/s``, ``1.5GiB/s`` (bytes: a capital B and ``/s``; GB =
1e9 bytes, GiB = 2^30). Latencies: ``25us`` (also ``µs``), ``800ns``, ``1.5ms``, ``0.001s``.
A link's per-byte cost is ``b = 1 / (bandwidth * efficiency)``, its per-message cost ``a`` its
latency.

**Formulas** (P workers on n = ceil(P/d) machines of d devices; l = min(P, d), the devices of
the fullest machine; a and b of the link named):

- P == 1: every collective costs 0 (alpha = beta = 0).
- ``ring`` all-reduce: one flat ring over all P devices. A step of a ring that crosses machines
  waits for the slowest link it uses, so a = the largest latency used and b = the largest b
  used (intra-node if l > 1, inter-node if n > 1: each machine's NIC then carries the step's
  M/P bytes each way): ``alpha = 2(P-1) a``, ``beta = 2(P-1)/P b``.
- ``hierarchical`` all-reduce: reduce-scatter inside each machine, then l concurrent
  inter-node ring all-reduces of M/l bytes each (one per local device, the l of a machine
  sharing its NIC, so together they move M per machine), then all-gather inside the machine:
  ``alpha = 2(l-1) a_intra + 2(n-1) a_inter``,
  ``beta = 2(l-1)/l b_intra + 2(n-1)/n b_inter``. Equals the ring on one machine or one device
  per machine.
- all-gather of G gathered bytes (NCCL's all-gather is a ring, whatever ``allreduce`` says):
  ``alpha = (P-1) a``, ``beta = (P-1)/P b``, a and b as for the flat ring.
- parameter servers (``ps``): ``alpha`` = the servers' latency (one message),
  ``server_beta = 1 / (server bandwidth * efficiency)``, ``worker_beta`` = 1 / a pusher's
  share of its machine's NIC: clients ``machine`` (BytePS: the machine's leader pushes the
  machine's sum) n pushers, each with the whole NIC (``b_inter``); clients ``process`` P
  pushers, the l of the fullest machine sharing its NIC (``l * b_inter``).
- ``local_reduce``: under clients ``machine`` the machine's workers first hand their message to
  the leader and get the total back (docs/DESIGN.md section 6: the local workers push to the
  leader as to a server), a star through the leader's intra-node link, one way: ``alpha =
  a_intra``, ``beta = (l-1) b_intra`` (the l-1 copies in before the push; the same out after
  the pull); 0 when l == 1. ``ServerLinks`` leaves it out; the simulator charges it each way,
  on the leader's link (``simulate._PushPull``).

**Measured** (comm_bench ``--output`` files): ``link(op, P)`` is what comm_bench measured at P:
its rows' times by size (``rows``: ``size_bytes``, ``time_s``; made non-decreasing by isotonic
regression), interpolated between sizes and extended by the fit's beta beyond the largest, with
the fit itself (``fit.alpha_s``, ``fit.beta_s_per_byte``) as the line MG-WFBP plans with (a
file without rows: the fit alone). One line fitted over 1 KiB to 64 MiB by relative error
follows the small sizes and misses the large ones by 10-35% where the network changes regime
(loopback above 1 MiB, an emulated link's token-bucket burst); the rows are the measurement
itself. ``ps(P, k, clients)`` comes from the ``pushpull``
fit at P, k servers and those clients (``alpha = alpha_f/2``, ``worker_beta = beta_f/2``,
``server_beta = 0``, pushers as recorded: see ``simulate.ServerLinks``); the measured push/pull
already includes any local sum, so ``local_reduce`` is 0. A P it lacks is a one-line error,
except P = 1, which costs 0. The pushpull rows beyond one partition (messages whose partitions
were all in flight at once) give ``queued_s_per_byte``: what a push waiting behind another's
costs beyond the pipeline of one-partition times, per byte, so that the replay of those
messages takes as long in all as measured (``_queueing``; 0 without such rows, or when the
pipeline alone is as slow). Over loopback, where 2 workers' pushes, the server's sums and the
pulls share 2 cores, ResNet-18's 46.8 MB in 12 partitions took 79 ms against the pipeline's
34 (1.2 ns/B); over an emulated 1 Gbit/s link, 2 workers to one server, 896 ms against 847
(1.7 ns/B, on a worker_beta of 16.6).

**Bursts** (``comm_bench --ops burst --model M``: a model's gradient tensors all-reduced one at
a time, ``T1``, and all started at once, ``Tb``, with their ``sizes``): the all-reduce link at
that P gets ``per_message_s = (T1 - sum of link(m)) / N`` (what the sequence costs beyond the
per-size times: on 2 workers pinned to a core each, Gloo's threads share the core with the
caller and many small messages wait a scheduler turn now and then) and ``queued_s = (Tb - T1)
/ (N - 1)`` (a message waiting behind another: the burst's first does not), so the replay
costs both sequences as measured (``simulate.Link``). Several bursts at one P are pooled
(sums over all their messages); a P without one keeps 0 and 0.
"""
from __future__ import annotations

import math
import os
import re
from dataclasses import dataclass, replace

from .. import yamlfile
from . import simulate
from ..collectives import (LAYOUTS, MACHINE, WORLD, carried_as, layout_size,
                           operations, ring_collective, ring_link, split)
from ..errors import UsageError, read_json
from ..planning import PS_CLIENTS

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
FOLDER = os.path.join(REPO, "configs", "topology")
# the declared collectives a network prices (``ddlbench.collectives``), reduce-scatter also by
# carrier as comm_bench measures it; a carrier's ring steps are its collective's
OPS = operations()
ALGORITHMS = ("ring", "hierarchical")
BACKENDS = ("gloo", "nccl")

_NUMBER = r"([+-]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][+-]?\d+)?)"
_BIT_UNITS = {"bit": 1.0, "kbit": 1e3, "mbit": 1e6, "gbit": 1e9, "tbit": 1e12}
_BYTE_UNITS = {"B": 1.0, "kB": 1e3, "KB": 1e3, "MB": 1e6, "GB": 1e9, "TB": 1e12,
               "KiB": 1024.0, "MiB": 1024.0 ** 2, "GiB": 1024.0 ** 3, "TiB": 1024.0 ** 4}
_TIME_UNITS = {"s": 1.0, "ms": 1e-3, "us": 1e-6, "µs": 1e-6, "ns": 1e-9}


def parse_bandwidth(text, what: str = "bandwidth") -> float:
    """Bytes per second from ``10gbit``, ``2.5Gbit/s`` (bits) or ``12GB/s``, ``1.5GiB/s``
    (bytes)."""
    s = str(text).strip()
    m = re.fullmatch(_NUMBER + r"\s*([A-Za-z]+)(/s)?", s)
    value = None
    if m:
        unit = m.group(2)
        if unit.lower() in _BIT_UNITS:
            value = float(m.group(1)) * _BIT_UNITS[unit.lower()] / 8
        elif unit.lower() in ("bps", "kbps", "mbps", "gbps", "tbps"):
            raise UsageError(f"ambiguous {what} {s!r}: write bits as gbit (10gbit) or bytes "
                             f"as GB/s (12GB/s)")
        elif unit in _BYTE_UNITS and m.group(3):
            value = float(m.group(1)) * _BYTE_UNITS[unit]
    if value is None:
        raise UsageError(f"malformed {what} {s!r}: expected a number and a unit, bits as "
                         f"10gbit or 2.5Gbit/s, bytes as 12GB/s or 1.5GiB/s")
    if not 0 < value < math.inf:
        raise UsageError(f"{what} must be positive, got {s!r}")
    return value


def parse_latency(text, what: str = "latency") -> float:
    """Seconds from ``25us``, ``800ns``, ``1.5ms``, ``0.001s``."""
    s = str(text).strip()
    m = re.fullmatch(_NUMBER + r"\s*(s|ms|us|µs|ns)", s)
    if not m:
        raise UsageError(f"malformed {what} {s!r}: expected a number and a unit of s, ms, us "
                         f"or ns (e.g. 25us)")
    value = float(m.group(1)) * _TIME_UNITS[m.group(2)]
    if not 0 <= value < math.inf:
        raise UsageError(f"{what} must be >= 0, got {s!r}")
    return value


def _zero() -> simulate.Link:
    return simulate.Link(0.0, 0.0)


class Network:
    """What the performance model asks of a network, for any worker count P."""
    name: str = "network"

    def link(self, op: str, nworkers: int) -> simulate.Link:
        """One ``op`` ("allreduce": M bytes every rank holds; "allgather": G gathered bytes)
        among ``nworkers`` workers costs ``alpha + beta * size``."""
        raise NotImplementedError

    def group_link(self, op: str, nworkers: int, layout: str) -> simulate.Link:
        """One ``op`` on this worker's group of ``layout`` (``collectives.LAYOUTS``) in a job
        of ``nworkers``: the whole job's ``link``; a network that knows no machines prices no
        other layout (one line)."""
        if layout == WORLD:
            return self.link(op, nworkers)
        raise self._no_machines(layout)

    def group_size(self, layout: str, nworkers: int) -> int:
        """The size of this worker's group of ``layout`` in a job of ``nworkers``."""
        if layout == WORLD:
            return nworkers
        raise self._no_machines(layout)

    def _no_machines(self, layout: str) -> UsageError:
        return UsageError(f"network {self.name} knows no machines: it prices collectives on "
                          f"the whole job, not on {layout!r} groups; describe the cluster as a "
                          f"topology (configs/topology/) for a method on groups")

    def ps(self, nworkers: int, nservers: int | None = None,
           clients: str = "machine") -> simulate.ServerLinks:
        """Push and pull through ``nservers`` parameter servers (None: the description's
        default); ``clients`` "machine" (one pusher per machine, BytePS) or "process"."""
        raise NotImplementedError

    def local_reduce(self, nworkers: int) -> simulate.Link:
        """One way of a machine's local sum under clients "machine" (not in ``ps``): a
        message's copies from the machine's other workers into the leader, and likewise the
        total back out to them; the simulator charges it each way."""
        raise NotImplementedError

    def describe(self) -> str:
        """One line."""
        raise NotImplementedError

    def _check_op(self, op: str) -> None:
        if op not in OPS:
            raise UsageError(f"no network cost for operation {op!r}: {', '.join(OPS)}")

    @staticmethod
    def _check_clients(clients: str) -> None:
        if clients not in PS_CLIENTS:
            raise UsageError(f"unknown parameter-server clients {clients!r}: "
                             f"{', '.join(PS_CLIENTS)}")


class _Link:
    """A link of a topology: per-message latency ``a``, per-byte ``b``."""

    def __init__(self, bandwidth: float, latency: float, efficiency: float):
        self.bandwidth, self.latency, self.efficiency = bandwidth, latency, efficiency

    @property
    def a(self) -> float:
        return self.latency

    @property
    def b(self) -> float:
        return 1.0 / (self.bandwidth * self.efficiency)

    def text(self) -> str:
        rate = self.bandwidth * 8 / 1e9
        eff = "" if self.efficiency == 1 else f" x {self.efficiency:g}"
        return f"{rate:.4g} Gbit/s{eff}, {self.latency * 1e6:.3g} us"


# Every constant's source (docs/MODEL.md, "Every constant's source"): the kinds a provenance
# entry may name, and what each means.
KINDS = {
    "measured": "measured on the hardware itself",
    "datasheet": "a hardware specification or standard, or arithmetic on them (a line rate, "
                 "a framing overhead)",
    "paper": "a figure a paper publishes (the reference)",
    "issue": "a figure from a public issue thread (the reference)",
    "original": "the original suite's tables, host files or launchers",
    "chosen": "chosen after comparing the model with a published table (the reference names "
              "where the value comes from); datasheet: what a datasheet-only reading gives",
    "assumed": "an estimate or the scenario's own choice, reasoned in the comment; neither "
               "a published figure of the hardware nor compared with any table",
    "unmeasured": "a placeholder (0) for a figure nobody measured",
}


@dataclass(frozen=True)
class Provenance:
    """Where one constant comes from: its ``kind`` (``KINDS``), the reference in words
    (``source``), for kind ``chosen`` the value a datasheet-only reading gives (``datasheet``,
    as the file writes it, and ``datasheet_value``, in the constant's units), and the range
    its source states (``range``, as written, and ``range_value``, (low, high) in the
    constant's units; None: none stated)."""
    kind: str
    source: str
    datasheet: object = None
    datasheet_value: object = None
    range: object = None
    range_value: tuple | None = None

    def as_dict(self) -> dict:
        out = {"kind": self.kind, "source": self.source}
        if self.kind == "chosen":
            out["datasheet"] = self.datasheet
        if self.range is not None:
            out["range"] = list(self.range)
        return out


def read_range(value, where: str, parse) -> tuple | None:
    """A provenance entry's ``range: [low, high]`` (None: not given), each end read by
    ``parse`` (the constant's own units); a malformed one, or low > high, is one line."""
    if value is None:
        return None
    if parse is None:
        raise UsageError(f"{where}: range: a stated range belongs to a topology's link "
                         f"constant (bandwidth, latency, efficiency)")
    if not isinstance(value, list) or len(value) != 2:
        raise UsageError(f"{where}: range must be [low, high] in the value's units (e.g. "
                         f"[10us, 50us]), got {value!r}")
    lo, hi = (parse(x, f"{where}: range {end}") for x, end in zip(value, ("low", "high")))
    if lo > hi:
        raise UsageError(f"{where}: range [{value[0]}, {value[1]}] has its low end above "
                         f"its high end")
    return lo, hi


def read_provenance(entry, where: str, parse=None) -> Provenance:
    """One provenance entry (a mapping: ``kind``, ``source``, ``datasheet`` for kind
    ``chosen`` and an optional ``range``, read by ``parse(text, what)``); every problem one
    line naming ``where``."""
    if not isinstance(entry, dict):
        raise UsageError(f"{where}: a provenance entry is a mapping (kind, source, and "
                         f"datasheet for kind chosen), got {entry!r}")
    extra = sorted(set(map(str, entry)) - {"kind", "source", "datasheet", "range"})
    if extra:
        raise UsageError(f"{where}: unknown key {extra[0]!r}; known: kind, source, datasheet, "
                         f"range")
    kind = entry.get("kind")
    if kind not in KINDS:
        raise UsageError(f"{where}: unknown kind {kind!r}; known: {', '.join(KINDS)}")
    source = entry.get("source")
    if not isinstance(source, str) or not source.strip():
        raise UsageError(f"{where}: kind {kind} needs a source (the reference, in words)")
    ds = entry.get("datasheet")
    stated = read_range(entry.get("range"), where, parse)
    written = None if stated is None else tuple(entry["range"])
    if kind != "chosen":
        if ds is not None:
            raise UsageError(f"{where}: a datasheet value belongs to kind chosen only, not "
                             f"{kind}")
        return Provenance(kind, source.strip(), range=written, range_value=stated)
    if ds is None:
        raise UsageError(f"{where}: kind chosen needs datasheet: the value a datasheet-only "
                         f"reading gives")
    return Provenance(kind, source.strip(), ds,
                      parse(ds, f"{where}: datasheet") if parse is not None else ds,
                      written, stated)


# The figures the model takes from a profile (ddlbench/measure/profile_file.py): where a
# profile gives one (not null), its ``provenance.constants`` names its kind and source.
PROFILE_CONSTANTS = ("forward_s", "backward_s", "forward_tensor_s", "optimizer_s", "throughput",
                     "alpha_s", "beta_s_per_byte", "comm_fit", "interference", "interference_ps",
                     "host", "launch", "rank_compute_s", "rank_passes_s")


def profile_provenance(prof: dict, where: str = "profile") -> tuple[dict, list[str]]:
    """A profile's provenance per constant (``provenance.constants``: name -> kind and source,
    as in a topology file; a name may also be a number of ``provenance``, e.g.
    ``provenance.survey_single_gpu``) and the constants of ``PROFILE_CONSTANTS`` it gives
    without an entry. A malformed entry is one line."""
    spec = (prof.get("provenance") or {}).get("constants") or {}
    if not isinstance(spec, dict):
        raise UsageError(f"{where}: provenance.constants must map each constant to its kind "
                         f"and source")
    given = [k for k in PROFILE_CONSTANTS if prof.get(k) is not None]
    out = {}
    for name, entry in spec.items():
        head, _, rest = str(name).partition(".")
        value = (prof.get("provenance") or {}).get(rest) if head == "provenance" and rest \
            else prof.get(name)
        if value is None:
            raise UsageError(f"{where}: provenance.constants: {name} has a source but no "
                             f"value here")
        out[name] = read_provenance(entry, f"{where}: provenance.constants: {name}")
    return out, [k for k in given if k not in out]


class Topology(Network):
    """A network described by a topology file (the module's docstring has the schema and the
    formulas). ``overrides`` (path -> value, as ``constants()`` gives them: ``"nodes"``,
    ``"intra_node.bandwidth"`` in bytes/s, ``"inter_node.latency"`` in s, ``"servers.efficiency"``)
    replace the file's values: the model with other constants (``variant``)."""
    _KEYS = {"name", "description", "nodes", "devices_per_node", "intra_node", "inter_node",
             "allreduce", "backend", "servers", "provenance", "validated_workers"}
    _LINK_KEYS = {"bandwidth", "latency", "efficiency"}
    _TOP = ("nodes", "devices_per_node")

    def __init__(self, path: str, overrides: dict | None = None, *, raw=None):
        self.path = path
        if raw is None:
            raw = yamlfile.load(path, "topology file")
        if not isinstance(raw, dict):
            raise UsageError(f"topology file {path} must be a mapping of keys (nodes, "
                             f"devices_per_node, intra_node, inter_node, ...)")
        self._raw = raw
        self.overrides = dict(overrides or {})
        self.values: dict[str, float] = {}         # path -> the constant in use (SI units)
        self.file_values: dict[str, float] = {}    # path -> the file's own value (SI units)
        self.provenance: dict[str, Provenance] = {}
        unknown = sorted(set(map(str, raw)) - self._KEYS)
        if unknown:
            raise UsageError(f"topology file {path}: unknown key {unknown[0]!r}; known: "
                             f"{', '.join(sorted(self._KEYS))}")
        self.name = str(raw.get("name") or os.path.splitext(os.path.basename(path))[0])
        self.description = str(raw.get("description") or "")
        self.nodes = self._count(raw, "nodes")
        self.devices_per_node = self._count(raw, "devices_per_node")
        self._read_provenance(raw, "", self._TOP)
        # the largest worker count the model on these constants was compared with published
        # or measured figures at (None: not stated); beyond it a prediction is an extrapolation
        v = raw.get("validated_workers")
        if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < 1):
            raise UsageError(f"topology file {path}: validated_workers must be a whole number "
                             f">= 1, got {v!r}")
        self.validated_workers = v
        self.intra = (self._link(raw, "intra_node") if self.devices_per_node > 1
                      or raw.get("intra_node") is not None else None)
        self.inter = self._link(raw, "inter_node")
        self.backend = raw.get("backend")
        if self.backend not in (None, *BACKENDS):
            raise UsageError(f"topology file {path}: unknown backend {self.backend!r}; "
                             f"backend: {' or '.join(BACKENDS)}")
        self.algorithm = raw.get("allreduce", "ring")
        if self.algorithm not in ALGORITHMS:
            raise UsageError(f"topology file {path}: unknown all-reduce algorithm "
                             f"{self.algorithm!r}; allreduce: {' or '.join(ALGORITHMS)}")
        servers = raw.get("servers") or {}
        if not isinstance(servers, dict):
            raise UsageError(f"topology file {path}: servers must be a mapping (count, "
                             f"bandwidth, latency, efficiency)")
        extra = sorted(set(map(str, servers)) - self._LINK_KEYS - {"count", "provenance"})
        if extra:
            raise UsageError(f"topology file {path}: servers: unknown key {extra[0]!r}; "
                             f"known: count, bandwidth, latency, efficiency, provenance")
        self.server_count = (self._count(servers, "count", "servers: count", "servers.count")
                             if servers.get("count") is not None else None)
        self.server = self._link({"servers": {k: v for k, v in servers.items()
                                              if k != "count"}}, "servers", self.inter)
        if servers.get("provenance") is not None:
            self._read_provenance(servers, "servers", ("count", *sorted(self._LINK_KEYS)))
        stray = sorted(set(self.overrides) - set(self.values))
        if stray:
            raise UsageError(f"topology file {path}: no constant {stray[0]!r} to change; it "
                             f"gives {', '.join(sorted(self.values))}")

    # -- constants and their sources (docs/MODEL.md, "Every constant's source") -------------
    def constants(self) -> dict[str, float]:
        """path -> every number the file gives, as in use (overrides applied; bandwidths in
        bytes/s, latencies in s)."""
        return dict(self.values)

    def missing_provenance(self) -> list[str]:
        """The constants the file gives without a provenance entry."""
        return sorted(set(self.values) - set(self.provenance))

    def datasheet_values(self) -> dict[str, float]:
        """path -> datasheet value of every constant of kind ``chosen``: the overrides that
        give the datasheet-only reading of this file."""
        return {k: p.datasheet_value for k, p in self.provenance.items() if p.kind == "chosen"}

    def ranges(self) -> dict[str, tuple[float, float]]:
        """path -> (low, high) of every constant whose provenance states a range (``range``)
        or is of kind ``chosen`` (at least its shipped and datasheet values), in SI units,
        each reaching the value in use (an override outside it widens it); the constants
        whose range is one value are left out."""
        out = {}
        for key, p in sorted(self.provenance.items()):
            ends = [self.file_values[key], self.values[key]]
            if p.range_value is not None:
                ends += p.range_value
            if p.kind == "chosen":
                ends.append(p.datasheet_value)
            if min(ends) < max(ends):
                out[key] = (min(ends), max(ends))
        return out

    def ends(self) -> tuple["Topology", "Topology"] | None:
        """(slow, fast): this network with every constant of ``ranges`` at the end that makes
        communication slower (lower bandwidth and efficiency, higher latency), and at the one
        that makes it faster; None when no constant states a range. The ends are taken
        constant by constant (a link whose bandwidth and efficiency both have ranges gets the
        lower of each at its slow end)."""
        if "_ends" not in self.__dict__:         # read once (a variant is a file's read)
            ranged = self.ranges()
            slow = {k: hi if k.endswith(".latency") else lo for k, (lo, hi) in ranged.items()}
            fast = {k: lo if k.endswith(".latency") else hi for k, (lo, hi) in ranged.items()}
            self._ends = (self.variant({**self.overrides, **slow}),
                          self.variant({**self.overrides, **fast})) if ranged else None
        return self._ends

    def range_note(self) -> str:
        """The constants with a range, in words (``ranges``; "" without any)."""
        return ", ".join(f"{k} [{_shown(k, lo)}, {_shown(k, hi)}]"
                         for k, (lo, hi) in self.ranges().items())

    def written(self, key: str) -> str:
        """The constant ``key`` (a path of ``constants()``) as the file writes it."""
        section, _, field = key.rpartition(".")
        return str((self._raw.get(section) if section else self._raw)[field])

    def link_of(self, section: str) -> _Link | None:
        """The link a section describes: intra_node, inter_node or servers."""
        return {"intra_node": self.intra, "inter_node": self.inter,
                "servers": self.server}[section]

    def variant(self, overrides: dict) -> "Topology":
        """This file with ``overrides`` (path -> value) in place of its own values."""
        return Topology(self.path, overrides, raw=self._raw)

    def _read_provenance(self, section: dict, prefix: str, fields) -> None:
        """``section``'s ``provenance`` mapping (field -> kind, source, datasheet), for the
        fields it gives; optional (a file without it reads as before)."""
        spec = section.get("provenance")
        if spec is None:
            return
        where = f"topology file {self.path}: {prefix + ': ' if prefix else ''}provenance"
        if not isinstance(spec, dict):
            raise UsageError(f"{where} must map each constant ({', '.join(fields)}) to its "
                             f"kind and source")
        for field, entry in spec.items():
            key = f"{prefix}.{field}" if prefix else str(field)
            if field not in fields:
                raise UsageError(f"{where}: unknown constant {field!r}; known: "
                                 f"{', '.join(fields)}")
            if key not in self.values:
                raise UsageError(f"{where}: {field} has a source but no value here")
            prov = read_provenance(entry, f"{where}: {field}",
                                   lambda text, what, k=key: self._parse(k, text, what))
            if prov.range_value is not None:
                lo, hi = prov.range_value
                if field not in self._LINK_KEYS:
                    raise UsageError(f"{where}: {field}: range: a stated range belongs to a "
                                     f"link's bandwidth, latency or efficiency, not {field}")
                if not lo <= self.file_values[key] <= hi:
                    raise UsageError(f"{where}: {field}: range [{prov.range[0]}, "
                                     f"{prov.range[1]}] does not contain the value "
                                     f"{self.written(key)}")
            self.provenance[key] = prov

    def _parse(self, key: str, value, what: str | None = None):
        """A value of the constant ``key`` as the file would write it, in SI units (a problem
        one line naming ``what``, default the file and ``key``)."""
        field = key.rsplit(".", 1)[-1]
        what = what or f"topology file {self.path}: {key}"
        if field == "bandwidth":
            return parse_bandwidth(value, what)
        if field == "latency":
            return parse_latency(value, what)
        if field == "efficiency":
            if isinstance(value, bool) or not isinstance(value, (int, float)) \
                    or not 0 < value <= 1:
                raise UsageError(f"{what} must be a number in (0, 1], got {value!r}")
            return float(value)
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise UsageError(f"{what} must be a whole number >= 1, got {value!r}")
        return value

    def _use(self, key: str, given):
        """The value in use for ``key``: an override, else the file's (``given``, parsed);
        recorded in ``values``."""
        self.file_values[key] = given
        value = self.overrides.get(key, given)
        if key in self.overrides:
            field = key.rsplit(".", 1)[-1]
            if field in ("bandwidth", "latency"):
                ok = (isinstance(value, (int, float)) and not isinstance(value, bool)
                      and (0 < value < math.inf if field == "bandwidth"
                           else 0 <= value < math.inf))
                if not ok:
                    raise UsageError(f"topology file {self.path}: {key} cannot be {value!r}")
            else:
                value = self._parse(key, value)
        self.values[key] = value
        return value

    # -- reading ----------------------------------------------------------------------------

    def _count(self, raw: dict, key: str, what: str | None = None,
               path: str | None = None) -> int:
        value = raw.get(key)
        if value is None:
            raise UsageError(f"topology file {self.path}: missing {what or key} (a whole "
                             f"number >= 1)")
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise UsageError(f"topology file {self.path}: {what or key} must be a whole number "
                             f">= 1, got {value!r}")
        return self._use(path or key, value)

    def _link(self, raw: dict, key: str, default: _Link | None = None) -> _Link:
        """The link ``raw[key]``; with ``default``, fields not given are its."""
        spec = raw.get(key)
        if spec is None:
            raise UsageError(f"topology file {self.path}: missing {key} (bandwidth, latency, "
                             f"optional efficiency)")
        if not isinstance(spec, dict):
            raise UsageError(f"topology file {self.path}: {key} must be a mapping (bandwidth, "
                             f"latency, optional efficiency)")
        unknown = sorted(set(map(str, spec)) - self._LINK_KEYS - {"provenance"})
        if unknown:
            raise UsageError(f"topology file {self.path}: {key}: unknown key {unknown[0]!r}; "
                             f"known: bandwidth, latency, efficiency, provenance")
        if default is None:
            for field in ("bandwidth", "latency"):
                if spec.get(field) is None:
                    raise UsageError(f"topology file {self.path}: {key}: missing {field}")
        where = f"topology file {self.path}: {key}:"
        bandwidth = (default.bandwidth if spec.get("bandwidth") is None
                     else self._use(f"{key}.bandwidth",
                                    parse_bandwidth(spec["bandwidth"], f"{where} bandwidth")))
        latency = (default.latency if spec.get("latency") is None
                   else self._use(f"{key}.latency",
                                  parse_latency(spec["latency"], f"{where} latency")))
        eff = spec.get("efficiency")
        if eff is None:
            eff = 1.0 if default is None else default.efficiency
        elif isinstance(eff, bool) or not isinstance(eff, (int, float)) or not 0 < eff <= 1:
            raise UsageError(f"{where} efficiency must be a number in (0, 1], got {eff!r}")
        else:
            eff = self._use(f"{key}.efficiency", float(eff))
        link = _Link(bandwidth, latency, float(eff))
        if key != "servers":      # the servers' provenance is read with their count
            self._read_provenance(spec, key, tuple(sorted(self._LINK_KEYS)))
        return link

    # -- shape of a job ---------------------------------------------------------------------
    @property
    def max_workers(self) -> int:
        return self.nodes * self.devices_per_node

    def _shape(self, nworkers: int) -> tuple[int, int]:
        """(machines spanned, devices on the fullest machine) for P workers."""
        if isinstance(nworkers, bool) or not isinstance(nworkers, int):
            raise UsageError(f"topology {self.path}: the number of workers must be a whole "
                             f"number, got {nworkers!r}")
        if nworkers < 1 or nworkers > self.max_workers:
            raise UsageError(f"topology {self.path} has room for 1 to {self.max_workers} "
                             f"workers ({self.nodes} nodes x {self.devices_per_node} devices), "
                             f"not {nworkers}")
        d = self.devices_per_node
        return -(-nworkers // d), min(nworkers, d)

    def _ring(self, n: int, l: int) -> tuple[float, float]:
        """(a, b) of one step of a flat ring: the slowest link it uses."""
        used = ([self.intra] if l > 1 else []) + ([self.inter] if n > 1 else [])
        return max(x.a for x in used), max(x.b for x in used)

    # -- the interface ----------------------------------------------------------------------
    def _priced(self, op: str) -> str:
        """The collective ``op`` (``name`` or ``name:carrier``) is priced as on this file's
        backend (``collectives.carried_as``; without a backend, itself)."""
        name, carrier = split(op)
        return carried_as(name, carrier, self.backend) if self.backend else name

    def link(self, op: str, nworkers: int) -> simulate.Link:
        self._check_op(op)
        n, l = self._shape(nworkers)
        p = nworkers
        if p == 1:
            return _zero()
        op = self._priced(op)
        if op == "all_to_all" and n > 1:
            # every worker sends 1/P of the message to each other worker: l - 1 of those
            # parts over its intra-node link, P - l over its machine's NIC, which the
            # machine's l workers share (l x (P - l) / P of a message each way)
            tiers = [(self.inter.a, self.inter.b * l * (p - l) / p)]
            if l > 1:
                tiers.append((self.intra.a, self.intra.b * (l - 1) / p))
            return simulate.Link((p - 1) * max(a for a, _ in tiers), max(b for _, b in tiers))
        if op == "allreduce" and self.algorithm == "hierarchical":
            alpha = beta = 0.0
            for count, tier in ((l, self.intra), (n, self.inter)):
                if count > 1:
                    a, b = ring_collective("allreduce", tier.a, tier.b, count)
                    alpha, beta = alpha + a, beta + b
            return simulate.Link(alpha, beta)
        return simulate.Link(*ring_collective(op, *self._ring(n, l), p))

    def group_link(self, op: str, nworkers: int, layout: str) -> simulate.Link:
        """``op`` inside a machine (``machine``: a ring of its l devices on the intra-node
        link) or across machines (``across``: a ring of the n machines on the inter-node
        link, the l groups of a machine running together and sharing its NIC, so each sees
        l x b_inter); the whole job as ``link``."""
        self._check_op(op)
        if layout not in LAYOUTS:
            raise UsageError(f"unknown group layout {layout!r}; known: {', '.join(LAYOUTS)}")
        if layout == WORLD:
            return self.link(op, nworkers)
        n, l = self._shape(nworkers)
        count, a, b = ((l, self.intra.a, self.intra.b) if layout == MACHINE
                       else (n, self.inter.a, l * self.inter.b))
        if count == 1:
            return _zero()
        return simulate.Link(*ring_collective(self._priced(op), a, b, count))

    def group_size(self, layout: str, nworkers: int) -> int:
        """The fullest machine's l (``machine``), the machines spanned n (``across``), or P."""
        self._shape(nworkers)
        return layout_size(layout, nworkers, self.devices_per_node)

    def default_nservers(self, nworkers: int) -> int:
        """``servers: count``, else one per worker machine."""
        n, _ = self._shape(nworkers)
        return self.server_count if self.server_count is not None else n

    def ps(self, nworkers: int, nservers: int | None = None,
           clients: str = "machine") -> simulate.ServerLinks:
        self._check_clients(clients)
        n, l = self._shape(nworkers)
        k = self.default_nservers(nworkers) if nservers is None else nservers
        if clients == "machine":
            pushers, worker_beta = n, self.inter.b
        else:
            pushers, worker_beta = nworkers, l * self.inter.b
        return simulate.ServerLinks(self.server.a, worker_beta, self.server.b, k, pushers)

    def local_reduce(self, nworkers: int) -> simulate.Link:
        _, l = self._shape(nworkers)
        if l == 1:
            return _zero()
        return simulate.Link(self.intra.a, (l - 1) * self.intra.b)

    def describe(self) -> str:
        intra = f"intra {self.intra.text()}; " if self.intra is not None else ""
        servers = (f"{self.server_count} servers" if self.server_count is not None
                   else "one server per worker machine")
        changed = (f"; changed: {', '.join(sorted(self.overrides))}" if self.overrides
                   else "")
        return (f"{self.name}: {self.nodes} nodes x {self.devices_per_node} devices; {intra}"
                f"inter {self.inter.text()}; {self.algorithm} all-reduce; {servers} "
                f"({self.server.text()}){changed}")


def _shown(key: str, value: float) -> str:
    """A constant's value in a few characters: Gbit/s, us, or the number."""
    field = key.rsplit(".", 1)[-1]
    if field == "bandwidth":
        return f"{value * 8 / 1e9:.4g} Gbit/s"
    if field == "latency":
        return f"{value * 1e6:.3g} us"
    return f"{value:g}"


def _points(rows, where: str) -> tuple[tuple[float, float], ...] | None:
    """comm_bench's measured rows as a ``simulate.Link``'s points: (bytes, seconds) by size,
    the times made non-decreasing by isotonic regression (pool adjacent violators: a larger
    message never costs less; the small sizes' noise is averaged, not followed). None without
    rows."""
    if rows is None or rows == []:
        return None
    by_size = _mean_by_size(rows, where)
    sizes = sorted(by_size)
    blocks: list[list[float]] = []         # [sum, count] of pooled neighbours
    for s in sizes:
        blocks.append([by_size[s], 1])
        while len(blocks) > 1 and blocks[-2][0] * blocks[-1][1] > blocks[-1][0] * blocks[-2][1]:
            total, count = blocks.pop()
            blocks[-1][0] += total
            blocks[-1][1] += count
    times = [total / count for total, count in blocks for _ in range(int(count))]
    return tuple((float(s), t) for s, t in zip(sizes, times))


def _mean_by_size(rows, where: str) -> dict[int, float]:
    """comm_bench's rows as their mean time (seconds) per message size (bytes); malformed
    rows are one line."""
    if not isinstance(rows, list) or not all(
            isinstance(r, dict) and isinstance(r.get("size_bytes"), int)
            and not isinstance(r.get("size_bytes"), bool) and r["size_bytes"] > 0
            and isinstance(r.get("time_s"), (int, float)) and not isinstance(r["time_s"], bool)
            and 0 <= r["time_s"] < math.inf for r in rows):
        raise UsageError(f"{where}: rows need size_bytes > 0 and time_s >= 0 each")
    by_size: dict[int, list[float]] = {}
    for r in rows:
        by_size.setdefault(r["size_bytes"], []).append(float(r["time_s"]))
    return {s: sum(t) / len(t) for s, t in by_size.items()}


def _queueing(links: simulate.ServerLinks, partition: int, rows) -> float:
    """The push queueing cost per byte (``ServerLinks.queued_s_per_byte``) with which the
    replay of ``rows``' messages (bytes, seconds), each cut into ``partition``-byte partitions
    all in flight, takes as long in all as measured: 0 if the pipeline alone takes as long
    (every push already overlaps the pull before it), else found by bisection (the replay
    grows with it; by at most the queued bytes times it, so that quotient is a lower bound)."""
    measured = sum(seconds for _, seconds in rows)

    def replayed(q: float) -> float:
        with_q = replace(links, queued_s_per_byte=q)
        return sum(with_q.message(nbytes, partition) for nbytes, _ in rows)
    pipeline = replayed(0.0)
    if pipeline >= measured:
        return 0.0
    lo = (measured - pipeline) / sum(nbytes - partition for nbytes, _ in rows)
    hi = 2 * lo
    while replayed(hi) < measured:
        lo, hi = hi, 2 * hi
    for _ in range(60):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if replayed(mid) < measured else (lo, mid)
    return hi


def _beyond_partition(r: dict, where: str) -> tuple[int | None, tuple]:
    """A comm_bench pushpull result's partition bytes and its rows of more than one partition
    (bytes, seconds): messages whose partitions were all in flight at once (none without a
    partition size)."""
    part = r.get("partition_bytes")
    if part is None:
        return None, ()
    if not isinstance(part, int) or isinstance(part, bool) or part <= 0:
        raise UsageError(f"{where}: partition_bytes must be a whole number > 0, got {part!r}")
    by_size = _mean_by_size(r.get("rows") or [], where)
    return part, tuple((s, t) for s, t in sorted(by_size.items()) if s > part)


def _burst(r: dict, where: str) -> tuple[list[int], float, float]:
    """A comm_bench burst result's (sizes, one at a time, all at once)."""
    sizes, one, burst = r.get("sizes"), r.get("one_at_a_time_s"), r.get("burst_s")
    if not (isinstance(sizes, list) and sizes and all(
            isinstance(m, int) and not isinstance(m, bool) and m > 0 for m in sizes)):
        raise UsageError(f"{where}: a burst needs its message sizes (sizes: bytes > 0 each; "
                         f"a file from comm_bench before they were recorded: run it again)")
    if not all(isinstance(x, (int, float)) and not isinstance(x, bool) and 0 <= x < math.inf
               for x in (one, burst)):
        raise UsageError(f"{where}: a burst's one_at_a_time_s and burst_s must be numbers "
                         f">= 0, got {one!r} and {burst!r}")
    return sizes, float(one), float(burst)


def _server_links(hit: tuple, nservers: int) -> simulate.ServerLinks:
    """A pushpull fit's ``ServerLinks`` (``Measured.ps``): its queueing cost from its rows
    beyond one partition, where it has them."""
    alpha_f, beta_f, pushers, (partition, rows), _ = hit
    links = simulate.ServerLinks(alpha_f / 2, beta_f / 2, 0.0, nservers, pushers)
    if not rows or partition is None:
        return links
    return replace(links, queued_s_per_byte=_queueing(links, partition, rows))


def _base(measured: list[int], nworkers: int) -> int:
    """The measured worker count an extrapolation to ``nworkers`` starts from: the nearest
    below it, else the smallest."""
    return max((p for p in measured if p < nworkers), default=measured[0])


def _ring_factors(op: str, base: int, nworkers: int) -> tuple[float, float]:
    """How many times a ring's latency part (its steps) and its bandwidth part (steps / P of
    the message) at ``nworkers`` are those at ``base``: ``collectives.ring_collective``'s per-message
    alpha and beta of unit steps, at the two counts."""
    (lat, bw), (lat0, bw0) = (ring_collective(split(op)[0], 1.0, 1.0, n)
                              for n in (nworkers, base))
    return lat / lat0, bw / bw0


class Measured(Network):
    """A network measured by ``python -m ddlbench.measure.comm_bench --output FILE`` at one or more
    worker counts (the module's docstring says what is taken from where)."""

    def __init__(self, paths: list[str], extrapolate: bool = False):
        """``extrapolate``: a worker count the files lack costs the ring (section 3) with the
        per-step alpha and beta (``collectives.ring_link``) of the nearest measured count below it
        (else the smallest measured), instead of being refused."""
        if isinstance(paths, str):
            paths = [paths]
        self.extrapolate = extrapolate
        self.paths = list(paths)
        if not self.paths:
            raise UsageError("no comm_bench files given")
        self.name = "measured:" + ",".join(os.path.splitext(os.path.basename(p))[0]
                                           for p in self.paths)
        self.fits: dict[tuple, tuple[float, float, str]] = {}       # (op, P) -> a, b, file
        self.pushpull: dict[tuple, tuple[float, float, int, str]] = {}  # (P, k, clients)
        self.bursts: dict[int, list[tuple[list[int], float, float]]] = {}  # P -> sizes, T1, Tb
        for path in self.paths:
            self._read(path)

    def _files(self) -> str:
        return ", ".join(self.paths)

    def _read(self, path: str) -> None:
        rec = read_json(path, f"comm_bench file {path}")
        if not isinstance(rec, dict) or rec.get("kind") != "comm_bench":
            kind = rec.get("kind") if isinstance(rec, dict) else type(rec).__name__
            raise UsageError(f"{path} is not a comm_bench record (kind {kind!r}, expected "
                             f"'comm_bench': python -m ddlbench.measure.comm_bench --output FILE)")
        results = rec.get("results")
        if not isinstance(results, list):
            raise UsageError(f"comm_bench file {path} has no results list")
        for i, r in enumerate(results):
            where = f"comm_bench file {path}: results[{i}]"
            if not isinstance(r, dict):
                raise UsageError(f"{where} is not a mapping")
            op, p, fit = r.get("op"), r.get("nworkers", rec.get("nworkers")), r.get("fit")
            if not isinstance(p, int) or isinstance(p, bool) or p < 1:
                raise UsageError(f"{where}: nworkers must be a whole number >= 1, got {p!r}")
            if op == "burst":
                self.bursts.setdefault(p, []).append(_burst(r, where))
                continue
            if not isinstance(fit, dict):
                raise UsageError(f"{where}: no fit")
            a, b = fit.get("alpha_s"), fit.get("beta_s_per_byte")
            if not all(isinstance(x, (int, float)) and not isinstance(x, bool)
                       and 0 <= x < math.inf for x in (a, b)):
                raise UsageError(f"{where}: fit alpha_s and beta_s_per_byte must be numbers "
                                 f">= 0, got {a!r} and {b!r}")
            if op == "pushpull":
                k, clients, pushers = r.get("nservers"), r.get("ps_clients"), r.get("pushers")
                if isinstance(pushers, list):
                    pushers = len(pushers)
                if not (isinstance(k, int) and k >= 1 and clients in PS_CLIENTS
                        and isinstance(pushers, int) and pushers >= 1):
                    raise UsageError(f"{where}: a pushpull result needs nservers, ps_clients "
                                     f"and pushers, got {k!r}, {clients!r}, {pushers!r}")
                self._put(self.pushpull, (p, k, clients),
                          (float(a), float(b), pushers, _beyond_partition(r, where), path),
                          f"pushpull at P = {p}, {k} servers, clients {clients}")
            elif op in OPS:
                self._put(self.fits, (op, p), (float(a), float(b), _points(r.get("rows"), where),
                                               path), f"{op} at P = {p}")

    @staticmethod
    def _put(table: dict, key, value, what: str) -> None:
        old = table.get(key)
        if old is not None and old[:-1] != value[:-1]:
            raise UsageError(f"{old[-1]} and {value[-1]} both measure {what}, differently; "
                             f"give one of them")
        table[key] = value

    @property
    def max_workers(self) -> int:
        counts = [p for _, p in self.fits] + [p for p, _, _ in self.pushpull]
        return max(counts, default=1)

    def link(self, op: str, nworkers: int) -> simulate.Link:
        self._check_op(op)
        hit = self.fits.get((op, nworkers))
        if hit is None:
            if nworkers == 1:
                return _zero()   # one worker: the collective moves nothing
            have = sorted(p for o, p in self.fits if o == op)
            measured = [p for p in have if p >= 2]
            if self.extrapolate and measured:
                return self._extrapolated(op, nworkers, _base(measured, nworkers))
            counts = ", ".join(map(str, have)) if have else "none"
            raise UsageError(f"comm_bench files {self._files()} have no {op} at {nworkers} "
                             f"workers; measured worker counts: {counts}")
        return self._with_bursts(op, simulate.Link(*hit[:3]), nworkers)

    def _with_bursts(self, op: str, link: simulate.Link, base: int) -> simulate.Link:
        """``link`` with the per-message and queueing costs of the bursts measured at ``base``
        workers (none: as it is)."""
        if op != "allreduce" or not self.bursts.get(base):
            return link
        bursts = self.bursts[base]
        messages = sum(len(sizes) for sizes, _, _ in bursts)
        beyond = sum(one - sum(link.measured(m) for m in sizes) for sizes, one, _ in bursts)
        waited = sum(len(sizes) - 1 for sizes, _, _ in bursts)
        queued = sum(burst - one for _, one, burst in bursts) / waited if waited else 0.0
        return replace(link, per_message_s=beyond / messages, queued_s=queued)

    def _extrapolated(self, op: str, nworkers: int, base: int) -> simulate.Link:
        """The ring at ``nworkers`` from the measurement at ``base`` (``extrapolate``): the
        fit's alpha and beta through the ring's per-step costs (``collectives.ring_link``), and the
        measured rows each split at the fit's alpha into a latency part (2(P-1) steps) and the
        rest, a bandwidth part (2(P-1)/P of the message), each scaled to ``nworkers``; the
        bursts' per-message and queueing costs of ``base`` kept (a scheduler's and Gloo's
        costs per message, not the ring's)."""
        a, b, points, _ = self.fits[(op, base)]
        step = ring_link(split(op)[0], a, b, base)
        alpha, beta = ring_collective(split(op)[0], step["alpha_s"], step["beta_s_per_byte"],
                                      nworkers)
        measured = self._with_bursts(op, simulate.Link(a, b, points), base)
        lat, bw = _ring_factors(op, base, nworkers)
        if points is not None:
            points = tuple((m, lat * min(t, a) + bw * max(t - a, 0.0)) for m, t in points)
        return simulate.Link(alpha, beta, points, measured.per_message_s, measured.queued_s)

    def ps(self, nworkers: int, nservers: int | None = None,
           clients: str = "machine") -> simulate.ServerLinks:
        self._check_clients(clients)
        if nservers is None:
            ks = sorted(k for p, k, c in self.pushpull if p == nworkers and c == clients)
            nservers = ks[0] if len(ks) == 1 else None
        hit = self.pushpull.get((nworkers, nservers, clients))
        measured = sorted({p for p, _, c in self.pushpull if c == clients and p >= 2})
        if hit is None and self.extrapolate and nworkers > 1 and measured:
            return self._extrapolated_ps(nworkers, nservers, clients, _base(measured, nworkers))
        if hit is None:
            have = sorted(self.pushpull)
            listed = ("; ".join(f"P = {p}, {k} servers, clients {c}" for p, k, c in have)
                      if have else "none")
            servers = "" if nservers is None else f"{nservers} servers, "
            raise UsageError(f"comm_bench files {self._files()} have no pushpull at "
                             f"{nworkers} workers, {servers}clients {clients}; measured: "
                             f"{listed}")
        return _server_links(hit, nservers)

    def _extrapolated_ps(self, nworkers: int, nservers: int | None, clients: str,
                         base: int) -> simulate.ServerLinks:
        """Push/pull at ``nworkers`` from the measurement at ``base`` (``extrapolate``): each
        pusher's link and the queueing cost as measured, the pushers as many times more as
        the workers (one per worker machine, or per worker), and the servers too unless
        given (one per worker machine)."""
        k0 = min(k for p, k, c in self.pushpull if p == base and c == clients)
        links = _server_links(self.pushpull[(base, k0, clients)], k0)
        more = nworkers / base
        return replace(links, pushers=max(1, math.ceil(links.pushers * more - 1e-9)),
                       nservers=nservers or max(1, math.ceil(k0 * more - 1e-9)))

    def local_reduce(self, nworkers: int) -> simulate.Link:
        """0: a measured push/pull already includes the machine's local sum."""
        return _zero()

    def describe(self) -> str:
        parts = []
        for op in OPS:
            ps = sorted(p for o, p in self.fits if o == op)
            if ps:
                parts.append(f"{op} P = {', '.join(map(str, ps))}")
        if self.pushpull:
            parts.append("pushpull " + ", ".join(f"P = {p} k = {k} {c}"
                                                 for p, k, c in sorted(self.pushpull)))
        if self.bursts:
            parts.append(f"bursts P = {', '.join(map(str, sorted(self.bursts)))}")
        ext = ("; other worker counts extrapolated from the nearest measured ring's steps"
               if self.extrapolate else "")
        return f"{self.name}: comm_bench fits, {'; '.join(parts) or 'no results'}{ext}"


def names() -> list[str]:
    """The shipped topologies: configs/topology/<name>.yaml."""
    try:
        files = os.listdir(FOLDER)
    except OSError:
        return []
    return sorted(f[:-len(".yaml")] for f in files if f.endswith(".yaml"))


def load(spec: str, extrapolate: bool = False) -> Network:
    """A topology file (``.yaml``/``.yml``), comm_bench files (``.json``, comma-separated;
    ``extrapolate``: see ``Measured``) or the name of a shipped topology."""
    text = str(spec).strip()
    if text.endswith((".yaml", ".yml")) and "," not in text:
        return Topology(text)
    parts = [p.strip() for p in text.split(",")]
    if parts and all(p.endswith(".json") for p in parts):
        return Measured(parts, extrapolate)
    if re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_.-]*", text) and text in names():
        return Topology(os.path.join(FOLDER, f"{text}.yaml"))
    raise UsageError(f"unknown network description {text!r}: give a topology file (.yaml), "
                     f"comm_bench --output files (.json, comma-separated) or one of "
                     f"{', '.join(names()) or '(none shipped)'}")

"""An emulated cluster on one machine: every process a host in its own network namespace.

``--net PROFILE`` (``configs/networks.yaml``, DESIGN.md section 9) makes the local spawner run
each of its processes as a host of a small emulated cluster, so torch.distributed's Gloo traffic
crosses real kernel TCP stacks at a chosen rate instead of the loopback::

    namespace ddlbench-ID-h0 ... ddlbench-ID-hN-1    one per process (worker or server)
        dIDhI   veth, 198.18.X.(I+1)/24, tbf rate R  (what host I sends)
    namespace ddlbench-ID-sw                         the switch
        dIDbr   bridge, no address
        dIDpI   veth peer of dIDhI, port of the bridge, tbf rate R  (what host I receives)

``ID`` is six hex digits, new for every run, in every name (an interface name fits in the
kernel's 15 characters up to 1000 hosts). The bridge and its ports live in a namespace of their
own, so nothing of a run appears in the machine's own namespace and the 198.18.0.0/15 addresses
(reserved for benchmarking) exist only inside namespaces this module made. Rank 0 hosts the
rendezvous store on its own address (a fresh namespace has no other listener, so a fixed port
cannot race) and every process gets ``GLOO_SOCKET_IFNAME`` and ``MASTER_ADDR`` for its host.

This module owns set-up and tear-down. Before it creates anything it writes a state file
(``/run/ddlbench-netem/ID.json``: the names it will create, its owner's PID and the owner's start
time); tear-down kills what still runs in the namespaces, deletes them (which deletes their
veths and the bridge) and then the state file. Tear-down runs on a normal end, on an exception,
and on SIGINT/SIGTERM; a run killed outright (SIGKILL) leaves its state file behind, and the next
start (or ``python -m ddlbench.netem cleanup``) removes every set whose owner is gone.

Before a run, a short TCP stream from host 1 to host 0 measures the achieved rate (recorded;
a warning when it is more than 10% off the profile). ``python -m ddlbench.netem probe`` does the
same by hand, and with ``--allreduce`` times Gloo all-reduces over all hosts (bus bandwidth as in
nccl-tests: algbw x 2(P-1)/P).

Needs root and iproute2 (``ip``, ``tc``); without them any profile but ``loopback`` is refused
with one line.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import select
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass, field

from .errors import EXIT_USAGE, UsageError

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PROFILES_FILE = os.path.join(REPO, "configs", "networks.yaml")
LOOPBACK = "loopback"
NS_PREFIX = "ddlbench-"
_NS_RE = re.compile(r"^ddlbench-([0-9a-f]{6})-(sw|h\d+)$")
STORE_PORT = 29500          # rank 0's rendezvous store, on its own address in its own namespace
PROBE_TOLERANCE = 0.10      # warn when the probe is further than this from the profile's rate
MIN_BURST = 128 * 1024      # bytes
TBF_LATENCY = "20ms"        # longest a packet may wait in a tbf queue (its queue length)
MAX_HOSTS = 250
ETC_NETNS = "/etc/netns"    # ip netns exec bind-mounts /etc/netns/NS/* over /etc/*
SCALING_FORMULA = ("rate = target_rate / speedup: a target whose devices compute `speedup` times "
                   "faster spends 1/speedup of the time computing, so its link must be "
                   "`speedup` times faster than the emulated one for the same "
                   "communication-to-computation ratio (bandwidth term only; latency is not "
                   "scaled)")


class NetemError(UsageError):
    """Network emulation is unavailable or failed: reported as one line (exit code 2)."""


# --------------------------------------------------------------------------- rates and sizes

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


def format_rate(bps: float | None) -> str:
    if bps is None:
        return "unlimited"
    for unit, scale in (("Gbit/s", 1e9), ("Mbit/s", 1e6), ("kbit/s", 1e3)):
        if bps >= scale:
            return f"{bps / scale:.3g} {unit}"
    return f"{bps:.3g} bit/s"


# --------------------------------------------------------------------------- profiles

@dataclass(frozen=True)
class Profile:
    name: str
    rate_bps: float | None = None           # None: loopback, no emulation
    burst_bytes: int | None = None
    target_rate_bps: float | None = None    # scaling: rate = target_rate / speedup
    speedup: float | None = None
    description: str = ""
    source: str = ""                        # the file, or "command line"

    @property
    def loopback(self) -> bool:
        return self.rate_bps is None

    @property
    def burst(self) -> int:
        """tbf's bucket: what the given burst says, else 1 ms at the rate, at least 128 KiB
        (a veth hands tbf GSO packets of up to 64 KiB)."""
        if self.burst_bytes is not None:
            return self.burst_bytes
        return max(MIN_BURST, int(self.rate_bps / 8 * 1e-3))

    def describe(self) -> dict:
        d = {"profile": self.name, "emulated": not self.loopback, "rate_bps": self.rate_bps,
             "rate": format_rate(self.rate_bps) if self.rate_bps else None,
             "burst_bytes": None if self.loopback else self.burst, "source": self.source}
        if self.speedup is not None:
            d.update(target_rate_bps=self.target_rate_bps, speedup=self.speedup,
                     scaling=SCALING_FORMULA)
        return d


_PROFILE_KEYS = {"rate", "burst", "target_rate", "speedup", "description"}


def _profile_from(name: str, spec: dict, source: str) -> Profile:
    where = f"network profile {name!r} ({source})"

    def what(key):  # on the command line the spec itself is the context
        return key if source == "command line" else f"{key} of {where}"
    if not isinstance(spec, dict):
        raise UsageError(f"{where}: expected a mapping of {', '.join(sorted(_PROFILE_KEYS))}")
    unknown = sorted(set(spec) - _PROFILE_KEYS)
    if unknown:
        raise UsageError(f"{where}: unknown key(s) {', '.join(unknown)}; known: "
                         f"{', '.join(sorted(_PROFILE_KEYS))}")
    description = str(spec.get("description") or "")
    rate, target, speedup = spec.get("rate"), spec.get("target_rate"), spec.get("speedup")
    burst = spec.get("burst")
    if rate is None and target is None and speedup is None:
        if burst is not None:
            raise UsageError(f"{where}: burst without a rate")
        return Profile(name, description=description, source=source)
    if rate is not None and (target is not None or speedup is not None):
        raise UsageError(f"{where}: give either rate, or target_rate with speedup, not both")
    target_bps = None
    speedup_f = None
    if rate is not None:
        rate_bps = parse_rate(rate, what("rate"))
    else:
        if target is None or speedup is None:
            raise UsageError(f"{where}: scaling needs both target_rate and speedup")
        target_bps = parse_rate(target, what("target_rate"))
        try:
            speedup_f = float(speedup)
        except (TypeError, ValueError):
            raise UsageError(f"{what('speedup')} must be a number, got {speedup!r}") from None
        if not speedup_f > 0 or speedup_f == float("inf"):
            raise UsageError(f"{what('speedup')} must be positive, got {speedup!r}")
        rate_bps = scaled_rate(target_bps, speedup_f)
    burst_b = parse_size(burst, what("burst")) if burst is not None else None
    return Profile(name, rate_bps, burst_b, target_bps, speedup_f, description, source)


def scaled_rate(target_rate_bps: float, speedup: float) -> float:
    """The emulated link rate that keeps a target cluster's communication-to-computation ratio.

    On the target an iteration computes for t_c / speedup (t_c: compute time here) and moves
    M bytes at target_rate; here it computes for t_c and moves M bytes at the emulated rate.
    Equal ratios, (M / rate) / t_c = (M / target_rate) / (t_c / speedup), give
    rate = target_rate / speedup.
    """
    return target_rate_bps / speedup


def profile_files() -> list[str]:
    files = [PROFILES_FILE]
    extra = os.environ.get("DDLBENCH_NETWORKS")
    if extra:
        files.append(extra)
    return files


def load_profiles(files: list[str] | None = None) -> dict[str, Profile]:
    from .yamlfile import load as load_yaml
    profiles: dict[str, Profile] = {}
    for path in files or profile_files():
        raw = load_yaml(path, "network profiles file")
        entries = (raw or {}).get("profiles") if isinstance(raw, dict) else None
        if not isinstance(entries, dict):
            raise UsageError(f"network profiles file {path}: expected a mapping 'profiles:' "
                             "of name: {rate: ..., ...}")
        for name, spec in entries.items():
            profiles[str(name)] = _profile_from(str(name), spec or {}, path)
    profiles.setdefault(LOOPBACK, Profile(LOOPBACK, description="no emulation", source="built in"))
    return profiles


def resolve(spec: str | None) -> Profile:
    """A profile by name, or free form ``rate=R[,burst=B]``, ``R`` or
    ``target=R,speedup=S[,burst=B]``. Bad input raises UsageError (one line)."""
    text = (spec if spec is not None else LOOPBACK).strip()
    if not text:
        raise UsageError("--net needs a profile name or rate=R")
    if text in (LOOPBACK, "local", "none"):
        return Profile(LOOPBACK, description="no emulation", source="built in")
    if "=" in text:
        fields = {}
        for part in text.split(","):
            key, eq, value = part.partition("=")
            key = key.strip().lower()
            key = {"target": "target_rate"}.get(key, key)
            if not eq or not value.strip() or key not in _PROFILE_KEYS - {"description"}:
                raise UsageError(f"malformed network spec {text!r}: expected rate=R[,burst=B] "
                                 "or target=R,speedup=S[,burst=B] (e.g. rate=2.5gbit)")
            if key in fields:
                raise UsageError(f"malformed network spec {text!r}: {key} given twice")
            fields[key] = value.strip()
        return _profile_from(text, fields, "command line")
    profiles = load_profiles()
    if text in profiles:
        return profiles[text]
    if re.fullmatch(_NUMBER + r"\s*[a-z]*bit", text.lower()):
        return _profile_from(text, {"rate": text}, "command line")
    raise UsageError(f"unknown network profile {text!r}; known: {', '.join(profiles)} "
                     f"(configs/networks.yaml), or rate=R[,burst=B], or target=R,speedup=S")


# --------------------------------------------------------------------------- availability

def unavailable_reason() -> str | None:
    """Why namespaces and tc cannot be used here, or None when they can."""
    if not hasattr(os, "geteuid") or os.geteuid() != 0:
        uid = os.geteuid() if hasattr(os, "geteuid") else "?"
        return (f"network emulation needs root (network namespaces, veth, tc); "
                f"this process runs as uid {uid}")
    missing = [tool for tool in ("ip", "tc") if _which(tool) is None]
    if missing:
        return (f"network emulation needs iproute2: {' and '.join(missing)} not found "
                f"(PATH and /sbin, /usr/sbin searched); install iproute2")
    return None


def _which(tool: str) -> str | None:
    path = os.environ.get("PATH", "")
    return shutil.which(tool, path=path + os.pathsep + "/usr/sbin:/sbin") if path else None


def require() -> None:
    reason = unavailable_reason()
    if reason:
        raise NetemError(reason)


def check(spec: str | None) -> Profile:
    """An entry point's check of ``--net``: a known profile or a well-formed rate, the local
    spawner (not mpirun/torchrun/srun, which use the real network), root and iproute2. Bad
    input raises UsageError (one line)."""
    profile = resolve(spec)
    if profile.loopback:
        return profile
    from .launch import detect
    placement = detect()
    if placement is not None and placement.launcher != "local":
        raise UsageError(f"--net {spec} emulates a cluster on this machine with the suite's "
                         f"local spawner (--nworkers N, no launcher); under "
                         f"{placement.launcher} the real network is used: drop --net "
                         f"(and DDLBENCH_NET)")
    require()
    return profile


# --------------------------------------------------------------------------- state files

def state_dir() -> str:
    path = os.environ.get("DDLBENCH_NETEM_STATE")
    if path:
        return path
    if os.path.isdir("/run") and os.access("/run", os.W_OK):
        return "/run/ddlbench-netem"
    return os.path.join(os.path.expanduser("~"), ".cache", "ddlbench", "netem")


def _start_time(pid: int) -> str | None:
    """The process's start time in clock ticks since boot: with the PID, it tells a live owner
    from a later process that reused its PID."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            stat = f.read()
        return stat.rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return None


def _owner_alive(state: dict) -> bool:
    pid = state.get("owner_pid")
    return isinstance(pid, int) and _start_time(pid) is not None and \
        _start_time(pid) == state.get("owner_start")


def _read_states() -> list[tuple[str, dict]]:
    directory = state_dir()
    out = []
    try:
        names = sorted(os.listdir(directory))
    except OSError:
        return out
    for name in names:
        if not name.endswith(".json"):
            continue
        path = os.path.join(directory, name)
        try:
            with open(path) as f:
                out.append((path, json.load(f)))
        except (OSError, ValueError):
            # Half-written by a run killed at that moment: its names follow the pattern, and
            # the orphan sweep below finds them.
            out.append((path, {"run_id": name[:-5], "namespaces": []}))
    return out


def _ip(*args: str, check: bool = True, timeout: float = 30) -> subprocess.CompletedProcess:
    cmd = [_which(args[0]) or args[0], *args[1:]]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise NetemError(f"network emulation: `{' '.join(args)}` failed: {e}") from None
    if check and proc.returncode != 0:
        detail = (proc.stderr.strip() or proc.stdout.strip() or f"exit {proc.returncode}")
        raise NetemError(f"network emulation: `{' '.join(args)}` failed: "
                         f"{detail.splitlines()[-1]}")
    return proc


def list_namespaces() -> list[str]:
    try:
        out = _ip("ip", "netns", "list", check=False).stdout
    except NetemError:  # no iproute2: there are none of ours either
        return []
    return [line.split()[0] for line in out.splitlines() if line.strip()]


def _remove_namespaces(names: list[str]) -> None:
    """Kill what runs in each namespace, then delete it (its veths and bridge go with it) and
    its ``/etc/netns/NS`` (the hosts file ``ip netns exec`` shows inside)."""
    present = set(list_namespaces())
    for ns in names:
        if _NS_RE.match(ns):
            shutil.rmtree(os.path.join(ETC_NETNS, ns), ignore_errors=True)
        if ns not in present:
            continue
        pids = _ip("ip", "netns", "pids", ns, check=False).stdout.split()
        for pid in pids:
            try:
                os.kill(int(pid), signal.SIGKILL)
            except (ValueError, ProcessLookupError, PermissionError):
                pass
        _ip("ip", "netns", "delete", ns, check=False)


def cleanup_stale(include_live: bool = False, log=None) -> list[str]:
    """Remove the sets of runs whose owner process is gone (all sets with ``include_live``),
    and namespaces of this module's pattern that no state file accounts for. Returns the run
    ids removed."""
    removed = []
    known = set()
    for path, state in _read_states():
        run_id = state.get("run_id", os.path.basename(path)[:-5])
        if state.get("owner_pid") is not None and not include_live and _owner_alive(state):
            known.add(run_id)
            continue
        names = list(state.get("namespaces") or [])
        names += [ns for ns in list_namespaces() if _NS_RE.match(ns)
                  and _NS_RE.match(ns).group(1) == run_id and ns not in names]
        _remove_namespaces(names)
        try:
            os.unlink(path)
        except OSError:
            pass
        removed.append(run_id)
    # Namespaces of the pattern that no state file accounts for (a run writes its state file
    # before it creates anything, so one that started meanwhile has its file by now).
    orphans: dict[str, list[str]] = {}
    for ns in list_namespaces():
        m = _NS_RE.match(ns)
        if m and m.group(1) not in known and not os.path.exists(
                os.path.join(state_dir(), f"{m.group(1)}.json")):
            orphans.setdefault(m.group(1), []).append(ns)
    for run_id, names in orphans.items():
        _remove_namespaces(names)
        if run_id not in removed:
            removed.append(run_id)
    if removed and log:
        log(f"removed the emulated network(s) of {len(removed)} earlier run(s) that did not "
            f"clean up: {', '.join(removed)}")
    return removed


# --------------------------------------------------------------------------- the cluster

@dataclass
class Host:
    index: int
    namespace: str | None     # None: this machine's own namespace (loopback)
    ifname: str
    address: str

    def prefix(self) -> list[str]:
        """The command prefix that runs a program on this host."""
        if self.namespace is None:
            return []
        return [_which("ip") or "ip", "netns", "exec", self.namespace]


@dataclass
class Cluster:
    """N emulated hosts for one run. ``up()`` builds them, ``down()`` removes them (idempotent);
    as a context manager it also turns SIGTERM/SIGHUP into an exception so tear-down runs."""
    nhosts: int
    profile: Profile
    run_id: str = ""
    hosts: list[Host] = field(default_factory=list)
    probe: dict | None = None
    _state_path: str | None = None
    _old_handlers: dict = field(default_factory=dict)

    def __post_init__(self):
        if not 1 <= self.nhosts <= MAX_HOSTS:
            raise UsageError(f"an emulated cluster has 1 to {MAX_HOSTS} hosts, got {self.nhosts}")
        if self.profile.loopback:
            self.hosts = [Host(i, None, "lo", "127.0.0.1") for i in range(self.nhosts)]
            return
        if not self.run_id:
            self.run_id = _new_run_id()
        rid = self.run_id
        subnet = int(rid[:2], 16)  # cosmetic: runs are isolated whatever their addresses
        self.hosts = [Host(i, f"{NS_PREFIX}{rid}-h{i}", f"d{rid}h{i}", f"198.18.{subnet}.{i + 1}")
                      for i in range(self.nhosts)]

    # names
    @property
    def switch(self) -> str:
        return f"{NS_PREFIX}{self.run_id}-sw"

    @property
    def bridge(self) -> str:
        return f"d{self.run_id}br"

    def port(self, i: int) -> str:
        return f"d{self.run_id}p{i}"

    @property
    def namespaces(self) -> list[str]:
        return [self.switch] + [h.namespace for h in self.hosts]

    # life cycle
    def __enter__(self) -> "Cluster":
        for s in (signal.SIGTERM, signal.SIGHUP):
            try:
                if signal.getsignal(s) in (signal.SIG_DFL, None):
                    self._old_handlers[s] = signal.signal(s, _raise_exit)
            except ValueError:  # not the main thread
                pass
        try:
            self.up(log=_stderr)
        except BaseException:
            self.__exit__(None, None, None)
            raise
        return self

    def __exit__(self, *exc) -> None:
        try:
            self.down()
        finally:
            for s, handler in self._old_handlers.items():
                signal.signal(s, handler)
            self._old_handlers.clear()

    def up(self, log=None) -> "Cluster":
        if self.profile.loopback:
            return self
        require()
        cleanup_stale(log=log)
        self._write_state()
        try:
            self._build()
        except BaseException:
            self.down()
            raise
        return self

    def _write_state(self) -> None:
        directory = state_dir()
        os.makedirs(directory, exist_ok=True)
        path = os.path.join(directory, f"{self.run_id}.json")
        state = {"run_id": self.run_id, "owner_pid": os.getpid(),
                 "owner_start": _start_time(os.getpid()), "created": time.time(),
                 "profile": self.profile.name, "namespaces": self.namespaces,
                 "command": " ".join(sys.argv)}
        tmp = path + ".tmp"
        with open(tmp, "w") as f:
            json.dump(state, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
        self._state_path = path

    def _build(self) -> None:
        sw, br = self.switch, self.bridge
        rate = f"{int(round(self.profile.rate_bps))}bit"
        burst = str(self.profile.burst)
        tbf = ["root", "tbf", "rate", rate, "burst", burst, "latency", TBF_LATENCY]
        _ip("ip", "netns", "add", sw)
        _ip("ip", "-n", sw, "link", "add", br, "type", "bridge")
        _ip("ip", "-n", sw, "link", "set", br, "up")
        for h in self.hosts:
            port = self.port(h.index)
            _ip("ip", "netns", "add", h.namespace)
            _ip("ip", "-n", sw, "link", "add", port, "type", "veth", "peer", "name", h.ifname,
                "netns", h.namespace)
            _ip("ip", "-n", sw, "link", "set", port, "master", br)
            _ip("ip", "-n", sw, "link", "set", port, "up")
            _ip("ip", "-n", h.namespace, "addr", "add", f"{h.address}/24", "dev", h.ifname)
            _ip("ip", "-n", h.namespace, "link", "set", "lo", "up")
            _ip("ip", "-n", h.namespace, "link", "set", h.ifname, "up")
            # Both ends of the host's link: what it sends (its veth) and what it receives
            # (the bridge's port towards it).
            _ip("tc", "-n", h.namespace, "qdisc", "replace", "dev", h.ifname, *tbf)
            _ip("tc", "-n", sw, "qdisc", "replace", "dev", port, *tbf)
        self._write_hosts_files()

    def _write_hosts_files(self) -> None:
        """Each host's /etc/hosts names every host (h0, h1, ...), so that reverse look-ups of
        peer addresses (torch's store logs them) answer from the file instead of a DNS server
        that a namespace cannot reach."""
        try:
            with open("/etc/hosts") as f:
                base = f.read()
        except OSError:
            base = "127.0.0.1 localhost\n"
        # Also as IPv4-mapped IPv6: the store's dual-stack socket sees its peers that way.
        ours = "".join(f"{a}{h.address} h{h.index} {h.namespace}\n"
                       for h in self.hosts for a in ("", "::ffff:"))
        for h in self.hosts:
            directory = os.path.join(ETC_NETNS, h.namespace)
            os.makedirs(directory, exist_ok=True)
            with open(os.path.join(directory, "hosts"), "w") as f:
                f.write(base.rstrip("\n") + f"\n# ddlbench emulated cluster {self.run_id}\n"
                        + ours)

    def down(self) -> None:
        if self.profile.loopback or not self.run_id:
            return
        _remove_namespaces(self.namespaces)
        path = self._state_path or os.path.join(state_dir(), f"{self.run_id}.json")
        try:
            os.unlink(path)
        except OSError:
            pass
        self._state_path = None

    # what a process on host i needs
    def env(self, i: int) -> dict[str, str]:
        h = self.hosts[i]
        if self.profile.loopback:
            return {}
        return {"GLOO_SOCKET_IFNAME": h.ifname, "MASTER_ADDR": self.hosts[0].address,
                "MASTER_PORT": str(STORE_PORT), "DDLBENCH_STORE_OWNER": "rank0",
                "DDLBENCH_NET_INFO": json.dumps(self.describe(), sort_keys=True)}

    def prefix(self, i: int) -> list[str]:
        return self.hosts[i].prefix()

    def describe(self) -> dict:
        d = self.profile.describe()
        if not self.profile.loopback:
            d.update(run_id=self.run_id, hosts=self.nhosts,
                     addresses=[h.address for h in self.hosts],
                     interfaces=[h.ifname for h in self.hosts],
                     tbf={"rate_bit": int(round(self.profile.rate_bps)),
                          "burst_bytes": self.profile.burst, "latency": TBF_LATENCY,
                          "where": "egress of each host's veth and of its bridge port"})
        d["probe"] = self.probe
        return d

    def summary(self) -> str:
        return (f"{self.nhosts} emulated hosts, profile {self.profile.name} "
                f"({format_rate(self.profile.rate_bps)} per host link, tbf burst "
                f"{self.profile.burst} B), run {self.run_id}, namespaces "
                f"{NS_PREFIX}{self.run_id}-*")


def _raise_exit(signum, _frame):
    raise SystemExit(128 + signum)


def _new_run_id() -> str:
    taken = {s.get("run_id") for _, s in _read_states()}
    taken |= {m.group(1) for m in map(_NS_RE.match, list_namespaces()) if m}
    while True:
        rid = os.urandom(3).hex()
        if rid not in taken:
            return rid


# --------------------------------------------------------------------------- the spawner's side

def start(nhosts: int, spec: str, log=None) -> Cluster | None:
    """For the local spawner: None for loopback, else a cluster that is up and probed (the
    probe's result printed, and a warning when it is more than 10% off). The caller runs
    ``down()`` when its processes are gone."""
    profile = resolve(spec)
    if profile.loopback:
        return None
    log = log or _stderr
    cluster = Cluster(nhosts, profile)
    cluster.up(log=log)
    try:
        log(cluster.summary())
        if nhosts >= 2:
            seconds = float(os.environ.get("DDLBENCH_NET_PROBE_S", "1.0"))
            if seconds > 0:
                cluster.probe = probe_stream(cluster, seconds)
                log(probe_line(cluster))
                if not cluster.probe["within_tolerance"]:
                    log(f"warning: the probe's {format_rate(cluster.probe['rate_bps'])} is "
                        f"{abs(cluster.probe['deviation']) * 100:.0f}% off the profile's "
                        f"{format_rate(profile.rate_bps)} (a busy or slow machine?); the run "
                        f"goes on, and its record says so")
    except BaseException:
        cluster.down()
        raise
    return cluster


def run_info(spec: str | None) -> dict:
    """The record's ``net`` entry: what the spawner measured (passed in DDLBENCH_NET_INFO),
    else what the profile says (loopback, or one process with nothing to emulate)."""
    raw = os.environ.get("DDLBENCH_NET_INFO")
    if raw:
        try:
            return json.loads(raw)
        except ValueError:
            pass
    try:
        info = resolve(spec).describe()
    except UsageError as e:
        return {"profile": spec, "error": str(e)}
    if info["emulated"]:
        info["emulated"] = False
        info["note"] = "one process: nothing to emulate"
    info["probe"] = None
    return info


def _stderr(line: str) -> None:
    print(f"ddlbench: net: {line}", file=sys.stderr, flush=True)


# --------------------------------------------------------------------------- probes

def _helper(cluster: Cluster, i: int, *args: str, env: dict | None = None) -> subprocess.Popen:
    cmd = [*cluster.prefix(i), sys.executable, "-m", "ddlbench.netem", *args]
    e = dict(os.environ, PYTHONPATH=REPO + os.pathsep + os.environ.get("PYTHONPATH", ""))
    e.update(env or {})
    return subprocess.Popen(cmd, cwd=REPO, env=e, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def _read_line(proc: subprocess.Popen, timeout: float, what: str) -> str:
    ready, _, _ = select.select([proc.stdout], [], [], timeout)
    line = proc.stdout.readline() if ready else ""
    if not line:
        _kill(proc)
        err = proc.stderr.read().strip().splitlines()
        raise NetemError(f"network probe: {what} did not start"
                         + (f": {err[-1]}" if err else ""))
    return line.strip()


def _kill(*procs: subprocess.Popen) -> None:
    for p in procs:
        if p.poll() is None:
            p.kill()
        p.wait()


def _finish(proc: subprocess.Popen, timeout: float, what: str) -> str:
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        _kill(proc)
        raise NetemError(f"network probe: {what} did not finish in {timeout:.0f} s") from None
    if proc.returncode != 0:
        lines = err.strip().splitlines()
        raise NetemError(f"network probe: {what} failed (exit {proc.returncode})"
                         + (f": {lines[-1]}" if lines else ""))
    return out


def probe_stream(cluster: Cluster, seconds: float = 1.0, src: int = 1, dst: int = 0) -> dict:
    """One TCP stream from host ``src`` to host ``dst`` for ``seconds``; the receiver's rate,
    timed from its first byte to the end (so connection set-up is not counted)."""
    receiver = _helper(cluster, dst, "_recv", "--address", cluster.hosts[dst].address)
    sender = None
    try:
        port = _read_line(receiver, 30, "the probe's receiver").split()[-1]
        sender = _helper(cluster, src, "_send", "--address", cluster.hosts[dst].address,
                         "--port", port, "--seconds", str(seconds))
        _finish(sender, seconds + 30, "the probe's sender")
        result = json.loads(_finish(receiver, 30, "the probe's receiver").strip().splitlines()[-1])
    finally:
        _kill(receiver, *([sender] if sender else []))
    rate = result["bytes"] * 8 / result["seconds"] if result["seconds"] > 0 else 0.0
    out = {"kind": f"tcp stream host {src} -> host {dst}", "seconds": round(result["seconds"], 4),
           "bytes": result["bytes"], "rate_bps": rate}
    if cluster.profile.rate_bps:
        dev = rate / cluster.profile.rate_bps - 1
        out.update(configured_bps=cluster.profile.rate_bps, deviation=round(dev, 4),
                   within_tolerance=abs(dev) <= PROBE_TOLERANCE)
    else:
        out.update(configured_bps=None, deviation=None, within_tolerance=True)
    return out


def probe_line(cluster: Cluster) -> str:
    p = cluster.probe
    text = (f"probe: {p['kind']}: {format_rate(p['rate_bps'])} over {p['seconds']:.2f} s")
    if p.get("configured_bps"):
        text += (f" (profile {cluster.profile.name}: {format_rate(p['configured_bps'])}, "
                 f"{p['deviation'] * 100:+.1f}%)")
    return text


def probe_allreduce(cluster: Cluster, nbytes: int = 16 << 20, iters: int = 5,
                    warmup: int = 1, timeout: float = 180) -> dict:
    """Gloo all-reduces of ``nbytes`` over every host; per operation the slowest rank's time,
    and the median's bus bandwidth (nccl-tests: algbw x 2(P-1)/P)."""
    n = cluster.nhosts
    if n < 2:
        raise UsageError("an all-reduce probe needs at least 2 hosts")
    common = ["--world", str(n), "--bytes", str(nbytes), "--iters", str(iters),
              "--warmup", str(warmup), "--address", cluster.hosts[0].address]
    procs = [_helper(cluster, 0, "_allreduce", "--rank", "0", *common,
                     env={"GLOO_SOCKET_IFNAME": cluster.hosts[0].ifname})]
    try:
        port = _read_line(procs[0], 120, "all-reduce rank 0").split()[-1]
        for i in range(1, n):
            procs.append(_helper(cluster, i, "_allreduce", "--rank", str(i), "--port", port,
                                 *common, env={"GLOO_SOCKET_IFNAME": cluster.hosts[i].ifname}))
        outs = [_finish(p, timeout, f"all-reduce rank {i}") for i, p in enumerate(procs)]
    finally:
        _kill(*procs)
    times = json.loads(outs[0].strip().splitlines()[-1])["times"]
    t = statistics.median(times)
    algbw = nbytes / t
    busbw = algbw * 2 * (n - 1) / n
    out = {"kind": f"gloo all-reduce over {n} hosts", "bytes": nbytes, "iters": iters,
           "times_s": times, "median_s": t, "algbw_bps": algbw * 8, "busbw_bps": busbw * 8}
    if cluster.profile.rate_bps:
        dev = busbw * 8 / cluster.profile.rate_bps - 1
        out.update(configured_bps=cluster.profile.rate_bps, deviation=round(dev, 4),
                   within_tolerance=abs(dev) <= PROBE_TOLERANCE)
    return out


# helpers run inside a host (hidden subcommands)

def _cmd_recv(a) -> int:
    srv = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    srv.bind((a.address, 0))
    srv.listen(1)
    print(f"listening {srv.getsockname()[1]}", flush=True)
    srv.settimeout(60)
    conn, _ = srv.accept()
    conn.settimeout(60)
    buf = bytearray(4 << 20)
    total = 0
    conn.recv_into(buf)           # the clock starts at the first byte
    t0 = t1 = time.perf_counter()
    while True:
        n = conn.recv_into(buf)
        if not n:
            break
        total += n
        t1 = time.perf_counter()
    print(json.dumps({"bytes": total, "seconds": t1 - t0}), flush=True)
    return 0


def _cmd_send(a) -> int:
    deadline = time.monotonic() + 30
    while True:
        try:
            conn = socket.create_connection((a.address, a.port), timeout=5)
            break
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)
    chunk = memoryview(bytearray(1 << 20))
    end = time.monotonic() + a.seconds
    while time.monotonic() < end:
        conn.sendall(chunk)
    conn.shutdown(socket.SHUT_WR)
    conn.recv(1)  # the receiver closes after it has read everything
    conn.close()
    return 0


def _cmd_allreduce(a) -> int:
    import datetime

    import torch
    import torch.distributed as dist
    torch.set_num_threads(1)
    timeout = datetime.timedelta(seconds=120)
    if a.rank == 0:
        store = dist.TCPStore(a.address, 0, a.world, True, timeout=timeout,
                              wait_for_workers=False)
        print(f"store {store.port}", flush=True)
    else:
        store = dist.TCPStore(a.address, a.port, a.world, False, timeout=timeout)
    dist.init_process_group("gloo", store=store, rank=a.rank, world_size=a.world,
                            timeout=timeout)
    t = torch.empty(a.bytes // 4)
    times = []
    for i in range(a.warmup + a.iters):
        t.fill_(1.0)
        dist.barrier()
        start = time.perf_counter()
        dist.all_reduce(t)
        took = torch.tensor([time.perf_counter() - start], dtype=torch.float64)
        dist.all_reduce(took, op=dist.ReduceOp.MAX)
        if t[0].item() != a.world or t[-1].item() != a.world:
            raise SystemExit(f"all-reduce gave {t[0].item()}, expected {a.world}")
        if i >= a.warmup:
            times.append(took.item())
    dist.destroy_process_group()
    if a.rank == 0:
        print(json.dumps({"times": times}), flush=True)
    return 0


# --------------------------------------------------------------------------- command line

def parse_args(argv):
    p = argparse.ArgumentParser(prog="python -m ddlbench.netem",
                                description="Emulated cluster on one machine (network "
                                            "namespaces, veth, bridge, tc tbf).")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")
    pr = sub.add_parser("probe", help="set up N hosts, measure, tear down, print")
    pr.add_argument("--net", default=os.environ.get("DDLBENCH_NET") or "1gbit",
                    help="profile name, rate=R[,burst=B] or target=R,speedup=S")
    pr.add_argument("--hosts", type=int, default=2, help="emulated hosts (>= 2)")
    pr.add_argument("--seconds", type=float, default=1.0,
                    help="TCP stream probe from host 1 to host 0 (0: skip it)")
    pr.add_argument("--allreduce", action="store_true",
                    help="also time Gloo all-reduces over all hosts (bus bandwidth)")
    pr.add_argument("--bytes", default="16M", help="all-reduce size (16M)")
    pr.add_argument("--iters", type=int, default=5, help="timed all-reduces (5, after 1 warm-up)")
    pr.add_argument("--json", default=None, metavar="FILE", help="also write the results here")
    cl = sub.add_parser("cleanup", help="remove the emulated networks of runs that are gone")
    cl.add_argument("--all", action="store_true",
                    help="also those of runs still alive (they will fail)")
    sub.add_parser("profiles", help="list the network profiles")
    sub.add_parser("status", help="list the emulated networks that exist now")
    r = sub.add_parser("_recv")
    r.add_argument("--address", required=True)
    s = sub.add_parser("_send")
    s.add_argument("--address", required=True)
    s.add_argument("--port", type=int, required=True)
    s.add_argument("--seconds", type=float, required=True)
    ar = sub.add_parser("_allreduce")
    for flag in ("--rank", "--world", "--bytes", "--iters", "--warmup", "--port"):
        ar.add_argument(flag, type=int, default=0)
    ar.add_argument("--address", required=True)
    return p.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    internal = {"_recv": _cmd_recv, "_send": _cmd_send, "_allreduce": _cmd_allreduce}
    if args.command in internal:
        return internal[args.command](args)
    try:
        if args.command == "probe":
            return _cmd_probe(args)
        if args.command == "cleanup":
            require()
            removed = cleanup_stale(include_live=args.all)
            print(f"removed {len(removed)} emulated network(s)"
                  + (f": {', '.join(removed)}" if removed else ""))
            return 0
        if args.command == "status":
            require()
            states = _read_states()
            for path, s in states:
                alive = _owner_alive(s)
                print(f"run {s.get('run_id')}: profile {s.get('profile')}, owner "
                      f"{s.get('owner_pid')} {'alive' if alive else 'gone (stale)'}, "
                      f"{len(s.get('namespaces') or [])} namespaces")
            if not states:
                print("no emulated networks")
            return 0
        for name, prof in load_profiles().items():
            rate = "no emulation" if prof.loopback else format_rate(prof.rate_bps)
            if prof.speedup is not None:
                rate += f" (= {format_rate(prof.target_rate_bps)} / {prof.speedup:g})"
            print(f"{name:20s} {rate:28s} {prof.description}")
        return 0
    except UsageError as e:
        print(f"ddlbench: error: {e}", file=sys.stderr, flush=True)
        return EXIT_USAGE


def _cmd_probe(args) -> int:
    profile = resolve(args.net)
    if args.hosts < 2:
        raise UsageError(f"--hosts must be at least 2 to measure a link, got {args.hosts}")
    if args.iters <= 0 or args.seconds < 0:
        raise UsageError("--iters must be positive and --seconds >= 0")
    nbytes = parse_size(args.bytes, "--bytes")
    if nbytes < 4:
        raise UsageError("--bytes must be at least 4 (one fp32)")
    nbytes -= nbytes % 4
    if not profile.loopback:
        require()
    results = {}
    with Cluster(args.hosts, profile) as cluster:
        print(f"netem: {cluster.summary()}" if not profile.loopback
              else f"netem: {args.hosts} processes on this machine's loopback (no emulation)",
              flush=True)
        if args.seconds > 0:
            cluster.probe = probe_stream(cluster, args.seconds)
            results["stream"] = cluster.probe
            print(f"netem: {probe_line(cluster)}", flush=True)
            if not cluster.probe["within_tolerance"]:
                print(f"netem: warning: more than {PROBE_TOLERANCE * 100:.0f}% off the profile",
                      flush=True)
        if args.allreduce:
            ar = probe_allreduce(cluster, nbytes, args.iters)
            results["allreduce"] = ar
            line = (f"netem: all-reduce of {nbytes} B over {args.hosts} hosts: median "
                    f"{ar['median_s'] * 1e3:.1f} ms of {args.iters}, algbw "
                    f"{format_rate(ar['algbw_bps'])}, busbw {format_rate(ar['busbw_bps'])}")
            if ar.get("deviation") is not None:
                line += f" ({ar['deviation'] * 100:+.1f}% of the profile's rate)"
            print(line, flush=True)
        results["net"] = cluster.describe()
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=2, sort_keys=True)
            f.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())

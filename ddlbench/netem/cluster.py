"""An emulated cluster on one machine: every process a host in its own network namespace.

``--net PROFILE`` (``configs/networks.yaml``, docs/DESIGN.md section 9) makes the local spawner
run each of its processes as a host of a small emulated cluster, so torch.distributed's Gloo
traffic crosses real kernel TCP stacks at a chosen rate instead of the loopback::

    namespace ddlbench-ID-h0 ... ddlbench-ID-hN-1    one per process (worker or server)
        dIDhI   veth, 198.18.X.(I+1)/24, tbf rate R  (what host I sends)
    namespace ddlbench-ID-sw                         the switch
        dIDbr   bridge, no address
        dIDpI   veth peer of dIDhI, port of the bridge, tbf rate R  (what host I receives)

``ID`` is six hex digits, new for every run, in every name (an interface name fits in the
kernel's 15 characters up to 1000 hosts). The bridge and its ports live in a namespace of their
own, so nothing of a run appears in the machine's own namespace and the 198.18.0.0/15 addresses
(reserved for benchmarking) exist only inside namespaces this package made. Rank 0 hosts the
rendezvous store on its own address (a fresh namespace has no other listener, so a fixed port
cannot race) and every process gets ``GLOO_SOCKET_IFNAME`` and ``MASTER_ADDR`` for its host.

A cluster owns its set-up and tear-down. Before it creates anything it writes a state file
(``state.py``); tear-down kills what still runs in the namespaces, deletes them (which deletes
their veths and the bridge) and then the state file. Tear-down runs on a normal end, on an
exception, and on SIGINT/SIGTERM (as a context manager, SIGTERM/SIGHUP become an exception).
"""
from __future__ import annotations

import json
import os
import signal
import sys
from dataclasses import dataclass, field

from ..errors import UsageError
from .links import (NS_PREFIX, TBF_LATENCY, _NS_RE, _remove_namespaces, build,
                    list_namespaces, netns_exec, require, write_hosts_files)
from .profiles import Profile
from .state import _read_states, cleanup_stale, start_reaper, state_dir, write_state
from .units import format_rate

STORE_PORT = 29500          # rank 0's rendezvous store, on its own address in its own namespace
MAX_HOSTS = 250


@dataclass
class Host:
    index: int
    namespace: str | None     # None: this machine's own namespace (loopback)
    ifname: str
    address: str
    name: str = ""            # its host name (h0, h1, ... unless the cluster names them)

    def __post_init__(self):
        self.name = self.name or f"h{self.index}"

    def prefix(self) -> list[str]:
        """The command prefix that runs a program on this host."""
        if self.namespace is None:
            return []
        return netns_exec(self.namespace)


@dataclass
class Cluster:
    """N emulated hosts for one run. ``up()`` builds them, ``down()`` removes them (idempotent);
    as a context manager it also turns SIGTERM/SIGHUP into an exception so tear-down runs."""
    nhosts: int
    profile: Profile
    run_id: str = ""
    hosts: list[Host] = field(default_factory=list)
    probe: dict | None = None
    # a standing cluster's (standing.py): host names NAME0, NAME1, ... and one interface name
    # in every host (as on a real cluster, where GLOO_SOCKET_IFNAME names it for all ranks)
    host_prefix: str = "h"
    ifname: str = ""
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
        self.hosts = [Host(i, f"{NS_PREFIX}{rid}-h{i}", self.ifname or f"d{rid}h{i}",
                           f"198.18.{subnet}.{i + 1}", f"{self.host_prefix}{i}")
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

    def up(self, log=None, state: dict | None = None, then=None) -> "Cluster":
        """Build the hosts. ``state``: more keys for the state file; ``then(cluster)``: more
        set-up once the network is there (a standing cluster's servers), torn down with it
        when it fails."""
        if self.profile.loopback:
            return self
        require()
        cleanup_stale(log=log)
        self._write_state(**(state or {}))
        start_reaper(self.run_id)  # tears the set down if this process is killed outright
        try:
            self._build()
            if then is not None:
                then(self)
        except BaseException:
            self.down()
            raise
        return self

    def _write_state(self, **extra) -> None:
        self._state_path = write_state(self.run_id, self.profile.name, self.namespaces, **extra)

    def _build(self) -> None:
        build(self.switch, self.bridge, self.hosts, [self.port(h.index) for h in self.hosts],
              self.profile.rate_bps, self.profile.burst)
        write_hosts_files(self.run_id, self.hosts)

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


def _stderr(line: str) -> None:
    print(f"ddlbench: net: {line}", file=sys.stderr, flush=True)

"""The ``ip`` and ``tc`` commands: whether they can run here, namespaces, veth, bridge, tbf.

Needs root and iproute2 (``ip``, ``tc``); without them any profile but ``loopback`` is refused
with one line (``unavailable_reason``, ``require``).
"""
from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess

from ..errors import UsageError

NS_PREFIX = "ddlbench-"
_NS_RE = re.compile(r"^ddlbench-([0-9a-f]{6})-(sw|h\d+)$")
TBF_LATENCY = "20ms"        # longest a packet may wait in a tbf queue (its queue length)
ETC_NETNS = "/etc/netns"    # ip netns exec bind-mounts /etc/netns/NS/* over /etc/*


class NetemError(UsageError):
    """Network emulation is unavailable or failed: reported as one line (exit code 2)."""


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


# --------------------------------------------------------------------------- commands

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


def netns_exec(namespace: str) -> list[str]:
    """The command prefix that runs a program in network namespace ``namespace``."""
    return [_which("ip") or "ip", "netns", "exec", namespace]


def list_namespaces() -> list[str]:
    try:
        out = _ip("ip", "netns", "list", check=False).stdout
    except NetemError:  # no iproute2: there are none of ours either
        return []
    return [line.split()[0] for line in out.splitlines() if line.strip()]


def namespace_pids(ns: str) -> list[int]:
    """The processes running in namespace ``ns`` (none when it is gone)."""
    out = _ip("ip", "netns", "pids", ns, check=False).stdout.split()
    return [int(p) for p in out if p.isdigit()]


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


# --------------------------------------------------------------------------- building a cluster

def build(switch: str, bridge: str, hosts: list, ports: list[str], rate_bps: float,
          burst: int) -> None:
    """The switch namespace with its bridge, and per host (``.namespace``, ``.ifname``,
    ``.address``) a namespace, a veth whose peer (``ports[i]``) is a port of the bridge, and a
    tbf at ``rate_bps`` on both ends."""
    rate = f"{int(round(rate_bps))}bit"
    tbf = ["root", "tbf", "rate", rate, "burst", str(burst), "latency", TBF_LATENCY]
    _ip("ip", "netns", "add", switch)
    _ip("ip", "-n", switch, "link", "add", bridge, "type", "bridge")
    _ip("ip", "-n", switch, "link", "set", bridge, "up")
    for h, port in zip(hosts, ports):
        _ip("ip", "netns", "add", h.namespace)
        _ip("ip", "-n", switch, "link", "add", port, "type", "veth", "peer", "name", h.ifname,
            "netns", h.namespace)
        _ip("ip", "-n", switch, "link", "set", port, "master", bridge)
        _ip("ip", "-n", switch, "link", "set", port, "up")
        _ip("ip", "-n", h.namespace, "addr", "add", f"{h.address}/24", "dev", h.ifname)
        _ip("ip", "-n", h.namespace, "link", "set", "lo", "up")
        _ip("ip", "-n", h.namespace, "link", "set", h.ifname, "up")
        # Both ends of the host's link: what it sends (its veth) and what it receives
        # (the bridge's port towards it).
        _ip("tc", "-n", h.namespace, "qdisc", "replace", "dev", h.ifname, *tbf)
        _ip("tc", "-n", switch, "qdisc", "replace", "dev", port, *tbf)


def write_hosts_files(run_id: str, hosts: list) -> None:
    """Each host's /etc/hosts names every host (``.name``: h0, h1, ...), so that reverse
    look-ups of peer addresses (torch's store logs them) answer from the file instead of a DNS
    server that a namespace cannot reach."""
    try:
        with open("/etc/hosts") as f:
            base = f.read()
    except OSError:
        base = "127.0.0.1 localhost\n"
    # Also as IPv4-mapped IPv6: the store's dual-stack socket sees its peers that way.
    ours = "".join(f"{a}{h.address} {h.name} {h.namespace}\n"
                   for h in hosts for a in ("", "::ffff:"))
    for h in hosts:
        directory = os.path.join(ETC_NETNS, h.namespace)
        os.makedirs(directory, exist_ok=True)
        with open(os.path.join(directory, "hosts"), "w") as f:
            f.write(base.rstrip("\n") + f"\n# ddlbench emulated cluster {run_id}\n" + ours)

"""MPI host files (Open MPI syntax: ``host slots=N`` per line, ``#`` comments).

Also a small command for the shell launchers:
``python -m ddlbench.hosts.hostfile FILE --need N`` checks that FILE exists, is not an example file
and holds at least N slots, then prints the rendezvous address (the first host; ``localhost``
becomes 127.0.0.1); with ``--horovod`` it prints the hosts as horovodrun's ``-H`` wants them
(``host:slots,...``; horovodrun's own host-file reader trips on comments). Bad input: one line
on stderr, exit 2.
"""
from __future__ import annotations

import ipaddress
import os
import re
import shlex
import socket
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from ..errors import EXIT_USAGE, ArgumentParser, UsageError

EXAMPLE_MARKER = "# ddlbench: example hosts"
LOCAL_NAMES = {"localhost", "127.0.0.1", "::1"}
MAX_SLOTS = 4096  # per host: more is a typo (a 20-digit count), not a machine
_LABEL = re.compile(r"(?!-)[A-Za-z0-9-]{1,63}(?<!-)\Z")


def valid_host(name: str) -> bool:
    """An RFC 1123 host name or an IP address: nothing a command line could take for an
    option (a leading '-') or for code."""
    try:
        ipaddress.ip_address(name)
        return True
    except ValueError:
        pass
    return len(name) <= 253 and all(_LABEL.match(label) for label in name.split("."))


@dataclass(frozen=True)
class Host:
    name: str
    slots: int


def parse(path: str) -> list[Host]:
    if not os.path.isfile(path):
        raise UsageError(f"host file {path} not found")
    hosts = []
    with open(path) as f:
        text = f.read()
    if EXAMPLE_MARKER in text:
        raise UsageError(f"host file {path} holds example hosts; put your cluster's hosts in "
                         f"it and remove the line '{EXAMPLE_MARKER}'")
    for lineno, raw in enumerate(text.splitlines(), 1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        name, *fields = line.split()
        if not valid_host(name):
            raise UsageError(f"{path}:{lineno}: {name[:60]!r} is not a host name or an IP "
                             f"address (an MPI host file has 'HOST slots=N' lines)")
        slots = 1
        for field in fields:
            key, _, value = field.partition("=")
            if key == "slots":
                if not value.isdigit() or not 1 <= int(value) <= MAX_SLOTS:
                    raise UsageError(f"{path}:{lineno}: bad slot count {value[:30]!r} (an "
                                     f"integer from 1 to {MAX_SLOTS})")
                slots = int(value)
        hosts.append(Host(name, slots))
    if not hosts:
        raise UsageError(f"host file {path} lists no hosts")
    return hosts


def total_slots(hosts: list[Host]) -> int:
    return sum(h.slots for h in hosts)


def rendezvous_address(hosts: list[Host]) -> str:
    first = hosts[0].name
    return "127.0.0.1" if first in LOCAL_NAMES else first


def horovodrun_hosts(hosts: list[Host]) -> str:
    return ",".join(f"{h.name}:{h.slots}" for h in hosts)


def check(path: str, need: int) -> list[Host]:
    hosts = parse(path)
    if need > total_slots(hosts):
        raise UsageError(f"{need} workers asked for, but host file {path} has only "
                         f"{total_slots(hosts)} slot(s)")
    return hosts


def is_local(name: str) -> bool:
    """Whether ``name`` is this machine (a local name or this host's name)."""
    return name in LOCAL_NAMES or name == socket.gethostname()


def used(hosts: list[Host], need: int) -> list[str]:
    """The hosts that ``need`` workers filling the slots in order occupy."""
    out, left = [], need
    for h in hosts:
        if left <= 0:
            break
        out.append(h.name)
        left -= h.slots
    return out


def remote_shell() -> list[str]:
    """The remote shell: $SSH (configs/cluster.conf), else non-interactive ssh."""
    return shlex.split(os.environ.get("SSH") or "ssh -o BatchMode=yes")


def require_reachable(names: list[str], timeout_s: float = 20.0) -> None:
    """Every host of ``names`` that is not this machine answers ``$SSH HOST true`` (all at
    once), or one line names the first that does not and what ssh said: a host that is down,
    unknown or refuses the key stops a launch before anything starts."""
    remote = [n for n in dict.fromkeys(names) if not is_local(n)]
    if not remote:
        return
    ssh = remote_shell()

    def probe(name: str) -> str | None:
        cmd = ssh + ["-o", f"ConnectTimeout={int(timeout_s)}", name, "true"]
        try:
            proc = subprocess.run(cmd, stdin=subprocess.DEVNULL, capture_output=True,
                                  text=True, timeout=timeout_s + 5)
        except (OSError, subprocess.TimeoutExpired) as e:
            return f"{type(e).__name__}: {e}"
        if proc.returncode == 0:
            return None
        said = [ln.strip() for ln in proc.stderr.splitlines() if ln.strip()]
        return said[-1] if said else f"exit code {proc.returncode}"

    with ThreadPoolExecutor(max_workers=min(32, len(remote))) as pool:
        for name, why in zip(remote, pool.map(probe, remote)):
            if why is not None:
                raise UsageError(f"host {name} does not answer over ssh "
                                 f"({' '.join(ssh)} {name} true): {why}")


def main(argv=None) -> int:
    p = ArgumentParser(prog="python -m ddlbench.hosts.hostfile")
    p.add_argument("path")
    p.add_argument("--need", type=int, default=1)
    p.add_argument("--horovod", action="store_true",
                   help="print the hosts as horovodrun -H wants them")
    p.add_argument("--reach", action="store_true",
                   help="also check that the hosts the workers use answer over ssh")
    args = p.parse_args(argv)
    try:
        if args.need <= 0:
            raise UsageError(f"nworkers must be positive, got {args.need}")
        hosts = check(args.path, args.need)
        if args.reach:
            require_reachable(used(hosts, args.need))
        print(horovodrun_hosts(hosts) if args.horovod else rendezvous_address(hosts))
        return 0
    except UsageError as e:
        print(f"ddlbench: error: {e}", file=sys.stderr)
        return EXIT_USAGE


if __name__ == "__main__":
    sys.exit(main())

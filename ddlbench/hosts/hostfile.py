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
import sys
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


def main(argv=None) -> int:
    p = ArgumentParser(prog="python -m ddlbench.hosts.hostfile")
    p.add_argument("path")
    p.add_argument("--need", type=int, default=1)
    p.add_argument("--horovod", action="store_true",
                   help="print the hosts as horovodrun -H wants them")
    args = p.parse_args(argv)
    try:
        if args.need <= 0:
            raise UsageError(f"nworkers must be positive, got {args.need}")
        hosts = check(args.path, args.need)
        print(horovodrun_hosts(hosts) if args.horovod else rendezvous_address(hosts))
        return 0
    except UsageError as e:
        print(f"ddlbench: error: {e}", file=sys.stderr)
        return EXIT_USAGE


if __name__ == "__main__":
    sys.exit(main())

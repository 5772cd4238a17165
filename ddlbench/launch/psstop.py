"""Stop every parameter-server job this user started from this checkout: ``byteps/stop.sh``
without ``job=``, as the original's ``benchmarks.py`` calls it (``cd byteps;./stop.sh``) after
each PS run.

``python -m ddlbench.launch.psstop [--hostfile F] [--grace S] [--ps-methods ID,...]`` looks, on
every host of the host file (without one: this machine only), for the processes of the suite's
PS jobs and stops them (SIGTERM, SIGKILL after ``--grace`` seconds). What identifies such a process is
what the PS launcher (``ddlbench.launch.pslaunch``) gives every process it starts, locally or
over ssh:

- it runs ``python -m ddlbench.train ... --job-id ID`` (the job's id on its command line), or
  ``python -m ddlbench.launch.bpsserver --job-id ID`` (real BytePS's scheduler or a server,
  ``engine=byteps``);
- in this checkout: its working directory is the checkout's root (the launcher ``cd``\\ s
  there on every host: local children start there, remote ones run ``cd ROOT && exec ...``);
- as this user (the process's owner is the user running this, on each host the ssh login);
- of a PS job: ``--nservers`` on its command line (the local spawner's job), or a ``--method``
  of ``--ps-methods`` (the registry's parameter-server ids, which ``stop.sh`` gets from
  ``python -m ddlbench.methods names --architecture ps``: a job on one machine runs no server,
  as BytePS), or ``DMLC_ROLE`` in its environment (a worker or server the launcher started on
  a host of the file).

Another user's job, a job of another checkout and an all-reduce job (``torchrun_hosts``, also
with ``--job-id``) are left alone. A remote host is searched by this module itself, run there
from the same checkout path (``cd ROOT && python -m ddlbench.launch.psstop --here``). Prints a
line per job stopped (``stopped job ID on HOST: N process(es)``) or that a host had none;
exit 0, or 1 when a host could not be searched (named in one line on stderr).
"""
from __future__ import annotations

import os
import shlex
import signal
import subprocess
import sys
import time

from ..errors import EXIT_USAGE, ArgumentParser, UsageError
from ..hosts import hostfile
from .pslaunch import JOB_ID
from .pslaunch import flag_value as _value

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PS_ROLES = ("worker", "server", "scheduler")
TRAIN, BYTEPS_SERVER = "ddlbench.train", "ddlbench.launch.bpsserver"


def ps_method(spec: str | None, ps_methods: frozenset = frozenset()) -> bool:
    """Whether ``--method``'s value names one of ``ps_methods`` (the registry's
    parameter-server ids, which ``byteps/stop.sh`` asks ``python -m ddlbench.methods names
    --architecture ps`` for: the launch layer does not import the methods)."""
    return any(m in ps_methods for m in (spec or "").split(","))


def job_of(argv: list[str], environ: dict[str, str] | None,
           ps_methods: frozenset = frozenset()) -> str | None:
    """The job id of a PS job's process from its command line and environment (None: not
    one): ``-m ddlbench.train`` with ``--job-id ID``, and ``--nservers``, ``DMLC_ROLE`` or a
    ``--method`` of ``ps_methods`` (a one-machine PS job runs no server, as BytePS); or
    ``-m ddlbench.launch.bpsserver --job-id ID`` (real BytePS's scheduler or a server)."""
    module = next((i for i in range(len(argv) - 1)
                   if argv[i] == "-m" and argv[i + 1] in (TRAIN, BYTEPS_SERVER)), None)
    if module is None:
        return None
    args = argv[module + 2:]
    job = _value(args, "--job-id")
    if job is None or not JOB_ID.match(job):
        return None
    if argv[module + 1] == BYTEPS_SERVER:   # real BytePS's scheduler or server (engine=byteps)
        return job
    ps = _value(args, "--nservers") is not None \
        or ps_method(_value(args, "--method"), ps_methods) \
        or (environ or {}).get("DMLC_ROLE") in PS_ROLES
    return job if ps else None


def _read(path: str) -> bytes | None:
    try:
        with open(path, "rb") as f:
            return f.read()
    except OSError:  # gone, or not ours to read
        return None


def find(root: str = ROOT, ps_methods: frozenset = frozenset(), uid: int | None = None,
         proc: str = "/proc") -> dict[int, str]:
    """{pid: job id} of this user's PS-job processes whose working directory is ``root``
    (``ps_methods``: as ``job_of``)."""
    uid = os.getuid() if uid is None else uid
    root = os.path.realpath(root)
    out = {}
    for name in os.listdir(proc):
        if not name.isdigit() or int(name) == os.getpid():
            continue
        where = os.path.join(proc, name)
        try:
            if os.stat(where).st_uid != uid or \
                    os.path.realpath(os.readlink(os.path.join(where, "cwd"))) != root:
                continue
        except OSError:
            continue
        raw = _read(os.path.join(where, "cmdline"))
        if not raw:
            continue
        argv = raw.decode(errors="replace").rstrip("\0").split("\0")
        job = job_of(argv, None, ps_methods)
        if job is None and "ddlbench.train" in argv:  # a remote role: DMLC_ROLE says PS
            env_raw = _read(os.path.join(where, "environ")) or b""
            job = job_of(argv, dict(kv.partition("=")[::2] for kv in
                                    env_raw.decode(errors="replace").split("\0") if "=" in kv),
                         ps_methods)
        if job is not None:
            out[int(name)] = job
    return out


def stop_here(grace: float, ps_methods: frozenset, root: str = ROOT) -> dict[str, int]:
    """Stop this machine's PS-job processes of ``root`` (SIGTERM; SIGKILL to the ones still
    there, as the same job, after ``grace`` seconds), then remove this user's BytePS files of
    jobs with no process left (``pslaunch.reap_byteps_leftovers``): {job id: processes
    stopped}."""
    found = find(root, ps_methods)
    for pid in found:
        _signal(pid, signal.SIGTERM)
    deadline = time.monotonic() + grace
    left = dict(found)
    while left and time.monotonic() < deadline:
        time.sleep(0.05)
        left = {p: j for p, j in left.items() if find_one(p, ps_methods, root) == j}
    for pid in left:
        _signal(pid, signal.SIGKILL)
    from .pslaunch import reap_byteps_leftovers
    reap_byteps_leftovers()   # the BytePS files of jobs now gone (a SIGKILLed launcher's too)
    counts: dict[str, int] = {}
    for job in found.values():
        counts[job] = counts.get(job, 0) + 1
    return counts


def find_one(pid: int, ps_methods: frozenset, root: str = ROOT) -> str | None:
    """The job of process ``pid`` if it is still one of ours (not a new process that took the
    pid), else None; a zombie (exited, not yet reaped) counts as gone."""
    stat = _read(f"/proc/{pid}/stat")
    if stat is None or stat.rpartition(b")")[2].split()[:1] == [b"Z"]:
        return None
    return find(root, ps_methods).get(pid) if os.path.isdir(f"/proc/{pid}") else None


def _signal(pid: int, sig: int) -> None:
    try:
        os.kill(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def report(host: str, counts: dict[str, int]) -> list[str]:
    if not counts:
        return [f"no parameter-server job of this checkout ({ROOT}) on {host}"]
    return [f"stopped job {job} on {host}: {n} process(es)" for job, n in sorted(counts.items())]


def stop_remote(host: str, grace: float,
                ps_methods: frozenset) -> tuple[list[str], str | None]:
    """(lines printed, the failure or None) of the search on a remote host over $SSH."""
    py, ids = sys.executable, ",".join(sorted(ps_methods))
    line = (f"cd {shlex.quote(ROOT)} && exec {shlex.quote(py)} -m ddlbench.launch.psstop "
            f"--here --grace {grace:g} --ps-methods {shlex.quote(ids)}")
    try:
        out = subprocess.run(hostfile.remote_shell() + [host, line], stdin=subprocess.DEVNULL,
                             capture_output=True, text=True, timeout=grace + 60)
    except (OSError, subprocess.TimeoutExpired) as e:
        return [], f"{type(e).__name__}: {e}"
    if out.returncode != 0:
        said = [s for s in out.stderr.splitlines() if s.strip()]
        return [], said[-1] if said else f"exit code {out.returncode}"
    return [s.replace(" on this machine", f" on {host}") for s in out.stdout.splitlines()], None


def hosts_of(path: str | None) -> list[str]:
    """The host file's hosts in file order, each once; this machine alone without one."""
    if not path:
        return ["localhost"]
    return list(dict.fromkeys(h.name for h in hostfile.parse(path)))


def main(argv=None) -> int:
    p = ArgumentParser(prog="python -m ddlbench.launch.psstop")
    p.add_argument("--hostfile", default=None,
                   help="the hosts to search (default: this machine only)")
    p.add_argument("--grace", type=float, default=5.0)
    p.add_argument("--here", action="store_true", help="this machine only (remote use)")
    p.add_argument("--ps-methods", default="", metavar="ID,...",
                   help="the parameter-server method ids (a job of one machine runs no server: "
                        "its --method tells it)")
    args = p.parse_args(argv)
    try:
        if args.grace < 0:
            raise UsageError(f"--grace must be >= 0, got {args.grace}")
        hosts = ["this machine"] if args.here else hosts_of(args.hostfile)
        ps_methods = frozenset(m for m in args.ps_methods.replace(" ", ",").split(",") if m)
        if any(not JOB_ID.match(m) for m in ps_methods):
            raise UsageError(f"--ps-methods must be method ids, got {args.ps_methods!r}")
    except UsageError as e:
        print(f"ddlbench: error: {e}", file=sys.stderr, flush=True)
        return EXIT_USAGE
    failed = 0
    local_done = False
    for h in hosts:
        if h == "this machine" or hostfile.is_local(h):
            if local_done:
                continue
            local_done = True
            print("\n".join(report(h, stop_here(args.grace, ps_methods))), flush=True)
            continue
        lines, why = stop_remote(h, args.grace, ps_methods)
        if why is not None:
            failed += 1
            print(f"ddlbench: cannot search {h} for jobs to stop: {why}", file=sys.stderr,
                  flush=True)
        if lines:
            print("\n".join(lines), flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())

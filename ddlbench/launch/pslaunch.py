"""Start a parameter-server job on the hosts of a host file, as BytePS's launcher did.

``python -m ddlbench.launch.pslaunch --hostfile F --nworkers W [--nservers S] [--job-id ID] -- ARGS``
(``byteps/byteps_launch.sh`` calls it) runs ``python -m ddlbench.train ARGS`` as W workers and
S servers:

- workers on one machine (one host of the file holds them all, or every host of the file is
  this one and the training script's flags make no emulated cluster of several hosts): no
  server, whatever S (a note says so), as BytePS with one worker machine (a
  local reduce and broadcast: ``ddlbench.runtime.ps.LocalReduce``); ``--ps-force-servers``
  (also when among ARGS) starts them anyway and hands the flag to the training script;

- every host of the file local (``localhost``): the suite's local spawner does it
  (``--nworkers W --nservers S``), servers included;
- otherwise workers fill the hosts' slots in order, and servers (default: one per worker
  machine, as the published runs) go on **dedicated hosts**, as the original's (its servers ran
  on machines of their own): ``--server-hosts H,...``, else the host file's hosts that hold no
  worker, round-robin; with no such host, or with ``--servers colocated``, round-robin over the
  worker machines (a line says so). Each process is started with ``$SSH host`` (``ssh`` unless
  configs/cluster.conf says otherwise) or locally for a local host, with the DMLC_* variables
  a BytePS user knows, meaning what they mean to BytePS: ``DMLC_NUM_WORKER`` counts worker
  *machines* and ``DMLC_WORKER_ID`` is the machine's index, ``BYTEPS_LOCAL_RANK`` and
  ``BYTEPS_LOCAL_SIZE`` the process's place on its machine (``DMLC_ROLE``, ``DMLC_NUM_SERVER``,
  ``DMLC_PS_ROOT_URI``, ``DMLC_PS_ROOT_PORT`` as usual); the suite adds ``DDLBENCH_SERVER_ID``,
  the worker's global rank and count (``DDLBENCH_WORKER_RANK``, ``DDLBENCH_NUM_WORKER``: host
  files may give machines different slot counts) and ``DDLBENCH_MACHINE`` (the host's name:
  the workers of one host push to the servers as one machine). The rendezvous is
  ``DMLC_PS_ROOT_URI`` (default: the first host) on ``DMLC_PS_ROOT_PORT`` (default: a port the
  first host's kernel reports free).

When any process fails, or this launcher gets SIGINT/SIGTERM, every process of the job is
stopped: local children directly, remote ones by ``pkill`` on their host, found by the job id
on their command line (``--job-id``, printed as ``job ID: ...``). Killed outright (SIGKILL),
the launcher still takes the job along: local children get the parent-death signal, remote
ones see their ssh connection's stdin close. ``--stop --job-id ID`` stops that job's processes
on every host of the file, and nothing else: ``byteps/stop.sh``.

Everything sent to a remote shell is quoted, and only variables with valid names
(``[A-Za-z_][A-Za-z0-9_]*``) are forwarded; host names and job ids are checked first.
"""
from __future__ import annotations

import argparse
import os
import re
import shlex
import shutil
import socket
import stat
import subprocess
import sys
import uuid

from ..errors import EXIT_USAGE, ArgumentParser, UsageError
from ..hosts import hostfile
from ..hosts.procs import (ENV_NAME, PARENT_ENV, STDIN_ENV, die_with_parent, stop_signals,
                           supervise, terminate)


FORWARD_PREFIXES = ("NCCL_", "GLOO_", "DDLBENCH_", "OMP_")
JOB_ID = re.compile(r"[A-Za-z0-9_.-]{1,64}\Z")


def check_job_id(job: str) -> str:
    if not JOB_ID.match(job):
        raise UsageError(f"job id must be 1 to 64 of [A-Za-z0-9_.-], got {job!r}")
    return job


def forwarded_env(environ) -> dict[str, str]:
    """The variables that travel to remote processes (ssh forwards none): the suite's, Gloo's,
    NCCL's and OpenMP's (their names are checked where the remote line is built)."""
    return {k: v for k, v in environ.items() if k.startswith(FORWARD_PREFIXES)}


def host_file_parser(prog: str) -> ArgumentParser:
    """The options of every launcher over a host file; ``parse`` adds the training script's
    arguments (after ``--``)."""
    p = ArgumentParser(prog=prog)
    p.add_argument("--hostfile", required=True)
    p.add_argument("--nworkers", type=int, default=None)
    p.add_argument("--job-id", default=None)
    p.add_argument("--stop", action="store_true",
                   help="stop job --job-id's processes on every host of the host file")
    p.add_argument("--grace", type=float, default=5.0)
    return p


def parse(p: ArgumentParser, argv):
    p.add_argument("train_args", nargs=argparse.REMAINDER)
    args = p.parse_args(argv)
    if args.train_args and args.train_args[0] == "--":
        args.train_args = args.train_args[1:]
    return args


def parse_args(argv):
    p = host_file_parser("python -m ddlbench.launch.pslaunch")
    p.add_argument("--nservers", type=int, default=None)
    p.add_argument("--servers", default="dedicated", choices=("dedicated", "colocated"),
                   help="servers on hosts of their own (default) or on the worker machines")
    p.add_argument("--server-hosts", default=None, metavar="H,...",
                   help="the hosts of the servers (default: the host file's hosts without "
                        "workers)")
    p.add_argument("--engine", default="torch", choices=("torch", "byteps"),
                   help="torch: the suite's servers; byteps: real BytePS's scheduler and "
                        "servers, every worker a BytePS worker of its own (the training "
                        "script's --engine byteps, in the environment make byteps-env builds)")
    p.add_argument("--ps-force-servers", action="store_true",
                   help="start the servers even when the workers are on one machine (which "
                        "otherwise runs none, as BytePS: a local reduce and broadcast)")
    return parse(p, argv)


FORCE = "--ps-force-servers"
ONE_MACHINE_NOTE = ("the workers are on one machine: no parameter server is started (a local "
                    "reduce and broadcast, as BytePS with one worker machine); "
                    "ps_force_servers=1 (--ps-force-servers) starts them anyway")


def one_machine(hosts: list[hostfile.Host], workers: list[str], train_args: list[str],
                nworkers: int) -> bool:
    """Whether the workers are on one machine: one host of the file holds them all; when every
    host of the file is this one, the local spawner runs them all here and the training
    script's rule decides (one machine unless ``--net`` emulates a cluster or ``--slots``
    makes several hosts: ``launch.local.one_machine``, the training script's rule)."""
    if not all(is_local(h.name) for h in hosts):
        return len(set(workers)) == 1
    import argparse

    from . import local
    p = argparse.ArgumentParser(add_help=False)
    p.add_argument("--slots", default=None)
    p.add_argument("--net", default=os.environ.get("DDLBENCH_NET") or "loopback")
    known, _ = p.parse_known_args(train_args)
    try:
        slots = None if known.slots is None else int(known.slots)
    except ValueError:   # the training script says what is wrong, in one line
        return True
    return local.one_machine(nworkers, slots, known.net, env={})


def resolve(hosts: list[hostfile.Host], path: str) -> None:
    for h in hosts:
        if h.name in hostfile.LOCAL_NAMES:
            continue
        try:
            socket.getaddrinfo(h.name, None)
        except socket.gaierror:
            raise UsageError(f"unknown host {h.name!r} in host file {path}") from None


is_local = hostfile.is_local


def placement(hosts: list[hostfile.Host], nworkers: int, nservers: int,
              servers: str = "dedicated", server_hosts: list[str] | None = None):
    """(host of each worker, host of each server, a note or None). Workers fill slots in file
    order. Servers go round-robin over ``server_hosts``, else (dedicated) over the hosts that
    hold no worker, else over the worker machines, with a note saying why."""
    workers = [h.name for h in hosts for _ in range(h.slots)][:nworkers]
    machines = list(dict.fromkeys(workers))
    note = None
    if server_hosts:
        pool = list(dict.fromkeys(server_hosts))
    elif servers == "dedicated":
        pool = [h for h in dict.fromkeys(h.name for h in hosts) if h not in machines]
        if not pool and nservers:
            pool = machines
            note = (f"no host of the host file is left without workers: the {nservers} "
                    f"server(s) share the worker machines (add hosts, or server_hosts=, for "
                    f"dedicated ones)")
    else:
        pool = machines
    return workers, [pool[s % len(pool)] for s in range(nservers)], note


_ssh = hostfile.remote_shell


def _free_port(host: str, py: str) -> int:
    code = "import socket; s = socket.socket(); s.bind(('', 0)); print(s.getsockname()[1])"
    if is_local(host):
        return int(subprocess.run([py, "-c", code], capture_output=True, text=True,
                                  check=True).stdout)
    out = subprocess.run(_ssh() + [host, f"{shlex.quote(py)} -c {shlex.quote(code)}"],
                         capture_output=True, text=True, timeout=60)
    if out.returncode != 0 or not out.stdout.strip().isdigit():
        raise UsageError(f"cannot reach {host} over ssh to choose a port: "
                         f"{(out.stderr.strip().splitlines() or ['no output'])[-1]}")
    return int(out.stdout)


def prepare(args) -> tuple[list[hostfile.Host], int | None]:
    """What a launcher over a host file checks first (the host file, its hosts' names, the
    job id, the worker count), and ``--stop``: (the hosts, the exit code of a stop or None)."""
    hosts = hostfile.parse(args.hostfile)
    resolve(hosts, args.hostfile)
    if args.job_id is not None:
        check_job_id(args.job_id)
    if args.stop:
        if args.job_id is None:
            raise UsageError("--stop needs --job-id ID (the id the launcher printed): only "
                             "that job's processes are stopped")
        return hosts, stop(hosts, args.job_id)
    if args.nworkers is None or args.nworkers <= 0:
        raise UsageError(f"nworkers must be positive, got {args.nworkers}")
    return hosts, None


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        args = parse_args(argv)
        hosts, stopped = prepare(args)
        if stopped is not None:
            return stopped
        hostfile.check(args.hostfile, args.nworkers)
        server_hosts = None
        if args.server_hosts:
            server_hosts = [h.strip() for h in args.server_hosts.split(",") if h.strip()]
            resolve([hostfile.Host(h, 1) for h in server_hosts], "server_hosts")
        py = sys.executable
        root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
        train = ["-m", "ddlbench.train", *args.train_args]
        job = args.job_id or uuid.uuid4().hex[:12]

        def announce() -> None:
            print(f"job ID: {job} (job={job} ./byteps/stop.sh stops it)", file=sys.stderr,
                  flush=True)
        if args.engine == "byteps":
            return byteps_job(args, hosts, server_hosts, py, root, train + ["--job-id", job],
                              job, announce)
        nservers = servers_of(args, hosts)
        train = ["-m", "ddlbench.train", *args.train_args]   # (with --ps-force-servers)
        if all(is_local(h.name) for h in hosts):
            announce()
            cmd = [py, *train, "--nworkers", str(args.nworkers),
                   *(["--nservers", str(nservers)] if nservers else []), "--job-id", job]
            print("+ " + " ".join(shlex.quote(c) for c in cmd), file=sys.stderr, flush=True)
            os.chdir(root)
            os.execv(py, cmd)
        workers, servers, note = placement(hosts, args.nworkers, nservers, args.servers,
                                           server_hosts)
        hostfile.require_reachable(workers + servers)
        announce()
        if note:
            print(f"ddlbench: note: {note}", file=sys.stderr, flush=True)
        uri = os.environ.get("DMLC_PS_ROOT_URI") or workers[0]
        port = os.environ.get("DMLC_PS_ROOT_PORT") or str(_free_port(workers[0], py))
        common, roles = dmlc_roles(workers, servers, args.nworkers, uri, port)
        return run(roles, common, py, root, train + ["--job-id", job], job, args.grace)
    except UsageError as e:
        print(f"ddlbench: error: {e}", file=sys.stderr, flush=True)
        return EXIT_USAGE


def servers_of(args, hosts: list[hostfile.Host]) -> int:
    """How many servers the job gets: ``--nservers``, else one per worker machine; none when
    the workers are on one machine (a note says so) unless forced (``--ps-force-servers``,
    which the training script then gets too)."""
    workers, _, _ = placement(hosts, args.nworkers, 0)
    nservers = args.nservers if args.nservers is not None else len(set(workers))
    if nservers <= 0:
        raise UsageError(f"nservers must be positive, got {nservers}")
    forced = args.ps_force_servers or FORCE in args.train_args
    if args.ps_force_servers and FORCE not in args.train_args:
        args.train_args.append(FORCE)
    if not forced and one_machine(hosts, workers, args.train_args, args.nworkers):
        print(f"ddlbench: note: {ONE_MACHINE_NOTE}", file=sys.stderr, flush=True)
        return 0
    return nservers


BYTEPS_SERVER = ["-m", "ddlbench.launch.bpsserver"]
# What a BytePS user sets on a small machine, the lane's defaults (each the environment's where
# it is set): one engine thread per server (BytePS: 4), one OpenMP thread for a worker's CPU
# reducer (4), one ZMQ I/O thread per process (4), OpenMP threads that sleep while they wait.
FAIR_SETTINGS = {"BYTEPS_SERVER_ENGINE_THREAD": "1", "BYTEPS_OMP_THREAD_PER_GPU": "1",
                 "BYTEPS_ZMQ_NTHREADS": "1", "OMP_WAIT_POLICY": "PASSIVE"}
FAIR_ENV = "DDLBENCH_BYTEPS_FAIR"        # 0: the lane as shipped before (``lane_settings``)
IDLE_LOOPS = "BYTEPS_CPU_COMPRESS_LOOPS"  # 1: the CPU path starts BytePS's compress loops
SERVER_SCHEDULE = "BYTEPS_SERVER_ENABLE_SCHEDULE"
# =original: the servers keep BytePS 0.2.5's stale scheduling heap (byteps/cpu_only.patch)
SCHEDULE_HEAP = "BYTEPS_SERVER_SCHEDULE_HEAP"


def byteps_job(args, hosts, server_hosts, py, root, train, job, announce) -> int:
    """``--engine byteps``: real BytePS's scheduler and ``nservers`` servers
    (``ddlbench.launch.bpsserver``; default one per worker machine, at least one) and the
    workers, each a BytePS worker of its own (``BYTEPS_LOCAL_SIZE=1``: the CPU path has no
    local reduce), locally or over ssh. One worker alone is local to BytePS: no scheduler, no
    server. The servers schedule as ``BYTEPS_SERVER_ENABLE_SCHEDULE`` in this environment
    says (the shell launcher sets it from the method)."""
    workers, _, _ = placement(hosts, args.nworkers, 0)
    settings, pin = lane_settings(os.environ)
    nservers = args.nservers if args.nservers is not None else len(set(workers))
    if nservers <= 0:
        raise UsageError(f"nservers must be positive, got {nservers}")
    reap_byteps_leftovers()   # of jobs gone without cleaning up (their launcher SIGKILLed)
    if args.nworkers == 1:
        print("ddlbench: note: one BytePS worker alone synchronises with nobody: no scheduler "
              "and no server are started", file=sys.stderr, flush=True)
        nservers = 0
    net = flag_value(args.train_args, "--net") or os.environ.get("DDLBENCH_NET") or "loopback"
    local = all(is_local(h.name) for h in hosts)
    from .. import netem
    emulated = local and not netem.resolve(net).loopback   # hosts host0... of a cluster built here
    if not emulated:
        workers, servers, note = placement(hosts, args.nworkers, nservers, args.servers,
                                           server_hosts)
        hostfile.require_reachable(workers + servers)
    else:   # an emulated cluster: a host per worker (--slots: per that many), servers apart
        from .local import hosts_of
        slots = flag_value(args.train_args, "--slots")
        where = hosts_of(args.nworkers + nservers, nservers, int(slots) if slots else None)
        workers = [f"host{h}" for h in where[:args.nworkers]]
        servers = [f"host{h}" for h in where[args.nworkers:]]
        note = None
    announce()
    if note:
        print(f"ddlbench: note: {note}", file=sys.stderr, flush=True)
    cluster = None
    try:
        if emulated:
            cluster = netem.start(max(int(h[4:]) for h in workers + servers) + 1, net)
        uri = os.environ.get("DMLC_PS_ROOT_URI") or workers[0]
        if not cluster and uri not in hostfile.LOCAL_NAMES:
            # ps-lite's scheduler binds to DMLC_PS_ROOT_URI: an address, not a host name
            try:
                uri = socket.gethostbyname(uri)
            except OSError:
                raise UsageError(f"cannot resolve {uri!r}, BytePS's scheduler host") from None
        first = "localhost" if cluster else workers[0]   # (an emulated host: any port is free)
        port = os.environ.get("DMLC_PS_ROOT_PORT") or str(_free_port(first, py))
        store = str(_free_port(first, py))
        while store == port:
            store = str(_free_port(first, py))
        common, roles, names = byteps_roles(workers, servers, uri, port, store, local)
        common["BYTEPS_JOB_ID"] = job     # the patch names the workers' shared memory with it
        common.update(settings)
        fair = local and settings[FAIR_ENV] == "1"   # (as shipped: no plan, nothing pinned)
        setups = byteps_pinning(common, roles, len(workers), len(servers), pin) if fair else None
        argvs = [train if role["DMLC_ROLE"] == "worker" else BYTEPS_SERVER + ["--job-id", job]
                 for _, role in roles]
        prefixes = None
        if cluster is not None:
            # the network is built: the workers run on it as on a cluster's (their record's
            # `net` is the cluster's, DDLBENCH_NET_INFO)
            inside = _without(train, ("--net", "--slots"))
            argvs = [inside if argv is train else argv for argv in argvs]
            common["DDLBENCH_NET"] = "loopback"
            prefixes = []
            common["DMLC_PS_ROOT_URI"] = cluster.hosts[0].address
            for h, role in roles:
                i = int(h[4:])
                host_env = cluster.env(i)
                role.update(DMLC_NODE_HOST=cluster.hosts[i].address, DDLBENCH_MACHINE=h,
                            GLOO_SOCKET_IFNAME=host_env["GLOO_SOCKET_IFNAME"],
                            DDLBENCH_NET_INFO=host_env["DDLBENCH_NET_INFO"])
                prefixes.append(cluster.prefix(i))
        return run(roles, common, py, root, train, job, args.grace, argvs=argvs, names=names,
                   ours=True, prefixes=prefixes, setups=setups)
    finally:
        if cluster is not None:
            cluster.down()
        remove_byteps_files(["localhost"] if cluster else sorted(set(workers)), job)


def lane_settings(environ) -> tuple[dict[str, str], bool]:
    """The variables the BytePS lane adds to every process, and whether its processes are
    pinned: by default (``DDLBENCH_BYTEPS_FAIR`` unset or 1) ``FAIR_SETTINGS``, each the
    environment's where set, and the local processes pinned as the suite's local spawner pins
    its own (``byteps_pinning``; ``--no-pin``'s ``DDLBENCH_PIN=0`` not); with 0, the lane as
    shipped before: none of them, nothing pinned, and the CPU path's idle compress and
    decompress loops started (``BYTEPS_CPU_COMPRESS_LOOPS=1``, byteps/cpu_only.patch)."""
    from ..hosts import pinning
    fair = environ.get(FAIR_ENV, "1")
    if fair not in ("0", "1"):
        raise UsageError(f"{FAIR_ENV} must be 0 or 1, got {fair!r}")
    if fair == "0":
        return {FAIR_ENV: "0", IDLE_LOOPS: environ.get(IDLE_LOOPS) or "1"}, False
    knobs = {k: environ.get(k) or v for k, v in FAIR_SETTINGS.items()}
    return {FAIR_ENV: "1", **knobs}, pinning.enabled(environ)


def byteps_pinning(common: dict, roles, nworkers: int, nservers: int, pin: bool) -> list:
    """Each local process's set-up (``local.child_setup``) under the plan the suite's local
    spawner makes for ``nworkers`` workers and ``nservers`` servers (``pinning.plan``: a core
    or more each where they fit; the workers alone where only they fit), the scheduler on
    every core; the plan goes to every process in ``DDLBENCH_PLACEMENT`` (the record's
    ``environment.placement``)."""
    import json

    from ..hosts import pinning
    from .local import child_setup
    plan = pinning.plan(nworkers, nservers, pin=pin)
    common[pinning.PLACEMENT_ENV] = json.dumps(plan, sort_keys=True)
    ranks = [int(r["DDLBENCH_WORKER_RANK"]) if r["DMLC_ROLE"] == "worker"
             else nworkers + int(r["DDLBENCH_SERVER_ID"]) if r["DMLC_ROLE"] == "server"
             else None for _, r in roles]
    return [child_setup(plan, rank) for rank in ranks]


def _without(args: list[str], flags: tuple[str, ...]) -> list[str]:
    """``args`` without ``flags`` and their values (``--flag V`` or ``--flag=V``)."""
    out, skip = [], False
    for a in args:
        if skip:
            skip = False
        elif a in flags:
            skip = True
        elif not a.startswith(tuple(f + "=" for f in flags)):
            out.append(a)
    return out


def flag_value(args: list[str], flag: str) -> str | None:
    """The last value of ``flag`` (``--flag V`` or ``--flag=V``) among ``args`` (the training
    script's arguments)."""
    found = None
    for i, a in enumerate(args):
        if a == flag and i + 1 < len(args):
            found = args[i + 1]
        elif a.startswith(flag + "="):
            found = a[len(flag) + 1:]
    return found


def byteps_files(job: str) -> str:
    """What a BytePS worker of job ``job`` leaves on its host when it does not end cleanly
    (the patch's names): its shared memory, its sockets and the directory of its trace
    (``runtime.byteps.start`` with --timeline), as a shell glob."""
    return (f"/dev/shm/BytePS_ShM_{job}_* /tmp/socket_send_{job}_* /tmp/socket_recv_{job}_* "
            f"/tmp/ddlbench-byteps-trace-{job}-*")


# Where a BytePS worker leaves its files (``byteps_files``): folder, and the names' start before
# the job id
# (a shared-memory file, a socket, a folder) and the separator after the id
BYTEPS_LEFTOVERS = (("/dev/shm", "BytePS_ShM_", stat.S_ISREG, "_"),
                    ("/tmp", "socket_send_", stat.S_ISSOCK, "_"),
                    ("/tmp", "socket_recv_", stat.S_ISSOCK, "_"),
                    ("/tmp", "ddlbench-byteps-trace-", stat.S_ISDIR, "-"))


def command_lines():
    """(pid, argv) of every process on this machine whose command line can be read."""
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                yield int(pid), f.read().decode(errors="replace").split("\0")
        except OSError:
            continue


def live_job_ids() -> set[str]:
    """The job ids on this machine's command lines (``--job-id ID`` of any process)."""
    return {argv[i + 1] for _, argv in command_lines()
            for i, a in enumerate(argv[:-1]) if a == "--job-id"}


def reap_byteps_leftovers() -> list[str]:
    """Remove this user's BytePS files on this machine (shared memory, sockets, traces) of
    jobs none of whose processes is left (a launcher killed with SIGKILL leaves them: nothing
    of it runs to remove them); a file that may be a running job's (its name starts with a
    live job's id) is kept. Returns what was removed."""
    live, me, removed = live_job_ids(), os.getuid(), []
    for folder, head, kind, sep in BYTEPS_LEFTOVERS:
        try:
            names = [n for n in os.listdir(folder) if n.startswith(head)]
        except OSError:
            continue
        for name in names:
            path, rest = os.path.join(folder, name), name[len(head):]
            try:
                st = os.lstat(path)
                if st.st_uid != me or not kind(st.st_mode) or any(
                        rest.startswith(j + sep) for j in live):
                    continue
                if stat.S_ISDIR(st.st_mode):
                    shutil.rmtree(path)
                else:
                    os.unlink(path)
                removed.append(path)
            except OSError:
                pass
    return removed


def remove_byteps_files(hosts: list[str], job: str) -> None:
    """Remove job ``job``'s BytePS files on every worker host (after the job: a worker
    killed, or ended after a failure, leaves them)."""
    cmd = f"rm -rf {byteps_files(check_job_id(job))}"
    for h in hosts:
        line = ["sh", "-c", cmd] if is_local(h) else _ssh() + [h, cmd]
        subprocess.run(line, capture_output=True, timeout=60)


def byteps_roles(workers: list[str], servers: list[str], uri: str, port: str, store: str,
                 local: bool):
    """The variables of every process of an ``--engine byteps`` job: (those common to all,
    [(host, a process's own)] for the scheduler, the servers and the workers, their names).
    Every worker is a BytePS worker (``DMLC_WORKER_ID`` = its rank, ``DMLC_NUM_WORKER`` the
    processes); worker 0's store is on ``DDLBENCH_STORE_PORT``. ``local``: every process is
    on this machine, and BytePS's nodes announce the loopback (``DMLC_NODE_HOST``)."""
    schedule = os.environ.get(SERVER_SCHEDULE, "0")
    common = {"DMLC_NUM_WORKER": str(len(workers)), "DMLC_NUM_SERVER": str(len(servers)),
              "DDLBENCH_NUM_WORKER": str(len(workers)), "DDLBENCH_ENGINE": "byteps",
              "DMLC_PS_ROOT_URI": "127.0.0.1" if uri in hostfile.LOCAL_NAMES else uri,
              "DMLC_PS_ROOT_PORT": port, "DDLBENCH_STORE_PORT": store,
              SERVER_SCHEDULE: schedule}
    if os.environ.get(SCHEDULE_HEAP):
        common[SCHEDULE_HEAP] = os.environ[SCHEDULE_HEAP]
    if local:
        common["DMLC_NODE_HOST"] = "127.0.0.1"
    roles, names = [], []
    if servers:
        roles.append((workers[0], {"DMLC_ROLE": "scheduler"}))
        names.append(f"BytePS scheduler on {workers[0]}")
    for s, h in enumerate(servers):
        roles.append((h, {"DMLC_ROLE": "server", "DDLBENCH_SERVER_ID": str(s)}))
        names.append(f"BytePS server {s} on {h}")
    for i, h in enumerate(workers):
        roles.append((h, {"DMLC_ROLE": "worker", "DMLC_WORKER_ID": str(i),
                          "DDLBENCH_WORKER_RANK": str(i), "DDLBENCH_MACHINE": h,
                          "BYTEPS_LOCAL_RANK": "0", "BYTEPS_LOCAL_SIZE": "1"}))
        names.append(f"worker {i} on {h}")
    _local_ranks(roles)
    return common, roles, names


def dmlc_roles(workers: list[str], servers: list[str], nworkers: int, uri: str, port: str):
    """The variables of every process (BytePS's and the suite's; the module's docstring):
    (those common to all, [(host, a process's own)] for the workers then the servers)."""
    machine_ids = list(dict.fromkeys(workers))
    common = {"DMLC_NUM_WORKER": str(len(machine_ids)), "DMLC_NUM_SERVER": str(len(servers)),
              "DDLBENCH_NUM_WORKER": str(nworkers),
              "DMLC_PS_ROOT_URI": "127.0.0.1" if uri in hostfile.LOCAL_NAMES else uri,
              "DMLC_PS_ROOT_PORT": port}
    roles = [(h, {"DMLC_ROLE": "worker", "DDLBENCH_WORKER_RANK": str(i),
                  "DMLC_WORKER_ID": str(machine_ids.index(h)), "DDLBENCH_MACHINE": h,
                  "BYTEPS_LOCAL_RANK": str(workers[:i].count(h)),
                  "BYTEPS_LOCAL_SIZE": str(workers.count(h))})
             for i, h in enumerate(workers)]
    roles += [(h, {"DMLC_ROLE": "server", "DDLBENCH_SERVER_ID": str(s)})
              for s, h in enumerate(servers)]
    _local_ranks(roles)
    return common, roles


def _local_ranks(roles) -> None:
    """Each process's place among its host's (``DDLBENCH_LOCAL_RANK``/``_SIZE``), so that CPU
    workers share that host's cores."""
    per_host = {h: sum(1 for x, _ in roles if x == h) for h, _ in roles}
    seen: dict[str, int] = {}
    for h, env in roles:
        env.update(DDLBENCH_LOCAL_RANK=str(seen.setdefault(h, 0)),
                   DDLBENCH_LOCAL_SIZE=str(per_host[h]))
        seen[h] += 1


def run(roles, common, py, root, train, job, grace, argvs=None, names=None,
        ours: bool | None = None, prefixes=None, setups=None) -> int:
    """Start every role's process (``(host, environment)``; its argv after the interpreter is
    ``train``, or its own from ``argvs``), supervise them, stop them all at the first failure
    or signal. ``names``: how lines name the processes (default: worker/server on host).
    ``ours``: the processes are the suite's, which watch their parent (default: without
    ``argvs``; with them, a tool's). ``prefixes``: each local process's command prefix (an
    emulated host's ``ip netns exec``). ``setups``: each local process's ``preexec_fn``
    (default: it dies with this process)."""
    with stop_signals() as stopping:
        return _run(roles, common, py, root, train, job, grace, stopping, argvs, names,
                    argvs is None if ours is None else ours, prefixes, setups)


def _run(roles, common, py, root, train, job, grace, stopping, argvs, names, ours,
         prefixes=None, setups=None) -> int:
    procs: list[tuple[str, subprocess.Popen]] = []
    argvs = argvs or [train] * len(roles)
    prefixes = prefixes or [[]] * len(roles)
    setups = setups or [None] * len(roles)
    # (an emulated host is this machine: its processes are local children)
    remote = sorted({h for (h, _), pre in zip(roles, prefixes) if not pre and not is_local(h)})
    try:
        for (host, role), argv, prefix, setup in zip(roles, argvs, prefixes, setups):
            env = dict(common, **role)
            if prefix or is_local(host):
                if ours:
                    env[PARENT_ENV] = str(os.getpid())
                procs.append((host, subprocess.Popen([*prefix, py, *argv], cwd=root,
                                                     env=dict(os.environ, **env),
                                                     preexec_fn=setup or die_with_parent())))
            else:
                # ssh forwards no environment: the network profile's settings travel too. The
                # remote process watches its stdin, our pipe: it ends when we do.
                env = forwarded_env(os.environ) | env | {STDIN_ENV: "1"}
                procs.append((host, subprocess.Popen(_ssh() + [host, remote_line(root, env, py,
                                                                                  argv)],
                                                     stdin=subprocess.PIPE,
                                                     preexec_fn=die_with_parent())))
        names = names or [(f"worker {role['DDLBENCH_WORKER_RANK']}"
                           if role["DMLC_ROLE"] == "worker"
                           else f"server {role['DDLBENCH_SERVER_ID']}") + f" on {host}"
                          for host, role in roles]
        # (1 s for the process that died first, over ssh perhaps, to be seen as the cause)
        return supervise([p for _, p in procs], names, stopping, settle_s=1.0, poll_s=0.1)
    finally:
        _stop_all(procs, remote, job, grace)


def remote_line(root: str, env: dict, py: str, argv: list[str]) -> str:
    """The command line a remote shell runs: every word quoted, every variable name checked
    (a name that is not a shell variable name would be code in the remote command line)."""
    for k in env:
        if not ENV_NAME.fullmatch(k):
            raise UsageError(f"environment variable {k!r} is not a valid variable name "
                             f"and cannot be forwarded to remote hosts; unset it")
    assign = " ".join(f"{k}={shlex.quote(v)}" for k, v in env.items())
    return (f"cd {shlex.quote(root)} && exec env {assign} {shlex.quote(py)} "
            + " ".join(shlex.quote(a) for a in argv))


def _stop_all(procs, remote_hosts, job, grace) -> None:
    """Remote processes by pkill on their hosts, then the local children (ssh clients or
    processes) with SIGTERM, SIGKILL after ``grace``."""
    alive = [p for _, p in procs if p.poll() is None]
    if alive and remote_hosts:
        stop([hostfile.Host(h, 1) for h in remote_hosts], job, quiet=True)
    terminate(alive, grace)


def stop(hosts, job: str, quiet: bool = False) -> int:
    """Stop the processes of job ``job`` (its id on their command line) on every host, and
    remove the files its BytePS workers leave (``remove_byteps_files``)."""
    pattern = (f"ddlbench[.](train|launch[.]bpsserver) .*--job-id "
               f"{re.escape(check_job_id(job))}( |$)")
    for h in dict.fromkeys(h.name for h in hosts):
        cmd = ["pkill", "-TERM", "-f", pattern]
        if not is_local(h):
            cmd = _ssh() + [h, " ".join(shlex.quote(c) for c in cmd)]
        subprocess.run(cmd, capture_output=True, timeout=60)
        remove_byteps_files([h], job)   # (engine=byteps: what its workers leave)
        if not quiet:
            print(f"stopped the processes of job {job} on {h}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

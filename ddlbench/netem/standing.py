"""A standing emulated cluster: hosts that stay up, each with its own OpenSSH server.

``python -m ddlbench.netem cluster up --hosts N --net PROFILE [--slots S] [--name NAME]`` builds
the emulated network of ``--net`` (cluster.py: a namespace per host, a veth to a bridge, a tbf
per direction, an address in 198.18.0.0/15) and gives every host what a cluster node has:

- a host name, ``NAME0 ... NAMEN-1`` (``node0`` ...), in a UTS namespace of its own, so
  ``hostname`` and ``socket.gethostname()`` tell the hosts apart, and in every host's
  ``/etc/hosts``;
- one interface name in every host, ``eth0`` (``GLOO_SOCKET_IFNAME=eth0`` holds for all ranks);
- an OpenSSH server (``/usr/sbin/sshd``, Debian's ``openssh-server``) on port 22 of its
  address, with a host key and a client key made for this cluster; every host's
  ``/etc/ssh/ssh_config`` (``ip netns exec`` shows ``/etc/netns/NS/ssh`` there) uses them, so
  ``ssh node3 hostname`` works from any host without a prompt, and the servers pass the
  suite's variables (``AcceptEnv``) and give remote commands the suite's ``PATH``.

The cluster's directory (``state_dir()/clusters/NAME``, printed by ``up`` and ``status``)
holds ``hostfile`` (``NAMEi slots=S``, an MPI host file), ``cluster.conf`` (the entries of
``configs/cluster.conf`` for it: interface, subnet, Python, mpirun; the launchers read it when
``DDLBENCH_CLUSTER_CONF`` names it), the keys, the servers' configuration and logs, and
``cluster.json`` (what ``status`` prints).

The 198.18 addresses exist only inside the namespaces: commands run on a host, as on a
cluster one logs in to a node. ``cluster exec [--host I] -- [VAR=VALUE ...] CMD ...`` runs CMD
on host I (default 0, the launch node) with the cluster's variables set, e.g.::

    python -m ddlbench.netem cluster exec -- hostfile=HOSTFILE nworkers=4 \\
        ./horovod/horovod_mpi_cj.sh

The set outlives ``up``: its state file says ``standing`` (state.py), so neither the next
run's stale-set clean-up nor ``cleanup`` removes it; ``cluster down`` does (``cleanup --all``
too), killing what runs on the hosts. An ``up`` that fails or is killed removes what it made.
"""
from __future__ import annotations

import contextlib
import fcntl
import json
import os
import re
import shutil
import subprocess
import sys
import time

from ..errors import UsageError
from .cluster import Cluster
from .links import ETC_NETNS, NetemError, namespace_pids, require
from .profiles import resolve
from .state import _read_states, cleanup_stale, make_standing, state_dir

SSHD = "/usr/sbin/sshd"
SLURM_DAEMONS = {"munged": "/usr/sbin/munged", "slurmctld": "/usr/sbin/slurmctld",
                 "slurmd": "/usr/sbin/slurmd"}
IFNAME = "eth0"
NAME_RE = re.compile(r"[a-z][a-z0-9-]{0,19}\Z")
MAX_STANDING_HOSTS = 64
# what the servers take from a client's environment (ssh -o SendEnv, the PS launcher's)
ACCEPTED = "LANG LC_* DDLBENCH_* GLOO_* NCCL_* MASTER_* OMP_* DMLC_* BYTEPS_*"
_VAR = re.compile(r"[A-Za-z_][A-Za-z0-9_]*=")


def directory(name: str) -> str:
    return os.path.join(state_dir(), "clusters", name)


def check_name(name: str) -> str:
    if not NAME_RE.match(name):
        raise UsageError(f"a cluster name is 1 to 20 of a-z, 0-9 and '-', starting with a "
                         f"letter (its hosts are NAME0, NAME1, ...), got {name!r}")
    return name


def unavailable_reason() -> str | None:
    """Why a standing cluster cannot be built here (beyond the network's needs), or None."""
    missing = [what for what, path in (("an OpenSSH server (sshd)", SSHD),
                                       ("the ssh client", shutil.which("ssh")),
                                       ("ssh-keygen", shutil.which("ssh-keygen")),
                                       ("unshare (util-linux)", shutil.which("unshare")))
               if not path or not os.access(path, os.X_OK)]
    if missing:
        return (f"a standing cluster needs {' and '.join(missing)}: install openssh-server "
                f"(`make cluster-deps` does, on Debian as root)")
    return None


def slurm_unavailable_reason() -> str | None:
    """Why ``--slurm`` cannot run here, or None."""
    missing = [path for path in [*SLURM_DAEMONS.values(), shutil.which("srun") or "srun",
                                 shutil.which("nsenter") or "nsenter"]
               if not os.access(path, os.X_OK)]
    if missing:
        return (f"--slurm needs Slurm and MUNGE ({', '.join(missing)} missing): install "
                f"slurmd, slurmctld, slurm-client and munge (`make cluster-deps` does, on "
                f"Debian as root)")
    return None


def require_all(slurm: bool = False) -> None:
    require()
    reason = unavailable_reason() or (slurm_unavailable_reason() if slurm else None)
    if reason:
        raise NetemError(reason)


def load(name: str) -> dict:
    """The description of standing cluster ``name`` (``cluster.json``); a one-line error when
    there is none."""
    path = os.path.join(directory(check_name(name)), "cluster.json")
    try:
        with open(path) as f:
            return json.load(f)
    except FileNotFoundError:
        raise UsageError(f"no standing cluster named {name!r} (python -m ddlbench.netem "
                         f"cluster up --name {name} ...)") from None
    except (OSError, ValueError) as e:
        raise UsageError(f"cluster {name!r}: unreadable {path}: {e}") from None
    except RecursionError:
        raise UsageError(f"cluster {name!r}: unreadable {path}: nested too deeply") from None


def up(name: str, nhosts: int, net: str, slots: int = 1, slurm: bool = False,
       log=None) -> dict:
    """Build standing cluster ``name`` (with ``slurm``, also a Slurm cluster of its hosts);
    returns its description (``cluster.json``)."""
    check_name(name)
    if not 1 <= nhosts <= MAX_STANDING_HOSTS:
        raise UsageError(f"a standing cluster has 1 to {MAX_STANDING_HOSTS} hosts, got {nhosts}")
    if not 1 <= slots <= 4096:
        raise UsageError(f"--slots must be 1 to 4096, got {slots}")
    profile = resolve(net)
    if profile.loopback:
        raise UsageError("a standing cluster needs an emulated network (--net 1gbit, "
                         "rate=R, ...), not loopback")
    with _building(name):
        require_all(slurm)
        return _up(name, nhosts, profile, slots, slurm, log)


@contextlib.contextmanager
def _building(name: str):
    """This process's hold on building cluster ``name`` (an exclusive ``flock`` of
    ``clusters/.NAME.lock``, which ends with the process however it ends; the file is removed
    as the hold ends): a second ``cluster up --name NAME`` at the same moment gets one line
    instead of a race for the same namespaces."""
    folder = os.path.join(state_dir(), "clusters")
    os.makedirs(folder, exist_ok=True)
    path = os.path.join(folder, f".{name}.lock")
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    held = False
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            # (a file its holder removed as it let go is no hold: the path names another now)
            held = os.path.exists(path) and os.path.samestat(os.fstat(fd), os.stat(path))
        except (BlockingIOError, FileNotFoundError):
            pass
        if not held:
            raise UsageError(f"cluster {name!r} is being built by another `cluster up --name "
                             f"{name}` at this moment; wait for it (cluster status --name "
                             f"{name})")
        yield
    finally:
        if held:
            with contextlib.suppress(OSError):
                os.unlink(path)
        os.close(fd)


def _up(name: str, nhosts: int, profile, slots: int, slurm: bool, log) -> dict:
    """``up``, its arguments checked, with the hold on the name."""
    where = directory(name)
    if os.path.exists(os.path.join(where, "cluster.json")):
        raise UsageError(f"cluster {name!r} is up already (python -m ddlbench.netem cluster "
                         f"down --name {name} first)")
    cleanup_stale(log=log)   # (an up of this name killed outright included)
    for _, state in _read_states():
        if state.get("cluster") == name:
            raise UsageError(f"cluster {name!r} is being built by process "
                             f"{state.get('owner_pid')}")
    shutil.rmtree(where, ignore_errors=True)
    os.makedirs(where)
    cluster = Cluster(nhosts, profile, host_prefix=name, ifname=IFNAME)
    described = {}
    try:
        cluster.up(log=log, state={"cluster": name, "directory": where},
                   then=lambda c: described.update(_serve(c, name, where, slots, slurm)))
    except BaseException:
        shutil.rmtree(where, ignore_errors=True)
        raise
    make_standing(cluster.run_id)
    return described


def down(name: str) -> dict:
    """Remove standing cluster ``name`` (what runs on its hosts included); returns what it
    was."""
    described = load(name)
    cluster = Cluster(len(described["hosts"]), resolve(described["net"]),
                      run_id=described["run_id"], host_prefix=name, ifname=IFNAME)
    cluster.down()
    shutil.rmtree(directory(name), ignore_errors=True)
    return described


def status(name: str) -> list[dict]:
    """Each host of cluster ``name``: its description and whether its sshd runs."""
    described = load(name)
    out = []
    for h in described["hosts"]:
        pids = namespace_pids(h["namespace"])
        running = {_program(p) for p in pids}
        out.append(dict(h, up=bool(pids), sshd=SSHD in running,
                        daemons=sorted(n for n, path in SLURM_DAEMONS.items()
                                       if os.path.realpath(path) in running)))
    return out


def standing_clusters() -> list[str]:
    try:
        return sorted(n for n in os.listdir(os.path.join(state_dir(), "clusters"))
                      if os.path.exists(os.path.join(directory(n), "cluster.json")))
    except OSError:
        return []


def exec_argv(name: str, host: int, command: list[str]) -> tuple[list[str], dict]:
    """(argv, environment) that run ``command`` on host ``host`` of cluster ``name``: in its
    network namespace with its /etc files and its host name. Leading ``VAR=VALUE`` words of
    ``command`` are set in its environment (as a shell does)."""
    described = load(name)
    require()
    hosts = described["hosts"]
    if not 0 <= host < len(hosts):
        raise UsageError(f"cluster {name!r} has hosts 0 to {len(hosts) - 1}, got --host {host}")
    env = dict(os.environ, **described["environment"])
    while command and _VAR.match(command[0]):
        key, _, value = command.pop(0).partition("=")
        env[key] = value
    if not command:
        raise UsageError("cluster exec needs a command (after --)")
    h = hosts[host]
    return on_host(h["namespace"], h["name"], command), env


def on_host(namespace: str, hostname: str, command: list[str]) -> list[str]:
    """The argv running ``command`` in ``namespace`` under host name ``hostname``."""
    return ["ip", "netns", "exec", namespace, "unshare", "--uts", "sh", "-c",
            'hostname "$0" && exec "$@"', hostname, *command]


# ------------------------------------------------------------------------------------ set-up

def _serve(cluster: Cluster, name: str, where: str, slots: int, slurm: bool) -> dict:
    """Keys, configuration, host file and one sshd per host; waits until every sshd answers
    from host 0; with ``slurm`` then MUNGE and Slurm (``_slurm``). Returns the description
    written to ``cluster.json``."""
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    venv_bin = os.path.dirname(sys.executable)
    path = f"{venv_bin}:/usr/local/bin:/usr/bin:/bin:/usr/local/sbin:/usr/sbin:/sbin"
    for key in ("host_key", "client_key"):
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C",
                        f"ddlbench cluster {name}", "-f", os.path.join(where, key)],
                       check=True, capture_output=True)
    shutil.copy(os.path.join(where, "client_key.pub"), os.path.join(where, "authorized_keys"))
    with open(os.path.join(where, "host_key.pub")) as f:
        host_key = " ".join(f.read().split()[:2])
    names = [h.name for h in cluster.hosts] + [h.address for h in cluster.hosts]
    _write(where, "known_hosts", f"{','.join(names)} {host_key}\n")
    _write(where, "sshd_config", "\n".join([
        f"# the OpenSSH servers of ddlbench cluster {name} (one per host, port 22)",
        "Port 22", f"HostKey {where}/host_key", f"AuthorizedKeysFile {where}/authorized_keys",
        "PidFile none", "PermitRootLogin prohibit-password", "PasswordAuthentication no",
        "KbdInteractiveAuthentication no", "UsePAM no", "StrictModes no", "PrintMotd no",
        "PrintLastLog no", "MaxStartups 200", "MaxSessions 200", f"AcceptEnv {ACCEPTED}",
        f"SetEnv PATH={path}", "Subsystem sftp internal-sftp", "LogLevel ERROR", ""]))
    client = "\n".join([
        f"# ssh within ddlbench cluster {name}", "Host *",
        f"  IdentityFile {where}/client_key", f"  UserKnownHostsFile {where}/known_hosts",
        "  StrictHostKeyChecking yes", "  BatchMode yes", "  LogLevel ERROR",
        "  ConnectTimeout 20", f"  SendEnv {ACCEPTED}", ""])
    for h in cluster.hosts:
        etc_ssh = os.path.join(ETC_NETNS, h.namespace, "ssh")
        os.makedirs(etc_ssh, exist_ok=True)
        _write(etc_ssh, "ssh_config", client)
    _write(where, "hostfile", f"# ddlbench cluster {name}: {len(cluster.hosts)} hosts, "
           f"{cluster.profile.name}\n" + "".join(f"{h.name} slots={slots}\n"
                                                 for h in cluster.hosts))
    subnet = cluster.hosts[0].address.rsplit(".", 1)[0] + ".0/24"
    environment = {"DDLBENCH_CLUSTER": name,
                   "DDLBENCH_CLUSTER_CONF": os.path.join(where, "cluster.conf")}
    _write(where, "cluster.conf", "\n".join([
        f"# configs/cluster.conf entries for ddlbench cluster {name} (the launchers read this",
        "# file when DDLBENCH_CLUSTER_CONF names it; `cluster exec` sets it). Hosts share this",
        "# machine's files, so the paths are the same on every host.",
        f'PY="${{PY:-{sys.executable}}}"', f'MPIRUN="${{MPIRUN:-{venv_bin}/mpirun}}"',
        f'MPI_HOME="${{MPI_HOME:-{os.path.dirname(venv_bin)}}}"',
        f'ETH_INTERFACE="${{ETH_INTERFACE:-{IFNAME}}}"', f'ETH_SUBNET="${{ETH_SUBNET:-{subnet}}}"',
        'SSH="${SSH:-ssh}"', ""]))
    os.makedirs("/run/sshd", mode=0o755, exist_ok=True)   # sshd's privilege-separation dir
    for h in cluster.hosts:
        with open(os.path.join(where, f"sshd-{h.name}.log"), "ab") as logf:
            subprocess.Popen(on_host(h.namespace, h.name, [SSHD, "-D", "-e", "-f",
                                                         os.path.join(where, "sshd_config")]),
                             stdin=subprocess.DEVNULL, stdout=logf, stderr=subprocess.STDOUT,
                             cwd="/", start_new_session=True)
    _wait_for_sshd(cluster, where)
    if slurm:
        environment["SLURM_CONF"] = _slurm(cluster, name, where, slots)
    described = {
        "name": name, "run_id": cluster.run_id, "net": cluster.profile.name,
        "rate_bps": cluster.profile.rate_bps, "slots": slots, "directory": where,
        "hostfile": os.path.join(where, "hostfile"), "subnet": subnet, "ifname": IFNAME,
        "repository": root, "created": time.time(), "environment": environment,
        "slurm": slurm,
        "hosts": [{"name": h.name, "address": h.address, "namespace": h.namespace,
                   "ifname": h.ifname} for h in cluster.hosts]}
    _write(where, "cluster.json", json.dumps(described, indent=2) + "\n")
    return described


def _wait_for_sshd(cluster: Cluster, where: str, timeout_s: float = 60.0) -> None:
    """Every host answers ``ssh HOST true`` from host 0, or the set-up fails with the host and
    its server's log."""
    first = cluster.hosts[0]
    deadline = time.monotonic() + timeout_s
    pending = list(cluster.hosts)
    while pending:
        h = pending[0]
        proc = subprocess.run(on_host(first.namespace, first.name,
                                      ["ssh", "-o", "ConnectTimeout=5", h.name, "true"]),
                              capture_output=True, text=True)
        if proc.returncode == 0:
            pending.pop(0)
            continue
        if time.monotonic() > deadline:
            tail = _last_line(os.path.join(where, f"sshd-{h.name}.log"))
            raise NetemError(f"cluster: the ssh server of {h.name} did not answer in "
                             f"{timeout_s:.0f} s: {(proc.stderr.strip().splitlines() or [''])[-1]}"
                             f"{'; its log: ' + tail if tail else ''}")
        time.sleep(0.2)


# --------------------------------------------------------------------------------- Slurm

def _slurm(cluster: Cluster, name: str, where: str, slots: int) -> str:
    """MUNGE and Slurm for the hosts: one ``munged`` (its socket a file, which every network
    namespace reaches), ``slurmctld`` on host 0, ``slurmd`` on every host, node NAMEi with
    ``slots`` CPUs at its address; ``proctrack/linuxproc`` and ``task/none`` (no cgroups to
    set up, none left behind). Returns the path of ``slurm.conf`` once every node is idle."""
    state = os.path.join(where, "slurm")
    os.makedirs(os.path.join(state, "ctld"))
    os.makedirs(os.path.join(where, "munge"), mode=0o755)
    key = os.path.join(where, "munge.key")
    with open(os.open(key, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600), "wb") as f:
        f.write(os.urandom(1024))
    socket_path = os.path.join(where, "munge", "munge.socket")
    first = cluster.hosts[0]
    conf = os.path.join(where, "slurm.conf")
    _write(where, "slurm.conf", "\n".join([
        f"# Slurm for ddlbench cluster {name}: python -m ddlbench.netem cluster up --slurm",
        f"ClusterName=ddlbench-{name}", f"SlurmctldHost={first.name}({first.address})",
        "SlurmUser=root", "SlurmdUser=root", "AuthType=auth/munge", "CredType=cred/munge",
        f"AuthInfo=socket={socket_path}", "ProctrackType=proctrack/linuxproc",
        "TaskPlugin=task/none", "JobAcctGatherType=jobacct_gather/none",
        "AccountingStorageType=accounting_storage/none", "SelectType=select/cons_tres",
        "SelectTypeParameters=CR_CPU", "MpiDefault=none", "ReturnToService=2",
        "SlurmdParameters=config_overrides", "MailProg=/bin/true",
        f"StateSaveLocation={state}/ctld", f"SlurmdSpoolDir={state}/spool-%n",
        f"SlurmctldPidFile={state}/slurmctld.pid", f"SlurmdPidFile={state}/slurmd-%n.pid",
        f"SlurmctldLogFile={state}/slurmctld.log", f"SlurmdLogFile={state}/slurmd-%n.log",
        *[f"NodeName={h.name} NodeAddr={h.address} CPUs={slots} State=UNKNOWN"
          for h in cluster.hosts],
        "PartitionName=main Nodes=ALL Default=YES MaxTime=INFINITE State=UP", ""]))
    _daemon(first, "munged", [SLURM_DAEMONS["munged"], "-F", "-f", f"--key-file={key}",
                              f"--socket={socket_path}",
                              f"--pid-file={where}/munge/munged.pid",
                              f"--log-file={where}/munge/munged.log",
                              f"--seed-file={where}/munge/munged.seed"], where)
    _wait(lambda: os.path.exists(socket_path), 30, "MUNGE's socket", f"{where}/munge/munged.log")
    _daemon(first, "slurmctld", [SLURM_DAEMONS["slurmctld"], "-D", "-i", "-f", conf], where)
    for h in cluster.hosts:
        _daemon(h, f"slurmd-{h.name}", [SLURM_DAEMONS["slurmd"], "-D", "-N", h.name, "-f",
                                        conf], where)
    sinfo = on_host(first.namespace, first.name, ["sinfo", "-h", "-N", "-o", "%N %T"])
    env = dict(os.environ, SLURM_CONF=conf)

    def idle() -> bool:
        out = subprocess.run(sinfo, env=env, capture_output=True, text=True).stdout.split()
        return out[1::2] == ["idle"] * len(cluster.hosts)
    _wait(idle, 60, "every Slurm node idle", f"{state}/slurmctld.log")
    return conf


def _daemon(host, log_name: str, command: list[str], where: str) -> None:
    """``command`` on ``host`` for good: in its network namespace (``nsenter``, so the
    machine's /sys, where Slurm looks for cgroups, stays in view) with its /etc files and
    host name in a mount and UTS namespace of its own; output in ``where/log_name.log``."""
    etc = os.path.join(ETC_NETNS, host.namespace)
    binds = " && ".join(f"mount --bind {etc}/{entry} /etc/{entry}"
                        for entry in sorted(os.listdir(etc)))
    with open(os.path.join(where, f"{log_name}.log"), "ab") as logf:
        subprocess.Popen(["nsenter", f"--net=/run/netns/{host.namespace}", "unshare", "--uts",
                          "--mount", "sh", "-c", f'{binds} && hostname "$0" && exec "$@"',
                          host.name, *command], stdin=subprocess.DEVNULL, stdout=logf,
                         stderr=subprocess.STDOUT, cwd="/", start_new_session=True)


def _wait(ready, timeout_s: float, what: str, log: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not ready():
        if time.monotonic() > deadline:
            tail = _last_line(log)
            raise NetemError(f"cluster: no {what} after {timeout_s:.0f} s"
                             f"{'; ' + log + ': ' + tail if tail else ''}")
        time.sleep(0.2)


def _last_line(path: str) -> str:
    """The last line of a daemon's log ("" when there is none), for an error line."""
    try:
        with open(path) as f:
            return (f.read().strip().splitlines() or [""])[-1]
    except OSError:
        return ""


def _program(pid: int) -> str | None:
    try:
        return os.readlink(f"/proc/{pid}/exe")   # (sshd rewrites its command line)
    except OSError:
        return None


def _write(where: str, name: str, text: str) -> None:
    with open(os.path.join(where, name), "w") as f:
        f.write(text)

"""``python -m ddlbench.netem``: the command line (probe, cleanup, profiles, status, helpers)."""
from __future__ import annotations

import argparse
import json
import os
import sys

from ..errors import EXIT_USAGE, ArgumentParser, UsageError, check_writable, open_to_write
from . import helper
from .cluster import Cluster
from .links import require
from .probe import PROBE_TOLERANCE, probe_allreduce, probe_best, probe_line
from .profiles import load_profiles, resolve
from .state import _owner_alive, _read_states, cleanup_stale, reap
from .units import format_rate, parse_size


def parse_args(argv):
    p = ArgumentParser(prog="python -m ddlbench.netem",
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
    rp = sub.add_parser("reap", help=argparse.SUPPRESS)  # started by a cluster (state.py)
    rp.add_argument("run_id")
    rp.add_argument("--owner", type=int, required=True)
    _cluster_parsers(sub)
    sub.add_parser("profiles", help="list the network profiles")
    sub.add_parser("status", help="list the emulated networks that exist now")
    helper.add_parsers(sub)
    return p.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    if args.command in helper.COMMANDS:
        return helper.COMMANDS[args.command](args)
    if args.command == "reap":
        reap(args.run_id, args.owner)
        return 0
    try:
        if args.command == "cluster":
            return _cmd_cluster(args)
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
                if s.get("standing"):   # no owner once up; cleanup leaves it alone
                    who = (f"standing cluster {s.get('cluster')} (cluster down --name "
                           f"{s.get('cluster')} removes it)")
                else:
                    who = (f"owner {s.get('owner_pid')} "
                           f"{'alive' if _owner_alive(s) else 'gone (stale)'}")
                print(f"run {s.get('run_id')}: profile {s.get('profile')}, {who}, "
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


def _cluster_parsers(sub) -> None:
    cl = sub.add_parser("cluster", help="a standing cluster: hosts with sshd that stay up "
                                        "(up, status, exec, down)")
    verbs = cl.add_subparsers(dest="verb", required=True, metavar="VERB")
    name = dict(default=os.environ.get("DDLBENCH_CLUSTER") or "node",
                help="the cluster's name, also its hosts' (NAME0, NAME1, ...; default node)")
    up = verbs.add_parser("up", help="build N hosts, each with its own sshd; print where the "
                                     "host file is")
    up.add_argument("--hosts", type=int, required=True, help="emulated hosts")
    up.add_argument("--net", default="1gbit", help="network profile (default 1gbit)")
    up.add_argument("--slots", type=int, default=1, help="slots per host in the host file")
    up.add_argument("--slurm", action="store_true",
                    help="also Slurm: slurmctld on host 0, slurmd on every host (MUNGE)")
    up.add_argument("--name", **name)
    st = verbs.add_parser("status", help="the standing clusters, or one, host by host")
    st.add_argument("--name", default=None)
    ex = verbs.add_parser("exec", help="run a command on a host (default host 0, the launch "
                                       "node): exec -- [VAR=VALUE ...] CMD ...")
    ex.add_argument("--name", **name)
    ex.add_argument("--host", type=int, default=0)
    ex.add_argument("argv", nargs=argparse.REMAINDER, metavar="COMMAND")
    dn = verbs.add_parser("down", help="remove the cluster and what runs on it")
    dn.add_argument("--name", **name)


def _cmd_cluster(args) -> int:
    from . import standing
    if args.verb == "up":
        d = standing.up(args.name, args.hosts, args.net, args.slots, args.slurm,
                        log=lambda line: print(f"netem: {line}", file=sys.stderr))
        print(f"cluster {d['name']}: {len(d['hosts'])} hosts ({d['hosts'][0]['name']} ... "
              f"{d['hosts'][-1]['name']}, {d['subnet']}, {d['net']}), sshd on each\n"
              f"  host file:    {d['hostfile']}\n"
              f"  cluster.conf: {d['environment']['DDLBENCH_CLUSTER_CONF']}\n"
              f"  run on it:    python -m ddlbench.netem cluster exec --name {d['name']} -- "
              f"hostfile={d['hostfile']} nworkers={len(d['hosts'])} "
              f"./horovod/horovod_mpi_cj.sh\n"
              + (f"  Slurm:        SLURM_CONF={d['environment']['SLURM_CONF']} (exec sets "
                 f"it): srun -N {len(d['hosts'])} ...\n" if d["slurm"] else "")
              + f"  remove it:    python -m ddlbench.netem cluster down --name {d['name']}",
              flush=True)
        return 0
    if args.verb == "down":
        d = standing.down(args.name)
        print(f"cluster {d['name']}: removed ({len(d['hosts'])} hosts)", flush=True)
        return 0
    if args.verb == "status":
        names = [args.name] if args.name else standing.standing_clusters()
        if not names:
            print("no standing clusters")
        for n in names:
            d = standing.load(n)
            print(f"cluster {n}: {len(d['hosts'])} hosts, {d['net']}, run {d['run_id']}, "
                  f"host file {d['hostfile']}")
            for h in standing.status(n):
                state = "sshd up" if h["sshd"] else ("no sshd" if h["up"] else "gone")
                print(f"  {h['name']:12s} {h['address']:16s} {h['namespace']}  {state}"
                      + "".join(f", {d} up" for d in h["daemons"]))
        return 0
    command = list(args.argv)
    if command and command[0] == "--":
        command = command[1:]
    argv, env = standing.exec_argv(args.name, args.host, command)
    os.execvpe(argv[0], argv, env)


def _cmd_probe(args) -> int:
    profile = resolve(args.net)
    if args.hosts < 2:
        raise UsageError(f"--hosts must be at least 2 to measure a link, got {args.hosts}")
    if args.iters <= 0 or args.seconds < 0:
        raise UsageError("--iters must be positive and --seconds >= 0")
    nbytes = parse_size(args.bytes, "--bytes")
    if nbytes < 4:
        raise UsageError("--bytes must be at least 4 (one fp32)")
    if args.json:
        check_writable(args.json, "--json")
    nbytes -= nbytes % 4
    if not profile.loopback:
        require()
    results = {}
    with Cluster(args.hosts, profile) as cluster:
        print(f"netem: {cluster.summary()}" if not profile.loopback
              else f"netem: {args.hosts} processes on this machine's loopback (no emulation)",
              flush=True)
        if args.seconds > 0:
            cluster.probe = probe_best(cluster, args.seconds)
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
        with open_to_write(args.json) as f:
            json.dump(results, f, indent=2, sort_keys=True)
            f.write("\n")
    return 0

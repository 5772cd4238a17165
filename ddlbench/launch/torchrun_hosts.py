"""torchrun on every host of a host file, one node each, over ssh: a multi-node job by hand.

``python -m ddlbench.launch.torchrun_hosts --hostfile F --nworkers N [--job-id ID] -- ARGS``
(``torchrun/torchrun_launch.sh`` calls it) takes the first hosts of F whose slots hold N
workers (every host the same number of slots, S; N a multiple of S) and runs on host i, over
``$SSH`` (or directly on this host)::

    torchrun --nnodes M --nproc-per-node S --node-rank i --rdzv-backend static \\
        --rdzv-endpoint HOST0:PORT -m ddlbench.train ARGS --job-id ID

which is what a user types on each node of a cluster: ranks i*S ... i*S+S-1 on host i, the
rendezvous (torch's TCP store) on the first host at a port its kernel reports free. The
suite's, Gloo's and NCCL's variables travel to every host (ssh forwards none); a failing
process, Ctrl-C or this launcher's death stops every host's processes (as the PS launcher's:
``pslaunch.py``), and ``--stop --job-id ID`` stops a job left behind.
"""
from __future__ import annotations

import os
import sys
import uuid

from ..errors import EXIT_USAGE, UsageError
from ..hosts import hostfile
from .pslaunch import _free_port, host_file_parser, is_local, parse, prepare
from .pslaunch import run as run_roles


def parse_args(argv):
    return parse(host_file_parser("python -m ddlbench.launch.torchrun_hosts"), argv)


def nodes(hosts: list[hostfile.Host], nworkers: int) -> tuple[list[str], int]:
    """(the hosts that run a node, processes per node) for ``nworkers`` workers."""
    slots = hosts[0].slots
    if any(h.slots != slots for h in hosts):
        raise UsageError("torchrun runs the same number of processes on every node: give "
                         "every host of the host file the same slots")
    if nworkers % slots:
        raise UsageError(f"{nworkers} workers do not fill whole nodes of {slots} slots")
    if nworkers > slots * len(hosts):
        raise UsageError(f"{nworkers} workers asked for, but the host file holds "
                         f"{slots * len(hosts)} slots")
    return [h.name for h in hosts[:nworkers // slots]], slots


def commands(names: list[str], slots: int, port: int, train_args: list[str],
             job: str) -> list[tuple[str, list[str]]]:
    """(host, argv after the interpreter) of each node's torchrun."""
    endpoint = f"{'127.0.0.1' if names[0] in hostfile.LOCAL_NAMES else names[0]}:{port}"
    return [(name, ["-m", "torch.distributed.run", "--nnodes", str(len(names)),
                    "--nproc-per-node", str(slots), "--node-rank", str(i),
                    "--rdzv-backend", "static", "--rdzv-endpoint", endpoint,
                    "-m", "ddlbench.train", *train_args, "--job-id", job])
            for i, name in enumerate(names)]


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        args = parse_args(argv)
        hosts, stopped = prepare(args)
        if stopped is not None:
            return stopped
        names, slots = nodes(hosts, args.nworkers)
        hostfile.require_reachable(names)
        py = sys.executable
        root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
        job = args.job_id or uuid.uuid4().hex[:12]
        print(f"job ID: {job} (python -m ddlbench.launch.torchrun_hosts --hostfile "
              f"{args.hostfile} --stop --job-id {job} stops it)", file=sys.stderr, flush=True)
        port = _free_port(names[0], py)
        node_cmds = commands(names, slots, port, args.train_args, job)
        for name, cmd in node_cmds:
            where = "here" if is_local(name) else f"on {name}"
            print(f"+ {where}: torchrun {' '.join(cmd[2:])}", file=sys.stderr, flush=True)
        # torchrun's workers inherit its stdin: on a remote host they watch it (the launcher's
        # ssh connection) as the PS launcher's processes do; here torchrun dies with us.
        return run_roles([(name, {}) for name, _ in node_cmds], {}, py, root, None, job,
                         args.grace, argvs=[cmd for _, cmd in node_cmds],
                         names=[f"node {i} ({name})" for i, (name, _) in
                                enumerate(node_cmds)])
    except UsageError as e:
        print(f"ddlbench: error: {e}", file=sys.stderr, flush=True)
        return EXIT_USAGE


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env bash
# Stop the suite's parameter-server jobs (workers and servers), as the original's stop script
# did after a parameter-server run (its benchmarks.py runs `cd byteps;./stop.sh` after each):
#
#   ./byteps/stop.sh                               # every PS job of yours from this checkout
#   hostfile=configs/cluster4 ./byteps/stop.sh     # ... on the hosts of that host file
#   job=ID ./byteps/stop.sh                        # only job ID (the launcher prints it)
#
# Without job=: the PS jobs this user started from this checkout (python -m
# ddlbench.launch.psstop says how it tells them apart) on the hosts of the host file:
# hostfile=, else configs/cluster$nworkers (nworkers default 8) where that file exists and
# lists real hosts, else this machine only (a line says so). Another user's jobs, another
# checkout's jobs and all-reduce jobs are left alone.
# With job=ID: only the processes of job ID, on the hosts of that host file (it must exist;
# with hostfile= unset and the default absent or an example: on this machine only).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
source "$root/ddlbench/launch/common.sh"
defaults nworkers=8
if [ -n "${job:-}" ]; then
    default="$root/configs/cluster$nworkers"
    if [ -z "${hostfile:-}" ] && { [ ! -f "$default" ] || grep -qF '# ddlbench: example hosts' "$default"; }; then
        # no host file of a cluster here: the job is this machine's (a launch on a stock
        # checkout names its own host file)
        hostfile="$(mktemp "${TMPDIR:-/tmp}/ddlbench-stop.XXXXXX")"
        trap 'rm -f "$hostfile"' EXIT
        echo "localhost slots=1" > "$hostfile"
        echo "$LAUNCHER_NAME: no host file (hostfile= unset, $default absent or an example): job $job on this machine only" >&2
        stop=("$PY" -m ddlbench.launch.pslaunch --hostfile "$hostfile" --stop --job-id "$job")
        [ "${dry_run:-0}" = 0 ] || launch_exec --quiet "${stop[@]}"
        rc=0; (cd "$root" && "${stop[@]}") || rc=$?
        exit "$rc"
    fi
    defaults "hostfile=$default"
    launch_exec --quiet "$PY" -m ddlbench.launch.pslaunch --hostfile "$hostfile" --stop --job-id "$job"
fi
hosts=()
if [ -n "${hostfile:-}" ]; then
    hosts=(--hostfile "$hostfile")
else
    default="$root/configs/cluster$nworkers"
    if [ -f "$default" ] && ! grep -qF '# ddlbench: example hosts' "$default"; then
        hosts=(--hostfile "$default")
    else
        echo "$LAUNCHER_NAME: no host file (hostfile= unset, $default absent or an example): this machine only" >&2
    fi
fi
# a PS job on one machine runs no server (as BytePS): its --method says PS
ps_methods="$(cd "$root" && "$PY" -m ddlbench.methods names --architecture ps)" || exit 2
launch_exec --quiet "$PY" -m ddlbench.launch.psstop "${hosts[@]}" --ps-methods "$ps_methods"

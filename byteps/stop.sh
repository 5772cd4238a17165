#!/usr/bin/env bash
# Stop the suite's training processes (workers and servers) on every host of a host file, as
# the original's stop script did after a parameter-server run:
#
#   job=ID ./byteps/stop.sh                        # hosts of configs/cluster$nworkers (8)
#   hostfile=configs/cluster4 job=ID ./byteps/stop.sh
#
# Only the processes of job ID (the launcher prints it; byteps_launch.sh takes job=ID) are
# stopped: other jobs, other users' runs and a test suite beside it are left alone.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
source "$root/ddlbench/launch/common.sh"
[ -n "${job:-}" ] || die "job= is required: the id the launcher printed (job ID: ...); stop.sh stops only that job's processes"
defaults nworkers=8
defaults "hostfile=$root/configs/cluster$nworkers"
launch_exec --quiet "$PY" -m ddlbench.launch.pslaunch --hostfile "$hostfile" --stop --job-id "$job"

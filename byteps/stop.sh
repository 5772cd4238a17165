#!/usr/bin/env bash
# Stop the suite's training processes (workers and servers) on every host of a host file, as
# the original's stop script did after a parameter-server run:
#
#   ./byteps/stop.sh                       # hosts of configs/cluster$nworkers (default 8)
#   hostfile=configs/cluster4 job=ID ./byteps/stop.sh   # only the processes of job ID
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
source "$root/ddlbench/launch/common.sh"
nworkers="${nworkers:-8}"
hostfile="${hostfile:-$root/configs/cluster$nworkers}"
cmd=("$PY" -m ddlbench.launch.pslaunch --hostfile "$hostfile" --stop)
[ -n "${job:-}" ] && cmd+=(--job-id "$job")
cd "$root"
exec "${cmd[@]}"

#!/usr/bin/env bash
# The original suite's BytePS launcher name and variables; it runs through byteps_launch.sh:
#
#   debug=0 rdma=0 dnn=resnet50 bs=64 nworkers=8 threshold=0 bytescheduler=0 ./byteps/launch.sh
#
# As the original:
# - debug=1 is the default and prints the command without running it (the first line says
#   so); debug=0 runs it;
# - nservers=0 (default) means nworkers/4 servers (at least 1), and workers on one machine
#   (nworkers=4: one host of configs/cluster4) run none, as BytePS with DMLC_NUM_WORKER=1 did (a
#   local reduce and broadcast; ps_force_servers=1, or BytePS's BYTEPS_FORCE_DISTRIBUTED=1,
#   starts them anyway);
# - bytescheduler=1 is the original's ByteScheduler-PS: the WFBP-PS workers with the servers'
#   priority scheduling (BYTEPS_SERVER_ENABLE_SCHEDULE=1), method byteschedulerps;
# - threshold counts ELEMENTS (the original's optimizer summed numel against it): 536870912,
#   its BSP-PS setting, is 2 GiB of fp32; byteps_launch.sh, the suite's own, counts bytes.
# Every other variable (rdma, bytescheduler, hostfile, image_size, iters, extra_args, job,
# optimizer (default: the original's SGD 0.01), cudnn_benchmark (default 1), ...)
# is byteps_launch.sh's.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
source "$root/ddlbench/launch/common.sh"

defaults debug=1 nworkers=8 nservers=0 threshold=0
case "$debug" in 0|1) ;; *) die "debug must be 0 or 1, got '$debug'" ;; esac
positive nworkers "$nworkers"
[[ "$nservers" =~ ^[0-9]{1,9}$ ]] || die "nservers must be a number >= 0, got '$nservers'"
elements "$threshold"
if [ "$nservers" = 0 ]; then nservers=$(( nworkers / 4 > 0 ? nworkers / 4 : 1 )); fi
if [ "$debug" = 1 ]; then
    echo "$LAUNCHER_NAME: debug=1 (the original's default): printing the command, running nothing; debug=0 runs it" >&2
fi
export nworkers nservers dry_run="$debug" threshold="$(element_bytes "$threshold")"
exec "$root/byteps/byteps_launch.sh"

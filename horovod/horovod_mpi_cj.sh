#!/usr/bin/env bash
# All-to-all methods through mpirun, driven by environment variables as in the original suite:
#
#   dnn=resnet50 bs=64 nworkers=8 senlen=64 rdma=0 method=fusion threshold=67108864 \
#   compressor=none density=0.001 ./horovod/horovod_mpi_cj.sh
#
# runs `python -m ddlbench.train` on the hosts of configs/cluster$nworkers (override with
# hostfile=...). rdma: 0 = 10GbE TCP, 1 = 100Gb InfiniBand with RDMA, 2 = TCP over the 100Gb
# fabric; interfaces come from configs/cluster.conf. For small runs: image_size (CNN pixels),
# iters (timing rounds), extra_args (passed through to the training script as they are).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
source "$root/ddlbench/launch_common.sh"

dnn="${dnn:-resnet50}"
bs="${bs:-64}"
nworkers="${nworkers:-8}"
senlen="${senlen:-64}"
rdma="${rdma:-0}"
method="${method:-fusion}"
threshold="${threshold:-67108864}"
compressor="${compressor:-none}"
density="${density:-0.001}"
image_size="${image_size:-}"
iters="${iters:-10}"
extra_args="${extra_args:-}"
hostfile="${hostfile:-$root/configs/cluster$nworkers}"

positive nworkers "$nworkers"
positive bs "$bs"
positive iters "$iters"
master_addr="$(check_hostfile "$hostfile" "$nworkers")"
mpi_options "$rdma"

args=(--model "$dnn" --batch-size "$bs" --sentence-len "$senlen" --method "$method"
      --threshold "$threshold" --compressor "$compressor" --density "$density"
      --num-iters "$iters")
[ -n "$image_size" ] && args+=(--image-size "$image_size")
# shellcheck disable=SC2206 # extra_args is meant to split into words
[ -n "$extra_args" ] && args+=($extra_args)

cmd=("$MPIRUN" -np "$nworkers" -hostfile "$hostfile" -wdir "$root" "${MPI_OPTS[@]}"
     -x "MASTER_ADDR=$master_addr" "$PY" -m ddlbench.train "${args[@]}")
echo "+ ${cmd[*]}" >&2
exec "${cmd[@]}"

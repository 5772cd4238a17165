#!/usr/bin/env bash
# ByteScheduler-A2A through mpirun, driven by environment variables as in the original suite:
#
#   dnn=resnet50 bs=64 nworkers=8 senlen=64 rdma=0 partition=4000000 credit=16000000 \
#   ./bytescheduler/horovod_mpi_cj.sh
#
# The same variables as horovod/horovod_mpi_cj.sh (dnn bs nworkers senlen rdma method threshold
# compressor density image_size iters hostfile extra_args), with method=bytescheduler by
# default, plus the scheduler's two settings in elements: partition (else
# BYTESCHEDULER_PARTITION, else 4000000) and credit (else BYTESCHEDULER_CREDIT, else
# 16000000), the published runs' values (DESIGN.md section 5). net=PROFILE (else DDLBENCH_NET)
# runs it on an emulated cluster on this machine instead, as horovod/horovod_mpi_cj.sh does.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
source "$root/ddlbench/launch_common.sh"

dnn="${dnn:-resnet50}"
bs="${bs:-64}"
nworkers="${nworkers:-8}"
senlen="${senlen:-64}"
rdma="${rdma:-0}"
method="${method:-bytescheduler}"
threshold="${threshold:-67108864}"
compressor="${compressor:-none}"
density="${density:-0.001}"
partition="${partition:-${BYTESCHEDULER_PARTITION:-4000000}}"
credit="${credit:-${BYTESCHEDULER_CREDIT:-16000000}}"
image_size="${image_size:-}"
iters="${iters:-10}"
extra_args="${extra_args:-}"
hostfile="${hostfile:-$root/configs/cluster$nworkers}"
net="${net:-${DDLBENCH_NET:-}}"

positive nworkers "$nworkers"
positive bs "$bs"
positive iters "$iters"
positive partition "$partition"
positive credit "$credit"

args=(--model "$dnn" --batch-size "$bs" --sentence-len "$senlen" --method "$method"
      --threshold "$threshold" --compressor "$compressor" --density "$density"
      --partition "$partition" --credit "$credit" --num-iters "$iters")
[ -n "$image_size" ] && args+=(--image-size "$image_size")
# shellcheck disable=SC2206 # extra_args is meant to split into words
[ -n "$extra_args" ] && args+=($extra_args)

emulated_exec "$net" "$nworkers" "${args[@]}"
master_addr="$(check_hostfile "$hostfile" "$nworkers")"
mpi_options "$rdma"
oversubscription_options "$nworkers" "$master_addr"

cmd=("$MPIRUN" -np "$nworkers" -hostfile "$hostfile" -wdir "$root" "${MPI_OPTS[@]}"
     -x "MASTER_ADDR=$master_addr" "$PY" -m ddlbench.train "${args[@]}")
echo "+ ${cmd[*]}" >&2
exec "${cmd[@]}"

#!/usr/bin/env bash
# ByteScheduler-A2A through mpirun, driven by environment variables as in the original suite:
#
#   dnn=resnet50 bs=64 nworkers=8 senlen=64 rdma=0 partition=4000000 credit=16000000 \
#   ./bytescheduler/horovod_mpi_cj.sh
#
# horovod/horovod_mpi_cj.sh with method=bytescheduler by default: the same variables (dnn bs
# nworkers senlen rdma method threshold compressor density image_size iters hostfile
# extra_args net), plus the scheduler's two settings in elements: partition (else
# BYTESCHEDULER_PARTITION, else 4000000) and credit (else BYTESCHEDULER_CREDIT, else
# 16000000), the published runs' values (DESIGN.md section 5).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
source "$root/ddlbench/launch_common.sh"

partition="${partition:-${BYTESCHEDULER_PARTITION:-4000000}}"
credit="${credit:-${BYTESCHEDULER_CREDIT:-16000000}}"
positive partition "$partition"
positive credit "$credit"

export method="${method:-bytescheduler}"
export extra_args="--partition $partition --credit $credit${extra_args:+ $extra_args}"
exec "$root/horovod/horovod_mpi_cj.sh"

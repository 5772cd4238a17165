#!/usr/bin/env bash
# ByteScheduler-A2A through mpirun, driven by environment variables as in the original suite:
#
#   dnn=resnet50 bs=64 nworkers=8 senlen=64 rdma=0 partition=4000000 credit=16000000 \
#   ./bytescheduler/horovod_mpi_cj.sh
#
# horovod/horovod_mpi_cj.sh with method=bytescheduler by default: the same variables (dnn bs
# nworkers senlen rdma method compressor density image_size iters hostfile extra_args net),
# with the scheduler's two settings in elements: partition (else BYTESCHEDULER_PARTITION) and
# credit (else BYTESCHEDULER_CREDIT), whose defaults are the method's own (the published runs'
# values, docs/DESIGN.md section 5): `python -m ddlbench.methods defaults bytescheduler`.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"

export method="${method:-bytescheduler}"
export NCCL_DEBUG="${NCCL_DEBUG:-INFO}"  # the original's launchers always set it
exec "$root/horovod/horovod_mpi_cj.sh"

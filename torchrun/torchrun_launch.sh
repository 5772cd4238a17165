#!/usr/bin/env bash
# All-to-all methods through torchrun on several hosts, one torchrun per host started over
# ssh, driven by environment variables as the other launchers:
#
#   dnn=resnet50 bs=64 nworkers=8 method=fusion hostfile=configs/cluster8 \
#   ./torchrun/torchrun_launch.sh
#
# On host i of the host file (every host the same slots, S; nworkers a multiple of S) it runs
#   torchrun --nnodes N/S --nproc-per-node S --node-rank i --rdzv-backend static \
#       --rdzv-endpoint HOST0:PORT -m ddlbench.train ...
# as a user would by hand on each node (python -m ddlbench.launch.torchrun_hosts). The method's
# settings, compressor, rdma (the interfaces of configs/cluster.conf), image_size, iters,
# extra_args, timeline and dry_run as for horovod/horovod_mpi_cj.sh; job=ID names the job
# (python -m ddlbench.launch.torchrun_hosts --hostfile F --stop --job-id ID stops it).
# A failing process or Ctrl-C stops every host's processes. For Slurm, srun starts the
# training script directly (README); for one host, torchrun --standalone. The training flags
# are checked (python -m ddlbench.flags) before any torchrun starts.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
source "$root/ddlbench/launch/common.sh"

defaults nworkers=8 rdma=0 method=fusion
defaults "hostfile=$root/configs/cluster$nworkers"
positive nworkers "$nworkers"
job_args "$method"
check_train_args   # a bad flag: one line here, not one per worker and torchrun's traceback

# The network profile's interfaces for Gloo/NCCL (no mpirun here: exported to every process).
mpi_options "$rdma"
for opt in "${MPI_OPTS[@]}"; do
    case "$opt" in *_SOCKET_IFNAME=*|NCCL_*=*|DDLBENCH_NETWORK=*) export "${opt?}" ;; esac
done

launch=("$PY" -m ddlbench.launch.torchrun_hosts --hostfile "$hostfile" --nworkers "$nworkers")
[ -n "${job:-}" ] && launch+=(--job-id "$job")
launch_exec --quiet "${launch[@]}" -- "${ARGS[@]}"

#!/usr/bin/env bash
# Parameter-server methods (BytePS style), driven by environment variables as in the original:
#
#   dnn=resnet50 bs=64 nworkers=8 nservers=2 rdma=0 threshold=536870912 bytescheduler=0 \
#   ./byteps/byteps_launch.sh
#
# Starts nworkers workers and nservers summation servers of `python -m ddlbench.train` on the
# hosts of configs/cluster$nworkers (override with hostfile=...): on localhost through the
# suite's local spawner, elsewhere over $SSH (configs/cluster.conf) with the DMLC_* variables;
# any failure, or Ctrl-C, stops every process of the job (byteps/stop.sh stops leftovers).
#
# method: byteschedulerps when bytescheduler=1 (the original's: WFBP-PS workers, the servers
# scheduling by priority, BYTEPS_SERVER_ENABLE_SCHEDULE=1), else bspps when threshold is at
# least 536870912 bytes (a fused push of everything; the original's BSP-PS setting counted
# 536870912 elements), else wfbpps (threshold 0: each tensor pushed as soon as it is ready);
# method=... overrides (byteschedulerps-worker: the suite's worker-side ByteScheduler).
# nservers: default one per worker machine. Workers on one machine (one host holds them all,
# or every host is this one) run no server, as BytePS (a local reduce and broadcast; a note
# says so) unless ps_force_servers=1 (then, on one machine, one per 4 workers; BytePS's own
# switch for it, BYTEPS_FORCE_DISTRIBUTED=1, sets the default). The method's settings
# are variables named after its options (threshold, partition_bytes, credit), their defaults
# the method's own (`python -m ddlbench.methods defaults bspps`); rdma (0/1/2 as the Horovod
# launcher), image_size, iters, extra_args, dry_run as for horovod/horovod_mpi_cj.sh; job=ID
# names the job for byteps/stop.sh (default: a new id, printed). DMLC_NUM_WORKER,
# DMLC_NUM_SERVER, DMLC_PS_ROOT_URI and DMLC_PS_ROOT_PORT are honoured where they are set
# (DMLC_NUM_WORKER counts worker machines, as for BytePS; nworkers counts processes).
# Servers run on hosts of their own, as the original's: server_hosts=H1,H2 or the host
# file's hosts without workers; servers=colocated puts them on the worker machines (also what
# happens, with a note, when no host is left). ps_clients=machine (default: the workers of a
# machine sum locally and one pushes, as BytePS) or process.
#
# engine=byteps: real BytePS 0.2.5 (the environment `make byteps-env` builds, with the project's
# CPU patch; BYTEPS_PY= names another Python) runs bspps, wfbpps or byteschedulerps: BytePS's
# scheduler and servers are this launcher's processes (nservers: default one per worker
# machine, on one machine too), every worker process is a BytePS worker of its own, and
# BYTEPS_SERVER_ENABLE_SCHEDULE=1 for byteschedulerps, 0 otherwise, as the original. With
# extra_args="--net PROFILE" on this machine the launcher builds an emulated cluster and runs
# every worker, server and the scheduler on hosts of it. The workers' flags (and BytePS's
# import in that Python) are checked before anything starts; BYTEPS_SERVER_SCHEDULE_HEAP is
# patched (the default) or original. As a BytePS user on a small machine,
# the lane sets BYTEPS_SERVER_ENGINE_THREAD=1, BYTEPS_OMP_THREAD_PER_GPU=1, BYTEPS_ZMQ_NTHREADS=1
# and OMP_WAIT_POLICY=PASSIVE (each kept where set; recorded) and pins BytePS's processes as the
# suite's are; DDLBENCH_BYTEPS_FAIR=0 runs the lane as shipped before (none of that).
# As the original's byteps/ scripts: optimizer=original-ps (default) trains every model, CNNs
# and BERT, with SGD at lr 0.01, not scaled by the workers (optimizer=auto: the training
# script's own choice; sgd, adam, adamw), and cudnn_benchmark=1 (default) sets
# cudnn.benchmark = True.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
source "$root/ddlbench/launch/common.sh"

defaults nworkers=8 "nservers=${DMLC_NUM_SERVER:-}" rdma=0 bytescheduler=0 \
    "ps_force_servers=${BYTEPS_FORCE_DISTRIBUTED:-0}"
defaults "hostfile=$root/configs/cluster$nworkers"

positive nworkers "$nworkers"
[ -n "$nservers" ] && positive nservers "$nservers"
case "$bytescheduler" in 0|1) ;; *) die "bytescheduler must be 0 or 1, got '$bytescheduler'" ;; esac
case "$ps_force_servers" in 0|1) ;; *) die "ps_force_servers (BYTEPS_FORCE_DISTRIBUTED) must be 0 or 1, got '$ps_force_servers'" ;; esac
if [ -z "${method:-}" ]; then
    fused=536870912   # bytes: at least this much is the original's BSP-PS (one fused push)
    given="${threshold:-0}"
    [[ "$given" =~ ^[0-9]{1,18}$ ]] || die "threshold must be a number of bytes >= 0, got '$given'"
    if [ "$bytescheduler" = 1 ]; then method=byteschedulerps
    elif [ "$given" -ge "$fused" ]; then method=bspps
    else method=wfbpps; fi
fi
case "${engine:-torch}" in
    torch) unset engine ;;   # (the training script's default: no --engine flag)
    byteps)
        [ "$rdma" = 0 ] || die "engine=byteps runs over TCP (rdma=0): the environment's BytePS is built without RDMA"
        PY="${BYTEPS_PY:-}"
        [ -n "$PY" ] || PY="$("$root/byteps/legacy_env.sh" python)" || exit 2
        # BytePS's servers schedule for byteschedulerps only, as the original's bytescheduler=1
        if [ "$method" = byteschedulerps ]; then schedule=1; else schedule=0; fi
        export BYTEPS_SERVER_ENABLE_SCHEDULE="$schedule" ;;
    *) die "engine must be torch or byteps, got '$engine'" ;;
esac
# The original's PS scripts: SGD at lr 0.01 for every model, cudnn.benchmark = True.
original_optimizer
defaults cudnn_benchmark=1
job_args "$method" --skip nservers --architecture ps
# engine=byteps: the workers' flags and BytePS's import, checked in the lane's Python before
# BytePS's scheduler and servers start (what a worker would refuse, in one line, first)
[ "${engine:-}" = byteps ] && check_train_args

# The network profile's interfaces for Gloo/NCCL (no mpirun here: exported to every process).
mpi_options "$rdma"
for opt in "${MPI_OPTS[@]}"; do
    case "$opt" in *_SOCKET_IFNAME=*|NCCL_*=*|DDLBENCH_NETWORK=*) export "${opt?}" ;; esac
done

launch=("$PY" -m ddlbench.launch.pslaunch --hostfile "$hostfile" --nworkers "$nworkers")
[ -n "$nservers" ] && launch+=(--nservers "$nservers")
[ -n "${job:-}" ] && launch+=(--job-id "$job")
[ -n "${servers:-}" ] && launch+=(--servers "$servers")
[ -n "${server_hosts:-}" ] && launch+=(--server-hosts "$server_hosts")
[ "$ps_force_servers" = 1 ] && launch+=(--ps-force-servers)
[ "${engine:-}" = byteps ] && launch+=(--engine byteps)
launch_exec --quiet "${launch[@]}" -- "${ARGS[@]}"

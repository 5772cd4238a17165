#!/usr/bin/env bash
# All-to-all methods through mpirun, driven by environment variables as in the original suite:
#
#   dnn=resnet50 bs=64 nworkers=8 senlen=64 rdma=0 method=fusion threshold=67108864 \
#   compressor=none density=0.001 ./horovod/horovod_mpi_cj.sh
#
# runs `python -m ddlbench.train` on the hosts of configs/cluster$nworkers (override with
# hostfile=...). rdma: 0 = 10GbE TCP, 1 = 100Gb InfiniBand with RDMA, 2 = TCP over the 100Gb
# fabric; interfaces come from configs/cluster.conf. For small runs: image_size (CNN pixels),
# iters (timing rounds), extra_args (more flags for the training script, split into words as a
# shell would, quotes honoured, nothing expanded); dry_run=1 prints the command and runs nothing.
# timeline=PATH writes the run's Chrome trace there (timeline_iters=N: its first N steps only).
# cudnn_benchmark=1 (default, as the original's scripts) sets cudnn.benchmark = True; 0 not.
#
# method unset: fusion at Horovod's default threshold (the original's horovod/ launcher, which
# ignored threshold=). The method's own settings are variables named after its options (fusion: threshold;
# bytescheduler: partition, credit; ddp: bucket_cap_mb; ...), with compressor and the
# compressor's options (density, powersgd_rank, ...); their defaults are the method's own:
# `python -m ddlbench.methods defaults METHOD` lists them.
#
# engine=horovod: real Horovod 0.28.1 (wfbp, fusion, bspa2a, mgwfbp; compressor none or fp16),
# run by the Python and mpirun of the environment `make horovod-env` builds (HOROVOD_PY and
# HOROVOD_MPIRUN from configs/cluster.conf or the environment name others). launcher=horovodrun starts it with `horovodrun --gloo`
# (Horovod's Gloo controller) instead of mpirun; launcher=mpirun is the default.
# engine=deepspeed: real DeepSpeed 0.19.8's ZeRO (method=zero), run by the Python of the
# environment `make deepspeed-env` builds (DEEPSPEED_PY names another) under the suite's mpirun.
#
# net=PROFILE (else DDLBENCH_NET): an emulated cluster on this machine instead (1gbit, 2.5gbit,
# 5gbit, rate=R, ...; configs/networks.yaml). Then mpirun, the host file and rdma are not used:
# the suite's local spawner runs the nworkers processes, each a host in its own network
# namespace (python -m ddlbench.train --nworkers N --net PROFILE). Needs root and iproute2.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
source "$root/ddlbench/launch/common.sh"
export NCCL_DEBUG="${NCCL_DEBUG:-INFO}"  # the original's launchers always set it

if [ -z "${method:-}" ] && [ -n "${threshold:-}" ]; then
    # The original's horovod/ launcher ran Horovod's default fusion and ignored threshold (its
    # benchmarks.py passes threshold=0 here): an original command keeps its meaning.
    echo "$LAUNCHER_NAME: threshold=$threshold ignored: with method unset this is Horovod's default tensor fusion, as in the original; method=fusion takes threshold (bytes)" >&2
    unset threshold
fi
defaults nworkers=8 rdma=0 method=fusion engine=torch launcher=mpirun "net=${DDLBENCH_NET:-}"
defaults "hostfile=$root/configs/cluster$nworkers"

case "$engine" in
    torch) ;;
    horovod)
        PY="${HOROVOD_PY:-}"
        [ -n "$PY" ] || PY="$("$root/horovod/legacy_env.sh" python)" || exit 2
        MPIRUN="${HOROVOD_MPIRUN:-$(dirname "$PY")/mpirun}" ;;
    deepspeed)
        # real DeepSpeed's ZeRO (scripts/deepspeed_env.sh): the suite's mpirun, its Python
        PY="${DEEPSPEED_PY:-}"
        [ -n "$PY" ] || PY="$("$root/scripts/deepspeed_env.sh" python)" || exit 2 ;;
    *) die "engine must be torch, horovod or deepspeed, got '$engine'" ;;
esac
case "$launcher" in
    mpirun) ;;
    horovodrun) [ "$engine" = horovod ] || die "launcher=horovodrun needs engine=horovod" ;;
    *) die "launcher must be mpirun or horovodrun, got '$launcher'" ;;
esac

positive nworkers "$nworkers"
defaults cudnn_benchmark=1   # the original's scripts set cudnn.benchmark = True
job_args "$method"

if [ -n "$net" ] && [ "$net" != loopback ] && [ "$engine" = horovod ]; then
    die "net= (an emulated cluster) runs on engine=torch or deepspeed only"
fi
emulated_exec "$net" "$nworkers" "${ARGS[@]}"

master_addr="$(check_hostfile "$hostfile" "$nworkers")"

if [ "$launcher" = horovodrun ]; then
    # Horovod's own launcher with its Gloo controller, on the host file's hosts.
    hvdrun="$(dirname "$PY")/horovodrun"
    [ -x "$hvdrun" ] || die "horovodrun not found beside $PY"
    hosts="$(cd "$root" && "$PY" -m ddlbench.hosts.hostfile "$hostfile" --need "$nworkers" --horovod)" || exit 2
    export MASTER_ADDR="$master_addr"
    launch_exec "$hvdrun" --gloo -np "$nworkers" -H "$hosts" "$PY" -m ddlbench.train "${ARGS[@]}"
fi

mpi_options "$rdma"
mpi_transport "$rdma"
oversubscription_options "$nworkers" "$master_addr"

launch_exec "$MPIRUN" -np "$nworkers" -hostfile "$hostfile" -wdir "$root" "${MPI_OPTS[@]}" \
    -x "MASTER_ADDR=$master_addr" "$PY" -m ddlbench.train "${ARGS[@]}"

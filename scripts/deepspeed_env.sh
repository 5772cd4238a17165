#!/usr/bin/env bash
# The environment of real DeepSpeed (scripts/deepspeed_probe.py; docs/DESIGN.md section 10).
#
#   scripts/deepspeed_env.sh build [--optional]   build it (reused while its inputs are unchanged)
#   scripts/deepspeed_env.sh python               print its Python, or say why there is none
#   scripts/deepspeed_env.sh remove               delete it (and every older build of it)
#   scripts/deepspeed_env.sh where                print the directory it lives in
#
# DeepSpeed 0.19.8 runs on the suite's torch 2.14.1, but pins packages of its own (pydantic 2
# and others), so it is not installed into the suite's venv: scripts/requirements-deepspeed.txt
# (DeepSpeed and what the venv lacks, every version pinned) goes with `pip install --no-deps
# --target` into $DDLBENCH_CACHE (default ~/.cache/ddlbench)/deepspeed-env-KEY/site, and the
# environment's Python, bin/python, is the suite's venv's with that directory first on
# PYTHONPATH. KEY hashes the requirements, this script, and the suite's Python (its real path)
# with its torch version. No op is compiled: DeepSpeed builds its ops with ninja when first
# used, and training on the CPU uses none (scripts/deepspeed_probe.py skips the shared-memory
# op, which only inference_all_reduce uses).
#
# Exit status: 0 done (or skipped, below); 2 a prerequisite is missing (the suite's venv: make
# setup); 3 the package registry cannot be reached (pip's words are a network error, the ones
# horovod/legacy_env.sh recognises); 1 anything else (its log is named). With --optional an
# unreachable registry is not an error (exit 0): the reason is written to
# $DDLBENCH_CACHE/deepspeed-env.unavailable, which the tests report as their skip reason.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(dirname "$here")"
reqs="$here/requirements-deepspeed.txt"
cache="${DDLBENCH_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/ddlbench}"
base="${DDLBENCH_PYTHON:-$repo/.venv/bin/python}"
name=deepspeed-env
unavailable="$cache/deepspeed-env.unavailable"
say() { echo "deepspeed-env: $*" >&2; }
fail() { local code="$1"; shift; echo "deepspeed-env: error: $*" >&2; exit "$code"; }
[ -x "$base" ] || fail 2 "the suite's Python $base is missing; run: make setup"
# the venv's own path (its bin/python links to the interpreter it was made from)
base_real="$(readlink -f "$(dirname "$base")")/$(basename "$base")"
# DeepSpeed's import reads torch's; the key follows both
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
# DeepSpeed's environment: the suite's Python with DeepSpeed's packages first
export PYTHONPATH="$env_dir/site\${PYTHONPATH:+:\$PYTHONPATH}"
export DS_ACCELERATOR=cpu
exec "$base_real" "\$@"
PY
    chmod +x "$env_dir/bin/python"
    if ! DS_ACCELERATOR=cpu "$env_dir/bin/python" -c '
import deepspeed, pydantic, torch
from deepspeed.accelerator import get_accelerator
a = get_accelerator()
print("deepspeed", deepspeed.__version__, "torch", torch.__version__, "pydantic",
      pydantic.VERSION, "accelerator", a.device_name(), "backend", a.communication_backend_name())
assert a.communication_backend_name() == "gloo", a.communication_backend_name()' >>"$log" 2>&1; then
        fail 1 "deepspeed does not import with its CPU accelerator on Gloo; see $log"
    fi
    legacy_ready
    say "ready in $(( SECONDS - t0 )) s: $env_dir ($(du -sh "$env_dir" | cut -f1)): $(tail -1 "$log")"
}

cmd_python() { legacy_python "$env_dir/bin/python" "make deepspeed-env" DeepSpeed; }

legacy_main "build [--optional], python, remove, where" "$@"

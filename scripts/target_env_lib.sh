# The environments of the lanes whose framework installs beside the suite's own torch
# (scripts/deepspeed_env.sh, scripts/torchft_env.sh); sourced by them after they set `name`
# (deepspeed-env, torchft-env), `reqs` (their requirements file, every version pinned) and
# `script` (their own path). The requirements go with `pip install --no-deps --target` into
# $DDLBENCH_CACHE (default ~/.cache/ddlbench)/NAME-KEY/site, and the environment's Python,
# bin/python, is the suite's venv's with that directory first on PYTHONPATH. KEY hashes the
# requirements, the script, this file, and the suite's Python (its real path) with its torch
# version. Exit codes: 2 bad use (or no suite venv: make setup); 3 the package registry cannot
# be reached (pip's words are a network error, the ones horovod/legacy_env.sh recognises); 1
# anything else (its log is named). With --optional an unreachable registry is not an error
# (exit 0): the reason is written to $DDLBENCH_CACHE/NAME.unavailable, which the tests report
# as their skip reason.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(dirname "$here")"
cache="${DDLBENCH_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/ddlbench}"
base="${DDLBENCH_PYTHON:-$repo/.venv/bin/python}"
unavailable="$cache/$name.unavailable"
say() { echo "$name: $*" >&2; }
fail() { local code="$1"; shift; echo "$name: error: $*" >&2; exit "$code"; }
[ -x "$base" ] || fail 2 "the suite's Python $base is missing; run: make setup"
# the venv's own path (its bin/python links to the interpreter it was made from)
base_real="$(readlink -f "$(dirname "$base")")/$(basename "$base")"
# the framework's import reads torch's; the key follows both
torch_version="$("$base" -c 'import torch; print(torch.__version__)' 2>/dev/null)" ||
    fail 2 "torch does not import in $base; run: make setup"
key="$({ cat "$reqs" "$script" "${BASH_SOURCE[0]}"; echo "$base_real $torch_version"; } |
       sha256sum | cut -c1-12)"
env_dir="$cache/$name-$key"
# shellcheck source=legacy_env_lib.sh
. "$here/legacy_env_lib.sh"
# pip's words for a network failure: horovod/legacy_env.sh's line, which the tests read too
eval "$(grep -m1 "^NETWORK_ERROR=" "$repo/horovod/legacy_env.sh")"

# `build [--optional]`: EXPORTS (lines of `export VAR=VALUE` the environment's Python sets,
# may be empty), CHECK (Python run in it once installed; its last line printed when ready) and
# WHAT (the error when the check fails), then build's own arguments.
target_env_build() {
    local exports="$1" check="$2" what="$3" optional
    shift 3
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
# $name: the suite's Python with the packages of $reqs first
export PYTHONPATH="$env_dir/site\${PYTHONPATH:+:\$PYTHONPATH}"
${exports:+$exports
}exec "$base_real" "\$@"
PY
    chmod +x "$env_dir/bin/python"
    "$env_dir/bin/python" -c "$check" >>"$log" 2>&1 || fail 1 "$what; see $log"
    legacy_ready
    say "ready in $(( SECONDS - t0 )) s: $env_dir ($(du -sh "$env_dir" | cut -f1)): $(tail -1 "$log")"
}

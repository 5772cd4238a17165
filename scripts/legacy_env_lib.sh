# What the environment scripts (horovod/legacy_env.sh, byteps/legacy_env.sh,
# scripts/deepspeed_env.sh, scripts/torchft_env.sh) share; sourced by them. They set `name`
# (horovod-env, byteps-env, deepspeed-env, torchft-env), `cache`, `env_dir` ($cache/$name-KEY)
# and `unavailable`, and define `say` and `fail CODE MESSAGE`.

# The opening of `build [--optional]` (in a cmd_build that declares `local optional` first):
# `optional` set (1 with --optional, else 0); true (0) when the environment is ready (said so,
# a recorded reason for its absence dropped), else the cache made and an older reason dropped
# (it may no longer hold; a skip writes its own) and false (1): the build goes on.
legacy_build_opening() {
    optional=0
    [ "${1:-}" = "--optional" ] && optional=1
    if [ -f "$env_dir/.ready" ]; then
        say "up to date: $env_dir"
        rm -f "$unavailable"
        return 0
    fi
    # (called as a condition, where set -e does not stop on a failure: each step checked)
    mkdir -p "$cache" || fail 1 "cannot make the cache directory $cache"
    rm -f "$unavailable" || fail 1 "cannot remove $unavailable"
    return 1
}

# The environment is ready: older builds (other inputs; GBs each) go, the stamp is written
# last, a recorded reason for its absence is dropped.
legacy_ready() {
    local old
    for old in "$cache/$name"-*; do
        [ "$old" = "$env_dir" ] || [ "$old" = "$env_dir.log" ] || rm -rf "$old"
    done
    touch "$env_dir/.ready"
    rm -f "$unavailable"
}

# `python`: print PATH if the environment is ready, else why not (the recorded reason, exit 3;
# not built, exit 1, with the command that builds it).
legacy_python() {
    local path="$1" build="$2"
    if [ -f "$env_dir/.ready" ]; then echo "$path"; return 0; fi
    if [ -f "$unavailable" ]; then fail 3 "$(cat "$unavailable")"; fi
    fail 1 "the $3 environment is not built ($env_dir); run: $build"
}

# `remove`: every build of it, and the recorded reason.
legacy_remove() {
    local d removed=0
    for d in "$cache/$name"-* "$unavailable"; do
        [ -e "$d" ] || continue
        rm -rf "$d"; removed=1; say "removed $d"
    done
    [ "$removed" = 1 ] || say "nothing to remove under $cache"
}

# The command line (USAGE names the commands): build [OPTIONS] (the script's cmd_build),
# python (its cmd_python), remove, where.
legacy_main() {
    local usage="$1"; shift
    case "${1:-build}" in
        build) shift || true; cmd_build "$@" ;;
        python) cmd_python ;;
        remove) legacy_remove ;;
        where) echo "$env_dir" ;;
        *) fail 2 "unknown command '$1' ($usage)" ;;
    esac
}

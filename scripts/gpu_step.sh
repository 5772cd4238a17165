# Sourced by the GPU scripts (scripts/gpu_check.sh, scripts/gpu_host_path.sh): their shared step.
# step SECONDS LOG COMMAND...: run one step under a time limit, its output appended to LOG and
# its command echoed there and here; a failed or timed-out step sets status=1 and returns its
# exit code, so one that hangs does not cost the others.
status=${status:-0}
step() {
    local limit=$1 log=$2 rc
    shift 2
    echo "== $*" | tee -a "$log"
    timeout "$limit" "$@" >>"$log" 2>&1
    rc=$?
    [ "$rc" -eq 0 ] || { echo "   exit $rc" | tee -a "$log"; status=1; }
    return "$rc"
}

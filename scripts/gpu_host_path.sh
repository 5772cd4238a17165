#!/usr/bin/env bash
# Issue 44's GPU checks (the lean host path) as one script (estimated at 7 minutes, not yet
# timed), for a session with a GPU and little device time: the bare loop beside every all-reduce
# method on ResNet-50 bs 64, and beside bspa2a, wfbp and DDP sending their messages on
# BERT-Large bs 8
# (ddlbench.overhead --cuda --optimizer auto, 6 interleaved rounds: overhead_<model>.json), the
# layer-wise profiles of both (profile_<model>.json), then the verdicts: scripts/launch_check.py
# (the model's wfbp / bare loop within 10% of the measured one) and scripts/host_path_bars.py
# (each ratio against its bar). Every step's output in OUTDIR/log.txt; exit 1 if a step failed
# or a bar is not met. scripts/gpu_check.sh runs this as its middle part.
#
#   scripts/gpu_host_path.sh OUTDIR    (PYTHON=... picks the interpreter; default python3)
set -u
out=${1:?usage: scripts/gpu_host_path.sh OUTDIR}
py=${PYTHON:-python3}
mkdir -p "$out" && out=$(cd "$out" && pwd) && cd "$(dirname "$0")/.." || exit 2
export PYTHONUNBUFFERED=1
log=$out/log.txt
# shellcheck source=scripts/gpu_step.sh
. scripts/gpu_step.sh

# four loops per method (bare, method, a raw all-reduce hook, DDP sending the same messages),
# the methods those the bars read (every all-reduce one on ResNet-50) and DDP
for spec in "resnet50 64 330" "bert 8 200"; do
    read -r model bs limit <<<"$spec"
    ms=$("$py" scripts/host_path_bars.py --methods "$model") || exit 2
    step "$limit" "$log" "$py" -m ddlbench.overhead --cuda --model "$model" --batch-size "$bs" \
        --optimizer auto --methods "$ms" --rounds 6 --json "$out/overhead_$model.json"
done
for spec in "resnet50 64" "bert 8"; do
    read -r model bs <<<"$spec"
    step 150 "$log" "$py" -m ddlbench.measure.profiler --model "$model" --batch-size "$bs" \
        --output "$out/profile_$model.json"
done
# the model's wfbp against the bare loop at one GPU, beside the measured ratio (within 10%),
# then every bar; their lines (of this run: the log may hold earlier ones) shown here too
from=$(($(wc -l <"$log") + 1))
step 60 "$log" "$py" scripts/launch_check.py "$out" resnet50 bert
step 30 "$log" "$py" scripts/host_path_bars.py "$out"
tail -n "+$from" "$log" | grep -E "^(resnet50|bert): wfbp|: (shown|met|NOT met|missing)$"
exit "$status"

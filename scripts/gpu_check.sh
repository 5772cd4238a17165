#!/usr/bin/env bash
# The GPU checks as one script, for a machine with a CUDA GPU (README "GPU"; figures in docs/RESULTS.md): first the
# single-GPU throughputs of docs/DESIGN.md section 10 (ResNet-50 bs 64, BERT-Large bs 8, BERT-Base
# bs 64; run records as train_<model>.json), the plain loop beside the methods (ddlbench.overhead),
# then tests/test_cuda.py, then layer-wise profiles of
# ResNet-50 bs 64 and BERT-Large bs 8 (profile_<model>.json, the format of configs/profiles/),
# then the model's wfbp/bare ratio from those profiles beside the measured one
# (scripts/launch_check.py); every step's output in OUTDIR/log.txt.
# Each step has a time limit of its own, so one that hangs does not cost the others.
#
#   scripts/gpu_check.sh OUTDIR        (PYTHON=... picks the interpreter; default python3)
set -u
out=${1:?usage: scripts/gpu_check.sh OUTDIR}
py=${PYTHON:-python3}
mkdir -p "$out" && out=$(cd "$out" && pwd) && cd "$(dirname "$0")/.." || exit 2
export PYTHONUNBUFFERED=1
status=0
log=$out/log.txt  # every step's output, in order

step() {  # step SECONDS LOG COMMAND...: run one step under a time limit, its output kept in LOG
    local limit=$1 log=$2 rc
    shift 2
    echo "== $*" | tee -a "$log"
    timeout "$limit" "$@" >>"$log" 2>&1
    rc=$?
    [ "$rc" -eq 0 ] || { echo "   exit $rc" | tee -a "$log"; status=1; }
    return "$rc"
}

{
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
    "$py" -c "import sys, torch, torchvision, transformers; print('python', sys.version.split()[0],
'torch', torch.__version__, 'torchvision', torchvision.__version__, 'transformers',
transformers.__version__, torch.cuda.get_device_name(0) if torch.cuda.is_available() else 'no GPU')"
} 2>&1 | tee "$log"

for spec in "resnet50 64" "bert 8" "bert_base 64"; do
    read -r model bs <<<"$spec"
    step 180 "$log" "$py" -m ddlbench.train --model "$model" --batch-size "$bs" \
        --method wfbp --output "$out/train_$model.json"
    grep "^Total" "$log" | tail -1
done

# The plain PyTorch loop beside each method, in one process (DESIGN section 10's figures were a
# plain loop's), with the benchmark's optimizer; then what the timeline's counters cost on BERT.
for spec in "resnet50 64" "bert 8" "bert_base 64"; do
    read -r model bs <<<"$spec"
    # four loops per method (bare, method, a raw all-reduce hook, DDP sending the same messages)
    step 300 "$log" "$py" -m ddlbench.overhead --cuda --model "$model" --batch-size "$bs" \
        --optimizer auto --methods bspa2a,wfbp,ddp --rounds 6 --json "$out/overhead_$model.json"
done
step 180 "$log" "$py" -m ddlbench.overhead --cuda --timeline --model bert --batch-size 8 \
    --optimizer auto --methods wfbp --rounds 6

xdist=()
"$py" -c "import xdist" 2>/dev/null && xdist=(-n 6)
step 420 "$log" "$py" -m pytest tests/test_cuda.py -q -p no:cacheprovider \
    "${xdist[@]}"
tail -3 "$log"

for spec in "resnet50 64" "bert 8"; do
    read -r model bs <<<"$spec"
    step 180 "$log" "$py" -m ddlbench.measure.profiler --model "$model" --batch-size "$bs" \
        --output "$out/profile_$model.json"
done
# the model's wfbp against the bare loop at one GPU, beside the overhead step's measured ratio
# (host and device as two resources: within 10% is issue 44's bar)
step 60 "$log" "$py" scripts/launch_check.py "$out" resnet50 bert
tail -2 "$log"
exit "$status"

#!/usr/bin/env bash
# The GPU checks as one script, for a machine with a CUDA GPU (README "GPU"; figures in docs/RESULTS.md): first the
# single-GPU throughputs of docs/DESIGN.md section 10 (ResNet-50 bs 64, BERT-Large bs 8, BERT-Base
# bs 64; run records as train_<model>.json), then issue 44's checks (scripts/gpu_host_path.sh:
# the plain loop beside the methods on ResNet-50 and BERT-Large with ddlbench.overhead,
# layer-wise profiles of both, profile_<model>.json in the format of configs/profiles/, the
# model's wfbp/bare ratio from those profiles beside the measured one, scripts/launch_check.py,
# and each ratio against its bar, scripts/host_path_bars.py), the plain loop beside the methods
# on BERT-Base, the timeline's cost, then tests/test_cuda.py; every step's output in
# OUTDIR/log.txt. Each step has a time limit of its own, so one that hangs does not cost the
# others. The whole takes more than one 10-minute call: with little device time, run
# scripts/gpu_host_path.sh alone.
#
#   scripts/gpu_check.sh OUTDIR        (PYTHON=... picks the interpreter; default python3)
set -u
out=${1:?usage: scripts/gpu_check.sh OUTDIR}
py=${PYTHON:-python3}
mkdir -p "$out" && out=$(cd "$out" && pwd) && cd "$(dirname "$0")/.." || exit 2
export PYTHONUNBUFFERED=1
log=$out/log.txt  # every step's output, in order
# shellcheck source=scripts/gpu_step.sh
. scripts/gpu_step.sh

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
# plain loop's), with the benchmark's optimizer, the profiles and issue 44's verdicts (its own
# log lines and exit status count here too); then BERT-Base and the timeline's counters' cost.
PYTHON=$py scripts/gpu_host_path.sh "$out" || status=1
step 300 "$log" "$py" -m ddlbench.overhead --cuda --model bert_base --batch-size 64 \
    --optimizer auto --methods bspa2a,wfbp,ddp --rounds 6 --json "$out/overhead_bert_base.json"
step 180 "$log" "$py" -m ddlbench.overhead --cuda --timeline --model bert --batch-size 8 \
    --optimizer auto --methods wfbp --rounds 6

xdist=()
"$py" -c "import xdist" 2>/dev/null && xdist=(-n 6)
step 420 "$log" "$py" -m pytest tests/test_cuda.py -q -p no:cacheprovider \
    "${xdist[@]}"
tail -3 "$log"
exit "$status"

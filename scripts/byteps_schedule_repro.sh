#!/usr/bin/env bash
# BytePS 0.2.5's server scheduling, alone: 1 scheduler, 1 server and 2 CPU workers of the
# real-BytePS environment (make byteps-env) on the loopback push_pull 60 float64 tensors of up to
# 320 KB in 64 KB partitions, 6 rounds, each worker's pushes staggered by up to 4 ms; every sum
# is checked. BYTEPS_SERVER_SCHEDULE_HEAP=original in the environment keeps 0.2.5's scheduling
# heap, which goes stale: with BYTEPS_SERVER_ENABLE_SCHEDULE=1 some partitions then come back
# holding one worker's own gradient instead of the sum. The patch's heap (the default) and
# unscheduled servers get every sum right (docs/DESIGN.md section 10).
#
#   [BYTEPS_SERVER_SCHEDULE_HEAP=original] scripts/byteps_schedule_repro.sh [SCHEDULE (default 1)] [NSERVERS (default 1)]
#
# Prints each wrong partition ("wrong: round R tensor T ...") and a line per worker; exits 1
# when a sum was wrong.
set -uo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
py="$("$root/byteps/legacy_env.sh" python)" || exit 2
schedule="${1:-1}"; nservers="${2:-1}"
dir="$(mktemp -d)"
trap 'kill $(jobs -p) 2>/dev/null; wait 2>/dev/null; rm -rf "$dir"' EXIT
port="$("$py" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0))
print(s.getsockname()[1])')"
export DMLC_NUM_WORKER=2 DMLC_NUM_SERVER="$nservers" DMLC_PS_ROOT_URI=127.0.0.1 \
    DMLC_PS_ROOT_PORT="$port" DMLC_NODE_HOST=127.0.0.1 BYTEPS_PARTITION_BYTES=65536 \
    BYTEPS_SERVER_ENABLE_SCHEDULE="$schedule"
DMLC_ROLE=scheduler timeout 120 "$py" -c 'import byteps.server' > "$dir/scheduler.log" 2>&1 &
for s in $(seq "$nservers"); do
    DMLC_ROLE=server timeout 120 "$py" -c 'import byteps.server' > "$dir/server$s.log" 2>&1 &
done
pids=()
for w in 0 1; do
    DMLC_ROLE=worker DMLC_WORKER_ID=$w BYTEPS_LOCAL_RANK=0 BYTEPS_LOCAL_SIZE=1 BYTEPS_CPU_ONLY=1 \
        timeout 120 "$py" -c '
import random, time
import torch, byteps.torch as bps
from byteps.torch.ops import push_pull_async_inplace
bps.init()
r = bps.rank()
torch.manual_seed(0)
sizes = [int(x) for x in torch.randint(1, 40000, (60,))]
wrong = 0
for rnd in range(6):
    random.seed(r * 100 + rnd)
    mine = [torch.arange(n, dtype=torch.float64) + (r + 1 + rnd) for n in sizes]
    handles = []
    for i, t in enumerate(mine):
        time.sleep(random.random() * 0.004)
        handles.append(push_pull_async_inplace(t, average=False, name=f"t{i}"))
    for h in handles:
        bps.synchronize(h)
    for i, (t, n) in enumerate(zip(mine, sizes)):
        want = 2 * torch.arange(n, dtype=torch.float64) + (3 + 2 * rnd)
        bad = (t != want).nonzero()
        if len(bad):
            wrong += 1
            j = int(bad[0])
            print(f"wrong: round {rnd} tensor {i} from element {j} ({len(bad)} of {n}): "
                  f"{float(t[j])}, the sum is {float(want[j])} (this worker alone: "
                  f"{float(j + r + 1 + rnd)})", flush=True)
print(f"worker {r}: {wrong} of {6 * len(sizes)} sums wrong", flush=True)
bps.shutdown()
raise SystemExit(1 if wrong else 0)' > "$dir/worker$w.log" 2>&1 &
    pids+=($!)
done
status=0
for p in "${pids[@]}"; do wait "$p" || status=1; done
grep -h "wrong\|Error\|Check failed" "$dir"/worker*.log
exit $status

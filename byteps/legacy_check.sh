#!/usr/bin/env bash
# The real-BytePS environment's check (byteps/legacy_env.sh): 1 scheduler, 1 server and 2 CPU
# workers (BYTEPS_CPU_ONLY=1, one process per BytePS worker) of the patched BytePS 0.2.5 on
# the loopback, with 4096-byte partitions. Each worker push_pulls a float32 tensor of its
# rank + 1 (summed: 3) and averages a float64 tensor of 10 partitions in place, then prints
# the shared-memory segments it mapped (the patch names them per job and worker: two workers
# on one host must not share one). Usage: legacy_check.sh PYTHON (the environment's wrapper).
# Prints every process's log; exits 0 only if both workers got the right sums.
set -uo pipefail
py="$1"
dir="$(mktemp -d)"
trap 'kill $(jobs -p) 2>/dev/null; wait 2>/dev/null; rm -rf "$dir"' EXIT
port="$("$py" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0))
print(s.getsockname()[1])')"
export DMLC_NUM_WORKER=2 DMLC_NUM_SERVER=1 DMLC_PS_ROOT_URI=127.0.0.1 DMLC_PS_ROOT_PORT="$port" \
    DMLC_NODE_HOST=127.0.0.1 BYTEPS_PARTITION_BYTES=4096
DMLC_ROLE=scheduler timeout 120 "$py" -c 'import byteps.server' > "$dir/scheduler.log" 2>&1 &
DMLC_ROLE=server timeout 120 "$py" -c 'import byteps.server' > "$dir/server.log" 2>&1 &
pids=()
for w in 0 1; do
    # each process its own BytePS worker (local rank 0 of 1), no socket folder given: the
    # patch names the default sockets per job and worker too
    DMLC_ROLE=worker DMLC_WORKER_ID=$w BYTEPS_LOCAL_RANK=0 BYTEPS_LOCAL_SIZE=1 BYTEPS_CPU_ONLY=1 \
        timeout 120 "$py" -c '
import torch, byteps.torch as bps
from byteps.torch.ops import push_pull_async, push_pull_async_inplace
bps.init()
r = bps.rank()
t = torch.ones(4) * (r + 1)
out = bps.synchronize(push_pull_async(t, average=False, name="check"))
print("worker", r, "of", bps.size(), "push_pull:", out.tolist(), flush=True)
assert out.tolist() == [3.0] * 4, out
big = torch.arange(5120, dtype=torch.float64) * (r + 1)  # 40960 bytes: 10 partitions
bps.synchronize(push_pull_async_inplace(big, average=True, name="big"))
assert torch.equal(big, torch.arange(5120, dtype=torch.float64) * 1.5), big
print("worker", r, "average of 10 partitions: ok", flush=True)
segments = sorted({line.split()[5] for line in open("/proc/self/maps")
                   if "/dev/shm/BytePS" in line})
print("worker", r, "shared memory:", " ".join(segments), flush=True)
bps.shutdown()' > "$dir/worker$w.log" 2>&1 &
    pids+=($!)
done
ok=0
for p in "${pids[@]}"; do wait "$p" || ok=1; done
for f in worker0 worker1 server scheduler; do
    echo "== $f"; tail -20 "$dir/$f.log"
done
exit $ok

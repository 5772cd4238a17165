#!/usr/bin/env bash
# The real-BytePS environment's check (byteps/legacy_env.sh): 1 scheduler, 1 server and 2
# workers of BytePS 0.2.5 on the loopback; each worker push_pulls a CPU tensor of its rank + 1,
# which must come back as their sum. Usage: legacy_check.sh PYTHON (the environment's wrapper).
# Prints every process's log; exits 0 only if both workers printed the sum.
set -uo pipefail
py="$1"
dir="$(mktemp -d)"
trap 'kill $(jobs -p) 2>/dev/null; wait 2>/dev/null; rm -rf "$dir"' EXIT
port="$("$py" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0))
print(s.getsockname()[1])')"
export DMLC_NUM_WORKER=2 DMLC_NUM_SERVER=1 DMLC_PS_ROOT_URI=127.0.0.1 DMLC_PS_ROOT_PORT="$port" \
    DMLC_NODE_HOST=127.0.0.1
DMLC_ROLE=scheduler "$py" -c 'import byteps.server' > "$dir/scheduler.log" 2>&1 &
DMLC_ROLE=server "$py" -c 'import byteps.server' > "$dir/server.log" 2>&1 &
pids=()
for w in 0 1; do
    mkdir -p "$dir/socket$w"
    # one worker per "machine": local rank 0 of 1, its own socket folder
    DMLC_ROLE=worker DMLC_WORKER_ID=$w BYTEPS_LOCAL_RANK=0 BYTEPS_LOCAL_SIZE=1 \
        BYTEPS_SOCKET_PATH="$dir/socket$w" timeout 120 "$py" -c '
import torch, byteps.torch as bps
bps.init()
t = torch.ones(4) * (bps.rank() + 1)
out = bps.synchronize(bps.push_pull_async(t, average=False, name="check"))
print("worker", bps.rank(), "of", bps.size(), "push_pull:", out.tolist(), flush=True)
assert out.tolist() == [3.0] * 4, out' > "$dir/worker$w.log" 2>&1 &
    pids+=($!)
done
ok=0
for p in "${pids[@]}"; do wait "$p" || ok=1; done
for f in worker0 worker1 server scheduler; do
    echo "== $f"; tail -20 "$dir/$f.log"
done
exit $ok

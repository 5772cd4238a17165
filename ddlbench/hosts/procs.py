"""Supervising a job's processes: signals recorded while setting up and tearing down, the
first failure named, the rest stopped (SIGTERM, then SIGKILL)."""
from __future__ import annotations

import contextlib
import signal
import subprocess
import sys
import time


@contextlib.contextmanager
def stop_signals():
    """While inside, SIGINT and SIGTERM are recorded instead of raised (so set-up and tear-down
    run to the end): yields a dict whose "signal" is the first one received, else None."""
    stopping = {"signal": None}

    def on_signal(signum, _frame):
        if stopping["signal"] is None:
            stopping["signal"] = signum

    old = {s: signal.signal(s, on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield stopping
    finally:
        for s, handler in old.items():
            signal.signal(s, handler)


def supervise(procs: list[subprocess.Popen], names: list[str], stopping: dict,
              settle_s: float = 0.0, poll_s: float = 0.05) -> int:
    """Wait for a job's processes (``stopping`` from ``stop_signals()``). Returns 0 when every
    one exits 0; 128 + signal when this process got SIGINT/SIGTERM; else the first failure's
    code (128 + signal for a killed process), after giving the others ``settle_s`` to exit on
    their own and naming the failed one when some are still running. The caller stops
    whatever still runs."""
    while True:
        if stopping["signal"] is not None:
            return 128 + stopping["signal"]
        codes = [p.poll() for p in procs]
        bad = [(i, c) for i, c in enumerate(codes) if c not in (None, 0)]
        if bad:
            i, code = bad[0]
            _wait_all(procs, settle_s)
            if any(p.poll() is None for p in procs):
                print(f"ddlbench: {names[i]} exited with code {code}; stopping the others",
                      file=sys.stderr, flush=True)
            return code if code > 0 else 128 - code
        if all(c == 0 for c in codes):
            return 0
        time.sleep(poll_s)


def _wait_all(procs, timeout_s):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and any(p.poll() is None for p in procs):
        time.sleep(0.05)


def terminate(procs, grace_s):
    alive = [p for p in procs if p.poll() is None]
    for p in alive:
        p.terminate()
    deadline = time.monotonic() + grace_s
    for p in alive:
        try:
            p.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()

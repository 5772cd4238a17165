"""Supervising a job's processes: signals recorded while setting up and tearing down, the
first failure named, the rest stopped (SIGTERM, then SIGKILL); children that die with their
parent, even when it is killed outright."""
from __future__ import annotations

import contextlib
import ctypes
import os
import re
import signal
import subprocess
import threading
import time

from ..errors import say

try:  # looked up here, not in a forked child
    _prctl = ctypes.CDLL(None, use_errno=True).prctl
except (OSError, AttributeError):  # pragma: no cover - not Linux
    _prctl = None
_PR_SET_PDEATHSIG = 1
_SIGTERM = int(signal.SIGTERM)
ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")  # a shell variable name (use fullmatch)
PARENT_ENV = "DDLBENCH_PARENT_PID"   # the spawner a local process must not outlive
STDIN_ENV = "DDLBENCH_WATCH_STDIN"   # 1: the launcher's connection is stdin (ssh)


def die_with_parent():
    """A ``preexec_fn`` for Popen: the child gets SIGTERM when this process dies, even by
    SIGKILL (Linux's parent-death signal, kept across exec), and exits at once if this
    process died before the child could ask for it."""
    parent = os.getpid()

    def preexec() -> None:
        if _prctl is not None:
            _prctl(_PR_SET_PDEATHSIG, _SIGTERM)
        if os.getppid() != parent:
            os._exit(1)
    return preexec


def watch_parent(environ=None, poll_s: float = 0.5) -> None:
    """In a job's process: a daemon thread that ends this process when what started it is
    gone, for the cases the parent-death signal does not reach: the spawner named by
    DDLBENCH_PARENT_PID is no longer the parent (it died and we were re-parented), or, with
    DDLBENCH_WATCH_STDIN=1, stdin (the launcher's ssh connection) reached its end."""
    environ = os.environ if environ is None else environ
    parent = environ.get(PARENT_ENV, "")
    if parent.isdigit():
        def orphaned() -> None:
            while os.getppid() == int(parent):
                time.sleep(poll_s)
            _leave("its spawner (pid " + parent + ") is gone")
        threading.Thread(target=orphaned, name="ddlbench-parent-watch", daemon=True).start()
    if environ.get(STDIN_ENV) == "1":
        def hung_up() -> None:
            try:
                while os.read(0, 4096):
                    pass
            except OSError:
                pass
            _leave("its launcher's connection closed")
        threading.Thread(target=hung_up, name="ddlbench-stdin-watch", daemon=True).start()


def _leave(why: str) -> None:
    os.write(2, f"ddlbench: process {os.getpid()}: {why}; exiting\n".encode())
    os._exit(128 + _SIGTERM)


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
    their own and naming the failed one when it was killed or some are still running. The
    caller stops whatever still runs."""
    while True:
        if stopping["signal"] is not None:
            return 128 + stopping["signal"]
        codes = [p.poll() for p in procs]
        first = [i for i, c in enumerate(codes) if c not in (None, 0)]
        if first:
            _wait_all(procs, settle_s)
            later = [i for i, p in enumerate(procs) if i not in first and p.poll() not in (None, 0)]
            # The cause: a process killed by a signal (here: a negative code; a remote one: 128
            # + signal from its shell, 255 from ssh), else the first to fail; peers that lost
            # it fail after it.
            order = first + later
            i = min(order, key=lambda j: (not _killed(procs[j].poll()), order.index(j)))
            code = procs[i].poll()
            if _killed(code) or any(p.poll() is None for p in procs):
                how = (f"was killed by {_signal_name(-code)}" if code < 0
                       else f"exited with code {code}")
                say(f"ddlbench: {names[i]} (pid {procs[i].pid}) {how}; stopping the others")
            return code if code > 0 else 128 - code
        if all(c == 0 for c in codes):
            return 0
        time.sleep(poll_s)


def _killed(code: int) -> bool:
    return code < 0 or code >= 128


def _signal_name(signum: int) -> str:
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"


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

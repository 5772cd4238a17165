"""Threads with a visible lifetime: started by a method's ``start()``, stopped by its ``close()``,
and an error (naming the thread) when one is still running after its join timeout."""
from __future__ import annotations

import queue
import threading

JOIN_TIMEOUT_S = 10.0
_STOP = object()


class ThreadLeftRunning(RuntimeError):
    """A thread that did not end within its join timeout."""


def join(thread: threading.Thread, timeout: float = JOIN_TIMEOUT_S) -> None:
    """Wait for ``thread`` to end; one still alive after ``timeout`` seconds is an error."""
    if thread.ident is None:  # never started
        return
    thread.join(timeout)
    if thread.is_alive():
        raise ThreadLeftRunning(f"thread {thread.name} still running {timeout:g} s after it "
                                f"was asked to stop")


def on_device(device) -> None:
    """A new thread starts on CUDA device 0: move it to the method's device."""
    if device is not None and device.type == "cuda":
        import torch
        torch.cuda.set_device(device)


class QueueWorker:
    """A daemon thread that hands each item put on its queue to ``handle``, one at a time, in
    order, until ``stop()``. An exception escaping ``handle`` ends the thread and goes to
    ``on_error`` (which reports it to whoever waits), or, without one, is raised again."""

    def __init__(self, name: str, handle, on_error=None, device=None):
        self.name = name
        self._handle = handle
        self._on_error = on_error
        self._device = device
        self._queue: queue.Queue = queue.Queue()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)

    def start(self) -> None:
        self._thread.start()

    def put(self, item) -> None:
        self._queue.put(item)

    def _run(self) -> None:
        try:
            on_device(self._device)
            while True:
                item = self._queue.get()
                if item is _STOP:
                    return
                self._handle(item)
        except BaseException as e:
            if self._on_error is None:
                raise
            self._on_error(e)

    def stop(self, timeout: float = JOIN_TIMEOUT_S) -> None:
        """Let the thread finish what is queued, then end it (an error if it does not)."""
        if self._thread.ident is not None and self._thread.is_alive():
            self._queue.put(_STOP)
        join(self._thread, timeout)

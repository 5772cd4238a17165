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


class HandsOver:
    """A method whose gradient hooks hand work to a communication thread, ``self._issuer`` (an
    ``Issuer``; None: the method issues itself): started with the method, stopped (what is
    queued issued first) before its hooks go. Put it before ``Method`` in the bases."""

    _issuer: "Issuer | None" = None

    def start(self) -> None:
        super().start()
        if self._issuer is not None:
            self._issuer.start()

    def close(self) -> None:
        try:
            if self._issuer is not None:
                self._issuer.stop()
        finally:
            super().close()


class IssueFailed(RuntimeError):
    """The communication thread could not issue an item; names the item."""


class CollectiveFailed(RuntimeError):
    """A collective of a bucket failed; names the collective, the bucket and its group."""


def wait_for(work, what: str) -> None:
    """``work.wait()``; a failure raised as ``CollectiveFailed`` saying ``what`` (the method, the
    collective, the bucket and its group) failed, and why."""
    try:
        work.wait()
    except Exception as e:
        raise CollectiveFailed(f"{what} failed: {type(e).__name__}: {e}") from e


def group_text(group) -> str:
    """A ``runtime.groups.Group`` as a failure names it."""
    return f"group {group.layout} (ranks {', '.join(map(str, group.ranks))})"


class Issuer:
    """A communication thread in the manner of Horovod's background loop: the training thread
    hands it items (``hand``: constant work, a queue put) and it calls ``issue(item)`` on each,
    one at a time, in the order handed over, so a method that hands over in bucket order issues
    the same sequence on every rank. ``drain()`` (the training thread, before it issues
    anything itself) waits until everything handed over is issued; an exception raised by
    ``issue`` stops the thread and is raised by the next ``hand`` or ``drain`` as
    ``IssueFailed``, naming the item (``describe(item)``). Without ``start()`` nothing runs on
    a thread: ``hand`` issues at once (a method used outside its ``with`` block)."""

    def __init__(self, name: str, issue, describe=repr, device=None):
        self.name = name
        self._issue = issue
        self._describe = describe
        self._device = device
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        self._cv = threading.Condition()
        self._handed = 0   # written by the training thread only
        self._issued = 0   # written by the thread, under the condition's lock
        self._error: IssueFailed | None = None
        self._thread: threading.Thread | None = None

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name=self.name, daemon=True)
            self._thread.start()

    def hand(self, item) -> None:
        if self._error is not None:
            raise self._error
        if self._thread is None:
            self._issue(item)
            return
        self._handed += 1
        self._queue.put(item)

    def _run(self) -> None:
        on_device(self._device)
        while True:
            item = self._queue.get()
            if item is _STOP:
                return
            try:
                self._issue(item)
            except BaseException as e:  # reported to the training thread, naming the item
                error = IssueFailed(f"{self.name}: could not issue {self._describe(item)}: "
                                    f"{type(e).__name__}: {e}")
                error.__cause__ = e
                with self._cv:
                    self._error = error
                    self._cv.notify_all()
                return
            with self._cv:
                self._issued += 1
                self._cv.notify_all()

    def drain(self, poll_s: float = 1.0) -> None:
        """Wait until every item handed over is issued (or raise the thread's error)."""
        if self._thread is None:
            return
        with self._cv:
            while self._issued < self._handed:
                if self._error is not None:
                    raise self._error
                if not self._thread.is_alive():
                    raise IssueFailed(f"{self.name}: the thread ended with "
                                      f"{self._handed - self._issued} item(s) not issued")
                self._cv.wait(poll_s)
        if self._error is not None:
            raise self._error

    def stop(self, timeout: float = JOIN_TIMEOUT_S) -> None:
        """Let the thread issue what is queued, then end it (an error if it does not)."""
        if self._thread is not None and self._thread.is_alive():
            self._queue.put(_STOP)
            join(self._thread, timeout)

"""Bounded waits for tests: no test waits for a thread, a child process or a queue without a bound (a hang fails
the test instead of the run)."""

from __future__ import annotations

import os
import signal
import threading
import time

#: The default bound: generous, far past any expected wait.
BOUND = 60.0


def wait_child(pid: int, timeout: float = BOUND) -> int:
    """The exit code of forked child ``pid``; past ``timeout`` seconds it is killed and the test fails."""
    deadline = time.monotonic() + timeout
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return os.waitstatus_to_exitcode(status)
        if time.monotonic() >= deadline:
            os.kill(pid, signal.SIGKILL)
            reaped = time.monotonic() + 10
            while not os.waitpid(pid, os.WNOHANG)[0] and time.monotonic() < reaped:  # killed: reaped soon
                time.sleep(0.01)
            raise AssertionError(f"child {pid} still running after {timeout} s: killed")
        time.sleep(0.005)


def join(thread: threading.Thread, timeout: float = BOUND) -> None:
    """Join ``thread``; still alive after ``timeout`` seconds, the test fails."""
    thread.join(timeout)
    assert not thread.is_alive(), f"thread {thread.name} still running after {timeout} s"


def readable(fd: int, timeout: float) -> bool:
    """Whether ``fd`` has something to read within ``timeout`` seconds (``poll``: any descriptor number, where
    ``select`` refuses those past 1023, which a long test run reaches)."""
    import select

    poller = select.poll()
    poller.register(fd, select.POLLIN)
    return bool(poller.poll(max(0.0, timeout) * 1000))

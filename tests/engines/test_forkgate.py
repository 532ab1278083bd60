"""The fork gate (hostedrooms.forkgate): a fork waits for the threads inside the driver to leave, at most
FORK_PAUSE (then it goes ahead with a warning); a fork from inside does not wait for itself; the child starts with
an open gate."""

from __future__ import annotations

import logging
import os
import threading
import time

import pytest
from waits import join, wait_child

from hostedrooms import forkgate

pytestmark = [
    pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork"),
    pytest.mark.filterwarnings("ignore:This process .* is multi-threaded:DeprecationWarning"),
]


class Inside:
    """A thread that holds the gate for ``seconds``, and says whether it had left."""

    def __init__(self, seconds: float) -> None:
        self.entered = threading.Event()
        self.left = False
        self.thread = threading.Thread(target=self._run, args=(seconds,), daemon=True)
        self.thread.start()
        assert self.entered.wait(30)

    def _run(self, seconds: float) -> None:
        with forkgate.inside_driver():
            self.entered.set()
            time.sleep(seconds)
            self.left = True


def fork_and_report(check: bool) -> int:
    """Fork a child that exits 0 if ``check`` (evaluated in the child) held, and can enter the gate itself."""
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            with forkgate.inside_driver():  # the child's gate is open: the parent's thread is not here
                code = 0 if check else 2
        finally:
            os._exit(code)
    return wait_child(pid, 60)


def test_a_fork_waits_for_the_threads_inside_to_leave() -> None:
    inside = Inside(0.3)
    pid = os.fork()
    if pid == 0:
        os._exit(0 if inside.left else 2)  # forked only once it had left
    assert wait_child(pid, 60) == 0
    join(inside.thread)


def test_a_fork_goes_ahead_after_the_pause_with_a_warning(monkeypatch: pytest.MonkeyPatch,
                                                          caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.setattr(forkgate, "FORK_PAUSE", 0.1)
    caplog.set_level(logging.WARNING, logger="hostedrooms.forkgate")
    inside = Inside(3.0)
    started = time.monotonic()
    pid = os.fork()
    if pid == 0:
        os._exit(0 if not inside.left else 2)  # the thread was still inside
    forked = time.monotonic() - started
    assert wait_child(pid, 60) == 0
    assert forked < 2.5  # did not wait for the thread (a generous bound)
    messages = [record.getMessage() for record in caplog.records]
    assert len(messages) == 1 and messages[0].startswith("fork() went ahead with 1 thread(s)"), messages
    join(inside.thread)


def test_a_fork_from_inside_does_not_wait_for_itself() -> None:
    started = time.monotonic()
    with forkgate.inside_driver(), forkgate.inside_driver():  # reentrant
        code = fork_and_report(True)
    assert code == 0
    assert time.monotonic() - started < forkgate.FORK_PAUSE / 2  # not the pause (a generous bound)


def test_threads_enter_again_after_a_fork() -> None:
    assert fork_and_report(True) == 0
    inside = Inside(0.0)
    join(inside.thread)
    assert inside.left

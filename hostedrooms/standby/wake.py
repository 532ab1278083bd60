"""When a following replicator runs its next pass: the wake-up hook.

A :class:`Waker` is armed before each pass (it notes the source's state) and then waited on: ``wait`` returns
as soon as the source may have changed since ``arm``, when ``timeout`` passes, or when ``stop`` is set. Arming
before the pass means a commit that lands while the pass runs still wakes the next one.

Shipped: :class:`IntervalWaker` (passes at an interval) and :class:`PollingWaker` (polls a cheap change token,
such as :meth:`EnginePageSource.change_token`: SQLite's ``PRAGMA data_version``, or sums over the rooms table on
PostgreSQL). A push-based waker plugs in the same way: on PostgreSQL ``LISTEN`` in ``arm`` (notifications sent
by appending transactions arrive on commit) and wait for one in ``wait``; or, once ``follow()`` exists, a thread
that follows the source's logs and sets an event. The replicator needs nothing else from it.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Hashable
from typing import Protocol, runtime_checkable

__all__ = ["IntervalWaker", "PollingWaker", "Waker"]


@runtime_checkable
class Waker(Protocol):
    """Tells a following replicator when to run its next pass."""

    def arm(self) -> None:
        """Note the source's state now: a later :meth:`wait` returns once it has changed."""
        ...

    def wait(self, timeout: float, stop: threading.Event) -> bool:
        """Block until the source may have changed since :meth:`arm` (True), ``timeout`` seconds pass or ``stop``
        is set (False).

        :param timeout: the longest wait, in seconds.
        :param stop: ends the wait when set.
        :returns: True when the source may have changed, False on ``timeout`` or ``stop``.
        """
        ...


class IntervalWaker:
    """No change detection: every pass waits the whole interval (any source, including one that cannot tell)."""

    def arm(self) -> None:
        pass

    def wait(self, timeout: float, stop: threading.Event) -> bool:
        stop.wait(max(0.0, timeout))
        return False


class PollingWaker:
    """Polls ``probe`` every ``poll_interval`` seconds and wakes when its value differs from the armed one.

    A probe answering None cannot tell; the waker then waits out the timeout like :class:`IntervalWaker`.

    :param probe: returns a value that changes when the source does, or None when it cannot tell.
    :param poll_interval: seconds between probes (above 0).
    :param monotonic: returns monotonic seconds.
    :raises ValueError: ``poll_interval`` is not positive.
    """

    def __init__(self, probe: Callable[[], Hashable | None], *, poll_interval: float = 0.01,
                 monotonic: Callable[[], float] = time.monotonic) -> None:
        if not poll_interval > 0:
            raise ValueError("poll_interval must be positive")
        self.probe = probe
        self.poll_interval = poll_interval
        self._monotonic = monotonic
        self._armed: Hashable | None = None

    def arm(self) -> None:
        self._armed = self.probe()

    def wait(self, timeout: float, stop: threading.Event) -> bool:
        deadline = self._monotonic() + max(0.0, timeout)
        while True:
            remaining = deadline - self._monotonic()
            if remaining <= 0:
                return False
            if self._armed is None:
                stop.wait(remaining)
                return False
            if stop.wait(min(self.poll_interval, remaining)):
                return False
            if self.probe() != self._armed:
                return True

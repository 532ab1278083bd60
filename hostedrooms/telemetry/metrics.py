"""The metrics recorded from inside services: one call each, nothing when nothing records.

The instruments themselves are :class:`~.instruments.Instruments`; the per-call durations and conflicts are
recorded by the span wrapper (:mod:`.spans`), the standby's pass metrics by :mod:`hostedrooms.standby.lag`.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any, Protocol

from .attributes import RETRY_KIND
from .providers import current

__all__ = ["count_appended", "count_retry", "follow_woke"]


class _Sized(Protocol):
    @property
    def event_id(self) -> str: ...

    @property
    def size(self) -> int: ...


def count_appended(events: Iterable[_Sized], written: Iterable[Mapping[str, Any]]) -> None:
    """Count the events an append wrote (not its replays) and their accounted bytes (``PreparedEvent.size``).

    :param events: the events the append was given.
    :param written: the rows it wrote.
    """
    signals = current()
    if signals is None or signals.instruments is None:
        return
    fresh = {row["event_id"] for row in written}
    sizes = [event.size for event in events if event.event_id in fresh]
    if sizes:
        signals.instruments.events_appended.add(len(sizes))
        signals.instruments.bytes_appended.add(sum(sizes))


def count_retry(kind: str) -> None:
    """Count one retry: ``kind`` is ``room_write.full_path``, ``room_write.exclusive`` or ``ledger``.

    :param kind: the retry's kind.
    """
    signals = current()
    if signals is not None and signals.instruments is not None:
        signals.instruments.retries.add(1, {RETRY_KIND: kind})


def follow_woke(page: Mapping[str, Any], wall_clock: Callable[[], float] = time.time) -> None:
    """Record follow()'s wake-up latency: now minus the ``created_at`` of the first event read after a wait.

    :param page: the first page read after the wait.
    :param wall_clock: returns the time in Unix seconds.
    """
    signals = current()
    if signals is None or signals.instruments is None:
        return
    events = page.get("events") or ()
    created = events[0].get("created_at") if events else None
    if isinstance(created, (int, float)) and not isinstance(created, bool):
        signals.instruments.follow_wakeup.record(max(0.0, wall_clock() - float(created)))

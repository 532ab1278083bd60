"""The standby's replica lag and pass metrics: :class:`LagBook`, and what a traced pass records.

A :class:`LagBook` keeps each room's lag as a replicator last saw it; the Prometheus endpoint
(:mod:`hostedrooms.standby.metrics`) keeps one of its own, and OpenTelemetry keeps one per live replicator
(:func:`lag_book`), fed by :func:`record_pass` (the ``on_result`` of ``Replicator.sync_once``'s span) and read by
the ``hostedrooms.replica.lag.*`` gauges, which this module feeds through
:func:`hostedrooms.telemetry.observe_gauge`.
"""

from __future__ import annotations

import threading
import time
import weakref
from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING, Any

from ..telemetry import LAG_SECONDS, LAG_SEQS, Signals, observe_gauge, store_attributes
from ..telemetry.attributes import EVENTS, OUTCOME, ROOM

if TYPE_CHECKING:
    from . import PassReport, Replicator

__all__ = ["LagBook", "lag_book", "pass_attributes", "record_pass"]


class LagBook:
    """Each room's replica lag as a replicator last saw it: seqs behind, and the seconds since the replicator
    first saw the room behind without a pass catching it up since (0 when caught up).

    The source states no commit times, so the seconds are measured on this process's ``monotonic`` clock from
    the first pass that saw the room's source ahead of its replica: a lower bound of the age of the oldest
    event the replica lacks. Fed with each :class:`~hostedrooms.standby.PassReport` (:meth:`update`).
    """

    def __init__(self, monotonic: Callable[[], float] = time.monotonic) -> None:
        self._monotonic = monotonic
        self._lock = threading.Lock()
        self._seqs: dict[str, int] = {}
        self._behind_since: dict[str, float] = {}

    def update(self, rooms: Iterable[tuple[str, int]], *, complete: bool) -> None:
        """Record ``(room_id, lag)`` pairs from one pass; ``complete`` (the pass saw every room): forget rooms
        it did not report (purged or no longer listed)."""
        now = self._monotonic()
        with self._lock:
            seen: set[str] = set()
            for room_id, lag in rooms:
                seen.add(room_id)
                self._seqs[room_id] = lag
                if lag <= 0:
                    self._behind_since.pop(room_id, None)
                else:
                    self._behind_since.setdefault(room_id, now)
            if complete:
                for room_id in set(self._seqs) - seen:
                    self._seqs.pop(room_id, None)
                    self._behind_since.pop(room_id, None)

    def snapshot(self) -> dict[str, tuple[int, float]]:
        """Each room's ``(seqs behind, seconds behind)`` now."""
        now = self._monotonic()
        with self._lock:
            return {room_id: (lag, max(0.0, now - self._behind_since[room_id]) if room_id in self._behind_since
                              else 0.0) for room_id, lag in self._seqs.items()}


#: Each replicator's lag (read by the ``hostedrooms.replica.lag.*`` gauges), timed on its own ``monotonic``.
_lag_books: weakref.WeakKeyDictionary[Replicator, LagBook] = weakref.WeakKeyDictionary()
_lock = threading.Lock()


def lag_book(replicator: Replicator) -> LagBook:
    """The lag ``replicator``'s passes reported while something recorded (created on first use)."""
    with _lock:
        book = _lag_books.get(replicator)
        if book is None:
            book = _lag_books[replicator] = LagBook(replicator.monotonic)
        return book


def record_pass(signals: Signals, args: tuple[Any, ...], report: PassReport) -> None:
    """A standby pass ended (``on_result`` of ``Replicator.sync_once``): its duration, failure and lag."""
    lag_book(args[0]).update(((room.room_id, room.lag) for room in report.rooms),
                             complete=not report.error and not report.bound)
    instruments = signals.instruments
    if instruments is None:
        return
    instruments.pass_duration.record(report.seconds)
    if report.error:
        instruments.pass_failures.add(1)


def pass_attributes(report: PassReport) -> dict[str, Any]:
    """A pass span's attributes: counts and the outcome (never the error text: it may name the source)."""
    outcome = "error" if report.error else "bound" if report.bound else "ok" if report.ok else "refused"
    return {OUTCOME: outcome, "hostedrooms.standby.rooms": len(report.rooms), EVENTS: report.events,
            "hostedrooms.standby.lag": report.lag}


def _observations(index: int) -> list[tuple[float, Mapping[str, Any]]]:
    observations: list[tuple[float, Mapping[str, Any]]] = []
    for replicator, book in list(_lag_books.items()):
        base = store_attributes(replicator.target)
        observations.extend((values[index], {**base, ROOM: room_id}) for room_id, values in book.snapshot().items())
    return observations


observe_gauge(LAG_SEQS, lambda: _observations(0))
observe_gauge(LAG_SECONDS, lambda: _observations(1))

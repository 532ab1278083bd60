"""What limits a replicator: its options (:class:`ReplicatorOptions`), the bounds of one pass (:class:`PassBounds`),
and the back-off of refused rooms (:class:`Backoff`).

A pass is bounded (``max_rooms_per_pass``, ``max_pages_per_pass``, ``max_bytes_per_pass``,
``max_seconds_per_pass``; the defaults follow from what a real source can hold): when a bound is reached the pass
ends with ``PassReport.bound`` saying which, and the next pass resumes the listing after the last room finished, so
a source whose listing never ends costs one bounded pass at a time.

A refused room (a conflict, a regression, a fork, a hostile page) is backed off (1 s, doubling to 5 min): never
retried in a hot loop.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass

from ..errors import HostedRoomError, StoreConfigurationError, StoreUnavailableError
from ..limits import Limits, in_force
from ..validation import INT64_MAX, bounded_int
from .source import SourceUnavailableError

__all__ = ["DEFAULT_MAX_SECONDS_PER_PASS", "PASS_ERRORS", "Backoff", "BoundReached", "PassBounds",
           "ReplicatorOptions"]

#: Errors that end a pass (the store or the source is unreachable or unusable): retried by the next pass, and
#: never charged to a room.
PASS_ERRORS = (StoreUnavailableError, StoreConfigurationError, SourceUnavailableError)

#: Seconds one pass may take by default (a real source's rooms fit in far less; a slower one resumes next pass).
DEFAULT_MAX_SECONDS_PER_PASS = 600.0


@dataclass(frozen=True, slots=True)
class ReplicatorOptions:
    """A :class:`~hostedrooms.standby.Replicator`'s options, validated when made (see the Replicator's docstring
    for each; a bad one raises HostedRoomError naming it)."""

    page_limit: int = 500
    max_pages_per_room: int | None = None
    workers: int = 1
    prune_disbanded_after: int | None = None
    max_rooms_per_pass: int | None = None
    max_pages_per_pass: int | None = None
    max_bytes_per_pass: int | None = None
    max_seconds_per_pass: float | None = DEFAULT_MAX_SECONDS_PER_PASS

    def __post_init__(self) -> None:
        prune = self.prune_disbanded_after
        if prune is not None:  # exactly an int, as prune_disbanded_replicas takes it (never a subclass)
            bounded_int(prune if type(prune) is int else None, error=HostedRoomError, low=0, high=INT64_MAX,
                        message="prune_disbanded_after must be a non-negative integer (seconds) or None")
        bounded_int(self.page_limit, error=HostedRoomError, low=1, message="page_limit must be a positive integer")
        for name, value in (("max_pages_per_room", self.max_pages_per_room),
                            ("max_rooms_per_pass", self.max_rooms_per_pass),
                            ("max_pages_per_pass", self.max_pages_per_pass),
                            ("max_bytes_per_pass", self.max_bytes_per_pass)):
            if value is not None:
                bounded_int(value, error=HostedRoomError, low=1, message=f"{name} must be a positive integer or None")
        seconds = self.max_seconds_per_pass
        if seconds is not None and (isinstance(seconds, bool) or not isinstance(seconds, (int, float))
                                    or not 0 < seconds < float("inf")):
            raise HostedRoomError("max_seconds_per_pass must be a positive number of seconds or None")
        bounded_int(self.workers, error=HostedRoomError, low=1, high=64,
                    message="workers must be an integer from 1 to 64")


class BoundReached(Exception):
    """The pass reached one of its bounds (the message says which)."""


class PassBounds:
    """What one pass may still spend: rooms listed, pages and bytes read, time (shared by the workers)."""

    def __init__(self, rooms: int, pages: int, size: int, deadline: float, monotonic: Callable[[], float]) -> None:
        self.rooms, self.pages, self.size, self.deadline = rooms, pages, size, deadline
        self._monotonic = monotonic
        self._lock = threading.Lock()
        self.reached = ""  # the first bound reached ("" while none)

    @classmethod
    def start(cls, options: ReplicatorOptions, limits: Limits | None,
              monotonic: Callable[[], float]) -> PassBounds:
        """The bounds of a pass starting now: the options', or the defaults that follow from ``limits``: every
        room a source can hold (MAX_ACTIVE_ROOMS + MAX_DISBANDED_ROOM_TOMBSTONES), the pages of that many full
        rooms, twice a source's whole event budget (MAX_GATEWAY_EVENT_BYTES, re-reads included)."""
        lim = in_force(limits)
        rooms = options.max_rooms_per_pass or int(lim.MAX_ACTIVE_ROOMS) + int(lim.MAX_DISBANDED_ROOM_TOMBSTONES)
        full_room = -(-(int(lim.MAX_EVENTS_PER_ROOM) + int(lim.CONTROL_EVENT_COUNT_RESERVE)) // options.page_limit) + 2
        pages = options.max_pages_per_pass or rooms * full_room
        size = options.max_bytes_per_pass or 2 * int(lim.MAX_GATEWAY_EVENT_BYTES)
        seconds = options.max_seconds_per_pass
        deadline = float("inf") if seconds is None else monotonic() + seconds
        return cls(rooms, pages, size, deadline, monotonic)

    def _stop(self, reason: str) -> None:
        with self._lock:
            self.reached = self.reached or reason
        raise BoundReached(self.reached)

    def check(self) -> None:
        """Raise BoundReached once a bound was reached (or the time is up)."""
        if self.reached:
            raise BoundReached(self.reached)
        if self._monotonic() >= self.deadline:
            self._stop("the pass took its time limit (max_seconds_per_pass)")

    def charge_room(self) -> None:
        """Charge one listed room. The room bound ends the listing only: rooms listed before it are still handled
        (so it never sets ``reached``, which stops the rooms not yet started)."""
        self.check()
        with self._lock:
            self.rooms -= 1
            left = self.rooms
        if left < 0:
            raise BoundReached("the source listed more rooms than a pass takes (max_rooms_per_pass)")

    def charge_page(self) -> None:
        """Charge one page about to be read."""
        self.check()
        with self._lock:
            self.pages -= 1
            left = self.pages
        if left < 0:
            self._stop("the pass read its page limit (max_pages_per_pass)")

    def charge_bytes(self, size: int) -> None:
        """Charge a page's bytes once read: past the bound, the rooms not yet started are stopped (this page is
        still stored)."""
        with self._lock:
            self.size -= size
            left = self.size
        if left < 0:
            with self._lock:
                self.reached = self.reached or "the pass read its byte limit (max_bytes_per_pass)"


class Backoff:
    """Per-room back-off after a refusal: ``base`` seconds, doubling per consecutive refusal up to ``maximum``.

    At most ``max_rooms`` rooms are remembered (the oldest refusal is forgotten first), so a source listing
    ever new rooms to refuse cannot grow it.

    :param base: the first delay, in seconds.
    :param maximum: the longest delay, in seconds.
    :param max_rooms: the most rooms remembered.
    """

    def __init__(self, base: float = 1.0, maximum: float = 300.0, *, max_rooms: int = 4096) -> None:
        self.base, self.maximum, self.max_rooms = base, maximum, max_rooms
        self._rooms: dict[str, tuple[int, float, str]] = {}  # room -> (refusals, retry at, reason)
        self._lock = threading.Lock()  # a replicator's workers share it

    def refuse(self, room_id: str, reason: str, now: float) -> float:
        """Record a refusal; return the delay before the room is read again.

        :param room_id: the room refused.
        :param reason: why, for the pass's report.
        :param now: the time, in the replicator's monotonic seconds.
        :returns: the delay, in seconds.
        """
        with self._lock:
            failures = self._rooms.pop(room_id, (0, 0.0, ""))[0] + 1
            delay = float(min(self.maximum, self.base * 2.0 ** min(failures - 1, 30)))
            self._rooms[room_id] = (failures, now + delay, reason)
            while len(self._rooms) > self.max_rooms:
                del self._rooms[next(iter(self._rooms))]
        return delay

    def waiting(self, room_id: str, now: float) -> tuple[float, str] | None:
        """(seconds left, reason) while the room is backed off, else None.

        :param room_id: the room.
        :param now: the time, in the replicator's monotonic seconds.
        :returns: ``(seconds left, reason)``, or None when the room may be read.
        """
        with self._lock:
            entry = self._rooms.get(room_id)
        if entry is None or entry[1] <= now:
            return None
        return float(entry[1] - now), str(entry[2])

    def clear(self, room_id: str) -> None:
        with self._lock:
            self._rooms.pop(room_id, None)

    def keep_only(self, room_ids: set[str]) -> None:
        """Forget rooms the source no longer lists (bounded by the rooms of one listing).

        :param room_ids: the rooms the source still lists.
        """
        with self._lock:
            for room_id in [room for room in self._rooms if room not in room_ids]:
                del self._rooms[room_id]

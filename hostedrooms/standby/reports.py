"""What a replicator pass reports: each room's status (:class:`RoomReport`), the pass's (:class:`PassReport`), each
stored page (:class:`PageIngested`), and the log lines of both (:func:`log_room`, :func:`log_pass`).

The records go to the ``hostedrooms.standby.replicator`` logger (hostedrooms.logs: an event name and structured
fields; never a page's events).
"""

from __future__ import annotations

import logging
from collections import Counter
from dataclasses import dataclass, field

from .reclaim import FENCED, RECLAIMED

__all__ = [
    "BACKING_OFF",
    "BEHIND",
    "CAUGHT_UP",
    "DEMOTED",
    "DISBANDED",
    "GONE",
    "LOCAL",
    "REFUSED",
    "SKIPPED",
    "PageIngested",
    "PassReport",
    "RoomReport",
    "log_pass",
    "log_room",
]

# The replicator's logger, by its documented name (the records were always the replicator's).
_log = logging.getLogger("hostedrooms.standby.replicator")

#: The replica holds everything the source reported.
CAUGHT_UP = "caught-up"
#: The replica is still behind (the page budget of the pass ran out, or the source kept appending).
BEHIND = "behind"
#: A page or the room was refused this pass (see ``reason``); the room is backed off.
REFUSED = "refused"
#: Refused earlier; not read again until its back-off ends.
BACKING_OFF = "backing-off"
#: The disband is replicated; the room is no longer followed.
DISBANDED = "disbanded"
#: The local authoritative store holds this room: never replicated over.
LOCAL = "local"
#: The source showed a newer lineage and this gateway's local room was demoted.
DEMOTED = "demoted"
#: The room vanished from the source between listing and reading (purged).
GONE = "gone"
#: Not replicated: disbanded on the source before this replica ever existed.
SKIPPED = "skipped"


@dataclass
class RoomReport:
    """What one pass did for one room."""

    room_id: str
    status: str
    pages: int = 0
    events: int = 0
    last_seq: int = 0  # the replica's stored seq after this pass (0: no replica)
    latest_seq: int = 0  # the source's latest seq, as last seen
    authority_gateway_id: str = ""  # the source's lineage, as last seen
    authority_epoch: int = 0
    reason: str = ""

    @property
    def lag(self) -> int:
        """Events the source holds that the replica does not (0 for rooms that are not replicated)."""
        if self.status in (LOCAL, DEMOTED, GONE, SKIPPED, RECLAIMED, FENCED):
            return 0
        return max(0, self.latest_seq - self.last_seq)


@dataclass
class PassReport:
    """One pass over every room of the source."""

    rooms: list[RoomReport] = field(default_factory=list)
    seconds: float = 0.0
    error: str = ""  # the pass stopped early: the source or the local store could not be used
    pruned: list[str] = field(default_factory=list)  # disbanded replicas removed after this pass
    bound: str = ""  # the pass stopped at one of its bounds (which one); the next pass resumes the listing

    @property
    def pages(self) -> int:
        return sum(room.pages for room in self.rooms)

    @property
    def events(self) -> int:
        return sum(room.events for room in self.rooms)

    @property
    def lag(self) -> int:
        return sum(room.lag for room in self.rooms)

    def count(self, status: str) -> int:
        return sum(1 for room in self.rooms if room.status == status)

    @property
    def ok(self) -> bool:
        """No pass error, no bound reached (every room of the source was looked at) and no room refused (or still
        backing off)."""
        return not self.error and not self.bound and not any(
            room.status in (REFUSED, BACKING_OFF) for room in self.rooms)

    def summary(self) -> str:
        counts = Counter(room.status for room in self.rooms)
        parts = ", ".join(f"{counts[status]} {status}" for status in (
            CAUGHT_UP, BEHIND, REFUSED, BACKING_OFF, DISBANDED, LOCAL, DEMOTED, GONE, SKIPPED, RECLAIMED, FENCED)
            if counts[status])
        text = (f"{_count(len(self.rooms), 'room')} ({parts or 'none'}); {_count(self.events, 'event')} in "
                f"{_count(self.pages, 'page')}; lag {_count(self.lag, 'event')}; {self.seconds:.2f} s")
        if self.pruned:
            text += f"; {_count(len(self.pruned), 'disbanded replica')} removed"
        if self.bound:
            text += f"; stopped at a bound: {self.bound}"
        return f"{text}; stopped early: {self.error}" if self.error else text


def _count(number: int, noun: str) -> str:
    return f"{number:,} {noun}{'' if number == 1 else 's'}"


@dataclass(frozen=True, slots=True)
class PageIngested:
    """Given to ``on_page`` after each stored page (``monotonic`` is when ``ingest_page`` returned)."""

    room_id: str
    first_seq: int  # the first newly stored seq (0 when the page stored nothing new)
    last_seq: int  # the replica's stored seq after the page
    events: int
    latest_seq: int
    monotonic: float


_ROOM_EVENTS = {
    REFUSED: ("replicate.room_refused", logging.WARNING), DEMOTED: ("replicate.room_demoted", logging.WARNING),
    GONE: ("replicate.room_gone", logging.INFO), DISBANDED: ("replicate.room_disbanded", logging.DEBUG)}


def log_room(room: RoomReport) -> None:
    """A room whose pass changed its standing (refused, demoted here, gone from the source, disbanded) or that
    ingested events (debug)."""
    event, level = _ROOM_EVENTS.get(room.status, ("replicate.room", logging.DEBUG) if room.events else ("", 0))
    if event and _log.isEnabledFor(level):
        _log.log(level, "room %s %s: %s", room.room_id, room.status, room.reason, extra={
            "event": event, "room": room.room_id, "gateway": room.authority_gateway_id or None,
            "epoch": room.authority_epoch or None, "last_seq": room.last_seq, "latest_seq": room.latest_seq,
            "events": room.events, "reason": room.reason or None})


def log_pass(report: PassReport) -> None:
    """One pass: a warning when it stopped early, info when it moved events or left rooms behind, else debug."""
    level = (logging.WARNING if report.error else logging.INFO
             if report.events or report.bound or not report.ok else logging.DEBUG)
    if _log.isEnabledFor(level):
        _log.log(level, "replicate pass: %s", report.summary(), extra={
            "event": "replicate.pass", "rooms": len(report.rooms), "events": report.events, "pages": report.pages,
            "lag": report.lag, "behind": report.count(BEHIND), "refused": report.count(REFUSED),
            "demoted": report.count(DEMOTED), "seconds": round(report.seconds, 3), "error": report.error or None,
            "bound": report.bound or None, "pruned": len(report.pruned)})

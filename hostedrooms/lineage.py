"""A store's lineage: which copy of a history a reader has been reading, and what to do when it changes.

PostgreSQL's streaming replication copies a primary's history to a standby; promoting the standby starts a new
timeline. With asynchronous replication the promoted standby may lack commits the old primary acknowledged,
and its next appends then reuse their seqs for other events: the log stays contiguous and ``verify`` clean, but a
reader that had read the lost events would silently read different ones at the same seqs. Every store
therefore has a lineage (:meth:`hostedrooms.backends.Backend.lineage`): ``postgresql:SYSTEM_ID:TIMELINE``
on PostgreSQL (it changes with every promotion and point-in-time restore), the constant ``sqlite`` on SQLite (a
file is never promoted). ``read_events`` pages carry it (``lineage``), and so do ``follow()``'s cursor, the
standby :class:`~hostedrooms.standby.Replicator`'s state and the HTTP page source.

A lineage change alone is no error: most promotions (synchronous replication, a clean switchover) lose nothing.
A reader that sees one checks the last event it had read, in the store as it is now: same seq, event id and
content, and it goes on; gone or different, and it gets :class:`~hostedrooms.errors.StoreLineageError` (the
Replicator refuses the room) instead of silently different events.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from .errors import HostedRoomError, StoreLineageError

__all__ = ["MAX_LINEAGE_CHARS", "check_lineage", "lost_event", "same_event"]

#: The longest lineage accepted from a source (PostgreSQL's is about 40 characters).
MAX_LINEAGE_CHARS = 128
_LINEAGE = re.compile(r"[A-Za-z0-9][A-Za-z0-9:._-]*")
#: The fields that make two events the same event.
_IDENTITY = ("seq", "event_id", "kind", "actor", "authority_epoch", "payload")


def check_lineage(value: Any, *, error: type[HostedRoomError] = HostedRoomError, label: str = "lineage") -> str:
    """``value`` if it is a lineage (ASCII letters and digits, then also ``:._-``, at most
    :data:`MAX_LINEAGE_CHARS`); ``error`` naming ``label`` otherwise (a value from outside is never trusted)."""
    if (not isinstance(value, str) or len(value) > MAX_LINEAGE_CHARS or not value.isascii()
            or _LINEAGE.fullmatch(value) is None):
        raise error(f"{label} must be ASCII letters, digits and ':._-', at most {MAX_LINEAGE_CHARS} characters")
    return value


def same_event(found: Mapping[str, Any], seen: Mapping[str, Any]) -> bool:
    """Whether ``found`` (read now) is the event ``seen`` (read before): the same seq, event id and content
    (kind, actor, epoch, payload)."""
    return all(found.get(name) == seen.get(name) for name in _IDENTITY)


def lost_event(room_id: str, seen: Mapping[str, Any], found: Mapping[str, Any] | None, *, previous: str | None,
               current: str | None) -> StoreLineageError:
    """The error for a reader whose last seen event ``seen`` is gone (``found`` None) or different now."""
    seq = int(seen["seq"])
    what = "is gone" if found is None else f"holds another event ({found.get('event_id')!r})"
    change = f" (lineage {previous} -> {current})" if previous != current else ""
    return StoreLineageError(
        f"hosted room {room_id!r}: the store's history changed{change} and its seq {seq}, where this reader last "
        f"read event {seen.get('event_id')!r}, {what}: events it read were lost (a standby that lacked them was "
        "promoted, or an older copy restored); reconcile before reading on", room_id=room_id, seq=seq,
        previous=previous, current=current)

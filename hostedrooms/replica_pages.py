"""Checking a replay page a source returned, before any use: :func:`validate_page` (pure, no store).

A replica stores what the authority stored, so a page is held to the authority's own rules for every field and
event, and to its own consistency (``cursor``, ``has_more`` and ``latest_seq`` against its events).
:func:`hostedrooms.replicas.ingest_page` and the standby's replicator take the :class:`CheckedPage` it returns.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from .errors import HostedRoomError, ReplicaError, ReplicaGapError
from .limits import Limits, in_force
from .lineage import check_lineage
from .records import Authority
from .rooms import CONTROL_EVENT_KINDS, PreparedEvent
from .rooms import rules as room_rules
from .validation import MAX_EPOCH, bounded_int, canonical_json, identifier

__all__ = ["CheckedEvent", "CheckedPage", "validate_page"]

#: The largest value a BIGINT column holds (seqs, epochs).
MAX_INT64 = 2**63 - 1


def positive_int64(value: Any, message: str) -> int:
    return bounded_int(value, error=ReplicaError, message=message, low=1, high=MAX_INT64)


def checked_epoch(value: Any, label: str, high: int) -> int:
    """A positive epoch of at most ``high``: a replica is promoted at ``epoch + 1`` and a promoted or demoted room
    must still be claimable at ``epoch + 1``, so every epoch stays within MAX_EPOCH after its increment."""
    epoch = positive_int64(value, f"{label} must be a positive integer")
    if epoch > high:
        raise ReplicaError(f"{label} is beyond the largest authority epoch")
    return epoch


@dataclass(frozen=True, slots=True)
class CheckedEvent:
    """One validated page event: its seq, canonical content and timestamp (None: stamped at ingest)."""

    seq: int
    event: PreparedEvent
    created_at: float | None

    def same_content(self, row: Mapping[Any, Any]) -> bool:
        """Whether a stored event row (``actor_json``/``payload_json`` texts) is this event."""
        return row["event_id"] == self.event.event_id and self.event.same_content(row)

    def same_record(self, record: Mapping[str, Any], lim: Limits | None = None) -> bool:
        """Whether an event as ``read_events`` returns it (decoded ``actor``/``payload``) is this event: the same
        seq, id, kind, epoch and canonical content."""
        limits_ = in_force(lim)
        try:
            texts = (canonical_json(record.get("actor"), error=ReplicaError, label="actor",
                                    max_bytes=limits_.MAX_ACTOR_JSON_BYTES),
                     canonical_json(record.get("payload"), error=ReplicaError, label="payload",
                                    max_bytes=limits_.MAX_EVENT_JSON_BYTES))
        except ReplicaError:
            return False
        return (record.get("seq") == self.seq and record.get("event_id") == self.event.event_id
                and (record.get("kind"), texts[0], record.get("authority_epoch"), texts[1])
                == (self.event.kind, self.event.actor_json, self.event.authority_epoch, self.event.payload_json))


@dataclass(frozen=True, slots=True)
class CheckedPage:
    """A validated ``read_events`` page of one room (:func:`validate_page`): what :func:`ingest_page` stores.

    ``latest_seq`` is the page's claim (None when it made none), never below its own last event; ``cursor`` and
    ``has_more`` are None when the page left them out, ``lineage`` too (a source that predates it)."""

    room_id: str
    gateway_id: str
    epoch: int
    events: list[CheckedEvent]
    latest_seq: int | None
    cursor: int | None
    has_more: bool | None
    limits: Limits
    lineage: str | None = None  # the source store's lineage (None: the page carried none)

    @property
    def authority(self) -> Authority:
        return {"gateway_id": self.gateway_id, "epoch": self.epoch}

    @property
    def last_seq(self) -> int | None:
        """The seq of the page's last event (None for an empty page)."""
        return self.events[-1].seq if self.events else None

    @property
    def size(self) -> int:
        """The accounted bytes of the page's events."""
        return sum(event.event.size for event in self.events)


def validate_page(page: Any, *, room_id: str, limits: Limits | None = None) -> CheckedPage:
    """Check ``page`` (a source's ``read_events`` answer for ``room_id``) as :func:`ingest_page` does, without
    touching a store: every field, every event, and that its ``cursor``, ``has_more`` and ``latest_seq`` agree
    with its events. Raises ReplicaError (or ReplicaGapError) naming the field; nothing of ``page`` is used
    before this returns.

    :param page: a source's ``read_events`` answer for ``room_id``.
    :param room_id: the room the page must be of.
    :param limits: the limits in force; :func:`~hostedrooms.replicas.ingest_page` accepts the result only under
        the same ``limits``.
    :returns: the checked page, ready for :func:`~hostedrooms.replicas.ingest_page`.
    :raises InvalidInputError: ``room_id`` is invalid.
    :raises ReplicaGapError: the page's events skip a sequence.
    :raises ReplicaError: a field or an event of the page is invalid, or the page contradicts itself.
    """
    lim = in_force(limits)
    return check_page(page, room_rules.validate_room_id(room_id, lim), lim)


def _optional_seq(page: Mapping[Any, Any], field: str) -> int | None:
    value = page.get(field)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_INT64:
        raise ReplicaError(f"page.{field} must be an integer from 0 to 2**63-1")
    return value


def check_page(page: Any, room_id: str, lim: Limits) -> CheckedPage:
    """The reference's page checks, then everything the store relies on (ingest stores nothing unchecked): events
    of this room only, epochs within 1..the page's epoch, JSON-serialisable bounded actor and payload, unique
    event ids; and a claim its own events and cursor support (a ``latest_seq`` below its last event, a ``cursor``
    other than its last event, or a ``has_more`` other than ``cursor < latest_seq`` is a page no authority
    serves)."""
    if not isinstance(page, dict):
        raise ReplicaError("page must be an object")
    raw_events = page.get("events")
    authority = page.get("authority")
    if not isinstance(raw_events, list):
        raise ReplicaError("page.events must be a list")
    if len(raw_events) > lim.MAX_LOG_LIMIT:
        raise ReplicaError(f"page.events holds more than {lim.MAX_LOG_LIMIT} events")
    if not isinstance(authority, dict):
        raise ReplicaError("page.authority is required for replication")
    gateway_id = identifier(authority.get("gateway_id"), error=ReplicaError, label="page.authority.gateway_id",
                            max_chars=lim.MAX_ACTOR_ID_CHARS)
    # Promotion writes epoch + 1, which must itself stay claimable.
    epoch = checked_epoch(authority.get("epoch"), "page.authority.epoch", MAX_EPOCH - 1)
    events: list[CheckedEvent] = []
    seen_ids: set[str] = set()
    for raw in raw_events:
        event = _validate_event(raw, room_id, epoch, lim)
        if events and event.seq != events[-1].seq + 1:
            raise ReplicaGapError("page events must be contiguous")
        if event.event.event_id in seen_ids:
            raise ReplicaError("page events repeat an event_id")
        seen_ids.add(event.event.event_id)
        events.append(event)
    latest = page.get("latest_seq")
    if isinstance(latest, int) and not isinstance(latest, bool) and latest > MAX_INT64:
        raise ReplicaError("page.latest_seq is out of range")
    latest_seq = _optional_seq(page, "latest_seq")
    cursor = _optional_seq(page, "cursor")
    has_more = page.get("has_more")
    if has_more is not None and not isinstance(has_more, bool):
        raise ReplicaError("page.has_more must be a boolean")
    last = events[-1].seq if events else None
    if last is not None and latest_seq is not None and latest_seq < last:
        raise ReplicaError("page.latest_seq is below the page's own last event")
    if last is not None and cursor is not None and cursor != last:
        raise ReplicaError("page.cursor is not the page's last event")
    if cursor is not None and latest_seq is not None:
        if cursor > latest_seq:
            raise ReplicaError("page.cursor is beyond page.latest_seq")
        if has_more is not None and has_more != (cursor < latest_seq):
            raise ReplicaError("page.has_more contradicts page.cursor and page.latest_seq")
    lineage = page.get("lineage")
    if lineage is not None:
        check_lineage(lineage, error=ReplicaError, label="page.lineage")
    return CheckedPage(room_id, gateway_id, epoch, events, latest_seq, cursor, has_more, lim, lineage)


def _validate_event(raw: Any, room_id: str, page_epoch: int, lim: Limits) -> CheckedEvent:
    if not isinstance(raw, dict):
        raise ReplicaError("page events must be objects")
    seq = positive_int64(raw.get("seq"), "event.seq must be a positive integer")
    for field in ("event_id", "kind"):
        if not isinstance(raw.get(field), str) or not raw[field]:
            raise ReplicaError(f"event.{field} must be a non-empty string")
    event_id = _authority_rule(room_rules.validate_event_id, raw["event_id"], "event_id", lim)
    kind = _authority_rule(room_rules.validate_event_kind, raw["kind"], "kind", lim)
    if not isinstance(raw.get("actor"), dict):
        raise ReplicaError("event.actor must be an object")
    if "payload" not in raw:
        raise ReplicaError("event.payload is required")
    if raw.get("room_id", room_id) != room_id:
        raise ReplicaError("event.room_id does not match the replicated room")
    event_epoch = raw.get("authority_epoch")
    if event_epoch is not None:
        event_epoch = positive_int64(event_epoch, "event.authority_epoch must be a positive integer")
        if event_epoch > page_epoch:
            raise ReplicaError("event.authority_epoch is newer than the page authority")
    created = _created_at(raw.get("created_at"))
    event = PreparedEvent(
        event_id, kind,
        canonical_json(raw["actor"], error=ReplicaError, label="actor", max_bytes=lim.MAX_ACTOR_JSON_BYTES),
        canonical_json(raw["payload"], error=ReplicaError, label="payload", max_bytes=lim.MAX_EVENT_JSON_BYTES),
        event_epoch, control=kind in CONTROL_EVENT_KINDS)
    # The reference stamps a missing (or zero) created_at with the ingest time.
    return CheckedEvent(seq, event, created if created else None)


def _authority_rule(validate: Any, value: str, field: str, lim: Limits) -> str:
    """``value`` if the authority's own rule for ``field`` accepts it exactly as given (a replica stores what the
    authority stored, so anything the rule would refuse or change could not have come from a hostedrooms log,
    and promotion would make the room unreadable)."""
    try:
        checked = str(validate(value, lim))
    except HostedRoomError as exc:
        raise ReplicaError(f"event.{field}: {exc}") from None
    if checked != value:
        raise ReplicaError(f"event.{field}: invalid {field}")
    return checked


def _created_at(value: Any) -> float | None:
    """A finite float, or None when absent (``10**400`` is refused, not an OverflowError)."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ReplicaError("event.created_at must be a finite number")
    try:
        created = float(value)
    except OverflowError:
        created = math.inf
    if not math.isfinite(created):
        raise ReplicaError("event.created_at must be a finite number")
    return created

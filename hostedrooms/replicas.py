"""Replicas of other gateways' rooms, and the takeover primitives (the native service).

A follower gateway keeps a durable copy of a room it does not own, fed by the authority's ``read_events``
pages (whose ``authority`` stamp proves lineage); when the authority dies, :func:`promote_replica` continues
the room here at ``epoch + 1``, and a returning stale authority fences itself with :func:`demote_room`.

These are storage primitives only: the caller decides *when* a takeover is safe (the previous owner can no
longer commit). What the store guarantees is that history is neither lost nor forked by the primitives:

* :func:`ingest_page` is idempotent (events at or below ``last_seq`` are compared, not rewritten), refuses
  gaps, older epochs, a different owner at the same epoch, overlapping events with different content, a page
  whose ``cursor``, ``has_more`` and ``latest_seq`` contradict its own events, and anything it could not later
  copy into the authoritative log; it never lowers the stored ``latest_seq``, except where the caller proves
  the page newer than the stored claim and no stored event supports that claim (``supersede_latest_seq``);
* :func:`reset_replica_latest` is the operator's recovery of a replica whose stored ``latest_seq`` no source
  can confirm any more (a lie, or a source that is gone);
* :func:`promote_replica` refuses a replica that is not caught up or whose room was disbanded, and goes
  through the same capacity gates as an append (see :class:`hostedrooms.rooms.RoomTransaction`);
* :func:`demote_room` appends ``authority.lost`` through the same fenced append path as every room write.

Concurrency: ingest serialises on the replica row (``FOR UPDATE``; replica creation on an advisory lock, so
MAX_REPLICA_ROOMS is exact). Promotion takes the room-creation lock, then the (absent) room row, then the
replica row, then the gateway budget shard(s) -- the rooms service's lock order with the replica row slotted in
after the room row; ingest never takes a room lock, so no cycle can form.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Engine, Select, delete, exists, func, insert, literal, select, update

from . import models
from .demotion import demote_room
from .engines import EngineSource, resolve_engine
from .errors import (
    HostedRoomError,
    ReplicaCapacityError,
    ReplicaEpochRegressionError,
    ReplicaError,
    ReplicaGapError,
    RoomConflictError,
)
from .identity import local_gateway_id as resolve_local_gateway_id
from .limits import Limits, in_force
from .lineage import check_lineage
from .records import Authority, IngestResult, PromotionResult, ReplayPage, ReplicaState
from .rooms import (
    CONTROL_EVENT_KINDS,
    PreparedEvent,
    RoomTransaction,
    payload_json,
    run_room_write,
    system_actor_json,
)
from .rooms import rules as room_rules
from .telemetry import traced
from .uow import UnitOfWork
from .validation import MAX_EPOCH, bounded_int, canonical_json, clock, identifier, stored_json

# validate_page (with CheckedPage and CheckedEvent) is the replicator's seam, not a service: it returns no record.
__all__ = [
    "REPLICA_CREATION_LOCK_KEY",
    "demote_room",
    "ingest_page",
    "promote_replica",
    "prune_disbanded_replicas",
    "replica_state",
    "reset_replica_latest",
]

#: Advisory lock key ("hosted" + 4) serialising replica creation (exact MAX_REPLICA_ROOMS).
REPLICA_CREATION_LOCK_KEY = 0x686F737465640004
#: The largest value a BIGINT column holds (seqs, epochs).
_MAX_INT64 = 2**63 - 1

_replicas = models.replicas
_replica_events = models.replica_events




def _resolve(engine: EngineSource) -> Engine:
    return resolve_engine(engine)


def _positive_int64(value: Any, message: str) -> int:
    return bounded_int(value, error=ReplicaError, message=message, low=1, high=_MAX_INT64)


def _epoch(value: Any, label: str, high: int) -> int:
    """A positive epoch of at most ``high``: a replica is promoted at ``epoch + 1`` and a promoted or demoted room
    must still be claimable at ``epoch + 1``, so every epoch stays within MAX_EPOCH after its increment."""
    epoch = _positive_int64(value, f"{label} must be a positive integer")
    if epoch > high:
        raise ReplicaError(f"{label} is beyond the largest authority epoch")
    return epoch


# --- page validation (pure) ------------------------------------------------------------------------------------


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
    before this returns."""
    lim = in_force(limits)
    return _validate_page(page, room_rules.validate_room_id(room_id, lim), lim)


def _optional_seq(page: Mapping[Any, Any], field: str) -> int | None:
    value = page.get(field)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= _MAX_INT64:
        raise ReplicaError(f"page.{field} must be an integer from 0 to 2**63-1")
    return value


def _validate_page(page: Any, room_id: str, lim: Limits) -> CheckedPage:
    """The reference's page checks, then everything the store relies on (hole 5): events of this room only,
    epochs within 1..the page's epoch, JSON-serialisable bounded actor and payload, unique event ids; and a
    claim its own events and cursor support (a ``latest_seq`` below its last event, a ``cursor`` other than its
    last event, or a ``has_more`` other than ``cursor < latest_seq`` is a page no authority serves)."""
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
    epoch = _epoch(authority.get("epoch"), "page.authority.epoch", MAX_EPOCH - 1)
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
    if isinstance(latest, int) and not isinstance(latest, bool) and latest > _MAX_INT64:
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
    seq = _positive_int64(raw.get("seq"), "event.seq must be a positive integer")
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
        event_epoch = _positive_int64(event_epoch, "event.authority_epoch must be a positive integer")
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


# --- ingest ------------------------------------------------------------------------------------------------------


@traced("ingest_page")
def ingest_page(
    engine: EngineSource, *, room_id: str, room_name: str, members: list[dict[str, Any]],
    page: ReplayPage | dict[str, Any] | CheckedPage, now: float | None = None, limits: Limits | None = None,
    supersede_latest_seq: int | None = None,
) -> IngestResult:
    """Persist one replay page of ``room_id`` (the verbatim result of the authority's ``read_events``, or what
    :func:`validate_page` returned for it with the same ``limits``).

    Idempotent: events at or below the stored ``last_seq`` are skipped (after checking they are the same
    events). Refuses a page that skips sequences (ReplicaGapError), an older authority epoch
    (ReplicaEpochRegressionError), a different owner at the stored epoch, conflicting overlapping events, or a
    page contradicting itself (ReplicaError); nothing is written then.

    The stored ``latest_seq`` is the largest of the stored one, the replica's last stored seq and the page's
    claim: it never decreases (a delayed page must not make a partial replica look caught up), with one
    exception. ``supersede_latest_seq`` is the stored ``latest_seq`` the caller saw *before it read* ``page``:
    when the replica still holds exactly that value and no stored event supports it (it is above ``last_seq``),
    the page was served after that claim was stored, so an authority's log only grew since; a lower claim then
    proves the stored one false, and ``latest_seq`` becomes the larger of the page's claim and the replica's last
    seq. (A source that lies once can thus not keep a replica from ever being caught up.)
    """
    lim = in_force(limits)
    room_id = room_rules.validate_room_id(room_id, lim)
    room_name = room_rules.validate_room_name(room_name, lim)
    _, members_json = room_rules.validate_members(members, lim)
    if supersede_latest_seq is not None:
        supersede_latest_seq = bounded_int(supersede_latest_seq, error=ReplicaError, low=0, high=_MAX_INT64,
                                           message="supersede_latest_seq must be an integer from 0 to 2**63-1")
    if isinstance(page, CheckedPage):
        if page.room_id != room_id or page.limits is not lim:
            raise ReplicaError("page was checked for another room or under other limits")
        checked = page
    else:
        checked = _validate_page(page, room_id, lim)
    timestamp = clock(now)
    with UnitOfWork(_resolve(engine)) as uow:
        result = _ingest(uow, lim, room_id, room_name, members_json, checked, timestamp, supersede_latest_seq)
        uow.commit()
    return result


def _lock_replica(uow: UnitOfWork, room_id: str) -> Mapping[Any, Any] | None:
    stmt = uow.backend.for_update(select(*_replicas.c).where(_replicas.c.room_id == room_id))
    return uow.connection.execute(stmt).mappings().first()


def _ingest(
    uow: UnitOfWork, lim: Limits, room_id: str, room_name: str, members_json: str, page: CheckedPage, now: float,
    supersede_latest_seq: int | None = None,
) -> IngestResult:
    connection = uow.connection
    row = _lock_replica(uow, room_id)
    if row is None:
        # Creating a replica: serialise creators so the cap is exact and a concurrent first page waits.
        uow.backend.advisory_lock(connection, REPLICA_CREATION_LOCK_KEY)
        row = _lock_replica(uow, room_id)
    if row is None:
        count = connection.execute(select(func.count()).select_from(_replicas)).scalar_one()
        if int(count) >= lim.MAX_REPLICA_ROOMS:
            raise ReplicaCapacityError("replica room capacity exhausted", limit="MAX_REPLICA_ROOMS")
        stored_epoch = last_seq = stored_latest = stored_bytes = 0
    else:
        stored_epoch, last_seq = int(row["authority_epoch"]), int(row["last_seq"])
        stored_latest, stored_bytes = int(row["latest_seq"]), int(row["event_bytes"])
    if page.epoch < stored_epoch:
        raise ReplicaEpochRegressionError("page authority epoch is older than the stored replica epoch")
    if row is not None and page.epoch == stored_epoch and page.gateway_id != row["authority_gateway_id"]:
        # Two owners at one epoch is a fork; adopting either would hide it (hole 3).
        raise ReplicaError("page authority owner conflicts with the stored replica at the same epoch")
    _check_overlap(uow, room_id, [event for event in page.events if event.seq <= last_seq])
    new_events = [event for event in page.events if event.seq > last_seq]
    if new_events and new_events[0].seq != last_seq + 1:
        raise ReplicaGapError("page skips sequences the replica has not stored")
    _check_new_event_ids(uow, room_id, new_events)
    added = 0
    for event in new_events:
        added += event.event.size
        if stored_bytes + added > lim.MAX_REPLICA_EVENT_BYTES:
            raise ReplicaCapacityError("replica event storage exhausted", limit="MAX_REPLICA_EVENT_BYTES")
    if new_events:
        connection.execute(insert(_replica_events), [
            {"room_id": room_id, "seq": event.seq, "event_id": event.event.event_id, "kind": event.event.kind,
             "actor_json": event.event.actor_json, "authority_epoch": event.event.authority_epoch,
             "payload_json": event.event.payload_json,
             "created_at": now if event.created_at is None else event.created_at}
            for event in new_events])
    new_last = new_events[-1].seq if new_events else last_seq
    claim = page.latest_seq if page.latest_seq is not None else new_last
    # Never lower latest_seq: a delayed page must not make a partial replica look caught up (hole 1); unless the
    # caller proves this page newer than an unsupported stored claim (see ingest_page).
    superseded = row is not None and stored_latest > last_seq and supersede_latest_seq == stored_latest
    latest_seq = max(new_last, claim) if superseded else max(stored_latest, new_last, claim)
    values = {"name": room_name, "members_json": members_json, "authority_gateway_id": page.gateway_id,
              "authority_epoch": page.epoch, "last_seq": new_last, "latest_seq": latest_seq, "updated_at": now}
    if row is None:
        connection.execute(insert(_replicas).values(
            room_id=room_id, event_bytes=added, created_at=now, **values))
    else:
        uow.fenced(
            update(_replicas).where(_replicas.c.room_id == room_id, _replicas.c.last_seq == last_seq)
            .values(event_bytes=_replicas.c.event_bytes + added, **values),
            ReplicaError("replica ingest lost its write fence"))
    return {"room_id": room_id, "stored_seq": new_last, "ingested": len(new_events), "authority": page.authority,
            "caught_up": new_last >= latest_seq}


def _check_overlap(uow: UnitOfWork, room_id: str, overlapping: Sequence[CheckedEvent]) -> None:
    """Already-stored seqs must hold exactly the page's events (a retry); anything else is a fork (hole 3)."""
    if not overlapping:
        return
    stored = {
        int(row["seq"]): row for row in uow.connection.execute(
            select(*_replica_events.c).where(
                _replica_events.c.room_id == room_id, _replica_events.c.seq >= overlapping[0].seq,
                _replica_events.c.seq <= overlapping[-1].seq)).mappings()}
    for event in overlapping:
        row = stored.get(event.seq)
        if row is None or not event.same_content(row):
            raise ReplicaError("page events conflict with the stored replica")


def _id_clash_query(room_id: str, event_ids: Sequence[str]) -> Select[tuple[int]]:
    """The seq of a stored replica event of ``room_id`` holding one of ``event_ids`` (answered from the
    ``(room_id, event_id)`` index: one probe per id, whatever the replica's length)."""
    return select(_replica_events.c.seq).where(
        _replica_events.c.room_id == room_id, _replica_events.c.event_id.in_(list(event_ids))).limit(1)


def _check_new_event_ids(uow: UnitOfWork, room_id: str, new_events: Sequence[CheckedEvent]) -> None:
    """A new event may not reuse a stored event id: promotion could not copy the log (ids are unique)."""
    if not new_events:
        return
    clash = uow.connection.execute(
        _id_clash_query(room_id, [event.event.event_id for event in new_events])).first()
    if clash is not None:
        raise ReplicaError("page events conflict with the stored replica")


# --- state ---------------------------------------------------------------------------------------------------------


@traced("replica_state")
def replica_state(engine: EngineSource, *, room_id: str, limits: Limits | None = None) -> ReplicaState:
    """The stored replica's coverage (``last_seq``/``latest_seq``) and authority lineage (a pure read)."""
    room_id = room_rules.validate_room_id(room_id, in_force(limits))
    with UnitOfWork(_resolve(engine), write=False) as uow:
        row = uow.connection.execute(select(*_replicas.c).where(_replicas.c.room_id == room_id)).mappings().first()
    if row is None:
        raise ReplicaError("replica not found")
    return _replica_to_dict(row)


def _replica_to_dict(row: Mapping[Any, Any]) -> ReplicaState:
    return {
        "room_id": row["room_id"], "name": row["name"],
        "members": stored_json(row["members_json"], lambda: f"replica of room {row['room_id']!r}"),
        "authority": {"gateway_id": row["authority_gateway_id"], "epoch": int(row["authority_epoch"])},
        "last_seq": int(row["last_seq"]), "latest_seq": int(row["latest_seq"]),
        "event_bytes": int(row["event_bytes"]), "created_at": float(row["created_at"]),
        "updated_at": float(row["updated_at"])}


@traced("reset_replica_latest")
def reset_replica_latest(
    engine: EngineSource, *, room_id: str, latest_seq: int | None = None, now: float | None = None,
    limits: Limits | None = None,
) -> ReplicaState:
    """Lower a replica's stored ``latest_seq`` (the authority's log end as last reported) to ``latest_seq``,
    by default its ``last_seq``, and return the replica's state: the operator's recovery from a claim no source
    will correct (a source that reported a seq it never served, then went away).

    ``latest_seq`` must lie between the replica's ``last_seq`` and its stored ``latest_seq``: stored events are
    never dropped and nothing is raised. The caller asserts the authority holds nothing after ``latest_seq``: a
    replica promoted after this call continues the room without any event the authority wrote past it. While
    the source is reachable, the :class:`~hostedrooms.standby.Replicator` corrects such a claim by itself.
    """
    lim = in_force(limits)
    room_id = room_rules.validate_room_id(room_id, lim)
    if latest_seq is not None:
        latest_seq = bounded_int(latest_seq, error=ReplicaError, low=0, high=_MAX_INT64,
                                 message="latest_seq must be an integer from 0 to 2**63-1")
    timestamp = clock(now)
    with UnitOfWork(_resolve(engine)) as uow:
        row = _lock_replica(uow, room_id)
        if row is None:
            raise ReplicaError("replica not found")
        last_seq, stored_latest = int(row["last_seq"]), int(row["latest_seq"])
        target = last_seq if latest_seq is None else latest_seq
        if not last_seq <= target <= stored_latest:
            raise ReplicaError(f"latest_seq must lie between the replica's last_seq {last_seq} and its latest_seq "
                               f"{stored_latest}")
        if target != stored_latest:
            uow.connection.execute(update(_replicas).where(_replicas.c.room_id == room_id)
                                   .values(latest_seq=target, updated_at=timestamp))
        uow.commit()
    return replica_state(engine, room_id=room_id, limits=limits)


# --- retention -------------------------------------------------------------------------------------------------


@traced("prune_disbanded_replicas")
def prune_disbanded_replicas(
    engine: EngineSource, *, retain_seconds: int = 0, now: float | None = None, limits: Limits | None = None,
) -> list[str]:
    """Delete the replicas whose log ends with ``room.disbanded`` stamped at least ``retain_seconds`` before
    ``now``, with their events, in one transaction; return their room ids in code-point order.

    A disbanded room can never be promoted, and its replica would keep one of the ``MAX_REPLICA_ROOMS`` slots for
    good. Not in the reference implementation (its replicas are never removed). A room's disband is its last
    event, so it is found at the replica's ``last_seq`` (one key lookup per replica).
    """
    in_force(limits)
    if type(retain_seconds) is not int or not 0 <= retain_seconds <= _MAX_INT64:
        raise ReplicaError("retain_seconds must be an integer from 0 to 2**63-1")
    cutoff = clock(now) - retain_seconds
    last = _replica_events.alias("last_event")
    disbanded = (
        select(_replicas.c.room_id)
        .join(last, (last.c.room_id == _replicas.c.room_id) & (last.c.seq == _replicas.c.last_seq))
        .where(last.c.kind == "room.disbanded", last.c.created_at <= cutoff))
    with UnitOfWork(_resolve(engine)) as uow:
        # Row locks first: an ingest of one of these replicas still running finishes before they go.
        room_ids = sorted(str(room_id) for room_id in uow.connection.execute(uow.backend.for_update(disbanded))
                          .scalars())
        if room_ids:
            uow.connection.execute(delete(_replica_events).where(_replica_events.c.room_id.in_(room_ids)))
            uow.connection.execute(delete(_replicas).where(_replicas.c.room_id.in_(room_ids)))
        uow.commit()
    return room_ids


# --- promotion -------------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _LogStats:
    count: int
    size: int
    first: int | None
    last: int | None
    disbanded: bool


def _replica_log(uow: UnitOfWork, room_id: str) -> _LogStats:
    """Count, accounted bytes, seq range and whether a ``room.disbanded`` event is present, in one query."""
    size = sum((uow.backend.byte_length(column) for column in (
        _replica_events.c.event_id, _replica_events.c.kind, _replica_events.c.actor_json,
        _replica_events.c.payload_json)), start=literal(0))
    disbanded = exists().where(_replica_events.c.room_id == room_id, _replica_events.c.kind == "room.disbanded")
    row = uow.connection.execute(
        select(func.count(), func.coalesce(func.sum(size), 0), func.min(_replica_events.c.seq),
               func.max(_replica_events.c.seq), disbanded.label("disbanded"))
        .where(_replica_events.c.room_id == room_id)).one()
    return _LogStats(int(row[0]), int(row[1]), row[2], row[3], bool(row[4]))


@traced("promote_replica")
def promote_replica(
    engine: EngineSource, *, room_id: str, reason: str = "authority-unreachable", now: float | None = None,
    local_gateway_id: str | Callable[[], str] | None = None, limits: Limits | None = None,
) -> PromotionResult:
    """Continue a replicated room on THIS gateway at ``epoch + 1``, in one transaction.

    Copies the replica's log into the authoritative tables, appends ``authority.claimed``
    (``system:authority-claimed:<epoch>``, with ``promoted_from_replica`` and ``reason``) and consumes the
    replica. Refuses a replica that is not caught up or whose room was disbanded (ReplicaError), and a room
    that does not fit the capacity limits an append would meet; a refused promotion leaves the replica intact.
    The local gateway is ``local_gateway_id`` (or what it returns, when a callable), else
    ``install:$HOSTEDROOMS_INSTALL_ID``. The caller decides that takeover is safe; this primitive only makes it
    atomic and provable.
    """
    lim = in_force(limits)
    room_id = room_rules.validate_room_id(room_id, lim)
    if not isinstance(reason, str) or not reason or len(reason) > 200:
        raise ReplicaError("reason must be a non-empty string of at most 200 chars")
    timestamp = clock(now)
    local = resolve_local_gateway_id(local_gateway_id)

    def body(tx: RoomTransaction) -> PromotionResult:
        replica, log = _promotable(tx, room_id, local)
        previous_gateway, previous_epoch = str(replica["authority_gateway_id"]), int(replica["authority_epoch"])
        last_seq = int(replica["last_seq"])
        if previous_epoch >= MAX_EPOCH:  # only a row stored before epochs were bounded can be there
            raise ReplicaError("replica authority epoch is beyond the largest authority epoch; it cannot be promoted")
        target_epoch = previous_epoch + 1
        claim = promotion_claim(previous_gateway, local, target_epoch, reason, tx.limits)
        # The room as it will stand once the log is copied: the claim is checked like an append to it, and
        # the copied bytes must fit the gateway (after pruning disbanded rooms) like any other write.
        room = {"room_id": room_id, "next_seq": last_seq + 1, "event_bytes": log.size}
        tx.check_capacity(room, [claim], uncounted_room_bytes=log.size)
        tx.insert_room({
            "room_id": room_id, "name": replica["name"], "members_json": replica["members_json"],
            "authority_gateway_id": local, "authority_epoch": target_epoch, "next_seq": last_seq + 1,
            "event_bytes": log.size, "revision": 1, "created_at": timestamp, "updated_at": timestamp,
            "disbanded_at": None})
        tx.store.copy_replica_log(tx.uow.connection, room_id)
        [row] = tx.append_locked(room, [claim], now=timestamp, check=False)
        tx.uow.connection.execute(delete(_replica_events).where(_replica_events.c.room_id == room_id))
        tx.uow.connection.execute(delete(_replicas).where(_replicas.c.room_id == room_id))
        return {"room_id": room_id, "authority_gateway_id": local, "authority_epoch": target_epoch,
                "previous_gateway_id": previous_gateway, "previous_epoch": previous_epoch,
                "claim_seq": int(row["seq"]), "latest_seq": int(row["seq"])}

    return run_room_write(engine, lim, body)


def promotion_claim(previous_gateway: str, local: str, epoch: int, reason: str, lim: Limits) -> PreparedEvent:
    """The ``authority.claimed`` event that promoting a replica of ``previous_gateway``'s room appends at
    ``epoch`` (its size is what a failover plans for)."""
    return PreparedEvent(
        f"system:authority-claimed:{epoch}", "authority.claimed", system_actor_json("authority-control", lim),
        payload_json({"previous_gateway_id": previous_gateway, "authority_gateway_id": local,
                      "authority_epoch": epoch, "promoted_from_replica": True, "reason": reason}, lim),
        epoch, control=True)


def supersede_replica(
    engine: EngineSource, *, room_id: str, room_name: str, members: Any, authority_gateway_id: str,
    authority_epoch: int, latest_seq: int, now: float | None = None, limits: Limits | None = None,
    unless_retired: bool = False,
) -> None:
    """Record that the replicated room has moved on to (``authority_gateway_id``, ``authority_epoch``), holding
    at least ``latest_seq`` events, so this replica cannot be promoted until it has ingested them: what a
    failover does before it gives a fenced room back (:func:`hostedrooms.standby.failover.failover`). A replica
    row is created (empty) when there is none. Refused when the local store holds this replica promoted at the
    epoch before (RoomConflictError; another room of the same id does not count: it cannot take the replica's
    place), or the replica already records a newer epoch (ReplicaEpochRegressionError), or, with
    ``unless_retired``, when the room id is retired here (RoomConflictError: a room promoted here and disbanded
    since leaves no claim to recognise). One transaction, serialised with :func:`promote_replica` on the
    room-creation lock.
    """
    lim = in_force(limits)
    room_id = room_rules.validate_room_id(room_id, lim)
    room_name = room_rules.validate_room_name(room_name, lim)
    _, members_json = room_rules.validate_members(members, lim)
    gateway = room_rules.validate_actor_id(authority_gateway_id, "authority_gateway_id", lim)
    epoch = _epoch(authority_epoch, "authority_epoch", MAX_EPOCH - 1)
    latest = bounded_int(latest_seq, error=ReplicaError, low=0, high=_MAX_INT64,
                         message="latest_seq must be an integer from 0 to 2**63-1")
    timestamp = clock(now)

    def body(tx: RoomTransaction) -> None:
        tx.lock_room_creation()
        room = tx.lock_room(room_id)
        if room is not None and _promoted_from(tx, room_id, gateway, epoch - 1):
            raise RoomConflictError("the replica was promoted here at the epoch before: it cannot be superseded")
        if unless_retired and room is None and tx.is_retired(room_id):
            raise RoomConflictError("room_id belongs to a disbanded room")
        row = _lock_replica(tx.uow, room_id)
        if row is None:
            tx.uow.connection.execute(insert(_replicas).values(
                room_id=room_id, name=room_name, members_json=members_json, authority_gateway_id=gateway,
                authority_epoch=epoch, last_seq=0, latest_seq=latest, event_bytes=0, created_at=timestamp,
                updated_at=timestamp))
            return
        if int(row["authority_epoch"]) > epoch:
            raise ReplicaEpochRegressionError("the replica already records a newer authority epoch")
        tx.uow.connection.execute(update(_replicas).where(_replicas.c.room_id == room_id).values(
            authority_gateway_id=gateway, authority_epoch=epoch,
            latest_seq=max(latest, int(row["latest_seq"])), updated_at=timestamp))

    run_room_write(engine, lim, body)


def _promoted_from(tx: RoomTransaction, room_id: str, gateway: str, epoch: int) -> bool:
    """Whether the local room ``room_id`` is a replica of ``gateway``'s promoted here at ``epoch`` (its claim at
    that epoch names ``gateway`` as the previous authority), rather than another room of the same id."""
    claim = tx.store.claim_event(tx.uow.connection, room_id, epoch)
    if claim is None:
        return False
    payload = stored_json(claim["payload_json"], lambda: f"hosted room {room_id!r} claim")
    return isinstance(payload, dict) and payload.get("previous_gateway_id") == gateway


def _promotable(tx: RoomTransaction, room_id: str, local: str) -> tuple[Mapping[Any, Any], _LogStats]:
    """The locked replica row and its log, refused unless the replica can become the local room (in this order:
    the reference's checks, then the log's, then the active-room cap)."""
    # Lock order: room creation, room row, replica row, gateway budget (inside check_capacity).
    tx.lock_room_creation()
    existing_room = tx.lock_room(room_id)
    replica = _lock_replica(tx.uow, room_id)
    if replica is None:
        raise ReplicaError("replica not found")
    if replica["authority_gateway_id"] == local:
        raise ReplicaError("this gateway already holds the room authority")
    if existing_room is not None:
        raise RoomConflictError("room_id already exists in the local authoritative store")
    if tx.is_retired(room_id):
        raise RoomConflictError("room_id belongs to a disbanded room")
    last_seq = int(replica["last_seq"])
    if last_seq < int(replica["latest_seq"]):
        raise ReplicaError("replica is not caught up with the authority log; ingest the remaining pages first")
    log = _replica_log(tx.uow, room_id)
    if log.disbanded:
        raise ReplicaError("replica log ends in room.disbanded; a disbanded room cannot be promoted")
    if log.count != last_seq or (log.count and (log.first != 1 or log.last != last_seq)):
        raise ReplicaError("replica log is not contiguous")
    tx.check_room_slot()
    return replica, log



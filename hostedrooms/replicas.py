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

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from sqlalchemy import Engine

from .advisory_keys import REPLICA_CREATION_LOCK_KEY
from .demotion import demote_room
from .engines import EngineSource, resolve_engine
from .errors import (
    ReplicaCapacityError,
    ReplicaEpochRegressionError,
    ReplicaError,
    ReplicaGapError,
    RoomConflictError,
)
from .identity import local_gateway_id as resolve_local_gateway_id
from .limits import Limits, in_force
from .records import IngestResult, PromotionResult, ReplayPage, ReplicaState
from .replica_pages import MAX_INT64, check_page, checked_epoch
from .replica_pages import CheckedEvent as CheckedEvent
from .replica_pages import CheckedPage as CheckedPage
from .replica_pages import validate_page as validate_page
from .rooms import (
    PreparedEvent,
    RoomTransaction,
    payload_json,
    run_room_write,
    system_actor_json,
)
from .rooms import rules as room_rules
from .store.replicas import LogStats
from .telemetry import traced
from .uow import UnitOfWork
from .validation import MAX_EPOCH, bounded_int, clock, stored_json

# validate_page (with CheckedPage and CheckedEvent, from .replica_pages) is the replicator's seam, not a service: it
# returns no record.
__all__ = [
    "REPLICA_CREATION_LOCK_KEY",
    "demote_room",
    "ingest_page",
    "promote_replica",
    "prune_disbanded_replicas",
    "replica_state",
    "reset_replica_latest",
]

def _resolve(engine: EngineSource) -> Engine:
    return resolve_engine(engine)


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

    :param engine: the local store: an :class:`~sqlalchemy.Engine`, or a zero-argument factory returning one.
    :param room_id: the replicated room.
    :param room_name: the room's name at the authority (stored with the replica).
    :param members: the room's members at the authority.
    :param page: the authority's ``read_events`` page, or :func:`validate_page`'s result for it.
    :param now: the ingest time, in Unix seconds (default: the wall clock).
    :param limits: the limits in force (default: :mod:`hostedrooms.limits`).
    :param supersede_latest_seq: the stored ``latest_seq`` seen before ``page`` was read (see above).
    :returns: ``room_id``, ``stored_seq`` (the replica's last seq now), ``ingested`` (events added), the page's
        ``authority`` and ``caught_up``.
    :raises InvalidInputError: ``room_id``, ``room_name`` or ``members`` is invalid.
    :raises ReplicaGapError: the page skips sequences the replica has not stored.
    :raises ReplicaEpochRegressionError: the page's authority epoch is older than the stored one.
    :raises ReplicaCapacityError: MAX_REPLICA_ROOMS or MAX_REPLICA_EVENT_BYTES would be exceeded.
    :raises ReplicaError: the page is malformed or contradicts itself or the stored events.
    :raises MisuseError: ``engine`` is not a SQLAlchemy Engine.
    :raises StorageError: the database failed underneath; nothing was committed.
    """
    lim = in_force(limits)
    room_id = room_rules.validate_room_id(room_id, lim)
    room_name = room_rules.validate_room_name(room_name, lim)
    _, members_json = room_rules.validate_members(members, lim)
    if supersede_latest_seq is not None:
        supersede_latest_seq = bounded_int(supersede_latest_seq, error=ReplicaError, low=0, high=MAX_INT64,
                                           message="supersede_latest_seq must be an integer from 0 to 2**63-1")
    if isinstance(page, CheckedPage):
        if page.room_id != room_id or page.limits is not lim:
            raise ReplicaError("page was checked for another room or under other limits")
        checked = page
    else:
        checked = check_page(page, room_id, lim)
    timestamp = clock(now)
    with UnitOfWork(_resolve(engine)) as uow:
        result = _ingest(uow, lim, room_id, room_name, members_json, checked, timestamp, supersede_latest_seq)
        uow.commit()
    return result


def _ingest(
    uow: UnitOfWork, lim: Limits, room_id: str, room_name: str, members_json: str, page: CheckedPage, now: float,
    supersede_latest_seq: int | None = None,
) -> IngestResult:
    store = uow.replicas
    row = store.lock(room_id)
    if row is None:
        # Creating a replica: serialise creators so the cap is exact and a concurrent first page waits.
        store.lock_creation()
        row = store.lock(room_id)
    if row is None:
        if store.count() >= lim.MAX_REPLICA_ROOMS:
            raise ReplicaCapacityError("replica room capacity exhausted", limit="MAX_REPLICA_ROOMS")
        stored_epoch = last_seq = stored_latest = stored_bytes = 0
    else:
        stored_epoch, last_seq = int(row["authority_epoch"]), int(row["last_seq"])
        stored_latest, stored_bytes = int(row["latest_seq"]), int(row["event_bytes"])
    if page.epoch < stored_epoch:
        raise ReplicaEpochRegressionError("page authority epoch is older than the stored replica epoch")
    if row is not None and page.epoch == stored_epoch and page.gateway_id != row["authority_gateway_id"]:
        # Two owners at one epoch is a fork; adopting either would hide it.
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
        store.insert_events([
            {"room_id": room_id, "seq": event.seq, "event_id": event.event.event_id, "kind": event.event.kind,
             "actor_json": event.event.actor_json, "authority_epoch": event.event.authority_epoch,
             "payload_json": event.event.payload_json,
             "created_at": now if event.created_at is None else event.created_at}
            for event in new_events])
    new_last = new_events[-1].seq if new_events else last_seq
    claim = page.latest_seq if page.latest_seq is not None else new_last
    # Never lower latest_seq: a delayed page must not make a partial replica look caught up; unless the
    # caller proves this page newer than an unsupported stored claim (see ingest_page).
    superseded = row is not None and stored_latest > last_seq and supersede_latest_seq == stored_latest
    latest_seq = max(new_last, claim) if superseded else max(stored_latest, new_last, claim)
    values = {"name": room_name, "members_json": members_json, "authority_gateway_id": page.gateway_id,
              "authority_epoch": page.epoch, "last_seq": new_last, "latest_seq": latest_seq, "updated_at": now}
    if row is None:
        store.insert({"room_id": room_id, "event_bytes": added, "created_at": now, **values})
    elif not store.advance(room_id, last_seq, added, values):
        raise ReplicaError("replica ingest lost its write fence")
    return {"room_id": room_id, "stored_seq": new_last, "ingested": len(new_events), "authority": page.authority,
            "caught_up": new_last >= latest_seq}


def _check_overlap(uow: UnitOfWork, room_id: str, overlapping: Sequence[CheckedEvent]) -> None:
    """Already-stored seqs must hold exactly the page's events (a retry); anything else is a fork."""
    if not overlapping:
        return
    stored = uow.replicas.events_between(room_id, overlapping[0].seq, overlapping[-1].seq)
    for event in overlapping:
        row = stored.get(event.seq)
        if row is None or not event.same_content(row):
            raise ReplicaError("page events conflict with the stored replica")


def _check_new_event_ids(uow: UnitOfWork, room_id: str, new_events: Sequence[CheckedEvent]) -> None:
    """A new event may not reuse a stored event id: promotion could not copy the log (ids are unique)."""
    if not new_events:
        return
    if uow.replicas.holds_event_id(room_id, [event.event.event_id for event in new_events]):
        raise ReplicaError("page events conflict with the stored replica")


# --- state ---------------------------------------------------------------------------------------------------------


@traced("replica_state")
def replica_state(engine: EngineSource, *, room_id: str, limits: Limits | None = None) -> ReplicaState:
    """The stored replica's coverage (``last_seq``/``latest_seq``) and authority lineage (a pure read).

    :param engine: the local store: an :class:`~sqlalchemy.Engine`, or a zero-argument factory returning one.
    :param room_id: the replicated room.
    :param limits: the limits in force (default: :mod:`hostedrooms.limits`).
    :returns: the replica: name, members, ``authority``, ``last_seq``, ``latest_seq``, ``event_bytes`` and times.
    :raises InvalidInputError: ``room_id`` is invalid.
    :raises ReplicaError: there is no replica of ``room_id``.
    :raises MisuseError: ``engine`` is not a SQLAlchemy Engine.
    :raises StorageError: the database failed underneath; nothing was committed.
    """
    room_id = room_rules.validate_room_id(room_id, in_force(limits))
    with UnitOfWork(_resolve(engine), write=False) as uow:
        row = uow.replicas.replica(room_id)
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

    :param engine: the local store: an :class:`~sqlalchemy.Engine`, or a zero-argument factory returning one.
    :param room_id: the replicated room.
    :param latest_seq: the new ``latest_seq`` (default: the replica's ``last_seq``).
    :param now: the update time, in Unix seconds (default: the wall clock).
    :param limits: the limits in force (default: :mod:`hostedrooms.limits`).
    :returns: the replica's state after the change (as :func:`replica_state`).
    :raises InvalidInputError: ``room_id`` is invalid.
    :raises ReplicaError: there is no replica of ``room_id``, or ``latest_seq`` is out of range.
    :raises MisuseError: ``engine`` is not a SQLAlchemy Engine.
    :raises StorageError: the database failed underneath; nothing was committed.
    """
    lim = in_force(limits)
    room_id = room_rules.validate_room_id(room_id, lim)
    if latest_seq is not None:
        latest_seq = bounded_int(latest_seq, error=ReplicaError, low=0, high=MAX_INT64,
                                 message="latest_seq must be an integer from 0 to 2**63-1")
    timestamp = clock(now)
    with UnitOfWork(_resolve(engine)) as uow:
        row = uow.replicas.lock(room_id)
        if row is None:
            raise ReplicaError("replica not found")
        last_seq, stored_latest = int(row["last_seq"]), int(row["latest_seq"])
        target = last_seq if latest_seq is None else latest_seq
        if not last_seq <= target <= stored_latest:
            raise ReplicaError(f"latest_seq must lie between the replica's last_seq {last_seq} and its latest_seq "
                               f"{stored_latest}")
        if target != stored_latest:
            uow.replicas.update(room_id, {"latest_seq": target, "updated_at": timestamp})
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

    :param engine: the local store: an :class:`~sqlalchemy.Engine`, or a zero-argument factory returning one.
    :param retain_seconds: keep a disbanded replica this many seconds after its ``room.disbanded`` event.
    :param now: the time retention is measured at, in Unix seconds (default: the wall clock).
    :param limits: the limits in force (default: :mod:`hostedrooms.limits`).
    :returns: the room ids of the deleted replicas.
    :raises ReplicaError: ``retain_seconds`` is not an integer from 0 to 2**63-1.
    :raises MisuseError: ``engine`` is not a SQLAlchemy Engine.
    :raises StorageError: the database failed underneath; nothing was committed.
    """
    in_force(limits)
    if type(retain_seconds) is not int or not 0 <= retain_seconds <= MAX_INT64:
        raise ReplicaError("retain_seconds must be an integer from 0 to 2**63-1")
    cutoff = clock(now) - retain_seconds
    with UnitOfWork(_resolve(engine)) as uow:
        # Row locks first: an ingest of one of these replicas still running finishes before they go.
        room_ids = uow.replicas.lock_disbanded(cutoff)
        if room_ids:
            uow.replicas.delete(room_ids)
        uow.commit()
    return room_ids


# --- promotion -------------------------------------------------------------------------------------------------


@traced("promote_replica")
def promote_replica(
    engine: EngineSource, *, room_id: str, reason: str = "authority-unreachable", now: float | None = None,
    local_gateway_id: str | Callable[[], str] | None = None, limits: Limits | None = None,
) -> PromotionResult:
    """Continue a replicated room on THIS gateway at ``epoch + 1``, in one transaction.

    Copies the replica's log into the authoritative tables, appends ``authority.claimed``
    (``system:authority-claimed:<epoch>``, with ``promoted_from_replica`` and ``reason``) and consumes the
    replica; a refused promotion leaves the replica intact. The caller decides that takeover is safe; this
    primitive only makes it atomic and provable.

    :param engine: the local store: an :class:`~sqlalchemy.Engine`, or a zero-argument factory returning one.
    :param room_id: the replicated room to continue here.
    :param reason: why (1 to 200 characters), recorded in the claim event.
    :param now: the promotion time, in Unix seconds (default: the wall clock).
    :param local_gateway_id: this gateway's id, or a callable returning it (default:
        ``install:$HOSTEDROOMS_INSTALL_ID``).
    :param limits: the limits in force (default: :mod:`hostedrooms.limits`).
    :returns: the new authority (``authority_gateway_id``, ``authority_epoch``), the previous one, and the
        claim's seq (``claim_seq``, also ``latest_seq``).
    :raises InvalidInputError: ``room_id`` is invalid.
    :raises ReplicaError: no replica, not caught up, its log is not contiguous or ends disbanded, this gateway
        already holds the authority, or ``reason`` is invalid.
    :raises RoomConflictError: the room exists here already, or its id is retired here.
    :raises CapacityExceededError: the room would not fit this gateway's limits.
    :raises MisuseError: ``engine`` is not a SQLAlchemy Engine.
    :raises StorageError: the database failed underneath; nothing was committed.
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
        tx.store.copy_replica_log(room_id)
        [row] = tx.append_locked(room, [claim], now=timestamp, check=False)
        tx.uow.replicas.consume(room_id)
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
    epoch = checked_epoch(authority_epoch, "authority_epoch", MAX_EPOCH - 1)
    latest = bounded_int(latest_seq, error=ReplicaError, low=0, high=MAX_INT64,
                         message="latest_seq must be an integer from 0 to 2**63-1")
    timestamp = clock(now)

    def body(tx: RoomTransaction) -> None:
        tx.lock_room_creation()
        room = tx.lock_room(room_id)
        if room is not None and _promoted_from(tx, room_id, gateway, epoch - 1):
            raise RoomConflictError("the replica was promoted here at the epoch before: it cannot be superseded")
        if unless_retired and room is None and tx.is_retired(room_id):
            raise RoomConflictError("room_id belongs to a disbanded room")
        row = tx.uow.replicas.lock(room_id)
        if row is None:
            tx.uow.replicas.insert({
                "room_id": room_id, "name": room_name, "members_json": members_json, "authority_gateway_id": gateway,
                "authority_epoch": epoch, "last_seq": 0, "latest_seq": latest, "event_bytes": 0,
                "created_at": timestamp, "updated_at": timestamp})
            return
        if int(row["authority_epoch"]) > epoch:
            raise ReplicaEpochRegressionError("the replica already records a newer authority epoch")
        tx.uow.replicas.update(room_id, {
            "authority_gateway_id": gateway, "authority_epoch": epoch,
            "latest_seq": max(latest, int(row["latest_seq"])), "updated_at": timestamp})

    run_room_write(engine, lim, body)


def _promoted_from(tx: RoomTransaction, room_id: str, gateway: str, epoch: int) -> bool:
    """Whether the local room ``room_id`` is a replica of ``gateway``'s promoted here at ``epoch`` (its claim at
    that epoch names ``gateway`` as the previous authority), rather than another room of the same id."""
    claim = tx.store.claim_event(room_id, epoch)
    if claim is None:
        return False
    payload = stored_json(claim["payload_json"], lambda: f"hosted room {room_id!r} claim")
    return isinstance(payload, dict) and payload.get("previous_gateway_id") == gateway


def _promotable(tx: RoomTransaction, room_id: str, local: str) -> tuple[Mapping[Any, Any], LogStats]:
    """The locked replica row and its log, refused unless the replica can become the local room (in this order:
    the reference's checks, then the log's, then the active-room cap)."""
    # Lock order: room creation, room row, replica row, gateway budget (inside check_capacity).
    tx.lock_room_creation()
    existing_room = tx.lock_room(room_id)
    replica = tx.uow.replicas.lock(room_id)
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
    log = tx.uow.replicas.log_stats(room_id)
    if log.disbanded:
        raise ReplicaError("replica log ends in room.disbanded; a disbanded room cannot be promoted")
    if log.count != last_seq or (log.count and (log.first != 1 or log.last != last_seq)):
        raise ReplicaError("replica log is not contiguous")
    tx.check_room_slot()
    return replica, log



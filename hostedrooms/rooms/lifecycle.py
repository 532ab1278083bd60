"""Room lifecycle: create (and legacy adoption), list, state, rename, authority claims, disband, prune."""

from __future__ import annotations

from typing import Any, cast

from ..engines import EngineSource, resolve_engine
from ..errors import (
    AuthorityConflictError,
    AuthoritySupersededError,
    EventConflictError,
    HostedRoomError,
    RoomConflictError,
    RoomNotFoundError,
)
from ..limits import Limits, in_force
from ..records import ClaimedRoom, CreatedRoom, DisbandedRoom, RenamedRoom, RoomRecord, RoomState
from ..store import RoomChange, RowLike
from ..telemetry import traced
from ..uow import UnitOfWork
from ..validation import (
    MAX_EPOCH,
    clock,
    flag,
)
from .pages import event_to_dict, room_to_dict
from .rules import (
    PreparedEvent,
    _actor_id,
    _bounded_limit,
    _claim_payload_json,
    _epoch,
    _event_id,
    _legacy_members_match,
    _members,
    _non_negative,
    _payload_json,
    _room_id,
    _room_name,
    _system_actor_json,
)
from .transaction import RoomTransaction, require_authority, require_room, run_room_write

__all__ = [
    "claim_authority", "create_room", "disband_room", "list_rooms", "prune_disbanded_rooms", "rename_room",
    "room_state"]


@traced("create_room")
def create_room(
    engine: EngineSource, *, room_id: str, name: str, members: list[dict[str, Any]], authority_gateway_id: str,
    now: float | None = None, limits: Limits | None = None,
) -> CreatedRoom:
    """Create a room, or return the identical existing room idempotently (adopting a 'legacy' room).

    A room whose authority is ``legacy`` (written by the reference) with the same name and members is adopted:
    its authority moves to ``authority_gateway_id`` at the next epoch with an ``authority.claimed`` event
    (``adopted`` and ``claim_event`` in the result).

    :param engine: the store: an :class:`~sqlalchemy.Engine`, or a zero-argument factory returning one.
    :param room_id: the new room's id (a retired id is refused forever).
    :param name: the room's display name.
    :param members: the room's members, each a mapping with the member's kind and id.
    :param authority_gateway_id: the gateway that will hold the room's authority (at epoch 1).
    :param now: the time to record, in Unix seconds (default: the wall clock).
    :param limits: the limits in force (default: :mod:`hostedrooms.limits`).
    :returns: the room; ``idempotent`` is true when an identical room already existed.
    :raises InvalidInputError: an argument is invalid (nothing was read or written).
    :raises RoomConflictError: ``room_id`` exists with another name, other members or another authority, or
        belongs to a disbanded room.
    :raises CapacityExceededError: the gateway already hosts MAX_ACTIVE_ROOMS live rooms.
    :raises MisuseError: ``engine`` is not a SQLAlchemy Engine.
    :raises StorageError: the database failed underneath (:class:`~hostedrooms.errors.StoreUnavailableError`
        when a retry may help); nothing was committed.
    """
    lim = in_force(limits)
    room_id = _room_id(room_id, lim)
    name = _room_name(name, lim)
    normalized_members, members_json = _members(members, lim)
    gateway_id = _actor_id(authority_gateway_id, "authority_gateway_id", lim)
    timestamp = clock(now)

    def body(tx: RoomTransaction) -> CreatedRoom:
        tx.lock_room_creation()
        if tx.is_retired(room_id):
            raise RoomConflictError("room_id belongs to a disbanded room")
        existing = tx.lock_room(room_id)
        if existing is not None:
            return _existing_room(tx, existing, name, normalized_members, members_json, gateway_id, timestamp)
        tx.check_room_slot()
        tx.insert_room({
            "room_id": room_id, "name": name, "members_json": members_json, "authority_gateway_id": gateway_id,
            "authority_epoch": 1, "next_seq": 1, "event_bytes": 0, "revision": 1, "created_at": timestamp,
            "updated_at": timestamp, "disbanded_at": None})
        # The reference's first-time result carries no latest_seq (its reload omits next_seq).
        return {
            "room_id": room_id, "name": name, "members": normalized_members, "authority_gateway_id": gateway_id,
            "authority_epoch": 1, "revision": 1, "created_at": timestamp, "updated_at": timestamp,
            "idempotent": False}

    return run_room_write(engine, lim, body)


def _existing_room(
    tx: RoomTransaction, existing: RowLike, name: str, members: list[dict[str, Any]], members_json: str,
    gateway_id: str, now: float,
) -> CreatedRoom:
    if existing["disbanded_at"] is not None:
        raise RoomConflictError("room_id belongs to a disbanded room")
    legacy_adoption = existing["authority_gateway_id"] == "legacy" and gateway_id != "legacy"
    members_match = existing["members_json"] == members_json or (
        legacy_adoption and _legacy_members_match(existing["members_json"], members))
    if existing["name"] != name or not members_match:
        raise RoomConflictError("room_id already exists with different state")
    if legacy_adoption:
        return _adopt_legacy_room(tx, existing, members_json=members_json, gateway_id=gateway_id, now=now)
    if existing["authority_gateway_id"] != gateway_id:
        raise RoomConflictError("room_id already belongs to a different authority")
    return cast(CreatedRoom, room_to_dict(existing, idempotent=True))


def _adopt_legacy_room(
    tx: RoomTransaction, existing: RowLike, *, members_json: str, gateway_id: str, now: float
) -> CreatedRoom:
    """Claim a 'legacy'-authority room for a real gateway with a fenced claim event at epoch + 1."""
    previous_epoch = int(existing["authority_epoch"])
    if previous_epoch >= MAX_EPOCH:  # only a row written outside hostedrooms can be there
        raise HostedRoomError("legacy room authority_epoch is beyond the largest authority epoch")
    target_epoch = previous_epoch + 1
    claim = PreparedEvent(
        "system:authority-adopted", "authority.claimed", _system_actor_json("authority-control", tx.limits),
        _claim_payload_json("legacy", gateway_id, target_epoch, tx.limits), target_epoch, control=True)
    [row] = tx.append_locked(
        existing, [claim], now=now,
        change=RoomChange(members_json=members_json, authority_gateway_id=gateway_id, authority_epoch=target_epoch,
                          fence=("legacy", previous_epoch)),
        error=AuthorityConflictError("legacy room adoption lost its fence"))
    adopted = {**existing, "members_json": members_json, "authority_gateway_id": gateway_id,
               "authority_epoch": target_epoch, "next_seq": int(existing["next_seq"]) + 1,
               "revision": int(existing["revision"]) + 1, "updated_at": now}
    result = {**room_to_dict(adopted, idempotent=True), "adopted": True, "claim_event": event_to_dict(row)}
    return cast(CreatedRoom, result)  # read with next_seq: latest_seq is there


@traced("list_rooms")
def list_rooms(
    engine: EngineSource, *, include_disbanded: bool = False, limit: int | None = None, offset: int = 0,
    limits: Limits | None = None,
) -> list[RoomRecord]:
    """One bounded read-only page ordered by most recent change (``limit`` defaults to MAX_ROOM_LIST_LIMIT).

    :param engine: the store: an :class:`~sqlalchemy.Engine`, or a zero-argument factory returning one.
    :param include_disbanded: also list disbanded rooms that are not pruned yet.
    :param limit: at most this many rooms (1 to MAX_ROOM_LIST_LIMIT, the default).
    :param offset: skip this many rooms first.
    :param limits: the limits in force (default: :mod:`hostedrooms.limits`).
    :returns: the rooms, most recently changed first.
    :raises InvalidInputError: an argument is invalid.
    :raises MisuseError: ``engine`` is not a SQLAlchemy Engine.
    :raises StorageError: the database failed underneath (:class:`~hostedrooms.errors.StoreUnavailableError`
        when a retry may help); nothing was committed.
    """
    lim = in_force(limits)
    include_disbanded = flag(include_disbanded, "include_disbanded")
    maximum = lim.MAX_ROOM_LIST_LIMIT
    page_size = _bounded_limit(maximum if limit is None else limit, maximum)
    skip = _non_negative(offset, "offset")
    with UnitOfWork(resolve_engine(engine), write=False) as uow:
        rows = uow.rooms.list_rooms(include_disbanded=include_disbanded, limit=page_size, offset=skip)
    return [room_to_dict(row) for row in rows]


@traced("room_state")
def room_state(
    engine: EngineSource, *, room_id: str, include_disbanded: bool = False, limits: Limits | None = None
) -> RoomState:
    """Durable replay and authority state for one room, with the claim event of its current epoch if any.

    :param engine: the store: an :class:`~sqlalchemy.Engine`, or a zero-argument factory returning one.
    :param room_id: the room to read.
    :param include_disbanded: also read a disbanded room that is not pruned yet.
    :param limits: the limits in force (default: :mod:`hostedrooms.limits`).
    :returns: the room (with ``latest_seq``), and ``authority_claim``, the ``authority.claimed`` event of its
        current epoch, when there is one.
    :raises InvalidInputError: ``room_id`` is invalid.
    :raises RoomNotFoundError: the room does not exist (or is disbanded, unless ``include_disbanded``).
    :raises RoomHistoryExpiredError: the room was disbanded and pruned.
    :raises MisuseError: ``engine`` is not a SQLAlchemy Engine.
    :raises StorageError: the database failed underneath (:class:`~hostedrooms.errors.StoreUnavailableError`
        when a retry may help); nothing was committed.
    """
    room_id = _room_id(room_id, in_force(limits))
    with UnitOfWork(resolve_engine(engine), write=False) as uow:
        row = require_room(uow, uow.rooms.room(room_id), room_id, include_disbanded=include_disbanded)
        claim = uow.rooms.claim_event(room_id, int(row["authority_epoch"]))
    state = cast(RoomState, room_to_dict(row))
    if claim is not None:
        state["authority_claim"] = event_to_dict(claim)
    return state


@traced("rename_room")
def rename_room(
    engine: EngineSource, *, room_id: str, event_id: str, name: str, now: float | None = None,
    limits: Limits | None = None,
) -> RenamedRoom:
    """Rename a live room and append its ``room.renamed`` replay event atomically (no authority fence).

    :param engine: the store: an :class:`~sqlalchemy.Engine`, or a zero-argument factory returning one.
    :param room_id: the room to rename.
    :param event_id: the caller's idempotency key for the ``room.renamed`` event.
    :param name: the new name.
    :param now: the time to record, in Unix seconds (default: the wall clock).
    :param limits: the limits in force (default: :mod:`hostedrooms.limits`).
    :returns: the renamed room with its ``event``; a retry with the same ``event_id`` and name replays it
        (``idempotent``).
    :raises InvalidInputError: an argument is invalid.
    :raises RoomNotFoundError: the room does not exist or is disbanded.
    :raises EventConflictError: ``event_id`` is stored with other content.
    :raises CapacityExceededError: the room's or the gateway's budget is full.
    :raises MisuseError: ``engine`` is not a SQLAlchemy Engine.
    :raises StorageError: the database failed underneath (:class:`~hostedrooms.errors.StoreUnavailableError`
        when a retry may help); nothing was committed.
    """
    lim = in_force(limits)
    room_id = _room_id(room_id, lim)
    event_id = _event_id(event_id, lim)
    name = _room_name(name, lim)
    timestamp = clock(now)
    actor_json = _system_actor_json("room-control", lim)
    payload_json = _payload_json({"name": name}, lim)

    def body(tx: RoomTransaction) -> RenamedRoom:
        room = tx.require_room(tx.lock_room(room_id), room_id, include_disbanded=True)
        if room["disbanded_at"] is not None:
            raise RoomNotFoundError("hosted room not found")
        existing = tx.load_event(room_id, event_id)
        if existing is not None:
            if existing["kind"] != "room.renamed" or existing["payload_json"] != payload_json:
                raise EventConflictError("event_id already exists with different immutable content")
            replay = {**room_to_dict(room, idempotent=True), "event": event_to_dict(existing, idempotent=True)}
            return cast(RenamedRoom, replay)  # a live room read with next_seq: latest_seq is there
        event = PreparedEvent(event_id, "room.renamed", actor_json, payload_json, int(room["authority_epoch"]))
        [row] = tx.append_locked(room, [event], now=timestamp, change=RoomChange(name=name))
        updated = {**room, "name": name, "next_seq": int(room["next_seq"]) + 1,
                   "revision": int(room["revision"]) + 1, "updated_at": timestamp}
        return cast(RenamedRoom, {**room_to_dict(updated), "event": event_to_dict(row)})  # as above

    return run_room_write(engine, lim, body)



# --- authority and lifecycle -----------------------------------------------------------------------------------


@traced("claim_authority")
def claim_authority(
    engine: EngineSource, *, room_id: str, expected_gateway_id: str, expected_epoch: int, new_gateway_id: str,
    event_id: str, now: float | None = None, limits: Limits | None = None,
) -> ClaimedRoom:
    """Move authority with a compare-and-swap of the epoch and an ``authority.claimed`` event (it does not decide
    *when* takeover is safe). An exact retry replays.

    :param engine: the store: an :class:`~sqlalchemy.Engine`, or a zero-argument factory returning one.
    :param room_id: the room whose authority moves.
    :param expected_gateway_id: the gateway the caller believes holds the authority now.
    :param expected_epoch: its epoch; the claim takes ``expected_epoch + 1``.
    :param new_gateway_id: the gateway that takes the authority.
    :param event_id: the caller's idempotency key for the ``authority.claimed`` event.
    :param now: the time to record, in Unix seconds (default: the wall clock).
    :param limits: the limits in force (default: :mod:`hostedrooms.limits`).
    :returns: the room under its new authority, with its ``claim_event``.
    :raises InvalidInputError: an argument is invalid (an epoch out of range included).
    :raises RoomNotFoundError: the room does not exist or is disbanded.
    :raises EventConflictError: ``event_id`` is stored with other content.
    :raises AuthoritySupersededError: this claim succeeded earlier but another one followed it.
    :raises AuthorityConflictError: the expected authority is not the room's (the compare-and-swap failed).
    :raises CapacityExceededError: the room's or the gateway's budget is full.
    :raises MisuseError: ``engine`` is not a SQLAlchemy Engine.
    :raises StorageError: the database failed underneath; nothing was committed.
    """
    lim = in_force(limits)
    room_id = _room_id(room_id, lim)
    expected_gateway = _actor_id(expected_gateway_id, "expected_gateway_id", lim)
    new_gateway = _actor_id(new_gateway_id, "new_gateway_id", lim)
    claim_id = _event_id(event_id, lim)
    expected = _epoch(expected_epoch, "expected_epoch", MAX_EPOCH - 1)
    timestamp = clock(now)
    target_epoch = expected + 1
    claim = PreparedEvent(
        claim_id, "authority.claimed", _system_actor_json("authority-control", lim),
        _claim_payload_json(expected_gateway, new_gateway, target_epoch, lim), target_epoch, control=True)

    def body(tx: RoomTransaction) -> ClaimedRoom:
        room = tx.require_room(tx.lock_room(room_id), room_id)
        existing = tx.load_event(room_id, claim_id)
        if existing is not None:
            if not claim.same_content(existing):
                raise EventConflictError("event_id already exists with different content")
            if room["authority_gateway_id"] != new_gateway or int(room["authority_epoch"]) != target_epoch:
                raise AuthoritySupersededError("authority claim succeeded but was later superseded")
            replay = room_to_dict(_live(room), idempotent=True)
            # A live room read with next_seq: latest_seq is there.
            return cast(ClaimedRoom, {**replay, "claim_event": event_to_dict(existing, idempotent=True)})
        require_authority(room, expected_gateway, expected, "hosted room authority changed")
        [row] = tx.append_locked(
            room, [claim], now=timestamp,
            change=RoomChange(authority_gateway_id=new_gateway, authority_epoch=target_epoch,
                              fence=(expected_gateway, expected)),
            error=AuthorityConflictError("hosted room authority changed"))
        claimed = {**room, "authority_gateway_id": new_gateway, "authority_epoch": target_epoch,
                   "next_seq": int(room["next_seq"]) + 1, "revision": int(room["revision"]) + 1,
                   "updated_at": timestamp}
        return cast(ClaimedRoom, {**room_to_dict(_live(claimed)), "claim_event": event_to_dict(row)})

    return run_room_write(engine, lim, body)


def _live(room: RowLike) -> dict[str, Any]:
    # The reference's claim result is read without disbanded_at (the room is live anyway).
    return {key: value for key, value in room.items() if key != "disbanded_at"}


@traced("disband_room")
def disband_room(
    engine: EngineSource, *, room_id: str, expected_gateway_id: str, expected_epoch: int, now: float | None = None,
    limits: Limits | None = None,
) -> DisbandedRoom:
    """Tombstone a room with a fenced ``room.disbanded`` event and retire its id permanently (idempotent).

    The same transaction prunes disbanded rooms past retention (as :func:`prune_disbanded_rooms` does).

    :param engine: the store: an :class:`~sqlalchemy.Engine`, or a zero-argument factory returning one.
    :param room_id: the room to disband.
    :param expected_gateway_id: the gateway that holds the room's authority.
    :param expected_epoch: that authority's epoch.
    :param now: the time to record, in Unix seconds (default: the wall clock).
    :param limits: the limits in force (default: :mod:`hostedrooms.limits`).
    :returns: ``room_id``, ``disbanded_at`` and the ``event``; a repeat is ``idempotent`` (with
        ``history_expired`` once the room was pruned).
    :raises InvalidInputError: an argument is invalid.
    :raises RoomNotFoundError: the room never existed.
    :raises AuthorityConflictError: the expected authority is not the room's.
    :raises RoomConflictError: the room changed under the disband's fence.
    :raises CapacityExceededError: the room's or the gateway's budget is full.
    :raises MisuseError: ``engine`` is not a SQLAlchemy Engine.
    :raises StorageError: the database failed underneath (:class:`~hostedrooms.errors.StoreUnavailableError`
        when a retry may help); nothing was committed.
    """
    lim = in_force(limits)
    room_id = _room_id(room_id, lim)
    expected_gateway = _actor_id(expected_gateway_id, "expected_gateway_id", lim)
    expected = _epoch(expected_epoch, "expected_epoch")
    timestamp = clock(now)
    payload_json = _payload_json({"room_id": room_id}, lim)
    actor_json = _system_actor_json("room-control", lim)

    def body(tx: RoomTransaction) -> DisbandedRoom:
        room = tx.lock_room(room_id)
        replay = _disband_replay(tx, room_id, room)
        if replay is not None:
            return replay
        assert room is not None  # _disband_replay raised or replayed otherwise
        require_authority(room, expected_gateway, expected, "stale hosted room authority")
        event = PreparedEvent(
            "system:room-disbanded", "room.disbanded", actor_json, payload_json, int(room["authority_epoch"]),
            control=True)
        [row] = tx.append_locked(
            room, [event], now=timestamp,
            change=RoomChange(disbanded_at=timestamp, fence=(expected_gateway, expected)),
            error=RoomConflictError("hosted room disband lost its fence"))
        tx.retire([room_id])
        tx.prune_disbanded(now=timestamp, max_gateway_event_bytes=tx.limits.MAX_GATEWAY_EVENT_BYTES)
        return {"room_id": room_id, "disbanded_at": timestamp, "idempotent": False, "event": event_to_dict(row)}

    # Disband prunes, and pruners must not interleave: hold every gateway budget shard from the start.
    return run_room_write(engine, lim, body, exclusive=True)


def _disband_replay(tx: RoomTransaction, room_id: str, room: RowLike | None) -> DisbandedRoom | None:
    """The idempotent replay for a retired or already-disbanded room; None when the room is live."""
    if room is None:
        retired_at = tx.store.retired_at(room_id)
        if retired_at is None:
            raise RoomNotFoundError("hosted room not found")
        return {"room_id": room_id, "disbanded_at": retired_at, "idempotent": True, "history_expired": True}
    if room["disbanded_at"] is None:
        return None
    tx.retire([room_id])
    event = tx.load_event(room_id, "system:room-disbanded")
    replay: DisbandedRoom = {"room_id": room_id, "disbanded_at": float(room["disbanded_at"]), "idempotent": True}
    if event is not None:
        replay["event"] = event_to_dict(event, idempotent=True)
    return replay


@traced("prune_disbanded_rooms")
def prune_disbanded_rooms(engine: EngineSource, *, now: float | None = None, limits: Limits | None = None) -> int:
    """Purge disbanded rooms past retention or beyond the tombstone cap; their ids stay retired forever.

    :param engine: the store: an :class:`~sqlalchemy.Engine`, or a zero-argument factory returning one.
    :param now: the time retention is measured at, in Unix seconds (default: the wall clock).
    :param limits: the limits in force (default: :mod:`hostedrooms.limits`).
    :returns: how many rooms were purged.
    :raises MisuseError: ``engine`` is not a SQLAlchemy Engine.
    :raises StorageError: the database failed underneath (:class:`~hostedrooms.errors.StoreUnavailableError`
        when a retry may help); nothing was committed.
    """
    timestamp = clock(now)
    return run_room_write(engine, limits, lambda tx: tx.prune_disbanded(now=timestamp), exclusive=True)

"""Appending to and reading the room log (the native service).

Both appends validate everything first (the reference's checks, in its order), then make one call,
:meth:`RoomTransaction.append <hostedrooms.rooms.transaction.RoomTransaction.append>`, which runs the store's
one-statement append or the full path; the result dicts are built here from the rows written and the replays.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from ..engines import EngineSource, resolve_engine
from ..errors import InvalidInputError
from ..limits import Limits, in_force
from ..records import Actor, Authority, EventPage, EventRecord, NewEvent, ReplayPage
from ..store import RowLike
from ..telemetry import count_appended, traced
from ..uow import UnitOfWork
from ..validation import clock
from .pages import appended, event_to_dict, fit_page, parse_all, replay_page
from .rules import (
    _EVENT_FIELDS,
    PreparedEvent,
    _actor_id,
    _BatchMemo,
    _bounded_limit,
    _epoch,
    _non_negative,
    _room_id,
    _validated_event,
    max_event_bytes,
    room_stop_event,
)
from .transaction import append_room, require_room

__all__ = ["append_event", "append_events", "read_events", "request_room_stop"]

#: Validated events with their normalised actors, in the caller's order.
_Prepared = Sequence[tuple[PreparedEvent, dict[str, str]]]


@traced("append_event")
def append_event(
    engine: EngineSource, *, room_id: str, event_id: str, kind: str, actor: Actor, payload: dict[str, Any],
    authority_gateway_id: str, authority_epoch: int, now: float | None = None, limits: Limits | None = None,
) -> EventRecord:
    """Append one immutable event at the room's next sequence number under the authority fence.

    Repeating an ``event_id`` with identical content returns the original (even after the room was disbanded
    or its authority moved, as the reference does); different content raises EventConflictError.

    :param engine: the store: an :class:`~sqlalchemy.Engine`, or a zero-argument factory returning one.
    :param room_id: the room to append to.
    :param event_id: the caller's idempotency key, unique within the room.
    :param kind: the event kind; the actor's kind decides which kinds it may append.
    :param actor: who appends: a mapping with the actor's ``kind`` and ``id``.
    :param payload: the event's JSON object (at most MAX_JSON_DEPTH deep and MAX_EVENT_BYTES serialised).
    :param authority_gateway_id: the gateway that holds the room's authority, as the caller believes.
    :param authority_epoch: that authority's epoch; a stale pair is refused (the fence).
    :param now: the append time in Unix seconds (default: the wall clock).
    :param limits: the limits in force (default: :mod:`hostedrooms.limits`).
    :returns: the stored event, with its ``seq``; ``idempotent`` is true when it is a replay of a stored one.
    :raises InvalidInputError: an argument is invalid (nothing was read or written).
    :raises RoomNotFoundError: the room does not exist or is disbanded
        (:class:`~hostedrooms.errors.RoomHistoryExpiredError` once its history was pruned).
    :raises EventConflictError: ``event_id`` is stored with different content.
    :raises AuthorityConflictError: ``authority_gateway_id``/``authority_epoch`` is not the room's authority.
    :raises CapacityExceededError: the room's or the gateway's event or byte budget is full (``limit`` names it).
    :raises MisuseError: ``engine`` is not a SQLAlchemy Engine (an async engine, say).
    :raises StorageError: the database failed underneath (:class:`~hostedrooms.errors.StoreUnavailableError`
        when a retry may help); nothing was committed.
    """
    lim = in_force(limits)
    room_id = _room_id(room_id, lim)
    event, normalized_actor, gateway_id, epoch = _validated_event(
        event_id, kind, actor, payload, authority_gateway_id, authority_epoch, lim)
    [result] = _append(engine, lim, room_id, [(event, normalized_actor)], gateway_id, epoch, clock(now))
    return result


@traced("append_events")
def append_events(
    engine: EngineSource, room_id: str, events: list[NewEvent] | tuple[NewEvent, ...], authority_gateway_id: str,
    authority_epoch: int, now: float | None = None, *, limits: Limits | None = None,
) -> list[EventRecord]:
    """Append many events to one room in one transaction: all or nothing, at contiguous seqs, in order.

    Each item is a mapping with ``event_id``, ``kind``, ``actor`` and ``payload`` validated as
    :func:`append_event` does. An item whose ``event_id`` already exists (or repeats an earlier item) with the
    same content is a replay (returned with ``idempotent: True`` and its original seq); different content
    raises EventConflictError and nothing is written. At most MAX_LOG_LIMIT items.

    :param engine: the store: an :class:`~sqlalchemy.Engine`, or a zero-argument factory returning one.
    :param room_id: the room to append to.
    :param events: one to MAX_LOG_LIMIT mappings, each with ``event_id``, ``kind``, ``actor`` and ``payload``
        (no other key).
    :param authority_gateway_id: the gateway that holds the room's authority, as the caller believes.
    :param authority_epoch: that authority's epoch; a stale pair is refused (the fence).
    :param now: the append time in Unix seconds (default: the wall clock).
    :param limits: the limits in force (default: :mod:`hostedrooms.limits`).
    :returns: one stored event per item, in the items' order (replays with ``idempotent: True``).
    :raises InvalidInputError: an argument or an item is invalid, or there are no or too many items (nothing
        was read or written).
    :raises RoomNotFoundError: the room does not exist or is disbanded.
    :raises EventConflictError: an item's ``event_id`` is stored, or repeated in the batch, with other content.
    :raises AuthorityConflictError: ``authority_gateway_id``/``authority_epoch`` is not the room's authority.
    :raises CapacityExceededError: the batch would overflow the room's or the gateway's budget.
    :raises MisuseError: ``engine`` is not a SQLAlchemy Engine.
    :raises StorageError: the database failed underneath; nothing was committed.
    """
    lim = in_force(limits)
    room_id = _room_id(room_id, lim)
    gateway_id = _actor_id(authority_gateway_id, "authority_gateway_id", lim)
    epoch = _epoch(authority_epoch, "authority_epoch")
    if not isinstance(events, (list, tuple)) or not events:
        raise InvalidInputError("events must be a non-empty list", field="events")
    if len(events) > lim.MAX_LOG_LIMIT:
        raise InvalidInputError("too many events", field="events")
    prepared: list[tuple[PreparedEvent, dict[str, str]]] = []
    memo = _BatchMemo(gateway_id, epoch)
    for item in events:
        if type(item) is not dict and not isinstance(item, Mapping):  # (the exact type first: the ABC check is slow)
            raise InvalidInputError("each event must be an object", field="events")
        if not item.keys() <= _EVENT_FIELDS:
            unknown = sorted(str(name) for name in item.keys() - _EVENT_FIELDS)
            raise InvalidInputError(f"unknown event fields: {', '.join(unknown)}", field="events")
        event, actor, _, _ = _validated_event(
            item.get("event_id"), item.get("kind"), item.get("actor"), item.get("payload"), gateway_id, epoch, lim,
            memo)
        prepared.append((event, actor))
    return _append(engine, lim, room_id, prepared, gateway_id, epoch, clock(now))


def _append(
    engine: EngineSource, lim: Limits, room_id: str, prepared: _Prepared, gateway_id: str, epoch: int, now: float
) -> list[EventRecord]:
    """The one append path of both services: one room write, then the result dict of each item in order."""
    events = [event for event, _ in prepared]
    written, replays = append_room(engine, lim, room_id, events, gateway_id=gateway_id, epoch=epoch, now=now)
    count_appended(events, written)
    return _results(prepared, written, replays)


def _results(
    prepared: _Prepared, written: Sequence[RowLike], replays: Mapping[str, RowLike]
) -> list[EventRecord]:
    """Each item's dict: the first item of each written event id is the fresh row (its actor as given, its
    payload parsed once for the lot); a replay, or a repeat of an item written by this call, is idempotent."""
    if len(written) == len(prepared) == 1:  # the commonest case: one new event
        return [appended(written[0], dict(prepared[0][1]))]
    if len(written) == len(prepared):  # every item is new and written in order
        parsed = parse_all([row["payload_json"] for row in written])
        return [appended(row, dict(actor), payload)
                for row, (_, actor), payload in zip(written, prepared, parsed, strict=True)]
    fresh = {row["event_id"]: row for row in written}
    payloads = dict(zip(fresh, parse_all([row["payload_json"] for row in written]), strict=True))
    results: list[EventRecord] = []
    for event, actor in prepared:
        event_id = event.event_id
        if event_id in payloads:
            results.append(appended(fresh[event_id], dict(actor), payloads.pop(event_id)))
        else:
            results.append(event_to_dict(replays.get(event_id) or fresh[event_id], idempotent=True))
    return results


@traced("read_events")
def read_events(
    engine: EngineSource, *, room_id: str, since_seq: int = 0, limit: int = 100, include_disbanded: bool = False,
    limits: Limits | None = None,
) -> EventPage:
    """A monotonic page of the room log after ``since_seq`` whose whole serialized form fits MAX_LOG_PAGE_BYTES.

    A stored event that cannot be decoded (written before MAX_JSON_DEPTH, by the reference or by hand) raises
    StorageError naming the room and seq; a room purged while it is read raises RoomHistoryExpiredError.

    :param engine: the store: an :class:`~sqlalchemy.Engine`, or a zero-argument factory returning one.
    :param room_id: the room to read.
    :param since_seq: return events after this sequence number (0: from the start); the page's ``cursor`` is
        the value for the next call.
    :param limit: at most this many events (1 to MAX_LOG_LIMIT); fewer when the byte budget is reached first.
    :param include_disbanded: also read a disbanded room (its log is kept until it is pruned).
    :param limits: the limits in force (default: :mod:`hostedrooms.limits`).
    :returns: the page: ``events``, ``cursor``, ``latest_seq``, ``has_more``, the room's ``authority`` and the
        store's ``lineage``.
    :raises InvalidInputError: an argument is invalid, or ``since_seq`` is ahead of the room's log.
    :raises RoomNotFoundError: the room does not exist (or is disbanded, unless ``include_disbanded``).
    :raises RoomHistoryExpiredError: the room was pruned, before or while it was read.
    :raises MisuseError: ``engine`` is not a SQLAlchemy Engine.
    :raises StorageError: the database failed, or a stored event cannot be decoded.
    """
    return _read(engine, room_id, since_seq, limit, include_disbanded, limits, exact=False)


def read_events_exact(
    engine: EngineSource, *, room_id: Any, since_seq: Any = 0, limit: Any = 100, include_disbanded: bool = False,
    limits: Limits | None = None,
) -> EventPage:
    """Tests only: :func:`read_events` on the plain path (rows through ``execute()``, one ``json.loads`` per text,
    the page serialised to check its size), the oracle the fast path is compared with."""
    return _read(engine, room_id, since_seq, limit, include_disbanded, limits, exact=True)


def _read(
    engine: EngineSource, room_id: Any, since_seq: Any, limit: Any, include_disbanded: bool, limits: Limits | None,
    *, exact: bool,
) -> EventPage:
    lim = in_force(limits)
    room_id = _room_id(room_id, lim)
    since = _non_negative(since_seq, "since_seq")
    page_size = _bounded_limit(limit, lim.MAX_LOG_LIMIT)
    page_bytes = int(lim.MAX_LOG_PAGE_BYTES)
    with UnitOfWork(resolve_engine(engine), write=False, statement_snapshots=True) as uow:
        store, connection = uow.rooms, uow.connection
        if exact:
            return _with_lineage(_read_plain(uow, room_id, since, page_size, page_bytes, include_disbanded),
                                 uow.backend.lineage(connection))
        # The head and the page are read consistently with each other (store.read_page).
        head, rows, row_bytes = store.read_page(
            room_id, since=since, limit=page_size, max_bytes=page_bytes,
            max_event_bytes=max_event_bytes(lim))
        # After the page: a standby promoted in between still holds every event the page read.
        lineage = uow.backend.lineage(connection)
        room = require_room(uow, head, room_id, include_disbanded=include_disbanded)
    latest_seq = int(room["next_seq"]) - 1
    if since > latest_seq:
        raise InvalidInputError("since_seq is ahead of the hosted room log", field="since_seq")
    authority: Authority = {"gateway_id": room["authority_gateway_id"], "epoch": int(room["authority_epoch"])}
    return _with_lineage(replay_page(room_id, rows, row_bytes, since=since, latest_seq=latest_seq,
                                     authority=authority, max_bytes=page_bytes), lineage)


def _with_lineage(page: ReplayPage, lineage: str) -> EventPage:
    """The page with the store's lineage (added after fitting: the reference's size rule is unchanged)."""
    return {"events": page["events"], "cursor": page["cursor"], "latest_seq": page["latest_seq"],
            "has_more": page["has_more"], "authority": page["authority"], "lineage": lineage}


def _read_plain(
    uow: UnitOfWork, room_id: str, since: int, page_size: int, page_bytes: int, include_disbanded: bool
) -> ReplayPage:
    """The plain path: the head, then the page through ``execute()``, each event decoded by event_to_dict, and
    fit_page, which serialises the page to check its size."""
    store = uow.rooms
    room = require_room(uow, store.room_head(room_id), room_id, include_disbanded=include_disbanded)
    latest_seq = int(room["next_seq"]) - 1
    authority: Authority = {"gateway_id": room["authority_gateway_id"], "epoch": int(room["authority_epoch"])}
    if since > latest_seq:
        raise InvalidInputError("since_seq is ahead of the hosted room log", field="since_seq")
    rows = store.event_page(
        room_id, since=since, latest_seq=latest_seq, limit=page_size, max_bytes=page_bytes)
    if not rows and since < latest_seq:
        # Each statement may read at its own snapshot: the room may have been purged (disbanded, then pruned)
        # after its row was read. Read it again, so that is reported as such.
        require_room(uow, store.room_head(room_id), room_id, include_disbanded=include_disbanded)
    events = [event_to_dict(row) for row in rows]
    return fit_page(room_id, events, since=since, latest_seq=latest_seq, authority=authority, max_bytes=page_bytes)


@traced("request_room_stop")
def request_room_stop(
    engine: EngineSource, *, room_id: str, cancel_id: str, expected_gateway_id: str, expected_epoch: int,
    limits: Limits | None = None,
) -> EventRecord:
    """Append an idempotent ``room.stop_requested`` fence that supersedes earlier user turns (wall clock).

    The authority gateway appends it (as its actor) as :func:`append_event` does; its event id derives from
    ``cancel_id``, so the same request again returns the stored event.

    :param engine: the store: an :class:`~sqlalchemy.Engine`, or a zero-argument factory returning one.
    :param room_id: the room to stop.
    :param cancel_id: the caller's idempotency key for this stop request.
    :param expected_gateway_id: the gateway that holds the room's authority.
    :param expected_epoch: that authority's epoch.
    :param limits: the limits in force (default: :mod:`hostedrooms.limits`).
    :returns: the stored ``room.stop_requested`` event.
    :raises InvalidInputError: an argument is invalid.
    :raises RoomNotFoundError: the room does not exist or is disbanded.
    :raises EventConflictError: ``cancel_id`` was already used with another ``expected_gateway_id``.
    :raises AuthorityConflictError: the expected authority is not the room's.
    :raises CapacityExceededError: the room's or the gateway's budget is full.
    :raises StorageError: the database failed underneath; nothing was committed.
    """
    lim = in_force(limits)
    stop = room_stop_event(cancel_id=cancel_id, expected_gateway_id=expected_gateway_id,
                           expected_epoch=expected_epoch, limits=lim)
    return append_event(engine, room_id=room_id, **stop, limits=lim)

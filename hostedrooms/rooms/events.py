"""Appending to and reading the room log (the native service).

The common append takes a shorter path to the same end (:func:`_fast_append`): one ``UPDATE ... RETURNING``
checks the fence and room limits, allocates the seqs, locks the row and (PostgreSQL) takes the budget lock shared
and counts the sharers; one ``INSERT`` adds the events, on PostgreSQL only if the gateway total read by that
later statement leaves the sharers' slack. Whatever does not fit rolls back and takes the full path.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.exc import IntegrityError

from ..engines import EngineSource
from ..errors import (
    EventConflictError,
    HostedRoomError,
)
from ..uow import UnitOfWork
from ..validation import (
    clock,
    utf8_len,
)
from .rows import _appended, _parse_all, _unserialisable, event_to_dict
from .rules import (
    _EVENT_FIELDS,
    Limits,
    PreparedEvent,
    _actor_id,
    _BatchMemo,
    _bounded_limit,
    _epoch,
    _lim,
    _non_negative,
    _room_id,
    _validated_event,
    max_event_bytes,
    room_stop_event,
)
from .transaction import (
    _BUDGETED_INSERT_EVENT,
    _FAST_ADVANCE,
    RoomTransaction,
    _events,
    _fast_advance_concurrent,
    _insert_events,
    _require_authority,
    _require_room,
    _resolve,
    _rooms,
    run_room_write,
)

# --- events ----------------------------------------------------------------------------------------------------



def append_event(
    engine: EngineSource, *, room_id: Any, event_id: Any, kind: Any, actor: Any, payload: Any,
    authority_gateway_id: Any = None, authority_epoch: Any = None, now: float | None = None,
    limits: Limits | None = None,
) -> dict[str, Any]:
    """Append one immutable event at the room's next sequence number under the authority fence.

    Repeating an ``event_id`` with identical content returns the original (even after the room was disbanded
    or its authority moved, as the reference does); different content raises EventConflictError.
    """
    lim = _lim(limits)
    room_id = _room_id(room_id, lim)
    event, normalized_actor, gateway_id, epoch = _validated_event(
        event_id, kind, actor, payload, authority_gateway_id, authority_epoch, lim)
    timestamp = clock(now)
    bound = _resolve(engine)
    try:
        [row] = run_room_write(bound, lim, lambda tx: _fast_append(tx, room_id, [event], gateway_id, timestamp))
        return _appended(row, normalized_actor)
    except _TakeFullPath:
        pass  # a replay, a conflict, a stale authority or a limit: the full path decides which

    def body(tx: RoomTransaction) -> dict[str, Any]:
        # Lock the room first: a concurrent append of the same event_id then waits and replays it.
        locked = tx.lock_room(room_id)
        existing = tx.load_event(room_id, event.event_id)
        if existing is not None:
            if not event.same_content(existing):
                raise EventConflictError("event_id already exists with different content")
            return event_to_dict(existing, idempotent=True)
        room = tx.require_room(locked, room_id)
        _require_authority(room, gateway_id, epoch, "stale hosted room authority")
        [row] = tx.append_locked(room, [event], now=timestamp)
        return _appended(row, normalized_actor)

    return run_room_write(bound, lim, body)


class _TakeFullPath(Exception):
    """Internal signal: the fast append did not apply; roll back and take the full path."""


def _fast_append(
    tx: RoomTransaction, room_id: str, events: Sequence[PreparedEvent], gateway_id: str, now: float
) -> list[dict[str, Any]]:
    """Append ``events`` with one guarded UPDATE ... RETURNING and one INSERT, or raise :class:`_TakeFullPath`.

    The UPDATE checks the authority fence, that the room is live and its count and byte limits, and allocates the
    seqs; where writers are serialised (SQLite) it checks the gateway total too. Where they run concurrently
    (PostgreSQL) the gateway budget is then checked as the full path does (shared budget lock, sharers' slack),
    but only the common case passes here. A batch holding a control kind takes the full path (the reserves apply
    per event); otherwise checking the batch's last event against the limits is checking each of them, since
    counts and bytes only grow. A stored (or repeated) event_id surfaces as the unique constraint. Whatever does
    not apply here rolls back, and the full path then replays, refuses or reports it with the reference's errors.
    """
    lim = tx.limits
    control = events[0].control
    if len(events) > 1 and any(event.control for event in events):
        raise _TakeFullPath
    count_reserve, byte_reserve = (
        (lim.CONTROL_EVENT_COUNT_RESERVE, lim.CONTROL_EVENT_BYTE_RESERVE) if control else (0, 0))
    count, size = len(events), sum(event.size for event in events)
    gateway_limit = lim.MAX_GATEWAY_EVENT_BYTES + byte_reserve
    serialised = tx.exclusive
    if not serialised and size > max_event_bytes(lim):
        raise _TakeFullPath  # a sharer may add only what the other sharers' slack assumed
    connection = tx.uow.connection
    advance = _FAST_ADVANCE if serialised else _fast_advance_concurrent(tx.uow.dialect)
    advanced = advance.first(connection, {
        "fast_room_id": room_id, "fast_gateway_id": gateway_id, "fast_epoch": events[0].authority_epoch,
        "fast_count": count, "fast_max_events": lim.MAX_EVENTS_PER_ROOM + count_reserve - count + 1,
        "fast_size": size, "fast_max_room_bytes": lim.MAX_ROOM_EVENT_BYTES + byte_reserve,
        "fast_max_gateway_bytes": gateway_limit, "fast_now": now})
    if advanced is None:
        raise _TakeFullPath
    first_seq = int(advanced[0]) - count
    rows = [
        {"room_id": room_id, "seq": first_seq + index, "event_id": event.event_id, "kind": event.kind,
         "actor_json": event.actor_json, "authority_epoch": event.authority_epoch,
         "payload_json": event.payload_json, "created_at": now}
        for index, event in enumerate(events)]
    try:
        if serialised:
            _insert_events(connection, rows)
        else:
            # The total read now includes this transaction's own bytes: committed + size + slack <= limit.
            budget = gateway_limit - (int(advanced[2]) - 1) * max_event_bytes(lim)
            if len(rows) == 1:
                if _BUDGETED_INSERT_EVENT.rowcount(connection, {**rows[0], "budget": budget}) != 1:
                    raise _TakeFullPath
            else:
                if tx.gateway_event_bytes() > budget:
                    raise _TakeFullPath
                _insert_events(connection, rows)
    except IntegrityError as exc:  # an event_id exists (or repeats): replays or a conflict
        raise _TakeFullPath from exc
    return rows



def append_events(
    engine: EngineSource, room_id: Any, events: Any, authority_gateway_id: Any, authority_epoch: Any,
    now: float | None = None, *, limits: Limits | None = None,
) -> list[dict[str, Any]]:
    """Append many events to one room in one transaction: all or nothing, at contiguous seqs, in order.

    Each item is a mapping with ``event_id``, ``kind``, ``actor`` and ``payload`` validated as
    :func:`append_event` does. An item whose ``event_id`` already exists (or repeats an earlier item) with the
    same content is a replay (returned with ``idempotent: True`` and its original seq); different content
    raises EventConflictError and nothing is written. At most MAX_LOG_LIMIT items.
    """
    lim = _lim(limits)
    room_id = _room_id(room_id, lim)
    gateway_id = _actor_id(authority_gateway_id, "authority_gateway_id", lim)
    epoch = _epoch(authority_epoch, "authority_epoch")
    if not isinstance(events, (list, tuple)) or not events:
        raise HostedRoomError("events must be a non-empty list")
    if len(events) > lim.MAX_LOG_LIMIT:
        raise HostedRoomError("too many events")
    prepared: list[tuple[PreparedEvent, dict[str, str]]] = []
    memo = _BatchMemo(gateway_id, epoch)
    for item in events:
        if not isinstance(item, Mapping):
            raise HostedRoomError("each event must be an object")
        if not item.keys() <= _EVENT_FIELDS:
            unknown = sorted(str(name) for name in item.keys() - _EVENT_FIELDS)
            raise HostedRoomError(f"unknown event fields: {', '.join(unknown)}")
        event, actor, _, _ = _validated_event(
            item.get("event_id"), item.get("kind"), item.get("actor"), item.get("payload"), gateway_id, epoch, lim,
            memo)
        prepared.append((event, actor))
    timestamp = clock(now)
    bound = _resolve(engine)
    try:
        batch = [event for event, _ in prepared]
        rows = run_room_write(bound, lim, lambda tx: _fast_append(tx, room_id, batch, gateway_id, timestamp))
        payloads = _parse_all([row["payload_json"] for row in rows])
        return [_appended(row, dict(actor), payload)
                for row, (_, actor), payload in zip(rows, prepared, payloads, strict=True)]
    except _TakeFullPath:
        pass  # replays, a conflict, a control kind, a stale authority or a limit: the full path decides

    def body(tx: RoomTransaction) -> list[dict[str, Any]]:
        locked = tx.lock_room(room_id)
        stored = tx.load_events(room_id, [event.event_id for event, _ in prepared])
        fresh: dict[str, PreparedEvent] = {}
        for event, _ in prepared:
            seen = stored.get(event.event_id)
            earlier = fresh.get(event.event_id)
            if (seen is not None and not event.same_content(seen)) or (earlier is not None and earlier != event):
                raise EventConflictError("event_id already exists with different content")
            if seen is None and earlier is None:
                fresh[event.event_id] = event
        written: dict[str, dict[str, Any]] = {}
        if fresh:
            room = tx.require_room(locked, room_id)
            _require_authority(room, gateway_id, epoch, "stale hosted room authority")
            written = {row["event_id"]: row for row in tx.append_locked(room, list(fresh.values()), now=timestamp)}
        results: list[dict[str, Any]] = []
        returned: set[str] = set()
        for event, actor in prepared:
            if event.event_id in written and event.event_id not in returned:
                results.append(_appended(written[event.event_id], dict(actor)))
            else:
                results.append(event_to_dict(stored.get(event.event_id) or written[event.event_id], idempotent=True))
            returned.add(event.event_id)
        return results

    return run_room_write(bound, lim, body)


def read_events(
    engine: EngineSource, *, room_id: Any, since_seq: Any = 0, limit: Any = 100, include_disbanded: bool = False,
    limits: Limits | None = None,
) -> dict[str, Any]:
    """A monotonic page of the room log after ``since_seq`` whose whole serialized form fits MAX_LOG_PAGE_BYTES.

    A stored event that cannot be decoded (written before MAX_JSON_DEPTH, by the reference or by hand) raises
    StorageError naming the room and seq; a room purged while it is read raises RoomHistoryExpiredError.
    """
    lim = _lim(limits)
    room_id = _room_id(room_id, lim)
    since = _non_negative(since_seq, "since_seq")
    page_size = _bounded_limit(limit, lim.MAX_LOG_LIMIT)
    page_bytes = int(lim.MAX_LOG_PAGE_BYTES)
    with UnitOfWork(_resolve(engine), write=False) as uow:
        found = uow.connection.execute(
            select(_rooms.c.next_seq, _rooms.c.authority_gateway_id, _rooms.c.authority_epoch,
                   _rooms.c.disbanded_at).where(_rooms.c.room_id == room_id)).mappings().first()
        room = _require_room(uow, found, room_id, include_disbanded=include_disbanded)
        latest_seq = int(room["next_seq"]) - 1
        authority = {"gateway_id": room["authority_gateway_id"], "epoch": int(room["authority_epoch"])}
        if since > latest_seq:
            raise HostedRoomError("since_seq is ahead of the hosted room log")
        rows = uow.connection.execute(_page_query(uow, room_id, since, latest_seq, page_size, page_bytes)).mappings()
        events = [event_to_dict(row) for row in rows]
        if not events and since < latest_seq:
            # PostgreSQL reads each statement at its own snapshot: the room may have been purged (disbanded, then
            # pruned) after its row was read. Read it again, so that is reported as such.
            again = uow.connection.execute(select(_rooms.c.room_id, _rooms.c.disbanded_at).where(
                _rooms.c.room_id == room_id)).mappings().first()
            _require_room(uow, again, room_id, include_disbanded=include_disbanded)

    def build(page: list[dict[str, Any]]) -> dict[str, Any]:
        cursor = page[-1]["seq"] if page else since
        return {"events": page, "cursor": cursor, "latest_seq": latest_seq, "has_more": cursor < latest_seq,
                "authority": authority}

    def fits(page: list[dict[str, Any]]) -> bool:
        try:
            text = json.dumps(build(page), ensure_ascii=False, separators=(",", ":"))
        except RecursionError:  # a decodable but very deep value stored before MAX_JSON_DEPTH (or by the reference)
            raise _unserialisable(room_id, page) from None
        return utf8_len(text) <= page_bytes

    if events and not fits(events):
        # Binary-search the largest prefix whose serialized page fits the budget.
        low, high = 1, len(events)
        while low < high:
            middle = (low + high + 1) // 2
            low, high = (middle, high) if fits(events[:middle]) else (low, middle - 1)
        events = events[:low]
        if not fits(events):
            raise HostedRoomError("hosted room event exceeds replay page limit")
    elif not events and since < latest_seq:
        # The next event alone outweighs a page (only with a lowered MAX_LOG_PAGE_BYTES); an empty page with
        # has_more would make a reader spin forever.
        raise HostedRoomError("hosted room event exceeds replay page limit")
    return build(events)



def _page_query(uow: UnitOfWork, room_id: str, since: int, latest_seq: int, page_size: int, page_bytes: int) -> Any:
    """Events after ``since`` (at most ``page_size``) while their running raw byte sum fits ``page_bytes``."""
    size = (uow.dialect.byte_length(_events.c.event_id) + uow.dialect.byte_length(_events.c.kind)
            + uow.dialect.byte_length(_events.c.actor_json) + uow.dialect.byte_length(_events.c.payload_json))
    # seq <= latest_seq keeps the page consistent with the room row read just before (PostgreSQL reads each
    # statement at its own snapshot, so later appends could otherwise show up beyond latest_seq).
    candidates = (
        select(*_events.c, func.sum(size).over(order_by=_events.c.seq).label("cumulative_bytes"))
        .where(_events.c.room_id == room_id, _events.c.seq > since, _events.c.seq <= latest_seq)
        .order_by(_events.c.seq).limit(page_size).cte("candidates"))
    return (select(*(candidates.c[column.name] for column in _events.c))
            .where(candidates.c.cumulative_bytes <= page_bytes).order_by(candidates.c.seq))


def request_room_stop(
    engine: EngineSource, *, room_id: Any, cancel_id: Any, expected_gateway_id: Any, expected_epoch: Any,
    limits: Limits | None = None,
) -> dict[str, Any]:
    """Append an idempotent ``room.stop_requested`` fence that supersedes earlier user turns (wall clock)."""
    lim = _lim(limits)
    stop = room_stop_event(cancel_id=cancel_id, expected_gateway_id=expected_gateway_id,
                           expected_epoch=expected_epoch, limits=lim)
    return append_event(engine, room_id=room_id, **stop, limits=lim)


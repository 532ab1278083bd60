"""The room write transaction: :class:`RoomTransaction` and :func:`run_room_write`.

Concurrency
-----------
SQLite serialises write transactions (``BEGIN IMMEDIATE``). On PostgreSQL (READ COMMITTED):

* writers to one room serialise on that room's row (``SELECT ... FOR UPDATE``, always the first lock taken);
  writers to different rooms do not block each other;
* ``create_room`` serialises on a room-creation advisory lock, which makes the active-room cap exact and turns
  a concurrent create of the same id into the idempotent replay;
* the gateway-wide byte limit is a sum over every room, which no row lock protects. Writers take a *shared*
  advisory lock on the gateway budget (sharers never block each other) and count how many transactions hold it
  (``n``, themselves included). A writer adding ``b`` bytes proceeds only if
  ``committed + b + (n - 1) * max_event_bytes <= limit``: every transaction that could commit alongside it either
  committed before its sum was read or held the lock when it counted, and none of those adds more than
  ``max_event_bytes`` (writers adding more take the exclusive path). Of any set of concurrent writers the one that
  locked last therefore saw room for all of them, so the committed total never exceeds the limit. A writer that
  does not fit (near the limit, or a big batch) restarts its transaction holding the lock *exclusively*: it
  waits for every sharer, sees the exact total, and then behaves exactly like the reference (prune disbanded
  rooms, then refuse). Pruning and disbanding always run exclusively, so two pruners never delete the same rows.
  Lock order is always: room-creation lock, room row, gateway budget lock, so no cycle can form.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from sqlalchemy import ColumnElement, Connection, Engine, Select, bindparam, delete, func, insert, select, update

from .. import models
from ..dialect import StoreDialect
from ..engines import EngineSource, resolve_engine
from ..errors import (
    AuthorityConflictError,
    HostedRoomError,
    RoomHistoryExpiredError,
    RoomNotFoundError,
)
from ..statements import HotStatement
from ..uow import UnitOfWork
from .rules import Limits, PreparedEvent, RowLike, _lim, max_event_bytes

#: Advisory lock keys ("hosted" + n); 1 is the migration lock.
GATEWAY_BYTES_LOCK_KEY = 0x686F737465640002
ROOM_CREATION_LOCK_KEY = 0x686F737465640003

_HISTORY_FULL = "This Group Chat reached its history limit. Start a new Group Chat to continue."
_ROOM_FULL = "This Group Chat reached its storage limit. Start a new Group Chat to continue."
_GATEWAY_FULL = "Group Chat storage is full on this host. Delete an old Group Chat and try again."
_TOO_MANY_ROOMS = "This host has too many active Group Chats. Delete one and try again."
_SEQUENCE_FENCE = "hosted room sequence advance lost its write fence"

_rooms = models.rooms
_events = models.events
_retired = models.retired_ids
# Rows of a purged room are deleted from these tables, in this order, before the room itself.
_DEPENDENT_TABLES = (models.remote_runs, models.links, models.peer_reservations, models.events)

_T = TypeVar("_T")

# Hot-path statements, built once (construction and cache-key generation are a large share of an append).
_SELECT_ROOM = select(*_rooms.c).where(_rooms.c.room_id == bindparam("room_id"))
_SELECT_EVENT = select(*_events.c).where(
    _events.c.room_id == bindparam("room_id"), _events.c.event_id == bindparam("event_id"))
_SELECT_RETIRED = select(_retired.c.room_id).where(_retired.c.room_id == bindparam("room_id"))
#: Accounted event bytes of every room on this gateway (live and disbanded).
_GATEWAY_TOTAL = select(func.coalesce(func.sum(_rooms.c.event_bytes), 0))
_SUM_EVENT_BYTES = HotStatement(_GATEWAY_TOTAL)
_HOT_INSERT_EVENT = HotStatement(insert(_events), column_keys=[column.name for column in _events.c])
_LOCK_ROOM: dict[str, Select[Any]] = {}
_all_rooms = _rooms.alias("all_rooms")
# The whole of an uncontended single append where writers are serialised (SQLite): one guarded UPDATE checks the
# authority fence, the room is live, the count and byte limits (the reserves already in the bound limits) and the
# gateway total, and allocates the seq. No row means "not this easy": the transaction is rolled back and the
# full path runs, so its errors and their precedence are the reference's.
_FAST_GUARDS = (
    _rooms.c.room_id == bindparam("fast_room_id"),
    _rooms.c.authority_gateway_id == bindparam("fast_gateway_id"),
    _rooms.c.authority_epoch == bindparam("fast_epoch"),
    _rooms.c.disbanded_at.is_(None),
    _rooms.c.next_seq <= bindparam("fast_max_events"),
    _rooms.c.event_bytes + bindparam("fast_size") <= bindparam("fast_max_room_bytes"))
_FAST_ADVANCE_ROOM = (
    update(_rooms)
    .values(next_seq=_rooms.c.next_seq + bindparam("fast_count"),
            event_bytes=_rooms.c.event_bytes + bindparam("fast_size"), updated_at=bindparam("fast_now"))
    .returning(_rooms.c.next_seq))
# Serialised writers (SQLite): the gateway total is exact inside the same UPDATE.
_FAST_ADVANCE = HotStatement(_FAST_ADVANCE_ROOM.where(
    *_FAST_GUARDS,
    select(func.coalesce(func.sum(_all_rooms.c.event_bytes), 0)).scalar_subquery() + bindparam("fast_size")
    <= bindparam("fast_max_gateway_bytes")))
# Concurrent writers (PostgreSQL): the same UPDATE also takes the gateway budget lock shared and counts its
# holders (after the room row: the documented lock order); the INSERT then adds the row only if the gateway total,
# read by that later statement (so after the sharers were counted), leaves room for the other sharers' slack.
_FAST_CONCURRENT: dict[str, HotStatement] = {}
_BUDGETED_INSERT_EVENT = HotStatement(insert(_events).from_select(
    [column.name for column in _events.c],
    select(*(bindparam(column.name, type_=column.type) for column in _events.c)).where(
        _GATEWAY_TOTAL.scalar_subquery() <= bindparam("budget"))))


def _fast_advance_concurrent(dialect: StoreDialect) -> HotStatement:
    stmt = _FAST_CONCURRENT.get(dialect.name)
    if stmt is None:
        stmt = _FAST_CONCURRENT[dialect.name] = HotStatement(_FAST_ADVANCE_ROOM.where(*_FAST_GUARDS).returning(
            *dialect.lock_shared_and_count(GATEWAY_BYTES_LOCK_KEY)))
    return stmt



def _require_authority(room: RowLike, gateway_id: str, epoch: int, message: str) -> None:
    if room["authority_gateway_id"] != gateway_id or int(room["authority_epoch"]) != epoch:
        raise AuthorityConflictError(message)


# --- the write transaction -------------------------------------------------------------------------------------


class NeedExclusiveGatewayLock(Exception):
    """Internal signal: restart the transaction holding the gateway byte-budget lock exclusively."""


class RoomTransaction:
    """One room write transaction: the unit of work, the limits in force, and the gateway budget lock state.

    Reusable in-transaction helpers for other services (replicas): :meth:`lock_room`, :meth:`require_room`,
    :meth:`load_events`, :meth:`check_capacity`, :meth:`append_locked`, :meth:`prune_disbanded`,
    :meth:`gateway_event_bytes`, :meth:`lock_room_creation`, :meth:`check_room_slot`. Use :func:`run_room_write` to
    run a body with the retry into exclusive mode, or pass ``exclusive=True`` to skip the shared fast path.
    """

    def __init__(self, uow: UnitOfWork, limits: Limits | None = None, *, exclusive: bool = False) -> None:
        self.uow = uow
        self.limits = _lim(limits)
        # Where writers never overlap (SQLite) the budget is always exact: behave as the exclusive holder.
        self.exclusive = exclusive or not uow.dialect.concurrent_writers
        self._gateway_locked = False
        self._holders = 1

    # -- locks and reads --

    def lock_room_creation(self) -> None:
        """Serialise room creation (exact active-room cap; concurrent creates of one id replay)."""
        self.uow.dialect.serialize(self.uow.connection, ROOM_CREATION_LOCK_KEY)

    def _lock_gateway(self) -> int:
        """Take the gateway budget lock (once); return how many transactions may add bytes alongside."""
        if not self._gateway_locked:
            connection = self.uow.connection
            if self.exclusive:
                self.uow.dialect.serialize(connection, GATEWAY_BYTES_LOCK_KEY)
            else:
                self._holders = self.uow.dialect.serialize_shared(connection, GATEWAY_BYTES_LOCK_KEY)
            self._gateway_locked = True
        return 1 if self.exclusive else self._holders

    def lock_room(self, room_id: str) -> RowLike | None:
        """Every column of a room (live or disbanded), row-locked until the transaction ends; None if absent."""
        dialect = self.uow.dialect
        stmt = _LOCK_ROOM.get(dialect.name)
        if stmt is None:
            stmt = _LOCK_ROOM[dialect.name] = dialect.for_update(_SELECT_ROOM)
        return self.uow.connection.execute(stmt, {"room_id": room_id}).mappings().first()

    def is_retired(self, room_id: str) -> bool:
        """Whether ``room_id`` is permanently retired."""
        return self.uow.connection.execute(_SELECT_RETIRED, {"room_id": room_id}).first() is not None

    def require_room(
        self, row: RowLike | None, room_id: str, *, include_disbanded: bool = False
    ) -> RowLike:
        """``row`` if it is a (live) room, else the reference's not-found or history-expired error."""
        return _require_room(self.uow, row, room_id, include_disbanded=include_disbanded)

    def load_event(self, room_id: str, event_id: str) -> RowLike | None:
        """One event row by id, or None."""
        params = {"room_id": room_id, "event_id": event_id}
        return self.uow.connection.execute(_SELECT_EVENT, params).mappings().first()

    def load_events(self, room_id: str, event_ids: Sequence[str]) -> dict[str, RowLike]:
        """Event rows by id (only those that exist)."""
        stmt = select(*_events.c).where(_events.c.room_id == room_id, _events.c.event_id.in_(list(event_ids)))
        return {row["event_id"]: row for row in self.uow.connection.execute(stmt).mappings()}

    def gateway_event_bytes(self) -> int:
        """Accounted event bytes of every room on this gateway (live and disbanded)."""
        total = _SUM_EVENT_BYTES.first(self.uow.connection, {})
        return int(total[0]) if total is not None else 0

    # -- capacity --

    def check_room_slot(self) -> None:
        """Refuse one more active room beyond MAX_ACTIVE_ROOMS (exact under :meth:`lock_room_creation`)."""
        active = self.uow.connection.execute(
            select(func.count()).select_from(_rooms).where(_rooms.c.disbanded_at.is_(None))).scalar_one()
        if int(active) >= self.limits.MAX_ACTIVE_ROOMS:
            raise HostedRoomError(_TOO_MANY_ROOMS)

    def check_capacity(
        self, room: RowLike, events: Sequence[PreparedEvent], *, uncounted_room_bytes: int = 0
    ) -> None:
        """Refuse ``events`` (appended in order) beyond the room's count/byte limits or the gateway's bytes.

        Control kinds may use the control reserves. When the gateway total would overflow, disbanded rooms are
        pruned first (exclusive mode only; in shared mode :class:`NeedExclusiveGatewayLock` is raised instead).
        ``uncounted_room_bytes``: bytes ``room`` already holds that the gateway total does not count yet (a room
        about to be inserted with a copied log); they must fit the gateway without the control reserve.
        """
        lim = self.limits
        count, room_bytes = int(room["next_seq"]) - 1, int(room["event_bytes"])
        for event in events:
            count_reserve, byte_reserve = (
                (lim.CONTROL_EVENT_COUNT_RESERVE, lim.CONTROL_EVENT_BYTE_RESERVE) if event.control else (0, 0))
            if count >= lim.MAX_EVENTS_PER_ROOM + count_reserve:
                raise HostedRoomError(_HISTORY_FULL)
            size = event.size
            if room_bytes + size > lim.MAX_ROOM_EVENT_BYTES + byte_reserve:
                raise HostedRoomError(_ROOM_FULL)
            count, room_bytes = count + 1, room_bytes + size
        steps = [(event.size, event.control) for event in events]
        self._check_gateway([(uncounted_room_bytes, False), *steps] if uncounted_room_bytes else steps)

    def _check_gateway(self, steps: Sequence[tuple[int, bool]]) -> None:
        """``steps``: the (bytes, control) additions in order."""
        lim = self.limits
        per_writer = max_event_bytes(lim)
        if not self.exclusive and sum(size for size, _ in steps) > per_writer:
            raise NeedExclusiveGatewayLock  # sharers may only add what the others' slack assumed
        slack = (self._lock_gateway() - 1) * per_writer
        current = self.gateway_event_bytes()
        added = 0
        for size, control in steps:
            added += size
            limit = lim.MAX_GATEWAY_EVENT_BYTES + (lim.CONTROL_EVENT_BYTE_RESERVE if control else 0)
            if current + added + slack <= limit:
                continue
            if not self.exclusive:
                raise NeedExclusiveGatewayLock
            if self.prune_disbanded(now=None, max_gateway_event_bytes=max(0, limit - added), current_bytes=current):
                current = self.gateway_event_bytes()
            if current + added > limit:
                raise HostedRoomError(_GATEWAY_FULL)

    # -- writes --

    def append_locked(
        self,
        room: RowLike,
        events: Sequence[PreparedEvent],
        *,
        now: float,
        values: dict[str, Any] | None = None,
        where: Sequence[ColumnElement[bool]] = (),
        error: BaseException | None = None,
        check: bool = True,
    ) -> list[dict[str, Any]]:
        """Capacity-check, then append ``events`` at the room's next seqs under a fenced room update.

        ``room`` must come from :meth:`lock_room` in this transaction. The room update advances ``next_seq`` and
        ``event_bytes`` and sets ``updated_at`` plus ``values``, guarded by ``next_seq`` and ``where``; unless
        exactly one row changes, ``error`` is raised (default: a RuntimeError). Returns the inserted rows as dicts.
        """
        if check:
            self.check_capacity(room, events)
        room_id, first_seq = room["room_id"], int(room["next_seq"])
        stmt = (
            update(_rooms)
            .where(_rooms.c.room_id == room_id, _rooms.c.next_seq == first_seq, *where)
            .values(next_seq=first_seq + len(events),
                    event_bytes=_rooms.c.event_bytes + sum(event.size for event in events),
                    updated_at=now, **(values or {})))
        self.uow.fenced(stmt, error if error is not None else RuntimeError(_SEQUENCE_FENCE))
        rows = [
            {"room_id": room_id, "seq": first_seq + index, "event_id": event.event_id, "kind": event.kind,
             "actor_json": event.actor_json, "authority_epoch": event.authority_epoch,
             "payload_json": event.payload_json, "created_at": now}
            for index, event in enumerate(events)]
        _insert_events(self.uow.connection, rows)
        return rows

    def retire(self, room_ids: Sequence[str]) -> None:
        """Reserve the ids of these disbanded rooms permanently (retired_at = disbanded_at)."""
        rows = self.uow.connection.execute(
            select(_rooms.c.room_id, _rooms.c.disbanded_at.label("retired_at"))
            .where(_rooms.c.room_id.in_(list(room_ids)), _rooms.c.disbanded_at.is_not(None))).mappings().all()
        if rows:
            stmt = self.uow.dialect.insert(_retired).on_conflict_do_nothing(index_elements=[_retired.c.room_id])
            self.uow.connection.execute(stmt, [dict(row) for row in rows])

    def prune_disbanded(
        self, *, now: float | None, max_gateway_event_bytes: int | None = None, current_bytes: int | None = None
    ) -> int:
        """Purge disbanded rooms past retention (when ``now`` is given), beyond the tombstone cap, and (oldest
        first) while the gateway holds more than ``max_gateway_event_bytes``; their ids stay retired.

        Takes the gateway budget lock exclusively (pruners must not interleave); returns the rooms purged.
        """
        if not self.exclusive:
            raise NeedExclusiveGatewayLock
        self._lock_gateway()
        lim, connection = self.limits, self.uow.connection
        disbanded = _rooms.c.disbanded_at.is_not(None)
        room_order = self.uow.dialect.bytewise(_rooms.c.room_id)
        candidates: set[str] = set()
        if now is not None:
            cutoff = now - lim.DISBANDED_ROOM_RETENTION_SECONDS
            candidates.update(connection.execute(
                select(_rooms.c.room_id).where(disbanded, _rooms.c.disbanded_at <= cutoff)).scalars())
        candidates.update(connection.execute(
            select(_rooms.c.room_id).where(disbanded).order_by(_rooms.c.disbanded_at.desc(), room_order.asc())
            .offset(lim.MAX_DISBANDED_ROOM_TOMBSTONES)).scalars())
        if max_gateway_event_bytes is not None:
            retained = self.gateway_event_bytes() if current_bytes is None else current_bytes
            if retained > max_gateway_event_bytes:
                oldest_first = connection.execute(
                    select(_rooms.c.room_id, _rooms.c.event_bytes).where(disbanded)
                    .order_by(_rooms.c.disbanded_at.asc(), room_order.asc()))
                for room_id, room_bytes in oldest_first:
                    candidates.add(room_id)
                    retained -= int(room_bytes)
                    if retained <= max_gateway_event_bytes:
                        break
        if not candidates:
            return 0
        room_ids = sorted(candidates)
        self.retire(room_ids)
        for table in _DEPENDENT_TABLES:
            connection.execute(delete(table).where(table.c.room_id.in_(room_ids)))
        connection.execute(delete(_rooms).where(_rooms.c.room_id.in_(room_ids)))
        return len(room_ids)


def _require_room(
    uow: UnitOfWork, row: RowLike | None, room_id: str, *, include_disbanded: bool = False
) -> RowLike:
    if row is not None and (include_disbanded or row["disbanded_at"] is None):
        return row
    # A retained disband tombstone still has replayable history; only a purged, retired id has expired.
    if row is None:
        retired = uow.connection.execute(_SELECT_RETIRED, {"room_id": room_id}).first()
        if retired is not None:
            raise RoomHistoryExpiredError("Group Chat history expired; room_id remains permanently retired")
    raise RoomNotFoundError("hosted room not found")


def _resolve(engine: EngineSource) -> Engine:
    return resolve_engine(engine)


def run_room_write(
    engine: EngineSource, limits: Limits | None, body: Callable[[RoomTransaction], _T], *, exclusive: bool = False
) -> _T:
    """Run ``body`` in one committed write transaction; if it needs the gateway budget lock exclusively, run it
    again from the start holding it (the first attempt rolled back completely)."""
    bound = _resolve(engine)
    while True:
        try:
            with UnitOfWork(bound) as uow:
                result = body(RoomTransaction(uow, limits, exclusive=exclusive))
                uow.commit()
                return result
        except NeedExclusiveGatewayLock:
            if exclusive:  # pragma: no cover - exclusive transactions never raise it
                raise
            exclusive = True

def _insert_events(connection: Connection, rows: Sequence[dict[str, Any]]) -> None:
    if len(rows) == 1:
        _HOT_INSERT_EVENT.rowcount(connection, rows[0])
    else:
        _HOT_INSERT_EVENT.run_many(connection, rows)

"""The room log's store: every statement the rooms service runs, behind one interface, one class per backend.

Like an event-sourcing recorder, a :class:`RoomStore` owns its SQL and the backend algorithms built from it;
the services above it validate, apply the reference's rules and error precedence, and call it inside their
unit of work. The statements both backends share are built here once per store; what differs (the row lock,
the one-statement append, the gateway budget) is in :mod:`.sqlite` and :mod:`.postgresql`.

A store is bound to one unit of work's connection (:meth:`RoomStore.bind`; a unit's ``uow.rooms``): its methods
take no connection. The statements are built once per backend, in the backend's prototype
(:func:`hostedrooms.store.room_store`), and shared by every bound copy.

The one-statement append (:meth:`RoomStore.append_one_statement`) is a shorter path to what the full path (lock
the room, read, check, then :meth:`RoomStore.append_locked`) does for the common append: it either writes exactly
what the full path would write, or writes nothing the caller keeps (it returns None and the caller rolls the
transaction back and takes the full path, which decides the replay, conflict or refusal).
``tests/services/test_rooms_paths.py`` runs generated operations both ways and compares every outcome;
:meth:`RoomStore.without_one_statement` is the switch those tests use. Either path wakes the room's followers
when it commits (a ``NOTIFY`` where readers listen): the store sends it beside the rows it writes.

The gateway byte budget is an escrow table, ``hosted_room_budget`` (:data:`hostedrooms.models.budget`): a few
shards whose ``used`` sum to every room's ``event_bytes``, each with an ``allowance`` it may fill without asking
anyone (``CHECK (used <= allowance)``). :meth:`RoomStore.take_budget` and the one-statement append add bytes to
one shard; :meth:`RoomStore.lock_budget` locks every shard and reads the exact total, and
:meth:`RoomStore.settle_budget` then writes the new total and spreads the free bytes again. Every statement that
changes a room's bytes runs beside one of those in the same transaction (the protocol is in
:mod:`hostedrooms.rooms.transaction`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from sqlalchemy import (
    BigInteger,
    BindParameter,
    ColumnElement,
    Select,
    and_,
    bindparam,
    case,
    delete,
    func,
    insert,
    select,
    text,
    update,
)
from sqlalchemy.exc import IntegrityError

from ... import models
from ...advisory_keys import ROOM_CREATION_LOCK_KEY
from ...backends import ROOM_EVENTS_CHANNEL, Backend
from ...limits import Limits
from ...statements import HotStatement
from ..bound import BoundStore

__all__ = [
    "REPLAY_COLUMNS",
    "ROOM_CREATION_LOCK_KEY",
    "EventLike",
    "OneStatementAppend",
    "RoomChange",
    "RoomStore",
    "RowLike",
    "int64",
]

#: A row as a mapping: a SQLAlchemy RowMapping or a plain dict of column values.
RowLike = Mapping[Any, Any]
#: What :meth:`RoomStore.append_one_statement` returns when it applies: the rows it wrote, or (having written
#: nothing) the stored rows of the events' ids, by id.
OneStatementAppend = tuple[list[dict[str, Any]], dict[str, RowLike]]

_rooms = models.rooms
_events = models.events
_retired = models.retired_ids
_budget = models.budget
_EVENT_COLUMNS = [column.name for column in _events.c]
_ROOM_COLUMNS = tuple(column.name for column in _rooms.c)
# The claim lookup repeats idx_hosted_room_events_claims' condition as written (a literal, not a bound kind), so
# both planners can use that partial index instead of walking the room's log backwards.
_CLAIM_EVENT = (
    select(*_events.c)
    .where(_events.c.room_id == bindparam("room_id"), text(models.CLAIM_KIND_CONDITION),
           _events.c.authority_epoch == bindparam("epoch"))
    .order_by(_events.c.seq.desc()).limit(1))
# Rows of a purged room are deleted from these tables, in this order, before the room itself.
_DEPENDENT_TABLES = (models.remote_runs, models.links, models.peer_reservations, models.events)

_SELECT_ROOM = select(*_rooms.c).where(_rooms.c.room_id == bindparam("room_id"))
_SELECT_EVENT = select(*_events.c).where(
    _events.c.room_id == bindparam("room_id"), _events.c.event_id == bindparam("event_id"))
_EVENT_ID_AT = select(_events.c.event_id).where(
    _events.c.room_id == bindparam("room_id"), _events.c.seq == bindparam("seq"))
_SELECT_RETIRED = select(_retired.c.room_id).where(_retired.c.room_id == bindparam("room_id"))
ROOM_HEAD = select(
    _rooms.c.next_seq, _rooms.c.authority_gateway_id, _rooms.c.authority_epoch, _rooms.c.disbanded_at
).where(_rooms.c.room_id == bindparam("room_id"))
ROOM_HEAD_KEYS = ("next_seq", "authority_gateway_id", "authority_epoch", "disbanded_at")
#: The event columns of a replay row (:meth:`RoomStore.replay_rows`), in this order.
REPLAY_COLUMNS = tuple(_EVENT_COLUMNS)
#: Accounted event bytes of every room on this gateway (live and disbanded).
GATEWAY_TOTAL = select(func.coalesce(func.sum(_rooms.c.event_bytes), 0))



def int64(name: str) -> BindParameter[int]:
    """A bound byte count, limit or total of the budget's arithmetic, sent as a 64-bit integer: psycopg binds an int
    in the narrowest integer type that holds it, and PostgreSQL adds two such binds in that width (so a total plus
    a share, each a smallint, overflowed past 32767)."""
    return bindparam(name, type_=BigInteger)


# The guarded advance of the one-statement append: the authority fence, the room is live, its count and byte
# limits (the reserves already in the bound limits); it allocates the seqs. The backends add the budget shard.
# (Its parameters keep the ``fast_`` prefix they always had: the statements' text does not change.)
ONE_STATEMENT_GUARDS = (
    _rooms.c.room_id == bindparam("fast_room_id"),
    _rooms.c.authority_gateway_id == bindparam("fast_gateway_id"),
    _rooms.c.authority_epoch == bindparam("fast_epoch"),
    _rooms.c.disbanded_at.is_(None),
    _rooms.c.next_seq <= int64("fast_max_events"),
    _rooms.c.event_bytes + int64("fast_size") <= int64("fast_max_room_bytes"))
ONE_STATEMENT_ADVANCE = (
    update(_rooms)
    .values(next_seq=_rooms.c.next_seq + int64("fast_count"),
            event_bytes=_rooms.c.event_bytes + int64("fast_size"), updated_at=bindparam("fast_now"))
    .returning(_rooms.c.next_seq))


class EventLike(Protocol):
    """What the store reads of a validated event (:class:`hostedrooms.rooms.PreparedEvent`)."""

    @property
    def event_id(self) -> str: ...
    @property
    def kind(self) -> str: ...
    @property
    def actor_json(self) -> str: ...
    @property
    def payload_json(self) -> str: ...
    @property
    def authority_epoch(self) -> int | None: ...
    @property
    def control(self) -> bool: ...
    @property
    def size(self) -> int: ...


@dataclass(frozen=True, slots=True)
class RoomChange:
    """What a room write sets besides advancing the log; any change also bumps ``revision`` by one.

    ``fence``: the write applies only while the room is live and its authority is exactly this (gateway id,
    epoch); without it, only the room's ``next_seq`` fences the write.
    """

    name: str | None = None
    members_json: str | None = None
    authority_gateway_id: str | None = None
    authority_epoch: int | None = None
    disbanded_at: float | None = None
    fence: tuple[str, int] | None = None

    def values(self) -> dict[str, Any]:
        """The columns this change sets (``revision + 1`` included)."""
        fields = {"name": self.name, "members_json": self.members_json,
                  "authority_gateway_id": self.authority_gateway_id, "authority_epoch": self.authority_epoch,
                  "disbanded_at": self.disbanded_at}
        return {**{key: value for key, value in fields.items() if value is not None},
                "revision": _rooms.c.revision + 1}

    def guards(self) -> list[ColumnElement[bool]]:
        """The WHERE terms of the fence (none without one)."""
        if self.fence is None:
            return []
        gateway_id, epoch = self.fence
        return [_rooms.c.disbanded_at.is_(None), _rooms.c.authority_gateway_id == gateway_id,
                _rooms.c.authority_epoch == epoch]


def event_rows(room_id: str, first_seq: int, events: Sequence[EventLike], now: float) -> list[dict[str, Any]]:
    """The event rows of ``events`` appended at ``first_seq`` onwards."""
    return [
        {"room_id": room_id, "seq": first_seq + index, "event_id": event.event_id, "kind": event.kind,
         "actor_json": event.actor_json, "authority_epoch": event.authority_epoch,
         "payload_json": event.payload_json, "created_at": now}
        for index, event in enumerate(events)]


class RoomStore(BoundStore):
    """The room log on one backend: rooms, their events, retired ids, the room lock and the gateway budget shards.

    Every method runs on :attr:`connection`, inside its unit of work's transaction; none commits. Each backend has
    one prototype (:func:`hostedrooms.store.room_store`), which builds the statements once and is bound to no
    connection; :meth:`bind` gives a unit its copy (``uow.rooms``), sharing them.
    """


    #: Whether write transactions run concurrently, so a writer may take bytes from one budget shard without
    #: locking the others (:mod:`hostedrooms.rooms.transaction`); where writers are serialised every writer
    #: locks the (one) shard and sees the exact total.
    concurrent_writers = False
    #: How many budget shards this backend keeps (the migration creates them; :meth:`lock_budget` restores any
    #: missing one).
    budget_shards = 1
    #: Whether :meth:`append_one_statement` is one statement that may run outside a transaction (autocommit): the
    #: caller may then run it in a unit of its own, which commits it as it runs.
    one_statement_autocommits = False
    #: Tests only (see :meth:`without_one_statement`): False makes every append take the full path.
    one_statement_enabled = True
    #: The budget shard :meth:`append_one_statement` charges by primary key (a bound copy on a connection whose
    #: shard is known: :mod:`hostedrooms.held_autocommit`'s); None: the backend's own choice.
    own_shard: int | None = None

    def __init__(self, backend: Backend) -> None:
        self.backend = backend
        #: The followers' wake-up channel (:mod:`hostedrooms.wakeup`).
        self.channel = ROOM_EVENTS_CHANNEL
        self._lock_room: Select[Any] = backend.for_update(_SELECT_ROOM)
        self._gateway_total = HotStatement(GATEWAY_TOTAL)
        self._room_head = HotStatement(ROOM_HEAD)
        self._insert_event = HotStatement(insert(_events), column_keys=_EVENT_COLUMNS)
        self._take_budget = HotStatement(
            update(_budget).where(self.free_shard(int64("size"), int64("limit")))
            .values(used=_budget.c.used + int64("size")))
        self._lock_budget = backend.for_update(select(_budget.c.shard, _budget.c.used).order_by(_budget.c.shard))
        # Under every shard's lock the spread of ``used`` is free: shard 0 holds the total, each shard an equal share
        # of the free bytes (shard 0 the remainder too; a shard beyond budget_shards, none).
        first = _budget.c.shard == 0
        self._settle_budget = HotStatement(update(_budget).values(
            used=case((first, int64("total")), else_=0),
            allowance=case((first, int64("total") + int64("first_share")),
                           (_budget.c.shard < self.budget_shards, int64("share")), else_=0),
            spread_limit=int64("limit")))
        # The room listing, live rooms only or all (compiled once each; limit and offset bound per call).
        listing = (select(*_rooms.c)
                   .order_by(_rooms.c.updated_at.desc(), backend.bytewise(_rooms.c.room_id).asc())
                   .limit(bindparam("limit")).offset(bindparam("offset")))
        self._list_rooms = {False: HotStatement(listing.where(_rooms.c.disbanded_at.is_(None))),
                            True: HotStatement(listing)}

    @contextlib.contextmanager
    def without_one_statement(self) -> Iterator[None]:
        """Tests only, on the prototype: every append of a unit begun inside the block takes the full path (the
        agreement tests of the one-statement append and the full path)."""
        previous, self.one_statement_enabled = self.one_statement_enabled, False
        try:
            yield
        finally:
            self.one_statement_enabled = previous

    # -- locks ----------------------------------------------------------------------------------------------

    def lock_room_creation(self) -> None:
        """Serialise room creation until the transaction ends."""
        self.backend.advisory_lock(self.connection, ROOM_CREATION_LOCK_KEY)

    def free_shard(self, size: Any, limit: Any) -> ColumnElement[bool]:
        """The WHERE clause picking the budget shard a writer adds ``size`` bytes to: one whose allowance has room
        for them, spread for a gateway limit of at most ``limit`` (none matches when no shard qualifies)."""
        return and_(_budget.c.shard == 0, _budget.c.used + size <= _budget.c.allowance,
                    _budget.c.spread_limit <= limit)

    def take_budget(self, size: int, limit: int) -> bool:
        """Add ``size`` bytes to a budget shard (:meth:`free_shard`) if one has room for them within its
        allowance, spread for a gateway limit of at most ``limit``; whether one did (it stays locked)."""
        return self._take_budget.rowcount(self.connection, {"size": size, "limit": limit}) == 1

    def lock_budget(self, limit: int) -> int:
        """Lock every budget shard (in shard order) until the transaction ends; the exact gateway total.

        A missing shard (a table emptied by hand) is created, and the total then re-read from the rooms and
        settled for ``limit``."""
        rows = self.connection.execute(self._lock_budget).all()
        if {int(shard) for shard, _ in rows} >= set(range(self.budget_shards)):
            return sum(int(used) for _, used in rows)
        stmt = self.backend.insert(_budget).on_conflict_do_nothing(index_elements=[_budget.c.shard])
        self.connection.execute(stmt, [{"shard": shard, "used": 0, "allowance": 0, "spread_limit": 0}
                                  for shard in range(self.budget_shards)])
        self.connection.execute(self._lock_budget).all()
        total = self.gateway_bytes()  # exact: every writer that could change it waits for these locks
        self.settle_budget(total, limit)
        return total

    def settle_budget(self, total: int, limit: int) -> None:
        """Under :meth:`lock_budget`: the gateway total is now ``total``; spread the bytes free below ``limit``
        over the shards (none when the total is at or above it)."""
        share, extra = divmod(max(0, limit - total), self.budget_shards)
        self._settle_budget.rowcount(
            self.connection, {"total": total, "share": share, "first_share": share + extra, "limit": limit})

    def lock_room(self, room_id: str) -> RowLike | None:
        """Every column of a room (live or disbanded), row-locked until the transaction ends; None if absent."""
        return self.connection.execute(self._lock_room, {"room_id": room_id}).mappings().first()

    # -- reads ----------------------------------------------------------------------------------------------

    def room(self, room_id: str) -> RowLike | None:
        """Every column of a room, unlocked (readers)."""
        return self.connection.execute(_SELECT_ROOM, {"room_id": room_id}).mappings().first()

    def room_head(self, room_id: str) -> RowLike | None:
        """A room's ``next_seq``, authority and ``disbanded_at`` (what a replay page needs), unlocked."""
        row = self._room_head.first(self.connection, {"room_id": room_id})
        return None if row is None else dict(zip(ROOM_HEAD_KEYS, row, strict=True))

    def is_retired(self, room_id: str) -> bool:
        """Whether ``room_id`` is permanently retired."""
        return self.connection.execute(_SELECT_RETIRED, {"room_id": room_id}).first() is not None

    def retired_at(self, room_id: str) -> float | None:
        """When ``room_id`` was retired, or None."""
        value = self.connection.execute(select(_retired.c.retired_at).where(_retired.c.room_id == room_id)).scalar()
        return None if value is None else float(value)

    def event(self, room_id: str, event_id: str) -> RowLike | None:
        """One event row by id, or None."""
        params = {"room_id": room_id, "event_id": event_id}
        return self.connection.execute(_SELECT_EVENT, params).mappings().first()

    def events(self, room_id: str, event_ids: Sequence[str]) -> dict[str, RowLike]:
        """Event rows by id (only those that exist)."""
        stmt = select(*_events.c).where(_events.c.room_id == room_id, _events.c.event_id.in_(list(event_ids)))
        return {row["event_id"]: row for row in self.connection.execute(stmt).mappings()}

    def event_id_at(self, room_id: str, seq: int) -> str | None:
        """The id of the event at ``seq`` (by the primary key), or None."""
        value = self.connection.execute(_EVENT_ID_AT, {"room_id": room_id, "seq": seq}).scalar()
        return None if value is None else str(value)

    def claim_event(self, room_id: str, epoch: int) -> RowLike | None:
        """The latest ``authority.claimed`` event of ``epoch``, or None."""
        return self.connection.execute(_CLAIM_EVENT, {"room_id": room_id, "epoch": epoch}).mappings().first()

    def gateway_bytes(self) -> int:
        """Accounted event bytes of every room on this gateway (live and disbanded)."""
        total = self._gateway_total.first(self.connection, {})
        return int(total[0]) if total is not None else 0

    def active_rooms(self) -> int:
        """How many rooms are not disbanded."""
        return int(self.connection.execute(
            select(func.count()).select_from(_rooms).where(_rooms.c.disbanded_at.is_(None))).scalar_one())

    def list_rooms(self, *, include_disbanded: bool, limit: int, offset: int
    ) -> Sequence[RowLike]:
        """Rooms by most recent change, then room id code point by code point (rows as dicts)."""
        cursor = self._list_rooms[include_disbanded].run(self.connection, {"limit": limit, "offset": offset})
        try:
            return [dict(zip(_ROOM_COLUMNS, row, strict=True)) for row in cursor.fetchall()]
        finally:
            cursor.close()

    def event_size(self) -> ColumnElement[Any]:
        """An event row's accounted bytes: the UTF-8 bytes of its id, kind, actor and payload texts."""
        length = self.backend.byte_length
        return (length(_events.c.event_id) + length(_events.c.kind) + length(_events.c.actor_json)
                + length(_events.c.payload_json))

    def event_page(self, room_id: str, *, since: int, latest_seq: int, limit: int, max_bytes: int
    ) -> Sequence[RowLike]:
        """Events after ``since`` up to ``latest_seq`` (at most ``limit``) while their running raw byte sum
        (id, kind, actor and payload texts) fits ``max_bytes``. The plain path (through ``execute()``, rows as
        mappings) that :meth:`replay_rows` must agree with; the exact page path uses it."""
        # seq <= latest_seq keeps the page consistent with the room row read just before (PostgreSQL reads each
        # statement at its own snapshot, so later appends could otherwise show up beyond latest_seq).
        candidates = (
            select(*_events.c, func.sum(self.event_size()).over(order_by=_events.c.seq).label("cumulative_bytes"))
            .where(_events.c.room_id == room_id, _events.c.seq > since, _events.c.seq <= latest_seq)
            .order_by(_events.c.seq).limit(limit).cte("candidates"))
        stmt = (select(*(candidates.c[name] for name in _EVENT_COLUMNS))
                .where(candidates.c.cumulative_bytes <= max_bytes).order_by(candidates.c.seq))
        return self.connection.execute(stmt).mappings().all()

    def replay_rows(self, room_id: str, *, since: int, latest_seq: int, limit: int, max_bytes: int,
        max_event_bytes: int,
    ) -> tuple[list[tuple[Any, ...]], int]:
        """The rows :meth:`event_page` selects, as driver tuples, and their accounted bytes in total.

        Each row holds the :data:`REPLAY_COLUMNS` in order, then one more value of the backend's own (ignore it).
        Compiled-once statements on the cursor. ``max_event_bytes``: the most one event can account for, which
        lets a backend that reads rows incrementally hold at most about one page of them at a time.
        """
        raise NotImplementedError

    def read_page(self, room_id: str, *, since: int, limit: int, max_bytes: int, max_event_bytes: int,
    ) -> tuple[RowLike | None, list[tuple[Any, ...]], int]:
        """A room's head (:meth:`room_head`) and its :meth:`replay_rows` after ``since`` up to the head's latest seq,
        read consistently with each other (the caller's read transaction here; one statement where a backend reads
        without one); ``(None, [], 0)`` when the room does not exist."""
        head = self.room_head(room_id)
        if head is None:
            return None, [], 0
        rows, total = self.replay_rows(
            room_id, since=since, latest_seq=int(head["next_seq"]) - 1, limit=limit, max_bytes=max_bytes,
            max_event_bytes=max_event_bytes)
        return head, rows, total

    # -- writes ---------------------------------------------------------------------------------------------

    def insert_room(self, values: Mapping[str, Any]) -> None:
        """Insert one room row (every column given)."""
        self.connection.execute(insert(_rooms).values(**values))

    def advance_room(self, room_id: str, first_seq: int, events: Sequence[EventLike], *, now: float,
        change: RoomChange | None = None,
    ) -> bool:
        """Advance the room past ``events`` (``next_seq``, ``event_bytes``, ``updated_at``) and apply ``change``,
        only if ``next_seq`` is still ``first_seq`` and ``change``'s fence holds; whether exactly one row did."""
        values: dict[str, Any] = {
            "next_seq": first_seq + len(events),
            "event_bytes": _rooms.c.event_bytes + sum(event.size for event in events), "updated_at": now}
        where = [_rooms.c.room_id == room_id, _rooms.c.next_seq == first_seq]
        if change is not None:
            values.update(change.values())
            where.extend(change.guards())
        return self.connection.execute(update(_rooms).where(*where).values(**values)).rowcount == 1

    def append_locked(
        self, room_id: str, first_seq: int, events: Sequence[EventLike], *, now: float,
        change: RoomChange | None = None,
    ) -> list[dict[str, Any]] | None:
        """The full path's write: :meth:`advance_room`, then the event rows, and the room's followers woken when the
        transaction commits; the rows written, or None (nothing written) when the fence did not hold."""
        if not self.advance_room(room_id, first_seq, events, now=now, change=change):
            return None
        rows = event_rows(room_id, first_seq, events, now)
        self.insert_events(rows)
        self.backend.notify(self.connection, self.channel, room_id)
        return rows

    def insert_events(self, rows: Sequence[Mapping[str, Any]]) -> None:
        """Insert event rows (one statement; an ``executemany`` for several)."""
        if len(rows) == 1:
            self._insert_event.rowcount(self.connection, rows[0])
        else:
            self._insert_event.run_many(self.connection, rows)

    def copy_replica_log(self, room_id: str) -> None:
        """Copy the replica log of ``room_id`` into its room log, row for row (replica promotion)."""
        replica_events = models.replica_events
        self.connection.execute(insert(_events).from_select(
            _EVENT_COLUMNS, select(*(replica_events.c[name] for name in _EVENT_COLUMNS))
            .where(replica_events.c.room_id == room_id)))

    def append_one_statement(self, room_id: str, events: Sequence[EventLike], *, gateway_id: str, now: float,
        limits: Limits,
    ) -> OneStatementAppend | None:
        """Append ``events`` to a live room whose authority is ``gateway_id`` at the events' epoch, adding their
        bytes to this connection's budget shard: the rows written (and no stored rows), or the stored rows of the
        events' ids when some exist (and nothing written), or None when it does not apply (the caller must then
        roll back: this transaction may have written part of it).

        A batch holding a control kind never applies (the reserves apply per event); otherwise checking the
        batch's last event against the limits is checking each of them, since counts and bytes only grow. The
        shard must have room within its allowance, spread for a gateway limit no higher than ``limits``' (so the
        one-statement append refuses nothing and admits nothing the exact check would not); a control event's
        reserve is left to the full path. A stored (or repeated) event_id the backend does not probe for surfaces as the
        unique constraint.
        """
        if len(events) > 1 and any(event.control for event in events):
            return None
        control = events[0].control
        count_reserve = limits.CONTROL_EVENT_COUNT_RESERVE if control else 0
        byte_reserve = limits.CONTROL_EVENT_BYTE_RESERVE if control else 0
        count = len(events)
        params = {
            "fast_room_id": room_id, "fast_gateway_id": gateway_id, "fast_epoch": events[0].authority_epoch,
            "fast_count": count, "fast_max_events": limits.MAX_EVENTS_PER_ROOM + count_reserve - count + 1,
            "fast_size": sum(event.size for event in events),
            "fast_max_room_bytes": limits.MAX_ROOM_EVENT_BYTES + byte_reserve,
            "fast_spread_limit": limits.MAX_GATEWAY_EVENT_BYTES, "fast_now": now}
        try:
            return self._append_one_statement(room_id, events, params, now)
        except IntegrityError:  # an event_id exists (or repeats), or the shard was short: replays, a conflict, a check
            return None

    def _append_one_statement(self, room_id: str, events: Sequence[EventLike], params: dict[str, Any], now: float
    ) -> OneStatementAppend | None:
        """The statements of :meth:`append_one_statement` (its parameters bound as ``fast_*``)."""
        raise NotImplementedError

    def retire(self, room_ids: Sequence[str]) -> None:
        """Reserve the ids of these disbanded rooms permanently (retired_at = disbanded_at)."""
        rows = self.connection.execute(
            select(_rooms.c.room_id, _rooms.c.disbanded_at.label("retired_at"))
            .where(_rooms.c.room_id.in_(list(room_ids)), _rooms.c.disbanded_at.is_not(None))).mappings().all()
        if rows:
            stmt = self.backend.insert(_retired).on_conflict_do_nothing(index_elements=[_retired.c.room_id])
            self.connection.execute(stmt, [dict(row) for row in rows])

    def prunable_rooms(self, *, disbanded_before: float | None, keep: int) -> set[str]:
        """Disbanded rooms disbanded at or before ``disbanded_before`` (when given), and those beyond the ``keep``
        most recently disbanded."""
        disbanded = _rooms.c.disbanded_at.is_not(None)
        found: set[str] = set()
        if disbanded_before is not None:
            found.update(self.connection.execute(
                select(_rooms.c.room_id).where(disbanded, _rooms.c.disbanded_at <= disbanded_before)).scalars())
        found.update(self.connection.execute(
            select(_rooms.c.room_id).where(disbanded)
            .order_by(_rooms.c.disbanded_at.desc(), self.backend.bytewise(_rooms.c.room_id).asc())
            .offset(keep)).scalars())
        return found

    def disbanded_oldest_first(self) -> list[tuple[str, int]]:
        """(room id, accounted event bytes) of every disbanded room, the longest disbanded first."""
        rows = self.connection.execute(
            select(_rooms.c.room_id, _rooms.c.event_bytes).where(_rooms.c.disbanded_at.is_not(None))
            .order_by(_rooms.c.disbanded_at.asc(), self.backend.bytewise(_rooms.c.room_id).asc()))
        return [(str(room_id), int(room_bytes)) for room_id, room_bytes in rows]

    def purge(self, room_ids: Sequence[str]) -> int:
        """Retire these disbanded rooms' ids, then delete the rooms with every row that depends on them; the event
        bytes they accounted for (the caller settles the budget)."""
        freed = self.connection.execute(select(func.coalesce(func.sum(_rooms.c.event_bytes), 0))
                                   .where(_rooms.c.room_id.in_(list(room_ids)))).scalar_one()
        self.retire(room_ids)
        for table in _DEPENDENT_TABLES:
            self.connection.execute(delete(table).where(table.c.room_id.in_(list(room_ids))))
        self.connection.execute(delete(_rooms).where(_rooms.c.room_id.in_(list(room_ids))))
        return int(freed)

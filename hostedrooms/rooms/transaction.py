"""The room write transaction: :class:`RoomTransaction` (the capacity and gateway budget protocol, the full append
path, the in-transaction helpers replicas compose) and :func:`run_room_write` (the retries).

An append first tries the store's one-statement append (:meth:`hostedrooms.store.RoomStore.append_one_statement`);
when that does not apply, the transaction rolls back and the full path runs: lock the room, read, decide the
replay, conflict or refusal in the reference's order, check capacity under the protocol below, then write.

Concurrency
-----------
SQLite serialises write transactions (``BEGIN IMMEDIATE``). On PostgreSQL (READ COMMITTED):

* writers to one room serialise on that room's row (``SELECT ... FOR UPDATE``, always the first lock taken);
  writers to different rooms do not block each other;
* ``create_room`` serialises on a room-creation advisory lock, which makes the active-room cap exact and turns
  a concurrent create of the same id into the idempotent replay;
* the gateway-wide byte limit is a sum over every room, which no room lock protects. It is kept as an *escrow*
  (``hosted_room_budget``, in the gateway's own schema): a few shards whose ``used`` always sum to every room's
  ``event_bytes`` (each statement that changes a room's bytes runs in a transaction that also changes a shard),
  each with an ``allowance`` (``CHECK (used <= allowance)``), the allowances summing to at most the gateway limit
  they were spread for (``spread_limit``). A writer adding ``b`` bytes takes them from one shard (its
  connection's) in one guarded update: ``used + b <= allowance`` and ``spread_limit`` no higher than the
  caller's limit. That shard's row lock is held until commit, so no two writers spend the same allowance, and the
  sum of the allowances bounds the committed total: the total never exceeds the limit, with no count of
  concurrent writers and no lock shared across the gateway. A writer whose shard is short (near the limit, a
  big batch, allowances spread for a higher limit, or a control event's reserve) restarts its transaction in
  *exclusive* mode: it locks every shard in shard order (waiting for every writer holding one), reads the exact
  total (their sum), then behaves exactly like the reference (prune disbanded rooms, then refuse), writes the new
  total and spreads the free bytes below its own limit over the shards again. Pruning and disbanding always run
  exclusively, so two pruners never delete the same rows. Lock order is always: room-creation lock, room row
  (replica row), budget shard(s), so no cycle can form; a transaction holding one shard never asks for the
  others (it restarts instead).

The one-statement append (PostgreSQL) takes its shard inside its own statement, in autocommit; on the thread's held
connection (:func:`append_room`, :mod:`hostedrooms.held_autocommit`) that is the connection's own shard, by primary
key, waiting for a writer that holds it (the lock order is unchanged: the room row first); behind a transaction
pooler, where the next statement may run on another server connection, the held connection has no shard of its
own and the server-side function takes a free one as the pooled attempt does; SQLite's exclusive writer
reads and updates the one counter row instead of summing every room.

A single append (:func:`append_room`) tries the one-statement append first with no unit of work around it where the
engine holds a connection for it: PostgreSQL's held autocommit connection (:func:`_held_attempt`), or SQLite's held
writer (:func:`_writer_attempt`), on which it is a write transaction of its own with everything a write unit on that
writer does around it (the lock file turn, the fork gate, the direct or observed transaction, the commit and the
wake-up, the unit of work's own functions ending the transaction) and the same cleanup on every exit.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from typing import Any, TypeVar

from sqlalchemy import Engine
from sqlalchemy import exc as sa_exc

from .. import forkgate, held_autocommit, writelock
from .. import writer as held_writer
from ..backends import backend_for
from ..engines import EngineSource, resolve_engine
from ..errors import (
    AuthorityConflictError,
    CapacityExceededError,
    EventConflictError,
    RoomHistoryExpiredError,
    RoomNotFoundError,
    translate,
)
from ..limits import Limits, in_force
from ..statements import DirectConnection
from ..store import ROOM_CREATION_LOCK_KEY, RoomChange, RoomStore, RowLike, room_store
from ..store.rooms import OneStatementAppend
from ..telemetry import count_retry
from ..uow import UnitOfWork, commit_transaction, roll_back
from ..wakeup import committed
from .rules import PreparedEvent

__all__ = [
    "ROOM_CREATION_LOCK_KEY",
    "NeedExclusiveGatewayLock",
    "RoomChange",
    "RoomTransaction",
    "TakeFullPath",
    "append_room",
    "require_authority",
    "require_room",
    "run_room_write",
]

_HISTORY_FULL = "This Group Chat reached its history limit. Start a new Group Chat to continue."
_ROOM_FULL = "This Group Chat reached its storage limit. Start a new Group Chat to continue."
_GATEWAY_FULL = "Group Chat storage is full on this host. Delete an old Group Chat and try again."
_TOO_MANY_ROOMS = "This host has too many active Group Chats. Delete one and try again."
_SEQUENCE_FENCE = "hosted room sequence advance lost its write fence"

_T = TypeVar("_T")
_log = logging.getLogger(__name__)


class NeedExclusiveGatewayLock(Exception):
    """Internal signal: restart the transaction holding every gateway budget shard (exclusive mode)."""


class TakeFullPath(Exception):
    """Internal signal: the one-statement append did not apply; restart the transaction on the full path."""


def require_authority(room: RowLike, gateway_id: str, epoch: int, message: str) -> None:
    """Raise AuthorityConflictError(``message``) unless ``room``'s authority is exactly (gateway_id, epoch)."""
    if room["authority_gateway_id"] != gateway_id or int(room["authority_epoch"]) != epoch:
        raise AuthorityConflictError(message)


def require_room(uow: UnitOfWork, row: RowLike | None, room_id: str, *, include_disbanded: bool = False) -> RowLike:
    """``row`` if it is a (live) room, else the reference's not-found or history-expired error."""
    if row is not None and (include_disbanded or row["disbanded_at"] is None):
        return row
    # A retained disband tombstone still has replayable history; only a purged, retired id has expired.
    if row is None and uow.rooms.is_retired(room_id):
        raise RoomHistoryExpiredError("Group Chat history expired; room_id remains permanently retired")
    raise RoomNotFoundError("hosted room not found")


class RoomTransaction:
    """One room write transaction: the unit of work, its store, the limits in force, the gateway budget state.

    Reusable in-transaction helpers for other services (replicas): :meth:`lock_room`, :meth:`require_room`,
    :meth:`load_event`, :meth:`load_events`, :meth:`check_capacity`, :meth:`append_locked`, :meth:`append`,
    :meth:`insert_room`, :meth:`prune_disbanded`, :meth:`gateway_event_bytes`, :meth:`lock_room_creation`,
    :meth:`check_room_slot`. Use :func:`run_room_write` to run a body with its retries, or pass
    ``exclusive=True`` to lock every budget shard from the first check. ``one_statement``: :meth:`append` may try
    the store's one-statement append first (:func:`run_room_write` sets it on a first attempt only).

    :meth:`check_capacity` *reserves* the bytes it admits in the budget: whoever calls it writes exactly those
    bytes to rooms in the same transaction (or fails it). Purges release theirs in :meth:`prune_disbanded`.
    """

    def __init__(
        self, uow: UnitOfWork, limits: Limits | None = None, *, exclusive: bool = False, one_statement: bool = False
    ) -> None:
        self.uow = uow
        self.store: RoomStore = uow.rooms
        self.limits = in_force(limits)
        # Where writers never overlap (SQLite) the budget is always exact: behave as the exclusive holder.
        self.exclusive = exclusive or not self.store.concurrent_writers
        self.one_statement = one_statement and self.store.one_statement_enabled
        #: The exact gateway total while every shard is locked (exclusive mode), else None.
        self._total: int | None = None

    # -- locks and reads --

    def lock_room_creation(self) -> None:
        """Serialise room creation (exact active-room cap; concurrent creates of one id replay)."""
        self.store.lock_room_creation()

    def _lock_gateway(self) -> int:
        """Lock every budget shard (once; exclusive mode) and spread the free bytes again for this transaction's
        limits (the last spread may have been for others); the exact gateway total."""
        if self._total is None:
            limit = self.limits.MAX_GATEWAY_EVENT_BYTES
            self._total = total = self.store.lock_budget(limit)
            self.store.settle_budget(total, limit)
        return self._total

    def _charge(self, delta: int) -> None:
        """Under every shard's lock: the gateway total changes by ``delta``; write it and spread the free bytes."""
        total = self._lock_gateway() + delta
        self._total = total
        self.store.settle_budget(total, self.limits.MAX_GATEWAY_EVENT_BYTES)

    def lock_room(self, room_id: str) -> RowLike | None:
        """Every column of a room (live or disbanded), row-locked until the transaction ends; None if absent."""
        return self.store.lock_room(room_id)

    def is_retired(self, room_id: str) -> bool:
        """Whether ``room_id`` is permanently retired."""
        return self.store.is_retired(room_id)

    def require_room(self, row: RowLike | None, room_id: str, *, include_disbanded: bool = False) -> RowLike:
        """``row`` if it is a (live) room, else the reference's not-found or history-expired error."""
        return require_room(self.uow, row, room_id, include_disbanded=include_disbanded)

    def load_event(self, room_id: str, event_id: str) -> RowLike | None:
        """One event row by id, or None."""
        return self.store.event(room_id, event_id)

    def load_events(self, room_id: str, event_ids: Sequence[str]) -> dict[str, RowLike]:
        """Event rows by id (only those that exist)."""
        return self.store.events(room_id, event_ids)

    def gateway_event_bytes(self) -> int:
        """Accounted event bytes of every room on this gateway (live and disbanded): the budget's exact total
        where every shard is locked, else the sum over every room (read in this statement's snapshot)."""
        if self._total is not None:
            return self._total
        return self.store.gateway_bytes()

    # -- capacity --

    def check_room_slot(self) -> None:
        """Refuse one more active room beyond MAX_ACTIVE_ROOMS (exact under :meth:`lock_room_creation`)."""
        if self.store.active_rooms() >= self.limits.MAX_ACTIVE_ROOMS:
            raise CapacityExceededError(_TOO_MANY_ROOMS, limit="MAX_ACTIVE_ROOMS")

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
                raise CapacityExceededError(_HISTORY_FULL, limit="MAX_EVENTS_PER_ROOM")
            size = event.size
            if room_bytes + size > lim.MAX_ROOM_EVENT_BYTES + byte_reserve:
                raise CapacityExceededError(_ROOM_FULL, limit="MAX_ROOM_EVENT_BYTES")
            count, room_bytes = count + 1, room_bytes + size
        steps = [(event.size, event.control) for event in events]
        self._check_gateway([(uncounted_room_bytes, False), *steps] if uncounted_room_bytes else steps)

    def _check_gateway(self, steps: Sequence[tuple[int, bool]]) -> None:
        """``steps``: the (bytes, control) additions in order; reserves their sum in the budget."""
        lim = self.limits
        if not self.exclusive:
            # One shard's allowance is within the limit without the control reserve, so within every step's.
            if self.store.take_budget(sum(size for size, _ in steps), lim.MAX_GATEWAY_EVENT_BYTES):
                return
            raise NeedExclusiveGatewayLock
        current = self._lock_gateway()
        added = 0
        for size, control in steps:
            added += size
            limit = lim.MAX_GATEWAY_EVENT_BYTES + (lim.CONTROL_EVENT_BYTE_RESERVE if control else 0)
            if current + added <= limit:
                continue
            if self.prune_disbanded(now=None, max_gateway_event_bytes=max(0, limit - added), current_bytes=current):
                current = self._lock_gateway()
            if current + added > limit:
                raise CapacityExceededError(_GATEWAY_FULL, limit="MAX_GATEWAY_EVENT_BYTES")
        self._charge(added)

    # -- writes --

    def insert_room(self, values: Mapping[str, Any]) -> None:
        """Insert one room row (every column given); the caller checked the slot and the id."""
        self.store.insert_room(values)

    def append_locked(
        self, room: RowLike, events: Sequence[PreparedEvent], *, now: float, change: RoomChange | None = None,
        error: BaseException | None = None, check: bool = True,
    ) -> list[dict[str, Any]]:
        """Capacity-check, then append ``events`` at the room's next seqs under a fenced room update.

        ``room`` must come from :meth:`lock_room` in this transaction. The room update advances ``next_seq`` and
        ``event_bytes``, sets ``updated_at`` and applies ``change``, guarded by ``next_seq`` and ``change``'s
        fence; unless exactly one row changes, ``error`` is raised (default: a RuntimeError). Returns the
        inserted rows as dicts.
        """
        if check:
            self.check_capacity(room, events)
        rows = self.store.append_locked(room["room_id"], int(room["next_seq"]), events, now=now, change=change)
        if rows is None:  # the fence did not hold: nothing was written
            raise error if error is not None else RuntimeError(_SEQUENCE_FENCE)
        return rows

    def append(
        self, room_id: str, events: Sequence[PreparedEvent], *, gateway_id: str, epoch: int, now: float
    ) -> tuple[Sequence[RowLike], Mapping[str, RowLike]]:
        """Append ``events`` under the authority fence (``gateway_id``, ``epoch``): the rows written, in order, and
        the stored rows of the events that are replays (by event id).

        An event whose id is stored, or repeats an earlier one, with the same content is a replay; with other
        content it raises EventConflictError and nothing is written. Conflicts are decided first, even in a
        disbanded room or under a moved authority (as the reference does); then the room must be live and the
        authority current, then capacity. With ``one_statement``, the store's one-statement append is tried first and
        :class:`TakeFullPath` raised when it does not apply.
        """
        if self.one_statement:
            outcome = self.store.append_one_statement(
                room_id, events, gateway_id=gateway_id, now=now, limits=self.limits)
            if outcome is None or (outcome[1] and not _all_replays(events, outcome[1])):
                raise TakeFullPath  # (stored ids that are not all replays: nothing was written)
            return outcome
        # Lock the room first: a concurrent append of the same event_id then waits and replays it.
        locked = self.lock_room(room_id)
        stored = self._stored(room_id, events)
        fresh: dict[str, PreparedEvent] = {}
        for event in events:
            seen, earlier = stored.get(event.event_id), fresh.get(event.event_id)
            if (seen is not None and not event.same_content(seen)) or (earlier is not None and earlier != event):
                raise EventConflictError("event_id already exists with different content")
            if seen is None and earlier is None:
                fresh[event.event_id] = event
        if not fresh:
            return [], stored
        room = self.require_room(locked, room_id)
        require_authority(room, gateway_id, epoch, "stale hosted room authority")
        return self.append_locked(room, list(fresh.values()), now=now), stored

    def _stored(self, room_id: str, events: Sequence[PreparedEvent]) -> dict[str, RowLike]:
        """The stored rows of ``events``' ids (one event: a prebuilt lookup instead of an ``IN`` list)."""
        if len(events) == 1:
            row = self.load_event(room_id, events[0].event_id)
            return {} if row is None else {row["event_id"]: row}
        return self.load_events(room_id, [event.event_id for event in events])

    def retire(self, room_ids: Sequence[str]) -> None:
        """Reserve the ids of these disbanded rooms permanently (retired_at = disbanded_at)."""
        self.store.retire(room_ids)

    def prune_disbanded(
        self, *, now: float | None, max_gateway_event_bytes: int | None = None, current_bytes: int | None = None
    ) -> int:
        """Purge disbanded rooms past retention (when ``now`` is given), beyond the tombstone cap, and (oldest
        first) while the gateway holds more than ``max_gateway_event_bytes``; their ids stay retired.

        Locks every budget shard (pruners must not interleave) and releases the purged rooms' bytes; returns the
        rooms purged.
        """
        if not self.exclusive:
            raise NeedExclusiveGatewayLock
        total = self._lock_gateway()
        lim = self.limits
        cutoff = None if now is None else now - lim.DISBANDED_ROOM_RETENTION_SECONDS
        candidates = self.store.prunable_rooms(
            disbanded_before=cutoff, keep=lim.MAX_DISBANDED_ROOM_TOMBSTONES)
        if max_gateway_event_bytes is not None:
            retained = total if current_bytes is None else current_bytes
            if retained > max_gateway_event_bytes:
                for room_id, room_bytes in self.store.disbanded_oldest_first():
                    candidates.add(room_id)
                    retained -= room_bytes
                    if retained <= max_gateway_event_bytes:
                        break
        if not candidates:
            return 0
        room_ids = sorted(candidates)
        self._charge(-self.store.purge(room_ids))
        return len(room_ids)


def _all_replays(events: Sequence[PreparedEvent], stored: Mapping[str, RowLike]) -> bool:
    """Whether every event (each id once) is stored with the same content: the whole append is a replay."""
    return len(stored) == len(events) == len({event.event_id for event in events}) and all(
        event.same_content(stored[event.event_id]) for event in events)


def run_room_write(
    engine: EngineSource, limits: Limits | None, body: Callable[[RoomTransaction], _T], *, exclusive: bool = False,
    lone_append: bool = False, one_statement: bool = True,
) -> _T:
    """Run ``body`` in one committed write transaction. A first attempt may take the one-statement append
    (:meth:`RoomTransaction.append`); if that does not apply, or the body needs every budget shard (exclusive
    mode), the attempt rolls back completely and the body runs again from the start on the full path (in
    exclusive mode when it asked so).

    ``lone_append``: the body is a lone :meth:`RoomTransaction.append`. Where the store's one-statement append
    can commit itself (PostgreSQL), the first attempt then runs in autocommit (:meth:`UnitOfWork.one_statement`):
    one round trip, which either commits everything it wrote or writes nothing (the retry then opens a
    transaction). ``one_statement=False``: the caller tried the one-statement append already; the full path only."""
    bound = resolve_engine(engine)
    one_statement = one_statement and not exclusive
    store = room_store(backend_for(bound))
    while True:
        try:
            # Only an attempt that runs nothing but the one-statement append may run in autocommit.
            autocommit = (one_statement and lone_append and store.one_statement_autocommits
                          and store.one_statement_enabled)
            with UnitOfWork.one_statement(bound) if autocommit else UnitOfWork(bound) as uow:
                result = body(RoomTransaction(uow, limits, exclusive=exclusive, one_statement=one_statement))
                uow.commit()
                return result
        except TakeFullPath:
            one_statement = False
            count_retry("room_write.full_path")
        except NeedExclusiveGatewayLock:
            if exclusive:  # pragma: no cover - exclusive transactions never raise it
                raise
            _log.debug("room write retried holding the gateway budget lock", extra={"event": "room.retry_exclusive"})
            exclusive, one_statement = True, False
            count_retry("room_write.exclusive")
        except CapacityExceededError as exc:
            _log.warning("room write refused: %s", exc.limit, extra={"event": "room.refused", "limit": exc.limit})
            raise


def append_room(
    engine: EngineSource, limits: Limits, room_id: str, events: Sequence[PreparedEvent], *, gateway_id: str,
    epoch: int, now: float,
) -> tuple[Sequence[RowLike], Mapping[str, RowLike]]:
    """A lone :meth:`RoomTransaction.append` (the rows written, the stored replays) as one room write, its first
    attempt the one-statement append alone, with no unit of work around it, where the engine holds a connection
    for it: the calling thread's held autocommit connection (PostgreSQL, :mod:`hostedrooms.held_autocommit`), or
    the held writer (SQLite, :func:`_writer_attempt`). Anything else than rows written or a whole replay (the
    statement declined, no connection to lend) leaves the decision to :func:`run_room_write` (on the full path
    when the attempt ran: it wrote nothing); a driver error is raised as the unit of work's attempt raises it."""
    bound = resolve_engine(engine)
    store = room_store(backend_for(bound))
    tried = False
    if store.one_statement_enabled:
        if store.one_statement_autocommits:
            held = held_autocommit.take(bound)
            tried = held is not None
            outcome = None if held is None else _held_attempt(
                bound, held, store, limits, room_id, events, gateway_id, now)
        else:
            tried, outcome = _writer_attempt(bound, store, limits, room_id, events, gateway_id, now)
        if outcome is not None and (not outcome[1] or _all_replays(events, outcome[1])):
            return outcome
        if tried:
            count_retry("room_write.full_path")
    return run_room_write(
        bound, limits, lambda tx: tx.append(room_id, events, gateway_id=gateway_id, epoch=epoch, now=now),
        lone_append=True, one_statement=not tried)


def _held_attempt(
    engine: Engine, held: held_autocommit.HeldConnection, prototype: RoomStore, limits: Limits, room_id: str,
    events: Sequence[PreparedEvent], gateway_id: str, now: float,
) -> tuple[Sequence[RowLike], dict[str, RowLike]] | None:
    """The one-statement append on ``held`` (given back however it ends); None when it declined. A driver error is
    raised translated, as from a unit of work (the statement is its own transaction: nothing was written)."""
    error: BaseException | None = None
    gated = False
    try:
        forkgate.enter()  # no fork while this thread is inside the driver
        gated = True
        connection = held.open()
        store: RoomStore | None = held.extra
        if store is None:  # bound once per held Connection (its shard: the server process's, known once)
            store = prototype.bind(connection)
            if held.backend_pid is not None:  # else behind a transaction pooler: the server chooses per statement
                store.own_shard = held.backend_pid % store.budget_shards
            held.extra = store
        return store.append_one_statement(room_id, events, gateway_id=gateway_id, now=now, limits=limits)
    except sa_exc.SQLAlchemyError as exc:  # raised as a unit of work raises it (nothing was written)
        error = exc
        raise translate(exc, engine.url) from exc
    except BaseException as exc:
        error = exc
        raise
    finally:
        try:
            held.release(error)
        finally:
            if gated:
                forkgate.leave()


def _writer_attempt(
    engine: Engine, prototype: RoomStore, limits: Limits, room_id: str, events: Sequence[PreparedEvent],
    gateway_id: str, now: float,
) -> tuple[bool, OneStatementAppend | None]:
    """The one-statement append as a write transaction of its own on SQLite's held writer (:mod:`hostedrooms.writer`):
    what a write unit on the held writer does around it, without the unit. The same write-lock turn
    (:mod:`hostedrooms.writelock`), then the fork gate, the writer lent to this thread, the transaction begun
    directly while nothing observes the engine (else by SQLAlchemy, whose events then see it and every statement),
    the commit and the followers' wake-up; every lock released however it ends (an interrupt too), a transaction
    left open rolled back and the connection dropped unless clean (:meth:`HeldWriter.release
    <hostedrooms.writer.HeldWriter.release>`). ``(False, None)``: not run (the engine queues no turn or this
    thread holds it already, the writer is busy now: the unit of work decides then, as for every write);
    ``(True, None)``: the statement declined, nothing was written."""
    if not held_writer.lone_appends:
        return False, None
    turn = writelock.take(engine)  # as UnitOfWork.__enter__: the turn first, then the fork gate, then the writer
    if turn is None:
        return False, None
    try:
        forkgate.enter()
        try:
            writer = held_writer.take(engine, wait=False)
            if writer is None:
                return False, None
            try:
                return True, _on_writer(engine, writer, prototype, limits, room_id, events, gateway_id, now)
            finally:
                writer.release()
        finally:
            forkgate.leave()
    finally:
        turn.release()


def _on_writer(
    engine: Engine, writer: held_writer.HeldWriter, prototype: RoomStore, limits: Limits, room_id: str,
    events: Sequence[PreparedEvent], gateway_id: str, now: float,
) -> OneStatementAppend | None:
    """:func:`_writer_attempt`'s transaction on ``writer`` (lent to this thread); None when the statement declined
    (rolled back). A driver error is raised translated, as a unit of work raises it."""
    connection: DirectConnection | None = None
    done = False
    try:
        connection = writer.open()
        kept = writer.extra
        if kept is not None and kept[0] is connection:
            store: RoomStore = kept[1]
        else:  # bound once per held connection (the prototype's switches are read before each attempt)
            store = prototype.bind(connection)
            writer.extra = (connection, store)
        if connection.fast:  # as UnitOfWork._enter_held
            connection.begin_direct()
        else:
            connection.begin()
        outcome = store.append_one_statement(room_id, events, gateway_id=gateway_id, now=now, limits=limits)
        if outcome is None or (outcome[1] and not _all_replays(events, outcome[1])):
            return None  # rolled back below (stored ids that are not all replays: nothing was written)
        commit_transaction(connection, engine)
        done = True
        committed(engine)  # this engine's followers look now
        return outcome
    except sa_exc.SQLAlchemyError as exc:
        raise translate(exc, engine.url) from exc
    finally:
        if connection is not None and not done:
            roll_back(connection)

"""The room log on PostgreSQL, where writers to different rooms run concurrently (READ COMMITTED).

The one-statement append is one data-modifying CTE, run in autocommit (one round trip, its own transaction): it
probes for the events' ids (a stored id returns the stored row, and nothing is written), advances the room under
its fences and limits (queueing the followers' ``NOTIFY`` in its ``RETURNING``), adds the bytes to this
connection's budget shard, or another with room that no writer holds (``FOR UPDATE SKIP LOCKED``: writers
never wait for each other's shards), and inserts the rows (a batch from one JSON parameter, one ``INSERT``).
The room advance also asks that some shard had room in the statement's snapshot, so a short budget usually
writes nothing; when no shard can pay after all (concurrent writers took the room since), the statement fails
whole (a division by zero, on purpose) and nothing is written. Either way the caller takes the full path. The
event ``INSERT`` never skips a conflict (a skipped row would leave a gap): a concurrent writer of the same id
fails the statement on the unique constraint instead.

On a connection held by the calling thread (:mod:`hostedrooms.held_autocommit`; the store's ``own_shard`` set),
the statement charges that connection's own shard (its backend pid modulo the shard count, known once) by primary
key instead of searching for a free one: when that shard cannot pay, nothing is written and the caller takes the
full path, which takes any free shard or re-spreads the budget.

Behind a transaction pooler (nothing prepared on the server, so this CTE would be planned at every call) the same
append runs as a server-side function, with the same rows and errors: :mod:`.pg_function`. A held connection there
has no ``own_shard`` (the next statement may run on another server connection): the function picks a free shard.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from sqlalchemy import (
    BigInteger,
    BindParameter,
    ColumnElement,
    Float,
    Select,
    Text,
    bindparam,
    cast,
    func,
    literal_column,
    null,
    select,
    text,
    union_all,
)
from sqlalchemy.exc import DataError

from ... import models
from ...backends import Backend
from ...statements import HotStatement
from .base import (
    REPLAY_COLUMNS,
    ROOM_HEAD,
    ROOM_HEAD_KEYS,
    EventLike,
    OneStatementAppend,
    RoomStore,
    RowLike,
    event_rows,
    int64,
)
from .pg_function import PoolerAppend

__all__ = ["PostgreSQLRoomStore"]

_events = models.events
_budget = models.budget
#: Budget shards per gateway: a connection takes bytes from the shard of its backend pid (the statements below
#: write the number out: their text is constant).
_SHARDS = 8


# The part both appends share, after their ``stored`` probe: the room advances under its fences and limits (and
# queues the followers' NOTIFY), then one budget shard pays. (Joined with ``+``: constant texts only, never input,
# which is what the noqa below says.)
def _advance_and_charge(own_shard: bool) -> str:
    """The advance and the charge; ``own_shard``: the shard is the bound ``:own_shard``, charged by primary key (a
    held connection's, whose backend pid is known: no search, no ``SKIP LOCKED``), else the first free one."""
    # The advance also asks that the shard (or some shard) has room in the statement's snapshot, so a short budget
    # usually writes nothing.
    which = "shard = CAST(:own_shard AS integer) AND " if own_shard else ""
    advance = (
        "advanced AS (UPDATE hosted_rooms SET next_seq = next_seq + :fast_count, "  # noqa: S608
        "event_bytes = event_bytes + :fast_size, updated_at = :fast_now "
        "WHERE room_id = :fast_room_id AND authority_gateway_id = :fast_gateway_id "
        "AND authority_epoch = :fast_epoch AND disbanded_at IS NULL AND next_seq <= :fast_max_events "
        "AND event_bytes + :fast_size <= :fast_max_room_bytes AND NOT EXISTS (SELECT 1 FROM stored) "
        "AND EXISTS (SELECT 1 FROM hosted_room_budget WHERE " + which +
        "used + :fast_size <= allowance AND spread_limit <= :fast_spread_limit) "
        "RETURNING next_seq, pg_notify(CAST(:notify_channel AS text), CAST(:fast_room_id AS text))), ")
    if own_shard:
        # Only once the room advanced (its row locked: the lock order). A writer holding the shard is waited for
        # (an autocommit statement's lock is short; the exclusive re-spread's is the full path's), and the row is
        # then checked again as committed.
        return advance + (  # noqa: S608
            "charged AS (UPDATE hosted_room_budget SET used = used + :fast_size "
            "WHERE shard = CAST(:own_shard AS integer) AND EXISTS (SELECT 1 FROM advanced) "
            "AND used + :fast_size <= allowance AND spread_limit <= :fast_spread_limit RETURNING shard), ")
    # Only once the room advanced (its row locked: the lock order), a shard with room, not locked by another
    # writer, the connection's own first.
    return advance + (  # noqa: S608
        "charged AS (UPDATE hosted_room_budget SET used = used + :fast_size WHERE shard = ("
        "SELECT shard FROM hosted_room_budget WHERE EXISTS (SELECT 1 FROM advanced) "
        "AND used + :fast_size <= allowance AND spread_limit <= :fast_spread_limit "
        "ORDER BY mod(shard + 8 - mod(pg_backend_pid(), 8), 8) LIMIT 1 FOR UPDATE SKIP LOCKED) RETURNING shard), ")


# The one-statement append: a data-modifying CTE, constant text (the budget shard is the connection's backend pid
# modulo _SHARDS). Its rows: the room's new next_seq (the other columns NULL) when it advanced, else the stored rows
# of the events' ids (_STORED_KEYS). One event binds its columns; a batch binds its rows as one JSON text (an array
# of [event_id, kind, actor_json, authority_epoch, payload_json]: one parameter to send, which measured faster than
# an array per column), inserted by one INSERT ... SELECT.
def _append_one(own_shard: bool) -> str:
    return (
    "WITH stored AS (SELECT room_id, seq, event_id, kind, actor_json, authority_epoch, payload_json, created_at "  # noqa: S608
    "FROM hosted_room_events WHERE room_id = :fast_room_id AND event_id = CAST(:event_id AS text)), "
    + _advance_and_charge(own_shard) +
    "inserted AS (INSERT INTO hosted_room_events "
    "(room_id, seq, event_id, kind, actor_json, authority_epoch, payload_json, created_at) "
    "SELECT CAST(:fast_room_id AS text), next_seq - 1, CAST(:event_id AS text), CAST(:kind AS text), "
    "CAST(:actor_json AS text), CAST(:authority_epoch AS bigint), CAST(:payload_json AS text), "
    "CAST(:fast_now AS float8) FROM advanced) "
    # An advance no shard could pay for divides by zero here: the whole statement fails, nothing is written.
    "SELECT next_seq / (SELECT count(*) FROM charged), NULL, NULL, NULL, NULL, NULL, NULL, NULL FROM advanced "
    "UNION ALL "
    "SELECT seq, room_id, event_id, kind, actor_json, authority_epoch, payload_json, created_at FROM stored")
# A batch probes each id on its own (a LATERAL lookup, LIMIT 1: one probe of the (room_id, event_id) index per id):
# as a semi-join, the planner hashed the ids against every event of the room, whose cost grew with the log. The ids
# come out of the JSON first (the OFFSET 0 keeps that subquery apart), so the probe compares with a plain value:
# under statistics older than a growing room (analysed while rooms held about one event, until autovacuum analyses
# again) the primary key (room_id, seq) and the unique index cost the same to the planner, which keeps the unique
# index, as for the single append's probe; an expression in the probe (``item ->> 0``) made the unique index cost
# a little more, and the primary key, read with a filter, scanned the whole room for every id.
def _append_batch(own_shard: bool) -> str:
    return (
    "WITH stored AS (SELECT found.* FROM (SELECT value ->> 0 AS id "  # noqa: S608
    "FROM json_array_elements(CAST(:fast_rows AS json)) OFFSET 0) AS batch, LATERAL ("
    "SELECT room_id, seq, event_id, kind, actor_json, authority_epoch, payload_json, created_at "
    "FROM hosted_room_events WHERE room_id = :fast_room_id AND event_id = batch.id LIMIT 1) AS found), "
    + _advance_and_charge(own_shard) +
    "inserted AS (INSERT INTO hosted_room_events "
    "(room_id, seq, event_id, kind, actor_json, authority_epoch, payload_json, created_at) "
    "SELECT CAST(:fast_room_id AS text), advanced.next_seq - :fast_count + item.ord - 1, item.row ->> 0, "
    "item.row ->> 1, item.row ->> 2, CAST(item.row ->> 3 AS bigint), item.row ->> 4, CAST(:fast_now AS float8) "
    "FROM advanced, json_array_elements(CAST(:fast_rows AS json)) WITH ORDINALITY AS item(row, ord) RETURNING 1) "
    # An advance no shard could pay for, or whose rows are not all there, divides by zero here: the whole
    # statement fails, nothing is written.
    "SELECT next_seq / ((SELECT count(*) FROM charged) "
    "* CAST((SELECT count(*) FROM inserted) = :fast_count AS integer)), NULL, NULL, NULL, NULL, NULL, NULL, NULL "
    "FROM advanced "
    "UNION ALL "
    "SELECT seq, room_id, event_id, kind, actor_json, authority_epoch, payload_json, created_at FROM stored")
_APPEND_ONE = _append_one(own_shard=False)
_APPEND_BATCH = _append_batch(own_shard=False)
#: The same on a held connection (:mod:`hostedrooms.held_autocommit`): its own shard, charged by primary key.
_APPEND_ONE_OWN = _append_one(own_shard=True)
_APPEND_BATCH_OWN = _append_batch(own_shard=True)
#: The rows of a batch as JSON text (exact: every text round-trips; validated texts hold no NUL).
_dumps = json.JSONEncoder(ensure_ascii=False, separators=(",", ":")).encode
#: SQLSTATE division_by_zero: the append's advance found no budget shard to pay for it, or (a batch) not every row
#: was inserted (see the statements).
_NO_SHARD_PAID = "22012"


def _int64_binds() -> list[BindParameter[int]]:
    """The statements' byte counts, limits and counts, bound as 64-bit integers (:func:`.base.int64`)."""
    return [int64(name) for name in (
        "fast_size", "fast_spread_limit", "fast_max_room_bytes", "fast_count", "fast_max_events")]



_STORED_KEYS = ("seq", "room_id", "event_id", "kind", "actor_json", "authority_epoch", "payload_json", "created_at")


class PostgreSQLRoomStore(RoomStore):
    """Concurrent writers: the room row lock, then one budget shard (or every shard, in order)."""

    concurrent_writers = True
    budget_shards = _SHARDS
    one_statement_autocommits = True

    def __init__(self, backend: Backend) -> None:
        super().__init__(backend)
        self._append_one = HotStatement(text(_APPEND_ONE).bindparams(*_int64_binds()))
        self._append_batch = HotStatement(text(_APPEND_BATCH).bindparams(*_int64_binds()))
        self._append_one_own = HotStatement(text(_APPEND_ONE_OWN).bindparams(*_int64_binds()))
        self._append_batch_own = HotStatement(text(_APPEND_BATCH_OWN).bindparams(*_int64_binds()))
        # The same append as a server-side function, for engines behind a transaction pooler (pg_function).
        self._pooler_append = PoolerAppend()
        # PostgreSQL sends a statement's whole result at once: the running byte sum is cut in the query, so no
        # more than one page ever leaves the server.
        page_of = self._page_of(bindparam("latest_seq"))
        self._replay = HotStatement(page_of.order_by(page_of.selected_columns.seq), binary_results=True)
        # The head and the page in one statement (one snapshot, one round trip): the head rides as the first row,
        # its columns in the page's (gateway id as room_id, epoch as authority_epoch, disbanded_at as created_at,
        # next_seq as cumulative), told apart by its NULL seq, which sorts first.
        head = ROOM_HEAD.cte("head")
        values: tuple[ColumnElement[Any], ...] = (
            head.c.authority_gateway_id, cast(null(), BigInteger), cast(null(), Text), cast(null(), Text),
            cast(null(), Text), head.c.authority_epoch, cast(null(), Text), cast(head.c.disbanded_at, Float(53)),
            head.c.next_seq)
        head_row = select(*(value.label(name) for name, value in zip(
            (*REPLAY_COLUMNS, "cumulative"), values, strict=True)))
        page = self._page_of(select(head.c.next_seq - 1).scalar_subquery())
        self._read_page = HotStatement(
            union_all(head_row, page).order_by(literal_column("seq").asc().nulls_first()), binary_results=True)

    def _page_of(self, latest_seq: Any) -> Select[Any]:
        """The replay rows after ``:since`` up to ``latest_seq`` whose running byte sum fits ``:max_bytes``
        (unordered: for a part of a UNION)."""
        candidates = (
            select(*_events.c, func.sum(self.event_size()).over(order_by=_events.c.seq, rows=(None, 0))
                   .label("cumulative"))
            .where(_events.c.room_id == bindparam("room_id"), _events.c.seq > bindparam("since"),
                   _events.c.seq <= latest_seq)
            .order_by(_events.c.seq).limit(bindparam("limit")).cte("candidates"))
        return select(*candidates.c).where(candidates.c.cumulative <= bindparam("max_bytes"))

    def replay_rows(self, room_id: str, *, since: int, latest_seq: int, limit: int, max_bytes: int,
        max_event_bytes: int,
    ) -> tuple[list[tuple[Any, ...]], int]:
        rows = self._fetch(self._replay, {
            "room_id": room_id, "since": since, "latest_seq": latest_seq, "limit": limit, "max_bytes": max_bytes})
        return rows, int(rows[-1][-1]) if rows else 0

    def read_page(self, room_id: str, *, since: int, limit: int, max_bytes: int, max_event_bytes: int,
    ) -> tuple[RowLike | None, list[tuple[Any, ...]], int]:
        rows = self._fetch(self._read_page, {
            "room_id": room_id, "since": since, "limit": limit, "max_bytes": max_bytes})
        if not rows:
            return None, [], 0
        gateway_id, _, _, _, _, epoch, _, disbanded_at, next_seq = rows[0]
        del rows[0]
        head = dict(zip(ROOM_HEAD_KEYS, (next_seq, gateway_id, epoch, disbanded_at), strict=True))
        return head, rows, int(rows[-1][-1]) if rows else 0

    def _fetch(self, statement: HotStatement, params: dict[str, Any]) -> list[tuple[Any, ...]]:
        cursor = statement.run(self.connection, params)
        try:
            rows: list[tuple[Any, ...]] = cursor.fetchall()
        finally:
            cursor.close()
        return rows

    def free_shard(self, size: Any, limit: Any) -> ColumnElement[bool]:
        # A shard with room that no other writer holds (never wait for one), the connection's own first (so
        # concurrent writers on different connections rarely meet).
        free = _budget.alias("free")
        own = func.mod(func.pg_backend_pid(), self.budget_shards)
        choice = (select(free.c.shard).where(free.c.used + size <= free.c.allowance, free.c.spread_limit <= limit)
                  .order_by(func.mod(free.c.shard + self.budget_shards - own, self.budget_shards)).limit(1)
                  .with_for_update(skip_locked=True))
        return _budget.c.shard == choice.scalar_subquery()

    def _append_one_statement(self, room_id: str, events: Sequence[EventLike], params: dict[str, Any], now: float
    ) -> OneStatementAppend | None:
        # The followers' channel of this engine's namespace (schema).
        params.update(self.backend.hot_params(self.connection, self.channel))
        own = self.own_shard
        if own is not None:  # a held connection: its own shard, by primary key
            params["own_shard"] = own
        try:
            if len(events) == 1:
                event = events[0]
                params.update(event_id=event.event_id, kind=event.kind, actor_json=event.actor_json,
                              authority_epoch=event.authority_epoch, payload_json=event.payload_json)
                statement = self._append_one if own is None else self._append_one_own
            else:
                params["fast_rows"] = _dumps([
                    (event.event_id, event.kind, event.actor_json, event.authority_epoch, event.payload_json)
                    for event in events])
                statement = self._append_batch if own is None else self._append_batch_own
            if self._pooler_append.applies(self.connection):  # behind a transaction pooler: the function
                rows = self._pooler_append.rows(self.connection, params, batch=len(events) > 1)
                if rows is None:  # not installed (remembered): nothing written, the full path
                    return None
                found = rows
            else:
                found = self._fetch(statement, params)
        except DataError as exc:
            if getattr(exc.orig, "sqlstate", None) == _NO_SHARD_PAID:
                return None
            raise
        if not found:
            return None
        if found[0][1] is None:  # the room advanced: its new next_seq
            return event_rows(room_id, int(found[0][0]) - len(events), events, now), {}
        stored: dict[str, RowLike] = {row[2]: dict(zip(_STORED_KEYS, row, strict=True)) for row in found}
        return [], stored

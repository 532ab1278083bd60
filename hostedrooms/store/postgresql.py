"""The room log on PostgreSQL, where writers to different rooms run concurrently (READ COMMITTED).

The one-statement append follows the gateway budget protocol of :mod:`hostedrooms.rooms.transaction` in fewer
round trips: its guarded ``UPDATE ... RETURNING`` locks the room row (the first lock, as always), then in its
RETURNING clause takes the gateway budget lock shared and counts the sharers; the ``INSERT ... SELECT ... WHERE``
then adds the row only if the gateway total, read by that later statement (so after the sharers were counted),
leaves room for the other sharers' slack: ``committed + size + (sharers - 1) * per_writer <= limit``. A writer
adding more than ``per_writer`` bytes never takes it (the other sharers' slack assumed no more).
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import (
    BigInteger,
    ColumnElement,
    Connection,
    Float,
    Select,
    Text,
    bindparam,
    cast,
    func,
    insert,
    literal_column,
    null,
    select,
    union_all,
)

from .. import models
from ..dialect import ROOM_EVENTS_CHANNEL, StoreDialect
from ..statements import HotStatement
from .base import (
    FAST_ADVANCE_ROOM,
    FAST_GUARDS,
    GATEWAY_BYTES_LOCK_KEY,
    GATEWAY_TOTAL,
    REPLAY_COLUMNS,
    ROOM_HEAD,
    ROOM_HEAD_KEYS,
    RoomStore,
    RowLike,
)

__all__ = ["PostgreSQLRoomStore"]

_events = models.events


class PostgreSQLRoomStore(RoomStore):
    """Concurrent writers: the room row lock, then the shared gateway budget lock and its sharers' slack."""

    concurrent_writers = True

    def __init__(self, dialect: StoreDialect) -> None:
        super().__init__(dialect)
        # The RETURNING clause also queues the followers' NOTIFY (delivered on commit): no extra round trip.
        self._advance = HotStatement(FAST_ADVANCE_ROOM.where(*FAST_GUARDS).returning(
            *dialect.lock_shared_and_count(),
            dialect.notify_column(bindparam("fast_room_id"))))
        self._budgeted_insert = HotStatement(insert(_events).from_select(
            [column.name for column in _events.c],
            select(*(bindparam(column.name, type_=column.type) for column in _events.c)).where(
                GATEWAY_TOTAL.scalar_subquery() <= bindparam("budget"))))
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

    def replay_rows(
        self, connection: Connection, room_id: str, *, since: int, latest_seq: int, limit: int, max_bytes: int,
        max_event_bytes: int,
    ) -> tuple[list[tuple[Any, ...]], int]:
        rows = self._fetch(self._replay, connection, {
            "room_id": room_id, "since": since, "latest_seq": latest_seq, "limit": limit, "max_bytes": max_bytes})
        return rows, int(rows[-1][-1]) if rows else 0

    def read_page(
        self, connection: Connection, room_id: str, *, since: int, limit: int, max_bytes: int, max_event_bytes: int,
    ) -> tuple[RowLike | None, list[tuple[Any, ...]], int]:
        rows = self._fetch(self._read_page, connection, {
            "room_id": room_id, "since": since, "limit": limit, "max_bytes": max_bytes})
        if not rows:
            return None, [], 0
        gateway_id, _, _, _, _, epoch, _, disbanded_at, next_seq = rows[0]
        del rows[0]
        head = dict(zip(ROOM_HEAD_KEYS, (next_seq, gateway_id, epoch, disbanded_at), strict=True))
        return head, rows, int(rows[-1][-1]) if rows else 0

    @staticmethod
    def _fetch(statement: HotStatement, connection: Connection, params: dict[str, Any]) -> list[tuple[Any, ...]]:
        cursor = statement.run(connection, params)
        try:
            rows: list[tuple[Any, ...]] = cursor.fetchall()
        finally:
            cursor.close()
        return rows

    def _fast_advance(
        self, connection: Connection, params: dict[str, Any], per_writer: int
    ) -> tuple[Any, ...] | None:
        if params["fast_size"] > per_writer:
            return None  # a sharer may add only what the other sharers' slack assumed
        # The budget key and the followers' channel of this engine's namespace (schema).
        params.update(self.dialect.hot_params(connection, GATEWAY_BYTES_LOCK_KEY, ROOM_EVENTS_CHANNEL))
        return self._advance.first(connection, params)

    def _fast_insert(
        self, connection: Connection, rows: list[dict[str, Any]], advanced: tuple[Any, ...], gateway_limit: int,
        per_writer: int,
    ) -> bool:
        # The total read now includes this transaction's own bytes: committed + size + slack <= limit.
        budget = gateway_limit - (int(advanced[2]) - 1) * per_writer
        if len(rows) == 1:
            return self._budgeted_insert.rowcount(connection, {**rows[0], "budget": budget}) == 1
        if self.gateway_bytes(connection) > budget:
            return False
        self.insert_events(connection, rows)
        return True

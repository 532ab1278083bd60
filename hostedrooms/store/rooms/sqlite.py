"""The room log on SQLite, where write transactions are serialised (``BEGIN IMMEDIATE``).

Every writer holds the database's write lock from its first statement, so the one budget row (a counter of every
room's bytes, :data:`hostedrooms.models.budget`) it reads is exact: the one-statement append checks it inside the
same guarded ``UPDATE`` that checks the fence and the room limits and allocates the seqs, then adds its bytes to it
and inserts the rows. No statement of an append reads more than one room.
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Sequence
from itertools import accumulate
from operator import itemgetter
from typing import Any

from sqlalchemy import bindparam, exists, select, update

from ... import models
from ...backends import Backend
from ...statements import HotStatement
from .base import (
    ONE_STATEMENT_ADVANCE,
    ONE_STATEMENT_GUARDS,
    EventLike,
    EventRows,
    OneStatementAppend,
    RoomStore,
    int64,
)

__all__ = ["SQLiteRoomStore"]

_budget = models.budget
_events = models.events
_size_of = itemgetter(len(_events.c))  # a replay row's last item: its accounted bytes


class SQLiteRoomStore(RoomStore):
    """Serialised writers: the one budget row is exact inside the append's own ``UPDATE``."""

    concurrent_writers = False
    budget_shards = 1

    def __init__(self, backend: Backend) -> None:
        super().__init__(backend)
        self._advance = HotStatement(ONE_STATEMENT_ADVANCE.where(*ONE_STATEMENT_GUARDS, exists().where(
            _budget.c.shard == 0, _budget.c.used + int64("fast_size") <= _budget.c.allowance,
            _budget.c.spread_limit <= int64("fast_spread_limit"))))
        self._charge = HotStatement(
            update(_budget).where(_budget.c.shard == 0).values(used=_budget.c.used + int64("fast_size")))
        # The replay rows with each one's accounted bytes; the running sum is cut here, not by a window function
        # (which would copy every candidate row into a temporary table first).
        self._replay = HotStatement(
            select(*_events.c, self.event_size())
            .where(_events.c.room_id == bindparam("room_id"), _events.c.seq > bindparam("since"),
                   _events.c.seq <= bindparam("latest_seq"))
            .order_by(_events.c.seq).limit(bindparam("limit")))

    def replay_rows(self, room_id: str, *, since: int, latest_seq: int, limit: int, max_bytes: int,
        max_event_bytes: int,
    ) -> tuple[list[tuple[Any, ...]], int]:
        # SQLite steps the statement as rows are fetched: fetch in chunks that fit what is left of the budget
        # (rows written through the API account for at most max_event_bytes each), so no more than about a page is
        # ever held, and stop at the first row the running sum cannot take.
        cursor = self._replay.run(
            self.connection, {"room_id": room_id, "since": since, "latest_seq": latest_seq, "limit": limit})
        try:
            rows: list[tuple[Any, ...]] = []
            total = 0
            while True:
                wanted = max(1, (max_bytes - total) // max(1, max_event_bytes))
                chunk = cursor.fetchmany(wanted)
                running = list(accumulate(map(_size_of, chunk), initial=total))
                if running[-1] > max_bytes:
                    fitting = bisect_right(running, max_bytes) - 1
                    rows.extend(chunk[:fitting])
                    return rows, running[fitting]
                rows.extend(chunk)
                total = running[-1]
                if len(chunk) < wanted:
                    return rows, total
        finally:
            cursor.close()

    def _append_one_statement(self, room_id: str, events: Sequence[EventLike], params: dict[str, Any], now: float
    ) -> OneStatementAppend | None:
        advanced = self._advance.first(self.connection, params)
        if advanced is None:
            return None
        self._charge.rowcount(self.connection, params)
        rows = EventRows(room_id, int(advanced[0]) - len(events), events, now)
        self.insert_written(rows)
        return rows, {}

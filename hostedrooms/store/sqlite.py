"""The room log on SQLite, where write transactions are serialised (``BEGIN IMMEDIATE``).

Every writer holds the database's write lock from its first statement, so the gateway total it reads is exact:
the one-statement append checks it inside the same guarded ``UPDATE`` that checks the fence and the room limits
and allocates the seqs.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import Connection, bindparam, func, select

from .. import models
from ..dialect import StoreDialect
from ..statements import HotStatement
from .base import FAST_ADVANCE_ROOM, FAST_GUARDS, RoomStore

__all__ = ["SQLiteRoomStore"]

_all_rooms = models.rooms.alias("all_rooms")


class SQLiteRoomStore(RoomStore):
    """Serialised writers: the gateway total is exact inside the append's own ``UPDATE``."""

    concurrent_writers = False

    def __init__(self, dialect: StoreDialect) -> None:
        super().__init__(dialect)
        self._advance = HotStatement(FAST_ADVANCE_ROOM.where(
            *FAST_GUARDS,
            select(func.coalesce(func.sum(_all_rooms.c.event_bytes), 0)).scalar_subquery() + bindparam("fast_size")
            <= bindparam("fast_max_gateway_bytes")))

    def _fast_advance(
        self, connection: Connection, params: dict[str, Any], per_writer: int
    ) -> tuple[Any, ...] | None:
        return self._advance.first(connection, params)

    def _fast_insert(
        self, connection: Connection, rows: list[dict[str, Any]], advanced: tuple[Any, ...], gateway_limit: int,
        per_writer: int,
    ) -> bool:
        self.insert_events(connection, rows)
        return True

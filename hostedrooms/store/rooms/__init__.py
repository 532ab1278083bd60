"""The room log's store: :class:`RoomStore` (the statements both backends share) and one subclass per backend.

``base.py`` holds the interface and the shared SQL, ``sqlite.py`` the serialised writers' one-statement append and
replay, ``postgresql.py`` the concurrent writers' (a data-modifying CTE in autocommit, budget shards taken
``SKIP LOCKED``). The registry that picks one per backend is :func:`hostedrooms.store.room_store`.
"""

from __future__ import annotations

from .base import (
    REPLAY_COLUMNS,
    EventLike,
    EventRows,
    OneStatementAppend,
    RoomChange,
    RoomStore,
    RowLike,
    event_rows,
    int64,
)
from .postgresql import PostgreSQLRoomStore
from .sqlite import SQLiteRoomStore

__all__ = [
    "REPLAY_COLUMNS",
    "EventLike",
    "EventRows",
    "OneStatementAppend",
    "PostgreSQLRoomStore",
    "RoomChange",
    "RoomStore",
    "RowLike",
    "SQLiteRoomStore",
    "event_rows",
    "int64",
]

"""The store layer: the room log's SQL and backend algorithms, one :class:`RoomStore` per backend.

Services call :func:`room_store` with their unit of work's backend and run the store's methods on the unit's
connection. :class:`~hostedrooms.backends.Backend` stays the connection-level seam every service shares
(transaction start, pragmas, upserts, advisory locks, probes); a store composes it with the room log's tables.
"""

from __future__ import annotations

import threading

from ..backends import Backend
from .base import (
    REPLAY_COLUMNS,
    ROOM_CREATION_LOCK_KEY,
    RoomChange,
    RoomStore,
    RowLike,
    event_rows,
)
from .postgresql import PostgreSQLRoomStore
from .sqlite import SQLiteRoomStore

__all__ = [
    "REPLAY_COLUMNS",
    "ROOM_CREATION_LOCK_KEY",
    "PostgreSQLRoomStore",
    "RoomChange",
    "RoomStore",
    "RowLike",
    "SQLiteRoomStore",
    "event_rows",
    "room_store",
]

_BACKENDS: dict[str, type[RoomStore]] = {"sqlite": SQLiteRoomStore, "postgresql": PostgreSQLRoomStore}
_stores: dict[str, RoomStore] = {}
_building = threading.Lock()


def room_store(backend: Backend) -> RoomStore:
    """The one :class:`RoomStore` of ``backend``'s backend (built, with its statements, on first use)."""
    store = _stores.get(backend.name)
    if store is None:
        with _building:
            store = _stores.get(backend.name)
            if store is None:
                store = _stores[backend.name] = _BACKENDS[backend.name](backend)
    return store

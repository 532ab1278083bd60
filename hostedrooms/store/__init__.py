"""The store layer: every aggregate's SQL, one store class per aggregate (and per backend where they differ).

- :mod:`.rooms`: the room log (:class:`RoomStore`, one subclass per backend);
- :mod:`.replicas`: replicas of other gateways' rooms (:class:`ReplicaStore`);
- :mod:`.locks`: every advisory lock key, the retired ones included.

Each store is built once per backend, its statements with it (:func:`room_store`, :func:`replica_store`: the
backend's prototype), and bound to a unit of work's connection for use (``uow.rooms``, ``uow.replicas``:
:attr:`hostedrooms.uow.UnitOfWork.rooms`), so no caller passes a connection. The backend seam every store shares
(transaction start, row locks, upserts, advisory locks, ``NOTIFY``) is :class:`~hostedrooms.backends.Backend`.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from typing import Generic, TypeVar

from ..advisory_keys import ROOM_CREATION_LOCK_KEY
from ..backends import Backend
from .replicas import ReplicaStore
from .rooms import (
    REPLAY_COLUMNS,
    EventRows,
    PostgreSQLRoomStore,
    RoomChange,
    RoomStore,
    RowLike,
    SQLiteRoomStore,
    event_rows,
)

__all__ = [
    "REPLAY_COLUMNS",
    "ROOM_CREATION_LOCK_KEY",
    "EventRows",
    "PerBackend",
    "PostgreSQLRoomStore",
    "ReplicaStore",
    "RoomChange",
    "RoomStore",
    "RowLike",
    "SQLiteRoomStore",
    "event_rows",
    "replica_store",
    "room_store",
]

_S = TypeVar("_S")


class PerBackend(Generic[_S]):
    """A store's registry: one prototype per backend, built (with its statements) on first use.

    Call it with a backend for that backend's prototype; bind the prototype to a unit's connection to use it
    (a unit of work does, in its store accessors).
    """

    def __init__(self, classes: Mapping[str, Callable[[Backend], _S]]) -> None:
        self._classes = dict(classes)
        self._built: dict[str, _S] = {}
        self._building = threading.Lock()

    def __call__(self, backend: Backend) -> _S:
        store = self._built.get(backend.name)
        if store is None:
            with self._building:
                store = self._built.get(backend.name)
                if store is None:
                    store = self._built[backend.name] = self._classes[backend.name](backend)
        return store


#: The one :class:`RoomStore` prototype of a backend's backend.
room_store: PerBackend[RoomStore] = PerBackend({"sqlite": SQLiteRoomStore, "postgresql": PostgreSQLRoomStore})
#: The one :class:`ReplicaStore` prototype of a backend's backend.
replica_store: PerBackend[ReplicaStore] = PerBackend({"sqlite": ReplicaStore, "postgresql": ReplicaStore})

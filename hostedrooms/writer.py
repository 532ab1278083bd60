"""The one held writer connection of a SQLite engine: write units run on it instead of a pooled connection.

SQLite lets one transaction write at a time (every write unit begins ``BEGIN IMMEDIATE``), so a second writing
connection in the same process only ever waits: one connection, held by the engine and lent to one write unit at a
time under a lock, loses nothing, and spares each write the pool's checkout and return and a new ``Connection``.
The unit runs on a :class:`~hostedrooms.statements.DirectConnection`, whose transaction and hot statements skip
SQLAlchemy while nothing observes the engine, decided when each unit begins (:mod:`hostedrooms.statements`); with
a listener installed (OpenTelemetry's SQLAlchemy instrumentation, a host's own) or statement logging on, the unit
runs through SQLAlchemy's public execution path. A single append's first attempt (the one-statement append) runs
on it too, as a transaction of its own with no unit of work around it
(:func:`hostedrooms.rooms.transaction.append_room`): it takes the writer only if it is free at once
(``take(wait=False)``, having taken the process's turn already, so a busy writer is never waited for twice) and
keeps the room store bound to the current connection in :attr:`HeldWriter.extra`.

Which engines hold one: those :func:`hostedrooms.create_engine` configured for a SQLite file with SQLAlchemy's
queue pool and the synchronous driver (:func:`allow`); never an in-memory database (one shared connection
already), a ``NullPool`` (the host chose to keep no connection open), or an AsyncEngine's own ``sync_engine``
(whose driver calls are awaited; its twin holds one). Read units keep using the pool.

The connection comes from a private copy of the engine's pool (the same connect hooks and pragmas, none of the
services' pool slots, as the shared waiter's does), opened at the first write and kept. It is dropped, and the
next unit opens a new one, whenever a unit leaves it invalidated (a failed commit, a disconnect) or still in a
transaction. A unit that cannot take it takes a pooled connection, exactly as before (SQLite's busy timeout then
arbitrates): a nested write unit of the same thread at once, another thread once it has waited the engine's busy
timeout for the lock. ``engine.dispose()`` closes it (at once, or when the unit using it ends); in a forked child
the parent's connection is never used nor closed (closing it there could disturb the parent's locks and WAL), and
a new one is opened.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from typing import Any

from sqlalchemy import Engine
from sqlalchemy import exc as sa_exc
from sqlalchemy.pool import Pool, QueuePool

from .engine_profile import known_runtime, runtime_of
from .held_slots import HeldSlot, generation
from .statements import DIRECT_BEGUN, DirectConnection, listened, statements_logged

__all__ = ["HeldWriter", "allow", "current_writer", "take", "without_held_writers", "without_lone_appends"]

#: Tests only (:func:`without_held_writers`): False makes every write unit take a pooled connection.
_enabled = True
#: Tests only (:func:`without_lone_appends`): False runs a lone append in a unit of work like every other write.
lone_appends = True


class HeldWriter:
    """One held connection and the lock lending it to one write unit at a time."""

    def __init__(self, engine: Engine, wait: float) -> None:
        self.engine = engine
        self.wait = wait
        self.generation = generation()  # a forked child never uses it (:mod:`hostedrooms.held_slots`)
        self._lock = threading.Lock()
        self._owner: int | None = None
        self._pool: Pool = engine.pool.recreate()  # its own: the same connect hooks, none of the services' slots
        self._connection: DirectConnection | None = None
        self._retired = False
        #: What a user of the writer keeps for its current connection (the lone append's store bound to it,
        #: :mod:`hostedrooms.rooms.transaction`): a pair (that connection, the thing), dropped with the connection.
        self.extra: tuple[DirectConnection, Any] | None = None

    def take(self, *, wait: bool = True) -> bool:
        """Lock the writer for this thread's unit; False (take a pooled connection) when this thread already holds
        it, it stays busy past the busy timeout (``wait=False``: it is busy now), or the engine was disposed."""
        ident = threading.get_ident()
        lock = self._lock
        # A free lock is taken without the timed wait's set-up (the common case: writers are serialised already).
        if self._owner == ident or not (lock.acquire(blocking=False) or (wait and lock.acquire(timeout=self.wait))):
            return False
        if self._retired:
            self._lock.release()
            return False
        self._owner = ident
        return True

    def open(self) -> DirectConnection:
        """The held connection (opened on first use; driver errors wrapped as ``engine.connect()`` wraps them),
        with the unit's path decided (``fast``: nothing observes the engine, :mod:`hostedrooms.statements`).

        A new Connection over the same DBAPI connection serves the unit when the last one cannot (statement logging
        switched since it was built, execution options a unit set): SQLAlchemy reads both once per Connection, as
        for a pooled unit's."""
        engine = self.engine
        logged = statements_logged(engine)
        connection = self._connection
        if connection is None:
            try:
                fairy = self._pool.connect()
            except engine.dialect.loaded_dbapi.Error as exc:
                raise sa_exc.DBAPIError.instance(
                    None, None, exc, engine.dialect.loaded_dbapi.Error, hide_parameters=engine.hide_parameters,
                    connection_invalidated=engine.dialect.is_disconnect(exc, None, None),
                    dialect=engine.dialect) from exc
            connection = self._connection = DirectConnection(engine, fairy, logged=logged)
        elif (connection.built_logging != logged
              or connection.get_execution_options() is not engine.get_execution_options()):
            connection = self._connection = DirectConnection(engine, connection.connection, logged=logged)
        connection.fast = not logged and not listened(engine, transactions=True)  # this unit's path
        return connection

    def release(self) -> None:
        """Unlock after a unit ended; drop the connection unless it is clean (valid, no transaction open)."""
        connection = self._connection
        if connection is not None and not _clean(connection):
            self._connection = self.extra = None
            _close(connection)
        self._owner = None
        self._lock.release()
        if self._retired:
            self._shut_if_free()

    def retire(self) -> None:
        """Close the connection now, or when the unit using it ends; later units take pooled connections."""
        self._retired = True
        self._shut_if_free()

    def _shut_if_free(self) -> None:
        if not self._lock.acquire(blocking=False):
            return  # the unit using it closes it when it releases
        try:
            connection, self._connection, self.extra = self._connection, None, None
            if connection is not None:
                _close(connection)
            self._pool.dispose()
        finally:
            self._lock.release()


def _clean(connection: DirectConnection) -> bool:
    if connection.closed or connection.invalidated or connection.in_transaction():
        return False
    fairy: Any = connection.connection
    raw = fairy.dbapi_connection
    return raw is not None and not raw.in_transaction and DIRECT_BEGUN not in fairy.info


def _close(connection: DirectConnection) -> None:
    """Close a held connection (rolled back if a transaction is open; an invalidated one is closed already)."""
    with contextlib.suppress(Exception):  # a broken connection: nothing left to release
        connection.close()


class _Slot(HeldSlot[HeldWriter]):
    """An engine's current writer (None until the first write unit; replaced after a dispose or a fork); kept in
    the engine's :class:`~hostedrooms.engine_profile.EngineRuntime` (engines built or adopted by hostedrooms for
    SQLite files)."""

    def __init__(self, wait: float) -> None:
        super().__init__()
        self.wait = wait

    @property
    def writer(self) -> HeldWriter | None:
        """The current writer (of this process or, until it is replaced, of the parent)."""
        return self.item


def allow(engine: Engine, busy_timeout: float) -> None:
    """Let ``engine`` (just configured for a SQLite file by hostedrooms) hold a writer where it can (see the module
    docstring); its ``dispose()`` then closes the writer's connection too."""
    if engine.dialect.is_async or type(engine.pool) is not QueuePool:
        return
    runtime = runtime_of(engine)
    if runtime.writer_slot is not None:
        return
    slot = runtime.writer_slot = _Slot(busy_timeout)
    slot.retire_on_dispose(engine)


def take(engine: Engine, *, wait: bool = True) -> HeldWriter | None:
    """``engine``'s held writer, locked for the calling thread's write unit; None: take a pooled connection
    (``wait=False``: also when it is busy now)."""
    runtime = known_runtime(engine)
    slot: _Slot | None = None if runtime is None else runtime.writer_slot
    if slot is None or not _enabled:
        return None
    writer = slot.current(lambda: HeldWriter(engine, slot.wait))
    return writer if writer.take(wait=wait) else None


def current_writer(engine: Engine) -> HeldWriter | None:
    """The writer ``engine`` holds now (None: none opened yet, or none allowed); for tests and diagnostics."""
    runtime = known_runtime(engine)
    slot: _Slot | None = None if runtime is None else runtime.writer_slot
    return None if slot is None else slot.writer


@contextlib.contextmanager
def without_lone_appends() -> Iterator[None]:
    """Tests only: inside the block a lone append runs in a unit of work on the held writer, as every other write
    does (:func:`hostedrooms.rooms.transaction.append_room`)."""
    global lone_appends
    previous, lone_appends = lone_appends, False
    try:
        yield
    finally:
        lone_appends = previous


@contextlib.contextmanager
def without_held_writers() -> Iterator[None]:
    """Tests only: inside the block every write unit takes a pooled connection (the plain path)."""
    global _enabled
    previous, _enabled = _enabled, False
    try:
        yield
    finally:
        _enabled = previous


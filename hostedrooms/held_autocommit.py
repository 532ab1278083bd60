"""Held autocommit connections: one per PostgreSQL engine and thread, for the one-statement append's first attempt.

The one-statement append (:mod:`hostedrooms.store.rooms.postgresql`) is one statement that commits itself. Run in
a unit of work it still pays a pool checkout and return, a new SQLAlchemy ``Connection``, the switch to
``AUTOCOMMIT`` and back, and a begin and a commit that do nothing; that was about half of the library's cost of a
single append. A connection held by the thread, kept in autocommit, pays none of it: :func:`take` lends the calling
thread its own connection (opened at its first append), the statement runs on it, :meth:`HeldConnection.release`
gives it back. The services use it only for that one statement's first attempt; everything else (the full path,
every other write, reads) keeps taking pooled connections.

Which engines hold them: those :func:`hostedrooms.create_engine` built for PostgreSQL with psycopg's synchronous
driver and SQLAlchemy's queue pool (:func:`allow`), direct or behind a pooler, never an AsyncEngine's
``sync_engine`` (its driver calls are awaited; the synchronous twin whose worker threads run the asyncio API's
services is an engine of the first kind), never an engine a host built itself and gave hostedrooms (adopted: left
as the host configured it).

Behind a pooler in transaction mode (``pooler="transaction"``: PgBouncer) the held connection is a client
connection to the pooler, which costs the pooler little and the server nothing: each autocommit statement is a
transaction of its own, which the pooler may run on any of its server connections. Nothing held depends on a server
session between statements: nothing is prepared on the server (the engine's ``prepare_threshold=None`` holds for
these connections too), and the connection's :attr:`HeldConnection.backend_pid` is None (what the client was told
at startup is not the server process that runs the next statement), so no append charges a shard chosen from it:
the server-side function (:mod:`hostedrooms.store.rooms.pg_function`) chooses its shard itself, from the server
process that runs it, among those no other writer holds. A server connection the pooler has found lost between
statements is the pooler's to replace (the client sees nothing); one lost under a statement, or the pooler itself
gone, fails the statement with the error the pooler passes on or a closed client connection, raised and dropped
as below, as on a pooled connection.

What it keeps:

- The connections come from a private copy of the engine's pool (``engine.pool.recreate()``: the same connect
  hooks, ``search_path`` among them; none of the services' pool slots), as the SQLite held writer's does.
- At most as many as the engine's pool size are held at once (``create_engine(held_connections=N)`` sets another
  bound; 0 holds none), beside the pool's ``pool_size + max_overflow``. A thread that needs one when all are held
  by live threads takes the pooled path; a connection held by a thread that has exited is taken back first (given
  to the asking thread), so thread pools that come and go never leak one.
- A connection that an attempt left broken (invalidated, closed) or in a transaction, or that an interrupt
  (``KeyboardInterrupt``, a cancelled task's thread) stopped mid-statement, is closed and dropped; the next attempt
  of that thread opens another. A driver error is raised as a unit of work raises it (the pooled path raises the
  same); one that lost the server drops, at their next use, every connection the engine held before it, and closes
  the services' idle pooled connections, as SQLAlchemy does when a pooled connection loses its server; and a
  pooled connection invalidated (SQLAlchemy's ``invalidate`` pool event) drops the held ones at their next use.
- ``engine.dispose()`` closes them (at once, or as the attempt using one ends); a forked child never uses nor
  closes its parent's (they stay referenced, untouched), and opens its own.
- Whether the statement skips SQLAlchemy is decided per attempt (:mod:`hostedrooms.statements`): with nothing
  observing the engine it runs on the driver's cursor; with a listener installed (OpenTelemetry's SQLAlchemy
  instrumentation, a host's own) or statement logging on, it runs through ``Connection.exec_driver_sql`` on the
  held ``Connection`` (in ``AUTOCOMMIT``), whose events and execution context the listeners see.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from typing import Any

from sqlalchemy import Engine, event
from sqlalchemy import exc as sa_exc
from sqlalchemy.pool import Pool, QueuePool

from .engine_profile import known_runtime, profile_of, runtime_of
from .held_slots import HeldSlot, generation
from .statements import DirectConnection, listened, statements_logged

__all__ = ["HeldConnection", "allow", "held_count", "take", "without_held_connections"]

#: Tests only (:func:`without_held_connections`): False makes every append take the pooled path.
_enabled = True
#: psycopg's ``TransactionStatus.IDLE``: no transaction open, no statement running.
_IDLE = 0


class HeldConnection:
    """One thread's held connection of one engine (lent to that thread only, one attempt at a time)."""

    __slots__ = ("backend_pid", "busy", "connection", "epoch", "extra", "slot", "thread")

    def __init__(self, slot: _Slot, thread: threading.Thread) -> None:
        self.slot = slot
        self.thread = thread
        self.busy = False
        self.connection: DirectConnection | None = None
        #: The server process of the connection: None until opened, and always None behind a transaction pooler
        #: (each statement may run on another server connection).
        self.backend_pid: int | None = None
        #: The slot's :attr:`_Slot.epoch` when the connection was opened.
        self.epoch = 0
        #: What the user keeps for this connection (the services: their store bound to it); reset when a new
        #: ``Connection`` is built.
        self.extra: Any = None

    def open(self) -> DirectConnection:
        """The held ``Connection`` in ``AUTOCOMMIT`` (opened on first use; driver errors wrapped as
        ``engine.connect()`` wraps them), with this attempt's path decided (``fast``: nothing observes the engine).

        A new Connection over the same DBAPI connection serves when statement logging switched since the last was
        built (SQLAlchemy reads it once per Connection)."""
        slot = self.slot
        engine = slot.engine
        logged = statements_logged(engine)
        connection = self.connection
        if connection is not None and self.epoch != slot.epoch:  # opened before another one lost its server
            self.connection, self.extra = None, None
            _close(connection)
            connection = None
        if connection is None:
            try:
                fairy: Any = slot.pool.connect()
            except engine.dialect.loaded_dbapi.Error as exc:
                raise sa_exc.DBAPIError.instance(
                    None, None, exc, engine.dialect.loaded_dbapi.Error, hide_parameters=engine.hide_parameters,
                    connection_invalidated=engine.dialect.is_disconnect(exc, None, None),
                    dialect=engine.dialect) from exc
            connection = self._build(fairy, logged)
            self.backend_pid = int(fairy.dbapi_connection.info.backend_pid) if slot.own_server else None
            self.epoch = slot.epoch
        elif connection.built_logging != logged:
            connection = self._build(connection.connection, logged)
        connection.fast = not logged and not listened(engine)  # this attempt's path
        return connection

    def _build(self, fairy: Any, logged: bool) -> DirectConnection:
        connection = DirectConnection(self.slot.engine, fairy, logged=logged)
        try:
            connection.execution_options(isolation_level="AUTOCOMMIT")
        except BaseException:
            _close(connection)
            self.connection = None
            raise
        self.connection, self.extra = connection, None
        return connection

    def release(self, error: BaseException | None = None) -> None:
        """The attempt ended (``error``: how it failed): end the scope SQLAlchemy opened if the observed path ran
        (a commit or a rollback that does nothing on the server: the statement committed or failed on its own);
        drop the connection unless it is clean (valid, no transaction open, not stopped mid-statement by an
        interrupt)."""
        connection = self.connection
        slot = self.slot
        interrupted = error is not None and not isinstance(error, Exception)
        if isinstance(error, sa_exc.DBAPIError) and error.connection_invalidated:
            # As SQLAlchemy does when a pooled connection finds its server gone: every connection opened before is
            # dropped, here at its next use, and the services' idle pooled connections are closed.
            slot.epoch += 1
            with contextlib.suppress(Exception):
                slot.engine.pool.dispose()
        try:
            if connection is not None and not interrupted and not connection.closed and connection.in_transaction():
                if error is None:
                    connection.commit()
                else:
                    connection.rollback()
        except Exception:
            interrupted = True
        finally:
            with slot.lock:
                self.busy = False
                retired = slot.retired
            if connection is not None and (interrupted or retired or not _clean(connection)):
                self.connection, self.extra = None, None
                _close(connection, interrupted=interrupted)
            if retired:
                slot.forget(self)


def _clean(connection: DirectConnection) -> bool:
    if connection.closed or connection.invalidated or connection.in_transaction():
        return False
    raw: Any = connection.connection.dbapi_connection
    return raw is not None and not raw.closed and int(raw.info.transaction_status) == _IDLE


def _close(connection: DirectConnection, *, interrupted: bool = False) -> None:
    """Close a held connection for good: detached from the private pool first (a public ``detach()``), so the pool
    never hands it out again and no ``invalidate`` event makes the other threads drop theirs. One an interrupt
    stopped mid-statement is invalidated instead (its socket closed, nothing asked of it), as SQLAlchemy treats an
    interrupt inside ``execute()``; one already invalidated (a lost server) is closed as it is."""
    with contextlib.suppress(Exception):  # a broken connection: nothing left to release
        if not connection.closed and not connection.invalidated:
            if interrupted:
                connection.invalidate()
            else:
                connection.connection.detach()
        connection.close()


class _Slot:
    """An engine's held connections of one generation, by thread (replaced after a dispose or a fork)."""

    def __init__(self, engine: Engine, limit: int) -> None:
        self.engine = engine
        self.limit = limit
        self.generation = generation()  # a forked child never uses it (:mod:`hostedrooms.held_slots`)
        self.lock = threading.Lock()
        self.pool: Pool = engine.pool.recreate()  # its own: the same connect hooks, none of the services' slots
        self.held: dict[int, HeldConnection] = {}
        self.retired = False
        #: Whether a connection's server process is its own between statements (not behind a transaction pooler).
        self.own_server = not _transaction_pooled(engine)
        #: Bumped when an attempt finds its server gone (a restart, a failover): older connections are dropped.
        self.epoch = 0

    def lend(self) -> HeldConnection | None:
        """The calling thread's connection, marked busy; None: nested in an attempt, the bound reached, retired."""
        thread = threading.current_thread()
        ident = thread.ident or 0
        with self.lock:
            if self.retired:
                return None
            held = self.held.get(ident)
            if held is None:
                held = self._new(thread, ident)
                if held is None:
                    return None
            elif held.thread is not thread:  # the ident of a thread that exited, reused: its connection is free
                held.thread = thread
            if held.busy:
                return None
            held.busy = True
            return held

    def _new(self, thread: threading.Thread, ident: int) -> HeldConnection | None:
        """Under the lock: a new entry for ``thread``, taking over one of an exited thread at the bound."""
        if len(self.held) >= self.limit:
            gone = next((key for key, other in self.held.items() if not other.busy and not other.thread.is_alive()),
                        None)
            if gone is None:
                return None
            held = self.held.pop(gone)  # its connection (clean: released) serves the new thread
            held.thread = thread
        else:
            held = HeldConnection(self, thread)
        self.held[ident] = held
        return held

    def retire(self) -> None:
        """Close every idle connection now (a busy one as its attempt ends) and the private pool."""
        with self.lock:
            self.retired = True
            idle = [held for held in self.held.values() if not held.busy]
        for held in idle:
            connection, held.connection = held.connection, None
            if connection is not None:
                _close(connection)
            self.forget(held)

    def forget(self, held: HeldConnection) -> None:
        with self.lock:
            for key, other in list(self.held.items()):
                if other is held:
                    del self.held[key]
            empty = not self.held
        if empty:
            with contextlib.suppress(Exception):
                self.pool.dispose()


class _Holder(HeldSlot[_Slot]):
    """An engine's current slot (None until the first attempt; replaced after a dispose or a fork); kept in the
    engine's :class:`~hostedrooms.engine_profile.EngineRuntime`."""

    def __init__(self, limit: int) -> None:
        super().__init__()
        self.limit = limit

    @property
    def slot(self) -> _Slot | None:
        """The current slot (of this process or, until it is replaced, of the parent)."""
        return self.item


def allow(engine: Engine, limit: int | None = None) -> None:
    """Let ``engine`` (just built by :func:`hostedrooms.create_engine`) hold up to ``limit`` connections (None: its
    pool size; 0: none) where it can (see the module docstring); its ``dispose()`` then closes them too."""
    profile = profile_of(engine)
    if (limit == 0 or engine.dialect.is_async or engine.dialect.driver != "psycopg"
            or type(engine.pool) is not QueuePool or profile is None):
        return
    runtime = runtime_of(engine)
    if runtime.held_autocommit is not None:
        return
    holder = runtime.held_autocommit = _Holder(max(1, engine.pool.size()) if limit is None else limit)
    holder.retire_on_dispose(engine)

    def invalidated(_dbapi_connection: Any, _record: Any, _exception: BaseException | None) -> None:
        # A connection of the engine was invalidated (a pooled unit found its server gone, a failed commit): drop
        # every held connection at its next use, as the pool recycles its own. (The private pools share the
        # engine pool's events: a held connection's invalidation lands here too.)
        slot = holder.slot
        if slot is not None:
            slot.epoch += 1

    event.listen(engine.pool, "invalidate", invalidated)


def _transaction_pooled(engine: Engine) -> bool:
    """Whether ``engine`` was built behind a pooler in transaction mode (its statements' server connections vary)."""
    profile = profile_of(engine)
    return profile is not None and profile.pooler is not None and profile.pooler.mode == "transaction"


def take(engine: Engine) -> HeldConnection | None:
    """The calling thread's held connection of ``engine``, lent to one attempt (:meth:`HeldConnection.release`
    it); None: take the pooled path."""
    runtime = known_runtime(engine)
    holder: _Holder | None = None if runtime is None else runtime.held_autocommit
    if holder is None or not _enabled:
        return None
    return holder.current(lambda: _Slot(engine, holder.limit)).lend()


def held_count(engine: Engine) -> int:
    """How many connections ``engine`` holds now (open or about to be); for tests and diagnostics."""
    runtime = known_runtime(engine)
    holder: _Holder | None = None if runtime is None else runtime.held_autocommit
    slot = None if holder is None else holder.slot
    if slot is None:
        return 0
    with slot.lock:
        return sum(1 for held in slot.held.values() if held.connection is not None)


@contextlib.contextmanager
def without_held_connections() -> Iterator[None]:
    """Tests only: inside the block every append takes the pooled path (the plain path)."""
    global _enabled
    previous, _enabled = _enabled, False
    try:
        yield
    finally:
        _enabled = previous


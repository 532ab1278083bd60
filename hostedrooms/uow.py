"""The unit of work: one database transaction per public operation, rolled back unless committed.

Usage::

    with UnitOfWork(engine) as uow:
        row = uow.connection.execute(select(...)).one()
        uow.fenced(update(rooms).where(...).values(...), AuthorityConflictError("..."))
        uow.commit()

Write units start with ``BEGIN IMMEDIATE`` on SQLite (the write lock is held from the first statement, so
read-then-write cannot lose updates); ``write=False`` opens a deferred read transaction instead, and
``write=False, statement_snapshots=True`` a read whose statements need no snapshot in common (each is correct on
its own), which on PostgreSQL runs without a transaction at all (:meth:`Backend.begin_statement_reads
<hostedrooms.backends.Backend.begin_statement_reads>`); :meth:`UnitOfWork.one_statement` opens that kind of
unit for a write of one statement that commits itself (the one-statement append). Driver errors raised inside the
block, on commit or on connect are translated here, in one place.

The stores hang off the unit, bound to its connection: ``uow.rooms``, ``uow.replicas``, ``uow.peers``,
``uow.ledger`` (built on first use, then the same object for the rest of the unit).

On a SQLite file engine a write unit runs on the engine's one held writer connection when it can take it
(:mod:`hostedrooms.writer`), otherwise on a pooled connection; both give the same transaction, results and errors.
Before either, a write unit on a SQLite file waits for its process's turn on the database's lock file, so the
writers of several processes queue instead of polling (:mod:`hostedrooms.writelock`); the turn ends in
``_close``, after the transaction committed or rolled back, however the unit ends. The functions that end a write
transaction (:func:`commit_transaction`, :func:`roll_back`) are shared with the single append's lone transaction
on that writer (:func:`hostedrooms.rooms.transaction.append_room`), which ends its transaction the same way.
"""

from __future__ import annotations

from collections.abc import Callable
from types import TracebackType
from typing import TYPE_CHECKING, Any, Generic, Self, TypeVar, overload

from sqlalchemy import Connection, Engine, Executable, Result
from sqlalchemy import exc as sa_exc
from sqlalchemy.orm import Session

from . import forkgate, writelock
from . import writer as held
from .backends import Backend, backend_for
from .db import reject_async
from .errors import translate
from .statements import DIRECT_BEGUN, DirectConnection, begin_unit, end_unit
from .wakeup import committed

if TYPE_CHECKING:  # the stores import the models: the unit imports them at first use (see _Bound)
    from .store import PerBackend, ReplicaStore, RoomStore
    from .store.bound import BoundStore
    from .store.ledger import LedgerStore
    from .store.peers import PeerStore

#: The public API; the functions that end a write transaction (below) are shared with the rooms service's lone
#: append, not offered to hosts.
__all__ = ["UnitOfWork"]

_S = TypeVar("_S")
_B = TypeVar("_B", bound="BoundStore")


class _Bound(Generic[_B]):
    """Builds a unit's copy of a backend's store prototype, bound to the unit's connection (BoundStore.bind,
    inline: it runs once per unit of work, on every append).

    The registry (``store.room_store``, by name) is imported at a backend's first unit, not with this module:
    importing hostedrooms (``hostedrooms.errors``, as a released migration does) must not import the live models
    (tests/migrations/test_frozen_migrations.py)."""

    def __init__(self, registry: str) -> None:
        self._registry = registry
        self._prototypes: dict[Backend, _B] = {}

    def __call__(self, uow: UnitOfWork) -> _B:
        prototype = self._prototypes.get(uow.backend)
        if prototype is None:
            from . import store as store_package

            stores: PerBackend[_B] = getattr(store_package, self._registry)
            prototype = self._prototypes[uow.backend] = stores(uow.backend)
        store: _B = object.__new__(type(prototype))
        store.__dict__.update(prototype.__dict__)
        store.connection = uow.connection
        return store


def _peer_store() -> type[PeerStore]:
    from .store.peers import PeerStore  # at first use: see _Bound

    return PeerStore


def _ledger_store() -> type[LedgerStore]:
    from .store.ledger import LedgerStore  # at first use: see _Bound

    return LedgerStore


class _UnitStore(Generic[_S]):
    """A unit's accessor for one store (``uow.rooms``): the store built for the unit on first use, then kept in the
    unit as a plain attribute (later uses cost an attribute read)."""

    def __init__(self, build: Callable[[UnitOfWork], _S]) -> None:
        self._build = build

    def __set_name__(self, owner: type, name: str) -> None:
        self._name = name

    @overload
    def __get__(self, uow: None, owner: type) -> Self: ...
    @overload
    def __get__(self, uow: UnitOfWork, owner: type) -> _S: ...
    def __get__(self, uow: UnitOfWork | None, owner: type) -> Self | _S:
        if uow is None:
            return self
        store = self._build(uow)
        uow.__dict__[self._name] = store
        return store


class UnitOfWork:
    """A context manager around one transaction on ``engine``; exposes ``connection``, ``session`` and the stores
    bound to the connection (``rooms``, ``replicas``, ``peers``, ``ledger``).

    :param engine: the store's Engine.
    :param write: False for a read-only unit.
    :param statement_snapshots: a read-only unit whose statements each read their own snapshot (PostgreSQL opens
        no transaction).
    :raises MisuseError: ``engine`` is an asyncio engine.
    """

    #: The room store of this unit's backend, on this unit's connection.
    rooms: _UnitStore[RoomStore] = _UnitStore(_Bound("room_store"))
    #: The replica store of this unit's backend, on this unit's connection.
    replicas: _UnitStore[ReplicaStore] = _UnitStore(_Bound("replica_store"))
    #: The peer routing store (links, grants, reservations, receipts) on this unit's connection.
    peers: _UnitStore[PeerStore] = _UnitStore(lambda uow: _peer_store()(uow.backend, uow.connection))
    #: The delivery ledger's store on this unit's connection.
    ledger: _UnitStore[LedgerStore] = _UnitStore(lambda uow: _ledger_store()(uow.backend, uow.connection))

    def __init__(self, engine: Engine, *, write: bool = True, statement_snapshots: bool = False) -> None:
        reject_async(engine)
        self.engine = engine
        self.write = write
        self.statement_snapshots = statement_snapshots and not write
        self.backend: Backend = backend_for(engine)
        self._connection: Connection | None = None
        self._session: Session | None = None
        self._committed = False
        self._writer: held.HeldWriter | None = None
        self._turn: writelock.FileWriteLock | None = None
        self._gated = False

    @classmethod
    def one_statement(cls, engine: Engine) -> UnitOfWork:
        """A unit for a write of one statement that commits itself (a store's one-statement append, where
        :attr:`~hostedrooms.store.RoomStore.one_statement_autocommits`): on PostgreSQL it runs in autocommit,
        outside any transaction, as a statement-snapshot read unit does.

        :param engine: the engine to write on.
        :returns: the unit, to use as a context manager.
        """
        return cls(engine, write=False, statement_snapshots=True)

    def __enter__(self) -> Self:
        # A write waits for its turn among all processes' writers (released by _close) before the fork gate: a
        # fork need not wait for a lock wait.
        self._turn = writelock.take(self.engine) if self.write else None
        try:
            forkgate.enter()  # no fork while the unit is inside the driver (held until it is closed)
            self._gated = True
            if self.write:
                writer = held.take(self.engine)
                if writer is not None:
                    return self._enter_held(writer)
        except BaseException:
            self._close()
            raise
        try:
            connection = self._connection = self.engine.connect()
            if self.statement_snapshots:
                self.backend.begin_statement_reads(connection)
            elif not self.write:
                self.backend.defer_begin(connection)
            connection.begin()
            begin_unit(connection)  # its hot statements take one path for the whole unit (hostedrooms.statements)
        except sa_exc.SQLAlchemyError as exc:
            self._close()
            raise translate(exc, self.engine.url) from exc
        except BaseException:
            self._close()
            raise
        return self

    def _enter_held(self, writer: held.HeldWriter) -> Self:
        self._writer = writer
        try:
            connection = self._connection = writer.open()
            if connection.fast:  # nothing observes the engine (decided as it was lent): skip SQLAlchemy where it can
                connection.begin_direct()  # SQLAlchemy joins it if a statement goes through execute()
            else:
                connection.begin()  # with listeners or logging: SQLAlchemy's own transaction, its events
        except sa_exc.SQLAlchemyError as exc:
            self._close()
            raise translate(exc, self.engine.url) from exc
        except BaseException:
            self._close()
            raise
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        try:
            if not self._committed:
                self.rollback()
        finally:
            self._close()
        if exc is not None and isinstance(exc, sa_exc.SQLAlchemyError):
            raise translate(exc, self.engine.url) from exc

    @property
    def connection(self) -> Connection:
        """The connection holding this unit's transaction (use Core statements on hot paths)."""
        if self._connection is None:
            raise RuntimeError("unit of work is not active")
        return self._connection

    @property
    def session(self) -> Session:
        """An ORM session joined to this unit's transaction; it never commits on its own."""
        if self._session is None:
            # The session joins the connection's transaction and never commits it: the unit of work does. (A
            # transaction the held writer began directly is joined by SQLAlchemy first, so the session sees one.)
            connection = self.connection
            if begun_directly(connection) and not connection.in_transaction():
                connection.begin()
            self._session = Session(bind=connection, expire_on_commit=False)
        return self._session

    def execute(self, statement: Executable, parameters: Any = None) -> Result[Any]:
        """Execute a Core statement in this unit's transaction.

        :param statement: a Core statement.
        :param parameters: its bound parameters, or None.
        :returns: the statement's result.
        """
        return self.connection.execute(statement, parameters)

    def fenced(self, statement: Executable, error: BaseException) -> None:
        """Run a guarded ``UPDATE ... WHERE``; raise ``error`` unless exactly one row changed.

        The caller leaves the block with the exception, so the unit rolls back and nothing it wrote stays.

        :param statement: the guarded ``UPDATE``.
        :param error: the exception to raise when it changed no row or more than one.
        :raises BaseException: ``error``, unless exactly one row changed.
        """
        result = self.connection.execute(statement)
        if result.rowcount != 1:
            raise error

    def commit(self) -> None:
        """Commit the transaction (flushing the ORM session first)."""
        if self._session is not None:
            try:
                self._session.flush()
            except sa_exc.SQLAlchemyError as exc:
                drop_after_failed_commit(self.connection)
                raise translate(exc, self.engine.url) from exc
        commit_transaction(self.connection, self.engine)
        self._committed = True
        if self.write:
            committed(self.engine)  # this engine's followers look now (SQLite polls otherwise)

    def rollback(self) -> None:
        """Roll back whatever this unit wrote; safe to call more than once."""
        if self._connection is not None:
            roll_back(self._connection)

    def _close(self) -> None:
        try:
            if self._session is not None:
                self._session.close()
                self._session = None
            connection, self._connection = self._connection, None
            writer, self._writer = self._writer, None
            if writer is not None:  # the held writer stays open for the next unit (unless the unit broke it)
                writer.release()
            elif connection is not None:
                end_unit(connection)
                connection.close()  # a transaction still open is rolled back on its way to the pool
        finally:
            turn, self._turn = self._turn, None
            try:
                if turn is not None:  # after the transaction ended, whichever way
                    turn.release()
            finally:
                if self._gated:
                    self._gated = False
                    forkgate.leave()



# -- ending a write transaction: shared by the unit of work and the lone append on SQLite's held writer
# (hostedrooms.rooms.transaction), so both end theirs the same way --


def begun_directly(connection: Connection) -> bool:
    """Whether ``connection`` (a held writer's) has a transaction open that SQLAlchemy has not joined."""
    return (isinstance(connection, DirectConnection) and not connection.closed and not connection.invalidated
            and DIRECT_BEGUN in connection.connection.info)


def end_transaction(connection: Connection, *, commit: bool) -> None:
    """Commit or roll back: SQLAlchemy's transaction if it has one, else the one the held writer began."""
    if connection.in_transaction() or not isinstance(connection, DirectConnection):
        if commit:
            connection.commit()
        else:
            connection.rollback()
    else:
        connection.end_direct(commit=commit)


def commit_transaction(connection: Connection, engine: Engine) -> None:
    """Commit ``connection``'s transaction; a driver error is raised translated, the connection dropped."""
    try:
        end_transaction(connection, commit=True)
    except sa_exc.SQLAlchemyError as exc:
        drop_after_failed_commit(connection)
        raise translate(exc, engine.url) from exc


def drop_after_failed_commit(connection: Connection) -> None:
    """After a failed COMMIT the driver may still hold the transaction open while SQLAlchemy considers it over:
    discard the connection (closing it rolls back) rather than return it to the pool. (A held writer's that lost
    its server is closed already.)"""
    if not connection.closed:
        connection.invalidate()


def roll_back(connection: Connection) -> None:
    """Roll back whatever ``connection``'s transaction wrote, if one is open; safe to call more than once."""
    if connection.in_transaction() or begun_directly(connection):
        try:
            end_transaction(connection, commit=False)
        except sa_exc.SQLAlchemyError:  # the connection is gone; its transaction went with it
            connection.invalidate()

"""SQLite: WAL, durable commits, ``BEGIN IMMEDIATE`` for every write transaction, the file checks of a target,
and ``PRAGMA data_version`` for waiting readers. Everything hostedrooms does differently on SQLite is here."""

from __future__ import annotations

import contextlib
import os
import urllib.parse
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

from sqlalchemy import URL, ColumnElement, Connection, Engine, NullPool, Table, event, func
from sqlalchemy.dialects import sqlite
from sqlalchemy.pool import StaticPool

from .. import writelock
from .. import writer as held_writer
from ..errors import StoreConfigurationError, StoreMissingError
from ..files import PRIVATE_FILE_MODE, SQLITE_SIDECARS, restrict_file
from ..statements import DIRECT_BEGUN
from .base import Backend, UpsertInsert, register, sa_create_engine

__all__ = ["SQLITE_LINEAGE", "SQLiteBackend"]

#: Key in a pooled connection's ``info``: the next SQLite transaction on it begins deferred (a read unit).
_DEFERRED_BEGIN = "hostedrooms_deferred_begin"

#: The lineage of every SQLite store (see :meth:`SQLiteBackend.lineage`).
SQLITE_LINEAGE = "sqlite"

_E = TypeVar("_E")


class SQLiteBackend(Backend):
    """SQLite: WAL, durable commits, and ``BEGIN IMMEDIATE`` for every write transaction.

    pysqlite's default transaction handling issues reads before its implicit BEGIN, which loses updates
    under concurrency; we take transaction control ourselves (the recipe in SQLAlchemy's SQLite dialect
    docs) so a read-then-write transaction holds the write lock from its first statement.
    """

    name = "sqlite"
    async_driver = "aiosqlite"

    # --- connection setup and transactions -------------------------------------------------------------------

    def configure_engine(self, engine: Engine, *, synchronous: str, busy_timeout: float) -> None:
        timeout_ms = int(busy_timeout * 1000)

        @event.listens_for(engine, "connect")
        def _on_connect(dbapi_connection: Any, _record: Any) -> None:
            dbapi_connection.isolation_level = None  # we emit BEGIN ourselves
            cursor = dbapi_connection.cursor()
            try:
                cursor.execute(f"PRAGMA busy_timeout={timeout_ms}")
                cursor.execute("PRAGMA journal_mode=WAL")
                cursor.execute(f"PRAGMA synchronous={synchronous}")
                cursor.execute("PRAGMA foreign_keys=ON")
            finally:
                cursor.close()

        # SQLAlchemy calls the dialect's do_begin() for every transaction, explicit or autobegun, and wraps its
        # driver errors. Emitting BEGIN there, rather than in a "begin" event listener (SQLAlchemy's documented
        # recipe), keeps the engine free of Connection event listeners: with one, every new Connection builds
        # its event dispatch afresh, about a fifth of the library's cost of a single append.
        def do_begin(dbapi_connection: Any) -> None:  # the pool's proxy of the driver's connection
            info = dbapi_connection.info
            if info.pop(DIRECT_BEGUN, False):
                return  # the held writer began this transaction directly: SQLAlchemy's joins it
            # On the driver's connection itself: the pool's proxy finds execute() only through its slow
            # attribute fallback (__getattr__), once per transaction.
            begin = "BEGIN" if info.pop(_DEFERRED_BEGIN, False) else "BEGIN IMMEDIATE"
            dbapi_connection.dbapi_connection.execute(begin)

        engine.dialect.do_begin = do_begin  # type: ignore[method-assign]
        held_writer.allow(engine, busy_timeout)  # writers are serialised: one held connection serves every write unit
        writelock.allow(engine, busy_timeout)  # write units of every process queue on the lock file

    def defer_begin(self, connection: Connection) -> None:
        connection.connection.info[_DEFERRED_BEGIN] = True

    # --- SQL fragments ---------------------------------------------------------------------------------------

    def insert(self, table: Table) -> UpsertInsert:
        return sqlite.insert(table)  # type: ignore[return-value]

    def greatest(self, *values: Any) -> ColumnElement[Any]:
        return func.max(*values)

    # --- locking ---------------------------------------------------------------------------------------------

    def lock_migrations(self, connection: Connection) -> None:
        # Our engines began this transaction with BEGIN IMMEDIATE. A host application's engine (its env.py's
        # connection) leaves pysqlite's default: no BEGIN before DDL, so each statement would commit on its
        # own and two upgraders would interleave. Begin the write transaction here instead.
        if not connection.connection.dbapi_connection.in_transaction:  # type: ignore[union-attr]
            connection.exec_driver_sql("BEGIN IMMEDIATE")

    @contextlib.contextmanager
    def probe_timeouts(self, connection: Connection, seconds: float) -> Iterator[None]:
        raw = connection.connection.dbapi_connection
        assert raw is not None
        cursor = raw.cursor()
        previous = cursor.execute("PRAGMA busy_timeout").fetchone()[0]
        cursor.execute(f"PRAGMA busy_timeout={int(seconds * 1000)}")
        try:
            yield
        finally:
            cursor.execute(f"PRAGMA busy_timeout={int(previous)}")
            cursor.close()

    # --- lineage and store facts -----------------------------------------------------------------------------

    def lineage(self, connection: Connection) -> str:
        """The constant :data:`SQLITE_LINEAGE`: a file is never promoted (an older copy of it put back is not
        detected by lineage)."""
        return SQLITE_LINEAGE

    def integrity_problems(self, connection: Connection) -> list[str]:
        rows = connection.exec_driver_sql("PRAGMA integrity_check").scalars().all()
        return [] if rows == ["ok"] else [str(row) for row in rows]

    def is_crash_safe(self, connection: Connection) -> bool:
        journal = str(connection.exec_driver_sql("PRAGMA journal_mode").scalar()).lower()
        synchronous = int(connection.exec_driver_sql("PRAGMA synchronous").scalar() or 0)
        return journal == "wal" and synchronous >= 2  # 2 = FULL, 3 = EXTRA

    def restrict_to_owner(self, connection: Connection) -> None:
        database = connection.engine.url.database
        if not database or database == ":memory:" or database.startswith("file:"):
            return
        # The WAL and shared-memory files hold the same rows as the database file until a checkpoint. This runs
        # inside a transaction: restrict_file never opens a descriptor whose closing would release our locks,
        # never follows a symlink, and refuses (PermissionError) a file that is not our own regular file.
        for suffix in ("", *SQLITE_SIDECARS):
            with contextlib.suppress(FileNotFoundError):
                restrict_file(database + suffix, PRIVATE_FILE_MODE)

    # --- URLs, engines and migrations ---------------------------------------------------------------------------

    render_as_batch = True

    def file_path(self, url: URL) -> Path | None:
        return None if url.database in (None, "", ":memory:") else Path(str(url.database))

    def build_with(self, factory: Callable[..., _E], url: URL, *, create: bool, **engine_kwargs: Any) -> _E:
        existing_file = _prepare_sqlite_file(url, create=create)
        if url.database in (None, "", ":memory:"):
            engine_kwargs.setdefault("poolclass", StaticPool)
        engine_kwargs.setdefault("connect_args", {}).setdefault("check_same_thread", False)
        engine = factory(url, **engine_kwargs)
        if existing_file is not None:
            sync_engine: Engine = getattr(engine, "sync_engine", None) or engine  # type: ignore[assignment]
            _open_existing_only(sync_engine, existing_file)
        return engine

    def store_absent(self, url: URL) -> bool:
        database = url.database
        return not database or database == ":memory:" or not os.path.isfile(database)

    def probe_engine(self, url: URL, seconds: float) -> Engine:
        # Read-only URI: a probe can neither create the file nor write to it; no WAL/migration hooks.
        uri = "file:" + urllib.parse.quote(str(url.database))
        probe_url = URL.create("sqlite", database=uri, query={"mode": "ro", "uri": "true"})
        return sa_create_engine(
            probe_url, poolclass=NullPool, connect_args={"timeout": seconds, "check_same_thread": False})

    # --- asyncio ---------------------------------------------------------------------------------------------

    def twin_target(self, url: URL) -> Path | URL | None:
        path = self.file_path(url)  # in memory: another engine has another database; a URI is used as given
        return None if path is None or str(path).startswith("file:") else path

    # --- notification: readers poll --------------------------------------------------------------------------

    def commit_file(self, url: URL) -> str | None:
        path = self.twin_target(url)  # a file path (not in memory, not a URI)
        return None if not isinstance(path, Path) else f"{path}-wal"  # WAL mode: every commit appends there

    def change_counter(self, dbapi_connection: Any) -> int:
        """A number that changes whenever another connection commits to the database (``PRAGMA data_version``:
        no I/O beyond the shared-memory index), read on a connection outside any transaction."""
        cursor = dbapi_connection.cursor()
        try:
            cursor.execute("PRAGMA data_version")
            return int(cursor.fetchone()[0])
        finally:
            cursor.close()


def _prepare_sqlite_file(url: URL, *, create: bool) -> str | None:
    """Check a SQLite file target (and make its folder when ``create``); return the file that must exist."""
    database = url.database
    if not database or database == ":memory:" or database.startswith("file:"):
        return None  # in memory, or a URI whose mode= the caller chose
    path = Path(database)
    if path.is_dir():
        raise StoreConfigurationError(f"hosted room store {database} is a directory, not a SQLite file")
    if create:
        path.parent.mkdir(parents=True, exist_ok=True)
        return None
    if not path.exists():
        raise StoreMissingError(f"hosted room store {database} does not exist (no SQLite file there)")
    return database


def _open_existing_only(engine: Engine, database: str) -> None:
    """Connect with SQLite's ``mode=rw`` URI, so a file removed after the check is never created again."""
    uri = f"file:{urllib.parse.quote(database)}?mode=rw"

    @event.listens_for(engine, "do_connect")
    def _connect_existing(_dialect: Any, _record: Any, cargs: list[Any], cparams: dict[str, Any]) -> None:
        cargs[:] = [uri]
        cparams["uri"] = True


register(SQLiteBackend())

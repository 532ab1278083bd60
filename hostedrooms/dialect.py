"""Everything that differs between SQLite and PostgreSQL, behind one interface.

Nothing else tests ``dialect.name``; callers ask :func:`dialect_for` (or :func:`dialect_for_url`,
:func:`dialect_named`) for a :class:`StoreDialect` and call it: transaction start (SQLite ``BEGIN IMMEDIATE``
versus PostgreSQL ``BEGIN`` plus row locks), upserts, scalar maximum, advisory locks, the short timeouts of
non-blocking probes, and the engine and URL defaults of each backend (driver, file checks, Alembic batch mode).

Namespaces (PostgreSQL): several gateways may share one database, a schema each (``schema=``, or a
``search_path`` in the URL). Advisory locks and ``NOTIFY`` channels are per database, so every advisory key and
channel name is derived from the engine's namespace (its database and ``current_schema()``, read once at its
first connection): two schemas never share a lock or a wake-up (the byte budget's shards are rows in the
schema). The ``public`` schema keeps the fixed keys and channels earlier versions used.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
import threading
import urllib.parse
import weakref
from collections.abc import Callable, Hashable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, TypeVar

import sqlalchemy
from sqlalchemy import (
    URL,
    BigInteger,
    ColumnElement,
    Connection,
    Engine,
    LargeBinary,
    NullPool,
    Select,
    Table,
    bindparam,
    cast,
    event,
    func,
    select,
    text,
)
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.engine import Dialect
from sqlalchemy.pool import StaticPool

from . import writelock
from . import writer as held
from .errors import SchemaMissingError, StoreConfigurationError, StoreMissingError, describe_target
from .files import PRIVATE_FILE_MODE, SQLITE_SIDECARS, restrict_file
from .statements import DIRECT_BEGUN, HotStatement
from .store.locks import MIGRATION_LOCK_KEY as MIGRATION_LOCK_KEY


def sa_create_engine(*args: Any, **kwargs: Any) -> Engine:
    """``sqlalchemy.create_engine``, looked up at each call: an instrumentation that wraps it after hostedrooms was
    imported (OpenTelemetry's global ``SQLAlchemyInstrumentor().instrument()``) sees hostedrooms' engines too."""
    return sqlalchemy.create_engine(*args, **kwargs)


#: Key in a pooled connection's ``info``: the next SQLite transaction on it begins deferred (a read unit).
_DEFERRED_BEGIN = "hostedrooms_deferred_begin"

#: Wake-up channels (:mod:`hostedrooms.wakeup`): a room's log grew (payload: the room id); ledger work became due
#: (payload: "delivery", "response" or "outbound").
ROOM_EVENTS_CHANNEL = "hostedrooms_room_events"
LEDGER_WORK_CHANNEL = "hostedrooms_ledger_work"

#: The schema whose advisory keys and channels are the fixed ones above, as earlier versions used them (so a
#: gateway in ``public`` and an older version of it running alongside still exclude each other); every other
#: schema gets keys and channels of its own (:func:`scoped_key`, :func:`scoped_channel`).
LEGACY_SCHEMA = "public"

#: A schema name hostedrooms accepts for ``schema=``: an unquoted-style identifier of at most 63 bytes.
_SCHEMA_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_MAX_IDENTIFIER_BYTES = 63

#: The ``pooler=`` values :func:`hostedrooms.create_engine` accepts: None or "session" (a direct connection, or a
#: pooler that keeps one server connection per client session: nothing changes), "transaction" (PgBouncer's
#: ``pool_mode = transaction``: no server-side prepared statements, no session state, LISTEN on ``listen_url``).
POOLERS = (None, "session", "transaction")

_S = TypeVar("_S", bound=Select[Any])
_T = TypeVar("_T")
_E = TypeVar("_E")


class UpsertInsert(Protocol):
    """The insert construct both dialects return: ``on_conflict_do_update`` / ``on_conflict_do_nothing``."""

    excluded: Any

    def values(self, *args: Any, **kwargs: Any) -> UpsertInsert: ...

    def on_conflict_do_update(self, *, index_elements: Any = ..., set_: Any = ..., where: Any = ...) -> Any: ...

    def on_conflict_do_nothing(self, *, index_elements: Any = ...) -> Any: ...


class StoreDialect:
    """Dialect-specific behaviour; one instance per supported backend."""

    name = "generic"

    def __init__(self) -> None:
        self._statements: dict[Hashable, Any] = {}

    def statement(self, key: Hashable, build: Callable[[StoreDialect], _T]) -> _T:
        """The one per-backend statement cache: ``build(self)`` the first time ``key`` is asked on this backend,
        the same object afterwards (statements whose text differs by backend: row locks, upserts, collations).
        Two threads racing on a first use may both build; either result is the same statement."""
        try:
            built: _T = self._statements[key]
        except KeyError:
            built = self._statements[key] = build(self)
        return built

    def configure_engine(self, engine: Engine, *, synchronous: str, busy_timeout: float) -> None:
        """Install connection hooks (pragmas, transaction start) on a new engine."""

    def defer_begin(self, connection: Connection) -> None:
        """Make the next transaction on ``connection`` a read transaction that takes no write lock up front."""

    def begin_statement_reads(self, connection: Connection) -> None:
        """Prepare ``connection`` for a read whose statements each need only a snapshot of their own: where
        every statement already sees its own snapshot (PostgreSQL at READ COMMITTED), no transaction is opened
        at all, which saves the BEGIN and ROLLBACK round trips; elsewhere a read transaction (:meth:`defer_begin`)."""
        self.defer_begin(connection)

    def snapshot_reads(self, connection: Connection) -> None:
        """Make the transaction just begun on ``connection`` (no statement run yet) one read-only snapshot, so
        several statements agree with each other (SQLite: a read transaction already is one, from its first read)."""

    def lineage(self, connection: Connection) -> str:
        """The store's lineage: an identity of the history it holds, which changes when another copy of that
        history takes over (a standby promoted). SQLite: the constant :data:`SQLITE_LINEAGE` (a file is never
        promoted; an older copy of it put back is not detected by lineage)."""
        return SQLITE_LINEAGE

    def insert(self, table: Table) -> UpsertInsert:
        """An INSERT that supports ``ON CONFLICT`` upserts."""
        raise NotImplementedError

    def for_update(self, stmt: _S) -> _S:
        """Lock the selected rows until the transaction ends where the backend needs row locks."""
        return stmt

    def greatest(self, *values: Any) -> ColumnElement[Any]:
        """The scalar maximum of its arguments."""
        raise NotImplementedError

    def lock_migrations(self, connection: Connection) -> None:
        """Serialise concurrent migration runs for the rest of the current transaction."""

    @contextlib.contextmanager
    def probe_timeouts(self, connection: Connection, seconds: float) -> Iterator[None]:
        """Bound how long statements in the current transaction may wait for locks."""
        yield

    def serialize(self, connection: Connection, key: int) -> None:
        """Serialise transactions taking the same ``key`` until they end (SQLite: BEGIN IMMEDIATE already does)."""

    def bytewise(self, expr: ColumnElement[Any]) -> ColumnElement[Any]:
        """``expr`` compared by code point (SQLite's BINARY), whatever the database's default collation."""
        return expr

    def hot_params(self, connection: Connection, channel: str) -> dict[str, Any]:
        """The parameters a hot statement binds for ``connection``'s namespace: ``notify_channel``, the namespace's
        name of the wake-up ``channel`` (one of hostedrooms' fixed channel names)."""
        raise NotImplementedError

    def byte_length(self, expr: ColumnElement[Any]) -> ColumnElement[Any]:
        """The UTF-8 byte length of a text expression."""
        return func.length(cast(expr, LargeBinary))

    def is_crash_safe(self, connection: Connection) -> bool:
        """Whether a commit on ``connection`` survives a process crash and power loss."""
        return True

    def integrity_problems(self, connection: Connection) -> list[str]:
        """The backend's own structural integrity check (empty when sound, or when it has none)."""
        return []

    def restrict_to_owner(self, connection: Connection) -> None:
        """Make the files holding the store owner-only (SQLite: ``0600``); nothing for a database server.

        Raises ``OSError`` when the mode cannot be changed safely: a file owned by another user, or a symlink
        (never followed).
        """

    def store_absent(self, url: URL) -> bool:
        """Whether ``url`` certainly names no existing store, decided without creating anything."""
        return False

    def probe_engine(self, url: URL, seconds: float) -> Engine:
        """A small engine for non-blocking probes of ``url``: no hooks, no migration, never creates the store."""
        raise NotImplementedError

    def is_missing_store(self, exc: BaseException) -> bool:
        """Whether an error raised while connecting means the database itself does not exist."""
        return False

    # --- URLs, engines and migrations (db.py, migrate.py, testing.py) ---------------------------------------------

    #: Whether Alembic must emulate ALTER TABLE by copying tables ("batch" mode: SQLite's ALTER is limited).
    render_as_batch = False

    def normalise_url(self, url: URL) -> URL:
        """``url`` with the driver hostedrooms uses on this backend."""
        return url

    def file_path(self, url: URL) -> Path | None:
        """The database file ``url`` names, or None (a database server, an in-memory database)."""
        return None

    def build_engine(self, url: URL, *, create: bool, **engine_kwargs: Any) -> Engine:
        """A plain SQLAlchemy Engine on ``url`` with this backend's defaults (``create``: see
        :func:`hostedrooms.db.create_engine`); raises SQLAlchemy's own errors for a bad URL or driver."""
        return self.build_with(sa_create_engine, url, create=create, **engine_kwargs)

    def build_with(self, factory: Callable[..., _E], url: URL, *, create: bool, **engine_kwargs: Any) -> _E:
        """:meth:`build_engine` with another engine factory (``sqlalchemy.ext.asyncio.create_async_engine``)."""
        return factory(url, **engine_kwargs)

    # --- asyncio (hostedrooms.aio) ---------------------------------------------------------------------------------

    #: The asyncio driver of :func:`hostedrooms.aio.create_async_engine` on this backend.
    async_driver = ""
    #: Whether committed writes can wake a waiting reader (``LISTEN``/``NOTIFY``); otherwise readers poll.
    notifies = False

    def twin_target(self, url: URL) -> Path | URL | None:
        """What a second, synchronous engine opens to reach the database ``url`` names (hostedrooms' driver), or
        None where it would not see the same database."""
        return self.normalise_url(url.set(drivername=url.get_backend_name()))

    def async_url(self, url: URL) -> URL:
        """``url`` (normalised) with this backend's asyncio driver."""
        return url.set(drivername=f"{url.get_backend_name()}+{self.async_driver}")

    def notify(self, connection: Connection, channel: str, payload: str) -> None:
        """Wake the readers listening on ``channel`` when the current transaction commits (nothing where readers
        poll). ``channel`` is one of hostedrooms' fixed channel names, never input."""

    def change_counter(self, dbapi_connection: Any) -> int:
        """Where readers poll: a number that changes whenever another connection commits."""
        raise NotImplementedError

    def commit_file(self, url: URL) -> str | None:
        """Where readers poll: a file every commit to ``url`` writes, whose writes hint that the change counter
        moved (None: none known)."""
        return None

    def listen_statement(self, channel: str, namespace: str | None = None) -> str:
        """The statement that makes a connection receive ``channel``'s notifications in ``namespace`` (one of
        hostedrooms' fixed channel names, never input)."""
        raise NotImplementedError

    # --- namespaces (one schema of a shared database per gateway) ------------------------------------------------

    #: Whether the backend has schemas (namespaces inside one database) for ``schema=``.
    has_schemas = False
    #: Whether the backend is reached through connection poolers (``pooler=``: PgBouncer before PostgreSQL).
    has_poolers = False

    def use_schema(self, engine: Engine, schema: str) -> None:
        """Make every connection of ``engine`` use ``schema`` alone (its ``search_path``), checked at connect."""
        raise NotImplementedError

    def namespace(self, connection: Connection) -> str | None:
        """The namespace of ``connection``'s engine (None: the legacy one); only where locks and channels are
        shared by several schemas of a database."""
        return None

    def raw_namespace(self, sa_dialect: Dialect, dbapi_connection: Any, url: URL) -> str | None:
        """:meth:`namespace` from a DBAPI connection outside any pool checkout (the shared waiter's)."""
        return None

    def check_search_path(self, connection: Connection) -> None:
        """Refuse a ``search_path`` under which hostedrooms' tables resolve to more than one schema, or to a
        schema other than the one new tables would be created in."""


class SQLiteDialect(StoreDialect):
    """SQLite: WAL, durable commits, and ``BEGIN IMMEDIATE`` for every write transaction.

    pysqlite's default transaction handling issues reads before its implicit BEGIN, which loses updates
    under concurrency; we take transaction control ourselves (the recipe in SQLAlchemy's SQLite dialect
    docs) so a read-then-write transaction holds the write lock from its first statement.
    """

    name = "sqlite"
    async_driver = "aiosqlite"

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
        def do_begin(dbapi_connection: Any) -> None:
            if dbapi_connection.info.pop(DIRECT_BEGUN, False):
                return  # the held writer began this transaction directly: SQLAlchemy's joins it
            deferred = dbapi_connection.info.pop(_DEFERRED_BEGIN, False)
            dbapi_connection.execute("BEGIN" if deferred else "BEGIN IMMEDIATE")

        engine.dialect.do_begin = do_begin  # type: ignore[method-assign]
        held.allow(engine, busy_timeout)  # writers are serialised: one held connection serves every write unit
        writelock.allow(engine, busy_timeout)  # write units of every process queue on the lock file

    def defer_begin(self, connection: Connection) -> None:
        connection.connection.info[_DEFERRED_BEGIN] = True

    def lock_migrations(self, connection: Connection) -> None:
        # Our engines began this transaction with BEGIN IMMEDIATE. A host application's engine (its env.py's
        # connection) leaves pysqlite's default: no BEGIN before DDL, so each statement would commit on its
        # own and two upgraders would interleave. Begin the write transaction here instead.
        if not connection.connection.dbapi_connection.in_transaction:  # type: ignore[union-attr]
            connection.exec_driver_sql("BEGIN IMMEDIATE")

    def insert(self, table: Table) -> UpsertInsert:
        return sqlite.insert(table)  # type: ignore[return-value]

    def integrity_problems(self, connection: Connection) -> list[str]:
        rows = connection.exec_driver_sql("PRAGMA integrity_check").scalars().all()
        return [] if rows == ["ok"] else [str(row) for row in rows]

    def is_crash_safe(self, connection: Connection) -> bool:
        journal = str(connection.exec_driver_sql("PRAGMA journal_mode").scalar()).lower()
        synchronous = int(connection.exec_driver_sql("PRAGMA synchronous").scalar() or 0)
        return journal == "wal" and synchronous >= 2  # 2 = FULL, 3 = EXTRA

    def greatest(self, *values: Any) -> ColumnElement[Any]:
        return func.max(*values)

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

    def store_absent(self, url: URL) -> bool:
        database = url.database
        return not database or database == ":memory:" or not os.path.isfile(database)

    def probe_engine(self, url: URL, seconds: float) -> Engine:
        # Read-only URI: a probe can neither create the file nor write to it; no WAL/migration hooks.
        uri = "file:" + urllib.parse.quote(str(url.database))
        probe_url = URL.create("sqlite", database=uri, query={"mode": "ro", "uri": "true"})
        return sa_create_engine(
            probe_url, poolclass=NullPool, connect_args={"timeout": seconds, "check_same_thread": False})

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

    def twin_target(self, url: URL) -> Path | URL | None:
        path = self.file_path(url)  # in memory: another engine has another database; a URI is used as given
        return None if path is None or str(path).startswith("file:") else path

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


class PostgreSQLDialect(StoreDialect):
    """PostgreSQL: READ COMMITTED transactions; writers to one room serialise on ``SELECT ... FOR UPDATE``."""

    name = "postgresql"
    async_driver = "psycopg_async"
    notifies = True
    has_schemas = True
    has_poolers = True

    def configure_engine(self, engine: Engine, *, synchronous: str, busy_timeout: float) -> None:
        # Before the connect hooks (the schema's search_path among them): first_connect runs first, once per pool
        # (again after a failure), so an unsupported engine is refused before anything else is asked of it.
        @event.listens_for(engine, "first_connect")
        def _on_first_connect(dbapi_connection: Any, _record: Any) -> None:
            refuse_engine(engine, dbapi_connection)

        @event.listens_for(engine, "connect")
        def _on_connect(dbapi_connection: Any, _record: Any) -> None:
            if engine.dialect not in _namespaces:
                _first_connect(engine, dbapi_connection)

    def notify(self, connection: Connection, channel: str, payload: str) -> None:
        _NOTIFY.first(connection, {"channel": scoped_channel(self.namespace(connection), channel),
                                   "payload": payload})

    def listen_statement(self, channel: str, namespace: str | None = None) -> str:
        if channel not in (ROOM_EVENTS_CHANNEL, LEDGER_WORK_CHANNEL):
            raise ValueError(f"unknown wake-up channel {channel!r}")
        return f"LISTEN {scoped_channel(namespace, channel)}"

    def hot_params(self, connection: Connection, channel: str) -> dict[str, Any]:
        # Built once per namespace: the channel's name is bound per call, so one compiled statement serves every
        # namespace.
        namespace = self.namespace(connection)
        cache_key = (namespace, channel)
        params = _HOT_PARAMS.get(cache_key)
        if params is None:
            params = _HOT_PARAMS[cache_key] = {"notify_channel": scoped_channel(namespace, channel)}
        return params

    # --- namespaces -------------------------------------------------------------------------------------------

    def use_schema(self, engine: Engine, schema: str) -> None:
        check_schema_name(schema)
        statement = f"SET search_path TO {_quote(schema)}"

        @event.listens_for(engine, "connect")
        def _on_connect(dbapi_connection: Any, _record: Any) -> None:
            _set_schema(engine, dbapi_connection, schema, statement)

    def namespace(self, connection: Connection) -> str | None:
        sa_dialect = connection.dialect
        try:
            return _namespaces[sa_dialect]
        except KeyError:
            pass
        database, schema = connection.exec_driver_sql("SELECT current_database(), current_schema()").one()
        return remember_namespace(sa_dialect, database, schema, connection.engine.url)

    def raw_namespace(self, sa_dialect: Dialect, dbapi_connection: Any, url: URL) -> str | None:
        """:meth:`namespace` from a DBAPI connection outside any pool checkout (the shared waiter's)."""
        try:
            return _namespaces[sa_dialect]
        except KeyError:
            pass
        cursor = dbapi_connection.cursor()
        try:
            cursor.execute("SELECT current_database(), current_schema()")
            database, schema = cursor.fetchone()
        finally:
            cursor.close()
        return remember_namespace(sa_dialect, database, schema, url)

    def check_search_path(self, connection: Connection) -> None:
        current, found = connection.exec_driver_sql(_TABLE_SCHEMAS).one()
        _refuse_split_path(current, list(found or ()), connection.engine.url)

    def insert(self, table: Table) -> UpsertInsert:
        return postgresql.insert(table)  # type: ignore[return-value]

    def for_update(self, stmt: _S) -> _S:
        return stmt.with_for_update()

    def lineage(self, connection: Connection) -> str:
        """``postgresql:SYSTEM_IDENTIFIER:TIMELINE``: the cluster's system identifier (fixed at ``initdb``, copied
        by ``pg_basebackup``) and the timeline it writes (a primary) or replays (a standby), which every
        promotion (and every point-in-time restore) increments. A primary's timeline is read from the WAL file
        name of its insert position, exact from the moment it accepts writes (``pg_control_checkpoint()`` lags
        until the next checkpoint). Read once per pooled connection: a primary's cannot change under an open
        connection. A standby's (it may be promoted while the connection stays open) and one read through a
        transaction pooler (whose next transaction may reach another server) are read on every call."""
        info = connection.info
        cached = info.get(_LINEAGE_INFO)
        if cached is not None:
            return str(cached)
        row = _LINEAGE.first(connection, {})
        assert row is not None  # one row, always
        system, recovering, walfile, replayed = row
        timeline = int(str(walfile)[:8], 16) if walfile is not None else int(replayed)
        lineage = f"postgresql:{system}:{timeline}"
        pooler = pooler_of(connection.engine)
        if not recovering and (pooler is None or pooler.mode != "transaction"):
            info[_LINEAGE_INFO] = lineage
        return lineage

    def begin_statement_reads(self, connection: Connection) -> None:
        # Each statement is its own transaction (autocommit); the pool restores the engine's isolation level
        # when the connection is returned.
        connection.execution_options(isolation_level="AUTOCOMMIT")

    def snapshot_reads(self, connection: Connection) -> None:
        # READ COMMITTED gives each statement its own snapshot; READ ONLY also runs on a hot standby.
        connection.exec_driver_sql("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY")

    def greatest(self, *values: Any) -> ColumnElement[Any]:
        return func.greatest(*values)

    def lock_migrations(self, connection: Connection) -> None:
        self.serialize(connection, MIGRATION_LOCK_KEY)

    def serialize(self, connection: Connection, key: int) -> None:
        # Advisory keys are per database: each namespace (schema) takes keys of its own.
        _LOCK.first(connection, {"key": scoped_key(self.namespace(connection), key)})

    def byte_length(self, expr: ColumnElement[Any]) -> ColumnElement[Any]:
        return func.octet_length(expr)

    def bytewise(self, expr: ColumnElement[Any]) -> ColumnElement[Any]:
        return expr.collate("C")

    def probe_engine(self, url: URL, seconds: float) -> Engine:
        # A small private pool: probes never queue behind the application's connections for long.
        connect_args = {} if "connect_timeout" in url.query else {"connect_timeout": 2}  # libpq's minimum
        return sa_create_engine(
            url, pool_size=1, max_overflow=4, pool_timeout=seconds, connect_args=connect_args)

    def normalise_url(self, url: URL) -> URL:
        hosts = url.query.get("host")
        if isinstance(hosts, str) and "," in hosts:
            # libpq's multi-host form (host=h1:p1,h2:p2), as SQLAlchemy takes it: one host parameter per server.
            url = url.update_query_dict({"host": tuple(hosts.split(","))})
        password = url.query.get("password")
        if password is not None:
            # libpq's ?password= is the password (the last given wins, as in libpq): held where SQLAlchemy's own
            # rendering (an Engine's repr, str(url)) masks it, never as a query parameter it prints.
            url = url.difference_update_query(["password"]).set(
                password=password if isinstance(password, str) else password[-1])
        if url.get_driver_name() in ("psycopg2", "psycopg", ""):
            return url.set(drivername="postgresql+psycopg")
        return url

    def is_missing_store(self, exc: BaseException) -> bool:
        original = getattr(exc, "orig", None) or exc
        if getattr(original, "sqlstate", None) == "3D000":  # invalid_catalog_name
            return True
        # libpq reports a missing database at connect time as text only (no SQLSTATE).
        text = str(original)
        return "database" in text and "does not exist" in text

    @contextlib.contextmanager
    def probe_timeouts(self, connection: Connection, seconds: float) -> Iterator[None]:
        milliseconds = max(1, int(seconds * 1000))
        # SET LOCAL lasts until the transaction ends; set_config(..., true) is its parameterisable form.
        for setting in ("lock_timeout", "statement_timeout"):
            connection.execute(func.set_config(setting, f"{milliseconds}ms", True).select())
        yield


_DIALECTS: dict[str, StoreDialect] = {d.name: d for d in (SQLiteDialect(), PostgreSQLDialect())}
SUPPORTED_DIALECTS = frozenset(_DIALECTS)


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


_LOCK = HotStatement(select(func.pg_advisory_xact_lock(bindparam("key", type_=BigInteger))))
_NOTIFY = HotStatement(select(func.pg_notify(bindparam("channel"), bindparam("payload"))))

# --- namespaces ------------------------------------------------------------------------------------------------

#: Per engine (its SQLAlchemy dialect object, shared by the engines ``execution_options()`` derives): the
#: namespace read at its first connection (None: the legacy schema's fixed keys and channels).
_namespaces: weakref.WeakKeyDictionary[Dialect, str | None] = weakref.WeakKeyDictionary()
#: (namespace, channel) -> the hot append's channel parameter.
_HOT_PARAMS: dict[tuple[str | None, str], dict[str, Any]] = {}

#: The current schema, and the schemas of the search path holding a hostedrooms table (rooms or version table).
_TABLE_SCHEMAS = (
    "SELECT current_schema(), ARRAY(SELECT DISTINCT table_schema::text FROM information_schema.tables "
    "WHERE table_name IN ('hosted_rooms', 'hostedrooms_alembic_version') "
    "AND table_schema = ANY(current_schemas(false)) ORDER BY 1)")
#: The same, after the database's name (an engine's first connection).
_FIRST_CONNECT = (
    "SELECT current_database(), current_schema(), ARRAY(SELECT DISTINCT table_schema::text "
    "FROM information_schema.tables WHERE table_name IN ('hosted_rooms', 'hostedrooms_alembic_version') "
    "AND table_schema = ANY(current_schemas(false)) ORDER BY 1)")


@dataclass(frozen=True, slots=True)
class Pooler:
    """How an engine reaches PostgreSQL: through a pooler in ``mode`` ("session", "transaction"), and the URL of a
    direct connection its shared waiter ``LISTEN``\\ s on (None: the engine's own URL)."""

    mode: str | None
    listen_url: URL | None


#: Per engine (its SQLAlchemy dialect object, shared by the engines ``execution_options()`` derives): its pooler.
_poolers: weakref.WeakKeyDictionary[Dialect, Pooler] = weakref.WeakKeyDictionary()


def use_pooler(engine: Engine, pooler: Pooler) -> None:
    """Record ``engine``'s pooler; under transaction pooling its connections never prepare statements on the
    server (a prepared statement lives on one server connection, and the next transaction may run on another)."""
    _poolers[engine.dialect] = pooler
    if pooler.mode != "transaction":
        return

    @event.listens_for(engine, "do_connect")
    def _no_server_prepares(_dialect: Any, _record: Any, _cargs: list[Any], cparams: dict[str, Any]) -> None:
        cparams["prepare_threshold"] = None  # psycopg 3: never PREPARE, whatever the connect_args said


def pooler_of(engine: Engine) -> Pooler | None:
    """The pooler ``engine`` was built with (None: a direct connection, as far as hostedrooms was told)."""
    return _poolers.get(engine.dialect)


def check_listen_through(engine: Engine) -> URL | None:
    """The URL a waiter of ``engine`` must ``LISTEN`` on (None: the engine's own pool); a StoreConfigurationError
    where notifications would be lost (a transaction pooler and no ``listen_url``)."""
    pooler = pooler_of(engine)
    if pooler is None:
        return None
    if pooler.mode == "transaction" and pooler.listen_url is None:
        raise StoreConfigurationError(
            f"LISTEN through a transaction pooler is lost: hosted room store {_describe(engine.url)} was built "
            "with pooler='transaction'; give listen_url=... (a direct connection to PostgreSQL, bypassing the "
            "pooler) for follow() and ledger wake-ups")
    return pooler.listen_url


#: The lineage of every SQLite store (see :meth:`StoreDialect.lineage`).
SQLITE_LINEAGE = "sqlite"
_LINEAGE_INFO = "hostedrooms_lineage"
# A primary: the WAL file of its insert position names its timeline. A standby (pg_walfile_name() refuses during
# recovery): the timeline its WAL receiver streams, else the last restart point's.
_LINEAGE = HotStatement(text(
    "SELECT s.system_identifier::text, pg_is_in_recovery(), "
    "CASE WHEN pg_is_in_recovery() THEN NULL ELSE pg_walfile_name(pg_current_wal_insert_lsn()) END, "
    "CASE WHEN pg_is_in_recovery() THEN COALESCE((SELECT received_tli FROM pg_stat_wal_receiver), "
    "(SELECT timeline_id FROM pg_control_checkpoint())) END "
    "FROM pg_control_system() s"))


#: What hostedrooms relies on that these PostgreSQL-compatible engines lack (see :func:`refuse_engine`).
_UNSUPPORTED_ENGINES = {
    "CockroachDB": "transaction-scoped advisory locks (room creation, replicas, the ledger, migrations) and "
                   "LISTEN/NOTIFY (wake-ups)",
    "YugabyteDB": "transaction-scoped advisory locks (room creation, replicas, the ledger, migrations) and "
                  "LISTEN/NOTIFY (wake-ups)",
    "Citus": "subqueries in INSERT on distributed tables (the one-statement append) and cluster-wide advisory "
             "locks (room creation, replicas, the ledger, migrations)",
}
_ENGINE_IDENTITY = "SELECT version(), EXISTS (SELECT 1 FROM pg_extension WHERE extname = 'citus')"


def _server_identity(dbapi_connection: Any) -> tuple[str, bool]:
    """The server's ``version()`` and whether the Citus extension is installed in the database."""
    cursor = dbapi_connection.cursor()
    try:
        cursor.execute(_ENGINE_IDENTITY)
        version, citus = cursor.fetchone()
    finally:
        cursor.close()
    dbapi_connection.rollback()
    return str(version), bool(citus)


def refuse_engine(engine: Engine, dbapi_connection: Any) -> None:
    """Refuse a PostgreSQL-compatible engine hostedrooms does not support yet (CockroachDB, YugabyteDB, a Citus
    database), naming what it lacks: a StoreConfigurationError at the engine's first connection."""
    version, citus = _server_identity(dbapi_connection)
    # YugabyteDB's version() reads "PostgreSQL 11.2-YB-2.18..." (its name only in yb_version()).
    found = "CockroachDB" if "CockroachDB" in version else None
    if "YugabyteDB" in version or "-YB-" in version:
        found = "YugabyteDB"
    if found is None and citus:
        found = "Citus"
    if found is not None:
        raise StoreConfigurationError(
            f"hosted room store {_describe(engine.url)} runs on {found}, which hostedrooms does not support yet: "
            f"it lacks {_UNSUPPORTED_ENGINES[found]}; use PostgreSQL")


def check_schema_name(schema: object) -> str:
    """``schema`` if it is a name hostedrooms accepts (letters, digits and underscores, not starting with a
    digit or ``pg_``, at most 63 bytes); a StoreConfigurationError otherwise."""
    if (not isinstance(schema, str) or not _SCHEMA_NAME.fullmatch(schema)
            or len(schema.encode()) > _MAX_IDENTIFIER_BYTES or schema.lower().startswith("pg_")):
        raise StoreConfigurationError(
            f"schema must be letters, digits and underscores (not starting with a digit or pg_), at most "
            f"{_MAX_IDENTIFIER_BYTES} bytes; got {schema!r}")
    return schema


def _quote(identifier: str) -> str:
    return '"' + identifier.replace('"', '""') + '"'


def namespace_of(database: str, schema: str) -> str | None:
    """The namespace of ``schema`` in ``database`` (None for :data:`LEGACY_SCHEMA`: the fixed keys)."""
    return None if schema == LEGACY_SCHEMA else f"{database}\x00{schema}"


def remember_namespace(sa_dialect: Dialect, database: str, schema: str | None, url: URL) -> str | None:
    """Record (and return) the namespace of an engine from its first connection's database and schema."""
    if schema is None:
        raise SchemaMissingError(
            f"the search_path of hosted room store {_describe(url)} names no existing schema; create the schema "
            "(`hostedrooms upgrade --schema NAME` does), or point search_path at an existing one")
    namespace = _namespaces[sa_dialect] = namespace_of(database, schema)
    return namespace


def scoped_key(namespace: str | None, key: int) -> int:
    """The 64-bit advisory key standing for ``key`` in ``namespace`` (``key`` itself in the legacy schema)."""
    if namespace is None:
        return key
    digest = hashlib.blake2b(f"{namespace}\x00{key}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big", signed=True)


def scoped_channel(namespace: str | None, channel: str) -> str:
    """The ``NOTIFY`` channel standing for ``channel`` in ``namespace`` (an identifier: ``channel`` plus a short
    hash of the namespace; ``channel`` itself in the legacy schema)."""
    if namespace is None:
        return channel
    return f"{channel}_{hashlib.blake2b(namespace.encode(), digest_size=6).hexdigest()}"


def _describe(url: URL) -> str:
    return describe_target(url)


#: Set by ``hostedrooms.migrate.upgrade`` while it runs: a missing schema is created rather than refused.
_creating_schemas = threading.local()


@contextlib.contextmanager
def creating_schemas() -> Iterator[None]:
    """Inside the block (this thread), a connection to a missing ``schema=`` creates it (``upgrade``)."""
    previous = getattr(_creating_schemas, "on", False)
    _creating_schemas.on = True
    try:
        yield
    finally:
        _creating_schemas.on = previous


def _set_schema(engine: Engine, dbapi_connection: Any, schema: str, statement: str) -> None:
    """A new connection's search_path: ``schema`` alone, checked; a missing schema created inside ``upgrade``."""
    cursor = dbapi_connection.cursor()
    try:
        cursor.execute(statement)
        database, current = _current(cursor)
        if current is None and getattr(_creating_schemas, "on", False):
            _create_schema(engine, dbapi_connection, cursor, schema)
            database, current = _current(cursor)
    finally:
        cursor.close()
    dbapi_connection.commit()  # a SET inside a transaction that rolls back would be undone
    if current != schema:
        raise SchemaMissingError(
            f"schema {schema} does not exist in hosted room store {_describe(engine.url)}; run "
            f"`hostedrooms upgrade --schema {schema}` (it creates the schema and its tables)")
    if engine.dialect not in _namespaces:
        _namespaces[engine.dialect] = namespace_of(database, schema)


def _first_connect(engine: Engine, dbapi_connection: Any) -> None:
    """An engine's first connection: its namespace, and a search_path that names one hostedrooms schema."""
    cursor = dbapi_connection.cursor()
    try:
        cursor.execute(_FIRST_CONNECT)
        database, current, found = cursor.fetchone()
    finally:
        cursor.close()
    dbapi_connection.rollback()
    _refuse_split_path(current, list(found or ()), engine.url)
    if current is not None:  # none: refused at the first namespaced statement (or created by upgrade)
        _namespaces[engine.dialect] = namespace_of(str(database), current)


def _current(cursor: Any) -> tuple[str, str | None]:
    cursor.execute("SELECT current_database(), current_schema()")
    database, current = cursor.fetchone()
    return str(database), current


def _create_schema(engine: Engine, dbapi_connection: Any, cursor: Any, schema: str) -> None:
    try:
        cursor.execute(f"CREATE SCHEMA IF NOT EXISTS {_quote(schema)}")
    except engine.dialect.loaded_dbapi.Error as exc:
        dbapi_connection.rollback()
        if getattr(exc, "sqlstate", None) == "42501":  # insufficient_privilege
            raise StoreConfigurationError(
                f"cannot create schema {schema} in hosted room store {_describe(engine.url)}: permission denied; "
                f"ask the database owner to CREATE SCHEMA {schema} (and grant this role USAGE and CREATE on it), "
                "then run the upgrade again") from exc
        raise


def _refuse_split_path(current: str | None, found: list[str], url: URL) -> None:
    """Refuse a search_path under which hostedrooms' tables would resolve to several schemas, or to one other
    than ``current`` (where an upgrade creates tables)."""
    if len(found) > 1 or (found and found[0] != current):
        raise StoreConfigurationError(
            f"the search_path of hosted room store {_describe(url)} resolves hostedrooms tables to schema(s) "
            f"{', '.join(found)} while new tables go to {current}; one gateway needs one schema: pass "
            "schema=NAME (or --schema NAME), or set search_path to that schema alone")


def dialect_for(bind: Engine | Connection) -> StoreDialect:
    """The :class:`StoreDialect` of an engine or connection (only supported backends reach here)."""
    return _DIALECTS[bind.dialect.name]


def dialect_for_url(url: URL) -> StoreDialect:
    """The :class:`StoreDialect` of a resolved URL (only supported backends reach here)."""
    return _DIALECTS[url.get_backend_name()]


def dialect_named(name: str) -> StoreDialect | None:
    """The :class:`StoreDialect` of SQLAlchemy backend ``name`` ("sqlite", "postgresql"), or None if unsupported."""
    return _DIALECTS.get(name)

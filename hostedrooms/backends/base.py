"""The backend interface (:class:`Backend`) and its registry (:func:`backend_for`, :func:`backend_named`,
:func:`backend_for_url`).

One :class:`Backend` instance per supported database (:mod:`.sqlite`, :mod:`.postgresql`) holds everything that
differs between them; nothing else tests ``dialect.name``. Its members fall into roles, each a section below:

* connection setup and transactions: hooks on a new engine, how a unit's transaction begins;
* SQL fragments: upserts, row locks, scalar maximum, bytewise order, byte length;
* locking: transaction-scoped advisory locks, the migration lock, the short waits of non-blocking probes;
* lineage and store facts: the history's identity, crash safety, the backend's own integrity check, file modes;
* URLs, engines and migrations: the driver, file checks, Alembic batch mode, probe engines;
* error classification: which connect-time failure means the database itself is missing;
* asyncio: the async driver and the synchronous twin of an AsyncEngine;
* notification: ``NOTIFY``/``LISTEN`` where commits notify, the change counter and commit file where readers poll;
* namespaces and poolers: one schema of a shared database per gateway, connection poolers in front.

The base class documents each member; where a backend has nothing to do the base's default is that nothing.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

import sqlalchemy
from sqlalchemy import URL, ColumnElement, Connection, Engine, LargeBinary, Select, Table, cast, func
from sqlalchemy.engine import Dialect

if TYPE_CHECKING:
    from ..engine_profile import Pooler


def sa_create_engine(*args: Any, **kwargs: Any) -> Engine:
    """``sqlalchemy.create_engine``, looked up at each call: an instrumentation that wraps it after hostedrooms was
    imported (OpenTelemetry's global ``SQLAlchemyInstrumentor().instrument()``) sees hostedrooms' engines too."""
    return sqlalchemy.create_engine(*args, **kwargs)


#: Wake-up channels (:mod:`hostedrooms.wakeup`): a room's log grew (payload: the room id); ledger work became due
#: (payload: "delivery", "response" or "outbound").
ROOM_EVENTS_CHANNEL = "hostedrooms_room_events"
LEDGER_WORK_CHANNEL = "hostedrooms_ledger_work"

#: A stable 64-bit key for advisory locks that serialise schema migrations on PostgreSQL.
MIGRATION_LOCK_KEY = 0x686F737465640001  # "hosted" + 1

_S = TypeVar("_S", bound=Select[Any])
_E = TypeVar("_E")


class UpsertInsert(Protocol):
    """The insert construct both backends return: ``on_conflict_do_update`` / ``on_conflict_do_nothing``."""

    excluded: Any

    def values(self, *args: Any, **kwargs: Any) -> UpsertInsert: ...

    def on_conflict_do_update(self, *, index_elements: Any = ..., set_: Any = ..., where: Any = ...) -> Any: ...

    def on_conflict_do_nothing(self, *, index_elements: Any = ...) -> Any: ...


class Backend:
    """What differs between the supported databases; one instance per backend (see the module docstring)."""

    name = "generic"

    # --- connection setup and transactions -------------------------------------------------------------------

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

    # --- SQL fragments ---------------------------------------------------------------------------------------

    def insert(self, table: Table) -> UpsertInsert:
        """An INSERT that supports ``ON CONFLICT`` upserts."""
        raise NotImplementedError

    def for_update(self, stmt: _S) -> _S:
        """Lock the selected rows until the transaction ends where the backend needs row locks."""
        return stmt

    def greatest(self, *values: Any) -> ColumnElement[Any]:
        """The scalar maximum of its arguments."""
        raise NotImplementedError

    def bytewise(self, expr: ColumnElement[Any]) -> ColumnElement[Any]:
        """``expr`` compared by code point (SQLite's BINARY), whatever the database's default collation."""
        return expr

    def byte_length(self, expr: ColumnElement[Any]) -> ColumnElement[Any]:
        """The UTF-8 byte length of a text expression."""
        return func.length(cast(expr, LargeBinary))

    # --- locking ---------------------------------------------------------------------------------------------

    def advisory_lock(self, connection: Connection, key: int) -> None:
        """Take the transaction-scoped advisory lock ``key`` (in the engine's namespace): transactions taking
        the same key run one after the other until each ends (SQLite: BEGIN IMMEDIATE already serialises every
        writer, so nothing to take)."""

    def lock_migrations(self, connection: Connection) -> None:
        """Serialise concurrent migration runs for the rest of the current transaction."""

    @contextlib.contextmanager
    def probe_timeouts(self, connection: Connection, seconds: float) -> Iterator[None]:
        """Bound how long statements in the current transaction may wait for locks."""
        yield

    # --- lineage and store facts -----------------------------------------------------------------------------

    def lineage(self, connection: Connection) -> str:
        """The store's lineage: an identity of the history it holds, which changes when another copy of that
        history takes over (a standby promoted)."""
        raise NotImplementedError

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

    def store_absent(self, url: URL) -> bool:
        """Whether ``url`` certainly names no existing store, decided without creating anything."""
        return False

    def probe_engine(self, url: URL, seconds: float) -> Engine:
        """A small engine for non-blocking probes of ``url``: no hooks, no migration, never creates the store."""
        raise NotImplementedError

    # --- error classification --------------------------------------------------------------------------------

    def is_missing_store(self, exc: BaseException) -> bool:
        """Whether an error raised while connecting means the database itself does not exist."""
        return False

    # --- asyncio (hostedrooms.aio) ---------------------------------------------------------------------------------

    #: The asyncio driver of :func:`hostedrooms.aio.create_async_engine` on this backend.
    async_driver = ""

    def twin_target(self, url: URL) -> Path | URL | None:
        """What a second, synchronous engine opens to reach the database ``url`` names (hostedrooms' driver), or
        None where it would not see the same database."""
        return self.normalise_url(url.set(drivername=url.get_backend_name()))

    def async_url(self, url: URL) -> URL:
        """``url`` (normalised) with this backend's asyncio driver."""
        return url.set(drivername=f"{url.get_backend_name()}+{self.async_driver}")

    # --- notification (hostedrooms.wakeup) -------------------------------------------------------------------

    #: Whether committed writes can wake a waiting reader (``LISTEN``/``NOTIFY``); otherwise readers poll.
    notifies = False

    def notify(self, connection: Connection, channel: str, payload: str) -> None:
        """Wake the readers listening on ``channel`` when the current transaction commits (nothing where readers
        poll). ``channel`` is one of hostedrooms' fixed channel names, never input."""

    def listen_statement(self, channel: str, namespace: str | None = None) -> str:
        """The statement that makes a connection receive ``channel``'s notifications in ``namespace`` (one of
        hostedrooms' fixed channel names, never input)."""
        raise NotImplementedError

    def hot_params(self, connection: Connection, channel: str) -> dict[str, Any]:
        """The parameters a hot statement binds for ``connection``'s namespace: ``notify_channel``, the namespace's
        name of the wake-up ``channel`` (one of hostedrooms' fixed channel names)."""
        raise NotImplementedError

    def change_counter(self, dbapi_connection: Any) -> int:
        """Where readers poll: a number that changes whenever another connection commits."""
        raise NotImplementedError

    def commit_file(self, url: URL) -> str | None:
        """Where readers poll: a file every commit to ``url`` writes, whose writes hint that the change counter
        moved (None: none known)."""
        return None

    # --- namespaces and poolers (one schema of a shared database per gateway) ------------------------------------

    #: Whether the backend has schemas (namespaces inside one database) for ``schema=``.
    has_schemas = False
    #: Whether the backend is reached through connection poolers (``pooler=``: PgBouncer before PostgreSQL).
    has_poolers = False

    def use_schema(self, engine: Engine, schema: str) -> None:
        """Make every connection of ``engine`` use ``schema`` alone (its ``search_path``), checked at connect."""
        raise NotImplementedError

    def use_pooler(self, engine: Engine, pooler: Pooler) -> None:
        """Record ``engine``'s pooler and make its connections fit it (see :attr:`has_poolers`)."""
        raise NotImplementedError

    def namespace(self, connection: Connection) -> str | None:
        """The namespace of ``connection``'s engine (None: the legacy one); only where locks and channels are
        shared by several schemas of a database."""
        return None

    def raw_namespace(self, dialect: Dialect, dbapi_connection: Any, url: URL) -> str | None:
        """:meth:`namespace` from a DBAPI connection outside any pool checkout (the shared waiter's), given the
        engine's SQLAlchemy ``dialect``."""
        return None

    def check_search_path(self, connection: Connection) -> None:
        """Refuse a ``search_path`` under which hostedrooms' tables resolve to more than one schema, or to a
        schema other than the one new tables would be created in."""


# --- the registry ----------------------------------------------------------------------------------------------

_BACKENDS: dict[str, Backend] = {}


def register(backend: Backend) -> Backend:
    """Make ``backend`` the one serving SQLAlchemy backend ``backend.name`` (each backend module registers its
    instance when imported; :mod:`hostedrooms.backends` imports them all)."""
    _BACKENDS[backend.name] = backend
    return backend


def backend_for(bind: Engine | Connection) -> Backend:
    """The :class:`Backend` of an engine or connection (only supported backends reach here)."""
    return _BACKENDS[bind.dialect.name]


def backend_for_url(url: URL) -> Backend:
    """The :class:`Backend` of a resolved URL (only supported backends reach here)."""
    return _BACKENDS[url.get_backend_name()]


def backend_named(name: str) -> Backend | None:
    """The :class:`Backend` of SQLAlchemy backend ``name`` ("sqlite", "postgresql"), or None if unsupported."""
    return _BACKENDS.get(name)


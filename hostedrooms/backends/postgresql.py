"""PostgreSQL: READ COMMITTED transactions, row locks, transaction-scoped advisory locks and ``LISTEN``/``NOTIFY``
scoped to the engine's namespace, the store's lineage, and refusing PostgreSQL-compatible engines hostedrooms does
not support. Everything hostedrooms does differently on PostgreSQL is here and in :mod:`.pg_namespaces`
(schemas, ``search_path``, poolers)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any, TypeVar

from sqlalchemy import (
    URL,
    BigInteger,
    ColumnElement,
    Connection,
    Engine,
    Select,
    Table,
    bindparam,
    event,
    func,
    select,
    text,
)
from sqlalchemy.dialects import postgresql
from sqlalchemy.engine import Dialect

from ..engine_profile import Pooler, known_record
from ..errors import StoreConfigurationError, describe_target, is_missing_database
from ..statements import HotStatement
from .base import (
    LEDGER_WORK_CHANNEL,
    MIGRATION_LOCK_KEY,
    ROOM_EVENTS_CHANNEL,
    Backend,
    UpsertInsert,
    register,
    sa_create_engine,
)
from .pg_namespaces import (
    TABLE_SCHEMAS,
    check_schema_name,
    first_connect,
    pooler_of,
    quote,
    refuse_split_path,
    remember_namespace,
    scoped_channel,
    scoped_key,
    set_schema,
    use_pooler,
)

__all__ = ["PostgreSQLBackend", "refuse_engine"]

_S = TypeVar("_S", bound=Select[Any])

_LOCK = HotStatement(select(func.pg_advisory_xact_lock(bindparam("key", type_=BigInteger))))
_NOTIFY = HotStatement(select(func.pg_notify(bindparam("channel"), bindparam("payload"))))
#: (namespace, channel) -> the hot append's channel parameter.
_HOT_PARAMS: dict[tuple[str | None, str], dict[str, Any]] = {}

_LINEAGE_INFO = "hostedrooms_lineage"
# A primary: the WAL file of its insert position names its timeline. A standby (pg_walfile_name() refuses during
# recovery): the timeline its WAL receiver streams, else the last restart point's.
_LINEAGE = HotStatement(text(
    "SELECT s.system_identifier::text, pg_is_in_recovery(), "
    "CASE WHEN pg_is_in_recovery() THEN NULL ELSE pg_walfile_name(pg_current_wal_insert_lsn()) END, "
    "CASE WHEN pg_is_in_recovery() THEN COALESCE((SELECT received_tli FROM pg_stat_wal_receiver), "
    "(SELECT timeline_id FROM pg_control_checkpoint())) END "
    "FROM pg_control_system() s"))


class PostgreSQLBackend(Backend):
    """PostgreSQL: READ COMMITTED transactions; writers to one room serialise on ``SELECT ... FOR UPDATE``."""

    name = "postgresql"
    async_driver = "psycopg_async"
    notifies = True
    has_schemas = True
    has_poolers = True

    # --- connection setup and transactions -------------------------------------------------------------------

    def configure_engine(self, engine: Engine, *, synchronous: str, busy_timeout: float) -> None:
        # Before the connect hooks (the schema's search_path among them): first_connect runs first, once per pool
        # (again after a failure), so an unsupported engine is refused before anything else is asked of it.
        @event.listens_for(engine, "first_connect")
        def _on_first_connect(dbapi_connection: Any, _record: Any) -> None:
            refuse_engine(engine, dbapi_connection)

        @event.listens_for(engine, "connect")
        def _on_connect(dbapi_connection: Any, _record: Any) -> None:
            record = known_record(engine.dialect)
            if record is None or not record.namespace_known:
                first_connect(engine, dbapi_connection)

    def begin_statement_reads(self, connection: Connection) -> None:
        # Each statement is its own transaction (autocommit); the pool restores the engine's isolation level
        # when the connection is returned.
        connection.execution_options(isolation_level="AUTOCOMMIT")

    def snapshot_reads(self, connection: Connection) -> None:
        # READ COMMITTED gives each statement its own snapshot; READ ONLY also runs on a hot standby.
        connection.exec_driver_sql("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY")

    # --- SQL fragments ---------------------------------------------------------------------------------------

    def insert(self, table: Table) -> UpsertInsert:
        return postgresql.insert(table)  # type: ignore[return-value]

    def for_update(self, stmt: _S) -> _S:
        return stmt.with_for_update()

    def greatest(self, *values: Any) -> ColumnElement[Any]:
        return func.greatest(*values)

    def byte_length(self, expr: ColumnElement[Any]) -> ColumnElement[Any]:
        return func.octet_length(expr)

    def bytewise(self, expr: ColumnElement[Any]) -> ColumnElement[Any]:
        return expr.collate("C")

    # --- locking ---------------------------------------------------------------------------------------------

    def advisory_lock(self, connection: Connection, key: int) -> None:
        # Advisory keys are per database: each namespace (schema) takes keys of its own.
        _LOCK.first(connection, {"key": scoped_key(self.namespace(connection), key)})

    def lock_migrations(self, connection: Connection) -> None:
        self.advisory_lock(connection, MIGRATION_LOCK_KEY)

    @contextlib.contextmanager
    def probe_timeouts(self, connection: Connection, seconds: float) -> Iterator[None]:
        milliseconds = max(1, int(seconds * 1000))
        # SET LOCAL lasts until the transaction ends; set_config(..., true) is its parameterisable form.
        for setting in ("lock_timeout", "statement_timeout"):
            connection.execute(func.set_config(setting, f"{milliseconds}ms", True).select())
        yield

    # --- lineage ---------------------------------------------------------------------------------------------

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

    # --- URLs, engines ---------------------------------------------------------------------------------------

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

    def probe_engine(self, url: URL, seconds: float) -> Engine:
        # A small private pool: probes never queue behind the application's connections for long.
        connect_args = {} if "connect_timeout" in url.query else {"connect_timeout": 2}  # libpq's minimum
        return sa_create_engine(
            url, pool_size=1, max_overflow=4, pool_timeout=seconds, connect_args=connect_args)

    # --- error classification --------------------------------------------------------------------------------

    def is_missing_store(self, exc: BaseException) -> bool:
        return is_missing_database(exc)

    # --- notification ----------------------------------------------------------------------------------------

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

    # --- namespaces and poolers (pg_namespaces) --------------------------------------------------------------

    def use_schema(self, engine: Engine, schema: str) -> None:
        check_schema_name(schema)
        statement = f"SET search_path TO {quote(schema)}"

        @event.listens_for(engine, "connect")
        def _on_connect(dbapi_connection: Any, _record: Any) -> None:
            set_schema(engine, dbapi_connection, schema, statement)

    def use_pooler(self, engine: Engine, pooler: Pooler) -> None:
        use_pooler(engine, pooler)

    def namespace(self, connection: Connection) -> str | None:
        dialect = connection.dialect
        record = known_record(dialect)
        if record is not None and record.namespace_known:
            return record.namespace
        database, schema = connection.exec_driver_sql("SELECT current_database(), current_schema()").one()
        return remember_namespace(dialect, database, schema, connection.engine.url)

    def raw_namespace(self, dialect: Dialect, dbapi_connection: Any, url: URL) -> str | None:
        """:meth:`namespace` from a DBAPI connection outside any pool checkout (the shared waiter's)."""
        record = known_record(dialect)
        if record is not None and record.namespace_known:
            return record.namespace
        cursor = dbapi_connection.cursor()
        try:
            cursor.execute("SELECT current_database(), current_schema()")
            database, schema = cursor.fetchone()
        finally:
            cursor.close()
        return remember_namespace(dialect, database, schema, url)

    def check_search_path(self, connection: Connection) -> None:
        current, found = connection.exec_driver_sql(TABLE_SCHEMAS).one()
        refuse_split_path(current, list(found or ()), connection.engine.url)


# --- PostgreSQL-compatible engines hostedrooms refuses ----------------------------------------------------------

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
            f"hosted room store {describe_target(engine.url)} runs on {found}, which hostedrooms does not support "
            f"yet: it lacks {_UNSUPPORTED_ENGINES[found]}; use PostgreSQL")


register(PostgreSQLBackend())

"""PostgreSQL namespaces and poolers: ``schema=``, the connect-time ``search_path`` and its checks, advisory keys
and ``NOTIFY`` channels scoped to the namespace, and ``pooler=``/``listen_url=``.

Several gateways may share one database, a schema each (``schema=``, or a ``search_path`` in the URL). Advisory
locks and ``NOTIFY`` channels are per database, so every advisory key and channel name is derived from the
engine's namespace (its database and ``current_schema()``, read once at its first connection and kept in the
engine's :class:`~hostedrooms.engine_profile.EngineRecord`): two schemas never share a lock or a wake-up (the
byte budget's shards are rows in the schema). The ``public`` schema keeps the fixed keys and channels earlier
versions used.
"""

from __future__ import annotations

import contextlib
import hashlib
import re
import threading
from collections.abc import Iterator
from typing import Any

from sqlalchemy import URL, Connection, Engine, event, text
from sqlalchemy.engine import Dialect

from ..engine_profile import Pooler, known_record, record_of
from ..errors import SchemaMissingError, StoreConfigurationError, describe_target

__all__ = [
    "LEGACY_SCHEMA", "POOLERS", "check_listen_through", "check_schema_name", "creating_schemas", "fleet_schemas",
    "namespace_of",
    "pooler_of", "remember_namespace", "scoped_channel", "scoped_key", "use_pooler",
]

#: The schema whose advisory keys and channels are the fixed ones (as earlier versions used them, so a gateway in
#: ``public`` and an older version of it running alongside still exclude each other); every other schema gets
#: keys and channels of its own (:func:`scoped_key`, :func:`scoped_channel`).
LEGACY_SCHEMA = "public"

#: A schema name hostedrooms accepts for ``schema=``: an unquoted-style identifier of at most 63 bytes.
_SCHEMA_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_MAX_IDENTIFIER_BYTES = 63

#: The ``pooler=`` values :func:`hostedrooms.create_engine` accepts: None or "session" (a direct connection, or a
#: pooler that keeps one server connection per client session: nothing changes), "transaction" (PgBouncer's
#: ``pool_mode = transaction``: no server-side prepared statements, no session state, LISTEN on ``listen_url``).
POOLERS = (None, "session", "transaction")

#: The current schema, and the schemas of the search path holding a hostedrooms table (rooms or version table).
TABLE_SCHEMAS = (
    "SELECT current_schema(), ARRAY(SELECT DISTINCT table_schema::text FROM information_schema.tables "
    "WHERE table_name IN ('hosted_rooms', 'hostedrooms_alembic_version') "
    "AND table_schema = ANY(current_schemas(false)) ORDER BY 1)")
#: The same, after the database's name (an engine's first connection).
_FIRST_CONNECT = (
    "SELECT current_database(), current_schema(), ARRAY(SELECT DISTINCT table_schema::text "
    "FROM information_schema.tables WHERE table_name IN ('hosted_rooms', 'hostedrooms_alembic_version') "
    "AND table_schema = ANY(current_schemas(false)) ORDER BY 1)")


# --- poolers -------------------------------------------------------------------------------------------------------

def use_pooler(engine: Engine, pooler: Pooler) -> None:
    """Record ``engine``'s pooler; under transaction pooling its connections never prepare statements on the
    server (a prepared statement lives on one server connection, and the next transaction may run on another)."""
    record_of(engine.dialect).pooler = pooler
    if pooler.mode != "transaction":
        return

    @event.listens_for(engine, "do_connect")
    def _no_server_prepares(_dialect: Any, _record: Any, _cargs: list[Any], cparams: dict[str, Any]) -> None:
        cparams["prepare_threshold"] = None  # psycopg 3: never PREPARE, whatever the connect_args said


def pooler_of(engine: Engine) -> Pooler | None:
    """The pooler ``engine`` was built with (None: a direct connection, as far as hostedrooms was told)."""
    record = known_record(engine.dialect)
    return None if record is None else record.pooler


def check_listen_through(engine: Engine) -> URL | None:
    """The URL a waiter of ``engine`` must ``LISTEN`` on (None: the engine's own pool); a StoreConfigurationError
    where notifications would be lost (a transaction pooler and no ``listen_url``)."""
    pooler = pooler_of(engine)
    if pooler is None:
        return None
    if pooler.mode == "transaction" and pooler.listen_url is None:
        raise StoreConfigurationError(
            f"LISTEN through a transaction pooler is lost: hosted room store {describe_target(engine.url)} was "
            "built with pooler='transaction'; give listen_url=... (a direct connection to PostgreSQL, bypassing "
            "the pooler) for follow() and ledger wake-ups")
    return pooler.listen_url


# --- namespaces ----------------------------------------------------------------------------------------------------

def check_schema_name(schema: object) -> str:
    """``schema`` if it is a name hostedrooms accepts (letters, digits and underscores, not starting with a
    digit or ``pg_``, at most 63 bytes); a StoreConfigurationError otherwise."""
    if (not isinstance(schema, str) or not _SCHEMA_NAME.fullmatch(schema)
            or len(schema.encode()) > _MAX_IDENTIFIER_BYTES or schema.lower().startswith("pg_")):
        raise StoreConfigurationError(
            f"schema must be letters, digits and underscores (not starting with a digit or pg_), at most "
            f"{_MAX_IDENTIFIER_BYTES} bytes; got {schema!r}")
    return schema


def quote(identifier: str) -> str:
    """``identifier`` as a quoted SQL identifier."""
    return '"' + identifier.replace('"', '""') + '"'


def namespace_of(database: str, schema: str) -> str | None:
    """The namespace of ``schema`` in ``database`` (None for :data:`LEGACY_SCHEMA`: the fixed keys)."""
    return None if schema == LEGACY_SCHEMA else f"{database}\x00{schema}"


def remember_namespace(dialect: Dialect, database: str, schema: str | None, url: URL) -> str | None:
    """Record (and return) the namespace of an engine (its SQLAlchemy ``dialect``) from a connection's database
    and schema."""
    if schema is None:
        raise SchemaMissingError(
            f"the search_path of hosted room store {describe_target(url)} names no existing schema; create the "
            "schema (`hostedrooms upgrade --schema NAME` does), or point search_path at an existing one")
    return record_of(dialect).learn_namespace(namespace_of(database, schema))


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


def set_schema(engine: Engine, dbapi_connection: Any, schema: str, statement: str) -> None:
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
            f"schema {schema} does not exist in hosted room store {describe_target(engine.url)}; run "
            f"`hostedrooms upgrade --schema {schema}` (it creates the schema and its tables)")
    record = record_of(engine.dialect)
    if not record.namespace_known:
        record.learn_namespace(namespace_of(database, schema))


def first_connect(engine: Engine, dbapi_connection: Any) -> None:
    """An engine's first connection: its namespace, and a search_path that names one hostedrooms schema."""
    cursor = dbapi_connection.cursor()
    try:
        cursor.execute(_FIRST_CONNECT)
        database, current, found = cursor.fetchone()
    finally:
        cursor.close()
    dbapi_connection.rollback()
    refuse_split_path(current, list(found or ()), engine.url)
    if current is not None:  # none: refused at the first namespaced statement (or created by upgrade)
        record_of(engine.dialect).learn_namespace(namespace_of(str(database), current))


def _current(cursor: Any) -> tuple[str, str | None]:
    cursor.execute("SELECT current_database(), current_schema()")
    database, current = cursor.fetchone()
    return str(database), current


def _create_schema(engine: Engine, dbapi_connection: Any, cursor: Any, schema: str) -> None:
    try:
        cursor.execute(f"CREATE SCHEMA IF NOT EXISTS {quote(schema)}")
    except engine.dialect.loaded_dbapi.Error as exc:
        dbapi_connection.rollback()
        if getattr(exc, "sqlstate", None) == "42501":  # insufficient_privilege
            raise StoreConfigurationError(
                f"cannot create schema {schema} in hosted room store {describe_target(engine.url)}: permission "
                f"denied; ask the database owner to CREATE SCHEMA {schema} (and grant this role USAGE and CREATE on "
                "it), then run the upgrade again") from exc
        raise


def refuse_split_path(current: str | None, found: list[str], url: URL) -> None:
    """Refuse a search_path under which hostedrooms' tables would resolve to several schemas, or to one other
    than ``current`` (where an upgrade creates tables)."""
    if len(found) > 1 or (found and found[0] != current):
        raise StoreConfigurationError(
            f"the search_path of hosted room store {describe_target(url)} resolves hostedrooms tables to schema(s) "
            f"{', '.join(found)} while new tables go to {current}; one gateway needs one schema: pass "
            "schema=NAME (or --schema NAME), or set search_path to that schema alone")


#: The schemas whose name is ``LIKE :pattern`` and that hold hostedrooms' version table or nothing at all (an empty
#: schema a database owner created for a gateway); the system schemas never.
_FLEET_SCHEMAS = (
    "SELECT n.nspname::text FROM pg_catalog.pg_namespace n WHERE n.nspname LIKE :pattern "
    "AND n.nspname NOT LIKE 'pg\\_%' AND n.nspname <> 'information_schema' "
    "AND (EXISTS (SELECT 1 FROM pg_catalog.pg_class c WHERE c.relnamespace = n.oid "
    "AND c.relname = 'hostedrooms_alembic_version' AND c.relkind IN ('r', 'p')) "
    "OR NOT EXISTS (SELECT 1 FROM pg_catalog.pg_class c WHERE c.relnamespace = n.oid)) ORDER BY 1")


def fleet_schemas(connection: Connection, pattern: str) -> list[str]:
    """The schemas a fleet upgrade selects for the ``LIKE`` ``pattern``: those holding hostedrooms' version table,
    and the empty ones; a name hostedrooms would refuse as ``schema=`` is left out."""
    names = connection.execute(text(_FLEET_SCHEMAS), {"pattern": pattern}).scalars()
    return [name for name in names if _SCHEMA_NAME.fullmatch(name) and len(name.encode()) <= _MAX_IDENTIFIER_BYTES]

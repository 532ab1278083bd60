"""Everything that differs between SQLite and PostgreSQL, one module per backend (as Alembic's ``ddl/``).

:mod:`.base` holds the interface, :class:`~.base.Backend`, with its roles (connection setup, SQL fragments,
locking, lineage, URLs and engines, error classification, asyncio, notification, namespaces and poolers) and the
registry; :mod:`.sqlite` and :mod:`.postgresql` hold each backend whole, :mod:`.pg_namespaces` PostgreSQL's
schemas, ``search_path`` checks, scoped keys and channels, and poolers. Nothing else tests ``dialect.name``:
callers ask :func:`backend_for` (or :func:`backend_for_url`, :func:`backend_named`) and call the backend.
"""

from __future__ import annotations

from ..engine_profile import Pooler
from .base import (
    LEDGER_WORK_CHANNEL,
    MIGRATION_LOCK_KEY,
    ROOM_EVENTS_CHANNEL,
    Backend,
    UpsertInsert,
    backend_for,
    backend_for_url,
    backend_named,
    sa_create_engine,
)
from .pg_namespaces import (
    LEGACY_SCHEMA,
    POOLERS,
    check_listen_through,
    check_schema_name,
    creating_schemas,
    fleet_schemas,
    namespace_of,
    pooler_of,
    scoped_channel,
    scoped_key,
    use_pooler,
)
from .postgresql import PostgreSQLBackend
from .sqlite import SQLITE_LINEAGE, SQLiteBackend

__all__ = [
    "LEDGER_WORK_CHANNEL", "LEGACY_SCHEMA", "MIGRATION_LOCK_KEY", "POOLERS", "ROOM_EVENTS_CHANNEL", "SQLITE_LINEAGE",
    "Backend", "Pooler", "PostgreSQLBackend", "SQLiteBackend", "UpsertInsert", "backend_for", "backend_for_url",
    "backend_named", "check_listen_through", "check_schema_name", "creating_schemas", "fleet_schemas",
    "namespace_of", "pooler_of", "sa_create_engine", "scoped_channel", "scoped_key", "use_pooler",
]

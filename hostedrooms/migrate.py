"""Schema migrations: the Alembic environment and a small API over ``alembic.command``.

``upgrade(target)`` works from a checkout and from an installed wheel: the scripts ship inside the package
as ``hostedrooms._migrations`` (the top-level ``alembic/`` folder of the repository).
"""

from __future__ import annotations

import importlib.util
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from alembic import command
from alembic.config import Config
from alembic.migration import MigrationContext
from alembic.runtime.environment import EnvironmentContext
from alembic.script import ScriptDirectory
from sqlalchemy import Connection, Engine
from sqlalchemy import exc as sa_exc

from .db import DATABASE_URL_ENV, Target, create_engine
from .dialect import dialect_for
from .errors import HostedRoomError, translate
from .models import metadata

#: hostedrooms' own Alembic version table (a host application keeps ``alembic_version``).
VERSION_TABLE = "hostedrooms_alembic_version"


def script_location() -> Path:
    """The folder holding ``env.py`` and ``versions/``, wherever hostedrooms is installed."""
    spec = importlib.util.find_spec("hostedrooms._migrations")
    if spec is not None and spec.submodule_search_locations:
        for location in spec.submodule_search_locations:
            if (Path(location) / "env.py").is_file():
                return Path(location)
    checkout = Path(__file__).resolve().parent.parent / "alembic"
    if (checkout / "env.py").is_file():
        return checkout
    raise HostedRoomError("hostedrooms migration scripts are missing from this installation")


def alembic_config(connectable: Engine | Connection | None = None) -> Config:
    """An Alembic Config for hostedrooms' scripts, optionally bound to an engine or connection."""
    config = Config()
    config.set_main_option("script_location", str(script_location()))
    if connectable is not None:
        config.attributes["connection"] = connectable
    return config


#: How long an upgrader waits for another process's upgrade (SQLite busy timeout on engines built here).
MIGRATION_BUSY_TIMEOUT = 600.0


@contextmanager
def _bound(target: Target | Connection) -> Iterator[Engine | Connection]:
    """An engine (or the given connection) for one migration call; driver errors leave as HostedRoomErrors."""
    # A given Engine keeps its own settings; one built here waits long for a concurrent upgrader.
    engine = target if isinstance(target, Connection) else create_engine(target, busy_timeout=MIGRATION_BUSY_TIMEOUT)
    try:
        yield engine
    except sa_exc.SQLAlchemyError as exc:
        raise translate(exc, engine.engine.url) from exc
    finally:
        if not isinstance(target, (Engine, Connection)):
            engine.engine.dispose()


def upgrade(target: Target | Connection, revision: str = "head") -> None:
    """Upgrade the hostedrooms schema in ``target`` to ``revision`` in one transaction."""
    with _bound(target) as bind:
        command.upgrade(alembic_config(bind), revision)


def downgrade(target: Target | Connection, revision: str) -> None:
    """Downgrade the hostedrooms schema in ``target`` to ``revision``."""
    with _bound(target) as bind:
        command.downgrade(alembic_config(bind), revision)


def head_revision() -> str | None:
    """The newest revision shipped with this installation."""
    return ScriptDirectory.from_config(alembic_config()).get_current_head()


def current_revision(target: Target | Connection) -> str | None:
    """The revision recorded in ``target`` (None when hostedrooms was never installed there)."""
    with _bound(target) as bind:
        if isinstance(bind, Connection):
            return _current(bind)
        with bind.connect() as connection:
            return _current(connection)


def _current(connection: Connection) -> str | None:
    context = MigrationContext.configure(connection, opts={"version_table": VERSION_TABLE})
    return context.get_current_revision()


def is_at_head(target: Target | Connection) -> bool:
    """True when ``target`` carries the newest shipped revision."""
    return current_revision(target) == head_revision()


# --- the Alembic environment (alembic/env.py delegates here) ---------------------------------------------


def include_object(obj: Any, name: str | None, type_: str, reflected: bool, compare_to: Any) -> bool:
    """Autogenerate and ``alembic check`` look only at hostedrooms' own tables, never the host's."""
    if type_ == "table":
        return name in metadata.tables
    table = getattr(obj, "table", None)
    return table is None or table.name in metadata.tables


def _connectable(context: EnvironmentContext) -> Engine | Connection:
    config = context.config
    given = config.attributes.get("connection")
    if isinstance(given, Connection):
        return given
    if isinstance(given, Engine):
        return create_engine(given)  # installs our SQLite transaction hooks if missing
    url = context.get_x_argument(as_dictionary=True).get("url") or os.environ.get(DATABASE_URL_ENV)
    url = url or config.get_main_option("sqlalchemy.url")
    if not url:
        raise HostedRoomError(f"no database given: pass -x url=..., set {DATABASE_URL_ENV}, or set sqlalchemy.url")
    return create_engine(url)


def _configure(context: EnvironmentContext, connection: Connection) -> None:
    context.configure(
        connection=connection,
        target_metadata=metadata,
        version_table=VERSION_TABLE,
        include_object=include_object,
        render_as_batch=connection.dialect.name == "sqlite",
        # SQLite DDL is transactional once we control BEGIN; one transaction makes a failed upgrade a no-op.
        transactional_ddl=True,
        transaction_per_migration=False,
        compare_type=True,
        compare_server_default=True,
    )


def _run_on(context: EnvironmentContext, connection: Connection) -> None:
    _configure(context, connection)
    with context.begin_transaction():
        dialect_for(connection).lock_migrations(connection)
        context.run_migrations()


def run_alembic_env(context: EnvironmentContext) -> None:
    """The body of ``alembic/env.py``: offline SQL rendering or an online run on one connection."""
    if context.is_offline_mode():
        url = context.get_x_argument(as_dictionary=True).get("url") or os.environ.get(DATABASE_URL_ENV)
        context.configure(
            url=url or context.config.get_main_option("sqlalchemy.url"),
            target_metadata=metadata,
            version_table=VERSION_TABLE,
            literal_binds=True,
            render_as_batch=True,
        )
        with context.begin_transaction():
            context.run_migrations()
        return
    connectable = _connectable(context)
    if isinstance(connectable, Connection):
        _run_on(context, connectable)
        return
    try:
        with connectable.connect() as connection:
            _run_on(context, connection)
    finally:
        if context.config.attributes.get("connection") is None:
            connectable.dispose()  # an engine we built from a URL

"""Schema migrations: the Alembic environment, a small migration API, and the hooks for a host's Alembic.

``upgrade(target)`` works from a checkout and from an installed wheel: the scripts ship inside the package
as ``hostedrooms._migrations`` (the top-level ``alembic/`` folder of the repository). It runs hostedrooms'
migration context directly on one connection, never as an ``alembic.command``, so a host application's
``env.py`` may call it (or :func:`upgrade_with_host`) in the middle of its own Alembic command.

For a host application's ``env.py``: :func:`host_include_name` and :func:`host_include_object` keep
hostedrooms' tables, indexes and version table out of the host's autogenerate and ``alembic check``.
"""

from __future__ import annotations

import importlib.util
import logging.config
import os
import re
from collections.abc import Callable, Iterator
from contextlib import contextmanager, nullcontext
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from alembic.config import Config
from alembic.migration import MigrationContext
from alembic.runtime.environment import EnvironmentContext
from alembic.script import ScriptDirectory
from alembic.util.exc import CommandError
from sqlalchemy import Connection, Engine
from sqlalchemy import exc as sa_exc

from . import writelock
from .backends import backend_for, creating_schemas
from .db import DATABASE_URL_ENV, Target, create_engine, engine_schema, resolve_url
from .errors import (
    HostedRoomError,
    InvalidInputError,
    SchemaMissingError,
    StoreConfigurationError,
    describe_target,
    translate,
)
from .models import metadata

if TYPE_CHECKING:
    from alembic.runtime.environment import NameFilterParentNames, NameFilterType
    from sqlalchemy.sql.schema import SchemaItem

#: Environment variable naming this gateway's schema (the CLI's ``--schema``, Alembic's ``-x schema=``).
SCHEMA_ENV = "HOSTEDROOMS_SCHEMA"

#: hostedrooms' own Alembic version table (a host application keeps ``alembic_version``).
VERSION_TABLE = "hostedrooms_alembic_version"

#: Every table hostedrooms owns in a shared database: its models' tables and its version table.
HOSTEDROOMS_TABLES = frozenset(metadata.tables) | {VERSION_TABLE}

#: ``script_location`` for an ``alembic.ini`` that drives an installed hostedrooms (no checkout needed).
PACKAGE_SCRIPT_LOCATION = "hostedrooms:_migrations"


def script_location() -> Path:
    """The folder holding ``env.py`` and ``versions/``, wherever hostedrooms is installed.

    :returns: the folder's path.
    :raises HostedRoomError: the migration scripts are missing from this installation.
    """
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
    """An Alembic Config for hostedrooms' scripts, optionally bound to an engine or connection.

    :param connectable: the engine or connection Alembic runs on, or None (its URL then comes from the command line).
    :returns: the Config.
    """
    config = Config()
    config.set_main_option("script_location", str(script_location()))
    if connectable is not None:
        config.attributes["connection"] = connectable
    return config


#: How long an upgrader waits for another process's upgrade (SQLite busy timeout on engines built here).
MIGRATION_BUSY_TIMEOUT = 600.0


@contextmanager
def _bound(target: Target | Connection, schema: str | None = None, *, upgrading: bool = False,
           ) -> Iterator[Engine | Connection]:
    """An engine (or the given connection) for one migration call; driver errors leave as HostedRoomErrors.

    ``schema``: the engine built here uses it (a given Engine or Connection must already: see
    :func:`_given_schema`). ``upgrading``: a missing schema is created, and a missing table or schema is never
    answered with advice to run the upgrade that just failed."""
    # A given Engine keeps its own settings; one built here waits long for a concurrent upgrader.
    if isinstance(target, (Engine, Connection)):
        _given_schema(target, schema)
        engine: Engine | Connection = target
    else:
        engine = create_engine(target, busy_timeout=MIGRATION_BUSY_TIMEOUT, schema=schema)
    try:
        with creating_schemas() if upgrading else nullcontext():
            yield engine
    except sa_exc.SQLAlchemyError as exc:
        translated = translate(exc, engine.engine.url)
        if upgrading and isinstance(translated, SchemaMissingError):
            translated = SchemaMissingError(
                f"upgrading hosted room store {describe_target(engine.engine.url)} failed: "
                f"{str(getattr(exc, 'orig', None) or exc).strip().splitlines()[0]}; if its search_path names a "
                "schema that does not exist, pass --schema NAME (schema=NAME) to create it, or ask the database "
                "owner to CREATE SCHEMA NAME")
        raise translated from exc
    finally:
        if not isinstance(target, (Engine, Connection)):
            engine.engine.dispose()


def _given_schema(target: Engine | Connection, schema: str | None) -> None:
    """A given Engine or Connection carries its schema already: ``schema`` must be None or that one."""
    if schema is None:
        return
    if isinstance(target, Connection) or engine_schema(target) != schema:
        raise StoreConfigurationError(
            f"schema={schema!r} applies to a target URL or path; for an Engine, build it with "
            f"hostedrooms.create_engine(url, schema={schema!r})")


def upgrade(target: Target | Connection, revision: str = "head", *, schema: str | None = None) -> None:
    """Upgrade the hostedrooms schema in ``target`` to ``revision`` in one transaction.

    ``target`` may be the Connection a host application's ``env.py`` holds: the migrations then run on it
    (inside the host's transaction if one is open, else in one of their own) without starting a nested
    Alembic command.

    ``schema`` (PostgreSQL): the gateway's own schema (see :func:`hostedrooms.create_engine`); it is created
    when missing (``CREATE SCHEMA IF NOT EXISTS``; without the privilege, the error says what to ask the
    database owner), and the tables and the version table go there. The migration lock is that schema's own.

    :param target: the store: a SQLite path, a database URL, an Engine, or a host's open Connection.
    :param revision: the revision to reach: ``head`` (the default), a revision id or name, or ``+N``.
    :param schema: PostgreSQL: the gateway's schema (for a path or URL; an Engine must have been built with it).
    :raises InvalidInputError: ``revision`` names no revision, or none reachable (nothing was run).
    :raises SchemaMissingError: ``schema`` (or the search_path's) does not exist and cannot be created.
    :raises StoreConfigurationError: ``schema`` given with an Engine built without it (or with a Connection), or
        the target cannot be opened.
    :raises StorageError: the database failed underneath (:class:`~hostedrooms.errors.StoreUnavailableError`
        when a retry may help).
    """
    _run(target, revision, lambda script, heads: script._upgrade_revs(revision, heads), schema, upgrading=True)


def downgrade(target: Target | Connection, revision: str, *, schema: str | None = None) -> None:
    """Downgrade the hostedrooms schema in ``target`` (in ``schema``) to ``revision``.

    :param target: the store: a SQLite path, a database URL, an Engine, or a host's open Connection.
    :param revision: the revision to reach: a revision id or name, ``-N``, or ``base`` (drops every table).
    :param schema: PostgreSQL: the gateway's schema (for a path or URL; an Engine must have been built with it).
    :raises InvalidInputError: ``revision`` names no revision, or none reachable (nothing was run).
    :raises StoreConfigurationError: ``schema`` given with an Engine built without it (or with a Connection), or
        the target cannot be opened.
    :raises StorageError: the database failed underneath (:class:`~hostedrooms.errors.StoreUnavailableError`
        when a retry may help).
    """
    _run(target, revision, lambda script, heads: script._downgrade_revs(revision, heads), schema)


def _run(target: Target | Connection, revision: str, steps: Callable[[ScriptDirectory, Any], Any],
         schema: str | None = None, *, upgrading: bool = False) -> None:
    """Run hostedrooms' migration context on ``target`` directly.

    ``alembic.command`` would install its ``alembic.context`` proxy and remove it on exit, which breaks a host
    command this call is nested in (``KeyError: 'config'``); an EnvironmentContext used through its methods
    touches no module proxy, and ``env.py`` (with its logging set-up) is not loaded at all.
    """
    check_revision(revision)
    config = alembic_config()
    script = ScriptDirectory.from_config(config)
    environment = EnvironmentContext(
        config, script, fn=lambda heads, _context: steps(script, heads), destination_rev=revision)
    with _bound(target, schema, upgrading=upgrading) as bind:
        try:
            if isinstance(bind, Connection):
                _run_on(environment, bind)
                return
            with create_engine(bind).connect() as connection:  # a given Engine gets our SQLite hooks
                _run_on(environment, connection)
        except CommandError as exc:  # an unknown or unreachable revision: nothing was run
            raise InvalidInputError(f"revision {revision!r}: {exc}", field="revision") from exc


#: What an Alembic revision argument may hold: ``head``, ``base``, an id or a name, ``+2``, ``-1``, ``branch@id``.
_REVISION = re.compile(r"[A-Za-z0-9_.@+-]{1,128}")


def check_revision(revision: object) -> None:
    """Refuse a revision argument that cannot name one (a URL given in its place, say) with an
    :class:`~hostedrooms.errors.InvalidInputError` that does not quote it: Alembic's own error would.

    :param revision: the argument given as a revision.
    :raises InvalidInputError: it cannot name a revision.
    """
    if not isinstance(revision, str) or not _REVISION.fullmatch(revision):
        raise InvalidInputError(
            "revision must be head, base, a revision id or name, +N or -N (letters, digits and _ . @ + -, at most "
            "128)", field="revision")


def head_revision() -> str | None:
    """The newest revision shipped with this installation.

    :returns: its id (such as ``0010_replica_event_ids``); None only if no migration shipped.
    """
    return ScriptDirectory.from_config(alembic_config()).get_current_head()


def current_revision(target: Target | Connection, *, schema: str | None = None) -> str | None:
    """The revision recorded in ``target`` (in ``schema``; None when hostedrooms was never installed there).

    :param target: the store: a SQLite path, a database URL, an Engine, or a host's open Connection.
    :param schema: PostgreSQL: the gateway's schema (for a path or URL; an Engine must have been built with it).
    :returns: the recorded revision id, or None.
    :raises StoreConfigurationError: ``schema`` given with an Engine built without it (or with a Connection), or
        the target cannot be opened.
    :raises StorageError: the database failed underneath (:class:`~hostedrooms.errors.StoreUnavailableError`
        when a retry may help).
    """
    with _bound(target, schema) as bind:
        if isinstance(bind, Connection):
            return _current(bind)
        with bind.connect() as connection:
            return _current(connection)


def _current(connection: Connection) -> str | None:
    context = MigrationContext.configure(connection, opts={"version_table": VERSION_TABLE})
    return context.get_current_revision()


def is_at_head(target: Target | Connection, *, schema: str | None = None) -> bool:
    """True when ``target`` (in ``schema``) carries the newest shipped revision.

    :param target: the store: a SQLite path, a database URL, an Engine, or a host's open Connection.
    :param schema: PostgreSQL: the gateway's schema (for a path or URL; an Engine must have been built with it).
    :returns: whether :func:`current_revision` is :func:`head_revision`.
    :raises StoreConfigurationError: ``schema`` given with an Engine built without it (or with a Connection), or
        the target cannot be opened.
    :raises StorageError: the database failed underneath (:class:`~hostedrooms.errors.StoreUnavailableError`
        when a retry may help).
    """
    return current_revision(target, schema=schema) == head_revision()


# --- hooks for a host application's own env.py ----------------------------------------------------------


def _ours(table_name: str | None) -> bool:
    return table_name in HOSTEDROOMS_TABLES


def host_include_name(name: str | None, type_: NameFilterType, parent_names: NameFilterParentNames) -> bool:
    """``include_name`` for a host's ``env.py``: never reflect hostedrooms' tables or their indexes and
    constraints, so the host's autogenerate proposes no drop and its ``alembic check`` stays clean.

    :param name: the reflected object's name.
    :param type_: its kind (``"table"``, ``"index"``, ...).
    :param parent_names: the names of the schema and table it belongs to.
    :returns: False for hostedrooms' tables and what belongs to them.
    """
    if type_ == "table":
        return not _ours(name)
    return not _ours(parent_names.get("table_name"))


def host_include_object(
    obj: SchemaItem, name: str | None, type_: NameFilterType, reflected: bool, compare_to: SchemaItem | None
) -> bool:
    """``include_object`` for a host's ``env.py``: skip hostedrooms' tables on both sides of the comparison,
    for hosts whose ``target_metadata`` also holds them (for foreign keys to ``hosted_rooms``, say).

    :param obj: the schema item compared.
    :param name: its name.
    :param type_: its kind (``"table"``, ``"index"``, ...).
    :param reflected: whether it was reflected from the database.
    :param compare_to: what it is compared with, or None.
    :returns: False for hostedrooms' tables and what belongs to them.
    """
    if type_ == "table":
        return not _ours(name)
    table = getattr(obj, "table", None)
    return table is None or not _ours(table.name)


class AlembicContext(Protocol):
    """What :func:`upgrade_with_host` needs of a host's ``alembic.context`` (or an EnvironmentContext)."""

    def is_offline_mode(self) -> bool: ...

    def get_context(self) -> MigrationContext: ...


def upgrade_with_host(context: AlembicContext, connection: Connection, revision: str = "head") -> bool:
    """From a host application's ``env.py``, after its ``context.configure(...)`` and before its
    ``context.run_migrations()``: upgrade hostedrooms on ``connection`` when the host's run is an upgrade
    (``alembic upgrade``, or a runner such as pytest-alembic upgrading), and do nothing otherwise (``check``,
    ``revision --autogenerate``, ``downgrade``, ``stamp``, ``current``, ``--sql``). Returns whether it ran.

    Called first, it commits hostedrooms' head before any host revision runs, so a host revision may refer to
    hostedrooms' tables (a foreign key to ``hosted_rooms``; PostgreSQL checks it at ``CREATE TABLE``): Alembic's
    ``depends_on`` cannot name hostedrooms' revisions, which live in their own history and version table.

    :param context: Alembic's context (``alembic.context`` in the host's ``env.py``).
    :param connection: the connection the host's migrations run on.
    :param revision: hostedrooms' revision to upgrade to.
    :returns: whether it upgraded.
    """
    if context.is_offline_mode() or not _is_upgrade(context.get_context()):
        return False
    upgrade(connection, revision)
    return True


def _is_upgrade(migration_context: MigrationContext) -> bool:
    """Whether this run upgrades. Alembic gives env.py no command name, but every command passes a migration
    function of its own as ``fn``: ``alembic.command.upgrade`` (and pytest-alembic's runner) one named
    ``upgrade``; ``downgrade``, ``check``/``revision`` (``retrieve_migrations``), ``stamp`` (``do_stamp``) and
    ``current`` (``display_version``) others."""
    return getattr(migration_context.opts.get("fn"), "__name__", None) == "upgrade"


def alembic_ini(url: str | None = None) -> str:
    """The text of an ``alembic.ini`` for this hostedrooms installation (``hostedrooms alembic-ini`` writes it).

    ``url`` (a SQLAlchemy URL or a SQLite path) becomes ``sqlalchemy.url``, the fallback after
    ``-x url=...`` and ``$HOSTEDROOMS_DATABASE_URL``; by default ``state.db`` in the working directory.

    :param url: a SQLAlchemy URL or a SQLite path, or None for ``state.db``.
    :returns: the file's text.
    """
    rendered = "sqlite:///state.db" if url is None else resolve_url(url).render_as_string(hide_password=False)
    return _INI_TEMPLATE.format(script_location=_ini_script_location(), url=rendered.replace("%", "%%"))


def _ini_script_location() -> str:
    """``hostedrooms:_migrations`` where the scripts sit inside the installed package (a wheel), which stays
    valid across reinstalls; in a checkout or an editable install, where they are the top-level ``alembic/``
    folder, their absolute path."""
    if (Path(__file__).resolve().parent / "_migrations" / "env.py").is_file():
        return PACKAGE_SCRIPT_LOCATION
    return str(script_location()).replace("%", "%%")


_INI_TEMPLATE = """\
# Alembic configuration for an installed hostedrooms (written by `hostedrooms alembic-ini`).
#   alembic -c THIS_FILE upgrade head
# The database comes from `-x url=...`, else $HOSTEDROOMS_DATABASE_URL, else sqlalchemy.url below.
# hostedrooms keeps its own version table (hostedrooms_alembic_version), so it can share a database with a
# host application's own Alembic history.

[alembic]
script_location = {script_location}
path_separator = os
sqlalchemy.url = {url}

[loggers]
keys = root,sqlalchemy,alembic

[handlers]
keys = console

[formatters]
keys = generic

[logger_root]
level = WARNING
handlers = console
qualname =

[logger_sqlalchemy]
level = WARNING
handlers =
qualname = sqlalchemy.engine

[logger_alembic]
level = INFO
handlers =
qualname = alembic

[handler_console]
class = StreamHandler
args = (sys.stderr,)
level = NOTSET
formatter = generic

[formatter_generic]
format = %(levelname)-5.5s [%(name)s] %(message)s
datefmt = %H:%M:%S
"""


# --- the Alembic environment (alembic/env.py delegates here) ---------------------------------------------


def include_object(
    obj: SchemaItem, name: str | None, type_: NameFilterType, reflected: bool, compare_to: SchemaItem | None
) -> bool:
    """Autogenerate and ``alembic check`` look only at hostedrooms' own tables, never the host's.

    :param obj: the schema item compared.
    :param name: its name.
    :param type_: its kind (``"table"``, ``"index"``, ...).
    :param reflected: whether it was reflected from the database.
    :param compare_to: what it is compared with, or None.
    :returns: True for hostedrooms' own tables and what belongs to them.
    """
    if type_ == "table":
        return name in metadata.tables
    table = getattr(obj, "table", None)
    return table is None or table.name in metadata.tables


def _created_on(dialect_name: str) -> Callable[..., bool]:
    """:func:`include_object` that also leaves out the models' objects not created on ``dialect_name`` (an index
    declared with ``ddl_if(dialect=...)``, which Alembic's comparison does not read)."""

    def include(obj: SchemaItem, name: str | None, type_: NameFilterType, reflected: bool,
                compare_to: SchemaItem | None) -> bool:
        condition = getattr(obj, "_ddl_if", None)
        if not reflected and condition is not None and condition.dialect not in (None, dialect_name):
            return False
        return include_object(obj, name, type_, reflected, compare_to)

    return include


def include_name(name: str | None, type_: NameFilterType, parent_names: NameFilterParentNames) -> bool:
    """hostedrooms' environment does not even reflect a host's tables (their types may be unknown to us).

    :param name: the reflected object's name.
    :param type_: its kind (``"table"``, ``"index"``, ...).
    :param parent_names: the names of the schema and table it belongs to.
    :returns: True for hostedrooms' own tables and anything that is not a table.
    """
    if type_ == "table":
        return name in metadata.tables
    return True


def _connectable(context: EnvironmentContext) -> Engine | Connection:
    config = context.config
    given = config.attributes.get("connection")
    if isinstance(given, Connection):
        return given
    if isinstance(given, Engine):
        return create_engine(given)  # installs our SQLite transaction hooks if missing
    arguments = context.get_x_argument(as_dictionary=True)
    url = arguments.get("url") or os.environ.get(DATABASE_URL_ENV)
    url = url or config.get_main_option("sqlalchemy.url")
    if not url:
        raise HostedRoomError(f"no database given: pass -x url=..., set {DATABASE_URL_ENV}, or set sqlalchemy.url")
    return create_engine(url, schema=arguments.get("schema") or os.environ.get(SCHEMA_ENV) or None)


def _configure(context: EnvironmentContext, connection: Connection) -> None:
    context.configure(
        connection=connection,
        target_metadata=metadata,
        version_table=VERSION_TABLE,
        include_name=include_name,
        include_object=_created_on(connection.dialect.name),
        render_as_batch=backend_for(connection).render_as_batch,
        # SQLite DDL is transactional once we control BEGIN; one transaction makes a failed upgrade a no-op.
        transactional_ddl=True,
        transaction_per_migration=False,
        compare_type=True,
        compare_server_default=True,
    )


def _run_on(context: EnvironmentContext, connection: Connection) -> None:
    _configure(context, connection)
    # A migration writes: on a SQLite file it queues with the other processes' writers (hostedrooms.writelock)
    # rather than polling against them, unless the given connection already began its transaction.
    turn = None if connection.in_transaction() else writelock.take(connection.engine)
    try:
        with context.begin_transaction():
            backend = backend_for(connection)
            backend.lock_migrations(connection)  # the namespace's own lock: other schemas migrate meanwhile
            backend.check_search_path(connection)  # tables and version table in current_schema() alone
            context.run_migrations()
    finally:
        if turn is not None:
            turn.release()


def _configure_logging(config: Config) -> None:
    """Apply the logging sections of the ``alembic.ini`` the ``alembic`` command line was given, as Alembic's
    own templates do, so a deploy log shows each ``Running upgrade ... -> ...``. A Config built in code (the
    library calls, pytest-alembic, a host's tests) has no file and leaves the process's logging alone; so
    does ``config.attributes["configure_logger"] = False``."""
    if config.config_file_name is None or not config.attributes.get("configure_logger", True):
        return
    if config.file_config.has_section("loggers"):
        logging.config.fileConfig(config.config_file_name, disable_existing_loggers=False)


def run_alembic_env(context: EnvironmentContext) -> None:
    """The body of ``alembic/env.py``: offline SQL rendering or an online run on one connection.

    :param context: Alembic's environment context (``alembic.context`` in ``env.py``).
    """
    _configure_logging(context.config)
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
        # `alembic -x schema=NAME upgrade head` creates a missing schema, as `hostedrooms upgrade --schema` does.
        with creating_schemas(), connectable.connect() as connection:
            _run_on(context, connection)
    finally:
        if context.config.attributes.get("connection") is None:
            connectable.dispose()  # an engine we built from a URL

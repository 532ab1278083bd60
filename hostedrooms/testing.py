"""pytest plugin for host applications: a migrated, isolated hostedrooms database per test.

Installed with hostedrooms and registered under the ``pytest11`` entry point, so an application's tests can
simply ask for the fixtures::

    def test_my_gateway(hostedrooms_engine):
        my_gateway = Gateway(engine=hostedrooms_engine)
        ...

    def test_facade(hostedrooms_target):          # a path or URL string, for hostedrooms.compat
        hosted_rooms.create_room(hostedrooms_target, ...)

By default each test gets its own SQLite file (copied from a template migrated once per session). To test
on PostgreSQL, pass ``--hostedrooms-postgres-url=postgresql://admin:pw@host/postgres`` or set
``HOSTEDROOMS_TEST_POSTGRES_URL``: an admin URL whose role may ``CREATE DATABASE``. Each test then gets a
fresh database cloned from a migrated template database, dropped afterwards.

The application's own tables join the template once per session: override ``hostedrooms_host_setup`` (a
session fixture) to return the application's ``MetaData``, its own Alembic history (:func:`host_alembic`), or a
callable taking the template's Engine::

    @pytest.fixture(scope="session")
    def hostedrooms_host_setup():
        return hostedrooms.testing.host_alembic("alembic.ini")   # or myapp.models.metadata

A fleet of gateways shares one PostgreSQL database, a schema each: pass ``--hostedrooms-schema=NAME`` (or set
``HOSTEDROOMS_TEST_SCHEMA``) and the template is migrated into that schema (``migrate.upgrade(url, schema=NAME)``);
``hostedrooms_target`` then carries it as the URL's ``search_path`` and ``hostedrooms_engine`` is built with
``schema=NAME``.

An asyncio application asks for ``hostedrooms_async_engine`` (a :func:`hostedrooms.aio.create_async_engine` on
the same per-test database, disposed afterwards; it needs the ``async`` extra).

The functions the fixtures are built from are public too (a PostgreSQL database for a ``with`` block, a
template prepared once, its per-test copy, an Engine disposed afterwards): hostedrooms' own test harness
(``tests/conftest.py``, every test on SQLite and PostgreSQL) is built from them.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import threading
import uuid
from collections.abc import Callable, Coroutine, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
import sqlalchemy as sa
from alembic import command
from alembic.config import Config

from . import migrate
from .db import create_engine, resolve_url

if TYPE_CHECKING:
    from sqlalchemy.ext.asyncio import AsyncEngine

POSTGRES_URL_ENV = "HOSTEDROOMS_TEST_POSTGRES_URL"
SCHEMA_ENV = "HOSTEDROOMS_TEST_SCHEMA"

#: What ``hostedrooms_host_setup`` may return: the host's tables, or a callable given the template's Engine.
HostSetup = sa.MetaData | Callable[[sa.Engine], object] | None


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("hostedrooms")
    group.addoption(
        "--hostedrooms-postgres-url", default=None,
        help=f"admin URL of a PostgreSQL server for hostedrooms fixtures (or ${POSTGRES_URL_ENV})")
    group.addoption(
        "--hostedrooms-schema", default=None,
        help=f"with PostgreSQL: the schema hostedrooms fixtures use in each test database (or ${SCHEMA_ENV})")


def _admin(admin_url: str) -> sa.Engine:
    return sa.create_engine(migrate_url(admin_url), isolation_level="AUTOCOMMIT")


def migrate_url(url: str) -> sa.URL:
    """``url`` with the driver hostedrooms uses (psycopg 3 for PostgreSQL).

    :param url: a database URL.
    :returns: the URL, with hostedrooms' driver.
    """
    return resolve_url(url)


def create_database(admin_url: str, name: str, *, template: str | None = None) -> str:
    """CREATE DATABASE ``name`` (dropping a leftover of that name); return its URL with the password.

    :param admin_url: a PostgreSQL URL allowed to create databases.
    :param name: the new database's name.
    :param template: a database to clone, or None for an empty one.
    :returns: the new database's URL.
    """
    admin = _admin(admin_url)
    try:
        with admin.connect() as connection:
            quote = connection.dialect.identifier_preparer.quote
            connection.exec_driver_sql(f"DROP DATABASE IF EXISTS {quote(name)} WITH (FORCE)")
            suffix = f" TEMPLATE {quote(template)}" if template else ""
            connection.exec_driver_sql(f"CREATE DATABASE {quote(name)}{suffix}")
    finally:
        admin.dispose()
    return migrate_url(admin_url).set(database=name).render_as_string(hide_password=False)


def drop_database(admin_url: str, name: str) -> None:
    """DROP DATABASE ``name`` if it exists, closing its connections.

    :param admin_url: a PostgreSQL URL allowed to drop databases.
    :param name: the database to drop.
    """
    admin = _admin(admin_url)
    try:
        with admin.connect() as connection:
            quote = connection.dialect.identifier_preparer.quote
            connection.exec_driver_sql(f"DROP DATABASE IF EXISTS {quote(name)} WITH (FORCE)")
    finally:
        admin.dispose()


def unique_name(prefix: str) -> str:
    """A database name unique to this process and call.

    :param prefix: the name's start.
    :returns: the name.
    """
    return f"{prefix}_{os.getpid()}_{uuid.uuid4().hex[:10]}"


def with_search_path(url: str, schema: str) -> str:
    """``url`` whose connections use ``schema`` alone (a ``search_path`` startup option: for a target string,
    where no ``schema=`` can be passed).

    :param url: a PostgreSQL URL.
    :param schema: the schema the connections use.
    :returns: the URL, as text.
    """
    with_path = resolve_url(url).update_query_dict({"options": f"-csearch_path={schema}"})
    return with_path.render_as_string(hide_password=False)


def postgres_admin_url(config: pytest.Config) -> str | None:
    """The admin URL given by ``--hostedrooms-postgres-url`` or ``$HOSTEDROOMS_TEST_POSTGRES_URL``, or None (the
    option is read only where this plugin is loaded).

    :param config: pytest's config.
    :returns: the admin URL, or None.
    """
    given = config.getoption("--hostedrooms-postgres-url", default=None) or os.environ.get(POSTGRES_URL_ENV)
    return str(given) if given else None


@contextlib.contextmanager
def postgres_database(admin_url: str, name: str, *, template: str | None = None) -> Iterator[str]:
    """A new PostgreSQL database ``name`` (empty, or cloned from database ``template``) for the ``with`` block:
    yields its URL; dropped afterwards, whatever happened.

    :param admin_url: a PostgreSQL URL allowed to create and drop databases.
    :param name: the new database's name.
    :param template: a database to clone, or None for an empty one.
    :returns: a context manager yielding the new database's URL.
    """
    url = create_database(admin_url, name, template=template)
    try:
        yield url
    finally:
        drop_database(admin_url, name)


def prepare_template(target: str, host_setup: HostSetup = None, *, schema: str | None = None) -> None:
    """Migrate the database ``target`` (in ``schema``) to head, then add the host's tables (see
    ``hostedrooms_host_setup``; in ``schema`` too).

    :param target: the database to prepare.
    :param host_setup: the host's tables: a ``MetaData``, a callable taking an Engine, or None.
    :param schema: the PostgreSQL schema, or None.
    """
    migrate.upgrade(target, schema=schema)
    if host_setup is None:
        return
    # Disposed: PostgreSQL clones a template only when nobody is connected.
    with open_engine(target, schema=schema) as engine:
        if isinstance(host_setup, sa.MetaData):
            host_setup.create_all(engine)
        else:
            host_setup(engine)


def host_alembic(config: str | os.PathLike[str] | Config = "alembic.ini", revision: str = "head") -> Callable[
        [sa.Engine], None]:
    """A ``hostedrooms_host_setup`` that runs the host application's own Alembic history onto the template:
    ``alembic upgrade <revision>`` with ``config`` (an ini file's path, or a ``Config``), handing the template's
    Engine to the host's ``env.py`` in ``config.attributes["connection"]`` (as pytest-alembic does; the host
    ``env.py`` of docs/host-alembic.md picks it up).

    :param config: the host's ``alembic.ini`` path, or an Alembic ``Config``.
    :param revision: the host's revision to upgrade to.
    :returns: the setup, for ``hostedrooms_host_setup`` to return.
    """

    def upgrade(engine: sa.Engine) -> None:
        alembic_config = config if isinstance(config, Config) else Config(os.fspath(config))
        alembic_config.attributes["connection"] = engine
        try:
            command.upgrade(alembic_config, revision)
        finally:
            alembic_config.attributes.pop("connection", None)

    return upgrade


def sqlite_template(directory: Path, host_setup: HostSetup = None) -> Path:
    """A SQLite file ``template.db`` in ``directory``, prepared by :func:`prepare_template`.

    :param directory: the folder to write ``template.db`` in.
    :param host_setup: the host's tables: a ``MetaData``, a callable taking an Engine, or None.
    :returns: the template file's path.
    """
    path = directory / "template.db"
    prepare_template(str(path), host_setup)
    return path


def copy_template(template: str | os.PathLike[str], path: Path) -> str:
    """A copy of the SQLite ``template`` file at ``path`` (one test's own database), as a target string.

    :param template: the prepared SQLite template file.
    :param path: where the copy goes.
    :returns: the copy's path, as a target string.
    """
    shutil.copyfile(template, path)
    return str(path)


@contextlib.contextmanager
def open_engine(target: str, *, schema: str | None = None) -> Iterator[sa.Engine]:
    """A hostedrooms Engine on ``target`` (in ``schema``) for the ``with`` block, disposed afterwards.

    :param target: a path or URL.
    :param schema: the PostgreSQL schema, or None.
    :returns: a context manager yielding the Engine.
    """
    engine = create_engine(target, schema=schema)
    try:
        yield engine
    finally:
        engine.dispose()


# --- fixtures ---------------------------------------------------------------------------------------------------


@pytest.fixture(scope="session")
def hostedrooms_postgres_url(request: pytest.FixtureRequest) -> str | None:
    """The admin URL given by option or environment, or None (SQLite).

    :param request: pytest's request.
    :returns: the admin URL, or None.
    """
    return postgres_admin_url(request.config)


@pytest.fixture(scope="session")
def hostedrooms_schema(request: pytest.FixtureRequest, hostedrooms_postgres_url: str | None) -> str | None:
    """The schema given by ``--hostedrooms-schema`` or ``$HOSTEDROOMS_TEST_SCHEMA`` (PostgreSQL only), or None.

    :param request: pytest's request.
    :param hostedrooms_postgres_url: the fixture: the admin URL, or None.
    :returns: the schema's name, or None.
    """
    given = request.config.getoption("--hostedrooms-schema", default=None) or os.environ.get(SCHEMA_ENV)
    if given and hostedrooms_postgres_url is None:
        raise pytest.UsageError("--hostedrooms-schema needs PostgreSQL (--hostedrooms-postgres-url)")
    return str(given) if given else None


@pytest.fixture(scope="session")
def hostedrooms_host_setup() -> HostSetup:
    """Override in the application's ``conftest.py`` to add its own tables to every test database: return a
    ``MetaData`` (``create_all`` runs on the template) or a callable taking the template's Engine (to run the
    application's own migrations, say). Applied once per session, after hostedrooms' migrations.

    :returns: None here (hostedrooms' tables only); an override returns a ``MetaData`` or a callable.
    """
    return None


@pytest.fixture(scope="session")
def _hostedrooms_template(
    hostedrooms_postgres_url: str | None, hostedrooms_host_setup: HostSetup, tmp_path_factory: pytest.TempPathFactory,
    hostedrooms_schema: str | None,
) -> Iterator[str]:
    """A database migrated to head once per session (with the host's tables): a SQLite file path, or a
    PostgreSQL database name."""
    if hostedrooms_postgres_url is None:
        yield str(sqlite_template(tmp_path_factory.mktemp("hostedrooms-template"), hostedrooms_host_setup))
        return
    name = unique_name("hostedrooms_template")
    with postgres_database(hostedrooms_postgres_url, name) as url:
        prepare_template(url, hostedrooms_host_setup, schema=hostedrooms_schema)
        yield name


@pytest.fixture
def hostedrooms_target(
    hostedrooms_postgres_url: str | None, _hostedrooms_template: str, tmp_path: Path, hostedrooms_schema: str | None,
) -> Iterator[str]:
    """A migrated hostedrooms database of this test alone, as a path or URL string.

    :param hostedrooms_postgres_url: the fixture: the admin URL, or None for SQLite.
    :param _hostedrooms_template: the plugin's session template (a file or a database name).
    :param tmp_path: pytest's fixture: where a SQLite copy goes.
    :param hostedrooms_schema: the fixture: the schema to use, or None.
    :returns: the database's path or URL, for the test.
    """
    if hostedrooms_postgres_url is None:
        yield copy_template(_hostedrooms_template, tmp_path / "hostedrooms.db")
        return
    name = unique_name("hostedrooms_test")
    with postgres_database(hostedrooms_postgres_url, name, template=_hostedrooms_template) as url:
        yield url if hostedrooms_schema is None else with_search_path(url, hostedrooms_schema)


@pytest.fixture
def hostedrooms_engine(hostedrooms_target: str, hostedrooms_schema: str | None) -> Iterator[sa.Engine]:
    """An Engine on this test's migrated hostedrooms database (disposed afterwards).

    :param hostedrooms_target: the fixture: this test's database.
    :param hostedrooms_schema: the fixture: the schema to use, or None.
    :returns: the Engine, for the test.
    """
    with open_engine(hostedrooms_target, schema=hostedrooms_schema) as engine:
        yield engine


@pytest.fixture
def hostedrooms_async_engine(hostedrooms_target: str, hostedrooms_schema: str | None) -> Iterator[AsyncEngine]:
    """An AsyncEngine (:func:`hostedrooms.aio.create_async_engine`) on this test's migrated hostedrooms database,
    for the asyncio API. A plain fixture, so it serves pytest-asyncio, anyio and ``asyncio.run`` tests alike; it is
    disposed after the test, on an event loop of its own (the test's loop is gone by then).

    :param hostedrooms_target: the fixture: this test's database.
    :param hostedrooms_schema: the fixture: the schema to use, or None.
    :returns: the AsyncEngine, for the test.
    """
    from .aio import create_async_engine

    engine = create_async_engine(hostedrooms_target, schema=hostedrooms_schema)
    try:
        yield engine
    finally:
        _on_a_loop_of_its_own(engine.dispose)


def _on_a_loop_of_its_own(coroutine: Callable[[], Coroutine[Any, Any, object]]) -> None:
    """Run ``coroutine()`` to its end on a new event loop: in this thread, or in another one while this thread
    runs a loop (a teardown inside a running loop cannot start one of its own)."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        asyncio.run(coroutine())
        return
    failure: list[BaseException] = []

    def run() -> None:
        try:
            asyncio.run(coroutine())
        except BaseException as exc:  # handed to the caller's thread
            failure.append(exc)

    worker = threading.Thread(target=run, name="hostedrooms-dispose")
    worker.start()
    worker.join()
    if failure:
        raise failure[0]

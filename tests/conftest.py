"""Test harness: every contract test runs on SQLite and on a real PostgreSQL server.

Fixtures
- ``backend``: "sqlite" or "postgresql" (tests using ``engine``/``target`` are parametrized over both).
- ``engine``: a freshly migrated, empty hostedrooms database for this test (SQLite: a file copied from a
  migrated template; PostgreSQL: this worker's own database, emptied before each test).
- ``target``: the same database as a string the seed-compatible facade accepts (a SQLite path or a URL).
- ``empty_target``: a brand-new empty database (never migrated) for migration tests.
- ``pg_admin_url``: an admin URL of the PostgreSQL server (skips when there is none).

PostgreSQL comes from ``$HOSTEDROOMS_TEST_POSTGRES_URL`` (an admin URL whose role may CREATE DATABASE), or
else a throwaway cluster started from Debian's ``postgresql`` binaries for this test run (each xdist
worker gets its own database). Without either the PostgreSQL tests skip, saying how to enable them;
``HOSTEDROOMS_REQUIRE_POSTGRES=1`` (set by .ci/run) turns that skip into a failure.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import Engine

from hostedrooms import migrate, pgcluster
from hostedrooms.db import create_engine
from hostedrooms.models import metadata
from hostedrooms.testing import create_database, drop_database, unique_name

BACKENDS = ("sqlite", "postgresql")
PG_URL_ENV = "HOSTEDROOMS_TEST_POSTGRES_URL"
REQUIRE_PG_ENV = "HOSTEDROOMS_REQUIRE_POSTGRES"
HOW_TO_ENABLE = (
    f"PostgreSQL tests need a server: `apt-get install postgresql` (the harness starts a throwaway cluster) "
    f"or set {PG_URL_ENV} to an admin URL that may CREATE DATABASE")


def _worker() -> str:
    return os.environ.get("PYTEST_XDIST_WORKER", "main")


# --- PostgreSQL server ------------------------------------------------------------------------------------


@pytest.fixture(scope="session")
def pg_admin_url() -> Iterator[str]:
    """An admin URL for a PostgreSQL server, or skip (fail when HOSTEDROOMS_REQUIRE_POSTGRES=1)."""
    given = os.environ.get(PG_URL_ENV)
    if given:
        yield given
        return
    cluster = None
    problem = HOW_TO_ENABLE
    if pgcluster.find_bin_dir() is not None:
        try:
            cluster = pgcluster.start()
        except RuntimeError as exc:
            problem = f"could not start a throwaway PostgreSQL cluster: {exc}"
    if cluster is None:
        if os.environ.get(REQUIRE_PG_ENV) == "1":
            pytest.fail(f"PostgreSQL is required ({REQUIRE_PG_ENV}=1) but unavailable: {problem}")
        pytest.skip(problem)
    try:
        yield cluster.url
    finally:
        cluster.stop()


@pytest.fixture(scope="session")
def pg_worker_url(pg_admin_url: str) -> Iterator[str]:
    """This worker's own migrated PostgreSQL database (tests empty it before use), dropped at the end of the
    session: on a server of the user's own ($HOSTEDROOMS_TEST_POSTGRES_URL) a run leaves nothing behind."""
    name = f"hostedrooms_test_{_worker()}_{os.getpid()}"
    url = create_database(pg_admin_url, name)
    try:
        migrate.upgrade(url)
        yield url
    finally:
        drop_database(pg_admin_url, name)


# --- SQLite template ---------------------------------------------------------------------------------------


@pytest.fixture(scope="session")
def sqlite_template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A SQLite file migrated to head once per session; tests get copies."""
    path = tmp_path_factory.mktemp("template") / "template.db"
    migrate.upgrade(path)
    return path


# --- per-test databases ------------------------------------------------------------------------------------


@pytest.fixture(params=BACKENDS)
def backend(request: pytest.FixtureRequest) -> str:
    """The database backend of this test run."""
    return str(request.param)


def _truncate_all(engine: Engine) -> None:
    with engine.begin() as connection:
        prepare = connection.dialect.identifier_preparer
        names = ", ".join(prepare.quote(table.name) for table in metadata.sorted_tables)
        connection.exec_driver_sql(f"TRUNCATE {names} CASCADE")


@pytest.fixture
def target(request: pytest.FixtureRequest, backend: str, tmp_path: Path) -> str:
    """A migrated, empty database as a facade target string (SQLite file path or PostgreSQL URL)."""
    if backend == "sqlite":
        path = tmp_path / "state.db"
        shutil.copyfile(request.getfixturevalue("sqlite_template"), path)
        return str(path)
    url: str = request.getfixturevalue("pg_worker_url")
    engine = create_engine(url)
    try:
        _truncate_all(engine)
    finally:
        engine.dispose()
    return url


@pytest.fixture
def engine(target: str) -> Iterator[Engine]:
    """A configured Engine on a migrated, empty database of ``backend``."""
    built = create_engine(target)
    try:
        yield built
    finally:
        built.dispose()


@pytest.fixture
def empty_target(request: pytest.FixtureRequest, backend: str, tmp_path: Path) -> Iterator[str]:
    """A brand-new database with no tables at all, as a target string."""
    if backend == "sqlite":
        yield str(tmp_path / "empty.db")
        return
    admin_url: str = request.getfixturevalue("pg_admin_url")
    name = unique_name("hostedrooms_empty")
    yield create_database(admin_url, name)
    drop_database(admin_url, name)

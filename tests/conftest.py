"""Test harness: every contract test runs on SQLite and on a real PostgreSQL server.

Fixtures
- ``backend``: "sqlite" or "postgresql" (tests using ``engine``/``target`` are parametrized over both).
- ``engine``: a freshly migrated, empty hostedrooms database for this test (SQLite: a file copied from a
  migrated template; PostgreSQL: this worker's own database, emptied before each test).
- ``target``: the same database as a string the seed-compatible facade accepts (a SQLite path or a URL).
- ``empty_target``: a brand-new empty database (never migrated) for migration tests.
- ``pg_admin_url``: an admin URL of the PostgreSQL server (skips when there is none).
- ``pgbouncer_url`` / ``pgbouncer_direct_url``: a migrated database of its own reached through Debian's
  ``pgbouncer`` in transaction pooling mode (started for the session), and the same database directly; skips
  when pgbouncer is not installed, fails instead under ``HOSTEDROOMS_REQUIRE_POSTGRES=1``.
- ``pg_standby_pair``: a primary and a streaming hot standby (a cluster of their own, started for the module: a
  standby takes seconds), holding a migrated database, with asynchronous replication; ``pg_pair_factory`` starts
  pairs for one test (``synchronous=True``: the primary names the standby in ``synchronous_standby_names``), for
  tests that promote the standby. Both skip when Debian's PostgreSQL binaries are absent (fail instead under
  ``HOSTEDROOMS_REQUIRE_POSTGRES=1``); every cluster is stopped and removed at the end.
- ``api``: "sync" or "async": the public API a contract test calls (``tests/apis.py``; a module opts in with
  ``_api = use_api("rooms", ...)``, and each of its tests then runs against both APIs, on both backends).

The databases come from the helpers of hostedrooms' own pytest plugin (``hostedrooms.testing``), the code a host
application's tests use; this harness needs only its functions, so it works whether or not the plugin is loaded.

PostgreSQL comes from ``$HOSTEDROOMS_TEST_POSTGRES_URL`` (or the plugin's ``--hostedrooms-postgres-url``; an admin
URL whose role may CREATE DATABASE), or else a throwaway cluster started from Debian's ``postgresql`` binaries
for this test run (each xdist worker gets its own database). Without either the PostgreSQL tests skip, saying
how to enable them; ``HOSTEDROOMS_REQUIRE_POSTGRES=1`` (set by .ci/run) turns that skip into a failure.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Engine, make_url
from sqlalchemy.exc import IntegrityError

from hostedrooms import pgcluster, testing
from hostedrooms.models import metadata

# The pytester fixture (some tests run a pytest of their own) removes, when it ends, every module imported while it
# ran. Were psycopg first imported then, the next import would build new Python exception classes while psycopg's
# compiled part keeps raising the old ones, which SQLAlchemy then no longer recognises as driver errors (a raw
# psycopg.OperationalError instead of a translated StorageError, in whichever tests ran next). Import it first.
try:
    import psycopg  # noqa: F401
except ImportError:  # the postgres extra is optional; its tests are skipped without it
    pass

BACKENDS = ("sqlite", "postgresql")
REQUIRE_PG_ENV = "HOSTEDROOMS_REQUIRE_POSTGRES"
HOW_TO_ENABLE = (
    f"PostgreSQL tests need a server: `apt-get install postgresql` (the harness starts a throwaway cluster) "
    f"or set {testing.POSTGRES_URL_ENV} to an admin URL that may CREATE DATABASE")


def _worker() -> str:
    return os.environ.get("PYTEST_XDIST_WORKER", "main")


# --- PostgreSQL server ------------------------------------------------------------------------------------


@pytest.fixture(scope="session")
def pg_admin_url(request: pytest.FixtureRequest) -> Iterator[str]:
    """An admin URL for a PostgreSQL server, or skip (fail when HOSTEDROOMS_REQUIRE_POSTGRES=1)."""
    given = testing.postgres_admin_url(request.config)
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
    with testing.postgres_database(pg_admin_url, f"hostedrooms_test_{_worker()}_{os.getpid()}") as url:
        testing.prepare_template(url)
        yield url


# --- PgBouncer (transaction pooling) before this server ----------------------------------------------------


@pytest.fixture(scope="session")
def _pgbouncer_database(pg_admin_url: str) -> Iterator[tuple[str, str]]:
    """(URL through PgBouncer, direct URL) of a migrated database of its own; PgBouncer stops before the
    database is dropped (it holds server connections to it)."""
    if pgcluster.find_pgbouncer() is None:
        problem = "PgBouncer tests need `apt-get install pgbouncer` (the harness starts one before PostgreSQL)"
        if os.environ.get(REQUIRE_PG_ENV) == "1":
            pytest.fail(f"PgBouncer is required ({REQUIRE_PG_ENV}=1) but not installed: {problem}")
        pytest.skip(problem)
    with testing.postgres_database(pg_admin_url, f"hostedrooms_pooled_{_worker()}_{os.getpid()}") as url:
        testing.prepare_template(url)
        bouncer = pgcluster.start_pgbouncer(pg_admin_url)
        try:
            yield bouncer.url(str(make_url(url).database)), url
        finally:
            bouncer.stop()


@pytest.fixture(scope="session")
def pgbouncer_url(_pgbouncer_database: tuple[str, str]) -> str:
    """A migrated database through PgBouncer in transaction pooling mode (tests empty it before use)."""
    return _pgbouncer_database[0]


@pytest.fixture(scope="session")
def pgbouncer_direct_url(_pgbouncer_database: tuple[str, str]) -> str:
    """The database of ``pgbouncer_url``, connected to directly (bypassing PgBouncer)."""
    return _pgbouncer_database[1]


# --- a primary with a streaming standby (failover, hot standby reads) -------------------------------------------


def _require_server_binaries() -> None:
    if pgcluster.find_bin_dir() is None:
        problem = "streaming standby tests need Debian's PostgreSQL server binaries (apt-get install postgresql)"
        if os.environ.get(REQUIRE_PG_ENV) == "1":
            pytest.fail(f"PostgreSQL is required ({REQUIRE_PG_ENV}=1) but unavailable: {problem}")
        pytest.skip(problem)


@pytest.fixture
def pg_pair_factory() -> Iterator[Callable[..., pgcluster.StandbyPair]]:
    """``start(synchronous=False)``: a new primary + streaming standby holding a migrated database; all stopped
    and removed when the test ends."""
    _require_server_binaries()
    pairs: list[pgcluster.StandbyPair] = []

    def start(*, synchronous: bool = False) -> pgcluster.StandbyPair:
        pair = pgcluster.start_pair(synchronous=synchronous, prepare=testing.prepare_template)
        pairs.append(pair)
        return pair

    try:
        yield start
    finally:
        for pair in pairs:
            pair.stop()


@pytest.fixture(scope="module")
def pg_standby_pair() -> Iterator[pgcluster.StandbyPair]:
    """One primary + hot standby (asynchronous) per module; the tests using it must not promote it."""
    _require_server_binaries()
    pair = pgcluster.start_pair(prepare=testing.prepare_template)
    try:
        yield pair
    finally:
        pair.stop()


# --- SQLite template ---------------------------------------------------------------------------------------


@pytest.fixture(scope="session")
def sqlite_template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A SQLite file migrated to head once per session; tests get copies."""
    return testing.sqlite_template(tmp_path_factory.mktemp("template"))


# --- per-test databases ------------------------------------------------------------------------------------


@pytest.fixture(params=BACKENDS)
def backend(request: pytest.FixtureRequest) -> str:
    """The database backend of this test run."""
    return str(request.param)


# (standby_fixtures.truncate_all is the same: this file keeps its own, since it also runs alone in a host's folder,
# tests/packaging/test_harness_smoke.py, where no test helper module can be imported.)
def _truncate_all(engine: Engine) -> None:
    """Every hostedrooms table emptied: ``DELETE`` (the tables hold a test's few rows; ``TRUNCATE`` gives each
    table, index and TOAST table a new file and syncs them at commit, ten times the cost, before every test), or
    ``TRUNCATE ... CASCADE`` when a foreign key of a table a test left behind refuses the ``DELETE``."""
    try:
        with engine.begin() as connection:
            for table in reversed(metadata.sorted_tables):
                connection.execute(table.delete())
    except IntegrityError:
        with engine.begin() as connection:
            prepare = connection.dialect.identifier_preparer
            names = ", ".join(prepare.quote(table.name) for table in metadata.sorted_tables)
            connection.exec_driver_sql(f"TRUNCATE {names} CASCADE")


@pytest.fixture
def target(request: pytest.FixtureRequest, backend: str, tmp_path: Path) -> str:
    """A migrated, empty database as a facade target string (SQLite file path or PostgreSQL URL)."""
    if backend == "sqlite":
        return testing.copy_template(request.getfixturevalue("sqlite_template"), tmp_path / "state.db")
    url: str = request.getfixturevalue("pg_worker_url")
    with testing.open_engine(url) as engine:
        _truncate_all(engine)
    return url


@pytest.fixture
def engine(target: str) -> Iterator[Engine]:
    """A configured Engine on a migrated, empty database of ``backend``."""
    with testing.open_engine(target) as built:
        yield built


@pytest.fixture
def empty_target(request: pytest.FixtureRequest, backend: str, tmp_path: Path) -> Iterator[str]:
    """A brand-new database with no tables at all, as a target string."""
    if backend == "sqlite":
        yield str(tmp_path / "empty.db")
        return
    admin_url: str = request.getfixturevalue("pg_admin_url")
    with testing.postgres_database(admin_url, testing.unique_name("hostedrooms_empty")) as url:
        yield url


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """``api``: both APIs for a test on the ``engine``/``target`` database, or only the synchronous one for a
    test without it (pure checks) or marked ``sync_api_only`` (say, one that calls the services from several
    threads at once, which the asyncio shim's one event loop cannot serve)."""
    if "api" in metafunc.fixturenames:
        only_sync = metafunc.definition.get_closest_marker("sync_api_only") is not None or not any(
            name in metafunc.fixturenames for name in ("engine", "target"))  # no database: nothing to call
        metafunc.parametrize("api", ["sync"] if only_sync else ["sync", "async"], indirect=True)


@pytest.fixture
def api(request: pytest.FixtureRequest) -> Iterator[Any]:
    """The synchronous modules, or the asyncio API behind the same names (``tests/apis.py``, imported here: a copy
    of this file elsewhere, as the harness's own smoke tests make, needs no sibling module)."""
    from apis import SYNC, AsyncApi

    if request.param == "sync":
        yield SYNC
        return
    shim = AsyncApi()
    try:
        yield shim
    finally:
        shim.close()

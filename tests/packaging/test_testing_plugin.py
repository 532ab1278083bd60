"""The pytest plugin gives a host application's tests a migrated database of their own, per test."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest
import sqlalchemy as sa

from hostedrooms import migrate
from hostedrooms.testing import prepare_template

pytest_plugins = ["pytester"]

HOST_APP_TESTS = '''
import sqlalchemy as sa
from hostedrooms import migrate
from hostedrooms.models import retired_ids

def _write_and_count(engine):
    with engine.begin() as connection:
        connection.execute(sa.insert(retired_ids).values(room_id="r", retired_at=1.0))
        return connection.execute(sa.select(sa.func.count()).select_from(retired_ids)).scalar_one()

def test_first(hostedrooms_engine):
    assert migrate.is_at_head(hostedrooms_engine)
    assert _write_and_count(hostedrooms_engine) == 1

def test_second_is_isolated(hostedrooms_engine):
    assert _write_and_count(hostedrooms_engine) == 1

def test_target_is_a_string(hostedrooms_target, hostedrooms_engine):
    assert isinstance(hostedrooms_target, str)
    assert hostedrooms_engine.dialect.name == EXPECTED
'''


def test_plugin_on_sqlite(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("HOSTEDROOMS_TEST_POSTGRES_URL", raising=False)
    pytester.makepyfile(HOST_APP_TESTS.replace("EXPECTED", "'sqlite'"))
    pytester.runpytest_subprocess().assert_outcomes(passed=3)


def test_plugin_on_postgresql(pytester: pytest.Pytester, pg_admin_url: str) -> None:
    pytester.makepyfile(HOST_APP_TESTS.replace("EXPECTED", "'postgresql'"))
    result = pytester.runpytest_subprocess(f"--hostedrooms-postgres-url={pg_admin_url}")
    result.assert_outcomes(passed=3)


# --- the host's own tables in the fixture databases ---------------------------------------------------------

HOST_MODELS = '''
import sqlalchemy as sa

metadata = sa.MetaData()
orders = sa.Table("host_orders", metadata, sa.Column("id", sa.Integer, primary_key=True),
                  sa.Column("room_id", sa.String(128), nullable=False))
'''

HOST_TABLE_TESTS = '''
import sqlalchemy as sa
from hostedrooms import migrate, rooms
from myapp.models import orders

def _add_order(engine):
    with engine.begin() as connection:
        connection.execute(sa.insert(orders).values(room_id="r1"))
        return connection.execute(sa.select(sa.func.count()).select_from(orders)).scalar_one()

def test_host_table_next_to_hostedrooms(hostedrooms_engine):
    assert migrate.is_at_head(hostedrooms_engine)
    rooms.create_room(hostedrooms_engine, room_id="r1", name="R", members=[], authority_gateway_id="install:t")
    assert _add_order(hostedrooms_engine) == 1

def test_host_table_is_isolated_per_test(hostedrooms_engine):
    assert _add_order(hostedrooms_engine) == 1
    assert hostedrooms_engine.dialect.name == EXPECTED
'''


def _host_app(pytester: pytest.Pytester, conftest: str, expected: str) -> None:
    pytester.makepyfile(**{"myapp/__init__": "", "myapp/models": HOST_MODELS})
    pytester.makeconftest(conftest)
    pytester.makepyfile(test_host=HOST_TABLE_TESTS.replace("EXPECTED", repr(expected)))


def test_host_metadata_joins_the_template_as_the_readme_shows(
        pytester: pytest.Pytester, backend: str, request: pytest.FixtureRequest,
        monkeypatch: pytest.MonkeyPatch) -> None:
    from test_readme import readme_block

    monkeypatch.delenv("HOSTEDROOMS_TEST_POSTGRES_URL", raising=False)
    _host_app(pytester, readme_block("def hostedrooms_host_setup"), backend)
    options = [] if backend == "sqlite" else [f"--hostedrooms-postgres-url={request.getfixturevalue('pg_admin_url')}"]
    pytester.runpytest_subprocess(*options).assert_outcomes(passed=2)


def test_host_setup_callable_receives_the_migrated_template_engine(tmp_path: Path) -> None:
    seen: list[sa.Engine] = []

    def my_migrations(engine: sa.Engine) -> None:
        assert migrate.is_at_head(engine)  # after hostedrooms' migrations
        seen.append(engine)
        with engine.begin() as connection:
            connection.exec_driver_sql("CREATE TABLE host_orders (id INTEGER PRIMARY KEY)")

    template = str(tmp_path / "template.db")
    prepare_template(template, my_migrations)
    assert len(seen) == 1
    with sqlite3.connect(template) as connection:
        tables = {row[0] for row in connection.execute("SELECT name FROM sqlite_master WHERE type='table'")}
    assert {"host_orders", "hosted_rooms", migrate.VERSION_TABLE} <= tables


# --- asyncio hosts, and the host's own Alembic history on the template --------------------------------------

ASYNC_HOST_TESTS = '''
import asyncio
from hostedrooms import aio

def test_async_engine_on_this_tests_database(hostedrooms_async_engine, hostedrooms_target):
    async def main():
        await aio.rooms.create_room(hostedrooms_async_engine, room_id="r1", name="R", members=[],
                                    authority_gateway_id="install:t")
        return await aio.rooms.room_state(hostedrooms_async_engine, room_id="r1")
    assert asyncio.run(main())["authority_epoch"] == 1
    assert hostedrooms_async_engine.dialect.name == EXPECTED

def test_async_engine_is_isolated_per_test(hostedrooms_async_engine):
    async def main():
        return await aio.rooms.list_rooms(hostedrooms_async_engine)
    assert asyncio.run(main()) == []
'''


def test_async_engine_fixture(pytester: pytest.Pytester, backend: str, request: pytest.FixtureRequest,
                              monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("HOSTEDROOMS_TEST_POSTGRES_URL", raising=False)
    pytester.makepyfile(ASYNC_HOST_TESTS.replace("EXPECTED", repr(backend)))
    options = [] if backend == "sqlite" else [f"--hostedrooms-postgres-url={request.getfixturevalue('pg_admin_url')}"]
    result = pytester.runpytest_subprocess("-W", "error::sqlalchemy.exc.SAWarning", *options)
    result.assert_outcomes(passed=2)


HOST_ALEMBIC_CONFTEST = '''
import pytest
from hostedrooms.testing import host_alembic

@pytest.fixture(scope="session")
def hostedrooms_host_setup():
    return host_alembic("alembic.ini")
'''

HOST_ALEMBIC_TESTS = '''
import sqlalchemy as sa
from hostedrooms import migrate

def test_the_host_history_ran_on_the_template(hostedrooms_engine):
    assert migrate.is_at_head(hostedrooms_engine)
    with hostedrooms_engine.begin() as connection:
        assert connection.execute(sa.text("SELECT version_num FROM alembic_version")).scalar_one() == "host_0001"
        connection.execute(sa.text("INSERT INTO host_orders (note) VALUES ('n1')"))
        assert connection.execute(sa.text("SELECT count(*) FROM host_orders")).scalar_one() == 1

def test_isolated(hostedrooms_engine):
    with hostedrooms_engine.connect() as connection:
        assert connection.execute(sa.text("SELECT count(*) FROM host_orders")).scalar_one() == 0
'''


def test_host_alembic_runs_the_host_history_on_the_template(
        pytester: pytest.Pytester, backend: str, request: pytest.FixtureRequest,
        monkeypatch: pytest.MonkeyPatch) -> None:
    from test_host_alembic import _write_host_app

    monkeypatch.delenv("HOSTEDROOMS_TEST_POSTGRES_URL", raising=False)
    _write_host_app(pytester.path, "sqlite:///unused-by-the-fixture.db", one_command=False)
    pytester.makeconftest(HOST_ALEMBIC_CONFTEST)
    pytester.makepyfile(test_host=HOST_ALEMBIC_TESTS)
    options = [] if backend == "sqlite" else [f"--hostedrooms-postgres-url={request.getfixturevalue('pg_admin_url')}"]
    pytester.runpytest_subprocess("-p", "no:cacheprovider", *options).assert_outcomes(passed=2)
    assert not (pytester.path / "unused-by-the-fixture.db").exists()

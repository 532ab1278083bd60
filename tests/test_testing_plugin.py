"""The pytest plugin gives a host application's tests a migrated database of their own, per test."""

from __future__ import annotations

import pytest

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

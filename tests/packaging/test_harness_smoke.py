"""The harness gives every backend a migrated, empty database."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import sqlalchemy as sa

from hostedrooms import migrate
from hostedrooms.models import metadata

pytest_plugins = ["pytester"]


def test_engine_is_migrated_and_empty(engine: sa.Engine) -> None:
    assert migrate.is_at_head(engine)
    with engine.connect() as connection:
        tables = set(sa.inspect(connection).get_table_names())
        assert set(metadata.tables) <= tables
        for table in metadata.sorted_tables:
            if table.name == "hosted_room_budget":  # the budget's counter rows may exist, accounting for nothing
                used = sa.select(sa.func.coalesce(sa.func.sum(table.c.used), 0))
                assert connection.execute(used).scalar_one() == 0
                continue
            assert connection.execute(sa.select(sa.func.count()).select_from(table)).scalar_one() == 0


TINY_TEST = '''
import sqlalchemy as sa

def test_tiny(target, backend):
    if backend == "postgresql":
        print("DATABASE", sa.make_url(target).database)
'''


def _test_databases(admin_url: str) -> set[str]:
    engine = sa.create_engine(admin_url)
    try:
        with engine.connect() as connection:
            return set(connection.execute(sa.text(
                "SELECT datname FROM pg_database WHERE datname LIKE 'hostedrooms%'")).scalars())
    finally:
        engine.dispose()


def test_a_run_on_the_users_server_leaves_no_database_behind(
        pytester: pytest.Pytester, pg_admin_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The "tests on your server" of docs/postgresql.md: HOSTEDROOMS_TEST_POSTGRES_URL names a server that outlives
    the run."""
    pytester.makeconftest((Path(__file__).resolve().parents[1] / "conftest.py").read_text())
    pytester.makepyfile(test_tiny=TINY_TEST)
    monkeypatch.setenv("HOSTEDROOMS_TEST_POSTGRES_URL", pg_admin_url)
    monkeypatch.delenv("PYTEST_ADDOPTS", raising=False)
    before = _test_databases(pg_admin_url)
    result = pytester.runpytest_subprocess("-s", "-p", "no:cacheprovider")
    result.assert_outcomes(passed=2)
    (name,) = re.findall(r"DATABASE (\S+)", result.stdout.str())
    assert name.startswith("hostedrooms_test_") and name not in before  # the run had a database of its own ...
    assert _test_databases(pg_admin_url) == before  # ... and dropped it

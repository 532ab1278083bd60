"""Fixtures of the standby tests (``pytest_plugins = ["standby_fixtures"]``): a second store of the test's backend.

``standby_target`` is, on SQLite, a copy of the migrated template beside the test's own database; on PostgreSQL a
database of its own (created and migrated once per session and worker, emptied before each test).
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import Engine
from sqlalchemy.exc import IntegrityError
from standby_support import migrated_database

from hostedrooms.db import create_engine
from hostedrooms.models import metadata


def truncate_all(engine: Engine) -> None:
    """Every hostedrooms table emptied, as ``tests/conftest.py`` empties the test's own database: ``DELETE``, or
    ``TRUNCATE ... CASCADE`` when a foreign key of a table a test left behind refuses it."""
    try:
        with engine.begin() as connection:
            for table in reversed(metadata.sorted_tables):
                connection.execute(table.delete())
    except IntegrityError:
        with engine.begin() as connection:
            quote = connection.dialect.identifier_preparer.quote
            connection.exec_driver_sql(
                f"TRUNCATE {', '.join(quote(table.name) for table in metadata.sorted_tables)} CASCADE")


@pytest.fixture(scope="session")
def pg_standby_url(pg_admin_url: str) -> Iterator[str]:
    yield from migrated_database(pg_admin_url, "hostedrooms_standby")


@pytest.fixture
def standby_target(request: pytest.FixtureRequest, backend: str, tmp_path: Path) -> str:
    """A second migrated, empty store of ``backend`` (the standby's), beside ``target`` (the authority's)."""
    if backend == "sqlite":
        path = tmp_path / "standby.db"
        shutil.copyfile(request.getfixturevalue("sqlite_template"), path)
        return str(path)
    url: str = request.getfixturevalue("pg_standby_url")
    engine = create_engine(url)
    try:
        truncate_all(engine)
    finally:
        engine.dispose()
    return url


@pytest.fixture
def standby(standby_target: str) -> Iterator[Engine]:
    engine = create_engine(standby_target)
    try:
        yield engine
    finally:
        engine.dispose()

"""Fixtures of the standby tests (``pytest_plugins = ["standby_fixtures"]``): a second store of the test's backend.

``standby_target`` is, on SQLite, a copy of the migrated template beside the test's own database; on PostgreSQL a
database of its own (created and migrated once per session and worker, emptied before each test).
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest
from factories import empty_tables
from sqlalchemy import Engine
from standby_support import migrated_database

from hostedrooms.db import create_engine


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
        empty_tables(engine)
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

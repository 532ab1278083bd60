"""An engine's hostedrooms state in one place (hostedrooms.engine_profile) and the backend registry.

What an engine was configured with is its :class:`EngineProfile`, found by :func:`profile_of` for the engine and
for every engine ``execution_options()`` derives from it; the record is held weakly (an engine disposed and dropped
takes it along, with its runtime). The missing-database rule is one rule: the probes' ``is_missing_store`` and
``errors.translate`` agree on it.
"""

from __future__ import annotations

import gc
import weakref
from pathlib import Path

import pytest
import sqlalchemy as sa
from sqlalchemy import Engine
from sqlalchemy import exc as sa_exc

import hostedrooms
from hostedrooms import engine_profile, rooms
from hostedrooms.backends import PostgreSQLBackend, SQLiteBackend, backend_for, backend_for_url, backend_named
from hostedrooms.errors import StoreMissingError, is_missing_database, translate


def test_the_registry_names_one_backend_per_database(engine: Engine, backend: str) -> None:
    found = backend_for(engine)
    assert found is backend_named(backend) is backend_for_url(engine.url)
    assert isinstance(found, SQLiteBackend if backend == "sqlite" else PostgreSQLBackend)
    assert found.name == backend
    assert backend_named("mysql") is None


def test_a_built_engine_has_its_profile_and_derived_engines_share_it(target: str, backend: str) -> None:
    engine = hostedrooms.create_engine(target, busy_timeout=3.5, synchronous="NORMAL")
    try:
        profile = engine_profile.profile_of(engine)
        assert profile is not None
        assert (profile.backend, profile.synchronous, profile.busy_timeout) == (
            backend_named(backend), "NORMAL", 3.5)
        assert profile.schema is None and profile.pooler is None
        assert engine_profile.profile_of(engine.execution_options(logging_token="x")) is profile
        # Adopting it again keeps the profile it was built with.
        assert hostedrooms.create_engine(engine) is engine
        assert engine_profile.profile_of(engine) is profile
    finally:
        engine.dispose()


def test_an_engine_hostedrooms_never_configured_has_no_profile(tmp_path: Path) -> None:
    plain = sa.create_engine(f"sqlite:///{tmp_path / 'plain.db'}")
    try:
        assert engine_profile.profile_of(plain) is None
        adopted = hostedrooms.create_engine(plain)
        profile = engine_profile.profile_of(adopted)
        assert profile is not None and profile.backend is backend_named("sqlite")
    finally:
        plain.dispose()


def test_a_dropped_engine_takes_its_record_and_runtime_along(target: str) -> None:
    engine = hostedrooms.create_engine(target)  # the target is migrated already
    rooms.create_room(engine, room_id="r1", name="Room", members=[], authority_gateway_id="g1")
    dialect_ref = weakref.ref(engine.dialect)
    engine_ref = weakref.ref(engine)
    assert engine_profile.known_record(engine.dialect) is not None
    engine.dispose()
    del engine
    gc.collect()
    assert engine_ref() is None and dialect_ref() is None


class _DriverError(Exception):
    def __init__(self, text: str, sqlstate: str | None = None) -> None:
        super().__init__(text)
        self.sqlstate = sqlstate


@pytest.mark.parametrize(("text", "sqlstate", "missing"), [
    ('database "nope" does not exist', None, True),
    ("connection failed: FATAL:  database \"gw\" does not exist", None, True),
    ("invalid catalog", "3D000", True),
    ('role "nobody" does not exist', None, False),
    ("relation does not exist", "42P01", False),
])
def test_the_missing_database_rule_is_the_same_for_probes_and_errors(
        text: str, sqlstate: str | None, missing: bool) -> None:
    wrapped = sa_exc.OperationalError("SELECT 1", {}, _DriverError(text, sqlstate))
    assert is_missing_database(wrapped) is missing
    assert backend_named("postgresql").is_missing_store(wrapped) is missing  # type: ignore[union-attr]
    assert backend_named("sqlite").is_missing_store(wrapped) is False  # type: ignore[union-attr]
    assert isinstance(translate(wrapped, "postgresql://h/db"), StoreMissingError) is missing

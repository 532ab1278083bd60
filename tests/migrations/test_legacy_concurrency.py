"""Several processes upgrading one database at once: exactly one migrates (adopting a reference file on
SQLite, creating a fresh schema on PostgreSQL), the others wait and then find head; nobody errors."""

from __future__ import annotations

from pathlib import Path

import pytest
import sqlalchemy as sa
from factories import RACER_START, race
from test_legacy_adoption import _draft_rooms, _host_state, _select, legacy
from test_legacy_schemas import dump

from hostedrooms import migrate, models
from hostedrooms.db import create_engine

PROCESSES = 4
CHILD = RACER_START + """
migrate.upgrade(sys.argv[1])
print("DONE", migrate.current_revision(sys.argv[1]))
"""


def _race(target: str, tmp_path: Path) -> list[str]:
    outputs = []
    for code, out in race(CHILD, target, tmp_path, processes=PROCESSES, timeout=120):
        assert code == 0, out
        outputs.append(out)
    return outputs


def _ran_baseline(outputs: list[str]) -> int:
    return sum("Running upgrade  -> 0001_baseline" in out for out in outputs)


def test_concurrent_upgrades_adopt_a_reference_file_once(tmp_path: Path) -> None:
    path = tmp_path / "state.db"
    _draft_rooms(path)
    host = _host_state(path)
    outputs = _race(str(path), tmp_path)
    assert _ran_baseline(outputs) == 1, outputs
    assert all(f"DONE {migrate.head_revision()}" in out for out in outputs), outputs
    assert _host_state(path) == host
    engine = create_engine(path)
    try:
        assert len(_select(engine, models.events)) == 4
        assert [r["room_id"] for r in _select(engine, models.retired_ids)] == ["r2"]
        with engine.connect() as connection:
            assert legacy.detect_generation(connection).kind == legacy.MANAGED
            versions = connection.execute(sa.text("SELECT count(*) FROM hostedrooms_alembic_version")).scalar_one()
        assert versions == 1
    finally:
        engine.dispose()
    assert "_hostedrooms_adopting_" not in repr(dump(path)["schema"])


@pytest.mark.parametrize("backend", ["postgresql"], indirect=True)
def test_concurrent_upgrades_of_a_fresh_postgresql_database(empty_target: str, tmp_path: Path) -> None:
    outputs = _race(empty_target, tmp_path)
    assert _ran_baseline(outputs) == 1, outputs
    assert all(f"DONE {migrate.head_revision()}" in out for out in outputs), outputs

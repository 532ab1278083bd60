"""The revisions are frozen: none imports ``hostedrooms.models`` (directly or through a module that does), and a
change to the live models changes nothing an upgrade does, on a fresh database or an adopted reference file.

The runtime checks run in child processes: one where importing the models raises, one where the live models
were changed before upgrading. The static check also sees imports inside functions a run may not reach.
"""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import sqlalchemy as sa
from alembic import command
from test_legacy_adoption import GENERATIONS
from test_legacy_schemas import EVENTS_DRAFT, ROOMS_DRAFT, build, insert

from hostedrooms import migrate
from hostedrooms.db import create_engine

ROOT = Path(__file__).resolve().parents[2]
VERSIONS = migrate.script_location() / "versions"
#: The last revision of the frozen set: upgrading to it must give this schema forever, whatever models.py says.
FROZEN = "0006_conform_reference_tables"
SNAPSHOT = Path(__file__).resolve().parents[1] / "snapshots" / "schema_0006_sqlite.sql"

#: Runs every revision as Alembic does (scripts loaded by path), without env.py, with the models unimportable.
WITHOUT_MODELS = """
import json, sys

class NoModels:
    def find_spec(self, name, path=None, target=None):
        if name == "hostedrooms.models" or name.startswith("hostedrooms.models."):
            raise ImportError(name + " imported by a revision")
        return None

sys.meta_path.insert(0, NoModels())

import sqlalchemy as sa
from alembic.config import Config
from alembic.runtime.environment import EnvironmentContext
from alembic.runtime.migration import MigrationStep
from alembic.script import ScriptDirectory

location, *urls = sys.argv[1:]
config = Config()
config.set_main_option("script_location", location)
script = ScriptDirectory.from_config(config)
outcomes = {}

def upgrade(heads, _context):
    revisions = list(script.iterate_revisions("head", heads, implicit_base=True))
    return [MigrationStep.upgrade_from_script(script.revision_map, each) for each in reversed(revisions)]

for url in urls:
    engine = sa.create_engine(url)
    try:
        with engine.connect() as connection:
            context = EnvironmentContext(config, script, fn=upgrade)
            context.configure(connection=connection, version_table="hostedrooms_alembic_version",
                              render_as_batch=connection.dialect.name == "sqlite")
            with context.begin_transaction():
                context.run_migrations()
        outcomes[url] = "ok"
    except Exception as exc:
        outcomes[url] = f"{type(exc).__module__}.{type(exc).__qualname__}: {exc}"
    finally:
        engine.dispose()
loaded = sorted(name for name in sys.modules if name.startswith("hostedrooms"))
print(json.dumps({"outcomes": outcomes, "modules": loaded}))
"""

#: Upgrades to FROZEN after a later-looking change to the live models: a new column and a new table.
ALTERED_MODELS = """
import sys
import sqlalchemy as sa
from hostedrooms import migrate, models

models.rooms.append_column(sa.Column("sneaky", sa.Text(), nullable=False, server_default=sa.text("'x'")))
sa.Table("hosted_room_sneaky", models.metadata, sa.Column("id", sa.Integer(), primary_key=True))
revision, *targets = sys.argv[1:]
for target in targets:
    migrate.upgrade(target, revision)
"""


def _child(script: str, *args: str) -> str:
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    result = subprocess.run([sys.executable, "-c", script, *args], capture_output=True, text=True, env=env,
                            timeout=300, check=False)
    assert result.returncode == 0, result.stdout + result.stderr
    return result.stdout


def _url(target: str) -> str:
    return target if "://" in target else f"sqlite:///{target}"


def _sqlite_ddl(path: Path | str) -> str:
    """The DDL of hostedrooms' tables and indexes, as the snapshot holds it (host tables and versions left out)."""
    engine = create_engine(path)
    try:
        with engine.connect() as connection:
            rows = connection.exec_driver_sql(
                "SELECT tbl_name, sql FROM sqlite_master WHERE sql IS NOT NULL ORDER BY name").all()
    finally:
        engine.dispose()
    ours = [sql for table, sql in rows
            if not table.startswith("host_") and table not in ("alembic_version", migrate.VERSION_TABLE)]
    return "".join(f"{sql};\n" for sql in ours)


def _snapshot() -> str:
    return "".join(line for line in SNAPSHOT.read_text(encoding="utf-8").splitlines(keepends=True)
                   if not line.startswith("--"))


def _inspected(target: str) -> dict[str, Any]:
    """Every table but the version table, as the inspector sees it (columns, keys, checks, indexes)."""
    engine = create_engine(target)
    try:
        with engine.connect() as connection:
            inspector = sa.inspect(connection)
            return {table: {
                "columns": [(c["name"], str(c["type"]), c["nullable"], c["default"])
                            for c in inspector.get_columns(table)],
                "pk": inspector.get_pk_constraint(table),
                "fks": inspector.get_foreign_keys(table),
                "uniques": sorted(inspector.get_unique_constraints(table), key=lambda u: str(u["name"])),
                "checks": sorted(inspector.get_check_constraints(table), key=lambda c: str(c["name"])),
                "indexes": sorted(inspector.get_indexes(table), key=lambda i: str(i["name"])),
            } for table in sorted(inspector.get_table_names()) if table != migrate.VERSION_TABLE}
    finally:
        engine.dispose()


def _imports(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.update([node.module, *(f"{node.module}.{alias.name}" for alias in node.names)])
    return names


def test_migration_scripts_import_no_hostedrooms_module_but_errors() -> None:
    scripts = sorted(VERSIONS.rglob("*.py"))
    assert {path.name for path in scripts} >= {"0001_baseline.py", "schema_0001.py", "adoption_0001.py"}
    for path in scripts:
        ours = {name for name in _imports(path) if name == "hostedrooms" or name.startswith("hostedrooms.")}
        assert ours <= {"hostedrooms.errors", "hostedrooms.errors.HostedRoomError"}, (path, ours)


def test_every_revision_runs_with_the_live_models_unimportable(empty_target: str, tmp_path: Path) -> None:
    targets = [_url(empty_target)]
    refused: list[str] = []
    if "://" not in empty_target:  # reference files are SQLite: adopt one of each generation, refuse another
        for name, builder in GENERATIONS.items():
            builder(tmp_path / f"{name}.db")
            targets.append(_url(str(tmp_path / f"{name}.db")))
        db = build(tmp_path / "color.db", ROOMS_DRAFT.replace("disbanded_at REAL", "disbanded_at REAL, color TEXT"),
                   EVENTS_DRAFT)
        insert(db, "hosted_rooms", {"room_id": "r", "name": "n", "members_json": "[]", "next_seq": 1, "revision": 1,
                                    "created_at": 1.0, "updated_at": 1.0, "color": "blue"})
        db.close()
        refused.append(_url(str(tmp_path / "color.db")))
    report = json.loads(_child(WITHOUT_MODELS, str(migrate.script_location()), *targets, *refused))
    assert "hostedrooms.models" not in report["modules"], report["modules"]
    for target in targets:
        assert report["outcomes"][target] == "ok", (target, report["outcomes"][target])
        engine = create_engine(target)
        try:
            assert migrate.current_revision(engine) == migrate.head_revision()
            command.check(migrate.alembic_config(engine))  # what they built is exactly the models
        finally:
            engine.dispose()
    for target in refused:  # the frozen code still raises the library's error type
        assert report["outcomes"][target] == (
            "hostedrooms.errors.HostedRoomError: cannot adopt legacy table hosted_rooms: "
            "unknown columns color would be lost")


def test_changing_the_live_models_changes_no_upgrade(empty_target: str, tmp_path: Path) -> None:
    if "://" in empty_target:  # PostgreSQL: the same database upgraded with the models as shipped, then altered
        migrate.upgrade(empty_target, FROZEN)
        shipped = _inspected(empty_target)
        migrate.downgrade(empty_target, "base")
        _child(ALTERED_MODELS, FROZEN, empty_target)
        altered = _inspected(empty_target)
        assert "hosted_room_sneaky" not in altered and "sneaky" not in repr(altered["hosted_rooms"])
        assert altered == shipped
        return
    adopted = []
    for name, builder in GENERATIONS.items():
        builder(tmp_path / f"{name}.db")
        adopted.append(str(tmp_path / f"{name}.db"))
    _child(ALTERED_MODELS, FROZEN, empty_target, *adopted)
    for target in (empty_target, *adopted):
        assert migrate.current_revision(target) == FROZEN
        ddl = _sqlite_ddl(target)
        assert "sneaky" not in ddl, target  # neither the new column nor the new table reached the database
        assert ddl == _snapshot(), target


def test_the_snapshot_is_what_a_fresh_sqlite_upgrade_builds(tmp_path: Path) -> None:
    """Guards the guard: with the models as shipped, upgrading to FROZEN builds exactly the snapshot, and the
    comparison sees a one-column difference."""
    path = tmp_path / "state.db"
    migrate.upgrade(path, FROZEN)
    assert _sqlite_ddl(path) == _snapshot()
    engine = create_engine(path)
    try:
        with engine.begin() as connection:
            connection.exec_driver_sql("ALTER TABLE hosted_rooms ADD COLUMN sneaky TEXT")
    finally:
        engine.dispose()
    assert _sqlite_ddl(path) != _snapshot()

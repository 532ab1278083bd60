"""The Alembic recipe for a host application (docs/host-alembic.md), run from its own files on a fresh database.

``docs/recipes/host_alembic/`` holds the recipe: ``alembic.ini``, ``migrations/env.py`` (the one-command shape),
``myapp/models.py`` and ``migrations/versions/myapp_0001_orders.py``, a host table with a foreign key to
``hosted_rooms``. The docs show those files (the blocks must equal them); these tests copy them into a temporary
project, set ``sqlalchemy.url`` (the one line a host edits) to an EMPTY database, and run the real ``alembic``
command: hostedrooms' tables must exist before the host's revision creates its key (PostgreSQL checks the
referenced table at ``CREATE TABLE``; SQLite does not, which is why only PostgreSQL showed the bug).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import sqlalchemy as sa
from test_readme import readme_block

from hostedrooms import migrate, testing
from hostedrooms.models import metadata as hostedrooms_metadata

ROOT = next(path for path in Path(__file__).resolve().parents if (path / "pyproject.toml").is_file())
RECIPE = ROOT / "docs" / "recipes" / "host_alembic"
BIN = Path(sys.executable).parent
HOSTEDROOMS = set(hostedrooms_metadata.tables) | {migrate.VERSION_TABLE}
HOOK_LINE = ("        hostedrooms_migrate.upgrade_with_host(context, connection)"
             "  # hostedrooms first: the one-command shape\n")

pytest_plugins = ["pytester"]


def _sa_url(target: str) -> str:
    return target if "://" in target else f"sqlite:///{target}"


def _project(directory: Path, url: str, *, one_command: bool = True) -> Path:
    """The recipe's files, as they are, in ``directory``; only ``sqlalchemy.url`` names the test's database."""
    shutil.copytree(RECIPE, directory, ignore=shutil.ignore_patterns("__pycache__"))
    ini = directory / "alembic.ini"
    text, count = re.subn(r"(?m)^sqlalchemy\.url = .*$", lambda _: f"sqlalchemy.url = {url.replace('%', '%%')}",
                          ini.read_text())
    assert count == 1, "the recipe's alembic.ini must set sqlalchemy.url once"
    ini.write_text(text)
    if not one_command:
        env_py = directory / "migrations" / "env.py"
        assert HOOK_LINE in env_py.read_text(), "the recipe's env.py changed: update HOOK_LINE"
        env_py.write_text(env_py.read_text().replace(HOOK_LINE, ""))
    return directory


def _run(argv: list[str], cwd: Path, env: dict[str, str] | None = None) -> str:
    result = subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=300, check=False)
    assert result.returncode == 0, f"{argv}:\n{result.stdout}{result.stderr}"
    return result.stdout + result.stderr


def _alembic(app: Path, *args: str) -> str:
    return _run([str(BIN / "alembic"), *args], cwd=app)


def _inspect(url: str) -> tuple[set[str], list[dict[str, object]]]:
    """(the tables, the foreign keys of myapp_orders) in ``url``'s default schema."""
    engine = sa.create_engine(url)
    try:
        with engine.connect() as connection:
            inspector = sa.inspect(connection)
            tables = set(inspector.get_table_names())
            keys = inspector.get_foreign_keys("myapp_orders") if "myapp_orders" in tables else []
            return tables, [dict(key) for key in keys]
    finally:
        engine.dispose()


def _assert_the_key(url: str) -> None:
    tables, keys = _inspect(url)
    assert {"myapp_orders"} | HOSTEDROOMS <= tables
    assert [(key["name"], key["referred_table"], key["constrained_columns"], key["referred_columns"],
             dict(key["options"]).get("ondelete")) for key in keys] == [  # type: ignore[call-overload]
        ("fk_myapp_orders_room", "hosted_rooms", ["room_id"], ["room_id"], "CASCADE")]


@pytest.fixture
def fresh_url(empty_target: str) -> str:
    """An empty database (SQLite: a new file)."""
    return _sa_url(empty_target)


@pytest.fixture
def fresh_schema_url(fresh_url: str) -> str:
    """An empty schema of an empty PostgreSQL database, named by the URL's ``search_path`` (the host's tables,
    hostedrooms' and both version tables go there)."""
    engine = sa.create_engine(fresh_url)
    try:
        with engine.begin() as connection:
            connection.exec_driver_sql("CREATE SCHEMA myapp_schema")
    finally:
        engine.dispose()
    return testing.with_search_path(fresh_url, "myapp_schema")


def test_the_docs_show_the_recipe_files_as_they_are() -> None:
    """The blocks of docs/host-alembic.md are the files these tests run."""
    for name, containing in [("migrations/env.py", "def run_migrations_online"),
                             ("myapp/models.py", '"myapp_orders", metadata'),
                             ("migrations/versions/myapp_0001_orders.py", 'revision = "myapp_0001"')]:
        assert readme_block(containing) == (RECIPE / name).read_text(), name


# The tests that run the alembic command are named host_alembic_*: the fast subset (README) leaves them out.


def test_host_alembic_recipe_one_command_on_a_fresh_database(fresh_url: str, tmp_path: Path) -> None:
    _one_command(fresh_url, tmp_path)


@pytest.mark.parametrize("backend", ["postgresql"], indirect=True)
def test_host_alembic_recipe_one_command_in_a_fresh_schema(
        fresh_url: str, fresh_schema_url: str, tmp_path: Path) -> None:
    _one_command(fresh_schema_url, tmp_path)
    assert _inspect(fresh_url)[0] == set()  # all of it in the schema, nothing in public


def _one_command(fresh_url: str, tmp_path: Path) -> None:
    """hostedrooms' tables come before the host's key; check is clean; the host's downgrade leaves hostedrooms."""
    app = _project(tmp_path / "app", fresh_url)

    out = _alembic(app, "upgrade", "head")
    assert out.index("Running upgrade  -> 0001_baseline") < out.index("Running upgrade  -> myapp_0001"), out
    assert migrate.current_revision(fresh_url) == migrate.head_revision()
    _assert_the_key(fresh_url)

    out = _alembic(app, "check")
    assert "No new upgrade operations detected" in out, out

    _alembic(app, "downgrade", "-1")  # the host's revision only: hostedrooms' tables stay, at head
    tables, _ = _inspect(fresh_url)
    assert "myapp_orders" not in tables and HOSTEDROOMS <= tables
    assert migrate.current_revision(fresh_url) == migrate.head_revision()

    out = _alembic(app, "upgrade", "head")  # again: hostedrooms is at head already, the host's key comes back
    assert "0001_baseline" not in out and "Running upgrade  -> myapp_0001" in out, out
    _assert_the_key(fresh_url)


def test_host_alembic_recipe_two_commands_in_the_documented_order(fresh_url: str, tmp_path: Path) -> None:
    app = _project(tmp_path / "app", fresh_url, one_command=False)
    commands = readme_block('hostedrooms upgrade --url "$DATABASE_URL"', language="sh")
    commands = "\n".join(line.strip() for line in commands.splitlines())  # the block is indented in a list item
    env = dict(os.environ, DATABASE_URL=fresh_url, PATH=f"{BIN}{os.pathsep}{os.environ['PATH']}")

    out = _run(["bash", "-euo", "pipefail", "-c", commands], cwd=app, env=env)
    assert "Running upgrade  -> myapp_0001" in out, out
    assert migrate.current_revision(fresh_url) == migrate.head_revision()
    _assert_the_key(fresh_url)
    assert "No new upgrade operations detected" in _alembic(app, "check")


PLUGIN_TEST = '''
import pytest
import sqlalchemy as sa
import hostedrooms.testing

@pytest.fixture(scope="session")
def hostedrooms_host_setup():
    return hostedrooms.testing.host_alembic("alembic.ini")

def test_the_host_table_and_its_key_are_in_the_template(hostedrooms_engine):
    keys = sa.inspect(hostedrooms_engine).get_foreign_keys("myapp_orders")
    assert [(key["referred_table"], key["options"].get("ondelete")) for key in keys] == [("hosted_rooms", "CASCADE")]
'''


def test_host_alembic_recipe_in_the_plugin_fixture(
        pytester: pytest.Pytester, backend: str, request: pytest.FixtureRequest) -> None:
    """``hostedrooms.testing.host_alembic("alembic.ini")`` builds the template from the recipe's history."""
    for entry in RECIPE.iterdir():
        if entry.name != "__pycache__":
            copy = shutil.copytree if entry.is_dir() else shutil.copyfile
            copy(entry, pytester.path / entry.name)
    pytester.makepyfile(test_host_template=PLUGIN_TEST)
    args = ["-p", "no:cacheprovider"]
    if backend == "postgresql":
        args.append(f"--hostedrooms-postgres-url={request.getfixturevalue('pg_admin_url')}")
    pytester.runpytest_subprocess(*args).assert_outcomes(passed=1)

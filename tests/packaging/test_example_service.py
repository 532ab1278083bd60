"""The example service (``examples/chat_service``) passes its own tests, on SQLite and on PostgreSQL.

They run as its developers run them: ``python -m pytest tests`` in its folder (its own pytest configuration and
``conftest.py``, hostedrooms' pytest plugin), in a subprocess. They need the example's dependencies (FastAPI,
uvicorn, httpx: hostedrooms' ``test`` extra), and fail, not skip, without them. Among them, on both backends:
every route's error bodies checked against RFC 9457's problem-details shape, and ``since_seq=-1`` answered alike
on ``/events`` and ``/stream``. Here, too: its ``alembic upgrade head`` migrates the database named by the
service's own variable, ``$CHAT_SERVICE_DATABASE``.
"""

from __future__ import annotations

import ast
import configparser
import importlib.util
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import sqlalchemy as sa
from test_readme import readme_block

from hostedrooms import testing

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "chat_service"


def _run_example_tests(*options: str) -> subprocess.CompletedProcess[str]:
    missing = [name for name in ("fastapi", "uvicorn", "httpx") if importlib.util.find_spec(name) is None]
    assert not missing, f"the example service needs {missing}: pip install -e '.[test]'"
    # The backend is the options' alone: none of the plugin's settings from this run's environment, and none of
    # its pytest options (CI's coverage and its floor measure hostedrooms' own run).
    env = {key: value for key, value in os.environ.items()
           if not key.startswith("HOSTEDROOMS_TEST_") and key != "PYTEST_ADDOPTS"}
    return subprocess.run(
        [sys.executable, "-m", "pytest", "tests", "-q", "-rA", "-p", "no:cacheprovider", "-p", "no:xdist",
         *options],
        cwd=EXAMPLE, env=env, capture_output=True, text=True, timeout=600, check=False)


def _assert_passed(result: subprocess.CompletedProcess[str]) -> None:
    summary = result.stdout.strip().splitlines()[-1] if result.stdout.strip() else ""
    assert result.returncode == 0 and " passed" in summary and "skipped" not in summary, (
        result.stdout[-6000:] + result.stderr[-3000:])


def _assert_problems_checked(result: subprocess.CompletedProcess[str]) -> None:
    """The run checked each route's error bodies against the problem-details shape, and ``since_seq=-1`` on both
    routes that take it (``-rA`` lists every passed test)."""
    passed = {line.removeprefix("PASSED ") for line in result.stdout.splitlines() if line.startswith("PASSED ")}
    shape = "tests/test_problems.py::test_each_routes_errors_are_problem_details["
    for route in ("create", "append", "read", "stream", "webhook"):
        assert f"{shape}{route}]" in passed, (route, sorted(passed))
    assert "tests/test_problems.py::test_since_seq_minus_one_is_the_same_problem_on_every_route" in passed


def test_the_example_service_on_sqlite() -> None:
    result = _run_example_tests()
    _assert_passed(result)
    _assert_problems_checked(result)


def test_the_example_service_on_postgresql(pg_admin_url: str) -> None:
    result = _run_example_tests(f"--hostedrooms-postgres-url={pg_admin_url}")
    _assert_passed(result)
    _assert_problems_checked(result)


@pytest.fixture(params=["sqlite", "postgresql"])
def empty_database(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """A database never migrated, as the service's variable names it: a SQLite path, or a plain
    ``postgresql://`` URL (no driver named: hostedrooms picks it, for the service and its migrations alike)."""
    if request.param == "sqlite":
        yield str(tmp_path / "data" / "chat.db")
        return
    admin_url: str = request.getfixturevalue("pg_admin_url")
    with testing.postgres_database(admin_url, testing.unique_name("chat_env")) as url:
        yield sa.make_url(url).set(drivername="postgresql").render_as_string(hide_password=False)


def _run(argv: list[str], cwd: Path, database: str | None) -> None:
    env = {key: value for key, value in os.environ.items()
           if not key.startswith("HOSTEDROOMS_TEST_") and key != "CHAT_SERVICE_DATABASE"}
    if database is not None:
        env["CHAT_SERVICE_DATABASE"] = database
    result = subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=300, check=False)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]


def _service_revision(database: str) -> str | None:
    with testing.open_engine(database) as engine, engine.connect() as connection:
        tables = sa.inspect(connection).get_table_names()
        assert "chat_webhooks" in tables and "hosted_rooms" in tables
        return connection.execute(sa.text("SELECT version_num FROM alembic_version")).scalar_one_or_none()


def test_alembic_upgrade_migrates_the_database_the_services_variable_names(
        empty_database: str, tmp_path: Path) -> None:
    ini = EXAMPLE / "alembic.ini"
    parser = configparser.ConfigParser()
    parser.read(ini)
    assert not parser.has_option("alembic", "sqlalchemy.url")  # one setting: the service's variable
    # hostedrooms' schema first (the service's key refers to it: docs/host-alembic.md), then the service's history.
    _run([str(Path(sys.executable).parent / "hostedrooms"), "upgrade", "--url", empty_database], tmp_path, None)
    _run([sys.executable, "-m", "alembic", "-c", str(ini), "upgrade", "head"], tmp_path, empty_database)
    assert _service_revision(empty_database) == "chat_0001"
    assert not (tmp_path / "var").exists()  # the service's default database was never touched


def test_alembic_without_the_variable_migrates_the_services_default(tmp_path: Path) -> None:
    """Unset, the variable means ``var/chat.db`` in the working directory, for Alembic as for the service (the
    one-command shape then upgrades hostedrooms too, on SQLite)."""
    _run([sys.executable, "-m", "alembic", "-c", str(EXAMPLE / "alembic.ini"), "upgrade", "head"], tmp_path, None)
    assert _service_revision(str(tmp_path / "var" / "chat.db")) == "chat_0001"


#: What the example's env.py adds to docs/host-alembic.md's: the database is the service's own setting.
ENV_PY_SERVICE_DATABASE = """
from hostedrooms import create_engine
from chat_service.settings import database
if config.attributes.get("connection") is None:
    config.attributes["connection"] = create_engine(database(), poolclass=pool.NullPool)
"""


def test_its_env_py_is_the_documented_one() -> None:
    """The example's ``migrations/env.py`` is docs/host-alembic.md's, statement for statement (its own models imported),
    plus the block that opens the service's database."""
    readme = readme_block("def run_migrations_online").replace(
        "from myapp.models import metadata  # your application's tables",
        "from chat_service.models import metadata  # the service's tables")
    assert _statements(EXAMPLE / "migrations" / "env.py") == sorted(
        _statements(readme) + _statements(ENV_PY_SERVICE_DATABASE))


def _statements(source: Path | str) -> list[str]:
    """The statements of a module, sorted (import order and comments aside), docstring dropped."""
    tree = ast.parse(source.read_text() if isinstance(source, Path) else source)
    return sorted(ast.dump(node) for node in tree.body
                  if not (isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant)))

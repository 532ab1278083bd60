"""The example service (``examples/chat_service``) passes its own tests, on SQLite and on PostgreSQL.

They run as its developers run them: ``python -m pytest tests`` in its folder (its own pytest configuration and
``conftest.py``, hostedrooms' pytest plugin), in a subprocess. They need the example's dependencies (FastAPI,
uvicorn, httpx: hostedrooms' ``test`` extra), and fail, not skip, without them.
"""

from __future__ import annotations

import ast
import importlib.util
import os
import subprocess
import sys
from pathlib import Path

from test_readme import readme_block

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "chat_service"


def _run_example_tests(*options: str) -> subprocess.CompletedProcess[str]:
    missing = [name for name in ("fastapi", "uvicorn", "httpx") if importlib.util.find_spec(name) is None]
    assert not missing, f"the example service needs {missing}: pip install -e '.[test]'"
    # The backend is the options' alone: none of the plugin's settings from this run's environment, and none of
    # its pytest options (CI's coverage and its floor measure hostedrooms' own run).
    env = {key: value for key, value in os.environ.items()
           if not key.startswith("HOSTEDROOMS_TEST_") and key != "PYTEST_ADDOPTS"}
    return subprocess.run(
        [sys.executable, "-m", "pytest", "tests", "-q", "-p", "no:cacheprovider", "-p", "no:xdist", *options],
        cwd=EXAMPLE, env=env, capture_output=True, text=True, timeout=600, check=False)


def _assert_passed(result: subprocess.CompletedProcess[str]) -> None:
    summary = result.stdout.strip().splitlines()[-1] if result.stdout.strip() else ""
    assert result.returncode == 0 and " passed" in summary and "skipped" not in summary, (
        result.stdout[-6000:] + result.stderr[-3000:])


def test_the_example_service_on_sqlite() -> None:
    _assert_passed(_run_example_tests())


def test_the_example_service_on_postgresql(pg_admin_url: str) -> None:
    _assert_passed(_run_example_tests(f"--hostedrooms-postgres-url={pg_admin_url}"))


def test_its_env_py_is_the_readmes() -> None:
    """The example's ``migrations/env.py`` is the README's, statement for statement (its own models imported)."""
    readme = readme_block("def run_migrations_online").replace(
        "from myapp.models import metadata  # your application's tables",
        "from chat_service.models import metadata  # the service's tables")
    assert _statements(EXAMPLE / "migrations" / "env.py") == _statements(readme)


def _statements(source: Path | str) -> list[str]:
    """The statements of a module, sorted (import order and comments aside), docstring dropped."""
    tree = ast.parse(source.read_text() if isinstance(source, Path) else source)
    return sorted(ast.dump(node) for node in tree.body
                  if not (isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant)))

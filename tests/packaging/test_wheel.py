"""The distributions: the wheel works installed in a fresh venv (library, console script, ``alembic``), and the
source distribution carries what its own tests need. Both come from one ``python -m build``, which builds the
wheel from the sdist, as a user's installer does."""

from __future__ import annotations

import os
import re
import shutil
import sqlite3
import subprocess
import sys
import tarfile
import venv
from pathlib import Path

import pytest
from test_readme import marked_block, readme_block

ROOT = Path(__file__).resolve().parents[2]

SCRIPT = """
import sqlite3, sys
from pathlib import Path
import hostedrooms
from hostedrooms import migrate
assert "site-packages" in hostedrooms.__file__, hostedrooms.__file__
print(migrate.script_location())
migrate.upgrade(sys.argv[1])
assert migrate.current_revision(sys.argv[1]) == migrate.head_revision() is not None
tables = {row[0] for row in sqlite3.connect(sys.argv[1]).execute("SELECT name FROM sqlite_master WHERE type='table'")}
assert {"hosted_rooms", "hosted_room_events", "secure_peer_deliveries", "hostedrooms_alembic_version"} <= tables
print("ok", migrate.head_revision())
"""


def _env(**extra: str) -> dict[str, str]:
    env = {key: value for key, value in os.environ.items()
           if key not in ("PYTHONPATH", "VIRTUAL_ENV", "PYTEST_ADDOPTS", "PYTEST_XDIST_WORKER",
                          "HOSTEDROOMS_TEST_POSTGRES_URL", "HOSTEDROOMS_DATABASE_URL")}
    env.update(extra)
    return env


def _run(argv: list[str], cwd: Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(argv, cwd=cwd, env=env or _env(), capture_output=True, text=True, timeout=600,
                            check=False)
    assert result.returncode == 0, result.stdout + result.stderr
    return result


@pytest.fixture(scope="module")
def dists(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, str]:
    """(sdist, wheel, build log) from ``python -m build`` (the wheel is built from the unpacked sdist)."""
    out = tmp_path_factory.mktemp("dist")
    # Build from a copy: setuptools writes hostedrooms.egg-info into the source tree, and two xdist workers
    # building from the checkout at once would race on it.
    source = tmp_path_factory.mktemp("source") / "hostedrooms"
    shutil.copytree(ROOT, source, ignore=shutil.ignore_patterns(
        ".git", ".venv", "*.egg-info", "build", "dist", "__pycache__", ".*_cache", ".hypothesis"))
    result = _run([sys.executable, "-m", "build", "-o", str(out), str(source)], cwd=out)
    (sdist,) = out.glob("hostedrooms-*.tar.gz")
    (wheel,) = out.glob("hostedrooms-*.whl")
    return sdist, wheel, result.stdout + result.stderr


def test_the_build_has_no_deprecation_warning(dists: tuple[Path, Path, str]) -> None:
    sdist, _, log = dists
    assert "deprecat" not in log.lower(), log
    with tarfile.open(sdist) as archive:
        metadata = archive.extractfile(f"{sdist.name.removesuffix('.tar.gz')}/PKG-INFO")
        assert metadata is not None
        headers = metadata.read().decode()
    assert "License-Expression: MIT" in headers and "License-File: LICENSE" in headers


def test_upgrade_from_an_installed_wheel_in_a_fresh_venv(dists: tuple[Path, Path, str], tmp_path: Path) -> None:
    _, wheel, _ = dists
    env_dir = tmp_path / "venv"
    venv.EnvBuilder(with_pip=True).create(env_dir)
    python = env_dir / "bin" / "python"
    _run([str(python), "-m", "pip", "install", "-q", str(wheel)], cwd=tmp_path)
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    result = _run([str(python), "-c", SCRIPT, str(outside / "state.db")], cwd=outside)
    location = result.stdout.splitlines()[0]
    assert "site-packages" in location and str(ROOT) not in location
    assert result.stdout.splitlines()[-1].startswith("ok ")

    # The README's commands, as written: `hostedrooms alembic-ini`, then the `alembic` command on it.
    on_path = _env(PATH=f"{env_dir / 'bin'}{os.pathsep}{os.environ['PATH']}")
    generated = outside / "generated"
    generated.mkdir()
    result = _run(["bash", "-euo", "pipefail", "-c", marked_block("wheel-alembic")], cwd=generated, env=on_path)
    log = result.stdout + result.stderr
    assert "script_location = hostedrooms:_migrations" in (generated / "hostedrooms-alembic.ini").read_text()
    assert "Running upgrade  -> 0001_baseline" in log, log  # env.py logs through the ini's logging sections
    head = result.stdout.splitlines()[-1]
    assert head.endswith("(head)"), log

    # The one line the README says matters, in a file written by hand.
    handwritten = outside / "handwritten"
    handwritten.mkdir()
    (handwritten / "alembic.ini").write_text(readme_block("script_location = hostedrooms:_migrations", "ini"))
    _run([str(env_dir / "bin" / "alembic"), "-x", "url=sqlite:///by-hand.db", "upgrade", "head"], cwd=handwritten)
    with sqlite3.connect(handwritten / "by-hand.db") as connection:
        (revision,) = connection.execute("SELECT version_num FROM hostedrooms_alembic_version").fetchone()
    assert revision == head.split()[0]


def test_the_sdist_runs_its_own_tests(dists: tuple[Path, Path, str], tmp_path: Path) -> None:
    sdist, _, _ = dists
    with tarfile.open(sdist) as archive:
        archive.extractall(tmp_path, filter="data")
    tree = tmp_path / sdist.name.removesuffix(".tar.gz")
    def test_files(top: Path) -> set[str]:
        return {str(path.relative_to(top)) for path in (top / "tests").rglob("*")
                if path.suffix in (".py", ".sql") and "__pycache__" not in path.parts}

    assert test_files(tree) == test_files(ROOT)  # snapshots and typing cases included
    assert (tree / "alembic.ini").is_file()
    env = _env(PYTHONPATH=str(tree))  # the unpacked tree's hostedrooms, not this checkout's
    result = _run([sys.executable, "-c", "import hostedrooms; print(hostedrooms.__file__)"], cwd=tree, env=env)
    assert result.stdout.strip() == str(tree / "hostedrooms" / "__init__.py")
    result = _run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "--collect-only", "-q"],
                  cwd=tree, env=env)
    summary = result.stdout.strip().splitlines()[-1]
    assert re.fullmatch(r"\d+/\d+ tests collected \(\d+ deselected\) in [\d.]+s", summary), summary  # no error
    result = _run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", "-k", "not postgresql",
                   "tests/migrations/test_migrations.py", "tests/packaging/test_readme.py"],
                  cwd=tree, env=env)
    assert " passed" in result.stdout and "failed" not in result.stdout, result.stdout


if sys.platform == "win32":  # pragma: no cover
    pytestmark = pytest.mark.skip("POSIX venv layout")

"""The migrations run from an installed wheel, not only from a checkout."""

from __future__ import annotations

import os
import subprocess
import sys
import venv
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

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


def _run(argv: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {key: value for key, value in os.environ.items() if key not in ("PYTHONPATH", "VIRTUAL_ENV")}
    result = subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=600, check=False)
    assert result.returncode == 0, result.stdout + result.stderr
    return result


def test_upgrade_from_an_installed_wheel_in_a_fresh_venv(tmp_path: Path) -> None:
    wheels = tmp_path / "wheels"
    _run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(wheels), str(ROOT)], cwd=tmp_path)
    (wheel,) = wheels.glob("hostedrooms-*.whl")
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


if sys.platform == "win32":  # pragma: no cover
    pytestmark = pytest.mark.skip("POSIX venv layout")

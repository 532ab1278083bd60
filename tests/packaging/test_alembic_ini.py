"""The ``alembic`` command line: what a deploy log shows, the generated ``alembic.ini``, and library calls that
leave the host process's logging alone. (From an installed wheel: tests/packaging/test_wheel.py.)"""

from __future__ import annotations

import logging
import subprocess
import sys
from pathlib import Path

import pytest
from alembic import command
from alembic.config import Config

from hostedrooms import cli, migrate
from hostedrooms.db import create_engine

ROOT = Path(__file__).resolve().parents[2]
ALEMBIC = str(Path(sys.executable).parent / "alembic")


def _alembic(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess[str]:
    result = subprocess.run([ALEMBIC, *args], cwd=cwd, capture_output=True, text=True, timeout=300, check=False)
    assert result.returncode == 0, result.stdout + result.stderr
    return result


def test_checkout_alembic_prints_each_revision_it_runs(tmp_path: Path) -> None:
    result = _alembic("-x", f"url=sqlite:///{tmp_path / 'fresh.db'}", "upgrade", "head")
    assert "Running upgrade  -> 0001_baseline" in result.stderr, result.stderr
    assert f"-> {migrate.head_revision()}" in result.stderr


def test_generated_ini_drives_this_installation(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    ini = tmp_path / "hostedrooms-alembic.ini"
    assert cli.main(["alembic-ini", str(ini)]) == 0
    assert f"wrote {ini}" in capsys.readouterr().out
    # An editable install (this checkout) has no hostedrooms/_migrations: the absolute path of alembic/.
    assert Config(str(ini)).get_main_option("script_location") == str(migrate.script_location())
    result = _alembic("-c", str(ini), "-x", f"url=sqlite:///{tmp_path / 'state.db'}", "upgrade", "head", cwd=tmp_path)
    assert "Running upgrade  -> 0001_baseline" in result.stderr, result.stderr
    assert migrate.current_revision(tmp_path / "state.db") == migrate.head_revision()
    result = _alembic("-c", str(ini), "-x", f"url=sqlite:///{tmp_path / 'state.db'}", "check", cwd=tmp_path)
    assert "No new upgrade operations detected" in result.stdout + result.stderr


def test_generated_ini_never_replaces_a_file_unless_forced(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    Path("alembic.ini").write_text("[alembic]\nscript_location = the host's own\n")
    assert cli.main(["alembic-ini"]) == 1
    assert capsys.readouterr().err == "hostedrooms: error: alembic.ini exists; pass --force to replace it\n"
    assert "the host's own" in Path("alembic.ini").read_text()
    assert cli.main(["alembic-ini", "--force"]) == 0
    assert Config("alembic.ini").get_main_option("sqlalchemy.url") == "sqlite:///state.db"


def test_generated_ini_to_stdout_with_a_url(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    url = "postgresql://deploy:p%25ss@db.example:5432/rooms"  # a percent-encoded password survives the ini
    assert cli.main(["alembic-ini", "-", "--url", url]) == 0
    ini = tmp_path / "out.ini"
    ini.write_text(capsys.readouterr().out)
    assert Config(str(ini)).get_main_option("sqlalchemy.url") == "postgresql+psycopg://deploy:p%25ss@db.example:5432/rooms"
    assert cli.main(["alembic-ini", "-", "--url", str(tmp_path / "a.db")]) == 0
    assert f"sqlalchemy.url = sqlite:///{tmp_path / 'a.db'}\n" in capsys.readouterr().out


def _logging_state() -> tuple[object, ...]:
    root = logging.getLogger()
    host = logging.getLogger("hostapp.worker")
    alembic_logger = logging.getLogger("alembic")
    return (root.level, tuple(root.handlers), host.disabled, tuple(host.handlers), alembic_logger.level,
            tuple(alembic_logger.handlers), alembic_logger.disabled)


def test_library_calls_leave_the_host_logging_alone(tmp_path: Path) -> None:
    host = logging.getLogger("hostapp.worker")
    handler = logging.NullHandler()
    host.addHandler(handler)
    try:
        before = _logging_state()
        migrate.upgrade(tmp_path / "a.db")
        migrate.downgrade(tmp_path / "a.db", "base")
        engine = create_engine(tmp_path / "b.db")
        try:
            command.upgrade(migrate.alembic_config(engine), "head")  # env.py, with a Config built in code
            config = Config(str(ROOT / "alembic.ini"))  # a file with logging sections, but opted out
            config.attributes["configure_logger"] = False
            config.attributes["connection"] = engine
            command.downgrade(config, "base")
        finally:
            engine.dispose()
        assert _logging_state() == before
    finally:
        host.removeHandler(handler)

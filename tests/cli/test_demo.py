"""`hostedrooms demo` runs the whole failover story and exits 0, on SQLite files and on PostgreSQL."""

from __future__ import annotations

import io
from pathlib import Path

import pytest

from hostedrooms import HostedRoomError, verify
from hostedrooms.cli import main
from hostedrooms.demo import run_demo
from hostedrooms.testing import create_database, drop_database, unique_name


def _assert_story(text: str) -> None:
    assert "every step held" in text
    assert "refused: AuthorityConflictError" in text
    assert text.count(": clean") == 2
    assert "authority.claimed" in text and "authority.lost" in text
    # The automatic part: a Replicator, failover, and the returning authority demoted by a replicator.
    assert "retro    disbanded  1 new event in 1 page" in text
    assert "design   promoted at epoch 2" in text and "ops      promoted at epoch 2" in text
    assert "retro    not promoted (disbanded)" in text
    assert "design   demoted" in text and "ops      demoted" in text
    assert "A's stale write to 'design': refused: AuthorityConflictError" in text


def test_demo_on_sqlite_files(tmp_path: Path) -> None:
    out = io.StringIO()
    assert run_demo(directory=str(tmp_path), url_a=None, url_b=None, out=out) == 0
    _assert_story(out.getvalue())
    assert verify(tmp_path / "gateway-a.db") == [] and verify(tmp_path / "gateway-b.db") == []
    with pytest.raises(HostedRoomError, match="empty databases"):  # a second run refuses to mix stories
        run_demo(directory=str(tmp_path), url_a=None, url_b=None, out=io.StringIO())


def test_demo_command_in_a_temporary_folder(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["demo"]) == 0
    _assert_story(capsys.readouterr().out)


def test_demo_on_postgresql(pg_admin_url: str, capsys: pytest.CaptureFixture[str]) -> None:
    names = [unique_name("demo_a"), unique_name("demo_b")]
    url_a, url_b = (create_database(pg_admin_url, name) for name in names)
    try:
        assert main(["demo", "--url-a", url_a, "--url-b", url_b]) == 0
        _assert_story(capsys.readouterr().out)
    finally:
        for name in names:
            drop_database(pg_admin_url, name)

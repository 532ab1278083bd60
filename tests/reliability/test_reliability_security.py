"""Security checks that cut across modules.

* No SQL is built from input: ruff's S608 (string-built SQL) is clean over the package, and the same check does
  flag a string-built statement (so it would catch one).
* Grants never reach logs: with SQLAlchemy's echo at DEBUG (statements, parameters and result rows) and every
  ``sqlalchemy`` logger at DEBUG, writing, replacing, listing, updating and deleting room links, and a failing
  link write, never print a grant; the same capture does show a grant that an ordinary query on a plain
  SQLAlchemy engine returns. (Every other secret is covered by tests/reliability/test_reliability_secrets.py.)
* Owner-private ledger files are covered by tests/services/test_ledger_storage.py (0700 directory, 0600 regular
  file with one link, refused symlinks/hard links/foreign owners, re-checked before every transaction) and
  tests/engines/test_files.py (no lock-dropping descriptors, symlinks never followed, shared directories never
  changed).
"""

from __future__ import annotations

import logging
import shutil
import subprocess
import sys
from functools import partial
from pathlib import Path
from typing import Any

import factories
import pytest
import sqlalchemy as sa
from factories import captured

import hostedrooms
from hostedrooms import models, peers
from hostedrooms.errors import StorageError

ROOT = Path(__file__).resolve().parents[2]
GRANT = "grant-9c1e-secret-value"


def ruff() -> str:
    found = shutil.which("ruff") or str(Path(sys.executable).with_name("ruff"))
    if not Path(found).exists():
        pytest.skip("ruff is not installed (CI runs `ruff check`, which selects S608)")
    return found


def run_s608(*paths: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([ruff(), "check", "--no-cache", "--select", "S608", *paths], cwd=ROOT,
                          capture_output=True, text=True, timeout=120, check=False)


def test_no_sql_is_built_from_strings_in_the_package() -> None:
    result = run_s608("hostedrooms", "alembic")
    assert result.returncode == 0, result.stdout + result.stderr


def test_the_s608_check_does_flag_string_built_sql(tmp_path: Path) -> None:
    sample = tmp_path / "bad.py"
    sample.write_text('def query(name: str) -> str:\n    return f"SELECT * FROM rooms WHERE name = \'{name}\'"\n')
    result = run_s608(str(sample))
    assert result.returncode != 0 and "S608" in result.stdout


link = partial(factories.link, grant=GRANT)


@pytest.fixture
def echoing(target: str, caplog: pytest.LogCaptureFixture) -> Any:
    """An engine echoing every statement, parameter set and row, with all SQLAlchemy loggers at DEBUG."""
    caplog.set_level(logging.DEBUG)
    for name in ("sqlalchemy", "sqlalchemy.engine", "sqlalchemy.pool", "sqlalchemy.orm"):
        caplog.set_level(logging.DEBUG, logger=name)
    engine = hostedrooms.create_engine(target, echo="debug", echo_pool="debug")
    try:
        yield engine
    finally:
        engine.dispose()


def test_link_operations_never_log_a_grant(
    echoing: sa.Engine, capfd: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture
) -> None:
    peers.upsert_room_link_record(echoing, record=link(), max_links=5)
    peers.upsert_room_link_record(echoing, record=link(status="down"), max_links=5)  # replace
    peers.upsert_room_link_record(echoing, record=link("m2"), max_links=5)
    assert [row["grant"] for row in peers.list_room_link_records(echoing)] == [GRANT, GRANT]
    assert peers.update_room_link_status(echoing, room_id="room-1", member_id="m1", status="ok", now=11.0)
    assert peers.delete_room_link_records(echoing, room_id="room-1") == 2
    text = captured(capfd, caplog)
    assert "hosted_room_links" in text  # the capture works: statements were logged
    assert GRANT not in text


def test_a_failing_link_write_never_logs_or_raises_a_grant(
    echoing: sa.Engine, capfd: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture
) -> None:
    def refuse(*_args: Any) -> None:
        raise echoing.dialect.loaded_dbapi.OperationalError("injected fault")

    # Fail the upsert itself (the statement binding the grant), after the lock and the cap count.
    statements: list[str] = []

    def before(_conn: Any, _cursor: Any, statement: str, *_args: Any) -> None:
        statements.append(statement)
        if statement.lstrip().upper().startswith("INSERT INTO HOSTED_ROOM_LINKS"):
            refuse()

    sa.event.listen(echoing, "before_cursor_execute", before)
    try:
        with pytest.raises(StorageError) as caught:
            peers.upsert_room_link_record(echoing, record=link(), max_links=5)
    finally:
        sa.event.remove(echoing, "before_cursor_execute", before)
    assert any(s.lstrip().upper().startswith("INSERT INTO HOSTED_ROOM_LINKS") for s in statements)
    text = captured(capfd, caplog)
    assert GRANT not in text
    assert GRANT not in f"{caught.value}{caught.value!r}{caught.value.args!r}"
    assert caught.value.__cause__ is None and caught.value.__context__ is None
    assert peers.list_room_link_records(echoing) == []


def test_the_log_capture_would_show_a_grant(
    echoing: sa.Engine, target: str, capfd: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture
) -> None:
    """Control: an ordinary query of the links table on a plain SQLAlchemy engine (one hostedrooms never built
    nor adopted, so its rows are logged at DEBUG) does log the grant row."""
    peers.upsert_room_link_record(echoing, record=link(), max_links=5)
    plain = sa.create_engine(hostedrooms.db.resolve_url(target), echo="debug")
    try:
        with plain.connect() as connection:
            assert connection.execute(sa.select(models.links.c.grant)).scalar_one() == GRANT
    finally:
        plain.dispose()
    assert GRANT in captured(capfd, caplog)

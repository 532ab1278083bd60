"""Revision 0012: on SQLite the duplicate cursor index keeps its name (the reference's readiness check asks for it)
and indexes no row, so appends no longer write it; downgrade builds it again. Nothing changes on PostgreSQL."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest
import sqlalchemy as sa
from test_legacy_schemas import EVENTS_CURRENT, EVENTS_CURSOR, ROOMS_CURRENT, build, insert

from hostedrooms import create_engine, migrate, rooms

CURSOR = "idx_hosted_room_events_cursor"
# What the reference asks on every open before it trusts the schema (restated from its behaviour).
READINESS = f"SELECT 1 FROM sqlite_master WHERE type='index' AND name='{CURSOR}'"
BEFORE = "0011_pooler_append_functions"
GATEWAY = "g1"


def _cursor_cells(path: Path) -> int:
    """Index entries stored in the cursor index's pages (dbstat: every page of every b-tree)."""
    with sqlite3.connect(path) as connection:
        return int(connection.execute("SELECT coalesce(sum(ncell), 0) FROM dbstat WHERE name = ?",
                                      (CURSOR,)).fetchone()[0])


def _cursor_sql(path: Path) -> str | None:
    with sqlite3.connect(path) as connection:
        row = connection.execute("SELECT sql FROM sqlite_master WHERE name = ?", (CURSOR,)).fetchone()
    return None if row is None else str(row[0])


def _append(url: str, count: int) -> None:
    engine = create_engine(url)
    try:
        rooms.create_room(engine, room_id="r", name="R", members=[], authority_gateway_id=GATEWAY)
        rooms.append_events(engine, "r", [{"event_id": f"e{index}", "kind": "message.user",
                                           "actor": {"kind": "user", "id": "u"}, "payload": {"n": index}}
                                          for index in range(count)], GATEWAY, 1)
    finally:
        engine.dispose()


def test_fresh_sqlite_keeps_the_name_and_stores_no_entry(tmp_path: Path) -> None:
    path = tmp_path / "state.db"
    migrate.upgrade(f"sqlite:///{path}")
    _append(f"sqlite:///{path}", 300)
    with sqlite3.connect(path) as connection:
        assert connection.execute(READINESS).fetchone() is not None
        # The reference's own schema step then changes nothing.
        connection.execute(EVENTS_CURSOR.replace("CREATE INDEX", "CREATE INDEX IF NOT EXISTS"))
        plan = " ".join(str(row) for row in connection.execute(
            "EXPLAIN QUERY PLAN SELECT * FROM hosted_room_events WHERE room_id = 'r' AND seq > 5 ORDER BY seq"))
    assert _cursor_cells(path) == 0
    assert CURSOR not in plan and "sqlite_autoindex_hosted_room_events_1" in plan
    assert (_cursor_sql(path) or "").endswith("WHERE 0")


def test_a_reference_file_loses_the_entries_and_gets_them_back_on_downgrade(tmp_path: Path) -> None:
    path = tmp_path / "state.db"
    connection = build(path, ROOMS_CURRENT, EVENTS_CURRENT, EVENTS_CURSOR)
    insert(connection, "hosted_rooms", {"room_id": "r", "name": "R", "members_json": "[]",
                                        "authority_gateway_id": GATEWAY, "next_seq": 41,
                                        "event_bytes": 0, "created_at": 1.0, "updated_at": 1.0})
    for seq in range(1, 41):
        insert(connection, "hosted_room_events", {
            "room_id": "r", "seq": seq, "event_id": f"e{seq}", "kind": "message.user",
            "actor_json": '{"id":"u","kind":"user"}', "authority_epoch": 1, "payload_json": "{}",
            "created_at": 1.0})
    connection.commit()
    connection.close()
    url = f"sqlite:///{path}"
    assert _cursor_cells(path) == 40
    migrate.upgrade(url, BEFORE)
    assert _cursor_cells(path) == 40  # the releases before 0012 keep the reference's index whole
    migrate.upgrade(url)
    assert _cursor_cells(path) == 0
    assert (_cursor_sql(path) or "").endswith("WHERE 0")
    migrate.downgrade(url, BEFORE)
    assert _cursor_cells(path) == 40
    assert "WHERE" not in (_cursor_sql(path) or "WHERE")
    with sqlite3.connect(path) as check:
        assert check.execute("SELECT count(*) FROM hosted_room_events").fetchone()[0] == 40
        assert check.execute(READINESS).fetchone() is not None


@pytest.mark.parametrize("backend", ["postgresql"], indirect=True)
def test_postgresql_has_no_cursor_index_before_or_after(empty_target: str) -> None:
    for revision in (BEFORE, "head"):
        migrate.upgrade(empty_target, revision)
        engine = sa.create_engine(empty_target)
        try:
            with engine.connect() as connection:
                names = {index["name"] for index in sa.inspect(connection).get_indexes("hosted_room_events")}
        finally:
            engine.dispose()
        assert CURSOR not in names

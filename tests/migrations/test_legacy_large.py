"""A large draft-layout reference file (200,000 events) is adopted with bounded memory: the backfills run a
batch of rooms/rows per statement and the rebuild copies inside SQLite, never loading all rows into Python."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from test_legacy_schemas import EVENTS_DRAFT, ROOMS_DRAFT, build

from hostedrooms import migrate

EVENTS = 200_000
ROOMS = 200
CHILD = """
import resource, sys, time
from hostedrooms import migrate
from hostedrooms.db import create_engine
engine = create_engine(sys.argv[1])
with engine.connect() as connection:
    connection.exec_driver_sql("SELECT 1")
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
started = time.perf_counter()
migrate.upgrade(engine)
print(time.perf_counter() - started, before, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)
"""


@pytest.mark.slow
def test_large_reference_file_adopts_with_bounded_memory(tmp_path: Path) -> None:
    path = tmp_path / "state.db"
    db = build(path, ROOMS_DRAFT, EVENTS_DRAFT)
    per_room = EVENTS // ROOMS
    payload = json.dumps({"text": "ünïcode ☃ " * 40}, ensure_ascii=False)
    db.execute("BEGIN")
    for room in range(ROOMS):
        db.execute("INSERT INTO hosted_rooms (room_id, name, members_json, next_seq, created_at, updated_at) "
                   "VALUES (?, ?, '[]', ?, 1.0, 1.0)", (f"room-{room:04d}", f"Room {room}", per_room + 1))
        db.executemany("INSERT INTO hosted_room_events (room_id, seq, event_id, kind, payload_json, created_at) "
                       "VALUES (?, ?, ?, 'message.user', ?, 1.0)",
                       ((f"room-{room:04d}", seq, f"e{seq}", payload) for seq in range(1, per_room + 1)))
    db.execute("COMMIT")
    db.close()
    size_mb = path.stat().st_size / 2**20
    out = subprocess.run([sys.executable, "-c", CHILD, str(path)], capture_output=True, text=True, check=True,
                         cwd=Path(migrate.__file__).resolve().parent.parent, timeout=600).stdout
    seconds, before_kb, after_kb = (float(v) for v in out.split())
    growth_mb = (after_kb - before_kb) / 1024
    print(f"\nadopted {EVENTS} events in {ROOMS} rooms ({size_mb:.0f} MB file) in {seconds:.1f} s; "
          f"peak RSS grew by {growth_mb:.1f} MB")
    assert growth_mb < max(64.0, size_mb / 2), "memory grew with the database: something loads all rows"
    db = build(path)
    try:
        expected = per_room * (len("e1") + len("message.user") + len('{"id":"legacy","kind":"system"}')
                               + len(payload.encode("utf-8")))
        digits = sum(len(f"e{seq}") - 2 for seq in range(1, per_room + 1))
        totals = {row[0] for row in db.execute("SELECT event_bytes FROM hosted_rooms")}
        assert totals == {expected + digits}
        assert db.execute("SELECT count(*) FROM hosted_room_events").fetchone() == (EVENTS,)
    finally:
        db.close()

"""list_rooms on many rooms: the pages are the plain listing's, with the listing index and without it, and both
planners read the page from the index instead of sorting every room (so the first page costs the same at any
room count; bench/run.py --scale measures it)."""

from __future__ import annotations

import json
from typing import Any

import sqlalchemy as sa
from sqlalchemy import Engine

from hostedrooms import models, rooms
from hostedrooms.backends import backend_for
from hostedrooms.store import room_store

GATEWAY = "g1"
INDEX = "idx_hosted_rooms_updated"
# Ids that sort differently by code point and by a locale's collation.
_STEMS = ["a", "B", "b", "Z", "z", "é", "a-", "a.", "_", "~"]


def _seed(engine: Engine, count: int) -> None:
    """``count`` rooms written in one statement: many share an ``updated_at`` (the id decides among them), about
    a quarter are disbanded, some of those the most recently changed."""
    rows = []
    for index in range(count):
        disbanded = index % 4 == 0
        updated = 1000.0 + (index * 7) % 40 + (0.5 if disbanded and index % 8 == 0 else 0.0)
        rows.append({"room_id": f"{_STEMS[index % len(_STEMS)]}{index:05}"[::-1 if index % 3 else 1],
                     "name": f"Room {index}", "members_json": json.dumps([{"id": f"m{index % 3}"}]),
                     "authority_gateway_id": GATEWAY, "authority_epoch": 1, "next_seq": 1 + index % 5,
                     "event_bytes": 0, "revision": 1, "created_at": 900.0, "updated_at": updated,
                     "disbanded_at": updated if disbanded else None})
    with engine.begin() as connection:
        connection.execute(sa.insert(models.rooms), rows)
        if connection.dialect.name == "postgresql":
            connection.exec_driver_sql("ANALYZE hosted_rooms")


def _plain(engine: Engine, include_disbanded: bool, limit: int, offset: int) -> list[dict[str, Any]]:
    """The reference's listing, sorted here: most recent change first, then room id code point by code point."""
    with engine.connect() as connection:
        rows = connection.execute(sa.select(models.rooms)).mappings().all()
    rows = sorted((row for row in rows if include_disbanded or row["disbanded_at"] is None),
                  key=lambda row: (-row["updated_at"], row["room_id"]))
    return [{"room_id": row["room_id"], "updated_at": float(row["updated_at"]), "latest_seq": row["next_seq"] - 1}
            for row in rows[offset:offset + limit]]


_PAGES = [(500, 0), (10, 0), (1, 0), (7, 3), (50, 120), (500, 500), (3, 1495), (10, 5000)]


def _pages(engine: Engine) -> list[str]:
    return [json.dumps(rooms.list_rooms(engine, include_disbanded=include_disbanded, limit=limit, offset=offset))
            for include_disbanded in (False, True) for limit, offset in _PAGES]


def test_pages_on_many_rooms_are_the_same_with_and_without_the_index(engine: Engine) -> None:
    _seed(engine, 1500)
    indexed = _pages(engine)
    expected = [_plain(engine, include_disbanded, limit, offset)
                for include_disbanded in (False, True) for limit, offset in _PAGES]
    assert [[{key: room[key] for key in ("room_id", "updated_at", "latest_seq")} for room in json.loads(page)]
            for page in indexed] == expected
    assert sum(len(page) for page in expected) > 1000  # (not vacuous)
    with engine.begin() as connection:
        connection.execute(sa.text(f"DROP INDEX {INDEX}"))
    try:
        assert _pages(engine) == indexed  # byte for byte, every field
    finally:
        with engine.begin() as connection:
            connection.execute(sa.text(f"CREATE INDEX {INDEX} ON hosted_rooms (updated_at)"))


def test_the_first_page_is_read_from_the_listing_index(engine: Engine) -> None:
    _seed(engine, 1500)
    for include_disbanded in (False, True):
        statement = room_store(backend_for(engine))._list_rooms[include_disbanded].statement
        with engine.connect() as connection:
            compiled = statement.compile(dialect=connection.dialect)
            values = compiled.construct_params({"limit": 20, "offset": 0})
            if connection.dialect.name == "sqlite":
                positional = tuple(values[name] for name in compiled.positiontup or ())
                plan = connection.exec_driver_sql(f"EXPLAIN QUERY PLAN {compiled.string}", positional).all()
                text = " ".join(str(row[-1]) for row in plan)
            else:
                connection.exec_driver_sql("SET LOCAL enable_seqscan = off")  # the primary key scan stays possible
                plan = connection.exec_driver_sql(f"EXPLAIN {compiled.string}", values).all()
                text = " ".join(str(row[0]) for row in plan)
        assert INDEX in text, text
        assert "TEMP B-TREE FOR ORDER BY" not in text and "->  Sort  (" not in text, text

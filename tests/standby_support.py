"""Helpers of the standby tests: authority-side builders and log readers (the fixtures are in
standby_fixtures.py, which a test module loads with ``pytest_plugins = ["standby_fixtures"]``)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import sqlalchemy as sa
from sqlalchemy import Engine

from hostedrooms import rooms
from hostedrooms.models import replica_events, replicas

GATEWAY_A = "install:gw-a"
GATEWAY_B = "install:gw-b"
GATEWAY_C = "install:gw-c"
USER = {"kind": "user", "id": "u1"}
MEMBERS = [{"id": "bot-1"}]


def host(engine: Engine, room_id: str, events: int = 0, *, gateway: str = GATEWAY_A, epoch: int = 1,
         name: str | None = None, prefix: str = "e") -> None:
    """Create ``room_id`` owned by ``gateway`` and append ``events`` user messages (in batches)."""
    rooms.create_room(engine, room_id=room_id, name=name or room_id.title(), members=MEMBERS,
                      authority_gateway_id=gateway, now=1.0)
    say(engine, room_id, events, gateway=gateway, epoch=epoch, prefix=prefix)


def say(engine: Engine, room_id: str, count: int, *, gateway: str = GATEWAY_A, epoch: int = 1,
        prefix: str = "e") -> None:
    """Append ``count`` user messages with ids ``{prefix}-{room}-{n}`` (n continuing from the log's length)."""
    start = int(rooms.room_state(engine, room_id=room_id).get("latest_seq", 0))
    for first in range(0, count, 500):
        batch = [{"event_id": f"{prefix}-{room_id}-{start + n}", "kind": "message.user", "actor": USER,
                  "payload": {"n": start + n}} for n in range(first, min(count, first + 500))]
        rooms.append_events(engine, room_id, batch, gateway, epoch)


def room_log(engine: Engine, room_id: str) -> list[tuple[Any, ...]]:
    """The authority's log as (seq, event_id, kind, actor, epoch, payload) rows, read through read_events."""
    rows: list[tuple[Any, ...]] = []
    since = 0
    while True:
        page = rooms.read_events(engine, room_id=room_id, since_seq=since, limit=500, include_disbanded=True)
        rows += [(event["seq"], event["event_id"], event["kind"], event["actor"], event["authority_epoch"],
                  event["payload"]) for event in page["events"]]
        since = page["cursor"]
        if not page["has_more"]:
            return rows


def replica_log(engine: Engine, room_id: str) -> list[tuple[Any, ...]]:
    """A replica's stored log in the same shape (the store offers no reader of replica events: read the table)."""
    import json

    with engine.connect() as connection:
        rows = connection.execute(
            sa.select(replica_events.c.seq, replica_events.c.event_id, replica_events.c.kind,
                      replica_events.c.actor_json, replica_events.c.authority_epoch, replica_events.c.payload_json)
            .where(replica_events.c.room_id == room_id).order_by(replica_events.c.seq)).all()
    return [(row[0], row[1], row[2], json.loads(row[3]), row[4], json.loads(row[5])) for row in rows]


def replica_ids(engine: Engine) -> list[str]:
    with engine.connect() as connection:
        return sorted(connection.execute(sa.select(replicas.c.room_id)).scalars())


_extra: dict[int, tuple[str, str]] = {}


def extra_store(beside: str, name: str = "extra") -> Engine:
    """One more empty migrated store of the same backend as ``beside``."""
    import os

    from sqlalchemy import make_url

    from hostedrooms import create_engine, migrate
    from hostedrooms.testing import create_database, unique_name

    if "://" not in beside:
        path = os.path.join(os.path.dirname(beside), f"{name}.db")
        engine = create_engine(path)
        migrate.upgrade(engine)
        return engine
    admin = make_url(beside).set(database="postgres").render_as_string(hide_password=False)
    database = unique_name(f"hostedrooms_{name}")
    engine = create_engine(create_database(admin, database))
    migrate.upgrade(engine)
    _extra[id(engine)] = (admin, database)
    return engine


def drop_store(engine: Engine) -> None:
    from hostedrooms.testing import drop_database

    engine.dispose()
    if id(engine) in _extra:
        drop_database(*_extra.pop(id(engine)))


def migrated_database(admin_url: str, prefix: str) -> Iterator[str]:
    """A new migrated PostgreSQL database named after ``prefix``, dropped when the generator ends (a fixture body)."""
    from hostedrooms import migrate
    from hostedrooms.testing import create_database, drop_database, unique_name

    name = unique_name(prefix)
    url = create_database(admin_url, name)
    try:
        migrate.upgrade(url)
        yield url
    finally:
        drop_database(admin_url, name)

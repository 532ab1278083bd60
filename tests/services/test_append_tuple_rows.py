"""An append's rows inserted as driver tuples built from its events (``RoomStore.insert_written``), and its results
built from the events (``_fresh``), against the mapping path and the full path: the same rows byte for byte and
type for type, the same results (key order and value types included), the same statements seen by a listener.

On SQLite the one-statement append takes the tuple path; on PostgreSQL (named parameters) ``insert_written``
falls back to the mapping path, which these tests check as well.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from contextlib import AbstractContextManager, nullcontext
from typing import Any

import pytest
import sqlalchemy as sa
from factories import make_room
from sqlalchemy import Engine

from hostedrooms import rooms
from hostedrooms.backends import backend_for
from hostedrooms.rooms import PreparedEvent
from hostedrooms.statements import HotStatement
from hostedrooms.store import EventRows, event_rows, room_store

GATEWAY = "install:gw-a"
USER = {"kind": "user", "id": "u1", "display_name": "Zoë"}
PAYLOADS = [{"text": "hi"}, {"f": -0.0, "g": 1e308, "h": 5e-324, "n": 2**62, "big": 2**70},
            {"t": "\U0001f600 é \u2028", "nested": {"b": [1, 1.0, True, None], "a": "z"}}, {}]

WAYS = ("tuples", "mappings", "full")


def _way(engine: Engine, way: str, monkeypatch: pytest.MonkeyPatch) -> AbstractContextManager[Any]:
    if way == "mappings":  # no positional plan: insert_written takes insert_events' mapping path
        monkeypatch.setattr(HotStatement, "positional_processors", lambda self, connection, columns: None)
    if way == "full":
        return room_store(backend_for(engine)).without_one_statement()
    return nullcontext()


def _stored(engine: Engine, room_id: str) -> list[Any]:
    """The room's event rows as the driver reads them (no result processing), each value with its type; on SQLite
    with each column's storage class too."""
    columns = "seq, event_id, kind, actor_json, authority_epoch, payload_json, created_at"
    typed = (", typeof(seq), typeof(authority_epoch), typeof(created_at), typeof(payload_json)"
             if engine.dialect.name == "sqlite" else "")
    with engine.connect() as connection:
        rows = connection.execute(sa.text(
            f"SELECT {columns}{typed} FROM hosted_room_events WHERE room_id = :room_id ORDER BY seq"),
            {"room_id": room_id}).all()
        room = connection.execute(sa.text(
            "SELECT next_seq, event_bytes, updated_at FROM hosted_rooms WHERE room_id = :room_id"),
            {"room_id": room_id}).one()
    return [[(type(value), value) for value in row] for row in [*rows, room]]


def _typed(value: Any) -> Any:
    """``value`` with the type of every part spelled out (so 1, 1.0 and True, or -0.0 and 0.0, differ)."""
    if isinstance(value, dict):
        return [(type(value), [(key, _typed(item)) for key, item in value.items()])]
    if isinstance(value, list):
        return [(type(value), [_typed(item) for item in value])]
    return (type(value), repr(value))


def _append_all(engine: Engine, room_id: str) -> list[Any]:
    make_room(engine, room_id, gateway=GATEWAY, members=[], now=1.0)
    results: list[Any] = [rooms.append_event(
        engine, room_id=room_id, event_id="single", kind="message.user", actor=USER, payload=PAYLOADS[1],
        authority_gateway_id=GATEWAY, authority_epoch=1, now=7)]
    results.append(rooms.append_events(engine, room_id, [
        {"event_id": "one", "kind": "message.user", "actor": USER, "payload": PAYLOADS[2]}], GATEWAY, 1, now=8.25))
    results.append(rooms.append_events(engine, room_id, [
        {"event_id": f"b{index}", "kind": "message.user", "actor": USER, "payload": payload}
        for index, payload in enumerate(PAYLOADS * 3)], GATEWAY, 1, now=1e9 + 0.5))
    return results


@pytest.mark.parametrize("way", WAYS[1:])
def test_tuple_rows_store_and_return_what_the_other_paths_do(
    engine: Engine, way: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    expected = _append_all(engine, "r-tuples")
    with _way(engine, way, monkeypatch):
        got = _append_all(engine, f"r-{way}")
    for batch in got:  # (the room ids differ: everything else must not)
        for result in batch if isinstance(batch, list) else [batch]:
            result["room_id"] = "r-tuples"
    assert _typed(got) == _typed(expected)
    assert _stored(engine, f"r-{way}") == _stored(engine, "r-tuples")
    assert math.copysign(1.0, expected[0]["payload"]["f"]) == -1.0  # -0.0 came back as -0.0


@pytest.fixture
def inserts(engine: Engine) -> Iterator[list[tuple[str, Any, bool]]]:
    """The event INSERTs a cursor listener sees (statement, parameters, executemany): the engine is observed."""
    seen: list[tuple[str, Any, bool]] = []

    def listen(conn: Any, cursor: Any, statement: str, parameters: Any, context: Any, executemany: bool) -> None:
        if statement.startswith("INSERT INTO hosted_room_events"):
            seen.append((statement, parameters, executemany))

    sa.event.listen(engine, "before_cursor_execute", listen)
    yield seen
    sa.event.remove(engine, "before_cursor_execute", listen)


def _appends_seen(seen: list[tuple[str, Any, bool]], room_id: str) -> list[Any]:
    """The appends' INSERTs of ``room_id`` (not the room's creation), its id replaced, parameters as lists."""
    def shown(params: Any) -> list[Any]:
        values = list(params.values()) if isinstance(params, dict) else list(params)
        return ["ROOM" if value == room_id else value for value in values]

    found = [(text, [shown(row) for row in params] if many else shown(params), many) for text, params, many in seen]
    return [insert for insert in found if "room.created" not in repr(insert[1])]


# Only SQLite's one-statement append inserts through insert_written (PostgreSQL's is one CTE, whose INSERT a listener
# sees only on the full path, and whether an append takes that depends on the budget's spread, not on this change).
@pytest.mark.parametrize("backend", ["sqlite"], indirect=True)
def test_an_observed_engine_sees_the_same_inserts_on_both_paths(
    engine: Engine, inserts: list[tuple[str, Any, bool]], monkeypatch: pytest.MonkeyPatch
) -> None:
    expected_results = _append_all(engine, "r1")
    tuple_inserts = _appends_seen(inserts, "r1")
    inserts.clear()
    with _way(engine, "mappings", monkeypatch):
        got = _append_all(engine, "r2")
    mapping_inserts = _appends_seen(inserts, "r2")
    assert mapping_inserts == tuple_inserts
    for batch in got:
        for result in batch if isinstance(batch, list) else [batch]:
            result["room_id"] = "r1"
    assert _typed(got) == _typed(expected_results)
    # The one-statement append: one execute for each lone event, one executemany for the batch.
    assert [many for _, _, many in tuple_inserts] == [False, False, True]


def test_event_rows_reads_as_event_rows_list() -> None:
    events = [PreparedEvent(f"e{n}", "message.user", '{"id":"u1","kind":"user"}', f'{{"n":{n}}}', 2)
              for n in range(4)]
    lazy, built = EventRows("r", 5, events, 3.5), event_rows("r", 5, events, 3.5)
    assert len(lazy) == 4 and list(lazy) == built
    assert [lazy[n] for n in range(-4, 4)] == built + built
    assert lazy[1:3] == built[1:3] and lazy[::-1] == built[::-1]
    with pytest.raises(IndexError):
        lazy[4]
    assert isinstance(lazy, Sequence)

"""Nothing accepted may make a reader fail (issue 14, section 3): JSON depth, NaN/Infinity, undecodable rows.

Every JSON document hostedrooms stores (actors, payloads, members, replicated events, ledger snapshots and
responses) nests at most ``MAX_JSON_DEPTH`` deep and holds no NaN or Infinity. Rows written before that rule (or
by the reference, or by hand) are still read without a raw ``RecursionError``: room readers raise a
``StorageError`` naming the room and seq, the ledger's queues skip the row (with a warning) and ``verify``
reports it.
"""

from __future__ import annotations

import json
import logging
import math
import threading
from collections.abc import Callable
from functools import partial
from typing import Any

import pytest
import sqlalchemy as sa
from apis import use_api
from factories import account_raw_bytes, bare_page, make_room, outbound, outbound_snapshot, prepare, snapshot
from hypothesis import given
from hypothesis import strategies as st
from sqlalchemy import Engine
from waits import join

import hostedrooms
from hostedrooms import limits, models, replicas, rooms
from hostedrooms.errors import HostedRoomError, ReplicaError, RoomConflictError, StorageError
from hostedrooms.ledger import DeliveryLedger
from hostedrooms.validation import json_depth_within

_api = use_api("rooms", "replicas", "DeliveryLedger")  # the tests on a database run on both APIs

GATEWAY = "install:gw-a"
USER = {"kind": "user", "id": "u1"}


def nested(depth: int) -> dict[str, Any]:
    """An object nested ``depth`` deep (the outermost object counts as 1)."""
    value: dict[str, Any] = {}
    for _ in range(depth - 1):
        value = {"a": value}
    return value


def nested_text(depth: int) -> str:
    return '{"a":' * (depth - 1) + "{}" + "}" * (depth - 1)


def shallow(call: Callable[[], Any]) -> Any:
    """Run ``call`` on a fresh thread, whose stack is nearly empty (as in a gateway's request handler, unlike a
    pytest test function), so the json encoder itself does not give up on ~990 levels, and return its result."""
    outcome: list[Any] = []

    def run() -> None:
        try:
            outcome.append(("ok", call()))
        except BaseException as exc:  # re-raised on the test's thread
            outcome.append(("error", exc))

    thread = threading.Thread(target=run)
    thread.start()
    join(thread, 120)
    kind, value = outcome[0]
    if kind == "error":
        raise value
    return value


_room = partial(make_room, room_id="r1", gateway=GATEWAY, members=[], now=1.0)


def _append(engine: Engine, event_id: str, payload: Any, **extra: Any) -> dict[str, Any]:
    arguments = {"room_id": "r1", "event_id": event_id, "kind": "message.user", "actor": USER, "payload": payload,
                 "authority_gateway_id": GATEWAY, "authority_epoch": 1, "now": 2.0, **extra}
    return rooms.append_event(engine, **arguments)


def _raw_event(engine: Engine, room_id: str, payload_json: str, *, actor_json: str = '{"id":"u1","kind":"user"}',
               event_id: str | None = None, kind: str = "message.user") -> int:
    """Store an event with raw SQL (as old code or the reference could have), keeping seqs and bytes consistent."""
    with engine.begin() as connection:
        next_seq = connection.execute(sa.select(models.rooms.c.next_seq).where(
            models.rooms.c.room_id == room_id)).scalar_one()
        event_id = event_id or f"raw{next_seq}"
        size = sum(len(text.encode()) for text in (event_id, kind, actor_json, payload_json))
        connection.execute(sa.insert(models.events).values(
            room_id=room_id, seq=next_seq, event_id=event_id, kind=kind, actor_json=actor_json, authority_epoch=1,
            payload_json=payload_json, created_at=3.0))
        connection.execute(sa.update(models.rooms).where(models.rooms.c.room_id == room_id).values(
            next_seq=next_seq + 1, event_bytes=models.rooms.c.event_bytes + size))
        account_raw_bytes(connection, size)
    return int(next_seq)


# --- write time ---------------------------------------------------------------------------------------------------


def test_the_depth_limit_is_documented_and_far_below_the_recursion_limit() -> None:
    import sys

    assert limits.MAX_JSON_DEPTH == 64
    assert limits.MAX_JSON_DEPTH * 4 < sys.getrecursionlimit()


# Regression: a payload nested ~990 deep was accepted; every later read_events past it raised RecursionError.
@pytest.mark.parametrize("depth", [65, 950])
def test_deep_payloads_are_refused_at_write_time(engine: Engine, depth: int) -> None:
    _room(engine)
    before = snapshot(engine)
    with pytest.raises(HostedRoomError, match="^payload is nested too deeply$"):
        shallow(lambda: _append(engine, "deep", nested(depth)))
    with pytest.raises(HostedRoomError, match="^payload is nested too deeply$"):
        shallow(lambda: rooms.append_events(engine, "r1", [{"event_id": "deep", "kind": "message.user",
                                                            "actor": USER, "payload": nested(depth)}], GATEWAY, 1))
    assert snapshot(engine) == before


def test_the_deepest_accepted_payload_reads_back(engine: Engine) -> None:
    _room(engine)
    wide = {"items": [[{"k": ["[{\\\"", {}]}] for _ in range(200)], "deep": nested(limits.MAX_JSON_DEPTH - 1)}
    _append(engine, "ok", nested(limits.MAX_JSON_DEPTH))
    _append(engine, "wide", wide)
    page = rooms.read_events(engine, room_id="r1")
    assert [event["payload"] for event in page["events"]] == [nested(limits.MAX_JSON_DEPTH), wide]


def test_deep_members_are_refused(engine: Engine) -> None:
    with pytest.raises(HostedRoomError, match="^members is nested too deeply$"):
        rooms.create_room(engine, room_id="r1", name="Team", members=[nested(limits.MAX_JSON_DEPTH)],
                          authority_gateway_id=GATEWAY)
    assert rooms.list_rooms(engine) == []


def test_deep_replicated_events_are_refused(engine: Engine) -> None:
    before = snapshot(engine)
    with pytest.raises(ReplicaError, match="^payload is nested too deeply$"):
        replicas.ingest_page(engine, room_id="x1", room_name="X", members=[], page=bare_page({"payload": nested(65)}))
    with pytest.raises(HostedRoomError, match="^members is nested too deeply$"):
        replicas.ingest_page(engine, room_id="x1", room_name="X", members=[nested(64)], page=bare_page({}))
    assert snapshot(engine) == before


# Regression: a deep snapshot was stored, and pending_outbound()/recoverable_outbound() then raised RecursionError.
@pytest.mark.parametrize("depth", [64, 950])
def test_deep_ledger_snapshots_and_responses_are_refused(engine: Engine, depth: int) -> None:
    ledger = DeliveryLedger(engine, clock=lambda: 1_000)
    before = snapshot(engine)
    with pytest.raises(ValueError, match="^secure peer outbound intent is invalid$"):
        # the snapshot itself is one more level
        shallow(lambda: ledger.prepare_outbound(**outbound(snapshot=outbound_snapshot(extra=nested(depth)))))
    assert snapshot(engine) == before
    ledger.prepare_outbound(**outbound())
    before = snapshot(engine)
    with pytest.raises(ValueError, match="^secure peer outbound result is invalid$"):
        shallow(lambda: ledger.commit_outbound("out-1", {"result": nested(depth)}))
    assert snapshot(engine) == before


# --- NaN and Infinity ----------------------------------------------------------------------------------------------


# Regression: NaN and Infinity were stored as the non-standard JSON tokens NaN/Infinity.
@pytest.mark.parametrize("number", [math.nan, math.inf, -math.inf])
def test_nan_and_infinity_are_refused_everywhere_json_is_stored(engine: Engine, number: float) -> None:
    _room(engine)
    before = snapshot(engine)
    with pytest.raises(HostedRoomError, match="^payload must be JSON-serializable$"):
        _append(engine, "nan", {"value": number})
    with pytest.raises(HostedRoomError, match="^members must be JSON-serializable$"):
        rooms.create_room(engine, room_id="r2", name="Team", members=[{"weight": number}],
                          authority_gateway_id=GATEWAY)
    with pytest.raises(ReplicaError, match="^payload must be JSON-serializable$"):
        replicas.ingest_page(engine, room_id="x1", room_name="X", members=[],
                             page=bare_page({"payload": {"n": number}}))
    with pytest.raises(ValueError, match="^secure peer outbound intent is invalid$"):
        DeliveryLedger(engine, clock=lambda: 1_000).prepare_outbound(**outbound(snapshot=outbound_snapshot(n=number)))
    assert snapshot(engine) == before


# --- readers of rows stored before the rule ------------------------------------------------------------------------


# Regression: rows nested deeper than the interpreter decodes made every read past them raise RecursionError.
# 990 may decode (then the page cannot be serialised again), 5000 never does: both are a StorageError.
@pytest.mark.parametrize("depth", [990, 5000])
def test_read_events_names_the_undecodable_event(engine: Engine, depth: int) -> None:
    _room(engine)
    _append(engine, "e1", {"text": "before"})
    seq = _raw_event(engine, "r1", nested_text(depth))
    _append(engine, "e3", {"text": "after"})
    assert [event["seq"] for event in rooms.read_events(engine, room_id="r1", limit=1)["events"]] == [1]
    with pytest.raises(StorageError, match=rf"^hosted room 'r1' event seq {seq} holds a stored value that cannot be "
                                           r"decoded \(RecursionError\)$"):
        rooms.read_events(engine, room_id="r1")
    with pytest.raises(StorageError, match=f"event seq {seq}"):
        rooms.read_events(engine, room_id="r1", since_seq=1)
    assert rooms.read_events(engine, room_id="r1", since_seq=seq)["events"][0]["event_id"] == "e3"


def test_read_events_names_an_event_that_is_not_json(engine: Engine) -> None:
    _room(engine)
    seq = _raw_event(engine, "r1", "{not json")
    with pytest.raises(StorageError, match=rf"^hosted room 'r1' event seq {seq} holds a stored value that cannot be "
                                           r"decoded \(JSONDecodeError\)$"):
        rooms.read_events(engine, room_id="r1")


def test_room_readers_name_undecodable_members(engine: Engine) -> None:
    _room(engine)
    with engine.begin() as connection:
        connection.execute(sa.update(models.rooms).values(members_json=f"[{nested_text(5000)}]"))
    with pytest.raises(StorageError, match="^hosted room 'r1' holds a stored value that cannot be decoded"):
        rooms.room_state(engine, room_id="r1")
    with pytest.raises(StorageError, match="^hosted room 'r1' holds"):
        rooms.list_rooms(engine)


def _deep_snapshot(engine: Engine, request_id: str) -> None:
    with engine.begin() as connection:
        connection.execute(sa.update(models.outbound_intents).where(
            models.outbound_intents.c.request_id == request_id).values(snapshot_json=nested_text(5000)))


# Regression: one undecodable snapshot made pending_outbound()/recoverable_outbound() raise for the whole queue.
def test_one_undecodable_outbound_intent_does_not_block_the_queue(
    engine: Engine, caplog: pytest.LogCaptureFixture
) -> None:
    clock = [1_000]
    ledger = DeliveryLedger(engine, clock=lambda: clock[0])
    for index in range(4):
        ledger.prepare_outbound(**outbound(request_id=f"out-{index}", snapshot=outbound_snapshot(connection_id="c")))
        clock[0] += 1
    _deep_snapshot(engine, "out-0")
    _deep_snapshot(engine, "out-2")
    with caplog.at_level(logging.WARNING, logger="hostedrooms.ledger"):
        assert [row["request_id"] for row in ledger.pending_outbound(limit=1, now=5_000)] == ["out-1"]
        assert [row["request_id"] for row in ledger.pending_outbound(limit=2, now=5_000)] == ["out-1", "out-3"]
        assert [row["request_id"] for row in ledger.recoverable_outbound(limit=1)] == ["out-1"]
        assert [row["request_id"] for row in ledger.recoverable_outbound()] == ["out-1", "out-3"]
        assert [row["request_id"] for row in ledger.pending_outbound_for_connection("c", now=1_000)] == [
            "out-1", "out-3"]
    assert "'out-0'" in caplog.text and "'out-2'" in caplog.text
    with pytest.raises(StorageError, match="^secure peer outbound intent 'out-0' holds a stored value"):
        ledger.outbound("out-0")
    before = snapshot(engine)
    with pytest.raises(StorageError):  # a call about that row: nothing it would write is committed
        ledger.defer_outbound("out-0", "retry")
    assert snapshot(engine) == before
    assert [str(violation) for violation in hostedrooms.verify(engine)] == [
        "ledger_json: out-0: outbound snapshot is not JSON within 64 levels",
        "ledger_json: out-2: outbound snapshot is not JSON within 64 levels"]


def test_one_undecodable_delivery_does_not_block_the_queue(engine: Engine) -> None:
    ledger = DeliveryLedger(engine, clock=lambda: 1_000)
    for envelope_id in ("env-0", "env-1"):
        prepare(ledger, envelope_id)
        ledger.authorize(envelope_id)
    with engine.begin() as connection:
        connection.execute(sa.update(models.deliveries).where(models.deliveries.c.envelope_id == "env-0").values(
            body_json=nested_text(5000)))
    assert [row["envelope_id"] for row in ledger.recoverable()] == ["env-1"]
    assert [row["envelope_id"] for row in ledger.pending_admissions(limit=1, now=2_000)] == ["env-1"]
    with pytest.raises(StorageError, match="^secure peer delivery 'env-0' holds a stored value"):
        ledger.get("env-0")
    assert [v.check for v in hostedrooms.verify(engine)] == ["ledger_json"]


# --- verify --------------------------------------------------------------------------------------------------------


def test_verify_reports_events_no_page_could_return(engine: Engine, monkeypatch: pytest.MonkeyPatch) -> None:
    _room(engine)
    _append(engine, "fine", {"text": "x" * 3000})
    _raw_event(engine, "r1", nested_text(65))
    _raw_event(engine, "r1", nested_text(5000))
    _raw_event(engine, "r1", "{not json")
    _raw_event(engine, "r1", "{}", event_id="x" * 300)  # (PostgreSQL's index refuses a 3 MB id outright)
    _raw_event(engine, "r1", "{}", kind="NOT A KIND!")
    _raw_event(engine, "r1", "{}", actor_json=nested_text(70))
    assert [str(violation) for violation in hostedrooms.verify(engine)] == [
        "readable_events: r1: seq 2: its payload_json is not JSON within 64 levels of nesting",
        "readable_events: r1: seq 3: its payload_json is not JSON within 64 levels of nesting",
        "readable_events: r1: seq 4: its actor or payload cannot be decoded",
        "readable_events: r1: seq 5: its event_id does not pass the append rules",
        "readable_events: r1: seq 6: its kind does not pass the append rules",
        "readable_events: r1: seq 7: its actor_json is not JSON within 64 levels of nesting"]
    # An event that alone outweighs the page budget (only possible with a lowered limit) is reported too.
    monkeypatch.setattr(limits, "MAX_LOG_PAGE_BYTES", 2_000)
    assert "readable_events: r1: seq 1: it alone exceeds the replay page limit" in map(str, hostedrooms.verify(engine))


def test_verify_reports_unreadable_replica_events(engine: Engine) -> None:
    replicas.ingest_page(engine, room_id="x1", room_name="X", members=[], page=bare_page({}))
    with engine.begin() as connection:
        connection.execute(sa.update(models.replica_events).values(payload_json=nested_text(100)))
    assert [str(violation) for violation in hostedrooms.verify(engine)] == [
        "readable_replica_events: x1: seq 1: its payload_json is not JSON within 64 levels of nesting"]


def test_verify_is_clean_on_what_the_api_accepts(engine: Engine) -> None:
    _room(engine)
    _append(engine, "e1", nested(limits.MAX_JSON_DEPTH))
    _append(engine, "e2", {"text": "nul \x00 and escape \x1b and é"})
    assert hostedrooms.verify(engine) == []
    assert json.loads(json.dumps(rooms.read_events(engine, room_id="r1")))["latest_seq"] == 2


def test_adopting_a_legacy_room_with_undecodable_members_is_a_conflict(engine: Engine) -> None:
    rooms.create_room(engine, room_id="r1", name="Team", members=[], authority_gateway_id="legacy", now=1.0)
    with engine.begin() as connection:
        connection.execute(sa.update(models.rooms).values(members_json=f"[{nested_text(5000)}]"))
    before = snapshot(engine)
    with pytest.raises(RoomConflictError, match="^room_id already exists with different state$"):
        rooms.create_room(engine, room_id="r1", name="Team", members=[{"id": "m1"}], authority_gateway_id=GATEWAY)
    assert snapshot(engine) == before


_TRICKY_TEXT = st.text(alphabet='[]{}"\\\\ax\u00e9\u2028,:', max_size=6)
_JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False) | _TRICKY_TEXT,
    lambda children: st.lists(children, max_size=3) | st.dictionaries(_TRICKY_TEXT, children, max_size=3),
    max_leaves=30)


def _depth(value: Any) -> int:
    if isinstance(value, dict):
        return 1 + max(map(_depth, value.values()), default=0)
    if isinstance(value, list):
        return 1 + max(map(_depth, value), default=0)
    return 0


@given(_JSON_VALUES, st.integers(min_value=0, max_value=8), st.booleans())
def test_json_depth_is_read_from_the_text(value: Any, limit: int, ascii_only: bool) -> None:
    """The text-based depth check agrees with the structure, whatever brackets, quotes or escapes strings hold."""
    text = json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=ascii_only)
    assert json_depth_within(text, limit) is (_depth(value) <= limit)

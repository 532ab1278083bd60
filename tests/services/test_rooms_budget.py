"""The gateway byte budget as escrow shards, and the one-statement append that spends it, on both backends.

The shards' ``used`` always sum to every room's ``event_bytes`` (every path that changes a room's bytes keeps
them so; ``verify`` reports a difference); the one-statement append either writes everything or nothing; the
refusal stays the reference's exactly, whatever limits the last spread was made for.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from apis import use_api
from factories import USER, A, B, ingest, lowered, run_together, snapshot
from factories import replica_page as page
from sqlalchemy import Engine

from hostedrooms import integrity, migrate, models, replicas, rooms
from hostedrooms import rooms as sync_rooms
from hostedrooms.backends import backend_for
from hostedrooms.db import create_engine
from hostedrooms.errors import CapacityExceededError, HostedRoomError
from hostedrooms.store import room_store
from hostedrooms.uow import UnitOfWork

_api = use_api("rooms", "replicas")  # the tests on a database run on both APIs

LOCAL = "install:gw-local"
ONE = len("e-0-000") + len("message.user") + len('{"id":"u1","kind":"user"}') + len('{"text":"' + "x" * 150 + '"}')


def make_room(engine: Engine, room_id: str, *, gateway: str = LOCAL) -> Any:
    return rooms.create_room(engine, room_id=room_id, name="Team", members=[], authority_gateway_id=gateway,
                             now=1000.0)


def message(engine: Engine, room_id: str, event_id: str, text: str = "hi", *, gateway: str = LOCAL, epoch: int = 1,
            **kwargs: Any) -> Any:
    return rooms.append_event(engine, room_id=room_id, event_id=event_id, kind="message.user", actor=dict(USER),
                              payload={"text": text}, authority_gateway_id=gateway, authority_epoch=epoch, **kwargs)


def sync_message(engine: Engine, room_id: str, event_id: str, text: str = "hi", **kwargs: Any) -> Any:
    """:func:`message` on the synchronous API (the concurrency tests' threads each run one)."""
    return sync_rooms.append_event(engine, room_id=room_id, event_id=event_id, kind="message.user",
                                   actor=dict(USER), payload={"text": text}, authority_gateway_id=LOCAL,
                                   authority_epoch=1, **kwargs)


def _budget_problems(engine: Engine) -> list[str]:
    with engine.connect() as connection:
        return [str(v) for v in integrity.check_budget(connection, backend_for(connection))]


def _budget_used(engine: Engine) -> int:
    with engine.connect() as connection:
        return int(connection.execute(sa.select(sa.func.coalesce(sa.func.sum(models.budget.c.used), 0))).scalar_one())


def _one_statement(engine: Engine, room_id: str, event_id: str, *, gateway: str = LOCAL, epoch: int = 1) -> Any:
    """The store's one-statement append alone, in a unit that commits whatever it wrote."""
    event = rooms.PreparedEvent(event_id, "message.user", '{"id":"u1","kind":"user"}', '{"text":"hi"}', epoch)
    with UnitOfWork(engine) as uow:
        outcome = uow.rooms.append_one_statement(room_id, [event], gateway_id=gateway, now=5.0, limits=lowered())
        uow.commit()
    return outcome


# --- the one-statement append writes everything or nothing ---------------------------------------------------


@pytest.mark.parametrize("case", ["stale epoch", "moved authority", "disbanded", "absent"])
def test_the_one_statement_append_writes_nothing_where_it_does_not_apply(engine: Engine, case: str) -> None:
    make_room(engine, "r1", gateway=LOCAL)
    message(engine, "r1", "first")  # the budget is spread: the one-statement append could apply
    if case == "disbanded":
        rooms.disband_room(engine, room_id="r1", expected_gateway_id=LOCAL, expected_epoch=1, now=2000.0)
    before = snapshot(engine)
    room_id, gateway, epoch = {"stale epoch": ("r1", LOCAL, 2), "moved authority": ("r1", B, 1),
                               "disbanded": ("r1", LOCAL, 1), "absent": ("r9", LOCAL, 1)}[case]
    assert _one_statement(engine, room_id, "e1", gateway=gateway, epoch=epoch) is None
    assert snapshot(engine) == before
    expected = {"stale epoch": "stale hosted room authority", "moved authority": "stale hosted room authority",
                "disbanded": "hosted room not found", "absent": "hosted room not found"}[case]
    with pytest.raises(HostedRoomError, match=f"^{expected}$"):  # the full path raises the reference's error
        message(engine, room_id, "e1", gateway=gateway, epoch=epoch)
    assert snapshot(engine) == before


def test_a_repeated_id_returns_the_stored_row(engine: Engine) -> None:
    make_room(engine, "r1")
    first = message(engine, "r1", "e1")
    before = snapshot(engine)
    again = message(engine, "r1", "e1")
    assert (again["seq"], again["idempotent"], first["idempotent"]) == (first["seq"], True, False)
    assert snapshot(engine) == before
    if room_store(backend_for(engine)).one_statement_autocommits:  # PostgreSQL: the probe answers in the same statement
        outcome = _one_statement(engine, "r1", "e1")
        assert outcome is not None and outcome[0] == [] and outcome[1]["e1"]["seq"] == first["seq"]
        assert snapshot(engine) == before


@pytest.mark.parametrize("backend", ["postgresql"], indirect=True)
def test_a_postgresql_append_is_one_round_trip(engine: Engine) -> None:
    """Counted on the synchronous API's engine (the asyncio API's twin runs the same service code)."""
    make_room(engine, "r1")
    message(engine, "r1", "warm")  # spreads the budget
    statements: list[str] = []
    sa.event.listen(engine, "before_cursor_execute", lambda *args: statements.append(args[2]))
    item = {"kind": "message.user", "actor": dict(USER), "payload": {"text": "hi"}}
    sync_rooms.append_event(engine, room_id="r1", event_id="e1", **item, authority_gateway_id=LOCAL,
                            authority_epoch=1)
    sync_rooms.append_event(engine, room_id="r1", event_id="e1", **item, authority_gateway_id=LOCAL,
                            authority_epoch=1)  # the replay too
    sync_rooms.append_events(engine, "r1", [{**item, "event_id": f"b{n}"} for n in range(5)], LOCAL, 1)
    assert len(statements) == 3, statements
    assert _budget_problems(engine) == []


def test_a_batch_stores_every_text_exactly(engine: Engine) -> None:
    """The batch's rows travel as one JSON text on PostgreSQL: each text comes back exactly as written."""
    make_room(engine, "r1")
    message(engine, "r1", "warm")
    texts = ['quote " backslash \\ slash /', "é ✓ 😀 \u2028 \u2029 \x7f", "\t\n\r", "{\"json\": [1]}", ""]
    items = [{"event_id": f"t{n}", "kind": "message.user", "actor": dict(USER), "payload": {"text": text, "n": n}}
             for n, text in enumerate(texts)]
    written = rooms.append_events(engine, "r1", items, LOCAL, 1)
    assert [row["idempotent"] for row in written] == [False] * len(texts)
    page = rooms.read_events(engine, room_id="r1", since_seq=1, limit=10)["events"]
    assert [(event["seq"], event["event_id"], event["payload"]) for event in page] == [
        (n + 2, f"t{n}", {"text": text, "n": n}) for n, text in enumerate(texts)]
    again = rooms.append_events(engine, "r1", items, LOCAL, 1)  # every id stored: the replay, nothing written
    assert [(row["seq"], row["idempotent"]) for row in again] == [(n + 2, True) for n in range(len(texts))]
    assert _budget_problems(engine) == []


def test_concurrent_writers_of_one_id_store_one_row(engine: Engine) -> None:
    make_room(engine, "r1")
    message(engine, "r1", "warm")
    results = run_together(lambda _: sync_message(engine, "r1", "same"), 4)
    assert not [r for r in results if isinstance(r, Exception)], results
    assert [r["seq"] for r in results] == [2] * 4
    assert sorted(r["idempotent"] for r in results) == [False, True, True, True]
    with engine.connect() as connection:
        assert connection.execute(sa.select(sa.func.count()).select_from(models.events)).scalar_one() == 2
    assert _budget_problems(engine) == []


# --- the budget is exact -------------------------------------------------------------------------------------


def test_the_budget_is_exact_under_eight_writers_across_rooms(engine: Engine) -> None:
    writers, allowed = 8, 60
    tight = lowered(MAX_EVENT_JSON_BYTES=200, MAX_ACTOR_JSON_BYTES=100,
                    MAX_GATEWAY_EVENT_BYTES=allowed * ONE + ONE // 2)
    for index in range(writers):
        make_room(engine, f"room-{index}")

    def worker(index: int) -> int:
        for n in range(1000):
            try:
                sync_message(engine, f"room-{index}", f"e-{index}-{n:03d}", text="x" * 150, limits=tight)
            except CapacityExceededError as exc:
                assert str(exc) == "Group Chat storage is full on this host. Delete an old Group Chat and try again."
                return n
        return 1000

    results = run_together(worker, writers)
    assert sum(results) == allowed, results  # never over, and nothing refused while room remained
    assert _budget_used(engine) == allowed * ONE
    assert _budget_problems(engine) == []


def test_a_caller_with_a_lower_limit_than_the_last_spread_is_refused_exactly(engine: Engine) -> None:
    make_room(engine, "r1")
    message(engine, "r1", "e-0-000", text="x" * 150)  # spread for the default (much higher) gateway limit
    exact = lowered(MAX_GATEWAY_EVENT_BYTES=2 * ONE)
    message(engine, "r1", "e-0-001", text="x" * 150, limits=exact)  # exactly at the limit: admitted
    with pytest.raises(CapacityExceededError, match="storage is full on this host"):
        message(engine, "r1", "e-0-002", text="x" * 150, limits=lowered(MAX_GATEWAY_EVENT_BYTES=3 * ONE - 1))
    message(engine, "r1", "e-0-002", text="x" * 150)  # the default limit again: room, re-spread
    assert _budget_used(engine) == 3 * ONE
    assert _budget_problems(engine) == []


def test_pruning_frees_the_budget_before_refusing(engine: Engine) -> None:
    tight = lowered(MAX_GATEWAY_EVENT_BYTES=2 * ONE)
    make_room(engine, "old")
    message(engine, "old", "e-0-000", text="x" * 150, limits=tight)
    rooms.disband_room(engine, room_id="old", expected_gateway_id=LOCAL, expected_epoch=1, now=2000.0, limits=tight)
    make_room(engine, "new")
    message(engine, "new", "e-1-000", text="x" * 150, limits=tight)
    message(engine, "new", "e-1-001", text="x" * 150, limits=tight)  # fits once the disbanded room is purged
    assert [room["room_id"] for room in rooms.list_rooms(engine, include_disbanded=True)] == ["new"]
    assert _budget_problems(engine) == []


# --- every path keeps the shards equal to the rooms' bytes ---------------------------------------------------


def test_every_path_keeps_the_shards_equal_to_the_rooms_bytes(engine: Engine) -> None:
    steps: list[tuple[str, Any]] = [
        ("create", lambda: make_room(engine, "r1", gateway=A)),
        ("one-statement append", lambda: message(engine, "r1", "e1", gateway=A)),
        ("batch", lambda: rooms.append_events(engine, "r1", [
            {"event_id": f"b{n}", "kind": "message.user", "actor": {"kind": "user", "id": "u1"}, "payload": {}}
            for n in range(3)], A, 1)),
        ("control batch (full path)", lambda: rooms.append_events(engine, "r1", [
            {"event_id": "s1", "kind": "room.stop_requested", "actor": {"kind": "gateway", "id": A},
             "payload": {}}, {"event_id": "s2", "kind": "message.user", "actor": {"kind": "user", "id": "u1"},
                              "payload": {}}], A, 1)),
        ("rename", lambda: rooms.rename_room(engine, room_id="r1", name="Renamed", event_id="n1")),
        ("claim", lambda: rooms.claim_authority(engine, room_id="r1", expected_gateway_id=A, expected_epoch=1,
                                                new_gateway_id=B, event_id="c1")),
        ("demotion", lambda: replicas.demote_room(engine, room_id="r1", observed_gateway_id=A, observed_epoch=3,
                                                  local_gateway_id=B)),
        ("replica ingest", lambda: ingest(engine, page(1, 3, room_id="r2"), room_id="r2")),
        ("promotion", lambda: replicas.promote_replica(engine, room_id="r2", local_gateway_id=B, now=3000.0)),
        ("disband", lambda: rooms.disband_room(engine, room_id="r2", expected_gateway_id=B, expected_epoch=2,
                                               now=3001.0)),
        ("prune", lambda: rooms.prune_disbanded_rooms(engine, now=1e12)),
    ]
    for name, step in steps:
        step()
        assert _budget_problems(engine) == [], name
    assert _budget_used(engine) > 0


def test_legacy_adoption_keeps_the_shards_equal(tmp_path: Path) -> None:
    from test_legacy_adoption import _draft_rooms

    path = tmp_path / "state.db"
    _draft_rooms(path)
    migrate.upgrade(path)
    engine = create_engine(path)
    try:
        assert _budget_problems(engine) == [] and _budget_used(engine) > 0  # filled by 0008
        rooms.create_room(engine, room_id="r1", name="Rööm r1 ☃", members=[{"id": "m1", "label": "Zoë"}],
                          authority_gateway_id="install:real", now=50.0)  # adopts: appends the claim
        message(engine, "r1", "after", gateway="install:real", epoch=2)
        assert _budget_problems(engine) == []
    finally:
        engine.dispose()


# --- the migration ---------------------------------------------------------------------------------------------


def test_the_migration_fills_the_shards_of_a_populated_database(empty_target: str, backend: str) -> None:
    migrate.upgrade(empty_target, "0007_claim_index")
    engine = create_engine(empty_target)
    try:
        with engine.begin() as connection:
            connection.execute(sa.text(
                "INSERT INTO hosted_rooms (room_id, name, members_json, authority_gateway_id, event_bytes, "
                "created_at, updated_at, disbanded_at) VALUES ('a', 'A', '[]', 'g', 0, 1, 1, NULL), "
                "('b', 'B', '[]', 'g', 0, 1, 1, 2)"))
            for room_id, event_id, payload in (("a", "e1", "{}"), ("a", "e2", '{"x":1}'), ("b", "e1", '"é"')):
                seq = 1 if (room_id, event_id) != ("a", "e2") else 2
                connection.execute(sa.text(
                    "INSERT INTO hosted_room_events (room_id, seq, event_id, kind, actor_json, payload_json, "
                    "created_at) VALUES (:r, :s, :e, 'message.user', '{}', :p, 1)"),
                    {"r": room_id, "s": seq, "e": event_id, "p": payload})
            connection.execute(sa.text(
                "UPDATE hosted_rooms SET next_seq = (SELECT count(*) + 1 FROM hosted_room_events e "
                "WHERE e.room_id = hosted_rooms.room_id), event_bytes = (SELECT sum(length(CAST(event_id AS BLOB)) "
                "+ length(CAST(kind AS BLOB)) + length(CAST(actor_json AS BLOB)) + length(CAST(payload_json AS BLOB)))"
                " FROM hosted_room_events e WHERE e.room_id = hosted_rooms.room_id)"
                if backend == "sqlite" else
                "UPDATE hosted_rooms SET next_seq = (SELECT count(*) + 1 FROM hosted_room_events e "
                "WHERE e.room_id = hosted_rooms.room_id), event_bytes = (SELECT sum(octet_length(event_id) "
                "+ octet_length(kind) + octet_length(actor_json) + octet_length(payload_json)) "
                "FROM hosted_room_events e WHERE e.room_id = hosted_rooms.room_id)"))
        migrate.upgrade(empty_target)
        with engine.connect() as connection:
            shards = connection.execute(sa.select(models.budget).order_by(models.budget.c.shard)).mappings().all()
            indexes = {index["name"] for index in sa.inspect(connection).get_indexes("hosted_room_events")}
        total = sum(len(text.encode()) for text in ("e1", "message.user", "{}", "{}", "e2", "message.user", "{}",
                                                    '{"x":1}', "e1", "message.user", "{}", '"é"'))
        assert sum(shard["used"] for shard in shards) == total
        assert len(shards) == room_store(backend_for(engine)).budget_shards
        assert ("idx_hosted_room_events_cursor" in indexes) == (backend == "sqlite")
        assert _budget_problems(engine) == []
        message(engine, "a", "after", gateway="g")  # the first append spreads the budget, then writes
        assert _budget_problems(engine) == []
    finally:
        engine.dispose()

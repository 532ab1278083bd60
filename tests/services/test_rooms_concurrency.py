"""Rooms under concurrent writers, on SQLite and PostgreSQL: sequences, caps and fences stay exact."""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from functools import partial

import factories
import pytest
import sqlalchemy as sa
from factories import lowered, message, run_together
from sqlalchemy import Engine

from hostedrooms import models, rooms
from hostedrooms.compat import _engine as compat_engine
from hostedrooms.compat import hosted_rooms as hr
from hostedrooms.errors import AuthorityConflictError, HostedRoomError
from hostedrooms.uow import UnitOfWork

LOCAL = "install:gw-local"
REMOTE = "install:gw-remote"
THREADS = 8


# This file's rooms have no members and take the time from the clock.
make_room = partial(factories.make_room, members=[], now=None)


def test_concurrent_appends_to_one_room_get_contiguous_seqs(engine: Engine) -> None:
    make_room(engine, "room-1")

    def worker(index: int) -> list[int]:
        return [message(engine, "room-1", f"e-{index}-{n}")["seq"] for n in range(3)]

    results = run_together(worker, THREADS)
    assert not [r for r in results if isinstance(r, Exception)], results
    assert sorted(seq for seqs in results for seq in seqs) == list(range(1, 25))
    page = rooms.read_events(engine, room_id="room-1", limit=500)
    assert [event["seq"] for event in page["events"]] == list(range(1, 25))
    for event in page["events"]:  # replays return the original seqs
        assert message(engine, "room-1", event["event_id"])["seq"] == event["seq"]
    with engine.connect() as connection:
        stored = connection.execute(sa.select(models.rooms.c.next_seq, models.rooms.c.event_bytes)).one()
    assert stored.next_seq == 25
    assert stored.event_bytes == sum(
        len(e["event_id"]) + len("message.user") + len('{"id":"u1","kind":"user"}') + len('{"text":"hi"}')
        for e in page["events"])


def test_concurrent_appends_of_one_event_id_replay(engine: Engine) -> None:
    make_room(engine, "room-1")
    results = run_together(lambda _: message(engine, "room-1", "same"), THREADS)
    assert [r["seq"] for r in results] == [1] * THREADS
    assert sorted(r["idempotent"] for r in results) == [False] + [True] * (THREADS - 1)


def test_concurrent_creates_on_a_fresh_database(empty_target: str, monkeypatch: pytest.MonkeyPatch) -> None:
    try:
        def worker(index: int) -> list[bool]:
            return [hr.create_room(empty_target, room_id=f"room-{index}-{n}", name="T", members=[],
                                   authority_gateway_id=LOCAL)["idempotent"] for n in range(2)]

        results = run_together(worker, THREADS)
        assert results == [[False, False]] * THREADS
        assert len(hr.list_rooms(empty_target)) == 16
    finally:
        compat_engine.forget_engines()


def test_concurrent_create_of_one_id_replays(engine: Engine) -> None:
    results = run_together(lambda _: make_room(engine, "same"), THREADS)
    assert not [r for r in results if isinstance(r, Exception)], results
    assert sorted(r["idempotent"] for r in results) == [False] + [True] * (THREADS - 1)


def test_active_room_cap_holds_under_concurrent_creates(engine: Engine) -> None:
    cap = lowered(MAX_ACTIVE_ROOMS=5)
    results = run_together(lambda index: make_room(engine, f"room-{index}", limits=cap), THREADS)
    refused = [r for r in results if isinstance(r, Exception)]
    assert len(refused) == THREADS - 5
    assert all(isinstance(r, HostedRoomError) and "too many active" in str(r) for r in refused)
    assert len(rooms.list_rooms(engine)) == 5


def test_concurrent_claims_have_one_winner(engine: Engine) -> None:
    make_room(engine, "room-1")
    results = run_together(lambda index: rooms.claim_authority(
        engine, room_id="room-1", expected_gateway_id=LOCAL, expected_epoch=1, new_gateway_id=f"install:gw-{index}",
        event_id=f"claim-{index}"), workers=2)
    winners = [r for r in results if isinstance(r, dict)]
    losers = [r for r in results if isinstance(r, Exception)]
    assert len(winners) == 1 and len(losers) == 1
    assert isinstance(losers[0], AuthorityConflictError) and str(losers[0]) == "hosted room authority changed"
    state = rooms.room_state(engine, room_id="room-1")
    assert (state["authority_gateway_id"], state["authority_epoch"], state["latest_seq"]) == (
        winners[0]["authority_gateway_id"], 2, 1)


def test_gateway_byte_limit_holds_under_concurrent_writers(engine: Engine) -> None:
    # Small per-event bounds make the shared path usable, so both the shared and the exclusive paths run.
    probe = lowered(MAX_EVENT_JSON_BYTES=200, MAX_ACTOR_JSON_BYTES=100)
    for index in range(THREADS):
        make_room(engine, f"room-{index}")
    one_event = len("e-0-000") + len("message.user") + len('{"id":"u1","kind":"user"}') + len(
        '{"text":"' + "x" * 150 + '"}')
    allowed_events = 60
    tight = lowered(MAX_EVENT_JSON_BYTES=200, MAX_ACTOR_JSON_BYTES=100,
                    MAX_GATEWAY_EVENT_BYTES=allowed_events * one_event + one_event // 2)
    assert rooms.max_event_bytes(probe) * (THREADS - 1) < tight.MAX_GATEWAY_EVENT_BYTES

    def worker(index: int) -> int:
        written = 0
        for n in range(1000):
            try:
                message(engine, f"room-{index}", f"e-{index}-{n:03d}", text="x" * 150, limits=tight)
            except HostedRoomError as exc:
                assert "storage is full on this host" in str(exc)
                return written
            written += 1
        return written

    results = run_together(worker, THREADS)
    assert sum(results) == allowed_events, results  # exact: never over, and nothing refused while room remained
    with engine.connect() as connection:
        total = connection.execute(sa.select(sa.func.sum(models.rooms.c.event_bytes))).scalar_one()
    assert total == allowed_events * one_event


@pytest.mark.parametrize("backend", ["postgresql"], indirect=True)
def test_postgres_writers_serialise_per_room_only(engine: Engine) -> None:
    make_room(engine, "busy")
    make_room(engine, "free")
    rooms.prune_disbanded_rooms(engine)  # spreads the gateway budget over its shards (an emptied table has none)
    holder = UnitOfWork(engine)
    holder.__enter__()
    try:
        tx = rooms.RoomTransaction(holder)
        room = tx.lock_room("busy")
        assert room is not None
        event = rooms.PreparedEvent("held", "message.user", '{"id":"u1","kind":"user"}', "{}", 1)
        tx.append_locked(room, [event], now=1.0)  # an in-flight append: holds the row and one budget shard
        with ThreadPoolExecutor(max_workers=2) as pool:
            free = pool.submit(message, engine, "free", "f-1")
            assert free.result(timeout=30)["seq"] == 1  # a different room does not wait (nor for that shard)
            busy = pool.submit(message, engine, "busy", "b-1")
            time.sleep(0.5)
            assert not busy.done()  # the same room waits for the row lock
            holder.commit()
            assert busy.result(timeout=30)["seq"] == 2
    finally:
        holder.__exit__(None, None, None)

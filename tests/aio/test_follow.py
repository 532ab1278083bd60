"""follow(): each event once, in seq order, as it commits; resumable; ends after room.disbanded; the
history-expired error when purged under it; nothing left open. Both APIs (the asyncio one is an async iterator,
driven here one event per loop run), both backends; and the ledger's work wake-ups."""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from typing import Any

import pytest
import sqlalchemy as sa
from apis import use_api
from factories import make_room
from sqlalchemy import Engine
from waits import join

from hostedrooms import aio, create_engine, rooms
from hostedrooms.errors import HostedRoomError, RoomHistoryExpiredError, RoomNotFoundError
from hostedrooms.ledger import DeliveryLedger
from hostedrooms.rooms import RoomTransaction
from hostedrooms.rooms.rules import PreparedEvent
from hostedrooms.uow import UnitOfWork

_api = use_api("rooms")  # the tests on a database run on both APIs

GATEWAY = "install:gw-a"
USER = {"kind": "user", "id": "u1"}
QUICK = {"poll_interval": 0.01, "fallback_interval": 0.5}


def say(engine: Engine, event_id: str, room_id: str = "r1") -> dict[str, Any]:
    return rooms.append_event(engine, room_id=room_id, event_id=event_id, kind="message.user", actor=USER,
                              payload={"text": event_id}, authority_gateway_id=GATEWAY, authority_epoch=1)


def sync_say(engine: Engine, event_id: str, room_id: str = "r1") -> None:
    """An append through the synchronous API from another thread (a concurrent appender)."""
    from hostedrooms import rooms as sync_rooms

    sync_rooms.append_event(engine, room_id=room_id, event_id=event_id, kind="message.user", actor=USER,
                            payload={"text": event_id}, authority_gateway_id=GATEWAY, authority_epoch=1)


def later(delay: float, *calls: Any) -> threading.Thread:
    """Run ``calls`` on another thread after ``delay`` seconds (while the test waits in follow())."""

    def run() -> None:
        time.sleep(delay)
        for call in calls:
            call()

    thread = threading.Thread(target=run)
    thread.start()
    return thread


def test_follows_the_log_as_it_commits_and_ends_after_disband(engine: Engine) -> None:
    make_room(engine, room_id="r1", gateway=GATEWAY)
    say(engine, "e1")
    other = create_engine(engine.url)
    feed = rooms.follow(engine, "r1", 0, **QUICK)
    try:
        assert next(feed)["event_id"] == "e1"
        writer = later(0.2, lambda: sync_say(other, "e2"), lambda: sync_say(other, "e3"), lambda: rooms_disband(other))
        rest = [(event["seq"], event["event_id"], event["kind"]) for event in feed]
        join(writer, 60)
    finally:
        other.dispose()
    assert rest == [(2, "e2", "message.user"), (3, "e3", "message.user"),
                    (4, "system:room-disbanded", "room.disbanded")]


def rooms_disband(engine: Engine) -> None:
    from hostedrooms import rooms as sync_rooms

    sync_rooms.disband_room(engine, room_id="r1", expected_gateway_id=GATEWAY, expected_epoch=1)


def test_resumes_from_a_cursor(engine: Engine) -> None:
    make_room(engine, room_id="r1", gateway=GATEWAY)
    for n in range(1, 6):
        say(engine, f"e{n}")
    rooms.disband_room(engine, room_id="r1", expected_gateway_id=GATEWAY, expected_epoch=1)
    assert [event["seq"] for event in rooms.follow(engine, "r1", 3, limit=2, **QUICK)] == [4, 5, 6]
    # After room.disbanded there is nothing left to wait for: the follower ends at once.
    assert list(rooms.follow(engine, "r1", 6, **QUICK)) == []


def test_bad_arguments_are_refused_before_anything_opens(engine: Engine) -> None:
    make_room(engine, room_id="r1", gateway=GATEWAY)
    with pytest.raises(HostedRoomError, match="^since_seq must be a non-negative integer$"):
        rooms.follow(engine, "r1", -1)
    with pytest.raises(HostedRoomError, match="^limit must be between 1 and 500$"):
        rooms.follow(engine, "r1", 0, limit=0)
    with pytest.raises(RoomNotFoundError, match="^hosted room not found$"):
        next(iter(rooms.follow(engine, "nope", 0, **QUICK)))
    with pytest.raises(HostedRoomError, match="^since_seq is ahead of the hosted room log$"):
        next(iter(rooms.follow(engine, "r1", 5, **QUICK)))
    assert engine.pool.checkedout() == 0


def test_a_room_purged_under_the_follower_is_history_expired(engine: Engine) -> None:
    make_room(engine, room_id="r1", gateway=GATEWAY)
    for n in range(1, 4):
        say(engine, f"e{n}")
    feed = rooms.follow(engine, "r1", 0, limit=1, **QUICK)
    assert next(feed)["seq"] == 1
    from hostedrooms import rooms as sync_rooms

    sync_rooms.disband_room(engine, room_id="r1", expected_gateway_id=GATEWAY, expected_epoch=1)
    sync_rooms.prune_disbanded_rooms(engine, now=time.time() + 10**9)
    with pytest.raises(RoomHistoryExpiredError, match="^Group Chat history expired"):
        next(feed)


def test_closing_a_follower_leaves_nothing_open(engine: Engine, api: Any) -> None:
    make_room(engine, room_id="r1", gateway=GATEWAY)
    say(engine, "e1")
    feed = rooms.follow(engine, "r1", 0, **QUICK)
    assert next(feed)["seq"] == 1
    feed.close()  # type: ignore[attr-defined]
    _nothing_open(engine, api)


def _nothing_open(engine: Engine, api: Any) -> None:
    """No checked-out connection in any pool of the test (its Engine, the asyncio twins), and on PostgreSQL no
    session of the database idle in a transaction or still listening."""
    engines = [engine] + ([twin.sync_engine for _, twin in api._twins.values()] if api.name == "async" else [])
    if api.name == "async":
        from hostedrooms.aio.engines import runner_of

        engines += [runner.engine for runner in map(runner_of, engines) if runner is not None]
    assert [pooled.pool.checkedout() for pooled in engines] == [0] * len(engines)
    if engine.dialect.name == "postgresql":  # a discarded connection's session ends once its server sees it closed
        deadline = time.monotonic() + 10
        with engine.connect() as connection:
            while (busy := connection.execute(sa.text(
                    "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                    "AND pid <> pg_backend_pid() AND (state LIKE 'idle in transaction%' OR query LIKE 'LISTEN%')"
            )).scalar_one()) and time.monotonic() < deadline:
                connection.rollback()
                time.sleep(0.01)
        assert busy == 0


def test_concurrent_appenders_each_seq_once_in_order(engine: Engine) -> None:
    make_room(engine, room_id="r1", gateway=GATEWAY)
    writers, each = 4, 15
    engines = [create_engine(engine.url) for _ in range(writers)]
    threads = [later(0.05, *[lambda w=w, n=n: sync_say(engines[w], f"w{w}-{n}") for n in range(each)])
               for w in range(writers)]
    feed = rooms.follow(engine, "r1", 0, limit=7, **QUICK)
    seen = [next(feed) for _ in range(writers * each)]
    feed.close()  # type: ignore[attr-defined]
    for thread in threads:
        join(thread, 60)
    for built in engines:
        built.dispose()
    assert [event["seq"] for event in seen] == list(range(1, writers * each + 1))
    assert len({event["event_id"] for event in seen}) == writers * each


@pytest.mark.parametrize("backend", ["postgresql"])
def test_a_slow_lower_seq_commits_before_any_later_seq_is_visible(engine: Engine) -> None:
    """Two real writers: A allocates seq 2 and stays open; B's append of seq 3 must wait on the room row lock, so
    the follower can never see 3 before 2 (no skipped seq), and sees both, in order, once A commits."""
    make_room(engine, room_id="r1", gateway=GATEWAY)
    say(engine, "e1")
    feed = rooms.follow(engine, "r1", 1, **QUICK)
    slow_engine, fast_engine = create_engine(engine.url), create_engine(engine.url)
    release, allocated = threading.Event(), threading.Event()
    seen: list[int] = []

    def slow() -> None:
        event = PreparedEvent("slow", "message.user", '{"id":"u1","kind":"user"}', '{"text":"slow"}', 1)
        with UnitOfWork(slow_engine) as uow:
            RoomTransaction(uow).append("r1", [event], gateway_id=GATEWAY, epoch=1, now=time.time())
            allocated.set()
            release.wait(30)
            uow.commit()

    slow_writer = threading.Thread(target=slow)
    slow_writer.start()
    assert allocated.wait(30)
    fast_writer = later(0, lambda: sync_say(fast_engine, "fast"))
    try:
        with engine.connect() as connection:  # the fast writer is queued behind the slow one's row lock
            deadline = time.monotonic() + 30
            while connection.execute(sa.text(
                    "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                    "AND wait_event_type = 'Lock'")).scalar_one() == 0:
                assert time.monotonic() < deadline
                connection.rollback()
                time.sleep(0.01)
        reader = later(0, lambda: seen.extend(next(feed)["seq"] for _ in range(2)))
        time.sleep(0.3)
        assert seen == []  # nothing is visible while seq 2 is uncommitted
        release.set()
        reader.join(30)
        assert seen == [2, 3]
    finally:
        release.set()
        slow_writer.join(30)
        fast_writer.join(30)
        feed.close()  # type: ignore[attr-defined]
        slow_engine.dispose()
        fast_engine.dispose()


# --- the ledger's work wake-ups ---------------------------------------------------------------------------------


def _outbound(ledger: Any, request_id: str) -> None:
    ledger.prepare_outbound(
        request_id=request_id, source_session_id="chat", source_run_id="run",
        snapshot={"connection_id": "c", "source_route_id": "r", "source_route_revision": "1",
                  "source_chat_id": "chat", "action": "instruction"},
        body="hi", action="instruction", expires_at=2**40)


@pytest.mark.sync_api_only  # the asyncio wake-up has its own test below
def test_ledger_work_wakeup_sync(engine: Engine) -> None:
    ledger = DeliveryLedger(engine)
    other = DeliveryLedger(create_engine(engine.url))
    with ledger.work_wakeup(poll_interval=0.01) as wakeup:
        assert wakeup.wait(0.1) is False
        writer = later(0.1, lambda: _outbound(other, "out-1"))
        started = time.monotonic()
        assert wakeup.wait(30) is True
        assert time.monotonic() - started < 20  # woken, not timed out
        join(writer, 60)
        assert [row["request_id"] for row in ledger.pending_outbound()] == ["out-1"]
    other.engine.dispose()
    assert engine.pool.checkedout() == 0


@pytest.mark.sync_api_only  # drives hostedrooms.aio itself
def test_ledger_work_wakeup_async(engine: Engine) -> None:
    other = DeliveryLedger(create_engine(engine.url))

    async def scenario() -> list[str]:
        async_engine = aio.create_async_engine(engine.url)
        try:
            ledger = await aio.open_ledger(async_engine)
            async with ledger.work_wakeup(poll_interval=0.01) as wakeup:
                assert await wakeup.wait(0.1) is False
                writer = asyncio.create_task(asyncio.to_thread(_outbound, other, "out-1"))
                assert await wakeup.wait(30) is True
                await writer
                return [row["request_id"] for row in await ledger.pending_outbound()]
        finally:
            await async_engine.dispose()

    assert asyncio.run(scenario()) == ["out-1"]
    other.engine.dispose()


@pytest.mark.sync_api_only  # drives hostedrooms.aio itself
def test_cancelling_an_async_follower_leaves_nothing_open(engine: Engine, api: Any) -> None:
    make_room(engine, room_id="r1", gateway=GATEWAY)
    say(engine, "e1")

    async def scenario() -> tuple[list[int], list[int]]:
        async_engine = aio.create_async_engine(engine.url)
        seen: list[int] = []

        async def consume() -> None:
            async for event in aio.rooms.follow(async_engine, "r1", 0, **QUICK):
                seen.append(event["seq"])

        task = asyncio.create_task(consume())
        await asyncio.sleep(0.3)  # waiting for the next commit
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        from hostedrooms.aio.engines import runner_of

        runner = runner_of(async_engine.sync_engine)
        checked_out = [async_engine.sync_engine.pool.checkedout(), runner.engine.pool.checkedout()]
        await async_engine.dispose()
        return seen, checked_out

    seen, checked_out = asyncio.run(scenario())
    assert seen == [1] and checked_out == [0, 0]
    _nothing_open(engine, api)

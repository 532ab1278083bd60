"""Followers never starve writers: every follower of an engine waits on the engine's one shared waiter (one
``LISTEN`` connection, or one ``data_version`` poller, outside the services' pool) and checks a pooled connection
out only to read. 200 followers on one engine with the default pool, on both backends, through the synchronous API
(threads) and the asyncio API (tasks; services in threads and awaited): none fails, no pooled connection is held
while they wait, an append to another room does not wait for them, and every follower of the appended room sees
its event. And a follow() abandoned under an anyio cancel scope (what Starlette does when an SSE client goes)
leaves no warning, no error log and nothing checked out."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import threading
import time
import warnings
from typing import Any

import anyio
import pytest
import sqlalchemy as sa
from factories import make_room
from sqlalchemy import Engine

from hostedrooms import aio, rooms
from hostedrooms.aio.engines import runner_for

FOLLOWERS = 200
GATEWAY = "install:gw-a"
USER = {"kind": "user", "id": "u1"}
#: No fallback re-read during the test: a follower reads only when woken, so an idle pool means idle followers.
WAITING = {"fallback_interval": 60.0}
#: A generous bound proving the append does not wait for the followers (it waited for a pool slot for 27 s).
APPEND_BOUND = 1.0


def event_of(event_id: str, room_id: str) -> dict[str, Any]:
    return {"room_id": room_id, "event_id": event_id, "kind": "message.user", "actor": USER,
            "payload": {"text": event_id}, "authority_gateway_id": GATEWAY, "authority_epoch": 1}


def two_rooms(engine: Engine) -> None:
    """``followed`` (holding seq 1, which every follower reads first) and ``other``, which nobody follows."""
    make_room(engine, room_id="followed", gateway=GATEWAY)
    make_room(engine, room_id="other", gateway=GATEWAY)
    rooms.append_event(engine, **event_of("first", "followed"))


def wait_until(condition: Any, what: str, seconds: float = 60.0) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.01)


def listening_sessions(engine: Engine) -> int:
    """PostgreSQL sessions of the database (other than this one) whose last statement was a LISTEN."""
    with engine.connect() as connection:
        return int(connection.execute(sa.text(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
            "AND pid <> pg_backend_pid() AND query LIKE 'LISTEN%'")).scalar_one())


def waiter_threads() -> int:
    return sum(thread.name == "hostedrooms-wakeup" for thread in threading.enumerate())


def assert_one_waiting_connection(engine: Engine) -> None:
    if engine.dialect.name == "postgresql":
        assert listening_sessions(engine) == 1


def assert_waiters_gone(engine: Engine) -> None:
    """The last follower gone, the shared waiter ends and closes its connection."""
    wait_until(lambda: waiter_threads() == 0, "the shared waiter to end", 10)
    if engine.dialect.name == "postgresql":
        wait_until(lambda: listening_sessions(engine) == 0, "the LISTEN session to end", 10)


def test_sync_followers_never_starve_writers(engine: Engine) -> None:
    two_rooms(engine)
    seen: list[list[int]] = [[] for _ in range(FOLLOWERS)]
    errors: list[BaseException] = []

    def follower(index: int) -> None:
        try:
            with contextlib.closing(rooms.follow(engine, "followed", 0, **WAITING)) as feed:
                for event in feed:
                    seen[index].append(event["seq"])
                    if event["seq"] == 2:
                        return
        except BaseException as exc:  # reported by the test
            errors.append(exc)

    threads = [threading.Thread(target=follower, args=(index,), daemon=True) for index in range(FOLLOWERS)]
    for thread in threads:
        thread.start()
    wait_until(lambda: errors or all(seen), "every follower to read seq 1")
    assert errors == []
    assert engine.pool.checkedout() == 0  # waiting followers hold no pooled connection
    assert_one_waiting_connection(engine)

    started = time.monotonic()
    rooms.append_event(engine, **event_of("elsewhere", "other"))
    assert time.monotonic() - started < APPEND_BOUND

    rooms.append_event(engine, **event_of("second", "followed"))
    for thread in threads:
        thread.join(60)
    assert errors == []
    assert seen == [[1, 2]] * FOLLOWERS
    assert engine.pool.checkedout() == 0
    assert_waiters_gone(engine)


@pytest.mark.parametrize("services", ["threads", "awaited"])
def test_async_followers_never_starve_writers(engine: Engine, services: str) -> None:
    two_rooms(engine)

    async def scenario() -> tuple[list[list[int]], float]:
        async_engine = aio.create_async_engine(engine.url, services=services)
        pools = [async_engine.sync_engine.pool, (await runner_for(async_engine)).engine.pool]
        seen: list[list[int]] = [[] for _ in range(FOLLOWERS)]

        async def follower(index: int) -> None:
            feed = aio.rooms.follow(async_engine, "followed", 0, **WAITING)
            async with contextlib.aclosing(feed):
                async for event in feed:
                    seen[index].append(event["seq"])
                    if event["seq"] == 2:
                        return

        try:
            tasks = [asyncio.create_task(follower(index)) for index in range(FOLLOWERS)]
            deadline = time.monotonic() + 60
            while not all(seen):
                failed = [task for task in tasks if task.done()]
                assert not failed, failed[0].exception()
                assert time.monotonic() < deadline, "timed out waiting for every follower to read seq 1"
                await asyncio.sleep(0.01)
            await asyncio.sleep(0.05)  # every follower back in its wait
            assert [pool.checkedout() for pool in pools] == [0, 0]
            await asyncio.to_thread(assert_one_waiting_connection, engine)

            started = time.monotonic()
            await aio.rooms.append_event(async_engine, **event_of("elsewhere", "other"))
            elapsed = time.monotonic() - started

            await aio.rooms.append_event(async_engine, **event_of("second", "followed"))
            await asyncio.wait_for(asyncio.gather(*tasks), 60)
            assert [pool.checkedout() for pool in pools] == [0, 0]
            return seen, elapsed
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            await async_engine.dispose()

    seen, elapsed = asyncio.run(scenario())
    assert elapsed < APPEND_BOUND
    assert seen == [[1, 2]] * FOLLOWERS
    assert_waiters_gone(engine)


# --- abandoned under an anyio cancel scope ---------------------------------------------------------------------


#: How long each follower runs before its scope is cancelled: while it enters, reads and waits.
CANCEL_AFTER = (0.0, 0.001, 0.01, 0.05, 0.3)


@pytest.mark.parametrize("services", ["threads", "awaited"])
def test_follow_abandoned_under_an_anyio_cancel_scope_leaves_nothing(
        engine: Engine, services: str, caplog: pytest.LogCaptureFixture) -> None:
    two_rooms(engine)
    caplog.set_level(logging.WARNING)

    async def scenario() -> list[list[int]]:
        async_engine = aio.create_async_engine(engine.url, services=services)
        pools = [async_engine.sync_engine.pool, (await runner_for(async_engine)).engine.pool]
        checked_out: list[list[int]] = []
        try:
            for delay in CANCEL_AFTER * 3:
                async def consume() -> None:
                    async for _event in aio.rooms.follow(async_engine, "followed", 0, **WAITING):
                        pass

                # Starlette's StreamingResponse: the body and a disconnect listener in one task group; the
                # client leaving cancels the group's scope, whatever the body is awaiting.
                async with anyio.create_task_group() as group:
                    group.start_soon(consume)
                    await anyio.sleep(delay)
                    group.cancel_scope.cancel()
                gc.collect()
                checked_out.append([pool.checkedout() for pool in pools])
            return checked_out
        finally:
            await async_engine.dispose()

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        checked_out = anyio.run(scenario, backend="asyncio")
        gc.collect()
    assert [str(warning.message) for warning in caught] == []
    assert [record.getMessage() for record in caplog.records] == []
    assert checked_out == [[0, 0]] * len(CANCEL_AFTER) * 3
    assert_waiters_gone(engine)

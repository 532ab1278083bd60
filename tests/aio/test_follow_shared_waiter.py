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
import os
import subprocess
import sys
import threading
import time
import warnings
from typing import Any

import anyio
import pytest
import sqlalchemy as sa
from factories import make_room, outbound
from sqlalchemy import Engine
from waits import join, wait_child

from hostedrooms import aio, rooms
from hostedrooms.aio.engines import runner_for
from hostedrooms.ledger import DeliveryLedger

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


# --- the ledger's work wake-ups share the waiter ----------------------------------------------------------------


def test_ledger_workers_and_followers_share_the_one_waiting_connection(engine: Engine) -> None:
    two_rooms(engine)
    ledger = DeliveryLedger(engine)
    with contextlib.ExitStack() as stack:
        wakeups = [stack.enter_context(ledger.work_wakeup()) for _ in range(40)]
        followers = [follow_in_thread(engine, 1) for _ in range(40)]
        wait_until(lambda: engine.pool.checkedout() == 0, "the followers to wait")
        time.sleep(0.2)  # the followers in their wait
        assert engine.pool.checkedout() == 0
        assert_one_waiting_connection(engine)
        assert waiter_threads() == 1
        ledger.prepare_outbound(**outbound())
        assert [wakeup.wait(30) for wakeup in wakeups] == [True] * 40  # woken: none waited its 30 s
        rooms.append_event(engine, **event_of("second", "followed"))
        for thread, _ in followers:
            thread.join(30)
        assert [outcome for _, outcome in followers] == [[2]] * 40
    assert engine.pool.checkedout() == 0
    assert_waiters_gone(engine)


def test_async_ledger_workers_share_the_one_waiting_connection(engine: Engine) -> None:
    other = DeliveryLedger(engine)

    async def scenario() -> list[bool]:
        async_engine = aio.create_async_engine(engine.url)
        pools = [async_engine.sync_engine.pool, (await runner_for(async_engine)).engine.pool]
        try:
            ledger = await aio.open_ledger(async_engine)
            async with contextlib.AsyncExitStack() as stack:
                wakeups = [await stack.enter_async_context(ledger.work_wakeup()) for _ in range(40)]
                assert [pool.checkedout() for pool in pools] == [0, 0]
                await asyncio.to_thread(assert_one_waiting_connection, engine)
                await asyncio.to_thread(other.prepare_outbound, **outbound())
                return [await wakeup.wait(30) for wakeup in wakeups]
        finally:
            await async_engine.dispose()

    assert asyncio.run(scenario()) == [True] * 40  # woken: none waited its 30 s
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


# --- processes, the poller's connection, a lost waiting connection, fork ---------------------------------------


def target_of(engine: Engine) -> str:
    """What another process opens to reach ``engine``'s database."""
    if engine.dialect.name == "sqlite":
        return str(engine.url.database)
    return engine.url.render_as_string(hide_password=False)


def follow_in_thread(engine: Engine, since: int) -> tuple[threading.Thread, list[Any]]:
    """A follower on another thread taking one event after ``since`` (or the error it raised)."""
    outcome: list[Any] = []

    def run() -> None:
        try:
            with contextlib.closing(rooms.follow(engine, "followed", since, **WAITING)) as feed:
                outcome.append(next(feed)["seq"])
        except BaseException as exc:  # reported by the test
            outcome.append(exc)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, outcome


APPEND_IN_CHILD = """
import sys
import hostedrooms
from hostedrooms import rooms
rooms.append_event(hostedrooms.create_engine(sys.argv[1]), room_id="followed", event_id=sys.argv[2],
                   kind="message.user", actor={"kind": "user", "id": "u1"}, payload={"text": "hi"},
                   authority_gateway_id="install:gw-a", authority_epoch=1)
"""


def test_commits_of_other_processes_wake_the_followers(engine: Engine) -> None:
    two_rooms(engine)
    followers = [follow_in_thread(engine, 1) for _ in range(20)]
    wait_until(lambda: waiter_threads() == 1, "the shared waiter")
    time.sleep(0.2)  # the followers in their wait
    subprocess.run([sys.executable, "-c", APPEND_IN_CHILD, target_of(engine), "from-child"], check=True, timeout=60)
    for thread, _ in followers:
        thread.join(30)  # woken: the fallback re-read would come after 60 s
    assert [outcome for _, outcome in followers] == [[2]] * 20
    assert_waiters_gone(engine)


@pytest.mark.parametrize("backend", ["sqlite"])
def test_the_poller_s_connection_never_drops_this_process_s_locks(engine: Engine) -> None:
    """Closing any descriptor of a SQLite file drops every POSIX lock the process holds on it. The poller's
    connection opens and closes with its waiter (here five times) while another connection of this process holds
    the write lock: another process must still find the database locked."""
    two_rooms(engine)
    probe = ("import sqlite3, sys\n"
             "try:\n    sqlite3.connect(sys.argv[1], timeout=0, isolation_level=None).execute('BEGIN IMMEDIATE')\n"
             "except sqlite3.OperationalError as exc:\n    print(exc)\nelse:\n    print('acquired')\n")
    with engine.connect() as holder:
        holder.begin()  # BEGIN IMMEDIATE: this process holds the write lock
        for _ in range(5):
            with contextlib.closing(rooms.follow(engine, "followed", 0, **WAITING)) as feed:
                assert next(feed)["seq"] == 1
            wait_until(lambda: waiter_threads() == 0, "the shared waiter to end", 10)
        found = subprocess.run([sys.executable, "-c", probe, target_of(engine)], check=True, timeout=60,
                               capture_output=True, text=True).stdout.strip()
        holder.rollback()
    assert found == "database is locked"


# A lost waiting connection: tests/aio/test_follow_reconnect.py (the waiter reconnects; followers go on).


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_a_forked_child_starts_its_own_waiter(engine: Engine) -> None:
    """A waiter running when the process forks does not exist in the child (its thread is not copied): a
    follower there must not join it and wait in vain, but start the child's own."""
    two_rooms(engine)
    parent_follower = follow_in_thread(engine, 1)
    wait_until(lambda: waiter_threads() == 1, "the parent's shared waiter")
    pid = os.fork()
    if pid == 0:  # the child: SQLAlchemy's fork recipe, then a follower woken by an append of its own
        code = 1
        try:
            engine.dispose(close=False)
            thread, outcome = follow_in_thread(engine, 1)
            time.sleep(0.5)  # the follower in its wait
            rooms.append_event(engine, **event_of("from-child", "followed"))
            thread.join(20)  # woken: the fallback re-read would come after 60 s
            code = 0 if outcome == [2] else 1
        finally:
            os._exit(code)
    code = wait_child(pid, 60)
    join(parent_follower[0], 30)
    assert code == 0
    assert parent_follower[1] == [2]
    assert_waiters_gone(engine)

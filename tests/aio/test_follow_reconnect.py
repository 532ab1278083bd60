"""Followers survive their listener (PostgreSQL): the engine's one ``LISTEN`` connection terminated under waiting
followers (synchronous and asyncio) and ledger wake-ups is opened again, and every follower goes on from its
cursor: the events appended before, during and after each loss reach each follower exactly once, in order. A
server unreachable for longer than ``reconnect_deadline`` ends them with StoreUnavailableError, not before; one
back within it loses them nothing. SQLite's poller, its connection failing, does the same."""

from __future__ import annotations

import asyncio
import contextlib
import sqlite3
import threading
import time
from typing import Any

import pytest
import sqlalchemy as sa
from factories import outbound
from sqlalchemy import Engine
from tcp_proxy import Proxy
from test_follow_shared_waiter import event_of, two_rooms, wait_until, waiter_threads
from waits import join

from hostedrooms import aio, create_engine, rooms, wakeup
from hostedrooms.backends import SQLiteBackend
from hostedrooms.errors import StoreUnavailableError
from hostedrooms.ledger import DeliveryLedger

POSTGRESQL = pytest.mark.parametrize("backend", ["postgresql"])

#: No fallback re-read within the test's bounds: an event committed while no connection listened reaches a
#: follower only through the wake-up after the reconnection.
WAITING = {"fallback_interval": 120.0}
LAST = 6


def listen_pids(engine: Engine) -> set[int]:
    with engine.connect() as connection:
        return set(connection.execute(sa.text(
            "SELECT pid FROM pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid() "
            "AND query LIKE 'LISTEN%'")).scalars())


def terminate_listeners(engine: Engine, expected: int) -> None:
    """Terminate every LISTEN backend (``expected`` of them) and wait until they are gone."""
    pids = listen_pids(engine)
    assert len(pids) == expected, pids
    with engine.connect() as connection:
        for pid in pids:
            connection.execute(sa.text("SELECT pg_terminate_backend(:pid)"), {"pid": pid})
    wait_until(lambda: not pids & all_pids(engine), "the LISTEN backends to end", 30)


def all_pids(engine: Engine) -> set[int]:
    with engine.connect() as connection:
        return set(connection.execute(sa.text("SELECT pid FROM pg_stat_activity")).scalars())


class SyncFollower:
    """A follower on a thread, collecting seqs until ``last`` (or the error it raised)."""

    def __init__(self, engine: Engine, since: int, last: int, **options: Any) -> None:
        self.seen: list[int] = []
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, args=(engine, since, last, options), daemon=True)
        self.thread.start()

    def _run(self, engine: Engine, since: int, last: int, options: dict[str, Any]) -> None:
        try:
            with contextlib.closing(rooms.follow(engine, "followed", since, **options)) as feed:
                for event in feed:
                    self.seen.append(event["seq"])
                    if event["seq"] == last:
                        return
        except BaseException as exc:  # reported by the test
            self.error = exc


class AsyncFollowers:
    """``count`` asyncio followers on one event loop (a thread), each collecting seqs until ``last``."""

    def __init__(self, url: Any, count: int, since: int, last: int, engine_options: dict[str, Any] | None = None,
                 **options: Any) -> None:
        self.seen: list[list[int]] = [[] for _ in range(count)]
        self.errors: list[BaseException | None] = [None] * count
        self._args = (url, since, last, engine_options or {}, options)
        self.thread = threading.Thread(target=lambda: asyncio.run(self._run()), daemon=True)
        self.thread.start()

    async def _run(self) -> None:
        url, since, last, engine_options, options = self._args
        async_engine = aio.create_async_engine(url, **engine_options)

        async def one(index: int) -> None:
            try:
                feed = aio.rooms.follow(async_engine, "followed", since, **options)
                async with contextlib.aclosing(feed):
                    async for event in feed:
                        self.seen[index].append(event["seq"])
                        if event["seq"] == last:
                            return
            except Exception as exc:  # reported by the test
                self.errors[index] = exc

        try:
            await asyncio.wait_for(asyncio.gather(*(one(index) for index in range(len(self.seen)))), 90)
        finally:
            await async_engine.dispose()


@POSTGRESQL
def test_followers_survive_a_terminated_listen_connection(engine: Engine, monkeypatch: pytest.MonkeyPatch) -> None:
    # A slower first retry: the appends after each termination commit while no connection listens.
    monkeypatch.setattr(wakeup, "RECONNECT_FIRST", 0.6)
    two_rooms(engine)  # seq 1
    followers = [SyncFollower(engine, 0, LAST, **WAITING) for _ in range(2)]
    async_followers = AsyncFollowers(engine.url, 2, 0, LAST, **WAITING)
    ledger = DeliveryLedger(engine)

    def all_at(seq: int) -> bool:
        return all(f.seen[-1:] == [seq] for f in followers) and all(s[-1:] == [seq] for s in async_followers.seen)

    with ledger.work_wakeup() as work:
        # Two waiting connections: the synchronous engine's and the one of the AsyncEngine's twin.
        wait_until(lambda: len(listen_pids(engine)) == 2 and all(f.seen for f in followers)
                   and all(async_followers.seen), "every follower to read seq 1")
        rooms.append_event(engine, **event_of("before", "followed"))  # seq 2
        for lost in (3, 5):
            wait_until(lambda: all_at(lost - 1), "the followers")  # noqa: B023 (called at once)
            terminate_listeners(engine, 2)
            rooms.append_event(engine, **event_of(f"lost-{lost}", "followed"))  # never notified
            # Read without a notification (the fallback re-read is far off): the wake-up after reconnecting.
            wait_until(lambda: all_at(lost),  # noqa: B023 (called at once)
                       "the followers to read what committed while nobody listened", 30)
            rooms.append_event(engine, **event_of(f"after-{lost}", "followed"))  # seq 4, 6
        for follower in followers:
            join(follower.thread, 60)
        join(async_followers.thread, 90)
        assert [(f.seen, f.error) for f in followers] == [(list(range(1, LAST + 1)), None)] * 2
        assert async_followers.errors == [None, None]
        assert async_followers.seen == [list(range(1, LAST + 1))] * 2

        # The ledger's wake-up survived too: woken (by the reconnections, then by due work), never failed.
        assert work.wait(30)
        ledger.prepare_outbound(**outbound())
        assert work.wait(30)
    assert engine.pool.checkedout() == 0


def proxied(engine: Engine, proxy: Proxy) -> dict[str, Any]:
    """Engine options whose waiting connection goes through ``proxy`` (the services connect directly)."""
    return {"pooler": "session", "listen_url": engine.url.set(host="127.0.0.1", port=proxy.port)}


DEADLINE = 1.5


@POSTGRESQL
def test_a_server_unreachable_past_the_deadline_fails_the_followers(engine: Engine) -> None:
    two_rooms(engine)
    with Proxy((str(engine.url.host), int(engine.url.port or 5432))) as proxy:
        options = proxied(engine, proxy)
        through = create_engine(engine.url, **options)
        try:
            followers = [SyncFollower(through, 1, 2, reconnect_deadline=DEADLINE, **WAITING) for _ in range(2)]
            async_followers = AsyncFollowers(engine.url, 2, 1, 2, options, reconnect_deadline=DEADLINE, **WAITING)
            wait_until(lambda: len(listen_pids(engine)) == 2, "the two waiting connections")
            time.sleep(0.2)  # the followers in their wait
            cut = time.monotonic()
            proxy.cut()  # the waiting connections dropped, and every new one refused
            for follower in followers:
                join(follower.thread, 30)
            join(async_followers.thread, 30)
            failed = time.monotonic()
        finally:
            through.dispose()
    errors = [follower.error for follower in followers] + async_followers.errors
    assert all(isinstance(error, StoreUnavailableError) for error in errors), errors
    assert failed - cut >= DEADLINE  # not before the deadline
    assert [follower.seen for follower in followers] + async_followers.seen == [[]] * 4


@POSTGRESQL
def test_a_server_back_within_the_deadline_loses_nothing(engine: Engine) -> None:
    two_rooms(engine)
    with Proxy((str(engine.url.host), int(engine.url.port or 5432))) as proxy:
        options = proxied(engine, proxy)
        through = create_engine(engine.url, **options)
        try:
            followers = [SyncFollower(through, 1, 3, **WAITING) for _ in range(2)]
            async_followers = AsyncFollowers(engine.url, 2, 1, 3, options, **WAITING)
            wait_until(lambda: len(listen_pids(engine)) == 2, "the two waiting connections")
            time.sleep(0.2)  # the followers in their wait
            proxy.cut()
            rooms.append_event(engine, **event_of("unheard", "followed"))  # seq 2: nobody listens
            time.sleep(1.0)  # several reconnection attempts refused
            proxy.restore()
            wait_until(lambda: len(listen_pids(engine)) == 2, "the waiters to reconnect", 30)
            rooms.append_event(engine, **event_of("heard", "followed"))  # seq 3
            for follower in followers:
                join(follower.thread, 30)
            join(async_followers.thread, 30)
        finally:
            through.dispose()
    assert [(f.seen, f.error) for f in followers] == [([2, 3], None)] * 2
    assert async_followers.errors == [None, None]
    assert async_followers.seen == [[2, 3]] * 2


@pytest.mark.parametrize("backend", ["sqlite"])
def test_a_failing_poller_connection_is_opened_again(engine: Engine, monkeypatch: pytest.MonkeyPatch) -> None:
    """The poller's reads failing (twice) end no follower: the waiter polls on a new connection and wakes them."""
    two_rooms(engine)
    failures = [sqlite3.OperationalError("disk I/O error")] * 2
    original = SQLiteBackend.change_counter

    def change_counter(self: SQLiteBackend, dbapi_connection: Any) -> int:
        if armed.is_set() and failures:
            raise failures.pop()
        return original(self, dbapi_connection)

    armed = threading.Event()
    monkeypatch.setattr(SQLiteBackend, "change_counter", change_counter)
    followers = [SyncFollower(engine, 1, 3, **WAITING) for _ in range(2)]
    wait_until(lambda: waiter_threads() == 1, "the shared waiter")
    time.sleep(0.2)  # the followers in their wait
    armed.set()
    wait_until(lambda: not failures, "the poller to fail twice")
    rooms.append_event(engine, **event_of("second", "followed"))
    rooms.append_event(engine, **event_of("third", "followed"))
    for follower in followers:
        join(follower.thread, 30)
    assert [(f.seen, f.error) for f in followers] == [([2, 3], None)] * 2

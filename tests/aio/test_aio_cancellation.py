"""Cancelling an asyncio call at any of its await points leaves nothing half-written and nothing open.

A call's await points are counted first (each time its coroutine suspends, waiting for a future: a worker
thread, or the awaited call as a whole); then, for every k, a fresh call is cancelled at its k-th await point, as
``Task.cancel()`` would (the awaited future is cancelled and CancelledError is raised there). Afterwards the
event (or the ledger transition) is either wholly there or wholly absent, ``verify()`` is clean, every pool has
all its connections back, and on PostgreSQL no session of the database is idle in a transaction. An awaited call
is also cancelled at each of its statements (below); ``test_aio_cancel_locks.py`` cancels calls at random moments
and checks the SQLite write lock from another process.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import sqlite3
from collections.abc import Callable, Coroutine, Generator
from typing import Any

import pytest
import sqlalchemy as sa
from factories import idle_in_transaction, make_room
from sqlalchemy import Engine
from sqlalchemy.ext.asyncio import create_async_engine as sa_create_async_engine

from hostedrooms import aio, models, verify
from hostedrooms.aio.engines import runner_of
from hostedrooms.ledger import DeliveryLedger

GATEWAY = "install:gw-a"


class CancelAt:
    """Await ``coroutine``, cancelling it at its ``at``-th suspension (never when ``at`` is None); ``count`` is
    how many suspensions it made."""

    def __init__(self, coroutine: Coroutine[Any, Any, Any], at: int | None) -> None:
        self.coroutine, self.at, self.count = coroutine, at, 0

    def __await__(self) -> Generator[Any, Any, Any]:
        steps = self.coroutine.__await__()
        send: Any = None
        throw: BaseException | None = None
        while True:
            try:
                waiting = steps.throw(throw) if throw is not None else steps.send(send)
            except StopIteration as done:
                return done.value
            throw, send = None, None
            self.count += 1
            if self.count == self.at:
                if hasattr(waiting, "cancel"):
                    waiting.cancel()
                throw = asyncio.CancelledError()
                continue
            try:
                send = yield waiting
            except BaseException as exc:
                throw = exc


SERVICES = pytest.mark.parametrize("services", ["threads", "awaited"])


def _cancelled_each_way(
    engine: Engine, call: Callable[[Any, int], Coroutine[Any, Any, Any]], check: Callable[[int, bool], None],
    services: str,
) -> int:
    """Run ``call(async_engine, n)`` uncancelled once (n = 0) to count its await points, then for each k a fresh
    call (n = k) cancelled at its k-th: ``check(n, cancelled)`` after each. Returns the count."""

    async def scenario() -> int:
        async_engine = aio.create_async_engine(engine.url, services=services)
        try:
            await call(async_engine, -1)  # warm: the runner and pooled connections exist, as in a running gateway
            counted = CancelAt(call(async_engine, 0), None)
            await counted
            check(0, False)
            for k in range(1, counted.count + 1):
                cancelled = False
                try:
                    await CancelAt(call(async_engine, k), k)
                except asyncio.CancelledError:
                    cancelled = True
                runner = runner_of(async_engine.sync_engine)
                assert async_engine.sync_engine.pool.checkedout() == 0, f"cancelled at {k}: a connection is out"
                assert runner.engine.pool.checkedout() == 0, f"cancelled at {k}: a connection is out"
                assert idle_in_transaction(engine) == 0, f"cancelled at {k}: a session is idle in a transaction"
                check(k, cancelled)
            return counted.count
        finally:
            await async_engine.dispose()

    return asyncio.run(scenario())


@SERVICES
def test_cancelling_an_append_at_each_await_point(engine: Engine, services: str) -> None:
    make_room(engine, room_id="r1", gateway=GATEWAY)

    def append(async_engine: Any, n: int) -> Coroutine[Any, Any, Any]:
        return aio.rooms.append_event(
            async_engine, room_id="r1", event_id=f"e{n}", kind="message.user", actor={"kind": "user", "id": "u1"},
            payload={"n": n}, authority_gateway_id=GATEWAY, authority_epoch=1)

    stored: list[int] = []

    def check(n: int, cancelled: bool) -> None:
        with engine.connect() as connection:
            found = connection.execute(sa.select(models.events.c.seq).where(
                models.events.c.room_id == "r1", models.events.c.event_id == f"e{n}")).first()
            next_seq = connection.execute(sa.select(models.rooms.c.next_seq).where(
                models.rooms.c.room_id == "r1")).scalar_one()
        if not cancelled:
            assert found is not None
        if found is not None:
            stored.append(n)
        assert next_seq == len(stored) + 2  # e-1 (the warm-up) and every stored event, nothing else
        assert verify(engine) == []

    count = _cancelled_each_way(engine, append, check, services)
    assert count >= 1
    # Every append is whole or absent; the ones cancelled before their commit are absent.
    assert 0 in stored


@SERVICES
def test_cancelling_a_ledger_transition_at_each_await_point(engine: Engine, services: str) -> None:
    ledger = DeliveryLedger(engine, clock=lambda: 1_000)
    for n in range(-1, 64):
        _prepare(ledger, n)

    def authorize_and_queue(async_engine: Any, n: int) -> Coroutine[Any, Any, Any]:
        async def run() -> Any:
            async_ledger = await _opened(async_engine)
            return await async_ledger.bind_owner(f"env-{n}", queued_id=f"q-{n}", run_id=None)

        return run()

    def check(n: int, cancelled: bool) -> None:
        row = ledger.get(f"env-{n}")
        assert row is not None
        assert (row["state"], row["queued_id"]) in {("authorized", None), ("queued", f"q-{n}")}
        if not cancelled:
            assert row["state"] == "queued"
        assert verify(engine) == []

    opened: dict[int, Any] = {}

    async def _opened(async_engine: Any) -> Any:
        if id(async_engine) not in opened:
            opened[id(async_engine)] = await aio.open_ledger(async_engine, clock=lambda: 1_000)
        return opened[id(async_engine)]

    count = _cancelled_each_way(engine, authorize_and_queue, check, services)
    assert count >= 1


def _prepare(ledger: DeliveryLedger, n: int) -> None:
    envelope = {
        "envelope_id": f"env-{n}", "request_id": f"req-{n}", "team_id": "team", "source_server_identity": "src",
        "source_route_id": "route", "source_route_revision": "1", "target_server_identity": "dst",
        "target_route_id": "troute", "target_route_revision": "1", "action": "instruction", "kind": "instruction",
        "exchange_id": f"x-{n}", "used_legs": 1, "max_legs": 6, "expires_at": 2**40, "body": {"message": "hi"}}
    ledger.prepare(envelope, transport_role="host", connection_id="conn", lease_token="lease",
                   target_chat_id="chat")
    ledger.authorize(f"env-{n}")


def test_an_awaited_call_cancelled_at_each_of_its_statements_runs_to_its_end(engine: Engine) -> None:
    """Awaited, a call runs on the loop: cancelled while any of its statements runs (once, or again as it goes on,
    as timeouts and anyio's cancel scopes do), it runs to its end, as in a worker thread, then the CancelledError
    reaches the caller, with the connection back in the pool and no lock held."""
    make_room(engine, room_id="r1", gateway=GATEWAY)

    async def scenario() -> int:
        async_engine = aio.create_async_engine(engine.url, services="awaited")
        cancel_at: set[int] = set()
        seen = [0]
        task: asyncio.Future[Any] | None = None

        def statement(*_args: Any) -> None:
            seen[0] += 1
            if seen[0] in cancel_at and task is not None:
                task.cancel()

        sa.event.listen(async_engine.sync_engine, "before_cursor_execute", statement)

        def append(n: int) -> Coroutine[Any, Any, Any]:
            return aio.rooms.append_event(
                async_engine, room_id="r1", event_id=f"e{n}", kind="message.user",
                actor={"kind": "user", "id": "u1"}, payload={}, authority_gateway_id=GATEWAY, authority_epoch=1)

        try:
            await append(-1)  # warm: the runner and a pooled connection exist
            seen[0] = 0
            await append(0)
            count = seen[0]
            for k in range(1, count + 1):
                seen[0], cancel_at = 0, {k} if k % 2 else {k, k + 1}
                task = asyncio.ensure_future(append(k))
                with pytest.raises(asyncio.CancelledError):
                    await task
                assert async_engine.sync_engine.pool.checkedout() == 0, f"cancelled at statement {k}"
                assert idle_in_transaction(engine) == 0, f"cancelled at statement {k}"
                _assert_write_lock_free(engine)
                with engine.connect() as connection:  # the call ran to its end: committed, whole
                    assert connection.execute(sa.select(models.events.c.seq).where(
                        models.events.c.event_id == f"e{k}")).all() == [(k + 2,)], f"cancelled at statement {k}"
            return count
        finally:
            await async_engine.dispose()

    statements = asyncio.run(scenario())
    # On PostgreSQL an append is one statement in autocommit; on SQLite several (advance the room, the budget, insert).
    assert statements == 1 if engine.dialect.name == "postgresql" else statements >= 2
    assert verify(engine) == []


def test_cancelling_the_first_call_on_an_adopted_engine_still_closes_its_old_connections(
    engine: Engine, caplog: pytest.LogCaptureFixture,
) -> None:
    """An AsyncEngine built elsewhere gets hostedrooms' connection hooks on its first call, which closes the
    connections it pooled before; cancelled meanwhile, that close still ends (none leaks, nothing is logged)."""
    driver = "sqlite+aiosqlite" if engine.dialect.name == "sqlite" else "postgresql+psycopg"

    async def scenario(k: int) -> None:
        adopted = sa_create_async_engine(engine.url.set(drivername=driver))
        try:
            async with adopted.connect():
                pass  # one pooled connection, opened without the hooks
            task = asyncio.ensure_future(aio.rooms.list_rooms(adopted))
            for _ in range(k):
                await asyncio.sleep(0)
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
            assert adopted.sync_engine.pool.checkedout() == 0, f"cancelled after {k} loop iterations"
        finally:
            await adopted.dispose()

    caplog.set_level(logging.WARNING)
    for k in range(8):
        asyncio.run(scenario(k))
    assert [record.getMessage() for record in caplog.records if record.levelno >= logging.WARNING] == []


def _assert_write_lock_free(engine: Engine) -> None:
    """On SQLite, another connection takes the file's write lock within 100 ms."""
    if engine.dialect.name != "sqlite":
        return
    other = sqlite3.connect(str(engine.url.database), timeout=0.1, isolation_level=None)
    try:
        other.execute("BEGIN IMMEDIATE")
        other.execute("ROLLBACK")
    finally:
        other.close()


@pytest.mark.parametrize("backend", ["sqlite"])
def test_a_call_cancelled_while_its_worker_thread_runs_ends_its_transaction_first(engine: Engine) -> None:
    """A call runs in a worker thread: cancelled while the thread waits for SQLite's write lock, the call still
    ends its transaction (here: commits, once the lock is free) before the CancelledError reaches the caller, so
    its connection is back in the pool by then."""
    import threading

    make_room(engine, room_id="r1", gateway=GATEWAY)
    blocker = engine.raw_connection()
    blocker.cursor().execute("BEGIN IMMEDIATE")  # the write lock: the append's BEGIN IMMEDIATE waits for it

    async def scenario() -> tuple[bool, int]:
        async_engine = aio.create_async_engine(engine.url)
        try:
            await aio.rooms.list_rooms(async_engine)  # warm: the twin exists
            task = asyncio.create_task(aio.rooms.append_event(
                async_engine, room_id="r1", event_id="e1", kind="message.user", actor={"kind": "user", "id": "u1"},
                payload={}, authority_gateway_id=GATEWAY, authority_epoch=1))
            await asyncio.sleep(0.2)  # the worker thread is waiting in BEGIN IMMEDIATE
            task.cancel()
            threading.Timer(0.3, lambda: blocker.cursor().execute("COMMIT")).start()
            cancelled = False
            try:
                await task
            except asyncio.CancelledError:
                cancelled = True
            return cancelled, runner_of(async_engine.sync_engine).engine.pool.checkedout()
        finally:
            await async_engine.dispose()

    try:
        cancelled, checked_out = asyncio.run(scenario())
    finally:
        blocker.close()
    assert cancelled and checked_out == 0
    with engine.connect() as connection:  # the call ran to its end: committed, whole
        assert connection.execute(sa.select(models.events.c.seq).where(models.events.c.event_id == "e1")).all() == [
            (1,)]
    assert verify(engine) == []

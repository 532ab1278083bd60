"""Cancelled coroutines release everything, checked from another process (issue #25, item 6).

Appends, ledger transitions and units of work are started as tasks and cancelled at random moments (after a
random number of loop iterations or a random time within the call's own duration), half of them cancelled a
second time while they end (as timeouts do); appends also under anyio cancel scopes (which cancel the task again
and again until it leaves the scope). After each cancellation:

- the awaiting task saw CancelledError, or the call's result when it had ended before the cancel: nothing else
  (no ``ValueError: Connection closed``, no driver error);
- on SQLite, another process takes the file's write lock within 100 ms (a long-lived child process runs
  ``BEGIN IMMEDIATE; ROLLBACK`` with ``timeout=0.1``);
- every pool has all its connections back, and on PostgreSQL no session is left idle in a transaction.

At the end the log is whole (``verify()``), and nothing was logged at WARNING or above (SQLAlchemy logs a failed
pool reset there; asyncio a task exception nobody retrieved) or warned (SAWarning, ResourceWarning: an unclosed
aiosqlite connection).
"""

from __future__ import annotations

import asyncio
import gc
import logging
import random
import subprocess
import sys
import time
import warnings
from collections import Counter
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

import anyio
import pytest
import sqlalchemy as sa
from factories import idle_in_transaction, make_room
from sqlalchemy import Engine

from hostedrooms import aio, models, verify
from hostedrooms.aio.engines import runner_of

GATEWAY = "install:gw-a"
CANCELLATIONS = 60
SERVICES = pytest.mark.parametrize("services", ["threads", "awaited"])
#: The default run's count, and a long variant (``-m slow``).
COUNTS = pytest.mark.parametrize("count", [CANCELLATIONS, pytest.param(1_000, marks=pytest.mark.slow)])

# Reads database paths from stdin, one a line; answers "ok" when it took the write lock within 100 ms.
PROBE = r"""
import sqlite3, sys
for line in sys.stdin:
    try:
        connection = sqlite3.connect(line.rstrip("\n"), timeout=0.1, isolation_level=None)
        try:
            connection.execute("BEGIN IMMEDIATE")
            connection.execute("ROLLBACK")
        finally:
            connection.close()
        print("ok", flush=True)
    except sqlite3.Error as exc:
        print(f"{type(exc).__name__}: {exc}", flush=True)
"""


class LockProbe:
    """Another process, asked over a pipe whether it can take a SQLite file's write lock within 100 ms."""

    def __init__(self) -> None:
        self._process = subprocess.Popen([sys.executable, "-c", PROBE], stdin=subprocess.PIPE,
                                         stdout=subprocess.PIPE, text=True)

    def take(self, path: str) -> str:
        """``"ok"``, or the error the other process got."""
        assert self._process.stdin is not None and self._process.stdout is not None
        self._process.stdin.write(path + "\n")
        self._process.stdin.flush()
        return self._process.stdout.readline().strip()

    def close(self) -> None:
        assert self._process.stdin is not None
        self._process.stdin.close()
        self._process.wait(timeout=10)


@pytest.fixture(scope="module")
def lock_probe() -> Iterator[LockProbe]:
    probe = LockProbe()
    try:
        yield probe
    finally:
        probe.close()


async def _pause(rng: random.Random, span: float) -> None:
    """A random moment: some loop iterations, or some time within ``span``."""
    if rng.random() < 0.5:
        for _ in range(rng.randint(0, 16)):
            await asyncio.sleep(0)
    else:
        await asyncio.sleep(rng.uniform(0, span))


#: Runs one call and cancels it at a random moment: ``"done"``, ``"cancelled"`` or what else the caller saw.
Canceller = Callable[[Awaitable[Any], random.Random, float], Awaitable[str]]


async def _task_cancel(call: Awaitable[Any], rng: random.Random, span: float) -> str:
    """``Task.cancel()`` at a random moment, half the time again while the call ends (as timeouts do)."""
    task = asyncio.ensure_future(call)
    await _pause(rng, span)
    task.cancel()
    if rng.random() < 0.5:
        await _pause(rng, span / 2)
        task.cancel()
    try:
        await task
    except asyncio.CancelledError:
        return "cancelled"
    except Exception as exc:  # what the caller would see is the finding
        return f"{type(exc).__name__}: {exc}"
    return "done"


async def _anyio_scope(call: Awaitable[Any], rng: random.Random, span: float) -> str:
    """The call in an anyio cancel scope, cancelled at a random moment: anyio cancels the task again and again
    until it leaves the scope."""
    scope = anyio.CancelScope()

    async def scoped() -> None:
        with scope:
            await call

    task = asyncio.ensure_future(scoped())
    await _pause(rng, span)
    scope.cancel()
    try:
        await task
    except Exception as exc:  # what the caller would see is the finding
        return f"{type(exc).__name__}: {exc}"
    return "cancelled" if scope.cancelled_caught else "done"


async def _cancel_many(
    engine: Engine, async_engine: Any, call: Callable[[int], Awaitable[Any]], lock_probe: LockProbe, seed: int,
    cancel: Canceller = _task_cancel, count: int = CANCELLATIONS,
) -> Counter[str]:
    """Start ``call(n)`` for n = 0, 1, ... and cancel each at a random moment; check what each left behind."""
    rng = random.Random(seed)
    await call(-2)  # warm: the runner exists, a connection is pooled
    started = time.monotonic()
    await call(-1)
    span = time.monotonic() - started  # the moments of the cancellations spread over a call's duration
    outcomes: Counter[str] = Counter()
    path = engine.url.database if engine.dialect.name == "sqlite" else None
    runner = runner_of(async_engine.sync_engine)
    for n in range(count):
        outcomes[await cancel(call(n), rng, span)] += 1
        if path is not None:
            assert lock_probe.take(path) == "ok", f"cancellation {n}: the write lock is still held"
        assert async_engine.sync_engine.pool.checkedout() == 0, f"cancellation {n}: a connection is out"
        assert runner.engine.pool.checkedout() == 0, f"cancellation {n}: a connection is out"
        assert idle_in_transaction(engine) == 0, f"cancellation {n}: a session is idle in a transaction"
    return outcomes


def _scenario(
    engine: Engine, services: str, body: Callable[[Any], Awaitable[Counter[str]]], caplog: pytest.LogCaptureFixture,
    count: int = CANCELLATIONS,
) -> Counter[str]:
    async def run() -> Counter[str]:
        async_engine = aio.create_async_engine(engine.url, services=services)
        try:
            return await body(async_engine)
        finally:
            await async_engine.dispose()

    caplog.set_level(logging.WARNING)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        outcomes = asyncio.run(run())
        gc.collect()  # an orphaned aiosqlite connection warns when collected
    unexpected = [w for w in caught if issubclass(w.category, (sa.exc.SAWarning, ResourceWarning, RuntimeWarning))]
    assert unexpected == [], [str(w.message) for w in unexpected]
    assert [record.getMessage() for record in caplog.records if record.levelno >= logging.WARNING] == []
    assert set(outcomes) <= {"done", "cancelled"}, outcomes
    assert outcomes["cancelled"] >= count // 6, outcomes  # many moments fall inside the calls
    assert verify(engine) == []
    return outcomes



def _appender(async_engine: Any) -> Callable[[int], Awaitable[Any]]:
    """``append(n)``: the coroutine appending event ``e{n}`` to room r1 (the same n again is a safe retry)."""

    def append(n: int) -> Awaitable[Any]:
        return aio.rooms.append_event(
            async_engine, room_id="r1", event_id=f"e{n}", kind="message.user", actor={"kind": "user", "id": "u1"},
            payload={"n": n}, authority_gateway_id=GATEWAY, authority_epoch=1)

    return append


@COUNTS
@SERVICES
def test_cancelled_appends_release_the_write_lock_and_their_connection(
    engine: Engine, services: str, lock_probe: LockProbe, caplog: pytest.LogCaptureFixture, count: int,
) -> None:
    make_room(engine, room_id="r1", gateway=GATEWAY)

    async def body(async_engine: Any) -> Counter[str]:
        append = _appender(async_engine)
        outcomes = await _cancel_many(engine, async_engine, append, lock_probe, seed=25_6, count=count)
        # A retry with the same event_id is safe whether or not the cancelled append committed.
        for n in range(count):
            await append(n)
        return outcomes

    _scenario(engine, services, body, caplog, count)
    with engine.connect() as connection:
        seqs = connection.execute(sa.select(models.events.c.seq).where(models.events.c.room_id == "r1").order_by(
            models.events.c.seq)).scalars().all()
        next_seq = connection.execute(sa.select(models.rooms.c.next_seq).where(
            models.rooms.c.room_id == "r1")).scalar_one()
    assert seqs == list(range(1, count + 3)) and next_seq == count + 3  # each event once


@SERVICES
def test_appends_cancelled_by_anyio_cancel_scopes_release_the_write_lock_and_their_connection(
    engine: Engine, services: str, lock_probe: LockProbe, caplog: pytest.LogCaptureFixture,
) -> None:
    make_room(engine, room_id="r1", gateway=GATEWAY)

    async def body(async_engine: Any) -> Counter[str]:
        append = _appender(async_engine)
        return await _cancel_many(engine, async_engine, append, lock_probe, seed=25_63, cancel=_anyio_scope)

    _scenario(engine, services, body, caplog)


@COUNTS
@SERVICES
def test_cancelled_ledger_transitions_release_the_write_lock_and_their_connection(
    engine: Engine, services: str, lock_probe: LockProbe, caplog: pytest.LogCaptureFixture, count: int,
) -> None:
    async def body(async_engine: Any) -> Counter[str]:
        ledger = await aio.open_ledger(async_engine, clock=lambda: 1_000)

        async def transitions(n: int) -> None:
            await ledger.prepare(_envelope(n), transport_role="host", connection_id="conn", lease_token="lease",
                                 target_chat_id="chat")
            await ledger.authorize(f"env-{n}")
            await ledger.bind_owner(f"env-{n}", queued_id=f"q-{n}", run_id=None)

        outcomes = await _cancel_many(engine, async_engine, transitions, lock_probe, seed=25_61, count=count)
        for n in range(count):  # each transition is whole or absent: the rest can follow
            row = await ledger.get(f"env-{n}")
            assert row is None or row["state"] in {"prepared", "authorized", "queued"}, row
        return outcomes

    _scenario(engine, services, body, caplog, count)


@pytest.mark.parametrize("backend", ["sqlite"])
def test_cancelled_units_of_work_release_the_write_lock_and_their_connection(
    engine: Engine, lock_probe: LockProbe, caplog: pytest.LogCaptureFixture,
) -> None:
    """The host's own transactions (AsyncUnitOfWork): each step is awaited on the AsyncEngine's connections."""
    make_room(engine, room_id="r1", gateway=GATEWAY)
    rooms = models.rooms

    async def body(async_engine: Any) -> Counter[str]:
        async def rename(n: int) -> None:
            async with aio.AsyncUnitOfWork(async_engine) as uow:
                await uow.execute(sa.update(rooms).where(rooms.c.room_id == "r1").values(name=f"Team {n}"))
                await uow.execute(sa.select(rooms.c.name).where(rooms.c.room_id == "r1"))
                await uow.commit()

        return await _cancel_many(engine, async_engine, rename, lock_probe, seed=25_62)

    _scenario(engine, "awaited", body, caplog)


def _envelope(n: int) -> dict[str, Any]:
    return {
        "envelope_id": f"env-{n}", "request_id": f"req-{n}", "team_id": "team", "source_server_identity": "src",
        "source_route_id": "route", "source_route_revision": "1", "target_server_identity": "dst",
        "target_route_id": "troute", "target_route_revision": "1", "action": "instruction", "kind": "instruction",
        "exchange_id": f"x-{n}", "used_legs": 1, "max_legs": 6, "expires_at": 2**40, "body": {"message": "hi"}}

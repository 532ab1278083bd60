"""Workloads and contenders of the comparison mode (``python bench/run.py --compare read``; bench/compare.py
runs them): hostedrooms beside its peers, each doing the same work through its own API.

A **workload** (:class:`Workload`, listed in :data:`WORKLOADS`) names the contender method its timed loop calls
(``method``), how many calls a round times (``calls``, full and ``--quick``), how many untimed warm-up calls
come first, and what the call does (``batch`` events per append call; ``stored`` events in the room a replay
reads; ``page`` size).

A **contender** (a :class:`Contender` subclass, listed in :data:`CONTENDERS`) takes part in every workload
whose ``method`` it defines, on the dialects it lists. Each contender runs in fresh processes:

- ``prepare()`` once per comparison, in its own process: create its database and schema, store what a replay
  reads; return a picklable ``state`` dict that every round receives;
- per round, in a fresh process: ``open(round_index)`` (connect, create that round's room or stream), the
  warm-up calls, then the timed calls ``method(index)``, each returning how many events it handled (the
  harness checks the total), all through ``drive()``; then ``durability()`` reads back, from the contender's
  OWN connection, the settings it ran with, and ``close()``;
- ``backend_pid()`` names its PostgreSQL backend, so the harness can add the server's CPU time.

**To add a contender** (an async API, a replica reader, another library): subclass :class:`Contender` (or an
existing one), set ``name`` (the ``--contenders`` name), ``label`` (the table's), ``dialects``, ``requires``
(modules; when one is missing the contender is skipped with a message) and ``default`` (False: runs only when
``--contenders`` names it), implement ``prepare``/``open``/``durability``/``close`` and the workload methods it
can do, and append the class to :data:`CONTENDERS`. An async contender overrides ``drive`` to run the loop in an
event loop it created in ``open`` (see :class:`HostedroomsToThread`, which runs the sync API through
``asyncio.to_thread``): the harness times ``drive`` as a whole, so the loop's own costs count, once.

**To add a workload** (replication catch-up, say): add a :class:`Workload` to :data:`WORKLOADS` with a new
``method`` name (``catch_up``), and define that method on the contenders that can do it (including
:class:`Hostedrooms`, the baseline every ratio divides by). ``prepare`` sees the workload as ``self.workload``
and sets up what the method needs.
"""

from __future__ import annotations

import asyncio
import functools
import json
import operator
import queue
import sqlite3
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar

from bench.common import (
    ACTOR,
    ACTOR_JSON,
    GATEWAY,
    KIND,
    PAYLOAD,
    PAYLOAD_JSON,
    Context,
    RawAppender,
    Scalar,
    canonical,
    dbapi_scalar,
    postgres_connect,
    postgres_durability,
    raise_limits,
    sqlite_durability,
)

BOTH = frozenset({"sqlite", "postgresql"})
READ_ROOM = "replay"


@dataclass(frozen=True)
class Workload:
    name: str  # --compare name
    method: str  # the contender method one timed call runs
    title: str
    calls: tuple[int, int]  # timed calls per round: full run, --quick
    warmup: int  # untimed calls first, in the same process
    batch: int = 1  # events per append call
    stored: tuple[int, int] = (0, 0)  # events in the room a replay reads: full run, --quick
    page: int = 500
    memory: bool = False  # also trace one call's peak Python memory, per contender
    rooms: tuple[int, int] = (0, 0)  # rooms of ``stored`` events each that a catch-up replicates: full, --quick

    def count(self, ctx: Context) -> int:
        return self.calls[1] if ctx.quick else self.calls[0]

    def room_size(self, ctx: Context) -> int:
        return self.stored[1] if ctx.quick else self.stored[0]

    def room_count(self, ctx: Context) -> int:
        return self.rooms[1] if ctx.quick else self.rooms[0]

    def events_per_call(self, ctx: Context) -> int:
        if self.rooms[0]:
            return self.room_count(ctx) * self.room_size(ctx)
        return self.room_size(ctx) if self.stored[0] else self.batch

    def describe(self, ctx: Context) -> str:
        return self.title.format(calls=self.count(ctx), batch=self.batch, stored=self.room_size(ctx),
                                 page=self.page, rooms=self.room_count(ctx))


WORKLOADS: dict[str, Workload] = {workload.name: workload for workload in (
    Workload("read", "replay", "whole-room replay of a {stored:,}-event room in pages of {page}, {calls} per round",
             calls=(2, 1), warmup=1, stored=(20_000, 5_000), memory=True),
    Workload("append", "append_one", "single durable append, one event per transaction, {calls:,} per round",
             calls=(2000, 200), warmup=20),
    Workload("batch100", "append_batch", "append a batch of {batch} events in one transaction, {calls} per round",
             calls=(100, 10), warmup=2, batch=100),
    Workload("catch-up", "catch_up", "a standby's catch-up of {rooms} rooms x {stored:,} events from the authority's "
             "store into an empty one, pages of {page}", calls=(1, 1), warmup=0, stored=(2000, 500),
             rooms=(256, 16)),
)}


def event_state() -> bytes:
    """An eventsourcing StoredEvent's state: the actor and payload hostedrooms stores, as canonical JSON."""
    return canonical({"actor": ACTOR, "payload": PAYLOAD}).encode()


class Contender:
    name: ClassVar[str]
    label: ClassVar[str]
    dialects: ClassVar[frozenset[str]] = BOTH
    requires: ClassVar[tuple[str, ...]] = ()  # modules this contender imports (checked per dialect below)
    requires_postgres: ClassVar[tuple[str, ...]] = ("psycopg",)
    default: ClassVar[bool] = True
    note: ClassVar[str] = ""

    def __init__(self, ctx: Context, workload: Workload, state: dict[str, Any]) -> None:
        self.ctx = ctx
        self.workload = workload
        self.state = state
        self.notes: list[str] = []  # what this run found worth reporting (a setting the harness had to change)

    @classmethod
    def supports(cls, workload: Workload, dialect: str) -> bool:
        return dialect in cls.dialects and callable(getattr(cls, workload.method, None))

    @classmethod
    def modules(cls, dialect: str) -> tuple[str, ...]:
        return cls.requires + (cls.requires_postgres if dialect == "postgresql" else ())

    def prepare(self) -> dict[str, Any]:
        return {}

    def open(self, round_index: int) -> None:
        """Connect and set up this round's room or stream (untimed)."""

    def drive(self, method: str, indexes: range) -> int:
        """Call ``method(index)`` for each index; return the events handled. The harness times this call."""
        operation: Callable[[int], int] = getattr(self, method)
        return sum(operation(index) for index in indexes)

    def durability(self) -> dict[str, str]:
        raise NotImplementedError

    def backend_pid(self) -> int | None:
        return None

    def close(self) -> None:
        """Release connections (a worker process ends right after)."""


def _engine(ctx: Context, target: str) -> Any:
    from hostedrooms import create_engine

    # One pooled connection: the durability read-back and the backend pid are the workload's own connection's.
    return create_engine(target, synchronous=ctx.synchronous, pool_size=1, max_overflow=0)


def _create_room(engine: Any, room_id: str) -> None:
    from hostedrooms import rooms

    rooms.create_room(engine, room_id=room_id, name=room_id, members=[], authority_gateway_id=GATEWAY)


def _fill(engine: Any, room_id: str, count: int) -> None:
    from hostedrooms import rooms

    for start in range(0, count, 500):
        batch = [{"event_id": f"fill-{seq}", "kind": KIND, "actor": ACTOR, "payload": PAYLOAD}
                 for seq in range(start, min(count, start + 500))]
        rooms.append_events(engine, room_id, batch, GATEWAY, 1)


def _engine_scalar(engine: Any) -> tuple[Scalar, Any]:
    """A scalar query on the engine's pooled DB-API connection (no SQLAlchemy transaction: SQLite's BEGIN
    IMMEDIATE would take the write lock), and that connection, to release."""
    connection = engine.raw_connection()
    return dbapi_scalar(connection), connection


class HostedroomsSchema(Contender):
    """Contenders working on hostedrooms' schema: prepare a migrated database (and the replayed room)."""

    def prepare(self) -> dict[str, Any]:
        raise_limits()
        target = self.ctx.new_database(self.name, migrated=True)
        if self.workload.rooms[0]:
            engine = _engine(self.ctx, target)
            for index in range(self.workload.room_count(self.ctx)):
                _create_room(engine, f"room-{index:03}")
                _fill(engine, f"room-{index:03}", self.workload.room_size(self.ctx))
            engine.dispose()
        elif self.workload.stored[0]:
            engine = _engine(self.ctx, target)
            _create_room(engine, READ_ROOM)
            _fill(engine, READ_ROOM, self.workload.room_size(self.ctx))
            self.verify(engine, target)
            engine.dispose()
        return {"target": target}

    def verify(self, engine: Any, target: str) -> None:
        """Check, before any round, that this contender's replay yields what hostedrooms' read_events does."""

    def _round_room(self, round_index: int) -> str:
        """A fresh room for an append round, created through hostedrooms before any raw connection opens."""
        room_id = f"round-{round_index}"
        engine = _engine(self.ctx, self.state["target"])
        _create_room(engine, room_id)
        engine.dispose()
        return room_id


class Hostedrooms(HostedroomsSchema):
    name = "hostedrooms"
    label = "hostedrooms"

    def open(self, round_index: int) -> None:
        from hostedrooms import rooms

        raise_limits()
        self.rooms = rooms
        self.standby: str | None = None
        if self.workload.rooms[0]:
            # The round's standby: an empty store of its own (its creation is not timed).
            self.standby = self.ctx.new_database(f"{self.name}-standby", migrated=True)
            self.standby_engine = _engine(self.ctx, self.standby)
            self.room_id = ""
        else:
            self.room_id = READ_ROOM if self.workload.stored[0] else self._round_room(round_index)
        self.engine = _engine(self.ctx, self.state["target"])

    def append_one(self, index: int) -> int:
        self.rooms.append_event(self.engine, room_id=self.room_id, event_id=f"e-{index}", kind=KIND, actor=ACTOR,
                                payload=PAYLOAD, authority_gateway_id=GATEWAY, authority_epoch=1)
        return 1

    def append_batch(self, index: int) -> int:
        size = self.workload.batch
        batch = [{"event_id": f"b{index}-{item}", "kind": KIND, "actor": ACTOR, "payload": PAYLOAD}
                 for item in range(size)]
        self.rooms.append_events(self.engine, self.room_id, batch, GATEWAY, 1)
        return size

    def replay(self, index: int) -> int:
        since, events = 0, 0
        while True:
            page = self.rooms.read_events(self.engine, room_id=self.room_id, since_seq=since,
                                          limit=self.workload.page)
            events += len(page["events"])
            since = page["cursor"]
            if not page["has_more"]:
                return events

    def catch_up(self, index: int) -> int:
        """The standby's Replicator: one pass over every room of the authority's store."""
        from hostedrooms.standby import EnginePageSource, Replicator

        report = Replicator(EnginePageSource(self.engine), self.standby_engine,
                            page_limit=self.workload.page).sync_once()
        if not report.ok or report.lag:
            raise RuntimeError(f"the catch-up did not complete: {report.summary()}")
        return report.events

    def page_json_bytes(self) -> int:
        """One replay page's size as JSON (what a page-bounded reader should hold at a time)."""
        page = self.rooms.read_events(self.engine, room_id=self.room_id, since_seq=0, limit=self.workload.page)
        return len(json.dumps(page).encode())

    def durability(self) -> dict[str, str]:
        # A catch-up commits to the standby: its settings are the ones that matter.
        scalar, connection = _engine_scalar(self.standby_engine if self.standby is not None else self.engine)
        try:
            return postgres_durability(scalar) if self.ctx.postgres else sqlite_durability(scalar)
        finally:
            connection.close()

    def backend_pid(self) -> int | None:
        if not self.ctx.postgres:
            return None
        scalar, connection = _engine_scalar(self.engine)
        try:
            return int(scalar("SELECT pg_backend_pid()"))
        finally:
            connection.close()

    def close(self) -> None:
        self.engine.dispose()
        if self.standby is not None:
            self.standby_engine.dispose()
            _drop_database(self.ctx, self.standby)


def _drop_database(ctx: Context, target: str) -> None:
    """Drop a PostgreSQL database a round created (SQLite files go with the run's temp folder)."""
    if ctx.url is None:
        return
    from sqlalchemy import make_url

    from hostedrooms.testing import drop_database

    drop_database(ctx.url, str(make_url(target).database))


class RawIngestLoop(Hostedrooms):
    """The loop every user would write: list the rooms, then per room read_events pages and ingest_page them,
    with nothing else (no lineage checks, no local-room fence, no reports): the floor of a catch-up."""

    name = "raw-ingest-loop"
    label = "raw read_events/ingest_page loop"
    note = "the same pages, no checks around them"

    @classmethod
    def supports(cls, workload: Workload, dialect: str) -> bool:
        # Only the catch-up: on the other workloads it would run hostedrooms' own methods again, under this label.
        return workload.method == "catch_up" and super().supports(workload, dialect)

    def catch_up(self, index: int) -> int:
        from hostedrooms import replicas, rooms

        events = 0
        for room in rooms.list_rooms(self.engine, include_disbanded=True):
            since = 0
            while True:
                page = rooms.read_events(self.engine, room_id=room["room_id"], since_seq=since,
                                         limit=self.workload.page, include_disbanded=True)
                result = replicas.ingest_page(self.standby_engine, room_id=room["room_id"], room_name=room["name"],
                                              members=room["members"], page=page)
                events += result["ingested"]
                since = result["stored_seq"]
                if not page["has_more"]:
                    break
        return events


class HostedroomsToThread(Hostedrooms):
    """The sync API from asyncio through ``asyncio.to_thread``, one awaited call at a time: what an async
    application pays today. Opt-in (``--contenders hostedrooms-to-thread``)."""

    name = "hostedrooms-to-thread"
    label = "hostedrooms via asyncio.to_thread"
    default = False

    def open(self, round_index: int) -> None:
        super().open(round_index)
        self.loop = asyncio.new_event_loop()  # one loop (and its thread pool) for warm-up and timed calls

    def drive(self, method: str, indexes: range) -> int:
        operation: Callable[[int], int] = getattr(self, method)

        async def run() -> int:
            total = 0
            for index in indexes:
                total += await self.hand_off(functools.partial(operation, index))
            return total

        return self.loop.run_until_complete(run())

    async def hand_off(self, call: Callable[[], int]) -> int:
        """``call()`` run off the loop, awaited."""
        return await asyncio.to_thread(call)

    def close(self) -> None:
        self.loop.run_until_complete(self.loop.shutdown_default_executor())
        self.loop.close()
        super().close()


class HostedroomsBareHop(HostedroomsToThread):
    """The sync API from asyncio through the cheapest hand-off there is: one dedicated thread taking calls from a
    queue and answering with ``call_soon_threadsafe``, no cancellation safety, no pool of workers. Not an API:
    the floor any design that keeps the blocking commit off the loop pays on this machine, measured beside the
    others. Opt-in (``--contenders hostedrooms-bare-hop``)."""

    name = "hostedrooms-bare-hop"
    label = "hostedrooms via a bare thread hand-off (the floor)"

    def open(self, round_index: int) -> None:
        super().open(round_index)
        self.calls: queue.SimpleQueue[tuple[asyncio.Future[int], Callable[[], int]] | None] = queue.SimpleQueue()
        self.worker = threading.Thread(target=self._work, daemon=True)
        self.worker.start()

    def _work(self) -> None:
        while (call := self.calls.get()) is not None:
            future, operation = call
            try:
                self.loop.call_soon_threadsafe(future.set_result, operation())
            except BaseException as exc:  # the awaiting round fails instead of waiting forever
                self.loop.call_soon_threadsafe(future.set_exception, exc)

    async def hand_off(self, call: Callable[[], int]) -> int:
        future: asyncio.Future[int] = self.loop.create_future()
        self.calls.put((future, call))
        return await future

    def close(self) -> None:
        self.calls.put(None)
        self.worker.join()
        super().close()


class HostedroomsAsync(Hostedrooms):
    """hostedrooms.aio on an AsyncEngine from ``hostedrooms.aio.create_async_engine`` (aiosqlite; psycopg async),
    one awaited call at a time: the asyncio API against the synchronous one (``--contenders hostedrooms-async``).
    ``durability()`` and ``backend_pid()`` read the connection the services ran on (SQLite: the twin engine of
    the runner; PostgreSQL: the AsyncEngine's own pool)."""

    name = "hostedrooms-async"
    label = "hostedrooms.aio (asyncio API)"
    requires = ("aiosqlite", "greenlet")
    default = False

    def open(self, round_index: int) -> None:
        from hostedrooms import aio

        super().open(round_index)
        self.loop = asyncio.new_event_loop()
        self.aio = aio
        self.async_engine = aio.create_async_engine(
            self.state["target"], synchronous=self.ctx.synchronous, pool_size=1, max_overflow=0)
        self.runner = self.loop.run_until_complete(aio.engines.runner_for(self.async_engine))
        self.engine.dispose()
        self.engine = self.runner.engine  # what durability() and backend_pid() read

    async def append_one_async(self, index: int) -> int:
        await self.aio.rooms.append_event(
            self.async_engine, room_id=self.room_id, event_id=f"e-{index}", kind=KIND, actor=ACTOR, payload=PAYLOAD,
            authority_gateway_id=GATEWAY, authority_epoch=1)
        return 1

    async def append_batch_async(self, index: int) -> int:
        size = self.workload.batch
        batch = [{"event_id": f"b{index}-{item}", "kind": KIND, "actor": ACTOR, "payload": PAYLOAD}
                 for item in range(size)]
        await self.aio.rooms.append_events(self.async_engine, self.room_id, batch, GATEWAY, 1)
        return size

    async def replay_async(self, index: int) -> int:
        since, events = 0, 0
        while True:
            page = await self.aio.rooms.read_events(self.async_engine, room_id=self.room_id, since_seq=since,
                                                    limit=self.workload.page)
            events += len(page["events"])
            since = page["cursor"]
            if not page["has_more"]:
                return events

    def drive(self, method: str, indexes: range) -> int:
        operation: Callable[[int], Any] = getattr(self, f"{method}_async")

        async def run() -> int:
            total = 0
            for index in indexes:
                total += await operation(index)
            return total

        return self.loop.run_until_complete(run())

    def durability(self) -> dict[str, str]:
        durability: Callable[[], dict[str, str]] = super().durability  # on the runner: awaited driver calls
        return self.loop.run_until_complete(self.runner.run(durability))

    def backend_pid(self) -> int | None:
        backend_pid: Callable[[], int | None] = super().backend_pid
        return self.loop.run_until_complete(self.runner.run(backend_pid))

    def page_json_bytes(self) -> int:
        page = self.loop.run_until_complete(self.aio.rooms.read_events(
            self.async_engine, room_id=self.room_id, since_seq=0, limit=self.workload.page))
        return len(json.dumps(page).encode())

    def close(self) -> None:
        self.loop.run_until_complete(self.async_engine.dispose())
        self.loop.close()
        self.engine.dispose()


class RawReferenceStatements(HostedroomsSchema):
    """The reference's append statements through the raw driver (bench/run.py's ``raw`` baseline)."""

    name = "raw-reference"
    label = "raw driver, the reference's append statements"
    note = "no validation; pre-serialised JSON"

    def open(self, round_index: int) -> None:
        self.room_id = self._round_room(round_index)
        self.appender = RawAppender(self.state["target"], self.ctx.postgres, self.ctx.synchronous)

    def append_one(self, index: int) -> int:
        self.appender.append(self.room_id, f"e-{index}")
        return 1

    def durability(self) -> dict[str, str]:
        return self.appender.durability()

    def backend_pid(self) -> int | None:
        return self.appender.backend_pid

    def close(self) -> None:
        self.appender.close()


_INSERT = ("INSERT INTO hosted_room_events (room_id, seq, event_id, kind, actor_json, authority_epoch, payload_json, "
           "created_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?)")
_PAGE = ("SELECT room_id, seq, event_id, kind, actor_json, authority_epoch, payload_json, created_at "
         "FROM hosted_room_events WHERE room_id=? AND seq>? ORDER BY seq LIMIT ?")


class RawDriver(HostedroomsSchema):
    """sqlite3 / psycopg directly on hostedrooms' tables: the floor of each workload."""

    def open(self, round_index: int) -> None:
        self.room_id = READ_ROOM if self.workload.stored[0] else self._round_room(round_index)
        self.connection = self._connect(self.state["target"])
        self.seq = 0

    def _connect(self, target: str) -> Any:
        if self.ctx.postgres:
            return postgres_connect(target)
        connection = sqlite3.connect(target, isolation_level=None)
        connection.execute(f"PRAGMA synchronous={self.ctx.synchronous}")
        return connection

    def _sql(self, statement: str) -> str:
        return statement.replace("?", "%s") if self.ctx.postgres else statement

    def durability(self) -> dict[str, str]:
        scalar = dbapi_scalar(self.connection)
        return postgres_durability(scalar) if self.ctx.postgres else sqlite_durability(scalar)

    def backend_pid(self) -> int | None:
        return int(self.connection.info.backend_pid) if self.ctx.postgres else None

    def close(self) -> None:
        self.connection.close()


class RawInsert(RawDriver):
    name = "raw-insert"
    label = "raw driver, INSERT of the event row only"
    note = "no checks, no room update; pre-serialised JSON"

    def _row(self, event_id: str) -> tuple[Any, ...]:
        self.seq += 1
        return (self.room_id, self.seq, event_id, KIND, ACTOR_JSON, 1, PAYLOAD_JSON, time.time())

    def append_one(self, index: int) -> int:
        # Autocommit: the INSERT is its own (durable) transaction.
        self.connection.execute(self._sql(_INSERT), self._row(f"e-{index}"))
        return 1

    def append_batch(self, index: int) -> int:
        rows = [self._row(f"b{index}-{item}") for item in range(self.workload.batch)]
        cursor = self.connection.cursor()
        cursor.execute("BEGIN" if self.ctx.postgres else "BEGIN IMMEDIATE")
        cursor.executemany(self._sql(_INSERT), rows)
        cursor.execute("COMMIT")
        return len(rows)


class RawOwnStatements(RawDriver):
    """hostedrooms' own one-statement append (its store's compiled SQL) through the raw driver: on SQLite the
    guarded advance, the budget counter and the INSERT in one transaction; on PostgreSQL the one data-modifying
    statement in autocommit. The floor of hostedrooms' design: what its statements and schema cost with no
    Python layer around them (no validation, no pool, no SQLAlchemy Connection, no result dicts)."""

    name = "raw-own-statements"
    label = "raw driver, hostedrooms' own append statements"
    note = "the floor of hostedrooms' design; pre-serialised JSON"

    def open(self, round_index: int) -> None:
        from sqlalchemy import create_engine as sa_create_engine

        from hostedrooms import limits, models, rooms
        from hostedrooms.backends import ROOM_EVENTS_CHANNEL, backend_named
        from hostedrooms.store import room_store

        raise_limits()
        super().open(round_index)
        engine = _engine(self.ctx, self.state["target"])
        rooms.prune_disbanded_rooms(engine)  # spreads the gateway budget (a fresh database's has no allowance)
        engine.dispose()
        # The statements hostedrooms' store runs (private attributes: read here to run them without the library),
        # compiled for this backend's driver as SQLAlchemy compiles them.
        dialect = sa_create_engine("postgresql+psycopg://" if self.ctx.postgres else "sqlite://").dialect
        store: Any = room_store(backend_named(dialect.name))  # type: ignore[arg-type]
        columns = [column.name for column in models.events.c]
        if self.ctx.postgres:
            self.connection.autocommit = True  # the one statement commits itself
            self.append_one_sql = _Bound(store._append_one.statement, dialect)
            self.append_batch_sql = _Bound(store._append_batch.statement, dialect)
        else:
            self.advance = _Bound(store._advance.statement, dialect)
            self.charge = _Bound(store._charge.statement, dialect)
            self.insert_many = _Bound(store._insert_event.statement, dialect, columns)
        self.fixed = {"fast_room_id": self.room_id, "fast_gateway_id": GATEWAY, "fast_epoch": 1,
                      "fast_max_room_bytes": limits.MAX_ROOM_EVENT_BYTES,
                      "fast_spread_limit": limits.MAX_GATEWAY_EVENT_BYTES,
                      "notify_channel": ROOM_EVENTS_CHANNEL}  # the public schema's follower channel
        self.max_events = limits.MAX_EVENTS_PER_ROOM
        self.event_bytes = len((KIND + ACTOR_JSON + PAYLOAD_JSON).encode())  # and the id's (ASCII) length

    def _append(self, event_ids: list[str]) -> int:
        now, count = time.time(), len(event_ids)
        size = sum(len(event_id) for event_id in event_ids) + count * self.event_bytes
        params = {**self.fixed, "fast_count": count, "fast_size": size, "fast_now": now,
                  "fast_max_events": self.max_events - count + 1}
        cursor = self.connection.cursor()
        if self.ctx.postgres:
            if count == 1:
                statement = self.append_one_sql
                params.update(event_id=event_ids[0], kind=KIND, actor_json=ACTOR_JSON, authority_epoch=1,
                              payload_json=PAYLOAD_JSON)
            else:
                statement = self.append_batch_sql
                params["fast_rows"] = json.dumps([[event_id, KIND, ACTOR_JSON, 1, PAYLOAD_JSON]
                                                  for event_id in event_ids], ensure_ascii=False,
                                                 separators=(",", ":"))
            cursor.execute(statement.text, statement.bind(params))
            advanced = cursor.fetchone()
            if advanced is None or advanced[1] is not None:
                raise RuntimeError("the one-statement append did not apply")
            return count
        cursor.execute("BEGIN IMMEDIATE")
        cursor.execute(self.advance.text, self.advance.bind(params))
        advanced = cursor.fetchone()
        if advanced is None:
            raise RuntimeError("the guarded advance did not apply")
        cursor.execute(self.charge.text, self.charge.bind(params))
        first = int(advanced[0]) - count
        rows = [(self.room_id, first + index, event_id, KIND, ACTOR_JSON, 1, PAYLOAD_JSON, now)
                for index, event_id in enumerate(event_ids)]
        if count == 1:
            cursor.execute(self.insert_many.text, self.insert_many.bind_row(rows[0]))
        else:
            cursor.executemany(self.insert_many.text, [self.insert_many.bind_row(row) for row in rows])
        cursor.execute("COMMIT")
        return count

    def append_one(self, index: int) -> int:
        return self._append([f"e-{index}"])

    def append_batch(self, index: int) -> int:
        return self._append([f"b{index}-{item}" for item in range(self.workload.batch)])


class SQLAlchemyFloor(Hostedrooms):
    """An append on a SQLAlchemy Connection with nothing of hostedrooms but what its rules need: each event
    validated as the spec requires (hostedrooms' own validator), then hostedrooms' one-statement append on a bare
    Connection (its compiled-once statements, ``engine.connect()``, ``begin()``, ``commit()``), then the result
    dicts; without the service layer around it (no unit of work, no retries, no full path, no replay or conflict
    handling). SQLite only: on PostgreSQL even the raw driver's run of these statements is below the targets."""

    name = "sqlalchemy-floor"
    label = "hostedrooms' validation and statements on a bare SQLAlchemy Connection"
    note = "no service layer: the floor of an implementation on SQLAlchemy"
    dialects = frozenset({"sqlite"})
    default = False

    @classmethod
    def supports(cls, workload: Workload, dialect: str) -> bool:
        # Appends only: on the other workloads it would run hostedrooms' own methods, under this label.
        return workload.method in ("append_one", "append_batch") and super().supports(workload, dialect)

    def open(self, round_index: int) -> None:
        from hostedrooms import limits
        from hostedrooms.backends import backend_for
        from hostedrooms.rooms import rules
        from hostedrooms.store import event_rows, room_store

        super().open(round_index)
        self.rules, self.event_rows = rules, event_rows
        self.store: Any = room_store(backend_for(self.engine))
        self.limits = limits
        self.fixed = {"fast_room_id": self.room_id, "fast_max_room_bytes": limits.MAX_ROOM_EVENT_BYTES,
                      "fast_spread_limit": limits.MAX_GATEWAY_EVENT_BYTES}
        self.rooms.prune_disbanded_rooms(self.engine)  # spreads the gateway budget (a fresh database's has none)

    def _prepare(self, items: list[dict[str, Any]]) -> list[tuple[Any, dict[str, str]]]:
        """Each item validated as ``append_events`` validates it: the event to insert and its normalised actor."""
        memo = self.rules._BatchMemo(GATEWAY, 1) if len(items) > 1 else None
        return [self.rules._validated_event(item["event_id"], item["kind"], item["actor"], item["payload"], GATEWAY,
                                            1, self.limits, memo)[:2] for item in items]  # type: ignore[arg-type]

    def _advance_params(self, events: list[Any], now: float) -> dict[str, Any]:
        count = len(events)
        return {**self.fixed, "fast_gateway_id": GATEWAY, "fast_epoch": 1, "fast_count": count,
                "fast_size": sum(event.size for event in events), "fast_now": now,
                "fast_max_events": self.limits.MAX_EVENTS_PER_ROOM - count + 1}

    def _write(self, events: list[Any], now: float) -> list[dict[str, Any]]:
        """The guarded advance and the INSERT in one transaction; the rows written."""
        with self.engine.connect() as connection:
            connection.begin()
            params = self._advance_params(events, now)
            advanced = self.store._advance.first(connection, params)
            if advanced is None:
                raise RuntimeError("the guarded advance did not apply")
            self.store._charge.rowcount(connection, params)
            rows = self.event_rows(self.room_id, int(advanced[0]) - len(events), events, now)
            self.store.insert_events(connection, rows)
            connection.commit()
        return rows

    def _append(self, items: list[dict[str, Any]]) -> int:
        prepared = self._prepare(items)
        rows = self._write([event for event, _ in prepared], time.time())
        payloads = json.loads(f"[{','.join(row['payload_json'] for row in rows)}]")
        results = [{"room_id": row["room_id"], "seq": row["seq"], "event_id": row["event_id"], "kind": row["kind"],
                    "actor": dict(actor), "authority_epoch": row["authority_epoch"], "payload": payload,
                    "created_at": row["created_at"], "idempotent": False}
                   for row, (_, actor), payload in zip(rows, prepared, payloads, strict=True)]
        return len(results)

    def append_one(self, index: int) -> int:
        return self._append([{"event_id": f"e-{index}", "kind": KIND, "actor": ACTOR, "payload": PAYLOAD}])

    def append_batch(self, index: int) -> int:
        return self._append([{"event_id": f"b{index}-{item}", "kind": KIND, "actor": ACTOR, "payload": PAYLOAD}
                             for item in range(self.workload.batch)])


class SQLAlchemyStatements(SQLAlchemyFloor):
    """:class:`SQLAlchemyFloor` without the validation: the events built straight from pre-serialised JSON, so
    what remains is hostedrooms' statements on a bare SQLAlchemy Connection and the result dicts."""

    name = "sqlalchemy-statements"
    label = "hostedrooms' statements on a bare SQLAlchemy Connection, no validation"
    note = "pre-serialised JSON; no validation, no service layer"

    def _prepare(self, items: list[dict[str, Any]]) -> list[tuple[Any, dict[str, str]]]:
        from hostedrooms.rooms import PreparedEvent

        return [(PreparedEvent(item["event_id"], KIND, ACTOR_JSON, PAYLOAD_JSON, 1), ACTOR) for item in items]


class PooledDBAPIFloor(SQLAlchemyFloor):
    """:class:`SQLAlchemyFloor` with the transaction run on the pool's DB-API connection instead of a SQLAlchemy
    Connection (``engine.raw_connection()``, the driver's own ``BEGIN IMMEDIATE``/``COMMIT``): what an append
    that bypassed the Connection would cost. It would give up the engine's cursor events and SQLAlchemy's error
    wrapping for appends; this contender only measures it."""

    name = "pooled-dbapi-floor"
    label = "hostedrooms' validation and statements on the pool's DB-API connection"
    note = "no SQLAlchemy Connection, no service layer"

    def open(self, round_index: int) -> None:
        from hostedrooms import models

        super().open(round_index)
        columns = [column.name for column in models.events.c]
        self.advance = _Bound(self.store._advance.statement, self.engine.dialect)
        self.charge = _Bound(self.store._charge.statement, self.engine.dialect)
        self.insert = _Bound(self.store._insert_event.statement, self.engine.dialect, columns)
        self.pick = operator.itemgetter(*columns)  # a row dict's values in column order

    def _write(self, events: list[Any], now: float) -> list[dict[str, Any]]:
        connection = self.engine.raw_connection()
        try:
            cursor = connection.cursor()
            cursor.execute("BEGIN IMMEDIATE")
            try:
                params = self._advance_params(events, now)
                cursor.execute(self.advance.text, self.advance.bind(params))
                advanced = cursor.fetchone()
                if advanced is None:
                    raise RuntimeError("the guarded advance did not apply")
                cursor.execute(self.charge.text, self.charge.bind(params))
                rows = self.event_rows(self.room_id, int(advanced[0]) - len(events), events, now)
                values = [self.pick(row) for row in rows]
                if len(values) == 1:
                    cursor.execute(self.insert.text, self.insert.bind_row(values[0]))
                else:
                    cursor.executemany(self.insert.text, [self.insert.bind_row(value) for value in values])
                cursor.execute("COMMIT")
            except BaseException:
                cursor.execute("ROLLBACK")
                raise
            finally:
                cursor.close()
        finally:
            connection.close()
        return rows


class _Bound:
    """A Core statement compiled for a driver, and its parameters in that driver's style (the statement's own
    literal binds filled in): what a hand-written raw loop would pass."""

    def __init__(self, statement: Any, dialect: Any, columns: list[str] | None = None) -> None:
        compiled = statement.compile(dialect=dialect, column_keys=columns)
        self.text: str = compiled.string
        self.defaults: dict[str, Any] = compiled.construct_params(_check=False)
        self.order: tuple[str, ...] | None = tuple(compiled.positiontup) if compiled.positiontup else None
        self.columns = columns or []
        # A row tuple in column order is already the driver's positional parameters when the orders agree.
        self.row_is_positional = self.order is not None and list(self.order) == self.columns

    def bind(self, params: dict[str, Any]) -> Any:
        values = {**self.defaults, **params}
        return values if self.order is None else tuple(values[name] for name in self.order)

    def bind_row(self, row: tuple[Any, ...], **extra: Any) -> Any:
        if self.row_is_positional and not extra:
            return row
        return self.bind({**dict(zip(self.columns, row, strict=True)), **extra})


def _raw_events(rows: list[Any]) -> list[dict[str, Any]]:
    """The event dicts read_events returns, built straight from driver tuples."""
    loads = json.loads
    return [{"room_id": row[0], "seq": row[1], "event_id": row[2], "kind": row[3], "actor": loads(row[4]),
             "authority_epoch": row[5], "payload": loads(row[6]), "created_at": row[7], "idempotent": False}
            for row in rows]


class RawDictLoop(RawDriver):
    name = "raw-dict-loop"
    label = "raw driver loop building the same event dicts"
    note = "one SELECT per page, stops at the known event count"

    def replay(self, index: int) -> int:
        sql, page, total = self._sql(_PAGE), self.workload.page, self.workload.room_size(self.ctx)
        since, events = 0, 0
        while events < total:
            batch = _raw_events(self.connection.execute(sql, (self.room_id, since, page)).fetchall())
            if not batch:
                break
            events += len(batch)
            since = batch[-1]["seq"]
        return events

    def verify(self, engine: Any, target: str) -> None:
        from hostedrooms import rooms

        connection = self._connect(target)
        try:
            own = _raw_events(connection.execute(self._sql(_PAGE), (READ_ROOM, 0, self.workload.page)).fetchall())
        finally:
            connection.close()
        expected = rooms.read_events(engine, room_id=READ_ROOM, since_seq=0, limit=self.workload.page)["events"]
        if own != expected:
            raise RuntimeError("the raw dict loop's page differs from read_events'")


# The reference's readiness check on every open: each of its tables' columns and the cursor index.
_SCHEMA_CHECKS = (
    "PRAGMA table_info(hosted_rooms)",
    "PRAGMA table_info(hosted_room_events)",
    "PRAGMA table_info(hosted_room_retired_ids)",
    "PRAGMA table_info(hosted_room_links)",
    "PRAGMA table_info(hosted_room_remote_runs)",
    "PRAGMA table_info(hosted_room_revoked_grants)",
    "PRAGMA table_info(hosted_room_peer_reservations)",
    "SELECT 1 FROM sqlite_master WHERE type='index' AND name='idx_hosted_room_events_cursor'",
)
_REFERENCE_ROOM = ("SELECT next_seq, authority_gateway_id, authority_epoch FROM hosted_rooms "
                   "WHERE room_id=? AND (disbanded_at IS NULL OR ?)")
# Up to ``limit`` events after ``since`` while their running raw byte size fits the page budget.
_REFERENCE_PAGE = (
    "WITH page AS (SELECT room_id, seq, event_id, kind, actor_json, authority_epoch, payload_json, created_at, "
    "SUM(LENGTH(CAST(event_id AS BLOB)) + LENGTH(CAST(kind AS BLOB)) "
    "+ LENGTH(CAST(actor_json AS BLOB)) + LENGTH(CAST(payload_json AS BLOB))) OVER (ORDER BY seq) AS running "
    "FROM hosted_room_events WHERE room_id=? AND seq>? ORDER BY seq LIMIT ?) "
    "SELECT room_id, seq, event_id, kind, actor_json, authority_epoch, payload_json, created_at "
    "FROM page WHERE running<=? ORDER BY seq")


class ReferenceStyleRead(HostedroomsSchema):
    """What the reference implementation's read_events does per call, written from its behaviour: a new
    connection (WAL and foreign-key pragmas, the schema readiness check), a deferred transaction with the room
    row and the windowed page query, json.loads per event, then json.dumps of the whole page to check it fits
    the page budget; the connection is closed on every call."""

    name = "reference-style"
    label = "reference-style read_events (new connection per call)"
    dialects = frozenset({"sqlite"})
    note = "written from the reference's behaviour"

    def open(self, round_index: int) -> None:
        self._use(self.state["target"])

    def _use(self, path: str) -> None:
        from hostedrooms import limits

        self.page_bytes = int(limits.MAX_LOG_PAGE_BYTES)
        self.path = path

    def _connect(self) -> sqlite3.Connection:
        connection = sqlite3.connect(self.path, timeout=10.0, isolation_level=None)
        connection.row_factory = sqlite3.Row
        connection.execute("PRAGMA journal_mode=WAL")
        connection.execute("PRAGMA foreign_keys=ON")
        return connection

    def read_page(self, since: int) -> dict[str, Any]:
        # One connection at a time in this process, so closing it never drops another connection's locks.
        connection = self._connect()
        try:
            for check in _SCHEMA_CHECKS:
                connection.execute(check).fetchall()
            connection.execute("BEGIN")
            room = connection.execute(_REFERENCE_ROOM, (READ_ROOM, 0)).fetchone()
            rows = connection.execute(_REFERENCE_PAGE, (READ_ROOM, since, self.workload.page,
                                                        self.page_bytes)).fetchall()
            connection.execute("COMMIT")
        finally:
            connection.close()
        latest = int(room["next_seq"]) - 1
        events = [{"room_id": row["room_id"], "seq": int(row["seq"]), "event_id": row["event_id"],
                   "kind": row["kind"], "actor": json.loads(row["actor_json"]),
                   "authority_epoch": int(row["authority_epoch"]) if row["authority_epoch"] is not None else None,
                   "payload": json.loads(row["payload_json"]), "created_at": float(row["created_at"]),
                   "idempotent": False} for row in rows]
        cursor = events[-1]["seq"] if events else since
        page = {"events": events, "cursor": cursor, "latest_seq": latest, "has_more": cursor < latest,
                "authority": {"gateway_id": str(room["authority_gateway_id"]), "epoch": int(room["authority_epoch"])}}
        if len(json.dumps(page, ensure_ascii=False, separators=(",", ":")).encode()) > self.page_bytes:
            raise RuntimeError("a page over the byte budget: not a case this benchmark covers")
        return page

    def replay(self, index: int) -> int:
        since, events = 0, 0
        while True:
            page = self.read_page(since)
            events += len(page["events"])
            since = page["cursor"]
            if not page["has_more"]:
                return events

    def verify(self, engine: Any, target: str) -> None:
        from hostedrooms import rooms

        self._use(target)
        if self.read_page(0) != rooms.read_events(engine, room_id=READ_ROOM, since_seq=0, limit=self.workload.page):
            raise RuntimeError("the reference-style page differs from read_events'")

    def durability(self) -> dict[str, str]:
        connection = self._connect()  # a connection opened as each call opens its own
        try:
            return sqlite_durability(dbapi_scalar(connection))
        finally:
            connection.close()


class Eventsourcing(Contender):
    """eventsourcing's own recorder (no application, mapper or transcoder): StoredEvents whose state is the
    canonical JSON of the actor and payload hostedrooms stores, encoded per event on append and decoded per
    event on replay."""

    requires = ("eventsourcing",)
    requires_postgres = ("psycopg", "psycopg_pool")
    recorder: ClassVar[str]  # "aggregate" or "application"
    topic = "bench.events:MessageUser"

    def _open_recorder(self, target: str) -> Any:
        kind: Any
        if self.ctx.postgres:
            from eventsourcing import postgres
            from sqlalchemy import make_url

            url = make_url(target)
            self.datastore: Any = postgres.PostgresDatastore(
                str(url.database), str(url.host), int(url.port or 5432), str(url.username), str(url.password),
                pool_size=1, max_overflow=0)
            kind = postgres.PostgresApplicationRecorder if self.recorder == "application" else \
                postgres.PostgresAggregateRecorder
        else:
            from eventsourcing import sqlite

            # One connection, so the settings read back (and set) are the ones the recorder's calls run on.
            self.datastore = sqlite.SQLiteDatastore(target, pool_size=1, max_overflow=0)
            kind = sqlite.SQLiteApplicationRecorder if self.recorder == "application" else \
                sqlite.SQLiteAggregateRecorder
        return kind(self.datastore)

    def prepare(self) -> dict[str, Any]:
        target = self.ctx.new_database(f"es-{self.recorder}", migrated=False)
        recorder = self._open_recorder(target)
        recorder.create_table()
        originator = uuid.uuid4()
        stored = self.workload.room_size(self.ctx) if self.workload.stored[0] else 0
        for start in range(0, stored, 500):
            recorder.insert_events([self._event(originator, version)
                                    for version in range(start + 1, min(stored, start + 500) + 1)])
        self.datastore.close()
        return {"target": target, "originator": str(originator)}

    def _event(self, originator: uuid.UUID, version: int) -> Any:
        from eventsourcing.persistence import StoredEvent

        return StoredEvent(originator_id=originator, originator_version=version, topic=self.topic,
                           state=event_state())

    def _scalar(self, sql: str) -> Any:
        if self.ctx.postgres:
            with self.datastore.get_connection() as connection:
                return dbapi_scalar(connection)(sql)
        with self.datastore.get_connection(commit=False) as connection:
            cursor = connection.cursor()  # eventsourcing's cursor wrapper: execute and fetchone only
            cursor.execute(sql)
            row = cursor.fetchone()
            return row[0] if row is not None else None

    def open(self, round_index: int) -> None:
        self.store = self._open_recorder(self.state["target"])
        self.originator = uuid.UUID(self.state["originator"]) if self.workload.stored[0] else uuid.uuid4()
        if not self.ctx.postgres:
            found = sqlite_durability(self._scalar)["synchronous"]
            if found != self.ctx.synchronous:
                self._scalar(f"PRAGMA synchronous={self.ctx.synchronous}")
                self.notes.append(f"the bench set synchronous={self.ctx.synchronous} (eventsourcing left {found})")

    def append_one(self, index: int) -> int:
        self.store.insert_events([self._event(self.originator, index + 1)])
        return 1

    def append_batch(self, index: int) -> int:
        size = self.workload.batch
        self.store.insert_events([self._event(self.originator, index * size + item + 1) for item in range(size)])
        return size

    def replay(self, index: int) -> int:
        page, total = self.workload.page, self.workload.room_size(self.ctx)
        since: int | None = None
        events = 0
        while events < total:
            stored = self.store.select_events(self.originator, gt=since, limit=page)
            if not stored:
                break
            decoded = [json.loads(event.state) for event in stored]
            events += len(decoded)
            since = stored[-1].originator_version
        return events

    def durability(self) -> dict[str, str]:
        return postgres_durability(self._scalar) if self.ctx.postgres else sqlite_durability(self._scalar)

    def backend_pid(self) -> int | None:
        if not self.ctx.postgres:
            return None
        with self.datastore.get_connection() as connection:
            return int(connection.info.backend_pid)

    def close(self) -> None:
        self.datastore.close()


class EventsourcingAggregate(Eventsourcing):
    name = "es-aggregate"
    label = "eventsourcing 9 aggregate recorder"
    recorder = "aggregate"
    note = "+json per event"


class EventsourcingApplication(Eventsourcing):
    name = "es-application"
    label = "eventsourcing 9 application recorder"
    recorder = "application"
    note = "+json per event; notification ids"


CONTENDERS: list[type[Contender]] = [
    Hostedrooms,
    RawIngestLoop,
    EventsourcingAggregate,
    EventsourcingApplication,
    RawReferenceStatements,
    RawInsert,
    RawOwnStatements,
    SQLAlchemyFloor,
    SQLAlchemyStatements,
    PooledDBAPIFloor,
    RawDictLoop,
    ReferenceStyleRead,
    HostedroomsToThread,
    HostedroomsBareHop,
    HostedroomsAsync,
]

"""hostedrooms itself in the comparison: the synchronous API (:class:`Hostedrooms`, the baseline every ratio
divides by), the bare catch-up loop, and the asyncio hand-offs and API.
"""

from __future__ import annotations

import asyncio
import functools
import json
import queue
import threading
from collections.abc import Callable
from typing import Any

from bench.common import (
    ACTOR,
    GATEWAY,
    KIND,
    PAYLOAD,
    postgres_durability,
    raise_limits,
    sqlite_durability,
)
from bench.contenders.base import (
    READ_ROOM,
    HostedroomsSchema,
    Workload,
    _drop_database,
    _engine,
    _engine_scalar,
)


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
        from hostedrooms import held_autocommit

        held = held_autocommit.take(self.engine)  # the connection this thread's single appends run on, if held
        if held is not None:
            try:
                held.open()
                return held.backend_pid
            finally:
                held.release()
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



class HostedroomsPooled(Hostedrooms):
    """The synchronous API with no held autocommit connection (:mod:`hostedrooms.held_autocommit`): a PostgreSQL
    single append's first attempt in a pooled unit of work, as before the held path (``--contenders
    hostedrooms-pooled``: the held path's before and after in the same alternating rounds)."""

    name = "hostedrooms-pooled"
    label = "hostedrooms, pooled first attempt"
    dialects = frozenset({"postgresql"})
    default = False

    def drive(self, method: str, indexes: range) -> int:
        from hostedrooms import held_autocommit

        with held_autocommit.without_held_connections():
            return super().drive(method, indexes)

    def backend_pid(self) -> int | None:
        from hostedrooms import held_autocommit

        with held_autocommit.without_held_connections():
            return super().backend_pid()


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

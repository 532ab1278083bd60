"""The comparison's workloads (:data:`WORKLOADS`), the :class:`Contender` interface, and what contenders on
hostedrooms' schema share (:class:`HostedroomsSchema`, engines, rooms, dropping a round's database).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar

from bench.common import (
    ACTOR,
    GATEWAY,
    KIND,
    PAYLOAD,
    Context,
    Scalar,
    canonical,
    dbapi_scalar,
    raise_limits,
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


def _drop_database(ctx: Context, target: str) -> None:
    """Drop a PostgreSQL database a round created (SQLite files go with the run's temp folder)."""
    if ctx.url is None:
        return
    from sqlalchemy import make_url

    from hostedrooms.testing import drop_database

    drop_database(ctx.url, str(make_url(target).database))



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

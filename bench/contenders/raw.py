"""Contenders through the raw DB-API driver: the reference's statements, hostedrooms' own statements (a floor),
and the reference-style readers; :class:`_Bound` compiles a Core statement for a driver.
"""

from __future__ import annotations

import json
import sqlite3
import time
from typing import Any

from bench.common import (
    ACTOR_JSON,
    GATEWAY,
    KIND,
    PAYLOAD_JSON,
    RawAppender,
    dbapi_scalar,
    postgres_connect,
    postgres_durability,
    raise_limits,
    sqlite_durability,
)
from bench.contenders.base import (
    READ_ROOM,
    HostedroomsSchema,
    _engine,
)


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
    Python layer around them (no validation, no pool, no SQLAlchemy Connection, no result dicts). On PostgreSQL the
    statement is the one a held connection runs (:mod:`hostedrooms.held_autocommit`: the connection's own budget
    shard, charged by primary key)."""

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
            self.append_one_sql = _Bound(store._append_one_own.statement, dialect)
            self.append_batch_sql = _Bound(store._append_batch_own.statement, dialect)
        else:
            self.advance = _Bound(store._advance.statement, dialect)
            self.charge = _Bound(store._charge.statement, dialect)
            self.insert_many = _Bound(store._insert_event.statement, dialect, columns)
        self.fixed = {"fast_room_id": self.room_id, "fast_gateway_id": GATEWAY, "fast_epoch": 1,
                      "fast_max_room_bytes": limits.MAX_ROOM_EVENT_BYTES,
                      "fast_spread_limit": limits.MAX_GATEWAY_EVENT_BYTES,
                      "notify_channel": ROOM_EVENTS_CHANNEL}  # the public schema's follower channel
        if self.ctx.postgres:  # the held connection's own shard (its server process's, known once)
            self.fixed["own_shard"] = int(self.connection.info.backend_pid) % store.budget_shards
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
        native = dict(rooms.read_events(engine, room_id=READ_ROOM, since_seq=0, limit=self.workload.page))
        native.pop("lineage", None)  # the native page's own key: the reference's page never had it
        if self.read_page(0) != native:
            raise RuntimeError("the reference-style page differs from read_events'")

    def durability(self) -> dict[str, str]:
        connection = self._connect()  # a connection opened as each call opens its own
        try:
            return sqlite_durability(dbapi_scalar(connection))
        finally:
            connection.close()

"""The SQLAlchemy floors: hostedrooms' validation and one-statement append on a bare Connection, with and
without the validation, and on the pool's DB-API connection.
"""

from __future__ import annotations

import json
import operator
import time
from typing import Any

from bench.common import (
    ACTOR,
    ACTOR_JSON,
    GATEWAY,
    KIND,
    PAYLOAD,
    PAYLOAD_JSON,
)
from bench.contenders.base import (
    Workload,
)
from bench.contenders.ours import Hostedrooms
from bench.contenders.raw import _Bound


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

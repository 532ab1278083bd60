"""eventsourcing as a peer: its own recorder, and its aggregate and application layers.
"""

from __future__ import annotations

import json
import uuid
from typing import Any, ClassVar

from bench.common import (
    dbapi_scalar,
    postgres_durability,
    sqlite_durability,
)
from bench.contenders.base import (
    Contender,
    event_state,
)


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

"""The replicas' store (:class:`hostedrooms.store.replicas.ReplicaStore`): each method's contract on a migrated,
empty store."""

from __future__ import annotations

from typing import Any

import pytest
from sqlalchemy import Engine
from sqlalchemy import exc as sa_exc

from hostedrooms import models
from hostedrooms.backends import Backend
from hostedrooms.errors import StoreUnavailableError, translate
from hostedrooms.store import replica_store
from hostedrooms.store.replicas import LogStats, ReplicaStore
from hostedrooms.uow import UnitOfWork

from .support import SHORT_WAIT, OnBackend, in_thread, snapshot

_replicas, _replica_events = models.replicas, models.replica_events


def replica_values(room_id: str = "room-1", **overrides: Any) -> dict[str, Any]:
    """Every column of a replica row with an empty log."""
    values = {"room_id": room_id, "name": "Team", "members_json": "[]", "authority_gateway_id": "gw-a",
              "authority_epoch": 1, "last_seq": 0, "latest_seq": 0, "event_bytes": 0, "created_at": 1.0,
              "updated_at": 1.0}
    return {**values, **overrides}


def replica_event(room_id: str, seq: int, *, kind: str = "message.created", created_at: float = 1.0,
                  event_id: str | None = None) -> dict[str, Any]:
    return {"room_id": room_id, "seq": seq, "event_id": event_id or f"e{seq}", "kind": kind, "actor_json": "{}",
            "authority_epoch": 1, "payload_json": '{"t":"\u00e9"}', "created_at": created_at}


def _size(row: dict[str, Any]) -> int:
    return sum(len(str(row[column]).encode()) for column in ("event_id", "kind", "actor_json", "payload_json"))


class ReplicaStoreContract(OnBackend):
    """What every backend's :class:`ReplicaStore` promises."""

    def seed(self, engine: Engine, *replicas: dict[str, Any], events: list[dict[str, Any]] | None = None) -> None:
        with UnitOfWork(engine) as uow:
            for values in replicas:
                uow.replicas.insert(values)
            if events:
                uow.replicas.insert_events(events)
            uow.commit()

    def _contend(self, quick_engine: Engine, impl: Backend, work: Any) -> Any:
        """``work(store)`` on a new transaction of ``quick_engine`` whose lock waits end after SHORT_WAIT, committed;
        a driver error translated."""
        def run() -> Any:
            with quick_engine.connect() as connection:
                try:
                    connection.begin()  # (SQLite: BEGIN IMMEDIATE is the wait)
                    with impl.probe_timeouts(connection, SHORT_WAIT):
                        found = work(replica_store(impl).bind(connection))
                except sa_exc.SQLAlchemyError as exc:
                    raise translate(exc, quick_engine.url) from exc
                connection.commit()
                return found
        return in_thread(run)

    def test_each_unit_binds_a_replica_store(self, engine: Engine, impl: Backend) -> None:
        with UnitOfWork(engine, write=False) as uow:
            assert isinstance(uow.replicas, ReplicaStore)
            assert uow.replicas.connection is uow.connection and uow.replicas.backend is impl

    def test_insert_then_read_count_and_lock(self, engine: Engine) -> None:
        self.seed(engine, replica_values(), replica_values("room-2"))
        with UnitOfWork(engine) as uow:
            assert dict(uow.replicas.replica("room-1") or {}) == replica_values()
            assert dict(uow.replicas.lock("room-2") or {}) == replica_values("room-2")
            assert uow.replicas.replica("absent") is None and uow.replicas.lock("absent") is None
            assert uow.replicas.count() == 2

    def test_lock_row_locks_the_replica(self, engine: Engine, quick_engine: Engine, impl: Backend) -> None:
        self.seed(engine, replica_values())
        with UnitOfWork(engine) as uow:
            assert uow.replicas.lock("room-1") is not None
            with pytest.raises(StoreUnavailableError):
                self._contend(quick_engine, impl, lambda store: store.update("room-1", {"name": "X"}))
        self._contend(quick_engine, impl, lambda store: store.update("room-1", {"name": "X"}))
        with UnitOfWork(engine, write=False) as uow:
            assert (uow.replicas.replica("room-1") or {})["name"] == "X"

    def test_lock_creation_excludes_a_second_creator(self, engine: Engine, quick_engine: Engine,
                                                     impl: Backend) -> None:
        def create(store: ReplicaStore) -> None:
            store.lock_creation()
            store.insert(replica_values("room-2"))

        with UnitOfWork(engine) as uow:
            uow.replicas.lock_creation()
            with pytest.raises(StoreUnavailableError):
                self._contend(quick_engine, impl, create)
        self._contend(quick_engine, impl, create)
        with UnitOfWork(engine, write=False) as uow:
            assert uow.replicas.count() == 1

    def test_events_between_holds_event_id_and_log_stats(self, engine: Engine) -> None:
        rows = [replica_event("room-1", seq) for seq in (1, 2, 3)]
        self.seed(engine, replica_values(last_seq=3), replica_values("room-2"), events=rows)
        with UnitOfWork(engine, write=False) as uow:
            store = uow.replicas
            assert {seq: dict(row) for seq, row in store.events_between("room-1", 2, 5).items()} == {
                2: rows[1], 3: rows[2]}
            assert store.events_between("room-2", 1, 5) == {}
            assert store.holds_event_id("room-1", ["nope", "e2"]) and not store.holds_event_id("room-1", ["nope"])
            assert not store.holds_event_id("room-2", ["e1"])
            assert store.log_stats("room-1") == LogStats(3, sum(map(_size, rows)), 1, 3, False)
            assert store.log_stats("room-2") == LogStats(0, 0, None, None, False)

    def test_log_stats_sees_a_disbanded_event(self, engine: Engine) -> None:
        rows = [replica_event("room-1", 1), replica_event("room-1", 2, kind="room.disbanded")]
        self.seed(engine, replica_values(last_seq=2), events=rows)
        with UnitOfWork(engine, write=False) as uow:
            assert uow.replicas.log_stats("room-1").disbanded

    def test_lock_disbanded_finds_replicas_ending_disbanded_by_the_cutoff(self, engine: Engine) -> None:
        self.seed(engine, replica_values("b", last_seq=1), replica_values("a", last_seq=1),
                  replica_values("late", last_seq=1), replica_values("reopened", last_seq=2),
                  replica_values("live", last_seq=1), events=[
                      replica_event("b", 1, kind="room.disbanded", created_at=5.0),
                      replica_event("a", 1, kind="room.disbanded", created_at=10.0),
                      replica_event("late", 1, kind="room.disbanded", created_at=11.0),
                      replica_event("reopened", 1, kind="room.disbanded", created_at=1.0),
                      replica_event("reopened", 2, created_at=2.0),
                      replica_event("live", 1, created_at=1.0)])
        with UnitOfWork(engine) as uow:
            assert uow.replicas.lock_disbanded(10.0) == ["a", "b"]

    def test_advance_is_fenced_by_last_seq(self, engine: Engine) -> None:
        self.seed(engine, replica_values(last_seq=3, event_bytes=10))
        with UnitOfWork(engine) as uow:
            assert not uow.replicas.advance("room-1", 2, 5, {"last_seq": 4})
            assert uow.replicas.advance("room-1", 3, 5, {"last_seq": 4, "latest_seq": 9})
            assert not uow.replicas.advance("room-1", 3, 5, {"last_seq": 5})  # the fence moved
            uow.commit()
        with UnitOfWork(engine, write=False) as uow:
            row = uow.replicas.replica("room-1") or {}
            assert (row["last_seq"], row["latest_seq"], row["event_bytes"]) == (4, 9, 15)

    def test_consume_and_delete_remove_replicas_with_their_logs(self, engine: Engine) -> None:
        self.seed(engine, replica_values("r1", last_seq=1), replica_values("r2", last_seq=1),
                  replica_values("r3", last_seq=1), replica_values("keep", last_seq=1),
                  events=[replica_event(room_id, 1) for room_id in ("r1", "r2", "r3", "keep")])
        with UnitOfWork(engine) as uow:
            uow.replicas.consume("r1")
            uow.replicas.delete(["r2", "r3", "absent"])
            uow.commit()
        after = snapshot(engine, _replicas, _replica_events)
        assert {row[0] for row in after[_replicas.name]} == {row[0] for row in after[_replica_events.name]} == {
            "keep"}


class TestReplicaStoreSQLite(ReplicaStoreContract):
    backend_name = "sqlite"


class TestReplicaStorePostgreSQL(ReplicaStoreContract):
    backend_name = "postgresql"

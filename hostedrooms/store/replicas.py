"""The replicas' store: every statement :mod:`hostedrooms.replicas` and the promotion run on the replica tables.

A :class:`ReplicaStore` is bound to one unit of work's connection (``uow.replicas``), like the room store
(:class:`hostedrooms.store.rooms.RoomStore`): the services hold the rules (validation, errors, the order of the
checks) and call it inside their unit; none of its methods commits. It owns the replica row's lock, the creation
lock (an advisory key, :mod:`hostedrooms.advisory_keys`), the fenced advance of an ingest, the id probes (answered from
the ``(room_id, event_id)`` index, revision ``0010_replica_event_ids``), the counts and the deletes.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Select, delete, exists, func, insert, literal, select, update

from .. import models
from ..advisory_keys import REPLICA_CREATION_LOCK_KEY
from ..backends import Backend
from .bound import BoundStore

__all__ = ["LogStats", "ReplicaStore", "id_clash_query"]

_replicas = models.replicas
_replica_events = models.replica_events


@dataclass(frozen=True, slots=True)
class LogStats:
    """A replica log's event count, accounted bytes, seq range and whether it holds ``room.disbanded``."""

    count: int
    size: int
    first: int | None
    last: int | None
    disbanded: bool


def id_clash_query(room_id: str, event_ids: Sequence[str]) -> Select[tuple[int]]:
    """The seq of a stored replica event of ``room_id`` holding one of ``event_ids`` (answered from the
    ``(room_id, event_id)`` index: one probe per id, whatever the replica's length)."""
    return select(_replica_events.c.seq).where(
        _replica_events.c.room_id == room_id, _replica_events.c.event_id.in_(list(event_ids))).limit(1)


class ReplicaStore(BoundStore):
    """The replica rows and their logs on one backend, bound to one unit's :attr:`connection` (:meth:`bind`)."""

    def __init__(self, backend: Backend) -> None:
        self.backend = backend

    # -- locks and reads -------------------------------------------------------------------------------------

    def lock_creation(self) -> None:
        """Serialise replica creation until the transaction ends (an exact replica cap)."""
        self.backend.advisory_lock(self.connection, REPLICA_CREATION_LOCK_KEY)

    def lock(self, room_id: str) -> Mapping[Any, Any] | None:
        """Every column of the replica of ``room_id``, row-locked until the transaction ends; None if absent."""
        stmt = self.backend.for_update(select(*_replicas.c).where(_replicas.c.room_id == room_id))
        return self.connection.execute(stmt).mappings().first()

    def replica(self, room_id: str) -> Mapping[Any, Any] | None:
        """Every column of the replica of ``room_id``, unlocked (readers)."""
        return self.connection.execute(
            select(*_replicas.c).where(_replicas.c.room_id == room_id)).mappings().first()

    def count(self) -> int:
        """How many replicas this store holds."""
        return int(self.connection.execute(select(func.count()).select_from(_replicas)).scalar_one())

    def events_between(self, room_id: str, first: int, last: int) -> dict[int, Mapping[Any, Any]]:
        """The stored replica events of ``room_id`` from seq ``first`` to ``last``, by seq."""
        rows = self.connection.execute(select(*_replica_events.c).where(
            _replica_events.c.room_id == room_id, _replica_events.c.seq >= first, _replica_events.c.seq <= last))
        return {int(row["seq"]): row for row in rows.mappings()}

    def holds_event_id(self, room_id: str, event_ids: Sequence[str]) -> bool:
        """Whether the replica log of ``room_id`` stores an event with one of ``event_ids``."""
        return self.connection.execute(id_clash_query(room_id, event_ids)).first() is not None

    def log_stats(self, room_id: str) -> LogStats:
        """Count, accounted bytes, seq range and whether a ``room.disbanded`` event is present, in one query."""
        size = sum((self.backend.byte_length(column) for column in (
            _replica_events.c.event_id, _replica_events.c.kind, _replica_events.c.actor_json,
            _replica_events.c.payload_json)), start=literal(0))
        disbanded = exists().where(_replica_events.c.room_id == room_id, _replica_events.c.kind == "room.disbanded")
        row = self.connection.execute(
            select(func.count(), func.coalesce(func.sum(size), 0), func.min(_replica_events.c.seq),
                   func.max(_replica_events.c.seq), disbanded.label("disbanded"))
            .where(_replica_events.c.room_id == room_id)).one()
        return LogStats(int(row[0]), int(row[1]), row[2], row[3], bool(row[4]))

    def lock_disbanded(self, cutoff: float) -> list[str]:
        """Row-lock the replicas whose last event is ``room.disbanded`` stamped at or before ``cutoff`` (an ingest
        of one still running finishes first); their room ids in code-point order."""
        last = _replica_events.alias("last_event")
        disbanded = (
            select(_replicas.c.room_id)
            .join(last, (last.c.room_id == _replicas.c.room_id) & (last.c.seq == _replicas.c.last_seq))
            .where(last.c.kind == "room.disbanded", last.c.created_at <= cutoff))
        return sorted(str(room_id) for room_id in self.connection.execute(self.backend.for_update(disbanded))
                      .scalars())

    # -- writes ------------------------------------------------------------------------------------------------

    def insert(self, values: Mapping[str, Any]) -> None:
        """Insert one replica row (every column given)."""
        self.connection.execute(insert(_replicas).values(**values))

    def insert_events(self, rows: Iterable[Mapping[str, Any]]) -> None:
        """Insert replica event rows (one statement)."""
        self.connection.execute(insert(_replica_events), list(rows))

    def advance(self, room_id: str, last_seq: int, added: int, values: Mapping[str, Any]) -> bool:
        """Set ``values`` and add ``added`` bytes to the replica of ``room_id``, only while its ``last_seq`` is still
        ``last_seq`` (the ingest's fence); whether exactly one row changed."""
        stmt = (update(_replicas).where(_replicas.c.room_id == room_id, _replicas.c.last_seq == last_seq)
                .values(event_bytes=_replicas.c.event_bytes + added, **values))
        return self.connection.execute(stmt).rowcount == 1

    def update(self, room_id: str, values: Mapping[str, Any]) -> None:
        """Set ``values`` on the replica of ``room_id`` (locked by the caller)."""
        self.connection.execute(update(_replicas).where(_replicas.c.room_id == room_id).values(**values))

    def consume(self, room_id: str) -> None:
        """Delete the replica of ``room_id`` with its log (promotion: the room now holds the log)."""
        self.connection.execute(delete(_replica_events).where(_replica_events.c.room_id == room_id))
        self.connection.execute(delete(_replicas).where(_replicas.c.room_id == room_id))

    def delete(self, room_ids: Sequence[str]) -> None:
        """Delete these replicas with their logs."""
        self.connection.execute(delete(_replica_events).where(_replica_events.c.room_id.in_(list(room_ids))))
        self.connection.execute(delete(_replicas).where(_replicas.c.room_id.in_(list(room_ids))))

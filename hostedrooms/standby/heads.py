"""Cheap read-only listings a standby needs and the public services do not offer yet.

Each is one short read transaction of Core statements over the models, on both backends:

* :func:`room_heads`: the rooms of a store in code-point order of ``room_id`` (keyset pages, so rooms that
  change while a pass lists them are neither skipped nor repeated, unlike ``list_rooms``' offset pages ordered
  by ``updated_at``), each with its authority, epoch, latest seq and whether it is disbanded; no names or
  members (up to 128 KiB per room), so a listing stays small whatever the members;
* :func:`replica_heads`: the coverage and lineage of every replica, without reading ``replica_state`` per room;
* :func:`disbanded_replicas`: which replicas hold a ``room.disbanded`` event (promotion refuses them);
* :func:`takeover_heads` and :func:`takeover_usage`: what a failover plans with (the old authority's rooms'
  last event and bytes; this store's active rooms, bytes, replicas and retired ids);
* :func:`room_counters`: a few sums over the rooms table that change with every committed append, claim,
  disband or purge (the PostgreSQL change probe).

Their statements are in :mod:`hostedrooms.queries.heads`; each function here is one read transaction.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from ..engines import EngineSource, resolve_engine
from ..errors import HostedRoomError
from ..queries import heads as reads
from ..uow import UnitOfWork

__all__ = [
    "LISTING_PAGE",
    "ReplicaHead",
    "RoomHead",
    "TakeoverHead",
    "TakeoverUsage",
    "all_replica_heads",
    "all_room_heads",
    "disbanded_replicas",
    "replica_heads",
    "room_counters",
    "room_heads",
    "takeover_heads",
    "takeover_usage",
]

#: Rooms or replicas per listing page (the services' MAX_ROOM_LIST_LIMIT).
LISTING_PAGE = 500


@dataclass(frozen=True, slots=True)
class RoomHead:
    """One room as a replicator sees it: its lineage (authority and epoch), its latest seq, whether disbanded."""

    room_id: str
    authority_gateway_id: str
    authority_epoch: int
    latest_seq: int
    disbanded: bool

    def to_dict(self) -> dict[str, Any]:
        return {"room_id": self.room_id, "authority_gateway_id": self.authority_gateway_id,
                "authority_epoch": self.authority_epoch, "latest_seq": self.latest_seq, "disbanded": self.disbanded}


@dataclass(frozen=True, slots=True)
class ReplicaHead:
    """One stored replica's coverage and lineage (what ``replica_state`` returns, without name and members)."""

    room_id: str
    authority_gateway_id: str
    authority_epoch: int
    last_seq: int
    latest_seq: int

    @property
    def caught_up(self) -> bool:
        """Whether the replica holds every event the authority's last page reported."""
        return self.last_seq >= self.latest_seq


def _page_args(after: Any, limit: Any) -> tuple[str | None, int]:
    if after is not None and not isinstance(after, str):
        raise HostedRoomError("after must be a room_id string or None")
    if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= LISTING_PAGE:
        raise HostedRoomError(f"limit must be an integer from 1 to {LISTING_PAGE}")
    return after, limit


def room_heads(engine: EngineSource, *, after: str | None = None, limit: int = LISTING_PAGE) -> list[RoomHead]:
    """Up to ``limit`` rooms (live and disbanded-but-retained) whose ``room_id`` sorts after ``after`` by code
    point, in that order."""
    after, limit = _page_args(after, limit)
    with UnitOfWork(resolve_engine(engine), write=False) as uow:
        rows = reads.room_heads_after(uow.connection, uow.backend, after, limit)
    return [RoomHead(str(row[0]), str(row[1]), int(row[2]), int(row[3]) - 1, row[4] is not None) for row in rows]


def all_room_heads(engine: EngineSource) -> dict[str, RoomHead]:
    """Every room of the store by id (a few hundred at most: MAX_ACTIVE_ROOMS plus retained tombstones)."""
    return {head.room_id: head for head in _walk(lambda after: room_heads(engine, after=after))}


def replica_heads(
    engine: EngineSource, *, after: str | None = None, limit: int = LISTING_PAGE
) -> list[ReplicaHead]:
    """Up to ``limit`` replicas whose ``room_id`` sorts after ``after`` by code point, in that order."""
    after, limit = _page_args(after, limit)
    with UnitOfWork(resolve_engine(engine), write=False) as uow:
        rows = reads.replica_heads_after(uow.connection, uow.backend, after, limit)
    return [ReplicaHead(str(row[0]), str(row[1]), int(row[2]), int(row[3]), int(row[4])) for row in rows]


def all_replica_heads(engine: EngineSource) -> dict[str, ReplicaHead]:
    """Every replica of the store by room id (at most MAX_REPLICA_ROOMS)."""
    return {head.room_id: head for head in _walk(lambda after: replica_heads(engine, after=after))}


def _walk(page: Any) -> Iterator[Any]:
    after: str | None = None
    while True:
        heads = page(after)
        yield from heads
        if len(heads) < LISTING_PAGE:
            return
        after = heads[-1].room_id


def disbanded_replicas(engine: EngineSource, room_ids: list[str]) -> set[str]:
    """Those of ``room_ids`` whose replica log holds ``room.disbanded`` (their rooms are gone for good)."""
    if not room_ids:
        return set()
    with UnitOfWork(resolve_engine(engine), write=False) as uow:
        return reads.disbanded_replica_ids(uow.connection, room_ids)


def room_counters(engine: EngineSource) -> tuple[int, ...]:
    """Sums over the rooms table that grow with every committed append, claim, rename and disband, and change
    when a room is created or purged: equal results mean no such commit in between (a change probe)."""
    with UnitOfWork(resolve_engine(engine), write=False) as uow:
        return reads.room_counter_sums(uow.connection)


@dataclass(frozen=True, slots=True)
class TakeoverHead:
    """One room of the old authority as a failover plans it: its lineage, last seq, that event's id (None when
    empty) and its accounted bytes, read in one snapshot."""

    room_id: str
    authority_gateway_id: str
    authority_epoch: int
    latest_seq: int
    event_id: str | None
    event_bytes: int
    disbanded: bool


def takeover_heads(engine: EngineSource, room_ids: Sequence[str]) -> dict[str, TakeoverHead]:
    """The rooms ``room_ids`` of a store (those that exist), each with its head event's id and its bytes."""
    if not room_ids:
        return {}
    with UnitOfWork(resolve_engine(engine), write=False) as uow:
        rows = reads.takeover_rows(uow.connection, room_ids)
    return {str(row[0]): TakeoverHead(str(row[0]), str(row[1]), int(row[2]), int(row[3]) - 1,
                                      None if row[4] is None else str(row[4]), int(row[5]), row[6] is not None)
            for row in rows}


@dataclass(frozen=True, slots=True)
class TakeoverUsage:
    """What a standby's store holds, for a failover's capacity plan."""

    active_rooms: int
    event_bytes: int
    replicas: int
    retired: frozenset[str]


def takeover_usage(engine: EngineSource, room_ids: Sequence[str]) -> TakeoverUsage:
    """This store's active rooms, accounted bytes (live and disbanded rooms), replicas, and which of
    ``room_ids`` are retired here, in one snapshot."""
    with UnitOfWork(resolve_engine(engine), write=False) as uow:
        active, size, replicas, retired = reads.takeover_usage_counts(uow.connection, room_ids)
    return TakeoverUsage(active, size, replicas, frozenset(retired))

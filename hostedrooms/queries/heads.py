"""The reads of a standby's listings (:mod:`hostedrooms.standby.heads`): keyset pages of rooms and replicas, the
disbanded replicas, the rooms table's change counters and what a failover plans with. Each runs on the caller's
connection, in its read transaction; the listing services validate their arguments and shape the rows."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sqlalchemy import ColumnElement, Connection, func, select

from .. import models
from ..backends import Backend

__all__ = [
    "disbanded_replica_ids",
    "replica_heads_after",
    "room_counter_sums",
    "room_heads_after",
    "takeover_rows",
    "takeover_usage_counts",
]

_rooms = models.rooms
_replicas = models.replicas
_replica_events = models.replica_events
_events = models.events
_retired = models.retired_ids


def _keyset_page(
    connection: Connection, backend: Backend, after: str | None, limit: int, key: ColumnElement[str],
    *columns: ColumnElement[Any],
) -> Sequence[Sequence[Any]]:
    # One keyset page: the rows whose ``key`` sorts after ``after`` by code point, in that order.
    order = backend.bytewise(key)
    stmt = select(key, *columns)
    if after is not None:
        stmt = stmt.where(order > after)
    return connection.execute(stmt.order_by(order).limit(limit)).all()


def room_heads_after(
    connection: Connection, backend: Backend, after: str | None, limit: int
) -> Sequence[Sequence[Any]]:
    """Up to ``limit`` rooms whose id sorts after ``after`` by code point, in that order, as ``(room_id,
    authority_gateway_id, authority_epoch, next_seq, disbanded_at)``."""
    return _keyset_page(connection, backend, after, limit, _rooms.c.room_id, _rooms.c.authority_gateway_id,
                        _rooms.c.authority_epoch, _rooms.c.next_seq, _rooms.c.disbanded_at)


def replica_heads_after(
    connection: Connection, backend: Backend, after: str | None, limit: int
) -> Sequence[Sequence[Any]]:
    """Up to ``limit`` replicas whose room id sorts after ``after`` by code point, in that order, as ``(room_id,
    authority_gateway_id, authority_epoch, last_seq, latest_seq)``."""
    return _keyset_page(connection, backend, after, limit, _replicas.c.room_id, _replicas.c.authority_gateway_id,
                        _replicas.c.authority_epoch, _replicas.c.last_seq, _replicas.c.latest_seq)


def disbanded_replica_ids(connection: Connection, room_ids: list[str]) -> set[str]:
    """Those of ``room_ids`` (not empty) whose replica log holds ``room.disbanded``."""
    rows = connection.execute(
        select(_replica_events.c.room_id).distinct()
        .where(_replica_events.c.kind == "room.disbanded", _replica_events.c.room_id.in_(room_ids))).scalars()
    return {str(room_id) for room_id in rows}


def room_counter_sums(connection: Connection) -> tuple[int, ...]:
    """The rooms, and the sums of their ``next_seq``, ``authority_epoch`` and ``revision``, and the disbanded."""
    row = connection.execute(select(
        func.count(), func.coalesce(func.sum(_rooms.c.next_seq), 0),
        func.coalesce(func.sum(_rooms.c.authority_epoch), 0), func.coalesce(func.sum(_rooms.c.revision), 0),
        func.count(_rooms.c.disbanded_at))).one()
    return tuple(int(value) for value in row)


def takeover_rows(connection: Connection, room_ids: Sequence[str]) -> Sequence[Sequence[Any]]:
    """The rooms ``room_ids`` (not empty) that exist, as ``(room_id, authority_gateway_id, authority_epoch,
    next_seq, head event id or None, event_bytes, disbanded_at)``."""
    head_id = (select(_events.c.event_id)
               .where(_events.c.room_id == _rooms.c.room_id, _events.c.seq == _rooms.c.next_seq - 1)
               .scalar_subquery())
    return connection.execute(select(
        _rooms.c.room_id, _rooms.c.authority_gateway_id, _rooms.c.authority_epoch, _rooms.c.next_seq, head_id,
        _rooms.c.event_bytes, _rooms.c.disbanded_at).where(_rooms.c.room_id.in_(list(room_ids)))).all()


def takeover_usage_counts(connection: Connection, room_ids: Sequence[str]) -> tuple[int, int, int, list[str]]:
    """Active rooms, accounted bytes (live and disbanded rooms), replicas, and which of ``room_ids`` are retired."""
    active = connection.execute(select(func.count()).where(_rooms.c.disbanded_at.is_(None))).scalar_one()
    size = connection.execute(select(func.coalesce(func.sum(_rooms.c.event_bytes), 0))).scalar_one()
    replicas = connection.execute(select(func.count()).select_from(_replicas)).scalar_one()
    retired = connection.execute(select(_retired.c.room_id).where(
        _retired.c.room_id.in_(list(room_ids)))).scalars().all() if room_ids else []
    return int(active), int(size), int(replicas), [str(room_id) for room_id in retired]

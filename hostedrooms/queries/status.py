"""The reads of a store's status (:func:`hostedrooms.status.store_status`): room and replica totals, the fullest
rooms, the most lagging replicas, the ledger's rows by state. Each is one statement on the caller's connection
(its read-only snapshot); the service turns the numbers into caps and ages."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sqlalchemy import Connection, Table, case, func, literal, select

from ..backends import Backend
from ..models import deliveries, outbound_intents, replicas, rooms

__all__ = [
    "delivery_states",
    "fullest_rooms",
    "most_behind_replicas",
    "outbound_states",
    "replica_totals",
    "responses_pending",
    "room_totals",
]

_live = rooms.c.disbanded_at.is_(None)
_events = rooms.c.next_seq - 1
_lag = replicas.c.latest_seq - replicas.c.last_seq


def _total(expr: Any) -> Any:
    return func.coalesce(func.sum(expr), 0)


def room_totals(connection: Connection) -> tuple[int, int, int, int, int, int]:
    """Live rooms, disbanded rooms, events, disbanded rooms' bytes, and a live room's most events and most bytes."""
    totals = connection.execute(select(
        _total(case((_live, 1), else_=0)), _total(case((_live, 0), else_=1)), _total(_events),
        _total(case((_live, 0), else_=rooms.c.event_bytes)),
        func.coalesce(func.max(case((_live, _events))), 0),
        func.coalesce(func.max(case((_live, rooms.c.event_bytes))), 0),
    )).one()
    live, disbanded, events, disbanded_bytes, most_events, most_bytes = (int(value) for value in totals)
    return live, disbanded, events, disbanded_bytes, most_events, most_bytes


def fullest_rooms(
    connection: Connection, backend: Backend, events_limit: float, bytes_limit: float, top: int
) -> Sequence[Any]:
    """Up to ``top`` live rooms as ``(room_id, events, bytes)``, the fullest first: the larger of a room's two
    fractions of ``events_limit`` and ``bytes_limit``; ties by room id in code-point order."""
    fullness = backend.greatest(_events / literal(events_limit), rooms.c.event_bytes / literal(bytes_limit))
    return connection.execute(
        select(rooms.c.room_id, _events, rooms.c.event_bytes).where(_live)
        .order_by(fullness.desc(), backend.bytewise(rooms.c.room_id)).limit(top)).all()


def replica_totals(connection: Connection) -> tuple[int, int, int, int, int]:
    """Replicas, those behind their source's last reported seq, their lag summed, the largest lag, the largest
    replica's bytes."""
    behind = _lag > 0
    count, behind_count, lag_total, max_lag, largest = (int(value) for value in connection.execute(select(
        func.count(), _total(case((behind, 1), else_=0)), _total(case((behind, _lag), else_=0)),
        func.coalesce(func.max(case((behind, _lag), else_=0)), 0), func.coalesce(func.max(replicas.c.event_bytes), 0),
    ).select_from(replicas)).one())
    return count, behind_count, lag_total, max_lag, largest


def most_behind_replicas(connection: Connection, backend: Backend, top: int) -> Sequence[Any]:
    """Up to ``top`` replicas, the most lagging first (ties by room id in code-point order), as ``(room_id,
    authority_gateway_id, authority_epoch, last_seq, latest_seq, event_bytes, updated_at)``."""
    return connection.execute(
        select(replicas.c.room_id, replicas.c.authority_gateway_id, replicas.c.authority_epoch, replicas.c.last_seq,
               replicas.c.latest_seq, replicas.c.event_bytes, replicas.c.updated_at)
        .order_by(_lag.desc(), backend.bytewise(replicas.c.room_id)).limit(top)).all()


def _by_state(connection: Connection, table: Table) -> dict[str, tuple[int, Any]]:
    return {str(state): (int(count), oldest) for state, count, oldest in connection.execute(
        select(table.c.state, func.count(), func.min(table.c.created_at)).group_by(table.c.state)).all()}


def delivery_states(connection: Connection) -> dict[str, tuple[int, Any]]:
    """Each stored delivery state: how many deliveries hold it and the oldest one's ``created_at``."""
    return _by_state(connection, deliveries)


def outbound_states(connection: Connection) -> dict[str, tuple[int, Any]]:
    """Each stored outbound intent state: how many intents hold it and the oldest one's ``created_at``."""
    return _by_state(connection, outbound_intents)


def responses_pending(connection: Connection) -> int:
    """How many admitted deliveries hold a response intent not yet committed."""
    return int(connection.execute(select(func.count()).select_from(deliveries).where(
        deliveries.c.state.in_(("authorized", "queued", "running")), deliveries.c.response_request_id.is_not(None),
        deliveries.c.response_committed == 0)).scalar_one())

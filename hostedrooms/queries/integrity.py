"""The reads of the integrity verifier (:func:`hostedrooms.integrity.verify`): each finds the rows that break one
invariant, as one aggregate query or one streamed scan (nothing is loaded whole), on the caller's connection in
its read-only transaction. The verifier turns the rows into violations; :func:`hostedrooms.integrity.repair_budget`
reads the budget here and writes it through the room store."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

import sqlalchemy as sa
from sqlalchemy import Connection

from ..backends import Backend
from ..models import DELIVERY_STATES, budget, deliveries, events, outbound_intents, replica_events, replicas, rooms
from ..models import retired_ids as retired

__all__ = [
    "budget_shards",
    "budget_totals",
    "committed_responses_without_request",
    "delivery_owner_counts",
    "disbanded_rooms_not_retired",
    "duplicate_event_ids",
    "event_at",
    "event_bytes_mismatches",
    "events_above_room_epoch",
    "orphan_events",
    "orphan_replica_events",
    "replica_log_mismatches",
    "room_bytes_total",
    "room_seq_mismatches",
    "scan_events",
    "scan_pending_outbound_snapshots",
    "scan_unfinished_delivery_bodies",
    "unknown_delivery_states",
]

#: Rows fetched at a time by the streamed scans.
SCAN_BATCH = 500


def _event_stats(table: sa.Table) -> sa.Subquery:
    return (sa.select(table.c.room_id, sa.func.count().label("n"), sa.func.min(table.c.seq).label("lo"),
                      sa.func.max(table.c.seq).label("hi"))
            .group_by(table.c.room_id).subquery())


def _scan(connection: Connection, query: sa.Select[Any]) -> Iterator[sa.RowMapping]:
    """The rows of ``query``, streamed (a server-side cursor where the driver has one)."""
    result = connection.execution_options(stream_results=True, yield_per=SCAN_BATCH).execute(query)
    yield from result.mappings()


# --- room logs


def room_seq_mismatches(connection: Connection) -> Iterable[Any]:
    """``(room_id, next_seq, n, lo, hi)`` of each room whose events' seqs are not exactly 1..next_seq-1."""
    stats = _event_stats(events)
    count = sa.func.coalesce(stats.c.n, 0)
    return connection.execute(
        sa.select(rooms.c.room_id, rooms.c.next_seq, count, stats.c.lo, stats.c.hi)
        .select_from(rooms.outerjoin(stats, stats.c.room_id == rooms.c.room_id))
        .where(sa.or_(count != rooms.c.next_seq - 1,
                      sa.and_(count > 0, sa.or_(stats.c.lo != 1, stats.c.hi != rooms.c.next_seq - 1))))
        .order_by(rooms.c.room_id))


def orphan_events(connection: Connection) -> Iterable[Any]:
    """``(room_id, n)`` of each room id that has events but no room."""
    return connection.execute(sa.select(events.c.room_id, sa.func.count()).where(
        ~sa.exists().where(rooms.c.room_id == events.c.room_id)).group_by(events.c.room_id))


def event_bytes_mismatches(connection: Connection, backend: Backend) -> Iterable[Any]:
    """``(room_id, stored, actual)`` of each room whose ``event_bytes`` is not the UTF-8 bytes of its events' id,
    kind, actor and payload."""
    size = sum((backend.byte_length(column) for column in
                (events.c.event_id, events.c.kind, events.c.actor_json, events.c.payload_json)),
               start=sa.literal(0))
    sums = sa.select(events.c.room_id, sa.func.sum(size).label("total")).group_by(events.c.room_id).subquery()
    total = sa.func.coalesce(sums.c.total, 0)
    return connection.execute(
        sa.select(rooms.c.room_id, rooms.c.event_bytes, total)
        .select_from(rooms.outerjoin(sums, sums.c.room_id == rooms.c.room_id))
        .where(rooms.c.event_bytes != total).order_by(rooms.c.room_id))


def duplicate_event_ids(connection: Connection) -> Iterable[Any]:
    """``(room_id, event_id, n)`` of each event id stored more than once in a room."""
    return connection.execute(
        sa.select(events.c.room_id, events.c.event_id, sa.func.count())
        .group_by(events.c.room_id, events.c.event_id).having(sa.func.count() > 1))


def events_above_room_epoch(connection: Connection) -> Iterable[Any]:
    """``(room_id, seq, event_epoch, room_epoch)`` of each event whose epoch is above its room's."""
    return connection.execute(
        sa.select(events.c.room_id, events.c.seq, events.c.authority_epoch, rooms.c.authority_epoch)
        .join(rooms, rooms.c.room_id == events.c.room_id)
        .where(events.c.authority_epoch > rooms.c.authority_epoch).order_by(events.c.room_id, events.c.seq))


def disbanded_rooms_not_retired(connection: Connection) -> Iterable[Any]:
    """``(room_id,)`` of each disbanded room whose id is not retired."""
    return connection.execute(sa.select(rooms.c.room_id).where(
        rooms.c.disbanded_at.is_not(None), ~sa.exists().where(retired.c.room_id == rooms.c.room_id)))


def scan_events(connection: Connection, *, replica: bool) -> Iterator[sa.RowMapping]:
    """Every event of the room logs (``replica``: of the replica logs) by room and seq, streamed."""
    table = replica_events if replica else events
    return _scan(connection, sa.select(table).order_by(table.c.room_id, table.c.seq))


def event_at(connection: Connection, room_id: str, seq: int) -> Any:
    """The event ``seq`` of room ``room_id`` (its rooms', else its replicas') as ``(event_id, kind, actor_json,
    authority_epoch, payload_json)``, or None."""
    row = None
    for table in (events, replica_events):
        row = connection.execute(sa.select(table.c.event_id, table.c.kind, table.c.actor_json,
                                           table.c.authority_epoch, table.c.payload_json).where(
            table.c.room_id == room_id, table.c.seq == seq)).first()
        if row is not None:
            break
    return row


# --- replica logs


def replica_log_mismatches(connection: Connection) -> Iterable[Any]:
    """``(room_id, last_seq, latest_seq, n, lo, hi)`` of each replica whose events are not exactly 1..last_seq, or
    whose last_seq is above the authority's latest_seq."""
    stats = _event_stats(replica_events)
    count = sa.func.coalesce(stats.c.n, 0)
    return connection.execute(
        sa.select(replicas.c.room_id, replicas.c.last_seq, replicas.c.latest_seq, count, stats.c.lo, stats.c.hi)
        .select_from(replicas.outerjoin(stats, stats.c.room_id == replicas.c.room_id))
        .where(sa.or_(count != replicas.c.last_seq, replicas.c.latest_seq < replicas.c.last_seq,
                      sa.and_(count > 0, sa.or_(stats.c.lo != 1, stats.c.hi != replicas.c.last_seq))))
        .order_by(replicas.c.room_id))


def orphan_replica_events(connection: Connection) -> Iterable[Any]:
    """``(room_id, n)`` of each room id that has replica events but no replica."""
    return connection.execute(
        sa.select(replica_events.c.room_id, sa.func.count())
        .where(~sa.exists().where(replicas.c.room_id == replica_events.c.room_id))
        .group_by(replica_events.c.room_id))


# --- the ledger


def scan_unfinished_delivery_bodies(connection: Connection) -> Iterator[sa.RowMapping]:
    """``envelope_id`` and ``body_json`` of every unfinished delivery, streamed."""
    return _scan(connection, sa.select(deliveries.c.envelope_id, deliveries.c.body_json)
                 .where(deliveries.c.state.not_in(("completed", "failed"))).order_by(deliveries.c.envelope_id))


def scan_pending_outbound_snapshots(connection: Connection) -> Iterator[sa.RowMapping]:
    """``request_id`` and ``snapshot_json`` of every pending outbound intent, streamed."""
    return _scan(connection, sa.select(outbound_intents.c.request_id, outbound_intents.c.snapshot_json)
                 .where(outbound_intents.c.state == "pending").order_by(outbound_intents.c.request_id))


def delivery_owner_counts(connection: Connection) -> Iterator[tuple[str, Any, int]]:
    """``(column, owner, n)`` of each queued id, then each run id, that owns more than one delivery."""
    for column in (deliveries.c.queued_id, deliveries.c.run_id):
        query = (sa.select(column, sa.func.count()).where(column.is_not(None))
                 .group_by(column).having(sa.func.count() > 1))
        for owner, n in connection.execute(query):
            yield column.name, owner, n


def unknown_delivery_states(connection: Connection) -> Iterable[Any]:
    """``(envelope_id, state)`` of each delivery in a state the schema does not know."""
    return connection.execute(sa.select(deliveries.c.envelope_id, deliveries.c.state).where(
        deliveries.c.state.not_in(DELIVERY_STATES)))


def committed_responses_without_request(connection: Connection) -> Iterable[Any]:
    """``(envelope_id,)`` of each delivery whose response is committed but names no request."""
    return connection.execute(sa.select(deliveries.c.envelope_id).where(
        deliveries.c.response_committed == 1, deliveries.c.response_request_id.is_(None)))


# --- the gateway budget


def budget_totals(connection: Connection) -> tuple[Any, Any, Any]:
    """The shards' ``used`` sum, ``allowance`` sum and the largest limit they were spread for."""
    used, allowance, limit = connection.execute(sa.select(
        sa.func.coalesce(sa.func.sum(budget.c.used), 0), sa.func.coalesce(sa.func.sum(budget.c.allowance), 0),
        sa.func.coalesce(sa.func.max(budget.c.spread_limit), 0))).one()
    return used, allowance, limit


def room_bytes_total(connection: Connection) -> Any:
    """Every room's ``event_bytes`` (live and disbanded), summed."""
    return connection.execute(sa.select(sa.func.coalesce(sa.func.sum(rooms.c.event_bytes), 0))).scalar_one()


def budget_shards(connection: Connection) -> tuple[int, int, int]:
    """The shards: how many, their ``used`` sum and their ``allowance`` sum."""
    count, used, allowance = connection.execute(sa.select(
        sa.func.count(), sa.func.coalesce(sa.func.sum(budget.c.used), 0),
        sa.func.coalesce(sa.func.sum(budget.c.allowance), 0))).one()
    return int(count), int(used), int(allowance)

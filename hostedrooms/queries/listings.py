"""Read-only listings of a store, as the console script prints them: rooms, replicas, secure-peer deliveries and a
room's log, a page at a time.

Each query opens one read unit of work and changes nothing. Rows come back as the driver returns them (values
unformatted, ``None`` kept); rendering them is the caller's business.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import sqlalchemy as sa
from sqlalchemy import Engine

from ..models import DELIVERY_STATES, deliveries, replicas, rooms
from ..store import REPLAY_COLUMNS, room_store
from ..uow import UnitOfWork
from ..validation import INT64_MAX

__all__ = ["DELIVERY_STATES", "LOG_COLUMNS", "LOG_FETCH_ROWS", "deliveries_listing", "replicas_listing", "room_exists",
           "room_log_page", "rooms_listing"]

#: What each row of :func:`room_log_page` holds first, in order (a row may hold one more value: ignore it).
LOG_COLUMNS = REPLAY_COLUMNS
#: The rows a backend that steps its cursor fetches at a time while reading a log page: a page has no byte budget
#: (it is a number of events), so the page's byte bound is the largest the statement takes and the bound of one
#: event is set to make that many rows of it.
LOG_FETCH_ROWS = 512


def rooms_listing(engine: Engine) -> Sequence[sa.Row[Any]]:
    """Every room, the most recently updated first: ``room_id, name, authority_gateway_id, authority_epoch``, its
    latest seq (``next_seq - 1``), ``event_bytes, disbanded_at`` (None while live)."""
    with UnitOfWork(engine, write=False) as uow:
        return uow.execute(sa.select(
            rooms.c.room_id, rooms.c.name, rooms.c.authority_gateway_id, rooms.c.authority_epoch,
            rooms.c.next_seq - 1, rooms.c.event_bytes, rooms.c.disbanded_at,
        ).order_by(rooms.c.updated_at.desc(), rooms.c.room_id)).all()


def replicas_listing(engine: Engine) -> Sequence[sa.Row[Any]]:
    """Every replica by room id: ``room_id, authority_gateway_id, authority_epoch, last_seq`` (ingested),
    ``latest_seq`` (the source's, as its last page reported it) and ``event_bytes``."""
    with UnitOfWork(engine, write=False) as uow:
        return uow.execute(sa.select(
            replicas.c.room_id, replicas.c.authority_gateway_id, replicas.c.authority_epoch,
            replicas.c.last_seq, replicas.c.latest_seq, replicas.c.event_bytes,
        ).order_by(replicas.c.room_id)).all()


def deliveries_listing(engine: Engine, state: str | None = None) -> Sequence[sa.Row[Any]]:
    """Every secure-peer delivery (those in ``state`` only, when given; one of :data:`DELIVERY_STATES`), the most
    recently updated first: ``envelope_id, state, kind, target_chat_id, queued_id, run_id, updated_at``."""
    query = sa.select(
        deliveries.c.envelope_id, deliveries.c.state, deliveries.c.kind, deliveries.c.target_chat_id,
        deliveries.c.queued_id, deliveries.c.run_id, deliveries.c.updated_at,
    ).order_by(deliveries.c.updated_at.desc(), deliveries.c.envelope_id)
    if state:
        query = query.where(deliveries.c.state == state)
    with UnitOfWork(engine, write=False) as uow:
        return uow.execute(query).all()


def room_exists(engine: Engine, room_id: str) -> bool:
    """Whether the store holds room ``room_id`` (live or disbanded)."""
    with UnitOfWork(engine, write=False) as uow:
        return room_store(uow.backend).room_head(uow.connection, room_id) is not None


def room_log_page(engine: Engine, room_id: str, *, since: int, limit: int) -> list[tuple[Any, ...]] | None:
    """Up to ``limit`` event rows of ``room_id`` after seq ``since``, in seq order, as stored (:data:`LOG_COLUMNS`
    first: texts undecoded, so a value the decoder refuses can still be shown); None when there is no such room.

    The room's head and its rows are read in one read unit (the store's compiled replay statement); ``limit``
    alone bounds the page, so memory is the caller's choice of ``limit``.
    """
    with UnitOfWork(engine, write=False) as uow:
        store = room_store(uow.backend)
        if store.room_head(uow.connection, room_id) is None:
            return None
        rows, _ = store.replay_rows(uow.connection, room_id, since=since, latest_seq=INT64_MAX, limit=limit,
                                    max_bytes=INT64_MAX, max_event_bytes=INT64_MAX // LOG_FETCH_ROWS)
    return rows

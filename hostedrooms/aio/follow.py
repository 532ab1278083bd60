"""``follow()`` for asyncio: :func:`hostedrooms.rooms.follow`'s loop, awaited (the same cursor, checks and
guarantees; see :mod:`hostedrooms.rooms.follow`).

The synchronous ``follow()`` checks the room when called. A plain function cannot await, so the asyncio
``follow()`` checks its arguments when called and the room on the first ``__anext__``, before yielding anything.
A web service that must refuse an unknown room before it answers (an SSE stream's ``200``) awaits
:func:`open_follow` instead: the same iterator, returned once the room was checked.

Each has its ``follow`` span, as the synchronous ``follow()`` (whose span is its call's checks): for
``follow()``, the first ``__anext__``'s opening, up to and with its first page read (what checks the room there),
before anything is yielded or awaited for a commit; for ``open_follow()``, the awaited call (its checks).
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncGenerator, Mapping
from typing import Any

from sqlalchemy.ext.asyncio import AsyncEngine

from .. import rooms as _rooms
from ..errors import InvalidInputError
from ..limits import Limits
from ..records import EventPage, EventRecord
from ..rooms.follow import FollowCursor, check_intervals
from ..telemetry import follow_woke, traced_block
from ..wakeup import FALLBACK_INTERVAL, RECONNECT_DEADLINE, check_waitable
from .derive import service
from .engines import require_async_engine
from .wakeup import room_wakeup

__all__ = ["follow", "open_follow"]

_read_events = service(_rooms.read_events)
_room_state = service(_rooms.room_state)


def follow(
    engine: AsyncEngine, room_id: str, since_seq: int = 0, *, limit: int = 100, poll_interval: float | None = None,
    fallback_interval: float = FALLBACK_INTERVAL, limits: Limits | None = None,
    reconnect_deadline: float = RECONNECT_DEADLINE,
    last_event: Mapping[str, Any] | None = None, lineage: str | None = None,
) -> AsyncGenerator[EventRecord, None]:
    """``async for event in follow(engine, room_id, since_seq)``: each event after ``since_seq``, in seq order,
    as it commits; ends after ``room.disbanded``. Arguments are checked here, before anything is opened. While it
    waits it holds no connection (the engine's one shared waiter wakes it); close the iterator
    (``contextlib.aclosing``), cancel its task or its anyio cancel scope to unregister it. ``last_event`` and
    ``lineage``: resuming across a failover, as the synchronous ``follow()`` (StoreLineageError);
    ``reconnect_deadline``: how long it waits through a lost waiting connection, as the synchronous ``follow()``
    (then StoreUnavailableError).

    :param engine: the store's AsyncEngine.
    :param room_id: the room to follow.
    :param since_seq: yield the events after this sequence number (0: from the start).
    :param limit: at most this many events per page read (1 to MAX_LOG_LIMIT).
    :param poll_interval: SQLite: seconds between checks of ``PRAGMA data_version`` (None: the waiter's default).
    :param fallback_interval: PostgreSQL: seconds after which the log is read again even with no notification.
    :param limits: the limits in force (default: :mod:`hostedrooms.limits`).
    :param reconnect_deadline: seconds a lost waiting connection may stay lost before the wait fails.
    :param last_event: the event at ``since_seq`` this reader handled before, when it resumes.
    :param lineage: the store lineage ``last_event`` was read under, if known.
    :returns: an async generator of the room's events in seq order; close it to stop.
    :raises InvalidInputError: an argument is invalid (when called), or ``since_seq`` is ahead of the log (when
        iterated).
    :raises MisuseError: ``engine`` is not an AsyncEngine.
    :raises StoreConfigurationError: the engine goes through a transaction pooler with no ``listen_url``.
    :raises RoomNotFoundError: the room does not exist (when iterated).
    :raises RoomHistoryExpiredError: the room was pruned (when iterated).
    :raises StoreLineageError: ``last_event`` is gone or different (when iterated).
    :raises StoreUnavailableError: no waiting connection served for ``reconnect_deadline`` seconds.
    """
    check_intervals(poll_interval, fallback_interval)
    cursor = FollowCursor.start(room_id, since_seq, limit, limits, last_event=last_event, lineage=lineage)
    checked = require_async_engine(engine)
    check_waitable(checked.sync_engine)  # behind a transaction pooler without listen_url: refused now
    return _follow(checked, cursor, (poll_interval, fallback_interval, reconnect_deadline), limits)


async def open_follow(
    engine: AsyncEngine, room_id: str, since_seq: int = 0, *, limit: int = 100, poll_interval: float | None = None,
    fallback_interval: float = FALLBACK_INTERVAL, limits: Limits | None = None,
    reconnect_deadline: float = RECONNECT_DEADLINE,
    last_event: Mapping[str, Any] | None = None, lineage: str | None = None,
) -> AsyncGenerator[EventRecord, None]:
    """``follow(...)``'s iterator, returned once the room was checked (one read): an unknown room raises
    RoomNotFoundError here, a purged one RoomHistoryExpiredError, a ``since_seq`` ahead of the log
    InvalidInputError, as the synchronous ``follow()`` does when called. ``events = await open_follow(engine,
    room_id, since)``, then answer and ``async for event in events``; nothing is held until it is iterated.

    :param engine: the store's AsyncEngine.
    :param room_id: the room to follow.
    :param since_seq: yield the events after this sequence number (0: from the start).
    :param limit: at most this many events per page read (1 to MAX_LOG_LIMIT).
    :param poll_interval: SQLite: seconds between checks of ``PRAGMA data_version`` (None: the waiter's default).
    :param fallback_interval: PostgreSQL: seconds after which the log is read again even with no notification.
    :param limits: the limits in force (default: :mod:`hostedrooms.limits`).
    :param reconnect_deadline: seconds a lost waiting connection may stay lost before the wait fails.
    :param last_event: the event at ``since_seq`` this reader handled before, when it resumes.
    :param lineage: the store lineage ``last_event`` was read under, if known.
    :returns: an async generator of the room's events in seq order; close it to stop.
    :raises InvalidInputError: an argument is invalid, or ``since_seq`` is ahead of the log.
    :raises RoomNotFoundError: the room does not exist.
    :raises RoomHistoryExpiredError: the room was pruned.
    :raises MisuseError: ``engine`` is not an AsyncEngine.
    :raises StoreConfigurationError: the engine goes through a transaction pooler with no ``listen_url``.
    """
    with traced_block("follow", getattr(engine, "sync_engine", None), {"room_id": room_id, "since_seq": since_seq}):
        check_intervals(poll_interval, fallback_interval)
        cursor = FollowCursor.start(room_id, since_seq, limit, limits, last_event=last_event, lineage=lineage)
        checked = require_async_engine(engine)
        check_waitable(checked.sync_engine)
        cursor.check_room(await _room_state(checked, room_id=cursor.room_id, include_disbanded=True, limits=limits))
    return _follow(checked, cursor, (poll_interval, fallback_interval, reconnect_deadline), limits, traced=True)


async def _follow(
    engine: AsyncEngine, cursor: FollowCursor, waiting: tuple[float | None, float, float], limits: Limits | None,
    *, traced: bool = False,
) -> AsyncGenerator[EventRecord, None]:
    """The follower's loop; ``traced``: the call that returned it was a span already (``open_follow``), else the
    opening (up to the first page read) is the ``follow`` span."""
    poll_interval, fallback_interval, reconnect_deadline = waiting
    async with room_wakeup(engine, cursor.room_id, poll_interval=poll_interval,
                           reconnect_deadline=reconnect_deadline) as wakeup:
        arguments = {"room_id": cursor.room_id, "since_seq": cursor.since}
        with contextlib.nullcontext() if traced else traced_block("follow", engine.sync_engine, arguments):
            if cursor.since and cursor.ended_before(
                    await _room_state(engine, room_id=cursor.room_id, include_disbanded=True, limits=limits)):
                return
            page: EventPage | None = await _next_page(engine, cursor, limits)
        woke = False
        while not cursor.done:
            if page is None:
                page = await _next_page(engine, cursor, limits)
            if woke:
                follow_woke(page)
            for event in cursor.deliver(page):
                yield event
            page, woke = None, cursor.waiting
            if woke:
                await wakeup.wait(fallback_interval)


async def _next_page(engine: AsyncEngine, cursor: FollowCursor, limits: Limits | None) -> EventPage:
    """The next page from the cursor; after a lineage change, once its last event was found unchanged (as the
    synchronous ``follow()``)."""
    try:
        page = await _read_events(engine, **cursor.read_arguments(limits))
    except InvalidInputError as exc:
        raise cursor.lost(exc) from None
    if cursor.lineage_changed(page):
        cursor.confirm(page, await _read_events(engine, **cursor.check_arguments(limits)))
    return page

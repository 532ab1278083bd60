"""``follow()`` for asyncio: :func:`hostedrooms.rooms.follow`'s loop, awaited (the same cursor, checks and
guarantees; see :mod:`hostedrooms.rooms.follow`)."""

from __future__ import annotations

from collections.abc import AsyncGenerator

from sqlalchemy.ext.asyncio import AsyncEngine

from .. import rooms as _rooms
from ..limits import Limits
from ..records import EventRecord
from ..rooms.follow import FollowCursor
from ..wakeup import FALLBACK_INTERVAL
from .derive import service
from .engines import require_async_engine
from .wakeup import room_wakeup

__all__ = ["follow"]

_read_events = service(_rooms.read_events)
_room_state = service(_rooms.room_state)


def follow(
    engine: AsyncEngine, room_id: str, since_seq: int = 0, *, limit: int = 100, poll_interval: float | None = None,
    fallback_interval: float = FALLBACK_INTERVAL, limits: Limits | None = None,
) -> AsyncGenerator[EventRecord, None]:
    """``async for event in follow(engine, room_id, since_seq)``: each event after ``since_seq``, in seq order,
    as it commits; ends after ``room.disbanded``. Arguments are checked here, before anything is opened. While it
    waits it holds no connection (the engine's one shared waiter wakes it); close the iterator
    (``contextlib.aclosing``), cancel its task or its anyio cancel scope to unregister it."""
    cursor = FollowCursor.start(room_id, since_seq, limit, limits)
    return _follow(require_async_engine(engine), cursor, poll_interval, fallback_interval, limits)


async def _follow(
    engine: AsyncEngine, cursor: FollowCursor, poll_interval: float | None, fallback_interval: float,
    limits: Limits | None,
) -> AsyncGenerator[EventRecord, None]:
    async with room_wakeup(engine, cursor.room_id, poll_interval=poll_interval) as wakeup:
        if cursor.since and cursor.ended_before(
                await _room_state(engine, room_id=cursor.room_id, include_disbanded=True, limits=limits)):
            return
        while not cursor.done:
            for event in cursor.deliver(await _read_events(engine, **cursor.read_arguments(limits))):
                yield event
            if cursor.waiting:
                await wakeup.wait(fallback_interval)

""":class:`~hostedrooms.wakeup.Wakeup` for asyncio: the same channels, keys and polling, awaited.

An AsyncWakeup registers with the same kind of shared waiter as the synchronous one (:mod:`hostedrooms.wakeup`):
one thread and one connection per engine, whatever the number of waiters, here the waiter of the synchronous
Engine the AsyncEngine's services run on (its twin), or of a small connection-less engine of the same database
built for the purpose when the services are awaited on the AsyncEngine itself. Its signals reach the event loop
through ``call_soon_threadsafe``; awaiting one holds no connection and runs no driver call on the loop. Leaving
the ``async with`` block only unregisters, without awaiting anything, so a cancellation (a task's, or an anyio
cancel scope's, which cancels every await inside it) cannot leave a connection half given back.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from types import TracebackType
from typing import Self

from sqlalchemy import Engine
from sqlalchemy.ext.asyncio import AsyncEngine
from sqlalchemy.pool import NullPool

from ..backends import LEDGER_WORK_CHANNEL, ROOM_EVENTS_CHANNEL, backend_for, backend_for_url, pooler_of
from ..db import create_engine, engine_schema
from ..engine_profile import runtime_of
from ..validation import interval
from ..wakeup import DEFAULT_POLL_INTERVAL, SharedWaiter, Subscription, check_waitable, driver_error, join_waiter
from .engines import require_async_engine, runner_for

__all__ = ["AsyncWakeup", "ledger_wakeup"]

# Per AsyncEngine whose services are awaited: the synchronous engine its shared waiter connects through (None
# where no second connection sees the same database), kept in its sync_engine's EngineRuntime (``waiter_engine``).


async def waiter_engine(engine: AsyncEngine) -> Engine | None:
    """The synchronous Engine whose shared waiter serves ``engine``'s wake-ups (None: no waiter can see the same
    database; waits end at their timeout)."""
    runner = await runner_for(engine)
    if not runner.engine.dialect.is_async:
        return runner.engine  # the twin the services run on
    sync_engine = engine.sync_engine
    runtime = runtime_of(sync_engine)
    if not runtime.waiter_engine_known:
        target = backend_for_url(engine.url).twin_target(engine.url)
        pooler = pooler_of(sync_engine)
        # NullPool: the waiter takes its one connection from a private copy of this pool; nothing else idles.
        runtime.waiter_engine = None if target is None else create_engine(
            target, create=False, poolclass=NullPool, schema=engine_schema(sync_engine),  # its channels
            pooler=None if pooler is None else pooler.mode, listen_url=None if pooler is None else pooler.listen_url)
        runtime.waiter_engine_known = True
    return runtime.waiter_engine


class _LoopSubscription(Subscription):
    """A subscription whose waiter is a task: the shared waiter's thread reaches it through its event loop."""

    def __init__(
        self, loop: asyncio.AbstractEventLoop, channel: str, key: str | None, poll_interval: float | None,
        reconnect_deadline: float | None = None,
    ) -> None:
        super().__init__(channel, key, poll_interval, reconnect_deadline)
        self._loop = loop
        self._event, self._ready = asyncio.Event(), asyncio.Event()
        self._woken = False  # read and written on the loop only
        self._pending = False  # a signal is on its way to the loop (one call per signal burst, not one each)

    def _call_soon(self, callback: Callable[[], object]) -> None:
        with contextlib.suppress(RuntimeError):  # a closed loop: nobody waits any more
            self._loop.call_soon_threadsafe(callback)

    def signal(self) -> None:
        if not self._pending:
            self._pending = True
            self._call_soon(self._signalled)

    def _signalled(self) -> None:
        self._pending = False
        self._woken = True
        self._event.set()

    def mark_ready(self) -> None:
        self._call_soon(self._ready.set)

    async def until_ready(self) -> None:
        await self._ready.wait()

    async def wait(self, timeout: float) -> bool:
        if not self._woken:
            timer = self._loop.call_later(max(0.0, timeout), self._event.set)
            try:
                await self._event.wait()
            finally:
                timer.cancel()
        # Cleared before the caller re-reads: a later commit is seen by that read or signals again.
        woken, self._woken = self._woken, False
        self._event.clear()
        return woken


class AsyncWakeup:
    """``async with AsyncWakeup(engine, channel, key=...) as wakeup: ... await wakeup.wait(timeout)`` (the
    arguments are :class:`~hostedrooms.wakeup.Wakeup`'s).

    :param engine: the AsyncEngine whose commits are waited for.
    :param channel: one of hostedrooms' wake-up channels.
    :param key: wake only for notifications with this payload (a room id, say), or None for any.
    :param poll_interval: SQLite: how often to look for a commit, in seconds (default: the waiter's).
    :param reconnect_deadline: how long ``wait`` may go without a waiting connection, in seconds.
    :raises MisuseError: ``engine`` is not an AsyncEngine.
    :raises StoreConfigurationError: the engine goes through a transaction pooler with no ``listen_url``.
    """

    def __init__(
        self, engine: AsyncEngine, channel: str, *, key: str | None = None, poll_interval: float | None = None,
        reconnect_deadline: float | None = None,
    ) -> None:
        self.engine = require_async_engine(engine)
        backend = backend_for(self.engine.sync_engine)
        if backend.notifies:
            backend.listen_statement(channel)  # one of hostedrooms' channels (a programming error otherwise)
        check_waitable(self.engine.sync_engine)  # a transaction pooler without listen_url: refused at once
        self.channel, self.key = channel, key
        if poll_interval is not None:
            interval(poll_interval, "poll_interval")
        self.poll_interval = DEFAULT_POLL_INTERVAL if poll_interval is None else poll_interval
        self.reconnect_deadline = reconnect_deadline
        self._subscription: _LoopSubscription | None = None
        self._waiter: SharedWaiter | None = None
        self._waiter_engine: Engine | None = None

    async def __aenter__(self) -> Self:
        self._waiter_engine = await waiter_engine(self.engine)
        subscription = self._subscription = _LoopSubscription(
            asyncio.get_running_loop(), self.channel, self.key, self.poll_interval, self.reconnect_deadline)
        try:
            self._waiter = join_waiter(self._waiter_engine, subscription)
            await subscription.until_ready()
        except BaseException:
            self._leave()
            raise
        self._raise_failure()
        return self

    def _raise_failure(self) -> None:
        subscription = self._subscription
        if subscription is not None and subscription.error is not None:
            self._leave()
            engine = self._waiter_engine or self.engine.sync_engine
            raise driver_error(engine, subscription.error) from subscription.error

    async def wait(self, timeout: float) -> bool:
        """Until a commit may have changed what is waited for (True) or ``timeout`` seconds passed (False).

        :param timeout: the longest wait, in seconds.
        :returns: True when woken by a commit, False when ``timeout`` passed.
        :raises StorageError: the waiting connection failed for good (:class:`~hostedrooms.errors.StoreUnavailableError`
            once no new one served for ``reconnect_deadline`` seconds).
        """
        assert self._subscription is not None, "wake-up not entered"
        woken = await self._subscription.wait(timeout)
        self._raise_failure()
        return woken

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self._leave()

    def _leave(self) -> None:
        waiter, self._waiter = self._waiter, None
        if waiter is not None and self._subscription is not None:
            waiter.remove(self._subscription)


def ledger_wakeup(engine: AsyncEngine, *, poll_interval: float | None = None,
                  reconnect_deadline: float | None = None) -> AsyncWakeup:
    """A wake-up on ledger work becoming due (any kind)."""
    return AsyncWakeup(engine, LEDGER_WORK_CHANNEL, poll_interval=poll_interval, reconnect_deadline=reconnect_deadline)


def room_wakeup(engine: AsyncEngine, room_id: str, *, poll_interval: float | None = None,
                reconnect_deadline: float | None = None) -> AsyncWakeup:
    """A wake-up on ``room_id``'s log growing."""
    return AsyncWakeup(engine, ROOM_EVENTS_CHANNEL, key=room_id, poll_interval=poll_interval,
                       reconnect_deadline=reconnect_deadline)

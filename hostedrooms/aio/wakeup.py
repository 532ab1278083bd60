""":class:`~hostedrooms.wakeup.Wakeup` for asyncio: the same channels, keys and polling, awaited.

PostgreSQL: a connection of the AsyncEngine's pool ``LISTEN``\\ s in autocommit and awaits psycopg's
notifications. SQLite: ``PRAGMA data_version`` is read every ``poll_interval`` seconds on a connection of the
engine's runner (the twin's worker thread; an ``asyncio.sleep`` in between). Leaving the ``async with`` block
gives the connection back, or discards it when it cannot be reset, whether the block ended, raised or was
cancelled.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from types import TracebackType
from typing import Any, Self

from sqlalchemy.ext.asyncio import AsyncEngine
from sqlalchemy.pool import PoolProxiedConnection
from sqlalchemy.util import greenlet_spawn

from ..dialect import LEDGER_WORK_CHANNEL, ROOM_EVENTS_CHANNEL, StoreDialect, dialect_for
from ..wakeup import DEFAULT_POLL_INTERVAL, Waiting, driver_error, time_left
from .engines import Runner, require_async_engine, runner_for

__all__ = ["AsyncWakeup", "ledger_wakeup"]


class AsyncWakeup(Waiting):
    """``async with AsyncWakeup(engine, channel, key=...) as wakeup: ... await wakeup.wait(timeout)``."""

    def __init__(
        self, engine: AsyncEngine, channel: str, *, key: str | None = None, poll_interval: float | None = None
    ) -> None:
        self.engine = require_async_engine(engine)
        self.channel, self.key = channel, key
        self.poll_interval = DEFAULT_POLL_INTERVAL if poll_interval is None else poll_interval
        self._raw: PoolProxiedConnection | None = None
        self._runner: Runner | None = None
        self._dialect: StoreDialect = dialect_for(self.engine.sync_engine)
        self._version = 0

    async def __aenter__(self) -> Self:
        runner = self._runner = await runner_for(self.engine)
        try:
            if self._dialect.notifies:
                raw = self._raw = await self.engine.raw_connection()
                driver: Any = raw.driver_connection
                await driver.set_autocommit(True)
                await driver.execute(self._dialect.listen_statement(self.channel))
            else:
                raw = self._raw = await runner.run(runner.engine.raw_connection)
                self._version = await runner.run(self._dialect.change_counter, raw.dbapi_connection)
        except BaseException as exc:
            await self._release(discard=True)
            raise driver_error(runner.engine, exc) from exc
        return self

    async def wait(self, timeout: float) -> bool:
        """Until a commit may have changed what is waited for (True) or ``timeout`` seconds passed (False)."""
        assert self._raw is not None and self._runner is not None, "wake-up not entered"
        deadline = time.monotonic() + max(0.0, timeout)
        try:
            if self._dialect.notifies:
                return await self._wait_notified(deadline)
            return await self._wait_polled(deadline)
        except (asyncio.CancelledError, Exception) as exc:
            if isinstance(exc, asyncio.CancelledError):
                raise
            raise driver_error(self._runner.engine, exc) from exc

    async def _wait_notified(self, deadline: float) -> bool:
        assert self._raw is not None
        driver: Any = self._raw.driver_connection
        while (remaining := time_left(deadline)) > 0:
            async with contextlib.aclosing(driver.notifies(timeout=remaining, stop_after=1)) as notifications:
                async for notification in notifications:
                    if self.wanted(notification):
                        return True
        return False

    async def _wait_polled(self, deadline: float) -> bool:
        assert self._raw is not None and self._runner is not None
        while not self.changed(await self._runner.run(self._dialect.change_counter, self._raw.dbapi_connection)):
            pause = self.pause(deadline)
            if pause is None:
                return False
            await asyncio.sleep(pause)
        return True

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self._release(discard=False)

    async def _release(self, *, discard: bool) -> None:
        raw, self._raw = self._raw, None
        if raw is None or self._runner is None:
            return
        if not self._dialect.notifies:
            await self._runner.run(raw.invalidate if discard else raw.close)
            return
        driver: Any = raw.driver_connection
        try:
            if not discard:
                await driver.execute("UNLISTEN *")
                await driver.set_autocommit(False)
        except Exception:  # the connection cannot be reset: discard it rather than pool it
            discard = True
        if discard:
            await greenlet_spawn(raw.invalidate)
        await greenlet_spawn(raw.close)


def ledger_wakeup(engine: AsyncEngine, *, poll_interval: float | None = None) -> AsyncWakeup:
    """A wake-up on ledger work becoming due (any kind)."""
    return AsyncWakeup(engine, LEDGER_WORK_CHANNEL, poll_interval=poll_interval)


def room_wakeup(engine: AsyncEngine, room_id: str, *, poll_interval: float | None = None) -> AsyncWakeup:
    """A wake-up on ``room_id``'s log growing."""
    return AsyncWakeup(engine, ROOM_EVENTS_CHANNEL, key=room_id, poll_interval=poll_interval)

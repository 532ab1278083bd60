"""Waiting for committed writes without busy polling: a room's log growing (:func:`hostedrooms.follow.follow`),
ledger work becoming due (:meth:`hostedrooms.ledger.DeliveryLedger.work_wakeup`).

PostgreSQL: every writing transaction that adds room events, or makes ledger work due, sends a ``NOTIFY`` on a
fixed channel (inside the transaction, so it is delivered when, and only if, the transaction commits). A waiter
``LISTEN``\\ s on a pooled connection of its own, in autocommit, until a notification for its key arrives or its
timeout passes. SQLite has no notifications: a waiter reads ``PRAGMA data_version`` on a pooled connection of
its own every ``poll_interval`` seconds (no transaction, no I/O beyond the shared-memory index); it changes
whenever another connection commits to the file.

A wake-up says only "look again": a waiter re-reads what it waits for, and a timeout (the polling fallback on
PostgreSQL) re-reads too. Enter the wake-up *before* reading, so a commit between the read and the wait still
wakes it. Leaving the ``with`` block gives the connection back (``UNLISTEN``, autocommit off), or discards it
when that fails; nothing is left open.
"""

from __future__ import annotations

import time
from types import TracebackType
from typing import Any, Self

from sqlalchemy import Engine
from sqlalchemy import exc as sa_exc
from sqlalchemy.engine.interfaces import DBAPIConnection
from sqlalchemy.pool import PoolProxiedConnection

from .dialect import LEDGER_WORK_CHANNEL, ROOM_EVENTS_CHANNEL, StoreDialect, dialect_for
from .errors import translate

__all__ = ["DEFAULT_POLL_INTERVAL", "LEDGER_WORK_CHANNEL", "ROOM_EVENTS_CHANNEL", "Wakeup", "driver_error"]

#: How often a SQLite waiter looks for a commit (seconds); PostgreSQL waiters re-read this often without a
#: notification only as a fallback, at :data:`FALLBACK_INTERVAL`.
DEFAULT_POLL_INTERVAL = 0.05
FALLBACK_INTERVAL = 5.0


def driver_error(engine: Engine, exc: BaseException) -> BaseException:
    """A raw driver error of ``engine`` (outside SQLAlchemy's execution layer) as hostedrooms' error."""
    dbapi = engine.dialect.loaded_dbapi
    if isinstance(exc, dbapi.Error):
        wrapped = sa_exc.DBAPIError.instance(None, None, exc, dbapi.Error, dialect=engine.dialect)
        return translate(wrapped, engine.url)
    return translate(exc, engine.url)


def time_left(deadline: float) -> float:
    """Seconds until ``deadline`` (a ``time.monotonic()`` reading); zero or less once it has passed."""
    return deadline - time.monotonic()


class Waiting:
    """What a waiter decides, the same for :class:`Wakeup` and its asyncio twin: which notification wakes it,
    whether the data version moved, how long to sleep before the next poll."""

    key: str | None
    poll_interval: float
    _version: int

    def wanted(self, notification: Any) -> bool:
        """Whether ``notification`` is for what is waited for (any on the channel when ``key`` is None)."""
        return self.key is None or notification.payload == self.key

    def changed(self, version: int) -> bool:
        """Whether ``version`` differs from the one seen last (it becomes the one seen last)."""
        changed, self._version = version != self._version, version
        return changed

    def pause(self, deadline: float) -> float | None:
        """How long to sleep before the next poll, or None once ``deadline`` has passed."""
        remaining = time_left(deadline)
        return min(self.poll_interval, remaining) if remaining > 0 else None


class Wakeup(Waiting):
    """``with Wakeup(engine, channel, key=...) as wakeup: ... wakeup.wait(timeout)``: see the module docstring.

    ``key``: only notifications with this payload wake the waiter (a room id); None: any on ``channel``.
    ``poll_interval``: SQLite's polling period (default :data:`DEFAULT_POLL_INTERVAL`).
    """

    def __init__(
        self, engine: Engine, channel: str, *, key: str | None = None, poll_interval: float | None = None
    ) -> None:
        self.engine = engine
        self.dialect: StoreDialect = dialect_for(engine)
        self.channel, self.key = channel, key
        self.poll_interval = DEFAULT_POLL_INTERVAL if poll_interval is None else poll_interval
        self._raw: PoolProxiedConnection | None = None
        self._version = 0

    def __enter__(self) -> Self:
        try:
            raw = self._raw = self.engine.raw_connection()
            if self.dialect.notifies:
                driver = raw.driver_connection
                driver.autocommit = True  # type: ignore[union-attr]
                driver.execute(self.dialect.listen_statement(self.channel))  # type: ignore[union-attr]
            else:
                self._version = self.dialect.change_counter(self._dbapi())
        except BaseException as exc:
            self._discard()
            raise driver_error(self.engine, exc) from exc
        return self

    def _dbapi(self) -> DBAPIConnection:
        assert self._raw is not None and self._raw.dbapi_connection is not None, "wake-up not entered"
        return self._raw.dbapi_connection

    def wait(self, timeout: float) -> bool:
        """Block until a commit may have changed what is waited for (True) or ``timeout`` seconds passed (False)."""
        deadline = time.monotonic() + max(0.0, timeout)
        try:
            if self.dialect.notifies:
                return self._wait_notified(deadline)
            return self._wait_polled(deadline)
        except BaseException as exc:
            raise driver_error(self.engine, exc) from exc

    def _wait_notified(self, deadline: float) -> bool:
        assert self._raw is not None
        driver: Any = self._raw.driver_connection
        while (remaining := time_left(deadline)) > 0:
            for notification in driver.notifies(timeout=remaining, stop_after=1):
                if self.wanted(notification):
                    return True
        return False

    def _wait_polled(self, deadline: float) -> bool:
        while not self.changed(self.dialect.change_counter(self._dbapi())):
            pause = self.pause(deadline)
            if pause is None:
                return False
            time.sleep(pause)
        return True

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        raw, self._raw = self._raw, None
        if raw is None:
            return
        try:
            if self.dialect.notifies:
                driver: Any = raw.driver_connection
                driver.execute("UNLISTEN *")
                driver.autocommit = False
        except Exception:  # the connection cannot be reset: discard it rather than pool it
            raw.invalidate()
        finally:
            raw.close()

    def _discard(self) -> None:
        raw, self._raw = self._raw, None
        if raw is not None:
            raw.invalidate()
            raw.close()

"""hostedrooms for asyncio: the whole API as coroutines on a SQLAlchemy AsyncEngine, from one implementation.

Every coroutine is derived from the synchronous function of the same name (:mod:`.derive`): same arguments,
results, errors and messages, checked by mypy against the synchronous signature. The synchronous code runs without
blocking the event loop on the engine's :class:`~hostedrooms.aio.engines.Runner`: by default in a worker thread on
a synchronous twin engine of the same database, or (``services="awaited"``) inside SQLAlchemy's greenlet bridge on
the AsyncEngine's own connections, every driver call awaited.

- :func:`create_async_engine` (a path: SQLite through aiosqlite, WAL, ``synchronous=FULL``, ``BEGIN IMMEDIATE``;
  a ``postgresql://`` URL: psycopg 3 async) and :class:`AsyncUnitOfWork` with ``fenced()``, for host code;
- :mod:`.rooms` (with ``follow()``, an async iterator over a room's log as it commits), :mod:`.peers`,
  :mod:`.replicas`, :mod:`.migrate`, :func:`verify`;
- :mod:`.ledger`: ``await open_ledger(engine, ...)`` gives an :class:`AsyncDeliveryLedger`.

Cancelling any of these calls leaves its transaction committed or rolled back, never half-written, and its
connection back in the pool.
"""

from __future__ import annotations

from .. import integrity as _integrity
from . import ledger, migrate, peers, replicas, rooms
from .derive import service
from .engines import create_async_engine
from .follow import follow, open_follow
from .ledger import AsyncDeliveryLedger, open_ledger
from .uow import AsyncUnitOfWork
from .wakeup import AsyncWakeup

__all__ = [
    "AsyncDeliveryLedger",
    "AsyncUnitOfWork",
    "AsyncWakeup",
    "create_async_engine",
    "follow",
    "ledger",
    "migrate",
    "open_follow",
    "open_ledger",
    "peers",
    "replicas",
    "rooms",
    "verify",
]

verify = service(_integrity.verify)
"""``await verify(engine, progress=..., expect_heads=...)``: :func:`hostedrooms.verify` for asyncio (same arguments,
result and errors)."""

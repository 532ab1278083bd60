"""AsyncEngines for hostedrooms, and how the synchronous services run for one (its :class:`Runner`).

There is one implementation of every service: the synchronous one. An AsyncEngine gets a :class:`Runner` that
runs it without blocking the event loop, in one of two ways, chosen by the backend (``StoreDialect
.services_in_thread``):

* **awaited driver calls** (PostgreSQL, psycopg 3's async mode): the synchronous service runs inside
  SQLAlchemy's greenlet bridge (``greenlet_spawn``, what ``AsyncConnection.run_sync`` and ``AsyncSession`` use)
  on the AsyncEngine's own ``sync_engine``: every driver call inside it is awaited on the loop, so thousands of
  calls can be in flight on one thread;
* **one worker thread per call** (a SQLite file): SQLite's asyncio driver (aiosqlite) hands every driver call to
  its own thread and back, about ten round trips per append; running the whole synchronous call in one worker
  thread instead, on a synchronous *twin* Engine of the same file built by :func:`hostedrooms.create_engine`
  with the same options, costs one. The twin is disposed with the AsyncEngine (``await engine.dispose()``).

Either way a call is cancellation-safe: a cancelled call leaves its transaction committed or rolled back,
never half-written, and its connection back in the pool (see :meth:`Runner.run`).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import functools
import os
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ParamSpec, TypeVar

from sqlalchemy import URL, Engine, event
from sqlalchemy.ext.asyncio import AsyncEngine
from sqlalchemy.ext.asyncio import create_async_engine as _sa_create_async_engine
from sqlalchemy.util import greenlet_spawn

from ..db import (
    DEFAULT_BUSY_TIMEOUT,
    build_configured,
    check_synchronous,
    configure_adopted,
    create_engine,
    resolve_url,
)
from ..dialect import dialect_for, dialect_for_url
from ..errors import HostedRoomError

__all__ = ["AsyncTarget", "Runner", "create_async_engine", "require_async_engine", "runner_for", "sync_url"]

P = ParamSpec("P")
R = TypeVar("R")

AsyncTarget = str | os.PathLike[str] | URL | AsyncEngine

#: Worker threads per SQLite twin: readers run concurrently (WAL); writers queue on SQLite's own write lock.
THREAD_WORKERS = 8


@dataclass(frozen=True, slots=True)
class _Options:
    synchronous: str = "FULL"
    busy_timeout: float = DEFAULT_BUSY_TIMEOUT
    create: bool = True


#: What create_async_engine was told, per engine (adopted engines get the defaults).
_options: weakref.WeakKeyDictionary[Engine, _Options] = weakref.WeakKeyDictionary()
_runners: weakref.WeakKeyDictionary[Engine, Runner] = weakref.WeakKeyDictionary()


def create_async_engine(
    target: AsyncTarget,
    *,
    synchronous: str = "FULL",
    busy_timeout: float = DEFAULT_BUSY_TIMEOUT,
    create: bool = True,
    **engine_kwargs: Any,
) -> AsyncEngine:
    """:func:`hostedrooms.create_engine` for asyncio: an AsyncEngine configured for hostedrooms.

    A path means a SQLite file through ``aiosqlite``, with the same WAL, ``synchronous`` (``FULL`` unless told),
    ``BEGIN IMMEDIATE`` and busy-timeout behaviour as the synchronous engine; a ``postgresql://`` URL uses psycopg
    3's async mode. An AsyncEngine is used as given (its synchronous side gets hostedrooms' connection hooks).
    Bad targets raise :class:`~hostedrooms.errors.HostedRoomError` as ``create_engine`` does.
    """
    check_synchronous(synchronous)
    if isinstance(target, AsyncEngine):
        configure_adopted(target.sync_engine, synchronous=synchronous, busy_timeout=busy_timeout)
        return target
    if isinstance(target, Engine):
        raise HostedRoomError(
            "hostedrooms.aio needs an asyncio target (a path, a URL or an AsyncEngine), not a synchronous "
            "Engine; give its URL instead")
    url = resolve_url(target)
    built = build_configured(dialect_for_url(url).async_url(url), _sa_create_async_engine, synchronous=synchronous,
                             busy_timeout=busy_timeout, create=create, **engine_kwargs)
    _options[built.sync_engine] = _Options(synchronous, busy_timeout, create)
    return built


def require_async_engine(engine: object) -> AsyncEngine:
    """``engine`` if it is an AsyncEngine; a HostedRoomError saying what to pass otherwise."""
    if isinstance(engine, AsyncEngine):
        return engine
    raise HostedRoomError(
        f"hostedrooms.aio needs a SQLAlchemy AsyncEngine, not {type(engine).__name__}; build one with "
        "hostedrooms.aio.create_async_engine(target), or call the synchronous API with an Engine")


def sync_url(engine: AsyncEngine) -> URL:
    """The URL of ``engine``'s database with hostedrooms' synchronous driver."""
    url = engine.url
    return dialect_for_url(url).normalise_url(url.set(drivername=url.get_backend_name()))


class Runner:
    """How hostedrooms' synchronous code runs for one AsyncEngine: :meth:`run` it, given :attr:`engine`."""

    #: The synchronous Engine the services are given (the AsyncEngine's ``sync_engine``, or a SQLite twin).
    engine: Engine

    async def run(self, fn: Callable[P, R], /, *args: P.args, **kwargs: P.kwargs) -> R:
        """``fn(*args, **kwargs)`` without blocking the loop. When the awaiting task is cancelled, the call
        finishes what it started first (its unit of work commits or rolls back and checks its connection in), then
        the cancellation propagates."""
        raise NotImplementedError

    def dispose(self) -> None:
        """Release what the runner holds besides the AsyncEngine itself."""


class _Awaited(Runner):
    """The synchronous code on the AsyncEngine's own ``sync_engine``; each driver call awaited on the loop.

    A cancellation arrives inside the call at the driver call it was waiting for (as a CancelledError raised
    there): the unit of work rolls back and closes its connection, each an awaited driver call too, then the
    CancelledError leaves the call."""

    def __init__(self, engine: AsyncEngine) -> None:
        self.engine = engine.sync_engine

    async def run(self, fn: Callable[P, R], /, *args: P.args, **kwargs: P.kwargs) -> R:
        result: R = await greenlet_spawn(functools.partial(fn, *args, **kwargs))
        return result


class _Threaded(Runner):
    """The synchronous code in a worker thread, on a synchronous twin Engine of the same SQLite file."""

    def __init__(self, twin: Engine) -> None:
        self.engine = twin
        self._executor: concurrent.futures.ThreadPoolExecutor | None = None

    def _pool(self) -> concurrent.futures.ThreadPoolExecutor:
        executor = self._executor
        if executor is None:
            executor = self._executor = concurrent.futures.ThreadPoolExecutor(
                THREAD_WORKERS, thread_name_prefix="hostedrooms-aio")
        return executor

    async def run(self, fn: Callable[P, R], /, *args: P.args, **kwargs: P.kwargs) -> R:
        started = self._pool().submit(functools.partial(fn, *args, **kwargs))
        waiting = asyncio.wrap_future(started)
        try:
            return await asyncio.shield(waiting)
        except asyncio.CancelledError:
            if not started.cancel():  # already running: let it end (commit or roll back) before giving up
                await _settle(waiting)
            raise

    def dispose(self) -> None:
        executor, self._executor = self._executor, None
        if executor is not None:
            executor.shutdown(wait=False)
        self.engine.dispose()


async def _settle(future: asyncio.Future[Any]) -> None:
    """Wait until ``future`` is done, whatever further cancellations arrive (the caller re-raises its own)."""
    while not future.done():
        try:
            await asyncio.shield(future)
        except asyncio.CancelledError:
            continue
        except BaseException:
            break
    if not future.cancelled():
        future.exception()  # retrieved: the cancelled call does not report it


async def runner_for(engine: object) -> Runner:
    """The :class:`Runner` of an AsyncEngine (built on first use; an adopted engine gets hostedrooms' hooks)."""
    async_engine = require_async_engine(engine)
    sync_engine = async_engine.sync_engine
    runner = _runners.get(sync_engine)
    if runner is not None:
        return runner
    options = _options.get(sync_engine, _Options())
    if configure_adopted(sync_engine, synchronous=options.synchronous, busy_timeout=options.busy_timeout):
        await async_engine.dispose()  # pooled connections predate the hooks
    dialect = dialect_for(sync_engine)
    path = dialect.file_path(async_engine.url)
    if not dialect.services_in_thread or path is None or str(path).startswith("file:"):  # a URI: used as given
        return _runners.setdefault(sync_engine, _Awaited(async_engine))
    threaded = _Threaded(create_engine(path, synchronous=options.synchronous, busy_timeout=options.busy_timeout,
                                       create=options.create))
    runner = _runners.setdefault(sync_engine, threaded)
    if runner is threaded:
        event.listen(sync_engine, "engine_disposed", lambda _engine: threaded.dispose())
    else:  # another task built one first, while this one awaited the dispose above
        threaded.dispose()
    return runner

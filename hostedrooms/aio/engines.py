"""AsyncEngines for hostedrooms, and how the synchronous services run for one (its :class:`Runner`).

There is one implementation of every service: the synchronous one. An AsyncEngine gets a :class:`Runner` that
runs it without blocking the event loop, in one of two ways (``create_async_engine(..., services=...)``):

* ``"threads"`` (the default): each call runs whole in a worker thread, on a synchronous *twin* Engine of the
  same database built by :func:`hostedrooms.create_engine` with the same options (a SQLite file: pysqlite; a
  PostgreSQL URL: psycopg in its synchronous mode). One thread hop per call. The AsyncEngine itself (aiosqlite,
  psycopg's async mode) serves the host's own code (:class:`~hostedrooms.aio.AsyncUnitOfWork`); wake-ups wait on
  the twin's one shared waiter (:mod:`hostedrooms.wakeup`). The twin is disposed with the AsyncEngine
  (``await engine.dispose()``).
* ``"awaited"``: each call runs inside SQLAlchemy's greenlet bridge (``greenlet_spawn``, what
  ``AsyncConnection.run_sync`` and ``AsyncSession`` use) on the AsyncEngine's own ``sync_engine``, every driver
  call awaited on the loop: no thread, any number of calls in flight, but every driver call costs a trip through
  the loop (aiosqlite: a hop to its own thread and back for each; psycopg async: a loop iteration per round trip,
  about twice the client CPU of the synchronous driver). Used where no twin can open the same database (an
  in-memory SQLite database, a SQLite URI).

Why threads by default (docs/benchmarks.md, "asyncio", has the measurements): an awaited append costs the loop
every driver call, so with many tasks it gets less done and the loop answers other tasks late; in a thread the
loop only hands the call over and takes the outcome back (one hop, the least any design that keeps the blocking commit
off the loop can pay).

Either way a cancelled call runs to its end before the CancelledError reaches the caller (see :meth:`Runner.run`):
its transaction committed or rolled back, never half-written or left open, its connection back in the pool, and
on SQLite no lock held.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import functools
import os
import queue
import threading
import weakref
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from typing import Any, ParamSpec, TypeVar

import sqlalchemy.ext.asyncio as sa_asyncio
from sqlalchemy import URL, Engine, event
from sqlalchemy.ext.asyncio import AsyncEngine
from sqlalchemy.util import greenlet_spawn

from ..backends import backend_for_url
from ..db import (
    DEFAULT_BUSY_TIMEOUT,
    build_configured,
    check_held_connections,
    check_synchronous,
    configure_adopted,
    create_engine,
    resolve_url,
)
from ..engine_profile import EngineRuntime, known_runtime, runtime_of
from ..errors import MisuseError

__all__ = [
    "AsyncTarget", "Runner", "create_async_engine", "outlive", "require_async_engine", "run_awaited", "run_to_end",
    "runner_for", "sync_url",
]

P = ParamSpec("P")
R = TypeVar("R")

AsyncTarget = str | os.PathLike[str] | URL | AsyncEngine

#: Worker threads per twin at most (calls beyond wait for one); the twin's pool holds as many connections. Sized
#: as ``asyncio.to_thread``'s default executor is, for the same blocking calls: a fixed 8 on 2 cores lagged the
#: loop more than ``asyncio.to_thread`` did, for no more throughput (docs/benchmarks.md, "asyncio").
THREAD_WORKERS = min(32, (os.cpu_count() or 1) + 4)
SERVICES = ("threads", "awaited")


@dataclass(frozen=True, slots=True)
class _Options:
    synchronous: str = "FULL"
    busy_timeout: float = DEFAULT_BUSY_TIMEOUT
    create: bool = True
    services: str = "threads"
    schema: str | None = None
    pooler: str | None = None
    listen_url: str | URL | None = None
    held_connections: int | None = None


# What create_async_engine was told (adopted engines get the defaults) and the runner built from it are kept in
# the ``sync_engine``'s EngineRuntime (``async_options``, ``runner``).


def _sa_create_async_engine(*args: Any, **kwargs: Any) -> AsyncEngine:
    """SQLAlchemy's ``create_async_engine``, looked up at each call (an instrumentation may wrap it later)."""
    return sa_asyncio.create_async_engine(*args, **kwargs)


def create_async_engine(
    target: AsyncTarget,
    *,
    synchronous: str = "FULL",
    busy_timeout: float = DEFAULT_BUSY_TIMEOUT,
    create: bool = True,
    services: str = "threads",
    schema: str | None = None,
    pooler: str | None = None,
    listen_url: str | URL | None = None,
    held_connections: int | None = None,
    **engine_kwargs: Any,
) -> AsyncEngine:
    """:func:`hostedrooms.create_engine` for asyncio: an AsyncEngine configured for hostedrooms.

    A path means a SQLite file through ``aiosqlite``, with the same WAL, ``synchronous`` (``FULL`` unless told),
    ``BEGIN IMMEDIATE`` and busy-timeout behaviour as the synchronous engine; a ``postgresql://`` URL uses psycopg
    3's async mode. An AsyncEngine is used as given (its synchronous side gets hostedrooms' connection hooks).
    ``schema``, ``pooler`` and ``listen_url`` hold for the synchronous twin too: under ``pooler="transaction"``
    neither prepares statements on the server, and wake-ups ``LISTEN`` on ``listen_url``.

    :param target: a SQLite file path, a database URL, or an AsyncEngine to adopt (configured in place).
    :param synchronous: SQLite only: ``FULL`` (the default) or ``NORMAL``, as for :func:`hostedrooms.create_engine`.
    :param busy_timeout: seconds a statement waits for another writer's lock before it fails.
    :param create: SQLite: whether a missing file (and its folder) is created.
    :param services: ``"threads"`` or ``"awaited"``: how hostedrooms' calls run for this engine (see
        :mod:`hostedrooms.aio.engines`).
    :param schema: PostgreSQL: this gateway's schema, as for :func:`hostedrooms.create_engine`.
    :param pooler: PostgreSQL: None, ``"session"`` or ``"transaction"``, as for :func:`hostedrooms.create_engine`.
    :param listen_url: a direct connection for the waiting connection, bypassing the pooler.
    :param held_connections: PostgreSQL, ``services="threads"``: the autocommit connections the synchronous twin
        may hold for single appends, as for :func:`hostedrooms.create_engine` (None: one per worker thread; 0: none).
    :param engine_kwargs: passed to :func:`sqlalchemy.ext.asyncio.create_async_engine` (a path or URL only).
    :returns: the AsyncEngine every :mod:`hostedrooms.aio` call takes.
    :raises MisuseError: ``target`` is a synchronous Engine, or ``synchronous`` or ``services`` is not an option.
    :raises InvalidInputError: ``busy_timeout``, ``create`` or ``held_connections`` is invalid.
    :raises StoreConfigurationError: an invalid ``schema``, ``pooler`` or ``listen_url``, or a target that cannot be
        understood.
    :raises StoreMissingError: ``create=False`` and the SQLite file does not exist.
    """
    check_synchronous(synchronous)
    check_held_connections(held_connections)
    if isinstance(target, AsyncEngine):
        resolve_url(target.url)  # refuses a driver hostedrooms does not use (asyncpg), as for a URL
    if services not in SERVICES:
        raise MisuseError(f"services must be one of {', '.join(SERVICES)}")
    if isinstance(target, AsyncEngine):
        configure_adopted(target.sync_engine, synchronous=synchronous, busy_timeout=busy_timeout, schema=schema,
                          pooler=pooler, listen_url=listen_url)
        runtime_of(target.sync_engine).async_options = _Options(
            synchronous, busy_timeout, True, services, schema, pooler, listen_url, held_connections)
        return target
    if isinstance(target, Engine):
        raise MisuseError(
            "hostedrooms.aio needs an asyncio target (a path, a URL or an AsyncEngine), not a synchronous "
            "Engine; give its URL instead")
    url = resolve_url(target)
    built = build_configured(backend_for_url(url).async_url(url), _sa_create_async_engine, synchronous=synchronous,
                             busy_timeout=busy_timeout, create=create, schema=schema, pooler=pooler,
                             listen_url=listen_url, **engine_kwargs)
    runtime_of(built.sync_engine).async_options = _Options(
        synchronous, busy_timeout, create, services, schema, pooler, listen_url, held_connections)
    return built


def require_async_engine(engine: object) -> AsyncEngine:
    """``engine`` if it is an AsyncEngine; a :class:`~hostedrooms.errors.MisuseError` saying what to pass
    otherwise."""
    if isinstance(engine, AsyncEngine):
        return engine
    raise MisuseError(
        f"hostedrooms.aio needs a SQLAlchemy AsyncEngine, not {type(engine).__name__}; build one with "
        "hostedrooms.aio.create_async_engine(target), or call the synchronous API with an Engine")


def sync_url(engine: AsyncEngine) -> URL:
    """The URL of ``engine``'s database with hostedrooms' synchronous driver."""
    url = engine.url
    return backend_for_url(url).normalise_url(url.set(drivername=url.get_backend_name()))


class Runner:
    """How hostedrooms' synchronous code runs for one AsyncEngine: :meth:`run` it, given :attr:`engine`."""

    @property
    def engine(self) -> Engine:
        """The synchronous Engine the services are given (the AsyncEngine's ``sync_engine``, or its twin)."""
        raise NotImplementedError

    async def run(self, fn: Callable[P, R], /, *args: P.args, **kwargs: P.kwargs) -> R:
        """``fn(*args, **kwargs)`` without blocking the loop.

        When the awaiting task is cancelled (however often), a call not yet begun never runs (in threads: one
        still waiting for a worker), and a begun one runs to its end first: its unit of work commits or rolls
        back and checks its connection in, then the CancelledError is raised, whatever the call's outcome. So a
        cancelled write may have committed; the services' idempotency keys (an append's ``event_id``, a ledger's
        envelope and request ids) make the retry that finds out safe."""
        raise NotImplementedError

    def dispose(self) -> None:
        """Release what the runner holds besides the AsyncEngine itself."""


class _Awaited(Runner):
    """The synchronous code on the AsyncEngine's own ``sync_engine``; each driver call awaited on the loop.

    The call runs to its end even when the awaiting task is cancelled (:func:`run_awaited`), as it does in a
    worker thread."""

    def __init__(self, engine: AsyncEngine) -> None:
        # Weak: the runner is kept in this very engine's runtime.
        self._engine = weakref.ref(engine.sync_engine)

    @property
    def engine(self) -> Engine:
        engine = self._engine()
        if engine is None:  # pragma: no cover - a runner is looked up through its live engine
            raise RuntimeError("the AsyncEngine of this runner is gone")
        return engine

    async def run(self, fn: Callable[P, R], /, *args: P.args, **kwargs: P.kwargs) -> R:
        return await run_awaited(fn, *args, **kwargs)


async def run_awaited(fn: Callable[P, R], /, *args: P.args, **kwargs: P.kwargs) -> R:
    """``fn(*args, **kwargs)`` in SQLAlchemy's greenlet bridge (each driver call awaited on the loop), run to its
    end even when the awaiting task is cancelled, however often: then the CancelledError is raised once it has
    ended (its unit of work committed or rolled back, its connection checked in), whatever its outcome.

    Why not let the CancelledError into the call, at the driver call it waits for: SQLAlchemy then discards the
    connection at once, from inside that driver call. On aiosqlite the close comes while a statement of the
    transaction is still open, and SQLite keeps such a connection, its transaction and the file's write lock
    until the statement is collected (every writer of the file, in every process, gets "database is locked" until
    then); a cursor closed afterwards raises ``ValueError: Connection closed`` in place of the CancelledError; and
    a second cancellation (a timeout, anyio's cancel scopes) interrupts the rollback or close itself. Waiting
    costs the rest of the call: for the services' short transactions a few driver calls (aiosqlite does not stop
    one in flight anyway: it runs in its own thread); a long call (``verify`` of a large database) is not cut
    short, as in a worker thread.
    """
    return await run_to_end(greenlet_spawn(functools.partial(fn, *args, **kwargs)))


async def run_to_end(work: Coroutine[Any, Any, R]) -> R:
    """Await ``work`` (in a task of its own); when the awaiting task is cancelled (however often), ``work`` runs
    to its end, then the CancelledError is raised, whatever the outcome."""
    task = asyncio.ensure_future(work)
    try:
        return await asyncio.shield(task)
    except asyncio.CancelledError:
        await outlive(task)
        raise


async def outlive(task: asyncio.Future[Any]) -> None:
    """Wait until ``task`` has ended, whatever cancellations arrive meanwhile; its outcome is dropped (retrieved,
    so asyncio does not log it)."""
    while not task.done():
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.wait((task,))
    if not task.cancelled():
        task.exception()


class _Threaded(Runner):
    """The synchronous code in a worker thread, on a synchronous twin Engine of the same SQLite file.

    One hop per call, kept short: the call goes on a queue that worker threads (started on demand, at most
    :data:`THREAD_WORKERS`) take from, and its outcome comes back on a future of the loop
    (``call_soon_threadsafe``); ``run_in_executor`` with the ``shield`` a cancellation-safe wait needs costs
    about twice as much per call. Workers are daemon threads: a call still running when the interpreter exits is
    abandoned, and SQLite rolls its transaction back when the file is next opened.
    """

    def __init__(self, twin: Engine) -> None:
        self._twin = twin
        self._workers = _Workers()

    @property
    def engine(self) -> Engine:
        return self._twin

    async def run(self, fn: Callable[P, R], /, *args: P.args, **kwargs: P.kwargs) -> R:
        # In a copy of the caller's context variables, as asyncio.to_thread runs a call: the caller's current
        # OpenTelemetry span (an application's request, the asyncio follow()'s) is the parent of the call's span.
        context = contextvars.copy_context()
        call = _Call(asyncio.get_running_loop(), functools.partial(context.run, fn, *args, **kwargs))
        self._workers.submit(call)
        try:
            result: R = await call.future
            return result
        except asyncio.CancelledError:
            if not call.skip():  # already running: let it end (commit or roll back) before giving up
                await call.settle()
            raise

    def dispose(self) -> None:
        # Workers busy with a call finish it (and what was queued before), then stop; later calls get new ones.
        workers, self._workers = self._workers, _Workers()
        workers.stop()
        self._twin.dispose()


class _Workers:
    """Up to :data:`THREAD_WORKERS` daemon threads taking calls from one queue, started when none is idle."""

    def __init__(self) -> None:
        self._queue: queue.SimpleQueue[_Call | None] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._started = self._idle = 0

    def submit(self, call: _Call) -> None:
        with self._lock:
            start = self._idle == 0 and self._started < THREAD_WORKERS
            if start:
                self._started += 1
            elif self._idle:
                self._idle -= 1
        if start:
            threading.Thread(target=self._work, name="hostedrooms-aio", daemon=True).start()
        self._queue.put(call)

    def _work(self) -> None:
        while (call := self._queue.get()) is not None:
            call.perform(self._ready)

    def _ready(self) -> None:
        with self._lock:
            self._idle += 1

    def stop(self) -> None:
        with self._lock:
            started = self._started
        for _ in range(started):
            self._queue.put(None)


class _Call:
    """One call handed to a worker thread, and how its outcome reaches the loop."""

    __slots__ = ("_done", "_fn", "_lock", "_loop", "_settled", "_started", "future")

    def __init__(self, loop: asyncio.AbstractEventLoop, fn: Callable[[], Any]) -> None:
        self._loop, self._fn = loop, fn
        self.future: asyncio.Future[Any] = loop.create_future()
        self._lock = threading.Lock()
        self._started = self._done = False
        self._settled: asyncio.Future[None] | None = None

    def skip(self) -> bool:
        """Cancel the call if no worker has started it; whether it will not run."""
        with self._lock:
            if self._started:
                return False
            self._started = True  # a worker that takes it now finds it taken
            return True

    def perform(self, ready: Callable[[], None]) -> None:
        """On a worker thread: run the call unless it was skipped, call ``ready`` (the worker is free), then
        report to the loop."""
        with self._lock:
            if self._started:
                ready()
                return
            self._started = True
        try:
            outcome: tuple[bool, Any] = (True, self._fn())
        except BaseException as exc:  # handed to the awaiting task
            outcome = (False, exc)
        ready()
        with contextlib.suppress(RuntimeError):  # a closed loop: nobody awaits the outcome any more
            self._loop.call_soon_threadsafe(self._report, outcome)

    def _report(self, outcome: tuple[bool, Any]) -> None:
        """On the loop: the outcome, to the awaiting task (unless it was cancelled) and to :meth:`settle`."""
        self._done = True
        ok, value = outcome
        if not self.future.done():
            if ok:
                self.future.set_result(value)
            else:
                self.future.set_exception(value)
        if self._settled is not None and not self._settled.done():
            self._settled.set_result(None)

    async def settle(self) -> None:
        """Wait until the started call has ended, whatever further cancellations arrive."""
        if self._done:
            return
        settled = self._settled = self._loop.create_future()
        while not settled.done():
            with contextlib.suppress(asyncio.CancelledError):
                await asyncio.shield(settled)


async def runner_for(engine: object) -> Runner:
    """The :class:`Runner` of an AsyncEngine (built on first use; an adopted engine gets hostedrooms' hooks)."""
    async_engine = require_async_engine(engine)
    sync_engine = async_engine.sync_engine
    runtime = runtime_of(sync_engine)
    runner: Runner | None = runtime.runner
    if runner is not None:
        return runner
    options: _Options = runtime.async_options or _Options()
    if configure_adopted(sync_engine, synchronous=options.synchronous, busy_timeout=options.busy_timeout):
        await run_to_end(async_engine.dispose())  # pooled connections predate the hooks (cancelled: still all)
    twin_target = backend_for_url(async_engine.url).twin_target(async_engine.url)
    if options.services == "awaited" or twin_target is None:
        return _keep_runner(runtime, _Awaited(async_engine))
    threaded = _Threaded(create_engine(
        twin_target, synchronous=options.synchronous, busy_timeout=options.busy_timeout, create=options.create,
        schema=options.schema, pooler=options.pooler, listen_url=options.listen_url,
        held_connections=options.held_connections, pool_size=THREAD_WORKERS,
        max_overflow=THREAD_WORKERS))  # the overflow: callers' own threads
    runner = _keep_runner(runtime, threaded)
    if runner is threaded:
        event.listen(sync_engine, "engine_disposed", lambda _engine: threaded.dispose())
    else:  # another task built one first, while this one awaited the dispose above
        threaded.dispose()
    return runner


_runners_lock = threading.Lock()


def _forked() -> None:
    global _runners_lock
    _runners_lock = threading.Lock()  # it may have been held by a thread that does not exist here


if hasattr(os, "register_at_fork"):  # not on Windows, which does not fork
    os.register_at_fork(after_in_child=_forked)


def _keep_runner(runtime: EngineRuntime, runner: Runner) -> Runner:
    """``runner`` as the engine's runner unless another task kept one first (then that one)."""
    with _runners_lock:
        if runtime.runner is None:
            runtime.runner = runner
        kept: Runner = runtime.runner
    return kept


def runner_of(sync_engine: Engine) -> Runner | None:
    """The runner built for the AsyncEngine whose ``sync_engine`` this is, if any (tests and diagnostics)."""
    runtime = known_runtime(sync_engine)
    runner: Runner | None = None if runtime is None else runtime.runner
    return runner

"""What hostedrooms did to an engine, in one place: its :class:`EngineProfile` (the configuration it was built or
adopted with, frozen) and its :class:`EngineRecord` (that profile, plus what hostedrooms learns about the engine
while it runs: its pooler hooks, its PostgreSQL namespace once known).

One map holds the records, keyed by the engine's SQLAlchemy ``Dialect`` object: the engines
``execution_options()`` derives share it (and the pool), so they share the record; the key is held weakly, so
an engine that is disposed and dropped takes its record with it. :func:`install` is the one place that installs
hostedrooms' connection hooks on an engine, in the order they must run; :func:`profile_of` is the one lookup of
what an engine was configured with.

Beside it, each Engine object carries its :class:`EngineRuntime` (:func:`runtime_of`): the objects hostedrooms
runs for that very Engine (the held writer's slot, the held autocommit connections, the shared waiter, the
asyncio runner, the waiter's engine, the compat facade's mark). They are per Engine, not per dialect, because
they hold their engine (the held writer does): kept in a map that outlives engines they would keep the engine,
and its dialect, alive; kept on the Engine they go with it. A derived engine (``execution_options()``) has a
runtime of its own, as it had its own entries.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from sqlalchemy import URL, Engine
from sqlalchemy.engine import Dialect
from sqlalchemy.engine.base import OptionEngine

if TYPE_CHECKING:
    from .backends.base import Backend

__all__ = [
    "EngineProfile", "EngineRecord", "EngineRuntime", "Pooler", "install", "known_runtime", "profile_of", "record_of",
    "runtime_of",
]


@dataclass(frozen=True, slots=True)
class Pooler:
    """How an engine reaches PostgreSQL: through a pooler in ``mode`` ("session", "transaction"), and the URL of a
    direct connection its shared waiter ``LISTEN``\\ s on (None: the engine's own URL)."""

    mode: str | None
    listen_url: URL | None


@dataclass(frozen=True, slots=True)
class EngineProfile:
    """The hostedrooms configuration of an engine built or adopted by :func:`hostedrooms.create_engine` (or by
    :func:`hostedrooms.aio.create_async_engine`, on its ``sync_engine``): the backend, SQLite's ``synchronous``
    mode and busy timeout, the PostgreSQL ``schema=`` and ``pooler=``/``listen_url=`` (None: not given)."""

    backend: Backend
    synchronous: str
    busy_timeout: float
    schema: str | None = None
    pooler: Pooler | None = None


class EngineRecord:
    """Everything hostedrooms keeps about one engine (and the engines derived from it).

    ``profile``: set by :func:`install` (None: hostedrooms never configured the engine, a host's engine used as
    given). ``pooler``: the pooler hooks installed on it (a configured engine's ``profile.pooler``; also a probe
    engine's, which has no profile). ``namespace``: the PostgreSQL namespace its connections use (None: the
    legacy schema's fixed keys and channels), valid once ``namespace_known``."""

    __slots__ = ("namespace", "namespace_known", "pooler", "profile")

    def __init__(self) -> None:
        self.profile: EngineProfile | None = None
        self.pooler: Pooler | None = None
        self.namespace: str | None = None
        self.namespace_known = False

    def learn_namespace(self, namespace: str | None) -> str | None:
        """Record the namespace read from a connection (the first one read wins); return it."""
        self.namespace, self.namespace_known = namespace, True
        return namespace


_records: weakref.WeakKeyDictionary[Dialect, EngineRecord] = weakref.WeakKeyDictionary()


def record_of(dialect: Dialect) -> EngineRecord:
    """The record of the engine(s) using SQLAlchemy ``dialect`` (``engine.dialect``), made on first use."""
    record = _records.get(dialect)
    if record is None:
        record = _records.setdefault(dialect, EngineRecord())
    return record


def known_record(dialect: Dialect) -> EngineRecord | None:
    """The record of ``dialect``'s engine(s) if hostedrooms keeps one, without making it."""
    return _records.get(dialect)


def profile_of(engine: Engine) -> EngineProfile | None:
    """What ``engine`` was configured with by hostedrooms (None: it never was)."""
    record = _records.get(engine.dialect)
    return None if record is None else record.profile


class EngineRuntime:
    """The objects hostedrooms runs for one Engine object (see the module docstring); each module owns its
    field and its rules: ``writer_slot`` (:mod:`hostedrooms.writer`), ``held_autocommit``
    (:mod:`hostedrooms.held_autocommit`), ``waiter`` and ``waiter_generation``
    (:mod:`hostedrooms.wakeup`; a waiter of another generation belongs to the parent of a forked process),
    ``async_options``, ``runner`` (:mod:`hostedrooms.aio.engines`), ``waiter_engine`` (:mod:`hostedrooms.aio.wakeup`;
    valid once ``waiter_engine_known``), ``compat_generation`` (:mod:`hostedrooms.compat._engine`: the facade
    adopted and migrated the engine in that generation of its cache)."""

    __slots__ = ("async_options", "compat_generation", "held_autocommit", "runner", "waiter", "waiter_engine",
                 "waiter_engine_known", "waiter_generation", "writer_slot")

    def __init__(self) -> None:
        self.writer_slot: Any = None
        self.held_autocommit: Any = None
        self.waiter: Any = None
        self.waiter_generation = -1
        self.async_options: Any = None
        self.runner: Any = None
        self.waiter_engine: Engine | None = None
        self.waiter_engine_known = False
        self.compat_generation = -1


#: The Engine attribute holding its :class:`EngineRuntime`.
_RUNTIME = "_hostedrooms_runtime"


def runtime_of(engine: Engine) -> EngineRuntime:
    """``engine``'s :class:`EngineRuntime`, made on first use (two threads racing get the same one)."""
    runtime: EngineRuntime | None = vars(engine).get(_RUNTIME)
    if runtime is None:
        runtime = vars(engine).setdefault(_RUNTIME, EngineRuntime())
    return runtime


def known_runtime(engine: Engine) -> EngineRuntime | None:
    """``engine``'s :class:`EngineRuntime` if it has one, without making it (the hot paths' lookup)."""
    runtime: EngineRuntime | None = vars(engine).get(_RUNTIME)
    return runtime


def install(engine: Engine, profile: EngineProfile) -> None:
    """Install hostedrooms' connection hooks on ``engine`` (an AsyncEngine's ``sync_engine``) for ``profile``,
    in the order they must run, and record the profile; the caller has checked the profile against the engine.

    The pooler first (its connect arguments hold for every connection), then the schema (its ``search_path`` is
    set before the other hooks run: they see the schema), then the backend's own hooks, then the logging rules."""
    backend = profile.backend
    if profile.pooler is not None:
        backend.use_pooler(engine, profile.pooler)
    if profile.schema is not None:  # before the other hooks: they see the schema's search_path
        backend.use_schema(engine, profile.schema)
    backend.configure_engine(engine, synchronous=profile.synchronous, busy_timeout=profile.busy_timeout)
    keep_secrets_out_of_logs(engine)
    record_of(engine.dialect).profile = profile


def _never() -> bool:
    return False


class _RowQuietOptionEngine(OptionEngine):
    """What ``execution_options()`` derives from an engine of ours: it never logs rows either."""

    def _should_log_debug(self) -> bool:
        return False


_RowQuietOptionEngine._option_cls = _RowQuietOptionEngine


def keep_secrets_out_of_logs(engine: Engine) -> None:
    """Rows and bound parameters of ``engine`` never reach a log or an error message, at any level.

    Rows carry chat messages, lease tokens, grants and peer message bodies; SQLAlchemy logs every fetched row
    when its engine logger is at DEBUG (``echo="debug"``, or the ``sqlalchemy.engine`` logger at DEBUG). It asks
    the engine once per result whether to (``_should_log_debug``): answering no here costs nothing per
    statement, and engines derived with ``execution_options()`` answer no too. Statements themselves are still
    logged at INFO, with their parameters hidden.
    """
    engine.hide_parameters = True
    engine._should_log_debug = _never  # type: ignore[method-assign]
    engine._option_cls = _RowQuietOptionEngine

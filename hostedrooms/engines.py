"""Where a service's Engine comes from: an Engine, or a factory resolved after the arguments validated; and the
one double-checked cache of engines per target (the compat facades' migrated engines, the probes' engines).
"""

from __future__ import annotations

import threading
from collections.abc import Callable

from sqlalchemy import Engine

from .db import refuse_translate_map, reject_async
from .errors import MisuseError

__all__ = ["EngineCache", "EngineSource", "resolve_engine"]

#: An Engine, or a zero-argument factory called only after the arguments validated (so a facade's bad input
#: never creates or migrates a database).
EngineSource = Engine | Callable[[], Engine]


def resolve_engine(source: EngineSource) -> Engine:
    """The Engine a service runs on: ``source`` itself, or what a zero-argument factory returns.

    An asyncio engine passed by mistake is refused with a MisuseError (not a TypeError from calling it); an
    engine with a ``schema_translate_map`` with a StoreConfigurationError (hostedrooms' compiled statements would
    ignore it: use ``create_engine(..., schema=...)``).

    :param source: an :class:`~sqlalchemy.Engine`, or a zero-argument factory returning one.
    :returns: the Engine to run on.
    :raises MisuseError: ``source`` is an asyncio engine, or neither an Engine nor callable.
    :raises StoreConfigurationError: the engine has a ``schema_translate_map``.
    """
    reject_async(source)
    if isinstance(source, Engine):
        refuse_translate_map(source)
        return source
    if not callable(source):
        raise MisuseError(f"hostedrooms needs a SQLAlchemy Engine, not {type(source).__name__}")
    engine = source()
    refuse_translate_map(engine)
    return engine


class EngineCache:
    """Engines built once per key and shared by every thread (the build runs under a lock, at most once)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._engines: dict[str, Engine] = {}

    def get(self, key: str, build: Callable[[], Engine]) -> Engine:
        """The cached engine of ``key``; ``build()`` makes it the first time (a failed build caches nothing).

        :param key: the cache key (a URL rendered with its password, say).
        :param build: makes the engine when ``key`` has none yet.
        :returns: the engine cached under ``key``.
        """
        engine = self._engines.get(key)
        if engine is not None:
            return engine
        with self._lock:
            engine = self._engines.get(key)
            if engine is None:
                engine = self._engines[key] = build()
        return engine

    def clear(self) -> None:
        """Dispose and drop every cached engine (tests; forked children)."""
        with self._lock:
            for engine in self._engines.values():
                engine.dispose()
            self._engines.clear()

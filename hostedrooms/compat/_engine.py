"""Shared plumbing of the seed-compatible facades: a cached, migrated Engine per ``db_path``.

The reference implementation takes a ``db_path`` on every call. Here ``db_path`` may be a filesystem path
(a SQLite file, created and migrated to head on first use), a SQLAlchemy URL string, or an Engine. Engines
are cached per target, so repeated calls neither reconnect nor re-check the schema.
"""

from __future__ import annotations

import threading

from sqlalchemy import Engine

from .. import migrate
from ..db import Target, create_engine, resolve_url
from ..identity import INSTALL_ID_ENV, local_gateway_id

__all__ = ["INSTALL_ID_ENV", "engine_for", "forget_engines", "local_gateway_id"]

_lock = threading.Lock()
_engines: dict[str, Engine] = {}


def _cache_key(target: Target) -> str:
    if isinstance(target, Engine):
        return f"engine:{id(target)}"
    return resolve_url(target).render_as_string(hide_password=False)


def engine_for(db_path: Target) -> Engine:
    """The cached Engine for ``db_path``, migrated to head the first time it is seen in this process."""
    key = _cache_key(db_path)
    engine = _engines.get(key)
    if engine is not None:
        return engine
    with _lock:
        engine = _engines.get(key)
        if engine is None:
            engine = create_engine(db_path)
            if not migrate.is_at_head(engine):
                migrate.upgrade(engine)
            _engines[key] = engine
    return engine


def forget_engines() -> None:
    """Dispose and drop every cached engine (tests; forked children)."""
    with _lock:
        for engine in _engines.values():
            engine.dispose()
        _engines.clear()

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
from ..engine_profile import runtime_of
from ..engines import EngineCache
from ..identity import INSTALL_ID_ENV, local_gateway_id

__all__ = ["INSTALL_ID_ENV", "engine_for", "forget_engines", "local_gateway_id"]

_engines = EngineCache()
# Engines passed in by callers, once adopted and migrated, are marked in their own EngineRuntime (the caller owns
# them: nothing here keeps them alive) with the generation of this cache; forget_engines() starts a new one.
_generation = 0
_adopting = threading.Lock()


def _migrated(engine: Engine) -> Engine:
    if not migrate.is_at_head(engine):
        migrate.upgrade(engine)
    return engine


def engine_for(db_path: Target) -> Engine:
    """The cached Engine for ``db_path``, migrated to head the first time it is seen in this process."""
    if isinstance(db_path, Engine):
        runtime = runtime_of(db_path)
        if runtime.compat_generation != _generation:
            with _adopting:
                if runtime.compat_generation != _generation:
                    _migrated(create_engine(db_path))
                    runtime.compat_generation = _generation
        return db_path
    key = resolve_url(db_path).render_as_string(hide_password=False)
    return _engines.get(key, lambda: _migrated(create_engine(db_path)))


def forget_engines() -> None:
    """Dispose and drop every cached engine (tests; forked children); adopted engines are the caller's."""
    global _generation
    _engines.clear()
    with _adopting:
        _generation += 1

"""Shared plumbing of the seed-compatible facades: a cached, migrated Engine per ``db_path``.

The reference implementation takes a ``db_path`` on every call. Here ``db_path`` may be a filesystem path
(a SQLite file, created and migrated to head on first use), a SQLAlchemy URL string, or an Engine. Engines
are cached per target, so repeated calls neither reconnect nor re-check the schema.
"""

from __future__ import annotations

import threading
import weakref

from sqlalchemy import Engine

from .. import migrate
from ..db import Target, create_engine, resolve_url
from ..engines import EngineCache
from ..identity import INSTALL_ID_ENV, local_gateway_id

__all__ = ["INSTALL_ID_ENV", "engine_for", "forget_engines", "local_gateway_id"]

_engines = EngineCache()
# Engines passed in by callers, once adopted and migrated: held weakly (the caller owns them), keyed by the
# object itself, never by id().
_adopted: weakref.WeakSet[Engine] = weakref.WeakSet()
_adopting = threading.Lock()


def _migrated(engine: Engine) -> Engine:
    if not migrate.is_at_head(engine):
        migrate.upgrade(engine)
    return engine


def engine_for(db_path: Target) -> Engine:
    """The cached Engine for ``db_path``, migrated to head the first time it is seen in this process."""
    if isinstance(db_path, Engine):
        if db_path not in _adopted:
            with _adopting:
                if db_path not in _adopted:
                    _adopted.add(_migrated(create_engine(db_path)))
        return db_path
    key = resolve_url(db_path).render_as_string(hide_password=False)
    return _engines.get(key, lambda: _migrated(create_engine(db_path)))


def forget_engines() -> None:
    """Dispose and drop every cached engine (tests; forked children); adopted engines are the caller's."""
    _engines.clear()
    with _adopting:
        _adopted.clear()

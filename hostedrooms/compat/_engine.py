"""Shared plumbing of the seed-compatible facades: a cached, migrated Engine per ``db_path``.

The reference implementation takes a ``db_path`` on every call. Here ``db_path`` may be a filesystem path
(a SQLite file, created and migrated to head on first use), a SQLAlchemy URL string, or an Engine. Engines
are cached per target, so repeated calls neither reconnect nor re-check the schema.
"""

from __future__ import annotations

import os
import threading
from pathlib import Path
from typing import Any

from sqlalchemy import Engine

from .. import migrate
from ..db import Target, create_engine, resolve_url
from ..errors import HostedRoomError
from ..validation import identifier

#: Environment variable holding this install's stable id; the gateway id is ``install:<id>``.
INSTALL_ID_ENV = "HOSTEDROOMS_INSTALL_ID"

_lock = threading.Lock()
_engines: dict[str, Engine] = {}
_migrated: set[int] = set()


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


def sqlite_file(db_path: Any) -> Path | None:
    """The SQLite file a ``db_path`` names without creating anything, or None for non-SQLite targets."""
    if isinstance(db_path, Engine):
        database = db_path.url.database if db_path.dialect.name == "sqlite" else None
        return Path(database) if database and database != ":memory:" else None
    url = resolve_url(db_path)
    if url.get_backend_name() != "sqlite" or url.database in (None, "", ":memory:"):
        return None
    return Path(str(url.database))


def local_gateway_id(explicit: Any = None) -> str:
    """The local authority gateway id: ``explicit`` if given, else ``install:$HOSTEDROOMS_INSTALL_ID``."""
    if explicit is not None:
        return identifier(explicit, error=HostedRoomError, label="authority_gateway_id")
    install_id = os.environ.get(INSTALL_ID_ENV, "").strip()
    if not install_id:
        raise HostedRoomError("stable gateway install identity is unavailable")
    return identifier(f"install:{install_id}", error=HostedRoomError, label="authority_gateway_id")

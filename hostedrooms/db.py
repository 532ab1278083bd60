"""Engines: turn a target (filesystem path, URL or Engine) into a configured SQLAlchemy Engine.

A filesystem path means a SQLite file (WAL, ``synchronous=FULL``, foreign keys, a busy timeout, and
``BEGIN IMMEDIATE`` for write transactions). A ``postgresql://`` URL uses psycopg 3. Bad targets raise
:class:`~hostedrooms.errors.HostedRoomError` naming the target with its password masked.
"""

from __future__ import annotations

import os
import weakref
from pathlib import Path
from typing import Any

import sqlalchemy
from sqlalchemy import URL, Engine, make_url
from sqlalchemy import exc as sa_exc
from sqlalchemy.pool import StaticPool

from .dialect import SUPPORTED_DIALECTS, dialect_for
from .errors import HostedRoomError, describe_target

Target = str | os.PathLike[str] | URL | Engine

#: Environment variable naming the default database URL (CLI, Alembic, tests).
DATABASE_URL_ENV = "HOSTEDROOMS_DATABASE_URL"
DEFAULT_BUSY_TIMEOUT = 10.0
SYNCHRONOUS_MODES = frozenset({"FULL", "EXTRA", "NORMAL"})

_configured: weakref.WeakSet[Engine] = weakref.WeakSet()


def resolve_url(target: str | os.PathLike[str] | URL) -> URL:
    """The SQLAlchemy URL for a target; a plain path becomes an absolute SQLite file URL."""
    if isinstance(target, URL):
        url = target
    elif isinstance(target, os.PathLike) or "://" not in str(target):
        text = os.fspath(target)
        if not text:
            raise HostedRoomError("database target must not be empty")
        return URL.create("sqlite", database=str(Path(text).expanduser().resolve()))
    else:
        try:
            url = make_url(str(target))
        except (sa_exc.ArgumentError, ValueError) as exc:
            raise HostedRoomError(f"malformed database URL: {_mask_raw(str(target))}") from exc
    backend = url.get_backend_name()
    if backend not in SUPPORTED_DIALECTS:
        raise HostedRoomError(
            f"unsupported database dialect {backend!r} in {describe_target(url)}; use sqlite or postgresql")
    if backend == "postgresql" and url.get_driver_name() in ("psycopg2", "psycopg", ""):
        url = url.set(drivername="postgresql+psycopg")
    return url


def _mask_raw(text: str) -> str:
    """Mask ``user:password@`` in a string that did not parse as a URL."""
    scheme, sep, rest = text.partition("://")
    if not sep or "@" not in rest:
        return text
    credentials, _, host = rest.rpartition("@")
    user = credentials.split(":", 1)[0]
    return f"{scheme}://{user}:***@{host}" if ":" in credentials else text


def create_engine(
    target: Target,
    *,
    synchronous: str = "FULL",
    busy_timeout: float = DEFAULT_BUSY_TIMEOUT,
    **engine_kwargs: Any,
) -> Engine:
    """Build (or adopt) an Engine configured for hostedrooms.

    ``synchronous`` applies to SQLite only; ``FULL`` (the default) makes every commit durable. ``NORMAL``
    is an explicit opt-in that may lose the last commits on power loss (never on a process crash).
    """
    if synchronous not in SYNCHRONOUS_MODES:
        raise HostedRoomError(f"synchronous must be one of {', '.join(sorted(SYNCHRONOUS_MODES))}")
    if isinstance(target, Engine):
        return _adopt_engine(target, synchronous=synchronous, busy_timeout=busy_timeout)
    url = resolve_url(target)
    # Statement parameters carry user messages and private grants: keep them out of errors and logs.
    engine_kwargs.setdefault("hide_parameters", True)
    if url.get_backend_name() == "sqlite":
        _prepare_sqlite_file(url)
        if url.database in (None, "", ":memory:"):
            engine_kwargs.setdefault("poolclass", StaticPool)
        engine_kwargs.setdefault("connect_args", {}).setdefault("check_same_thread", False)
    try:
        engine = sqlalchemy.create_engine(url, **engine_kwargs)
    except (sa_exc.ArgumentError, sa_exc.NoSuchModuleError, ImportError) as exc:
        raise HostedRoomError(f"cannot use database {describe_target(url)}: {exc}") from exc
    dialect_for(engine).configure_engine(engine, synchronous=synchronous, busy_timeout=busy_timeout)
    _configured.add(engine)
    return engine


def _adopt_engine(engine: Engine, *, synchronous: str, busy_timeout: float) -> Engine:
    """Use a caller's Engine as given, installing our connection hooks once if it lacks them."""
    if engine.dialect.name not in SUPPORTED_DIALECTS:
        raise HostedRoomError(
            f"unsupported database dialect {engine.dialect.name!r} in {describe_target(engine.url)}")
    if engine not in _configured:
        dialect_for(engine).configure_engine(engine, synchronous=synchronous, busy_timeout=busy_timeout)
        engine.pool.dispose()  # pooled connections predate the hooks
        _configured.add(engine)
    return engine


def _prepare_sqlite_file(url: URL) -> None:
    database = url.database
    if database and database != ":memory:" and not database.startswith("file:"):
        Path(database).parent.mkdir(parents=True, exist_ok=True)


def sqlite_path(engine: Engine) -> Path | None:
    """The file behind a SQLite engine, or None (PostgreSQL, in-memory)."""
    if engine.dialect.name != "sqlite" or engine.url.database in (None, "", ":memory:"):
        return None
    return Path(str(engine.url.database))

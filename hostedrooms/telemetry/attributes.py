"""What hostedrooms records as attributes: the names, the arguments recorded and the value check, a store's
attributes (the database and schema names of an Engine and, on PostgreSQL, its server's host and port; never its
URL) and a failure's ``db.response.status_code``.

Only identifiers and integers are ever recorded (:func:`safe`); docs/observability.md lists every name.
"""

from __future__ import annotations

import weakref
from typing import Any

from sqlalchemy.engine import URL

__all__ = [
    "DB_NAMESPACE", "DB_OPERATION", "DB_STATUS", "DB_SYSTEM", "EPOCH", "ERROR_TYPE", "EVENTS", "FIRST_SEQ",
    "GATEWAY", "LAST_SEQ", "LEDGER_STATE", "LEDGER_TABLE", "OPERATION", "OUTCOME", "RETRY_KIND", "ROOM",
    "SERVER_ADDRESS", "SERVER_PORT", "SINCE_SEQ", "response_status", "safe", "server_attributes",
    "store_attributes",
]

# Attribute names (OpenTelemetry database semantic conventions, then hostedrooms' own).
DB_SYSTEM = "db.system.name"
DB_NAMESPACE = "db.namespace"
DB_OPERATION = "db.operation.name"
DB_STATUS = "db.response.status_code"
SERVER_ADDRESS = "server.address"
SERVER_PORT = "server.port"
ERROR_TYPE = "error.type"
#: The public call a metric point measured (the spans' ``db.operation.name``): on hostedrooms' own metrics, so
#: that no SQL-level series of the conventions' ``db.*`` metrics is ever added to by a hostedrooms call.
OPERATION = "hostedrooms.operation"
ROOM = "hostedrooms.room.id"
GATEWAY = "hostedrooms.gateway.id"
EPOCH = "hostedrooms.epoch"
SINCE_SEQ = "hostedrooms.seq.since"
FIRST_SEQ = "hostedrooms.seq.first"
LAST_SEQ = "hostedrooms.seq.last"
OUTCOME = "hostedrooms.outcome"
EVENTS = "hostedrooms.events"
LEDGER_STATE = "hostedrooms.ledger.state"
LEDGER_TABLE = "hostedrooms.ledger.table"
RETRY_KIND = "hostedrooms.retry.kind"

#: Arguments recorded as span attributes, by parameter name. Only identifiers and integers: the values are
#: checked (a str of at most MAX_TEXT characters, an int that is not a bool) before they are recorded.
PARAMETERS: dict[str, str] = {
    "room_id": ROOM,
    "authority_gateway_id": GATEWAY,
    "expected_gateway_id": GATEWAY,
    "new_gateway_id": GATEWAY,
    "local_gateway_id": GATEWAY,
    "observed_gateway_id": GATEWAY,
    "authority_epoch": EPOCH,
    "expected_epoch": EPOCH,
    "observed_epoch": EPOCH,
    "since_seq": SINCE_SEQ,
}
MAX_TEXT = 256


def safe(value: Any) -> str | int | None:
    """``value`` when it may be recorded (an int that is not a bool, a str of at most MAX_TEXT characters)."""
    if type(value) is int:
        return value
    if type(value) is str and len(value) <= MAX_TEXT:
        return value
    return None


_engines: weakref.WeakKeyDictionary[Any, dict[str, Any]] = weakref.WeakKeyDictionary()


def store_attributes(engine: Any) -> dict[str, Any]:
    """``db.system.name`` and ``db.namespace`` of an Engine (the database and schema names, never the URL), and
    on PostgreSQL ``server.address`` and ``server.port`` (:func:`server_attributes`); nothing for anything that
    is not an Engine (a factory, a URL, None).

    :param engine: anything; only an Engine is described.
    :returns: the attributes, by name (empty for anything that is not an Engine).
    """
    try:
        known = _engines.get(engine)
    except TypeError:  # a factory or anything else not weakly referable: nothing to say about it
        return {}
    if known is None:
        known = _describe_engine(engine)
        try:
            _engines[engine] = known
        except TypeError:
            pass
    return dict(known)


def _describe_engine(engine: Any) -> dict[str, Any]:
    from sqlalchemy import Engine

    if not isinstance(engine, Engine):
        return {}
    from ..db import engine_schema

    backend = engine.dialect.name
    attributes: dict[str, Any] = {DB_SYSTEM: backend}
    database = engine.url.database
    if database:
        schema = engine_schema(engine)
        attributes[DB_NAMESPACE] = f"{database}|{schema}" if schema else database
    if backend == "postgresql":
        attributes.update(server_attributes(engine.url))
    return attributes


def server_attributes(url: URL) -> dict[str, Any]:
    """``server.address`` and ``server.port`` of a PostgreSQL URL, as the URL names them (nothing else of it: no
    user, password or query). A multi-host URL (``?host=h1:p1,h2:p2``, or one ``host`` parameter per server)
    gives its first server: the one libpq tries first, though a failover may connect to another. A Unix socket's
    directory (``?host=/run/postgresql``) is its address. The port only where the URL gives one (libpq's default
    may come from the environment, ``PGPORT``); the address likewise (none: libpq's default socket or
    ``PGHOST``)."""
    address, port = url.host, url.port
    if not address:
        address, port = _first_server(url.query.get("host"))
    if port is None:
        port = _port(_first(url.query.get("port")))
    found: dict[str, Any] = {}
    if address:
        found[SERVER_ADDRESS] = address
        if port is not None:
            found[SERVER_PORT] = port
    return found


def _first(value: str | tuple[str, ...] | None) -> str | None:
    """The first of a URL query parameter's values (given once or more, each maybe a comma-separated list)."""
    if isinstance(value, tuple):
        value = value[0] if value else None
    return value.split(",")[0].strip() if value else None


def _first_server(hosts: str | tuple[str, ...] | None) -> tuple[str | None, int | None]:
    entry = _first(hosts)
    if not entry or entry.startswith("/"):
        return entry, None
    if entry.startswith("["):  # an IPv6 address, maybe with a port: [::1]:5432
        end = entry.find("]")
        rest = entry[end + 1:] if end > 0 else ""
        return entry[1:end] if end > 0 else entry, _port(rest[1:]) if rest.startswith(":") else None
    if entry.count(":") == 1:
        address, port = entry.split(":")
        return address, _port(port)
    return entry, None


def _port(text: str | None) -> int | None:
    return int(text) if text and text.isdigit() and 0 < int(text) < 65536 else None


#: How far ``response_status`` follows an error's causes (a translated error is one step from the driver's).
_CAUSES = 8


def response_status(exc: BaseException) -> str | None:
    """``db.response.status_code`` of a failure: the SQLSTATE of the PostgreSQL error behind it (psycopg's
    ``sqlstate``, psycopg2's ``pgcode``), or the extended result code of the SQLite error behind it, in decimal
    (``sqlite3.Error.sqlite_errorcode``: 5 for SQLITE_BUSY, 2067 for SQLITE_CONSTRAINT_UNIQUE); None when no
    database answered (a refused input, a fence, a connection that never opened). Follows the chain of
    ``__cause__`` (hostedrooms raises its errors ``from`` the driver's) and SQLAlchemy's ``orig``."""
    current: BaseException | None = exc
    for _ in range(_CAUSES):
        if current is None:
            return None
        for candidate in (current, getattr(current, "orig", None)):
            code = _code(candidate)
            if code is not None:
                return code
        current = current.__cause__
    return None


def _code(error: Any) -> str | None:
    if error is None:
        return None
    for name in ("sqlstate", "pgcode"):
        sqlstate = getattr(error, name, None)
        if type(sqlstate) is str and len(sqlstate) == 5:
            return sqlstate
    code = getattr(error, "sqlite_errorcode", None)
    return str(code) if type(code) is int else None

"""What hostedrooms records as attributes: the names, the arguments recorded and the value check, and a store's
``db.*`` attributes (the database and schema names of an Engine, never its URL).

Only identifiers and integers are ever recorded (:func:`safe`); docs/observability.md lists every name.
"""

from __future__ import annotations

import weakref
from typing import Any

__all__ = [
    "DB_NAMESPACE", "DB_OPERATION", "DB_SYSTEM", "EPOCH", "ERROR_TYPE", "EVENTS", "FIRST_SEQ", "GATEWAY",
    "LAST_SEQ", "LEDGER_STATE", "LEDGER_TABLE", "OUTCOME", "RETRY_KIND", "ROOM", "SINCE_SEQ", "safe",
    "store_attributes",
]

# Attribute names (OpenTelemetry database semantic conventions, then hostedrooms' own).
DB_SYSTEM = "db.system.name"
DB_NAMESPACE = "db.namespace"
DB_OPERATION = "db.operation.name"
ERROR_TYPE = "error.type"
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
    """``db.system.name`` and ``db.namespace`` of an Engine (the database and schema names, never the URL);
    nothing for anything that is not an Engine (a factory, a URL, None)."""
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
    return attributes

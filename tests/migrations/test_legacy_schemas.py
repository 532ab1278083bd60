"""Legacy ``state.db`` generations for the adoption tests (a helper module: it holds no tests), written as raw
SQLite DDL restating the reference's layouts.

Nothing here imports the reference implementation: the layouts are restated from its migration code so the
project's tests stand alone. Builders fill rows through plain ``sqlite3``, exactly as the reference would.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Iterable
from pathlib import Path
from typing import Any

# --- current reference layouts (no named constraints) -------------------------------------------------------

ROOMS_CURRENT = """
CREATE TABLE hosted_rooms (
    room_id TEXT PRIMARY KEY, name TEXT NOT NULL, members_json TEXT NOT NULL,
    authority_gateway_id TEXT NOT NULL,
    authority_epoch INTEGER NOT NULL DEFAULT 1 CHECK (authority_epoch >= 1),
    next_seq INTEGER NOT NULL DEFAULT 1 CHECK (next_seq >= 1),
    event_bytes INTEGER NOT NULL DEFAULT 0 CHECK (event_bytes >= 0),
    revision INTEGER NOT NULL DEFAULT 1 CHECK (revision >= 1),
    created_at REAL NOT NULL, updated_at REAL NOT NULL, disbanded_at REAL)"""
EVENTS_CURRENT = """
CREATE TABLE hosted_room_events (
    room_id TEXT NOT NULL, seq INTEGER NOT NULL CHECK (seq >= 1), event_id TEXT NOT NULL, kind TEXT NOT NULL,
    actor_json TEXT NOT NULL, authority_epoch INTEGER CHECK (authority_epoch IS NULL OR authority_epoch >= 1),
    payload_json TEXT NOT NULL, created_at REAL NOT NULL,
    PRIMARY KEY (room_id, seq), UNIQUE (room_id, event_id), FOREIGN KEY (room_id) REFERENCES hosted_rooms(room_id))"""
EVENTS_CURSOR = "CREATE INDEX idx_hosted_room_events_cursor ON hosted_room_events(room_id, seq)"
RETIRED = "CREATE TABLE hosted_room_retired_ids (room_id TEXT PRIMARY KEY, retired_at REAL NOT NULL)"
LINKS = """
CREATE TABLE hosted_room_links (
    room_id TEXT NOT NULL, member_id TEXT NOT NULL, target_url TEXT NOT NULL, target_profile TEXT NOT NULL,
    grant TEXT NOT NULL, catalog_json TEXT NOT NULL, cancellation_scope_id TEXT NOT NULL, trace_id TEXT NOT NULL,
    transport_security TEXT NOT NULL, status TEXT NOT NULL DEFAULT 'ready', updated_at REAL NOT NULL,
    PRIMARY KEY (room_id, member_id))"""
REMOTE_RUNS_CURRENT = """
CREATE TABLE hosted_room_remote_runs (
    room_id TEXT NOT NULL, home_install_id TEXT NOT NULL, authority_gateway_id TEXT NOT NULL,
    authority_epoch INTEGER NOT NULL CHECK (authority_epoch >= 1), member_id TEXT NOT NULL, task_id TEXT NOT NULL,
    execution_generation INTEGER NOT NULL CHECK (execution_generation >= 1), target_install_id TEXT NOT NULL,
    target_profile TEXT NOT NULL, run_id TEXT NOT NULL, session_id TEXT NOT NULL,
    created_at REAL NOT NULL, updated_at REAL NOT NULL,
    PRIMARY KEY (room_id, home_install_id, authority_gateway_id, authority_epoch, member_id, target_install_id,
                 target_profile, task_id, execution_generation))"""
REVOKED = """
CREATE TABLE hosted_room_revoked_grants (scope_key TEXT PRIMARY KEY, expires_at REAL NOT NULL,
    revoked_before REAL NOT NULL)"""
RESERVATIONS = """
CREATE TABLE hosted_room_peer_reservations (
    room_id TEXT NOT NULL, member_id TEXT NOT NULL, target_profile TEXT NOT NULL, authority_gateway_id TEXT NOT NULL,
    authority_epoch INTEGER NOT NULL CHECK (authority_epoch >= 1), expires_at REAL NOT NULL, revoked_at REAL,
    created_at REAL NOT NULL, updated_at REAL NOT NULL, PRIMARY KEY (room_id, member_id, target_profile))"""
REPLICAS = """
CREATE TABLE hosted_room_replicas (
    room_id TEXT PRIMARY KEY, name TEXT NOT NULL, members_json TEXT NOT NULL, authority_gateway_id TEXT NOT NULL,
    authority_epoch INTEGER NOT NULL CHECK (authority_epoch >= 1),
    last_seq INTEGER NOT NULL DEFAULT 0 CHECK (last_seq >= 0), latest_seq INTEGER NOT NULL DEFAULT 0,
    event_bytes INTEGER NOT NULL DEFAULT 0, created_at REAL NOT NULL, updated_at REAL NOT NULL)"""
REPLICA_EVENTS = """
CREATE TABLE hosted_room_replica_events (
    room_id TEXT NOT NULL, seq INTEGER NOT NULL CHECK (seq >= 1), event_id TEXT NOT NULL, kind TEXT NOT NULL,
    actor_json TEXT NOT NULL, authority_epoch INTEGER, payload_json TEXT NOT NULL, created_at REAL NOT NULL,
    PRIMARY KEY (room_id, seq))"""

# Delivery columns the first ledger layout lacked (the reference adds them with ALTER TABLE).
DELIVERY_LATER = (
    "request_id", "lease_token", "team_id", "source_peer_id", "target_peer_id", "parent_leg", "response_request_id",
    "response_request_digest", "response_body", "response_request_response", "response_retry_at",
    "response_attempts", "response_last_error", "admission_retry_at", "admission_attempts", "admission_last_error")
_DELIVERY_COLUMNS = (
    ("envelope_id", "TEXT PRIMARY KEY"), ("request_id", "TEXT NOT NULL"), ("claim_digest", "TEXT NOT NULL"),
    ("transport_role", "TEXT NOT NULL CHECK(transport_role IN ('host','client'))"),
    ("connection_id", "TEXT NOT NULL"), ("lease_token", "TEXT NOT NULL"), ("team_id", "TEXT NOT NULL"),
    ("source_peer_id", "TEXT"), ("source_server_identity", "TEXT NOT NULL"), ("source_route_id", "TEXT NOT NULL"),
    ("source_route_revision", "TEXT NOT NULL"), ("target_peer_id", "TEXT"),
    ("target_server_identity", "TEXT NOT NULL"), ("target_route_id", "TEXT NOT NULL"),
    ("target_route_revision", "TEXT NOT NULL"), ("target_chat_id", "TEXT NOT NULL"),
    ("action", "TEXT NOT NULL CHECK(action IN ('instruction','request_reply'))"),
    ("kind", "TEXT NOT NULL CHECK(kind IN ('instruction','request_reply','response'))"),
    ("exchange_id", "TEXT NOT NULL"), ("parent_envelope_id", "TEXT"), ("parent_leg", "INTEGER"),
    ("used_legs", "INTEGER NOT NULL CHECK(used_legs BETWEEN 1 AND 6)"),
    ("max_legs", "INTEGER NOT NULL CHECK(max_legs=6)"),
    ("expires_at", "INTEGER NOT NULL"), ("body_json", "TEXT NOT NULL"),
    ("state", "TEXT NOT NULL CHECK(state IN ('prepared','authorized','queued','running','completed','failed'))"),
    ("queued_id", "TEXT"), ("run_id", "TEXT"), ("admission_retry_at", "INTEGER"),
    ("admission_attempts", "INTEGER NOT NULL DEFAULT 0"), ("admission_last_error", "TEXT"),
    ("response_committed", "INTEGER NOT NULL DEFAULT 0 CHECK(response_committed IN (0,1))"),
    ("response_request_id", "TEXT"), ("response_request_digest", "TEXT"), ("response_body", "TEXT"),
    ("response_request_response",
     "INTEGER CHECK(response_request_response IS NULL OR response_request_response IN (0,1))"),
    ("response_retry_at", "INTEGER"), ("response_attempts", "INTEGER NOT NULL DEFAULT 0"),
    ("response_last_error", "TEXT"), ("result_hash", "TEXT"), ("error", "TEXT"),
    ("created_at", "INTEGER NOT NULL"), ("updated_at", "INTEGER NOT NULL"))
DELIVERY_INDEXES = (
    "CREATE INDEX secure_peer_delivery_state ON secure_peer_deliveries(state,updated_at)",
    "CREATE INDEX secure_peer_delivery_run ON secure_peer_deliveries(run_id,state)",
    "CREATE UNIQUE INDEX secure_peer_delivery_queued_owner ON secure_peer_deliveries(queued_id)"
    " WHERE queued_id IS NOT NULL",
    "CREATE UNIQUE INDEX secure_peer_delivery_run_owner ON secure_peer_deliveries(run_id) WHERE run_id IS NOT NULL")
ROUTE_COLUMNS = ("connection_id", "source_route_id", "source_route_revision")
_INTENT_COLUMNS = (
    ("request_id", "TEXT PRIMARY KEY"), ("intent_digest", "TEXT NOT NULL"), ("source_session_id", "TEXT NOT NULL"),
    ("source_run_id", "TEXT NOT NULL"), ("connection_id", "TEXT NOT NULL"), ("source_route_id", "TEXT NOT NULL"),
    ("source_route_revision", "TEXT NOT NULL"), ("snapshot_json", "TEXT NOT NULL"), ("body", "TEXT NOT NULL"),
    ("action", "TEXT NOT NULL CHECK(action IN ('instruction','request_reply'))"), ("expires_at", "INTEGER NOT NULL"),
    ("state", "TEXT NOT NULL CHECK(state IN ('pending','committed','failed'))"), ("response_json", "TEXT"),
    ("retry_at", "INTEGER"), ("attempts", "INTEGER NOT NULL DEFAULT 0"), ("last_error", "TEXT"),
    ("created_at", "INTEGER NOT NULL"), ("updated_at", "INTEGER NOT NULL"))
INTENT_INDEXES = (
    "CREATE INDEX secure_peer_outbound_pending ON secure_peer_outbound_intents(state,retry_at,created_at)",
    "CREATE INDEX secure_peer_outbound_source ON secure_peer_outbound_intents(state,source_session_id,created_at)",
    "CREATE INDEX secure_peer_outbound_connection ON secure_peer_outbound_intents(state,connection_id,created_at)")


def _table(name: str, columns: Iterable[tuple[str, str]], drop: Iterable[str] = ()) -> str:
    dropped = set(drop)
    return f"CREATE TABLE {name} ({', '.join(f'{c} {d}' for c, d in columns if c not in dropped)})"


# --- older layouts ----------------------------------------------------------------------------------------------

ROOMS_DRAFT = """
CREATE TABLE hosted_rooms (
    room_id TEXT PRIMARY KEY, name TEXT NOT NULL, members_json TEXT NOT NULL,
    next_seq INTEGER NOT NULL DEFAULT 1 CHECK (next_seq >= 1),
    revision INTEGER NOT NULL DEFAULT 1 CHECK (revision >= 1),
    created_at REAL NOT NULL, updated_at REAL NOT NULL, disbanded_at REAL)"""
EVENTS_DRAFT = """
CREATE TABLE hosted_room_events (
    room_id TEXT NOT NULL, seq INTEGER NOT NULL CHECK (seq >= 1), event_id TEXT NOT NULL, kind TEXT NOT NULL,
    payload_json TEXT NOT NULL, created_at REAL NOT NULL,
    PRIMARY KEY (room_id, seq), UNIQUE (room_id, event_id), FOREIGN KEY (room_id) REFERENCES hosted_rooms(room_id))"""
REMOTE_RUNS_OLDEST = """
CREATE TABLE hosted_room_remote_runs (
    room_id TEXT NOT NULL, member_id TEXT NOT NULL, task_id TEXT NOT NULL, execution_generation INTEGER NOT NULL,
    target_install_id TEXT NOT NULL, target_profile TEXT NOT NULL, run_id TEXT NOT NULL, session_id TEXT NOT NULL,
    created_at REAL NOT NULL, updated_at REAL NOT NULL,
    PRIMARY KEY (room_id, member_id, task_id, execution_generation))"""
REMOTE_RUNS_HOME = """
CREATE TABLE hosted_room_remote_runs (
    room_id TEXT NOT NULL, home_install_id TEXT NOT NULL, member_id TEXT NOT NULL, task_id TEXT NOT NULL,
    execution_generation INTEGER NOT NULL, target_install_id TEXT NOT NULL, target_profile TEXT NOT NULL,
    run_id TEXT NOT NULL, session_id TEXT NOT NULL, created_at REAL NOT NULL, updated_at REAL NOT NULL,
    PRIMARY KEY (room_id, home_install_id, member_id, target_install_id, target_profile, task_id,
                 execution_generation))"""

LEGACY_ACTOR = '{"id":"legacy","kind":"system"}'

ROOM_TABLES_CURRENT = (ROOMS_CURRENT, EVENTS_CURRENT, RETIRED, LINKS, REMOTE_RUNS_CURRENT, REVOKED, RESERVATIONS,
                       EVENTS_CURSOR)
REPLICA_TABLES = (REPLICAS, REPLICA_EVENTS)
LEDGER_CURRENT = (_table("secure_peer_deliveries", _DELIVERY_COLUMNS), *DELIVERY_INDEXES,
                  _table("secure_peer_outbound_intents", _INTENT_COLUMNS), *INTENT_INDEXES)
DELIVERIES_DRAFT = (_table("secure_peer_deliveries", _DELIVERY_COLUMNS, DELIVERY_LATER), *DELIVERY_INDEXES)
INTENTS_DRAFT = (_table("secure_peer_outbound_intents", _INTENT_COLUMNS, ROUTE_COLUMNS), INTENT_INDEXES[0])
# The reference ran on a draft ledger: its ALTERs committed (nullable route columns), its repair did not.
INTENTS_TOUCHED = (
    _table("secure_peer_outbound_intents", _INTENT_COLUMNS, ROUTE_COLUMNS)
    + "", INTENT_INDEXES[0], *(f"ALTER TABLE secure_peer_outbound_intents ADD COLUMN {c} TEXT" for c in ROUTE_COLUMNS))

HOST_TABLES = (
    "CREATE TABLE alembic_version (version_num VARCHAR(32) NOT NULL PRIMARY KEY)",
    "INSERT INTO alembic_version VALUES ('hostapp_0042')",
    "CREATE TABLE host_orders (id INTEGER PRIMARY KEY, room_id TEXT REFERENCES hosted_rooms(room_id), note TEXT)",
    "CREATE TABLE host_log (id INTEGER PRIMARY KEY, line TEXT NOT NULL)",
    "INSERT INTO host_log (line) VALUES ('host ünïcode ☃')",
)


def connect(path: Path) -> sqlite3.Connection:
    connection = sqlite3.connect(path, isolation_level=None)
    connection.execute("PRAGMA journal_mode=WAL")  # as the reference leaves its files
    connection.execute("PRAGMA foreign_keys=ON")
    return connection


def build(path: Path, *statements: str) -> sqlite3.Connection:
    """Create ``path`` with the given DDL/DML statements; returns an open connection for filling rows."""
    connection = connect(path)
    for statement in statements:
        connection.execute(statement)
    return connection


def insert(connection: sqlite3.Connection, table: str, row: dict[str, Any]) -> None:
    names = ", ".join(row)
    marks = ", ".join("?" for _ in row)
    connection.execute(f"INSERT INTO {table} ({names}) VALUES ({marks})", tuple(row.values()))


def rows(connection: sqlite3.Connection, table: str) -> list[dict[str, Any]]:
    cursor = connection.execute(f"SELECT * FROM {table} ORDER BY 1, 2")
    names = [d[0] for d in cursor.description]
    return [dict(zip(names, r, strict=True)) for r in cursor]


def dump(path: Path) -> dict[str, Any]:
    """Every schema entry and every row of every table (a byte-level view of the file's content)."""
    connection = sqlite3.connect(path)
    try:
        schema = sorted(connection.execute("SELECT type, name, tbl_name, sql FROM sqlite_master").fetchall(),
                        key=repr)
        data = {name: sorted(connection.execute(f'SELECT * FROM "{name}"').fetchall(), key=repr)
                for (kind, name, _, _) in schema if kind == "table"}
    finally:
        connection.close()
    return {"schema": schema, "data": data}


# --- rows -------------------------------------------------------------------------------------------------------

BIG_PAYLOAD = json.dumps({"text": "ünïcödé ☃ " * 20_000}, ensure_ascii=False, separators=(",", ":"))


def delivery(envelope_id: str, state: str, *, draft: bool, **extra: Any) -> dict[str, Any]:
    row: dict[str, Any] = {
        "envelope_id": envelope_id, "request_id": f"req-{envelope_id}", "claim_digest": "d" * 64,
        "transport_role": "host", "connection_id": "conn-1", "lease_token": "lease", "team_id": "team",
        "source_peer_id": None, "source_server_identity": "src", "source_route_id": "sr", "source_route_revision": "1",
        "target_peer_id": "peer", "target_server_identity": "dst", "target_route_id": "tr",
        "target_route_revision": "2", "target_chat_id": "chat", "action": "request_reply", "kind": "request_reply",
        "exchange_id": "ex", "parent_envelope_id": None, "parent_leg": None, "used_legs": 1, "max_legs": 6,
        "expires_at": 2_000_000_000, "body_json": json.dumps({"message": f"héllo {envelope_id} ☃"}, ensure_ascii=False),
        "state": state, "queued_id": f"q-{envelope_id}" if state in ("queued", "running", "completed") else None,
        "run_id": f"run-{envelope_id}" if state in ("running", "completed") else None,
        "admission_retry_at": None, "admission_attempts": 0, "admission_last_error": None, "response_committed": 0,
        "response_request_id": None, "response_request_digest": None, "response_body": None,
        "response_request_response": None, "response_retry_at": None, "response_attempts": 0,
        "response_last_error": None, "result_hash": "h" if state == "completed" else None,
        "error": "boom" if state == "failed" else None, "created_at": 1_700_000_000, "updated_at": 1_700_000_001,
    }
    row.update(extra)
    if draft:
        for name in DELIVERY_LATER:
            row.pop(name)
    return row


DELIVERY_STATES = ("prepared", "authorized", "queued", "running", "completed", "failed")


def intent(request_id: str, snapshot_json: str, *, route: tuple[str, str, str] | None, state: str = "pending",
           **extra: Any) -> dict[str, Any]:
    row: dict[str, Any] = {
        "request_id": request_id, "intent_digest": "i" * 64, "source_session_id": "sess", "source_run_id": "run",
        "snapshot_json": snapshot_json, "body": "bödy ☃", "action": "instruction", "expires_at": 2_000_000_000,
        "state": state, "response_json": None, "retry_at": 1_700_000_100 if state == "pending" else None,
        "attempts": 2, "last_error": None, "created_at": 1_700_000_000, "updated_at": 1_700_000_005,
    }
    if route is not None:
        row.update(zip(ROUTE_COLUMNS, route, strict=True))
    row.update(extra)
    return row


def snapshot(**fields: Any) -> str:
    return json.dumps(fields, ensure_ascii=False)


#: (request_id, snapshot_json, expected route or None = fails closed)
LEGACY_INTENTS: tuple[tuple[str, str, tuple[str, str, str] | None], ...] = (
    ("ok-1", snapshot(connection_id="c-1", source_route_id="r-1", source_route_revision="7", extra="ü"),
     ("c-1", "r-1", "7")),
    ("ok-number", snapshot(connection_id="c-2", source_route_id="r-2", source_route_revision=3), ("c-2", "r-2", "3")),
    ("bad-json", "{not json", None),
    ("bad-list", "[1, 2, 3]", None),
    ("bad-missing", snapshot(connection_id="c-3", source_route_id="r-3"), None),
    ("bad-empty", snapshot(connection_id="", source_route_id="r", source_route_revision="1"), None),
    ("bad-zero", snapshot(connection_id="c", source_route_id="r", source_route_revision=0), None),
)

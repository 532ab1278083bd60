"""Adopting ``state.db`` files written by the reference implementation: the code of revisions 0001-0006, frozen.

The reference (raw sqlite3) created its tables with ``CREATE TABLE IF NOT EXISTS`` and migrated older layouts
each time it connected; its files carry no version table and often sit beside a host application's tables.
hostedrooms adopts them with ordinary revisions, all inside the one transaction of an upgrade:

* ``0001_baseline`` creates the tables the database lacks: every table on a fresh database; on one that already
  holds reference tables, only the missing ones. Alembic then records the baseline (the stamp) in the same
  transaction, after the migration lock was taken, so concurrent upgraders never adopt twice.
* ``0002``-``0005`` repeat the reference's own migrations, each only where its legacy trait is present:
  draft room/event columns (+ event_bytes backfill), the 9-column remote-run key, retired ids of disbanded
  rooms, and the secure-peer ledger columns (+ the route backfill from ``snapshot_json``, committed this time).
* ``0006`` rebuilds each table the reference created into the baseline's exact layout (named constraints, its
  indexes), so ``alembic check`` is clean on an adopted database too.

Every step is a no-op on a database hostedrooms created, so the fresh path yields exactly the baseline schema.
Legacy databases are SQLite files; on PostgreSQL the steps find nothing to do.

Frozen with those revisions (see ``__init__``): it reads the tables of :mod:`schema_0001`, never
``hostedrooms.models``, and settles backend differences itself rather than through live hostedrooms code.
Never edit it; a later revision that needs other behaviour copies what it needs into its own module.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa
from alembic.operations import Operations
from sqlalchemy import Connection, Table
from sqlalchemy import exc as sa_exc
from sqlalchemy.dialects import sqlite
from sqlalchemy.dialects.sqlite.base import SQLiteDialect
from sqlalchemy.ext.compiler import compiles
from sqlalchemy.sql.compiler import SQLCompiler
from sqlalchemy.sql.functions import FunctionElement

from hostedrooms.errors import HostedRoomError

from . import schema_0001 as schema

log = logging.getLogger("alembic.runtime.migration")

#: Rows read or updated per statement by the backfills (read at call time so tests can lower it).
BATCH_SIZE = 2000

#: hostedrooms' own Alembic version table, as these revisions were written for it.
VERSION_TABLE = "hostedrooms_alembic_version"

#: The authority, actor and route values the reference gives rows that predate those fields.
LEGACY_AUTHORITY = "legacy"
LEGACY_ACTOR_JSON = '{"id":"legacy","kind":"system"}'  # compact, sorted-key JSON of {"kind":"system","id":"legacy"}
LEGACY_ROUTE_ERROR = "invalid legacy secure peer route snapshot"

#: Generations reported by :func:`detect_generation`.
EMPTY = "empty"  # no hostedrooms table and no version: a fresh install
MANAGED = "managed"  # hostedrooms' version table holds a revision: Alembic already governs it
REFERENCE = "reference"  # unversioned, written by the current reference: only the layout needs conforming
LEGACY = "legacy"  # unversioned, with at least one older layout or an unfinished reference repair


def _room_draft_columns() -> dict[str, tuple[sa.Column[Any], ...]]:
    """The columns draft layouts lacked, declared as the reference adds them (fresh objects per call)."""
    return {
        "hosted_rooms": (
            sa.Column("authority_gateway_id", sa.Text(), nullable=False, server_default=LEGACY_AUTHORITY),
            sa.Column("authority_epoch", sa.Integer(), nullable=False, server_default=sa.text("1")),
            sa.Column("event_bytes", sa.Integer(), nullable=False, server_default=sa.text("0")),
        ),
        "hosted_room_events": (
            sa.Column("actor_json", sa.Text(), nullable=False, server_default=LEGACY_ACTOR_JSON),
            sa.Column("authority_epoch", sa.Integer(), nullable=True),
        ),
    }


ROOM_DRAFT_COLUMNS = {table: tuple(column.name for column in columns)
                      for table, columns in _room_draft_columns().items()}

#: Delivery columns later than the first ledger layout, declared as the reference adds them.
DELIVERY_LATER_COLUMNS: tuple[tuple[str, sa.types.TypeEngine[Any], str | None], ...] = (
    ("request_id", sa.Text(), None),
    ("lease_token", sa.Text(), None),
    ("team_id", sa.Text(), None),
    ("source_peer_id", sa.Text(), None),
    ("target_peer_id", sa.Text(), None),
    ("parent_leg", sa.Integer(), None),
    ("response_request_id", sa.Text(), None),
    ("response_request_digest", sa.Text(), None),
    ("response_body", sa.Text(), None),
    ("response_request_response", sa.Integer(), None),
    ("response_retry_at", sa.Integer(), None),
    ("response_attempts", sa.Integer(), "0"),
    ("response_last_error", sa.Text(), None),
    ("admission_retry_at", sa.Integer(), None),
    ("admission_attempts", sa.Integer(), "0"),
    ("admission_last_error", sa.Text(), None),
)
OUTBOUND_ROUTE_COLUMNS = ("connection_id", "source_route_id", "source_route_revision")

#: Values for NOT NULL columns a legacy row may lack (missing column, or NULL in a column the reference added
#: as nullable). Columns with a server default fall back to it. The reference's claim stores an absent
#: request id / team id / lease token as "", so "" is what such a row would have held.
LEGACY_FALLBACKS: dict[tuple[str, str], object] = {
    ("hosted_rooms", "authority_gateway_id"): LEGACY_AUTHORITY,
    ("hosted_room_events", "actor_json"): LEGACY_ACTOR_JSON,
    ("hosted_room_remote_runs", "home_install_id"): LEGACY_AUTHORITY,
    ("hosted_room_remote_runs", "authority_gateway_id"): LEGACY_AUTHORITY,
    ("hosted_room_remote_runs", "authority_epoch"): 1,
    ("secure_peer_deliveries", "request_id"): "",
    ("secure_peer_deliveries", "lease_token"): "",
    ("secure_peer_deliveries", "team_id"): "",
}

HOLD_PREFIX = "_hostedrooms_adopting_"


class Utf8Length(FunctionElement[int]):
    """The UTF-8 byte length of a text expression, spelled per backend (SQLite has no octet_length before 3.43)."""

    type = sa.Integer()
    inherit_cache = True


@compiles(Utf8Length, "sqlite")
def _utf8_length_sqlite(element: Utf8Length, compiler: SQLCompiler, **kw: Any) -> str:
    return f"length(CAST({compiler.process(element.clauses, **kw)} AS BLOB))"


@compiles(Utf8Length)
def _utf8_length_default(element: Utf8Length, compiler: SQLCompiler, **kw: Any) -> str:
    return f"octet_length({compiler.process(element.clauses, **kw)})"


# --- detection ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Generation:
    """What an (unversioned) database holds: its generation, present/missing tables and legacy traits."""

    kind: str
    present: frozenset[str]
    missing: frozenset[str]
    traits: frozenset[str]


def detect_generation(connection: Connection) -> Generation:
    """Classify ``connection``'s database; call it inside the migration transaction (after the lock)."""
    inspector = sa.inspect(connection)
    names = set(inspector.get_table_names())
    present = frozenset(names & set(schema.metadata.tables))
    missing = frozenset(set(schema.metadata.tables) - present)
    traits = frozenset(name for name, check in _TRAITS if check(connection, inspector, present))
    if VERSION_TABLE in names and connection.execute(
            sa.select(sa.func.count()).select_from(sa.table(VERSION_TABLE))).scalar_one():
        kind = MANAGED
    elif not present:
        kind = EMPTY
    elif traits <= {"reference_layout"}:
        kind = REFERENCE
    else:
        kind = LEGACY
    return Generation(kind=kind, present=present, missing=missing, traits=traits)


def _columns(inspector: sa.Inspector, table: str) -> frozenset[str]:
    return frozenset(column["name"] for column in inspector.get_columns(table))


def _lacks(table: str, wanted: Sequence[str]) -> Callable[[Connection, sa.Inspector, frozenset[str]], bool]:
    def check(_connection: Connection, inspector: sa.Inspector, present: frozenset[str]) -> bool:
        return table in present and not set(wanted) <= _columns(inspector, table)
    return check


def _old_remote_run_key(_connection: Connection, inspector: sa.Inspector, present: frozenset[str]) -> bool:
    return "hosted_room_remote_runs" in present and not remote_run_key_is_current(inspector)


def _unrepaired_routes(connection: Connection, inspector: sa.Inspector, present: frozenset[str]) -> bool:
    table = "secure_peer_outbound_intents"
    if table not in present or not set(OUTBOUND_ROUTE_COLUMNS) <= _columns(inspector, table):
        return False
    return connection.execute(sa.select(_unrepaired_route_rows().exists())).scalar_one() is True


def _unretired_disbanded(connection: Connection, _inspector: sa.Inspector, present: frozenset[str]) -> bool:
    if "hosted_rooms" not in present:
        return False
    pending = _disbanded_rooms()
    if "hosted_room_retired_ids" in present:
        pending = pending.where(~_retired(schema.rooms.c.room_id))
    return connection.execute(sa.select(pending.exists())).scalar_one() is True


def _reference_layout(_connection: Connection, inspector: sa.Inspector, present: frozenset[str]) -> bool:
    return any(not made_by_hostedrooms(inspector, table) for table in present)


_TRAITS: tuple[tuple[str, Callable[[Connection, sa.Inspector, frozenset[str]], bool]], ...] = (
    ("draft_rooms", _lacks("hosted_rooms", ROOM_DRAFT_COLUMNS["hosted_rooms"])),
    ("draft_events", _lacks("hosted_room_events", ROOM_DRAFT_COLUMNS["hosted_room_events"])),
    ("remote_run_key", _old_remote_run_key),
    ("unretired_disbanded", _unretired_disbanded),
    ("delivery_columns", _lacks("secure_peer_deliveries", [name for name, _, _ in DELIVERY_LATER_COLUMNS])),
    ("outbound_columns", _lacks("secure_peer_outbound_intents", OUTBOUND_ROUTE_COLUMNS)),
    ("outbound_routes", _unrepaired_routes),
    ("reference_layout", _reference_layout),
)


def made_by_hostedrooms(inspector: sa.Inspector, table: str) -> bool:
    """Whether ``table`` carries hostedrooms' named primary key (the reference never named constraints)."""
    return inspector.get_pk_constraint(table).get("name") == f"pk_{table}"


def remote_run_key_is_current(inspector: sa.Inspector) -> bool:
    """The reference's test: every identity column present and the primary key in identity order."""
    table = schema.remote_runs
    key = tuple(inspector.get_pk_constraint(table.name).get("constrained_columns") or ())
    return set(table.c.keys()) <= _columns(inspector, table.name) and key == tuple(table.primary_key.columns.keys())


# --- revision steps ----------------------------------------------------------------------------------------


def _bind(op: Operations) -> Connection | None:
    """The live connection, or None when Alembic renders SQL offline (adoption needs a real database)."""
    if op.get_context().as_sql:
        return None
    return op.get_bind()


def create_baseline(op: Operations) -> None:
    """0001: create the baseline tables (and their indexes) the database does not have yet: all when fresh."""
    connection = _bind(op)
    missing = {table.name for table in schema.TABLES}
    if connection is not None:
        generation = detect_generation(connection)
        if generation.kind != EMPTY:
            log.info("adopting a %s hostedrooms database (traits: %s)", generation.kind,
                     ", ".join(sorted(generation.traits)) or "none")
        missing = set(generation.missing)
    for table in schema.TABLES:
        if table.name in missing:
            op.execute(sa.schema.CreateTable(table))
            for index in sorted(table.indexes, key=lambda index: str(index.name)):
                op.execute(sa.schema.CreateIndex(index))


def add_room_columns(op: Operations) -> None:
    """Draft layouts: add the authority/actor columns; backfill ``event_bytes`` when it is new."""
    connection = _bind(op)
    if connection is None:
        return
    inspector = sa.inspect(connection)
    added: set[str] = set()
    for table, columns in _room_draft_columns().items():
        if not inspector.has_table(table):
            continue
        existing = _columns(inspector, table)
        for column in columns:
            if column.name not in existing:
                op.add_column(table, column)
                added.add(f"{table}.{column.name}")
    if "hosted_rooms.event_bytes" in added:
        backfill_event_bytes(connection)


def backfill_event_bytes(connection: Connection) -> None:
    """Set each room's ``event_bytes`` from its events, a batch of rooms per statement (SQLite streams it)."""
    rooms, events = schema.rooms, schema.events
    per_event = (Utf8Length(events.c.event_id) + Utf8Length(events.c.kind) + Utf8Length(events.c.actor_json)
                 + Utf8Length(events.c.payload_json))
    total = sa.select(sa.func.coalesce(sa.func.sum(per_event), 0)).where(
        events.c.room_id == rooms.c.room_id).scalar_subquery()
    for batch in _key_batches(connection, rooms.c.room_id):
        connection.execute(sa.update(rooms).where(rooms.c.room_id.in_(batch)).values(event_bytes=total))


def rebuild_remote_runs(op: Operations) -> None:
    """Old receipts: rebuild with the 9-column identity key (missing values 'legacy', 'legacy', 1).

    Rows that collide under the new key keep the first one, as the reference does (``INSERT OR IGNORE``).
    """
    connection = _bind(op)
    if connection is None:
        return
    inspector = sa.inspect(connection)
    if not inspector.has_table("hosted_room_remote_runs") or remote_run_key_is_current(inspector):
        return
    rebuild_tables(connection, [schema.remote_runs], skip_duplicates=True)


def _disbanded_rooms() -> sa.Select[Any]:
    rooms = schema.rooms
    return sa.select(rooms.c.room_id, rooms.c.disbanded_at).where(rooms.c.disbanded_at.is_not(None))


def _retired(room_id: sa.ColumnElement[Any]) -> sa.Exists:
    retired = schema.retired_ids
    return sa.select(retired.c.room_id).where(retired.c.room_id == room_id).exists()


def retire_disbanded_rooms(op: Operations) -> None:
    """Old layouts kept a disbanded room's identity only in ``hosted_rooms``: copy it to the retired ids."""
    connection = _bind(op)
    if connection is None:
        return
    # Room ids are unique, so skipping those already retired is the reference's INSERT OR IGNORE, portably.
    pending = _disbanded_rooms().where(~_retired(schema.rooms.c.room_id))
    connection.execute(sa.insert(schema.retired_ids).from_select(["room_id", "retired_at"], pending))


def add_ledger_columns(op: Operations) -> None:
    """Secure-peer ledgers: add the later delivery and outbound columns, then backfill the outbound routes."""
    connection = _bind(op)
    if connection is None:
        return
    inspector = sa.inspect(connection)
    if inspector.has_table("secure_peer_deliveries"):
        existing = _columns(inspector, "secure_peer_deliveries")
        for name, type_, default in DELIVERY_LATER_COLUMNS:
            if name not in existing:
                op.add_column("secure_peer_deliveries", sa.Column(
                    name, type_, nullable=default is None,
                    server_default=None if default is None else sa.text(default)))
    if inspector.has_table("secure_peer_outbound_intents"):
        existing = _columns(inspector, "secure_peer_outbound_intents")
        for name in OUTBOUND_ROUTE_COLUMNS:
            if name not in existing:
                op.add_column("secure_peer_outbound_intents", sa.Column(name, sa.Text(), nullable=True))
        backfill_outbound_routes(connection)


def _unrepaired_route_rows() -> sa.Select[Any]:
    intents = schema.outbound_intents
    return sa.select(intents.c.request_id, intents.c.snapshot_json).where(
        sa.or_(*(intents.c[name].is_(None) for name in OUTBOUND_ROUTE_COLUMNS)))


def route_from_snapshot(snapshot_json: Any) -> tuple[str, str, str] | None:
    """The reference's reading of a legacy snapshot: the three route fields, or None (fail closed)."""
    try:
        snapshot = json.loads(snapshot_json)
        route = tuple(str(snapshot.get(name) or "") for name in OUTBOUND_ROUTE_COLUMNS)
    except Exception:  # the reference fails closed on anything a malformed snapshot raises
        return None
    if not all(route):
        return None
    return route[0], route[1], route[2]


def backfill_outbound_routes(connection: Connection) -> None:
    """Fill NULL route columns from ``snapshot_json``; a malformed snapshot fails the intent closed."""
    intents = schema.outbound_intents
    last: str | None = None
    while True:
        query = _unrepaired_route_rows().order_by(intents.c.request_id).limit(BATCH_SIZE)
        if last is not None:
            query = query.where(intents.c.request_id > last)
        rows = connection.execute(query).all()
        if not rows:
            return
        for request_id, snapshot_json in rows:
            route = route_from_snapshot(snapshot_json)
            where = intents.c.request_id == request_id
            if route is None:
                connection.execute(sa.update(intents).where(where).values(
                    state="failed", retry_at=None, last_error=LEGACY_ROUTE_ERROR,
                    **dict.fromkeys(OUTBOUND_ROUTE_COLUMNS, "")))
            else:
                connection.execute(sa.update(intents).where(where).values(
                    dict(zip(OUTBOUND_ROUTE_COLUMNS, route, strict=True))))
        last = rows[-1][0]


def conform_reference_tables(op: Operations) -> None:
    """Rebuild every table the reference created into the baseline layout (named constraints, indexes)."""
    connection = _bind(op)
    if connection is None:
        return
    inspector = sa.inspect(connection)
    tables = [table for table in schema.metadata.sorted_tables
              if inspector.has_table(table.name) and not made_by_hostedrooms(inspector, table.name)]
    if tables:
        rebuild_tables(connection, tables)


def downgrade_note(step: str) -> None:
    """Legacy steps have no schema to undo: say so instead of pretending to restore a legacy layout."""
    log.info("%s: nothing to undo in the baseline layout; an adopted database keeps its adopted rows and is "
             "not returned to the reference's legacy layout (that layout was never versioned)", step)


# --- table rebuild -----------------------------------------------------------------------------------------


def _key_batches(connection: Connection, key: sa.ColumnElement[Any]) -> Iterator[list[Any]]:
    """Yield lists of ``key`` values in ascending order, BATCH_SIZE at a time (keyset pagination)."""
    last: Any = None
    while True:
        query = sa.select(key).order_by(key).limit(BATCH_SIZE)
        if last is not None:
            query = query.where(key > last)
        batch = list(connection.execute(query).scalars())
        if not batch:
            return
        yield batch
        last = batch[-1]


def _fallback(table: Table, column: sa.Column[Any]) -> sa.ColumnElement[Any] | None:
    key = (table.name, column.name)
    if key in LEGACY_FALLBACKS:
        return sa.literal(LEGACY_FALLBACKS[key])
    default = column.server_default
    if isinstance(default, sa.DefaultClause) and isinstance(default.arg, sa.TextClause):
        return sa.literal_column(default.arg.text)
    return None


def _value(table: Table, column: sa.Column[Any], hold: sa.TableClause) -> sa.ColumnElement[Any]:
    fallback = _fallback(table, column)
    if column.name in hold.c:
        value: sa.ColumnElement[Any] = hold.c[column.name]
        return value if fallback is None or column.nullable else sa.func.coalesce(value, fallback)
    if fallback is None:
        raise HostedRoomError(f"cannot adopt legacy table {table.name}: column {column.name} is missing")
    return fallback


def _foreign_objects(connection: Connection, table: Table) -> list[str]:
    """DDL of indexes and triggers on ``table`` that are not hostedrooms' (a host's): kept across the rebuild."""
    master = sa.table("sqlite_master", sa.column("type"), sa.column("name"), sa.column("tbl_name"), sa.column("sql"))
    ours = {index.name for index in table.indexes}
    rows = connection.execute(sa.select(master.c.name, master.c.sql).where(
        master.c.tbl_name == table.name, master.c.type.in_(["index", "trigger"]), master.c.sql.is_not(None)))
    return [str(sql) for name, sql in rows if name not in ours]


def rebuild_tables(connection: Connection, tables: Sequence[Table], *, skip_duplicates: bool = False) -> None:
    """Rebuild legacy SQLite ``tables`` into their baseline layout, keeping every row.

    Rows are parked in holding tables, the originals dropped (children first), the baseline tables created and
    refilled (parents first), then the host's own indexes/triggers on them restored. Dropping and recreating
    (rather than renaming) keeps other tables' foreign keys and views pointing at the same names; with
    ``defer_foreign_keys`` a host table referencing ours is re-parented before the transaction commits.
    """
    if not isinstance(connection.dialect, SQLiteDialect):  # reference databases are SQLite files
        raise HostedRoomError("legacy table layouts can only be adopted from SQLite databases")
    order = [table for table in schema.metadata.sorted_tables if table in tables]
    connection.exec_driver_sql("PRAGMA defer_foreign_keys=ON")  # resets when the transaction ends
    inspector = sa.inspect(connection)
    holds: dict[str, sa.TableClause] = {}
    kept: dict[str, list[str]] = {}
    for table in order:
        existing = [column["name"] for column in inspector.get_columns(table.name)]
        unknown = sorted(set(existing) - set(table.c.keys()))
        if unknown:
            raise HostedRoomError(
                f"cannot adopt legacy table {table.name}: unknown columns {', '.join(unknown)} would be lost")
        source = sa.table(table.name, *(sa.column(name) for name in existing))
        hold = sa.table(HOLD_PREFIX + table.name, *(sa.column(name) for name in existing))
        kept[table.name] = _foreign_objects(connection, table)
        connection.execute(sa.schema.DropTable(sa.Table(hold.name, sa.MetaData()), if_exists=True))
        connection.execute(sa.CreateTableAs(
            sa.select(*source.c).order_by(sa.literal_column("rowid")), hold.name))
        holds[table.name] = hold
    for table in reversed(order):
        connection.execute(sa.schema.DropTable(sa.Table(table.name, sa.MetaData())))
    for table in order:
        connection.execute(sa.schema.CreateTable(table))
        _refill(connection, table, holds[table.name], skip_duplicates=skip_duplicates)
        for index in table.indexes:
            index.create(connection)
        for ddl in kept[table.name]:
            connection.exec_driver_sql(ddl)
        connection.execute(sa.schema.DropTable(sa.Table(holds[table.name].name, sa.MetaData())))


def _refill(connection: Connection, table: Table, hold: sa.TableClause, *, skip_duplicates: bool) -> None:
    names = list(table.c.keys())
    rows = sa.select(*(_value(table, table.c[name], hold) for name in names)).select_from(hold)
    rows = rows.where(sa.true()).order_by(sa.literal_column("rowid"))  # WHERE: SQLite's upsert parse rule
    statement = sqlite.insert(table).from_select(names, rows)
    if skip_duplicates:
        statement = statement.on_conflict_do_nothing(index_elements=list(table.primary_key.columns.keys()))
    try:
        inserted = connection.execute(statement).rowcount
    except sa_exc.IntegrityError as exc:
        raise HostedRoomError(f"cannot adopt legacy table {table.name}: {exc.orig}") from exc
    total = connection.execute(sa.select(sa.func.count()).select_from(hold)).scalar_one()
    if inserted != total:
        log.warning("%s: %d legacy rows collided under the new key and were dropped, as the reference does",
                    table.name, total - inserted)

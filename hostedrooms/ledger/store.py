"""The ledger's store: every statement of the delivery ledger, one :class:`LedgerStore` per backend.

The services (:mod:`.deliveries`, :mod:`.responses`, :mod:`.outbound`, :mod:`.retries`, :mod:`.retention`) hold
the rules and call the store with their unit of work's connection; the store owns the SQL and how it runs (a
retry machine describes its guarded updates, the store compiles and runs them). Single-row statements
(lookups by key, the guarded ``UPDATE ... RETURNING`` transitions, inserts) are :class:`~hostedrooms.statements.
HotStatement`\\ s, compiled once per engine and run on the unit's cursor; their rows come back as plain dicts
keyed by column name (what ``Result.mappings()`` would give). Driver errors arrive wrapped as from ``execute()``
and SQLAlchemy's cursor events fire; its statement-level events (``before_execute``) do not, for these. Listings
and pruning run through ``Connection.execute`` (their plans vary with their filters and limits).

:meth:`LedgerStore.without_fast_path` is the switch the agreement tests use (``tests/test_ledger_paths.py``):
inside it every statement runs through ``Connection.execute`` and the services skip their one-statement
attempts, taking the full path (read the row, then decide), as before the store existed.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator, Mapping, Sequence
from typing import Any, cast

from sqlalchemy import (
    BindParameter,
    ColumnElement,
    Connection,
    CursorResult,
    Executable,
    Select,
    Table,
    bindparam,
    delete,
    func,
    select,
    update,
)

from ..backends import Backend
from ..models import deliveries, outbound_intents
from ..statements import HotStatement
from ..wakeup import LEDGER_WORK_CHANNEL
from .claims import ACTIVE_DELIVERY_STATES, EXPIRED_ERROR, NONTERMINAL_DELIVERY_STATES, PREPARE_LOCK_KEY

D = deliveries
OUT = outbound_intents

#: A row as the store returns it: column name -> value.
Row = dict[str, Any]


def one_of(column: ColumnElement[Any], values: Sequence[str], name: str) -> ColumnElement[bool]:
    """``column IN (values)`` with one bound parameter per value (named ``<name>_<i>``, each carrying its value),
    so the statement compiles to one fixed text (an ``IN`` list expands per call otherwise)."""
    return column.in_([bindparam(f"{name}_{index}", value) for index, value in enumerate(values)])


#: The states a delivery may hold a response intent in, and the unfinished ones.
ADMITTED = one_of(D.c.state, ACTIVE_DELIVERY_STATES, "admitted")
UNFINISHED = one_of(D.c.state, NONTERMINAL_DELIVERY_STATES, "unfinished")
#: An authorized delivery no queue entry or run owns yet: it awaits admission.
OWNERLESS = (D.c.state == "authorized", D.c.queued_id.is_(None), D.c.run_id.is_(None))
#: A response intent that may still change: set on an admitted delivery, not yet committed.
RESPONSE_WAITING = (ADMITTED, D.c.response_request_id.is_not(None), D.c.response_committed == 0)
#: A pending outbound intent.
OUTBOUND_WAITING = (OUT.c.state == "pending",)

_BY_ENVELOPE = D.c.envelope_id == bindparam("key")
_BY_REQUEST = OUT.c.request_id == bindparam("key")

# prepare(): fail expired prepared rows, count what is in flight, insert.
_EXPIRE_PREPARED = (update(D).where(D.c.state == "prepared", D.c.expires_at <= bindparam("now"))
                    .values(state="failed", error=EXPIRED_ERROR, updated_at=bindparam("now")))
_IN_FLIGHT = select(func.count()).select_from(D).where(UNFINISHED)
#: The columns prepare() inserts (the others take their defaults).
DELIVERY_INSERT_COLUMNS = (
    "envelope_id", "request_id", "transport_role", "connection_id", "lease_token", "team_id", "source_peer_id",
    "source_server_identity", "source_route_id", "source_route_revision", "target_peer_id",
    "target_server_identity", "target_route_id", "target_route_revision", "target_chat_id", "action", "kind",
    "exchange_id", "parent_envelope_id", "parent_leg", "used_legs", "max_legs", "expires_at", "claim_digest",
    "body_json", "state", "created_at", "updated_at")
# The same insert, made only while fewer than ``capacity`` deliveries are unfinished (the count and the insert in
# one statement; the values are typed, as a SELECT list needs on PostgreSQL).
_INSERT_WITHIN_CAPACITY = D.insert().from_select(
    list(DELIVERY_INSERT_COLUMNS),
    select(*(bindparam(name, type_=D.c[name].type) for name in DELIVERY_INSERT_COLUMNS))
    .where(_IN_FLIGHT.scalar_subquery() < bindparam("capacity"))).returning(*D.c)
# Counts are far below this: a capacity beyond it admits as any larger one would (and still binds as 64 bits).
_CAPACITY_BOUND = 2**62
# prepare() of a known envelope still prepared: its new lease token.
_REFRESH_LEASE = (
    update(D).where(_BY_ENVELOPE, D.c.state == "prepared", D.c.claim_digest == bindparam("digest"))
    .values(lease_token=bindparam("lease"), updated_at=bindparam("now")).returning(*D.c))
# bind_owner(): an ownerless authorized delivery gets its owner; a queued one its run.
_BIND_AUTHORIZED = (
    update(D).where(_BY_ENVELOPE, *OWNERLESS)
    .values(state=bindparam("set_state"), queued_id=bindparam("set_queued_id"), run_id=bindparam("set_run_id"),
            admission_retry_at=None, admission_last_error=None, updated_at=bindparam("now"))
    .returning(*D.c))
_BIND_RUN = (
    update(D).where(_BY_ENVELOPE, D.c.state == "queued", D.c.queued_id == bindparam("bound_queued_id"),
                    D.c.run_id.is_(None))
    .values(state="running", run_id=bindparam("set_run_id"), admission_retry_at=None, admission_last_error=None,
            updated_at=bindparam("now"))
    .returning(*D.c))
# Response intents: prepare (the guard on the locked row), commit (any, or one request's), clear.
_RESPONSE_OPEN = (D.c.response_request_digest.is_(None), D.c.response_committed == 0, ADMITTED)
_RESPONSE_VALUES = dict(
    response_request_id=bindparam("request"), response_request_digest=bindparam("digest"),
    response_body=bindparam("body"), response_request_response=bindparam("request_response"),
    response_retry_at=bindparam("now"), response_attempts=0, response_last_error=None, updated_at=bindparam("now"))
_PREPARE_RESPONSE = update(D).where(_BY_ENVELOPE, *_RESPONSE_OPEN).values(**_RESPONSE_VALUES).returning(*D.c)
# The same with the one condition prepare_response() otherwise reads first: a request delivery, not an instruction.
_PREPARE_RESPONSE_DIRECT = (update(D).where(_BY_ENVELOPE, *_RESPONSE_OPEN, D.c.kind != "instruction")
                            .values(**_RESPONSE_VALUES).returning(*D.c))
_COMMIT_RESPONSE_ANY = (
    update(D).where(_BY_ENVELOPE, ADMITTED, D.c.response_committed == 0)
    .values(response_committed=1, response_retry_at=None, response_last_error=None, updated_at=bindparam("now"))
    .returning(*D.c))
_COMMIT_RESPONSE = _COMMIT_RESPONSE_ANY.where(D.c.response_request_id == bindparam("request"))
_CLEAR_RESPONSE = (
    update(D).where(_BY_ENVELOPE, D.c.response_request_id == bindparam("request"), D.c.response_committed == 0,
                    ADMITTED)
    .values(response_request_id=None, response_request_digest=None, response_body=None,
            response_request_response=None, response_retry_at=None, response_attempts=0,
            response_last_error=None, updated_at=bindparam("now"))
    .returning(*D.c))
# Outbound intents: fail the expired before a listing; store the Hub's response.
_EXPIRE_PENDING = (update(OUT).where(OUT.c.state == "pending", OUT.c.expires_at <= bindparam("now"))
                   .values(state="failed", retry_at=None, last_error=EXPIRED_ERROR, updated_at=bindparam("now")))
#: The columns prepare_outbound() inserts.
OUTBOUND_INSERT_COLUMNS = (
    "request_id", "source_session_id", "source_run_id", "body", "action", "expires_at", "connection_id",
    "source_route_id", "source_route_revision", "intent_digest", "snapshot_json", "state", "retry_at",
    "created_at", "updated_at")
_COMMIT_OUTBOUND = (
    update(OUT).where(_BY_REQUEST, OUT.c.state == "pending")
    .values(state="committed", response_json=bindparam("response"), retry_at=None, last_error=None,
            updated_at=bindparam("now"))
    .returning(*OUT.c))
_PRUNE_DELIVERIES = delete(D).where(D.c.state.in_(("completed", "failed")), D.c.updated_at < bindparam("cutoff"))
_PRUNE_OUTBOUND = delete(OUT).where(OUT.c.state.in_(("committed", "failed")), OUT.c.updated_at < bindparam("cutoff"))

#: Where the caller's error text goes in a retry machine's failure values.
ERROR: BindParameter[Any] = bindparam("v_error")


class _Returning:
    """A hot single-row statement whose rows come back as dicts of ``table``'s columns."""

    __slots__ = ("core", "hot", "names")

    def __init__(self, statement: Any, table: Table, *, column_keys: Sequence[str] | None = None) -> None:
        self.core: Executable = statement
        self.hot = HotStatement(statement, column_keys=column_keys)
        self.names = tuple(column.name for column in table.c)


class LedgerStore:
    """Every statement of the delivery ledger on one backend (get it with :func:`ledger_store`)."""

    #: Tests only (see :meth:`without_fast_path`).
    fast_path = True

    def __init__(self, backend: Backend) -> None:
        self.backend = backend
        lock = backend.for_update
        self._delivery = _Returning(select(D).where(_BY_ENVELOPE), D)
        self._lock_delivery = _Returning(lock(select(D).where(_BY_ENVELOPE)), D)
        self._delivery_of_run = _Returning(select(D).where(D.c.run_id == bindparam("key")), D)
        self._outbound = _Returning(select(OUT).where(_BY_REQUEST), OUT)
        self._lock_outbound = _Returning(lock(select(OUT).where(_BY_REQUEST)), OUT)
        self._expire_prepared = HotStatement(_EXPIRE_PREPARED)
        self._in_flight = HotStatement(_IN_FLIGHT)
        self._insert_delivery = _Returning(D.insert().returning(*D.c), D, column_keys=DELIVERY_INSERT_COLUMNS)
        self._insert_within_capacity = _Returning(_INSERT_WITHIN_CAPACITY, D)
        self._refresh_lease = _Returning(_REFRESH_LEASE, D)
        self._bind_authorized = _Returning(_BIND_AUTHORIZED, D)
        self._bind_run = _Returning(_BIND_RUN, D)
        self._prepare_response = _Returning(_PREPARE_RESPONSE, D)
        self._prepare_response_direct = _Returning(_PREPARE_RESPONSE_DIRECT, D)
        self._commit_response = {False: _Returning(_COMMIT_RESPONSE, D), True: _Returning(_COMMIT_RESPONSE_ANY, D)}
        self._clear_response = _Returning(_CLEAR_RESPONSE, D)
        self._expire_pending = HotStatement(_EXPIRE_PENDING)
        # ON CONFLICT DO NOTHING: a concurrent prepare of the same id (PostgreSQL) returns no row and becomes a
        # replay (psycopg reports no rowcount for it).
        self._insert_outbound = _Returning(
            backend.insert(OUT).on_conflict_do_nothing(index_elements=["request_id"]).returning(*OUT.c), OUT,
            column_keys=OUTBOUND_INSERT_COLUMNS)
        self._commit_outbound = _Returning(_COMMIT_OUTBOUND, OUT)
        self._shapes: dict[Any, _Returning] = {}
        self._shaping = threading.Lock()

    @contextlib.contextmanager
    def without_fast_path(self) -> Iterator[None]:
        """Tests only: inside the block every statement runs through ``Connection.execute`` and the services take
        their full paths (the agreement tests compare both)."""
        previous, self.fast_path = self.fast_path, False
        try:
            yield
        finally:
            self.fast_path = previous

    # -- running statements

    def _rows(self, statement: _Returning, connection: Connection, params: Mapping[str, Any]) -> list[Row]:
        if not self.fast_path:
            return [dict(row) for row in connection.execute(statement.core, params).mappings()]
        cursor = statement.hot.run(connection, params)
        try:
            found = cursor.fetchall()
        finally:
            cursor.close()
        names = statement.names
        return [dict(zip(names, row, strict=True)) for row in found]

    def _row(self, statement: _Returning, connection: Connection, params: Mapping[str, Any]) -> Row | None:
        if not self.fast_path:
            found = connection.execute(statement.core, params).mappings().first()
            return None if found is None else dict(found)
        row = statement.hot.first(connection, params)
        return None if row is None else dict(zip(statement.names, row, strict=True))

    def _scalar(self, statement: HotStatement, connection: Connection, params: Mapping[str, Any]) -> Any:
        if not self.fast_path:
            return connection.execute(cast(Executable, statement.statement), params).scalar_one()
        row = statement.first(connection, params)
        assert row is not None
        return row[0]

    def _run(self, statement: HotStatement, connection: Connection, params: Mapping[str, Any]) -> None:
        if not self.fast_path:
            connection.execute(cast(Executable, statement.statement), params)
            return
        statement.rowcount(connection, params)

    def _shaped(self, key: Any, build: Any) -> _Returning:
        """The statement of one shape (``key``), built by ``build()`` the first time it is asked."""
        found = self._shapes.get(key)
        if found is None:
            with self._shaping:
                found = self._shapes.get(key)
                if found is None:
                    found = self._shapes[key] = build()
        return found

    # -- locks and wake-ups

    def serialize_prepares(self, connection: Connection) -> None:
        """One prepare at a time, so its capacity count cannot be raced (SQLite: BEGIN IMMEDIATE already does)."""
        self.backend.advisory_lock(connection, PREPARE_LOCK_KEY)

    def wake(self, connection: Connection, work: str) -> None:
        """Wake the ledger's waiters when this transaction commits: ``work`` became due."""
        self.backend.notify(connection, LEDGER_WORK_CHANNEL, work)

    # -- deliveries

    def delivery(self, connection: Connection, envelope_id: str, *, lock: bool = False) -> Row | None:
        """The delivery row of ``envelope_id`` (locked until the transaction ends with ``lock``), or None."""
        return self._row(self._lock_delivery if lock else self._delivery, connection, {"key": envelope_id})

    def delivery_of_run(self, connection: Connection, run_id: str) -> Row | None:
        """The delivery row run ``run_id`` owns, or None."""
        return self._row(self._delivery_of_run, connection, {"key": run_id})

    def expire_prepared(self, connection: Connection, now: int) -> None:
        """Fail the prepared deliveries whose exchange expired by ``now``."""
        self._run(self._expire_prepared, connection, {"now": now})

    def in_flight(self, connection: Connection) -> int:
        """How many deliveries are unfinished."""
        return int(self._scalar(self._in_flight, connection, {}))

    def insert_delivery(self, connection: Connection, values: Mapping[str, Any]) -> Row:
        """Insert a delivery (DELIVERY_INSERT_COLUMNS); return the stored row."""
        row = self._row(self._insert_delivery, connection, values)
        assert row is not None
        return row

    def insert_delivery_within(self, connection: Connection, values: Mapping[str, Any], capacity: int) -> Row | None:
        """Insert a delivery (DELIVERY_INSERT_COLUMNS) while fewer than ``capacity`` are unfinished: what
        :meth:`in_flight` and :meth:`insert_delivery` do, in one statement. The stored row, or None (full)."""
        bounded = max(0, min(capacity, _CAPACITY_BOUND))  # (no count is below 0 or reaches the bound)
        return self._row(self._insert_within_capacity, connection, {**values, "capacity": bounded})

    def refresh_lease(self, connection: Connection, envelope_id: str, *, digest: str, lease: str,
                      now: int) -> Row | None:
        """Give a still prepared delivery of claim ``digest`` its new lease token; the row, or None."""
        return self._row(self._refresh_lease, connection,
                         {"key": envelope_id, "digest": digest, "lease": lease, "now": now})

    def transition(self, connection: Connection, envelope_id: str, *, expected: tuple[str, ...],
                   values: Mapping[str, Any], now: int) -> Row | None:
        """``UPDATE ... SET <values>, updated_at WHERE envelope_id AND state IN <expected> RETURNING *``: the
        changed row, or None when the delivery was not in ``expected``."""
        names = tuple(sorted(values))

        def build() -> _Returning:
            statement = (update(D).where(_BY_ENVELOPE, one_of(D.c.state, expected, "expected"))
                         .values({name: bindparam(f"set_{name}") for name in (*names, "updated_at")})
                         .returning(*D.c))
            return _Returning(statement, D)

        params = {"key": envelope_id, "set_updated_at": now, **{f"set_{name}": values[name] for name in names}}
        return self._row(self._shaped(("transition", expected, names), build), connection, params)

    def bind_authorized(self, connection: Connection, envelope_id: str, *, queued_id: str | None,
                        run_id: str | None, now: int) -> Row | None:
        """An ownerless authorized delivery becomes ``queued`` (no run) or ``running``; the row, or None."""
        return self._row(self._bind_authorized, connection, {
            "key": envelope_id, "set_state": "running" if run_id is not None else "queued",
            "set_queued_id": queued_id, "set_run_id": run_id, "now": now})

    def bind_run(self, connection: Connection, envelope_id: str, *, queued_id: str, run_id: str,
                 now: int) -> Row | None:
        """A queued delivery of entry ``queued_id`` with no run becomes ``running`` under ``run_id``; the row,
        or None."""
        return self._row(self._bind_run, connection, {
            "key": envelope_id, "bound_queued_id": queued_id, "set_run_id": run_id, "now": now})

    # -- response intents

    def prepare_response(self, connection: Connection, envelope_id: str, *, direct: bool,
                         params: Mapping[str, Any]) -> Row | None:
        """Set a response intent (``request``, ``digest``, ``body``, ``request_response``, ``now``) on an admitted
        delivery that has none; ``direct`` also requires a request delivery (the check a caller that has not read
        the row needs). The changed row, or None."""
        statement = self._prepare_response_direct if direct else self._prepare_response
        return self._row(statement, connection, {**params, "key": envelope_id})

    def commit_response(self, connection: Connection, envelope_id: str, *, request_id: str | None,
                        now: int) -> list[Row]:
        """Mark the uncommitted response intent (``request_id``'s, or any) committed; the changed rows."""
        return self._rows(self._commit_response[request_id is None], connection,
                          {"key": envelope_id, "request": request_id, "now": now})

    def clear_response(self, connection: Connection, envelope_id: str, *, request_id: str, now: int) -> Row | None:
        """Drop the uncommitted response intent ``request_id``; the changed row, or None."""
        return self._row(self._clear_response, connection, {"key": envelope_id, "request": request_id, "now": now})

    # -- outbound intents

    def outbound(self, connection: Connection, request_id: str, *, lock: bool = False) -> Row | None:
        """The outbound intent row of ``request_id`` (locked until the transaction ends with ``lock``), or None."""
        return self._row(self._lock_outbound if lock else self._outbound, connection, {"key": request_id})

    def insert_outbound(self, connection: Connection, values: Mapping[str, Any]) -> Row | None:
        """Insert an outbound intent (OUTBOUND_INSERT_COLUMNS); the stored row, or None when the id exists."""
        return self._row(self._insert_outbound, connection, values)

    def commit_outbound(self, connection: Connection, request_id: str, *, response: str, now: int) -> Row | None:
        """Store the Hub's response of a pending intent; the changed row, or None when it is not pending."""
        return self._row(self._commit_outbound, connection, {"key": request_id, "response": response, "now": now})

    def expire_pending(self, connection: Connection, now: int) -> None:
        """Fail the pending outbound intents whose exchange expired by ``now``."""
        self._run(self._expire_pending, connection, {"now": now})

    # -- retries (hostedrooms.ledger.retries)

    def retry_waiting(self, connection: Connection, spec: Any, params: Mapping[str, Any]) -> Row | None:
        """A retry machine's (``spec``: a RetryMachine) guarded retry; the changed row, or None."""
        statement = self._shaped(("retry", spec.name), lambda: _Returning(spec.retry_statement(), spec.table))
        return self._row(statement, connection, params)

    def retry_directly(self, connection: Connection, spec: Any, params: Mapping[str, Any]) -> Row | None:
        """A retry machine's retry as one statement (counting attempts in SQL); the changed row, or None."""
        statement = self._shaped(("retry_directly", spec.name),
                                 lambda: _Returning(spec.retry_direct_statement(), spec.table))
        return self._row(statement, connection, params)

    def fail_waiting(self, connection: Connection, spec: Any, params: Mapping[str, Any]) -> Row | None:
        """A retry machine's guarded failure; the changed row, or None."""
        statement = self._shaped(("fail", spec.name), lambda: _Returning(spec.fail_statement(), spec.table))
        return self._row(statement, connection, params)

    # -- listings and pruning

    def order(self, table: Table, *first: Any) -> list[Any]:
        """``first``, then creation time, then the key in code-point order (as SQLite sorts it)."""
        key = table.c.envelope_id if table is D else table.c.request_id
        return [*first, table.c.created_at, self.backend.bytewise(key)]

    def deliveries_where(self, *conditions: ColumnElement[bool]) -> Select[Any]:
        """The unfinished deliveries matching ``conditions``, oldest first."""
        return select(D).where(*conditions, D.c.state.in_(NONTERMINAL_DELIVERY_STATES)).order_by(*self.order(D))

    def pending_outbound_where(self, *conditions: ColumnElement[bool]) -> Select[Any]:
        """The pending outbound intents matching ``conditions``, oldest first."""
        return select(OUT).where(OUT.c.state == "pending", *conditions).order_by(*self.order(OUT))

    def due(self, spec: Any, now: int) -> Select[Any]:
        """A retry machine's waiting rows whose retry is due at ``now``: soonest first, then oldest."""
        due = func.coalesce(spec.table.c[spec.retry_at], 0)
        return select(spec.table).where(*spec.waiting, due <= now).order_by(*self.order(spec.table, due))

    def backlog(self, connection: Connection) -> dict[tuple[str, str], int]:
        """The non-terminal rows by ``(table, state)``, zeros included (see ``DeliveryLedger.backlog``)."""
        counts = {("deliveries", state): 0 for state in NONTERMINAL_DELIVERY_STATES}
        counts["outbound", "pending"] = 0
        for table, column, states in (("deliveries", deliveries.c.state, NONTERMINAL_DELIVERY_STATES),
                                      ("outbound", outbound_intents.c.state, ("pending",))):
            statement = select(column, func.count()).where(column.in_(states)).group_by(column)
            for state, count in connection.execute(statement):
                counts[table, str(state)] = int(count)
        return counts

    def prune(self, connection: Connection, cutoff: int) -> int:
        """Delete finished deliveries and intents last changed before ``cutoff``; return how many."""
        removed = 0
        for statement in (_PRUNE_DELIVERIES, _PRUNE_OUTBOUND):
            result: CursorResult[Any] = connection.execute(statement, {"cutoff": cutoff})
            removed += int(result.rowcount or 0)
        return removed


_stores: dict[str, LedgerStore] = {}
_building = threading.Lock()


def ledger_store(backend: Backend) -> LedgerStore:
    """The one :class:`LedgerStore` of ``backend``'s backend (built, with its statements, on first use)."""
    store = _stores.get(backend.name)
    if store is None:
        with _building:
            store = _stores.get(backend.name)
            if store is None:
                store = _stores[backend.name] = LedgerStore(backend)
    return store

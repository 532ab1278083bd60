"""The ledger's store: every statement of the delivery ledger, its states and its advisory key.

The services (:mod:`hostedrooms.ledger`'s deliveries, responses, outbound, retries and retention) hold the rules and
reach the store from their unit of work as ``uow.ledger``: a :class:`LedgerStore` bound to the unit's connection.
It owns the SQL and how it runs (a retry machine describes its guarded updates, the store compiles and runs them).
Single-row statements (lookups by key, the guarded ``UPDATE ... RETURNING`` transitions, inserts) are
:class:`~hostedrooms.statements.HotStatement`\\ s, compiled once per backend (:class:`LedgerStatements`) and run on
the unit's cursor; their rows come back as plain dicts keyed by column name (what ``Result.mappings()`` would
give). Driver errors arrive wrapped as from ``execute()`` and SQLAlchemy's cursor events fire; its
statement-level events (``before_execute``) do not, for these. Listings and pruning run through
``Connection.execute`` (their plans vary with their filters and limits).

:meth:`LedgerStatements.without_one_statement` is the switch the agreement tests use
(``tests/services/test_ledger_paths.py``): inside it every statement runs through ``Connection.execute`` and the
services skip their one-statement attempts, taking the full path (read the row, then decide).
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any, Protocol, cast

from sqlalchemy import (
    BigInteger,
    BindParameter,
    ColumnElement,
    Connection,
    CursorResult,
    Executable,
    Select,
    Table,
    bindparam,
    case,
    delete,
    func,
    select,
    update,
)

from ..advisory_keys import PREPARE_LOCK_KEY
from ..backends import LEDGER_WORK_CHANNEL, Backend
from ..models import deliveries, outbound_intents
from ..statements import HotStatement

__all__ = [
    "ACTIVE_DELIVERY_STATES",
    "DELIVERY_INSERT_COLUMNS",
    "DELIVERY_STATES",
    "ERROR",
    "EXPIRED_ERROR",
    "NONTERMINAL_DELIVERY_STATES",
    "OUTBOUND_INSERT_COLUMNS",
    "OUTBOUND_WAITING",
    "OWNERLESS",
    "PREPARE_LOCK_KEY",
    "RESPONSE_WAITING",
    "TERMINAL_DELIVERY_STATES",
    "LedgerStatements",
    "LedgerStore",
    "Row",
    "in_fixed_binds",
    "ledger_statements",
]

# --- states, the expiry error, the advisory key ------------------------------------------------------------

DELIVERY_STATES = frozenset({"prepared", "authorized", "queued", "running", "completed", "failed"})
TERMINAL_DELIVERY_STATES = frozenset({"completed", "failed"})
#: States a crash can leave a delivery in; sorted tuples keep the SQL deterministic.
NONTERMINAL_DELIVERY_STATES = ("authorized", "prepared", "queued", "running")
#: Admitted (receipt accepted) states: only these may carry a response intent or be finished successfully.
ACTIVE_DELIVERY_STATES = ("authorized", "queued", "running")
#: The error recorded on a delivery or intent whose exchange expired.
EXPIRED_ERROR = "secure peer exchange expired"

#: A row as the store returns it: column name -> value.
Row = dict[str, Any]


class RetrySpec(Protocol):
    """What the retry statements are built from: a :class:`~hostedrooms.ledger.retries.RetryMachine`'s table, its
    guard (``where``, binding ``:key``), the columns a retry sets, what a failure sets, and the retry schedule
    (``schedule[n - 1]``: seconds after the n-th failed try; the last entry for every later one)."""

    @property
    def name(self) -> str: ...
    @property
    def table(self) -> Table: ...
    @property
    def where(self) -> tuple[ColumnElement[bool], ...]: ...
    @property
    def retry_at(self) -> str: ...
    @property
    def attempts(self) -> str: ...
    @property
    def last_error(self) -> str: ...
    @property
    def failed(self) -> Mapping[str, Any] | None: ...
    @property
    def schedule(self) -> tuple[int, ...]: ...
    @property
    def direct_attempts(self) -> int: ...


def _guarded(spec: RetrySpec, extra: tuple[ColumnElement[bool], ...], values: Mapping[str, Any]) -> Any:
    return (update(spec.table).where(*spec.where, *extra).values({**values, "updated_at": bindparam("v_now")})
            .returning(*spec.table.c))


def _retry_direct(spec: RetrySpec) -> Any:
    """The retry counting attempts in SQL, the schedule written out as a CASE."""
    counted = func.coalesce(spec.table.c[spec.attempts], 0)
    attempts = counted + 1
    delay = case(*((attempts == n, spec.schedule[n - 1]) for n in range(1, len(spec.schedule))),
                 else_=spec.schedule[-1])
    now = bindparam("v_now", type_=spec.table.c[spec.retry_at].type)
    values = {spec.attempts: attempts, spec.retry_at: now + delay, spec.last_error: ERROR}
    return _guarded(spec, (counted.between(0, spec.direct_attempts),), values)


def in_fixed_binds(column: ColumnElement[Any], values: Sequence[str], name: str) -> ColumnElement[bool]:
    """``column IN (values)`` with one bound parameter per value (named ``<name>_<i>``, each carrying its value),
    so the statement compiles to one fixed text (an ``IN`` list expands per call otherwise)."""
    return column.in_([bindparam(f"{name}_{index}", value) for index, value in enumerate(values)])


_delivery_state = deliveries.c.state
_outbound_state = outbound_intents.c.state

#: The states a delivery may hold a response intent in, and the unfinished ones.
ADMITTED = in_fixed_binds(_delivery_state, ACTIVE_DELIVERY_STATES, "admitted")
UNFINISHED = in_fixed_binds(_delivery_state, NONTERMINAL_DELIVERY_STATES, "unfinished")
#: An authorized delivery no queue entry or run owns yet: it awaits admission.
OWNERLESS = (_delivery_state == "authorized", deliveries.c.queued_id.is_(None), deliveries.c.run_id.is_(None))
#: A response intent that may still change: set on an admitted delivery, not yet committed.
RESPONSE_WAITING = (ADMITTED, deliveries.c.response_request_id.is_not(None), deliveries.c.response_committed == 0)
#: A pending outbound intent.
OUTBOUND_WAITING = (_outbound_state == "pending",)

_BY_ENVELOPE = deliveries.c.envelope_id == bindparam("key")
_BY_REQUEST = outbound_intents.c.request_id == bindparam("key")

# prepare(): fail expired prepared rows, count what is in flight, insert.
_EXPIRE_PREPARED = (
    update(deliveries).where(_delivery_state == "prepared", deliveries.c.expires_at <= bindparam("now"))
    .values(state="failed", error=EXPIRED_ERROR, updated_at=bindparam("now")))
_IN_FLIGHT = select(func.count()).select_from(deliveries).where(UNFINISHED)
#: The columns prepare() inserts (the others take their defaults).
DELIVERY_INSERT_COLUMNS = (
    "envelope_id", "request_id", "transport_role", "connection_id", "lease_token", "team_id", "source_peer_id",
    "source_server_identity", "source_route_id", "source_route_revision", "target_peer_id",
    "target_server_identity", "target_route_id", "target_route_revision", "target_chat_id", "action", "kind",
    "exchange_id", "parent_envelope_id", "parent_leg", "used_legs", "max_legs", "expires_at", "claim_digest",
    "body_json", "state", "created_at", "updated_at")
# The same insert, made only while fewer than ``capacity`` deliveries are unfinished (the count and the insert in
# one statement; the values are typed, as a SELECT list needs on PostgreSQL).
_INSERT_WITHIN_CAPACITY = deliveries.insert().from_select(
    list(DELIVERY_INSERT_COLUMNS),
    select(*(bindparam(name, type_=deliveries.c[name].type) for name in DELIVERY_INSERT_COLUMNS))
    .where(_IN_FLIGHT.scalar_subquery() < bindparam("capacity", type_=BigInteger))).returning(*deliveries.c)
# Counts are far below this: a capacity beyond it admits as any larger one would (and still binds as 64 bits).
_CAPACITY_BOUND = 2**62
# prepare() of a known envelope still prepared: its new lease token.
_REFRESH_LEASE = (
    update(deliveries)
    .where(_BY_ENVELOPE, _delivery_state == "prepared", deliveries.c.claim_digest == bindparam("digest"))
    .values(lease_token=bindparam("lease"), updated_at=bindparam("now")).returning(*deliveries.c))
# bind_owner(): an ownerless authorized delivery gets its owner; a queued one its run.
_BIND_AUTHORIZED = (
    update(deliveries).where(_BY_ENVELOPE, *OWNERLESS)
    .values(state=bindparam("set_state"), queued_id=bindparam("set_queued_id"), run_id=bindparam("set_run_id"),
            admission_retry_at=None, admission_last_error=None, updated_at=bindparam("now"))
    .returning(*deliveries.c))
_BIND_RUN = (
    update(deliveries).where(_BY_ENVELOPE, _delivery_state == "queued",
                             deliveries.c.queued_id == bindparam("bound_queued_id"), deliveries.c.run_id.is_(None))
    .values(state="running", run_id=bindparam("set_run_id"), admission_retry_at=None, admission_last_error=None,
            updated_at=bindparam("now"))
    .returning(*deliveries.c))
# Response intents: prepare (the guard on the locked row), commit (any, or one request's), clear.
_RESPONSE_OPEN = (deliveries.c.response_request_digest.is_(None), deliveries.c.response_committed == 0, ADMITTED)
_RESPONSE_VALUES = dict(
    response_request_id=bindparam("request"), response_request_digest=bindparam("digest"),
    response_body=bindparam("body"), response_request_response=bindparam("request_response"),
    response_retry_at=bindparam("now"), response_attempts=0, response_last_error=None, updated_at=bindparam("now"))
_PREPARE_RESPONSE = (update(deliveries).where(_BY_ENVELOPE, *_RESPONSE_OPEN).values(**_RESPONSE_VALUES)
                     .returning(*deliveries.c))
# The same with the one condition prepare_response() otherwise reads first: a request delivery, not an instruction.
_PREPARE_RESPONSE_DIRECT = (update(deliveries).where(_BY_ENVELOPE, *_RESPONSE_OPEN, deliveries.c.kind != "instruction")
                            .values(**_RESPONSE_VALUES).returning(*deliveries.c))
_COMMIT_RESPONSE_ANY = (
    update(deliveries).where(_BY_ENVELOPE, ADMITTED, deliveries.c.response_committed == 0)
    .values(response_committed=1, response_retry_at=None, response_last_error=None, updated_at=bindparam("now"))
    .returning(*deliveries.c))
_COMMIT_RESPONSE = _COMMIT_RESPONSE_ANY.where(deliveries.c.response_request_id == bindparam("request"))
_CLEAR_RESPONSE = (
    update(deliveries).where(_BY_ENVELOPE, deliveries.c.response_request_id == bindparam("request"),
                             deliveries.c.response_committed == 0, ADMITTED)
    .values(response_request_id=None, response_request_digest=None, response_body=None,
            response_request_response=None, response_retry_at=None, response_attempts=0,
            response_last_error=None, updated_at=bindparam("now"))
    .returning(*deliveries.c))
# Outbound intents: fail the expired before a listing; store the Hub's response.
_EXPIRE_PENDING = (
    update(outbound_intents).where(_outbound_state == "pending", outbound_intents.c.expires_at <= bindparam("now"))
    .values(state="failed", retry_at=None, last_error=EXPIRED_ERROR, updated_at=bindparam("now")))
#: The columns prepare_outbound() inserts.
OUTBOUND_INSERT_COLUMNS = (
    "request_id", "source_session_id", "source_run_id", "body", "action", "expires_at", "connection_id",
    "source_route_id", "source_route_revision", "intent_digest", "snapshot_json", "state", "retry_at",
    "created_at", "updated_at")
_COMMIT_OUTBOUND = (
    update(outbound_intents).where(_BY_REQUEST, _outbound_state == "pending")
    .values(state="committed", response_json=bindparam("response"), retry_at=None, last_error=None,
            updated_at=bindparam("now"))
    .returning(*outbound_intents.c))
_PRUNE_DELIVERIES = delete(deliveries).where(
    _delivery_state.in_(("completed", "failed")), deliveries.c.updated_at < bindparam("cutoff"))
_PRUNE_OUTBOUND = delete(outbound_intents).where(
    _outbound_state.in_(("committed", "failed")), outbound_intents.c.updated_at < bindparam("cutoff"))

#: Where the caller's error text goes in a retry machine's failure values.
ERROR: BindParameter[Any] = bindparam("v_error")


class _HotDictStatement:
    """A single-row statement compiled once (a :class:`HotStatement`) whose rows come back as dicts of ``table``'s
    columns; ``core`` is the same statement for ``Connection.execute``."""

    __slots__ = ("core", "hot", "names")

    def __init__(self, statement: Any, table: Table, *, column_keys: Sequence[str] | None = None) -> None:
        self.core: Executable = statement
        self.hot = HotStatement(statement, column_keys=column_keys)
        self.names = tuple(column.name for column in table.c)


class LedgerStatements:
    """The ledger's statements on one backend, compiled once (get them with :func:`ledger_statements`)."""

    #: Tests only (see :meth:`without_one_statement`).
    one_statement = True

    def __init__(self, backend: Backend) -> None:
        lock = backend.for_update
        by_envelope, by_request = select(deliveries).where(_BY_ENVELOPE), select(outbound_intents).where(_BY_REQUEST)
        self.delivery = _HotDictStatement(by_envelope, deliveries)
        self.lock_delivery = _HotDictStatement(lock(by_envelope), deliveries)
        self.delivery_of_run = _HotDictStatement(
            select(deliveries).where(deliveries.c.run_id == bindparam("key")), deliveries)
        self.outbound = _HotDictStatement(by_request, outbound_intents)
        self.lock_outbound = _HotDictStatement(lock(by_request), outbound_intents)
        self.expire_prepared = HotStatement(_EXPIRE_PREPARED)
        self.in_flight = HotStatement(_IN_FLIGHT)
        self.insert_delivery = _HotDictStatement(
            deliveries.insert().returning(*deliveries.c), deliveries, column_keys=DELIVERY_INSERT_COLUMNS)
        self.insert_within_capacity = _HotDictStatement(_INSERT_WITHIN_CAPACITY, deliveries)
        self.refresh_lease = _HotDictStatement(_REFRESH_LEASE, deliveries)
        self.bind_authorized = _HotDictStatement(_BIND_AUTHORIZED, deliveries)
        self.bind_run = _HotDictStatement(_BIND_RUN, deliveries)
        self.prepare_response = _HotDictStatement(_PREPARE_RESPONSE, deliveries)
        self.prepare_response_direct = _HotDictStatement(_PREPARE_RESPONSE_DIRECT, deliveries)
        self.commit_response = {False: _HotDictStatement(_COMMIT_RESPONSE, deliveries),
                                True: _HotDictStatement(_COMMIT_RESPONSE_ANY, deliveries)}
        self.clear_response = _HotDictStatement(_CLEAR_RESPONSE, deliveries)
        self.expire_pending = HotStatement(_EXPIRE_PENDING)
        # ON CONFLICT DO NOTHING: a concurrent prepare of the same id (PostgreSQL) returns no row and becomes a
        # replay (psycopg reports no rowcount for it).
        self.insert_outbound = _HotDictStatement(
            backend.insert(outbound_intents).on_conflict_do_nothing(index_elements=["request_id"])
            .returning(*outbound_intents.c), outbound_intents, column_keys=OUTBOUND_INSERT_COLUMNS)
        self.commit_outbound = _HotDictStatement(_COMMIT_OUTBOUND, outbound_intents)
        self._shapes: dict[Any, _HotDictStatement] = {}
        self._shaping = threading.Lock()

    @contextlib.contextmanager
    def without_one_statement(self) -> Iterator[None]:
        """Tests only: inside the block every statement runs through ``Connection.execute`` and the services take
        their full paths (the agreement tests compare both)."""
        previous, self.one_statement = self.one_statement, False
        try:
            yield
        finally:
            self.one_statement = previous

    def shaped(self, key: Any, build: Callable[[], _HotDictStatement]) -> _HotDictStatement:
        """The statement of one shape (``key``), built by ``build()`` the first time it is asked."""
        found = self._shapes.get(key)
        if found is None:
            with self._shaping:
                found = self._shapes.get(key)
                if found is None:
                    found = self._shapes[key] = build()
        return found


_compiled: dict[str, LedgerStatements] = {}
_building = threading.Lock()


def ledger_statements(backend: Backend) -> LedgerStatements:
    """The one :class:`LedgerStatements` of ``backend``'s backend (built, with its statements, on first use)."""
    statements = _compiled.get(backend.name)
    if statements is None:
        with _building:
            statements = _compiled.get(backend.name)
            if statements is None:
                statements = _compiled[backend.name] = LedgerStatements(backend)
    return statements


class LedgerStore:
    """Every statement of the delivery ledger, run on one unit of work's connection (``uow.ledger``)."""

    __slots__ = ("backend", "connection", "statements")

    def __init__(self, backend: Backend, connection: Connection) -> None:
        self.backend = backend
        self.connection = connection
        self.statements = ledger_statements(backend)

    @property
    def one_statement(self) -> bool:
        """Whether the services may take their one-statement attempts (False inside ``without_one_statement``)."""
        return self.statements.one_statement

    # -- running statements

    def _rows(self, statement: _HotDictStatement, params: Mapping[str, Any]) -> list[Row]:
        if not self.statements.one_statement:
            return [dict(row) for row in self.connection.execute(statement.core, params).mappings()]
        cursor = statement.hot.run(self.connection, params)
        try:
            found = cursor.fetchall()
        finally:
            cursor.close()
        names = statement.names
        return [dict(zip(names, row, strict=True)) for row in found]

    def _row(self, statement: _HotDictStatement, params: Mapping[str, Any]) -> Row | None:
        if not self.statements.one_statement:
            found = self.connection.execute(statement.core, params).mappings().first()
            return None if found is None else dict(found)
        row = statement.hot.first(self.connection, params)
        return None if row is None else dict(zip(statement.names, row, strict=True))

    def _scalar(self, statement: HotStatement, params: Mapping[str, Any]) -> Any:
        if not self.statements.one_statement:
            return self.connection.execute(cast(Executable, statement.statement), params).scalar_one()
        row = statement.first(self.connection, params)
        assert row is not None
        return row[0]

    def _run(self, statement: HotStatement, params: Mapping[str, Any]) -> None:
        if not self.statements.one_statement:
            self.connection.execute(cast(Executable, statement.statement), params)
            return
        statement.rowcount(self.connection, params)

    # -- locks and wake-ups

    def lock_prepares(self) -> None:
        """One prepare at a time, so its capacity count cannot be raced (SQLite: BEGIN IMMEDIATE already does)."""
        self.backend.advisory_lock(self.connection, PREPARE_LOCK_KEY)

    def wake(self, work: str) -> None:
        """Wake the ledger's waiters when this transaction commits: ``work`` became due."""
        self.backend.notify(self.connection, LEDGER_WORK_CHANNEL, work)

    # -- deliveries

    def delivery(self, envelope_id: str, *, lock: bool = False) -> Row | None:
        """The delivery row of ``envelope_id`` (locked until the transaction ends with ``lock``), or None."""
        statements = self.statements
        return self._row(statements.lock_delivery if lock else statements.delivery, {"key": envelope_id})

    def delivery_of_run(self, run_id: str) -> Row | None:
        """The delivery row run ``run_id`` owns, or None."""
        return self._row(self.statements.delivery_of_run, {"key": run_id})

    def expire_prepared(self, now: int) -> None:
        """Fail the prepared deliveries whose exchange expired by ``now``."""
        self._run(self.statements.expire_prepared, {"now": now})

    def in_flight(self) -> int:
        """How many deliveries are unfinished."""
        return int(self._scalar(self.statements.in_flight, {}))

    def insert_delivery(self, values: Mapping[str, Any]) -> Row:
        """Insert a delivery (DELIVERY_INSERT_COLUMNS); return the stored row."""
        row = self._row(self.statements.insert_delivery, values)
        assert row is not None
        return row

    def insert_delivery_within(self, values: Mapping[str, Any], capacity: int) -> Row | None:
        """Insert a delivery (DELIVERY_INSERT_COLUMNS) while fewer than ``capacity`` are unfinished: what
        :meth:`in_flight` and :meth:`insert_delivery` do, in one statement. The stored row, or None (full)."""
        bounded = max(0, min(capacity, _CAPACITY_BOUND))  # (no count is below 0 or reaches the bound)
        return self._row(self.statements.insert_within_capacity, {**values, "capacity": bounded})

    def refresh_lease(self, envelope_id: str, *, digest: str, lease: str, now: int) -> Row | None:
        """Give a still prepared delivery of claim ``digest`` its new lease token; the row, or None."""
        return self._row(self.statements.refresh_lease,
                         {"key": envelope_id, "digest": digest, "lease": lease, "now": now})

    def transition(self, envelope_id: str, *, expected: tuple[str, ...], values: Mapping[str, Any],
                   now: int) -> Row | None:
        """``UPDATE ... SET <values>, updated_at WHERE envelope_id AND state IN <expected> RETURNING *``: the
        changed row, or None when the delivery was not in ``expected``."""
        names = tuple(sorted(values))

        def build() -> _HotDictStatement:
            in_expected = in_fixed_binds(_delivery_state, expected, "expected")
            statement = (update(deliveries).where(_BY_ENVELOPE, in_expected)
                         .values({name: bindparam(f"set_{name}") for name in (*names, "updated_at")})
                         .returning(*deliveries.c))
            return _HotDictStatement(statement, deliveries)

        params = {"key": envelope_id, "set_updated_at": now, **{f"set_{name}": values[name] for name in names}}
        return self._row(self.statements.shaped(("transition", expected, names), build), params)

    def bind_authorized(self, envelope_id: str, *, queued_id: str | None, run_id: str | None,
                        now: int) -> Row | None:
        """An ownerless authorized delivery becomes ``queued`` (no run) or ``running``; the row, or None."""
        return self._row(self.statements.bind_authorized, {
            "key": envelope_id, "set_state": "running" if run_id is not None else "queued",
            "set_queued_id": queued_id, "set_run_id": run_id, "now": now})

    def bind_run(self, envelope_id: str, *, queued_id: str, run_id: str, now: int) -> Row | None:
        """A queued delivery of entry ``queued_id`` with no run becomes ``running`` under ``run_id``; the row,
        or None."""
        return self._row(self.statements.bind_run, {
            "key": envelope_id, "bound_queued_id": queued_id, "set_run_id": run_id, "now": now})

    # -- response intents

    def prepare_response(self, envelope_id: str, *, direct: bool, params: Mapping[str, Any]) -> Row | None:
        """Set a response intent (``request``, ``digest``, ``body``, ``request_response``, ``now``) on an admitted
        delivery that has none; ``direct`` also requires a request delivery (the check a caller that has not read
        the row needs). The changed row, or None."""
        statements = self.statements
        statement = statements.prepare_response_direct if direct else statements.prepare_response
        return self._row(statement, {**params, "key": envelope_id})

    def commit_response(self, envelope_id: str, *, request_id: str | None, now: int) -> list[Row]:
        """Mark the uncommitted response intent (``request_id``'s, or any) committed; the changed rows."""
        return self._rows(self.statements.commit_response[request_id is None],
                          {"key": envelope_id, "request": request_id, "now": now})

    def clear_response(self, envelope_id: str, *, request_id: str, now: int) -> Row | None:
        """Drop the uncommitted response intent ``request_id``; the changed row, or None."""
        return self._row(self.statements.clear_response, {"key": envelope_id, "request": request_id, "now": now})

    # -- outbound intents

    def outbound(self, request_id: str, *, lock: bool = False) -> Row | None:
        """The outbound intent row of ``request_id`` (locked until the transaction ends with ``lock``), or None."""
        statements = self.statements
        return self._row(statements.lock_outbound if lock else statements.outbound, {"key": request_id})

    def insert_outbound(self, values: Mapping[str, Any]) -> Row | None:
        """Insert an outbound intent (OUTBOUND_INSERT_COLUMNS); the stored row, or None when the id exists."""
        return self._row(self.statements.insert_outbound, values)

    def commit_outbound(self, request_id: str, *, response: str, now: int) -> Row | None:
        """Store the Hub's response of a pending intent; the changed row, or None when it is not pending."""
        return self._row(self.statements.commit_outbound, {"key": request_id, "response": response, "now": now})

    def expire_pending(self, now: int) -> None:
        """Fail the pending outbound intents whose exchange expired by ``now``."""
        self._run(self.statements.expire_pending, {"now": now})

    # -- retries (hostedrooms.ledger.retries)

    def retry_waiting(self, spec: RetrySpec, params: Mapping[str, Any]) -> Row | None:
        """A retry machine's guarded retry: attempts, next try and last error set (``v_attempts``, ``v_retry_at``,
        ``v_error``); the changed row, or None."""
        statement = self.statements.shaped(("retry", spec.name), lambda: _HotDictStatement(_guarded(spec, (), {
            spec.attempts: bindparam("v_attempts"), spec.retry_at: bindparam("v_retry_at"),
            spec.last_error: ERROR}), spec.table))
        return self._row(statement, params)

    def retry_directly(self, spec: RetrySpec, params: Mapping[str, Any]) -> Row | None:
        """A retry machine's retry as one statement, for rows whose attempt count is between 0 and
        ``spec.direct_attempts``: the count grows by one and the next try is due ``spec.schedule``'s delay for it
        after ``v_now`` (``v_error``, ``v_now``); the changed row, or None."""
        statement = self.statements.shaped(
            ("retry_directly", spec.name), lambda: _HotDictStatement(_retry_direct(spec), spec.table))
        return self._row(statement, params)

    def fail_waiting(self, spec: RetrySpec, params: Mapping[str, Any]) -> Row | None:
        """A retry machine's guarded failure (:data:`ERROR` stands for the error text); the changed row, or None."""
        assert spec.failed is not None
        failed = spec.failed
        statement = self.statements.shaped(
            ("fail", spec.name), lambda: _HotDictStatement(_guarded(spec, (), failed), spec.table))
        return self._row(statement, params)

    # -- listings and pruning

    def order(self, table: Table, *first: Any) -> list[Any]:
        """``first``, then creation time, then the key in code-point order (as SQLite sorts it)."""
        key = table.c.envelope_id if table is deliveries else table.c.request_id
        return [*first, table.c.created_at, self.backend.bytewise(key)]

    def deliveries_where(self, *conditions: ColumnElement[bool]) -> Select[Any]:
        """The unfinished deliveries matching ``conditions``, oldest first."""
        return (select(deliveries).where(*conditions, _delivery_state.in_(NONTERMINAL_DELIVERY_STATES))
                .order_by(*self.order(deliveries)))

    def pending_outbound_where(self, *conditions: ColumnElement[bool]) -> Select[Any]:
        """The pending outbound intents matching ``conditions``, oldest first."""
        return (select(outbound_intents).where(_outbound_state == "pending", *conditions)
                .order_by(*self.order(outbound_intents)))

    def due(self, spec: Any, now: int) -> Select[Any]:
        """A retry machine's waiting rows whose retry is due at ``now``: soonest first, then oldest."""
        due = func.coalesce(spec.table.c[spec.retry_at], 0)
        return select(spec.table).where(*spec.waiting, due <= now).order_by(*self.order(spec.table, due))

    def backlog(self) -> dict[tuple[str, str], int]:
        """The non-terminal rows by ``(table, state)``, zeros included (see ``DeliveryLedger.backlog``)."""
        counts = {("deliveries", state): 0 for state in NONTERMINAL_DELIVERY_STATES}
        counts["outbound", "pending"] = 0
        for table, column, states in (("deliveries", _delivery_state, NONTERMINAL_DELIVERY_STATES),
                                      ("outbound", _outbound_state, ("pending",))):
            statement = select(column, func.count()).where(column.in_(states)).group_by(column)
            for state, count in self.connection.execute(statement):
                counts[table, str(state)] = int(count)
        return counts

    def prune(self, cutoff: int) -> int:
        """Delete finished deliveries and intents last changed before ``cutoff``; return how many."""
        removed = 0
        for statement in (_PRUNE_DELIVERIES, _PRUNE_OUTBOUND):
            result: CursorResult[Any] = self.connection.execute(statement, {"cutoff": cutoff})
            removed += int(result.rowcount or 0)
        return removed

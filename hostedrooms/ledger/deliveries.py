"""Deliveries: prepare, authorize, bind an owner, retry or fail admission, finish; and their listings."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any

from sqlalchemy import ColumnElement, RowMapping, bindparam, func, select, update

from ..dialect import StoreDialect
from ..errors import LedgerCapacityError, LedgerInputError, LedgerStateError
from ..records import DeliveryRecord
from ..uow import UnitOfWork
from ..validation import canonical_json_bytes
from .claims import (
    ACTIVE_DELIVERY_STATES,
    EXPIRED_ERROR,
    MAX_RETRY_BATCH,
    NONTERMINAL_DELIVERY_STATES,
    PREPARE_LOCK_KEY,
    _finish_error_text,
    _key,
    _limit,
    _optional_key,
    _result_hash,
    delivery_claim,
)
from .retries import ERROR, Retrying, retry_machine
from .rows import D, _delivery, _fetch, _public_delivery, _public_rows, _returned

# prepare(): fail expired prepared rows, count what is in flight, insert (returning the row).
_EXPIRE_PREPARED = (update(D).where(D.c.state == "prepared", D.c.expires_at <= bindparam("now"))
                    .values(state="failed", error=EXPIRED_ERROR, updated_at=bindparam("expired_at")))
_IN_FLIGHT = select(func.count()).select_from(D).where(D.c.state.in_(NONTERMINAL_DELIVERY_STATES))
_INSERT_DELIVERY = D.insert().returning(*D.c)
# prepare() of a known envelope still prepared: its new lease token.
_REFRESH_LEASE = (
    update(D).where(D.c.envelope_id == bindparam("key"), D.c.state == "prepared",
                    D.c.claim_digest == bindparam("digest"))
    .values(lease_token=bindparam("lease"), updated_at=bindparam("now"))
    .returning(*D.c))
#: An authorized delivery no queue entry or run owns yet: it awaits admission.
_OWNERLESS = (D.c.state == "authorized", D.c.queued_id.is_(None), D.c.run_id.is_(None))
# bind_owner(): an ownerless authorized delivery gets its owner; a queued one its run.
_BIND_AUTHORIZED = (
    update(D).where(D.c.envelope_id == bindparam("key"), *_OWNERLESS)
    .values(state=bindparam("set_state"), queued_id=bindparam("set_queued_id"), run_id=bindparam("set_run_id"),
            admission_retry_at=None, admission_last_error=None, updated_at=bindparam("set_updated_at"))
    .returning(*D.c))
_BIND_RUN = (
    update(D).where(D.c.envelope_id == bindparam("key"), D.c.state == "queued",
                    D.c.queued_id == bindparam("bound_queued_id"), D.c.run_id.is_(None))
    .values(state="running", run_id=bindparam("set_run_id"), admission_retry_at=None, admission_last_error=None,
            updated_at=bindparam("set_updated_at"))
    .returning(*D.c))

# Admission of an ownerless authorized delivery: retried with backoff until a queue entry or run owns it, or failed.
_ADMISSION = retry_machine(
    D, "envelope_id", _OWNERLESS,
    retryable=lambda row, _: row["state"] == "authorized" and row["queued_id"] is None and row["run_id"] is None,
    attempts="admission_attempts", retry_at="admission_retry_at", last_error="admission_last_error",
    failed={"state": "failed", "error": ERROR, "admission_retry_at": None, "admission_last_error": None},
    fetch=_delivery, public=_public_delivery)


def _transition_statement(expected: tuple[str, ...], names: tuple[str, ...]) -> Callable[[StoreDialect], Any]:
    """A builder of ``UPDATE deliveries SET <names>, updated_at WHERE envelope_id = :key AND state IN <expected>
    RETURNING *`` (parameters ``key``, ``set_<name>``, ``set_updated_at``), built once per shape and backend."""

    def build(_dialect: StoreDialect) -> Any:
        return (update(D).where(D.c.envelope_id == bindparam("key"), D.c.state.in_(expected))
                .values({name: bindparam(f"set_{name}") for name in (*names, "updated_at")}).returning(*D.c))

    return build


class Deliveries(Retrying):
    """The delivery state machine (a part of :class:`~hostedrooms.ledger.DeliveryLedger`)."""

    def _deliveries_where(self, *conditions: ColumnElement[bool]) -> list[DeliveryRecord]:
        def work(uow: UnitOfWork) -> list[DeliveryRecord]:
            statement = select(D).where(*conditions).order_by(*self._order(uow))
            return _public_rows(uow, statement, _public_delivery)

        return self._read(work)

    def prepare(
        self, envelope: Mapping[str, Any], *, transport_role: str, connection_id: str, lease_token: str,
        target_chat_id: str,
    ) -> tuple[DeliveryRecord, bool]:
        """Durably record an envelope's claim before it is acknowledged; return ``(row, created)``.

        A known envelope must carry the same claim digest (else ``LedgerStateError``, a ``RuntimeError``); while
        it is still ``prepared`` a new lease token replaces the old one. A new envelope first fails expired
        prepared rows, then is refused with ``LedgerCapacityError`` (a ``RuntimeError``) when
        MAX_NONTERMINAL_DELIVERIES are in flight.
        """
        claim, digest = delivery_claim(envelope, transport_role=transport_role, connection_id=connection_id,
                                       lease_token=lease_token, target_chat_id=target_chat_id)
        timestamp = self._now()

        def work(uow: UnitOfWork) -> tuple[DeliveryRecord, bool]:
            # PostgreSQL: one prepare at a time, so the capacity count cannot be raced (SQLite: BEGIN IMMEDIATE).
            uow.dialect.serialize(uow.connection, PREPARE_LOCK_KEY)
            envelope_id = claim["envelope_id"]
            row = _delivery(uow, envelope_id, lock=True)
            if row is not None:
                return self._known_envelope(uow, row, claim, digest, timestamp), False
            uow.execute(_EXPIRE_PREPARED, {"now": timestamp, "expired_at": timestamp})
            in_flight = uow.execute(_IN_FLIGHT).scalar_one()
            if int(in_flight) >= self._capacity():
                raise LedgerCapacityError("secure peer delivery capacity is full", limit="MAX_NONTERMINAL_DELIVERIES")
            values = {name: value for name, value in claim.items() if name != "body"}
            inserted = uow.execute(_INSERT_DELIVERY, {
                **values, "claim_digest": digest, "body_json": canonical_json_bytes(claim["body"]).decode("utf-8"),
                "state": "prepared", "created_at": timestamp, "updated_at": timestamp}).mappings().first()
            created = _public_delivery(inserted)
            assert created is not None
            return created, True

        return self._write(work)

    @staticmethod
    def _known_envelope(
        uow: UnitOfWork, row: RowMapping, claim: dict[str, Any], digest: str, timestamp: int
    ) -> DeliveryRecord:
        if row["claim_digest"] != digest:
            raise LedgerStateError("secure peer envelope identity changed")
        if row["state"] == "prepared" and str(row["lease_token"] or "") != claim["lease_token"]:
            # The row is locked (prepare read it FOR UPDATE; SQLite's write lock): unchanged when the guard misses.
            changed = _returned(uow, _REFRESH_LEASE, {
                "key": claim["envelope_id"], "digest": digest, "lease": claim["lease_token"], "now": timestamp})
            row = row if changed is None else changed
        public = _public_delivery(row)
        assert public is not None
        return public

    def get(self, envelope_id: str) -> DeliveryRecord | None:
        """The delivery of ``envelope_id``, or None."""
        key = _key(envelope_id, "envelope_id")
        return self._read(lambda uow: _public_delivery(_delivery(uow, key)))

    def _transition(
        self, envelope_id: Any, *, expected: Iterable[str], wake: str | None = None, **values: Any
    ) -> DeliveryRecord | None:
        """Guarded state change: the row if it was in ``expected`` (and now changed), else None. ``wake``: the
        work a change makes due (waiters on the ledger's wake-up channel are woken on commit)."""
        key = _key(envelope_id, "envelope_id")
        timestamp = self._now()

        shape = (tuple(sorted(expected)), tuple(sorted(values)))
        params = {"key": key, "set_updated_at": timestamp, **{f"set_{name}": value for name, value in values.items()}}

        def work(uow: UnitOfWork) -> DeliveryRecord | None:
            statement = uow.dialect.statement(("ledger.transition", *shape), _transition_statement(*shape))
            row = _public_delivery(uow.execute(statement, params).mappings().first())
            if row is not None and wake is not None:
                self._wake(uow, wake)
            return row

        return self._write(work)

    def authorize(self, envelope_id: str) -> DeliveryRecord | None:
        """``prepared``/``authorized`` -> ``authorized`` (the remote receipt was accepted); else None."""
        return self._transition(envelope_id, expected=("prepared", "authorized"), state="authorized", wake="delivery")

    def fail_ownerless_authorized(self, envelope_id: str, *, error: str) -> DeliveryRecord | None:
        """Fail only an ``authorized`` delivery that has no queued/run owner; return the current row."""
        return self._fail(_ADMISSION, _key(envelope_id, "envelope_id"), error)

    def bind_owner(self, envelope_id: str, *, queued_id: str | None, run_id: str | None) -> DeliveryRecord | None:
        """Bind a queue entry and/or run to an admitted delivery.

        ``authorized`` becomes ``queued`` (queue id only) or ``running`` (with a run id); a ``queued``
        delivery gains its run and becomes ``running``. Repeating the current binding returns the row; any
        other owner, or a missing/terminal/prepared delivery, returns None.
        """
        key = _key(envelope_id, "envelope_id")
        queued, run = _optional_key(queued_id, "queued_id"), _optional_key(run_id, "run_id")
        if queued is None and run is None:
            raise LedgerInputError("secure peer delivery owner is empty")
        timestamp = self._now()

        def work(uow: UnitOfWork) -> DeliveryRecord | None:
            row = _delivery(uow, key, lock=True)
            if row is None:
                return None
            state, owner = row["state"], (row["queued_id"], row["run_id"])
            # The row is locked (PostgreSQL FOR UPDATE; SQLite's write lock): the guarded updates match.
            if state == "authorized":
                row = uow.execute(_BIND_AUTHORIZED, {
                    "key": key, "set_state": "running" if run is not None else "queued", "set_queued_id": queued,
                    "set_run_id": run, "set_updated_at": timestamp}).mappings().first()
                if run is None:
                    self._wake(uow, "delivery")  # a newly queued delivery
            elif state == "queued":
                if owner != (queued, None):  # another queue entry, or a run is already bound
                    return None
                if run is not None:
                    row = uow.execute(_BIND_RUN, {
                        "key": key, "bound_queued_id": row["queued_id"], "set_run_id": run,
                        "set_updated_at": timestamp}).mappings().first()
            elif state != "running" or owner != (queued, run):
                return None
            return _public_delivery(row)

        return self._write(work)

    def defer_admission(self, envelope_id: str, *, error: str) -> DeliveryRecord | None:
        """Schedule another admission try of an ownerless ``authorized`` delivery (backoff); return the row."""
        return self._retry(_ADMISSION, _key(envelope_id, "envelope_id"), error)

    def pending_admissions(self, *, limit: int = 20, now: int | None = None) -> list[DeliveryRecord]:
        """Ownerless ``authorized`` deliveries whose admission retry is due, soonest first."""
        count = _limit(limit, MAX_RETRY_BATCH, "secure peer admission retry limit is invalid")
        return self._due(_ADMISSION, count, now)

    def nonterminal_for_chat(self, chat_id: str) -> list[DeliveryRecord]:
        """Every unfinished delivery targeting ``chat_id``, oldest first."""
        key = _key(chat_id, "chat_id")
        return self._deliveries_where(D.c.target_chat_id == key, D.c.state.in_(NONTERMINAL_DELIVERY_STATES))

    def finish(
        self, envelope_id: str, *, succeeded: bool, result_text: str = "", error: str | None = None
    ) -> DeliveryRecord | None:
        """Complete an admitted delivery (storing the result's SHA-256) or fail any unfinished one.

        ``error`` is recorded up to MAX_FINISH_ERROR_CHARS characters; a longer text is cut and ends with
        FINISH_ERROR_CUT_MARK.
        """
        result_hash = _result_hash(result_text)
        expected = ACTIVE_DELIVERY_STATES if succeeded else NONTERMINAL_DELIVERY_STATES
        recorded = _finish_error_text(error) if error is not None else None
        return self._transition(envelope_id, expected=expected, state="completed" if succeeded else "failed",
                                result_hash=result_hash, error=recorded)

    def recoverable(self) -> list[DeliveryRecord]:
        """Every unfinished delivery (including ``prepared`` ones a crash left behind), oldest first."""
        return self._deliveries_where(D.c.state.in_(NONTERMINAL_DELIVERY_STATES))

    def for_run(self, run_id: str) -> DeliveryRecord | None:
        """The delivery owned by run ``run_id``, or None."""
        key = _key(run_id, "run_id")
        return self._read(lambda uow: _public_delivery(_fetch(uow, D, D.c.run_id == key)))

    def nonterminal_for_connection(self, connection_id: str) -> list[DeliveryRecord]:
        """Every unfinished delivery received over ``connection_id``, oldest first."""
        key = _key(connection_id, "connection_id")
        return self._deliveries_where(D.c.connection_id == key, D.c.state.in_(NONTERMINAL_DELIVERY_STATES))

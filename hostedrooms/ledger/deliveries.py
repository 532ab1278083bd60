"""Deliveries: prepare, authorize, bind an owner, retry or fail admission, finish; and their listings."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from sqlalchemy import ColumnElement

from ..errors import LedgerCapacityError, LedgerInputError, LedgerStateError
from ..models import deliveries
from ..records import DeliveryRecord
from ..store.ledger import ACTIVE_DELIVERY_STATES, NONTERMINAL_DELIVERY_STATES, OWNERLESS, LedgerStore, Row
from ..uow import UnitOfWork
from ..validation import canonical_json_bytes
from .claims import (
    MAX_RETRY_BATCH,
    _finish_error_text,
    _key,
    _limit,
    _optional_key,
    _result_hash,
    delivery_claim,
)
from .retries import ERROR, Retrying, retry_machine
from .rows import _public_delivery, _public_rows, fetch_delivery

# Admission of an ownerless authorized delivery: retried with backoff until a queue entry or run owns it, or failed.
_ADMISSION = retry_machine(
    "admission", deliveries, "envelope_id", OWNERLESS,
    retryable=lambda row, _: row["state"] == "authorized" and row["queued_id"] is None and row["run_id"] is None,
    attempts="admission_attempts", retry_at="admission_retry_at", last_error="admission_last_error",
    failed={"state": "failed", "error": ERROR, "admission_retry_at": None, "admission_last_error": None},
    fetch=fetch_delivery, public=_public_delivery)


class Deliveries(Retrying):
    """The delivery state machine (a part of :class:`~hostedrooms.ledger.DeliveryLedger`)."""

    def _deliveries_where(self, *conditions: ColumnElement[bool]) -> list[DeliveryRecord]:
        """The unfinished deliveries matching ``conditions``, oldest first."""
        def work(uow: UnitOfWork) -> list[DeliveryRecord]:
            return _public_rows(uow, uow.ledger.deliveries_where(*conditions), _public_delivery)

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

        :param envelope: the envelope as received (its id, kind, legs, chats and body are checked).
        :param transport_role: ``"host"`` or ``"client"``.
        :param connection_id: the connection the envelope arrived on.
        :param lease_token: the lease of the transport that received it.
        :param target_chat_id: the chat it is delivered to.
        :returns: ``(row, created)``: the delivery, and whether this call recorded it.
        :raises LedgerInputError: the envelope or an argument is invalid (``field`` names it).
        :raises LedgerStateError: the envelope's id is stored with another claim digest.
        :raises LedgerCapacityError: MAX_NONTERMINAL_DELIVERIES deliveries are unfinished.
        :raises LedgerPermissionError: the SQLite ledger file or its folder is unsafe (a link, another owner, open
            access).
        :raises StorageError: the database failed underneath; nothing was committed.
        """
        claim, digest = delivery_claim(envelope, transport_role=transport_role, connection_id=connection_id,
                                       lease_token=lease_token, target_chat_id=target_chat_id)
        timestamp = self._now()
        values = {name: value for name, value in claim.items() if name != "body"}
        values.update(claim_digest=digest, body_json=canonical_json_bytes(claim["body"]).decode("utf-8"),
                      state="prepared", created_at=timestamp, updated_at=timestamp)

        def work(uow: UnitOfWork) -> tuple[DeliveryRecord, bool]:
            store = uow.ledger
            # PostgreSQL: one prepare at a time, so the capacity count cannot be raced (SQLite: BEGIN IMMEDIATE).
            store.lock_prepares()
            row = store.delivery(claim["envelope_id"], lock=True)
            if row is not None:
                return self._known_envelope(store, row, claim, digest, timestamp), False
            store.expire_prepared(timestamp)
            if store.one_statement:  # the count and the insert in one statement
                inserted = store.insert_delivery_within(values, self._capacity())
            elif store.in_flight() < self._capacity():
                inserted = store.insert_delivery(values)
            else:
                inserted = None
            if inserted is None:
                raise LedgerCapacityError("secure peer delivery capacity is full", limit="MAX_NONTERMINAL_DELIVERIES")
            created = _public_delivery(inserted)
            assert created is not None
            return created, True

        return self._write(work)

    @staticmethod
    def _known_envelope(
        store: LedgerStore, row: Row, claim: dict[str, Any], digest: str, timestamp: int
    ) -> DeliveryRecord:
        if row["claim_digest"] != digest:
            raise LedgerStateError("secure peer envelope identity changed")
        if row["state"] == "prepared" and str(row["lease_token"] or "") != claim["lease_token"]:
            # The row is locked (prepare read it FOR UPDATE; SQLite's write lock): unchanged when the guard misses.
            changed = store.refresh_lease(claim["envelope_id"], digest=digest, lease=claim["lease_token"],
                                          now=timestamp)
            row = row if changed is None else changed
        public = _public_delivery(row)
        assert public is not None
        return public

    def get(self, envelope_id: str) -> DeliveryRecord | None:
        """The delivery of ``envelope_id``, or None.

        :param envelope_id: the delivery's envelope id.
        :returns: the delivery, or None when there is none.
        :raises LedgerInputError: ``envelope_id`` is not storable text.
        :raises LedgerPermissionError: the SQLite ledger file or its folder is unsafe (a link, another owner, open
            access).
        :raises StorageError: the database failed underneath; nothing was committed.
        """
        key = _key(envelope_id, "envelope_id")
        return self._read(lambda uow: _public_delivery(uow.ledger.delivery(key)), one_statement=True)

    def _transition(
        self, envelope_id: Any, *, expected: Iterable[str], wake: str | None = None, **values: Any
    ) -> DeliveryRecord | None:
        """Guarded state change: the row if it was in ``expected`` (and now changed), else None. ``wake``: the
        work a change makes due (waiters on the ledger's wake-up channel are woken on commit)."""
        key = _key(envelope_id, "envelope_id")
        timestamp = self._now()
        states = tuple(sorted(expected))

        def work(uow: UnitOfWork) -> DeliveryRecord | None:
            store = uow.ledger
            row = _public_delivery(store.transition(key, expected=states, values=values, now=timestamp))
            if row is not None and wake is not None:
                store.wake(wake)
            return row

        return self._write(work)

    def authorize(self, envelope_id: str) -> DeliveryRecord | None:
        """``prepared``/``authorized`` -> ``authorized`` (the remote receipt was accepted); else None.

        :param envelope_id: the delivery's envelope id.
        :returns: the authorized delivery, or None when it is missing or in another state.
        :raises LedgerInputError: ``envelope_id`` is not storable text.
        :raises LedgerPermissionError: the SQLite ledger file or its folder is unsafe (a link, another owner, open
            access).
        :raises StorageError: the database failed underneath; nothing was committed.
        """
        return self._transition(envelope_id, expected=("prepared", "authorized"), state="authorized", wake="delivery")

    def fail_ownerless_authorized(self, envelope_id: str, *, error: str) -> DeliveryRecord | None:
        """Fail only an ``authorized`` delivery that has no queued/run owner; return the current row.

        :param envelope_id: the delivery's envelope id.
        :param error: why admission failed (recorded, at most MAX_ERROR_CHARS characters).
        :returns: the delivery as it now is, or None when there is none.
        :raises LedgerInputError: ``envelope_id`` is not storable text.
        :raises LedgerPermissionError: the SQLite ledger file or its folder is unsafe (a link, another owner, open
            access).
        :raises StorageError: the database failed underneath; nothing was committed.
        """
        return self._fail(_ADMISSION, _key(envelope_id, "envelope_id"), error)

    def bind_owner(self, envelope_id: str, *, queued_id: str | None, run_id: str | None) -> DeliveryRecord | None:
        """Bind a queue entry and/or run to an admitted delivery.

        ``authorized`` becomes ``queued`` (queue id only) or ``running`` (with a run id); a ``queued``
        delivery gains its run and becomes ``running``. Repeating the current binding returns the row; any
        other owner, or a missing/terminal/prepared delivery, returns None.

        :param envelope_id: the delivery's envelope id.
        :param queued_id: the queue entry that owns it, or None.
        :param run_id: the run that owns it, or None (not both None).
        :returns: the bound delivery, or None (see above).
        :raises LedgerInputError: an id is not storable text, or both owners are None.
        :raises LedgerPermissionError: the SQLite ledger file or its folder is unsafe (a link, another owner, open
            access).
        :raises StorageError: the database failed underneath; nothing was committed.
        """
        key = _key(envelope_id, "envelope_id")
        queued, run = _optional_key(queued_id, "queued_id"), _optional_key(run_id, "run_id")
        if queued is None and run is None:
            raise LedgerInputError("secure peer delivery owner is empty")
        timestamp = self._now()

        def work(uow: UnitOfWork) -> DeliveryRecord | None:
            store = uow.ledger
            if store.one_statement:
                bound = self._bind_directly(store, key, queued, run, timestamp)
                if bound is not None:
                    return bound
            return self._bind_after_reading(store, key, queued, run, timestamp)

        return self._write(work)

    @staticmethod
    def _bind_directly(store: LedgerStore, key: str, queued: str | None, run: str | None,
                       timestamp: int) -> DeliveryRecord | None:
        """The binding the call most likely asks for, as one guarded update without reading the row first: a
        queued delivery of this entry gains its run, or an ownerless authorized one its owner. The guard is the
        condition under which :meth:`_bind_after_reading` runs the same update, so a changed row is its result;
        None (nothing changed) leaves the decision to it."""
        if queued is not None and run is not None:
            changed = store.bind_run(key, queued_id=queued, run_id=run, now=timestamp)
        else:
            changed = store.bind_authorized(key, queued_id=queued, run_id=run, now=timestamp)
            if changed is not None and run is None:
                store.wake("delivery")  # a newly queued delivery
        return _public_delivery(changed)

    @staticmethod
    def _bind_after_reading(store: LedgerStore, key: str, queued: str | None, run: str | None,
                            timestamp: int) -> DeliveryRecord | None:
        row = store.delivery(key, lock=True)
        if row is None:
            return None
        state, owner = row["state"], (row["queued_id"], row["run_id"])
        # The row is locked (PostgreSQL FOR UPDATE; SQLite's write lock): the guarded updates match.
        if state == "authorized":
            row = store.bind_authorized(key, queued_id=queued, run_id=run, now=timestamp)
            if run is None:
                store.wake("delivery")  # a newly queued delivery
        elif state == "queued":
            if owner != (queued, None):  # another queue entry, or a run is already bound
                return None
            if run is not None:
                row = store.bind_run(key, queued_id=row["queued_id"], run_id=run, now=timestamp)
        elif state != "running" or owner != (queued, run):
            return None
        return _public_delivery(row)

    def defer_admission(self, envelope_id: str, *, error: str) -> DeliveryRecord | None:
        """Schedule another admission try of an ownerless ``authorized`` delivery (backoff); return the row.

        :param envelope_id: the delivery's envelope id.
        :param error: why this try failed (recorded, at most MAX_ERROR_CHARS characters).
        :returns: the delivery as it now is, or None when there is none.
        :raises LedgerInputError: ``envelope_id`` is not storable text.
        :raises LedgerPermissionError: the SQLite ledger file or its folder is unsafe (a link, another owner, open
            access).
        :raises StorageError: the database failed underneath; nothing was committed.
        """
        return self._retry(_ADMISSION, _key(envelope_id, "envelope_id"), error)

    def pending_admissions(self, *, limit: int = 20, now: int | None = None) -> list[DeliveryRecord]:
        """Ownerless ``authorized`` deliveries whose admission retry is due, soonest first.

        :param limit: the most rows to return, 1 to MAX_RETRY_BATCH.
        :param now: the time in Unix seconds (default: the ledger's clock).
        :returns: the due deliveries, soonest first.
        :raises LedgerInputError: ``limit`` or ``now`` is invalid.
        :raises LedgerPermissionError: the SQLite ledger file or its folder is unsafe (a link, another owner, open
            access).
        :raises StorageError: the database failed underneath; nothing was committed.
        """
        count = _limit(limit, MAX_RETRY_BATCH, "secure peer admission retry limit is invalid")
        return self._due(_ADMISSION, count, now)

    def nonterminal_for_chat(self, chat_id: str) -> list[DeliveryRecord]:
        """Every unfinished delivery targeting ``chat_id``, oldest first.

        :param chat_id: the target chat.
        :returns: the unfinished deliveries, oldest first.
        :raises LedgerInputError: ``chat_id`` is not storable text.
        :raises LedgerPermissionError: the SQLite ledger file or its folder is unsafe (a link, another owner, open
            access).
        :raises StorageError: the database failed underneath; nothing was committed.
        """
        key = _key(chat_id, "chat_id")
        return self._deliveries_where(deliveries.c.target_chat_id == key)

    def finish(
        self, envelope_id: str, *, succeeded: bool, result_text: str = "", error: str | None = None
    ) -> DeliveryRecord | None:
        """Complete an admitted delivery (storing the result's SHA-256) or fail any unfinished one.

        ``error`` is recorded up to MAX_FINISH_ERROR_CHARS characters; a longer text is cut and ends with
        FINISH_ERROR_CUT_MARK.

        :param envelope_id: the delivery's envelope id.
        :param succeeded: True to complete an admitted delivery, False to fail an unfinished one.
        :param result_text: the result, of which only the SHA-256 is stored.
        :param error: why it failed, or None.
        :returns: the finished delivery, or None when it is missing or in no state that may finish so.
        :raises LedgerInputError: ``envelope_id`` is not storable text, or ``result_text`` is not UTF-8 encodable text.
        :raises LedgerPermissionError: the SQLite ledger file or its folder is unsafe (a link, another owner, open
            access).
        :raises StorageError: the database failed underneath; nothing was committed.
        """
        result_hash = _result_hash(result_text)
        expected = ACTIVE_DELIVERY_STATES if succeeded else NONTERMINAL_DELIVERY_STATES
        recorded = _finish_error_text(error) if error is not None else None
        return self._transition(envelope_id, expected=expected, state="completed" if succeeded else "failed",
                                result_hash=result_hash, error=recorded)

    def recoverable(self) -> list[DeliveryRecord]:
        """Every unfinished delivery (including ``prepared`` ones a crash left behind), oldest first.

        :returns: the unfinished deliveries, oldest first.
        :raises LedgerPermissionError: the SQLite ledger file or its folder is unsafe (a link, another owner, open
            access).
        :raises StorageError: the database failed underneath; nothing was committed.
        """
        return self._deliveries_where()

    def for_run(self, run_id: str) -> DeliveryRecord | None:
        """The delivery owned by run ``run_id``, or None.

        :param run_id: the run.
        :returns: the delivery, or None when no delivery has that run.
        :raises LedgerInputError: ``run_id`` is not storable text.
        :raises LedgerPermissionError: the SQLite ledger file or its folder is unsafe (a link, another owner, open
            access).
        :raises StorageError: the database failed underneath; nothing was committed.
        """
        key = _key(run_id, "run_id")
        return self._read(lambda uow: _public_delivery(uow.ledger.delivery_of_run(key)), one_statement=True)

    def nonterminal_for_connection(self, connection_id: str) -> list[DeliveryRecord]:
        """Every unfinished delivery received over ``connection_id``, oldest first.

        :param connection_id: the connection.
        :returns: the unfinished deliveries, oldest first.
        :raises LedgerInputError: ``connection_id`` is not storable text.
        :raises LedgerPermissionError: the SQLite ledger file or its folder is unsafe (a link, another owner, open
            access).
        :raises StorageError: the database failed underneath; nothing was committed.
        """
        key = _key(connection_id, "connection_id")
        return self._deliveries_where(deliveries.c.connection_id == key)

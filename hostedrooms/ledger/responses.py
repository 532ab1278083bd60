"""Response intents: the reply owed to the Hub for a request delivery, bound to its digest before it leaves."""

from __future__ import annotations

from sqlalchemy import bindparam

from ..errors import LedgerStateError
from ..models import deliveries
from ..records import DeliveryRecord
from ..store.ledger import ACTIVE_DELIVERY_STATES, RESPONSE_WAITING
from ..uow import UnitOfWork
from .claims import (
    _key,
    _limit,
    _optional_key,
    response_claim,
)
from .retries import Retrying, retry_machine
from .rows import _public_delivery, fetch_delivery

# An uncommitted response intent (``request``): retried with backoff until the Hub has it, or cleared.
_RESPONSE = retry_machine(
    "response", deliveries, "envelope_id", RESPONSE_WAITING,
    guard=(deliveries.c.response_request_id == bindparam("request"),),
    retryable=lambda row, guard: (row["state"] in ACTIVE_DELIVERY_STATES
                                  and row["response_request_id"] == guard["request"]
                                  and int(row["response_committed"] or 0) == 0),
    attempts="response_attempts", retry_at="response_retry_at", last_error="response_last_error", failed=None,
    fetch=fetch_delivery, public=_public_delivery)


class ResponseIntents(Retrying):
    """Response intents of admitted deliveries (a part of :class:`~hostedrooms.ledger.DeliveryLedger`)."""

    def prepare_response(
        self, envelope_id: str, *, request_id: str, body: str, request_response: bool
    ) -> DeliveryRecord | None:
        """Bind the reply owed for a request delivery to its digest before it is sent (idempotent).

        :param envelope_id: the delivery's envelope id.
        :param request_id: the request the reply answers.
        :param body: the reply's text.
        :param request_response: whether the reply itself asks for a response.
        :returns: the delivery with its response intent, or None when it is missing, finished or an instruction.
        :raises LedgerInputError: an argument is invalid (``field`` names it).
        :raises LedgerStateError: another intent is already bound to this delivery.
        :raises LedgerPermissionError: the SQLite ledger file or its folder is unsafe (a link, another owner, open
            access).
        :raises StorageError: the database failed underneath; nothing was committed.
        """
        key = _key(envelope_id, "envelope_id")
        digest = response_claim(request_id=request_id, body=body, request_response=request_response)
        timestamp = self._now()
        params = {"request": request_id, "digest": digest, "body": body, "request_response": int(request_response),
                  "now": timestamp}

        def work(uow: UnitOfWork) -> DeliveryRecord | None:
            store = uow.ledger
            if store.one_statement:
                # The common call (a request delivery with no intent yet) as one guarded update: its guard is what
                # the reading path checks before the same update, so a changed row is that path's result.
                changed = store.prepare_response(key, direct=True, params=params)
                if changed is not None:
                    store.wake("response")
                    return _public_delivery(changed)
            row = store.delivery(key, lock=True)
            if row is None or row["state"] not in ACTIVE_DELIVERY_STATES or row["kind"] == "instruction":
                return None
            if row["response_request_digest"] is not None:
                if row["response_request_digest"] != digest:
                    raise LedgerStateError("secure peer response intent changed")
                return _public_delivery(row)
            # The row is locked (PostgreSQL FOR UPDATE; SQLite's write lock): unchanged when the guard misses.
            changed = store.prepare_response(key, direct=False, params=params)
            if changed is not None:
                store.wake("response")
            return _public_delivery(row if changed is None else changed)

        return self._write(work)

    def mark_response_committed(self, envelope_id: str, *, request_id: str | None = None) -> DeliveryRecord | None:
        """Record that the reply (``request_id``, or any when None) reached the Hub; return the row.

        :param envelope_id: the delivery's envelope id.
        :param request_id: the reply's request id, or None for whichever intent the delivery holds.
        :returns: the delivery as it now is, or None when there is none.
        :raises LedgerInputError: an id is not storable text.
        :raises LedgerStateError: the delivery's response state is ambiguous.
        :raises LedgerPermissionError: the SQLite ledger file or its folder is unsafe (a link, another owner, open
            access).
        :raises StorageError: the database failed underneath; nothing was committed.
        """
        key = _key(envelope_id, "envelope_id")
        request = _optional_key(request_id, "request_id")
        timestamp = self._now()

        def work(uow: UnitOfWork) -> DeliveryRecord | None:
            store = uow.ledger
            changed = store.commit_response(key, request_id=request, now=timestamp)
            if len(changed) > 1:
                raise LedgerStateError("secure peer response state is ambiguous")
            return _public_delivery(changed[0] if changed else store.delivery(key))

        return self._write(work)

    def clear_response_intent(self, envelope_id: str, *, request_id: str) -> DeliveryRecord | None:
        """Drop an uncommitted response intent ``request_id`` (so another may be prepared); return the row.

        :param envelope_id: the delivery's envelope id.
        :param request_id: the request the reply answers.
        :returns: the delivery as it now is, or None when there is none.
        :raises LedgerInputError: an id is not storable text.
        :raises LedgerPermissionError: the SQLite ledger file or its folder is unsafe (a link, another owner, open
            access).
        :raises StorageError: the database failed underneath; nothing was committed.
        """
        key, request = _key(envelope_id, "envelope_id"), _key(request_id, "request_id")
        timestamp = self._now()

        def work(uow: UnitOfWork) -> DeliveryRecord | None:
            store = uow.ledger
            changed = store.clear_response(key, request_id=request, now=timestamp)
            return _public_delivery(store.delivery(key) if changed is None else changed)

        return self._write(work)

    def defer_response(self, envelope_id: str, *, request_id: str, error: str) -> DeliveryRecord | None:
        """Persist bounded exponential retry state for one response intent; return the row.

        :param envelope_id: the delivery's envelope id.
        :param request_id: the request the reply answers.
        :param error: why this send failed (recorded, at most MAX_ERROR_CHARS characters).
        :returns: the delivery as it now is, or None when there is none.
        :raises LedgerInputError: an id is not storable text.
        :raises LedgerPermissionError: the SQLite ledger file or its folder is unsafe (a link, another owner, open
            access).
        :raises StorageError: the database failed underneath; nothing was committed.
        """
        key, request = _key(envelope_id, "envelope_id"), _key(request_id, "request_id")
        return self._retry(_RESPONSE, key, error, request=request)

    def pending_responses(self, *, limit: int = 8, now: int | None = None) -> list[DeliveryRecord]:
        """Uncommitted response intents whose retry is due, soonest first (limit up to the capacity).

        :param limit: the most rows to return, 1 to MAX_NONTERMINAL_DELIVERIES.
        :param now: the time in Unix seconds (default: the ledger's clock).
        :returns: the deliveries whose response is due, soonest first.
        :raises LedgerInputError: ``limit`` or ``now`` is invalid.
        :raises LedgerPermissionError: the SQLite ledger file or its folder is unsafe (a link, another owner, open
            access).
        :raises StorageError: the database failed underneath; nothing was committed.
        """
        return self._due(_RESPONSE, _limit(limit, self._capacity(), "secure peer response retry limit is invalid"), now)

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
        """Bind the reply owed for a request delivery to its digest before it is sent (idempotent)."""
        key = _key(envelope_id, "envelope_id")
        digest = response_claim(request_id=request_id, body=body, request_response=request_response)
        timestamp = self._now()
        params = {"request": request_id, "digest": digest, "body": body, "request_response": int(request_response),
                  "now": timestamp}

        def work(uow: UnitOfWork) -> DeliveryRecord | None:
            store = uow.ledger
            if store.fast_path:
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
        """Record that the reply (``request_id``, or any when None) reached the Hub; return the row."""
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
        """Drop an uncommitted response intent ``request_id`` (so another may be prepared); return the row."""
        key, request = _key(envelope_id, "envelope_id"), _key(request_id, "request_id")
        timestamp = self._now()

        def work(uow: UnitOfWork) -> DeliveryRecord | None:
            store = uow.ledger
            changed = store.clear_response(key, request_id=request, now=timestamp)
            return _public_delivery(store.delivery(key) if changed is None else changed)

        return self._write(work)

    def defer_response(self, envelope_id: str, *, request_id: str, error: str) -> DeliveryRecord | None:
        """Persist bounded exponential retry state for one response intent; return the row."""
        key, request = _key(envelope_id, "envelope_id"), _key(request_id, "request_id")
        return self._retry(_RESPONSE, key, error, request=request)

    def pending_responses(self, *, limit: int = 8, now: int | None = None) -> list[DeliveryRecord]:
        """Uncommitted response intents whose retry is due, soonest first (limit up to the capacity)."""
        return self._due(_RESPONSE, _limit(limit, self._capacity(), "secure peer response retry limit is invalid"), now)

"""Outbound intents: a request this side sends, bound to its digest before it leaves, retried or failed."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from sqlalchemy import ColumnElement

from ..errors import LedgerStateError
from ..models import outbound_intents
from ..records import OutboundRecord
from ..store.ledger import OUTBOUND_WAITING, Row
from ..uow import UnitOfWork
from .claims import (
    MAX_RETRY_BATCH,
    _key,
    _limit,
    _response_text,
    outbound_claim,
)
from .retries import ERROR, Retrying, retry_machine
from .rows import _public_outbound, _public_rows, fetch_outbound

# A pending intent's send: retried with backoff until the Hub's response is committed, or failed.
_SEND = retry_machine(
    "send", outbound_intents, "request_id", OUTBOUND_WAITING, retryable=lambda row, _: row["state"] == "pending",
    attempts="attempts", retry_at="retry_at", last_error="last_error",
    failed={"state": "failed", "retry_at": None, "last_error": ERROR}, fetch=fetch_outbound, public=_public_outbound)


class OutboundIntents(Retrying):
    """Outbound intents (a part of :class:`~hostedrooms.ledger.DeliveryLedger`)."""

    def _pending_outbound_where(self, now: Any, *conditions: ColumnElement[bool]) -> list[OutboundRecord]:
        """Pending intents matching ``conditions``, oldest first, after those expiring by ``now`` are failed."""
        timestamp = self._timestamp(now)

        def work(uow: UnitOfWork) -> list[OutboundRecord]:
            store = uow.ledger
            store.expire_pending(timestamp)
            return _public_rows(uow, store.pending_outbound_where(*conditions), _public_outbound)

        return self._write(work)

    def prepare_outbound(
        self, *, request_id: str, source_session_id: str, source_run_id: str, snapshot: Mapping[str, Any],
        body: str, action: str, expires_at: int,
    ) -> tuple[OutboundRecord, bool]:
        """Bind an outbound request to its digest before it is sent; return ``(row, created)``.

        Replaying the same intent returns the stored row; a different intent under the same ``request_id``
        raises ``LedgerStateError`` (a ``RuntimeError``).

        :param request_id: the outbound request's id.
        :param source_session_id: the chat the request is sent from.
        :param source_run_id: the run that sends it.
        :param snapshot: the route snapshot (its keys are checked, see the delivery ledger page).
        :param body: the request's text.
        :param action: ``"instruction"`` or ``"request_reply"``.
        :param expires_at: when the intent expires, in Unix seconds.
        :returns: ``(row, created)``: the intent, and whether this call recorded it.
        :raises LedgerInputError: an argument is invalid (``field`` names it).
        :raises LedgerStateError: ``request_id`` is stored with another intent.
        :raises LedgerPermissionError: the SQLite ledger file or its folder is unsafe (a link, another owner, open
            access).
        :raises StorageError: the database failed underneath; nothing was committed.
        """
        values, digest, snapshot_text = outbound_claim(
            request_id=request_id, source_session_id=source_session_id, source_run_id=source_run_id,
            snapshot=snapshot, body=body, action=action, expires_at=expires_at)
        timestamp = self._now()

        def known(row: Row) -> tuple[OutboundRecord, bool]:
            if row["intent_digest"] != digest:
                raise LedgerStateError("secure peer outbound intent changed")
            public = _public_outbound(row)
            assert public is not None
            return public, False

        row_values = {**values, "intent_digest": digest, "snapshot_json": snapshot_text, "state": "pending",
                      "retry_at": timestamp, "created_at": timestamp, "updated_at": timestamp}

        def work(uow: UnitOfWork) -> tuple[OutboundRecord, bool]:
            store = uow.ledger
            # Read first (the full path), or insert first: the insert does nothing for a known id, and the row it
            # then reads is the one the full path would have read.
            if not store.one_statement:
                row = store.outbound(request_id, lock=True)
                if row is not None:
                    return known(row)
            inserted = store.insert_outbound(row_values)
            if inserted is None:
                row = store.outbound(request_id)
                assert row is not None
                return known(row)
            public = _public_outbound(inserted)
            assert public is not None
            store.wake("outbound")
            return public, True

        return self._write(work)

    def pending_outbound_for_chat(self, source_session_id: str, *, now: int | None = None) -> list[OutboundRecord]:
        """Pending outbound intents of one chat, oldest first (expired ones are failed first).

        :param source_session_id: the chat.
        :param now: the time in Unix seconds, to expire intents by (default: the ledger's clock).
        :returns: the pending intents, oldest first.
        :raises LedgerInputError: an argument is invalid.
        :raises LedgerPermissionError: the SQLite ledger file or its folder is unsafe (a link, another owner, open
            access).
        :raises StorageError: the database failed underneath; nothing was committed.
        """
        key = _key(source_session_id, "source_session_id")
        return self._pending_outbound_where(now, outbound_intents.c.source_session_id == key)

    def pending_outbound_for_route(
        self, connection_id: str, source_route_id: str, source_route_revision: str, *, now: int | None = None
    ) -> list[OutboundRecord]:
        """Pending outbound intents of one exact route revision, oldest first (expired ones failed first).

        :param connection_id: the route's connection.
        :param source_route_id: the route.
        :param source_route_revision: the route's revision.
        :param now: the time in Unix seconds, to expire intents by (default: the ledger's clock).
        :returns: the pending intents, oldest first.
        :raises LedgerInputError: an argument is invalid.
        :raises LedgerPermissionError: the SQLite ledger file or its folder is unsafe (a link, another owner, open
            access).
        :raises StorageError: the database failed underneath; nothing was committed.
        """
        keys = (_key(connection_id, "connection_id"), _key(source_route_id, "source_route_id"),
                _key(source_route_revision, "source_route_revision"))
        return self._pending_outbound_where(
            now, outbound_intents.c.connection_id == keys[0], outbound_intents.c.source_route_id == keys[1],
            outbound_intents.c.source_route_revision == keys[2])

    def pending_outbound_for_connection(self, connection_id: str, *, now: int | None = None) -> list[OutboundRecord]:
        """Pending outbound intents of one connection, oldest first (expired ones are failed first).

        :param connection_id: the connection.
        :param now: the time in Unix seconds, to expire intents by (default: the ledger's clock).
        :returns: the pending intents, oldest first.
        :raises LedgerInputError: an argument is invalid.
        :raises LedgerPermissionError: the SQLite ledger file or its folder is unsafe (a link, another owner, open
            access).
        :raises StorageError: the database failed underneath; nothing was committed.
        """
        key = _key(connection_id, "connection_id")
        return self._pending_outbound_where(now, outbound_intents.c.connection_id == key)

    def outbound(self, request_id: str) -> OutboundRecord | None:
        """The outbound intent ``request_id``, or None.

        :param request_id: the outbound request's id.
        :returns: the intent, or None when there is none.
        :raises LedgerInputError: ``request_id`` is not storable text.
        :raises LedgerPermissionError: the SQLite ledger file or its folder is unsafe (a link, another owner, open
            access).
        :raises StorageError: the database failed underneath; nothing was committed.
        """
        key = _key(request_id, "request_id")
        return self._read(lambda uow: _public_outbound(uow.ledger.outbound(key)), one_statement=True)

    def commit_outbound(self, request_id: str, response: Mapping[str, Any]) -> OutboundRecord | None:
        """Store the Hub's response of a pending intent (idempotent; a different response raises).

        :param request_id: the outbound request's id.
        :param response: the Hub's response (a JSON object, at most MAX_JSON_DEPTH deep).
        :returns: the intent as it now is, or None when there is none.
        :raises LedgerInputError: an argument is invalid.
        :raises LedgerStateError: the intent was committed with a different response.
        :raises LedgerPermissionError: the SQLite ledger file or its folder is unsafe (a link, another owner, open
            access).
        :raises StorageError: the database failed underneath; nothing was committed.
        """
        key = _key(request_id, "request_id")
        text, timestamp = _response_text(response), self._now()

        def work(uow: UnitOfWork) -> OutboundRecord | None:
            store = uow.ledger
            if store.one_statement:
                # A pending intent (the common call) as one guarded update: the reading path runs the same update
                # exactly when the row is pending, so a changed row is its result.
                changed = store.commit_outbound(key, response=text, now=timestamp)
                if changed is not None:
                    return _public_outbound(changed)
            row = store.outbound(key, lock=True)
            if row is None:
                return None
            if row["state"] == "committed" and str(row["response_json"] or "") != text:
                raise LedgerStateError("secure peer outbound result changed")
            if row["state"] != "pending":
                return _public_outbound(row)
            # The row is locked (PostgreSQL FOR UPDATE; SQLite's write lock): unchanged when the guard misses.
            changed = store.commit_outbound(key, response=text, now=timestamp)
            return _public_outbound(row if changed is None else changed)

        return self._write(work)

    def defer_outbound(self, request_id: str, error: str) -> OutboundRecord | None:
        """Schedule another send of a pending intent (backoff); return the row.

        :param request_id: the outbound request's id.
        :param error: why this send failed (recorded, at most MAX_ERROR_CHARS characters).
        :returns: the intent as it now is, or None when there is none.
        :raises LedgerInputError: ``request_id`` is not storable text.
        :raises LedgerPermissionError: the SQLite ledger file or its folder is unsafe (a link, another owner, open
            access).
        :raises StorageError: the database failed underneath; nothing was committed.
        """
        return self._retry(_SEND, _key(request_id, "request_id"), error)

    def fail_outbound(self, request_id: str, error: str) -> OutboundRecord | None:
        """Fail a pending intent; return the current row.

        :param request_id: the outbound request's id.
        :param error: why it failed (recorded, at most MAX_ERROR_CHARS characters).
        :returns: the intent as it now is, or None when there is none.
        :raises LedgerInputError: ``request_id`` is not storable text.
        :raises LedgerPermissionError: the SQLite ledger file or its folder is unsafe (a link, another owner, open
            access).
        :raises StorageError: the database failed underneath; nothing was committed.
        """
        return self._fail(_SEND, _key(request_id, "request_id"), error)

    def pending_outbound(self, *, limit: int = 8, now: int | None = None) -> list[OutboundRecord]:
        """Pending intents whose send is due, soonest first.

        :param limit: the most rows to return, 1 to MAX_RETRY_BATCH.
        :param now: the time in Unix seconds (default: the ledger's clock).
        :returns: the due intents, soonest first.
        :raises LedgerInputError: ``limit`` or ``now`` is invalid.
        :raises LedgerPermissionError: the SQLite ledger file or its folder is unsafe (a link, another owner, open
            access).
        :raises StorageError: the database failed underneath; nothing was committed.
        """
        return self._due(_SEND, _limit(limit, MAX_RETRY_BATCH, "secure peer outbound retry limit is invalid"), now)

    def recoverable_outbound(self, *, limit: int = 50) -> list[OutboundRecord]:
        """Return every nonterminal outbound intent, including future retries (oldest first).

        :param limit: the most rows to return, 1 to MAX_RETRY_BATCH.
        :returns: the unfinished intents, oldest first.
        :raises LedgerInputError: ``limit`` is invalid.
        :raises LedgerPermissionError: the SQLite ledger file or its folder is unsafe (a link, another owner, open
            access).
        :raises StorageError: the database failed underneath; nothing was committed.
        """
        count = _limit(limit, MAX_RETRY_BATCH, "secure peer outbound recovery limit is invalid")

        def work(uow: UnitOfWork) -> list[OutboundRecord]:
            return _public_rows(uow, uow.ledger.pending_outbound_where(), _public_outbound, count)

        return self._read(work)

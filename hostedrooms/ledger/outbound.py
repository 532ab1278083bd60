"""Outbound intents: a request this side sends, bound to its digest before it leaves, retried or failed."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from sqlalchemy import ColumnElement, RowMapping, bindparam, select, update

from ..dialect import StoreDialect
from ..errors import LedgerStateError
from ..records import OutboundRecord
from ..uow import UnitOfWork
from .claims import (
    EXPIRED_ERROR,
    MAX_RETRY_BATCH,
    _key,
    _limit,
    _response_text,
    outbound_claim,
)
from .retries import ERROR, Retrying, retry_machine
from .rows import OUT, _outbound, _public_outbound, _public_rows, _returned

# Before a chat's, route's or connection's pending intents are listed, those expiring by then fail.
_EXPIRE_PENDING = (update(OUT).where(OUT.c.state == "pending", OUT.c.expires_at <= bindparam("now"))
                   .values(state="failed", retry_at=None, last_error=EXPIRED_ERROR, updated_at=bindparam("expired_at")))


def _insert_outbound(dialect: StoreDialect) -> Any:
    """INSERT ... ON CONFLICT DO NOTHING RETURNING *: a concurrent prepare of the same id (PostgreSQL) returns
    no row and becomes a replay (psycopg reports no rowcount for it). Its columns are the parameters'."""
    return dialect.insert(OUT).on_conflict_do_nothing(index_elements=["request_id"]).returning(*OUT.c)


_COMMIT = (
    update(OUT).where(OUT.c.request_id == bindparam("key"), OUT.c.state == "pending")
    .values(state="committed", response_json=bindparam("response"), retry_at=None, last_error=None,
            updated_at=bindparam("now"))
    .returning(*OUT.c))

# A pending intent's send: retried with backoff until the Hub's response is committed, or failed.
_SEND = retry_machine(
    OUT, "request_id", (OUT.c.state == "pending",), retryable=lambda row, _: row["state"] == "pending",
    attempts="attempts", retry_at="retry_at", last_error="last_error",
    failed={"state": "failed", "retry_at": None, "last_error": ERROR}, fetch=_outbound, public=_public_outbound)


class OutboundIntents(Retrying):
    """Outbound intents (a part of :class:`~hostedrooms.ledger.DeliveryLedger`)."""

    def _pending_outbound_where(self, now: Any, *conditions: ColumnElement[bool]) -> list[OutboundRecord]:
        timestamp = self._timestamp(now)

        def work(uow: UnitOfWork) -> list[OutboundRecord]:
            uow.execute(_EXPIRE_PENDING, {"now": timestamp, "expired_at": timestamp})
            statement = (select(OUT).where(OUT.c.state == "pending", *conditions)
                         .order_by(*self._order(uow, table=OUT)))
            return _public_rows(uow, statement, _public_outbound)

        return self._write(work)

    def prepare_outbound(
        self, *, request_id: str, source_session_id: str, source_run_id: str, snapshot: Mapping[str, Any],
        body: str, action: str, expires_at: int,
    ) -> tuple[OutboundRecord, bool]:
        """Bind an outbound request to its digest before it is sent; return ``(row, created)``.

        Replaying the same intent returns the stored row; a different intent under the same ``request_id``
        raises ``LedgerStateError`` (a ``RuntimeError``).
        """
        values, digest, snapshot_text = outbound_claim(
            request_id=request_id, source_session_id=source_session_id, source_run_id=source_run_id,
            snapshot=snapshot, body=body, action=action, expires_at=expires_at)
        timestamp = self._now()

        def known(row: RowMapping) -> tuple[OutboundRecord, bool]:
            if row["intent_digest"] != digest:
                raise LedgerStateError("secure peer outbound intent changed")
            public = _public_outbound(row)
            assert public is not None
            return public, False

        def work(uow: UnitOfWork) -> tuple[OutboundRecord, bool]:
            row = _outbound(uow, request_id, lock=True)
            if row is not None:
                return known(row)
            inserted = _returned(uow, uow.dialect.statement("ledger.insert_outbound", _insert_outbound), {
                **values, "intent_digest": digest, "snapshot_json": snapshot_text, "state": "pending",
                "retry_at": timestamp, "created_at": timestamp, "updated_at": timestamp})
            if inserted is None:
                row = _outbound(uow, request_id)
                assert row is not None
                return known(row)
            public = _public_outbound(inserted)
            assert public is not None
            self._wake(uow, "outbound")
            return public, True

        return self._write(work)

    def pending_outbound_for_chat(self, source_session_id: str, *, now: int | None = None) -> list[OutboundRecord]:
        """Pending outbound intents of one chat, oldest first (expired ones are failed first)."""
        key = _key(source_session_id, "source_session_id")
        return self._pending_outbound_where(now, OUT.c.source_session_id == key)

    def pending_outbound_for_route(
        self, connection_id: str, source_route_id: str, source_route_revision: str, *, now: int | None = None
    ) -> list[OutboundRecord]:
        """Pending outbound intents of one exact route revision, oldest first (expired ones failed first)."""
        keys = (_key(connection_id, "connection_id"), _key(source_route_id, "source_route_id"),
                _key(source_route_revision, "source_route_revision"))
        return self._pending_outbound_where(
            now, OUT.c.connection_id == keys[0], OUT.c.source_route_id == keys[1],
            OUT.c.source_route_revision == keys[2])

    def pending_outbound_for_connection(self, connection_id: str, *, now: int | None = None) -> list[OutboundRecord]:
        """Pending outbound intents of one connection, oldest first (expired ones are failed first)."""
        key = _key(connection_id, "connection_id")
        return self._pending_outbound_where(now, OUT.c.connection_id == key)

    def outbound(self, request_id: str) -> OutboundRecord | None:
        """The outbound intent ``request_id``, or None."""
        key = _key(request_id, "request_id")
        return self._read(lambda uow: _public_outbound(_outbound(uow, key)))

    def commit_outbound(self, request_id: str, response: Mapping[str, Any]) -> OutboundRecord | None:
        """Store the Hub's response of a pending intent (idempotent; a different response raises)."""
        key = _key(request_id, "request_id")
        text, timestamp = _response_text(response), self._now()

        def work(uow: UnitOfWork) -> OutboundRecord | None:
            row = _outbound(uow, key, lock=True)
            if row is None:
                return None
            if row["state"] == "committed" and str(row["response_json"] or "") != text:
                raise LedgerStateError("secure peer outbound result changed")
            if row["state"] != "pending":
                return _public_outbound(row)
            # The row is locked (PostgreSQL FOR UPDATE; SQLite's write lock): unchanged when the guard misses.
            changed = _returned(uow, _COMMIT, {"key": key, "response": text, "now": timestamp})
            return _public_outbound(row if changed is None else changed)

        return self._write(work)

    def defer_outbound(self, request_id: str, error: str) -> OutboundRecord | None:
        """Schedule another send of a pending intent (backoff); return the row."""
        return self._retry(_SEND, _key(request_id, "request_id"), error)

    def fail_outbound(self, request_id: str, error: str) -> OutboundRecord | None:
        """Fail a pending intent; return the current row."""
        return self._fail(_SEND, _key(request_id, "request_id"), error)

    def pending_outbound(self, *, limit: int = 8, now: int | None = None) -> list[OutboundRecord]:
        """Pending intents whose send is due, soonest first."""
        return self._due(_SEND, _limit(limit, MAX_RETRY_BATCH, "secure peer outbound retry limit is invalid"), now)

    def recoverable_outbound(self, *, limit: int = 50) -> list[OutboundRecord]:
        """Return every nonterminal outbound intent, including future retries (oldest first)."""
        count = _limit(limit, MAX_RETRY_BATCH, "secure peer outbound recovery limit is invalid")

        def work(uow: UnitOfWork) -> list[OutboundRecord]:
            statement = select(OUT).where(OUT.c.state == "pending").order_by(*self._order(uow, table=OUT))
            return _public_rows(uow, statement, _public_outbound, count)

        return self._read(work)

"""Ledger rows: decoding rows into the public shapes, and ordered listings that skip undecodable rows."""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from typing import Any, TypeVar, cast

from sqlalchemy import Select

from ..errors import StorageError
from ..records import DeliveryRecord, OutboundRecord
from ..store.ledger import LedgerStore, Row
from ..uow import UnitOfWork
from ..validation import stored_json

_log = logging.getLogger("hostedrooms.ledger")
#: A public record type (DeliveryRecord, OutboundRecord).
_R = TypeVar("_R")


# Stored JSON that cannot be decoded (written by the reference or by hand: not JSON, or nested deeper than the
# interpreter decodes) is a StorageError naming the row for a call about that row (nothing it would write is
# committed); a listing skips the row with a warning instead, so one bad row never blocks a queue. Skipped rows
# stay stored until they expire or are finished, and ``verify`` reports them.


def _public_delivery(row: Mapping[str, Any] | None) -> DeliveryRecord | None:
    if row is None:
        return None
    item = dict(row)
    item["body"] = stored_json(item.pop("body_json"), lambda: f"secure peer delivery {row['envelope_id']!r}")
    return cast(DeliveryRecord, item)


def _public_outbound(row: Mapping[str, Any] | None) -> OutboundRecord | None:
    if row is None:
        return None

    def where() -> str:
        return f"secure peer outbound intent {row['request_id']!r}"

    item = dict(row)
    item["snapshot"] = stored_json(item.pop("snapshot_json"), where)
    response = item.pop("response_json")
    item["response"] = stored_json(response, where) if response else None
    return cast(OutboundRecord, item)


def _listed(public: Callable[[Any], _R | None], row: Any) -> _R | None:
    """``public(row)``, or None (with a warning) for a row whose stored JSON cannot be decoded."""
    try:
        return public(row)
    except StorageError as exc:
        _log.warning("secure peer ledger listing skipped a row: %s", exc)
        return None


def _public_rows(
    uow: UnitOfWork, statement: Select[Any], public: Callable[[Any], _R | None], limit: int | None = None,
) -> list[_R]:
    """The decodable rows of ``statement`` in order, at most ``limit``: rows skipped as undecodable do not count,
    so the next ones are read instead."""
    if limit is None:
        return [item for row in uow.execute(statement).mappings() if (item := _listed(public, row)) is not None]
    found: list[_R] = []
    offset = 0
    while True:
        page = statement.limit(limit) if not offset else statement.limit(limit).offset(offset)
        rows = uow.execute(page).mappings().all()
        for row in rows:
            item = _listed(public, row)
            if item is not None:
                found.append(item)
                if len(found) == limit:
                    return found
        if len(rows) < limit:
            return found
        offset += len(rows)


def fetch_delivery(store: LedgerStore, envelope_id: str, *, lock: bool = False) -> Row | None:
    """The delivery row of ``envelope_id`` (a retry machine's fetch)."""
    return store.delivery(envelope_id, lock=lock)


def fetch_outbound(store: LedgerStore, request_id: str, *, lock: bool = False) -> Row | None:
    """The outbound intent row of ``request_id`` (a retry machine's fetch)."""
    return store.outbound(request_id, lock=lock)

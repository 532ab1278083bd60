"""Ledger rows: lookups by key, ordered listings, the row a guarded UPDATE returned, and decoding rows into the
public shapes."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any, TypeVar, cast

from sqlalchemy import ColumnElement, RowMapping, Select, Table, bindparam, select

from ..dialect import StoreDialect
from ..errors import StorageError
from ..models import deliveries, outbound_intents
from ..records import DeliveryRecord, OutboundRecord
from ..uow import UnitOfWork
from ..validation import stored_json

D = deliveries
OUT = outbound_intents
_log = logging.getLogger("hostedrooms.ledger")
#: A public record type (DeliveryRecord, OutboundRecord).
_R = TypeVar("_R")


# Stored JSON that cannot be decoded (written by the reference or by hand: not JSON, or nested deeper than the
# interpreter decodes) is a StorageError naming the row for a call about that row (nothing it would write is
# committed); a listing skips the row with a warning instead, so one bad row never blocks a queue. Skipped rows
# stay stored until they expire or are finished, and ``verify`` reports them.


def _public_delivery(row: RowMapping | None) -> DeliveryRecord | None:
    if row is None:
        return None
    item = dict(row)
    item["body"] = stored_json(item.pop("body_json"), lambda: f"secure peer delivery {row['envelope_id']!r}")
    return cast(DeliveryRecord, item)


def _public_outbound(row: RowMapping | None) -> OutboundRecord | None:
    if row is None:
        return None

    def where() -> str:
        return f"secure peer outbound intent {row['request_id']!r}"

    item = dict(row)
    item["snapshot"] = stored_json(item.pop("snapshot_json"), where)
    response = item.pop("response_json")
    item["response"] = stored_json(response, where) if response else None
    return cast(OutboundRecord, item)


def _listed(public: Callable[[RowMapping], _R | None], row: RowMapping) -> _R | None:
    """``public(row)``, or None (with a warning) for a row whose stored JSON cannot be decoded."""
    try:
        return public(row)
    except StorageError as exc:
        _log.warning("secure peer ledger listing skipped a row: %s", exc)
        return None


def _public_rows(
    uow: UnitOfWork, statement: Select[Any], public: Callable[[RowMapping], _R | None], limit: int | None = None,
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


def _fetch(uow: UnitOfWork, table: Table, key: ColumnElement[bool], *, lock: bool = False) -> RowMapping | None:
    statement = select(table).where(key)
    if lock:
        statement = uow.dialect.for_update(statement)
    return uow.execute(statement).mappings().first()


# Built once: a row is read by key several times per transition, and building the statement (cache key included)
# cost more than running it. The locking variants differ by backend: StoreDialect.statement() keeps one per backend.
_SELECT_DELIVERY = select(D).where(D.c.envelope_id == bindparam("key"))
_SELECT_OUTBOUND = select(OUT).where(OUT.c.request_id == bindparam("key"))


def _lock_delivery(dialect: StoreDialect) -> Select[Any]:
    return dialect.for_update(_SELECT_DELIVERY)


def _lock_outbound(dialect: StoreDialect) -> Select[Any]:
    return dialect.for_update(_SELECT_OUTBOUND)


def _delivery(uow: UnitOfWork, envelope_id: str, *, lock: bool = False) -> RowMapping | None:
    """The delivery row of ``envelope_id`` (locked until the transaction ends with ``lock``), or None."""
    statement = uow.dialect.statement("ledger.lock_delivery", _lock_delivery) if lock else _SELECT_DELIVERY
    return uow.execute(statement, {"key": envelope_id}).mappings().first()


def _outbound(uow: UnitOfWork, request_id: str, *, lock: bool = False) -> RowMapping | None:
    """The outbound intent row of ``request_id`` (locked until the transaction ends with ``lock``), or None."""
    statement = uow.dialect.statement("ledger.lock_outbound", _lock_outbound) if lock else _SELECT_OUTBOUND
    return uow.execute(statement, {"key": request_id}).mappings().first()


def _returned(uow: UnitOfWork, statement: Any, params: dict[str, Any]) -> RowMapping | None:
    """The row a guarded ``UPDATE ... RETURNING`` changed, or None when its guard matched no row."""
    return uow.execute(statement, params).mappings().first()

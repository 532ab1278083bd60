"""Retention: finished deliveries and intents are deleted once untouched for a retention period."""

from __future__ import annotations

from typing import Any, cast

from sqlalchemy import CursorResult, delete

from ..errors import LedgerInputError
from ..uow import UnitOfWork
from .base import LedgerBase
from .claims import _INT64_MAX, _INT64_MIN, DEFAULT_RETAIN_SECONDS, TERMINAL_DELIVERY_STATES
from .rows import OUT, D


def _changed(uow: UnitOfWork, statement: Any) -> int:
    result = cast("CursorResult[Any]", uow.execute(statement))
    return int(result.rowcount or 0)


class Retention(LedgerBase):
    """Pruning of finished rows (a part of :class:`~hostedrooms.ledger.DeliveryLedger`)."""

    def prune(self, *, retain_seconds: int = DEFAULT_RETAIN_SECONDS) -> int:
        """Delete terminal deliveries and intents untouched for ``retain_seconds``; return how many."""
        if type(retain_seconds) is not int or not 0 <= retain_seconds <= _INT64_MAX:
            raise LedgerInputError("secure peer ledger retention is invalid", field="retain_seconds")
        # Timestamps are 64-bit: a cutoff below the smallest one deletes nothing, as any older cutoff would.
        cutoff = max(_INT64_MIN, self._now() - retain_seconds)

        def work(uow: UnitOfWork) -> int:
            removed = _changed(uow, delete(D).where(D.c.state.in_(sorted(TERMINAL_DELIVERY_STATES)),
                                                    D.c.updated_at < cutoff))
            return removed + _changed(uow, delete(OUT).where(OUT.c.state.in_(("committed", "failed")),
                                                           OUT.c.updated_at < cutoff))

        return self._write(work)

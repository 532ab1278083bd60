"""Retention: finished deliveries and intents are deleted once untouched for a retention period."""

from __future__ import annotations

from ..errors import LedgerInputError
from .base import LedgerBase
from .claims import _INT64_MAX, _INT64_MIN, DEFAULT_RETAIN_SECONDS


class Retention(LedgerBase):
    """Pruning of finished rows (a part of :class:`~hostedrooms.ledger.DeliveryLedger`)."""

    def prune(self, *, retain_seconds: int = DEFAULT_RETAIN_SECONDS) -> int:
        """Delete terminal deliveries and intents untouched for ``retain_seconds``; return how many.

        :param retain_seconds: how long a finished row is kept after its last change (default: 30 days).
        :returns: the number of rows deleted.
        :raises LedgerInputError: ``retain_seconds`` is not an int from 0 to 2**63 - 1.
        :raises LedgerPermissionError: the SQLite ledger file or its folder is unsafe (a link, another owner, open
            access).
        :raises StorageError: the database failed underneath; nothing was committed.
        """
        if type(retain_seconds) is not int or not 0 <= retain_seconds <= _INT64_MAX:
            raise LedgerInputError("secure peer ledger retention is invalid", field="retain_seconds")
        # Timestamps are 64-bit: a cutoff below the smallest one deletes nothing, as any older cutoff would.
        cutoff = max(_INT64_MIN, self._now() - retain_seconds)

        return self._write(lambda uow: uow.ledger.prune(cutoff))

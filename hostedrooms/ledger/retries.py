"""The one retry/fail state machine of the ledger, shared by admissions, response intents and outbound intents.

A row *waiting* for a remote step (an ``authorized`` delivery no queue entry or run owns yet, an uncommitted
response intent, a ``pending`` outbound intent) is either *retried* -- its attempts grow by one and its next try
is due after :func:`~hostedrooms.ledger.claims.retry_delay` -- or *failed*, which is terminal. Both are one
guarded ``UPDATE ... WHERE <key> AND <guard> RETURNING *``: while the guard holds the row changes and is
returned; once it no longer holds (finished, failed, owned, a lost race) nothing changes and the row is returned
as it stands, or None when there is no row. The waiting rows whose retry is due form the machine's queue.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from sqlalchemy import BindParameter, ColumnElement, RowMapping, Table, bindparam, func, select, update

from ..telemetry import count_retry
from ..uow import UnitOfWork
from .base import LedgerBase
from .claims import _error_text, retry_delay
from .rows import _public_rows, _returned

_log = logging.getLogger(__name__)
#: Where the caller's error text goes in a failure's values (see :func:`retry_machine`).
ERROR: BindParameter[Any] = bindparam("v_error")

#: The public record of a row (DeliveryRecord, OutboundRecord).
_R = TypeVar("_R")
Fetch = Callable[..., RowMapping | None]  # fetch(uow, key, *, lock=False)
Retryable = Callable[[RowMapping, Mapping[str, Any]], bool]


@dataclass(frozen=True, slots=True)
class RetryMachine(Generic[_R]):
    """One table's retry/fail transitions and queue (build with :func:`retry_machine`); ``public`` makes a row
    its public record."""

    table: Table
    waiting: tuple[ColumnElement[bool], ...]
    retry_at: str
    attempts: str
    fetch: Fetch
    public: Callable[[RowMapping | None], _R | None]
    retryable: Retryable
    retry_statement: Any
    fail_statement: Any

    def retry(self, uow: UnitOfWork, key: str, *, error: str, now: int, **guard: Any) -> _R | None:
        """Count one more failed try of the row ``key`` and schedule the next; return the row.

        The row is read locked (PostgreSQL ``FOR UPDATE``; SQLite's write lock) for its attempt count, so the
        guarded update matches exactly when ``retryable`` says so; otherwise the row is returned unchanged.
        """
        row = self.fetch(uow, key, lock=True)
        if row is None or not self.retryable(row, guard):
            return self.public(row)
        attempts = int(row[self.attempts] or 0) + 1
        changed = _returned(uow, self.retry_statement, {
            **guard, "key": key, "v_attempts": attempts, "v_retry_at": now + retry_delay(attempts), "v_error": error,
            "v_now": now})
        if changed is not None:
            count_retry(f"ledger.{self.table.name}")
        return self.public(row if changed is None else changed)

    def fail(self, uow: UnitOfWork, key: str, *, error: str, now: int, **guard: Any) -> _R | None:
        """Fail the row ``key`` while its guard holds; return the row as it now stands (None when missing)."""
        changed = _returned(uow, self.fail_statement, {**guard, "key": key, "v_error": error, "v_now": now})
        return self.public(self.fetch(uow, key) if changed is None else changed)


def retry_machine(
    table: Table, key: str, waiting: tuple[ColumnElement[bool], ...], *, retryable: Retryable, attempts: str,
    retry_at: str, last_error: str, failed: Mapping[str, Any] | None, fetch: Fetch,
    public: Callable[[RowMapping | None], _R | None], guard: tuple[ColumnElement[bool], ...] = (),
) -> RetryMachine[_R]:
    """The retry/fail transitions of rows of ``table`` whose ``key`` column is bound as ``:key``.

    A row may be retried or failed while ``waiting`` and ``guard`` hold (``guard`` narrows a call to one intent
    and may bind more parameters, passed to the calls by name); ``retryable`` is the same test on a fetched row.
    A retry sets the ``attempts``, ``retry_at`` and ``last_error`` columns; a failure sets ``failed``
    (:data:`ERROR` stands for the error text). Both set ``updated_at``. The statements are built here, once.
    """
    where = (table.c[key] == bindparam("key"), *guard, *waiting)
    retry = {attempts: bindparam("v_attempts"), retry_at: bindparam("v_retry_at"), last_error: ERROR}
    return RetryMachine(
        table=table, waiting=waiting, retry_at=retry_at, attempts=attempts, fetch=fetch, public=public,
        retryable=retryable, retry_statement=_guarded(table, where, retry),
        fail_statement=_guarded(table, where, failed) if failed is not None else None)


def _guarded(table: Table, where: tuple[ColumnElement[bool], ...], values: Mapping[str, Any]) -> Any:
    return update(table).where(*where).values({**values, "updated_at": bindparam("v_now")}).returning(*table.c)


class Retrying(LedgerBase):
    """The ledger calls over a :class:`RetryMachine`: retry, fail, and the queue of due retries."""

    def _retry(self, machine: RetryMachine[_R], key: str, error: Any, **guard: Any) -> _R | None:
        text, timestamp = _error_text(error), self._now()
        return _logged("ledger.retry", machine, key,
                       self._write(lambda uow: machine.retry(uow, key, error=text, now=timestamp, **guard)))

    def _fail(self, machine: RetryMachine[_R], key: str, error: Any) -> _R | None:
        text, timestamp = _error_text(error), self._now()
        return _logged("ledger.failed", machine, key, self._write(lambda uow: machine.fail(uow, key, error=text,
                                                                                          now=timestamp)))

    def _due(self, machine: RetryMachine[_R], count: int, now: Any) -> list[_R]:
        """At most ``count`` waiting rows whose retry is due at ``now``: soonest first, then oldest."""
        timestamp = self._timestamp(now)
        due = func.coalesce(machine.table.c[machine.retry_at], 0)

        def work(uow: UnitOfWork) -> list[_R]:
            statement = (select(machine.table).where(*machine.waiting, due <= timestamp)
                         .order_by(*self._order(uow, due, table=machine.table)))
            return _public_rows(uow, statement, machine.public, count)

        return self._read(work)


def _logged(event: str, machine: RetryMachine[_R], key: str, row: _R | None) -> _R | None:
    """Log a retry (info) or a failure (warning) of the row ``key``: its table, attempts and state, never the error
    text (it may quote what the remote side said) or a body."""
    level = logging.WARNING if event == "ledger.failed" else logging.INFO
    if _log.isEnabledFor(level):
        values: Any = row if isinstance(row, dict) else {}
        _log.log(level, "%s %s of %s", event, key, machine.table.name, extra={
            "event": event, "table": machine.table.name, "key": key, "attempts": values.get(machine.attempts),
            "state": values.get("state"), "retry_at": values.get(machine.retry_at)})
    return row

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

from sqlalchemy import ColumnElement, Table, bindparam, case, func, update

from ..store.ledger import ERROR, LedgerStore, Row
from ..telemetry import count_retry
from ..uow import UnitOfWork
from .base import LedgerBase
from .claims import RETRY_EXPONENT_CAP, _error_text, retry_delay
from .rows import _public_rows

_log = logging.getLogger(__name__)
#: The attempt counts a retry counts in SQL (:meth:`RetryMachine.retry_direct_statement`); a row outside them (left
#: by hand or by the reference) takes the path that reads it first.
_DIRECT_ATTEMPTS = 1_000_000
#: The clock readings it takes (far from the 64-bit bounds, where the sum would overflow differently in SQL).
_DIRECT_NOW = 2**62

#: The public record of a row (DeliveryRecord, OutboundRecord).
_R = TypeVar("_R")
Fetch = Callable[..., Row | None]  # fetch(store, key, *, lock=False)
Retryable = Callable[[Mapping[str, Any], Mapping[str, Any]], bool]

__all__ = ["ERROR", "RetryMachine", "Retrying", "retry_machine"]


@dataclass(frozen=True, slots=True)
class RetryMachine(Generic[_R]):
    """One table's retry/fail transitions and queue (build with :func:`retry_machine`); ``public`` makes a row
    its public record. Its statements are built by :meth:`retry_statement` and :meth:`fail_statement` and run by
    the ledger's store."""

    name: str
    table: Table
    waiting: tuple[ColumnElement[bool], ...]
    where: tuple[ColumnElement[bool], ...]
    retry_at: str
    attempts: str
    last_error: str
    failed: Mapping[str, Any] | None
    fetch: Fetch
    public: Callable[[Any], _R | None]
    retryable: Retryable

    def retry_statement(self) -> Any:
        """The guarded retry: attempts, next try and last error set (``v_attempts``, ``v_retry_at``, ``v_error``)."""
        values = {self.attempts: bindparam("v_attempts"), self.retry_at: bindparam("v_retry_at"),
                  self.last_error: ERROR}
        return _guarded(self.table, self.where, values)

    def retry_direct_statement(self) -> Any:
        """The guarded retry as one statement, for rows whose attempt count is between 0 and a bound: the count
        grows by one and the next try is due :func:`retry_delay` of it after ``v_now``, the schedule written out
        from retry_delay itself (``v_error``, ``v_now``)."""
        counted = func.coalesce(self.table.c[self.attempts], 0)
        attempts = counted + 1
        delay = case(*((attempts == n, retry_delay(n)) for n in range(1, RETRY_EXPONENT_CAP)),
                     else_=retry_delay(RETRY_EXPONENT_CAP))
        now = bindparam("v_now", type_=self.table.c[self.retry_at].type)
        values = {self.attempts: attempts, self.retry_at: now + delay,
                  self.last_error: ERROR}
        return _guarded(self.table, (*self.where, counted.between(0, _DIRECT_ATTEMPTS)), values)

    def fail_statement(self) -> Any:
        """The guarded failure (:data:`ERROR` stands for the error text)."""
        assert self.failed is not None
        return _guarded(self.table, self.where, self.failed)

    def retry(self, store: LedgerStore, key: str, *, error: str, now: int, **guard: Any) -> _R | None:
        """Count one more failed try of the row ``key`` and schedule the next; return the row.

        The row is read locked (PostgreSQL ``FOR UPDATE``; SQLite's write lock) for its attempt count, so the
        guarded update matches exactly when ``retryable`` says so; otherwise the row is returned unchanged. First,
        the retry is tried as one statement counting in SQL: its guard implies ``retryable``, and its values are
        those the update after reading would set, so a changed row is that path's result.
        """
        if store.fast_path and -_DIRECT_NOW < now < _DIRECT_NOW:
            changed = store.retry_directly(self, {**guard, "key": key, "v_error": error, "v_now": now})
            if changed is not None:
                count_retry(f"ledger.{self.table.name}")
                return self.public(changed)
        row = self.fetch(store, key, lock=True)
        if row is None or not self.retryable(row, guard):
            return self.public(row)
        attempts = int(row[self.attempts] or 0) + 1
        changed = store.retry_waiting(self, {
            **guard, "key": key, "v_attempts": attempts, "v_retry_at": now + retry_delay(attempts), "v_error": error,
            "v_now": now})
        if changed is not None:
            count_retry(f"ledger.{self.table.name}")
        return self.public(row if changed is None else changed)

    def fail(self, store: LedgerStore, key: str, *, error: str, now: int, **guard: Any) -> _R | None:
        """Fail the row ``key`` while its guard holds; return the row as it now stands (None when missing)."""
        changed = store.fail_waiting(self, {**guard, "key": key, "v_error": error, "v_now": now})
        return self.public(self.fetch(store, key) if changed is None else changed)


def retry_machine(
    name: str, table: Table, key: str, waiting: tuple[ColumnElement[bool], ...], *, retryable: Retryable,
    attempts: str, retry_at: str, last_error: str, failed: Mapping[str, Any] | None, fetch: Fetch,
    public: Callable[[Any], _R | None], guard: tuple[ColumnElement[bool], ...] = (),
) -> RetryMachine[_R]:
    """The retry/fail transitions (``name``: unique per ledger) of rows of ``table`` whose ``key`` column is bound
    as ``:key``.

    A row may be retried or failed while ``waiting`` and ``guard`` hold (``guard`` narrows a call to one intent
    and may bind more parameters, passed to the calls by name); ``retryable`` is the same test on a fetched row.
    A retry sets the ``attempts``, ``retry_at`` and ``last_error`` columns; a failure sets ``failed``
    (:data:`ERROR` stands for the error text). Both set ``updated_at``.
    """
    return RetryMachine(
        name=name, table=table, waiting=waiting, where=(table.c[key] == bindparam("key"), *guard, *waiting),
        retry_at=retry_at, attempts=attempts, last_error=last_error, failed=failed, fetch=fetch, public=public,
        retryable=retryable)


def _guarded(table: Table, where: tuple[ColumnElement[bool], ...], values: Mapping[str, Any]) -> Any:
    return update(table).where(*where).values({**values, "updated_at": bindparam("v_now")}).returning(*table.c)


class Retrying(LedgerBase):
    """The ledger calls over a :class:`RetryMachine`: retry, fail, and the queue of due retries."""

    def _retry(self, machine: RetryMachine[_R], key: str, error: Any, **guard: Any) -> _R | None:
        text, timestamp = _error_text(error), self._now()
        return _logged("ledger.retry", machine, key, self._write(
            lambda uow: machine.retry(uow.ledger, key, error=text, now=timestamp, **guard)))

    def _fail(self, machine: RetryMachine[_R], key: str, error: Any) -> _R | None:
        text, timestamp = _error_text(error), self._now()
        return _logged("ledger.failed", machine, key, self._write(
            lambda uow: machine.fail(uow.ledger, key, error=text, now=timestamp)))

    def _due(self, machine: RetryMachine[_R], count: int, now: Any) -> list[_R]:
        """At most ``count`` waiting rows whose retry is due at ``now``: soonest first, then oldest."""
        timestamp = self._timestamp(now)

        def work(uow: UnitOfWork) -> list[_R]:
            return _public_rows(uow, uow.ledger.due(machine, timestamp), machine.public, count)

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

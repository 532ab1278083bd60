"""The ledger's transaction helper: clock, file checks, and one unit of work per public call.

Every part of :class:`~hostedrooms.ledger.DeliveryLedger` (deliveries, response intents, outbound intents,
retention) is a mixin over :class:`LedgerBase` and runs its work through :meth:`LedgerBase._write` or
:meth:`LedgerBase._read`.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from sqlalchemy import Engine

from .. import limits as default_limits
from ..db import sqlite_path
from ..errors import LedgerInputError, StorageError
from ..files import ensure_private_directory
from ..limits import Limits, check_limits
from ..uow import UnitOfWork
from ..wakeup import LEDGER_WORK_CHANNEL, Wakeup
from .claims import _integer
from .guard import FileIdentity, prepare_ledger_file, secure_ledger_file

Clock = Callable[[], float]
_T = TypeVar("_T")


def _check_options(clock: object, path: object, limits: object) -> None:
    """Refuse a constructor option of the wrong kind before anything is opened."""
    if clock is not None and not callable(clock):
        raise LedgerInputError("clock must be None or a callable returning the time in seconds", field="clock")
    if (path is not None and not isinstance(path, str | os.PathLike)) or (isinstance(path, str) and not path):
        raise LedgerInputError("path must be None or the ledger's file path", field="path")
    if path is not None and "\x00" in os.fsdecode(os.fspath(path)):  # no file system takes one
        raise LedgerInputError("path must not contain a NUL character", field="path")
    if limits is not None and not callable(limits):
        check_limits(limits)


class LedgerBase:
    """A ledger's engine, clock and guarded file, and the transaction helpers its parts share."""

    def __init__(
        self, engine: Engine, *, clock: Clock | None = None, path: str | os.PathLike[str] | None = None,
        limits: Limits | Callable[[], Limits] | None = None,
    ) -> None:
        _check_options(clock, path, limits)
        self.engine = engine
        self._clock = clock
        self._limit_source = limits
        guarded = Path(os.path.abspath(path)) if path is not None else sqlite_path(engine)
        self.file: Path | None = guarded
        self._identity: FileIdentity | None = None
        if guarded is not None:
            # Once, before this ledger's first transaction; from then on only the path is examined (os.lstat),
            # never opened: see hostedrooms.files.
            self._identity = prepare_ledger_file(guarded, prepare_directory=self._prepare_directory)
        self._require_crash_safe()

    # -- plumbing

    def _prepare_directory(self, directory: Path) -> None:
        """Make the ledger's folder owner-private (the facade substitutes its module's patchable function)."""
        ensure_private_directory(directory)

    def _limits(self) -> Limits:
        """The limits now: ``limits`` as given, what a provider returns when called, or :mod:`hostedrooms.limits`
        (read at call time, so lowering a constant there takes effect)."""
        source = self._limit_source
        if source is None:
            return default_limits
        return source() if callable(source) else source

    def _capacity(self) -> int:
        """MAX_NONTERMINAL_DELIVERIES, read at call time."""
        return int(self._limits().MAX_NONTERMINAL_DELIVERIES)

    def _now(self) -> int:
        return int(self._clock() if self._clock is not None else time.time())

    def _timestamp(self, now: Any) -> int:
        return self._now() if now is None else _integer(now, "secure peer ledger timestamp is invalid", "now")

    def _check_file(self) -> None:
        if self.file is not None:
            secure_ledger_file(self.file, expected=self._identity)

    def _write(self, work: Callable[[UnitOfWork], _T]) -> _T:
        """Run ``work`` in one write transaction (committed when it returns) after the file checks."""
        self._check_file()
        with UnitOfWork(self.engine) as uow:
            result = work(uow)
            uow.commit()
            return result

    def _read(self, work: Callable[[UnitOfWork], _T], *, one_statement: bool = False) -> _T:
        """Run ``work`` in one read transaction after the file checks. ``one_statement``: ``work`` runs a single
        statement, which needs no snapshot beyond its own (PostgreSQL then opens no transaction for it)."""
        self._check_file()
        with UnitOfWork(self.engine, write=False, statement_snapshots=one_statement) as uow:
            return work(uow)

    def work_wakeup(self, *, poll_interval: float | None = None, reconnect_deadline: float | None = None) -> Wakeup:
        """A context manager whose ``wait(timeout)`` returns once a ledger transition made work due (a delivery
        authorised or queued, a response or outbound intent prepared), or ``timeout`` passed; retries that
        become due later are the caller's to time. Enter it before reading the queues, so no wake-up is missed
        between the read and the wait (see :mod:`hostedrooms.wakeup`). A lost waiting connection is opened again;
        only past ``reconnect_deadline`` seconds without one (default
        :data:`~hostedrooms.wakeup.RECONNECT_DEADLINE`) does ``wait`` raise StoreUnavailableError.

        :param poll_interval: SQLite: how often to look for a commit, in seconds (default: the waiter's).
        :param reconnect_deadline: how long ``wait`` may go without a waiting connection, in seconds.
        :returns: the wake-up, to use as a context manager.
        """
        return Wakeup(self.engine, LEDGER_WORK_CHANNEL, poll_interval=poll_interval,
                      reconnect_deadline=reconnect_deadline)

    def _require_crash_safe(self) -> None:
        def check(uow: UnitOfWork) -> bool:
            return uow.backend.is_crash_safe(uow.connection)

        if not self._read(check):
            raise StorageError("secure peer delivery ledger requires WAL with synchronous=FULL")

    def close(self) -> None:
        """Release pooled connections when this ledger owns its engine (the facade's SQLite files)."""
        if getattr(self, "_owns_engine", False):
            self.engine.dispose()

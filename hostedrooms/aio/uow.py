"""The unit of work for asyncio: :class:`AsyncUnitOfWork` is :class:`hostedrooms.uow.UnitOfWork` (one transaction,
rolled back unless committed, ``BEGIN IMMEDIATE`` on SQLite, driver errors translated in one place), each of its
steps awaited through SQLAlchemy's greenlet bridge on the AsyncEngine's own connections (aiosqlite or psycopg's
async mode).

Usage::

    async with AsyncUnitOfWork(engine) as uow:
        row = (await uow.execute(select(...))).first()
        await uow.fenced(update(rooms).where(...).values(...), AuthorityConflictError("..."))
        await uow.commit()

Cancelling the task at any step lets that step end first (a statement in flight completes, a commit commits),
then the CancelledError leaves the block, which rolls back what was not committed and checks the connection in,
to its end however often the task is cancelled meanwhile: no transaction stays open and, on SQLite, no write lock
stays held. A cancelled ``commit()`` may therefore have committed.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from types import TracebackType
from typing import Any, Concatenate, ParamSpec, Self, TypeVar

from sqlalchemy import Executable, Result
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from ..uow import UnitOfWork
from .engines import require_async_engine, run_awaited, runner_for

__all__ = ["AsyncUnitOfWork"]

P = ParamSpec("P")
R = TypeVar("R")


class AsyncUnitOfWork:
    """An async context manager around one transaction on an AsyncEngine (see the module docstring).

    :param engine: the AsyncEngine.
    :param write: False for a read-only unit.
    :raises MisuseError: ``engine`` is not an AsyncEngine.
    """

    def __init__(self, engine: AsyncEngine, *, write: bool = True) -> None:
        self.engine = require_async_engine(engine)
        self.write = write
        self._unit: UnitOfWork | None = None

    @property
    def unit(self) -> UnitOfWork:
        """The synchronous unit of work behind this one (for :meth:`run_sync` bodies)."""
        if self._unit is None:
            raise RuntimeError("unit of work is not active")
        return self._unit

    async def __aenter__(self) -> Self:
        await runner_for(self.engine)  # an adopted engine gets hostedrooms' connection hooks first
        unit = UnitOfWork(self.engine.sync_engine, write=self.write)
        try:
            await run_awaited(unit.__enter__)
        except asyncio.CancelledError:  # the unit may have begun its transaction: no block will end it
            await run_awaited(unit.__exit__, None, None, None)
            raise
        self._unit = unit
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        unit, self._unit = self._unit, None
        if unit is not None:
            await run_awaited(unit.__exit__, exc_type, exc, tb)

    @property
    def connection(self) -> AsyncConnection:
        """The connection holding this unit's transaction, as an AsyncConnection. Its calls are SQLAlchemy's own:
        cancelled, they discard the connection from inside the driver call (see
        :func:`~hostedrooms.aio.engines.run_awaited`); this unit's methods run each step to its end instead."""
        return AsyncConnection(self.engine, self.unit.connection)

    async def execute(self, statement: Executable, parameters: Any = None) -> Result[Any]:
        """Execute a Core statement in this unit's transaction (the result is buffered).

        :param statement: a Core statement.
        :param parameters: its bound parameters, or None.
        :returns: the statement's buffered result.
        """
        return await run_awaited(self.unit.execute, statement, parameters)

    async def fenced(self, statement: Executable, error: BaseException) -> None:
        """Run a guarded ``UPDATE ... WHERE``; raise ``error`` unless exactly one row changed (the unit then rolls
        back when the block ends with it).

        :param statement: the guarded ``UPDATE``.
        :param error: the exception to raise when it changed no row or more than one.
        :raises BaseException: ``error``, unless exactly one row changed.
        """
        await run_awaited(self.unit.fenced, statement, error)

    async def commit(self) -> None:
        """Commit the transaction."""
        await run_awaited(self.unit.commit)

    async def rollback(self) -> None:
        """Roll back whatever this unit wrote; safe to call more than once."""
        await run_awaited(self.unit.rollback)

    async def run_sync(self, fn: Callable[Concatenate[UnitOfWork, P], R], *args: P.args, **kwargs: P.kwargs) -> R:
        """``fn(unit, *args, **kwargs)`` with the synchronous unit of work, every driver call awaited (Core or ORM
        code written for :class:`~hostedrooms.uow.UnitOfWork`, ``RoomTransaction`` included).

        :param fn: called with the synchronous unit first.
        :param args: the positional and keyword arguments passed on to ``fn`` after the unit.
        :returns: what ``fn`` returned.
        """
        return await run_awaited(fn, self.unit, *args, **kwargs)

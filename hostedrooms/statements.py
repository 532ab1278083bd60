"""Hot statements: Core statements compiled once per dialect and run on the unit's DBAPI cursor.

For a short statement, ``Connection.execute()`` spends most of its time around the driver, not in it: the
compiled-cache lookup, building an execution context, processing binds and setting up a ``Result`` cost
about 15 µs of the 17 µs a one-row SQLite lookup takes on these machines. An append issues two or three of
them per transaction, which is most of the library's overhead over the raw driver. A :class:`HotStatement`
pays the compilation once and then hands the driver the compiled text and the parameters in its own style.

What it keeps from ``execute()``: the SQL text comes from the Core statement (never written by hand or built
from input); parameters go to the driver as bound parameters; bind processors run; the execution runs
through ``Connection._cursor_execute``, the same path SQLAlchemy uses for its own special-case statements,
so ``before_cursor_execute``/``after_cursor_execute`` listeners fire, ``handle_error`` runs, a driver error
arrives as SQLAlchemy's wrapped ``DBAPIError`` (with parameters hidden as the engine says), and a
disconnect invalidates the connection. What it gives up: results are plain tuples from the cursor, and
statements that need per-call compilation (``IN`` lists, literal execution, escaped bind names) are
refused when first compiled.
"""

from __future__ import annotations

import operator
import weakref
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Connection
from sqlalchemy.engine import Dialect
from sqlalchemy.sql import ClauseElement

__all__ = ["HotStatement"]


@dataclass(frozen=True, slots=True)
class _Plan:
    """One statement compiled for one dialect."""

    text: str
    #: Parameter names in driver order (positional paramstyles), or None (named paramstyles).
    order: tuple[str, ...] | None
    #: Values of the statement's own literal binds (``next_seq + 1``), overridden by call parameters.
    defaults: Mapping[str, Any]
    processors: Mapping[str, Callable[[Any], Any]]
    #: Positional: picks the values in driver order from a mapping, as one tuple.
    pick: Callable[[Mapping[str, Any]], tuple[Any, ...]] | None
    #: Keyword arguments of the DBAPI connection's ``cursor()``.
    cursor_options: Mapping[str, Any]
    #: Positional without statement defaults: (position, bind processor) of the values to process after picking.
    positions: tuple[tuple[int, Callable[[Any], Any]], ...] | None


class HotStatement:
    """A Core statement to run many times with different parameters, at the driver's speed.

    ``column_keys`` names the columns of an INSERT/UPDATE without explicit values (as ``compile()`` takes them).
    ``binary_results``: where the driver can (psycopg), rows come in the binary format, which spares the server
    and the client writing and parsing numbers as text (the values are the same).
    """

    __slots__ = ("_binary_results", "_column_keys", "_last", "_plans", "statement")

    def __init__(
        self, statement: ClauseElement, *, column_keys: Sequence[str] | None = None, binary_results: bool = False
    ) -> None:
        self.statement = statement
        self._column_keys = list(column_keys) if column_keys is not None else None
        self._binary_results = binary_results
        self._plans: weakref.WeakKeyDictionary[Dialect, _Plan] = weakref.WeakKeyDictionary()
        #: The plan used last, and (weakly) its dialect: an engine's calls find it without a lookup.
        self._last: tuple[weakref.ref[Dialect], _Plan] | None = None

    def _plan(self, dialect: Dialect) -> _Plan:
        last = self._last
        if last is not None and last[0]() is dialect:
            return last[1]
        plan = self._plans.get(dialect)
        if plan is None:
            plan = self._plans[dialect] = self._compile(dialect)
        self._last = (weakref.ref(dialect), plan)
        return plan

    def _compile(self, dialect: Dialect) -> _Plan:
        compiled: Any = self.statement.compile(dialect=dialect, column_keys=self._column_keys)
        if compiled.literal_execute_params or compiled.post_compile_params or compiled.escaped_bind_names:
            raise TypeError("a HotStatement must compile to one fixed text (no IN lists or escaped names)")
        order = tuple(compiled.positiontup) if dialect.positional else None
        # Binds the statement fills itself (the 1 of ``next_seq + 1``); the others come from each call.
        defaults = {name: bind.effective_value for bind, name in compiled.bind_names.items() if not bind.required}
        pick = _tuple_getter(order) if order is not None else None
        # psycopg's own cursors take ``binary=``; SQLAlchemy's adapter of its async connections does not.
        binary = self._binary_results and dialect.driver == "psycopg" and not dialect.is_async
        processors = dict(compiled._bind_processors)
        positions = None if order is None or defaults else tuple(
            (index, processors[name]) for index, name in enumerate(order) if name in processors)
        return _Plan(compiled.string, order, defaults, processors, pick, {"binary": True} if binary else {},
                     positions)

    def _parameters(self, plan: _Plan, params: Mapping[str, Any]) -> Any:
        if plan.positions is not None:  # pick the values, then process those that need it (no dict copy)
            picked = plan.pick(params)  # type: ignore[misc]  # positional plans always pick
            if not plan.positions:
                return picked
            values = list(picked)
            for index, process in plan.positions:
                value = values[index]
                if value is not None:
                    values[index] = process(value)
            return tuple(values)
        merged = {**plan.defaults, **params} if plan.defaults or plan.processors else params
        for name, process in plan.processors.items():
            value = merged.get(name)
            if value is not None:
                merged[name] = process(value)  # type: ignore[index]  # merged is a fresh dict here
        return merged if plan.pick is None else plan.pick(merged)

    def run(self, connection: Connection, params: Mapping[str, Any]) -> Any:
        """Execute on ``connection`` (inside its transaction); returns the open DBAPI cursor (close it)."""
        plan = self._plan(connection.dialect)
        cursor = connection.connection.cursor(**plan.cursor_options)
        try:
            # Private but long-standing: the path SQLAlchemy itself uses for statements outside execute().
            connection._cursor_execute(cursor, plan.text, self._parameters(plan, params))
        except BaseException:
            cursor.close()
            raise
        return cursor

    def run_many(self, connection: Connection, rows: Sequence[Mapping[str, Any]]) -> None:
        """Execute once per row in one driver ``executemany`` (through ``exec_driver_sql``: cursor events fire
        once, with ``executemany=True``, and driver errors are wrapped as for any statement)."""
        plan = self._plan(connection.dialect)
        connection.exec_driver_sql(plan.text, [self._parameters(plan, row) for row in rows])

    def first(self, connection: Connection, params: Mapping[str, Any]) -> tuple[Any, ...] | None:
        """Execute and return the first row as a tuple (or None)."""
        cursor = self.run(connection, params)
        try:
            row = cursor.fetchone()
        finally:
            cursor.close()
        return None if row is None else tuple(row)

    def rowcount(self, connection: Connection, params: Mapping[str, Any]) -> int:
        """Execute and return how many rows the statement changed."""
        cursor = self.run(connection, params)
        try:
            return int(cursor.rowcount)
        finally:
            cursor.close()



def _tuple_getter(names: tuple[str, ...]) -> Callable[[Mapping[str, Any]], tuple[Any, ...]]:
    """``mapping -> tuple(mapping[name] for name in names)`` at C speed."""
    if len(names) == 1:
        single = operator.itemgetter(names[0])
        return lambda mapping: (single(mapping),)
    getter: Callable[[Mapping[str, Any]], tuple[Any, ...]] = operator.itemgetter(*names)
    return getter

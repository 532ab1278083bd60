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

On a :class:`DirectConnection` (a SQLite engine's one held writer, :mod:`hostedrooms.writer`) a hot statement
skips ``_cursor_execute`` too, while nothing observes the connection: no engine or Connection event listener and
no statement logging. It then runs straight on the DBAPI cursor, and a driver error is wrapped exactly as
SQLAlchemy wraps it (``DBAPIError.instance``: the same class, message, hidden parameters and ``orig``), so the
unit of work translates it in the same one place. With a listener installed or logging at INFO, the statement
takes ``_cursor_execute`` as above and every event fires.
"""

from __future__ import annotations

import operator
import weakref
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Connection
from sqlalchemy import exc as sa_exc
from sqlalchemy.engine import Dialect
from sqlalchemy.sql import ClauseElement

__all__ = ["DIRECT_BEGUN", "DirectConnection", "HotStatement"]

#: Key in a pooled connection's ``info``: its transaction was begun by :meth:`DirectConnection.begin_direct`, so
#: SQLAlchemy's own begin (when a statement runs through ``execute()``) joins it instead of beginning another.
DIRECT_BEGUN = "hostedrooms_direct_begun"


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
        if type(connection) is DirectConnection and connection.unobserved():
            return connection.direct(plan.text, self._parameters(plan, params), plan.cursor_options)
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
        parameters = [self._parameters(plan, row) for row in rows]
        if type(connection) is DirectConnection and connection.unobserved():
            connection.direct(plan.text, parameters, plan.cursor_options, many=True).close()
            return
        connection.exec_driver_sql(plan.text, parameters)

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


class DirectConnection(Connection):
    """A Connection whose hot statements may run straight on its DBAPI cursor (see the module docstring).

    Built only by :mod:`hostedrooms.writer` for the one held writer of a SQLite engine; everything else about it is
    SQLAlchemy's Connection (``execute()``, transactions, events, the ORM session joined to it).
    """

    def unobserved(self) -> bool:
        """Whether nothing would see a statement run outside SQLAlchemy: no event listener on this connection, its
        engine or the Connection class, and no statement logging (``_echo``, refreshed by the writer per unit)."""
        return not (self._echo or self._has_events or self.engine._has_events)

    def begin_direct(self) -> None:
        """Begin a transaction as SQLAlchemy would (the dialect's ``do_begin``), without a ``RootTransaction``: a
        statement later run through ``execute()`` autobegins one that joins it (:data:`DIRECT_BEGUN`)."""
        raw: Any = self.connection
        try:
            self.dialect.do_begin(raw)
        except self.dialect.loaded_dbapi.Error as exc:
            raise self._wrapped(exc, None, None) from exc
        raw.info[DIRECT_BEGUN] = True

    def end_direct(self, *, commit: bool) -> None:
        """Commit or roll back the transaction :meth:`begin_direct` began (if SQLAlchemy has not joined it)."""
        raw: Any = self.connection
        raw.info.pop(DIRECT_BEGUN, None)
        try:
            if commit:
                self.dialect.do_commit(raw)
            else:
                self.dialect.do_rollback(raw)
        except self.dialect.loaded_dbapi.Error as exc:
            raise self._wrapped(exc, None, None) from exc

    def _wrapped(self, exc: Any, text: str | None, parameters: Any, many: bool = False) -> sa_exc.StatementError:
        """``exc`` (a driver error) as ``_cursor_execute`` raises it; a disconnect invalidates this connection."""
        disconnect = self.dialect.is_disconnect(exc, self.connection, None)
        wrapped: sa_exc.StatementError = sa_exc.DBAPIError.instance(
            text, parameters, exc, self.dialect.loaded_dbapi.Error, hide_parameters=self.engine.hide_parameters,
            connection_invalidated=disconnect, dialect=self.dialect, ismulti=many)
        if disconnect:
            self.invalidate(exc)
        return wrapped

    def direct(self, text: str, parameters: Any, cursor_options: Mapping[str, Any], *, many: bool = False) -> Any:
        """Run ``text`` on a new DBAPI cursor of this connection; returns the cursor (close it). A driver error is
        raised as SQLAlchemy's wrapped ``DBAPIError`` with the driver's error as ``orig`` and as the cause, as
        ``_cursor_execute`` raises it; a disconnect invalidates the connection as it does."""
        raw: Any = self.connection
        cursor = raw.cursor(**cursor_options)
        try:
            if many:
                cursor.executemany(text, parameters)
            else:
                cursor.execute(text, parameters)
        except self.dialect.loaded_dbapi.Error as exc:
            cursor.close()
            raise self._wrapped(exc, text, parameters, many) from exc
        except BaseException:
            cursor.close()
            raise
        return cursor

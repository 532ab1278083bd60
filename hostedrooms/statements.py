"""Hot statements: Core statements compiled once per dialect and run on the unit's DBAPI cursor while nothing
observes the engine, through SQLAlchemy's public ``exec_driver_sql`` as soon as anything does.

For a short statement, ``Connection.execute()`` spends most of its time around the driver, not in it: the
compiled-cache lookup, building an execution context, processing binds and setting up a ``Result`` cost
about 15 µs of the 17 µs a one-row SQLite lookup takes on these machines. An append issues two or three of
them per transaction, which is most of the library's overhead over the raw driver. A :class:`HotStatement`
pays the compilation once and then hands the driver the compiled text and the parameters in its own style.

What it keeps from ``execute()``: the SQL text comes from the Core statement (never written by hand or built
from input); parameters go to the driver as bound parameters; bind processors run; results are the driver's
rows as plain tuples (no result processors, on either path). Statements that need per-call compilation (``IN``
lists, literal execution, escaped bind names) are refused when first compiled. A caller that builds many rows
itself (an append's event rows) may hand them over as the driver's positional tuples
(:meth:`HotStatement.run_many_bound`) where :meth:`HotStatement.positional_processors` says the driver takes
exactly those columns in that order, applying the bind processors it names itself: the same values reach the
driver, with no mapping built and picked apart per row.

Two paths, and only SQLAlchemy's public API on both:

- **Observed** (:func:`observed`): when anything would see the statement on SQLAlchemy's path (a
  ``before_cursor_execute``/``after_cursor_execute`` listener on the engine or the ``Engine`` class; a dialect
  ``handle_error``/``do_execute``/``do_executemany`` listener; OpenTelemetry's SQLAlchemy instrumentation registers
  such listeners) or statements are logged, the statement runs through ``Connection.exec_driver_sql`` with the
  same text and parameters: SQLAlchemy builds an execution context, the cursor events fire, ``handle_error`` runs
  and errors arrive as SQLAlchemy raises them. (``before_execute``/``after_execute`` are not looked for:
  SQLAlchemy does not call them for ``exec_driver_sql``; nor are listeners on the ``Connection`` class or one
  Connection, which the engine's dispatch does not hold: asking each Connection's would cost more than the fast
  path saves.)
  Instrumentations that keep state in the execution context (OpenTelemetry's span) need this: SQLAlchemy's
  lower-level cursor helpers pass none.
- **Unobserved**: the statement runs straight on a DBAPI cursor of the driver's connection behind the pool's public
  connection proxy (``connection.connection.dbapi_connection.cursor()``), and a driver error is wrapped exactly as
  SQLAlchemy wraps it (``DBAPIError.instance``: the same class, message, hidden parameters and ``orig``), so the unit
  of work translates it in the same one place; a disconnect invalidates the connection as SQLAlchemy does.

When it is decided: once per unit of work, that is per public call (listeners may be added at any time, as
OpenTelemetry does to engines that already exist): on a pooled connection at the unit's first hot statement
(:func:`begin_unit`), on a SQLite engine's one held writer when it is lent to the unit (:mod:`hostedrooms.writer`;
that unit's transaction too is then begun directly or by SQLAlchemy). A listener added while a unit runs applies
from the next call on, as SQLAlchemy reads its own statement-logging flag once per Connection. A connection
outside any unit (a migration's) asks at each statement.
"""

from __future__ import annotations

import logging
import operator
import weakref
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Connection, Engine
from sqlalchemy import exc as sa_exc
from sqlalchemy.engine import CursorResult, Dialect
from sqlalchemy.sql import ClauseElement

__all__ = ["DIRECT_BEGUN", "DirectConnection", "HotStatement", "begin_unit", "end_unit", "listened", "observed",
           "statements_logged", "wrap_driver_error"]

#: Key in a pooled connection's ``info``: its transaction was begun by :meth:`DirectConnection.begin_direct`, so
#: SQLAlchemy's own begin (when a statement runs through ``execute()``) joins it instead of beginning another.
DIRECT_BEGUN = "hostedrooms_direct_begun"

#: SQLAlchemy's documented logger of an engine's statements (``echo``); an engine's ``logging_name`` adds a child.
_ENGINE_LOGGER = "sqlalchemy.engine.Engine"
#: Those loggers by ``logging_name`` (loggers live as long as the process: ``logging.getLogger`` is not per call).
_loggers: dict[str | None, logging.Logger] = {}


def statements_logged(engine: Engine) -> bool:
    """Whether SQLAlchemy logs ``engine``'s statements (``echo``, or its logger at INFO)."""
    if engine.echo:
        return True
    name = engine.logging_name
    logger = _loggers.get(name)
    if logger is None:
        logger = _loggers[name] = logging.getLogger(_ENGINE_LOGGER if not name else f"{_ENGINE_LOGGER}.{name}")
    return logger.isEnabledFor(logging.INFO)


def observed(connection: Connection, *, transactions: bool = False) -> bool:
    """Whether anything would see ``connection``'s hot statements (``transactions``: and its begin, commit and
    rollback) run outside SQLAlchemy: a listener SQLAlchemy's public path would call for them (:func:`listened`),
    or statement logging. Cheap enough to ask per statement (one check per event, no allocation)."""
    engine = connection.engine
    return listened(engine, transactions=transactions) or statements_logged(engine)


def listened(engine: Engine, *, transactions: bool = False) -> bool:
    """Whether a listener on ``engine`` or the ``Engine`` class (its dispatch holds both) or on its dialect would see
    a hot statement on SQLAlchemy's public path: ``before_cursor_execute``, ``after_cursor_execute``, the dialect's
    ``handle_error``, ``do_execute``, ``do_executemany`` (``transactions``: and ``begin``, ``commit``,
    ``rollback``). ``before_execute``/``after_execute`` are not asked: SQLAlchemy does not call them for
    ``exec_driver_sql`` (they see hostedrooms' other statements, run through ``execute()``, either way)."""
    dispatch: Any = engine.dispatch
    if dispatch.before_cursor_execute or dispatch.after_cursor_execute:
        return True
    if transactions and (dispatch.begin or dispatch.commit or dispatch.rollback):
        return True
    dialect: Any = engine.dialect.dispatch
    return bool(dialect.handle_error or dialect.do_execute or dialect.do_executemany)


#: Each unit of work now running on an ordinary connection: its decision (None: not asked yet; asked at its first
#: hot statement, so a unit that runs none pays nothing). :func:`begin_unit` and :func:`end_unit` keep it.
_units: dict[Connection, bool | None] = {}


def begin_unit(connection: Connection) -> None:
    """A unit of work begins on ``connection``: whether its hot statements skip SQLAlchemy is decided once, for the
    whole unit (as the held writer does); :func:`end_unit` when the unit ends."""
    _units[connection] = None


def end_unit(connection: Connection) -> None:
    """Forget ``connection``'s unit (it ended)."""
    _units.pop(connection, None)


def wrap_driver_error(
    connection: Connection, exc: Any, text: str | None, parameters: Any, *, many: bool = False
) -> sa_exc.StatementError:
    """``exc`` (a driver error raised on ``connection``'s DBAPI connection) as SQLAlchemy raises it from
    ``execute()``; a disconnect invalidates the connection (and closes a held writer's: it never reconnects)."""
    dialect = connection.dialect
    disconnect = dialect.is_disconnect(exc, connection.connection, None)
    wrapped: sa_exc.StatementError = sa_exc.DBAPIError.instance(
        text, parameters, exc, dialect.loaded_dbapi.Error, hide_parameters=connection.engine.hide_parameters,
        connection_invalidated=disconnect, dialect=dialect, ismulti=many)
    if disconnect:
        connection.invalidate(exc)
        if isinstance(connection, DirectConnection):
            # Closed, an invalidated Connection never takes another pooled connection: a statement after this one
            # in the same unit fails instead of running outside the unit's transaction.
            connection.close()
    return wrapped


def _direct(connection: Connection, text: str, parameters: Any, cursor_options: Mapping[str, Any],
            *, many: bool = False) -> Any:
    """Run ``text`` on a new DBAPI cursor of ``connection``; returns the cursor (close it)."""
    raw: Any = connection.connection
    # The driver's own cursor(): what the pool proxy's cursor() calls, without its arguments packed and unpacked.
    cursor = raw.dbapi_connection.cursor(**cursor_options)
    try:
        if many:
            cursor.executemany(text, parameters)
        else:
            cursor.execute(text, parameters)
    except connection.dialect.loaded_dbapi.Error as exc:
        cursor.close()
        raise wrap_driver_error(connection, exc, text, parameters, many=many) from exc
    except BaseException:
        cursor.close()
        raise
    return cursor


def _fast(connection: Connection) -> bool:
    """Whether a hot statement may skip SQLAlchemy on ``connection`` (not a held writer's, which decided as it was
    lent): as decided for its unit of work, else asked at once (see the module docstring)."""
    fast = _units.get(connection)
    if fast is None:
        fast = not observed(connection)
        if connection in _units:  # the unit's first hot statement decides for the unit
            _units[connection] = fast
    return fast


class _Rows:
    """A ``CursorResult`` seen as the DBAPI cursor the unobserved path returns (plain tuples, ``rowcount``)."""

    __slots__ = ("_result",)

    def __init__(self, result: CursorResult[Any]) -> None:
        self._result = result

    @property
    def rowcount(self) -> int:
        return self._result.rowcount

    def fetchone(self) -> tuple[Any, ...] | None:
        row = self._result.fetchone()
        return None if row is None else tuple(row)

    def fetchmany(self, size: int) -> list[tuple[Any, ...]]:
        return [tuple(row) for row in self._result.fetchmany(size)]

    def fetchall(self) -> list[tuple[Any, ...]]:
        return [tuple(row) for row in self._result.fetchall()]

    def close(self) -> None:
        self._result.close()


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
    and the client writing and parsing numbers as text (the values are the same; unobserved path only).
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
        processors = _bind_processors(compiled.bind_names, dialect)
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
        """Execute on ``connection`` (inside its transaction); returns an open cursor-like object (``fetchone``,
        ``fetchall``, ``rowcount``; close it) whose rows are plain tuples on both paths."""
        plan = self._plan(connection.dialect)
        return _execute(connection, plan, self._parameters(plan, params))

    def run_many(self, connection: Connection, rows: Sequence[Mapping[str, Any]]) -> None:
        """Execute once per row in one driver ``executemany`` (observed: through ``exec_driver_sql``, whose cursor
        events fire once, with ``executemany=True``)."""
        plan = self._plan(connection.dialect)
        _execute_many(connection, plan, [self._parameters(plan, row) for row in rows])

    # -- rows the caller binds itself (positional paramstyles) --

    def positional_processors(
        self, connection: Connection, columns: Sequence[str]
    ) -> Mapping[str, Callable[[Any], Any]] | None:
        """When the driver takes this statement's parameters as a tuple of exactly ``columns``' values in that
        order (a positional paramstyle, no literal binds of the statement's own): the bind processor of each of
        those columns that has one, by name, which the caller applies itself before :meth:`run_bound` or
        :meth:`run_many_bound` (as :meth:`run` would apply it); otherwise None (use :meth:`run`, :meth:`run_many`).
        """
        plan = self._plan(connection.dialect)
        if plan.order is None or plan.defaults or plan.order != tuple(columns):
            return None
        return plan.processors

    def run_bound(self, connection: Connection, row: tuple[Any, ...]) -> int:
        """Execute once with ``row``, already the driver's positional parameters (:meth:`positional_processors`);
        returns how many rows the statement changed."""
        cursor = _execute(connection, self._positional_plan(connection), row)
        try:
            return int(cursor.rowcount)
        finally:
            cursor.close()

    def run_many_bound(self, connection: Connection, rows: Sequence[tuple[Any, ...]]) -> None:
        """:meth:`run_many` for rows that are already the driver's positional parameters
        (:meth:`positional_processors`): the same ``executemany`` with the same values, no mapping picked apart."""
        _execute_many(connection, self._positional_plan(connection), rows)

    def _positional_plan(self, connection: Connection) -> _Plan:
        plan = self._plan(connection.dialect)
        if plan.order is None or plan.defaults:
            raise TypeError("this statement takes its parameters by name on this dialect")
        return plan

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


def _execute(connection: Connection, plan: _Plan, parameters: Any) -> Any:
    """Run ``plan`` once with the driver's ``parameters`` on the unobserved or the observed path."""
    if connection.fast if type(connection) is DirectConnection else _fast(connection):
        return _direct(connection, plan.text, parameters, plan.cursor_options)
    return _Rows(connection.exec_driver_sql(plan.text, parameters))


def _execute_many(connection: Connection, plan: _Plan, parameters: Sequence[Any]) -> None:
    """Run ``plan`` once per item of ``parameters`` (the driver's) in one ``executemany``, on either path."""
    if connection.fast if type(connection) is DirectConnection else _fast(connection):
        _direct(connection, plan.text, parameters, plan.cursor_options, many=True).close()
        return
    connection.exec_driver_sql(plan.text, parameters)


def _bind_processors(bind_names: Mapping[Any, str], dialect: Dialect) -> dict[str, Callable[[Any], Any]]:
    """The dialect's bind processor of each bind that has one, by compiled name (as ``execute()`` applies them)."""
    found = {}
    for bind, name in bind_names.items():
        process = bind.type.dialect_impl(dialect).bind_processor(dialect)
        if process is not None:
            found[name] = process
    return found


def _tuple_getter(names: tuple[str, ...]) -> Callable[[Mapping[str, Any]], tuple[Any, ...]]:
    """``mapping -> tuple(mapping[name] for name in names)`` at C speed."""
    if len(names) == 1:
        single = operator.itemgetter(names[0])
        return lambda mapping: (single(mapping),)
    getter: Callable[[Mapping[str, Any]], tuple[Any, ...]] = operator.itemgetter(*names)
    return getter


class DirectConnection(Connection):
    """A Connection whose hot statements and transaction may skip SQLAlchemy (see the module docstring).

    Built only by :mod:`hostedrooms.writer` for the one held writer of a SQLite engine (over the pool's connection
    proxy, with SQLAlchemy's public constructor); everything else about it is SQLAlchemy's Connection
    (``execute()``, transactions, events, the ORM session joined to it).
    """

    #: Whether the current unit's hot statements and transaction skip SQLAlchemy: nothing observes the engine
    #: (no listener :func:`listened` looks for, statements not logged), decided as the writer is lent to a unit.
    fast = False

    def __init__(self, engine: Engine, connection: Any, *, logged: bool) -> None:
        super().__init__(engine, connection)
        #: Whether SQLAlchemy logged statements when this Connection was built (``logged``: it reads that once, so
        #: the writer builds another when that changes, and when a unit set execution options).
        self.built_logging = logged

    def begin_direct(self) -> None:
        """Begin a transaction as SQLAlchemy would (the dialect's ``do_begin``), without a ``RootTransaction``: a
        statement later run through ``execute()`` autobegins one that joins it (:data:`DIRECT_BEGUN`)."""
        raw: Any = self.connection
        try:
            self.dialect.do_begin(raw)
        except self.dialect.loaded_dbapi.Error as exc:
            raise wrap_driver_error(self, exc, None, None) from exc
        raw.info[DIRECT_BEGUN] = True

    def end_direct(self, *, commit: bool) -> None:
        """Commit or roll back the transaction :meth:`begin_direct` began (if SQLAlchemy has not joined it)."""
        raw: Any = self.connection
        raw.info.pop(DIRECT_BEGUN, None)
        driver = raw.dbapi_connection  # not through the pool's proxy, which finds commit() by a slow fallback
        try:
            if commit:
                self.dialect.do_commit(driver)
            else:
                self.dialect.do_rollback(driver)
        except self.dialect.loaded_dbapi.Error as exc:
            raise wrap_driver_error(self, exc, None, None) from exc

"""One span per public service call: :func:`traced` on a function, :func:`traced_methods` on a class,
:func:`traced_block` on a block (the asyncio ``follow()``'s opening).

A decorated function keeps its signature and type. Each call asks :func:`~.providers.current` whether anything
records; if not it runs the plain function. Otherwise the call is one ``CLIENT`` span named after its
``db.operation.name`` (and one ``hostedrooms.operation.duration`` measurement), with the store's attributes
(``db.*``, and ``server.*`` on PostgreSQL), the recorded arguments (:data:`~.attributes.PARAMETERS`, values
checked by :func:`~.attributes.safe`) and the result's outcome and seq range. Never recorded: a message body,
payload, actor, grant, claim, lease token, digest, error text or URL. Exceptions are not recorded as span events
(their messages may quote input): the span's status is ERROR, ``error.type`` names the class and
``db.response.status_code`` gives the database's code when one answered (:func:`~.attributes.response_status`).
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import time
from collections.abc import Callable, Iterable, Mapping
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any, TypeVar, cast

from .attributes import (
    DB_OPERATION,
    DB_STATUS,
    DB_SYSTEM,
    ERROR_TYPE,
    EVENTS,
    FIRST_SEQ,
    LAST_SEQ,
    LEDGER_STATE,
    OPERATION,
    OUTCOME,
    PARAMETERS,
    SERVER_ADDRESS,
    SERVER_PORT,
    response_status,
    safe,
    store_attributes,
)
from .providers import Signals, current

__all__ = ["no_engine", "traced", "traced_block", "traced_methods"]

R = TypeVar("R")
C = TypeVar("C", bound=type)
#: A decorated function keeps its exact type (a ParamSpec copy would change what mypy reports on users' code).
F = TypeVar("F", bound=Callable[..., Any])

#: Error classes counted as conflicts (``hostedrooms.conflicts``): a fence or an idempotency key refused a write.
_CONFLICTS = frozenset({
    "EventConflictError", "RoomConflictError", "AuthorityConflictError", "AuthoritySupersededError",
    "ReplicaEpochRegressionError", "ReplicaGapError", "LedgerStateError",
})


@dataclass(frozen=True, slots=True)
class _Operation:
    name: str
    positions: Mapping[str, int]  # recorded parameter -> its position (or -1: keyword-only)
    engine: Callable[[tuple[Any, ...]], Any]  # where the Engine is, from the positional arguments
    result: Callable[[Any], dict[str, Any]] | None
    on_result: Callable[[Signals, tuple[Any, ...], Any], None] | None
    append: bool


def _first_argument(args: tuple[Any, ...]) -> Any:
    return args[0] if args else None


def no_engine(_args: tuple[Any, ...]) -> Any:
    """For :func:`traced`: the call has no Engine to describe (a probe's target may be a URL with a password).

    :param _args: the call's positional arguments (ignored).
    :returns: None.
    """
    return None


def traced(
    operation: str, *, engine: Callable[[tuple[Any, ...]], Any] = _first_argument,
    result: Callable[[Any], dict[str, Any]] | None = None,
    on_result: Callable[[Signals, tuple[Any, ...], Any], None] | None = None,
) -> Callable[[F], F]:
    """Decorate a public service so each call is one span ``operation`` (and one
    ``hostedrooms.operation.duration`` measurement); the function, its signature and its type are unchanged.

    ``engine`` finds the Engine among the positional arguments (default: the first). ``result`` maps the return
    value to more attributes (only identifiers, counts and seqs). ``on_result`` gets the signals, the positional
    arguments and the return value when something records (the standby's pass metrics).

    :param operation: the span's name.
    :param engine: finds the Engine among the positional arguments.
    :param result: maps the return value to more span attributes, or None.
    :param on_result: called when something records, or None.
    :returns: the decorator.
    """

    def decorate(function: F) -> F:
        spec = _Operation(operation, _positions(function), engine, result, on_result,
                          operation in ("append_event", "append_events"))

        @functools.wraps(function)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            signals = current()
            if signals is None:
                return function(*args, **kwargs)
            return _run(signals, spec, function, args, kwargs)

        return cast(F, wrapper)

    return decorate


def traced_methods(prefix: str, names: Iterable[str]) -> Callable[[C], C]:
    """Class decorator: :func:`traced` on each method in ``names`` (inherited ones included), as
    ``{prefix}.{name}``, finding the Engine at ``self.engine``.

    :param prefix: the spans' name prefix.
    :param names: the methods to trace.
    :returns: the class decorator.
    """

    def decorate(cls: C) -> C:
        for name in names:
            method = getattr(cls, name)
            setattr(cls, name, traced(f"{prefix}.{name}", engine=_self_engine, result=_record_state)(method))
        return cls

    return decorate


def _self_engine(args: tuple[Any, ...]) -> Any:
    return getattr(args[0], "engine", None) if args else None


def _positions(function: Callable[..., Any]) -> dict[str, int]:
    positions: dict[str, int] = {}
    for index, parameter in enumerate(inspect.signature(function).parameters.values()):
        if parameter.name in PARAMETERS:
            keyword_only = parameter.kind is inspect.Parameter.KEYWORD_ONLY
            positions[parameter.name] = -1 if keyword_only else index
    return positions


def _run(signals: Signals, spec: _Operation, function: Callable[..., R], args: tuple[Any, ...],
         kwargs: dict[str, Any]) -> R:
    with _Call(signals, spec, spec.engine(args), _arguments(spec.positions, args, kwargs)) as call:
        value = function(*args, **kwargs)
        call.returned(value)
        _after(signals, spec, args, value)
    return value


class _Call:
    """One recorded call: its span (when a tracer records) and its measurements, taken as it ends."""

    __slots__ = ("_returned", "_scope", "base", "signals", "span", "spec", "started")

    def __init__(self, signals: Signals, spec: _Operation, engine: Any, arguments: Mapping[str, Any]) -> None:
        self.signals, self.spec = signals, spec
        self.base = store_attributes(engine)
        self.base[DB_OPERATION] = spec.name
        self._scope: Any = None
        if signals.tracer is not None:
            self._scope = signals.tracer.start_as_current_span(
                spec.name, kind=_client_kind(), attributes={**self.base, **arguments}, record_exception=False,
                set_status_on_exception=False)
        self.span: Any = None
        self.started = 0.0
        self._returned = False

    def __enter__(self) -> _Call:
        if self._scope is not None:
            self.span = self._scope.__enter__()
        self.started = time.perf_counter()
        return self

    def returned(self, value: Any) -> None:
        """The call returned ``value``: its outcome and seq range on the span."""
        self._returned = True
        if self.span is not None and self.span.is_recording():
            self.span.set_attributes(_result_attributes(self.spec, value))

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: Any) -> None:
        status = None if exc is None else response_status(exc)
        if exc is not None and self.span is not None:
            self.span.set_attributes({ERROR_TYPE: _error_type(exc), OUTCOME: "error",
                                      **({} if status is None else {DB_STATUS: status})})
            self.span.set_status(_error_status(exc))
        elif exc is None and not self._returned and self.span is not None:  # a block: it ended without error
            self.span.set_attribute(OUTCOME, "ok")
        _measure(self.signals, self.spec, self.base, self.started, exc, status)
        if self._scope is not None:
            self._scope.__exit__(kind, exc, tb)


def traced_block(operation: str, engine: Any, arguments: Mapping[str, Any]) -> AbstractContextManager[Any]:
    """``with traced_block(...)``: a block recorded as a call of ``operation`` (its span and measurements, as
    :func:`traced` records a call), where no function call delimits it (the asyncio ``follow()``'s opening).
    ``engine``: the Engine to describe; ``arguments``: the call's arguments by parameter name (only those of
    :data:`~.attributes.PARAMETERS` are recorded, checked). Nothing when nothing records.

    :param operation: the operation's name.
    :param engine: the Engine to describe.
    :param arguments: the call's arguments by parameter name.
    :returns: the context manager.
    """
    signals = current()
    if signals is None:
        return contextlib.nullcontext()
    spec = _Operation(operation, {}, no_engine, None, None, False)
    return _Call(signals, spec, engine, _arguments({name: -1 for name in arguments if name in PARAMETERS}, (),
                                                   arguments))


def _after(signals: Signals, spec: _Operation, args: tuple[Any, ...], value: Any) -> None:
    if spec.on_result is not None:
        spec.on_result(signals, args, value)


def _client_kind() -> Any:
    from opentelemetry.trace import SpanKind

    return SpanKind.CLIENT


def _error_status(exc: BaseException) -> Any:
    from opentelemetry.trace import Status, StatusCode

    return Status(StatusCode.ERROR, _error_type(exc))  # the class only: messages may quote input


def _error_type(exc: BaseException) -> str:
    return type(exc).__name__


#: The store's attributes a measurement carries (never ``db.namespace``: a SQLite file's path per test or tenant).
_MEASURED = (DB_SYSTEM, SERVER_ADDRESS, SERVER_PORT)


def _measure(signals: Signals, spec: _Operation, base: dict[str, Any], started: float,
             exc: BaseException | None, status: str | None) -> None:
    instruments = signals.instruments
    if instruments is None:
        return
    elapsed = time.perf_counter() - started
    attributes = {key: base[key] for key in _MEASURED if key in base}
    attributes[OPERATION] = spec.name
    if exc is not None:
        attributes[ERROR_TYPE] = _error_type(exc)
        if status is not None:
            attributes[DB_STATUS] = status
        if attributes[ERROR_TYPE] in _CONFLICTS:
            instruments.conflicts.add(1, attributes)
    instruments.operation_duration.record(elapsed, attributes)
    if spec.append:
        instruments.append_duration.record(elapsed, attributes)


def _arguments(positions: Mapping[str, int], args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> dict[str, Any]:
    attributes: dict[str, Any] = {}
    for name, index in positions.items():
        if name in kwargs:
            value = kwargs[name]
        elif 0 <= index < len(args):
            value = args[index]
        else:
            continue
        value = safe(value)
        if value is not None:
            attributes[PARAMETERS[name]] = value
    return attributes


def _result_attributes(spec: _Operation, value: Any) -> dict[str, Any]:
    if spec.result is not None:
        try:
            return spec.result(value)
        except Exception:  # a result the mapper does not know: the span still ends, the call still returns
            return {OUTCOME: "ok"}
    return _record_seqs(value)


def _record_seqs(value: Any) -> dict[str, Any]:
    """Outcome and seq range of a service result: an event, a list of events, a page or a room record."""
    records: list[Any]
    if isinstance(value, Mapping) and isinstance(value.get("events"), list):
        records = value["events"]
    elif isinstance(value, Mapping):
        records = [value]
    elif isinstance(value, list):
        records = value
    else:
        return {OUTCOME: "ok" if value is not None else "none"}
    seqs = [record["seq"] for record in records
            if isinstance(record, Mapping) and type(record.get("seq")) is int]
    attributes: dict[str, Any] = {} if records and records[0] is value else {EVENTS: len(records)}
    if seqs:
        attributes[FIRST_SEQ], attributes[LAST_SEQ] = min(seqs), max(seqs)
    replay = bool(records) and all(isinstance(r, Mapping) and r.get("idempotent") is True for r in records)
    attributes[OUTCOME] = "replay" if replay else "ok"
    return attributes


def _record_state(value: Any) -> dict[str, Any]:
    """The ledger's results: a record (its state), a list of records (how many), a count or None."""
    if isinstance(value, Mapping):
        state = value.get("state")
        return {OUTCOME: "ok", **({LEDGER_STATE: state} if safe(state) is not None else {})}
    if isinstance(value, list):
        return {OUTCOME: "ok", EVENTS: len(value)}
    return {OUTCOME: "ok" if value is not None else "none"}

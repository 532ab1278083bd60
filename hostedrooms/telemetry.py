"""OpenTelemetry for hostedrooms: one span per public service call and a few metrics, all optional.

hostedrooms depends on the OpenTelemetry *API* only (the ``otel`` extra: ``pip install 'hostedrooms[otel]'``);
the application configures the SDK, its exporters and its sampling. Without the API installed nothing of
OpenTelemetry is imported and every service runs exactly as without this module. With the API and no SDK
configured (no tracer or meter provider set), a service call checks that once per call and runs the plain
function: no span, no measurement. :func:`configure` points hostedrooms at providers of its own instead of the
global ones (tests, or an application keeping hostedrooms' signals apart).

What is recorded (docs/observability.md lists every name): spans named after ``db.operation.name`` with
OpenTelemetry's database attributes (``db.system.name``, ``db.namespace``, ``db.operation.name``) plus room id,
gateway id, epoch, seq range, outcome and error class; never a message body, payload, actor, grant, claim,
lease token, digest, error text or URL. Exceptions are not recorded as span events (their messages may quote
input): the span's status is ERROR and ``error.type`` names the class.

The instrumentation is applied once per service (:func:`traced` on a function, :func:`traced_methods` on the
ledger class); the few metrics that need a value from inside a service are one call each
(:func:`count_appended`, :func:`count_retry`, :func:`follow_woke`).
"""

from __future__ import annotations

import functools
import inspect
import threading
import time
import weakref
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar, cast

__all__ = [
    "LagBook",
    "configure",
    "count_appended",
    "count_retry",
    "follow_woke",
    "no_engine",
    "observe_ledger",
    "traced",
    "traced_methods",
]

R = TypeVar("R")
C = TypeVar("C", bound=type)
#: A decorated function keeps its exact type (a ParamSpec copy would change what mypy reports on users' code).
F = TypeVar("F", bound=Callable[..., Any])

#: The instrumentation scope's name (``otel.scope.name`` on every span and metric).
SCOPE = "hostedrooms"

# Attribute names (OpenTelemetry database semantic conventions, then hostedrooms' own).
DB_SYSTEM = "db.system.name"
DB_NAMESPACE = "db.namespace"
DB_OPERATION = "db.operation.name"
ERROR_TYPE = "error.type"
ROOM = "hostedrooms.room.id"
GATEWAY = "hostedrooms.gateway.id"
EPOCH = "hostedrooms.epoch"
SINCE_SEQ = "hostedrooms.seq.since"
FIRST_SEQ = "hostedrooms.seq.first"
LAST_SEQ = "hostedrooms.seq.last"
OUTCOME = "hostedrooms.outcome"
EVENTS = "hostedrooms.events"
LEDGER_STATE = "hostedrooms.ledger.state"
LEDGER_TABLE = "hostedrooms.ledger.table"
RETRY_KIND = "hostedrooms.retry.kind"

#: Arguments recorded as span attributes, by parameter name. Only identifiers and integers: the values are
#: checked (a str of at most _MAX_TEXT characters, an int that is not a bool) before they are recorded.
_PARAMETERS: dict[str, str] = {
    "room_id": ROOM,
    "authority_gateway_id": GATEWAY,
    "expected_gateway_id": GATEWAY,
    "new_gateway_id": GATEWAY,
    "local_gateway_id": GATEWAY,
    "observed_gateway_id": GATEWAY,
    "authority_epoch": EPOCH,
    "expected_epoch": EPOCH,
    "observed_epoch": EPOCH,
    "since_seq": SINCE_SEQ,
}
_MAX_TEXT = 256

#: Error classes counted as conflicts (``hostedrooms.conflicts``): a fence or an idempotency key refused a write.
_CONFLICTS = frozenset({
    "EventConflictError", "RoomConflictError", "AuthorityConflictError", "AuthoritySupersededError",
    "ReplicaEpochRegressionError", "ReplicaGapError", "LedgerStateError",
})


# -- the providers -----------------------------------------------------------------------------------------------


class _Signals:
    """The tracer and instruments of one pair of providers (either may be None: not configured)."""

    def __init__(self, tracer_provider: Any, meter_provider: Any) -> None:
        from . import __version__ as version  # the instrumentation scope's version

        self.tracer = None if tracer_provider is None else tracer_provider.get_tracer(SCOPE, version)
        self.meter = None if meter_provider is None else meter_provider.get_meter(SCOPE, version)
        if self.meter is not None:
            self._instruments(self.meter)

    def _instruments(self, meter: Any) -> None:
        self.operation_duration = meter.create_histogram(
            "db.client.operation.duration", unit="s", description="Duration of hostedrooms service calls")
        self.append_duration = meter.create_histogram(
            "hostedrooms.append.duration", unit="s", description="Duration of append_event and append_events")
        self.events_appended = meter.create_counter(
            "hostedrooms.events.appended", unit="{event}", description="Events newly written by appends")
        self.bytes_appended = meter.create_counter(
            "hostedrooms.bytes.appended", unit="By", description="Accounted bytes of the events newly written")
        self.conflicts = meter.create_counter(
            "hostedrooms.conflicts", unit="{conflict}", description="Calls refused by a fence or idempotency key")
        self.retries = meter.create_counter(
            "hostedrooms.retries", unit="{retry}", description="Room write attempts run again; ledger retries")
        self.follow_wakeup = meter.create_histogram(
            "hostedrooms.follow.wakeup.latency", unit="s",
            description="From an event's created_at to follow() reading it after a wait")
        self.pass_duration = meter.create_histogram(
            "hostedrooms.standby.pass.duration", unit="s", description="Duration of a standby replication pass")
        self.pass_failures = meter.create_counter(
            "hostedrooms.standby.pass.failures", unit="{pass}", description="Standby passes that stopped early")
        meter.create_observable_gauge(
            "hostedrooms.replica.lag.seqs", callbacks=[_observe_lag_seqs], unit="{event}",
            description="Events the source holds that the replica does not, per room")
        meter.create_observable_gauge(
            "hostedrooms.replica.lag.seconds", callbacks=[_observe_lag_seconds], unit="s",
            description="Seconds since the replicator first saw the room behind (0 when caught up)")
        meter.create_observable_gauge(
            "hostedrooms.ledger.backlog", callbacks=[_observe_backlog], unit="{item}",
            description="Non-terminal ledger rows by table and state, in the ledgers passed to observe_ledger")


_lock = threading.Lock()
_api: Any = None  # None: not looked for yet; False: not installed; else _Api
_override: _Signals | None = None
_cached: tuple[Any, Any, _Signals | None] = (None, None, None)  # (tracer provider, meter provider, signals)


@dataclass(frozen=True, slots=True)
class _Api:
    """The installed OpenTelemetry API: ``providers()`` returns the global (tracer, meter) providers as set."""

    providers: Callable[[], tuple[Any, Any]]
    noop: tuple[type, ...]


def _load_api() -> Any:
    global _api
    try:
        from opentelemetry import metrics, trace
    except ImportError:
        _api = False
        return _api
    _api = _Api(_global_providers(trace, metrics), (trace.ProxyTracerProvider, trace.NoOpTracerProvider))
    return _api


def _global_providers(trace: Any, metrics: Any) -> Callable[[], tuple[Any, Any]]:
    """How to read the global providers at each call. The public getters cost microseconds (an environment
    lookup each) against a durable append's budget of a few percent, so where the API keeps them in its module
    globals (as 1.x does) those are read: None until a provider is set. The getters run once first, so a
    provider named by OTEL_PYTHON_TRACER_PROVIDER / OTEL_PYTHON_METER_PROVIDER is loaded and set as they do."""
    trace.get_tracer_provider()
    metrics.get_meter_provider()
    internal = getattr(metrics, "_internal", None)
    if hasattr(trace, "_TRACER_PROVIDER") and hasattr(internal, "_METER_PROVIDER"):
        return lambda: (trace._TRACER_PROVIDER, internal._METER_PROVIDER)  # type: ignore[union-attr]
    return lambda: (trace.get_tracer_provider(), metrics.get_meter_provider())


def _configured(provider: Any, noop: tuple[type, ...], api_module: str) -> Any:
    """``provider`` when it is a real one (an SDK's), else None (unset, the API's proxy or no-op)."""
    if provider is None or isinstance(provider, noop) or type(provider).__module__.startswith(api_module):
        return None
    return provider


def _current() -> _Signals | None:
    """The signals to record now, or None (no API, or no provider configured): the per-call check."""
    if _override is not None:
        return _override
    api = _api if _api is not None else _load_api()
    if api is False:
        return None
    tracer_provider, meter_provider = api.providers()
    cached = _cached
    if tracer_provider is cached[0] and meter_provider is cached[1]:
        return cached[2]
    return _refresh(tracer_provider, meter_provider, api.noop)


def _refresh(tracer_provider: Any, meter_provider: Any, noop: tuple[type, ...]) -> _Signals | None:
    global _cached
    with _lock:
        real_tracer = _configured(tracer_provider, noop, "opentelemetry.trace")
        real_meter = _configured(meter_provider, (), "opentelemetry.metrics")
        signals = None if real_tracer is None and real_meter is None else _Signals(real_tracer, real_meter)
        _cached = (tracer_provider, meter_provider, signals)
        return signals


def configure(*, tracer_provider: Any = None, meter_provider: Any = None) -> None:
    """Record hostedrooms' spans and metrics with these providers instead of the global ones.

    Call with no argument to go back to the global providers (``opentelemetry.trace.set_tracer_provider`` and
    ``opentelemetry.metrics.set_meter_provider``). A provider left None records nothing of its kind.
    Needs the OpenTelemetry API (the ``otel`` extra) only to be useful: the providers are the caller's objects.
    """
    global _override
    with _lock:
        if tracer_provider is None and meter_provider is None:
            _override = None
        else:
            _override = _Signals(tracer_provider, meter_provider)


# -- spans ------------------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Operation:
    name: str
    positions: Mapping[str, int]  # recorded parameter -> its position (or -1: keyword-only)
    engine: Callable[[tuple[Any, ...]], Any]  # where the Engine is, from the positional arguments
    result: Callable[[Any], dict[str, Any]] | None
    on_result: Callable[[_Signals, tuple[Any, ...], Any], None] | None
    append: bool


def _first_argument(args: tuple[Any, ...]) -> Any:
    return args[0] if args else None


def no_engine(_args: tuple[Any, ...]) -> Any:
    """For :func:`traced`: the call has no Engine to describe (a probe's target may be a URL with a password)."""
    return None


def traced(
    operation: str, *, engine: Callable[[tuple[Any, ...]], Any] = _first_argument,
    result: Callable[[Any], dict[str, Any]] | None = None,
    on_result: Callable[[Any, tuple[Any, ...], Any], None] | None = None,
) -> Callable[[F], F]:
    """Decorate a public service so each call is one span ``operation`` (and one ``db.client.operation.duration``
    measurement); the function, its signature and its type are unchanged.

    ``engine`` finds the Engine among the positional arguments (default: the first). ``result`` maps the return
    value to more attributes (only identifiers, counts and seqs). ``on_result`` gets the signals, the positional
    arguments and the return value when something records (the standby's pass metrics).
    """

    def decorate(function: F) -> F:
        spec = _Operation(operation, _positions(function), engine, result, on_result,
                          operation in ("append_event", "append_events"))

        @functools.wraps(function)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            signals = _current()
            if signals is None:
                return function(*args, **kwargs)
            return _run(signals, spec, function, args, kwargs)

        return cast(F, wrapper)

    return decorate


def traced_methods(prefix: str, names: Iterable[str]) -> Callable[[C], C]:
    """Class decorator: :func:`traced` on each method in ``names`` (inherited ones included), as
    ``{prefix}.{name}``, finding the Engine at ``self.engine``."""

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
        if parameter.name in _PARAMETERS:
            keyword_only = parameter.kind is inspect.Parameter.KEYWORD_ONLY
            positions[parameter.name] = -1 if keyword_only else index
    return positions


def _run(signals: _Signals, spec: _Operation, function: Callable[..., R], args: tuple[Any, ...],
         kwargs: dict[str, Any]) -> R:
    base = _engine_attributes(spec.engine(args))
    base[DB_OPERATION] = spec.name
    tracer = signals.tracer
    started = time.perf_counter()
    if tracer is None:
        try:
            value = function(*args, **kwargs)
        except BaseException as exc:
            _measure(signals, spec, base, started, exc)
            raise
        _measure(signals, spec, base, started, None)
        _after(signals, spec, args, value)
        return value
    attributes = dict(base)
    attributes.update(_arguments(spec.positions, args, kwargs))
    with tracer.start_as_current_span(spec.name, kind=_client_kind(), attributes=attributes,
                                      record_exception=False, set_status_on_exception=False) as span:
        try:
            value = function(*args, **kwargs)
        except BaseException as exc:
            span.set_attribute(ERROR_TYPE, _error_type(exc))
            span.set_attribute(OUTCOME, "error")
            span.set_status(_error_status(exc))
            _measure(signals, spec, base, started, exc)
            raise
        if span.is_recording():
            span.set_attributes(_result_attributes(spec, value))
        _measure(signals, spec, base, started, None)
        _after(signals, spec, args, value)
        return value


def _after(signals: _Signals, spec: _Operation, args: tuple[Any, ...], value: Any) -> None:
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


def _measure(signals: _Signals, spec: _Operation, base: dict[str, Any], started: float,
             exc: BaseException | None) -> None:
    if signals.meter is None:
        return
    elapsed = time.perf_counter() - started
    attributes = {key: base[key] for key in (DB_SYSTEM, DB_OPERATION) if key in base}
    if exc is not None:
        attributes[ERROR_TYPE] = _error_type(exc)
        if attributes[ERROR_TYPE] in _CONFLICTS:
            signals.conflicts.add(1, attributes)
    signals.operation_duration.record(elapsed, attributes)
    if spec.append:
        signals.append_duration.record(elapsed, attributes)


def _safe(value: Any) -> str | int | None:
    if type(value) is int:
        return value
    if type(value) is str and len(value) <= _MAX_TEXT:
        return value
    return None


def _arguments(positions: Mapping[str, int], args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> dict[str, Any]:
    attributes: dict[str, Any] = {}
    for name, index in positions.items():
        if name in kwargs:
            value = kwargs[name]
        elif 0 <= index < len(args):
            value = args[index]
        else:
            continue
        safe = _safe(value)
        if safe is not None:
            attributes[_PARAMETERS[name]] = safe
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
        return {OUTCOME: "ok", **({LEDGER_STATE: state} if _safe(state) is not None else {})}
    if isinstance(value, list):
        return {OUTCOME: "ok", EVENTS: len(value)}
    return {OUTCOME: "ok" if value is not None else "none"}


_engines: weakref.WeakKeyDictionary[Any, dict[str, Any]] = weakref.WeakKeyDictionary()


def _engine_attributes(engine: Any) -> dict[str, Any]:
    """``db.system.name`` and ``db.namespace`` of an Engine (the database and schema names, never the URL)."""
    try:
        known = _engines.get(engine)
    except TypeError:  # a factory or anything else not weakly referable: nothing to say about it
        return {}
    if known is None:
        known = _describe_engine(engine)
        try:
            _engines[engine] = known
        except TypeError:
            pass
    return dict(known)


def _describe_engine(engine: Any) -> dict[str, Any]:
    from sqlalchemy import Engine

    if not isinstance(engine, Engine):
        return {}
    from .db import engine_schema

    backend = engine.dialect.name
    attributes: dict[str, Any] = {DB_SYSTEM: backend}
    database = engine.url.database
    if database:
        schema = engine_schema(engine)
        attributes[DB_NAMESPACE] = f"{database}|{schema}" if schema else database
    return attributes


# -- metrics recorded from inside services -----------------------------------------------------------------------


def count_appended(events: Iterable[Any], written: Iterable[Mapping[str, Any]]) -> None:
    """Count the events an append wrote (not its replays) and their accounted bytes (``PreparedEvent.size``)."""
    signals = _current()
    if signals is None or signals.meter is None:
        return
    fresh = {row["event_id"] for row in written}
    sizes = [event.size for event in events if event.event_id in fresh]
    if sizes:
        signals.events_appended.add(len(sizes))
        signals.bytes_appended.add(sum(sizes))


def count_retry(kind: str) -> None:
    """Count one retry: ``kind`` is ``room_write.full_path``, ``room_write.exclusive`` or ``ledger``."""
    signals = _current()
    if signals is not None and signals.meter is not None:
        signals.retries.add(1, {RETRY_KIND: kind})


def follow_woke(page: Mapping[str, Any], wall_clock: Callable[[], float] = time.time) -> None:
    """Record follow()'s wake-up latency: now minus the ``created_at`` of the first event read after a wait."""
    signals = _current()
    if signals is None or signals.meter is None:
        return
    events = page.get("events") or ()
    created = events[0].get("created_at") if events else None
    if isinstance(created, (int, float)) and not isinstance(created, bool):
        signals.follow_wakeup.record(max(0.0, wall_clock() - float(created)))


# -- replica lag -------------------------------------------------------------------------------------------------


class LagBook:
    """Each room's replica lag as a replicator last saw it: seqs behind, and the seconds since the replicator
    first saw the room behind without a pass catching it up since (0 when caught up).

    The source states no commit times, so the seconds are measured on this process's ``monotonic`` clock from
    the first pass that saw the room's source ahead of its replica: a lower bound of the age of the oldest
    event the replica lacks. Fed with each :class:`~hostedrooms.standby.PassReport` (:meth:`update`).
    """

    def __init__(self, monotonic: Callable[[], float] = time.monotonic) -> None:
        self._monotonic = monotonic
        self._lock = threading.Lock()
        self._seqs: dict[str, int] = {}
        self._behind_since: dict[str, float] = {}

    def update(self, rooms: Iterable[tuple[str, int]], *, complete: bool) -> None:
        """Record ``(room_id, lag)`` pairs from one pass; ``complete`` (the pass saw every room): forget rooms
        it did not report (purged or no longer listed)."""
        now = self._monotonic()
        with self._lock:
            seen: set[str] = set()
            for room_id, lag in rooms:
                seen.add(room_id)
                self._seqs[room_id] = lag
                if lag <= 0:
                    self._behind_since.pop(room_id, None)
                else:
                    self._behind_since.setdefault(room_id, now)
            if complete:
                for room_id in set(self._seqs) - seen:
                    self._seqs.pop(room_id, None)
                    self._behind_since.pop(room_id, None)

    def snapshot(self) -> dict[str, tuple[int, float]]:
        """Each room's ``(seqs behind, seconds behind)`` now."""
        now = self._monotonic()
        with self._lock:
            return {room_id: (lag, max(0.0, now - self._behind_since[room_id]) if room_id in self._behind_since
                              else 0.0) for room_id, lag in self._seqs.items()}


#: Each replicator's lag (read by the ``hostedrooms.replica.lag.*`` gauges), timed on its own ``monotonic``.
_lag_books: weakref.WeakKeyDictionary[Any, LagBook] = weakref.WeakKeyDictionary()


def lag_book(replicator: Any) -> LagBook:
    """The lag ``replicator``'s passes reported while something recorded (created on first use)."""
    with _lock:
        book = _lag_books.get(replicator)
        if book is None:
            book = _lag_books[replicator] = LagBook(getattr(replicator, "_monotonic", time.monotonic))
        return book


def record_pass(signals: Any, args: tuple[Any, ...], report: Any) -> None:
    """A standby pass ended (``on_result`` of ``Replicator.sync_once``): its duration, failure and lag."""
    lag_book(args[0]).update(((room.room_id, room.lag) for room in report.rooms),
                             complete=not report.error and not report.bound)
    if signals.meter is None:
        return
    signals.pass_duration.record(report.seconds)
    if report.error:
        signals.pass_failures.add(1)


def pass_attributes(report: Any) -> dict[str, Any]:
    """A pass span's attributes: counts and the outcome (never the error text: it may name the source)."""
    outcome = "error" if report.error else "bound" if report.bound else "ok" if report.ok else "refused"
    return {OUTCOME: outcome, "hostedrooms.standby.rooms": len(report.rooms), EVENTS: report.events,
            "hostedrooms.standby.lag": report.lag}


def _observe_lag_seqs(_options: Any) -> Iterable[Any]:
    return _observations(0)


def _observe_lag_seconds(_options: Any) -> Iterable[Any]:
    return _observations(1)


def _observations(index: int) -> list[Any]:
    from opentelemetry.metrics import Observation

    observations: list[Any] = []
    for replicator, book in list(_lag_books.items()):
        base = _engine_attributes(getattr(replicator, "target", None))
        observations.extend(Observation(values[index], {**base, ROOM: room_id})
                            for room_id, values in book.snapshot().items())
    return observations


# -- the ledger's backlog ----------------------------------------------------------------------------------------

_ledgers: weakref.WeakSet[Any] = weakref.WeakSet()


def observe_ledger(ledger: Any) -> None:
    """Report ``ledger``'s backlog (``hostedrooms.ledger.backlog``: its non-terminal rows by table and state,
    :meth:`DeliveryLedger.backlog <hostedrooms.ledger.DeliveryLedger.backlog>`) at each metric collection: one
    read transaction per collection, on the collecting thread. The ledger is held weakly."""
    _ledgers.add(ledger)


def _observe_backlog(_options: Any) -> Iterable[Any]:
    from opentelemetry.metrics import Observation

    observations = []
    for ledger in list(_ledgers):
        base = _engine_attributes(ledger.engine)
        try:
            counts = ledger.backlog()
        except Exception:  # an unreachable store: no observation this time (a gauge callback must not raise)
            continue
        for (table, state), count in counts.items():
            observations.append(Observation(count, {**base, LEDGER_TABLE: table, LEDGER_STATE: state}))
    return observations

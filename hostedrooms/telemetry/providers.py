"""Which providers hostedrooms records with, looked up once per call: the no-SDK fast path.

Without the OpenTelemetry API installed nothing of OpenTelemetry is imported (:func:`current` returns None).
With the API and no SDK configured (no tracer or meter provider set), :func:`current` checks the API's provider
globals and returns None: the caller runs its plain code. The tracer and instruments of a pair of real providers
are built once and cached until the providers change. :func:`configure` replaces the global providers with the
application's own.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from .._version import __version__
from .instruments import Instruments

__all__ = ["SCOPE", "Signals", "configure", "current"]

#: The instrumentation scope's name (``otel.scope.name`` on every span and metric).
SCOPE = "hostedrooms"


class Signals:
    """The tracer and instruments of one pair of providers (either may be None: not configured).

    :param tracer_provider: an OpenTelemetry tracer provider, or None.
    :param meter_provider: an OpenTelemetry meter provider, or None.
    """

    def __init__(self, tracer_provider: Any, meter_provider: Any) -> None:
        self.tracer = None if tracer_provider is None else tracer_provider.get_tracer(SCOPE, __version__)
        self.meter = None if meter_provider is None else meter_provider.get_meter(SCOPE, __version__)
        self.instruments = None if self.meter is None else Instruments(self.meter)


_lock = threading.Lock()
_api: Any = None  # None: not looked for yet; False: not installed; else _Api
_override: Signals | None = None
_cached: tuple[Any, Any, Signals | None] = (None, None, None)  # (tracer provider, meter provider, signals)


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


def current() -> Signals | None:
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


def _refresh(tracer_provider: Any, meter_provider: Any, noop: tuple[type, ...]) -> Signals | None:
    global _cached
    with _lock:
        real_tracer = _configured(tracer_provider, noop, "opentelemetry.trace")
        real_meter = _configured(meter_provider, (), "opentelemetry.metrics")
        signals = None if real_tracer is None and real_meter is None else Signals(real_tracer, real_meter)
        _cached = (tracer_provider, meter_provider, signals)
        return signals


def configure(*, tracer_provider: Any = None, meter_provider: Any = None) -> None:
    """Record hostedrooms' spans and metrics with these providers instead of the global ones.

    Call with no argument to go back to the global providers (``opentelemetry.trace.set_tracer_provider`` and
    ``opentelemetry.metrics.set_meter_provider``). A provider left None records nothing of its kind.
    Needs the OpenTelemetry API (the ``otel`` extra) only to be useful: the providers are the caller's objects.

    :param tracer_provider: the OpenTelemetry tracer provider, or None.
    :param meter_provider: the OpenTelemetry meter provider, or None.
    """
    global _override
    with _lock:
        if tracer_provider is None and meter_provider is None:
            _override = None
        else:
            _override = Signals(tracer_provider, meter_provider)

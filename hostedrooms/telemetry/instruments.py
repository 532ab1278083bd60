"""The metric instruments hostedrooms creates on a meter, and the public hook that feeds its gauges.

The gauges are read from outside telemetry: the standby's replica lag (:mod:`hostedrooms.standby.lag`) and the
ledger's backlog (:func:`hostedrooms.ledger.observe_ledger`). Their modules register a reader with
:func:`observe_gauge` when imported; telemetry imports neither of them. docs/observability.md lists every name.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Mapping
from typing import Any

__all__ = [
    "BACKLOG", "DURATION_BUCKETS", "LAG_SECONDS", "LAG_SEQS", "OPERATION_DURATION", "GaugeReader", "Instruments",
    "observe_gauge",
]

#: hostedrooms' own duration of each public call: not the conventions' ``db.client.operation.duration``, which
#: SQL-level instrumentation records for each statement (the same time would be counted twice in its totals).
OPERATION_DURATION = "hostedrooms.operation.duration"
#: Every duration histogram's bucket boundaries, in seconds: those the OpenTelemetry database conventions advise
#: for ``db.client.operation.duration`` (given as advice: a View of the application's still decides). The SDK's
#: default boundaries (0, 5, 10, ... 10000) are meant for milliseconds: every call would fall in the first.
DURATION_BUCKETS = (0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1.0, 5.0, 10.0)

LAG_SEQS = "hostedrooms.replica.lag.seqs"
LAG_SECONDS = "hostedrooms.replica.lag.seconds"
BACKLOG = "hostedrooms.ledger.backlog"

#: A gauge's reader: called at each metric collection, on the collecting thread; each ``(value, attributes)``
#: pair is one observation. A reader must not raise (a gauge callback must not).
GaugeReader = Callable[[], Iterable[tuple[float, Mapping[str, Any]]]]

_GAUGES: dict[str, tuple[str, str]] = {  # name -> (unit, description)
    LAG_SEQS: ("{event}", "Events the source holds that the replica does not, per room"),
    LAG_SECONDS: ("s", "Seconds since the replicator first saw the room behind (0 when caught up)"),
    BACKLOG: ("{item}", "Non-terminal ledger rows by table and state, in the ledgers passed to observe_ledger"),
}
_readers: dict[str, list[GaugeReader]] = {name: [] for name in _GAUGES}
_lock = threading.Lock()


def observe_gauge(name: str, reader: GaugeReader) -> None:
    """Feed the gauge ``name`` (``LAG_SEQS``, ``LAG_SECONDS`` or ``BACKLOG``) with ``reader``'s observations
    too, on every meter hostedrooms records with (those set later included).

    :param name: the gauge's name.
    :param reader: returns the observations, called at each collection.
    :raises ValueError: no hostedrooms gauge has that name.
    """
    if name not in _GAUGES:
        raise ValueError(f"no hostedrooms gauge is named {name!r}")
    with _lock:
        _readers[name] = [*_readers[name], reader]


def _callback(name: str) -> Callable[[Any], Iterable[Any]]:
    def observe(_options: Any) -> Iterable[Any]:
        from opentelemetry.metrics import Observation

        return [Observation(value, dict(attributes))
                for reader in _readers[name] for value, attributes in reader()]

    return observe


class Instruments:
    """hostedrooms' instruments on one meter (the gauges' callbacks read the registered readers)."""

    def __init__(self, meter: Any) -> None:
        self.operation_duration = _seconds(meter, OPERATION_DURATION, "Duration of hostedrooms service calls")
        self.append_duration = _seconds(
            meter, "hostedrooms.append.duration", "Duration of append_event and append_events")
        self.events_appended = meter.create_counter(
            "hostedrooms.events.appended", unit="{event}", description="Events newly written by appends")
        self.bytes_appended = meter.create_counter(
            "hostedrooms.bytes.appended", unit="By", description="Accounted bytes of the events newly written")
        self.conflicts = meter.create_counter(
            "hostedrooms.conflicts", unit="{conflict}", description="Calls refused by a fence or idempotency key")
        self.retries = meter.create_counter(
            "hostedrooms.retries", unit="{retry}", description="Room write attempts run again; ledger retries")
        self.follow_wakeup = _seconds(meter, "hostedrooms.follow.wakeup.latency",
                                      "From an event's created_at to follow() reading it after a wait")
        self.pass_duration = _seconds(
            meter, "hostedrooms.standby.pass.duration", "Duration of a standby replication pass")
        self.pass_failures = meter.create_counter(
            "hostedrooms.standby.pass.failures", unit="{pass}", description="Standby passes that stopped early")
        for name, (unit, description) in _GAUGES.items():
            meter.create_observable_gauge(name, callbacks=[_callback(name)], unit=unit, description=description)


def _seconds(meter: Any, name: str, description: str) -> Any:
    """A duration histogram in seconds, with :data:`DURATION_BUCKETS` as its bucket advice."""
    return meter.create_histogram(name, unit="s", description=description,
                                  explicit_bucket_boundaries_advisory=DURATION_BUCKETS)

"""Prometheus metrics of a following standby: ``hostedrooms replicate --follow --metrics HOST:PORT``.

:class:`StandbyMetrics` is fed each :class:`~hostedrooms.standby.PassReport` (``Replicator.run``'s ``on_pass``)
and serves the Prometheus text exposition format at ``http://HOST:PORT/metrics`` (any path answers the same)
with prometheus-client (the ``metrics`` extra), on its own registry: every room's lag (seqs and seconds, computed
when scraped), the passes, their durations and failures. docs/observability.md lists the names.
"""

from __future__ import annotations

import ipaddress
import re
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

from ..errors import HostedRoomError
from .lag import LagBook

__all__ = ["StandbyMetrics", "parse_address"]

_HOST = re.compile(r"[A-Za-z0-9]([A-Za-z0-9.-]{0,251}[A-Za-z0-9])?")


def parse_address(text: Any, *, option: str = "--metrics") -> tuple[str, int]:
    """``HOST:PORT`` (``[IPv6]:PORT`` for an IPv6 address) as ``(host, port)``; port 0 takes any free port.

    The host is required (an address or a host name): the endpoint is bound only where the operator said.
    Anything else raises HostedRoomError naming the expected form.

    :param text: the address.
    :param option: the option named in the error message.
    :returns: ``(host, port)``.
    :raises HostedRoomError: ``text`` is not ``HOST:PORT``.
    """
    expected = f"{option} must be HOST:PORT (e.g. 127.0.0.1:9464, or [::1]:9464), not {text!r}"
    if not isinstance(text, str) or len(text) > 300:
        raise HostedRoomError(expected)
    host, colon, port = text.rpartition(":")
    if not colon or not port.isascii() or not port.isdigit() or int(port) > 65535:
        raise HostedRoomError(expected)
    if host.startswith("[") and host.endswith("]"):
        try:
            host = str(ipaddress.IPv6Address(host[1:-1]))
        except ValueError:
            raise HostedRoomError(expected) from None
    elif not _HOST.fullmatch(host):
        raise HostedRoomError(expected)
    return host, int(port)


def _prometheus() -> Any:
    try:
        import prometheus_client
    except ImportError:
        raise HostedRoomError(
            "--metrics needs prometheus-client: pip install 'hostedrooms[metrics]'") from None
    return prometheus_client


class StandbyMetrics:
    """A following replicator's metrics on a prometheus-client registry of their own.

    Call :meth:`on_pass` with each pass's report; :meth:`serve` starts the HTTP endpoint (a daemon thread) and
    :meth:`close` stops it. ``monotonic`` times the lag seconds (:class:`~hostedrooms.standby.lag.LagBook`).

    :param monotonic: the clock the lag seconds are timed with.
    """

    def __init__(self, *, monotonic: Callable[[], float] = time.monotonic) -> None:
        client = _prometheus()
        self.lag = LagBook(monotonic)
        self.registry = client.CollectorRegistry(auto_describe=True)
        self.passes = client.Counter("hostedrooms_standby_passes", "Replication passes run",
                                     registry=self.registry)
        self.failures = client.Counter(
            "hostedrooms_standby_pass_failures", "Passes that stopped early (the source or the store unusable)",
            registry=self.registry)
        self.durations = client.Histogram(
            "hostedrooms_standby_pass_duration_seconds", "Duration of each replication pass",
            buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0),
            registry=self.registry)
        self.rooms = client.Gauge("hostedrooms_standby_rooms", "Rooms of the last pass by status",
                                  ["status"], registry=self.registry)
        self.events = client.Counter("hostedrooms_standby_events", "Events stored by the passes",
                                     registry=self.registry)
        self.registry.register(_LagCollector(self.lag, client))
        self._server: Any = None
        self._thread: threading.Thread | None = None
        self._statuses: set[str] = set()

    def on_pass(self, report: Any) -> None:
        """Record one pass (a :class:`~hostedrooms.standby.PassReport`).

        :param report: the pass's report.
        """
        self.passes.inc()
        self.durations.observe(max(0.0, float(report.seconds)))
        self.events.inc(report.events)
        if report.error:
            self.failures.inc()
        self.lag.update(((room.room_id, room.lag) for room in report.rooms),
                        complete=not report.error and not report.bound)
        counts: dict[str, int] = {}
        for room in report.rooms:
            counts[room.status] = counts.get(room.status, 0) + 1
        for status in self._statuses | set(counts):
            self.rooms.labels(status=status).set(counts.get(status, 0))
        self._statuses |= set(counts)

    def serve(self, address: str) -> tuple[str, int]:
        """Serve the metrics at ``address`` (``HOST:PORT``, :func:`parse_address`); return where it listens.

        :param address: ``HOST:PORT``.
        :returns: ``(host, port)`` it listens on.
        :raises HostedRoomError: ``address`` is invalid or cannot be listened on.
        """
        host, port = parse_address(address)
        client = _prometheus()
        try:
            self._server, self._thread = client.start_http_server(port, addr=host, registry=self.registry)
        except OSError as exc:
            raise HostedRoomError(f"--metrics {address}: cannot listen there ({exc.strerror or exc})") from None
        bound = self._server.server_address
        return str(bound[0]), int(bound[1])

    def close(self) -> None:
        """Stop the endpoint (when serving)."""
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None


class _LagCollector:
    """Each room's lag, read from the book when scraped (the seconds keep growing between passes)."""

    def __init__(self, book: LagBook, client: Any) -> None:
        self._book, self._client = book, client

    def describe(self) -> list[Any]:
        return []

    def collect(self) -> Iterator[Any]:
        families = self._client.metrics_core
        seqs = families.GaugeMetricFamily(
            "hostedrooms_replica_lag_seqs", "Events the source holds that the replica does not", labels=["room"])
        seconds = families.GaugeMetricFamily(
            "hostedrooms_replica_lag_seconds",
            "Seconds since the replicator first saw the room behind (0 when caught up)", labels=["room"])
        for room_id, (lag, behind) in sorted(self._book.snapshot().items()):
            seqs.add_metric([room_id], lag)
            seconds.add_metric([room_id], behind)
        yield seqs
        yield seconds

"""What hostedrooms' OpenTelemetry instrumentation costs a single durable append (issue 29: at most 3% with the
API installed and no SDK configured).

    python bench/run.py --telemetry-overhead --rounds 10     # SQLite file, synchronous=FULL
    python bench/run.py --telemetry-overhead --rounds 20 --synchronous NORMAL

One process, one database, one room; single events (``rooms.append_event``, one transaction each) appended by
the variants in turn, one by one, so that drift in the disk's and the machine's load (and the log's growth)
falls on all of them alike; each round gives each variant's median latency (wall clock, and CPU time of the
thread), and its ratio to ``off``:

- ``off``: the service without its span wrapper (``__wrapped__``) and the telemetry providers told the API is
  absent (its in-service counters return at once): hostedrooms as it was before the instrumentation;
- ``api, no SDK``: the shipped path with the OpenTelemetry API installed and no provider configured;
- ``SDK`` (informational, when opentelemetry-sdk is installed): a TracerProvider and a MeterProvider with no
  processor or reader, so spans and measurements are built and dropped (what the exporters add is not counted).

Prints each variant's median latency per append and the median and range over the rounds of its ratio to ``off``.
A durable append's time is mostly its fsyncs, whose noise on a shared machine can hide a few microseconds; so it
also prints the wrapper's own CPU cost per call (a service that does nothing, wrapped and not, no I/O), which
divided by the append's latency bounds the overhead more steadily.
"""

from __future__ import annotations

import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from typing import Any

from bench.common import ACTOR, GATEWAY, PAYLOAD


def _variants(append: Callable[..., Any]) -> list[tuple[str, Callable[..., Any], Callable[[], None]]]:
    """(name, the append to call, what switches the telemetry providers to it): switching costs two assignments."""
    from hostedrooms import telemetry
    from hostedrooms.telemetry import providers

    real_api = providers._load_api()

    def off() -> None:
        providers._override, providers._api = None, False

    def api_only() -> None:
        providers._override, providers._api = None, real_api

    variants = [("off", append.__wrapped__, off), ("api, no SDK", append, api_only)]
    try:
        from opentelemetry.sdk.metrics import MeterProvider
        from opentelemetry.sdk.trace import TracerProvider
    except ImportError:
        return variants
    telemetry.configure(tracer_provider=TracerProvider(), meter_provider=MeterProvider())
    signals, _ = providers._override, telemetry.configure()

    def sdk() -> None:
        providers._override, providers._api = signals, real_api

    return [*variants, ("SDK (informational)", append, sdk)]


def _wrapper_cost(calls: int = 200_000) -> tuple[float, float]:
    """Microseconds per call a span wrapper adds to a function that does nothing: (API without a provider,
    the plain function as the base); the best of 5 runs each."""
    from hostedrooms import telemetry

    def nothing(engine: Any, *, room_id: str) -> None:
        return None

    wrapped = telemetry.traced("nothing")(nothing)

    def best(function: Callable[..., Any]) -> float:
        runs = []
        for _ in range(5):
            started = time.perf_counter()
            for _ in range(calls):
                function(None, room_id="r")
            runs.append((time.perf_counter() - started) / calls)
        return min(runs) * 1e6

    return best(wrapped) - best(nothing), best(nothing)


def run_overhead(*, synchronous: str, rounds: int, per_round: int) -> int:
    from hostedrooms import create_engine, migrate, rooms, telemetry
    from hostedrooms.telemetry import providers

    if providers._load_api() is False:
        print("the OpenTelemetry API is not installed: pip install 'hostedrooms[otel]'", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory(prefix="hostedrooms-otel-") as folder:
        target = os.path.join(folder, "state.db")
        migrate.upgrade(target)
        engine = create_engine(target, synchronous=synchronous)
        rooms.create_room(engine, room_id="r", name="r", members=[], authority_gateway_id=GATEWAY)
        variants = _variants(rooms.append_event)
        wall: dict[str, list[float]] = {name: [] for name, _, _ in variants}
        cpu: dict[str, list[float]] = {name: [] for name, _, _ in variants}
        counter = [0]

        def one(append: Callable[..., Any]) -> tuple[float, float]:
            counter[0] += 1
            started, started_cpu = time.perf_counter(), time.thread_time()
            append(engine, room_id="r", event_id=f"e{counter[0]}", kind="message.user", actor=ACTOR,
                   payload=PAYLOAD, authority_gateway_id=GATEWAY, authority_epoch=1)
            return time.perf_counter() - started, time.thread_time() - started_cpu

        for _ in range(20):  # warm-up: caches, the file's first pages
            for _, append, enter in variants:
                enter()
                one(append)
        for index in range(rounds):
            # Appends alternate between the variants one by one (the order rotating), so that the disk's and the
            # machine's noise falls on all of them alike; each round's figure is a median.
            samples: dict[str, tuple[list[float], list[float]]] = {name: ([], []) for name, _, _ in variants}
            for step in range(per_round * len(variants)):
                name, append, enter = variants[(step + index) % len(variants)]
                enter()
                seconds, cpu_seconds = one(append)
                samples[name][0].append(seconds)
                samples[name][1].append(cpu_seconds)
            for name, (seconds_list, cpu_list) in samples.items():
                wall[name].append(statistics.median(seconds_list))
                cpu[name].append(statistics.median(cpu_list))
        telemetry.configure()
        providers._api = None
        engine.dispose()
    print(f"# telemetry overhead, {time.strftime('%Y-%m-%d')}, sqlite, synchronous={synchronous}, batch size 1, "
          f"{rounds} rounds x {per_round} appends per variant (alternating one by one), {os.cpu_count()} cores")
    _report("wall clock", wall)
    _report("CPU (this thread)", cpu)
    added, _ = _wrapper_cost()
    append_us = statistics.median(wall["off"]) * 1e6
    print(f"span wrapper, API without a provider: +{added:.2f} us per call (no I/O) = "
          f"{added / append_us:.4%} of the median durable append ({append_us:.0f} us)")
    return 0


def _report(what: str, seconds: dict[str, list[float]]) -> None:
    base = seconds["off"]
    print(f"{what + ': variant':<32} {'median us/append':>17} {'ratio to off: median':>21} {'min':>7} {'max':>7}")
    for name, values in seconds.items():
        ratios = [value / off for value, off in zip(values, base, strict=True)]
        print(f"{name:<32} {statistics.median(values) * 1e6:>17.1f} {statistics.median(ratios):>21.4f} "
              f"{min(ratios):>7.4f} {max(ratios):>7.4f}")

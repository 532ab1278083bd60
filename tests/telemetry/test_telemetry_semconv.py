"""hostedrooms' metrics and spans in the OpenTelemetry database conventions' shape (issue 37, item 3).

- every duration histogram is in seconds with the conventions' bucket boundaries as advice, so the SDK's
  millisecond defaults no longer put every call in the first bucket (read back with the SDK's metric reader);
- ``server.address`` / ``server.port`` on PostgreSQL (from the engine's URL; never its credentials), and the
  database's ``db.response.status_code`` (SQLSTATE, or SQLite's result code) on a failure it answered;
- hostedrooms' call metric is its own (``hostedrooms.operation.duration``): no metric of hostedrooms' scope shares
  a name with SQL-level instrumentation's, so their totals never add up a call twice;
- the asyncio ``follow()`` and ``open_follow()`` have their ``follow`` span, as the synchronous ``follow()``.

Spans and metrics are captured with the SDK's in-memory exporter and reader through ``telemetry.configure`` (the
global providers stay unset).
"""

from __future__ import annotations

import asyncio
import sqlite3
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
import sqlalchemy as sa
from sqlalchemy import Engine, make_url

import hostedrooms
from hostedrooms import RoomNotFoundError, SchemaMissingError, StoreIntegrityError, aio, rooms, telemetry
from hostedrooms.backends import backend_for_url
from hostedrooms.telemetry.attributes import response_status, server_attributes
from hostedrooms.telemetry.instruments import DURATION_BUCKETS, Instruments

sdk_trace = pytest.importorskip("opentelemetry.sdk.trace")
from opentelemetry.sdk.metrics import MeterProvider  # noqa: E402
from opentelemetry.sdk.metrics.export import InMemoryMetricReader  # noqa: E402
from opentelemetry.sdk.trace.export import SimpleSpanProcessor  # noqa: E402
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter  # noqa: E402

GW = "install:gw-a"
#: The boundaries OpenTelemetry's database conventions give for db.client.operation.duration, in seconds.
CONVENTIONS_BUCKETS = (0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1, 5, 10)


@dataclass
class Captured:
    spans: InMemorySpanExporter
    reader: InMemoryMetricReader
    meter_provider: MeterProvider

    def finished(self, name: str | None = None) -> list[Any]:
        return [span for span in self.spans.get_finished_spans() if name is None or span.name == name]

    def metrics(self, scope: str = telemetry.SCOPE) -> dict[str, list[Any]]:
        """Each metric's data points of the instrumentation scope ``scope``, by name."""
        data = self.reader.get_metrics_data()
        found: dict[str, list[Any]] = {}
        for resource in data.resource_metrics if data else ():
            for scope_metrics in resource.scope_metrics:
                if scope_metrics.scope.name == scope:
                    for metric in scope_metrics.metrics:
                        found.setdefault(metric.name, []).extend(metric.data.data_points)
        return found


@pytest.fixture
def captured() -> Iterator[Captured]:
    exporter, reader = InMemorySpanExporter(), InMemoryMetricReader()
    tracer_provider = sdk_trace.TracerProvider()
    tracer_provider.add_span_processor(SimpleSpanProcessor(exporter))
    meter_provider = MeterProvider(metric_readers=[reader])
    telemetry.configure(tracer_provider=tracer_provider, meter_provider=meter_provider)
    try:
        yield Captured(exporter, reader, meter_provider)
    finally:
        telemetry.configure()
        tracer_provider.shutdown()
        meter_provider.shutdown()


def _user(n: int) -> dict[str, Any]:
    return {"event_id": f"e{n}", "kind": "message.user", "actor": {"kind": "user", "id": "u1"},
            "payload": {"text": "hello", "n": n}}


# --- buckets ------------------------------------------------------------------------------------------------------


class _Meter:
    """Records what each instrument was created with (the advice is an argument of the API's create_histogram)."""

    def __init__(self) -> None:
        self.histograms: dict[str, dict[str, Any]] = {}

    def create_histogram(self, name: str, **kwargs: Any) -> None:
        self.histograms[name] = kwargs

    def create_counter(self, name: str, **kwargs: Any) -> None:
        pass

    def create_observable_gauge(self, name: str, **kwargs: Any) -> None:
        pass


def test_every_duration_histogram_advises_the_conventions_buckets_in_seconds() -> None:
    assert DURATION_BUCKETS == CONVENTIONS_BUCKETS
    meter = _Meter()
    Instruments(meter)
    assert set(meter.histograms) == {"hostedrooms.operation.duration", "hostedrooms.append.duration",
                                     "hostedrooms.follow.wakeup.latency", "hostedrooms.standby.pass.duration"}
    for name, created in meter.histograms.items():
        assert created["unit"] == "s", name
        assert tuple(created["explicit_bucket_boundaries_advisory"]) == CONVENTIONS_BUCKETS, name


def test_the_buckets_read_back_spread_over_more_than_one(engine: Engine, captured: Captured) -> None:
    rooms.create_room(engine, room_id="r1", name="Team", members=[], authority_gateway_id=GW)
    rooms.append_event(engine, room_id="r1", authority_gateway_id=GW, authority_epoch=1, **_user(1))
    for _ in range(5):
        rooms.room_state(engine, room_id="r1")

    def slow(*_args: Any) -> None:
        time.sleep(0.12)  # past the 0.1 s boundary, whatever the machine

    sa.event.listen(engine, "before_cursor_execute", slow)
    try:
        rooms.list_rooms(engine)
    finally:
        sa.event.remove(engine, "before_cursor_execute", slow)
    metrics = captured.metrics()
    points = metrics["hostedrooms.operation.duration"]
    assert {tuple(point.explicit_bounds) for point in points} == {CONVENTIONS_BUCKETS}
    assert {tuple(point.explicit_bounds) for point in metrics["hostedrooms.append.duration"]} == {
        CONVENTIONS_BUCKETS}
    counts = [sum(column) for column in zip(*(point.bucket_counts for point in points), strict=True)]
    assert len(counts) == len(CONVENTIONS_BUCKETS) + 1 and sum(counts) == 8
    assert sum(1 for count in counts if count) >= 2, counts  # the SDK's defaults put all eight in the first
    [listed] = [point for point in points if point.attributes["hostedrooms.operation"] == "list_rooms"]
    above = CONVENTIONS_BUCKETS.index(0.1) + 1  # the bucket (0.1, 0.5] and those after it
    assert sum(listed.bucket_counts[above:]) == 1 and listed.min >= 0.12
    [read] = [point for point in points if point.attributes["hostedrooms.operation"] == "room_state"]
    assert sum(read.bucket_counts[:above]) >= 1 and read.min < 0.1  # a generous bound: one of five reads is fast


# --- server.address, server.port, db.response.status_code --------------------------------------------------------


def test_postgresql_calls_name_their_server(engine: Engine, captured: Captured) -> None:
    rooms.create_room(engine, room_id="r1", name="Team", members=[], authority_gateway_id=GW)
    with pytest.raises(RoomNotFoundError):
        rooms.room_state(engine, room_id="nowhere")
    create, missing = captured.finished()
    [created, failed] = [captured.metrics()["hostedrooms.operation.duration"][i] for i in (0, 1)]
    if engine.dialect.name == "postgresql":
        server = {"server.address": engine.url.host, "server.port": engine.url.port}
        assert server["server.address"] and server["server.port"]
    else:  # an embedded database: no server
        server = {}
    for span in (create, missing):
        assert {key: span.attributes[key] for key in span.attributes if key.startswith("server.")} == server
    for point in (created, failed):
        assert {key: point.attributes[key] for key in point.attributes if key.startswith("server.")} == server
    # A refusal no database answered carries no status code.
    assert missing.attributes["error.type"] == "RoomNotFoundError"
    assert "db.response.status_code" not in missing.attributes and "db.response.status_code" not in failed.attributes


@pytest.mark.parametrize(("url", "expected"), [
    ("postgresql://alice:secret@db.example:6432/rooms", {"server.address": "db.example", "server.port": 6432}),
    ("postgresql://alice:secret@db.example/rooms", {"server.address": "db.example"}),
    ("postgresql://alice:secret@[::1]:5433/rooms", {"server.address": "::1", "server.port": 5433}),
    ("postgresql://alice:secret@/rooms?host=h1:5001,h2:5002&target_session_attrs=read-write",
     {"server.address": "h1", "server.port": 5001}),
    ("postgresql://alice:secret@/rooms?host=h1:5001&host=h2:5002", {"server.address": "h1", "server.port": 5001}),
    ("postgresql://alice:secret@/rooms?host=h1,h2&port=5001,5002", {"server.address": "h1", "server.port": 5001}),
    ("postgresql://alice:secret@/rooms?host=[2001:db8::1]:5001,h2", {"server.address": "2001:db8::1",
                                                                     "server.port": 5001}),
    ("postgresql://alice:secret@/rooms?host=/run/postgresql", {"server.address": "/run/postgresql"}),
    ("postgresql://alice:secret@/rooms?host=/run/postgresql&port=5433",
     {"server.address": "/run/postgresql", "server.port": 5433}),
    ("postgresql://alice:secret@/rooms", {}),  # libpq's default socket, or PGHOST: not guessed
    ("postgresql:///rooms?password=secret", {}),
])
def test_the_server_is_read_from_the_url_and_nothing_else(url: str, expected: dict[str, Any]) -> None:
    normalised = backend_for_url(make_url(url)).normalise_url(make_url(url))  # as an Engine holds it
    for form in (make_url(url), normalised):
        found = server_attributes(form)
        assert found == expected, form
        assert "secret" not in repr(found) and "alice" not in repr(found)


def test_a_failure_the_database_answered_carries_its_code(empty_target: str, captured: Captured) -> None:
    engine = hostedrooms.create_engine(empty_target)  # no schema: the store answers "no such table"
    try:
        with pytest.raises(SchemaMissingError):
            rooms.list_rooms(engine)
    finally:
        engine.dispose()
    expected = "42P01" if engine.dialect.name == "postgresql" else str(sqlite3.SQLITE_ERROR)  # undefined_table
    [span] = captured.finished("list_rooms")
    assert span.attributes["error.type"] == "SchemaMissingError"
    assert span.attributes["db.response.status_code"] == expected
    [point] = captured.metrics()["hostedrooms.operation.duration"]
    assert point.attributes["db.response.status_code"] == expected
    assert point.attributes["error.type"] == "SchemaMissingError"


def test_the_status_code_is_the_drivers_extended_code_behind_the_error() -> None:
    scratch = sa.create_engine("sqlite://")
    with scratch.begin() as connection:
        connection.exec_driver_sql("CREATE TABLE t (k INTEGER PRIMARY KEY)")
        connection.exec_driver_sql("INSERT INTO t VALUES (1)")
    try:
        with scratch.begin() as connection:
            connection.exec_driver_sql("INSERT INTO t VALUES (1)")
    except sa.exc.IntegrityError as exc:
        driver_error = exc
    try:
        raise StoreIntegrityError("refused") from driver_error  # as hostedrooms translates a driver error
    except StoreIntegrityError as translated:
        assert response_status(translated) == str(sqlite3.SQLITE_CONSTRAINT_PRIMARYKEY) == "1555"
    finally:
        scratch.dispose()

    class Psycopg2Error(Exception):
        pgcode = "40001"

    assert response_status(RuntimeError("wrapped")) is None
    chained = RuntimeError("outer")
    chained.__cause__ = Psycopg2Error()
    assert response_status(chained) == "40001"


# --- hostedrooms' own metric names ------------------------------------------------------------------------------


def test_no_hostedrooms_metric_shares_a_name_with_sql_level_instrumentation(
    engine: Engine, captured: Captured
) -> None:
    instrumentation = pytest.importorskip("opentelemetry.instrumentation.sqlalchemy")
    from opentelemetry.instrumentation.dependencies import get_dependency_conflicts

    instrumentor = instrumentation.SQLAlchemyInstrumentor()
    listed = get_dependency_conflicts(instrumentor.instrumentation_dependencies()) is None
    instrumentor.instrument(engine=engine, meter_provider=captured.meter_provider, skip_dep_check=not listed)
    try:
        rooms.create_room(engine, room_id="r1", name="Team", members=[], authority_gateway_id=GW)
        rooms.append_event(engine, room_id="r1", authority_gateway_id=GW, authority_epoch=1, **_user(1))
    finally:
        instrumentor.uninstrument()
    ours = captured.metrics()
    sql_level = captured.metrics(instrumentation.__name__)
    assert sql_level, "the instrumentation recorded nothing on the shared meter provider"
    assert "db.client.operation.duration" not in ours
    assert not [name for name in ours if name.startswith("db.")]
    assert not set(ours) & set(sql_level)
    operations = {point.attributes["hostedrooms.operation"] for point in ours["hostedrooms.operation.duration"]}
    assert operations == {"create_room", "append_event"}
    assert not [point for point in ours["hostedrooms.operation.duration"] if "db.operation.name" in point.attributes]


# --- the asyncio follow's span ----------------------------------------------------------------------------------


def _children(captured: Captured, parent: Any) -> list[str]:
    return [span.name for span in captured.finished() if span.parent is not None
            and span.parent.span_id == parent.context.span_id]


def test_the_asyncio_follow_and_open_follow_have_their_span(target: str, captured: Captured) -> None:
    engine = hostedrooms.create_engine(target)
    rooms.create_room(engine, room_id="r1", name="Team", members=[], authority_gateway_id=GW)
    rooms.append_event(engine, room_id="r1", authority_gateway_id=GW, authority_epoch=1, **_user(1))
    rooms.disband_room(engine, room_id="r1", expected_gateway_id=GW, expected_epoch=1)  # the log ends: no wait

    async def both() -> tuple[list[str], list[str]]:
        async_engine = aio.create_async_engine(target)
        try:
            followed = [event["kind"] async for event in aio.follow(async_engine, "r1")]
            opened = [event["kind"] async for event in await aio.open_follow(async_engine, "r1", 1)]
            with pytest.raises(RoomNotFoundError):
                await anext(aio.follow(async_engine, "nowhere"))
            with pytest.raises(RoomNotFoundError):
                await aio.open_follow(async_engine, "nowhere")
            return followed, opened
        finally:
            await async_engine.dispose()

    try:
        followed, opened = asyncio.run(both())
    finally:
        engine.dispose()
    assert followed == ["message.user", "room.disbanded"] and opened == ["room.disbanded"]
    follows = captured.finished("follow")
    assert len(follows) == 4
    first, second, unknown, unopened = follows
    for span in follows:
        assert span.kind.name == "CLIENT" and span.attributes["db.system.name"] == engine.dialect.name
        assert span.attributes["db.operation.name"] == "follow"
    assert first.attributes["hostedrooms.room.id"] == "r1" and first.attributes["hostedrooms.outcome"] == "ok"
    assert second.attributes["hostedrooms.seq.since"] == 1
    assert _children(captured, first) == ["read_events"]  # follow(): its opening, up to the first page read
    assert _children(captured, second) == ["room_state"]  # open_follow(): its checks
    for span in (unknown, unopened):
        assert span.attributes["error.type"] == "RoomNotFoundError" and span.status.status_code.name == "ERROR"
    points = captured.metrics()["hostedrooms.operation.duration"]
    assert sum(point.count for point in points if point.attributes["hostedrooms.operation"] == "follow") == 4


def test_an_asyncio_call_is_a_child_of_the_callers_span(target: str, captured: Captured) -> None:
    # The services run in worker threads (or SQLAlchemy's greenlet bridge) with the caller's context variables,
    # as asyncio.to_thread would: an application's current span is the parent of hostedrooms' span.
    application = sdk_trace.TracerProvider()
    application.add_span_processor(SimpleSpanProcessor(captured.spans))

    async def request() -> None:
        async_engine = aio.create_async_engine(target)
        try:
            with application.get_tracer("application").start_as_current_span("request"):
                await aio.rooms.create_room(async_engine, room_id="r1", name="Team", members=[],
                                            authority_gateway_id=GW)
                await aio.rooms.room_state(async_engine, room_id="r1")
        finally:
            await async_engine.dispose()

    try:
        asyncio.run(request())
    finally:
        application.shutdown()
    [parent] = captured.finished("request")
    assert _children(captured, parent) == ["create_room", "room_state"]

"""OpenTelemetry (issue 29, item 1): a span per public service call with the database attributes, the metrics, and
what never reaches them (no message body, payload, actor, grant, lease token, digest, error text or password).

Spans and metrics are captured with the SDK's in-memory exporter and metric reader, given to hostedrooms with
``telemetry.configure`` (the global providers stay unset, so the rest of the run is not traced). Without the API
installed nothing of OpenTelemetry is imported (a subprocess with the package blocked).
"""

from __future__ import annotations

import asyncio
import gc
import inspect
import json
import subprocess
import sys
import textwrap
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from factories import link, outbound, outbound_snapshot, prepare
from sqlalchemy import Engine
from waits import join

from hostedrooms import EventConflictError, models, peers, replicas, rooms, telemetry
from hostedrooms.ledger import DeliveryLedger, observe_ledger
from hostedrooms.standby import EnginePageSource, Replicator

pytest_plugins = ["standby_fixtures"]

sdk_trace = pytest.importorskip("opentelemetry.sdk.trace")
from opentelemetry.sdk.metrics import MeterProvider  # noqa: E402
from opentelemetry.sdk.metrics.export import InMemoryMetricReader  # noqa: E402
from opentelemetry.sdk.trace.export import SimpleSpanProcessor  # noqa: E402
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter  # noqa: E402

GW_A, GW_B = "install:gw-a", "install:gw-b"
PASSWORD = "pw-3e9b-secret"
MESSAGE = "chat-message-71c0-secret"
ACTOR = "actor-0d4e-secret"
ROOM_NAME = "room-name-5a2f-secret"
LEASE = "lease-token-19aa-secret"
ENVELOPE_BODY = "envelope-body-c81e-secret"
GRANT = "grant-77f0-secret-value"
OUTBOUND_BODY = "outbound-body-4d3c-secret"
SNAPSHOT = "snapshot-value-e02b-secret"
RESPONSE = "hub-response-9b41-secret"
REPLY = "reply-body-6f15-secret"
ERROR_TEXT = "error-text-2c8d-secret"
RESULT_TEXT = "result-text-a7e3-secret"
SECRETS = (PASSWORD, MESSAGE, ACTOR, ROOM_NAME, LEASE, ENVELOPE_BODY, GRANT, OUTBOUND_BODY, SNAPSHOT, RESPONSE,
           REPLY, ERROR_TEXT, RESULT_TEXT)


@dataclass
class Captured:
    spans: InMemorySpanExporter
    reader: InMemoryMetricReader

    def finished(self) -> list[Any]:
        return list(self.spans.get_finished_spans())

    def metrics(self) -> dict[str, list[Any]]:
        """Each metric's data points, by name."""
        data = self.reader.get_metrics_data()
        found: dict[str, list[Any]] = {}
        for resource in data.resource_metrics if data else ():
            for scope in resource.scope_metrics:
                for metric in scope.metrics:
                    found.setdefault(metric.name, []).extend(metric.data.data_points)
        return found

    def everything(self) -> str:
        """Every exported span (name, attributes, events, links, status, resource) and metric, as text."""
        data = self.reader.get_metrics_data()
        return "\n".join([span.to_json() for span in self.finished()] + [data.to_json() if data else ""])


@pytest.fixture
def captured() -> Iterator[Captured]:
    exporter, reader = InMemorySpanExporter(), InMemoryMetricReader()
    tracer_provider = sdk_trace.TracerProvider()
    tracer_provider.add_span_processor(SimpleSpanProcessor(exporter))
    meter_provider = MeterProvider(metric_readers=[reader])
    telemetry.configure(tracer_provider=tracer_provider, meter_provider=meter_provider)
    try:
        yield Captured(exporter, reader)
    finally:
        telemetry.configure()
        tracer_provider.shutdown()
        meter_provider.shutdown()


def _user(n: int, text: str = MESSAGE) -> dict[str, Any]:
    return {"event_id": f"e{n}", "kind": "message.user", "actor": {"kind": "user", "id": ACTOR},
            "payload": {"text": text, "n": n}}


def _rooms_workload(engine: Engine) -> None:
    rooms.create_room(engine, room_id="r1", name=ROOM_NAME, members=[{"id": "m1"}], authority_gateway_id=GW_A)
    rooms.append_event(engine, room_id="r1", authority_gateway_id=GW_A, authority_epoch=1, **_user(1))
    rooms.append_events(engine, "r1", [_user(2), _user(3), _user(1)], GW_A, 1)
    with pytest.raises(EventConflictError):
        rooms.append_event(engine, room_id="r1", authority_gateway_id=GW_A, authority_epoch=1,
                           **_user(1, "another " + MESSAGE))
    assert rooms.read_events(engine, room_id="r1", since_seq=0)["events"][0]["payload"]["text"] == MESSAGE
    assert rooms.list_rooms(engine)[0]["name"] == ROOM_NAME
    rooms.room_state(engine, room_id="r1")
    rooms.rename_room(engine, room_id="r1", event_id="rename-1", name="Another " + ROOM_NAME)
    rooms.claim_authority(engine, room_id="r1", expected_gateway_id=GW_A, expected_epoch=1, new_gateway_id=GW_B,
                          event_id="claim-1")
    rooms.request_room_stop(engine, room_id="r1", cancel_id="stop-1", expected_gateway_id=GW_B, expected_epoch=2)
    rooms.create_room(engine, room_id="r2", name=ROOM_NAME, members=[], authority_gateway_id=GW_A)
    rooms.disband_room(engine, room_id="r2", expected_gateway_id=GW_A, expected_epoch=1)
    assert [event["kind"] for event in rooms.follow(engine, "r2")][-1] == "room.disbanded"
    rooms.prune_disbanded_rooms(engine)


def _peers_workload(engine: Engine) -> None:
    claims = {"room_id": "r1", "home_install_id": "home-1", "authority_gateway_id": GW_A, "authority_epoch": 1,
              "member_id": "m1", "target_install_id": "target-1", "target_profile": "alpha", "issued_at": 1.0,
              "grant": GRANT}
    peers.upsert_room_link_record(engine, record=link(room_id="r1", grant=GRANT), max_links=5)  # type: ignore[arg-type]
    assert peers.list_room_link_records(engine)[0]["grant"] == GRANT
    peers.update_room_link_status(engine, room_id="r1", member_id="m1", status="stale", now=5.0)
    peers.reserve_peer_room(engine, claims=claims, expires_at=100.0, now=2.0)
    peers.peer_room_is_reserved(engine, room_id="r1", target_profile="alpha", now=3.0)
    peers.peer_room_grant_is_current(engine, claims=claims, now=3.0)
    peers.revoke_room_grant_scope(engine, claims=claims, expires_at=100.0, now=4.0)
    peers.room_grant_is_revoked(engine, claims=claims, now=4.0)
    receipt = {"room_id": "r1", "home_install_id": "home-1", "authority_gateway_id": GW_A, "authority_epoch": 1,
               "member_id": "m1", "target_install_id": "target-1", "target_profile": "alpha", "task_id": "task-1",
               "execution_generation": 1, "run_id": "run-1", "session_id": "session-1"}
    peers.upsert_remote_run_receipt(engine, record=receipt, now=10)  # type: ignore[arg-type]
    peers.list_remote_run_receipts(engine, room_id="r1")
    peers.remote_run_receipt(engine, record=receipt)  # type: ignore[arg-type]
    peers.delete_room_link_records(engine, room_id="r1")
    assert peers.probe_hosted_room(engine, room_id="r1") is True
    with pytest.raises(Exception):  # noqa: B017 - whichever refusal: only what reaches the spans matters here
        peers.probe_peer_room_reservation(f"postgresql://alice:{PASSWORD}@127.0.0.1:1/rooms", room_id="r1",
                                          target_profile="alpha")


def _ledger_workload(engine: Engine) -> DeliveryLedger:
    ledger = DeliveryLedger(engine)
    prepare(ledger, 1, lease_token=LEASE, message=ENVELOPE_BODY)
    ledger.get("env-1")
    ledger.authorize("env-1")
    ledger.defer_admission("env-1", error=ERROR_TEXT)
    ledger.pending_admissions(now=2**41)
    ledger.bind_owner("env-1", queued_id="q-1", run_id="run-1")
    ledger.for_run("run-1")
    ledger.nonterminal_for_chat("chat-1")
    ledger.nonterminal_for_connection("conn-1")
    ledger.prepare_response("env-1", request_id="resp-1", body=REPLY, request_response=False)
    ledger.defer_response("env-1", request_id="resp-1", error=ERROR_TEXT)
    ledger.pending_responses(now=2**41)
    ledger.mark_response_committed("env-1", request_id="resp-1")
    ledger.finish("env-1", succeeded=True, result_text=RESULT_TEXT)
    ledger.recoverable()
    ledger.prepare_outbound(**outbound(snapshot=outbound_snapshot(note=SNAPSHOT), body=OUTBOUND_BODY))
    ledger.pending_outbound_for_chat("chat-1", now=2**39)
    ledger.pending_outbound_for_connection("conn-1", now=2**39)
    ledger.defer_outbound("out-1", ERROR_TEXT)
    ledger.pending_outbound(now=2**41)
    ledger.recoverable_outbound()
    ledger.commit_outbound("out-1", {"text": RESPONSE})
    assert ledger.outbound("out-1")["response"] == {"text": RESPONSE}  # type: ignore[index]
    ledger.prepare_outbound(**outbound(request_id="out-2", body=OUTBOUND_BODY))
    ledger.fail_outbound("out-2", ERROR_TEXT)
    prepare(ledger, 2, lease_token=LEASE, message=ENVELOPE_BODY)
    ledger.fail_ownerless_authorized("env-2", error=ERROR_TEXT)
    ledger.prune(retain_seconds=10**9)
    return ledger


def _standby_workload(engine: Engine, standby: Engine) -> None:
    rooms.create_room(engine, room_id="r3", name=ROOM_NAME, members=[], authority_gateway_id=GW_A)
    rooms.append_events(engine, "r3", [_user(n) for n in range(1, 5)], GW_A, 1)
    report = Replicator(EnginePageSource(engine), standby, local_gateway_id=GW_B).sync_once()
    assert report.ok and report.lag == 0
    replicas.replica_state(standby, room_id="r3")
    replicas.reset_replica_latest(standby, room_id="r3", latest_seq=4)
    replicas.prune_disbanded_replicas(standby, retain_seconds=0)
    replicas.promote_replica(standby, room_id="r3", local_gateway_id=GW_B)
    replicas.demote_room(standby, room_id="r3", observed_gateway_id=GW_A, observed_epoch=9, local_gateway_id=GW_B)


#: Every public service call, as its span (db.operation.name).
SERVICE_SPANS = {
    "create_room", "append_event", "append_events", "read_events", "list_rooms", "room_state", "rename_room",
    "claim_authority", "request_room_stop", "disband_room", "follow", "prune_disbanded_rooms",
    "upsert_room_link_record", "list_room_link_records", "update_room_link_status", "reserve_peer_room",
    "peer_room_is_reserved", "peer_room_grant_is_current", "revoke_room_grant_scope", "room_grant_is_revoked",
    "upsert_remote_run_receipt", "list_remote_run_receipts", "remote_run_receipt", "delete_room_link_records",
    "probe_hosted_room", "probe_peer_room_reservation",
    "ingest_page", "replica_state", "reset_replica_latest", "prune_disbanded_replicas", "promote_replica",
    "demote_room", "standby.pass",
    *(f"ledger.{name}" for name in (
        "prepare", "get", "authorize", "defer_admission", "pending_admissions", "bind_owner", "for_run",
        "nonterminal_for_chat", "nonterminal_for_connection", "prepare_response", "defer_response",
        "pending_responses", "mark_response_committed", "finish", "recoverable", "prepare_outbound",
        "pending_outbound_for_chat", "pending_outbound_for_connection", "defer_outbound", "pending_outbound",
        "recoverable_outbound", "commit_outbound", "outbound", "fail_outbound", "fail_ownerless_authorized",
        "prune")),
}


def _digests(engine: Engine) -> list[str]:
    """The digests the ledger stored (secrets derived from claims and intents)."""
    with engine.connect() as connection:
        deliveries = connection.execute(sa.select(models.deliveries.c.claim_digest)).scalars().all()
        intents = connection.execute(sa.select(models.outbound_intents.c.intent_digest)).scalars().all()
    return [value for value in (*deliveries, *intents) if value]


def test_every_service_call_is_a_span_and_no_secret_is_exported(
    engine: Engine, standby: Engine, captured: Captured
) -> None:
    _rooms_workload(engine)
    _peers_workload(engine)
    ledger = _ledger_workload(engine)
    observe_ledger(ledger)
    _standby_workload(engine, standby)
    spans = captured.finished()
    names = {span.name for span in spans}
    assert SERVICE_SPANS <= names, f"no span for: {sorted(SERVICE_SPANS - names)}"
    for span in spans:
        assert span.attributes["db.operation.name"] == span.name
        if span.name.startswith("probe_"):
            continue
        assert span.attributes["db.system.name"] == engine.dialect.name
        assert span.attributes["db.namespace"]
    text = captured.everything()
    secrets = [*SECRETS, *_digests(engine)]
    if engine.url.password:  # the test server's URL with its credentials (the password alone is a common word)
        secrets.append(f":{engine.url.password}@")
    leaked = [secret for secret in secrets if secret in text]
    assert not leaked, f"exported: {leaked}"
    assert captured.metrics()["hostedrooms.ledger.backlog"]  # the gauge read the ledger (and leaked nothing)


def test_span_attributes_follow_the_call(engine: Engine, captured: Captured) -> None:
    rooms.create_room(engine, room_id="r1", name="Team", members=[], authority_gateway_id=GW_A)
    rooms.append_events(engine, "r1", [_user(1), _user(2), _user(3)], GW_A, 1)
    rooms.append_event(engine, room_id="r1", authority_gateway_id=GW_A, authority_epoch=1, **_user(2))
    with pytest.raises(EventConflictError):
        rooms.append_event(engine, room_id="r1", authority_gateway_id=GW_A, authority_epoch=1, **_user(2, "x"))
    batch, replay, conflict = [span for span in captured.finished() if span.name.startswith("append_")]
    server = {key for key in batch.attributes if key.startswith("server.")}  # PostgreSQL's (test_telemetry_semconv)
    assert {k: v for k, v in batch.attributes.items() if k not in server} | {"db.namespace": "-"} == {
        "db.system.name": engine.dialect.name, "db.namespace": "-", "db.operation.name": "append_events",
        "hostedrooms.room.id": "r1", "hostedrooms.gateway.id": GW_A, "hostedrooms.epoch": 1,
        "hostedrooms.events": 3, "hostedrooms.seq.first": 1, "hostedrooms.seq.last": 3, "hostedrooms.outcome": "ok"}
    assert replay.attributes["hostedrooms.outcome"] == "replay" and replay.attributes["hostedrooms.seq.last"] == 2
    assert conflict.attributes["error.type"] == "EventConflictError"
    assert conflict.status.status_code.name == "ERROR" and conflict.status.description == "EventConflictError"
    assert conflict.events == ()  # no exception event: its message could quote input
    assert batch.kind.name == "CLIENT"


def test_services_keep_their_signatures_and_results(engine: Engine, captured: Captured) -> None:
    for function in (rooms.append_event, rooms.append_events, rooms.follow, replicas.ingest_page,
                     peers.reserve_peer_room, DeliveryLedger.prepare, Replicator.sync_once):
        wrapped = function.__wrapped__  # type: ignore[attr-defined]
        assert inspect.signature(function) == inspect.signature(wrapped)
        assert function.__doc__ == wrapped.__doc__ and function.__name__ == wrapped.__name__
    rooms.create_room(engine, room_id="r1", name="Team", members=[], authority_gateway_id=GW_A)
    traced = rooms.append_events(engine, "r1", [_user(1), _user(2)], GW_A, 1, now=5.0)
    telemetry.configure()
    plain = rooms.append_events(engine, "r1", [_user(1), _user(2)], GW_A, 1, now=5.0)
    assert plain == [{**event, "idempotent": True} for event in traced]


def _points(metrics: dict[str, list[Any]], name: str, **attributes: Any) -> list[Any]:
    return [point for point in metrics.get(name, [])
            if all(point.attributes.get(key) == value for key, value in attributes.items())]


def test_append_metrics_conflicts_and_retries(engine: Engine, captured: Captured) -> None:
    rooms.create_room(engine, room_id="r1", name="Team", members=[], authority_gateway_id=GW_A)
    batch = [_user(1), _user(2)]
    rooms.append_events(engine, "r1", batch, GW_A, 1)
    rooms.append_events(engine, "r1", [*batch, _user(3)], GW_A, 1)  # two replays, one new event
    with pytest.raises(EventConflictError):
        rooms.append_event(engine, room_id="r1", authority_gateway_id=GW_A, authority_epoch=1, **_user(1, "x"))
    ledger = DeliveryLedger(engine)
    prepare(ledger, 1)
    ledger.authorize("env-1")
    ledger.defer_admission("env-1", error="busy")
    metrics = captured.metrics()
    with engine.connect() as connection:  # the room's accounted bytes (its three events)
        stored = connection.execute(sa.select(models.rooms.c.event_bytes)).scalar_one()
    assert sum(point.value for point in metrics["hostedrooms.events.appended"]) == 3
    assert sum(point.value for point in metrics["hostedrooms.bytes.appended"]) == stored > 0
    [appends] = _points(metrics, "hostedrooms.append.duration", **{"error.type": None})
    assert appends.count == 2 and appends.sum > 0
    [failed] = _points(metrics, "hostedrooms.append.duration", **{"error.type": "EventConflictError"})
    assert failed.count == 1
    [conflicts] = metrics["hostedrooms.conflicts"]
    assert conflicts.value == 1 and conflicts.attributes["error.type"] == "EventConflictError"
    assert _points(metrics, "hostedrooms.retries", **{"hostedrooms.retry.kind": "ledger.secure_peer_deliveries"})
    # A replay is found on the full path: the first attempt (the one-statement append) is run again.
    assert _points(metrics, "hostedrooms.retries", **{"hostedrooms.retry.kind": "room_write.full_path"})
    assert _points(metrics, "hostedrooms.operation.duration", **{"hostedrooms.operation": "ledger.defer_admission"})


def test_the_ledger_backlog_gauge_reads_the_observed_ledger(engine: Engine, captured: Captured) -> None:
    ledger = DeliveryLedger(engine)
    observe_ledger(ledger)
    prepare(ledger, 1)
    prepare(ledger, 2)
    ledger.authorize("env-2")
    ledger.prepare_outbound(**outbound())
    expected = {("deliveries", "prepared"): 1, ("deliveries", "authorized"): 1, ("deliveries", "queued"): 0,
                ("deliveries", "running"): 0, ("outbound", "pending"): 1}
    assert ledger.backlog() == expected
    points = _points(captured.metrics(), "hostedrooms.ledger.backlog", **{"db.system.name": engine.dialect.name})
    seen = {(p.attributes["hostedrooms.ledger.table"], p.attributes["hostedrooms.ledger.state"]): p.value
            for p in points}
    assert seen == expected


def test_replica_lag_per_room_goes_to_zero(engine: Engine, standby: Engine, captured: Captured) -> None:
    rooms.create_room(engine, room_id="r1", name="Team", members=[], authority_gateway_id=GW_A)
    rooms.append_events(engine, "r1", [_user(n) for n in range(1, 8)], GW_A, 1)
    gc.collect()  # the replicators of earlier tests (held weakly by the gauges) are gone
    clock = [100.0]
    replicator = Replicator(EnginePageSource(engine), standby, page_limit=2, max_pages_per_room=1,
                            local_gateway_id=GW_B, monotonic=lambda: clock[0])
    assert replicator.sync_once().lag == 5
    clock[0] = 103.5
    metrics = captured.metrics()
    assert [p.value for p in _points(metrics, "hostedrooms.replica.lag.seqs", **{"hostedrooms.room.id": "r1"})
            ] == [5]
    assert [p.value for p in _points(metrics, "hostedrooms.replica.lag.seconds",
                                     **{"hostedrooms.room.id": "r1"})] == [3.5]
    while replicator.sync_once().lag:
        pass
    metrics = captured.metrics()
    assert [p.value for p in _points(metrics, "hostedrooms.replica.lag.seqs", **{"hostedrooms.room.id": "r1"})
            ] == [0]
    assert [p.value for p in _points(metrics, "hostedrooms.replica.lag.seconds",
                                     **{"hostedrooms.room.id": "r1"})] == [0.0]
    assert _points(metrics, "hostedrooms.standby.pass.duration")[0].count >= 4
    pass_span = next(span for span in captured.finished() if span.name == "standby.pass")
    assert pass_span.attributes["hostedrooms.standby.lag"] == 5
    other = Replicator(EnginePageSource(standby), engine, local_gateway_id=GW_A)  # another target, no rooms
    assert other.sync_once().rooms == []
    points = _points(captured.metrics(), "hostedrooms.replica.lag.seqs")
    assert [(p.attributes["hostedrooms.room.id"], p.attributes["db.system.name"]) for p in points] == [
        ("r1", standby.dialect.name)]  # each replicator's rooms are its own: the other's pass forgot none


def test_follow_records_its_wakeup_latency(engine: Engine, captured: Captured) -> None:
    rooms.create_room(engine, room_id="r1", name="Team", members=[], authority_gateway_id=GW_A)
    follower = rooms.follow(engine, "r1", poll_interval=0.01)
    writer = threading.Timer(0.2, lambda: rooms.append_event(
        engine, room_id="r1", authority_gateway_id=GW_A, authority_epoch=1, **_user(1)))
    writer.start()
    try:
        event = next(follower)
    finally:
        follower.close()
        join(writer, 60)
    assert event["event_id"] == "e1"
    [latency] = captured.metrics()["hostedrooms.follow.wakeup.latency"]
    assert latency.count == 1 and 0 <= latency.sum < 60  # a generous bound: it did not block


def test_the_asyncio_follow_records_its_wakeup_latency(
    tmp_path: Path, sqlite_template: Path, captured: Captured
) -> None:
    from hostedrooms import aio, create_engine

    path = tmp_path / "state.db"
    path.write_bytes(sqlite_template.read_bytes())
    engine = create_engine(str(path))
    rooms.create_room(engine, room_id="r1", name="Team", members=[], authority_gateway_id=GW_A)

    async def first_event() -> dict[str, Any]:
        async_engine = aio.create_async_engine(str(path))
        try:
            follower = aio.follow(async_engine, "r1", poll_interval=0.01)
            try:
                return dict(await anext(follower))
            finally:
                await follower.aclose()
        finally:
            await async_engine.dispose()

    writer = threading.Timer(0.2, lambda: rooms.append_event(
        engine, room_id="r1", authority_gateway_id=GW_A, authority_epoch=1, **_user(1)))
    writer.start()
    try:
        event = asyncio.run(first_event())
    finally:
        join(writer, 60)
        engine.dispose()
    assert event["event_id"] == "e1"
    [latency] = captured.metrics()["hostedrooms.follow.wakeup.latency"]
    assert latency.count == 1 and 0 <= latency.sum < 60


def test_no_provider_records_nothing(engine: Engine) -> None:
    # The API is installed here, and no provider is set: the per-call check finds nothing to record.
    assert telemetry.providers.current() is None
    rooms.create_room(engine, room_id="r1", name="Team", members=[], authority_gateway_id=GW_A)


def test_telemetry_imports_neither_the_standby_nor_the_ledger() -> None:
    # The standby's lag and the ledger's backlog feed their gauges through telemetry.observe_gauge; telemetry
    # itself knows neither package (no import, so no cycle through them).
    script = ("import json, sys, hostedrooms.telemetry; print(json.dumps(sorted(name for name in sys.modules "
              "if name.startswith(('hostedrooms.standby', 'hostedrooms.ledger')))))")
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True, timeout=120)
    assert json.loads(result.stdout) == []


def test_a_gauge_reader_feeds_only_a_gauge_of_hostedrooms() -> None:
    with pytest.raises(ValueError, match="no hostedrooms gauge is named 'hostedrooms.nothing'"):
        telemetry.observe_gauge("hostedrooms.nothing", list)


def test_nothing_of_opentelemetry_is_imported_without_the_api(tmp_path: Path, sqlite_template: Path) -> None:
    path = tmp_path / "state.db"
    path.write_bytes(sqlite_template.read_bytes())
    script = textwrap.dedent(f"""
        import importlib.abc, json, sys

        class Blocked(importlib.abc.MetaPathFinder):
            def find_spec(self, name, path=None, target=None):
                if name == "opentelemetry" or name.startswith("opentelemetry."):
                    raise ImportError(f"blocked: {{name}}")
                return None

        sys.meta_path.insert(0, Blocked())
        import hostedrooms
        from hostedrooms import rooms, telemetry
        from hostedrooms.ledger import DeliveryLedger
        engine = hostedrooms.create_engine({str(path)!r})
        rooms.create_room(engine, room_id="r1", name="Team", members=[], authority_gateway_id="install:gw")
        event = rooms.append_event(engine, room_id="r1", event_id="e1", kind="message.user",
                                   actor={{"kind": "user", "id": "u1"}}, payload={{}},
                                   authority_gateway_id="install:gw", authority_epoch=1)
        DeliveryLedger(engine).pending_outbound()
        loaded = sorted(name for name in sys.modules if name.startswith("opentelemetry"))
        print(json.dumps({{"seq": event["seq"], "loaded": loaded, "current": telemetry.providers.current()}}))
    """)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120,
                          check=False)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == {"seq": 1, "loaded": [], "current": None}


def test_global_providers_set_after_the_first_call_are_used(tmp_path: Path, sqlite_template: Path) -> None:
    path = tmp_path / "state.db"
    path.write_bytes(sqlite_template.read_bytes())
    script = textwrap.dedent(f"""
        import json
        from opentelemetry import metrics, trace
        from opentelemetry.sdk.metrics import MeterProvider
        from opentelemetry.sdk.metrics.export import InMemoryMetricReader
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import SimpleSpanProcessor
        from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
        import hostedrooms
        from hostedrooms import rooms

        engine = hostedrooms.create_engine({str(path)!r})
        rooms.list_rooms(engine)  # before any provider: nothing recorded
        exporter, reader = InMemorySpanExporter(), InMemoryMetricReader()
        tracer_provider = TracerProvider()
        tracer_provider.add_span_processor(SimpleSpanProcessor(exporter))
        trace.set_tracer_provider(tracer_provider)
        metrics.set_meter_provider(MeterProvider(metric_readers=[reader]))
        rooms.create_room(engine, room_id="r1", name="Team", members=[], authority_gateway_id="install:gw")
        names = [m.name for r in reader.get_metrics_data().resource_metrics for s in r.scope_metrics
                 for m in s.metrics]
        print(json.dumps({{"spans": [s.name for s in exporter.get_finished_spans()], "metrics": names}}))
    """)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120,
                          check=False)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == {"spans": ["create_room"], "metrics": ["hostedrooms.operation.duration"]}


def test_observe_ledger_is_where_the_docs_name_it() -> None:
    """``hostedrooms.telemetry.observe_ledger`` (docs/observability.md) and the ledger package's are one function."""
    import hostedrooms.ledger
    import hostedrooms.telemetry

    assert hostedrooms.telemetry.observe_ledger is hostedrooms.ledger.observe_ledger

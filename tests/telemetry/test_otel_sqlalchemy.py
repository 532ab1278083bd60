"""OpenTelemetry's SQLAlchemy instrumentation on hostedrooms' engines (issue 37, item 1).

``opentelemetry-instrument`` turns ``opentelemetry-instrumentation-sqlalchemy`` on wherever it is installed. Its
``before_cursor_execute`` listener keeps the statement's span in SQLAlchemy's execution context, so every statement
of an instrumented engine must run through SQLAlchemy's public execution path (:mod:`hostedrooms.statements`). Here
every public call family runs with the instrumentation on, on both backends and both APIs, in both of its forms
(``instrument(engine=...)`` and the global one, which wraps engine creation), and the statements' spans nest under
hostedrooms' own span of the call. Each test uninstruments at its end, so the rest of the run is not traced.

The instrumentation lists the SQLAlchemy releases it supports (``instrumentation_dependencies()``); on one it does
not list (2.1 for 0.66b2) ``instrument()`` declines, as documented for every ``BaseInstrumentor``: it logs the
conflict and returns None. The tests assert that, then force it with ``skip_dep_check=True``.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import Any

import pytest
import sqlalchemy as sa
from factories import link, outbound, prepare
from sqlalchemy import Engine

import hostedrooms
from hostedrooms import (
    EventConflictError,
    StoreIntegrityError,
    UnitOfWork,
    held_autocommit,
    migrate,
    peers,
    replicas,
    rooms,
    telemetry,
    writer,
)
from hostedrooms.ledger import DeliveryLedger
from hostedrooms.models import retired_ids
from hostedrooms.standby import EnginePageSource, Replicator
from hostedrooms.statements import HotStatement, observed

pytest.importorskip("opentelemetry.instrumentation.sqlalchemy")
from opentelemetry.instrumentation.dependencies import get_dependency_conflicts
from opentelemetry.instrumentation.sqlalchemy import SQLAlchemyInstrumentor
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

pytest_plugins = ["standby_fixtures"]

GW_A, GW_B = "install:gw-a", "install:gw-b"
SQL_SCOPE = "opentelemetry.instrumentation.sqlalchemy"
#: Whether the installed instrumentation lists the installed SQLAlchemy (else it declines unless forced).
LISTED = get_dependency_conflicts(SQLAlchemyInstrumentor().instrumentation_dependencies()) is None


class Traced:
    """The spans of one test: hostedrooms' (through ``telemetry.configure``) and the instrumentation's."""

    def __init__(self) -> None:
        self.exporter = InMemorySpanExporter()
        self.provider = TracerProvider()
        self.provider.add_span_processor(SimpleSpanProcessor(self.exporter))

    def instrument(self, **kwargs: Any) -> None:
        """``SQLAlchemyInstrumentor().instrument(...)``, forced where it declines this SQLAlchemy."""
        SQLAlchemyInstrumentor().instrument(tracer_provider=self.provider, skip_dep_check=not LISTED, **kwargs)
        assert SQLAlchemyInstrumentor().is_instrumented_by_opentelemetry

    def spans(self) -> list[ReadableSpan]:
        return list(self.exporter.get_finished_spans())

    def statements_under(self) -> dict[str, list[str]]:
        """Each hostedrooms span's name -> the statements (first words) of the SQL spans nested in it."""
        spans = self.spans()
        ours = {span.context.span_id: span.name for span in spans
                if span.instrumentation_scope is not None and span.instrumentation_scope.name == telemetry.SCOPE}
        nested: dict[str, list[str]] = {}
        for span in _sql_spans(spans):
            if span.parent is not None and span.parent.span_id in ours:
                nested.setdefault(ours[span.parent.span_id], []).append(span.name.split()[0].upper())
        return nested


def _sql_spans(spans: list[ReadableSpan]) -> list[ReadableSpan]:
    return [span for span in spans if span.instrumentation_scope is not None
            and span.instrumentation_scope.name == SQL_SCOPE and span.name != "connect"]


@pytest.fixture
def traced() -> Iterator[Traced]:
    found = Traced()
    telemetry.configure(tracer_provider=found.provider)
    try:
        yield found
    finally:
        SQLAlchemyInstrumentor().uninstrument()
        telemetry.configure()
        found.provider.shutdown()


def _user(n: int, text: str = "hello") -> dict[str, Any]:
    return {"event_id": f"e{n}", "kind": "message.user", "actor": {"kind": "user", "id": "u1"},
            "payload": {"text": text, "n": n}}


def _rooms_workload(api_rooms: Any, engine: Any) -> None:
    api_rooms.create_room(engine, room_id="r1", name="Team", members=[{"id": "m1"}], authority_gateway_id=GW_A)
    appended = api_rooms.append_event(engine, room_id="r1", authority_gateway_id=GW_A, authority_epoch=1,
                                      **_user(1))
    assert appended["seq"] == 1
    batch = api_rooms.append_events(engine, "r1", [_user(2), _user(3), _user(1)], GW_A, 1)
    assert [event["seq"] for event in batch] == [2, 3, 1]
    with pytest.raises(EventConflictError):  # a driver-level path too: the error still arrives as documented
        api_rooms.append_event(engine, room_id="r1", authority_gateway_id=GW_A, authority_epoch=1,
                               **_user(1, "another text"))
    assert [event["seq"] for event in api_rooms.read_events(engine, room_id="r1", since_seq=0)["events"]] == [1, 2, 3]
    assert api_rooms.room_state(engine, room_id="r1")["latest_seq"] == 3
    assert [room["room_id"] for room in api_rooms.list_rooms(engine)] == ["r1"]
    api_rooms.create_room(engine, room_id="r2", name="Gone", members=[], authority_gateway_id=GW_A)
    api_rooms.disband_room(engine, room_id="r2", expected_gateway_id=GW_A, expected_epoch=1)
    assert api_rooms.prune_disbanded_rooms(engine, now=4e9) >= 1  # past any retention


def _expect_nested(traced: Traced, calls: dict[str, str]) -> None:
    """Each call's span holds a SQL span of the statement it must run (``calls``: span name -> first word; an
    ``INSERT`` may be PostgreSQL's one-statement append, a ``WITH``)."""
    nested = traced.statements_under()
    missing = {name: word for name, word in calls.items()
               if not {word, "WITH" if word == "INSERT" else word} & set(nested.get(name, []))}
    assert not missing, f"no nested SQL span for {missing}; nested: {nested}"


ROOM_CALLS = {"create_room": "INSERT", "append_event": "INSERT", "append_events": "INSERT",
              "read_events": "SELECT", "room_state": "SELECT", "list_rooms": "SELECT", "disband_room": "UPDATE",
              "prune_disbanded_rooms": "DELETE"}


def test_every_call_family_with_the_engine_instrumented(engine: Engine, standby: Engine, traced: Traced) -> None:
    rooms.create_room(engine, room_id="before", name="Before", members=[], authority_gateway_id=GW_A)
    rooms.append_event(engine, room_id="before", authority_gateway_id=GW_A, authority_epoch=1, **_user(1))
    # Instrumented after the engines (and SQLite's held writer) exist, as opentelemetry-instrument may do.
    traced.instrument(engines=[engine, standby])
    assert engine.dialect.name == "postgresql" or _held_writer_is_used(engine)
    rooms.disband_room(engine, room_id="before", expected_gateway_id=GW_A, expected_epoch=1)
    _rooms_workload(rooms, engine)
    _replicas_workload(engine, standby)
    _peers_workload(engine)
    _ledger_workload(engine)
    _expect_nested(traced, {**ROOM_CALLS, "ingest_page": "INSERT", "promote_replica": "UPDATE",
                            "demote_room": "UPDATE", "upsert_room_link_record": "INSERT",
                            "list_room_link_records": "SELECT", "reserve_peer_room": "INSERT",
                            "ledger.prepare": "INSERT", "ledger.authorize": "UPDATE", "ledger.get": "SELECT",
                            "ledger.prepare_outbound": "INSERT", "ledger.prune": "DELETE"})
    # Outside any call: only the ledger constructor's durability check (PRAGMAs on SQLite; no span of its own).
    orphans = [span.name for span in _sql_spans(traced.spans()) if span.parent is None]
    assert all(name.startswith("PRAGMA") for name in orphans), orphans


@pytest.mark.parametrize("backend", ["postgresql"], indirect=True)
def test_the_held_append_is_traced_under_its_call(
    engine: Engine, traced: Traced, monkeypatch: pytest.MonkeyPatch
) -> None:
    rooms.create_room(engine, room_id="r1", name="Team", members=[], authority_gateway_id=GW_A)
    # The thread's held connection exists before the instrumentation, as opentelemetry-instrument may find it.
    rooms.append_event(engine, room_id="r1", authority_gateway_id=GW_A, authority_epoch=1, **_user(1))
    lent: list[Any] = []
    take = held_autocommit.take
    monkeypatch.setattr(held_autocommit, "take", lambda bound: lent.append(take(bound)) or lent[-1])
    traced.instrument(engine=engine)
    assert rooms.append_event(engine, room_id="r1", authority_gateway_id=GW_A, authority_epoch=1,
                              **_user(2))["seq"] == 2
    assert [item["seq"] for item in rooms.append_events(engine, "r1", [_user(3), _user(4)], GW_A, 1)] == [3, 4]
    assert len(lent) == 2 and None not in lent  # both on the held connection
    nested = traced.statements_under()
    assert nested["append_event"] == ["WITH"] and nested["append_events"] == ["WITH"], nested
    assert not [span.name for span in _sql_spans(traced.spans()) if span.parent is None]
    SQLAlchemyInstrumentor().uninstrument()
    count = len(_sql_spans(traced.spans()))
    rooms.append_event(engine, room_id="r1", authority_gateway_id=GW_A, authority_epoch=1, **_user(5))
    assert len(_sql_spans(traced.spans())) == count and lent[-1] is not None  # unobserved again, still held


def _held_writer_is_used(engine: Engine) -> bool:
    return writer.current_writer(engine) is not None


def _replicas_workload(engine: Engine, standby: Engine) -> None:
    rooms.create_room(engine, room_id="r3", name="Replicated", members=[], authority_gateway_id=GW_A)
    rooms.append_events(engine, "r3", [_user(n) for n in range(1, 5)], GW_A, 1)
    report = Replicator(EnginePageSource(engine), standby, local_gateway_id=GW_B).sync_once()
    assert report.ok and report.lag == 0
    assert replicas.replica_state(standby, room_id="r3")["latest_seq"] == 4  # type: ignore[index]
    replicas.promote_replica(standby, room_id="r3", local_gateway_id=GW_B)
    replicas.demote_room(standby, room_id="r3", observed_gateway_id=GW_A, observed_epoch=9, local_gateway_id=GW_B)


def _peers_workload(engine: Engine) -> None:
    claims = {"room_id": "r1", "home_install_id": "home-1", "authority_gateway_id": GW_A, "authority_epoch": 1,
              "member_id": "m1", "target_install_id": "target-1", "target_profile": "alpha", "issued_at": 1.0,
              "grant": "grant-1"}
    peers.upsert_room_link_record(engine, record=link(room_id="r1"), max_links=5)  # type: ignore[arg-type]
    assert peers.list_room_link_records(engine)[0]["room_id"] == "r1"
    peers.reserve_peer_room(engine, claims=claims, expires_at=100.0, now=2.0)
    assert peers.peer_room_is_reserved(engine, room_id="r1", target_profile="alpha", now=3.0)
    assert peers.probe_hosted_room(engine, room_id="r1") is True


def _ledger_workload(engine: Engine) -> None:
    ledger = DeliveryLedger(engine)
    prepare(ledger, 1)
    assert ledger.get("env-1") is not None
    ledger.authorize("env-1")
    ledger.bind_owner("env-1", queued_id="q-1", run_id="run-1")
    ledger.finish("env-1", succeeded=True, result_text="done")
    ledger.prepare_outbound(**outbound())
    ledger.commit_outbound("out-1", {"text": "ok"})
    assert ledger.outbound("out-1")["response"] == {"text": "ok"}  # type: ignore[index]
    ledger.prune(retain_seconds=0)


def test_the_global_instrumentation_traces_new_engines_on_both_apis(
    target: str, api: Any, traced: Traced
) -> None:
    traced.instrument()  # wraps engine creation: the engines (and the asyncio API's twins) built from now on
    engine = hostedrooms.create_engine(target)
    try:
        _rooms_workload(api.rooms, engine)
        _expect_nested(traced, ROOM_CALLS)
    finally:
        engine.dispose()


def test_migrate_upgrade_with_the_engine_instrumented(empty_target: str, traced: Traced) -> None:
    engine = hostedrooms.create_engine(empty_target)
    try:
        traced.instrument(engine=engine)
        migrate.upgrade(engine)
        assert migrate.is_at_head(engine)
        statements = " ".join(span.name for span in _sql_spans(traced.spans())).upper()
        assert "CREATE" in statements
        if engine.dialect.name == "postgresql":  # the migration lock: one of hostedrooms' hot statements
            locks = [span for span in _sql_spans(traced.spans())
                     if "pg_advisory_xact_lock" in str(span.attributes.get("db.statement",  # type: ignore[union-attr]
                                                                           span.attributes.get("db.query.text")))]
            assert locks
    finally:
        engine.dispose()


def test_an_instrumented_engine_takes_the_public_path_and_uninstrumenting_ends_it(
    engine: Engine, traced: Traced
) -> None:
    with engine.connect() as connection:
        assert not observed(connection, transactions=True)
        traced.instrument(engine=engine)
        assert observed(connection)
        SQLAlchemyInstrumentor().uninstrument()
        assert not observed(connection, transactions=True)
    rooms.create_room(engine, room_id="r1", name="Team", members=[], authority_gateway_id=GW_A)
    assert not _sql_spans(traced.spans())


@pytest.mark.skipif(LISTED, reason="the instrumentation lists this SQLAlchemy: it does not decline")
def test_the_instrumentation_declines_an_unlisted_sqlalchemy(
    engine: Engine, traced: Traced, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.ERROR):
        assert SQLAlchemyInstrumentor().instrument(engine=engine, tracer_provider=traced.provider) is None
    assert "SQLAlchemyInstrumentor only instruments" in caplog.text and sa.__version__ in caplog.text
    assert not SQLAlchemyInstrumentor().is_instrumented_by_opentelemetry
    with engine.connect() as connection:
        assert not observed(connection, transactions=True)  # no listener was installed
    rooms.create_room(engine, room_id="r1", name="Team", members=[], authority_gateway_id=GW_A)
    assert not traced.spans() or not _sql_spans(traced.spans())


def test_a_hot_statement_error_reaches_the_span_and_the_caller(engine: Engine, traced: Traced) -> None:
    insert = HotStatement(sa.insert(retired_ids), column_keys=["room_id", "retired_at"])
    traced.instrument(engine=engine)
    with UnitOfWork(engine) as uow:
        insert.rowcount(uow.connection, {"room_id": "twice", "retired_at": 1.0})
        uow.commit()
    with pytest.raises(StoreIntegrityError), UnitOfWork(engine) as uow:
        insert.rowcount(uow.connection, {"room_id": "twice", "retired_at": 2.0})
    inserts = [span for span in _sql_spans(traced.spans()) if span.name.upper().startswith("INSERT")]
    assert [span.status.is_ok for span in inserts] == [True, False]

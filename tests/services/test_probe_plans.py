"""Id probes answered from an index, one probe per id, whatever the log's length.

Two probes used to read a whole room for every call, so their cost grew with the log: a PostgreSQL batch
append's check for stored ids (under the generic plan the driver's prepared statement settles on, the planner
hash-joined the batch's ids against every event of the room), and an ingested page's check that its new ids are
not already in the replica (no index covered ``(room_id, event_id)``). These tests pin the plans (on PostgreSQL
both the plan for the values and the generic plan, with statistics as autovacuum keeps them) and that the answers
stay right: a batch repeating stored ids returns the stored rows, and a page reusing a stored id is refused.

With statistics older than a growing room (analysed while every room held one event, as on a busy gateway's new
room until autovacuum's next ``ANALYZE``), the primary key ``(room_id, seq)`` and the unique index cost the same to
the planner; the batch's probe once took the primary key with a filter, reading the room for every id, so each
batch cost more than the last. The stale-statistics test pins both probes' plans under those statistics, and that
a batch costs no more as the room grows.
"""

from __future__ import annotations

import contextlib
import re
import statistics
import time
from collections.abc import Iterator
from typing import Any

import factories
import pytest
import sqlalchemy as sa
from sqlalchemy import Engine
from sqlalchemy.dialects.postgresql import asyncpg

from hostedrooms import replicas, rooms
from hostedrooms.backends import backend_named
from hostedrooms.errors import ReplicaError
from hostedrooms.store import room_store
from hostedrooms.store.replicas import id_clash_query

A = factories.A
ACTOR = {"id": "u1", "kind": "user"}


def _batch(start: int, count: int) -> list[dict[str, Any]]:
    return [{"event_id": f"e{n}", "kind": "message.user", "actor": ACTOR, "payload": {"text": f"m{n}"}}
            for n in range(start, start + count)]


def _plan(connection: sa.Connection, statement: str, params: Any) -> str:
    if connection.dialect.name == "sqlite":
        rows = connection.exec_driver_sql(f"EXPLAIN QUERY PLAN {statement}", params).all()
        return "\n".join(str(row[-1]) for row in rows)
    rows = connection.exec_driver_sql(f"EXPLAIN {statement}", params).all()
    return "\n".join(str(row[0]) for row in rows)


def _literal(value: Any) -> str:
    return "'" + value.replace("'", "''") + "'" if isinstance(value, str) else repr(value)


_PROBE_VALUES = {
    "fast_room_id": "r1", "fast_gateway_id": A, "fast_epoch": 1, "fast_count": 2, "fast_size": 10,
    "fast_max_events": 10**9, "fast_max_room_bytes": 10**12, "fast_spread_limit": 10**12, "fast_now": 1.0,
    "notify_channel": "c"}
#: The batch probe's and the single probe's own values: an id stored (e5) and one that is not.
_BATCH_VALUES = {**_PROBE_VALUES, "fast_rows": '[["e5","k","{}",1,"{}"],["new","k","{}",1,"{}"]]'}
_ONE_VALUES = {**_PROBE_VALUES, "fast_count": 1, "event_id": "e5", "kind": "k", "actor_json": "{}",
               "authority_epoch": 1, "payload_json": "{}"}


def _probe_plans(connection: sa.Connection, statement: Any, values: dict[str, Any]) -> list[str]:
    """The plan of an append statement for these values, and the generic plan a prepared statement settles on."""
    # The plan for these values (what the first executions of a prepared statement use) ...
    compiled = statement.compile(dialect=connection.dialect)
    plans = [_plan(connection, compiled.string, compiled.construct_params(values))]
    # ... and the generic plan, chosen without the values (the room's size unknown to it): the statement with $n
    # placeholders (asyncpg's style), PREPAREd as the driver's prepared statement is.
    numbered = statement.compile(dialect=asyncpg.dialect())
    names = list(numbered.positiontup or ())
    types = ", ".join("text" if isinstance(values[name], str) else "float8" if isinstance(values[name], float)
                      else "bigint" for name in names)
    connection.exec_driver_sql(f"PREPARE hostedrooms_probe ({types}) AS {numbered.string}")
    connection.exec_driver_sql("SET LOCAL plan_cache_mode = force_generic_plan")
    arguments = ", ".join(_literal(values[name]) for name in names)  # the test's own constants
    plans.append(_plan(connection, f"EXECUTE hostedrooms_probe({arguments})", {}))
    connection.exec_driver_sql("DEALLOCATE hostedrooms_probe")
    connection.exec_driver_sql("RESET plan_cache_mode")
    assert "(room_id = 'r1'::text)" in plans[0] and "(room_id = $" in plans[1], plans  # (each plan is what it says)
    return plans


def _assert_probes_the_unique_index(plan: str) -> None:
    """The ``stored`` probe finds each id through the ``(room_id, event_id)`` index, never by reading the room."""
    probe = plan.split("CTE advanced")[0]
    assert re.search(r"Index Cond: .*room_id = .*event_id = ", probe), plan
    assert "Hash" not in probe and "Filter" not in probe and "Seq Scan" not in probe, plan


def test_a_postgresql_batch_probes_each_id_in_the_unique_index(engine: Engine) -> None:
    if engine.dialect.name != "postgresql":
        pytest.skip("the one-statement batch append is PostgreSQL's")
    rooms.create_room(engine, room_id="r1", name="R", members=[], authority_gateway_id=A)
    for start in range(0, 2000, 100):
        rooms.append_events(engine, "r1", _batch(start, 100), authority_gateway_id=A, authority_epoch=1)
    store = room_store(backend_named("postgresql"))
    with engine.connect() as connection:
        # Statistics as autovacuum keeps them (a test database's may be left from other tests' tables).
        connection.exec_driver_sql("ANALYZE hosted_room_events")
        plans = [*_probe_plans(connection, store._append_batch.statement, _BATCH_VALUES),
                 *_probe_plans(connection, store._append_one.statement, _ONE_VALUES)]
    for plan in plans:
        _assert_probes_the_unique_index(plan)
    # And the answer: a batch repeating stored ids returns the stored rows, writing nothing.
    again = rooms.append_events(engine, "r1", _batch(5, 3), authority_gateway_id=A, authority_epoch=1)
    assert [(event["seq"], event["idempotent"]) for event in again] == [(6, True), (7, True), (8, True)]
    assert rooms.room_state(engine, room_id="r1")["latest_seq"] == 2000


def _timed_batch(engine: Engine, start: int) -> float:
    began = time.perf_counter()
    rooms.append_events(engine, "r1", _batch(start, 100), authority_gateway_id=A, authority_epoch=1)
    return time.perf_counter() - began


@contextlib.contextmanager
def _statistics_older_than_room_r1(engine: Engine) -> Iterator[None]:
    """Statistics analysed while each of 60 rooms held one event, then an empty room ``r1`` to grow inside the
    block, with autovacuum off for the table meanwhile (no ANALYZE behind the test's back)."""
    with engine.begin() as connection:
        connection.exec_driver_sql("ALTER TABLE hosted_room_events SET (autovacuum_enabled = false)")
    try:
        for n in range(60):
            rooms.create_room(engine, room_id=f"s{n}", name="S", members=[], authority_gateway_id=A)
            rooms.append_events(engine, f"s{n}", [{**_batch(0, 1)[0], "event_id": f"s{n}-e0"}],
                                authority_gateway_id=A, authority_epoch=1)
        with engine.begin() as connection:
            connection.exec_driver_sql("ANALYZE hosted_room_events")
        rooms.create_room(engine, room_id="r1", name="R", members=[], authority_gateway_id=A)
        yield
    finally:
        with engine.begin() as connection:
            connection.exec_driver_sql("ALTER TABLE hosted_room_events RESET (autovacuum_enabled)")


def test_the_probes_keep_the_unique_index_under_statistics_older_than_the_room(engine: Engine) -> None:
    """Statistics analysed while every room held one event (a busy gateway's new room, before autovacuum analyses
    the table again): a room growing by batches still has each id probed in the unique index, so a batch costs
    no more at 3,000 events than at 100."""
    if engine.dialect.name != "postgresql":
        pytest.skip("the one-statement appends are PostgreSQL's")
    with _statistics_older_than_room_r1(engine):
        seconds = [_timed_batch(engine, start) for start in range(0, 3000, 100)]
        store = room_store(backend_named("postgresql"))
        with engine.connect() as connection:
            plans = [*_probe_plans(connection, store._append_batch.statement, _BATCH_VALUES),
                     *_probe_plans(connection, store._append_one.statement, _ONE_VALUES)]
        # The last batches (at 2,900 events and more) against the first ones: a median of three each, a generous
        # bound (a probe that reads the room for each id grows with the room well past it).
        first = statistics.median(seconds[1:4])
        last = statistics.median([*seconds[-2:], _timed_batch(engine, 3000)])
    for plan in plans:
        _assert_probes_the_unique_index(plan)
    assert last < 4 * first, (first, last, seconds)
    assert rooms.room_state(engine, room_id="r1")["latest_seq"] == 3100


def _page(events: list[dict[str, Any]], latest: int) -> dict[str, Any]:
    return {"room_id": "r1", "events": events, "latest_seq": latest, "has_more": False,
            "next_since_seq": events[-1]["seq"] if events else 0, "authority_gateway_id": A, "authority_epoch": 1,
            "disbanded_at": None}


def test_an_ingested_page_probes_its_new_ids_in_the_replica_index(engine: Engine) -> None:
    rooms.create_room(engine, room_id="r1", name="R", members=[], authority_gateway_id=A)
    rooms.append_events(engine, "r1", _batch(0, 300), authority_gateway_id=A, authority_epoch=1)
    source = rooms.read_events(engine, room_id="r1", since_seq=0, limit=300)
    # Another gateway's room "rr" replicated into this store: the same events, under its id.
    events = [{**event, "room_id": "rr"} for event in source["events"]]
    replicas.ingest_page(engine, room_id="rr", room_name="R", members=[], page={**source, "room_id": "rr",
                                                                              "events": events})
    with engine.connect() as connection:
        compiled = id_clash_query("rr", ["a", "b", "c"]).compile(
            dialect=connection.dialect, compile_kwargs={"render_postcompile": True})
        values = compiled.construct_params()
        if connection.dialect.name == "sqlite":
            params: Any = tuple(values[name] for name in compiled.positiontup or ())
        else:
            params = values
            connection.exec_driver_sql("ANALYZE hosted_room_replica_events")  # statistics as autovacuum keeps them
            connection.exec_driver_sql("SET LOCAL enable_seqscan = off")  # tiny tables: make the choice visible
        plan = _plan(connection, compiled.string, params)
    assert "idx_hosted_room_replica_events_event_id" in plan, plan
    # And the answer: a new event reusing a stored id is refused, nothing written.
    last = events[-1]
    reused = {**events[0], "seq": last["seq"] + 1}
    with pytest.raises(ReplicaError):
        replicas.ingest_page(engine, room_id="rr", room_name="R", members=[], page=_page([reused], last["seq"] + 1))
    assert replicas.replica_state(engine, room_id="rr")["last_seq"] == 300


def test_a_batch_repeating_a_stored_id_twice_beside_a_new_one(engine: Engine) -> None:
    """The per-id probe returns a stored row once per item naming it: the answer is still each item's own."""
    rooms.create_room(engine, room_id="r1", name="R", members=[], authority_gateway_id=A)
    rooms.append_events(engine, "r1", _batch(0, 10), authority_gateway_id=A, authority_epoch=1)
    stored = _batch(5, 1)[0]
    fresh = {"event_id": "new", "kind": "message.user", "actor": ACTOR, "payload": {"text": "new"}}
    results = rooms.append_events(engine, "r1", [stored, fresh, stored], authority_gateway_id=A, authority_epoch=1)
    assert [(event["event_id"], event["seq"], event["idempotent"]) for event in results] == [
        ("e5", 6, True), ("new", 11, False), ("e5", 6, True)]
    assert [event["event_id"] for event in rooms.read_events(engine, room_id="r1", since_seq=10)["events"]] == ["new"]
    # Every item stored already (one of them twice): a pure replay, nothing written.
    again = rooms.append_events(engine, "r1", [stored, fresh, stored], authority_gateway_id=A, authority_epoch=1)
    assert [(event["seq"], event["idempotent"]) for event in again] == [(6, True), (11, True), (6, True)]
    assert rooms.room_state(engine, room_id="r1")["latest_seq"] == 11


# --- the append functions behind a transaction pooler (revision 0011) ------------------------------------------------

#: The functions' probes (their text inside the function, as auto_explain shows it).
_FUNCTION_PROBES = ("WHERE room_id = p_room_id AND event_id = batch.id",
                    "WHERE room_id = p_room_id AND event_id = p_event_id")
_FUNCTION_CALLS = (
    "SELECT * FROM hostedrooms_append_batch('r1', %(gateway)s, 1, 2, 10, 1000000000, 1000000000000, 1000000000000, "
    "1.0, 'c', CAST(%(rows)s AS json))",
    "SELECT * FROM hostedrooms_append_one('r1', %(gateway)s, 1, 1, 10, 1000000000, 1000000000000, 1000000000000, "
    "1.0, 'c', 'e5', 'k', '{}', 1, '{}')")


def _function_probe_plans(connection: sa.Connection) -> list[str]:
    """The plans of the functions' id probes, custom (the first calls of a session) and generic (what PL/pgSQL may
    settle on after five), as auto_explain reports the statements run inside a function (as notices)."""
    notices: list[str] = []
    connection.connection.driver_connection.add_notice_handler(
        lambda notice: notices.append(notice.message_primary or ""))
    try:
        connection.exec_driver_sql("LOAD 'auto_explain'")
    except sa.exc.DBAPIError as exc:  # a server of the user's own, where this role may not load it
        pytest.skip(f"auto_explain cannot be loaded here: {exc.orig}")
    for setting in ("auto_explain.log_min_duration = 0", "auto_explain.log_nested_statements = on",
                    "auto_explain.log_level = notice"):
        connection.exec_driver_sql(f"SET LOCAL {setting}")
    values = {"gateway": A, "rows": '[["e5","k","{}",1,"{}"],["new","k","{}",1,"{}"]]'}
    for mode in ("force_custom_plan", "force_generic_plan"):
        connection.exec_driver_sql(f"SET LOCAL plan_cache_mode = {mode}")
        for call in _FUNCTION_CALLS:
            found = connection.exec_driver_sql(call, values).all()
            assert [row[2] for row in found] == ["e5"]  # the stored row, nothing written
    connection.rollback()
    plans = [notice for notice in notices if any(probe in notice for probe in _FUNCTION_PROBES)]
    assert len(plans) == 4, notices
    assert "'r1'::text" in plans[0] and "$1" in plans[2], plans  # (each plan is what it says)
    # Each plan, after its query's text.
    return [next(plan.split(probe, 1)[1] for probe in _FUNCTION_PROBES if probe in plan) for plan in plans]


def test_the_pooler_functions_probe_each_id_in_the_unique_index_under_stale_statistics(engine: Engine) -> None:
    """The functions keep their plans for a server connection's life (PL/pgSQL may switch to a generic plan after
    five calls): under statistics older than a growing room, custom and generic plans still probe each id in the
    ``(room_id, event_id)`` index, never reading the room."""
    if engine.dialect.name != "postgresql":
        pytest.skip("the append functions are PostgreSQL's")
    with _statistics_older_than_room_r1(engine):
        for start in range(0, 2000, 100):
            rooms.append_events(engine, "r1", _batch(start, 100), authority_gateway_id=A, authority_epoch=1)
        with engine.connect() as connection:
            plans = _function_probe_plans(connection)
    for plan in plans:
        assert re.search(r"Index Cond: .*room_id = .*event_id = ", plan), plan
        assert "Hash" not in plan and "Filter" not in plan and "Seq Scan" not in plan, plan
    assert rooms.room_state(engine, room_id="r1")["latest_seq"] == 2000

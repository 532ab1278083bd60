"""Behind a transaction pooler the one-statement append runs as the server-side function revision
``0011_pooler_append_functions`` installs (issue #36 item 3; ``hostedrooms.store.rooms.pg_function``).

Through PgBouncer in transaction mode: the function path (on the thread's held client connection to PgBouncer, and
on a pooled one), the statement path (the same database, direct) and the full path return the same results, raise
the same errors and leave the same rows on generated sequences (fenced, disbanded, capacity, stored and repeated
ids, batches holding a stored id); several writers through the pooler
leave contiguous seqs and each id once; the function is what runs (a statement listener sees its call, and with
the function dropped the append still works, on the statement, saying once to upgrade). The revision creates the
functions in the migration's schema, bound to that schema's tables, and its downgrade drops them.
"""

from __future__ import annotations

import logging
import random
import threading
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, nullcontext
from typing import Any

import pytest
import sqlalchemy as sa
from factories import lowered, snapshot
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sqlalchemy import Engine
from test_fleet_pooler import emptied, whole_log
from test_rooms_paths import _fresh, _item, _limits, _operation, _outcomes

import hostedrooms
from hostedrooms import held_autocommit, migrate, models, rooms
from hostedrooms.backends import backend_for
from hostedrooms.errors import HostedRoomError
from hostedrooms.rooms import transaction
from hostedrooms.store import room_store
from hostedrooms.store.rooms import pg_function

FUNCTIONS = ("hostedrooms_append_batch", "hostedrooms_append_one")
BEFORE = "0010_replica_event_ids"
TABLES = (models.rooms, models.events, models.retired_ids)
ACTOR = {"kind": "user", "id": "u1"}


@pytest.fixture
def engines(pgbouncer_url: str, pgbouncer_direct_url: str) -> Iterator[tuple[Engine, Engine]]:
    """(through PgBouncer with ``pooler="transaction"``, direct) on the same emptied database."""
    emptied(pgbouncer_direct_url)
    pooled = hostedrooms.create_engine(pgbouncer_url, pooler="transaction", pool_size=4, max_overflow=0)
    direct = hostedrooms.create_engine(pgbouncer_direct_url)
    try:
        yield pooled, direct
    finally:
        pooled.dispose()
        direct.dispose()


@pytest.fixture
def calls(monkeypatch: pytest.MonkeyPatch) -> dict[str, int]:
    """How many appends called the function (and got its rows) while the test ran (on the class: each store
    binds its own copy)."""
    counts = {"function": 0}
    original = pg_function.PoolerAppend.rows

    def counting(self: pg_function.PoolerAppend, *args: Any, **kwargs: Any) -> Any:
        found = original(self, *args, **kwargs)
        counts["function"] += found is not None
        return found

    monkeypatch.setattr(pg_function.PoolerAppend, "rows", counting)
    return counts


@pytest.fixture
def held_attempts(monkeypatch: pytest.MonkeyPatch) -> list[Engine]:
    """The engine of each append whose first attempt ran on a held connection while the test ran."""
    seen: list[Engine] = []
    original = transaction._held_attempt

    def counting(engine: Engine, *args: Any) -> Any:
        seen.append(engine)
        return original(engine, *args)

    monkeypatch.setattr(transaction, "_held_attempt", counting)
    return seen


def _functions(connection: sa.Connection) -> list[tuple[str, str]]:
    return [tuple(row) for row in connection.execute(sa.text(
        "SELECT n.nspname, p.proname FROM pg_proc AS p JOIN pg_namespace AS n ON n.oid = p.pronamespace "
        "WHERE p.proname IN ('hostedrooms_append_one', 'hostedrooms_append_batch') ORDER BY 1, 2"))]


def _say(engine: Engine, event_id: str, room_id: str = "r1", text: str = "a") -> Any:
    return rooms.append_event(engine, room_id=room_id, event_id=event_id, kind="message.user", actor=ACTOR,
                              payload={"text": text}, authority_gateway_id="g1", authority_epoch=1, now=3000.0)


def _batch(engine: Engine, event_ids: list[str], room_id: str = "r1") -> Any:
    items = [{"event_id": event_id, "kind": "message.user", "actor": ACTOR, "payload": {"text": event_id}}
             for event_id in event_ids]
    return rooms.append_events(engine, room_id, items, "g1", 1, 3000.0)


# --- the same outcomes as the statement and the full path ---------------------------------------------------------


def test_function_statement_and_full_path_agree_on_generated_sequences(
        engines: tuple[Engine, Engine], calls: dict[str, int], held_attempts: list[Engine]) -> None:
    """Four ways: through the pooler on the held connection and on a pooled one; direct (held); the full path."""
    pooled, direct = engines
    store = room_store(backend_for(direct))
    ways: tuple[tuple[Engine, Callable[[], AbstractContextManager[None]]], ...] = (
        (pooled, nullcontext), (pooled, held_autocommit.without_held_connections), (direct, nullcontext),
        (direct, store.without_one_statement))

    @settings(max_examples=40, deadline=None, database=None,
              suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
    @given(st.randoms(use_true_random=False))
    def agree(rng: random.Random) -> None:
        operations = [_operation(rng) for _ in range(rng.randint(1, 20))]
        lim = _limits(rng)
        runs = []
        for engine, context in ways:
            _fresh(engine, lim)
            with context():
                outcomes = _outcomes(engine, operations, lim)
            runs.append((outcomes, snapshot(direct, TABLES)))
        assert runs[0] == runs[1] == runs[2] == runs[3]

    agree()
    assert calls["function"] > 0  # the pooled runs did call the function
    assert pooled in held_attempts  # through the pooler on the held connection too


@pytest.mark.parametrize(("case", "refused"), [
    ("fenced", "AuthorityConflictError"), ("moved", "AuthorityConflictError"), ("disbanded", "RoomNotFoundError"),
    ("capacity", "CapacityExceededError"), ("stored", None), ("batch-stored", None),
    ("batch-conflict", "EventConflictError"), ("batch-repeats", None), ("absent", "RoomNotFoundError")])
def test_function_and_statement_agree_on_each_refusal_and_replay(
        engines: tuple[Engine, Engine], calls: dict[str, int], case: str, refused: str | None) -> None:
    """Each case named in the issue, run through the function (pooler: held and pooled connection) and the
    statement (direct)."""
    pooled, direct = engines
    outcomes = []
    for engine, context in ((pooled, nullcontext), (pooled, held_autocommit.without_held_connections),
                            (direct, nullcontext)):
        _fresh(engine)
        with context():
            outcomes.append((_case(engine, case), snapshot(engine, TABLES)))
    assert outcomes[0] == outcomes[1] == outcomes[2]
    result = outcomes[0][0]
    if refused is None:
        assert not isinstance(result, tuple), result
    else:
        assert isinstance(result, tuple) and result[0] == refused, result
    assert calls["function"] > 0


def _case(engine: Engine, case: str) -> Any:
    _say(engine, "e1")
    _batch(engine, ["e2", "e3"])
    try:
        if case == "fenced":
            return rooms.append_event(engine, room_id="r1", event_id="x", kind="message.user", actor=ACTOR,
                                      payload={}, authority_gateway_id="g1", authority_epoch=2, now=3001.0)
        if case == "moved":
            return rooms.append_events(engine, "r1", [_item("message.user", "user", "x", "a")], "g2", 1, 3001.0)
        if case == "disbanded":
            rooms.disband_room(engine, room_id="r1", expected_gateway_id="g1", expected_epoch=1, now=3001.0)
            return _say(engine, "x")
        if case == "capacity":
            return rooms.append_event(engine, room_id="r1", event_id="x", kind="message.user", actor=ACTOR,
                                      payload={"text": "x" * 50}, authority_gateway_id="g1", authority_epoch=1,
                                      now=3001.0, limits=lowered(MAX_ROOM_EVENT_BYTES=200))
        if case == "stored":
            return [_say(engine, "e1"), _say(engine, "e2", text="e2")]
        if case == "batch-stored":
            return _batch(engine, ["e4", "e2", "e5"])
        if case == "batch-conflict":
            return rooms.append_events(engine, "r1", [_item("message.user", "user", "e9", "a"),
                                                      _item("message.user", "user", "e2", "other")], "g1", 1, 3001.0)
        if case == "batch-repeats":
            return [_batch(engine, ["e6", "e7", "e6"]), _batch(engine, ["e6", "e7", "e6"])]
        return _say(engine, "x", room_id="r3")
    except HostedRoomError as exc:
        return type(exc).__name__, str(exc)


def test_an_advance_no_free_shard_can_pay_fails_the_function_as_it_fails_the_statement(
        engines: tuple[Engine, Engine]) -> None:
    """Another writer holds every shard (after the advance's check saw room): both fail whole with SQLSTATE 22012
    (the caller's cue for the full path), writing nothing."""
    pooled, direct = engines
    _fresh(direct)
    before = snapshot(direct, (*TABLES, models.budget))
    store: Any = room_store(backend_for(direct))
    params = {"fast_room_id": "r1", "fast_gateway_id": "g1", "fast_epoch": 1, "fast_count": 1, "fast_size": 10,
              "fast_max_events": 10**9, "fast_max_room_bytes": 10**12, "fast_spread_limit": 10**12,
              "fast_now": 1.0, "notify_channel": "c", "event_id": "x", "kind": "message.user",
              "actor_json": "{}", "authority_epoch": 1, "payload_json": "{}"}
    with direct.connect() as holder:
        assert holder.exec_driver_sql("SELECT shard FROM hosted_room_budget FOR UPDATE").all()
        for engine, statement in ((pooled, store._pooler_append._one.statement), (direct, store._append_one.statement)):
            with engine.connect() as connection, pytest.raises(sa.exc.DataError) as caught:
                connection.execute(statement, params)
            assert getattr(caught.value.orig, "sqlstate", None) == "22012"
        holder.rollback()
    assert snapshot(direct, (*TABLES, models.budget)) == before


def test_the_function_wakes_followers_for_single_and_batch_appends_and_not_for_replays(
        engines: tuple[Engine, Engine], pgbouncer_direct_url: str, calls: dict[str, int]) -> None:
    """The followers' NOTIFY (LISTEN on a direct connection): one per append that wrote, none for a replay, which
    commits first (notifications arrive in commit order)."""
    psycopg = pytest.importorskip("psycopg")
    sql = pytest.importorskip("psycopg.sql")
    pooled, direct = engines
    _fresh(direct)
    _say(direct, "old", room_id="r2")
    with direct.connect() as connection:
        channel = backend_for(direct).hot_params(connection, room_store(backend_for(direct)).channel)["notify_channel"]
    listener = psycopg.connect(sa.make_url(pgbouncer_direct_url).set(drivername="postgresql").render_as_string(
        hide_password=False), autocommit=True)
    try:
        listener.execute(sql.SQL("LISTEN {}").format(sql.Identifier(channel)))
        assert _say(pooled, "old", room_id="r2")["idempotent"]
        _batch(pooled, ["b1", "b2"])
        _say(pooled, "e1")
        payloads = [notify.payload for notify in listener.notifies(timeout=30, stop_after=2)]
    finally:
        listener.close()
    assert payloads == ["r1", "r1"]
    assert calls["function"] == 3


# --- several writers through the pooler ----------------------------------------------------------------------------


def test_writers_through_the_pooler_leave_contiguous_seqs_and_each_id_once(
        engines: tuple[Engine, Engine], calls: dict[str, int], held_attempts: list[Engine], pgbouncer_url: str
) -> None:
    """Six writers on two engines (more clients than PgBouncer's four server connections; each writer's single
    appends on its held client connection, whose statements PgBouncer spreads over its server connections): each
    writes ids of its own and all of them the same shared ids (single and in batches); every id is stored once, at
    contiguous seqs, and exactly one caller of each shared id saw it written; the budget's shards add up."""
    pooled, _ = engines
    other = hostedrooms.create_engine(pgbouncer_url, pooler="transaction", pool_size=4, max_overflow=0)
    _fresh(pooled)
    written: dict[str, int] = {}
    lock = threading.Lock()
    errors: list[BaseException] = []

    def work(index: int) -> None:
        engine = (pooled, other)[index % 2]
        try:
            for n in range(25):
                results = [_say(engine, f"w{index}-{n}"), _say(engine, f"shared-{n}"),
                           *_batch(engine, [f"pair-{n}-a", f"pair-{n}-b"])]
                with lock:
                    for result in results:
                        written[result["event_id"]] = written.get(result["event_id"], 0) + (not result["idempotent"])
        except BaseException as exc:  # every failure counts; none may be lost in a thread
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(index,)) for index in range(6)]
    try:
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(120)
    finally:
        other.dispose()
    assert errors == [] and not any(thread.is_alive() for thread in threads)
    log = whole_log(pooled, "r1")
    assert [event["seq"] for event in log] == list(range(1, len(log) + 1))
    ids = [event["event_id"] for event in log]
    assert len(ids) == len(set(ids)) == 6 * 25 + 25 + 50
    assert set(ids) == set(written) and set(written.values()) == {1}  # one caller wrote each id, once
    assert rooms.room_state(pooled, room_id="r1")["latest_seq"] == len(log)
    assert calls["function"] > 0
    assert {id(engine) for engine in held_attempts} == {id(pooled), id(other)}
    assert hostedrooms.verify(pooled) == []  # among others: the shards' used bytes sum to the rooms' bytes


# --- that the function runs --------------------------------------------------------------------------------------


def test_the_pooled_engine_calls_the_function_and_a_direct_one_the_statement(engines: tuple[Engine, Engine]) -> None:
    """A statement listener (it routes hot statements through SQLAlchemy's public path) sees what runs."""
    seen: dict[str, list[str]] = {"pooled": [], "direct": []}
    for name, engine in zip(seen, engines, strict=True):
        sa.event.listen(engine, "before_cursor_execute",
                        lambda *args, name=name: seen[name].append(args[2]))
    _fresh(engines[1])
    for engine in engines:
        _say(engine, f"one-{id(engine)}")
        _batch(engine, [f"a-{id(engine)}", f"b-{id(engine)}"])
    assert sum("hostedrooms_append_one(" in text for text in seen["pooled"]) == 1
    assert sum("hostedrooms_append_batch(" in text for text in seen["pooled"]) == 1
    assert not any("WITH stored AS" in text for text in seen["pooled"])
    assert not any("hostedrooms_append_" in text for text in seen["direct"])
    assert sum("WITH stored AS" in text for text in seen["direct"]) == 2


def test_without_the_functions_the_pooled_engine_runs_the_statement_and_says_to_upgrade(
        pgbouncer_url: str, pgbouncer_direct_url: str, caplog: pytest.LogCaptureFixture,
        held_attempts: list[Engine]) -> None:
    """A database below revision 0011 (a library newer than its schema): the first append (on the thread's held
    connection) finds the function missing, writes nothing there, takes the full path; the engine then runs the
    statement (on the same held connection, kept); one warning."""
    emptied(pgbouncer_direct_url)
    migrate.downgrade(pgbouncer_direct_url, BEFORE)
    caplog.set_level(logging.WARNING, logger=pg_function.__name__)
    engine = hostedrooms.create_engine(pgbouncer_url, pooler="transaction")
    try:
        with engine.connect() as connection:
            assert _functions(connection) == []
        _fresh(engine)
        assert not pg_function.function_missing(engine.dialect)
        results = [_say(engine, "e1"), _say(engine, "e1"), *_batch(engine, ["e2", "e3"]), *_batch(engine, ["e2"])]
        assert [(event["seq"], event["idempotent"]) for event in results] == [
            (1, False), (1, True), (2, False), (3, False), (2, True)]
        assert pg_function.function_missing(engine.dialect)
        warnings = [record.getMessage() for record in caplog.records if record.name == pg_function.__name__]
        assert len(warnings) == 1 and "hostedrooms upgrade" in warnings[0] and "0011" in warnings[0], warnings
        assert held_attempts == [engine] * 4 and held_autocommit.held_count(engine) == 1  # kept, clean
    finally:
        engine.dispose()
        migrate.upgrade(pgbouncer_direct_url)
    # Upgraded: a new engine calls the function again.
    engine = hostedrooms.create_engine(pgbouncer_url, pooler="transaction")
    try:
        assert _say(engine, "e4")["seq"] == 4
        assert not pg_function.function_missing(engine.dialect)
    finally:
        engine.dispose()


# --- the revision -------------------------------------------------------------------------------------------------


def test_the_revision_installs_the_functions_per_schema_and_drops_them_on_downgrade(
        empty_target: str, monkeypatch: pytest.MonkeyPatch, calls: dict[str, int]) -> None:
    """A schema per gateway: each schema's functions write that schema's tables (the call resolved by the
    engine's search_path). SQLite: the revision changes nothing."""
    if not empty_target.startswith("postgresql"):
        migrate.upgrade(empty_target, BEFORE)
        before = _sqlite_schema(empty_target)
        migrate.upgrade(empty_target, pg_function.FUNCTION_REVISION)  # (later revisions may change SQLite)
        assert _sqlite_schema(empty_target) == before
        assert migrate.current_revision(empty_target) == pg_function.FUNCTION_REVISION
        migrate.downgrade(empty_target, BEFORE)
        assert _sqlite_schema(empty_target) == before
        return
    for schema in ("gw_f1", "gw_f2"):
        migrate.upgrade(empty_target, schema=schema)
    # Any engine of the test takes the function path (schema= and pooler="transaction" do not go together; a
    # PgBouncer alias per schema is the fleet's way, see bench/fleet.py).
    monkeypatch.setattr(pg_function.PoolerAppend, "applies", staticmethod(lambda connection: True))
    engine = hostedrooms.create_engine(empty_target, schema="gw_f1")
    try:
        with engine.connect() as connection:
            assert _functions(connection) == [(schema, name) for schema in ("gw_f1", "gw_f2") for name in FUNCTIONS]
            source = connection.execute(sa.text(
                "SELECT prosrc FROM pg_proc WHERE proname = 'hostedrooms_append_one' "
                "AND pronamespace = CAST('gw_f1' AS regnamespace)")).scalar_one()
        assert "gw_f1.hosted_room_events" in source and "gw_f2" not in source
        _fresh(engine)
        assert _say(engine, "e1")["seq"] == 1 and _batch(engine, ["e2", "e3"])[-1]["seq"] == 3
        assert calls["function"] == 2
        with engine.connect() as connection:
            counts = connection.execute(sa.text(
                "SELECT (SELECT count(*) FROM gw_f1.hosted_room_events), "
                "(SELECT count(*) FROM gw_f2.hosted_room_events)")).one()
        assert tuple(counts) == (3, 0)
        migrate.downgrade(empty_target, BEFORE, schema="gw_f1")
        with engine.connect() as connection:
            assert _functions(connection) == [("gw_f2", name) for name in FUNCTIONS]
        migrate.upgrade(empty_target, schema="gw_f1")
        with engine.connect() as connection:
            assert len(_functions(connection)) == 4
    finally:
        engine.dispose()


def _sqlite_schema(target: str) -> list[tuple[Any, ...]]:
    engine = sa.create_engine(f"sqlite:///{target}" if "://" not in target else target)
    try:
        with engine.connect() as connection:
            return [tuple(row) for row in connection.exec_driver_sql(
                "SELECT type, name, sql FROM sqlite_master ORDER BY type, name")]
    finally:
        engine.dispose()

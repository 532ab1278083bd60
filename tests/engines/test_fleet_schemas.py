"""A fleet of gateways in one PostgreSQL database, a schema each (#26 items 1, 2 and 5): ``schema=`` end to end,
the same isolation from a ``search_path`` in the URL, what is refused, and that no advisory lock, budget count,
notification or migration of one schema reaches another."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from factories import lowered, message, run_cli, run_together
from sqlalchemy import Engine

import hostedrooms
from hostedrooms import migrate, models, peers, rooms, testing
from hostedrooms.advisory_keys import (
    MIGRATION_LOCK_KEY,
    PEER_LINKS_LOCK_KEY,
    PEER_RESERVATIONS_LOCK_KEY,
    PREPARE_LOCK_KEY,
    REPLICA_CREATION_LOCK_KEY,
    ROOM_CREATION_LOCK_KEY,
)
from hostedrooms.backends import LEDGER_WORK_CHANNEL, backend_for
from hostedrooms.errors import (
    HostedRoomError,
    SchemaMissingError,
    StoreConfigurationError,
    StoreReadOnlyError,
    StoreUnavailableError,
    translate,
)
from hostedrooms.uow import UnitOfWork
from hostedrooms.wakeup import Wakeup

pytest_plugins = ["pytester"]

GATEWAY = "install:gw-fleet"
SCHEMAS = ("gw_a", "gw_b", "gw_c")
#: What a write of another schema may add to an append at most: far below the 2 s the other schema holds its locks.
NOT_BLOCKED = 1.0

#: Every advisory key a write takes (rooms, replicas, ledger, peer links and reservations, migrations).
WRITE_KEYS = (ROOM_CREATION_LOCK_KEY, REPLICA_CREATION_LOCK_KEY, PREPARE_LOCK_KEY, PEER_LINKS_LOCK_KEY,
              PEER_RESERVATIONS_LOCK_KEY, MIGRATION_LOCK_KEY)


@pytest.fixture(scope="module")
def fleet_url(pg_admin_url: str) -> Iterator[str]:
    """A fresh database holding three gateways' schemas, each migrated with ``schema=`` (none in ``public``)."""
    with testing.postgres_database(pg_admin_url, testing.unique_name("hostedrooms_fleet")) as url:
        for schema in SCHEMAS:
            migrate.upgrade(url, schema=schema)
        yield url


@pytest.fixture
def fleet(fleet_url: str) -> Iterator[dict[str, Engine]]:
    """An emptied engine per schema."""
    engines = {schema: hostedrooms.create_engine(fleet_url, schema=schema) for schema in SCHEMAS}
    try:
        for engine in engines.values():
            with engine.begin() as connection:
                for table in reversed(models.metadata.sorted_tables):
                    connection.execute(sa.delete(table))
        yield engines
    finally:
        for engine in engines.values():
            engine.dispose()


def make_room(engine: Engine, room_id: str, name: str = "Team") -> None:
    rooms.create_room(engine, room_id=room_id, name=name, members=[], authority_gateway_id=GATEWAY, now=1000.0)


def say(engine: Engine, room_id: str, event_id: str, **kwargs: Any) -> dict[str, Any]:
    return message(engine, room_id, event_id, gateway=GATEWAY, **kwargs)


def tables_in(engine: Engine, schema: str) -> set[str]:
    with engine.connect() as connection:
        return set(connection.execute(sa.text(
            "SELECT table_name FROM information_schema.tables WHERE table_schema = :schema"),
            {"schema": schema}).scalars())


def with_search_path(url: str, path: str) -> str:
    return sa.make_url(url).update_query_dict({"options": f"-csearch_path={path}"}).render_as_string(
        hide_password=False)


# --- item 1: a namespace per gateway ------------------------------------------------------------------------------


def test_two_schemas_of_one_database_are_two_gateways(fleet: dict[str, Engine], fleet_url: str) -> None:
    a, b = fleet["gw_a"], fleet["gw_b"]
    for schema in ("gw_a", "gw_b"):  # each schema has its tables and its own version table; public has none
        assert {"hosted_rooms", migrate.VERSION_TABLE} <= tables_in(a, schema)
        assert migrate.current_revision(fleet_url, schema=schema) == migrate.head_revision()
    assert not tables_in(a, "public") & migrate.HOSTEDROOMS_TABLES
    make_room(a, "same-id", "in A")
    make_room(b, "same-id", "in B")
    assert say(a, "same-id", "a-1")["seq"] == 1
    assert say(a, "same-id", "a-2")["seq"] == 2
    assert rooms.room_state(b, room_id="same-id")["name"] == "in B"
    assert rooms.read_events(b, room_id="same-id")["events"] == []
    assert [e["event_id"] for e in rooms.read_events(a, room_id="same-id")["events"]] == ["a-1", "a-2"]

    got: list[dict[str, Any]] = []
    follower = threading.Thread(target=lambda: got.append(next(iter(rooms.follow(b, "same-id")))))
    follower.start()
    time.sleep(0.3)
    say(b, "same-id", "b-1")
    follower.join(timeout=30)
    assert [(e["event_id"], e["seq"]) for e in got] == [("b-1", 1)]


def test_a_search_path_in_the_url_is_the_same_namespace(fleet: dict[str, Engine], fleet_url: str) -> None:
    by_url = hostedrooms.create_engine(with_search_path(fleet_url, "gw_b"))
    try:
        make_room(by_url, "r1", "through the URL")
        assert rooms.room_state(fleet["gw_b"], room_id="r1")["name"] == "through the URL"
        with by_url.connect() as one, fleet["gw_b"].connect() as other:
            assert backend_for(one).namespace(one) == backend_for(other).namespace(other) is not None
        with fleet["gw_a"].connect() as third:
            assert backend_for(third).namespace(third) != backend_for(one).namespace(one)
    finally:
        by_url.dispose()


def test_a_schema_translate_map_is_refused(fleet_url: str, fleet: dict[str, Engine]) -> None:
    translating = {"schema_translate_map": {None: "gw_a"}}
    with pytest.raises(StoreConfigurationError, match="schema_translate_map"):
        hostedrooms.create_engine(fleet_url, execution_options=translating)
    derived = fleet["gw_a"].execution_options(**translating)
    with pytest.raises(StoreConfigurationError, match="schema=NAME"):
        make_room(derived, "r1")
    with pytest.raises(StoreConfigurationError, match="schema_translate_map"):
        rooms.read_events(derived, room_id="r1")


@pytest.mark.parametrize("path", ["gw_a,gw_b", "gw_empty,gw_a"])
def test_a_search_path_resolving_to_another_or_two_hostedrooms_schemas_is_refused(
    fleet: dict[str, Engine], fleet_url: str, path: str
) -> None:
    with fleet["gw_a"].begin() as connection:
        connection.exec_driver_sql("CREATE SCHEMA IF NOT EXISTS gw_empty")
    engine = hostedrooms.create_engine(with_search_path(fleet_url, path))
    try:
        with pytest.raises(StoreConfigurationError, match="one gateway needs one schema"):
            make_room(engine, "r1")
    finally:
        engine.dispose()
    with pytest.raises(StoreConfigurationError, match="one gateway needs one schema"):
        migrate.upgrade(with_search_path(fleet_url, path))
    assert "hosted_rooms" not in tables_in(fleet["gw_a"], "gw_empty")  # nothing created beside gw_a's tables


def test_a_missing_schema_names_the_command_that_creates_it(fleet_url: str) -> None:
    engine = hostedrooms.create_engine(fleet_url, schema="gw_nowhere")
    try:
        with pytest.raises(SchemaMissingError, match=r"hostedrooms upgrade --schema gw_nowhere"):
            make_room(engine, "r1")
    finally:
        engine.dispose()
    # upgrade never advises itself: with a search_path naming no existing schema it says what to do instead.
    with pytest.raises(SchemaMissingError) as raised:
        migrate.upgrade(with_search_path(fleet_url, "gw_nowhere"))
    assert "run `hostedrooms upgrade`" not in str(raised.value)
    assert "--schema" in str(raised.value)


def test_upgrade_creates_the_schema_and_says_what_to_ask_for_without_the_privilege(
    fleet_url: str, fleet: dict[str, Engine]
) -> None:
    migrate.upgrade(fleet_url, schema="gw_created")
    assert migrate.is_at_head(fleet_url, schema="gw_created")
    role = testing.unique_name("fleet_role")
    with fleet["gw_a"].begin() as connection:
        connection.exec_driver_sql(f"CREATE ROLE {role} LOGIN PASSWORD 'pw'")
    try:
        url = sa.make_url(fleet_url).set(username=role, password="pw").render_as_string(hide_password=False)
        with pytest.raises(StoreConfigurationError, match="ask the database owner to CREATE SCHEMA gw_denied"):
            migrate.upgrade(url, schema="gw_denied")
    finally:
        with fleet["gw_a"].begin() as connection:
            connection.exec_driver_sql(f"DROP ROLE {role}")


@pytest.mark.parametrize("schema", ["pg_x", "1abc", 'a"b', "a b", "x" * 64, ""])
def test_schema_names_are_identifiers(fleet_url: str, schema: str) -> None:
    with pytest.raises(StoreConfigurationError, match="schema must be"):
        hostedrooms.create_engine(fleet_url, schema=schema)


def test_sqlite_has_no_schemas(tmp_path: Path) -> None:
    with pytest.raises(StoreConfigurationError, match="needs a database server with schemas"):
        hostedrooms.create_engine(tmp_path / "state.db", schema="gw_a")
    with pytest.raises(StoreConfigurationError, match="needs a database server with schemas"):
        migrate.upgrade(tmp_path / "state.db", schema="gw_a")
    assert not (tmp_path / "state.db").exists()


def test_the_cli_and_alembic_take_a_schema(
    fleet_url: str, fleet: dict[str, Engine], capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    code, _, err = run_cli(capsys, "upgrade", "--url", fleet_url, "--schema", "gw_cli")
    assert code == 0, err
    monkeypatch.setenv(migrate.SCHEMA_ENV, "gw_cli")
    code, _, err = run_cli(capsys, "check", "--url", fleet_url)
    assert code == 0, err
    from alembic import command
    config = migrate.alembic_config()
    config.cmd_opts = type("Options", (), {"x": [f"url={fleet_url}", "schema=gw_alembic"]})()  # type: ignore[assignment]
    monkeypatch.delenv(migrate.SCHEMA_ENV)
    command.upgrade(config, "head")
    assert migrate.is_at_head(fleet_url, schema="gw_alembic")


# --- item 2: isolation --------------------------------------------------------------------------------------------


def test_a_transaction_of_another_schema_holding_every_write_lock_does_not_delay_a_write(
    fleet: dict[str, Engine]
) -> None:
    a, b = fleet["gw_a"], fleet["gw_b"]
    make_room(a, "held")
    say(a, "held", "warm-up")  # (gw_a's budget shards are spread by its first append)
    make_room(b, "r1")
    say(b, "r1", "warm-up")
    held = ExitStack()
    holder = held.enter_context(UnitOfWork(a))
    try:
        for key in WRITE_KEYS:  # what a disband, a create_room, a ledger prepare or an upgrade holds
            holder.backend.advisory_lock(holder.connection, key)
        # And every budget shard of gw_a, as its exclusive append path holds them (rows of gw_a's own table).
        assert len(holder.connection.execute(sa.select(models.budget).with_for_update()).all()) == 8

        def writes() -> float:
            started = time.monotonic()
            say(b, "r1", "fast")  # the one-statement append, charging one of gw_b's shards
            make_room(b, "room-new")  # the room-creation lock
            rooms.disband_room(b, room_id="room-new", expected_gateway_id=GATEWAY, expected_epoch=1)
            return time.monotonic() - started

        pool = ThreadPoolExecutor(max_workers=1)
        try:
            assert pool.submit(writes).result(timeout=NOT_BLOCKED * 10) < NOT_BLOCKED
        finally:
            held.close()  # before the pool waits for a write blocked on it
            pool.shutdown()
    finally:
        held.close()


def test_budget_exact_per_schema_under_concurrent_writers_of_several_schemas(fleet: dict[str, Engine]) -> None:
    writers_per_schema = 3
    one_event = len("e-0-0-000") + len("message.user") + len('{"id":"u1","kind":"user"}') + len(
        '{"text":"' + "x" * 150 + '"}')
    allowed = 30
    tight = lowered(MAX_EVENT_JSON_BYTES=200, MAX_ACTOR_JSON_BYTES=100,
                    MAX_GATEWAY_EVENT_BYTES=allowed * one_event + one_event // 2)
    for engine in fleet.values():
        for index in range(writers_per_schema):
            make_room(engine, f"room-{index}")

    def worker(slot: int) -> tuple[str, int]:
        schema, index = SCHEMAS[slot % len(SCHEMAS)], slot // len(SCHEMAS)
        written = 0
        for n in range(1000):
            try:
                say(fleet[schema], f"room-{index}", f"e-{index}-{slot % 10}-{n:03d}", text="x" * 150, limits=tight)
            except HostedRoomError as exc:
                assert "storage is full on this host" in str(exc)
                return schema, written
            written += 1
        return schema, written

    results = run_together(worker, writers_per_schema * len(SCHEMAS))
    assert not [r for r in results if isinstance(r, Exception)], results
    for schema, engine in fleet.items():
        assert sum(written for owner, written in results if owner == schema) == allowed, results
        with engine.connect() as connection:
            total = connection.execute(sa.select(sa.func.sum(models.rooms.c.event_bytes))).scalar_one()
        assert total == allowed * one_event


def test_an_idle_follower_runs_no_statement_for_other_schemas_writes(fleet: dict[str, Engine]) -> None:
    a, b = fleet["gw_a"], fleet["gw_b"]
    make_room(a, "same-id")
    make_room(b, "same-id")
    statements: list[str] = []
    sa.event.listen(b, "before_cursor_execute", lambda *args: statements.append(args[2]))
    got: list[dict[str, Any]] = []

    def follow() -> None:
        got.append(next(iter(rooms.follow(b, "same-id", fallback_interval=120.0))))

    follower = threading.Thread(target=follow)
    follower.start()
    deadline = time.monotonic() + 10
    while not statements and time.monotonic() < deadline:  # its first read: it waits from then on
        time.sleep(0.05)
    time.sleep(0.5)
    before = len(statements)
    for n in range(20):  # same room id, other schema: a shared channel would wake gw_b's follower each time
        say(a, "same-id", f"a-{n}")
    with UnitOfWork(a) as uow:
        uow.backend.notify(uow.connection, LEDGER_WORK_CHANNEL, "delivery")
        uow.commit()
    time.sleep(1.0)
    assert statements[before:] == []
    say(b, "same-id", "b-1")
    follower.join(timeout=30)
    assert [e["event_id"] for e in got] == ["b-1"]


def test_ledger_work_of_another_schema_does_not_wake_a_worker(fleet: dict[str, Engine]) -> None:
    a, b = fleet["gw_a"], fleet["gw_b"]
    with Wakeup(b, LEDGER_WORK_CHANNEL) as wakeup:
        with UnitOfWork(a) as uow:
            uow.backend.notify(uow.connection, LEDGER_WORK_CHANNEL, "delivery")
            uow.commit()
        assert not wakeup.wait(1.0)
        with UnitOfWork(b) as uow:
            uow.backend.notify(uow.connection, LEDGER_WORK_CHANNEL, "delivery")
            uow.commit()
        assert wakeup.wait(10.0)


def test_a_migration_held_in_one_schema_does_not_delay_anothers(fleet: dict[str, Engine], fleet_url: str) -> None:
    pool = ThreadPoolExecutor(max_workers=1)
    try:
        with fleet["gw_a"].connect() as connection, connection.begin():
            backend_for(connection).lock_migrations(connection)  # an upgrade of gw_a in progress
            started = time.monotonic()
            pool.submit(migrate.upgrade, fleet_url, schema="gw_b").result(timeout=NOT_BLOCKED * 10)
            assert time.monotonic() - started < NOT_BLOCKED * 5  # an upgrade at head: connect, lock, read
    finally:
        pool.shutdown()  # after gw_a's lock is released


# --- item 5: errors -----------------------------------------------------------------------------------------------


def test_a_read_only_server_is_a_read_only_error(fleet: dict[str, Engine]) -> None:
    b = fleet["gw_b"]
    make_room(b, "r1")
    with b.connect() as connection:
        connection.exec_driver_sql("SET TRANSACTION READ ONLY")  # as every transaction on a hot standby
        with pytest.raises(sa.exc.DBAPIError) as raised:
            connection.execute(sa.update(models.rooms).values(name="x"))
    error = translate(raised.value, b.url)
    assert isinstance(error, StoreReadOnlyError) and isinstance(error, StoreConfigurationError)
    recovery = sa.exc.OperationalError("LISTEN x", {}, Exception("cannot execute LISTEN during recovery"))
    assert isinstance(translate(recovery, b.url), StoreReadOnlyError)


def test_a_poolers_startup_parameter_refusal_is_a_configuration_error() -> None:
    class ProtocolViolation(Exception):
        sqlstate = "08P01"

    refused = sa.exc.OperationalError(
        None, {}, ProtocolViolation('connection failed: ERROR:  unsupported startup parameter: options'))
    error = translate(refused, "postgresql://u@127.0.0.1:6432/bars")
    assert type(error) is StoreConfigurationError, error
    assert not isinstance(error, StoreUnavailableError)


@pytest.mark.parametrize("services", ["threads", "awaited"])
def test_async_engines_take_a_schema(fleet: dict[str, Engine], fleet_url: str, services: str) -> None:
    import asyncio

    from hostedrooms import aio

    make_room(fleet["gw_c"], "r1", "in C")
    make_room(fleet["gw_a"], "r1", "in A")

    async def main() -> tuple[str, list[str]]:
        engine = aio.create_async_engine(fleet_url, schema="gw_c", services=services)
        try:
            name = str((await aio.rooms.room_state(engine, room_id="r1"))["name"])
            events = aio.follow(engine, "r1", fallback_interval=120.0)
            waiting = asyncio.ensure_future(events.__anext__())
            await asyncio.sleep(0.5)
            await asyncio.to_thread(say, fleet["gw_a"], "r1", "a-1")  # another schema: not followed
            await asyncio.to_thread(say, fleet["gw_c"], "r1", "c-1")
            first = await asyncio.wait_for(waiting, 30)
            await events.aclose()
            return name, [str(first["event_id"])]
        finally:
            await engine.dispose()

    assert asyncio.run(main()) == ("in C", ["c-1"])


# --- the pytest plugin --------------------------------------------------------------------------------------------

SCHEMA_APP_TESTS = '''
from hostedrooms import create_engine, migrate, rooms

def test_the_fixtures_use_the_schema(hostedrooms_engine, hostedrooms_target, hostedrooms_schema):
    assert hostedrooms_schema == "gw_plugin"
    assert migrate.is_at_head(hostedrooms_engine)
    with hostedrooms_engine.connect() as connection:
        assert connection.exec_driver_sql("SELECT current_schema()").scalar() == "gw_plugin"
        assert connection.exec_driver_sql(
            "SELECT count(*) FROM information_schema.tables WHERE table_schema = 'public' "
            "AND table_name = 'hosted_rooms'").scalar() == 0
    by_target = create_engine(hostedrooms_target)  # what a facade builds from the target string: same schema
    try:
        rooms.create_room(by_target, room_id="r1", name="T", members=[], authority_gateway_id="install:g")
    finally:
        by_target.dispose()
    assert rooms.room_state(hostedrooms_engine, room_id="r1")["name"] == "T"
'''


def test_the_plugin_runs_in_a_schema(pytester: pytest.Pytester, pg_admin_url: str) -> None:
    pytester.makepyfile(SCHEMA_APP_TESTS)
    result = pytester.runpytest_subprocess(
        f"--hostedrooms-postgres-url={pg_admin_url}", "--hostedrooms-schema=gw_plugin", "-p", "no:cacheprovider")
    result.assert_outcomes(passed=1)


def test_ownership_probes_read_the_engines_schema(fleet: dict[str, Engine], fleet_url: str) -> None:
    make_room(fleet["gw_b"], "only-in-b")
    assert peers.probe_hosted_room(fleet["gw_b"], room_id="only-in-b")
    assert not peers.probe_hosted_room(fleet["gw_a"], room_id="only-in-b")
    assert peers.probe_hosted_room(with_search_path(fleet_url, "gw_b"), room_id="only-in-b")
    nowhere = hostedrooms.create_engine(fleet_url, schema="gw_nowhere")
    try:
        assert not peers.probe_hosted_room(nowhere, room_id="only-in-b")
    finally:
        nowhere.dispose()


def test_replicate_between_two_schemas_from_the_command_line(
    fleet: dict[str, Engine], fleet_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    make_room(fleet["gw_a"], "r1")
    say(fleet["gw_a"], "r1", "a-1")
    code, _, err = run_cli(capsys, "replicate", "--from", with_search_path(fleet_url, "gw_a"), "--to", fleet_url,
                           "--schema", "gw_b", "--gateway", "install:gw-b")
    assert code == 0, err
    for schema, expected in (("gw_b", 1), ("gw_a", 0), ("gw_c", 0)):
        with fleet[schema].connect() as connection:
            count = connection.execute(sa.select(sa.func.count()).select_from(models.replicas)).scalar_one()
        assert count == expected, schema


def test_upgrade_never_advises_itself(fleet_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    class NoSchemaSelected(Exception):
        sqlstate = "3F000"  # invalid_schema_name: what CREATE TABLE says when the search_path names no schema

    def fail(*_args: Any) -> None:
        raise sa.exc.ProgrammingError("CREATE TABLE", {}, NoSchemaSelected("no schema has been selected to create in"))

    monkeypatch.setattr(migrate, "_run_on", fail)
    with pytest.raises(SchemaMissingError) as raised:
        migrate.upgrade(fleet_url, schema="gw_a")
    assert "run `hostedrooms upgrade`" not in str(raised.value)
    assert "CREATE SCHEMA" in str(raised.value)
    with pytest.raises(SchemaMissingError, match="run `hostedrooms upgrade --schema gw_nowhere`"):  # elsewhere: say it
        migrate.current_revision(fleet_url, schema="gw_nowhere")


def test_several_processes_upgrade_their_own_schemas_at_once(fleet_url: str, fleet: dict[str, Engine]) -> None:
    import subprocess
    import sys

    schemas = [f"gw_proc_{index}" for index in range(4)]
    children = [subprocess.Popen(
        [sys.executable, "-m", "hostedrooms.cli", "upgrade", "--url", fleet_url, "--schema", schema],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for schema in schemas]
    for child in children:
        _, err = child.communicate(timeout=120)
        assert child.returncode == 0, err
    for schema in schemas:
        assert migrate.is_at_head(fleet_url, schema=schema)
        assert {"hosted_rooms", migrate.VERSION_TABLE} <= tables_in(fleet["gw_a"], schema)

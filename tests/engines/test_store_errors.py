"""Storage errors a caller can act on: transient (retry) versus configuration (fix it first), per real cause.

Each case is produced for real on the backend where it arises (a wrong password, a missing database, a host that
does not resolve, a closed port, a database never migrated, a lock held past the busy timeout, a full database,
a server terminating the session, a deadlock). A table-driven test covers the codes that are hard to provoke.
"""

from __future__ import annotations

import socket
import sqlite3
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from factories import connect_error
from sqlalchemy import Engine

from hostedrooms import (
    HostedRoomError,
    SchemaMissingError,
    StorageError,
    StoreAuthenticationError,
    StoreConfigurationError,
    StoreHostNotFoundError,
    StoreMissingError,
    StoreUnavailableError,
    UnitOfWork,
    migrate,
    rooms,
)
from hostedrooms.db import create_engine
from hostedrooms.errors import translate

MEMBERS = [{"id": "m1"}]
GATEWAY = "install:gw-a"


def _connect_error(url: str | sa.URL) -> StorageError:
    """What opening a unit of work on ``url`` raises (it must raise)."""
    error = connect_error(url)
    assert isinstance(error.__cause__, sa.exc.OperationalError)
    return error


def _assert_configuration(error: StorageError, kind: type[StoreConfigurationError]) -> None:
    assert type(error) is kind, repr(error)
    assert isinstance(error, StoreConfigurationError) and isinstance(error, HostedRoomError)
    assert not isinstance(error, StoreUnavailableError)  # a retry loop on StoreUnavailableError must not spin


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])  # nothing listens once the socket is closed


# --- configuration: PostgreSQL ---------------------------------------------------------------------------------


def test_wrong_password_is_an_authentication_error(pg_admin_url: str) -> None:
    url = sa.make_url(pg_admin_url).set(password="not-the-password-9b1")
    error = _connect_error(url)
    _assert_configuration(error, StoreAuthenticationError)
    assert "password authentication failed" in str(error)
    assert "not-the-password-9b1" not in str(error) and "***" in str(error)


def test_missing_database_is_a_missing_store(pg_admin_url: str) -> None:
    url = sa.make_url(pg_admin_url).set(database="hostedrooms_no_such_database")
    error = _connect_error(url)
    _assert_configuration(error, StoreMissingError)
    assert "hostedrooms_no_such_database" in str(error)


def test_unresolvable_host_is_a_configuration_error() -> None:
    host = "hostedrooms-test.invalid"  # RFC 6761: never resolves
    try:
        socket.getaddrinfo(host, 5432)
    except socket.gaierror as exc:
        resolver_says_temporary = exc.errno == socket.EAI_AGAIN  # a machine without any DNS server
    else:  # pragma: no cover - a resolver that answers for .invalid
        pytest.fail(f"{host} resolved")
    error = _connect_error(f"postgresql://alice:pw@{host}:5432/rooms")
    assert host in str(error)
    if resolver_says_temporary:
        assert type(error) is StoreUnavailableError  # what the resolver said: try again later
    else:
        _assert_configuration(error, StoreHostNotFoundError)


# --- transient: PostgreSQL -------------------------------------------------------------------------------------


@pytest.fixture
def pg_engine(pg_worker_url: str) -> Iterator[Engine]:
    """An engine on this worker's PostgreSQL database (these tests read no rows)."""
    engine = create_engine(pg_worker_url)
    yield engine
    engine.dispose()


def test_connection_refused_is_transient() -> None:
    error = _connect_error(f"postgresql://alice:pw@127.0.0.1:{_closed_port()}/rooms")
    assert type(error) is StoreUnavailableError
    assert "refused" in str(error).lower()


def test_server_terminating_the_session_is_transient(pg_admin_url: str, pg_engine: Engine) -> None:
    engine = pg_engine
    admin = create_engine(pg_admin_url)
    try:
        with pytest.raises(StoreUnavailableError) as caught, UnitOfWork(engine) as uow:
            pid = uow.execute(sa.select(sa.func.pg_backend_pid())).scalar_one()
            with admin.connect() as connection:
                assert connection.execute(sa.select(sa.func.pg_terminate_backend(pid))).scalar_one() is True
                _wait_until_gone(connection, pid)  # the server has sent its FATAL 57P01 and closed the session
            uow.execute(sa.select(1))
    finally:
        admin.dispose()
    assert getattr(caught.value.__cause__, "orig", None).sqlstate == "57P01"  # type: ignore[union-attr]
    assert "administrator command" in str(caught.value)
    # The connection was discarded: the next unit of work gets a fresh one and succeeds.
    with UnitOfWork(engine, write=False) as uow:
        assert uow.execute(sa.select(1)).scalar_one() == 1


def _wait_until_gone(connection: sa.Connection, pid: int) -> None:
    activity = sa.table("pg_stat_activity", sa.column("pid"))
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        running = connection.execute(sa.select(sa.func.count()).select_from(activity)
                                     .where(activity.c.pid == pid)).scalar_one()
        connection.rollback()  # pg_stat_activity is a snapshot per transaction: look again in a new one
        if running == 0:
            return
        time.sleep(0.01)
    pytest.fail(f"backend {pid} still running")


def test_deadlock_is_transient(pg_engine: Engine) -> None:
    engine = pg_engine  # (SQLite serialises writers with BEGIN IMMEDIATE: it cannot deadlock)
    both_hold_one = threading.Barrier(2, timeout=30)
    outcomes: list[BaseException | None] = [None, None]

    def worker(index: int, first: int, second: int) -> None:
        try:
            with UnitOfWork(engine) as uow:
                uow.backend.advisory_lock(uow.connection, first)
                both_hold_one.wait()
                uow.backend.advisory_lock(uow.connection, second)  # each waits for the other: PostgreSQL aborts one
                uow.commit()
        except BaseException as exc:  # recorded for the assertion below
            outcomes[index] = exc

    threads = [threading.Thread(target=worker, args=(0, 101, 102)), threading.Thread(target=worker, args=(1, 102, 101))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    failed = [outcome for outcome in outcomes if outcome is not None]
    assert len(failed) == 1, outcomes
    assert type(failed[0]) is StoreUnavailableError and "deadlock" in str(failed[0])


# --- never migrated: both backends ------------------------------------------------------------------------------


def test_a_database_never_migrated_says_run_upgrade(empty_target: str) -> None:
    engine = create_engine(empty_target)
    try:
        with pytest.raises(SchemaMissingError) as caught:
            rooms.list_rooms(engine)
        with pytest.raises(SchemaMissingError):
            rooms.create_room(engine, room_id="r1", name="R", members=MEMBERS, authority_gateway_id=GATEWAY)
    finally:
        engine.dispose()
    _assert_configuration(caught.value, SchemaMissingError)
    assert "run `hostedrooms upgrade`" in str(caught.value)
    assert "hosted_rooms" in str(caught.value)  # the driver's reason: which table is missing


# --- SQLite: locked, full ---------------------------------------------------------------------------------------


def _migrated(tmp_path: Path) -> Path:
    path = tmp_path / "state.db"
    migrate.upgrade(path)
    return path


def test_sqlite_locked_past_the_busy_timeout_is_transient(tmp_path: Path) -> None:
    path = _migrated(tmp_path)
    holder = sqlite3.connect(path, isolation_level=None)
    holder.execute("BEGIN IMMEDIATE")  # another process's writer, holding the write lock
    engine = create_engine(path, busy_timeout=0.1)
    try:
        with pytest.raises(StoreUnavailableError, match="locked") as caught:
            rooms.create_room(engine, room_id="r1", name="R", members=MEMBERS, authority_gateway_id=GATEWAY)
        holder.execute("ROLLBACK")
        rooms.create_room(engine, room_id="r1", name="R", members=MEMBERS, authority_gateway_id=GATEWAY)  # retried
    finally:
        holder.close()
        engine.dispose()
    assert type(caught.value) is StoreUnavailableError


def test_sqlite_full_database_is_transient(tmp_path: Path) -> None:
    path = _migrated(tmp_path)
    engine = create_engine(path)
    rooms.create_room(engine, room_id="r1", name="R", members=MEMBERS, authority_gateway_id=GATEWAY)
    with engine.connect() as connection:
        pages = connection.exec_driver_sql("PRAGMA page_count").scalar_one()
    engine.dispose()
    engine = create_engine(path)

    @sa.event.listens_for(engine, "connect")
    def _cap(dbapi_connection: Any, _record: Any) -> None:  # the file may not grow: as good as a full disk
        dbapi_connection.execute(f"PRAGMA max_page_count={pages}")

    try:
        with pytest.raises(StoreUnavailableError, match="full") as caught:
            rooms.append_event(engine, room_id="r1", event_id="big", kind="message.user",
                               actor={"kind": "user", "id": "u"}, payload={"text": "x" * 200_000},
                               authority_gateway_id=GATEWAY, authority_epoch=1)
    finally:
        engine.dispose()
    assert type(caught.value) is StoreUnavailableError
    assert getattr(caught.value.__cause__, "orig", None).sqlite_errorname == "SQLITE_FULL"  # type: ignore[union-attr]
    engine = create_engine(path)
    try:
        assert "big" not in [e["event_id"] for e in rooms.read_events(engine, room_id="r1")["events"]]
    finally:
        engine.dispose()


def test_sqlite_file_that_is_not_a_database_is_a_configuration_error(tmp_path: Path) -> None:
    path = tmp_path / "notes.db"
    path.write_bytes(b"these are not the pages you are looking for" * 200)
    engine = create_engine(path)
    try:
        with pytest.raises(StoreConfigurationError, match="not a database") as caught, UnitOfWork(engine) as uow:
            uow.connection.exec_driver_sql("SELECT count(*) FROM sqlite_master")
    finally:
        engine.dispose()
    _assert_configuration(caught.value, StoreConfigurationError)


# --- classification table ---------------------------------------------------------------------------------------


class _DriverError(Exception):
    def __init__(self, text: str, *, sqlstate: str | None = None, sqlite_errorcode: int | None = None) -> None:
        super().__init__(text)
        if sqlstate is not None:
            self.sqlstate = sqlstate
        if sqlite_errorcode is not None:
            self.sqlite_errorcode = sqlite_errorcode


@pytest.mark.parametrize(("error", "expected"), [
    # PostgreSQL, by SQLSTATE
    (_DriverError("could not serialize access", sqlstate="40001"), StoreUnavailableError),
    (_DriverError("deadlock detected", sqlstate="40P01"), StoreUnavailableError),
    (_DriverError("could not extend file: No space left on device", sqlstate="53100"), StoreUnavailableError),
    (_DriverError("sorry, too many clients already", sqlstate="53300"), StoreUnavailableError),
    (_DriverError("the database system is starting up", sqlstate="57P03"), StoreUnavailableError),
    (_DriverError("terminating connection due to administrator command", sqlstate="57P01"), StoreUnavailableError),
    (_DriverError("canceling statement due to lock timeout", sqlstate="55P03"), StoreUnavailableError),
    (_DriverError("server closed the connection unexpectedly", sqlstate="08006"), StoreUnavailableError),
    (_DriverError('password authentication failed for user "a"', sqlstate="28P01"), StoreAuthenticationError),
    (_DriverError('no pg_hba.conf entry for host "10.0.0.1"', sqlstate="28000"), StoreAuthenticationError),
    (_DriverError('database "x" does not exist', sqlstate="3D000"), StoreMissingError),
    (_DriverError('relation "hosted_rooms" does not exist', sqlstate="42P01"), SchemaMissingError),
    (_DriverError('column "queued_id" does not exist', sqlstate="42703"), SchemaMissingError),
    (_DriverError("permission denied for table hosted_rooms", sqlstate="42501"), StoreConfigurationError),
    # PostgreSQL at connect time: text only
    (_DriverError('connection failed: FATAL:  role "nobody" does not exist'), StoreAuthenticationError),
    (_DriverError("fe_sendauth: no password supplied"), StoreAuthenticationError),
    (_DriverError("failed to resolve host 'db.example': [Errno -3] Temporary failure in name resolution"),
     StoreUnavailableError),
    (_DriverError("connection failed: FATAL:  the database system is shutting down"), StoreUnavailableError),
    # SQLite, by result code (extended codes keep their primary code in the low byte)
    (_DriverError("database is locked", sqlite_errorcode=5), StoreUnavailableError),
    (_DriverError("database is locked", sqlite_errorcode=5 | 2 << 8), StoreUnavailableError),  # BUSY_SNAPSHOT
    (_DriverError("database table is locked", sqlite_errorcode=6), StoreUnavailableError),
    (_DriverError("database or disk is full", sqlite_errorcode=13), StoreUnavailableError),
    (_DriverError("attempt to write a readonly database", sqlite_errorcode=8 | 1 << 8), StoreUnavailableError),
    (_DriverError("attempt to write a readonly database", sqlite_errorcode=8), StoreConfigurationError),
    (_DriverError("unable to open database file", sqlite_errorcode=14), StoreConfigurationError),
    (_DriverError("file is not a database", sqlite_errorcode=26), StoreConfigurationError),
    (_DriverError("no such table: hosted_rooms", sqlite_errorcode=1), SchemaMissingError),
    (_DriverError("disk I/O error", sqlite_errorcode=10), StoreUnavailableError),  # unknown: as before, transient
    (_DriverError("injected fault: disk I/O error"), StoreUnavailableError),
])
def test_classification(error: _DriverError, expected: type[StorageError]) -> None:
    translated = translate(sa.exc.OperationalError("SELECT 1", None, error), "postgresql://u:***@h/db")
    assert type(translated) is expected, translated
    assert str(error).splitlines()[0] in str(translated)


def test_unknown_programming_errors_stay_plain_storage_errors() -> None:
    translated = translate(sa.exc.ProgrammingError("SELECT", None, _DriverError("syntax error", sqlstate="42601")),
                           "x")
    assert type(translated) is StorageError


# --- an AsyncEngine passed by mistake ---------------------------------------------------------------------------


def _async_engine() -> Any:
    from sqlalchemy.ext.asyncio import create_async_engine

    return create_async_engine("postgresql+psycopg://alice:pw@127.0.0.1:1/rooms")  # never connected


def _ledger(engine: Any) -> Any:
    from hostedrooms.ledger import DeliveryLedger

    return DeliveryLedger(engine)


def _compat_ledger(engine: Any) -> Any:
    from hostedrooms.compat.secure_peer_delivery import SecurePeerDeliveryLedger

    return SecurePeerDeliveryLedger(engine)


def _compat_rooms(engine: Any) -> Any:
    from hostedrooms.compat import hosted_rooms

    return hosted_rooms.list_rooms(engine)


def _compat_replicas(engine: Any) -> Any:
    from hostedrooms.compat import hosted_room_replicas

    return hosted_room_replicas.replica_state(engine, room_id="r1")


def _peers(engine: Any) -> Any:
    from hostedrooms import peers

    return peers.list_room_link_records(engine)


def _probe(engine: Any) -> Any:
    from hostedrooms import peers

    return peers.probe_hosted_room(engine, room_id="r1")


def _replicas(engine: Any) -> Any:
    from hostedrooms import replicas

    return replicas.replica_state(engine, room_id="r1")


def _verify(engine: Any) -> Any:
    from hostedrooms import verify

    return verify(engine)


@pytest.mark.parametrize("call", [
    create_engine, migrate.upgrade, migrate.current_revision, UnitOfWork, rooms.list_rooms, _peers, _probe, _replicas,
    _ledger, _verify, _compat_rooms, _compat_replicas, _compat_ledger,
], ids=lambda call: getattr(call, "__name__", str(call)).lstrip("_"))
def test_an_async_engine_is_refused_clearly(call: Any) -> None:
    engine = _async_engine()
    with pytest.raises(HostedRoomError, match="synchronous SQLAlchemy Engine, not AsyncEngine") as caught:
        call(engine)
    assert "hostedrooms.create_engine" in str(caught.value)
    assert "pw" not in str(caught.value)


def test_a_service_given_something_else_than_an_engine_says_so() -> None:
    with pytest.raises(HostedRoomError, match="needs a SQLAlchemy Engine, not str"):
        rooms.list_rooms("state.db")  # type: ignore[arg-type]  # the native API takes an Engine

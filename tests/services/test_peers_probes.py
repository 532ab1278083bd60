"""Ownership probes: never create, migrate or block; a missing store or table answers False."""

from __future__ import annotations

import contextlib
import sqlite3
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from apis import use_api
from sqlalchemy import Engine

from hostedrooms import models, peers
from hostedrooms.db import create_engine
from hostedrooms.errors import HostedRoomError, RoomProbeUnavailableError

_api = use_api("peers")  # the tests on a database run on both APIs

NOW = 5_000.0
#: The issue's bound: a probe answers (or gives up) within half a second while another connection writes.
NO_BLOCK_SECONDS = 0.5


def add_room(engine: Engine, room_id: str, *, disbanded_at: float | None = None) -> None:
    with engine.begin() as connection:
        connection.execute(sa.insert(models.rooms).values(
            room_id=room_id, name=room_id, members_json="[]", authority_gateway_id="install:a", created_at=1.0,
            updated_at=1.0, disbanded_at=disbanded_at))


def reserve(engine: Engine, room_id: str = "room-1", profile: str = "alpha", expires_at: float = NOW + 100) -> None:
    peers.reserve_peer_room(engine, claims={
        "room_id": room_id, "member_id": "m1", "target_profile": profile, "authority_gateway_id": "install:a",
        "authority_epoch": 1}, expires_at=expires_at, now=NOW)


def probe_room(target: Any, room_id: str = "room-1") -> bool:
    return peers.probe_hosted_room(target, room_id=room_id)


def probe_reservation(target: Any, room_id: str = "room-1", profile: str = "alpha", now: float = NOW) -> bool:
    return peers.probe_peer_room_reservation(target, room_id=room_id, target_profile=profile, now=now)


def table_names(target: str) -> list[str]:
    engine = create_engine(target)
    try:
        return sorted(sa.inspect(engine).get_table_names())
    finally:
        engine.dispose()


@pytest.fixture(autouse=True)
def _fresh_probe_engines() -> Iterator[None]:
    yield
    peers.forget_probe_engines()  # each test's database is dropped or deleted afterwards


# --- answers -----------------------------------------------------------------------------------------


def test_room_probe_sees_only_live_rooms(target: str, engine: Engine) -> None:
    add_room(engine, "room-1")
    add_room(engine, "room-gone", disbanded_at=2.0)
    assert probe_room(target) is True
    assert probe_room(target, " room-1 ") is True
    assert probe_room(target, "room-gone") is False
    assert probe_room(target, "room-2") is False
    assert probe_room(engine) is True  # an Engine target works too (only its URL is used)


def test_reservation_probe_sees_only_live_reservations(target: str, engine: Engine) -> None:
    reserve(engine)
    reserve(engine, room_id="room-2")
    peers.revoke_room_grant_scope(engine, claims={
        "room_id": "room-2", "home_install_id": "h", "authority_gateway_id": "install:a", "authority_epoch": 1,
        "member_id": "m1", "target_install_id": "t", "target_profile": "alpha"}, expires_at=NOW + 50, now=NOW)
    assert probe_reservation(target) is True
    assert probe_reservation(target, profile="beta") is False
    assert probe_reservation(target, now=NOW + 100) is False
    assert probe_reservation(target, room_id="room-2") is False
    assert probe_reservation(engine) is True


def test_invalid_identifiers_are_refused_before_anything_is_opened(tmp_path: Path) -> None:
    missing = tmp_path / "nowhere" / "state.db"
    with pytest.raises(HostedRoomError, match="^invalid room_id$"):
        peers.probe_hosted_room(missing, room_id="")
    with pytest.raises(HostedRoomError, match="^target_profile must be a string$"):
        peers.probe_peer_room_reservation(missing, room_id="room-1", target_profile=None)
    assert not missing.parent.exists()


# --- never create, never migrate ---------------------------------------------------------------------


def test_missing_sqlite_file_answers_false_and_creates_nothing(tmp_path: Path) -> None:
    missing = tmp_path / "nowhere" / "state.db"
    assert probe_room(missing) is False
    assert probe_reservation(str(missing)) is False
    assert not missing.parent.exists()


def test_missing_postgresql_database_answers_false_and_creates_nothing(pg_admin_url: str) -> None:
    url = sa.make_url(pg_admin_url).set(database="hostedrooms_probe_never_created")
    assert probe_room(url.render_as_string(hide_password=False)) is False
    assert probe_reservation(url) is False
    admin = sa.create_engine(pg_admin_url)
    try:
        with admin.connect() as connection:
            names = connection.execute(sa.text("SELECT datname FROM pg_database")).scalars().all()
    finally:
        admin.dispose()
    assert "hostedrooms_probe_never_created" not in names


def _store_without_tables(backend: str, empty_target: str) -> None:
    if backend == "sqlite":  # a real SQLite file that holds none of our tables
        with contextlib.closing(sqlite3.connect(empty_target)) as raw:
            raw.execute("CREATE TABLE unrelated (x)")


def test_missing_tables_answer_false_and_nothing_is_created(backend: str, empty_target: str) -> None:
    _store_without_tables(backend, empty_target)
    before = table_names(empty_target)
    assert probe_room(empty_target) is False
    assert probe_reservation(empty_target) is False
    assert table_names(empty_target) == before


def test_probes_never_migrate_an_older_store(backend: str, empty_target: str) -> None:
    engine = create_engine(empty_target)
    try:
        with engine.begin() as connection:  # only the rooms table, as an old store would have
            models.rooms.create(connection)
        add_room(engine, "room-1")
    finally:
        engine.dispose()
    assert probe_room(empty_target) is True
    assert probe_reservation(empty_target) is False
    assert table_names(empty_target) == ["hosted_rooms"]


def test_a_file_that_is_not_a_database_is_unavailable(tmp_path: Path) -> None:
    junk = tmp_path / "junk.db"
    junk.write_bytes(b"this is definitely not a sqlite database" * 100)
    with pytest.raises(RoomProbeUnavailableError, match="^hosted room ownership is temporarily unavailable$"):
        probe_room(junk)
    with pytest.raises(RoomProbeUnavailableError, match="^peer room ownership is temporarily unavailable$"):
        probe_reservation(junk)


# --- never block -------------------------------------------------------------------------------------


@contextlib.contextmanager
def write_lock_held(backend: str, target: str, table: str) -> Iterator[None]:
    """Another connection holds the write lock: SQLite BEGIN EXCLUSIVE, PostgreSQL an exclusive table lock."""
    if backend == "sqlite":
        raw = sqlite3.connect(target, isolation_level=None)
        try:
            raw.execute("BEGIN EXCLUSIVE")
            raw.execute(f"DELETE FROM {table}")  # uncommitted: readers must not see it
            yield
            raw.execute("ROLLBACK")
        finally:
            raw.close()
        return
    engine = create_engine(target)
    try:
        with engine.connect() as connection:
            connection.begin()
            connection.execute(sa.text(f"LOCK TABLE {table} IN ACCESS EXCLUSIVE MODE"))
            yield
            connection.rollback()
    finally:
        engine.dispose()


def timed(probe: Callable[[], bool]) -> tuple[bool | RoomProbeUnavailableError, float]:
    started = time.monotonic()
    try:
        outcome: bool | RoomProbeUnavailableError = probe()
    except RoomProbeUnavailableError as exc:
        outcome = exc
    return outcome, time.monotonic() - started


@pytest.mark.parametrize("kind", ["room", "reservation"])
def test_probe_answers_fast_while_another_connection_holds_the_write_lock(
    backend: str, target: str, engine: Engine, kind: str
) -> None:
    if kind == "room":
        add_room(engine, "room-1")
        probe, table = (lambda: probe_room(target)), models.rooms.name
    else:
        reserve(engine)
        probe, table = (lambda: probe_reservation(target)), models.peer_reservations.name
    assert probe() is True  # warm: the probe engine exists before the lock is taken
    with write_lock_held(backend, target, table):
        outcome, elapsed = timed(probe)
    assert elapsed < NO_BLOCK_SECONDS
    if backend == "sqlite":  # WAL: a reader sees the last committed state despite the exclusive writer
        assert outcome is True
    else:  # an exclusive table lock: the probe gives up after its short lock timeout
        assert isinstance(outcome, RoomProbeUnavailableError)
        assert "temporarily unavailable" in str(outcome)
    assert probe() is True  # and works again once the lock is gone


@pytest.mark.parametrize("backend", ["sqlite"])
def test_sqlite_rollback_journal_exclusive_lock_is_unavailable_fast(target: str) -> None:
    with contextlib.closing(sqlite3.connect(target, isolation_level=None)) as raw:
        raw.execute("PRAGMA journal_mode=DELETE")  # an older store without WAL: writers block readers
    with contextlib.closing(sqlite3.connect(target, isolation_level=None)) as raw:
        raw.execute("INSERT INTO hosted_rooms (room_id, name, members_json, authority_gateway_id, created_at,"
                    " updated_at) VALUES ('room-1', 'r', '[]', 'install:a', 1, 1)")
        assert raw.execute("PRAGMA journal_mode").fetchone()[0] == "delete"
    with write_lock_held("sqlite", target, models.rooms.name):
        outcome, elapsed = timed(lambda: probe_room(target))
    assert elapsed < NO_BLOCK_SECONDS
    assert isinstance(outcome, RoomProbeUnavailableError)
    assert probe_room(target) is True


@pytest.mark.parametrize("backend", ["postgresql"])
def test_postgresql_row_lock_does_not_block_the_probe(target: str, engine: Engine) -> None:
    add_room(engine, "room-1")
    reserve(engine)
    assert probe_room(target) is True
    with engine.connect() as holder:
        holder.begin()
        rooms, reservations = models.rooms, models.peer_reservations
        holder.execute(sa.update(rooms).where(rooms.c.room_id == "room-1").values(disbanded_at=9.0))
        holder.execute(sa.update(reservations).values(revoked_at=9.0))
        holder.execute(sa.select(rooms).with_for_update())
        for probe in (lambda: probe_room(target), lambda: probe_reservation(target)):
            outcome, elapsed = timed(probe)
            assert elapsed < NO_BLOCK_SECONDS
            assert outcome is True  # the last committed state
        holder.rollback()

"""Room links: atomic insert-or-replace, the link cap, status, deletion, secrecy of grants, file mode."""

from __future__ import annotations

import logging
import os
import stat
import threading
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from pathlib import Path
from typing import Any

import factories
import pytest
import sqlalchemy as sa
from apis import use_api
from factories import every_text
from sqlalchemy import Engine
from sqlalchemy.orm import Session

from hostedrooms import migrate, models, peers
from hostedrooms.db import create_engine
from hostedrooms.errors import HostedRoomError, StorageError

_api = use_api("peers")  # the tests on a database run on both APIs

GRANT = "grant-secret-7f3a9c"


link = partial(factories.link, target_url="https://peer.example/x", target_profile="alpha", grant=GRANT,
               status="ready")


def stored(engine: Engine) -> list[dict[str, Any]]:
    return peers.list_room_link_records(engine)


def test_upsert_then_list_returns_every_field(engine: Engine) -> None:
    peers.upsert_room_link_record(engine, record=link(), max_links=5)
    assert stored(engine) == [link()]


def test_upsert_replaces_every_field_of_an_existing_link(engine: Engine) -> None:
    peers.upsert_room_link_record(engine, record=link(), max_links=5)
    replacement = link(
        target_url="https://other.example/y", target_profile="beta", grant="rotated-grant", catalog_json='{"a":1}',
        cancellation_scope_id="scope-2", trace_id="trace-2", transport_security="mtls", status="degraded",
        updated_at=99.5)
    peers.upsert_room_link_record(engine, record=replacement, max_links=1)  # at the cap: a replacement is fine
    assert stored(engine) == [replacement]


def test_max_links_counts_only_new_rows(engine: Engine) -> None:
    peers.upsert_room_link_record(engine, record=link("m1"), max_links=2)
    peers.upsert_room_link_record(engine, record=link("m2"), max_links=2)
    peers.upsert_room_link_record(engine, record=link("m1", grant="rotated"), max_links=2)
    with pytest.raises(HostedRoomError, match="^too many stored room links$"):
        peers.upsert_room_link_record(engine, record=link("m3"), max_links=2)
    assert [(row["member_id"], row["grant"]) for row in stored(engine)] == [("m1", "rotated"), ("m2", GRANT)]


def test_list_orders_by_room_then_member_bytewise(engine: Engine) -> None:
    for room_id, member_id in [("room-b", "m2"), ("Room-z", "m1"), ("room-b", "M9"), ("room-a", "m1")]:
        peers.upsert_room_link_record(engine, record=link(member_id, room_id=room_id), max_links=10)
    assert [(row["room_id"], row["member_id"]) for row in stored(engine)] == [
        ("Room-z", "m1"), ("room-a", "m1"), ("room-b", "M9"), ("room-b", "m2")]


def test_update_status_sets_status_and_time_only_for_an_existing_link(engine: Engine) -> None:
    peers.upsert_room_link_record(engine, record=link(), max_links=5)
    assert peers.update_room_link_status(engine, room_id="room-1", member_id="m1", status="degraded", now=20) is True
    assert peers.update_room_link_status(engine, room_id="room-1", member_id="zz", status="degraded", now=21) is False
    assert stored(engine) == [link(status="degraded", updated_at=20.0)]


def test_delete_removes_only_that_rooms_links_and_counts_them(engine: Engine) -> None:
    for member_id in ("m1", "m2"):
        peers.upsert_room_link_record(engine, record=link(member_id), max_links=5)
    peers.upsert_room_link_record(engine, record=link("m1", room_id="room-2"), max_links=5)
    assert peers.delete_room_link_records(engine, room_id="room-1") == 2
    assert peers.delete_room_link_records(engine, room_id="room-1") == 0
    assert [row["room_id"] for row in stored(engine)] == ["room-2"]


@pytest.mark.parametrize("missing", peers.LINK_COLUMNS)
def test_missing_key_names_the_key_and_changes_nothing(engine: Engine, missing: str) -> None:
    peers.upsert_room_link_record(engine, record=link("m0"), max_links=5)
    record = link()
    del record[missing]
    with pytest.raises(HostedRoomError, match=f"^room link record is missing {missing}$") as caught:
        peers.upsert_room_link_record(engine, record=record, max_links=5)
    assert GRANT not in str(caught.value)
    assert [row["member_id"] for row in stored(engine)] == ["m0"]


@pytest.mark.parametrize(("record", "max_links", "message"), [
    (["not", "a", "mapping"], 5, "room link record must be a mapping"),
    (link(grant=123), 5, "room link grant must be a string"),
    (link(status=None), 5, "room link status must be a string"),
    (link(updated_at="soon"), 5, "room link updated_at must be a number"),
    (link(updated_at=float("nan")), 5, "room link updated_at must be a number"),
    (link(), "5", "max_links must be a number"),
    (link(), True, "max_links must be a number"),
])
def test_bad_input_is_refused_before_touching_the_store(
    engine: Engine, record: Any, max_links: Any, message: str
) -> None:
    with pytest.raises(HostedRoomError, match=f"^{message}$"):
        peers.upsert_room_link_record(engine, record=record, max_links=max_links)
    assert stored(engine) == []


def test_status_and_delete_refuse_non_string_keys(engine: Engine) -> None:
    peers.upsert_room_link_record(engine, record=link(), max_links=5)
    with pytest.raises(HostedRoomError, match="^room_id must be a string$"):
        peers.update_room_link_status(engine, room_id=None, member_id="m1", status="x")  # type: ignore[arg-type]
    with pytest.raises(HostedRoomError, match="^status must be a string$"):
        peers.update_room_link_status(engine, room_id="room-1", member_id="m1", status=3)  # type: ignore[arg-type]
    with pytest.raises(HostedRoomError, match="^room_id must be a string$"):
        peers.delete_room_link_records(engine, room_id=1)  # type: ignore[arg-type]
    assert stored(engine) == [link()]


# --- concurrency -------------------------------------------------------------------------------------


def _register_concurrently(engine: Engine, count: int, max_links: int) -> list[BaseException | None]:
    barrier = threading.Barrier(count, timeout=60)

    def register(index: int) -> BaseException | None:
        barrier.wait()
        try:
            peers.upsert_room_link_record(engine, record=link(f"m{index:02d}"), max_links=max_links)
        except HostedRoomError as exc:
            return exc
        return None

    with ThreadPoolExecutor(max_workers=count) as pool:
        return list(pool.map(register, range(count), timeout=120))


@pytest.mark.sync_api_only  # several threads call the services at once
def test_24_concurrent_link_registrations_all_persist(engine: Engine) -> None:
    outcomes = _register_concurrently(engine, 24, max_links=100)
    assert outcomes == [None] * 24
    assert [row["member_id"] for row in stored(engine)] == [f"m{index:02d}" for index in range(24)]


@pytest.mark.sync_api_only  # several threads call the services at once
def test_concurrent_registrations_never_exceed_the_cap(engine: Engine) -> None:
    outcomes = _register_concurrently(engine, 24, max_links=10)
    refused = [exc for exc in outcomes if exc is not None]
    assert len(refused) == 14
    assert all(str(exc) == "too many stored room links" for exc in refused)
    assert len(stored(engine)) == 10


# --- secrecy of grants -------------------------------------------------------------------------------


def test_room_link_model_repr_hides_the_grant() -> None:
    model = models.RoomLink(**link())
    assert GRANT not in repr(model)
    assert "room-1" in repr(model) and "m1" in repr(model)


def test_orm_loaded_room_link_repr_hides_the_grant(engine: Engine) -> None:
    peers.upsert_room_link_record(engine, record=link(), max_links=5)
    with Session(engine) as session:
        loaded = session.scalars(sa.select(models.RoomLink)).one()
        assert loaded.grant == GRANT
        assert GRANT not in repr(loaded) and GRANT not in str(loaded)


def test_store_error_during_a_link_write_never_contains_the_grant(
    engine: Engine, caplog: pytest.LogCaptureFixture
) -> None:
    # A unique index on trace_id makes the second insert fail inside the database, grant bound as a parameter.
    # Built on a detached Table: an Index on models.links would join the shared metadata for good.
    detached = sa.Table(models.links.name, sa.MetaData(), sa.Column("trace_id", sa.Text))
    index = sa.Index("test_links_unique_trace", detached.c.trace_id, unique=True)
    with engine.begin() as connection:
        index.create(connection)
    try:
        _check_store_error_hides_grant(engine, caplog)
    finally:  # the PostgreSQL test database is shared by later tests
        with engine.begin() as connection:
            index.drop(connection)


def _check_store_error_hides_grant(engine: Engine, caplog: pytest.LogCaptureFixture) -> None:
    peers.upsert_room_link_record(engine, record=link("m1", trace_id="same"), max_links=5)
    caplog.set_level(logging.DEBUG)
    caplog.set_level(logging.DEBUG, logger="sqlalchemy.engine")  # statement and row logging on
    with pytest.raises(StorageError) as caught:
        peers.upsert_room_link_record(engine, record=link("m2", trace_id="same"), max_links=5)
    assert "refused a write" in str(caught.value)
    assert GRANT not in every_text(caught.value)
    assert caught.value.__cause__ is None and caught.value.__context__ is None
    peers.list_room_link_records(engine)  # returns grants, but must not log them
    assert GRANT not in caplog.text
    assert [row["member_id"] for row in stored(engine)] == ["m1"]


def test_validation_error_while_a_record_holds_a_grant_never_contains_it(engine: Engine) -> None:
    record = link(updated_at=object())
    with pytest.raises(HostedRoomError) as caught:
        peers.upsert_room_link_record(engine, record=record, max_links=5)
    assert GRANT not in every_text(caught.value)


def test_cap_error_never_contains_the_grant(engine: Engine) -> None:
    with pytest.raises(HostedRoomError) as caught:
        peers.upsert_room_link_record(engine, record=link(), max_links=0)
    assert GRANT not in every_text(caught.value)


# --- SQLite file mode --------------------------------------------------------------------------------


def _mode(path: Path) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


def test_sqlite_store_is_owner_only_after_a_link_save(tmp_path: Path) -> None:
    path = tmp_path / "state.db"
    migrate.upgrade(path)
    os.chmod(path, 0o644)
    engine = create_engine(path)
    try:
        peers.upsert_room_link_record(engine, record=link(), max_links=5)
        assert _mode(path) == 0o600
        for suffix in ("-wal", "-shm"):
            sidecar = Path(f"{path}{suffix}")
            if sidecar.exists():
                assert _mode(sidecar) == 0o600
        os.chmod(path, 0o664)
        assert peers.update_room_link_status(engine, room_id="room-1", member_id="m1", status="down", now=1)
        assert _mode(path) == 0o600
    finally:
        engine.dispose()


@pytest.mark.sync_api_only  # os.stat is patched for the whole process: opening an engine there fails
def test_sqlite_link_save_fails_cleanly_when_the_mode_cannot_be_set(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "state.db"
    migrate.upgrade(path)
    engine = create_engine(path)

    def refuse(*_args: Any, **_kwargs: Any) -> None:
        raise PermissionError(1, "Operation not permitted")

    monkeypatch.setattr(os, "chmod", refuse)
    os_stat = os.stat
    monkeypatch.setattr(os, "stat", lambda p, *a, **k: os.stat_result((0o100644, *os_stat(p)[1:])))
    try:
        with pytest.raises(StorageError, match="cannot make the room store owner-only") as caught:
            peers.upsert_room_link_record(engine, record=link(), max_links=5)
        assert GRANT not in every_text(caught.value)
        monkeypatch.undo()
        assert peers.list_room_link_records(engine) == []  # rolled back: the grant was never committed
    finally:
        engine.dispose()

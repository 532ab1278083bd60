"""The unit of work: one transaction, rolled back unless committed; fenced writes; no lost updates."""

from __future__ import annotations

import multiprocessing
import time
from typing import Any

import pytest
import sqlalchemy as sa

from hostedrooms import AuthorityConflictError, StoreIntegrityError, StoreUnavailableError, UnitOfWork
from hostedrooms.db import create_engine
from hostedrooms.models import retired_ids, rooms


def _room_values(room_id: str = "r1", epoch: int = 1) -> dict[str, object]:
    return {"room_id": room_id, "name": "Room", "members_json": "[]", "authority_gateway_id": "install:a",
            "authority_epoch": epoch, "created_at": 1.0, "updated_at": 1.0}


def _count(engine: sa.Engine, table: sa.Table) -> int:
    with engine.connect() as connection:
        return int(connection.execute(sa.select(sa.func.count()).select_from(table)).scalar_one())


def test_rolls_back_unless_committed(engine: sa.Engine) -> None:
    with UnitOfWork(engine) as uow:
        uow.execute(sa.insert(retired_ids).values(room_id="gone", retired_at=1.0))
    assert _count(engine, retired_ids) == 0
    with UnitOfWork(engine) as uow:
        uow.execute(sa.insert(retired_ids).values(room_id="kept", retired_at=1.0))
        uow.commit()
    assert _count(engine, retired_ids) == 1


def test_rolls_back_on_error(engine: sa.Engine) -> None:
    with pytest.raises(RuntimeError, match="boom"), UnitOfWork(engine) as uow:
        uow.execute(sa.insert(retired_ids).values(room_id="gone", retired_at=1.0))
        raise RuntimeError("boom")
    assert _count(engine, retired_ids) == 0


def test_orm_session_shares_the_transaction(engine: sa.Engine) -> None:
    from hostedrooms.models import RetiredRoomId

    with UnitOfWork(engine) as uow:
        uow.session.add(RetiredRoomId(room_id="orm", retired_at=2.0))
        uow.session.flush()
        assert uow.execute(sa.select(retired_ids.c.room_id)).scalar_one() == "orm"
    assert _count(engine, retired_ids) == 0
    with UnitOfWork(engine) as uow:
        uow.session.add(RetiredRoomId(room_id="orm", retired_at=2.0))
        uow.commit()
    assert _count(engine, retired_ids) == 1


def test_lost_fence_raises_and_changes_nothing(engine: sa.Engine) -> None:
    with UnitOfWork(engine) as uow:
        uow.execute(sa.insert(rooms).values(**_room_values()))
        uow.commit()
    stale = (sa.update(rooms).where(rooms.c.room_id == "r1", rooms.c.authority_epoch == 7)
             .values(authority_epoch=8, name="stolen"))
    with pytest.raises(AuthorityConflictError, match="stale"), UnitOfWork(engine) as uow:
        uow.execute(sa.insert(retired_ids).values(room_id="side-effect", retired_at=1.0))
        uow.fenced(stale, AuthorityConflictError("stale hosted room authority"))
    with engine.connect() as connection:
        row = connection.execute(sa.select(rooms.c.name, rooms.c.authority_epoch)).one()
    assert tuple(row) == ("Room", 1)
    assert _count(engine, retired_ids) == 0
    fresh = sa.update(rooms).where(rooms.c.room_id == "r1", rooms.c.authority_epoch == 1).values(authority_epoch=2)
    with UnitOfWork(engine) as uow:
        uow.fenced(fresh, AuthorityConflictError("stale hosted room authority"))
        uow.commit()
    with engine.connect() as connection:
        assert connection.execute(sa.select(rooms.c.authority_epoch)).scalar_one() == 2


def test_driver_errors_are_translated(engine: sa.Engine) -> None:
    with UnitOfWork(engine) as uow:
        uow.execute(sa.insert(retired_ids).values(room_id="dup", retired_at=1.0))
        uow.commit()
    with pytest.raises(StoreIntegrityError) as caught, UnitOfWork(engine) as uow:
        uow.execute(sa.insert(retired_ids).values(room_id="dup", retired_at=2.0))
    assert isinstance(caught.value.__cause__, sa.exc.IntegrityError)
    assert isinstance(caught.value, ValueError)  # HostedRoomError keeps the seed's ValueError base


def _increment_worker(target: str, iterations: int) -> None:
    from hostedrooms.backends import backend_for

    engine = create_engine(target)
    for _ in range(iterations):
        with UnitOfWork(engine) as uow:
            select = uow.backend.for_update(sa.select(rooms.c.revision).where(rooms.c.room_id == "r1"))
            value = uow.execute(select).scalar_one()  # read ...
            uow.execute(sa.update(rooms).where(rooms.c.room_id == "r1").values(revision=value + 1))  # ... then write
            uow.commit()
    assert backend_for(engine) is not None
    engine.dispose()


def test_two_processes_read_then_write_lose_no_update(engine: sa.Engine, target: str) -> None:
    with UnitOfWork(engine) as uow:
        uow.execute(sa.insert(rooms).values(**_room_values()))
        uow.commit()
    iterations = 150
    context = multiprocessing.get_context("spawn")
    workers = [context.Process(target=_increment_worker, args=(target, iterations)) for _ in range(2)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join(timeout=120)
        assert worker.exitcode == 0
    with engine.connect() as connection:
        assert connection.execute(sa.select(rooms.c.revision)).scalar_one() == 1 + 2 * iterations


def test_sqlite_reads_do_not_take_the_write_lock(tmp_path: object) -> None:
    from pathlib import Path

    from hostedrooms import migrate

    path = Path(str(tmp_path)) / "locks.db"
    migrate.upgrade(path)
    engine = create_engine(path, busy_timeout=0.2)
    try:
        with UnitOfWork(engine) as writer:
            writer.execute(sa.insert(retired_ids).values(room_id="pending", retired_at=1.0))
            started = time.monotonic()
            with UnitOfWork(engine, write=False) as reader:  # deferred BEGIN: no wait for the writer
                assert reader.execute(sa.select(sa.func.count()).select_from(retired_ids)).scalar_one() == 0
            assert time.monotonic() - started < 0.2  # generous: it would otherwise wait out the busy timeout
            with pytest.raises(StoreUnavailableError, match="locked"), UnitOfWork(engine) as second_writer:
                second_writer.execute(sa.select(1))
    finally:
        engine.dispose()


def test_sqlite_a_read_unit_leaves_the_next_write_unit_on_its_connection_locking(tmp_path: object) -> None:
    """The deferred BEGIN of a read unit applies to that unit only, on the pooled connection it used."""
    import sqlite3
    from pathlib import Path

    from hostedrooms import migrate

    path = Path(str(tmp_path)) / "reuse.db"
    migrate.upgrade(path)
    engine = create_engine(path, busy_timeout=0.2, pool_size=1, max_overflow=0)  # one connection, reused
    other = sqlite3.connect(path, timeout=0, isolation_level=None)
    try:
        with UnitOfWork(engine, write=False) as reader:
            reader.execute(sa.select(1))
            other.execute("BEGIN IMMEDIATE")  # a deferred reader does not hold the write lock
            other.execute("ROLLBACK")
        with UnitOfWork(engine) as writer:
            writer.execute(sa.select(1))
            with pytest.raises(sqlite3.OperationalError, match="locked"):
                other.execute("BEGIN IMMEDIATE")
    finally:
        other.close()
        engine.dispose()


def _in_transaction(uow: UnitOfWork) -> bool:
    raw: Any = uow.connection.connection.dbapi_connection
    if hasattr(raw, "in_transaction"):  # sqlite3
        return bool(raw.in_transaction)
    return str(raw.info.transaction_status.name) != "IDLE"  # psycopg


def test_a_statement_snapshot_read_leaves_the_pooled_connection_transactional(
    engine: sa.Engine, backend: str
) -> None:
    """``statement_snapshots`` reads open no transaction on PostgreSQL (each statement is its own), a deferred read
    transaction on SQLite; either way the connection goes back to the pool as it came, so the next write unit on
    it is one transaction again."""
    engine = create_engine(engine.url, pool_size=1, max_overflow=0)  # one connection, reused
    try:
        with UnitOfWork(engine, write=False, statement_snapshots=True) as reader:
            assert reader.execute(sa.select(sa.func.count()).select_from(retired_ids)).scalar_one() == 0
            assert _in_transaction(reader) is (backend == "sqlite")
        with UnitOfWork(engine) as writer:
            writer.execute(sa.insert(retired_ids).values(room_id="gone", retired_at=1.0))
            assert _in_transaction(writer)
        assert _count(engine, retired_ids) == 0  # rolled back: it was one transaction
    finally:
        engine.dispose()

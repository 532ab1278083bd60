"""hostedrooms.aio: one implementation (every public service has its coroutine, with the synchronous signature),
create_async_engine (the synchronous engine's behaviour on aiosqlite and psycopg async), AsyncUnitOfWork (one
transaction, fenced updates, translated errors), migrations, and clear refusals of the wrong kind of engine."""

from __future__ import annotations

import asyncio
import inspect
import sqlite3
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from sqlalchemy import Engine
from sqlalchemy.ext.asyncio import create_async_engine as sa_create_async_engine

from hostedrooms import (
    AuthorityConflictError,
    HostedRoomError,
    StoreIntegrityError,
    StoreMissingError,
    aio,
    integrity,
    migrate,
    peers,
    replicas,
    rooms,
)
from hostedrooms.aio.ledger import AsyncDeliveryLedger
from hostedrooms.ledger import DeliveryLedger
from hostedrooms.models import retired_ids
from hostedrooms.models import rooms as rooms_table


def _public_services(module: Any) -> list[str]:
    names = getattr(module, "__all__", ["upgrade", "downgrade", "current_revision", "is_at_head"])
    return [name for name in names if inspect.isfunction(getattr(module, name))
            and list(inspect.signature(getattr(module, name)).parameters)[:1] in (["engine"], ["target"])]


@pytest.mark.parametrize(("sync", "asynchronous"), [
    (rooms, aio.rooms), (peers, aio.peers), (replicas, aio.replicas), (migrate, aio.migrate)],
    ids=lambda module: module.__name__)
def test_every_service_has_its_coroutine_with_the_same_signature(sync: Any, asynchronous: Any) -> None:
    names = [name for name in _public_services(sync) if name not in ("alembic_config", "follow")]
    assert names and not [name for name in names if not hasattr(asynchronous, name)]
    for name in names:
        mine, theirs = inspect.signature(getattr(asynchronous, name)), inspect.signature(getattr(sync, name))
        assert asyncio.iscoroutinefunction(getattr(asynchronous, name)), name
        assert list(mine.parameters.values())[1:] == list(theirs.parameters.values())[1:], name
        assert mine.return_annotation == theirs.return_annotation, name
        assert getattr(asynchronous, name).__doc__ == getattr(sync, name).__doc__, name


def test_every_ledger_method_has_its_coroutine() -> None:
    public = [name for name, value in inspect.getmembers(DeliveryLedger) if not name.startswith("_")
              and callable(value) and name != "work_wakeup"]
    missing = [name for name in public if not hasattr(AsyncDeliveryLedger, name)]
    assert public and missing == []
    opened, built = inspect.signature(aio.open_ledger), inspect.signature(DeliveryLedger)
    assert list(opened.parameters.values())[1:] == list(built.parameters.values())[1:]


def test_verify_is_derived_too() -> None:
    assert aio.verify.__doc__ == integrity.verify.__doc__
    assert list(inspect.signature(aio.verify).parameters)[1:] == ["progress", "expect_heads"]


def run(coroutine: Any) -> Any:
    return asyncio.run(coroutine)


async def _disposed(engine: Any, body: Callable[[Any], Any]) -> Any:
    try:
        return await body(engine)
    finally:
        await engine.dispose()


# --- create_async_engine -------------------------------------------------------------------------------------


def test_a_sqlite_path_is_aiosqlite_with_the_durable_settings(tmp_path: Path) -> None:
    async def body(engine: Any) -> tuple[Any, ...]:
        async with engine.connect() as connection:
            pragmas = tuple([(await connection.exec_driver_sql(f"PRAGMA {name}")).scalar()
                             for name in ("journal_mode", "synchronous", "busy_timeout", "foreign_keys")])
        return (engine.url.drivername, *pragmas)

    engine = aio.create_async_engine(tmp_path / "sub" / "state.db", busy_timeout=3)
    assert run(_disposed(engine, body)) == ("sqlite+aiosqlite", "wal", 2, 3000, 1)
    normal = aio.create_async_engine(tmp_path / "normal.db", synchronous="NORMAL")
    assert run(_disposed(normal, body))[2] == 1


def test_a_write_unit_holds_the_sqlite_write_lock_from_its_start(tmp_path: Path) -> None:
    path = tmp_path / "state.db"
    migrate.upgrade(path)

    async def body(engine: Any) -> None:
        async with aio.AsyncUnitOfWork(engine) as uow:
            await uow.execute(sa.select(rooms_table.c.room_id))  # a read first: BEGIN IMMEDIATE took the lock
            other = sqlite3.connect(path, timeout=0, isolation_level=None)
            try:
                with pytest.raises(sqlite3.OperationalError, match="locked"):
                    other.execute("BEGIN IMMEDIATE")
            finally:
                other.close()
        async with aio.AsyncUnitOfWork(engine, write=False) as uow:  # a read unit takes no write lock
            await uow.execute(sa.select(rooms_table.c.room_id))
            other = sqlite3.connect(path, timeout=0, isolation_level=None)
            try:
                other.execute("BEGIN IMMEDIATE")
                other.execute("ROLLBACK")
            finally:
                other.close()

    run(_disposed(aio.create_async_engine(path), body))


def test_bad_targets_are_refused_as_create_engine_refuses_them(tmp_path: Path, engine: Engine) -> None:
    with pytest.raises(StoreMissingError, match="does not exist"):
        aio.create_async_engine(tmp_path / "missing.db", create=False)
    assert not (tmp_path / "missing.db").exists()
    with pytest.raises(HostedRoomError, match="^unsupported database dialect 'mysql'"):
        aio.create_async_engine("mysql://u:secret@h/db")
    with pytest.raises(HostedRoomError, match="^synchronous must be one of"):
        aio.create_async_engine(tmp_path / "x.db", synchronous="OFF")
    with pytest.raises(HostedRoomError, match="not a synchronous Engine"):
        aio.create_async_engine(engine)  # type: ignore[arg-type]


def test_postgresql_urls_use_psycopg_async(pg_admin_url: str) -> None:
    engine = aio.create_async_engine(pg_admin_url.replace("postgresql+psycopg://", "postgresql://"))
    try:
        assert engine.url.drivername == "postgresql+psycopg_async"
    finally:
        run(engine.dispose())


def test_a_synchronous_engine_given_to_the_async_api_is_refused_clearly(engine: Engine) -> None:
    with pytest.raises(HostedRoomError, match="needs a SQLAlchemy AsyncEngine, not Engine") as caught:
        run(aio.rooms.list_rooms(engine))  # type: ignore[arg-type]
    assert "hostedrooms.aio.create_async_engine" in str(caught.value)
    with pytest.raises(HostedRoomError, match="needs a SQLAlchemy AsyncEngine, not str"):
        run(aio.rooms.list_rooms("state.db"))  # type: ignore[arg-type]


def test_an_adopted_async_engine_gets_hostedrooms_hooks(tmp_path: Path) -> None:
    path = tmp_path / "state.db"
    migrate.upgrade(path)

    async def body(engine: Any) -> Any:
        await aio.rooms.create_room(engine, room_id="r1", name="R", members=[], authority_gateway_id="install:a")
        async with aio.AsyncUnitOfWork(engine) as uow:
            return (await uow.execute(sa.text("PRAGMA synchronous"))).scalar()

    assert run(_disposed(sa_create_async_engine(f"sqlite+aiosqlite:///{path}"), body)) == 2


def test_migrations_and_verify_on_an_empty_database(empty_target: str) -> None:
    async def body(engine: Any) -> tuple[Any, ...]:
        before = await aio.migrate.current_revision(engine)
        await aio.migrate.upgrade(engine)
        return before, await aio.migrate.is_at_head(engine), await aio.verify(engine)

    assert run(_disposed(aio.create_async_engine(empty_target), body)) == (None, True, [])


# --- AsyncUnitOfWork ---------------------------------------------------------------------------------------


def test_a_unit_rolls_back_unless_committed_and_fences(engine: Engine) -> None:
    rooms.create_room(engine, room_id="r1", name="R", members=[], authority_gateway_id="install:a", now=1.0)
    fence = (sa.update(rooms_table).where(rooms_table.c.room_id == "r1", rooms_table.c.authority_epoch == 1)
             .values(updated_at=rooms_table.c.updated_at + 1))
    stale = sa.update(rooms_table).where(rooms_table.c.authority_epoch == 7).values(updated_at=0)

    async def body(async_engine: Any) -> None:
        async with aio.AsyncUnitOfWork(async_engine) as uow:
            await uow.fenced(fence, AuthorityConflictError("moved"))  # not committed: rolled back
        with pytest.raises(AuthorityConflictError, match="^moved$"):
            async with aio.AsyncUnitOfWork(async_engine) as uow:
                await uow.fenced(fence, AuthorityConflictError("unused"))
                await uow.fenced(stale, AuthorityConflictError("moved"))
                await uow.commit()
        async with aio.AsyncUnitOfWork(async_engine) as uow:
            await uow.fenced(fence, AuthorityConflictError("moved"))
            await uow.commit()
        with pytest.raises(StoreIntegrityError, match="refused a write"):  # a driver error, translated
            async with aio.AsyncUnitOfWork(async_engine) as uow:
                for _ in range(2):
                    await uow.execute(sa.insert(retired_ids).values(room_id="x", retired_at=1.0))
        async with aio.AsyncUnitOfWork(async_engine, write=False) as uow:
            assert await uow.run_sync(lambda unit: unit.connection.execute(
                sa.select(rooms_table.c.updated_at)).scalar_one()) == 2.0
            assert (await uow.connection.execute(sa.select(sa.func.count()).select_from(retired_ids))).scalar() == 0

    run(_disposed(aio.create_async_engine(engine.url), body))


def test_threads_and_awaited_calls_give_the_same_results(engine: Engine) -> None:
    rooms.create_room(engine, room_id="r1", name="R", members=[], authority_gateway_id="install:a", now=1.0)

    async def body(services: str) -> tuple[Any, ...]:
        async_engine = aio.create_async_engine(engine.url, services=services)
        try:
            appended = await aio.rooms.append_event(
                async_engine, room_id="r1", event_id=f"e-{services}", kind="message.user",
                actor={"kind": "user", "id": "u"}, payload={"by": services}, authority_gateway_id="install:a",
                authority_epoch=1, now=2.0)
            with pytest.raises(AuthorityConflictError) as caught:
                await aio.rooms.append_event(
                    async_engine, room_id="r1", event_id="stale", kind="message.user",
                    actor={"kind": "user", "id": "u"}, payload={}, authority_gateway_id="install:b", authority_epoch=1)
            page = await aio.rooms.read_events(async_engine, room_id="r1")
            return {**appended, "event_id": "-", "payload": "-", "seq": 0}, str(caught.value), page["authority"]
        finally:
            await async_engine.dispose()

    assert run(body("threads")) == run(body("awaited"))
    with pytest.raises(HostedRoomError, match="^services must be one of threads, awaited$"):
        aio.create_async_engine(engine.url, services="processes")


def test_disposing_the_async_engine_disposes_its_twin(engine: Engine) -> None:
    from hostedrooms.aio.engines import runner_of

    async def body() -> tuple[int, int]:
        async_engine = aio.create_async_engine(engine.url)
        await aio.rooms.list_rooms(async_engine)
        twin = runner_of(async_engine.sync_engine).engine
        before = twin.pool.checkedin()
        await async_engine.dispose()
        return before, twin.pool.checkedin()

    assert run(body()) == (1, 0)


def test_one_task_calling_in_turn_keeps_one_worker_thread(engine: Engine) -> None:
    # A worker counts itself free before it reports, so the next call of the same task finds it idle instead of
    # starting another thread (more threads would only take turns at the same connection pool).
    from hostedrooms.aio.engines import runner_for

    async def body() -> set[int]:
        async_engine = aio.create_async_engine(engine.url)
        try:
            runner = await runner_for(async_engine)
            return {await runner.run(threading.get_ident) for _ in range(500)}
        finally:
            await async_engine.dispose()

    assert len(run(body())) == 1

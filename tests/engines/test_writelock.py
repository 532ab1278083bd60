"""The SQLite write lock file (:mod:`hostedrooms.writelock`): where it lives, who takes it, and that every way a
write unit ends lets it go (an exception, a cancelled asyncio call, a fork).

"Another process" is played by a descriptor of the lock file opened here: ``flock`` locks belong to an open file
description, so a lock taken through a fresh descriptor excludes this process's own writers as another process's
would.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import os
import shutil
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from factories import USER, file_mode, make_room, run_together
from sqlalchemy import Engine
from waits import readable

import hostedrooms
from hostedrooms import aio, migrate, models, rooms, verify, writelock
from hostedrooms.errors import StoreUnavailableError
from hostedrooms.uow import UnitOfWork

GATEWAY = "install:gw-a"
BOUND = 30.0  # a generous bound: only proves that nothing blocks


@pytest.fixture
def path(tmp_path: Path) -> Path:
    database = tmp_path / "state.db"
    migrate.upgrade(database)
    return database


@pytest.fixture
def engine(path: Path) -> Iterator[Engine]:
    built = hostedrooms.create_engine(path, busy_timeout=0.5)
    make_room(built, "r1", gateway=GATEWAY)
    yield built
    built.dispose()


def _append(engine: Engine, event_id: str) -> Any:
    return rooms.append_event(engine, room_id="r1", event_id=event_id, kind="message.user", actor=USER,
                              payload={"text": event_id}, authority_gateway_id=GATEWAY, authority_epoch=1)


def _event_ids(engine: Engine) -> list[str]:
    with engine.connect() as connection:
        return list(connection.execute(sa.select(models.events.c.event_id).order_by(models.events.c.seq)).scalars())


def lock_is_free(database: Path) -> bool:
    """Whether another process could take the write lock now (tried through a fresh descriptor, then let go)."""
    fd = os.open(writelock.lock_file(str(database)), os.O_RDONLY | os.O_CLOEXEC)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    finally:
        os.close(fd)  # closing the only descriptor of this description lets the lock go
    return True


def soon_free(database: Path) -> bool:
    """Whether the lock is free within a generous bound (a waiter that gave up holds it for a moment when its
    ``flock`` returns, then lets go)."""
    deadline = time.monotonic() + BOUND
    while not lock_is_free(database):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True


@contextlib.contextmanager
def held_elsewhere(database: Path) -> Iterator[None]:
    """The write lock held as another process would hold it, for the block."""
    fd = os.open(writelock.lock_file(str(database)), os.O_RDONLY | os.O_CLOEXEC)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        yield
    finally:
        os.close(fd)


# --- where it lives, who takes it ---------------------------------------------------------------------------------


def test_the_lock_file_is_private_beside_the_database_and_only_writers_create_it(path: Path, tmp_path: Path) -> None:
    assert file_mode(Path(writelock.lock_file(str(path)))) == 0o600  # the migration wrote, so it took the lock
    copy = tmp_path / "copy.db"
    shutil.copy(path, copy)
    engine = hostedrooms.create_engine(copy)
    try:
        assert rooms.list_rooms(engine) == []  # reads never take it
        assert not Path(writelock.lock_file(str(copy))).exists()
        make_room(engine, "r1", gateway=GATEWAY)
        assert file_mode(Path(writelock.lock_file(str(copy)))) == 0o600
        assert lock_is_free(copy)
    finally:
        engine.dispose()


def test_in_memory_databases_and_a_missing_file_take_no_lock(tmp_path: Path) -> None:
    memory = hostedrooms.create_engine("sqlite://")
    assert writelock.take(memory) is None
    engine = hostedrooms.create_engine(tmp_path / "new.db")
    try:
        assert writelock.take(engine) is None  # no database yet: its first write creates it
        assert not Path(writelock.lock_file(str(tmp_path / "new.db"))).exists()
    finally:
        engine.dispose()


# --- held for the transaction, released however it ends --------------------------------------------------------


def test_a_write_unit_holds_the_lock_until_it_ends_even_by_an_exception(engine: Engine, path: Path) -> None:
    with pytest.raises(ZeroDivisionError), UnitOfWork(engine) as uow:
        uow.execute(sa.update(models.rooms).values(name="changed"))
        assert not lock_is_free(path)
        raise ZeroDivisionError
    assert lock_is_free(path)
    with UnitOfWork(engine, write=False) as uow:  # rolled back; a read unit takes no lock
        assert uow.execute(sa.select(models.rooms.c.name)).scalar_one() == "Team"
        assert lock_is_free(path)
    _append(engine, "e1")
    assert lock_is_free(path) and _event_ids(engine) == ["e1"]


def test_a_writer_waits_for_its_turn_then_writes(engine: Engine, path: Path) -> None:
    patient = hostedrooms.create_engine(path, busy_timeout=BOUND)
    outcome: list[Any] = []
    try:
        with held_elsewhere(path):
            thread = threading.Thread(target=lambda: outcome.append(_append(patient, "waited")))
            thread.start()
            thread.join(timeout=0.3)
            assert thread.is_alive() and outcome == []  # queued behind the holder
        thread.join(timeout=BOUND)
        assert not thread.is_alive() and outcome[0]["event_id"] == "waited"
    finally:
        patient.dispose()


def test_a_turn_that_does_not_come_within_the_busy_timeout_is_a_locked_store(engine: Engine, path: Path) -> None:
    with held_elsewhere(path):
        with pytest.raises(StoreUnavailableError, match="database is locked"):
            _append(engine, "e1")
    assert _event_ids(engine) == []
    assert soon_free(path)  # the helper that waited in vain lets go as soon as it gets the lock
    _append(engine, "e1")
    assert _event_ids(engine) == ["e1"]


def test_a_waiter_keeps_its_place_past_the_busy_timeout_while_the_queue_moves(engine: Engine, path: Path) -> None:
    outcome: list[Any] = []
    waiting = hostedrooms.create_engine(path, busy_timeout=1.0)
    thread = threading.Thread(target=lambda: outcome.append(_outcome(lambda: _append(waiting, "patient"))))
    try:
        with held_elsewhere(path):
            fd = os.open(writelock.lock_file(str(path)), os.O_RDWR | os.O_CLOEXEC)
            try:
                thread.start()
                for n in range(6):  # 1.8 s, past its busy timeout (1 s): turns end every 0.3 s meanwhile
                    thread.join(timeout=0.3)
                    os.pwrite(fd, n.to_bytes(16, "little"), 0)  # as each turn writes as it ends
                assert thread.is_alive() and outcome == []
            finally:
                os.close(fd)
        thread.join(timeout=BOUND)
    finally:
        waiting.dispose()
    assert not thread.is_alive() and outcome[0]["event_id"] == "patient"
    with held_elsewhere(path):  # the queue stands still: a busy timeout later the waiter gives up
        with pytest.raises(StoreUnavailableError, match="no writer ended its turn within the busy timeout"):
            _append(engine, "e2")


def _outcome(call: Any) -> Any:
    try:
        return call()
    except Exception as exc:  # the test thread reports it
        return exc


def test_threads_taking_their_first_turns_at_once_share_one_descriptor(path: Path, tmp_path: Path) -> None:
    copy = tmp_path / "fresh.db"  # a lock file this process has not opened yet
    shutil.copy(path, copy)
    engine = hostedrooms.create_engine(copy, busy_timeout=BOUND)

    def turns(_: int) -> int:
        for _ in range(50):
            lock = writelock.take(engine)
            assert lock is not None
            lock.release()
        return 0

    try:
        assert run_together(turns, 16) == [0] * 16
    finally:
        engine.dispose()
    assert lock_is_free(copy)
    opened = writelock._locks[writelock.lock_file(str(copy))]._fd
    assert opened is not None and os.fstat(opened).st_ino == os.stat(writelock.lock_file(str(copy))).st_ino


def test_a_nested_write_unit_of_the_same_thread_does_not_wait_for_itself(engine: Engine, path: Path) -> None:
    began = time.monotonic()
    with UnitOfWork(engine) as outer:
        outer.execute(sa.update(models.rooms).values(name="outer"))
        with pytest.raises(StoreUnavailableError):  # SQLite's busy timeout decides, as before the lock file
            _append(engine, "inner")
        outer.commit()
    assert time.monotonic() - began < BOUND
    assert lock_is_free(path) and _event_ids(engine) == []


def test_a_cancelled_asyncio_call_ends_its_turn(path: Path) -> None:
    async def main() -> list[bool]:
        async_engine = aio.create_async_engine(path)
        freed = []
        try:
            await aio.rooms.create_room(async_engine, room_id="r1", name="Team", members=[],
                                        authority_gateway_id=GATEWAY)
            with held_elsewhere(path):  # cancelled while it waits for its turn
                task = asyncio.create_task(_aio_append(async_engine, "waiting"))
                await asyncio.sleep(0.2)
                task.cancel()
            await asyncio.wait({task}, timeout=BOUND)
            freed.append(task.cancelled() and lock_is_free(path))
            for n in range(20):  # cancelled at moments within the call
                task = asyncio.create_task(_aio_append(async_engine, f"e{n}"))
                await asyncio.sleep(n * 0.0005)
                task.cancel()
                await asyncio.wait({task}, timeout=BOUND)
                freed.append(task.done() and lock_is_free(path))
        finally:
            await async_engine.dispose()
        return freed

    assert asyncio.run(main()) == [True] * 21
    assert verify(path) == []


async def _aio_append(async_engine: Any, event_id: str) -> Any:
    return await aio.rooms.append_event(async_engine, room_id="r1", event_id=event_id, kind="message.user",
                                        actor=USER, payload={"text": event_id}, authority_gateway_id=GATEWAY,
                                        authority_epoch=1)


# --- fork ------------------------------------------------------------------------------------------------------------


def test_a_forked_child_does_not_inherit_the_parents_turn(engine: Engine, path: Path) -> None:
    _append(engine, "e1")
    to_parent, from_child = os.pipe()
    to_child, from_parent = os.pipe()
    # The parent holds its turn, not a SQLite transaction: a child forked inside a transaction could never write
    # to the file (SQLite's own locks are process-wide state the child inherits: sqlite.org/howtocorrupt.html 2.6).
    turn = writelock.take(engine)
    assert turn is not None
    try:
        pid = os.fork()
        if pid == 0:  # the child: the parent's turn is not its own; it waits, then writes after the parent
            code = 1
            try:
                try:
                    _append(engine, "child-early")
                    code = 2
                except StoreUnavailableError:
                    os.write(from_child, b"1")
                    if readable(to_child, BOUND) and os.read(to_child, 1) == b"2":
                        _append(engine, "child")
                        code = 0
            finally:
                os._exit(code)
        assert readable(to_parent, BOUND) and os.read(to_parent, 1) == b"1"
    finally:
        turn.release()
    assert soon_free(path)  # the child's inherited descriptor does not keep the parent's lock
    os.write(from_parent, b"2")
    deadline = time.monotonic() + BOUND
    while (waited := os.waitpid(pid, os.WNOHANG))[0] == 0:
        assert time.monotonic() < deadline, "the child never ended"
        time.sleep(0.01)
    for fd in (to_parent, from_child, to_child, from_parent):
        os.close(fd)
    assert os.waitstatus_to_exitcode(waited[1]) == 0
    assert _event_ids(engine) == ["e1", "child"] and lock_is_free(path)


def test_a_lock_file_descriptor_is_closed_once_no_engine_uses_it(tmp_path: Path) -> None:
    """A process that opens many databases in turn (a test suite, a host's) keeps no descriptor for each."""
    import gc

    from hostedrooms import create_engine

    def fds() -> set[str]:
        return {os.readlink(f"/proc/self/fd/{fd}") for fd in os.listdir("/proc/self/fd")
                if os.path.exists(f"/proc/self/fd/{fd}")} if os.path.isdir("/proc/self/fd") else set()

    for index in range(20):
        engine = create_engine(str(tmp_path / f"s{index}.db"))
        migrate.upgrade(engine)
        make_room(engine, "r")
        assert writelock.lock_file(str(tmp_path / f"s{index}.db")) in fds()  # in use: kept
        engine.dispose()
        del engine
        gc.collect()
    last = tmp_path / "last.db"  # dropped descriptors are closed when the next lock file is opened
    engine = create_engine(str(last))
    migrate.upgrade(engine)
    make_room(engine, "r")
    open_locks = [path for path in fds() if path.endswith(writelock.LOCK_SUFFIX) and path.startswith(str(tmp_path))]
    assert open_locks == [writelock.lock_file(str(last))]
    engine.dispose()

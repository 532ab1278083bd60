"""The lone append on SQLite's held writer (``hostedrooms.rooms.transaction._writer_attempt``): a single append's
one-statement attempt as a write transaction of its own, with no unit of work around it.

It must be taken where it applies and nowhere else (a nested write of the thread, a busy writer, a declined
statement leave it to the unit of work), and every way it ends must release what it took: the process's turn on
the lock file, the fork gate, the held writer, and the transaction (rolled back, the connection dropped unless
clean), on the fast path (nothing observes the engine) and on SQLAlchemy's path (a listener installed).
The generated agreement with the unit-of-work and full paths is in tests/services/test_rooms_paths.py.
"""

from __future__ import annotations

import contextlib
import sqlite3
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from factories import USER, make_room
from sqlalchemy import Engine, event
from sqlalchemy import exc as sa_exc
from test_writelock import lock_is_free

import hostedrooms
from hostedrooms import forkgate, migrate, models, rooms, uow, verify, wakeup, writer
from hostedrooms.backends import backend_for
from hostedrooms.engine_profile import known_runtime
from hostedrooms.errors import HostedRoomError, StorageError
from hostedrooms.limits import in_force
from hostedrooms.rooms import transaction
from hostedrooms.statements import DirectConnection
from hostedrooms.store import room_store
from hostedrooms.store.rooms.sqlite import SQLiteRoomStore

GATEWAY = "install:gw-a"


@pytest.fixture
def path(tmp_path: Path) -> Path:
    database = tmp_path / "state.db"
    migrate.upgrade(database)
    return database


@pytest.fixture
def engine(path: Path) -> Iterator[Engine]:
    built = hostedrooms.create_engine(path, busy_timeout=0.5)
    make_room(built, "r1", gateway=GATEWAY)
    rooms.prune_disbanded_rooms(built)  # the budget spread (as the first write holding it leaves it)
    yield built
    built.dispose()


@pytest.fixture(params=["fast", "observed"])
def observed(request: pytest.FixtureRequest, engine: Engine) -> Iterator[list[str]]:
    """The statements SQLAlchemy's path saw (``observed``: a listener is installed, so everything takes it)."""
    seen: list[str] = []

    def saw(_conn: Any, _cursor: Any, statement: str, *_args: Any) -> None:
        seen.append(statement)

    if request.param == "observed":
        event.listen(engine, "before_cursor_execute", saw)
    yield seen
    if request.param == "observed":
        event.remove(engine, "before_cursor_execute", saw)


@pytest.fixture
def units(monkeypatch: pytest.MonkeyPatch) -> list[bool]:
    """One item per unit of work opened while the test ran (its ``write`` flag)."""
    opened: list[bool] = []
    original = uow.UnitOfWork.__enter__

    def counting(self: uow.UnitOfWork) -> Any:
        opened.append(self.write)
        return original(self)

    monkeypatch.setattr(uow.UnitOfWork, "__enter__", counting)
    return opened


def _append(engine: Engine, event_id: str, text: str = "hi") -> Any:
    return rooms.append_event(engine, room_id="r1", event_id=event_id, kind="message.user", actor=USER,
                              payload={"text": text}, authority_gateway_id=GATEWAY, authority_epoch=1, now=2000.0)


def _outcome(call: Callable[[], Any]) -> Any:
    try:
        return call()
    except HostedRoomError as exc:
        return type(exc).__name__, str(exc), type(exc.__cause__).__name__


def _seqs(engine: Engine) -> list[int]:
    with engine.connect() as connection:
        return list(connection.execute(sa.select(models.events.c.seq).order_by(models.events.c.seq)).scalars())


def _writer_of(engine: Engine) -> writer.HeldWriter:
    runtime = known_runtime(engine)
    held = None if runtime is None or runtime.writer_slot is None else runtime.writer_slot.writer
    assert isinstance(held, writer.HeldWriter)
    return held


def _all_released(engine: Engine, path: Path) -> None:
    """Nothing the attempt took is still held, and no transaction is left open on the writer's connection."""
    held = _writer_of(engine)
    assert lock_is_free(path)
    assert forkgate._depth() == 0 and forkgate._gate.inside == 0
    assert held.take(wait=False)  # free: neither this thread nor another holds it
    try:
        connection = held._connection
        assert connection is None or not connection.connection.dbapi_connection.in_transaction  # type: ignore[union-attr]
    finally:
        held.release()
    other = sqlite3.connect(path, isolation_level=None, timeout=0)
    try:  # SQLite's own write lock is free too
        other.execute("BEGIN IMMEDIATE")
        other.execute("ROLLBACK")
    finally:
        other.close()


def test_a_single_append_runs_without_a_unit_of_work_and_as_one_in_the_plain_way(
    engine: Engine, units: list[bool], observed: list[str]
) -> None:
    assert _append(engine, "e1")["seq"] == 1
    assert units == []  # the lone append: no unit of work
    assert not observed or any(text.startswith("INSERT INTO hosted_room_events") for text in observed)
    with writer.without_lone_appends():
        assert _append(engine, "e2")["seq"] == 2
    assert units == [True]
    units.clear()
    assert _append(engine, "e1")["idempotent"] is True  # declined (a stored id): the full path, in a unit
    assert units == [True]
    assert _seqs(engine) == [1, 2] and verify(engine) == []


def test_a_nested_append_or_a_busy_writer_leaves_it_to_the_unit_of_work(engine: Engine, units: list[bool]) -> None:
    with writer.without_held_writers():  # a pooled write unit holds the turn: the inner append takes none
        with uow.UnitOfWork(engine) as outer:
            outer.execute(sa.update(models.rooms).values(name="outer"))
            assert _outcome(lambda: _append(engine, "inner"))[0] == "StoreUnavailableError"
            outer.commit()
    assert len(units) == 2
    held = _writer_of(engine)
    units.clear()
    taken = threading.Event()
    release = threading.Event()

    def hold() -> None:  # another thread holds the writer (without a turn): this one must not wait for it twice
        assert held.take()
        taken.set()
        release.wait(timeout=30)
        held.release()

    thread = threading.Thread(target=hold)
    thread.start()
    try:
        assert taken.wait(timeout=30)
        store = room_store(backend_for(engine))
        assert transaction._writer_attempt(engine, store, in_force(None), "r1", [], GATEWAY, 2000.0) == (False, None)
    finally:
        release.set()
        thread.join(timeout=30)
    assert not thread.is_alive()
    assert _append(engine, "after")["seq"] == 1 and units == []


def _interrupt_after(monkeypatch: pytest.MonkeyPatch, where: str, error: BaseException) -> None:
    """Raise ``error`` at one step of the attempt (after that step did its work, where it does any)."""
    def after(original: Callable[..., Any]) -> Callable[..., Any]:
        def step(*args: Any, **kwargs: Any) -> Any:
            original(*args, **kwargs)
            raise error
        return step

    if where == "open":
        monkeypatch.setattr(writer.HeldWriter, "open", after(writer.HeldWriter.open))
    elif where == "begin":
        monkeypatch.setattr(DirectConnection, "begin_direct", after(DirectConnection.begin_direct))
        monkeypatch.setattr(DirectConnection, "begin", after(DirectConnection.begin))
    elif where == "statement":  # the room advanced and the budget charged: the event row not yet inserted
        monkeypatch.setattr(SQLiteRoomStore, "insert_written", after(SQLiteRoomStore.insert_written))
    elif where == "commit":  # before COMMIT runs
        def failing(*_args: Any, **_kwargs: Any) -> None:
            raise error
        monkeypatch.setattr(transaction, "commit_transaction", failing)
    elif where == "wakeup":  # committed already
        monkeypatch.setattr(transaction, "committed", after(wakeup.committed))


@pytest.mark.parametrize("where", ["open", "begin", "statement", "commit", "wakeup"])
@pytest.mark.parametrize("error", ["interrupt", "driver"])
def test_every_way_the_attempt_ends_releases_everything_it_took(
    engine: Engine, path: Path, observed: list[str], monkeypatch: pytest.MonkeyPatch, where: str, error: str
) -> None:
    assert _append(engine, "e1")["seq"] == 1
    raised: BaseException = KeyboardInterrupt() if error == "interrupt" else sa_exc.OperationalError(
        "COMMIT", None, sqlite3.OperationalError("disk I/O error"))
    with monkeypatch.context() as patched:
        _interrupt_after(patched, where, raised)
        expected: Any = KeyboardInterrupt if error == "interrupt" else StorageError
        with pytest.raises(expected):
            _append(engine, "e2")
    _all_released(engine, path)
    assert _seqs(engine) == ([1, 2] if where == "wakeup" else [1])  # committed only once COMMIT ran
    assert _append(engine, "e3")["seq"] == (3 if where == "wakeup" else 2)
    assert verify(engine) == []


def test_a_failed_commit_is_raised_as_a_unit_of_work_raises_it_and_drops_the_connection(
    engine: Engine, path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert _append(engine, "e1")["seq"] == 1
    original: Callable[..., None] = DirectConnection.end_direct

    def failing(self: DirectConnection, *, commit: bool) -> None:
        if commit:
            raise sa_exc.OperationalError("COMMIT", None, sqlite3.OperationalError("disk I/O error"))
        original(self, commit=commit)

    outcomes = []
    ways: tuple[Callable[[], contextlib.AbstractContextManager[None]], ...] = (
        contextlib.nullcontext, writer.without_lone_appends)
    for index, way in enumerate(ways):
        before = _writer_of(engine)._connection
        with monkeypatch.context() as patched, way():
            patched.setattr(DirectConnection, "end_direct", failing)
            outcomes.append(_outcome(lambda: _append(engine, "e-failed")))
        assert before is not None and (before.invalidated or before.closed)  # never lent again
        _all_released(engine, path)
        assert _append(engine, f"e-after-{index}")["seq"] == index + 2  # on a new held connection
        assert _writer_of(engine)._connection is not before
    assert outcomes[0] == outcomes[1] and outcomes[0][0] == "StoreUnavailableError", outcomes
    assert _seqs(engine) == [1, 2, 3] and verify(engine) == []

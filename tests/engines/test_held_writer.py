"""The held writer of a SQLite engine (hostedrooms/writer.py): write units on one held connection, hot statements
on its driver cursor, and the pooled path it replaces agree on everything stored and raised.

Each comparison runs the same calls twice, once as the services run them (the held writer) and once with
:func:`hostedrooms.writer.without_held_writers` (every write unit on a pooled connection, as before), and compares
results, errors (class, message and the driver error behind them) and rows. Then the held connection under
several processes and threads at once, a fork, an engine's dispose, a failed commit, and SQLAlchemy's cursor
events.
"""

from __future__ import annotations

import os
import random
import sqlite3
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, nullcontext
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from factories import make_room, run_together, snapshot
from sqlalchemy import Engine, event
from test_rooms_paths import _fresh, _limits, _operation, _outcomes
from waits import wait_child

import hostedrooms
from hostedrooms import create_engine, models, rooms, testing, verify, writer
from hostedrooms.engine_profile import known_runtime
from hostedrooms.errors import HostedRoomError
from hostedrooms.uow import UnitOfWork

GATEWAY = "g1"
USER = {"kind": "user", "id": "u1"}
WAYS: tuple[Callable[[], AbstractContextManager[None]], ...] = (nullcontext, writer.without_held_writers)


@pytest.fixture
def path(sqlite_template: Path, tmp_path: Path) -> str:
    """A migrated, empty SQLite file."""
    return testing.copy_template(sqlite_template, tmp_path / "state.db")


@pytest.fixture
def held(path: str) -> Iterator[Engine]:
    with testing.open_engine(path) as engine:
        yield engine


@pytest.fixture
def taken(monkeypatch: pytest.MonkeyPatch) -> dict[str, int]:
    """How many write units took the held writer while the test ran."""
    counts = {"held": 0}
    original = writer.take

    def counting(engine: Engine, **kwargs: Any) -> Any:
        found = original(engine, **kwargs)
        counts["held"] += found is not None
        return found

    monkeypatch.setattr(writer, "take", counting)
    return counts


def _append(engine: Engine, event_id: str, payload: Any = None, room_id: str = "r1") -> Any:
    return rooms.append_event(engine, room_id=room_id, event_id=event_id, kind="message.user", actor=USER,
                              payload={"text": "hi"} if payload is None else payload, authority_gateway_id=GATEWAY,
                              authority_epoch=1, now=2000.0)


def _outcome(call: Callable[[], Any]) -> Any:
    """The call's result, or what it raised: class, message, and the driver error behind it."""
    try:
        return call()
    except HostedRoomError as exc:
        cause = exc.__cause__
        original = getattr(cause, "orig", None)
        return (type(exc).__name__, str(exc), type(cause).__name__, type(original).__name__, str(original),
                getattr(original, "sqlite_errorcode", None))


def _seqs(engine: Engine, room_id: str = "r1") -> list[int]:
    with engine.connect() as connection:
        return list(connection.execute(sa.select(models.events.c.seq).where(models.events.c.room_id == room_id)
                                       .order_by(models.events.c.seq)).scalars())


def _writer_of(engine: Engine) -> Any:
    runtime = known_runtime(engine)
    assert runtime is not None and runtime.writer_slot is not None  # hostedrooms allowed this engine a writer
    return runtime.writer_slot.writer


# --- the same outcomes ---------------------------------------------------------------------------------------------


def test_held_and_pooled_write_units_agree_on_generated_sequences(held: Engine, taken: dict[str, int]) -> None:
    for seed in range(30):
        rng = random.Random(seed)
        operations = [_operation(rng) for _ in range(rng.randint(1, 20))]
        lim = _limits(rng)
        runs = []
        for way in WAYS:
            _fresh(held)
            with way():
                outcomes = _outcomes(held, operations, lim)
            runs.append((outcomes, snapshot(held, (models.rooms, models.events, models.retired_ids))))
        assert runs[0] == runs[1], seed
    assert taken["held"] > 0


def _blocked(engine: Engine, path: str) -> Any:
    """An append while another connection holds the write lock (the engine's busy timeout is short)."""
    blocker = sqlite3.connect(path, isolation_level=None)
    try:
        blocker.execute("BEGIN IMMEDIATE")
        return _outcome(lambda: _append(engine, "e-busy"))
    finally:
        blocker.close()


def _pragma_on_connect(engine: Engine, pragma: str) -> None:
    @event.listens_for(engine, "connect")
    def _set(dbapi_connection: Any, _record: Any) -> None:
        dbapi_connection.execute(pragma)


def _page_count(path: str) -> int:
    connection = sqlite3.connect(path)
    try:
        return int(connection.execute("PRAGMA page_count").fetchone()[0])
    finally:
        connection.close()


@pytest.mark.parametrize("case", ["busy", "read-only", "full", "nested"])
def test_errors_through_the_held_writer_are_translated_as_on_a_pooled_connection(
    sqlite_template: Path, tmp_path: Path, case: str, taken: dict[str, int]
) -> None:
    outcomes = []
    for way in WAYS:
        for leftover in tmp_path.glob("state.db*"):
            leftover.unlink()
        path = testing.copy_template(sqlite_template, tmp_path / "state.db")
        with testing.open_engine(path) as setup:
            make_room(setup, "r1", gateway=GATEWAY)
        engine = create_engine(path, busy_timeout=0.05)
        try:
            # (Connect hooks are added before the engine's first connection, as a host adds them.)
            if case == "read-only":
                _pragma_on_connect(engine, "PRAGMA query_only=1")
            elif case == "full":  # no page may be added: a large event needs some
                _pragma_on_connect(engine, f"PRAGMA max_page_count={_page_count(path)}")
            with way():
                if case == "busy":
                    found = _blocked(engine, path)
                elif case == "nested":  # a write unit inside this thread's own: the pooled path, locked out
                    with UnitOfWork(engine):
                        found = _outcome(lambda engine=engine: _append(engine, "e-nested"))
                else:
                    found = _outcome(lambda engine=engine: _append(engine, "e-big", {"text": "x" * 30_000}))
                outcomes.append(found)
                if case in ("busy", "nested"):  # the writer is free and sound again
                    assert _append(engine, "e-after")["seq"] == 1
        finally:
            engine.dispose()
    expected = {"busy": "StoreUnavailableError", "read-only": "StoreConfigurationError",
                "full": "StoreUnavailableError", "nested": "StoreUnavailableError"}[case]
    assert outcomes[0] == outcomes[1]
    assert outcomes[0][0] == expected, outcomes[0]
    assert taken["held"] > 0


def _failing_commit(engine: Engine) -> None:
    """A unit whose COMMIT fails: a deferred foreign key violated (an event of a room that does not exist)."""
    with UnitOfWork(engine) as uow:
        uow.connection.exec_driver_sql("PRAGMA defer_foreign_keys=ON")
        uow.connection.execute(sa.insert(models.events).values(
            room_id="absent", seq=1, event_id="x", kind="message.user", actor_json="{}", authority_epoch=1,
            payload_json="{}", created_at=1.0))
        uow.commit()


def test_a_failed_commit_drops_the_held_connection_and_raises_as_before(held: Engine) -> None:
    make_room(held, "r1", gateway=GATEWAY)
    _append(held, "e1")
    before = _writer_of(held)._connection
    outcomes = []
    for way in WAYS:
        with way():
            outcomes.append(_outcome(lambda: _failing_commit(held)))
    assert outcomes[0] == outcomes[1] and outcomes[0][0] == "StoreIntegrityError", outcomes
    assert before.invalidated or before.closed  # never lent again
    assert _append(held, "e2")["seq"] == 2  # on a new held connection
    assert _writer_of(held)._connection is not before
    assert _seqs(held) == [1, 2] and verify(held) == []


# --- the held connection's life ------------------------------------------------------------------------------------


def test_dispose_closes_the_held_connection_at_once_or_when_its_unit_ends(held: Engine) -> None:
    make_room(held, "r1", gateway=GATEWAY)
    _append(held, "e1")
    first = _writer_of(held)
    connection = first._connection
    held.dispose()
    assert connection.closed and first._connection is None
    assert _append(held, "e2")["seq"] == 2  # a new writer after the dispose
    second = _writer_of(held)
    assert second is not first
    # Disposed while a unit runs on it in another thread: closed when that unit ends, after it committed.
    inside, release = threading.Event(), threading.Event()

    def slow_unit() -> None:
        with UnitOfWork(held) as uow:
            uow.connection.execute(sa.update(models.rooms).values(name="renamed"))
            inside.set()
            release.wait(10)
            uow.commit()

    thread = threading.Thread(target=slow_unit)
    thread.start()
    assert inside.wait(10)
    busy = second._connection
    held.dispose()
    assert not busy.closed
    release.set()
    thread.join(10)
    assert busy.closed
    with held.connect() as check:
        assert check.execute(sa.select(models.rooms.c.name)).scalar_one() == "renamed"
    assert _seqs(held) == [1, 2] and verify(held) == []


CHILD = r"""
import sys, threading
from hostedrooms import create_engine, rooms
path, name, count = sys.argv[1], sys.argv[2], int(sys.argv[3])
engine = create_engine(path)
def work(thread):
    for n in range(count):
        rooms.append_event(engine, room_id="r1", event_id=f"{name}-{thread}-{n}", kind="message.user",
                           actor={"kind": "user", "id": "u1"}, payload={"n": n}, authority_gateway_id="g1",
                           authority_epoch=1)
threads = [threading.Thread(target=work, args=(t,)) for t in range(2)]
for t in threads: t.start()
for t in threads: t.join(120)
engine.dispose()
print("ok")
"""


def test_processes_and_threads_appending_to_one_file_lose_and_repeat_no_seq(held: Engine, path: str) -> None:
    make_room(held, "r1", gateway=GATEWAY)
    env = dict(os.environ, PYTHONPATH=str(Path(hostedrooms.__file__).resolve().parent.parent))
    children = [subprocess.Popen([sys.executable, "-c", CHILD, path, f"p{n}", "40"], stdout=subprocess.PIPE,
                                 stderr=subprocess.STDOUT, text=True, env=env) for n in range(3)]
    results = run_together(lambda index: [_append(held, f"t{index}-{n}")["seq"] for n in range(40)], 2)
    outputs = [child.communicate(timeout=120)[0] for child in children]
    assert all(child.returncode == 0 and out.strip().endswith("ok") for child, out in zip(children, outputs,
                                                                                          strict=True)), outputs
    assert all(isinstance(result, list) for result in results), results
    total = 3 * 2 * 40 + 2 * 40
    assert _seqs(held) == list(range(1, total + 1))
    with held.connect() as connection:
        ids = connection.execute(sa.select(models.events.c.event_id)).scalars().all()
    assert len(set(ids)) == total and verify(held) == []


@pytest.mark.skipif(not hasattr(os, "fork"), reason="no fork")
def test_a_forked_child_never_uses_nor_closes_the_parents_held_connection(held: Engine) -> None:
    make_room(held, "r1", gateway=GATEWAY)
    _append(held, "e1")
    parent = _writer_of(held)
    pid = os.fork()
    if pid == 0:  # the child: its own writer and connection; the parent's untouched
        code = 1
        try:
            _append(held, "child-1")
            _append(held, "child-2")
            ok = _writer_of(held) is not parent and parent._connection is not None and not parent._connection.closed
            code = 0 if ok else 2
        finally:
            os._exit(code)
    assert wait_child(pid, 60) == 0
    assert _writer_of(held) is parent
    _append(held, "e2")  # the parent's held connection still works
    assert _seqs(held) == [1, 2, 3, 4] and verify(held) == []


def test_cursor_listeners_see_every_statement_of_a_held_write(held: Engine) -> None:
    make_room(held, "r1", gateway=GATEWAY)
    _append(held, "e1")  # the held connection exists before the listener: it is noticed anyway
    seen: list[str] = []

    @event.listens_for(held, "before_cursor_execute")
    def _seen(_conn: Any, _cursor: Any, statement: str, *_args: Any) -> None:
        seen.append(statement.split()[0])

    _append(held, "e2")
    assert "UPDATE" in seen and "INSERT" in seen, seen
    assert _seqs(held) == [1, 2]

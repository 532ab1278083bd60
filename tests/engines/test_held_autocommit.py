"""The held autocommit connections of a PostgreSQL engine (hostedrooms/held_autocommit.py): the one-statement
append's first attempt on a connection per engine and thread, and its lifecycle (dispose, fork, a broken
connection, one left in a transaction or interrupted, threads that come and go, the observed and unobserved
paths), directly and (``any_room``) through PgBouncer in transaction mode, where the held connection is a client
connection to the pooler: no shard of its own, nothing prepared, a server lost under a statement or the pooler
gone dropping it as a lost server does. That the held path stores and raises what the pooled path and the full
path do is tests/services/test_rooms_paths.py's comparison (it runs all three) and, behind the pooler,
tests/engines/test_pooler_function.py's.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
import sqlalchemy as sa
from factories import make_room, message, run_together
from sqlalchemy import Engine, event
from test_fleet_pooler import emptied
from waits import wait_child

import hostedrooms
from hostedrooms import aio, errors, held_autocommit, models, pgcluster, rooms, verify
from hostedrooms.backends import backend_for, pooler_of
from hostedrooms.engine_profile import known_runtime
from hostedrooms.rooms import transaction
from hostedrooms.store import room_store

pytestmark = pytest.mark.parametrize("backend", ["postgresql"], indirect=True)


@pytest.fixture
def taken(monkeypatch: pytest.MonkeyPatch) -> dict[str, int]:
    """How many appends were lent a held connection (``held``) or not (``pooled``) while the test ran."""
    counts = {"held": 0, "pooled": 0}
    original = held_autocommit.take

    def counting(engine: Engine) -> Any:
        found = original(engine)
        counts["held" if found is not None else "pooled"] += 1
        return found

    monkeypatch.setattr(held_autocommit, "take", counting)
    return counts


@pytest.fixture
def full_paths(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The retries counted while the test ran (``room_write.full_path`` once per declined first attempt)."""
    seen: list[str] = []
    original = transaction.count_retry

    def counting(name: str) -> None:
        seen.append(name)
        original(name)

    monkeypatch.setattr(transaction, "count_retry", counting)
    return seen


def _held(engine: Engine) -> held_autocommit.HeldConnection:
    """The calling thread's held connection of ``engine`` (it must exist)."""
    runtime = known_runtime(engine)
    assert runtime is not None and runtime.held_autocommit is not None
    slot = runtime.held_autocommit.slot
    assert slot is not None
    return slot.held[threading.get_ident()]


def _raw(engine: Engine) -> Any:
    connection = _held(engine).connection
    assert connection is not None
    return connection.connection.dbapi_connection


def _shards(engine: Engine) -> dict[int, int]:
    with engine.connect() as connection:
        return dict(connection.execute(sa.select(models.budget.c.shard, models.budget.c.used)).all())


def _seqs(engine: Engine, room_id: str = "room-1") -> list[int]:
    page = rooms.read_events(engine, room_id=room_id, limit=500)
    return [item["seq"] for item in page["events"]]


@pytest.fixture
def room(engine: Engine) -> Iterator[Engine]:
    make_room(engine, "room-1")
    rooms.prune_disbanded_rooms(engine)  # spreads the gateway budget over the shards
    yield engine


@pytest.fixture
def bounced(backend: str, pgbouncer_url: str, pgbouncer_direct_url: str) -> Iterator[Engine]:
    """room-1 on an engine through PgBouncer (``pooler="transaction"``, its waiter direct), the budget spread."""
    emptied(pgbouncer_direct_url)
    engine = hostedrooms.create_engine(pgbouncer_url, pooler="transaction", listen_url=pgbouncer_direct_url)
    try:
        make_room(engine, "room-1")
        rooms.prune_disbanded_rooms(engine)
        yield engine
    finally:
        engine.dispose()


@pytest.fixture(params=["direct", "pgbouncer"])
def any_room(request: pytest.FixtureRequest, backend: str) -> Engine:
    """``room`` (direct) or ``bounced`` (through PgBouncer in transaction mode)."""
    engine: Engine = request.getfixturevalue("room" if request.param == "direct" else "bounced")
    return engine


def _behind_pooler(engine: Engine) -> bool:
    pooler = pooler_of(engine)
    return pooler is not None and pooler.mode == "transaction"


def test_appends_run_on_one_held_connection_charging_its_own_shard(room: Engine, taken: dict[str, int]) -> None:
    before = _shards(room)
    first = message(room, "room-1", "e1")
    pid = int(_raw(room).info.backend_pid)
    second = message(room, "room-1", "e2")
    assert (first["seq"], second["seq"]) == (1, 2) and taken == {"held": 2, "pooled": 0}
    assert int(_raw(room).info.backend_pid) == pid and held_autocommit.held_count(room) == 1
    assert room.pool.checkedout() == 0  # the services' pool was never asked
    after = _shards(room)
    own = pid % len(after)
    assert {shard for shard in after if after[shard] != before[shard]} == {own}
    size = len("e1") + len("message.user") + len('{"id":"u1","kind":"user"}') + len('{"text":"hi"}')
    assert after[own] - before[own] == 2 * size
    assert verify(room) == []


def test_a_short_own_shard_writes_nothing_and_the_full_path_appends(room: Engine, full_paths: list[str]) -> None:
    message(room, "room-1", "e1")
    own = int(_raw(room).info.backend_pid) % len(_shards(room))
    with room.begin() as connection:  # the held connection's shard has no room left; the others have
        connection.execute(sa.update(models.budget).where(models.budget.c.shard == own)
                           .values(allowance=models.budget.c.used))
    appended = message(room, "room-1", "e2")
    assert appended["seq"] == 2 and appended["idempotent"] is False
    assert full_paths == ["room_write.full_path"]
    assert _seqs(room) == [1, 2] and verify(room) == []


def test_dispose_closes_held_connections_at_once_or_when_their_attempt_ends(any_room: Engine) -> None:
    room = any_room
    message(room, "room-1", "e1")
    raw = _raw(room)
    room.dispose()
    assert raw.closed and held_autocommit.held_count(room) == 0
    message(room, "room-1", "e2")  # a new one is opened
    assert _raw(room) is not raw and not _raw(room).closed
    # Disposed while an attempt holds it: closed as the attempt ends, never under it.
    held = held_autocommit.take(room)
    assert held is not None
    connection = held.open()
    raw = connection.connection.dbapi_connection
    room.dispose()
    assert not raw.closed
    connection.exec_driver_sql("SELECT 1")
    held.release()
    assert raw.closed
    assert message(room, "room-1", "e3")["seq"] == 3 and verify(room) == []


def test_a_lost_server_raises_as_the_pooled_path_does_and_every_older_connection_is_dropped(room: Engine) -> None:
    message(room, "room-1", "e1")
    pid = int(_raw(room).info.backend_pid)
    others: list[Any] = []
    opened, lost = threading.Event(), threading.Event()

    def other_thread() -> None:  # another thread's held connection: opened before the loss, used again after it
        message(room, "room-1", "o1")
        others.append(_raw(room))
        opened.set()
        lost.wait(timeout=60)
        message(room, "room-1", "o2")
        others.append(_raw(room))

    thread = threading.Thread(target=other_thread)
    thread.start()
    try:
        assert opened.wait(timeout=60)
        with room.connect() as connection:
            assert connection.execute(sa.select(sa.func.pg_terminate_backend(pid))).scalar_one() is True
        with pytest.raises(hostedrooms.StoreUnavailableError):  # as a pooled unit whose connection was killed
            message(room, "room-1", "e2")
        assert _held(room).connection is None  # dropped
    finally:
        lost.set()
        thread.join(timeout=60)
    assert len(others) == 2 and others[1] is not others[0] and others[0].closed  # dropped at its next use
    assert message(room, "room-1", "e2")["seq"] == 4  # nothing was written by the failed call
    assert int(_raw(room).info.backend_pid) != pid
    # A pooled connection invalidated (as SQLAlchemy does when one finds its server gone): the held ones go too.
    raw = _raw(room)
    with room.connect() as connection:
        connection.invalidate()
    message(room, "room-1", "e3")
    assert _raw(room) is not raw and raw.closed
    assert _seqs(room) == [1, 2, 3, 4, 5] and verify(room) == []


def test_a_connection_left_in_a_transaction_or_interrupted_is_dropped(any_room: Engine) -> None:
    room = any_room
    message(room, "room-1", "e1")
    held = held_autocommit.take(room)
    assert held is not None
    raw = held.open().connection.dbapi_connection
    raw.execute("BEGIN")  # left in a transaction by the attempt
    held.release()
    assert held.connection is None  # dropped: rolled back (or closed) on its way back to the private pool
    assert raw.closed or raw.info.transaction_status == 0

    message(room, "room-1", "e2")

    def interrupt(*_args: Any) -> None:
        raise KeyboardInterrupt

    event.listen(room, "before_cursor_execute", interrupt)
    try:
        with pytest.raises(KeyboardInterrupt):
            message(room, "room-1", "e3")
    finally:
        event.remove(room, "before_cursor_execute", interrupt)
    assert _held(room).connection is None  # dropped, never reused
    with room.connect() as connection:  # and no transaction of it is left open on the server (nor of any other)
        states = connection.execute(sa.text(
            "SELECT state FROM pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid()"
        )).scalars().all()
    assert all(state not in ("idle in transaction", "active") for state in states), states
    assert message(room, "room-1", "e3")["seq"] == 3 and _seqs(room) == [1, 2, 3]


@pytest.mark.skipif(not hasattr(os, "fork"), reason="no fork")
def test_a_forked_child_never_uses_nor_closes_the_parents_held_connection(any_room: Engine) -> None:
    room = any_room
    message(room, "room-1", "e1")
    parent = _raw(room)
    pid = os.fork()
    if pid == 0:  # the child: its own connection; the parent's untouched
        code = 1
        try:
            message(room, "room-1", "child-1")
            message(room, "room-1", "child-2")
            code = 0 if _raw(room) is not parent and not parent.closed else 2
            room.dispose(close=False)  # SQLAlchemy's advice for a child: lets go of every inherited connection
            message(room, "room-1", "child-3")
            code = code or (0 if not parent.closed else 3)
        finally:
            os._exit(code)
    assert wait_child(pid, 60) == 0
    assert _raw(room) is parent and not parent.closed
    assert message(room, "room-1", "e2")["seq"] == 5  # the parent's held connection still works
    assert _seqs(room) == [1, 2, 3, 4, 5] and verify(room) == []


def test_threads_that_come_and_go_hold_no_more_than_the_pool_size(any_room: Engine, taken: dict[str, int]) -> None:
    room = any_room
    limit = room.pool.size()  # type: ignore[attr-defined]
    for wave in range(3):  # short-lived threads, three times as many as may be held
        results = run_together(lambda index, wave=wave: message(room, "room-1", f"w{wave}-{index}")["seq"], limit)
        assert not [r for r in results if isinstance(r, Exception)], results
        assert held_autocommit.held_count(room) <= limit
    assert taken == {"held": 3 * limit, "pooled": 0}  # exited threads' connections served the next ones
    # Threads alive holding every connection: one more takes the pooled path, and appends all the same.
    parked = threading.Event()
    ready = threading.Barrier(limit + 1, timeout=60)

    def park(index: int) -> None:
        message(room, "room-1", f"p-{index}")
        ready.wait()
        parked.wait(timeout=60)

    threads = [threading.Thread(target=park, args=(index,)) for index in range(limit)]
    for thread in threads:
        thread.start()
    try:
        ready.wait()
        assert message(room, "room-1", "extra")["idempotent"] is False
    finally:
        parked.set()
        for thread in threads:
            thread.join(timeout=60)
    assert taken["pooled"] == 1 and held_autocommit.held_count(room) == limit
    assert _seqs(room) == list(range(1, 4 * limit + 2)) and verify(room) == []


def test_observed_engines_run_the_held_statement_through_sqlalchemy(
    any_room: Engine, taken: dict[str, int], caplog: pytest.LogCaptureFixture
) -> None:
    room = any_room
    # Direct: the statement; behind the pooler: the call of the append function.
    first, logged = ("SELECT", "SELECT * FROM hostedrooms_append_one(") if _behind_pooler(room) else (
        "WITH", "WITH stored")
    message(room, "room-1", "e1")
    raw = _raw(room)
    seen: list[str] = []

    def cursor(_conn: Any, _cursor: Any, statement: str, *_args: Any) -> None:
        seen.append(statement.split()[0])

    event.listen(room, "before_cursor_execute", cursor)
    try:
        message(room, "room-1", "e2")
        assert seen == [first]  # the one statement, on SQLAlchemy's path
        # A replay answered by the statement, a conflict by the full path: the held connection stays clean.
        assert message(room, "room-1", "e2")["idempotent"] is True
        with pytest.raises(hostedrooms.EventConflictError):
            message(room, "room-1", "e2", text="other")
    finally:
        event.remove(room, "before_cursor_execute", cursor)
    count = len(seen)
    message(room, "room-1", "e3")
    assert len(seen) == count  # unobserved again: straight on the cursor
    with caplog.at_level(logging.INFO, logger="sqlalchemy.engine.Engine"):
        message(room, "room-1", "e4")
    assert any(record.getMessage().startswith(logged) for record in caplog.records)
    assert _raw(room) is raw and taken == {"held": 6, "pooled": 0}  # all on the one held connection
    assert not _held(room).connection.in_transaction()  # type: ignore[union-attr]
    assert _seqs(room) == [1, 2, 3, 4]


def test_the_asyncio_api_appends_on_its_twins_held_connections(target: str) -> None:
    async def append_twice() -> tuple[list[int], Engine]:
        async_engine = aio.create_async_engine(target)
        try:
            await aio.rooms.create_room(async_engine, room_id="room-1", name="Team", members=[],
                                        authority_gateway_id="g1")
            seqs = [(await aio.rooms.append_event(
                async_engine, room_id="room-1", event_id=f"e{n}", kind="message.user",
                actor={"kind": "user", "id": "u"},
                payload={"text": "hi"}, authority_gateway_id="g1", authority_epoch=1))["seq"] for n in (1, 2)]
            twin = (await aio.engines.runner_for(async_engine)).engine
            assert held_autocommit.held_count(twin) >= 1  # the worker threads', on the synchronous twin
            return seqs, twin
        finally:
            await async_engine.dispose()

    seqs, twin = asyncio.run(append_twice())
    assert seqs == [1, 2] and held_autocommit.held_count(twin) == 0  # disposed with the AsyncEngine


def test_only_engines_built_for_psycopg_hold_connections(target: str) -> None:
    def holds(engine: Engine) -> bool:
        runtime = known_runtime(engine)
        return runtime is not None and runtime.held_autocommit is not None

    built = hostedrooms.create_engine(target)
    pooled = hostedrooms.create_engine(target, pooler="transaction", listen_url=target)
    adopted = sa.create_engine(target.replace("postgresql://", "postgresql+psycopg://", 1))
    nullpool = hostedrooms.create_engine(target, poolclass=sa.pool.NullPool)
    async_engine = aio.create_async_engine(target)
    try:
        assert holds(built) and holds(pooled)  # behind a transaction pooler: client connections to it
        assert not holds(adopted) and not holds(nullpool)
        assert not holds(async_engine.sync_engine)
    finally:
        for engine in (built, pooled, adopted, nullpool):
            engine.dispose()
        async_engine.sync_engine.dispose()


def test_held_connections_sets_the_bound_and_zero_holds_none(target: str, taken: dict[str, int]) -> None:
    def limit(engine: Engine) -> int | None:
        runtime = known_runtime(engine)
        holder = None if runtime is None else runtime.held_autocommit
        return None if holder is None else int(holder.limit)

    default = hostedrooms.create_engine(target, pool_size=3)
    two = hostedrooms.create_engine(target, held_connections=2)
    none = hostedrooms.create_engine(target, held_connections=0)
    try:
        assert (limit(default), limit(two), limit(none)) == (3, 2, None)
        make_room(none, "room-0")
        assert message(none, "room-0", "e1")["seq"] == 1 and held_autocommit.held_count(none) == 0
        assert taken["held"] == 0
    finally:
        for engine in (default, two, none):
            engine.dispose()


@pytest.mark.parametrize("bad", [-1, True, 1.5, "2"])
def test_held_connections_refuses_what_is_not_a_count(target: str, bad: object) -> None:
    with pytest.raises(errors.InvalidInputError, match="held_connections"):
        hostedrooms.create_engine(target, held_connections=bad)  # type: ignore[arg-type]
    with pytest.raises(errors.InvalidInputError, match="held_connections"):
        aio.create_async_engine(target, held_connections=bad)  # type: ignore[arg-type]


# --- behind a transaction pooler ------------------------------------------------------------------------------


def test_behind_the_pooler_appends_run_on_the_held_client_connection_with_no_shard_of_its_own(
        bounced: Engine, taken: dict[str, int], monkeypatch: pytest.MonkeyPatch) -> None:
    """No pool checkout per append (the services' pool never asked), the function called with no shard chosen by
    the client (PgBouncer's startup key is no server process), nothing prepared; the plain pooled path checks a
    connection out per append; the budget stays exact."""
    checkouts: list[int] = []
    # The held connections' private pool, built at the first append, copies the engine pool's listeners.
    event.listen(bounced.pool, "checkout", lambda *_args: checkouts.append(1))
    own: list[int | None] = []
    original = type(room_store_of(bounced)).append_one_statement

    def recording(self: Any, *args: Any, **kwargs: Any) -> Any:
        own.append(self.own_shard)
        return original(self, *args, **kwargs)

    monkeypatch.setattr(type(room_store_of(bounced)), "append_one_statement", recording)
    message(bounced, "room-1", "e1")  # opens the thread's held connection (one checkout of the private pool)
    opened = len(checkouts)
    assert opened == 1 and held_autocommit.held_count(bounced) == 1
    assert _held(bounced).backend_pid is None and _raw(bounced).prepare_threshold is None
    for n in range(2, 7):
        message(bounced, "room-1", f"e{n}")
    assert len(checkouts) == opened and bounced.pool.checkedout() == 0  # type: ignore[attr-defined]
    with held_autocommit.without_held_connections():
        for n in range(7, 10):
            message(bounced, "room-1", f"e{n}")
    assert len(checkouts) == opened + 3  # one per append on the pooled path
    assert taken == {"held": 6, "pooled": 3} and own == [None] * 9
    assert _seqs(bounced) == list(range(1, 10)) and verify(bounced) == []


def room_store_of(engine: Engine) -> Any:
    return room_store(backend_for(engine))


def test_behind_the_pooler_a_server_lost_under_the_statement_raises_as_the_pooled_path_and_drops_the_held(
        bounced: Engine, pgbouncer_direct_url: str, taken: dict[str, int]) -> None:
    """The server connection PgBouncer ran the statement on is terminated while the statement waits for the room
    row: the held attempt raises what the pooled attempt raises (nothing written) and its connection is dropped;
    the next append works."""
    message(bounced, "room-1", "e1")
    direct = hostedrooms.create_engine(pgbouncer_direct_url)
    outcomes: dict[str, Any] = {}
    try:
        for way in ("held", "pooled"):
            with direct.connect() as locker:
                locker.execute(sa.select(models.rooms.c.room_id).where(models.rooms.c.room_id == "room-1")
                               .with_for_update())
                thread = threading.Thread(target=_append_then_again, args=(bounced, way, outcomes))
                thread.start()
                _terminate_the_waiting_backend(direct)
                locker.rollback()
            thread.join(timeout=60)
            assert not thread.is_alive()
    finally:
        direct.dispose()
    for way in ("held", "pooled"):  # the same error either way, and the next append of the thread works
        failed, _, after = outcomes[way]
        assert failed is hostedrooms.StoreUnavailableError and after is not None, outcomes
    assert outcomes["held"][1] is True and taken == {"held": 3, "pooled": 2}  # the held connection was dropped
    assert _seqs(bounced) == [1, 2, 3] and verify(bounced) == []  # the failed appends wrote nothing


def _append_then_again(engine: Engine, way: str, outcomes: dict[str, Any]) -> None:
    """On its own thread: an append that is to fail (its server terminated), then one that must work."""
    failed: type[BaseException] | None = None
    with contextlib.nullcontext() if way == "held" else held_autocommit.without_held_connections():
        try:
            message(engine, "room-1", f"lost-{way}")
        except hostedrooms.HostedRoomError as exc:
            failed = type(exc)
        runtime = known_runtime(engine)
        slot = None if runtime is None or runtime.held_autocommit is None else runtime.held_autocommit.slot
        held = None if slot is None else slot.held.get(threading.get_ident())
        dropped = held is None or held.connection is None
        after = message(engine, "room-1", f"after-{way}")["seq"]
    outcomes[way] = (failed, dropped, after)


def _terminate_the_waiting_backend(direct: Engine) -> None:
    """Terminate the one server backend waiting for a lock in this database (within a bounded wait)."""
    deadline = time.monotonic() + 60
    with direct.connect() as connection:
        while time.monotonic() < deadline:
            pids = connection.execute(sa.text(
                "SELECT pid FROM pg_stat_activity WHERE datname = current_database() AND wait_event_type = 'Lock'"
            )).scalars().all()
            connection.rollback()
            if pids:
                assert len(pids) == 1
                connection.execute(sa.select(sa.func.pg_terminate_backend(pids[0])))
                connection.commit()
                return
            time.sleep(0.02)
    raise AssertionError("no append waited for the room row")


def test_behind_the_pooler_the_pooler_gone_drops_the_held_connection_as_a_lost_server(
        backend: str, pg_admin_url: str, pgbouncer_direct_url: str) -> None:
    """PgBouncer stopped: the held connection's next statement fails as a pooled one would
    (StoreUnavailableError, nothing written), and the connection is dropped."""
    emptied(pgbouncer_direct_url)
    database = str(sa.make_url(pgbouncer_direct_url).database)
    bouncer = pgcluster.start_pgbouncer(pg_admin_url)
    engine = hostedrooms.create_engine(bouncer.url(database), pooler="transaction")
    try:
        make_room(engine, "room-1")
        message(engine, "room-1", "e1")
        assert _held(engine).connection is not None
    finally:
        bouncer.stop()
    try:
        with pytest.raises(hostedrooms.StoreUnavailableError):
            message(engine, "room-1", "e2")
        assert _held(engine).connection is None
    finally:
        engine.dispose()
    assert _seqs_of(pgbouncer_direct_url) == [1]


def _seqs_of(url: str) -> list[int]:
    engine = hostedrooms.create_engine(url)
    try:
        return _seqs(engine)
    finally:
        engine.dispose()

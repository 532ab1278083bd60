"""Observed and unobserved engines store and raise the same (issue 37, item 1).

While nothing observes an engine, hot statements (and a SQLite held writer's transaction) skip SQLAlchemy; once
anything does (a listener of the cursor or transaction events on the engine or the ``Engine`` class, a dialect
``handle_error``/``do_execute`` listener, statement logging), they run through SQLAlchemy's public execution
path (:mod:`hostedrooms.statements`). The same generated room operations and the ledger's scripted workload run
both ways here: the results, the errors with their messages and the rows left must be the same, and the cursor
listeners and the log must have seen the hot statements.
"""

from __future__ import annotations

import logging
import random
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import factories
import pytest
import sqlalchemy as sa
from sqlalchemy import Connection, Engine
from test_ledger_paths import SCRIPT
from test_ledger_paths import _run as _ledger_run
from test_rooms_paths import _fresh, _operation, _outcomes

from hostedrooms import models, rooms
from hostedrooms.statements import observed

Observer = Callable[[Engine, list[str]], Any]


def _statement_listener(target: Any, event: str) -> Observer:
    @contextmanager
    def observe(engine: Engine, seen: list[str]) -> Iterator[None]:
        def listener(*args: Any) -> None:
            conn = args[0]
            if conn.engine is engine:  # a class-level listener sees the other tests' engines too
                seen.append(str(args[2] if event.endswith("cursor_execute") else args[1]))

        sa.event.listen(target(engine), event, listener)
        try:
            yield
        finally:
            sa.event.remove(target(engine), event, listener)

    return observe


@contextmanager
def _handle_error(engine: Engine, seen: list[str]) -> Iterator[None]:
    def listener(context: Any) -> None:
        seen.append("error")

    sa.event.listen(engine, "handle_error", listener)
    try:
        yield
    finally:
        sa.event.remove(engine, "handle_error", listener)


class _Lines(logging.Handler):
    def __init__(self, seen: list[str]) -> None:
        super().__init__(logging.INFO)
        self.seen = seen

    def emit(self, record: logging.LogRecord) -> None:
        self.seen.append(record.getMessage())


@contextmanager
def _logging(engine: Engine, seen: list[str]) -> Iterator[None]:
    logger = logging.getLogger("sqlalchemy.engine.Engine")
    handler, level = _Lines(seen), logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    try:
        yield
    finally:
        logger.setLevel(level)
        logger.removeHandler(handler)


@contextmanager
def _do_execute(engine: Engine, seen: list[str]) -> Iterator[None]:
    def listener(_cursor: Any, statement: str, _parameters: Any, _context: Any) -> None:
        seen.append(statement)  # returns None: SQLAlchemy then executes as usual

    sa.event.listen(engine, "do_execute", listener)
    try:
        yield
    finally:
        sa.event.remove(engine, "do_execute", listener)


OBSERVERS: dict[str, Any] = {
    "engine-before-cursor": _statement_listener(lambda engine: engine, "before_cursor_execute"),
    "engine-class-after-cursor": _statement_listener(lambda engine: Engine, "after_cursor_execute"),
    "dialect-do-execute": _do_execute,
    "dialect-handle-error": _handle_error,
    "statement-logging": _logging,
    "engine-after-execute": _statement_listener(lambda engine: engine, "after_execute"),
    "connection-class-before-cursor": _statement_listener(lambda engine: Connection, "before_cursor_execute"),
}
#: Listeners the fast path does not look for (hostedrooms.statements): ``after_execute`` (SQLAlchemy does not call it
#: for ``exec_driver_sql``), listeners on the ``Connection`` class (the engine's dispatch does not hold them). They
#: see hostedrooms' other statements; stored rows and results are the same.
NOT_LOOKED_FOR = {"engine-after-execute", "connection-class-before-cursor"}
#: Observers that see no hot statement: those, and ``handle_error`` (errors only).
BLIND = {*NOT_LOOKED_FOR, "dialect-handle-error"}


def _rooms_run(engine: Engine, operations: list[tuple[Any, ...]]) -> tuple[Any, ...]:
    _fresh(engine)
    outcomes = _outcomes(engine, operations, None)
    reads = [rooms.read_events(engine, room_id=room_id, since_seq=0, include_disbanded=True)
             for room_id in ("r1", "r2")]
    listed = rooms.list_rooms(engine, include_disbanded=True)
    return outcomes, reads, listed, factories.snapshot(engine, (models.rooms, models.events, models.retired_ids))


@pytest.mark.parametrize("observer", OBSERVERS)
def test_room_operations_agree_observed_or_not(engine: Engine, observer: str) -> None:
    rng = random.Random(37)
    operations = [_operation(rng) for _ in range(40)]
    plain = _rooms_run(engine, operations)
    seen: list[str] = []
    with OBSERVERS[observer](engine, seen):
        with engine.connect() as connection:
            assert observed(connection) is (observer not in NOT_LOOKED_FOR)
        watched = _rooms_run(engine, operations)
    assert watched == plain
    with engine.connect() as connection:
        assert not observed(connection, transactions=True)  # the observer is gone: the fast path again
    if observer not in BLIND:
        assert any("INSERT INTO hosted_room_events" in line for line in seen), seen[:5]


@pytest.mark.parametrize("observer", ["engine-before-cursor", "statement-logging"])
def test_the_ledger_agrees_observed_or_not(engine: Engine, observer: str) -> None:
    plain = _ledger_run(engine, SCRIPT)
    seen: list[str] = []
    with OBSERVERS[observer](engine, seen):
        watched = _ledger_run(engine, SCRIPT)
    assert watched == plain
    assert any("UPDATE secure_peer_deliveries" in line for line in seen), seen[:5]


def test_a_listener_added_between_calls_sees_the_next_call(engine: Engine) -> None:
    rooms.create_room(engine, room_id="r1", name="Team", members=[], authority_gateway_id="g1")
    seen: list[str] = []
    with OBSERVERS["engine-before-cursor"](engine, seen):
        rooms.append_event(engine, room_id="r1", event_id="e1", kind="message.user",
                           actor={"kind": "user", "id": "u1"}, payload={"text": "hi"}, authority_gateway_id="g1",
                           authority_epoch=1)
    assert any("INSERT INTO hosted_room_events" in line for line in seen), seen
    seen.clear()
    rooms.append_event(engine, room_id="r1", event_id="e2", kind="message.user", actor={"kind": "user", "id": "u1"},
                       payload={"text": "hi"}, authority_gateway_id="g1", authority_epoch=1)
    assert seen == []  # removed: unobserved again


def test_a_unit_takes_one_path_and_forgets_it_when_it_ends(engine: Engine) -> None:
    from hostedrooms import statements
    from hostedrooms.models import retired_ids
    from hostedrooms.uow import UnitOfWork

    head = statements.HotStatement(sa.select(retired_ids.c.room_id).where(retired_ids.c.room_id == sa.bindparam("id")))
    seen: list[str] = []
    for write in (False, True):  # a pooled read unit; a write unit (SQLite: the held writer)
        with UnitOfWork(engine, write=write) as uow:
            assert head.first(uow.connection, {"id": "none"}) is None  # decided here: nothing observes
            with OBSERVERS["engine-before-cursor"](engine, seen):
                assert head.first(uow.connection, {"id": "none"}) is None  # added mid-unit: the next unit's
        assert seen == []
    with OBSERVERS["engine-before-cursor"](engine, seen), UnitOfWork(engine, write=False) as uow:
        head.first(uow.connection, {"id": "none"})
    assert any("retired" in line for line in seen), seen
    with pytest.raises(ZeroDivisionError), UnitOfWork(engine, write=False) as uow:
        head.first(uow.connection, {"id": "none"})
        raise ZeroDivisionError
    assert statements._units == {}  # every unit ended forgets its decision (no connection kept)

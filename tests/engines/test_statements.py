"""Hot statements: compiled once, run on the cursor, and still seen by listeners and translated like any other."""

from __future__ import annotations

from typing import Any

import pytest
import sqlalchemy as sa

from hostedrooms import StoreIntegrityError, StoreUnavailableError, UnitOfWork
from hostedrooms.models import retired_ids
from hostedrooms.statements import HotStatement

INSERT = HotStatement(sa.insert(retired_ids), column_keys=["room_id", "retired_at"])
# 0.5 is the statement's own literal: it must reach the driver without the caller passing it.
LATER_THAN = HotStatement(
    sa.select(retired_ids.c.room_id, retired_ids.c.retired_at)
    .where(retired_ids.c.retired_at > sa.bindparam("after") + 0.5)
    .order_by(retired_ids.c.retired_at))


def _rows(engine: sa.Engine) -> list[tuple[Any, ...]]:
    with engine.connect() as connection:
        return [tuple(row) for row in connection.execute(sa.select(retired_ids).order_by(retired_ids.c.room_id))]


def test_runs_one_and_many_rows_with_the_statements_own_literals(engine: sa.Engine) -> None:
    with UnitOfWork(engine) as uow:
        assert INSERT.rowcount(uow.connection, {"room_id": "a", "retired_at": 1}) == 1
        INSERT.run_many(uow.connection, [{"room_id": "b", "retired_at": 2.0}, {"room_id": "c", "retired_at": 3.0}])
        assert LATER_THAN.first(uow.connection, {"after": 1.0}) == ("b", 2.0)
        assert LATER_THAN.first(uow.connection, {"after": 2.6}) is None  # 3.0 is not above 2.6 + 0.5
        uow.commit()
    assert _rows(engine) == [("a", 1.0), ("b", 2.0), ("c", 3.0)]


def test_cursor_listeners_see_every_hot_statement(engine: sa.Engine) -> None:
    seen: list[tuple[str, bool]] = []

    def listen(_conn: Any, _cursor: Any, statement: str, _params: Any, _context: Any, many: bool) -> None:
        seen.append((statement.split()[0].upper(), many))

    sa.event.listen(engine, "before_cursor_execute", listen)
    try:
        with UnitOfWork(engine) as uow:
            INSERT.rowcount(uow.connection, {"room_id": "a", "retired_at": 1.0})
            INSERT.run_many(uow.connection, [{"room_id": "b", "retired_at": 2.0}, {"room_id": "c", "retired_at": 3.0}])
            LATER_THAN.first(uow.connection, {"after": 0.0})
    finally:
        sa.event.remove(engine, "before_cursor_execute", listen)
    assert seen == [("INSERT", False), ("INSERT", True), ("SELECT", False)]
    assert _rows(engine) == []  # never committed


def test_a_listener_refusing_a_hot_statement_rolls_the_unit_back(engine: sa.Engine) -> None:
    def refuse(*_args: Any) -> None:
        raise engine.dialect.loaded_dbapi.OperationalError("injected fault")

    def refused(run: Any) -> BaseException:
        with pytest.raises(Exception, match="injected fault") as caught, UnitOfWork(engine) as uow:
            run(uow.connection)
        return caught.value

    with UnitOfWork(engine) as uow:
        INSERT.rowcount(uow.connection, {"room_id": "kept", "retired_at": 1.0})
        uow.commit()
    sa.event.listen(engine, "before_cursor_execute", refuse)
    try:
        hot = refused(lambda connection: INSERT.rowcount(connection, {"room_id": "lost", "retired_at": 2.0}))
        core = refused(lambda connection: connection.execute(
            sa.insert(retired_ids).values(room_id="lost", retired_at=2.0)))
    finally:
        sa.event.remove(engine, "before_cursor_execute", refuse)
    # As SQLAlchemy raises it for any statement: wrapped and translated on 2.1, the listener's own error on 2.0.
    assert type(hot) is type(core)
    assert isinstance(hot, (StoreUnavailableError, engine.dialect.loaded_dbapi.OperationalError))
    assert _rows(engine) == [("kept", 1.0)]


def test_driver_errors_are_wrapped_translated_and_keep_parameters_out(engine: sa.Engine) -> None:
    secret = "room-id-twice"
    with UnitOfWork(engine) as uow:
        INSERT.rowcount(uow.connection, {"room_id": secret, "retired_at": 1.0})
        uow.commit()
    with pytest.raises(StoreIntegrityError) as caught, UnitOfWork(engine) as uow:
        INSERT.rowcount(uow.connection, {"room_id": secret, "retired_at": 2.0})
    assert isinstance(caught.value.__cause__, sa.exc.IntegrityError)
    assert "parameters hidden" in str(caught.value.__cause__)  # the engine's hide_parameters applies
    with pytest.raises(StoreIntegrityError), UnitOfWork(engine) as uow:
        INSERT.run_many(uow.connection, [{"room_id": "new", "retired_at": 1.0}, {"room_id": secret, "retired_at": 1.0}])
    assert _rows(engine) == [(secret, 1.0)]


def test_statements_that_compile_per_call_are_refused(engine: sa.Engine) -> None:
    listed = HotStatement(sa.select(retired_ids.c.room_id).where(retired_ids.c.room_id.in_(["a", "b"])))
    with pytest.raises(TypeError, match="one fixed text"), UnitOfWork(engine) as uow:
        listed.first(uow.connection, {})

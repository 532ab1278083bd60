"""What the contract classes share: the per-backend base class, events, room rows and bounded waits."""

from __future__ import annotations

import contextlib
import dataclasses
import threading
from collections.abc import Callable, Iterator
from typing import Any, ClassVar

import pytest
import sqlalchemy as sa
from sqlalchemy import Engine
from sqlalchemy import exc as sa_exc

from hostedrooms import models
from hostedrooms.backends import Backend, backend_for
from hostedrooms.db import create_engine
from hostedrooms.errors import translate
from hostedrooms.limits import LimitValues
from hostedrooms.uow import UnitOfWork

#: How long a contended lock may wait in these tests before the waiter gives up (seconds).
SHORT_WAIT = 0.2
#: A generous bound on work that must not block (seconds): reached only if it does block.
NOT_BLOCKING = 20.0


class OnBackend:
    """A contract's base: a subclass names its backend (``backend_name``), which overrides the parametrised
    ``backend`` fixture of ``tests/conftest.py``, so ``engine`` and ``target`` are that backend's."""

    backend_name: ClassVar[str]

    @pytest.fixture
    def backend(self) -> str:
        return self.backend_name

    @pytest.fixture
    def impl(self, engine: Engine) -> Backend:
        """The :class:`Backend` of the test's engine."""
        return backend_for(engine)

    @pytest.fixture
    def quick_engine(self, target: str) -> Iterator[Engine]:
        """A second engine on the same store whose SQLite lock waits end after :data:`SHORT_WAIT`."""
        engine = create_engine(target, busy_timeout=SHORT_WAIT)
        try:
            yield engine
        finally:
            engine.dispose()


@dataclasses.dataclass(frozen=True)
class Ev:
    """An event as the room store reads it (:class:`hostedrooms.store.rooms.EventLike`)."""

    event_id: str
    kind: str = "message.created"
    actor_json: str = '{"id":"u1","kind":"user"}'
    payload_json: str = '{"text":"hi"}'
    authority_epoch: int | None = 1
    control: bool = False

    @property
    def size(self) -> int:
        return sum(len(text.encode()) for text in (self.event_id, self.kind, self.actor_json, self.payload_json))


def room_values(room_id: str = "room-1", *, gateway: str = "gw-local", epoch: int = 1, now: float = 1000.0,
                **overrides: Any) -> dict[str, Any]:
    """Every column of a live room row with an empty log."""
    values = {"room_id": room_id, "name": "Team", "members_json": "[]", "authority_gateway_id": gateway,
              "authority_epoch": epoch, "next_seq": 1, "event_bytes": 0, "revision": 1, "created_at": now,
              "updated_at": now, "disbanded_at": None}
    return {**values, **overrides}


def lowered(**overrides: int) -> LimitValues:
    """The default limits with some lowered."""
    return dataclasses.replace(LimitValues.read(), **overrides)


def snapshot(engine: Engine, *tables: sa.Table) -> dict[str, list[tuple[Any, ...]]]:
    """Every row of ``tables`` (default: every hostedrooms table), sorted: what "wrote nothing" compares."""
    chosen = tables or tuple(models.metadata.sorted_tables)
    with UnitOfWork(engine, write=False) as uow:  # a read: no write lock (SQLite)
        return {table.name: sorted(tuple(row) for row in uow.connection.execute(sa.select(table)))
                for table in chosen}


def in_thread(work: Callable[[], Any]) -> Any:
    """Run ``work`` on another thread and return its result (or raise its error); fails if it does not finish
    within :data:`NOT_BLOCKING`."""
    outcome: dict[str, Any] = {}

    def run() -> None:
        try:
            outcome["value"] = work()
        except BaseException as exc:  # re-raised on the caller's thread
            outcome["error"] = exc

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(NOT_BLOCKING)
    assert not thread.is_alive(), f"blocked for over {NOT_BLOCKING} s"
    if "error" in outcome:
        raise outcome["error"]
    return outcome.get("value")


def contend(engine: Engine, work: Callable[[sa.Connection], Any]) -> Any:
    """``work(connection)`` in a new write transaction of ``engine`` (a :func:`OnBackend.quick_engine`) whose lock
    waits end after :data:`SHORT_WAIT`, on another thread, committed; its result, or its driver error translated
    (a lock it waited for past the bound: :class:`~hostedrooms.errors.StoreUnavailableError`)."""
    backend = backend_for(engine)

    def run() -> Any:
        with engine.connect() as connection:
            try:
                connection.begin()  # (SQLite: BEGIN IMMEDIATE is the wait)
                with backend.probe_timeouts(connection, SHORT_WAIT):
                    found = work(connection)
                connection.commit()
            except sa_exc.SQLAlchemyError as exc:
                raise translate(exc, engine.url) from exc
            return found

    return in_thread(run)


@contextlib.contextmanager
def listening(engine: Engine, channel: str) -> Iterator[Callable[[], list[str]]]:
    """Listen on ``channel`` in the engine's namespace (where the backend notifies) for the block; yields
    ``received(expected)``: the payloads received so far, waiting for the first at most :data:`NOT_BLOCKING` when
    one is ``expected``, else a short while (a check that none came). Where readers poll, it returns [] always."""
    backend = backend_for(engine)
    if not backend.notifies:
        yield lambda expected=False: []
        return
    with engine.connect() as connection:
        connection.execution_options(isolation_level="AUTOCOMMIT")
        connection.exec_driver_sql(backend.listen_statement(channel, backend.namespace(connection)))
        raw: Any = connection.connection.dbapi_connection

        def received(expected: bool = False) -> list[str]:
            wait = NOT_BLOCKING if expected else SHORT_WAIT
            return [notify.payload for notify in raw.notifies(timeout=wait, stop_after=1)]

        yield received

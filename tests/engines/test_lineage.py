"""A store's lineage (#26 item 4), on both backends without a failover: pages carry it, a resumed follower checks
its last event, the Replicator and the HTTP source validate it and refuse a source that lost a replica's events,
``verify`` checks remembered heads, and the driver errors of a hot standby and a dead primary are classified.
The failovers themselves (a streaming standby promoted) are in ``tests/engines/test_fleet_failover.py``."""

from __future__ import annotations

import contextlib
import re
from collections.abc import Hashable, Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
import sqlalchemy as sa
from factories import make_room, message, run_cli
from sqlalchemy import Engine
from sqlalchemy import exc as sa_exc

import hostedrooms
from hostedrooms import aio, integrity, models, rooms, testing
from hostedrooms.errors import (
    InvalidInputError,
    ReplicaError,
    StorageError,
    StoreLineageError,
    StoreReadOnlyError,
    StoreUnavailableError,
    translate,
)
from hostedrooms.replicas import validate_page
from hostedrooms.standby import EnginePageSource, Replicator
from hostedrooms.standby.http import HttpPageSource, PageServer
from hostedrooms.standby.replicator import CAUGHT_UP, REFUSED
from hostedrooms.standby.source import SourceProtocolError

ROOM = "room-1"


def _log(engine: Engine, count: int) -> list[dict[str, Any]]:
    make_room(engine, ROOM)
    return [message(engine, ROOM, f"e{n}", f"text {n}") for n in range(1, count + 1)]


def _rewrite(engine: Engine, seq: int, event_id: str, text: str) -> None:
    """Put another event at ``seq`` (what a promoted asynchronous standby's next append does to a lost seq)."""
    with engine.begin() as connection:
        connection.execute(sa.update(models.events).where(
            models.events.c.room_id == ROOM, models.events.c.seq == seq).values(
            event_id=event_id, payload_json=f'{{"text":"{text}"}}'))


# --- pages -----------------------------------------------------------------------------------------------------


def test_every_page_carries_the_stores_lineage(engine: Engine, backend: str) -> None:
    _log(engine, 2)
    page = rooms.read_events(engine, room_id=ROOM)
    pattern = r"sqlite" if backend == "sqlite" else r"postgresql:[0-9]+:[0-9]+"
    assert re.fullmatch(pattern, page["lineage"])
    assert rooms.read_events(engine, room_id=ROOM, since_seq=1)["lineage"] == page["lineage"]  # cached: the same


def test_the_lineage_is_read_once_per_pooled_connection(engine: Engine, backend: str) -> None:
    _log(engine, 1)
    statements: list[str] = []
    sa.event.listen(engine, "before_cursor_execute", lambda *args: statements.append(args[2]))
    engine.dispose()  # a fresh pool: one connection for the reads below, taken in turn
    for _ in range(20):
        rooms.read_events(engine, room_id=ROOM)
    assert engine.pool.checkedin() == 1
    assert sum("pg_control_system" in statement for statement in statements) == (backend == "postgresql")


# --- follow(): a resumed follower checks its last event ------------------------------------------------------


def test_a_resumed_follower_whose_last_event_is_unchanged_goes_on(engine: Engine) -> None:
    events = _log(engine, 3)
    with contextlib.closing(rooms.follow(engine, ROOM, 2, last_event=events[1], fallback_interval=0.05)) as follower:
        assert next(follower)["event_id"] == "e3"


def test_a_resumed_follower_whose_last_event_changed_gets_a_lineage_error(engine: Engine) -> None:
    events = _log(engine, 3)
    _rewrite(engine, 2, "other-2", "not what was read")
    follower = rooms.follow(engine, ROOM, 2, last_event=events[1], fallback_interval=0.05)
    with pytest.raises(StoreLineageError, match="seq 2") as caught:
        next(follower)
    assert isinstance(caught.value, StorageError) and (caught.value.room_id, caught.value.seq) == (ROOM, 2)


def test_a_resumed_follower_whose_last_event_is_gone_gets_a_lineage_error(engine: Engine) -> None:
    events = _log(engine, 3)
    with engine.begin() as connection:  # the log as a standby that lacked seqs 2 and 3 holds it
        connection.execute(sa.delete(models.events).where(models.events.c.seq >= 2))
        connection.execute(sa.update(models.rooms).values(next_seq=2))
    with pytest.raises(StoreLineageError, match="is gone"):
        rooms.follow(engine, ROOM, 3, last_event=events[2])  # found when called: the log ends before it
    with pytest.raises(InvalidInputError):  # without a remembered event: the plain argument error
        rooms.follow(engine, ROOM, 3)


def test_the_same_lineage_skips_the_check_and_a_bad_resume_is_refused(engine: Engine) -> None:
    events = _log(engine, 3)
    lineage = rooms.read_events(engine, room_id=ROOM)["lineage"]
    _rewrite(engine, 2, "other-2", "changed on this very lineage")  # not a failover: nothing to detect
    with contextlib.closing(rooms.follow(engine, ROOM, 2, last_event=events[1], lineage=lineage,
                                        fallback_interval=0.05)) as follower:
        assert next(follower)["event_id"] == "e3"
    for bad in ({"seq": 1, "event_id": "e1"}, "e2", 7):
        with pytest.raises(InvalidInputError) as caught:
            rooms.follow(engine, ROOM, 2, last_event=bad)  # type: ignore[arg-type]
        assert caught.value.field == "last_event"
    with pytest.raises(InvalidInputError) as refused:
        rooms.follow(engine, ROOM, 2, last_event=events[1], lineage="not a lineage")
    assert refused.value.field == "lineage"


def test_the_asyncio_follower_checks_its_last_event_too(target: str) -> None:
    import asyncio

    with testing.open_engine(target) as engine:
        events = _log(engine, 3)

    async def run() -> None:
        engine = aio.create_async_engine(target)
        try:
            follower = aio.follow(engine, ROOM, 2, last_event=events[1], fallback_interval=0.05)
            assert (await follower.__anext__())["event_id"] == "e3"
            await follower.aclose()
            changed = dict(events[1], payload={"text": "another"})
            follower = aio.follow(engine, ROOM, 2, last_event=changed, fallback_interval=0.05)
            with pytest.raises(StoreLineageError):
                await follower.__anext__()
            await follower.aclose()
        finally:
            await engine.dispose()

    asyncio.run(run())


# --- the Replicator and the HTTP source ------------------------------------------------------------------------


class _Relabelled:
    """A PageSource whose pages claim the lineage this test sets (a source store that failed over)."""

    def __init__(self, inner: EnginePageSource, lineage: str) -> None:
        self.inner, self.lineage = inner, lineage

    def list_rooms(self, **kwargs: Any) -> Any:
        return self.inner.list_rooms(**kwargs)

    def room_info(self, room_id: str) -> Any:
        return self.inner.room_info(room_id)

    def read_events(self, room_id: str, **kwargs: Any) -> dict[str, Any]:
        return {**self.inner.read_events(room_id, **kwargs), "lineage": self.lineage}

    def change_token(self) -> Hashable | None:
        return None

    def describe(self) -> str:
        return "relabelled"

    def close(self) -> None:
        self.inner.close()


@pytest.fixture
def replica_store(tmp_path: Path, sqlite_template: Path) -> Iterator[Engine]:
    """A standby gateway's own (SQLite) store."""
    with testing.open_engine(testing.copy_template(sqlite_template, tmp_path / "replica.db")) as built:
        yield built


def test_the_replicator_refuses_a_source_that_lost_its_replicas_events(engine: Engine,
                                                                      replica_store: Engine) -> None:
    _log(engine, 3)
    source = _Relabelled(EnginePageSource(engine), "postgresql:1:1")
    replicator = Replicator(source, replica_store)
    assert replicator.sync_once().rooms[0].status == CAUGHT_UP
    # Promoted elsewhere, nothing lost: the replica's last event is there as stored, so replication goes on.
    source.lineage = "postgresql:1:2"
    message(engine, ROOM, "e4")
    report = replicator.sync_once().rooms[0]
    assert (report.status, report.last_seq) == (CAUGHT_UP, 4)
    # Promoted again, onto a copy that lacked seq 4 and wrote another event there: refused, nothing ingested.
    source.lineage = "postgresql:1:3"
    _rewrite(engine, 4, "other-4", "written after the failover")
    message(engine, ROOM, "e5")
    report = replicator.sync_once().rooms[0]
    assert report.status == REFUSED and "lineage is postgresql:1:3 (was postgresql:1:2)" in report.reason
    assert "lost events" in report.reason and report.last_seq == 4
    # A new replicator (a restart) has no lineage remembered: it checks the replica's last event on first read.
    later = Replicator(source, replicator.target).sync_once().rooms[0]
    assert later.status == REFUSED and "lost events" in later.reason


@pytest.mark.parametrize("lineage", [7, "", "x" * 129, "two words", "caf\u00e9", "-leading", ["sqlite"]])
def test_a_hostile_lineage_is_refused_by_the_page_checks_and_the_http_source(
        engine: Engine, lineage: Any) -> None:
    _log(engine, 1)
    page = dict(rooms.read_events(engine, room_id=ROOM), lineage=lineage)
    with pytest.raises(ReplicaError, match="page.lineage"):
        validate_page(page, room_id=ROOM)
    with PageServer(_Relabelled(EnginePageSource(engine), lineage)) as server:
        client = HttpPageSource(server.url)
        try:
            with pytest.raises(SourceProtocolError, match="lineage"):
                client.read_events(ROOM, since_seq=0, limit=10)
        finally:
            client.close()


def test_the_http_source_carries_the_lineage(engine: Engine) -> None:
    _log(engine, 2)
    with PageServer(EnginePageSource(engine)) as server:
        client = HttpPageSource(server.url)
        try:
            page = client.read_events(ROOM, since_seq=0, limit=10)
        finally:
            client.close()
    assert page["lineage"] == rooms.read_events(engine, room_id=ROOM)["lineage"]
    assert validate_page(page, room_id=ROOM).lineage == page["lineage"]


# --- verify with remembered heads ------------------------------------------------------------------------------


def test_verify_reports_a_remembered_head_gone_or_different(engine: Engine) -> None:
    events = _log(engine, 3)
    assert integrity.verify(engine, expect_heads=[f"{ROOM}/3/e3", (ROOM, 2, "e2"), events[0]]) == []
    _rewrite(engine, 2, "other-2", "reused seq")
    with engine.begin() as connection:
        connection.execute(sa.update(models.events).where(models.events.c.seq == 1).values(
            payload_json='{"text":"changed"}'))
    found = [violation for violation in integrity.verify(
        engine, expect_heads=[f"{ROOM}/2/e2", f"{ROOM}/9/e9", events[0], f"{ROOM}/3/e3"])
        if violation.check == "expected_head"]  # (the rewrites also changed the accounted bytes)
    assert [(v.check, v.subject) for v in found] == [
        ("expected_head", f"{ROOM} seq 2"), ("expected_head", f"{ROOM} seq 9"), ("expected_head", f"{ROOM} seq 1")]
    assert "holds event 'other-2'" in found[0].detail and "is gone" in found[1].detail
    assert "payload" in found[2].detail
    for bad in ("room-1/x/e1", "room-1/1", ("room-1", 0, "e1"), 5, "bad room/1/e1"):
        with pytest.raises(InvalidInputError) as caught:
            integrity.verify(engine, expect_heads=[bad])
        assert caught.value.field == "expect_heads"


def test_the_cli_verifies_remembered_heads(target: str, capsys: pytest.CaptureFixture[str]) -> None:
    with testing.open_engine(target) as engine:
        _log(engine, 2)
    code, out, _ = run_cli(capsys, "verify", "--url", target, "--expect-head", f"{ROOM}/2/e2")
    assert code == 0 and "verify: clean" in out
    code, out, _ = run_cli(capsys, "verify", "--url", target, "--expect-head", f"{ROOM}/2/e2",
                           "--expect-head", f"{ROOM}/2/lost-2")
    assert code == 1 and f"expected_head: {ROOM} seq 2: holds event 'e2'" in out and "1 violation" in out


# --- the driver errors of a hot standby and of a dead primary --------------------------------------------------


def _driver_error(kind: type[sa_exc.DBAPIError], orig: Exception) -> sa_exc.DBAPIError:
    return kind("SELECT 1", {}, orig)


def test_read_only_and_dead_primary_errors_are_classified() -> None:
    url = "postgresql+psycopg://u:secret@127.0.0.1/db"
    listen = psycopg.errors.ReadOnlySqlTransaction("cannot execute LISTEN during recovery")
    write = psycopg.errors.ReadOnlySqlTransaction("cannot execute INSERT in a read-only transaction")
    assert listen.sqlstate == "25006"
    for orig in (listen, write):
        assert isinstance(translate(_driver_error(sa_exc.InternalError, orig), url), StoreReadOnlyError)
    for text in ("consuming input failed: server closed the connection unexpectedly",
                 "connection to server at \"127.0.0.1\", port 5432 failed: Connection refused",
                 "connection failed: connection to server at \"127.0.0.1\", port 5433 failed: session is read-only",
                 "the connection is lost"):
        found = translate(_driver_error(sa_exc.OperationalError, psycopg.OperationalError(text)), url)
        assert type(found) is StoreUnavailableError, text
    shutdown = psycopg.errors.AdminShutdown("terminating connection due to administrator command")
    assert type(translate(_driver_error(sa_exc.OperationalError, shutdown), url)) is StoreUnavailableError


def test_lineage_errors_are_exported() -> None:
    assert hostedrooms.StoreLineageError is StoreLineageError

"""A primary failover with a real streaming standby (#26 item 4): the harness starts a primary, a hot standby
(``pg_basebackup -R``) and promotes it.

* On a hot standby, reads work (``read_events``, ``list_rooms``, ``room_state``, ``verify``, a page source with
  its listing, room info, pages and change token) and writes and ``follow()`` raise StoreReadOnlyError.
* Synchronous replication through a multi-host URL: the primary dies under concurrent appenders, the standby is
  promoted; writers see only StoreUnavailableError in between, then resume; no acknowledged append is lost.
* Asynchronous replication, made to lag deterministically (the standby is stopped while the primary takes
  acknowledged appends, then the primary dies and the standby is promoted without them): the new primary reuses
  the lost seqs for other events, and lineage makes that visible: pages carry a new lineage, a follower that had
  read a lost event gets StoreLineageError and one whose last event survived goes on, the Replicator (over HTTP)
  refuses the room, and ``verify`` with the remembered head reports it.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import pytest
from factories import make_room, message, run_cli
from sqlalchemy import Engine

import hostedrooms
from hostedrooms import aio, integrity, pgcluster, rooms, testing
from hostedrooms.errors import StoreLineageError, StoreReadOnlyError, StoreUnavailableError
from hostedrooms.standby import EnginePageSource, HttpPageSource, PageServer, Replicator
from hostedrooms.standby.replicator import CAUGHT_UP, REFUSED

ROOM = "ha-room"
T = TypeVar("T")


@contextlib.contextmanager
def engine_of(url: str) -> Iterator[Engine]:
    engine = hostedrooms.create_engine(url)
    try:
        yield engine
    finally:
        engine.dispose()


def until_available(call: Callable[[], T], within: float = 60.0) -> T:
    """``call()``, retried while it raises StoreUnavailableError (the caller's retry loop across a failover)."""
    deadline = time.monotonic() + within
    while True:
        try:
            return call()
        except StoreUnavailableError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.02)


# --- a hot standby ---------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def standby_log(pg_standby_pair: pgcluster.StandbyPair) -> list[dict[str, Any]]:
    """A room of three events on the primary, replayed by the standby."""
    with engine_of(pg_standby_pair.primary_url) as primary:
        make_room(primary, ROOM)
        written = [message(primary, ROOM, f"e{n}", f"text {n}") for n in range(1, 4)]
    pg_standby_pair.primary.wait_replayed(pg_standby_pair.standby)
    return written


def test_a_hot_standby_serves_every_read(pg_standby_pair: pgcluster.StandbyPair,
                                         standby_log: list[dict[str, Any]],
                                         capsys: pytest.CaptureFixture[str]) -> None:
    with engine_of(pg_standby_pair.primary_url) as primary, engine_of(pg_standby_pair.standby_url) as standby:
        page = rooms.read_events(standby, room_id=ROOM)
        assert page == rooms.read_events(primary, room_id=ROOM)  # the same lineage: one history
        assert [event["event_id"] for event in page["events"]] == ["e1", "e2", "e3"]
        assert rooms.list_rooms(standby) == rooms.list_rooms(primary)
        assert rooms.room_state(standby, room_id=ROOM) == rooms.room_state(primary, room_id=ROOM)
        assert integrity.verify(standby, expect_heads=[standby_log[-1]]) == []
        source = EnginePageSource(standby)
        try:
            assert [head.room_id for head in source.list_rooms()] == [ROOM]
            assert source.room_info(ROOM).name == "Team"
            assert source.read_events(ROOM, since_seq=2, limit=10)["events"][0]["event_id"] == "e3"
            assert source.change_token() is not None
        finally:
            source.close()
    for argv, shown in ((["rooms"], ROOM), (["log", ROOM], '{"text":"text 3"}'),
                        (["verify", "--expect-head", f"{ROOM}/3/e3"], "verify: clean")):
        code, out, err = run_cli(capsys, *argv, "--url", pg_standby_pair.standby_url)
        assert code == 0 and shown in out and not err, (argv, out, err)


def test_a_hot_standby_refuses_writes_and_follow_as_read_only(
        pg_standby_pair: pgcluster.StandbyPair, standby_log: list[dict[str, Any]]) -> None:
    with engine_of(pg_standby_pair.standby_url) as standby:
        with pytest.raises(StoreReadOnlyError) as write:
            message(standby, ROOM, "e4")
        assert getattr(write.value.__cause__, "orig", None).sqlstate == "25006"  # type: ignore[union-attr]
        with pytest.raises(StoreReadOnlyError):
            make_room(standby, "ha-other")
        follower = rooms.follow(standby, ROOM, 3)  # the room check is a read: it passes
        with pytest.raises(StoreReadOnlyError, match="cannot execute LISTEN during recovery"):
            next(follower)

    async def follow_async() -> None:
        engine = aio.create_async_engine(pg_standby_pair.standby_url)
        try:
            events = aio.follow(engine, ROOM, 3)
            with pytest.raises(StoreReadOnlyError):
                await events.__anext__()
        finally:
            await engine.dispose()

    asyncio.run(follow_async())


# --- synchronous replication: nothing acknowledged is lost -------------------------------------------------------


class _Writers:
    """Appenders in threads, appending until told to stop, each retrying an append on StoreUnavailableError (the
    same event id: a replay is idempotent) until it is acknowledged; any other error is recorded and ends the
    writer."""

    def __init__(self, url: str, writers: int) -> None:
        self.engine = hostedrooms.create_engine(url)
        self.acknowledged: list[dict[str, Any]] = []
        self.unavailable = 0
        self.other: list[BaseException] = []
        self.progress = threading.Condition()
        self.stop = threading.Event()
        self.threads = [threading.Thread(target=self._write, args=(writer,)) for writer in range(writers)]

    def _write(self, writer: int) -> None:
        deadline = time.monotonic() + 120
        n = 0
        while not self.stop.is_set() and time.monotonic() < deadline:
            try:
                event = message(self.engine, ROOM, f"w{writer}-{n}")
            except StoreUnavailableError:
                with self.progress:
                    self.unavailable += 1
                time.sleep(0.01)
                continue
            except BaseException as exc:  # anything else is what this test forbids
                with self.progress:
                    self.other.append(exc)
                    self.progress.notify_all()
                return
            n += 1
            with self.progress:
                self.acknowledged.append(event)
                self.progress.notify_all()

    def wait_for(self, count: int) -> int:
        """Wait until ``count`` appends were acknowledged in all; return how many were then."""
        with self.progress:
            assert self.progress.wait_for(lambda: len(self.acknowledged) >= count or self.other, timeout=60)
            return len(self.acknowledged)

    def __enter__(self) -> _Writers:
        for thread in self.threads:
            thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        for thread in self.threads:
            thread.join(180)
        self.engine.dispose()


@pytest.mark.parametrize(("writers", "before", "after"), [
    (4, 20, 20), pytest.param(16, 500, 500, marks=pytest.mark.slow)])
def test_synchronous_failover_through_a_multi_host_url_loses_no_acknowledged_append(
        pg_pair_factory: Callable[..., pgcluster.StandbyPair], writers: int, before: int, after: int) -> None:
    pair = pg_pair_factory(synchronous=True)
    with engine_of(pair.url) as engine:
        make_room(engine, ROOM)
        lineage = rooms.read_events(engine, room_id=ROOM)["lineage"]
        with _Writers(pair.url, writers=writers) as load:
            load.wait_for(before)
            pair.primary.halt()  # as a crash: in-flight appends are never acknowledged
            pair.standby.promote()
            promoted = load.wait_for(0)
            load.wait_for(promoted + after)  # the writers resumed on the new primary
        assert not load.other, load.other
        assert load.unavailable > 0  # the writers were appending when the primary died
        log = _whole_log(engine)
    assert [event["seq"] for event in log] == list(range(1, len(log) + 1))
    stored = {event["event_id"]: event for event in log}
    assert len(stored) == len(log) >= len(load.acknowledged)  # each once (a retry replays, never duplicates)
    for event in load.acknowledged:
        assert stored[event["event_id"]]["seq"] == event["seq"]
    assert _whole_page(pair.url)["lineage"] != lineage


def _whole_log(engine: Engine) -> list[dict[str, Any]]:
    found: list[dict[str, Any]] = []
    while True:
        page = until_available(lambda: rooms.read_events(engine, room_id=ROOM, since_seq=len(found), limit=500))
        found.extend(page["events"])
        if not page["has_more"]:
            return found


def _whole_page(url: str) -> Any:
    with engine_of(url) as engine:
        return rooms.read_events(engine, room_id=ROOM)


# --- asynchronous replication: lineage detects what the failover lost --------------------------------------------


def test_asynchronous_failover_is_detected_by_lineage(
        pg_pair_factory: Callable[..., pgcluster.StandbyPair], sqlite_template: Path, tmp_path: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    pair = pg_pair_factory()
    replica_target = testing.copy_template(sqlite_template, tmp_path / "standby-gateway.db")
    with engine_of(pair.url) as engine, engine_of(replica_target) as replica_store:
        make_room(engine, ROOM)
        for n in range(1, 6):
            message(engine, ROOM, f"e{n}")
        pair.primary.wait_replayed(pair.standby)
        kept = rooms.read_events(engine, room_id=ROOM)
        pair.standby.halt("fast")  # the standby misses what comes next
        for n in range(6, 9):
            message(engine, ROOM, f"e{n}")  # acknowledged by the primary alone
        lost = rooms.read_events(engine, room_id=ROOM)
        assert lost["lineage"] == kept["lineage"] and lost["latest_seq"] == 8
        with PageServer(EnginePageSource(engine)) as server:
            replicator = Replicator(HttpPageSource(server.url), replica_store)
            assert replicator.sync_once().rooms[0].status == CAUGHT_UP  # the replica holds seqs 1..8

            pair.primary.halt()
            pair.standby.restart()
            with engine_of(pair.standby_url) as on_standby:
                # The standby's lineage is its primary's; read again on the same pooled connection once promoted.
                assert rooms.read_events(on_standby, room_id=ROOM)["lineage"] == kept["lineage"]
                pair.standby.promote()
                promoted = rooms.read_events(on_standby, room_id=ROOM)["lineage"]
                assert on_standby.pool.checkedin() == 1  # one connection served both reads
            for n in range(6, 10):  # the new primary's next appends reuse seqs 6..8
                until_available(lambda n=n: message(engine, ROOM, f"after-{n}"))

            page = rooms.read_events(engine, room_id=ROOM)
            assert page["lineage"] == promoted != kept["lineage"]
            assert [event["event_id"] for event in page["events"][4:7]] == ["e5", "after-6", "after-7"]

            last_lost, last_kept = lost["events"][-1], kept["events"][-1]
            with pytest.raises(StoreLineageError, match="seq 8") as caught:
                next(rooms.follow(engine, ROOM, 8, last_event=last_lost, lineage=lost["lineage"]))
            assert (caught.value.previous, caught.value.current) == (lost["lineage"], page["lineage"])
            with contextlib.closing(rooms.follow(engine, ROOM, 5, last_event=last_kept,
                                                 lineage=kept["lineage"])) as follower:
                assert next(follower)["event_id"] == "after-6"  # its last event survived: it goes on

            report = replicator.sync_once().rooms[0]
            assert report.status == REFUSED and "lost events" in report.reason, report.reason
            assert report.last_seq == 8  # nothing of the diverged log was ingested

        remembered = f"{ROOM}/8/{last_lost['event_id']}"
        assert [violation.check for violation in integrity.verify(engine, expect_heads=[remembered])] == [
            "expected_head"]
        assert integrity.verify(engine, expect_heads=[last_kept]) == []
    code, out, _ = run_cli(capsys, "verify", "--url", pair.url, "--expect-head", remembered)
    assert code == 1 and "holds event 'after-8', not the remembered 'e8'" in out

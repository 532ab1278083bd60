"""The Replicator keeps a standby's replicas of every room of a source caught up, on SQLite and PostgreSQL:
catch-up, resume, claims and epoch changes, disbands, the local fence, refusals with back-off, forks, demotion
of a returning authority, and the following loop."""

from __future__ import annotations

import dataclasses
import threading
import time
import tracemalloc
from collections.abc import Hashable
from typing import Any

import pytest
from sqlalchemy import Engine
from standby_support import (
    GATEWAY_A,
    GATEWAY_B,
    GATEWAY_C,
    drop_store,
    extra_store,
    host,
    replica_ids,
    replica_log,
    room_log,
    say,
)

from hostedrooms import replicas, rooms, verify
from hostedrooms.errors import (
    AuthorityConflictError,
    HostedRoomError,
    RoomHistoryExpiredError,
    StoreUnavailableError,
)
from hostedrooms.limits import LimitValues
from hostedrooms.standby import (
    Backoff,
    EnginePageSource,
    IntervalWaker,
    PollingWaker,
    Replicator,
    RoomHead,
    RoomInfo,
    SourceUnavailableError,
)
from hostedrooms.standby.replicator import (
    BACKING_OFF,
    BEHIND,
    CAUGHT_UP,
    DEMOTED,
    DISBANDED,
    GONE,
    LOCAL,
    REFUSED,
    SKIPPED,
)

pytest_plugins = ["standby_fixtures"]  # the standby, standby_target and pg_standby_url fixtures


class Clock:
    def __init__(self) -> None:
        self.value = 1000.0

    def __call__(self) -> float:
        return self.value


class Watched:
    """A source that counts what the replicator asks and can be told to misbehave per room."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.reads: dict[str, int] = {}
        self.infos = 0
        self.page_hook: Any = None  # (room_id, page) -> page
        self.read_error: BaseException | None = None

    def list_rooms(self, *, after: str | None = None, limit: int = 500) -> list[RoomHead]:
        return list(self.inner.list_rooms(after=after, limit=limit))

    def room_info(self, room_id: str) -> RoomInfo:
        self.infos += 1
        result: RoomInfo = self.inner.room_info(room_id)
        return result

    def read_events(self, room_id: str, *, since_seq: int, limit: int) -> dict[str, Any]:
        self.reads[room_id] = self.reads.get(room_id, 0) + 1
        if self.read_error is not None:
            raise self.read_error
        page: dict[str, Any] = self.inner.read_events(room_id, since_seq=since_seq, limit=limit)
        return self.page_hook(room_id, page) if self.page_hook else page

    def change_token(self) -> Hashable | None:
        token: Hashable | None = self.inner.change_token()
        return token

    def describe(self) -> str:
        return "watched"

    def close(self) -> None:
        self.inner.close()


def _statuses(report: Any) -> dict[str, str]:
    return {room.room_id: room.status for room in report.rooms}


def _assert_replicated(authority: Engine, standby: Engine, room_ids: list[str]) -> None:
    for room_id in room_ids:
        assert replica_log(standby, room_id) == room_log(authority, room_id), room_id
        state = replicas.replica_state(standby, room_id=room_id)
        assert state["last_seq"] == state["latest_seq"] == len(room_log(authority, room_id))
    assert verify(authority) == [] and verify(standby) == []


def test_one_pass_replicates_every_room_and_a_second_reads_nothing(engine: Engine, standby: Engine) -> None:
    for index, size in enumerate((0, 1, 499, 500, 501, 1203)):
        host(engine, f"room-{index}", size)
    source = Watched(EnginePageSource(engine))
    replicator = Replicator(source, standby, page_limit=500)
    report = replicator.sync_once()
    assert _statuses(report) == {f"room-{index}": CAUGHT_UP for index in range(6)}
    assert report.events == 0 + 1 + 499 + 500 + 501 + 1203 and report.lag == 0 and report.ok
    assert [room.pages for room in report.rooms] == [1, 1, 1, 1, 2, 3]
    _assert_replicated(engine, standby, [f"room-{index}" for index in range(6)])
    source.reads.clear()
    again = replicator.sync_once()
    assert _statuses(again) == _statuses(report) and again.events == 0 and source.reads == {}


def test_workers_replicate_the_same_rooms_in_the_same_order(engine: Engine, standby: Engine) -> None:
    for index in range(9):
        host(engine, f"room-{index}", 40 * index)
    pages: list[str] = []
    reported: list[str] = []
    replicator = Replicator(EnginePageSource(engine), standby, page_limit=50, workers=4,
                            on_page=lambda page: pages.append(page.room_id),
                            on_room=lambda room: reported.append(room.room_id))
    report = replicator.sync_once()
    assert [room.room_id for room in report.rooms] == reported == [f"room-{index}" for index in range(9)]
    assert {room.status for room in report.rooms} == {CAUGHT_UP} and report.events == 40 * 36
    assert sorted(pages) == sorted(f"room-{index}" for index in range(9) for _ in range(max(1, -(-40 * index // 50))))
    _assert_replicated(engine, standby, [f"room-{index}" for index in range(9)])


def test_a_rename_reaches_the_replica(engine: Engine, standby: Engine) -> None:
    host(engine, "r", 2, name="Before")
    source = Watched(EnginePageSource(engine))
    replicator = Replicator(source, standby)
    replicator.sync_once()
    say(engine, "r", 2)
    replicator.sync_once()
    assert source.infos == 1  # read once, not per page
    rooms.rename_room(engine, room_id="r", event_id="rename-1", name="After")
    replicator.sync_once()
    assert replicas.replica_state(standby, room_id="r")["name"] == "After" and source.infos == 2


def test_resumes_a_partial_replica_without_gap_or_duplicate(engine: Engine, standby: Engine) -> None:
    host(engine, "long", 1000)
    host(engine, "short", 30)
    first = Replicator(EnginePageSource(engine), standby, page_limit=100, max_pages_per_room=3).sync_once()
    assert _statuses(first) == {"long": BEHIND, "short": CAUGHT_UP}
    assert first.rooms[0].last_seq == 300 and first.rooms[0].lag == 700
    say(engine, "long", 5)
    # A new replicator (as after a restart) resumes from the stored last_seq.
    second = Replicator(EnginePageSource(engine), standby, page_limit=100).sync_once()
    assert _statuses(second) == {"long": CAUGHT_UP, "short": CAUGHT_UP}
    assert second.rooms[0].events == 705 and second.rooms[0].pages == 8
    _assert_replicated(engine, standby, ["long", "short"])


def test_follows_claims_and_epoch_changes(engine: Engine, standby: Engine) -> None:
    host(engine, "r", 10)
    replicator = Replicator(EnginePageSource(engine), standby)
    replicator.sync_once()
    rooms.claim_authority(engine, room_id="r", expected_gateway_id=GATEWAY_A, expected_epoch=1,
                          new_gateway_id=GATEWAY_C, event_id="claim-2")
    say(engine, "r", 3, gateway=GATEWAY_C, epoch=2, prefix="c")
    rooms.claim_authority(engine, room_id="r", expected_gateway_id=GATEWAY_C, expected_epoch=2,
                          new_gateway_id=GATEWAY_A, event_id="claim-3")
    report = replicator.sync_once()
    [room] = report.rooms
    assert room.status == CAUGHT_UP and room.events == 5
    assert (room.authority_gateway_id, room.authority_epoch) == (GATEWAY_A, 3)
    state = replicas.replica_state(standby, room_id="r")
    assert state["authority"] == {"gateway_id": GATEWAY_A, "epoch": 3}
    _assert_replicated(engine, standby, ["r"])


def test_replicates_a_disband_then_stops_reading_the_room(engine: Engine, standby: Engine) -> None:
    host(engine, "gone-soon", 4)
    host(engine, "never-seen", 2)
    rooms.disband_room(engine, room_id="never-seen", expected_gateway_id=GATEWAY_A, expected_epoch=1)
    source = Watched(EnginePageSource(engine))
    replicator = Replicator(source, standby)
    first = replicator.sync_once()
    assert _statuses(first) == {"gone-soon": CAUGHT_UP, "never-seen": SKIPPED}
    rooms.disband_room(engine, room_id="gone-soon", expected_gateway_id=GATEWAY_A, expected_epoch=1)
    second = replicator.sync_once()
    assert _statuses(second) == {"gone-soon": DISBANDED, "never-seen": SKIPPED}
    assert replica_log(standby, "gone-soon")[-1][2] == "room.disbanded"
    assert replica_ids(standby) == ["gone-soon"]  # a room disbanded before it was seen takes no replica slot
    source.reads.clear()
    third = replicator.sync_once()
    assert _statuses(third) == _statuses(second) and source.reads == {}
    _assert_replicated(engine, standby, ["gone-soon"])


def test_pruning_removes_disbanded_replicas_after_their_retention(engine: Engine, standby: Engine) -> None:
    """A standby that sees rooms disbanded frees their replica slots (MAX_REPLICA_ROOMS) when asked to."""
    for room_id in ("gone", "kept"):
        host(engine, room_id, 3)
    clock = Clock()
    replicator = Replicator(EnginePageSource(engine), standby, now=clock, prune_disbanded_after=60)
    replicator.sync_once()
    rooms.disband_room(engine, room_id="gone", expected_gateway_id=GATEWAY_A, expected_epoch=1, now=clock.value)
    kept = replicator.sync_once()  # the disband is replicated, and within its retention
    assert _statuses(kept) == {"gone": DISBANDED, "kept": CAUGHT_UP} and kept.pruned == []
    assert replica_ids(standby) == ["gone", "kept"]
    clock.value += 60
    pruned = replicator.sync_once()
    assert pruned.pruned == ["gone"] and "1 disbanded replica removed" in pruned.summary()
    assert [room.reason for room in pruned.rooms if room.room_id == "gone"] == ["replica removed"]
    assert replica_ids(standby) == ["kept"] and replica_log(standby, "gone") == []
    after = replicator.sync_once()  # never replicated again: the source's tombstone is skipped
    assert _statuses(after) == {"gone": SKIPPED, "kept": CAUGHT_UP} and after.pruned == []
    assert replica_ids(standby) == ["kept"] and verify(standby) == []
    with pytest.raises(HostedRoomError, match="prune_disbanded_after"):
        Replicator(EnginePageSource(engine), standby, prune_disbanded_after=-1)


def test_never_replicates_over_a_room_this_gateway_promoted(engine: Engine, standby: Engine) -> None:
    host(engine, "r", 6)
    source = Watched(EnginePageSource(engine))
    replicator = Replicator(source, standby, local_gateway_id=GATEWAY_B)
    replicator.sync_once()
    replicas.promote_replica(standby, room_id="r", local_gateway_id=GATEWAY_B)
    rooms.append_event(standby, room_id="r", event_id="on-b", kind="message.user", actor={"kind": "user", "id": "u"},
                       payload={}, authority_gateway_id=GATEWAY_B, authority_epoch=2)
    before = room_log(standby, "r")
    # The old authority still serves its (now stale) lineage, and even keeps writing: nothing reaches B's room.
    say(engine, "r", 3)
    source.reads.clear()
    report = replicator.sync_once()
    assert _statuses(report) == {"r": LOCAL} and source.reads == {}
    assert "never replicated over" in report.rooms[0].reason and report.ok
    assert room_log(standby, "r") == before and replica_ids(standby) == []
    assert verify(standby) == []


def test_a_refused_page_is_reported_and_backed_off(engine: Engine, standby: Engine) -> None:
    host(engine, "bad", 5)
    host(engine, "good", 5)
    source = Watched(EnginePageSource(engine))

    def hostile(room_id: str, page: dict[str, Any]) -> dict[str, Any]:
        if room_id == "bad":
            page["events"][2]["kind"] = "NOT A KIND!"
        return page

    source.page_hook = hostile
    clock = Clock()
    replicator = Replicator(source, standby, monotonic=clock, backoff=Backoff(base=1.0, maximum=8.0))
    first = replicator.sync_once()
    assert _statuses(first) == {"bad": REFUSED, "good": CAUGHT_UP} and not first.ok
    assert "event.kind" in first.rooms[0].reason and "retrying in 1 s" in first.rooms[0].reason
    assert replica_ids(standby) == ["good"]  # nothing of the refused page was stored
    say(engine, "good", 2)
    for _ in range(5):  # passes in quick succession read the refused room no more
        report = replicator.sync_once()
        assert _statuses(report) == {"bad": BACKING_OFF, "good": CAUGHT_UP}
    assert source.reads["bad"] == 1 and replicas.replica_state(standby, room_id="good")["last_seq"] == 7
    delays = []
    for _ in range(5):
        waiting = replicator.backoff.waiting("bad", clock.value)
        assert waiting is not None
        clock.value += waiting[0]
        replicator.sync_once()
        delays.append(round(waiting[0]))
    assert delays == [1, 2, 4, 8, 8] and source.reads["bad"] == 6
    source.page_hook = None
    clock.value += 8
    assert _statuses(replicator.sync_once()) == {"bad": CAUGHT_UP, "good": CAUGHT_UP}
    assert replicator.backoff.waiting("bad", clock.value) is None
    _assert_replicated(engine, standby, ["bad", "good"])


def test_a_source_that_pages_nothing_new_is_refused_not_spun_on(engine: Engine, standby: Engine) -> None:
    host(engine, "stuck", 10)
    source = Watched(EnginePageSource(engine))
    source.page_hook = lambda _room, page: {**page, "events": [], "cursor": 0, "has_more": True}
    replicator = Replicator(source, standby, max_pages_per_room=None)
    report = replicator.sync_once()
    # A page holding nothing while claiming seq 10: refused after one read (and nothing stored), not a loop.
    assert _statuses(report) == {"stuck": REFUSED} and source.reads["stuck"] == 1
    assert "holds nothing after seq 0" in report.rooms[0].reason and replica_ids(standby) == []


def test_a_room_purged_between_listing_and_reading_is_gone(engine: Engine, standby: Engine) -> None:
    host(engine, "r", 3)
    source = Watched(EnginePageSource(engine))
    source.read_error = RoomHistoryExpiredError("Group Chat history expired; room_id remains permanently retired")
    report = Replicator(source, standby).sync_once()
    assert _statuses(report) == {"r": GONE} and report.ok


def test_an_unreachable_source_stops_the_pass_without_charging_rooms(engine: Engine, standby: Engine) -> None:
    host(engine, "a", 3)
    host(engine, "b", 3)
    source = Watched(EnginePageSource(engine))
    source.read_error = SourceUnavailableError("page source down")
    replicator = Replicator(source, standby)
    report = replicator.sync_once()
    assert report.error == "page source down" and report.rooms == [] and not report.ok
    assert replicator.backoff.waiting("a", time.monotonic()) is None
    source.read_error = StoreUnavailableError("hosted room store is unavailable")
    assert replicator.sync_once().error
    source.read_error = None
    assert _statuses(replicator.sync_once()) == {"a": CAUGHT_UP, "b": CAUGHT_UP}


def test_a_source_that_forked_from_the_replica_is_refused(engine: Engine, standby: Engine,
                                                          standby_target: str) -> None:
    """The standby C followed A further in room "r" than B did before B took over: B's lineage does not continue
    C's replica there. In room "s" C was behind B's takeover point: it continues onto B's lineage."""
    host(engine, "r", 5)  # A's store (the authority)
    host(engine, "s", 5)
    b_store = extra_store(standby_target)
    try:
        for room_id in ("r", "s"):  # B replicated A's first 5 events of each room
            replicas.ingest_page(b_store, room_id=room_id, room_name="R", members=[{"id": "bot-1"}],
                                 page=rooms.read_events(engine, room_id=room_id, since_seq=0))
        replicas.ingest_page(standby, room_id="s", room_name="S", members=[{"id": "bot-1"}],
                             page=rooms.read_events(engine, room_id="s", since_seq=0, limit=3))
        say(engine, "r", 3)
        # C (the standby) replicated all 8 events of "r", and only 3 of "s".
        replicas.ingest_page(standby, room_id="r", room_name="R", members=[{"id": "bot-1"}],
                             page=rooms.read_events(engine, room_id="r", since_seq=0))
        # A went silent for B, which promoted its replicas and carried on at epoch 2.
        for room_id in ("r", "s"):
            replicas.promote_replica(b_store, room_id=room_id, local_gateway_id=GATEWAY_B)
            say(b_store, room_id, 4, gateway=GATEWAY_B, epoch=2, prefix="b")
        before = replica_log(standby, "r")
        report = Replicator(EnginePageSource(b_store), standby).sync_once()
        assert _statuses(report) == {"r": REFUSED, "s": CAUGHT_UP}
        assert "forked from this replica: its seq 8 was written at epoch 2" in report.rooms[0].reason
        assert replica_log(standby, "r") == before
        assert replica_log(standby, "s") == room_log(b_store, "s") and verify(standby) == []
    finally:
        drop_store(b_store)


def test_a_returning_authority_is_demoted_and_refuses_stale_writes(engine: Engine, standby: Engine,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    host(engine, "taken", 5)
    host(engine, "kept", 2)
    Replicator(EnginePageSource(engine), standby).sync_once()
    replicas.promote_replica(standby, room_id="taken", local_gateway_id=GATEWAY_B)
    monkeypatch.delenv("HOSTEDROOMS_INSTALL_ID", raising=False)
    back = Replicator(EnginePageSource(standby), engine)  # A's replicator, without A's identity
    unknown = back.sync_once()
    assert _statuses(unknown) == {"taken": REFUSED} and "gateway's identity" in unknown.rooms[0].reason
    monkeypatch.setenv("HOSTEDROOMS_INSTALL_ID", "gw-a")
    back = Replicator(EnginePageSource(standby), engine)
    report = back.sync_once()
    assert _statuses(report) == {"taken": DEMOTED}
    state = rooms.room_state(engine, room_id="taken")
    assert (state["authority_gateway_id"], state["authority_epoch"]) == (GATEWAY_B, 2)
    with pytest.raises(AuthorityConflictError):
        rooms.append_event(engine, room_id="taken", event_id="stale", kind="message.user",
                           actor={"kind": "user", "id": "u"}, payload={}, authority_gateway_id=GATEWAY_A,
                           authority_epoch=1)
    assert _statuses(back.sync_once()) == {"taken": LOCAL}  # once demoted, left alone
    assert rooms.room_state(engine, room_id="kept")["authority_gateway_id"] == GATEWAY_A
    assert verify(engine) == [] and verify(standby) == []


def test_a_refused_demotion_is_backed_off(engine: Engine, standby: Engine) -> None:
    host(engine, "taken", 3)
    Replicator(EnginePageSource(engine), standby).sync_once()
    replicas.promote_replica(standby, room_id="taken", local_gateway_id=GATEWAY_B)
    full = dataclasses.replace(LimitValues.read(), MAX_EVENTS_PER_ROOM=3, CONTROL_EVENT_COUNT_RESERVE=0)
    clock = Clock()
    back = Replicator(EnginePageSource(standby), engine, local_gateway_id=GATEWAY_A, limits=full, monotonic=clock)
    first = back.sync_once()
    assert _statuses(first) == {"taken": REFUSED} and "demotion refused: This Group Chat reached its history" \
        in first.rooms[0].reason
    assert _statuses(back.sync_once()) == {"taken": BACKING_OFF}
    back.limits = None
    clock.value += 1
    assert _statuses(back.sync_once()) == {"taken": DEMOTED}
    assert rooms.room_state(engine, room_id="taken")["authority_epoch"] == 2 and verify(engine) == []


@pytest.mark.parametrize("backend", ["sqlite"], indirect=True)  # the bound is the replicator's, on any backend
def test_memory_is_one_page_whatever_the_room_count(engine: Engine, standby: Engine) -> None:
    payload = "x" * 8000
    for index in range(24):
        rooms.create_room(engine, room_id=f"m{index:02}", name="M", members=[], authority_gateway_id=GATEWAY_A)
        rooms.append_events(engine, f"m{index:02}", [
            {"event_id": f"m{index}-{n}", "kind": "message.user", "actor": {"kind": "user", "id": "u"},
             "payload": {"t": payload}} for n in range(40)], GATEWAY_A, 1)
    peaks = []
    for count in (3, 24):
        target = extra_store(str(engine.url.database), name=f"mem{count}")
        try:
            source = EnginePageSource(engine)
            heads = [head for head in source.list_rooms() if int(head.room_id[1:]) < count]
            limited = Watched(source)
            limited.list_rooms = lambda *, after=None, limit=500, heads=heads: [  # type: ignore[method-assign]
                head for head in heads if after is None or head.room_id > after][:limit]
            replicator = Replicator(limited, target, page_limit=40)
            tracemalloc.start()
            report = replicator.sync_once()
            peaks.append(tracemalloc.get_traced_memory()[1])
            tracemalloc.stop()
            assert report.events == count * 40
        finally:
            drop_store(target)
    page = 40 * 8000
    assert peaks[1] < peaks[0] * 1.5, peaks  # eight times the rooms, about the same peak
    assert peaks[1] < 12 * page, peaks  # a page of events, decoded, and its ingest copies


def test_run_follows_new_commits_and_stops(engine: Engine, standby: Engine) -> None:
    host(engine, "live", 1)
    source = EnginePageSource(engine)
    stop = threading.Event()
    passes: list[Any] = []
    replicator = Replicator(source, standby)
    thread = threading.Thread(target=replicator.run, kwargs={
        "interval": 30.0, "waker": PollingWaker(source.change_token, poll_interval=0.01), "stop": stop,
        "on_pass": passes.append})
    thread.start()
    try:
        deadline = time.monotonic() + 30
        while not passes and time.monotonic() < deadline:
            time.sleep(0.01)
        say(engine, "live", 3)
        host(engine, "new", 2)
        while time.monotonic() < deadline:
            try:
                if (replicas.replica_state(standby, room_id="live")["last_seq"] == 4
                        and replicas.replica_state(standby, room_id="new")["last_seq"] == 2):
                    break
            except Exception:  # not there yet
                pass
            time.sleep(0.01)
    finally:
        stop.set()
        thread.join(timeout=30)
    assert not thread.is_alive()
    # Woken by the commits, well before the 30 s interval.
    assert replicas.replica_state(standby, room_id="new")["last_seq"] == 2
    _assert_replicated(engine, standby, ["live", "new"])


def test_change_token_moves_with_every_commit_and_only_then(engine: Engine) -> None:
    host(engine, "r", 1)
    source = EnginePageSource(engine)
    try:
        first = source.change_token()
        assert first is not None and source.change_token() == first
        rooms.read_events(engine, room_id="r", since_seq=0)  # reads change nothing
        assert source.change_token() == first
        say(engine, "r", 1)
        second = source.change_token()
        assert second != first and source.change_token() == second
        rooms.claim_authority(engine, room_id="r", expected_gateway_id=GATEWAY_A, expected_epoch=1,
                              new_gateway_id=GATEWAY_B, event_id="c")
        assert source.change_token() != second
    finally:
        source.close()


def test_the_interval_waker_waits_and_stops() -> None:
    stop = threading.Event()
    started = time.monotonic()
    assert IntervalWaker().wait(0.05, stop) is False and time.monotonic() - started >= 0.04
    stop.set()
    started = time.monotonic()
    assert PollingWaker(lambda: 1, poll_interval=0.01).wait(30, stop) is False
    assert time.monotonic() - started < 10

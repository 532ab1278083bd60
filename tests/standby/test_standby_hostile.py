"""A page source is trusted with nothing (issue #25, items 1 to 3), on SQLite and PostgreSQL:

1. a source takes a room away from this gateway (demotion) only on proof that its log continues the room;
2. every value a source returns is validated before any use: a bad one refuses that room only, and neither a pass
   nor ``run()`` ends with an undocumented error (a hypothesis test feeds hostile pages, heads and room infos);
3. a pass is bounded (rooms listed, pages, bytes, time) and one lying ``latest_seq`` cannot keep a replica from
   ever being caught up.
"""

from __future__ import annotations

import dataclasses
import itertools
import threading
import tracemalloc
from collections.abc import Callable, Hashable
from typing import Any

import pytest
from hypothesis import HealthCheck, assume, event, given, settings
from hypothesis import strategies as st
from sqlalchemy import Engine
from standby_support import (
    GATEWAY_A,
    GATEWAY_B,
    GATEWAY_C,
    drop_store,
    extra_store,
    host,
    replica_log,
    room_log,
    say,
)

from hostedrooms import replicas, rooms, verify
from hostedrooms.errors import AuthorityConflictError, HostedRoomError, RoomNotFoundError
from hostedrooms.standby import (
    Backoff,
    EnginePageSource,
    PageServer,
    PassReport,
    Replicator,
    RoomHead,
    RoomInfo,
    SourceProtocolError,
    failover,
)
from hostedrooms.standby.http import HttpPageSource
from hostedrooms.standby.replicator import BEHIND, CAUGHT_UP, DEMOTED, LOCAL, REFUSED, SKIPPED

pytest_plugins = ["standby_fixtures"]  # the standby, standby_target and pg_standby_url fixtures


class Fake:
    """A source over another (or nothing) whose every answer a test can replace."""

    def __init__(self, inner: Any = None) -> None:
        self.inner = inner
        self.requests: list[str] = []
        self.heads: Callable[[str | None, int], Any] | None = None
        self.page: Callable[[str, int, int], Any] | None = None
        self.info: Callable[[str], Any] | None = None

    def list_rooms(self, *, after: str | None = None, limit: int = 500) -> Any:
        self.requests.append(f"/rooms?after={after}&limit={limit}")
        if self.heads is not None:
            return self.heads(after, limit)
        return list(self.inner.list_rooms(after=after, limit=limit))

    def room_info(self, room_id: str) -> Any:
        self.requests.append(f"/rooms/{room_id}")
        if self.info is not None:
            return self.info(room_id)
        return self.inner.room_info(room_id)

    def read_events(self, room_id: str, *, since_seq: int, limit: int) -> Any:
        self.requests.append(f"/rooms/{room_id}/events?since_seq={since_seq}")
        if self.page is not None:
            return self.page(room_id, since_seq, limit)
        return self.inner.read_events(room_id, since_seq=since_seq, limit=limit)

    def change_token(self) -> Hashable | None:
        return None

    def describe(self) -> str:
        return "fake"

    def close(self) -> None:
        pass


def _statuses(report: PassReport) -> dict[str, str]:
    return {room.room_id: room.status for room in report.rooms}


def _still_owned(engine: Engine, room_id: str, gateway: str = GATEWAY_A, epoch: int = 1) -> None:
    """The room is still ``gateway``'s at ``epoch``, and it can still write."""
    state = rooms.room_state(engine, room_id=room_id)
    assert (state["authority_gateway_id"], state["authority_epoch"]) == (gateway, epoch)
    rooms.append_event(engine, room_id=room_id, event_id=f"still-{room_id}", kind="message.user",
                       actor={"kind": "user", "id": "u"}, payload={}, authority_gateway_id=gateway,
                       authority_epoch=epoch)


# --- 1. demotion only on proof ------------------------------------------------------------------------------------


def test_an_unrelated_store_with_a_same_named_room_never_demotes(engine: Engine, standby_target: str) -> None:
    """``replicate --from`` the wrong gateway: its "ops" is another room at a higher epoch."""
    host(engine, "ops", 4)
    other = extra_store(standby_target, name="unrelated")
    try:
        host(other, "ops", 7, gateway=GATEWAY_C, prefix="x")
        rooms.claim_authority(other, room_id="ops", expected_gateway_id=GATEWAY_C, expected_epoch=1,
                              new_gateway_id=GATEWAY_B, event_id="c2")
        before = room_log(engine, "ops")
        report = Replicator(EnginePageSource(other), engine, local_gateway_id=GATEWAY_A).sync_once()
        assert _statuses(report) == {"ops": REFUSED}
        assert "demotion refused" in report.rooms[0].reason and "not this room's" in report.rooms[0].reason
        assert room_log(engine, "ops") == before
        _still_owned(engine, "ops")
        assert verify(engine) == []
    finally:
        drop_store(other)


def test_a_listing_only_forger_never_demotes(engine: Engine) -> None:
    """An endpoint that answers only ``/rooms`` with one forged head: refused, nothing changes."""
    host(engine, "ops", 3)
    forger = Fake()
    forger.heads = lambda after, limit: [RoomHead("ops", GATEWAY_B, 9, 500, False)] if after is None else []

    def missing(room_id: str, since: int, limit: int) -> Any:
        raise SourceProtocolError("the source refused the request (404): no such page endpoint")

    forger.page = missing
    report = Replicator(forger, engine, local_gateway_id=GATEWAY_A).sync_once()
    assert _statuses(report) == {"ops": REFUSED} and "404" in report.rooms[0].reason
    _still_owned(engine, "ops")
    # One that answers pages too, at the forged epoch, with nothing in them (or garbage).
    forger.page = lambda room_id, since, limit: {"events": [], "cursor": since, "latest_seq": since,
                                                 "has_more": False, "authority": {"gateway_id": GATEWAY_B,
                                                                                  "epoch": 9}}
    replicator = Replicator(forger, engine, local_gateway_id=GATEWAY_A)
    refused = replicator.sync_once()
    assert _statuses(refused) == {"ops": REFUSED}
    assert "local events after seq 0 are missing from the source" in refused.rooms[0].reason
    _still_owned(engine, "ops")
    assert verify(engine) == []


def test_a_claim_naming_another_previous_authority_never_demotes(engine: Engine, standby_target: str) -> None:
    """The source holds the same events, then a claim from gateway C (not this gateway A)."""
    host(engine, "r", 5)
    other = extra_store(standby_target, name="copycat")
    try:
        host(other, "r", 0, gateway=GATEWAY_C)
        # The same events (ids and content) as A's log, written under C at epoch 1.
        for event in rooms.read_events(engine, room_id="r", since_seq=0)["events"]:
            rooms.append_event(other, room_id="r", event_id=event["event_id"], kind=event["kind"],
                               actor=event["actor"], payload=event["payload"], authority_gateway_id=GATEWAY_C,
                               authority_epoch=1)
        assert [row[1:] for row in room_log(other, "r")] == [row[1:] for row in room_log(engine, "r")]
        rooms.claim_authority(other, room_id="r", expected_gateway_id=GATEWAY_C, expected_epoch=1,
                              new_gateway_id=GATEWAY_B, event_id="claim-by-b")
        report = Replicator(EnginePageSource(other), engine, local_gateway_id=GATEWAY_A).sync_once()
        assert _statuses(report) == {"r": REFUSED}
        assert f"does not name {GATEWAY_A} at epoch 1 as the previous authority" in report.rooms[0].reason
        _still_owned(engine, "r")
    finally:
        drop_store(other)


def test_local_events_the_source_never_got_refuse_the_demotion(engine: Engine, standby: Engine) -> None:
    """A wrote after the standby's last pass, then B took over: B's log does not continue A's room."""
    host(engine, "r", 5)
    Replicator(EnginePageSource(engine), standby).sync_once()
    say(engine, "r", 2)  # never replicated
    replicas.promote_replica(standby, room_id="r", local_gateway_id=GATEWAY_B)
    report = Replicator(EnginePageSource(standby), engine, local_gateway_id=GATEWAY_A).sync_once()
    assert _statuses(report) == {"r": REFUSED}
    assert "local events from seq 6 to 7 are missing from the source" in report.rooms[0].reason
    _still_owned(engine, "r")


def test_a_local_write_during_the_proof_refuses_the_demotion(engine: Engine, standby: Engine) -> None:
    host(engine, "r", 3)
    Replicator(EnginePageSource(engine), standby).sync_once()
    replicas.promote_replica(standby, room_id="r", local_gateway_id=GATEWAY_B)
    source = Fake(EnginePageSource(standby))

    def page(room_id: str, since: int, limit: int) -> Any:
        if since == 0:
            say(engine, "r", 1)  # the old authority writes while its replicator reads the new one
        return source.inner.read_events(room_id, since_seq=since, limit=limit)

    source.page = page
    replicator = Replicator(source, engine, local_gateway_id=GATEWAY_A)
    report = replicator.sync_once()
    # The demotion is conditioned on the proven head (seq 3): nothing changes, and the next pass proves again.
    assert _statuses(report) == {"r": LOCAL}
    assert "not demoted" in report.rooms[0].reason and "written after the proof" in report.rooms[0].reason
    _still_owned(engine, "r")
    again = replicator.sync_once()
    assert _statuses(again) == {"r": REFUSED}
    assert "local events from seq 4 to" in again.rooms[0].reason and "missing from the source" in again.rooms[0].reason
    _still_owned(engine, "r")


def test_a_genuine_failover_still_demotes_even_across_pages_and_claims(engine: Engine, standby: Engine) -> None:
    """The proof reads the whole local log (several pages) and finds the claim after it."""
    host(engine, "r", 23)
    Replicator(EnginePageSource(engine), standby, page_limit=10).sync_once()
    replicas.promote_replica(standby, room_id="r", local_gateway_id=GATEWAY_B)
    say(standby, "r", 4, gateway=GATEWAY_B, epoch=2, prefix="b")
    rooms.claim_authority(standby, room_id="r", expected_gateway_id=GATEWAY_B, expected_epoch=2,
                          new_gateway_id=GATEWAY_C, event_id="to-c")
    source = Fake(EnginePageSource(standby))
    report = Replicator(source, engine, local_gateway_id=GATEWAY_A, page_limit=10).sync_once()
    assert _statuses(report) == {"r": DEMOTED}
    assert (report.rooms[0].authority_gateway_id, report.rooms[0].authority_epoch) == (GATEWAY_C, 3)
    assert sum("/events" in request for request in source.requests) == 3  # seqs 1-10, 11-20, 21-30
    state = rooms.room_state(engine, room_id="r")
    assert (state["authority_gateway_id"], state["authority_epoch"]) == (GATEWAY_C, 3)
    with pytest.raises(AuthorityConflictError):
        rooms.append_event(engine, room_id="r", event_id="stale", kind="message.user",
                           actor={"kind": "user", "id": "u"}, payload={}, authority_gateway_id=GATEWAY_A,
                           authority_epoch=1)
    assert verify(engine) == []


# --- 2. validated before use ----------------------------------------------------------------------------------------


def _hostile_kind(room_id: str, page: dict[str, Any]) -> dict[str, Any]:
    if room_id == "bad" and page["events"]:
        page["events"][0]["kind"] = ["x"]
    return page


def test_an_unhashable_kind_refuses_that_room_only(engine: Engine, standby: Engine) -> None:
    """Issue #25 item 2: ``"kind": ["x"]`` on a room replicated once raised TypeError out of sync_once."""
    host(engine, "bad", 2)
    host(engine, "good", 2)
    source = Fake(EnginePageSource(engine))
    replicator = Replicator(source, standby)
    assert _statuses(replicator.sync_once()) == {"bad": CAUGHT_UP, "good": CAUGHT_UP}
    say(engine, "bad", 1)
    say(engine, "good", 1)
    source.page = lambda room_id, since, limit: _hostile_kind(
        room_id, source.inner.read_events(room_id, since_seq=since, limit=limit))
    report = replicator.sync_once()
    assert _statuses(report) == {"bad": REFUSED, "good": CAUGHT_UP}
    assert "room 'bad'" in report.rooms[0].reason and "event.kind" in report.rooms[0].reason
    assert replica_log(standby, "good") == room_log(engine, "good")
    assert replicas.replica_state(standby, room_id="bad")["last_seq"] == 2 and verify(standby) == []


def test_an_unhashable_kind_over_http_refuses_that_room_only(engine: Engine, standby: Engine) -> None:
    host(engine, "bad", 2)
    host(engine, "good", 2)
    hostile = [False]

    class Hostile(EnginePageSource):
        def read_events(self, room_id: str, *, since_seq: int, limit: int) -> dict[str, Any]:
            page = super().read_events(room_id, since_seq=since_seq, limit=limit)
            return _hostile_kind(room_id, page) if hostile[0] else page

    with PageServer(Hostile(engine)) as server:
        source = HttpPageSource(server.url)
        try:
            replicator = Replicator(source, standby)
            assert _statuses(replicator.sync_once()) == {"bad": CAUGHT_UP, "good": CAUGHT_UP}
            say(engine, "bad", 1)
            say(engine, "good", 1)
            hostile[0] = True
            report = replicator.sync_once()
        finally:
            source.close()
    assert _statuses(report) == {"bad": REFUSED, "good": CAUGHT_UP} and "event.kind" in report.rooms[0].reason
    assert replica_log(standby, "good") == room_log(engine, "good") and verify(standby) == []


@pytest.mark.parametrize("listing", [
    "not a list", [1, 2], [RoomHead(5, GATEWAY_A, 1, 1, False)],  # type: ignore[arg-type]
    [RoomHead("b", GATEWAY_A, 1, 1, False), RoomHead("a", GATEWAY_A, 1, 1, False)],
    [RoomHead(f"r{n:03}", GATEWAY_A, 1, 1, False) for n in range(501)]])
def test_a_broken_listing_ends_the_pass_with_an_error(engine: Engine, standby: Engine, listing: Any) -> None:
    source = Fake()
    source.heads = lambda after, limit: listing
    report = Replicator(source, standby).sync_once()
    assert report.error.startswith("the source's room listing was refused") and not report.ok


def test_a_source_raising_its_own_errors_never_escapes(engine: Engine, standby: Engine) -> None:
    host(engine, "bad", 2)
    host(engine, "good", 2)
    source = Fake(EnginePageSource(engine))

    def broken(room_id: str, since: int, limit: int) -> Any:
        if room_id == "bad":
            raise KeyError("events")
        return source.inner.read_events(room_id, since_seq=since, limit=limit)

    source.page = broken
    report = Replicator(source, standby).sync_once()
    assert _statuses(report) == {"bad": REFUSED, "good": CAUGHT_UP}
    assert "the source failed on its page: KeyError" in report.rooms[0].reason

    def listing(after: str | None, limit: int) -> Any:
        raise ZeroDivisionError("oops")

    source.heads = listing
    failed = Replicator(source, standby).sync_once()
    assert "ZeroDivisionError" in failed.error


def test_run_goes_on_whatever_the_source_returns(engine: Engine, standby: Engine) -> None:
    """``replicate --follow`` is ``run()``: hostile data is reported per pass, never raised."""
    host(engine, "bad", 2)
    host(engine, "good", 2)
    source = Fake(EnginePageSource(engine))
    source.page = lambda room_id, since, limit: {"events": "x"} if room_id == "bad" else \
        source.inner.read_events(room_id, since_seq=since, limit=limit)
    answers = iter([None, "junk", [RoomHead("bad", GATEWAY_A, 1, [], False)]])  # type: ignore[arg-type]

    def heads(after: str | None, limit: int) -> Any:
        answer = next(answers, None)
        return answer if answer is not None and after is None else source.inner.list_rooms(after=after, limit=limit)

    source.heads = heads
    passes: list[PassReport] = []
    stop = threading.Event()

    def on_pass(report: PassReport) -> None:
        passes.append(report)
        if len(passes) == 4:
            stop.set()

    Replicator(source, standby, backoff=Backoff(base=0.0, maximum=0.0)).run(
        interval=0.001, stop=stop, on_pass=on_pass, max_error_delay=0.001)
    assert len(passes) == 4 and passes[1].error and passes[2].rooms[0].reason.startswith(
        "the source's listing of room 'bad' is invalid: latest_seq")
    assert _statuses(passes[3])["bad"] == REFUSED and _statuses(passes[3])["good"] == CAUGHT_UP


_JUNK = st.recursive(
    st.none() | st.booleans() | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats(allow_nan=True, allow_infinity=True) | st.text(max_size=6),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner, max_size=3),
    max_leaves=6)
_DELETE = object()
_PAGE_FIELDS = ["events", "cursor", "latest_seq", "has_more", "authority", "authority.gateway_id",
                "authority.epoch", "event.seq", "event.event_id", "event.kind", "event.actor", "event.payload",
                "event.authority_epoch", "event.created_at", "event.room_id", "event", "page"]
_HEAD_FIELDS = ["room_id", "authority_gateway_id", "authority_epoch", "latest_seq", "disbanded"]


def _mutated_page(page: dict[str, Any], where: str, value: Any) -> Any:
    if where == "page":
        return value
    if where.startswith("authority."):
        target, key = page["authority"], where.split(".")[1]
    elif where == "event":
        if not page["events"]:
            return page
        page["events"][-1] = value
        return page
    elif where.startswith("event."):
        if not page["events"]:
            return page
        target, key = page["events"][-1], where.split(".")[1]
    else:
        target, key = page, where
    if value is _DELETE:
        target.pop(key, None)
    else:
        target[key] = value
    return page


_hostility = st.one_of(
    st.tuples(st.just("page"), st.sampled_from(_PAGE_FIELDS), _JUNK | st.just(_DELETE)),
    st.tuples(st.just("page"), st.sampled_from(["latest_seq", "cursor", "event.seq", "authority.epoch"]),
              st.sampled_from([10**15, 2**63 - 1, 2**63, 0, -1])),
    st.tuples(st.just("head"), st.sampled_from(_HEAD_FIELDS), _JUNK),
    st.tuples(st.just("head"), st.sampled_from(["latest_seq", "authority_epoch"]),
              st.sampled_from([10**15, 2**63 - 1, 2**63, 0, -1])),
    st.tuples(st.just("info"), st.sampled_from(["name", "members", "room_id", "info"]), _JUNK))


_examples = itertools.count()


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                    HealthCheck.too_slow])
@given(attack=_hostility)
def test_hostile_values_refuse_that_room_only(engine: Engine, standby: Engine, attack: tuple[str, str, Any]) -> None:
    """Wrong types at every field of pages, heads and room infos, huge ints, nested junk, for a room replicated
    once (a fresh one per example), while "good" is genuine: sync_once raises nothing, keeps replicating "good",
    and everything stored verifies."""
    what, where, value = attack
    assume(not (what == "head" and where == "room_id" and value == "good"))  # a listing out of order
    bad = f"bad-{next(_examples)}"
    try:
        rooms.room_state(engine, room_id="good")
    except RoomNotFoundError:  # the first example
        host(engine, "good", 1)
    host(engine, bad, 1)
    inner = EnginePageSource(engine)
    source = Fake(inner)
    replicator = Replicator(source, standby, backoff=Backoff(base=0.0, maximum=0.0))
    assert _statuses(replicator.sync_once())[bad] == CAUGHT_UP  # replicated once, genuinely
    say(engine, bad, 1)
    say(engine, "good", 1)

    def page(room_id: str, since: int, limit: int) -> Any:
        real = inner.read_events(room_id, since_seq=since, limit=limit)
        return _mutated_page(real, where, value) if what == "page" and room_id == bad else real

    def heads(after: str | None, limit: int) -> Any:
        listed = inner.list_rooms(after=after, limit=limit)
        if what != "head":
            return listed
        changed = []
        for head in listed:
            if head.room_id == bad:
                if where == "room_id" and not isinstance(value, str):
                    continue  # a non-string id ends the walk: test_a_broken_listing_ends_the_pass_with_an_error
                head = dataclasses.replace(head, **{where: value})
            changed.append(head)
        unique = {head.room_id: head for head in changed}  # a junk id equal to another room's is left out
        return [unique[room_id] for room_id in sorted(unique)]

    def info(room_id: str) -> Any:
        real = inner.room_info(room_id)
        if what != "info" or room_id != bad:
            return real
        return value if where == "info" else dataclasses.replace(real, **{where: value})

    source.page, source.heads, source.info = page, heads, info
    if what == "info":  # a replicator that has not read the room's info yet
        replicator = Replicator(source, standby, backoff=Backoff(base=0.0, maximum=0.0))
    report = replicator.sync_once()  # raises nothing
    assert report.error == "" and report.bound == ""
    statuses = _statuses(report)
    event(f"{what}: {statuses.get(bad, 'not listed')}")
    assert statuses["good"] == CAUGHT_UP, report.summary()
    assert replica_log(standby, "good") == room_log(engine, "good")
    assert verify(standby) == []
    report.summary()  # every reported value is printable


# --- 3. bounded passes; no poison from one response -------------------------------------------------------------


def _endless(after: str | None, limit: int) -> list[RoomHead]:
    start = 0 if after is None else int(after[1:]) + 1
    return [RoomHead(f"r{n:012}", GATEWAY_A, 1, 3, True) for n in range(start, start + limit)]


@pytest.mark.parametrize("backend", ["sqlite"], indirect=True)  # the bound is the replicator's, on any backend
@pytest.mark.parametrize("workers", [1, 3])
def test_an_endless_listing_ends_the_pass_at_its_bound_in_flat_memory(standby: Engine, workers: int) -> None:
    source = Fake()
    source.heads = _endless
    replicator = Replicator(source, standby, workers=workers)
    tracemalloc.start()
    try:
        first = replicator.sync_once()
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert first.bound.startswith("the source listed more rooms than a pass takes") and not first.ok
    assert len(first.rooms) == 256 + 512 and first.count(SKIPPED) == 768 and first.error == ""
    assert "stopped at a bound" in first.summary()
    assert peak < 8 * 2**20, peak
    second = replicator.sync_once()  # resumes after the last room the first pass took
    assert second.rooms[0].room_id == "r000000000768" and len(second.rooms) == 768
    small = Replicator(source, standby, max_rooms_per_pass=10).sync_once()
    assert len(small.rooms) == 10 and small.bound


def _forever(room_id: str, since: int, limit: int) -> dict[str, Any]:
    """A source whose room never ends: one new event per page, always more to come."""
    event = {"room_id": room_id, "seq": since + 1, "event_id": f"f{since + 1}", "kind": "message.user",
             "actor": {"kind": "user", "id": "u"}, "authority_epoch": 1, "payload": {"t": "x" * 1000},
             "created_at": 1.0}
    return {"events": [event], "cursor": since + 1, "latest_seq": since + 2, "has_more": True,
            "authority": {"gateway_id": GATEWAY_A, "epoch": 1}}


@pytest.mark.parametrize("bound", ["pages", "bytes", "seconds"])
def test_a_room_that_never_ends_ends_the_pass_at_its_bound(standby: Engine, bound: str) -> None:
    source = Fake()
    source.heads = lambda after, limit: [RoomHead("endless", GATEWAY_A, 1, 10**6, False),
                                         RoomHead("later", GATEWAY_A, 1, 0, False)] if after is None else []
    source.page = _forever
    source.info = lambda room_id: RoomInfo(room_id, "Endless", [])
    ticks = iter(range(10**9))
    arguments: dict[str, Any] = {"pages": {"max_pages_per_pass": 40}, "bytes": {"max_bytes_per_pass": 30_000},
                                 "seconds": {"monotonic": lambda: float(next(ticks))}}[bound]
    replicator = Replicator(source, standby, **arguments)
    report = replicator.sync_once()
    assert f"max_{bound}_per_pass" in report.bound and _statuses(report) == {"endless": BEHIND}
    stored = replicas.replica_state(standby, room_id="endless")["last_seq"]
    assert 20 <= stored <= 700 and verify(standby) == []
    again = replicator.sync_once()  # resumes with the room cut short, from its stored seq
    assert again.rooms[0].room_id == "endless"
    assert replicas.replica_state(standby, room_id="endless")["last_seq"] > stored


def _poisoned_once(source: Fake, claim: int) -> None:
    calls = [0]

    def page(room_id: str, since: int, limit: int) -> dict[str, Any]:
        real: dict[str, Any] = source.inner.read_events(room_id, since_seq=since, limit=limit)
        calls[0] += 1
        if calls[0] == 1:
            real.update(latest_seq=claim, has_more=True)
        return real

    source.page = page


def test_one_page_claiming_a_huge_latest_seq_does_not_poison_the_replica(engine: Engine, standby: Engine) -> None:
    """Issue #25 item 3: a page claiming 10**15, then the truth (1): the replica is promotable."""
    host(engine, "r", 1)
    source = Fake(EnginePageSource(engine))
    _poisoned_once(source, 10**15)
    first = Replicator(source, standby, max_pages_per_room=1).sync_once()  # the lie is all this pass reads
    assert _statuses(first) == {"r": BEHIND}
    state = replicas.replica_state(standby, room_id="r")
    assert (state["last_seq"], state["latest_seq"]) == (1, 10**15)
    assert failover(standby, from_gateway=GATEWAY_A, local_gateway_id=GATEWAY_B,
                    dry_run=True).rooms[0].outcome == "not-caught-up"
    second = Replicator(source, standby).sync_once()  # the truth
    assert _statuses(second) == {"r": CAUGHT_UP} and "that claim was lowered" in second.rooms[0].reason
    state = replicas.replica_state(standby, room_id="r")
    assert (state["last_seq"], state["latest_seq"]) == (1, 1)
    assert failover(standby, from_gateway=GATEWAY_A, local_gateway_id=GATEWAY_B).rooms[0].outcome == "promoted"


def test_the_lie_and_the_truth_in_one_pass(engine: Engine, standby: Engine) -> None:
    host(engine, "r", 3)
    source = Fake(EnginePageSource(engine))
    _poisoned_once(source, 10**15)
    report = Replicator(source, standby, page_limit=2).sync_once()
    assert _statuses(report) == {"r": CAUGHT_UP} and report.rooms[0].latest_seq == 3
    state = replicas.replica_state(standby, room_id="r")
    assert (state["last_seq"], state["latest_seq"]) == (3, 3)


def test_a_head_claiming_a_huge_latest_seq_is_never_stored(engine: Engine, standby: Engine) -> None:
    host(engine, "r", 1)
    source = Fake(EnginePageSource(engine))
    source.heads = lambda after, limit: [dataclasses.replace(head, latest_seq=10**15)
                                         for head in source.inner.list_rooms(after=after, limit=limit)]
    replicator = Replicator(source, standby)
    replicator.sync_once()
    replicator.sync_once()
    state = replicas.replica_state(standby, room_id="r")
    assert (state["last_seq"], state["latest_seq"]) == (1, 1)
    assert failover(standby, from_gateway=GATEWAY_A, local_gateway_id=GATEWAY_B,
                    dry_run=True).rooms[0].outcome == "would-promote"


def test_a_room_gone_from_the_source_is_not_charged_to_the_proof(engine: Engine) -> None:
    """A forged head whose pages say the room is gone: the local room stays this gateway's."""
    host(engine, "ops", 1)
    forger = Fake()
    forger.heads = lambda after, limit: [RoomHead("ops", GATEWAY_B, 2, 1, False)] if after is None else []

    def gone(room_id: str, since: int, limit: int) -> Any:
        raise RoomNotFoundError("hosted room not found")

    forger.page = gone
    report = Replicator(forger, engine, local_gateway_id=GATEWAY_A).sync_once()
    assert _statuses(report) == {"ops": REFUSED} and "hosted room not found" in report.rooms[0].reason
    _still_owned(engine, "ops")


def test_documented_errors_only(engine: Engine, standby: Engine) -> None:
    with pytest.raises(HostedRoomError, match="max_rooms_per_pass"):
        Replicator(Fake(), standby, max_rooms_per_pass=0)
    with pytest.raises(HostedRoomError, match="max_seconds_per_pass"):
        Replicator(Fake(), standby, max_seconds_per_pass=float("nan"))


def test_replicate_follow_never_exits_because_of_a_source(engine: Engine, standby: Engine,
                                                          standby_target: str) -> None:
    """Issue #25 item 2 end to end: ``hostedrooms replicate --follow`` from an HTTP endpoint serving a page with
    ``"kind": ["x"]`` (after a first good pass) keeps following, reports the room refused, and stops cleanly on
    SIGTERM."""
    import signal
    import subprocess
    import sys
    import time

    host(engine, "bad", 2)
    host(engine, "good", 2)
    hostile = [False]

    class Hostile(EnginePageSource):
        def read_events(self, room_id: str, *, since_seq: int, limit: int) -> dict[str, Any]:
            page = super().read_events(room_id, since_seq=since_seq, limit=limit)
            return _hostile_kind(room_id, page) if hostile[0] else page

    def wait_for(condition: Callable[[], bool]) -> None:
        deadline = time.monotonic() + 60
        while not condition():
            assert time.monotonic() < deadline, "the follower did not get there within 60 s"
            time.sleep(0.02)

    def stored(room_id: str) -> int:
        try:
            return int(replicas.replica_state(standby, room_id=room_id)["last_seq"])
        except HostedRoomError:
            return 0

    with PageServer(Hostile(engine)) as server:
        follower = subprocess.Popen(
            [sys.executable, "-m", "hostedrooms.cli", "replicate", "--from", server.url, "--to", standby_target,
             "--follow", "--interval", "0.05", "--poll", "0"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            text=True)
        try:
            wait_for(lambda: stored("bad") == 2 and stored("good") == 2)
            hostile[0] = True
            say(engine, "bad", 1)
            say(engine, "good", 1)
            wait_for(lambda: stored("good") == 3)
            say(engine, "good", 1)
            wait_for(lambda: stored("good") == 4)  # still following after the refusal
            assert follower.poll() is None
        finally:
            follower.send_signal(signal.SIGTERM)
            out, err = follower.communicate(timeout=60)
    assert follower.returncode == 0, (out, err)
    assert "Traceback" not in err and out.splitlines()[-1].startswith("replicate: stopped after "), (out, err)
    assert "refused bad" in out and "event.kind" in out, out
    assert stored("bad") == 2 and verify(standby) == []


@pytest.mark.parametrize(("field", "value"), [
    ("authority_gateway_id", "a\nb"), ("authority_gateway_id", 7), ("authority_epoch", True), ("authority_epoch", 0),
    ("authority_epoch", 1.0), ("authority_epoch", 2**63), ("authority_epoch", "1"), ("latest_seq", -1),
    ("latest_seq", [1]), ("disbanded", "no"), ("disbanded", None)])
def test_a_bad_head_over_http_refuses_that_room_only(engine: Engine, standby: Engine, field: str, value: Any) -> None:
    """Issue #25 item 2 through HttpPageSource: one listed room with a bad field refuses that room, by name and
    field; the rooms listed beside it replicate (the whole listing was refused before)."""
    host(engine, "a-bad", 2)
    host(engine, "b-good", 2)

    class Hostile(EnginePageSource):
        def list_rooms(self, *, after: str | None = None, limit: int = 500) -> list[RoomHead]:
            heads = super().list_rooms(after=after, limit=limit)
            return [dataclasses.replace(head, **{field: value}) if head.room_id == "a-bad" else head
                    for head in heads]

    with PageServer(Hostile(engine)) as server:
        source = HttpPageSource(server.url)
        try:
            report = Replicator(source, standby).sync_once()
        finally:
            source.close()
    assert not report.error and _statuses(report) == {"a-bad": REFUSED, "b-good": CAUGHT_UP}
    assert "'a-bad'" in report.rooms[0].reason and field in report.rooms[0].reason
    assert replica_log(standby, "b-good") == room_log(engine, "b-good") and verify(standby) == []

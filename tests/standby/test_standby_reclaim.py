"""The returning authority's replicator finishes an unfinished takeover (issue #34, "a rerun of the same command
finishes the job, and so does the returning authority's replicator"): a room that a standby's failover fenced in
A's store and never promoted is given back to A by A's replicator reading the standby's store, never while (or
after) the standby promotes it, and a pass stopped half-way is finished by the next. Both backends."""

from __future__ import annotations

import threading
from collections.abc import Mapping
from typing import Any

import pytest
from sqlalchemy import Engine
from standby_support import GATEWAY_A, GATEWAY_B, host

from hostedrooms import replicas, rooms, verify
from hostedrooms.cli import main
from hostedrooms.errors import AuthorityConflictError, HostedRoomError
from hostedrooms.records import Actor
from hostedrooms.standby import EnginePageSource, Replicator, failover
from hostedrooms.standby.outcomes import PROMOTED, RELEASED, TAKEN_OVER
from hostedrooms.standby.reclaim import FENCED, RECLAIM_STEP, RECLAIMED
from hostedrooms.standby.replicator import LOCAL, REFUSED
from hostedrooms.standby.steps import step_hook

pytest_plugins = ["standby_fixtures"]

ROOMS = ["r-0", "r-1"]
USER: Actor = {"kind": "user", "id": "u"}


class Killed(Exception):
    """A process killed at a step boundary."""


def _write(engine: Engine, room_id: str, gateway: str, event_id: str) -> None:
    epoch = int(rooms.room_state(engine, room_id=room_id)["authority_epoch"])
    rooms.append_event(engine, room_id=room_id, event_id=event_id, kind="message.user", actor=USER, payload={},
                       authority_gateway_id=gateway, authority_epoch=epoch)


def _holder(engine: Engine, room_id: str) -> tuple[str, int]:
    state = rooms.room_state(engine, room_id=room_id, include_disbanded=True)
    return state["authority_gateway_id"], int(state["authority_epoch"])


def _writers(stores: Mapping[str, Engine], room_id: str) -> list[str]:
    found = []
    for gateway, engine in stores.items():
        try:
            if rooms.room_state(engine, room_id=room_id)["authority_gateway_id"] == gateway:
                found.append(gateway)
        except HostedRoomError:
            continue
    return found


def _killed_failover(engine: Engine, standby: Engine, where: str = "failover.caught_up") -> None:
    """B fences A's rooms, catches up and dies before promoting any."""
    for room_id in ROOMS:
        host(engine, room_id, 3)
    assert Replicator(EnginePageSource(engine), standby, local_gateway_id=GATEWAY_B).sync_once().error == ""

    def kill(name: str, details: Mapping[str, Any]) -> None:
        if name == where:
            raise Killed(name)

    with step_hook(kill), pytest.raises(Killed):
        failover(standby, from_gateway=GATEWAY_A, local_gateway_id=GATEWAY_B, catch_up_from=EnginePageSource(engine))
    assert [_holder(engine, room_id) for room_id in ROOMS] == [(GATEWAY_B, 2), (GATEWAY_B, 2)]  # fenced
    # r-1 (promoted last) has no writer until someone finishes the job
    assert _writers({GATEWAY_A: engine, GATEWAY_B: standby}, "r-1") == []


def _return_pass(engine: Engine, standby: Engine, **options: Any) -> Any:
    options.setdefault("reclaim_after", 0)
    return Replicator(EnginePageSource(standby), engine, local_gateway_id=GATEWAY_A, source_gateway_id=GATEWAY_B,
                      **options).sync_once()


def test_the_returning_authority_takes_back_rooms_the_standby_fenced_and_never_promoted(
        engine: Engine, standby: Engine) -> None:
    _killed_failover(engine, standby)
    report = _return_pass(engine, standby)
    assert report.error == "" and report.ok
    assert {room.room_id: room.status for room in report.rooms} == {"r-0": RECLAIMED, "r-1": RECLAIMED}
    assert "holds it again at epoch 3" in report.rooms[0].reason
    stores = {GATEWAY_A: engine, GATEWAY_B: standby}
    assert [_writers(stores, room_id) for room_id in ROOMS] == [[GATEWAY_A], [GATEWAY_A]]
    _write(engine, "r-0", GATEWAY_A, "after-return")
    with pytest.raises(HostedRoomError):  # B can never promote at the fence's epoch any more
        replicas.promote_replica(standby, room_id="r-1", local_gateway_id=GATEWAY_B)
    assert _return_pass(engine, standby).rooms == []  # nothing left to give back
    # A later failover from A (its operator's call) takes the rooms over again, with A's writes since
    rerun = failover(standby, from_gateway=GATEWAY_A, local_gateway_id=GATEWAY_B,
                     catch_up_from=EnginePageSource(engine))
    assert rerun.ok and {room.outcome for room in rerun.rooms} == {PROMOTED}
    assert [_writers(stores, room_id) for room_id in ROOMS] == [[GATEWAY_B], [GATEWAY_B]]
    assert "after-return" in [row["event_id"] for row in rooms.read_events(
        standby, room_id="r-0", since_seq=0, limit=100)["events"]]
    assert verify(engine) == [] and verify(standby) == []


def test_a_room_the_standby_promoted_is_never_taken_back(engine: Engine, standby: Engine) -> None:
    _killed_failover(engine, standby, where="failover.promoted")  # r-0 promoted on B, then B died
    assert _holder(standby, "r-0") == (GATEWAY_B, 2)
    _write(standby, "r-0", GATEWAY_B, "b-writes")
    report = _return_pass(engine, standby)
    statuses = {room.room_id: room.status for room in report.rooms}
    assert statuses.get("r-0", LOCAL) == LOCAL and statuses["r-1"] == RECLAIMED
    stores = {GATEWAY_A: engine, GATEWAY_B: standby}
    assert [_writers(stores, room_id) for room_id in ROOMS] == [[GATEWAY_B], [GATEWAY_A]]
    with pytest.raises(AuthorityConflictError):
        _write(engine, "r-0", GATEWAY_A, "a-too-late")
    assert _return_pass(engine, standby).rooms == [] or all(
        room.status == LOCAL for room in _return_pass(engine, standby).rooms)
    assert verify(engine) == [] and verify(standby) == []


def test_a_reclaim_stopped_between_its_two_writes_is_finished_by_the_next_pass_or_the_rerun(
        engine: Engine, standby: Engine) -> None:
    _killed_failover(engine, standby)

    def kill(name: str, details: Mapping[str, Any]) -> None:
        if name == RECLAIM_STEP and details["room_id"] == "r-0":
            raise Killed(name)

    with step_hook(kill), pytest.raises(Killed):
        _return_pass(engine, standby)
    stores = {GATEWAY_A: engine, GATEWAY_B: standby}
    assert _writers(stores, "r-0") == []  # B can no longer promote it; A has not claimed it yet
    with pytest.raises(HostedRoomError):
        replicas.promote_replica(standby, room_id="r-0", local_gateway_id=GATEWAY_B)
    rerun = failover(standby, from_gateway=GATEWAY_A, local_gateway_id=GATEWAY_B,
                     catch_up_from=EnginePageSource(engine))  # B's rerun finishes r-0's release
    assert {room.room_id: room.outcome for room in rerun.rooms}["r-0"] == RELEASED
    report = _return_pass(engine, standby)
    assert all(room.status != REFUSED for room in report.rooms), report.summary()
    assert [_writers(stores, room_id) for room_id in ROOMS] == [[GATEWAY_A], [rerun_holder(rerun, "r-1")]]
    assert verify(engine) == [] and verify(standby) == []


def rerun_holder(report: Any, room_id: str) -> str:
    return str({room.room_id: room.holder for room in report.rooms}[room_id])


def test_racing_the_standbys_rerun_each_room_gets_one_writer(engine: Engine, standby: Engine) -> None:
    """A's return pass and B's failover rerun run at once (A paused between its two writes of one room while
    B's rerun goes through): every room ends with exactly one writer, whoever won it."""
    _killed_failover(engine, standby)
    reached, go = threading.Event(), threading.Event()

    def pause(name: str, details: Mapping[str, Any]) -> None:
        if name == RECLAIM_STEP and threading.current_thread().name == "returning":
            reached.set()
            assert go.wait(60.0)

    outcome: list[Any] = []
    returning = threading.Thread(target=lambda: outcome.append(_return_pass(engine, standby)), name="returning")
    with step_hook(pause):
        returning.start()
        assert reached.wait(60.0)
        rerun = failover(standby, from_gateway=GATEWAY_A, local_gateway_id=GATEWAY_B,
                         catch_up_from=EnginePageSource(engine))
        go.set()
        returning.join(60.0)
    assert not returning.is_alive() and outcome and outcome[0].error == ""
    stores = {GATEWAY_A: engine, GATEWAY_B: standby}
    for room_id in ROOMS:
        assert len(_writers(stores, room_id)) == 1, (room_id, rerun.summary(), outcome[0].summary())
    assert {room.outcome for room in rerun.rooms} <= {PROMOTED, RELEASED, TAKEN_OVER}
    assert verify(engine) == [] and verify(standby) == []


def test_over_http_the_fenced_rooms_are_reported_with_what_to_run(engine: Engine, standby: Engine) -> None:
    _killed_failover(engine, standby)

    class Remote:
        """A source that serves the standby's pages without its store (as HttpPageSource does)."""

        def __init__(self, inner: EnginePageSource) -> None:
            self.inner = inner

        def __getattr__(self, name: str) -> Any:
            return getattr(self.inner, name)

    source: Any = Remote(EnginePageSource(standby))
    report = Replicator(source, engine, local_gateway_id=GATEWAY_A, source_gateway_id=GATEWAY_B,
                        reclaim_after=0).sync_once()
    assert {room.room_id: room.status for room in report.rooms} == {"r-0": FENCED, "r-1": FENCED}
    assert "hostedrooms failover" in report.rooms[0].reason and "FENCED".lower() in report.summary()
    assert _holder(engine, "r-0") == (GATEWAY_B, 2)  # nothing changed


def test_a_fresh_fence_is_left_to_its_failover(engine: Engine, standby: Engine) -> None:
    """While the fence is younger than ``reclaim_after`` the failover may still be running: the room is reported
    fenced and left alone; once older, it is given back."""
    _killed_failover(engine, standby)
    fenced_at = float(rooms.read_events(engine, room_id="r-0", since_seq=3, limit=1)["events"][0]["created_at"])
    early = _return_pass(engine, standby, reclaim_after=300, now=lambda: fenced_at + 299)
    assert {room.room_id: room.status for room in early.rooms} == {"r-0": FENCED, "r-1": FENCED}
    assert "not promoted there yet" in early.rooms[0].reason and early.ok
    assert _holder(engine, "r-0") == (GATEWAY_B, 2)
    late = _return_pass(engine, standby, reclaim_after=300, now=lambda: fenced_at + 301)
    assert {room.room_id: room.status for room in late.rooms} == {"r-0": RECLAIMED, "r-1": RECLAIMED}


@pytest.mark.parametrize("options", [{"source_gateway_id": ""}, {"source_gateway_id": 5},
                                     {"source_gateway_id": GATEWAY_A}, {"reclaim_after": -1},
                                     {"reclaim_after": "5"}, {"reclaim_after": float("nan")}])
def test_bad_reclaim_options_are_refused(engine: Engine, standby: Engine, options: dict[str, Any]) -> None:
    with pytest.raises(HostedRoomError):
        Replicator(EnginePageSource(standby), engine, local_gateway_id=GATEWAY_A, **options)


def test_the_replicate_command_gives_back_with_source_gateway(
        engine: Engine, standby: Engine, target: str, standby_target: str, capsys: pytest.CaptureFixture[str]) -> None:
    """``hostedrooms replicate --from <B's store> --to <A's store> --gateway A --source-gateway B``: a line per room
    given back, exit 0; without ``--source-gateway`` nothing is given back."""
    _killed_failover(engine, standby)
    plain = main(["replicate", "--from", standby_target, "--to", target, "--gateway", GATEWAY_A])
    capsys.readouterr()
    assert plain == 0 and _holder(engine, "r-0") == (GATEWAY_B, 2)
    code = main(["replicate", "--from", standby_target, "--to", target, "--gateway", GATEWAY_A,
                 "--source-gateway", GATEWAY_B, "--reclaim-after", "0"])
    out = capsys.readouterr().out
    assert code == 0, out
    assert "reclaimed r-0: fenced here for install:gw-b at epoch 2 and never promoted there" in out
    assert "(2 reclaimed)" in out and _holder(engine, "r-0") == (GATEWAY_A, 3)

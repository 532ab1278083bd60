"""Failover as a whole (issue #34 items 2 and 3): a takeover never changes ownership it cannot complete. Only rooms
the standby can promote are fenced; a room it cannot promote after all is given back; a run stopped anywhere is
finished by a rerun; two standbys racing take each room once, and the loser reports who took it. After every
completed run each room of the old authority has exactly one writer. Both backends."""

from __future__ import annotations

import dataclasses
import importlib
import threading
from collections.abc import Iterator, Mapping
from typing import Any

import pytest
from sqlalchemy import Engine
from standby_support import GATEWAY_A, GATEWAY_B, GATEWAY_C, drop_store, extra_store, host, room_log

from hostedrooms import replicas, rooms, verify
from hostedrooms.errors import AuthorityConflictError, CapacityExceededError
from hostedrooms.limits import LimitValues
from hostedrooms.standby import EnginePageSource, Replicator, failover
from hostedrooms.standby.outcomes import CAPACITY, CONFLICT, FENCED, PROMOTED, RELEASED, TAKEN_OVER
from hostedrooms.standby.steps import step_hook

pytest_plugins = ["standby_fixtures"]

takeover = importlib.import_module("hostedrooms.standby.takeover")
ROOMS = ["r-0", "r-1", "r-2"]
USER = {"kind": "user", "id": "u"}
BOUND = 60.0


class Killed(Exception):
    """A process killed at a step boundary."""


def _write(engine: Engine, room_id: str, gateway: str, event_id: str) -> None:
    """One append by ``gateway`` at the epoch the store records for it (raises if it may not write)."""
    epoch = int(rooms.room_state(engine, room_id=room_id)["authority_epoch"])
    rooms.append_event(engine, room_id=room_id, event_id=event_id, kind="message.user", actor=USER, payload={},
                       authority_gateway_id=gateway, authority_epoch=epoch)


def _writers(stores: Mapping[str, Engine], room_id: str) -> list[str]:
    """The gateways whose own store lets them write ``room_id`` (authoritative there, held by them, live)."""
    found = []
    for gateway, engine in stores.items():
        try:
            state = rooms.room_state(engine, room_id=room_id)
        except Exception:
            continue
        if state["authority_gateway_id"] == gateway:
            found.append(gateway)
    return found


def _setup(engine: Engine, standby: Engine) -> None:
    for room_id in ROOMS:
        host(engine, room_id, 3)
    assert Replicator(EnginePageSource(engine), standby, local_gateway_id=GATEWAY_B).sync_once().error == ""


def _outcomes(report: Any) -> dict[str, tuple[str, str | None]]:
    return {room.room_id: (room.outcome, room.holder) for room in report.rooms}


def test_a_room_whose_id_the_standby_already_hosts_is_never_fenced(engine: Engine, standby: Engine) -> None:
    _setup(engine, standby)
    host(standby, "r-1", 1, gateway=GATEWAY_B)  # the standby's own room of the same id
    report = failover(standby, from_gateway=GATEWAY_A, local_gateway_id=GATEWAY_B,
                      catch_up_from=EnginePageSource(engine))
    assert _outcomes(report) == {"r-0": (PROMOTED, GATEWAY_B), "r-1": (CONFLICT, GATEWAY_A),
                                 "r-2": (PROMOTED, GATEWAY_B)}
    assert "left with install:gw-a" in report.rooms[1].reason and not report.ok
    _write(engine, "r-1", GATEWAY_A, "still-a")  # the old authority still writes it: it has a writer
    rerun = failover(standby, from_gateway=GATEWAY_A, local_gateway_id=GATEWAY_B,
                     catch_up_from=EnginePageSource(engine))
    assert _outcomes(rerun)["r-1"] == (CONFLICT, GATEWAY_A)
    stores = {GATEWAY_A: engine, GATEWAY_B: standby}
    assert [_writers(stores, room_id) for room_id in ("r-0", "r-2")] == [[GATEWAY_B], [GATEWAY_B]]
    # (the standby's own "r-1" is another room: A's "r-1" is A's alone, unfenced in its store)
    assert rooms.room_state(engine, room_id="r-1")["authority_gateway_id"] == GATEWAY_A
    assert verify(engine) == [] and verify(standby) == []


def test_rooms_beyond_the_standbys_capacity_stay_with_the_old_authority(engine: Engine, standby: Engine) -> None:
    _setup(engine, standby)
    two = dataclasses.replace(LimitValues.read(), MAX_ACTIVE_ROOMS=2)
    report = failover(standby, from_gateway=GATEWAY_A, local_gateway_id=GATEWAY_B,
                      catch_up_from=EnginePageSource(engine), limits=two)
    assert _outcomes(report) == {"r-0": (PROMOTED, GATEWAY_B), "r-1": (PROMOTED, GATEWAY_B),
                                 "r-2": (CAPACITY, GATEWAY_A)}
    _write(engine, "r-2", GATEWAY_A, "still-a")
    stores = {GATEWAY_A: engine, GATEWAY_B: standby}
    assert all(len(_writers(stores, room_id)) == 1 for room_id in ROOMS)


def test_a_room_the_standby_cannot_promote_after_the_fence_is_given_back(
        engine: Engine, standby: Engine, monkeypatch: pytest.MonkeyPatch) -> None:
    """Its own writes used the bytes between the plan and the promotion: the fence is released to A at epoch 3,
    A writes on, and a later run takes the room over with every event."""
    _setup(engine, standby)
    real = takeover.promote_replica

    def full(target: Any, **options: Any) -> Any:
        if options["room_id"] == "r-1":
            raise CapacityExceededError("This Hosted Room Gateway reached its storage limit.",
                                        limit="MAX_GATEWAY_EVENT_BYTES")
        return real(target, **options)

    monkeypatch.setattr(takeover, "promote_replica", full)
    report = failover(standby, from_gateway=GATEWAY_A, local_gateway_id=GATEWAY_B,
                      catch_up_from=EnginePageSource(engine))
    assert _outcomes(report)["r-1"] == (RELEASED, GATEWAY_A) and "storage limit" in report.rooms[1].reason
    state = rooms.room_state(engine, room_id="r-1")
    assert (state["authority_gateway_id"], state["authority_epoch"]) == (GATEWAY_A, 3)
    _write(engine, "r-1", GATEWAY_A, "after-release")
    with pytest.raises(Exception, match="replica is not caught up"):
        replicas.promote_replica(standby, room_id="r-1", local_gateway_id=GATEWAY_B)  # never at the fence's epoch
    monkeypatch.setattr(takeover, "promote_replica", real)
    again = failover(standby, from_gateway=GATEWAY_A, local_gateway_id=GATEWAY_B,
                     catch_up_from=EnginePageSource(engine))
    assert _outcomes(again)["r-1"] == (PROMOTED, GATEWAY_B) and again.rooms[1].epoch == 4
    assert "after-release" in [row[1] for row in room_log(standby, "r-1")]
    with pytest.raises(AuthorityConflictError):
        _write(engine, "r-1", GATEWAY_A, "too-late")
    assert verify(engine) == [] and verify(standby) == []


@pytest.mark.parametrize("where", ["failover.planned", "failover.fenced", "failover.caught_up",
                                   "failover.promote", "failover.promoted"])
def test_a_run_killed_at_any_step_is_finished_by_a_rerun(engine: Engine, standby: Engine, where: str) -> None:
    _setup(engine, standby)

    def kill(name: str, details: Mapping[str, Any]) -> None:
        if name == where:
            raise Killed(name)

    with step_hook(kill), pytest.raises(Killed):
        failover(standby, from_gateway=GATEWAY_A, local_gateway_id=GATEWAY_B, catch_up_from=EnginePageSource(engine))
    stores = {GATEWAY_A: engine, GATEWAY_B: standby}
    assert all(len(_writers(stores, room_id)) <= 1 for room_id in ROOMS)  # never two writers, even stopped
    report = failover(standby, from_gateway=GATEWAY_A, local_gateway_id=GATEWAY_B,
                      catch_up_from=EnginePageSource(engine))
    assert report.ok and {room.outcome for room in report.rooms} <= {PROMOTED, TAKEN_OVER}
    assert all(_writers(stores, room_id) == [GATEWAY_B] for room_id in ROOMS)
    for room_id in ROOMS:
        assert [row[1] for row in room_log(standby, room_id)][:3] == [row[1] for row in room_log(engine, room_id)][:3]
    assert verify(engine) == [] and verify(standby) == []


@pytest.fixture
def third(engine: Engine) -> Iterator[Engine]:
    beside = (str(engine.url.database) if engine.url.get_backend_name() == "sqlite"
              else engine.url.render_as_string(hide_password=False))
    store = extra_store(beside, name="third")
    yield store
    drop_store(store)


def test_two_standbys_racing_take_each_room_once(engine: Engine, standby: Engine, third: Engine) -> None:
    names = [f"r{index:02d}" for index in range(12)]
    for room_id in names:
        host(engine, room_id, 2)
    for store, gateway in ((standby, GATEWAY_B), (third, GATEWAY_C)):
        assert Replicator(EnginePageSource(engine), store, local_gateway_id=gateway).sync_once().error == ""
    barrier = threading.Barrier(2)
    reports: dict[str, Any] = {}
    errors: list[BaseException] = []

    def run(store: Engine, gateway: str) -> None:
        try:
            barrier.wait(BOUND)
            reports[gateway] = failover(store, from_gateway=GATEWAY_A, local_gateway_id=gateway,
                                        catch_up_from=EnginePageSource(engine))
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(store, gateway)) for store, gateway in
               ((standby, GATEWAY_B), (third, GATEWAY_C))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(BOUND)
        assert not thread.is_alive()
    assert errors == []
    stores = {GATEWAY_A: engine, GATEWAY_B: standby, GATEWAY_C: third}
    for room_id in names:
        [writer] = _writers(stores, room_id)
        assert writer in (GATEWAY_B, GATEWAY_C)
        for gateway, report in reports.items():
            [room] = [room for room in report.rooms if room.room_id == room_id]
            assert room.holder == writer
            assert room.outcome == (PROMOTED if gateway == writer else TAKEN_OVER)
    assert reports[GATEWAY_B].ok and reports[GATEWAY_C].ok
    assert verify(standby) == [] and verify(third) == [] and verify(engine) == []


def test_a_stopped_catch_up_leaves_fenced_rooms_for_the_rerun(engine: Engine, standby: Engine,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    _setup(engine, standby)
    for room_id in ROOMS:
        _write(engine, room_id, GATEWAY_A, f"late-{room_id}")  # the catch-up has pages to read
    source = EnginePageSource(engine)
    original = source.read_events

    def unreachable(*args: Any, **kwargs: Any) -> Any:
        from hostedrooms.standby import SourceUnavailableError
        raise SourceUnavailableError("connection refused")

    monkeypatch.setattr(source, "read_events", unreachable)
    report = failover(standby, from_gateway=GATEWAY_A, local_gateway_id=GATEWAY_B, catch_up_from=source)
    assert not report.ok and {room.outcome for room in report.rooms} == {FENCED}
    monkeypatch.setattr(source, "read_events", original)
    rerun = failover(standby, from_gateway=GATEWAY_A, local_gateway_id=GATEWAY_B, catch_up_from=source)
    assert rerun.ok and {room.outcome for room in rerun.rooms} == {PROMOTED}
    for room_id in ROOMS:
        assert f"late-{room_id}" in [row[1] for row in room_log(standby, room_id)]

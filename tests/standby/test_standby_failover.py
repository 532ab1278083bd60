"""failover() promotes every caught-up replica of a silent authority and reports each room it could not
promote, and why; a dry run decides the same without writing. Both backends."""

from __future__ import annotations

import dataclasses

import pytest
from sqlalchemy import Engine
from standby_support import GATEWAY_A, GATEWAY_B, GATEWAY_C, MEMBERS, host, replica_ids, room_log, say

from hostedrooms import replicas, rooms, verify
from hostedrooms.errors import HostedRoomError
from hostedrooms.limits import LimitValues
from hostedrooms.standby import EnginePageSource, Replicator, failover
from hostedrooms.standby.failover import CAPACITY, CONFLICT, DISBANDED, NOT_CAUGHT_UP, PROMOTED, WOULD_PROMOTE

pytest_plugins = ["standby_fixtures"]


def _outcomes(report: object) -> dict[str, str]:
    return {room.room_id: room.outcome for room in report.rooms}  # type: ignore[attr-defined]


def _replicate(authority: Engine, standby: Engine, **options: object) -> None:
    Replicator(EnginePageSource(authority), standby, local_gateway_id=GATEWAY_B, **options).sync_once()  # type: ignore[arg-type]


def test_promotes_every_caught_up_replica_and_says_why_not_for_the_rest(engine: Engine, standby: Engine) -> None:
    host(engine, "alpha", 3)
    host(engine, "beta", 0)
    host(engine, "gone", 2)
    host(engine, "long", 30)
    host(engine, "dup", 1)
    host(engine, "theirs", 2)
    rooms.claim_authority(engine, room_id="theirs", expected_gateway_id=GATEWAY_A, expected_epoch=1,
                          new_gateway_id=GATEWAY_C, event_id="to-c")
    _replicate(engine, standby)
    rooms.disband_room(engine, room_id="gone", expected_gateway_id=GATEWAY_A, expected_epoch=1)
    say(engine, "long", 30)
    _replicate(engine, standby, page_limit=10, max_pages_per_room=1)  # "long" stays behind; the disband lands
    # A room of the same id was created here meanwhile (say, by hand): the replica cannot become it.
    rooms.create_room(standby, room_id="dup", name="Dup", members=MEMBERS, authority_gateway_id=GATEWAY_B)
    before = {room_id: replicas.replica_state(standby, room_id=room_id) for room_id in replica_ids(standby)}

    dry = failover(standby, from_gateway=GATEWAY_A, local_gateway_id=GATEWAY_B, dry_run=True)
    expected = {"alpha": WOULD_PROMOTE, "beta": WOULD_PROMOTE, "dup": CONFLICT, "gone": DISBANDED,
                "long": NOT_CAUGHT_UP}
    assert _outcomes(dry) == expected and not dry.ok
    assert {room_id: replicas.replica_state(standby, room_id=room_id) for room_id in replica_ids(standby)} == before
    assert [room["room_id"] for room in rooms.list_rooms(standby)] == ["dup"]

    report = failover(standby, from_gateway=GATEWAY_A, local_gateway_id=GATEWAY_B, now=50.0)
    assert _outcomes(report) == {**expected, "alpha": PROMOTED, "beta": PROMOTED}
    by_room = {room.room_id: room for room in report.rooms}
    assert (by_room["alpha"].epoch, by_room["alpha"].claim_seq) == (2, 4)
    assert (by_room["beta"].epoch, by_room["beta"].claim_seq) == (2, 1)
    assert [room.epoch for room in dry.rooms if room.promoted] == [2, 2]
    assert "seq 40 of the 60" in by_room["long"].reason and "disbanded" in by_room["gone"].reason
    assert report.summary() == f"promoted 2 of 5 rooms of {GATEWAY_A} on {GATEWAY_B}; 3 not promoted"
    assert room_log(standby, "alpha")[:3] == room_log(engine, "alpha")
    assert room_log(standby, "alpha")[3][2] == "authority.claimed"
    state = rooms.room_state(standby, room_id="alpha")
    assert (state["authority_gateway_id"], state["authority_epoch"]) == (GATEWAY_B, 2)
    # Refused replicas are intact; another gateway's replica was never considered.
    assert replica_ids(standby) == ["dup", "gone", "long", "theirs"]
    assert replicas.replica_state(standby, room_id="long") == before["long"]
    assert verify(standby) == []
    again = failover(standby, from_gateway=GATEWAY_A, local_gateway_id=GATEWAY_B)
    assert {room.room_id for room in again.rooms} == {"dup", "gone", "long"} and not again.promoted


def test_capacity_is_reported_and_the_dry_run_predicts_it(engine: Engine, standby: Engine) -> None:
    for room_id in ("r1", "r2", "r3"):
        host(engine, room_id, 2)
    _replicate(engine, standby)
    host(standby, "own", 0, gateway=GATEWAY_B)
    limits = dataclasses.replace(LimitValues.read(), MAX_ACTIVE_ROOMS=3)
    dry = failover(standby, from_gateway=GATEWAY_A, local_gateway_id=GATEWAY_B, dry_run=True, limits=limits)
    assert _outcomes(dry) == {"r1": WOULD_PROMOTE, "r2": WOULD_PROMOTE, "r3": CAPACITY}
    report = failover(standby, from_gateway=GATEWAY_A, local_gateway_id=GATEWAY_B, limits=limits)
    assert _outcomes(report) == {"r1": PROMOTED, "r2": PROMOTED, "r3": CAPACITY}
    assert "too many active Group Chats" in report.rooms[2].reason
    assert replica_ids(standby) == ["r3"] and verify(standby) == []


def test_failover_refuses_bad_identities(standby: Engine, monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(HostedRoomError, match="from_gateway is this gateway"):
        failover(standby, from_gateway=GATEWAY_B, local_gateway_id=GATEWAY_B)
    with pytest.raises(HostedRoomError, match="invalid from_gateway"):
        failover(standby, from_gateway="not an id!", local_gateway_id=GATEWAY_B)
    monkeypatch.delenv("HOSTEDROOMS_INSTALL_ID", raising=False)
    with pytest.raises(HostedRoomError, match="identity is unavailable"):
        failover(standby, from_gateway=GATEWAY_A)
    monkeypatch.setenv("HOSTEDROOMS_INSTALL_ID", "gw-b")
    assert failover(standby, from_gateway=GATEWAY_A).local_gateway == GATEWAY_B

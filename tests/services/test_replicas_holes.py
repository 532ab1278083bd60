"""The reference's takeover holes, closed (native API and facade), on SQLite and PostgreSQL.

Each test names the hole it covers (the numbering of the replicas issue):
1. ingest never lowers latest_seq; 2. promote refuses a replica that is not caught up; 3. a different owner at
the stored epoch, or overlapping events with different content, are refused; 4. promote and demote meet the
append capacity gates and keep event_bytes exact; 5. ingest validates what it stores; 6. a disbanded room's
replica cannot be promoted.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from apis import use_api
from factories import MEMBERS, A, B, ingest, lowered, stored_events
from factories import replica_event as event
from factories import replica_page as page
from factories import replica_snapshot as snapshot
from sqlalchemy import Engine

from hostedrooms import models, replicas, rooms, verify
from hostedrooms.compat import hosted_room_replicas as hrr
from hostedrooms.compat import hosted_rooms as hr
from hostedrooms.errors import HostedRoomError, ReplicaError

_api = use_api("replicas", "rooms", "verify")  # the tests on a database run on both APIs

NOT_CAUGHT_UP = "^replica is not caught up with the authority log; ingest the remaining pages first$"
OWNER_CONFLICT = "^page authority owner conflicts with the stored replica at the same epoch$"
EVENTS_CONFLICT = "^page events conflict with the stored replica$"
DISBANDED = "^replica log ends in room.disbanded; a disbanded room cannot be promoted$"


def room_bytes(engine: Engine, room_id: str = "r1") -> int:
    with engine.connect() as connection:
        return int(connection.execute(
            sa.select(models.rooms.c.event_bytes).where(models.rooms.c.room_id == room_id)).scalar_one())


# --- 1. latest_seq never decreases ------------------------------------------------------------------------------


def test_hole1_delayed_page_never_lowers_latest_seq(engine: Engine) -> None:
    ingest(engine, page(1, 2, latest=2))
    ingest(engine, page(3, 4, latest=10))  # the authority has moved on to seq 10
    delayed = ingest(engine, page(1, 2, latest=2))  # a page fetched earlier arrives late
    assert delayed["caught_up"] is False
    state = replicas.replica_state(engine, room_id="r1")
    assert (state["last_seq"], state["latest_seq"]) == (4, 10)
    missing_latest = page(5, 5)
    del missing_latest["latest_seq"]
    assert ingest(engine, missing_latest)["caught_up"] is False
    assert replicas.replica_state(engine, room_id="r1")["latest_seq"] == 10
    assert verify(engine) == []


# --- 2. promote refuses a replica that is not caught up ---------------------------------------------------------


def test_hole2_promote_refuses_a_partial_replica(engine: Engine) -> None:
    ingest(engine, page(1, 3, latest=5))
    before = snapshot(engine)
    with pytest.raises(ReplicaError, match=NOT_CAUGHT_UP):
        replicas.promote_replica(engine, room_id="r1", local_gateway_id=B)
    assert snapshot(engine) == before
    ingest(engine, page(4, 5))
    assert replicas.promote_replica(engine, room_id="r1", local_gateway_id=B)["claim_seq"] == 6


def test_hole2_facade_refuses_too(target: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HOSTEDROOMS_INSTALL_ID", "gw-b")
    hrr.ingest_page(target, room_id="r1", room_name="Team", members=MEMBERS, page=page(1, 1, latest=2))
    with pytest.raises(hrr.ReplicaError, match=NOT_CAUGHT_UP):
        hrr.promote_replica(target, room_id="r1")
    assert hrr.replica_state(target, room_id="r1")["last_seq"] == 1


# --- 3. forks are refused -----------------------------------------------------------------------------------------


def test_hole3_other_owner_at_the_same_epoch_is_refused(engine: Engine) -> None:
    ingest(engine, page(1, 2, gateway=A, epoch=2))
    before = snapshot(engine)
    with pytest.raises(ReplicaError, match=OWNER_CONFLICT):
        ingest(engine, page(3, 3, gateway=B, epoch=2))
    with pytest.raises(ReplicaError, match=OWNER_CONFLICT):
        ingest(engine, page(1, 2, gateway=B, epoch=2))  # even a page that adds nothing
    assert snapshot(engine) == before


@pytest.mark.parametrize("change", [
    {"payload": {"text": "forked"}}, {"event_id": "other"}, {"kind": "message.member"},
    {"actor": {"id": "u2", "kind": "user"}}, {"authority_epoch": None}])
def test_hole3_overlapping_events_with_other_content_are_refused(engine: Engine, change: dict[str, Any]) -> None:
    ingest(engine, page(1, 3))
    before = snapshot(engine)
    forked = page(2, 4)
    forked["events"][0].update(change)  # seq 2 differs from the stored seq 2
    with pytest.raises(ReplicaError, match=EVENTS_CONFLICT):
        ingest(engine, forked)
    assert snapshot(engine) == before  # seq 4 was not written either


def test_hole3_a_retry_with_another_timestamp_is_still_a_retry(engine: Engine) -> None:
    ingest(engine, page(1, 2))
    retry = page(1, 3)
    retry["events"][0]["created_at"] = 5.0
    retry["events"][0]["actor"] = {"kind": "user", "id": "u1"}  # key order is not content
    assert ingest(engine, retry)["ingested"] == 1


def test_hole3_reused_event_id_at_a_new_seq_is_refused(engine: Engine) -> None:
    ingest(engine, page(1, 2))
    before = snapshot(engine)
    duplicate = page(3, 3)
    duplicate["events"][0]["event_id"] = "e1"
    with pytest.raises(ReplicaError, match=EVENTS_CONFLICT):
        ingest(engine, duplicate)
    twice = page(3, 4)
    twice["events"][1]["event_id"] = "e3"
    with pytest.raises(ReplicaError, match="^page events repeat an event_id$"):
        ingest(engine, twice)
    assert snapshot(engine) == before


def test_hole3_facade_refuses_forks(target: str) -> None:
    hrr.ingest_page(target, room_id="r1", room_name="Team", members=MEMBERS, page=page(1, 1, epoch=2))
    with pytest.raises(hrr.ReplicaError, match=OWNER_CONFLICT):
        hrr.ingest_page(target, room_id="r1", room_name="Team", members=MEMBERS, page=page(2, 2, gateway=B, epoch=2))
    forked = page(1, 1, epoch=2)
    forked["events"][0]["payload"] = {"text": "forked"}
    with pytest.raises(hrr.ReplicaError, match=EVENTS_CONFLICT):
        hrr.ingest_page(target, room_id="r1", room_name="Team", members=MEMBERS, page=forked)


# --- 4. capacity gates and exact accounting ---------------------------------------------------------------------


def _replica_bytes(engine: Engine) -> int:
    return int(replicas.replica_state(engine, room_id="r1")["event_bytes"])


def accounted(stored: dict[str, Any]) -> int:
    """The bytes an event is accounted for: event_id + kind + canonical actor + canonical payload (UTF-8)."""
    def canonical(value: Any) -> str:
        return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)

    return len((stored["event_id"] + stored["kind"] + canonical(stored["actor"]) + canonical(stored["payload"]))
               .encode("utf-8"))


def test_hole4_promote_charges_the_log_and_the_claim(engine: Engine) -> None:
    pg = page(1, 3)
    pg["events"][0]["payload"] = {"text": "héllo ✓"}  # multi-byte text is counted in bytes
    ingest(engine, pg)
    copied = _replica_bytes(engine)
    assert copied == sum(accounted(e) for e in pg["events"])
    replicas.promote_replica(engine, room_id="r1", local_gateway_id=B)
    claim = stored_events(engine)[-1]
    assert room_bytes(engine) == copied + accounted(claim)
    assert verify(engine) == []  # event_bytes equals the bytes the events hold


def test_hole4_promote_respects_the_active_room_cap(engine: Engine) -> None:
    rooms.create_room(engine, room_id="other", name="Other", members=[], authority_gateway_id=B, now=1.0)
    ingest(engine, page(1, 2))
    before = snapshot(engine)
    with pytest.raises(HostedRoomError, match="^This host has too many active Group Chats"):
        replicas.promote_replica(engine, room_id="r1", local_gateway_id=B, limits=lowered(MAX_ACTIVE_ROOMS=1))
    assert snapshot(engine) == before
    replicas.promote_replica(engine, room_id="r1", local_gateway_id=B, limits=lowered(MAX_ACTIVE_ROOMS=2))


def test_hole4_promote_respects_the_room_limits_with_the_control_reserve(engine: Engine) -> None:
    ingest(engine, page(1, 4))
    before = snapshot(engine)
    # Four events plus the claim: the claim may use the control reserve, but not beyond it.
    with pytest.raises(HostedRoomError, match="^This Group Chat reached its history limit"):
        replicas.promote_replica(engine, room_id="r1", local_gateway_id=B,
                                 limits=lowered(MAX_EVENTS_PER_ROOM=2, CONTROL_EVENT_COUNT_RESERVE=2))
    copied = _replica_bytes(engine)
    with pytest.raises(HostedRoomError, match="^This Group Chat reached its storage limit"):
        replicas.promote_replica(engine, room_id="r1", local_gateway_id=B,
                                 limits=lowered(MAX_ROOM_EVENT_BYTES=copied, CONTROL_EVENT_BYTE_RESERVE=10))
    assert snapshot(engine) == before
    result = replicas.promote_replica(engine, room_id="r1", local_gateway_id=B,
                                      limits=lowered(MAX_EVENTS_PER_ROOM=4, CONTROL_EVENT_COUNT_RESERVE=1,
                                                     MAX_ROOM_EVENT_BYTES=copied))
    assert result["claim_seq"] == 5  # the claim fits the reserves exactly


def test_hole4_promote_respects_the_gateway_budget_after_pruning(engine: Engine) -> None:
    ingest(engine, page(1, 3))
    copied = _replica_bytes(engine)
    rooms.create_room(engine, room_id="old", name="Old", members=[], authority_gateway_id=B, now=1.0)
    rooms.append_event(engine, room_id="old", event_id="big", kind="message.user", actor={"kind": "user", "id": "u"},
                       payload={"text": "x" * 500}, authority_gateway_id=B, authority_epoch=1, now=1.0)
    old = room_bytes(engine, "old")
    tight = lowered(MAX_GATEWAY_EVENT_BYTES=old + copied - 1, CONTROL_EVENT_BYTE_RESERVE=0)
    before = snapshot(engine)
    with pytest.raises(HostedRoomError, match="^Group Chat storage is full on this host"):
        replicas.promote_replica(engine, room_id="r1", local_gateway_id=B, limits=tight)
    assert snapshot(engine) == before  # the replica is intact
    # Once the old room is disbanded it is pruned to make room, and its id stays retired.
    rooms.disband_room(engine, room_id="old", expected_gateway_id=B, expected_epoch=1, now=2.0)
    loose = lowered(MAX_GATEWAY_EVENT_BYTES=copied + 1, CONTROL_EVENT_BYTE_RESERVE=1024)
    replicas.promote_replica(engine, room_id="r1", local_gateway_id=B, limits=loose, now=3.0)
    assert [room["room_id"] for room in rooms.list_rooms(engine, include_disbanded=True)] == ["r1"]
    with pytest.raises(HostedRoomError, match="history expired"):
        rooms.room_state(engine, room_id="old", include_disbanded=True)
    assert verify(engine) == []


def test_hole4_copied_bytes_get_no_control_reserve(engine: Engine) -> None:
    ingest(engine, page(1, 3))
    copied = _replica_bytes(engine)
    # The reserve would cover the copied log, but only control events (the claim) may use it.
    with pytest.raises(HostedRoomError, match="^Group Chat storage is full on this host"):
        replicas.promote_replica(engine, room_id="r1", local_gateway_id=B,
                                 limits=lowered(MAX_GATEWAY_EVENT_BYTES=copied - 1))


def test_hole4_demote_charges_its_event_and_meets_the_limits(engine: Engine) -> None:
    rooms.create_room(engine, room_id="r1", name="Team", members=MEMBERS, authority_gateway_id=A, now=1.0)
    rooms.append_event(engine, room_id="r1", event_id="e1", kind="message.user", actor={"kind": "user", "id": "u"},
                       payload={}, authority_gateway_id=A, authority_epoch=1, now=1.0)
    before = snapshot(engine)
    with pytest.raises(HostedRoomError, match="^This Group Chat reached its history limit"):
        replicas.demote_room(engine, room_id="r1", observed_gateway_id=B, observed_epoch=2, local_gateway_id=A,
                             limits=lowered(MAX_EVENTS_PER_ROOM=1, CONTROL_EVENT_COUNT_RESERVE=0))
    with pytest.raises(HostedRoomError, match="^Group Chat storage is full on this host"):
        replicas.demote_room(engine, room_id="r1", observed_gateway_id=B, observed_epoch=2, local_gateway_id=A,
                             limits=lowered(MAX_GATEWAY_EVENT_BYTES=room_bytes(engine), CONTROL_EVENT_BYTE_RESERVE=0))
    assert snapshot(engine) == before
    held = room_bytes(engine)
    replicas.demote_room(engine, room_id="r1", observed_gateway_id=B, observed_epoch=2, local_gateway_id=A,
                         limits=lowered(MAX_EVENTS_PER_ROOM=1, CONTROL_EVENT_COUNT_RESERVE=1))
    assert room_bytes(engine) > held
    assert verify(engine) == []


def test_hole4_facade_reads_room_limits_from_the_room_facade(target: str, monkeypatch: pytest.MonkeyPatch) -> None:
    hr.create_room(target, room_id="r1", name="Team", members=MEMBERS, authority_gateway_id="install:gw-a")
    monkeypatch.setenv("HOSTEDROOMS_INSTALL_ID", "gw-a")
    monkeypatch.setattr(hr, "MAX_EVENTS_PER_ROOM", 0)
    monkeypatch.setattr(hr, "CONTROL_EVENT_COUNT_RESERVE", 0)
    with pytest.raises(hrr.HostedRoomError, match="history limit"):
        hrr.demote_room(target, room_id="r1", observed_gateway_id=B, observed_epoch=2)
    assert hr.room_state(target, room_id="r1")["authority_epoch"] == 1


# --- 5. ingest validates what it stores ---------------------------------------------------------------------------


BAD_EVENTS: list[tuple[dict[str, Any], str]] = [
    ({"room_id": "r2"}, "event.room_id does not match the replicated room"),
    ({"room_id": None}, "event.room_id does not match the replicated room"),
    ({"authority_epoch": 0}, "event.authority_epoch must be a positive integer"),
    ({"authority_epoch": -3}, "event.authority_epoch must be a positive integer"),
    ({"authority_epoch": "1"}, "event.authority_epoch must be a positive integer"),
    ({"authority_epoch": 2}, "event.authority_epoch is newer than the page authority"),
    ({"actor": {"id": {1, 2}}}, "actor must be JSON-serializable"),
    ({"payload": {"when": object()}}, "payload must be JSON-serializable"),
    ({"actor": {"id": "x" * 5000}}, "actor is too large"),
    ({"created_at": "yesterday"}, "event.created_at must be a finite number"),
    ({"created_at": float("inf")}, "event.created_at must be a finite number"),
    ({"seq": 2**63}, "event.seq must be a positive integer"),
]


@pytest.mark.parametrize(("change", "message"), BAD_EVENTS)
def test_hole5_events_are_validated_before_storing(engine: Engine, change: dict[str, Any], message: str) -> None:
    ingest(engine, page(1, 1))
    before = snapshot(engine)
    bad = page(2, 3)
    bad["events"][1].update(change)
    with pytest.raises(ReplicaError, match=f"^{message}$"):
        ingest(engine, bad)
    assert snapshot(engine) == before


def test_hole5_huge_epoch_and_latest_seq_are_refused(engine: Engine) -> None:
    with pytest.raises(ReplicaError, match="^page.authority.epoch must be a positive integer$"):
        ingest(engine, page(1, 1, epoch=2**63))
    huge = page(1, 1)
    huge["latest_seq"] = 2**63
    with pytest.raises(ReplicaError, match="^page.latest_seq is out of range$"):
        ingest(engine, huge)
    assert snapshot(engine)["hosted_room_replicas"] == []


def test_hole5_legacy_events_without_epoch_are_kept(engine: Engine) -> None:
    pg = page(1, 1)
    pg["events"][0]["authority_epoch"] = None
    ingest(engine, pg)
    replicas.promote_replica(engine, room_id="r1", local_gateway_id=B)
    assert [e["authority_epoch"] for e in stored_events(engine)] == [None, 2]


def test_hole5_facade_gives_replica_errors(tmp_path: Path) -> None:
    pg = page(1, 1)
    pg["events"][0]["actor"] = {"id": {1}}
    with pytest.raises(hrr.ReplicaError, match="^actor must be JSON-serializable$"):
        hrr.ingest_page(tmp_path / "s.db", room_id="r1", room_name="Team", members=MEMBERS, page=pg)
    assert not (tmp_path / "s.db").exists()


# --- 6. a disbanded room stays gone ---------------------------------------------------------------------------------


def test_hole6_disbanded_log_is_not_promoted(engine: Engine) -> None:
    disbanded = page(1, 3)
    disbanded["events"][2] = event(3, event_id="system:room-disbanded", kind="room.disbanded",
                                   actor={"id": "room-control", "kind": "system"}, payload={"room_id": "r1"})
    ingest(engine, disbanded)
    before = snapshot(engine)
    with pytest.raises(ReplicaError, match=DISBANDED):
        replicas.promote_replica(engine, room_id="r1", local_gateway_id=B)
    assert snapshot(engine) == before
    assert rooms.list_rooms(engine, include_disbanded=True) == []


def test_hole6_facade_refuses_too(target: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HOSTEDROOMS_INSTALL_ID", "gw-b")
    disbanded = page(1, 1)
    disbanded["events"][0] = event(1, event_id="system:room-disbanded", kind="room.disbanded",
                                   actor={"id": "room-control", "kind": "system"}, payload={"room_id": "r1"})
    hrr.ingest_page(target, room_id="r1", room_name="Team", members=MEMBERS, page=disbanded)
    with pytest.raises(hrr.ReplicaError, match=DISBANDED):
        hrr.promote_replica(target, room_id="r1")
    assert hrr.replica_state(target, room_id="r1")["last_seq"] == 1

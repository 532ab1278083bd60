"""Replicas: the reference's ingest / state / promote / demote behaviour, on SQLite and PostgreSQL
(native API and the seed-compatible facade)."""

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
from hostedrooms.errors import (
    AuthorityConflictError,
    HostedRoomError,
    ReplicaEpochRegressionError,
    ReplicaError,
    ReplicaGapError,
    RoomConflictError,
)

_api = use_api("replicas", "rooms", "verify")  # the tests on a database run on both APIs

C = "install:gw-c"


# --- ingest ----------------------------------------------------------------------------------------------------


def test_ingest_pages_in_order_then_state(engine: Engine) -> None:
    first = ingest(engine, page(1, 3, latest=5))
    assert first == {"room_id": "r1", "stored_seq": 3, "ingested": 3,
                     "authority": {"gateway_id": A, "epoch": 1}, "caught_up": False}
    second = ingest(engine, page(4, 5), now=1001.0)
    assert second["stored_seq"] == 5 and second["ingested"] == 2 and second["caught_up"] is True
    state = replicas.replica_state(engine, room_id="r1")
    sizes = sum(len(json.dumps(e["actor"], sort_keys=True, separators=(",", ":")))
                + len(json.dumps(e["payload"], sort_keys=True, separators=(",", ":")))
                + len(e["event_id"]) + len(e["kind"]) for e in page(1, 5)["events"])
    assert state == {"room_id": "r1", "name": "Team", "members": MEMBERS, "authority": {"gateway_id": A, "epoch": 1},
                     "last_seq": 5, "latest_seq": 5, "event_bytes": sizes, "created_at": 1000.0,
                     "updated_at": 1001.0}
    assert verify(engine) == []


def test_ingest_is_idempotent_for_old_pages(engine: Engine) -> None:
    ingest(engine, page(1, 3))
    ingest(engine, page(4, 4))
    before = snapshot(engine)["hosted_room_replica_events"]
    again = ingest(engine, page(1, 3), now=2000.0)
    assert again == {"room_id": "r1", "stored_seq": 4, "ingested": 0, "authority": {"gateway_id": A, "epoch": 1},
                     "caught_up": True}
    partly = ingest(engine, page(3, 6), now=2001.0)
    assert partly["ingested"] == 2 and partly["stored_seq"] == 6
    after = snapshot(engine)["hosted_room_replica_events"]
    assert after[:4] == before
    assert replicas.replica_state(engine, room_id="r1")["updated_at"] == 2001.0
    assert verify(engine) == []


def test_missing_created_at_is_stamped_with_ingest_time(engine: Engine) -> None:
    pg = page(1, 1)
    del pg["events"][0]["created_at"]
    ingest(engine, pg, now=1234.5)
    with engine.connect() as connection:
        assert connection.execute(sa.select(models.replica_events.c.created_at)).scalar_one() == 1234.5


def test_gaps_are_refused(engine: Engine) -> None:
    with pytest.raises(ReplicaGapError, match="^page skips sequences the replica has not stored$"):
        ingest(engine, page(2, 3))
    ingest(engine, page(1, 2))
    before = snapshot(engine)
    with pytest.raises(ReplicaGapError, match="^page skips sequences the replica has not stored$"):
        ingest(engine, page(4, 5))
    broken = page(3, 5)
    del broken["events"][1]
    with pytest.raises(ReplicaGapError, match="^page events must be contiguous$"):
        ingest(engine, broken)
    assert snapshot(engine) == before


def test_older_epoch_is_refused_and_newer_epoch_adopted(engine: Engine) -> None:
    ingest(engine, page(1, 2, epoch=2, gateway=B))
    before = snapshot(engine)
    with pytest.raises(ReplicaEpochRegressionError,
                       match="^page authority epoch is older than the stored replica epoch$"):
        ingest(engine, page(1, 2, epoch=1))
    assert snapshot(engine) == before
    result = ingest(engine, page(3, 3, epoch=3, gateway=A))
    assert result["authority"] == {"gateway_id": A, "epoch": 3}
    assert replicas.replica_state(engine, room_id="r1")["authority"] == {"gateway_id": A, "epoch": 3}


def test_empty_page_creates_an_empty_replica(engine: Engine) -> None:
    result = ingest(engine, page(1, 0))
    assert result == {"room_id": "r1", "stored_seq": 0, "ingested": 0, "authority": {"gateway_id": A, "epoch": 1},
                      "caught_up": True}
    assert replicas.replica_state(engine, room_id="r1")["last_seq"] == 0


def test_name_and_members_follow_the_latest_page(engine: Engine) -> None:
    ingest(engine, page(1, 1))
    replicas.ingest_page(engine, room_id="r1", room_name="Renamed", members=[{"id": "m2"}], page=page(2, 2), now=1.0)
    state = replicas.replica_state(engine, room_id="r1")
    assert state["name"] == "Renamed" and state["members"] == [{"id": "m2"}]


BAD_INGESTS: list[tuple[dict[str, Any], type[Exception], str]] = [
    ({"room_id": 7}, HostedRoomError, "room_id must be a string"),
    ({"room_id": "bad id"}, HostedRoomError, "invalid room_id"),
    ({"room_name": " "}, HostedRoomError, "invalid room name"),
    ({"members": {}}, HostedRoomError, "members must be a list"),
    ({"members": ["x"]}, HostedRoomError, "each room member must be an object"),
    ({"page": []}, ReplicaError, "page must be an object"),
    ({"page": {"events": {}, "authority": {}}}, ReplicaError, "page.events must be a list"),
    ({"page": {"events": []}}, ReplicaError, "page.authority is required for replication"),
    ({"page": {"events": [], "authority": {"epoch": 1}}}, HostedRoomError,
     "page.authority.gateway_id must be a string"),
    ({"page": {"events": [], "authority": {"gateway_id": "a b", "epoch": 1}}}, HostedRoomError,
     "invalid page.authority.gateway_id"),
    ({"page": {"events": [], "authority": {"gateway_id": A, "epoch": True}}}, ReplicaError,
     "page.authority.epoch must be a positive integer"),
    ({"page": {"events": [], "authority": {"gateway_id": A, "epoch": 0}}}, ReplicaError,
     "page.authority.epoch must be a positive integer"),
    ({"page": {"events": ["x"], "authority": {"gateway_id": A, "epoch": 1}}}, ReplicaError,
     "page events must be objects"),
    ({"page": {"events": [event(0)], "authority": {"gateway_id": A, "epoch": 1}}}, ReplicaError,
     "event.seq must be a positive integer"),
    ({"page": {"events": [event(1, event_id="")], "authority": {"gateway_id": A, "epoch": 1}}}, ReplicaError,
     "event.event_id must be a non-empty string"),
    ({"page": {"events": [event(1, kind=None)], "authority": {"gateway_id": A, "epoch": 1}}}, ReplicaError,
     "event.kind must be a non-empty string"),
    ({"page": {"events": [event(1, actor="u1")], "authority": {"gateway_id": A, "epoch": 1}}}, ReplicaError,
     "event.actor must be an object"),
]


@pytest.mark.parametrize(("overrides", "error", "message"), BAD_INGESTS)
def test_bad_ingest_is_refused_before_the_database(
    engine: Engine, overrides: dict[str, Any], error: type[Exception], message: str
) -> None:
    ingest(engine, page(1, 1))
    before = snapshot(engine)
    arguments: dict[str, Any] = {"room_id": "r1", "room_name": "Team", "members": MEMBERS, "page": page(2, 2)}
    arguments.update(overrides)
    with pytest.raises(error, match=f"^{message}$"):
        replicas.ingest_page(engine, now=5.0, **arguments)
    assert snapshot(engine) == before


def test_missing_payload_is_refused(engine: Engine) -> None:
    pg = page(1, 1)
    del pg["events"][0]["payload"]
    with pytest.raises(ReplicaError, match="^event.payload is required$"):
        ingest(engine, pg)
    assert snapshot(engine)["hosted_room_replicas"] == []


def test_replica_room_cap(engine: Engine) -> None:
    capped = lowered(MAX_REPLICA_ROOMS=2)
    ingest(engine, page(1, 1, room_id="r1"), room_id="r1", limits=capped)
    ingest(engine, page(1, 1, room_id="r2"), room_id="r2", limits=capped)
    with pytest.raises(ReplicaError, match="^replica room capacity exhausted$"):
        ingest(engine, page(1, 1, room_id="r3"), room_id="r3", limits=capped)
    ingest(engine, page(2, 2, room_id="r2"), room_id="r2", limits=capped)  # existing replicas still grow
    assert len(snapshot(engine)["hosted_room_replicas"]) == 2


def test_replica_event_byte_cap(engine: Engine) -> None:
    ingest(engine, page(1, 1))
    one = replicas.replica_state(engine, room_id="r1")["event_bytes"]
    capped = lowered(MAX_REPLICA_EVENT_BYTES=one * 2)
    ingest(engine, page(2, 2), limits=capped)
    before = snapshot(engine)
    with pytest.raises(ReplicaError, match="^replica event storage exhausted$"):
        ingest(engine, page(3, 3), limits=capped)
    assert snapshot(engine) == before


def test_replica_state_of_unknown_room(engine: Engine) -> None:
    with pytest.raises(ReplicaError, match="^replica not found$"):
        replicas.replica_state(engine, room_id="r1")
    with pytest.raises(HostedRoomError, match="^invalid room_id$"):
        replicas.replica_state(engine, room_id="")


# --- promote ---------------------------------------------------------------------------------------------------


def test_promote_copies_the_log_and_claims_the_next_epoch(engine: Engine) -> None:
    ingest(engine, page(1, 3))
    promoted = replicas.promote_replica(engine, room_id="r1", reason="host-lost", now=2000.0, local_gateway_id=B)
    assert promoted == {"room_id": "r1", "authority_gateway_id": B, "authority_epoch": 2,
                        "previous_gateway_id": A, "previous_epoch": 1, "claim_seq": 4, "latest_seq": 4}
    log = stored_events(engine)
    assert [(e["seq"], e["event_id"], e["authority_epoch"]) for e in log] == [
        (1, "e1", 1), (2, "e2", 1), (3, "e3", 1), (4, "system:authority-claimed:2", 2)]
    assert [e["created_at"] for e in log] == [101.0, 102.0, 103.0, 2000.0]
    assert log[0]["payload"] == {"text": "hello 1"}
    claim = log[3]
    assert claim["kind"] == "authority.claimed"
    assert claim["actor"] == {"kind": "system", "id": "authority-control"}
    assert claim["payload"] == {"previous_gateway_id": A, "authority_gateway_id": B, "authority_epoch": 2,
                                "promoted_from_replica": True, "reason": "host-lost"}
    state = rooms.room_state(engine, room_id="r1")
    assert (state["authority_gateway_id"], state["authority_epoch"], state["latest_seq"]) == (B, 2, 4)
    assert (state["name"], state["members"], state["revision"]) == ("Team", MEMBERS, 1)
    assert state["authority_claim"]["event_id"] == "system:authority-claimed:2"
    with pytest.raises(ReplicaError, match="^replica not found$"):
        replicas.replica_state(engine, room_id="r1")
    assert snapshot(engine)["hosted_room_replica_events"] == []
    assert verify(engine) == []
    appended = rooms.append_event(
        engine, room_id="r1", event_id="after", kind="message.user", actor={"kind": "user", "id": "u1"},
        payload={}, authority_gateway_id=B, authority_epoch=2, now=2001.0)
    assert appended["seq"] == 5


def test_promote_refusals(engine: Engine) -> None:
    with pytest.raises(ReplicaError, match="^replica not found$"):
        replicas.promote_replica(engine, room_id="r1", local_gateway_id=B)
    ingest(engine, page(1, 1, gateway=B))
    before = snapshot(engine)
    with pytest.raises(ReplicaError, match="^this gateway already holds the room authority$"):
        replicas.promote_replica(engine, room_id="r1", local_gateway_id=B)
    rooms.create_room(engine, room_id="r1", name="Team", members=MEMBERS, authority_gateway_id=A, now=1.0)
    before = snapshot(engine)
    with pytest.raises(RoomConflictError, match="^room_id already exists in the local authoritative store$"):
        replicas.promote_replica(engine, room_id="r1", local_gateway_id=A)
    assert snapshot(engine) == before
    rooms.disband_room(engine, room_id="r1", expected_gateway_id=A, expected_epoch=1, now=2.0)
    rooms.prune_disbanded_rooms(engine, now=1e12)
    before = snapshot(engine)
    with pytest.raises(RoomConflictError, match="^room_id belongs to a disbanded room$"):
        replicas.promote_replica(engine, room_id="r1", local_gateway_id=A)
    assert snapshot(engine) == before


@pytest.mark.parametrize("reason", ["", 5, "x" * 201, None])
def test_promote_reason_must_be_short_text(engine: Engine, reason: Any) -> None:
    ingest(engine, page(1, 1))
    before = snapshot(engine)
    with pytest.raises(ReplicaError, match="^reason must be a non-empty string of at most 200 chars$"):
        replicas.promote_replica(engine, room_id="r1", reason=reason, local_gateway_id=B)
    assert snapshot(engine) == before


# --- demote ----------------------------------------------------------------------------------------------------


def _hosted_room(engine: Engine, events: int = 2) -> None:
    rooms.create_room(engine, room_id="r1", name="Team", members=MEMBERS, authority_gateway_id=A, now=1.0)
    for n in range(events):
        rooms.append_event(engine, room_id="r1", event_id=f"e{n}", kind="message.user",
                           actor={"kind": "user", "id": "u1"}, payload={"n": n}, authority_gateway_id=A,
                           authority_epoch=1, now=2.0)


def test_demote_appends_authority_lost_and_adopts_the_lineage(engine: Engine) -> None:
    _hosted_room(engine)
    result = replicas.demote_room(engine, room_id="r1", observed_gateway_id=B, observed_epoch=3, now=5.0,
                                  local_gateway_id=A)
    assert result == {"room_id": "r1", "authority_gateway_id": B, "authority_epoch": 3, "idempotent": False}
    lost = stored_events(engine)[-1]
    assert (lost["seq"], lost["event_id"], lost["kind"], lost["authority_epoch"], lost["created_at"]) == (
        3, "system:authority-lost:3", "authority.lost", 3, 5.0)
    assert lost["actor"] == {"kind": "system", "id": "authority-control"}
    assert lost["payload"] == {"previous_gateway_id": A, "authority_gateway_id": B, "authority_epoch": 3}
    state = rooms.room_state(engine, room_id="r1")
    assert (state["authority_gateway_id"], state["authority_epoch"], state["revision"]) == (B, 3, 2)
    assert verify(engine) == []
    before = snapshot(engine)
    again = replicas.demote_room(engine, room_id="r1", observed_gateway_id=B, observed_epoch=3, now=6.0,
                                 local_gateway_id=A)
    assert again == {"room_id": "r1", "authority_gateway_id": B, "authority_epoch": 3, "idempotent": True}
    assert snapshot(engine) == before
    with pytest.raises(AuthorityConflictError, match="^stale hosted room authority$"):
        rooms.append_event(engine, room_id="r1", event_id="late", kind="message.user",
                           actor={"kind": "user", "id": "u1"}, payload={}, authority_gateway_id=A, authority_epoch=1)


def test_demote_refusals(engine: Engine) -> None:
    with pytest.raises(ReplicaError, match="^room not found in the local authoritative store$"):
        replicas.demote_room(engine, room_id="r1", observed_gateway_id=B, observed_epoch=2, local_gateway_id=A)
    _hosted_room(engine)
    before = snapshot(engine)
    with pytest.raises(ReplicaEpochRegressionError, match="^observed epoch does not supersede the stored authority$"):
        replicas.demote_room(engine, room_id="r1", observed_gateway_id=B, observed_epoch=1, local_gateway_id=A)
    with pytest.raises(ReplicaError, match="^room is not locally authoritative; nothing to demote$"):
        replicas.demote_room(engine, room_id="r1", observed_gateway_id=C, observed_epoch=2, local_gateway_id=B)
    with pytest.raises(ReplicaError, match="^observed_gateway_id is this gateway: "):  # issue 14: never itself
        replicas.demote_room(engine, room_id="r1", observed_gateway_id=B, observed_epoch=2, local_gateway_id=B)
    for bad_epoch in (0, True, "2", 2**63):
        with pytest.raises(ReplicaError, match="^observed_epoch must be a positive integer$"):
            replicas.demote_room(engine, room_id="r1", observed_gateway_id=B, observed_epoch=bad_epoch,
                                 local_gateway_id=A)
    with pytest.raises(HostedRoomError, match="^invalid observed_gateway_id$"):
        replicas.demote_room(engine, room_id="r1", observed_gateway_id="", observed_epoch=2, local_gateway_id=A)
    assert snapshot(engine) == before
    rooms.disband_room(engine, room_id="r1", expected_gateway_id=A, expected_epoch=1, now=3.0)
    with pytest.raises(ReplicaError, match="^room not found in the local authoritative store$"):
        replicas.demote_room(engine, room_id="r1", observed_gateway_id=B, observed_epoch=2, local_gateway_id=A)


def test_demote_refuses_a_taken_lost_event_id(engine: Engine) -> None:
    _hosted_room(engine, events=0)
    rooms.append_event(engine, room_id="r1", event_id="system:authority-lost:2", kind="message.user",
                       actor={"kind": "user", "id": "u1"}, payload={}, authority_gateway_id=A, authority_epoch=1)
    before = snapshot(engine)
    with pytest.raises(ReplicaError, match="^the authority.lost event id is already taken in this room$"):
        replicas.demote_room(engine, room_id="r1", observed_gateway_id=B, observed_epoch=2, local_gateway_id=A)
    assert snapshot(engine) == before


def test_demoted_room_stays_a_live_foreign_row(engine: Engine) -> None:
    """Kept from the reference: failback by promoting the room again is impossible here."""
    _hosted_room(engine)
    replicas.demote_room(engine, room_id="r1", observed_gateway_id=B, observed_epoch=2, local_gateway_id=A)
    assert [room["room_id"] for room in rooms.list_rooms(engine)] == ["r1"]
    ingest(engine, page(1, 3, gateway=B, epoch=2))
    with pytest.raises(RoomConflictError, match="^room_id already exists in the local authoritative store$"):
        replicas.promote_replica(engine, room_id="r1", local_gateway_id=A)


# --- local identity and the facade -----------------------------------------------------------------------------


def test_native_local_gateway_defaults_to_the_install_id(engine: Engine, monkeypatch: pytest.MonkeyPatch) -> None:
    ingest(engine, page(1, 1))
    monkeypatch.delenv("HOSTEDROOMS_INSTALL_ID", raising=False)
    with pytest.raises(HostedRoomError, match="^stable gateway install identity is unavailable$"):
        replicas.promote_replica(engine, room_id="r1")
    monkeypatch.setenv("HOSTEDROOMS_INSTALL_ID", "gw-b")
    assert replicas.promote_replica(engine, room_id="r1")["authority_gateway_id"] == B


def test_facade_story(target: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HOSTEDROOMS_INSTALL_ID", "gw-b")
    result = hrr.ingest_page(target, room_id="r1", room_name="Team", members=MEMBERS, page=page(1, 2), now=1.0)
    assert result["stored_seq"] == 2
    assert hrr.replica_state(target, room_id="r1")["last_seq"] == 2
    promoted = hrr.promote_replica(target, room_id="r1", now=2.0)
    assert (promoted["authority_gateway_id"], promoted["authority_epoch"], promoted["claim_seq"]) == (B, 2, 3)
    assert hr.read_events(target, room_id="r1")["authority"] == {"gateway_id": B, "epoch": 2}
    monkeypatch.setenv("HOSTEDROOMS_INSTALL_ID", "gw-a")
    with pytest.raises(hrr.ReplicaError, match="^room is not locally authoritative; nothing to demote$"):
        hrr.demote_room(target, room_id="r1", observed_gateway_id="install:gw-c", observed_epoch=3)
    monkeypatch.setenv("HOSTEDROOMS_INSTALL_ID", "gw-b")
    demoted = hrr.demote_room(target, room_id="r1", observed_gateway_id="install:gw-c", observed_epoch=3, now=3.0)
    assert demoted["idempotent"] is False
    assert verify(target) == []


def test_facade_exports_the_reference_names() -> None:
    assert hrr.MAX_REPLICA_ROOMS == 256 and hrr.MAX_REPLICA_EVENT_BYTES == 256 * 1024 * 1024
    assert issubclass(hrr.ReplicaGapError, hrr.ReplicaError) and issubclass(hrr.ReplicaError, hr.HostedRoomError)
    assert issubclass(hrr.ReplicaEpochRegressionError, hrr.ReplicaError)
    assert hrr.RoomConflictError is hr.RoomConflictError


def test_facade_limits_are_read_at_call_time(target: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(hrr, "MAX_REPLICA_ROOMS", 1)
    hrr.ingest_page(target, room_id="r1", room_name="Team", members=MEMBERS, page=page(1, 1), now=1.0)
    with pytest.raises(hrr.ReplicaError, match="^replica room capacity exhausted$"):
        hrr.ingest_page(target, room_id="r2", room_name="Team", members=MEMBERS, page=page(1, 1, room_id="r2"))
    monkeypatch.setattr(hrr, "MAX_REPLICA_EVENT_BYTES", 10)
    with pytest.raises(hrr.ReplicaError, match="^replica event storage exhausted$"):
        hrr.ingest_page(target, room_id="r1", room_name="Team", members=MEMBERS, page=page(2, 2))
    monkeypatch.setattr(hrr, "MAX_EVENT_JSON_BYTES", 5)
    with pytest.raises(hrr.ReplicaError, match="^payload is too large$"):
        hrr.ingest_page(target, room_id="r1", room_name="Team", members=MEMBERS, page=page(2, 2))
    # Room limits come from the room facade, as the reference's promote shares the room module's store.
    monkeypatch.setenv("HOSTEDROOMS_INSTALL_ID", "gw-b")
    monkeypatch.setattr(hr, "MAX_ACTIVE_ROOMS", 0)
    with pytest.raises(hrr.HostedRoomError, match="too many active Group Chats"):
        hrr.promote_replica(target, room_id="r1")
    assert hrr.replica_state(target, room_id="r1")["last_seq"] == 1


def test_facade_bad_input_creates_no_store(tmp_path: Path) -> None:
    store = tmp_path / "never.db"
    with pytest.raises(HostedRoomError, match="^invalid room_id$"):
        hrr.ingest_page(store, room_id="", room_name="Team", members=MEMBERS, page=page(1, 1))
    with pytest.raises(ReplicaError, match="^reason must be a non-empty string of at most 200 chars$"):
        hrr.promote_replica(store, room_id="r1", reason="")
    with pytest.raises(ReplicaError, match="^observed_epoch must be a positive integer$"):
        hrr.demote_room(store, room_id="r1", observed_gateway_id=B, observed_epoch=0)
    assert not store.exists()


# --- pruning disbanded replicas (not in the reference: it never removes a replica) --------------------------------


def _disbanded_replica(engine: Any, room_id: str, at: float, **kwargs: Any) -> None:
    pg = page(1, 2, room_id=room_id)
    closing = event(3, room_id=room_id, event_id="system:room-disbanded", kind="room.disbanded",
                    actor={"id": "room-control", "kind": "system"}, payload={"room_id": room_id}, created_at=at)
    pg["events"].append(closing)
    pg.update(cursor=3, latest_seq=3, has_more=False)
    ingest(engine, pg, room_id=room_id, **kwargs)


def test_prune_removes_disbanded_replicas_past_retention_and_frees_their_slots(engine: Engine) -> None:
    small = lowered(MAX_REPLICA_ROOMS=3)
    _disbanded_replica(engine, "old", 500.0, limits=small)
    _disbanded_replica(engine, "new", 900.0, limits=small)
    ingest(engine, page(1, 4, room_id="live"), room_id="live", limits=small)
    with pytest.raises(ReplicaError, match="^replica room capacity exhausted$"):
        ingest(engine, page(1, 1, room_id="next"), room_id="next", limits=small)
    assert replicas.prune_disbanded_replicas(engine, retain_seconds=200, now=1000.0) == ["old"]
    assert [row[0] for row in snapshot(engine)["hosted_room_replicas"]] == ["live", "new"]
    assert {row[0] for row in snapshot(engine)["hosted_room_replica_events"]} == {"live", "new"}
    ingest(engine, page(1, 1, room_id="next"), room_id="next", limits=small)  # the slot is free again
    assert replicas.prune_disbanded_replicas(engine, now=1000.0) == ["new"]  # retain_seconds=0: every one
    assert replicas.prune_disbanded_replicas(engine, now=1000.0) == []
    assert [row[0] for row in snapshot(engine)["hosted_room_replicas"]] == ["live", "next"]
    assert replicas.replica_state(engine, room_id="live")["last_seq"] == 4
    assert verify(engine) == []


@pytest.mark.parametrize("retain", [-1, 1.5, True, "60", 2**63, None])
def test_prune_refuses_a_bad_retention_and_changes_nothing(engine: Engine, retain: Any) -> None:
    _disbanded_replica(engine, "old", 500.0)
    before = snapshot(engine)
    with pytest.raises(ReplicaError, match="^retain_seconds must be an integer from 0 to 2\\*\\*63-1$"):
        replicas.prune_disbanded_replicas(engine, retain_seconds=retain, now=1000.0)
    assert snapshot(engine) == before

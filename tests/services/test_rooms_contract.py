"""Rooms and the event log: the reference's behaviour, on SQLite and PostgreSQL (native API and facade)."""

from __future__ import annotations

import hashlib
import json
from typing import Any

import pytest
import sqlalchemy as sa
from apis import use_api
from factories import lowered, make_room
from sqlalchemy import Engine

from hostedrooms import limits, models, rooms
from hostedrooms.compat import _engine as compat_engine
from hostedrooms.compat import hosted_rooms as hr
from hostedrooms.errors import (
    AuthorityConflictError,
    AuthoritySupersededError,
    EventConflictError,
    HostedRoomError,
    RoomConflictError,
    RoomHistoryExpiredError,
    RoomNotFoundError,
)

LOCAL = "install:gw-local"
REMOTE = "install:gw-remote"
OTHER = "install:gw-other"
DAY = 24 * 60 * 60

_api = use_api("rooms")  # the tests on a database run on both APIs


def user_msg(engine: Engine, room_id: str, n: object, *, gateway: str = LOCAL, epoch: int = 1,
             text: str | None = None, **kwargs: Any) -> dict[str, Any]:
    return rooms.append_event(
        engine, room_id=room_id, event_id=rooms.user_event_id(f"client-{n}"), kind="message.user",
        actor={"kind": "user", "id": "u1"}, payload={"text": text or f"hello {n}"},
        authority_gateway_id=gateway, authority_epoch=epoch, now=kwargs.pop("now", 1000.0), **kwargs)


def count(engine: Engine, table: sa.Table) -> int:
    with engine.connect() as connection:
        return int(connection.execute(sa.select(sa.func.count()).select_from(table)).scalar_one())


def room_row(engine: Engine, room_id: str) -> dict[str, Any] | None:
    with engine.connect() as connection:
        row = connection.execute(sa.select(models.rooms).where(models.rooms.c.room_id == room_id)).mappings().first()
    return dict(row) if row is not None else None


# --- create / list / rename ------------------------------------------------------------------------------------


def test_create_room_new_replay_and_conflicts(engine: Engine) -> None:
    members = [{"id": "m1", "profile": "alpha", "target": {"url": "x"}}]
    created = rooms.create_room(engine, room_id=" room-1 ", name="  Team  ", members=members,
                                authority_gateway_id=LOCAL, now=100)
    assert created == {
        "room_id": "room-1", "name": "Team", "members": members, "authority_gateway_id": LOCAL,
        "authority_epoch": 1, "revision": 1, "created_at": 100.0, "updated_at": 100.0, "idempotent": False}
    again = rooms.create_room(engine, room_id="room-1", name="Team", members=members, authority_gateway_id=LOCAL,
                              now=200)
    assert again == {**created, "idempotent": True, "latest_seq": 0}
    with pytest.raises(RoomConflictError, match="^room_id already exists with different state$"):
        rooms.create_room(engine, room_id="room-1", name="Other", members=members, authority_gateway_id=LOCAL)
    with pytest.raises(RoomConflictError, match="^room_id already exists with different state$"):
        rooms.create_room(engine, room_id="room-1", name="Team", members=[], authority_gateway_id=LOCAL)
    with pytest.raises(RoomConflictError, match="^room_id already belongs to a different authority$"):
        rooms.create_room(engine, room_id="room-1", name="Team", members=members, authority_gateway_id=REMOTE)
    assert count(engine, models.rooms) == 1


def test_list_rooms_orders_pages_and_filters(engine: Engine) -> None:
    for room_id in ("b", "a", "B"):  # equal updated_at: room_id ascending, bytewise ("B" < "a" < "b")
        make_room(engine, room_id=room_id, now=100)
    make_room(engine, room_id="newest", now=300)
    make_room(engine, room_id="gone", now=50)
    rooms.disband_room(engine, room_id="gone", expected_gateway_id=LOCAL, expected_epoch=1, now=60)
    listed = rooms.list_rooms(engine)
    assert [room["room_id"] for room in listed] == ["newest", "B", "a", "b"]
    assert all(room["latest_seq"] == 0 and "disbanded_at" not in room for room in listed)
    assert [room["room_id"] for room in rooms.list_rooms(engine, limit=2, offset=1)] == ["B", "a"]
    with_gone = rooms.list_rooms(engine, include_disbanded=True)
    assert [room["room_id"] for room in with_gone][-1] == "gone"
    assert with_gone[-1]["disbanded_at"] == 60.0 and with_gone[-1]["latest_seq"] == 1
    assert rooms.list_rooms(engine, limit=2, limits=lowered(MAX_ROOM_LIST_LIMIT=2))[0]["room_id"] == "newest"
    with pytest.raises(HostedRoomError, match="^limit must be between 1 and 2$"):
        rooms.list_rooms(engine, limit=3, limits=lowered(MAX_ROOM_LIST_LIMIT=2))


def test_rename_room_event_replay_and_conflicts(engine: Engine) -> None:
    make_room(engine)
    renamed = rooms.rename_room(engine, room_id="room-1", event_id="rename-1", name=" New name ", now=300)
    assert (renamed["name"], renamed["revision"], renamed["latest_seq"], renamed["updated_at"]) == (
        "New name", 2, 1, 300.0)
    assert renamed["event"] == {
        "room_id": "room-1", "seq": 1, "event_id": "rename-1", "kind": "room.renamed",
        "actor": {"kind": "system", "id": "room-control"}, "authority_epoch": 1, "payload": {"name": "New name"},
        "created_at": 300.0, "idempotent": False}
    replay = rooms.rename_room(engine, room_id="room-1", event_id="rename-1", name="New name", now=400)
    assert replay["idempotent"] is True and replay["event"] == {**renamed["event"], "idempotent": True}
    assert replay["latest_seq"] == 1 and replay["updated_at"] == 300.0
    with pytest.raises(EventConflictError, match="^event_id already exists with different immutable content$"):
        rooms.rename_room(engine, room_id="room-1", event_id="rename-1", name="Else")
    with pytest.raises(RoomNotFoundError, match="^hosted room not found$"):
        rooms.rename_room(engine, room_id="nope", event_id="rename-9", name="x")
    assert room_row(engine, "room-1") is not None and room_row(engine, "room-1")["event_bytes"] == sum(  # type: ignore[index]
        len(part.encode()) for part in ("rename-1", "room.renamed", '{"id":"room-control","kind":"system"}',
                                        '{"name":"New name"}'))
    rooms.disband_room(engine, room_id="room-1", expected_gateway_id=LOCAL, expected_epoch=1)
    with pytest.raises(RoomNotFoundError, match="^hosted room not found$"):
        rooms.rename_room(engine, room_id="room-1", event_id="rename-1", name="New name")


# --- append / read ---------------------------------------------------------------------------------------------


def test_append_event_shapes_normalisation_and_sequences(engine: Engine) -> None:
    make_room(engine)
    make_room(engine, room_id="room-2")
    first = rooms.append_event(
        engine, room_id="room-1", event_id=rooms.user_event_id("c-1"), kind="message.user",
        actor={"kind": "user", "id": " u1 ", "display_name": "  Alice  ", "profile": None, "connection_id": "  "},
        payload={"text": "hi é", "a": [1, 2]}, authority_gateway_id=LOCAL, authority_epoch=1, now=1001)
    assert first == {
        "room_id": "room-1", "seq": 1, "event_id": "user:" + hashlib.sha256(b"c-1").hexdigest(),
        "kind": "message.user", "actor": {"kind": "user", "id": "u1", "display_name": "Alice"},
        "authority_epoch": 1, "payload": {"a": [1, 2], "text": "hi é"}, "created_at": 1001.0, "idempotent": False}
    replay = rooms.append_event(
        engine, room_id="room-1", event_id=rooms.user_event_id("c-1"), kind="message.user",
        actor={"kind": "user", "id": "u1", "display_name": "Alice"}, payload={"a": [1, 2], "text": "hi é"},
        authority_gateway_id=LOCAL, authority_epoch=1, now=5000)
    assert replay == {**first, "idempotent": True}
    assert user_msg(engine, "room-2", 1)["seq"] == 1  # sequences are per room
    member = rooms.append_event(
        engine, room_id="room-1", event_id="member-reply-1", kind="message.member",
        actor={"kind": "member", "id": "m1", "connection_id": "conn-1"}, payload={}, authority_gateway_id=LOCAL,
        authority_epoch=1)
    turn = rooms.append_event(
        engine, room_id="room-1", event_id="turn-1", kind="turn.started", actor={"kind": "gateway", "id": LOCAL},
        payload={}, authority_gateway_id=LOCAL, authority_epoch=1)
    assert (member["seq"], turn["seq"]) == (2, 3)
    stored = room_row(engine, "room-1")
    assert stored is not None and stored["next_seq"] == 4
    with engine.connect() as connection:
        texts = connection.execute(
            sa.select(models.events.c.actor_json, models.events.c.payload_json)
            .where(models.events.c.room_id == "room-1", models.events.c.seq == 1)).one()
    assert tuple(texts) == ('{"display_name":"Alice","id":"u1","kind":"user"}', '{"a":[1,2],"text":"hi é"}')


def test_append_event_actor_kind_matrix(engine: Engine) -> None:
    make_room(engine)
    allowed = rooms.EVENT_KINDS_BY_ACTOR
    all_kinds = sorted(set().union(*allowed.values()))
    n = 0
    for actor_kind, kinds in allowed.items():
        actor_id = LOCAL if actor_kind == "gateway" else "someone"
        for kind in all_kinds:
            n += 1
            call = dict(room_id="room-1", event_id=f"e-{n}", kind=kind, actor={"kind": actor_kind, "id": actor_id},
                        payload={}, authority_gateway_id=LOCAL, authority_epoch=1)
            if kind in kinds:
                assert rooms.append_event(engine, **call)["kind"] == kind  # type: ignore[arg-type]
            else:
                with pytest.raises(HostedRoomError, match=f"^actor kind '{actor_kind}' cannot append '{kind}'$"):
                    rooms.append_event(engine, **call)  # type: ignore[arg-type]
    assert rooms.read_events(engine, room_id="room-1", limit=500)["latest_seq"] == sum(map(len, allowed.values()))


def test_append_replay_precedes_room_and_authority_checks(engine: Engine) -> None:
    make_room(engine)
    original = user_msg(engine, "room-1", 1)
    rooms.claim_authority(engine, room_id="room-1", expected_gateway_id=LOCAL, expected_epoch=1,
                          new_gateway_id=REMOTE, event_id="claim-2")
    assert user_msg(engine, "room-1", 1) == {**original, "idempotent": True}  # stale authority, but a replay
    with pytest.raises(AuthorityConflictError, match="^stale hosted room authority$"):
        user_msg(engine, "room-1", 2)
    rooms.disband_room(engine, room_id="room-1", expected_gateway_id=REMOTE, expected_epoch=2)
    assert user_msg(engine, "room-1", 1)["idempotent"] is True
    with pytest.raises(RoomNotFoundError, match="^hosted room not found$"):
        user_msg(engine, "room-1", 3, gateway=REMOTE, epoch=2)
    for changed in ({"text": "changed"}, {"epoch": 2, "gateway": REMOTE}):
        with pytest.raises(EventConflictError, match="^event_id already exists with different content$"):
            user_msg(engine, "room-1", 1, **changed)  # type: ignore[arg-type]


def test_read_events_pages_and_cursor(engine: Engine) -> None:
    make_room(engine)
    for n in range(1, 4):
        user_msg(engine, "room-1", n)
    page = rooms.read_events(engine, room_id="room-1")
    assert [event["seq"] for event in page["events"]] == [1, 2, 3]
    assert (page["cursor"], page["latest_seq"], page["has_more"]) == (3, 3, False)
    assert page["authority"] == {"gateway_id": LOCAL, "epoch": 1}
    partial = rooms.read_events(engine, room_id="room-1", since_seq=1, limit=1)
    assert [event["seq"] for event in partial["events"]] == [2] and partial["has_more"] is True
    empty = rooms.read_events(engine, room_id="room-1", since_seq=3)
    assert empty["events"] == [] and empty["cursor"] == 3 and empty["has_more"] is False
    with pytest.raises(HostedRoomError, match="^since_seq is ahead of the hosted room log$"):
        rooms.read_events(engine, room_id="room-1", since_seq=4)
    rooms.disband_room(engine, room_id="room-1", expected_gateway_id=LOCAL, expected_epoch=1)
    with pytest.raises(RoomNotFoundError):
        rooms.read_events(engine, room_id="room-1")
    kept = rooms.read_events(engine, room_id="room-1", include_disbanded=True)
    assert kept["events"][-1]["kind"] == "room.disbanded" and kept["latest_seq"] == 4


def _page_size(page: dict[str, Any]) -> int:
    """The size the reference's rule bounds: the page without ``lineage`` (added after fitting)."""
    replay = {key: value for key, value in page.items() if key != "lineage"}
    return len(json.dumps(replay, ensure_ascii=False, separators=(",", ":")).encode("utf-8"))


def test_read_events_byte_budget_counts_the_whole_page(engine: Engine) -> None:
    make_room(engine)
    for n in range(1, 7):
        user_msg(engine, "room-1", n, text="é" * (20 * n))
    full = rooms.read_events(engine, room_id="room-1")
    # Pick a budget just below the full page: the page must be the largest prefix whose JSON fits.
    prefix_sizes = []
    for size in range(1, 7):
        events = full["events"][:size]
        prefix = {"events": events, "cursor": events[-1]["seq"], "latest_seq": 6, "has_more": size < 6,
                  "authority": full["authority"]}
        prefix_sizes.append(_page_size(prefix))
    budget = prefix_sizes[3] + 5  # fits 4 events, not 5
    page = rooms.read_events(engine, room_id="room-1", limits=lowered(MAX_LOG_PAGE_BYTES=budget))
    assert [event["seq"] for event in page["events"]] == [1, 2, 3, 4] and page["has_more"] is True
    assert _page_size(page) <= budget
    exact = rooms.read_events(engine, room_id="room-1", limits=lowered(MAX_LOG_PAGE_BYTES=prefix_sizes[3]))
    assert len(exact["events"]) == 4 and _page_size(exact) == prefix_sizes[3]
    with pytest.raises(HostedRoomError, match="^hosted room event exceeds replay page limit$"):
        rooms.read_events(engine, room_id="room-1", limits=lowered(MAX_LOG_PAGE_BYTES=prefix_sizes[0] - 1))
    with pytest.raises(HostedRoomError, match="^hosted room event exceeds replay page limit$"):
        rooms.read_events(engine, room_id="room-1", limits=lowered(MAX_LOG_PAGE_BYTES=10))


# --- authority and lifecycle -----------------------------------------------------------------------------------


def test_claim_authority_cas_replay_and_superseded(engine: Engine) -> None:
    make_room(engine)
    user_msg(engine, "room-1", 1)
    claim = rooms.claim_authority(engine, room_id="room-1", expected_gateway_id=LOCAL, expected_epoch=1,
                                  new_gateway_id=REMOTE, event_id="claim-2", now=2000)
    assert (claim["authority_gateway_id"], claim["authority_epoch"], claim["revision"], claim["latest_seq"]) == (
        REMOTE, 2, 2, 2)
    assert claim["idempotent"] is False and claim["updated_at"] == 2000.0 and "disbanded_at" not in claim
    assert claim["claim_event"] == {
        "room_id": "room-1", "seq": 2, "event_id": "claim-2", "kind": "authority.claimed",
        "actor": {"kind": "system", "id": "authority-control"}, "authority_epoch": 2,
        "payload": {"previous_gateway_id": LOCAL, "authority_gateway_id": REMOTE, "authority_epoch": 2},
        "created_at": 2000.0, "idempotent": False}
    replay = rooms.claim_authority(engine, room_id="room-1", expected_gateway_id=LOCAL, expected_epoch=1,
                                   new_gateway_id=REMOTE, event_id="claim-2", now=2001)
    assert replay == {**claim, "idempotent": True, "claim_event": {**claim["claim_event"], "idempotent": True}}
    assert rooms.room_state(engine, room_id="room-1")["authority_claim"] == claim["claim_event"]
    with pytest.raises(AuthorityConflictError, match="^hosted room authority changed$"):
        rooms.claim_authority(engine, room_id="room-1", expected_gateway_id=LOCAL, expected_epoch=1,
                              new_gateway_id=OTHER, event_id="claim-x")
    with pytest.raises(EventConflictError, match="^event_id already exists with different content$"):
        rooms.claim_authority(engine, room_id="room-1", expected_gateway_id=LOCAL, expected_epoch=1,
                              new_gateway_id=OTHER, event_id="claim-2")
    rooms.claim_authority(engine, room_id="room-1", expected_gateway_id=REMOTE, expected_epoch=2,
                          new_gateway_id=OTHER, event_id="claim-3")
    with pytest.raises(AuthoritySupersededError, match="^authority claim succeeded but was later superseded$"):
        rooms.claim_authority(engine, room_id="room-1", expected_gateway_id=LOCAL, expected_epoch=1,
                              new_gateway_id=REMOTE, event_id="claim-2")
    with pytest.raises(AuthorityConflictError):
        user_msg(engine, "room-1", 2, gateway=REMOTE, epoch=2)
    assert user_msg(engine, "room-1", 3, gateway=OTHER, epoch=3)["seq"] == 4
    with pytest.raises(RoomNotFoundError):
        rooms.claim_authority(engine, room_id="missing", expected_gateway_id=LOCAL, expected_epoch=1,
                              new_gateway_id=OTHER, event_id="claim-9")


def test_room_state_reports_forged_claims_like_the_reference(engine: Engine) -> None:
    make_room(engine)
    state = rooms.room_state(engine, room_id="room-1")
    assert "authority_claim" not in state and state["latest_seq"] == 0
    forged = rooms.append_event(
        engine, room_id="room-1", event_id="forged", kind="authority.claimed", actor={"kind": "system", "id": "x"},
        payload={"authority_gateway_id": OTHER}, authority_gateway_id=LOCAL, authority_epoch=1)
    state = rooms.room_state(engine, room_id="room-1")
    assert state["authority_gateway_id"] == LOCAL and state["authority_claim"]["event_id"] == forged["event_id"]


def test_request_room_stop(engine: Engine) -> None:
    make_room(engine)
    stop = rooms.request_room_stop(engine, room_id="room-1", cancel_id=" cancel-1 ", expected_gateway_id=LOCAL,
                                   expected_epoch=1)
    assert stop["kind"] == "room.stop_requested" and stop["payload"] == {"cancel_id": "cancel-1"}
    assert stop["event_id"] == "room-stop:" + hashlib.sha256(b"cancel-1").hexdigest()[:32]
    assert stop["actor"] == {"kind": "gateway", "id": LOCAL}
    again = rooms.request_room_stop(engine, room_id="room-1", cancel_id="cancel-1", expected_gateway_id=LOCAL,
                                    expected_epoch=1)
    assert again["idempotent"] is True and again["seq"] == stop["seq"] == 1
    with pytest.raises(AuthorityConflictError, match="^stale hosted room authority$"):
        rooms.request_room_stop(engine, room_id="room-1", cancel_id="cancel-2", expected_gateway_id=LOCAL,
                                expected_epoch=2)


def test_disband_replays_retires_and_expires(engine: Engine) -> None:
    make_room(engine)
    user_msg(engine, "room-1", 1)
    with pytest.raises(AuthorityConflictError, match="^stale hosted room authority$"):
        rooms.disband_room(engine, room_id="room-1", expected_gateway_id=REMOTE, expected_epoch=1)
    disbanded = rooms.disband_room(engine, room_id="room-1", expected_gateway_id=LOCAL, expected_epoch=1, now=3000)
    assert disbanded == {
        "room_id": "room-1", "disbanded_at": 3000.0, "idempotent": False,
        "event": {"room_id": "room-1", "seq": 2, "event_id": "system:room-disbanded", "kind": "room.disbanded",
                  "actor": {"kind": "system", "id": "room-control"}, "authority_epoch": 1,
                  "payload": {"room_id": "room-1"}, "created_at": 3000.0, "idempotent": False}}
    again = rooms.disband_room(engine, room_id="room-1", expected_gateway_id=OTHER, expected_epoch=7, now=3001)
    assert again == {**disbanded, "idempotent": True, "event": {**disbanded["event"], "idempotent": True}}
    state = rooms.room_state(engine, room_id="room-1", include_disbanded=True)
    assert state["disbanded_at"] == 3000.0 and state["revision"] == 2
    with pytest.raises(RoomNotFoundError):
        rooms.room_state(engine, room_id="room-1")
    with pytest.raises(RoomConflictError, match="^room_id belongs to a disbanded room$"):
        make_room(engine)
    assert rooms.prune_disbanded_rooms(engine, now=3000 + 90 * DAY - 1) == 0
    assert rooms.prune_disbanded_rooms(engine, now=3000 + 90 * DAY) == 1
    with pytest.raises(RoomHistoryExpiredError, match="^Group Chat history expired; room_id remains permanently "):
        rooms.room_state(engine, room_id="room-1", include_disbanded=True)
    with pytest.raises(RoomHistoryExpiredError):
        rooms.read_events(engine, room_id="room-1", include_disbanded=True)
    expired = rooms.disband_room(engine, room_id="room-1", expected_gateway_id=LOCAL, expected_epoch=1)
    assert expired == {"room_id": "room-1", "disbanded_at": 3000.0, "idempotent": True, "history_expired": True}
    with pytest.raises(RoomNotFoundError, match="^hosted room not found$") as excinfo:
        rooms.disband_room(engine, room_id="never", expected_gateway_id=LOCAL, expected_epoch=1)
    assert not isinstance(excinfo.value, RoomHistoryExpiredError)
    with pytest.raises(RoomConflictError, match="^room_id belongs to a disbanded room$"):
        make_room(engine)
    assert count(engine, models.events) == 0 and count(engine, models.retired_ids) == 1


def _insert_dependents(engine: Engine, room_id: str) -> None:
    with engine.begin() as connection:
        connection.execute(sa.insert(models.links).values(
            room_id=room_id, member_id="m1", target_url="u", target_profile="p", grant="g", catalog_json="{}",
            cancellation_scope_id=f"s-{room_id}", trace_id=f"t-{room_id}", transport_security="tls",
            status="ready", updated_at=1.0))
        connection.execute(sa.insert(models.remote_runs).values(
            room_id=room_id, home_install_id="h", authority_gateway_id=LOCAL, authority_epoch=1, member_id="m1",
            task_id="t", execution_generation=1, target_install_id="ti", target_profile="p", run_id="r",
            session_id="s", created_at=1.0, updated_at=1.0))
        connection.execute(sa.insert(models.peer_reservations).values(
            room_id=room_id, member_id="m1", target_profile="p", authority_gateway_id=LOCAL, authority_epoch=1,
            expires_at=10.0, revoked_at=None, created_at=1.0, updated_at=1.0))
        connection.execute(sa.insert(models.replicas).values(
            room_id=room_id, name="n", members_json="[]", authority_gateway_id=LOCAL, authority_epoch=1, last_seq=0,
            latest_seq=0, event_bytes=0, created_at=1.0, updated_at=1.0))


def test_prune_deletes_dependents_keeps_replicas_and_retired_ids(engine: Engine) -> None:
    for index, room_id in enumerate(("old", "mid", "new", "live")):
        make_room(engine, room_id=room_id)
        _insert_dependents(engine, room_id)
        if room_id != "live":
            rooms.disband_room(engine, room_id=room_id, expected_gateway_id=LOCAL, expected_epoch=1,
                               now=100.0 + index, limits=lowered(MAX_DISBANDED_ROOM_TOMBSTONES=10))
    # Tombstone cap: keep the 2 most recently disbanded; "old" is purged, its id retired.
    assert rooms.prune_disbanded_rooms(engine, now=200, limits=lowered(MAX_DISBANDED_ROOM_TOMBSTONES=2)) == 1
    assert room_row(engine, "old") is None and room_row(engine, "mid") is not None
    for table in (models.links, models.remote_runs, models.peer_reservations):
        assert count(engine, table) == 3
    assert count(engine, models.replicas) == 4  # replica rows are not the room's dependents (reference)
    assert rooms.prune_disbanded_rooms(engine, now=102 + 90 * DAY) == 2
    for table in (models.links, models.remote_runs, models.peer_reservations):
        assert count(engine, table) == 1
    with engine.connect() as connection:
        query = sa.select(models.retired_ids.c.room_id, models.retired_ids.c.retired_at)
        retired = {row[0]: row[1] for row in connection.execute(query)}
    assert retired == {"old": 100.0, "mid": 101.0, "new": 102.0}
    assert rooms.prune_disbanded_rooms(engine, now=10**10) == 0 and count(engine, models.retired_ids) == 3
    assert [room["room_id"] for room in rooms.list_rooms(engine, include_disbanded=True)] == ["live"]


def test_disband_prunes_beyond_the_tombstone_cap(engine: Engine) -> None:
    small = lowered(MAX_DISBANDED_ROOM_TOMBSTONES=1)
    for index, room_id in enumerate(("r1", "r2")):
        make_room(engine, room_id=room_id)
        rooms.disband_room(engine, room_id=room_id, expected_gateway_id=LOCAL, expected_epoch=1, now=10.0 + index,
                           limits=small)
    assert room_row(engine, "r1") is None and room_row(engine, "r2") is not None
    assert rooms.disband_room(engine, room_id="r1", expected_gateway_id=LOCAL, expected_epoch=1)["history_expired"]


def test_legacy_room_adoption(engine: Engine) -> None:
    with engine.begin() as connection:
        connection.execute(sa.insert(models.rooms).values(
            room_id="old-room", name="Team", members_json='[{"id":"m1"}]', authority_gateway_id="legacy",
            authority_epoch=1, next_seq=3, event_bytes=10, revision=1, created_at=1.0, updated_at=1.0))
    with pytest.raises(RoomConflictError, match="^room_id already exists with different state$"):
        rooms.create_room(engine, room_id="old-room", name="Team", members=[{"id": "m2"}],
                          authority_gateway_id=LOCAL)
    members = [{"id": "m1", "target": {"url": "u"}}]
    adopted = rooms.create_room(engine, room_id="old-room", name="Team", members=members, authority_gateway_id=LOCAL,
                                now=50)
    claim_payload = {"previous_gateway_id": "legacy", "authority_gateway_id": LOCAL, "authority_epoch": 2}
    assert adopted == {
        "room_id": "old-room", "name": "Team", "members": members, "authority_gateway_id": LOCAL,
        "authority_epoch": 2, "revision": 2, "created_at": 1.0, "updated_at": 50.0, "idempotent": True,
        "latest_seq": 3, "adopted": True,
        "claim_event": {"room_id": "old-room", "seq": 3, "event_id": "system:authority-adopted",
                        "kind": "authority.claimed", "actor": {"kind": "system", "id": "authority-control"},
                        "authority_epoch": 2, "payload": claim_payload, "created_at": 50.0, "idempotent": False}}
    stored = room_row(engine, "old-room")
    assert stored is not None and stored["members_json"] == '[{"id":"m1","target":{"url":"u"}}]'
    assert stored["event_bytes"] > 10 and stored["next_seq"] == 4
    replay = rooms.create_room(engine, room_id="old-room", name="Team", members=members, authority_gateway_id=LOCAL)
    assert replay["idempotent"] is True and "adopted" not in replay
    assert rooms.room_state(engine, room_id="old-room")["authority_claim"]["event_id"] == "system:authority-adopted"
    assert user_msg(engine, "old-room", 1, epoch=2)["seq"] == 4


# --- capacity --------------------------------------------------------------------------------------------------


def test_room_event_count_limit_and_control_reserve(engine: Engine) -> None:
    tight = lowered(MAX_EVENTS_PER_ROOM=2, CONTROL_EVENT_COUNT_RESERVE=1)
    make_room(engine)
    user_msg(engine, "room-1", 1, limits=tight)
    user_msg(engine, "room-1", 2, limits=tight)
    with pytest.raises(HostedRoomError, match="^This Group Chat reached its history limit. Start a new"):
        user_msg(engine, "room-1", 3, limits=tight)
    rooms.request_room_stop(engine, room_id="room-1", cancel_id="c", expected_gateway_id=LOCAL, expected_epoch=1,
                            limits=tight)  # a control kind may use the reserve
    with pytest.raises(HostedRoomError, match="history limit"):
        rooms.disband_room(engine, room_id="room-1", expected_gateway_id=LOCAL, expected_epoch=1, limits=tight)
    assert rooms.room_state(engine, room_id="room-1")["latest_seq"] == 3


def test_room_event_byte_limit(engine: Engine) -> None:
    make_room(engine)
    size = user_msg(engine, "room-1", 1)
    one = room_row(engine, "room-1")["event_bytes"]  # type: ignore[index]
    assert size["seq"] == 1
    tight = lowered(MAX_ROOM_EVENT_BYTES=2 * one, CONTROL_EVENT_BYTE_RESERVE=0)
    user_msg(engine, "room-1", 2, limits=tight)  # same size: exactly at the limit
    with pytest.raises(HostedRoomError, match="^This Group Chat reached its storage limit. Start a new"):
        user_msg(engine, "room-1", 3, limits=tight)
    assert room_row(engine, "room-1")["event_bytes"] == 2 * one  # type: ignore[index]


def test_gateway_byte_limit_prunes_disbanded_rooms_oldest_first_then_refuses(engine: Engine) -> None:
    for index, room_id in enumerate(("gone-1", "gone-2", "live")):
        make_room(engine, room_id=room_id)
        user_msg(engine, room_id, 1, text="x" * 400)
        if room_id != "live":
            rooms.disband_room(engine, room_id=room_id, expected_gateway_id=LOCAL, expected_epoch=1,
                               now=100.0 + index)
    with engine.connect() as connection:
        query = sa.select(models.rooms.c.room_id, models.rooms.c.event_bytes)
        per_room = {row[0]: row[1] for row in connection.execute(query)}
    total = sum(per_room.values())
    message_bytes = room_row(engine, "live")["event_bytes"]  # type: ignore[index]
    # Room for one more message only once gone-1 (the oldest disbanded room) is purged.
    tight = lowered(MAX_GATEWAY_EVENT_BYTES=total - per_room["gone-1"] + message_bytes)
    user_msg(engine, "live", 2, text="x" * 400, limits=tight)
    assert room_row(engine, "gone-1") is None and room_row(engine, "gone-2") is not None
    full = lowered(MAX_GATEWAY_EVENT_BYTES=total - per_room["gone-1"] + message_bytes + per_room["gone-2"] - 1)
    before = count(engine, models.rooms)
    with pytest.raises(HostedRoomError, match="^Group Chat storage is full on this host. Delete an old Group"):
        user_msg(engine, "live", 3, text="x" * 400 + "y" * 3 * per_room["gone-2"], limits=full)
    assert count(engine, models.rooms) == before  # the refused write rolled its pruning back
    with engine.connect() as connection:
        assert set(connection.execute(sa.select(models.retired_ids.c.room_id)).scalars()) == {"gone-1", "gone-2"}


def test_gateway_control_byte_reserve(engine: Engine) -> None:
    make_room(engine)
    user_msg(engine, "room-1", 1)
    used = room_row(engine, "room-1")["event_bytes"]  # type: ignore[index]
    tight = lowered(MAX_GATEWAY_EVENT_BYTES=used, CONTROL_EVENT_BYTE_RESERVE=10_000)
    with pytest.raises(HostedRoomError, match="storage is full on this host"):
        user_msg(engine, "room-1", 2, limits=tight)
    assert rooms.disband_room(engine, room_id="room-1", expected_gateway_id=LOCAL, expected_epoch=1,
                              limits=tight)["idempotent"] is False


def test_active_room_cap(engine: Engine) -> None:
    cap = lowered(MAX_ACTIVE_ROOMS=2)
    make_room(engine, room_id="a", limits=cap)
    make_room(engine, room_id="b", limits=cap)
    with pytest.raises(HostedRoomError, match="^This host has too many active Group Chats. Delete one and try"):
        make_room(engine, room_id="c", limits=cap)
    assert make_room(engine, room_id="a", limits=cap)["idempotent"] is True
    rooms.disband_room(engine, room_id="a", expected_gateway_id=LOCAL, expected_epoch=1)
    assert make_room(engine, room_id="c", limits=cap)["idempotent"] is False


# --- batch append ----------------------------------------------------------------------------------------------


def _batch_item(n: int, text: str | None = None) -> dict[str, Any]:
    return {"event_id": f"b-{n}", "kind": "message.user", "actor": {"kind": "user", "id": "u1"},
            "payload": {"text": text or f"m{n}"}}


def test_append_events_is_contiguous_idempotent_and_all_or_nothing(engine: Engine) -> None:
    make_room(engine)
    user_msg(engine, "room-1", 0)
    written = rooms.append_events(engine, "room-1", [_batch_item(1), _batch_item(2), _batch_item(1)], LOCAL, 1,
                                  now=7)
    assert [(e["seq"], e["event_id"], e["idempotent"]) for e in written] == [
        (2, "b-1", False), (3, "b-2", False), (2, "b-1", True)]
    assert written[0]["created_at"] == 7.0 and written[0]["actor"] == {"kind": "user", "id": "u1"}
    again = rooms.append_events(engine, "room-1", [_batch_item(2), _batch_item(3)], LOCAL, 1)
    assert [(e["seq"], e["idempotent"]) for e in again] == [(3, True), (4, False)]
    snapshot = room_row(engine, "room-1")
    with pytest.raises(EventConflictError):
        rooms.append_events(engine, "room-1", [_batch_item(5), _batch_item(2, text="changed")], LOCAL, 1)
    with pytest.raises(EventConflictError):
        rooms.append_events(engine, "room-1", [_batch_item(5), _batch_item(5, text="other")], LOCAL, 1)
    with pytest.raises(HostedRoomError, match="history limit"):
        rooms.append_events(engine, "room-1", [_batch_item(5), _batch_item(6)], LOCAL, 1,
                            limits=lowered(MAX_EVENTS_PER_ROOM=5))
    with pytest.raises(AuthorityConflictError):
        rooms.append_events(engine, "room-1", [_batch_item(5)], LOCAL, 2)
    with pytest.raises(HostedRoomError, match="^events must be a non-empty list$"):
        rooms.append_events(engine, "room-1", [], LOCAL, 1)
    with pytest.raises(HostedRoomError, match="^unknown event fields: x$"):
        rooms.append_events(engine, "room-1", [{**_batch_item(5), "x": 1}], LOCAL, 1)
    assert room_row(engine, "room-1") == snapshot
    page = rooms.read_events(engine, room_id="room-1")
    assert [e["seq"] for e in page["events"]] == [1, 2, 3, 4]


def test_append_events_one_shared_actor_object_is_checked_per_kind(engine: Engine) -> None:
    make_room(engine)
    author = {"kind": "user", "id": " u1 ", "display_name": " Ann "}
    items = [{"event_id": f"s-{n}", "kind": "message.user", "actor": author, "payload": {"n": n}} for n in range(3)]
    written = rooms.append_events(engine, "room-1", items, LOCAL, 1)
    assert [e["actor"] for e in written] == [{"kind": "user", "id": "u1", "display_name": "Ann"}] * 3
    written[0]["actor"]["id"] = "changed"  # each result owns its actor
    assert written[1]["actor"]["id"] == "u1"
    assert [e["payload"] for e in written] == [{"n": 0}, {"n": 1}, {"n": 2}]
    before = room_row(engine, "room-1")
    # The same object may author one kind and not another: the matrix is checked for each (actor, kind).
    mixed = [{"event_id": "s-9", "kind": "message.user", "actor": author, "payload": {}},
             {"event_id": "s-10", "kind": "message.member", "actor": author, "payload": {}}]
    with pytest.raises(HostedRoomError, match="^actor kind 'user' cannot append 'message.member'$"):
        rooms.append_events(engine, "room-1", mixed, LOCAL, 1)
    gateway = {"kind": "gateway", "id": LOCAL}
    stray = [{"event_id": "g-1", "kind": "turn.started", "actor": gateway, "payload": {}},
             {"event_id": "g-2", "kind": "turn.settled", "actor": {"kind": "gateway", "id": "install:other"},
              "payload": {}}]
    with pytest.raises(HostedRoomError, match="^gateway actor.id must match authority_gateway_id$"):
        rooms.append_events(engine, "room-1", stray, LOCAL, 1)
    assert room_row(engine, "room-1") == before


def _event_size(item: dict[str, Any]) -> int:
    """The accounted bytes of one batch item (event_id + kind + canonical actor and payload JSON)."""
    def canonical(value: Any) -> str:
        return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)

    return len((item["event_id"] + item["kind"] + canonical(item["actor"]) + canonical(item["payload"])).encode())


def test_append_events_limits_hold_for_every_event_of_a_batch(engine: Engine) -> None:
    make_room(engine)
    user_msg(engine, "room-1", 0)
    count_cap = lowered(MAX_EVENTS_PER_ROOM=5, CONTROL_EVENT_COUNT_RESERVE=1)
    with pytest.raises(HostedRoomError, match="history limit"):
        rooms.append_events(engine, "room-1", [_batch_item(n) for n in range(1, 6)], LOCAL, 1, limits=count_cap)
    assert [e["seq"] for e in rooms.append_events(
        engine, "room-1", [_batch_item(n) for n in range(1, 5)], LOCAL, 1, limits=count_cap)] == [2, 3, 4, 5]
    stop = {"event_id": "stop-1", "kind": "room.stop_requested", "actor": {"kind": "gateway", "id": LOCAL},
            "payload": {}}
    # A control kind may use the reserve, but only for itself: an ordinary event before it is refused.
    with pytest.raises(HostedRoomError, match="history limit"):
        rooms.append_events(engine, "room-1", [_batch_item(9), stop], LOCAL, 1, limits=count_cap)
    assert rooms.append_events(engine, "room-1", [stop], LOCAL, 1, limits=count_cap)[0]["seq"] == 6

    make_room(engine, room_id="room-2")
    items = [_batch_item(n) for n in range(3)]
    total = sum(_event_size(item) for item in items)
    exact = lowered(MAX_ROOM_EVENT_BYTES=total, CONTROL_EVENT_BYTE_RESERVE=0)
    short = lowered(MAX_ROOM_EVENT_BYTES=total - 1, CONTROL_EVENT_BYTE_RESERVE=0)
    with pytest.raises(HostedRoomError, match="storage limit"):
        rooms.append_events(engine, "room-2", items, LOCAL, 1, limits=short)
    assert room_row(engine, "room-2")["event_bytes"] == 0  # type: ignore[index]
    rooms.append_events(engine, "room-2", items, LOCAL, 1, limits=exact)
    assert room_row(engine, "room-2")["event_bytes"] == total  # type: ignore[index]

    used = sum(row["event_bytes"] for row in (room_row(engine, "room-1"), room_row(engine, "room-2")) if row)
    more = [_batch_item(n) for n in range(10, 12)]
    gateway_short = lowered(MAX_GATEWAY_EVENT_BYTES=used + sum(map(_event_size, more)) - 1)
    with pytest.raises(HostedRoomError, match="storage is full on this host"):
        rooms.append_events(engine, "room-1", more, LOCAL, 1, limits=gateway_short)
    gateway_exact = lowered(MAX_GATEWAY_EVENT_BYTES=used + sum(map(_event_size, more)),
                            MAX_EVENTS_PER_ROOM=50)
    assert len(rooms.append_events(engine, "room-1", more, LOCAL, 1, limits=gateway_exact)) == 2


def test_append_events_replays_inside_a_fresh_batch_keep_their_first_seq(engine: Engine) -> None:
    make_room(engine)
    first = rooms.append_events(engine, "room-1", [_batch_item(1)], LOCAL, 1)
    mixed = rooms.append_events(engine, "room-1", [_batch_item(2), _batch_item(1), _batch_item(3), _batch_item(2)],
                                LOCAL, 1)
    assert [(e["event_id"], e["seq"], e["idempotent"]) for e in mixed] == [
        ("b-2", 2, False), ("b-1", first[0]["seq"], True), ("b-3", 3, False), ("b-2", 2, True)]
    assert rooms.room_state(engine, room_id="room-1")["latest_seq"] == 3


# --- the seed-compatible facade --------------------------------------------------------------------------------


@pytest.fixture
def facade_env(monkeypatch: pytest.MonkeyPatch) -> Any:
    monkeypatch.setenv(compat_engine.INSTALL_ID_ENV, "gw-local")
    yield
    compat_engine.forget_engines()


def test_facade_round_trip_and_lowered_limit_on_the_facade_module(
        target: str, facade_env: None, monkeypatch: pytest.MonkeyPatch) -> None:
    gateway = hr.local_authority_gateway_id()
    assert gateway == LOCAL
    created = hr.create_room(target, room_id="room-1", name="Team", members=[], authority_gateway_id=gateway, now=1)
    assert created["idempotent"] is False and "latest_seq" not in created
    event = hr.append_event(target, room_id="room-1", event_id=hr.user_event_id("c1"), kind="message.user",
                            actor={"kind": "user", "id": "u"}, payload={"t": 1}, authority_gateway_id=gateway,
                            authority_epoch=1)
    assert event["seq"] == 1
    assert hr.read_events(target, room_id="room-1")["latest_seq"] == 1
    assert [room["room_id"] for room in hr.list_rooms(target)] == ["room-1"]
    monkeypatch.setattr(hr, "MAX_ACTIVE_ROOMS", 1)
    with pytest.raises(hr.HostedRoomError, match="too many active Group Chats"):
        hr.create_room(target, room_id="room-2", name="Team", members=[], authority_gateway_id=gateway)
    monkeypatch.setattr(hr, "MAX_EVENT_JSON_BYTES", 8)
    with pytest.raises(hr.HostedRoomError, match="^payload is too large$"):
        hr.append_event(target, room_id="room-1", event_id="e2", kind="message.user",
                        actor={"kind": "user", "id": "u"}, payload={"text": "long enough"},
                        authority_gateway_id=gateway, authority_epoch=1)
    monkeypatch.setattr(hr, "MAX_EVENT_JSON_BYTES", limits.MAX_EVENT_JSON_BYTES)
    monkeypatch.setattr(hr, "MAX_ROOM_LIST_LIMIT", 3)
    with pytest.raises(hr.HostedRoomError, match="^limit must be between 1 and 3$"):
        hr.list_rooms(target, limit=4)
    assert len(hr.list_rooms(target)) == 1  # the default limit follows the lowered maximum
    stop = hr.request_room_stop(target, room_id="room-1", cancel_id="c", expected_gateway_id=gateway,
                                expected_epoch=1)
    claim = hr.claim_authority(target, room_id="room-1", expected_gateway_id=gateway, expected_epoch=1,
                               new_gateway_id=REMOTE, event_id="claim-2")
    assert (stop["seq"], claim["latest_seq"]) == (2, 3)
    assert hr.rename_room(target, room_id="room-1", event_id="r1", name="N")["name"] == "N"
    assert hr.room_state(target, room_id="room-1")["authority_epoch"] == 2
    assert hr.disband_room(target, room_id="room-1", expected_gateway_id=REMOTE, expected_epoch=2)["event"]
    assert hr.prune_disbanded_rooms(target, now=10**12) == 1


def test_facade_exports_the_reference_surface() -> None:
    constants = {
        "PROTOCOL_VERSION": 2, "MAX_ROOM_ID_CHARS": 128, "MAX_EVENT_ID_CHARS": 128, "MAX_ROOM_NAME_CHARS": 200,
        "MAX_EVENT_KIND_CHARS": 64, "MAX_ACTOR_ID_CHARS": 128, "MAX_ACTOR_LABEL_CHARS": 200, "MAX_MEMBERS": 128,
        "MAX_MEMBERS_JSON_BYTES": 128 * 1024, "MAX_EVENT_JSON_BYTES": 256 * 1024, "MAX_LOG_LIMIT": 500,
        "MAX_LOG_PAGE_BYTES": 2 * 1024 * 1024, "MAX_ROOM_LIST_LIMIT": 500, "MAX_ACTIVE_ROOMS": 256,
        "MAX_DISBANDED_ROOM_TOMBSTONES": 512, "DISBANDED_ROOM_RETENTION_SECONDS": 90 * DAY,
        "MAX_EVENTS_PER_ROOM": 50_000, "MAX_ROOM_EVENT_BYTES": 256 * 1024 * 1024,
        "MAX_GATEWAY_EVENT_BYTES": 16 * 1024 * 1024, "CONTROL_EVENT_COUNT_RESERVE": 64,
        "CONTROL_EVENT_BYTE_RESERVE": 1024 * 1024}
    assert {name: getattr(hr, name) for name in constants} == constants
    for name in ("HostedRoomError", "RoomNotFoundError", "RoomHistoryExpiredError", "RoomConflictError",
                 "RoomProbeUnavailableError", "EventConflictError", "AuthorityConflictError",
                 "AuthoritySupersededError"):
        assert issubclass(getattr(hr, name), ValueError)
    assert hr.RoomHistoryExpiredError.reason == "room_history_expired"
    assert hr.AuthoritySupersededError.reason == "authority_conflict"
    import inspect

    expected = {
        "create_room": ["db_path", "room_id", "name", "members", "authority_gateway_id", "now"],
        "list_rooms": ["db_path", "include_disbanded", "limit", "offset"],
        "rename_room": ["db_path", "room_id", "event_id", "name", "now"],
        "append_event": ["db_path", "room_id", "event_id", "kind", "actor", "payload", "authority_gateway_id",
                         "authority_epoch", "now"],
        "room_state": ["db_path", "room_id", "include_disbanded"],
        "request_room_stop": ["db_path", "room_id", "cancel_id", "expected_gateway_id", "expected_epoch"],
        "claim_authority": ["db_path", "room_id", "expected_gateway_id", "expected_epoch", "new_gateway_id",
                            "event_id", "now"],
        "disband_room": ["db_path", "room_id", "expected_gateway_id", "expected_epoch", "now"],
        "read_events": ["db_path", "room_id", "since_seq", "limit", "include_disbanded"],
        "prune_disbanded_rooms": ["db_path", "now"],
        "user_event_id": ["client_event_id"], "local_authority_gateway_id": [], "default_db_path": []}
    for name, params in expected.items():
        signature = inspect.signature(getattr(hr, name))
        assert list(signature.parameters) == params, name
        kinds = [parameter.kind for parameter in signature.parameters.values()]
        if params and params[0] == "db_path":
            assert kinds[0] is inspect.Parameter.POSITIONAL_OR_KEYWORD
            assert all(kind is inspect.Parameter.KEYWORD_ONLY for kind in kinds[1:]), name


def test_facade_identity_and_default_db_path(monkeypatch: pytest.MonkeyPatch, tmp_path: Any) -> None:
    monkeypatch.delenv(compat_engine.INSTALL_ID_ENV, raising=False)
    with pytest.raises(hr.HostedRoomError, match="^stable gateway install identity is unavailable$"):
        hr.local_authority_gateway_id()
    monkeypatch.setenv(compat_engine.INSTALL_ID_ENV, "abc")
    assert hr.local_authority_gateway_id() == "install:abc"
    monkeypatch.delenv("HOSTEDROOMS_DATABASE_URL", raising=False)
    monkeypatch.setenv("HERMES_HOME", str(tmp_path / "root" / "profiles" / "work"))
    assert hr.default_db_path() == tmp_path / "root" / "state.db"
    monkeypatch.setenv("HERMES_HOME", str(tmp_path / "home"))
    assert hr.default_db_path() == tmp_path / "home" / "state.db"
    monkeypatch.setenv("HOSTEDROOMS_DATABASE_URL", "postgresql://db/rooms")
    assert hr.default_db_path() == "postgresql://db/rooms"


def test_facade_bad_input_creates_no_database(tmp_path: Any) -> None:
    path = tmp_path / "nested" / "state.db"
    with pytest.raises(hr.HostedRoomError, match="^invalid room_id$"):
        hr.create_room(str(path), room_id="bad id", name="x", members=[], authority_gateway_id=LOCAL)
    with pytest.raises(hr.HostedRoomError, match="^limit must be between 1 and 500$"):
        hr.read_events(str(path), room_id="r", limit=0)
    assert not path.exists() and not path.parent.exists()

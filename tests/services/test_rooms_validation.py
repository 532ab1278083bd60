"""Bad input to the room functions: the reference's error class and message, and the database unchanged."""

from __future__ import annotations

from typing import Any

import pytest
from apis import use_api
from factories import snapshot
from sqlalchemy import Engine

from hostedrooms import errors, rooms

_api = use_api("rooms")  # the tests on a database run on both APIs

LOCAL = "install:gw-local"
USER = {"kind": "user", "id": "u1"}
LONG = "a" * 129


def _append(**overrides: Any) -> dict[str, Any]:
    call = {"room_id": "room-1", "event_id": "e-new", "kind": "message.user", "actor": USER, "payload": {"t": 1},
            "authority_gateway_id": LOCAL, "authority_epoch": 1}
    call.update(overrides)
    return call


def _create(**overrides: Any) -> dict[str, Any]:
    call = {"room_id": "room-2", "name": "Team", "members": [], "authority_gateway_id": LOCAL}
    call.update(overrides)
    return call


def _claim(**overrides: Any) -> dict[str, Any]:
    call = {"room_id": "room-1", "expected_gateway_id": LOCAL, "expected_epoch": 1, "new_gateway_id": "install:x",
            "event_id": "claim-new"}
    call.update(overrides)
    return call


def _disband(**overrides: Any) -> dict[str, Any]:
    call = {"room_id": "room-1", "expected_gateway_id": LOCAL, "expected_epoch": 1}
    call.update(overrides)
    return call


#: (function, keyword arguments, error class name, exact message)
CASES: list[tuple[str, dict[str, Any], str, str]] = [
    # create_room
    ("create_room", _create(room_id="bad id"), "InvalidInputError", "invalid room_id"),
    ("create_room", _create(room_id=5), "InvalidInputError", "room_id must be a string"),
    ("create_room", _create(room_id=LONG), "InvalidInputError", "invalid room_id"),
    ("create_room", _create(room_id="-lead"), "InvalidInputError", "invalid room_id"),
    ("create_room", _create(name=" "), "InvalidInputError", "invalid room name"),
    ("create_room", _create(name="n" * 201), "InvalidInputError", "invalid room name"),
    ("create_room", _create(name=None), "InvalidInputError", "name must be a string"),
    ("create_room", _create(members={}), "InvalidInputError", "members must be a list"),
    ("create_room", _create(members=[1]), "InvalidInputError", "each room member must be an object"),
    ("create_room", _create(members=[{}] * 129), "InvalidInputError", "too many room members"),
    ("create_room", _create(members=[{"x": {1}}]), "InvalidInputError", "members must be JSON-serializable"),
    ("create_room", _create(members=[{"x": "y" * 140_000}]), "InvalidInputError", "members is too large"),
    ("create_room", _create(authority_gateway_id=None), "InvalidInputError", "authority_gateway_id must be a string"),
    ("create_room", _create(authority_gateway_id="bad gw"), "InvalidInputError", "invalid authority_gateway_id"),
    ("create_room", _create(room_id="gone"), "RoomConflictError", "room_id belongs to a disbanded room"),
    ("create_room", _create(room_id="room-1", name="Else"), "RoomConflictError",
     "room_id already exists with different state"),
    ("create_room", _create(room_id="room-1", authority_gateway_id="install:x"), "RoomConflictError",
     "room_id already belongs to a different authority"),
    # append_event
    ("append_event", _append(event_id="bad id"), "InvalidInputError", "invalid event_id"),
    ("append_event", _append(event_id=LONG), "InvalidInputError", "invalid event_id"),
    ("append_event", _append(kind="Message"), "InvalidInputError", "invalid event kind"),
    ("append_event", _append(kind="k" * 65), "InvalidInputError", "invalid event kind"),
    ("append_event", _append(kind=3), "InvalidInputError", "kind must be a string"),
    ("append_event", _append(actor="user"), "InvalidInputError", "actor must be an object"),
    ("append_event", _append(actor={"kind": "user", "id": "u", "x": 1, "a": 2}), "InvalidInputError",
     "unknown actor fields: a, x"),
    ("append_event", _append(actor={"kind": "robot", "id": "u"}), "InvalidInputError", "invalid actor.kind"),
    ("append_event", _append(actor={"id": "u"}), "InvalidInputError", "invalid actor.kind"),
    ("append_event", _append(kind="message.member"), "InvalidInputError",
     "actor kind 'user' cannot append 'message.member'"),
    ("append_event", _append(actor={"kind": "user"}), "InvalidInputError", "actor.id must be a string"),
    ("append_event", _append(actor={"kind": "user", "id": "a b"}), "InvalidInputError", "invalid actor.id"),
    ("append_event", _append(actor={"kind": "user", "id": "u", "display_name": 5}), "InvalidInputError",
     "actor.display_name must be a string"),
    ("append_event", _append(actor={"kind": "user", "id": "u", "display_name": "d" * 201}), "InvalidInputError",
     "actor.display_name is too long"),
    ("append_event", _append(actor={"kind": "user", "id": "u", "profile": "p" * 129}), "InvalidInputError",
     "actor.profile is too long"),
    ("append_event", _append(authority_gateway_id=None), "InvalidInputError", "authority_gateway_id must be a string"),
    ("append_event", _append(kind="turn.started", actor={"kind": "gateway", "id": "install:x"}), "InvalidInputError",
     "gateway actor.id must match authority_gateway_id"),
    ("append_event", _append(authority_epoch=0), "InvalidInputError", "authority_epoch must be a positive integer"),
    ("append_event", _append(authority_epoch=True), "InvalidInputError", "authority_epoch must be a positive integer"),
    ("append_event", _append(authority_epoch="1"), "InvalidInputError", "authority_epoch must be a positive integer"),
    ("append_event", _append(authority_epoch=None), "InvalidInputError", "authority_epoch must be a positive integer"),
    ("append_event", _append(payload=[]), "InvalidInputError", "payload must be an object"),
    ("append_event", _append(payload={"s": {1}}), "InvalidInputError", "payload must be JSON-serializable"),
    ("append_event", _append(payload={"s": "x" * 262_144}), "InvalidInputError", "payload is too large"),
    ("append_event", _append(authority_epoch=2), "AuthorityConflictError", "stale hosted room authority"),
    ("append_event", _append(authority_gateway_id="install:x"), "AuthorityConflictError",
     "stale hosted room authority"),
    ("append_event", _append(room_id="missing"), "RoomNotFoundError", "hosted room not found"),
    ("append_event", _append(room_id="gone"), "RoomHistoryExpiredError",
     "Group Chat history expired; room_id remains permanently retired"),
    ("append_event", _append(event_id="e-1", payload={"t": 2}), "EventConflictError",
     "event_id already exists with different content"),
    # read_events / room_state / list_rooms
    ("read_events", {"room_id": "room-1", "since_seq": 2}, "InvalidInputError",
     "since_seq is ahead of the hosted room log"),
    ("read_events", {"room_id": "room-1", "since_seq": -1}, "InvalidInputError",
     "since_seq must be a non-negative integer"),
    ("read_events", {"room_id": "room-1", "since_seq": True}, "InvalidInputError",
     "since_seq must be a non-negative integer"),
    ("read_events", {"room_id": "room-1", "limit": 0}, "InvalidInputError", "limit must be between 1 and 500"),
    ("read_events", {"room_id": "room-1", "limit": 501}, "InvalidInputError", "limit must be between 1 and 500"),
    ("read_events", {"room_id": "room-1", "limit": 1.0}, "InvalidInputError", "limit must be between 1 and 500"),
    ("read_events", {"room_id": "gone"}, "RoomHistoryExpiredError",
     "Group Chat history expired; room_id remains permanently retired"),
    ("room_state", {"room_id": "missing"}, "RoomNotFoundError", "hosted room not found"),
    ("room_state", {"room_id": " "}, "InvalidInputError", "invalid room_id"),
    ("list_rooms", {"limit": 0}, "InvalidInputError", "limit must be between 1 and 500"),
    ("list_rooms", {"offset": -1}, "InvalidInputError", "offset must be a non-negative integer"),
    # rename / stop / claim / disband
    ("rename_room", {"room_id": "room-1", "event_id": "r", "name": ""}, "InvalidInputError", "invalid room name"),
    ("rename_room", {"room_id": "room-1", "event_id": "e-1", "name": "N"}, "EventConflictError",
     "event_id already exists with different immutable content"),
    ("rename_room", {"room_id": "gone", "event_id": "r", "name": "N"}, "RoomHistoryExpiredError",
     "Group Chat history expired; room_id remains permanently retired"),
    ("request_room_stop", {"room_id": "room-1", "cancel_id": "bad id", "expected_gateway_id": LOCAL,
                           "expected_epoch": 1}, "InvalidInputError", "invalid cancel_id"),
    ("request_room_stop", {"room_id": "room-1", "cancel_id": "c", "expected_gateway_id": None,
                           "expected_epoch": 1}, "InvalidInputError", "actor.id must be a string"),
    ("request_room_stop", {"room_id": "room-1", "cancel_id": "c", "expected_gateway_id": LOCAL,
                           "expected_epoch": 3}, "AuthorityConflictError", "stale hosted room authority"),
    ("claim_authority", _claim(expected_gateway_id=1), "InvalidInputError", "expected_gateway_id must be a string"),
    ("claim_authority", _claim(new_gateway_id="a b"), "InvalidInputError", "invalid new_gateway_id"),
    ("claim_authority", _claim(event_id=""), "InvalidInputError", "invalid event_id"),
    ("claim_authority", _claim(expected_epoch=0), "InvalidInputError", "expected_epoch must be a positive integer"),
    ("claim_authority", _claim(expected_epoch=2), "AuthorityConflictError", "hosted room authority changed"),
    ("claim_authority", _claim(event_id="e-1"), "EventConflictError", "event_id already exists with different content"),
    ("claim_authority", _claim(room_id="gone"), "RoomHistoryExpiredError",
     "Group Chat history expired; room_id remains permanently retired"),
    ("disband_room", _disband(expected_epoch=-1), "InvalidInputError", "expected_epoch must be a positive integer"),
    ("disband_room", _disband(expected_gateway_id="install:x"), "AuthorityConflictError",
     "stale hosted room authority"),
    ("disband_room", _disband(room_id="missing"), "RoomNotFoundError", "hosted room not found"),
]


def _seed(engine: Engine) -> None:
    rooms.create_room(engine, room_id="room-1", name="Team", members=[], authority_gateway_id=LOCAL, now=1.0)
    rooms.append_event(engine, room_id="room-1", event_id="e-1", kind="message.user", actor=USER, payload={"t": 1},
                       authority_gateway_id=LOCAL, authority_epoch=1, now=2.0)
    rooms.create_room(engine, room_id="gone", name="Gone", members=[], authority_gateway_id=LOCAL, now=1.0)
    rooms.disband_room(engine, room_id="gone", expected_gateway_id=LOCAL, expected_epoch=1, now=3.0)
    rooms.prune_disbanded_rooms(engine, now=10.0**10)


def test_bad_input_is_refused_and_leaves_the_database_unchanged(engine: Engine) -> None:
    _seed(engine)
    before = snapshot(engine)
    for function, kwargs, error_name, message in CASES:
        with pytest.raises(HostedRoomError) as excinfo:
            getattr(rooms, function)(engine, **kwargs)
        assert type(excinfo.value) is getattr(errors, error_name), (function, kwargs, excinfo.value)
        assert str(excinfo.value) == message, (function, kwargs)
    assert snapshot(engine) == before


def test_user_event_id_validates() -> None:
    with pytest.raises(HostedRoomError, match="^invalid event_id$"):
        rooms.user_event_id("bad id")
    assert rooms.user_event_id(" c ") == rooms.user_event_id("c")


HostedRoomError = errors.HostedRoomError

"""Replicated events, epochs and the disband/purge race (issue 14, sections 3 and 5).

* A replicated event passes the authority's own identifier, kind and size rules, exactly as given (a replica
  stores what the authority stored); anything else is a ``ReplicaError`` and nothing is stored.
* Every epoch is bounded so that the ``epoch + 1`` of a later claim or promotion still fits 64 bits: an
  out-of-range epoch is refused where it enters, never an ``OverflowError``/``bigint out of range`` later.
* ``demote_room`` never takes this gateway itself as the newer authority.
* PostgreSQL: a room disbanded and purged between ``read_events``' two statements is reported as expired.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import sqlalchemy as sa
from apis import use_api
from factories import bare_page as page
from factories import snapshot
from sqlalchemy import Engine

from hostedrooms import models, replicas, rooms
from hostedrooms.db import create_engine
from hostedrooms.errors import HostedRoomError, ReplicaError, RoomHistoryExpiredError
from hostedrooms.rooms.events import read_events_exact

_api = use_api("replicas", "rooms")  # the tests on a database run on both APIs

A = "install:gw-a"
B = "install:gw-b"
USER = {"kind": "user", "id": "u1"}
INT64_MAX = 2**63 - 1
MAX_EPOCH = INT64_MAX - 1  # the largest stored epoch: a claim or promotion writes epoch + 1


def ingest(engine: Engine, body: dict[str, Any], room_name: Any = "X") -> dict[str, Any]:
    return replicas.ingest_page(engine, room_id="x1", room_name=room_name, members=[], page=body, now=5.0)


# --- replicated events pass the authority's rules ------------------------------------------------------------------


# Regression: a 3 MB event_id and the kind "NOT A KIND!" were ingested; the promoted room could not be read.
@pytest.mark.parametrize(("field", "value", "message"), [
    ("event_id", "x" * 3_000_000, "^event.event_id: invalid event_id$"),
    ("event_id", "not an id!", "^event.event_id: invalid event_id$"),
    ("event_id", " e1", "^event.event_id: invalid event_id$"),  # the authority never stores an unstripped id
    ("event_id", "e\ud800", "^event.event_id: invalid event_id$"),
    ("kind", "NOT A KIND!", "^event.kind: invalid event kind$"),
    ("kind", "k" * 65, "^event.kind: invalid event kind$"),
    ("kind", "message.user\ud800", "^event.kind: invalid event kind$"),
    ("kind", "message.user\x00", "^event.kind: invalid event kind$"),
])
def test_replicated_ids_and_kinds_pass_the_append_rules(engine: Engine, field: str, value: str, message: str) -> None:
    before = snapshot(engine)
    with pytest.raises(ReplicaError, match=message):
        ingest(engine, page({}, {field: value}))
    assert snapshot(engine) == before


def test_replicated_events_keep_the_append_size_rules(engine: Engine) -> None:
    before = snapshot(engine)
    with pytest.raises(ReplicaError, match="^payload is too large$"):
        ingest(engine, page({"payload": {"text": "x" * (256 * 1024)}}))
    with pytest.raises(ReplicaError, match="^actor is too large$"):
        ingest(engine, page({"actor": {"kind": "user", "id": "u", "display_name": "x" * 5000}}))
    assert snapshot(engine) == before


# Regression: created_at=10**400 escaped as a raw OverflowError.
@pytest.mark.parametrize("created_at", [10**400, -(10**400), float("inf"), float("nan"), "1.0", True])
def test_replicated_timestamps_must_be_finite_numbers(engine: Engine, created_at: Any) -> None:
    before = snapshot(engine)
    with pytest.raises(ReplicaError, match="^event.created_at must be a finite number$"):
        ingest(engine, page({"created_at": created_at}))
    assert snapshot(engine) == before


def test_replica_room_names_refuse_nul(engine: Engine) -> None:
    with pytest.raises(HostedRoomError, match="^invalid room name$"):
        ingest(engine, page({}), room_name="X\x00Y")
    assert snapshot(engine)["hosted_room_replicas"] == []


def test_a_valid_replica_promotes_into_a_readable_room(engine: Engine) -> None:
    ingest(engine, page({"event_id": "user:abc", "payload": {"text": "hi \x00 \u009b"}}, {"kind": "turn.started",
                                                                                          "actor": {"kind": "gateway",
                                                                                                    "id": B}}))
    replicas.promote_replica(engine, room_id="x1", reason="test", now=6.0, local_gateway_id=A)
    events = rooms.read_events(engine, room_id="x1")["events"]
    assert [(event["event_id"], event["payload"]) for event in events[:2]] == [
        ("user:abc", {"text": "hi \x00 \u009b"}), ("e2", {})]


# --- epochs ---------------------------------------------------------------------------------------------------------


def test_the_largest_epoch_leaves_room_for_one_more() -> None:
    from hostedrooms import validation

    assert (validation.MAX_EPOCH, validation.INT64_MAX) == (MAX_EPOCH, INT64_MAX)


# Regression: a page at epoch 2**63-1 was ingested; promote_replica then failed raw (OverflowError on SQLite,
# "bigint out of range" on PostgreSQL), so a peer could make a replica impossible to promote.
@pytest.mark.parametrize("epoch", [INT64_MAX, MAX_EPOCH])
def test_ingest_refuses_epochs_that_could_not_be_promoted(engine: Engine, epoch: int) -> None:
    before = snapshot(engine)
    with pytest.raises(ReplicaError, match="^page.authority.epoch is beyond the largest authority epoch$"):
        ingest(engine, page({}, epoch=epoch))
    assert snapshot(engine) == before


def test_the_highest_promotable_epoch_ends_cleanly_at_the_next_claim(engine: Engine) -> None:
    ingest(engine, page({}, epoch=MAX_EPOCH - 1))
    promoted = replicas.promote_replica(engine, room_id="x1", reason="test", now=6.0, local_gateway_id=A)
    assert promoted["authority_epoch"] == MAX_EPOCH
    before = snapshot(engine)
    with pytest.raises(HostedRoomError, match="^expected_epoch is beyond the largest authority epoch$"):
        rooms.claim_authority(engine, room_id="x1", expected_gateway_id=A, expected_epoch=MAX_EPOCH,
                              new_gateway_id=B, event_id="claim-1", now=7.0)
    assert snapshot(engine) == before
    rooms.append_event(engine, room_id="x1", event_id="still", kind="message.user", actor=USER, payload={},
                       authority_gateway_id=A, authority_epoch=MAX_EPOCH, now=7.0)


def _local_room(engine: Engine) -> None:
    rooms.create_room(engine, room_id="r1", name="R", members=[], authority_gateway_id=A, now=1.0)


# Regression: demote_room accepted 2**63-1; the next claim_authority then failed raw.
def test_demote_refuses_epochs_that_could_not_be_claimed_again(engine: Engine) -> None:
    _local_room(engine)
    before = snapshot(engine)
    with pytest.raises(ReplicaError, match="^observed_epoch is beyond the largest authority epoch$"):
        replicas.demote_room(engine, room_id="r1", observed_gateway_id=B, observed_epoch=INT64_MAX, now=2.0,
                             local_gateway_id=A)
    assert snapshot(engine) == before
    replicas.demote_room(engine, room_id="r1", observed_gateway_id=B, observed_epoch=MAX_EPOCH, now=2.0,
                         local_gateway_id=A)
    before = snapshot(engine)
    with pytest.raises(HostedRoomError, match="^expected_epoch is beyond the largest authority epoch$"):
        rooms.claim_authority(engine, room_id="r1", expected_gateway_id=B, expected_epoch=MAX_EPOCH,
                              new_gateway_id=A, event_id="back", now=3.0)
    assert snapshot(engine) == before


@pytest.mark.parametrize("call", ["append_event", "append_events", "disband_room", "claim_authority"])
def test_room_writes_refuse_epochs_beyond_the_bound(engine: Engine, call: str) -> None:
    _local_room(engine)
    before = snapshot(engine)
    with pytest.raises(HostedRoomError, match="epoch is beyond the largest authority epoch$"):
        if call == "append_event":
            rooms.append_event(engine, room_id="r1", event_id="e1", kind="message.user", actor=USER, payload={},
                               authority_gateway_id=A, authority_epoch=INT64_MAX)
        elif call == "append_events":
            rooms.append_events(engine, "r1", [{"event_id": "e1", "kind": "message.user", "actor": USER,
                                                "payload": {}}], A, INT64_MAX)
        elif call == "disband_room":
            rooms.disband_room(engine, room_id="r1", expected_gateway_id=A, expected_epoch=INT64_MAX)
        else:
            rooms.claim_authority(engine, room_id="r1", expected_gateway_id=A, expected_epoch=INT64_MAX,
                                  new_gateway_id=B, event_id="c1")
    assert snapshot(engine) == before


def test_a_legacy_room_at_the_largest_epoch_is_refused_cleanly(engine: Engine) -> None:
    rooms.create_room(engine, room_id="r1", name="R", members=[], authority_gateway_id="legacy", now=1.0)
    with engine.begin() as connection:
        connection.execute(sa.update(models.rooms).values(authority_epoch=INT64_MAX))
    before = snapshot(engine)
    with pytest.raises(HostedRoomError, match="^legacy room authority_epoch is beyond the largest authority epoch$"):
        rooms.create_room(engine, room_id="r1", name="R", members=[], authority_gateway_id=A, now=2.0)
    assert snapshot(engine) == before


# Regression: demote_room took this gateway itself as the "newer" authority and raised its own epoch, no claim.
def test_demote_refuses_this_gateway_as_the_newer_authority(engine: Engine) -> None:
    _local_room(engine)
    before = snapshot(engine)
    with pytest.raises(ReplicaError, match="^observed_gateway_id is this gateway: "):
        replicas.demote_room(engine, room_id="r1", observed_gateway_id=A, observed_epoch=5, now=2.0,
                             local_gateway_id=A)
    assert snapshot(engine) == before
    assert rooms.room_state(engine, room_id="r1")["authority_epoch"] == 1


# --- the disband/purge race (PostgreSQL reads each statement at its own snapshot) ------------------------------------


# Regression (PostgreSQL): a room purged between read_events' room read and its page read was reported as "event
# exceeds replay page limit". On SQLite the read transaction is one snapshot: the page is returned as it stood.
# The purge runs just before the first statement that reads the log: on the plain path that is the page statement
# after the room read; read_events on PostgreSQL reads the room and the page in that one statement.
@pytest.mark.sync_api_only  # listens to the statements of the test's own Engine
@pytest.mark.parametrize("read", [rooms.read_events, read_events_exact], ids=["read_events", "plain"])
def test_a_room_purged_while_it_is_read(engine: Engine, target: str, read: Callable[..., Any]) -> None:
    _local_room(engine)
    for index in range(3):
        rooms.append_event(engine, room_id="r1", event_id=f"e{index}", kind="message.user", actor=USER, payload={},
                           authority_gateway_id=A, authority_epoch=1, now=2.0)
    rooms.disband_room(engine, room_id="r1", expected_gateway_id=A, expected_epoch=1, now=3.0)
    other = create_engine(target)
    purged: list[int] = []

    def purge_before_the_page(_conn: Any, _cursor: Any, statement: str, *_args: Any) -> None:
        if models.events.name in statement and not purged:
            purged.append(rooms.prune_disbanded_rooms(other, now=10.0**10))

    sa.event.listen(engine, "before_cursor_execute", purge_before_the_page)
    try:
        if engine.dialect.name == "postgresql":
            with pytest.raises(RoomHistoryExpiredError, match="^Group Chat history expired"):
                read(engine, room_id="r1", include_disbanded=True)
        else:
            page = read(engine, room_id="r1", include_disbanded=True)
            assert [event["seq"] for event in page["events"]] == [1, 2, 3, 4]
    finally:
        sa.event.remove(engine, "before_cursor_execute", purge_before_the_page)
        other.dispose()
    assert purged == [1]
    with pytest.raises(RoomHistoryExpiredError):
        read(engine, room_id="r1", include_disbanded=True)

"""A strict application using hostedrooms: ``mypy --strict`` must accept this file, and it runs as written.

tests/packaging/test_typing.py type-checks it (each ``assert_type`` pins a result's key to its type: a key typed
``Any``, renamed or removed fails the check) and runs :func:`main` on a SQLite file.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any, assert_type

from sqlalchemy import Engine

import hostedrooms
from hostedrooms import UnitOfWork, create_engine, migrate, peers, replicas, rooms
from hostedrooms.ledger import DeliveryLedger
from hostedrooms.records import (
    Actor,
    Authority,
    ClaimedRoom,
    CreatedRoom,
    DeliveryRecord,
    EventPage,
    EventRecord,
    GrantClaims,
    NewEvent,
    OutboundRecord,
    RemoteRunReceipt,
    RemoteRunRecord,
    ReplicaState,
    RoomLinkRecord,
    RoomRecord,
)

GATEWAY = "install:gw-a"
PEER = "install:gw-b"


def whole_log(engine: Engine, room_id: str) -> list[EventRecord]:
    """Every event of a room, one bounded page at a time."""
    events: list[EventRecord] = []
    since = 0
    while True:
        page: EventPage = rooms.read_events(engine, room_id=room_id, since_seq=since, limit=2)
        events.extend(page["events"])
        assert_type(page["has_more"], bool)
        since = page["cursor"]
        if not page["has_more"]:
            return events


def use_rooms(engine: Engine) -> EventPage:
    created: CreatedRoom = rooms.create_room(
        engine, room_id="r1", name="Planning", members=[{"id": "bot-1", "role": "helper"}],
        authority_gateway_id=GATEWAY, now=100.0)
    assert_type(created["authority_epoch"], int)
    assert_type(created.get("latest_seq"), int | None)  # absent on first creation
    if created.get("adopted"):
        claim = created["claim_event"]
        assert_type(claim["seq"], int)

    user: Actor = {"kind": "user", "id": "u1", "display_name": "Ada"}
    event = rooms.append_event(
        engine, room_id="r1", event_id=rooms.user_event_id("client-42"), kind="message.user", actor=user,
        payload={"text": "hello"}, authority_gateway_id=GATEWAY, authority_epoch=1)
    assert_type(event["seq"], int)
    assert_type(event["authority_epoch"], int | None)
    assert_type(event["idempotent"], bool)
    text = event["payload"]["text"]
    assert text == "hello"

    batch: list[NewEvent] = [
        {"event_id": "t1", "kind": "turn.started", "actor": {"kind": "gateway", "id": GATEWAY}, "payload": {}},
        {"event_id": "t2", "kind": "turn.settled", "actor": {"kind": "gateway", "id": GATEWAY}, "payload": {}},
    ]
    seqs: list[int] = [item["seq"] for item in rooms.append_events(engine, "r1", batch, GATEWAY, 1)]
    assert seqs == [2, 3]
    assert len(whole_log(engine, "r1")) == 3

    renamed = rooms.rename_room(engine, room_id="r1", event_id="rename-1", name="Roadmap")
    assert_type(renamed["latest_seq"], int)  # always present here
    assert_type(renamed["event"]["kind"], str)

    claimed: ClaimedRoom = rooms.claim_authority(
        engine, room_id="r1", expected_gateway_id=GATEWAY, expected_epoch=1, new_gateway_id=PEER,
        event_id="claim-2")
    assert claimed["claim_event"]["authority_epoch"] == 2
    state = rooms.room_state(engine, room_id="r1")
    if "authority_claim" in state:
        assert_type(state["authority_claim"]["event_id"], str)
    listed: list[RoomRecord] = rooms.list_rooms(engine, limit=10)
    names = {room["room_id"]: room["name"] for room in listed}
    assert names == {"r1": "Roadmap"}

    page = rooms.read_events(engine, room_id="r1")
    authority: Authority = page["authority"]
    assert (authority["gateway_id"], authority["epoch"]) == (PEER, 2)
    return page


def use_replicas(engine: Engine, page: EventPage) -> None:
    ingested = replicas.ingest_page(engine, room_id="copy", room_name="Copy", members=[], page={
        **page, "events": [{**event, "room_id": "copy"} for event in page["events"]]})
    assert_type(ingested["caught_up"], bool)
    state: ReplicaState = replicas.replica_state(engine, room_id="copy")
    assert state["last_seq"] == state["latest_seq"] == ingested["stored_seq"]
    promoted = replicas.promote_replica(engine, room_id="copy", local_gateway_id=GATEWAY, reason="peer gone")
    assert_type(promoted["previous_epoch"], int)
    demoted = replicas.demote_room(
        engine, room_id="copy", observed_gateway_id=PEER, observed_epoch=promoted["authority_epoch"] + 1,
        local_gateway_id=lambda: GATEWAY)
    assert_type(demoted["idempotent"], bool)


def use_peers(engine: Engine) -> None:
    link: RoomLinkRecord = {
        "room_id": "r1", "member_id": "m1", "target_url": "https://peer.example/rooms", "target_profile": "default",
        "grant": "secret", "catalog_json": "{}", "cancellation_scope_id": "scope", "trace_id": "trace",
        "transport_security": "tls", "status": "ready", "updated_at": 10.0}
    peers.upsert_room_link_record(engine, record=link, max_links=16)
    stored: list[RoomLinkRecord] = peers.list_room_link_records(engine)
    assert stored[0]["grant"] == "secret"
    assert peers.update_room_link_status(engine, room_id="r1", member_id="m1", status="degraded")

    claims: GrantClaims = {
        "room_id": "r1", "home_install_id": "home", "authority_gateway_id": PEER, "authority_epoch": 2,
        "member_id": "m1", "target_install_id": "target", "target_profile": "default", "issued_at": 5.0}
    peers.reserve_peer_room(engine, claims=claims, expires_at=10**10, now=10.0)
    assert peers.peer_room_grant_is_current(engine, claims=claims, now=10.0)
    peers.revoke_room_grant_scope(engine, claims=claims, expires_at=10**10, now=10.0)
    assert peers.room_grant_is_revoked(engine, claims=claims, now=10.0)

    record: RemoteRunRecord = {
        "room_id": "r1", "home_install_id": "home", "authority_gateway_id": PEER, "authority_epoch": 2,
        "member_id": "m1", "target_install_id": "target", "target_profile": "default", "task_id": "task-1",
        "execution_generation": 1, "run_id": "run-1", "session_id": "session-1"}
    peers.upsert_remote_run_receipt(engine, record=record, now=10.0)
    receipt: RemoteRunReceipt | None = peers.remote_run_receipt(engine, record=record)
    assert receipt is not None and receipt["run_id"] == "run-1"
    assert_type(receipt["created_at"], float)
    assert [item["task_id"] for item in peers.list_remote_run_receipts(engine, session_id="session-1")] == ["task-1"]
    assert peers.delete_room_link_records(engine, room_id="r1") == 1


def use_ledger(engine: Engine) -> None:
    ledger = DeliveryLedger(engine, clock=lambda: 1_000_000.0)
    envelope = {
        "envelope_id": "env-1", "request_id": "req-1", "team_id": "team", "source_server_identity": "srv-a",
        "source_route_id": "route-a", "source_route_revision": "rev-1", "target_server_identity": "srv-b",
        "target_route_id": "route-b", "target_route_revision": "rev-2", "action": "request_reply",
        "kind": "request_reply", "exchange_id": "ex-1", "used_legs": 1, "max_legs": 6, "expires_at": 2_000_000,
        "body": {"message": "hi"}}
    row, created = ledger.prepare(envelope, transport_role="host", connection_id="conn-1", lease_token="lease-1",
                                  target_chat_id="chat-1")
    assert created and row["state"] == "prepared"
    assert_type(row["body"]["message"], str)
    authorized: DeliveryRecord | None = ledger.authorize("env-1")
    assert authorized is not None and authorized["queued_id"] is None
    running = ledger.bind_owner("env-1", queued_id=None, run_id="run-1")
    assert running is not None
    assert_type(running["admission_attempts"], int)
    finished = ledger.finish("env-1", succeeded=True, result_text="done")
    assert finished is not None and finished["result_hash"] is not None

    intent, _ = ledger.prepare_outbound(
        request_id="out-1", source_session_id="chat-1", source_run_id="run-1", body="hello", action="instruction",
        expires_at=2_000_000, snapshot={"connection_id": "conn-1", "source_route_id": "route-a",
                                        "source_route_revision": "rev-1", "source_chat_id": "chat-1",
                                        "action": "instruction"})
    assert_type(intent["response"], dict[str, Any] | None)
    committed: OutboundRecord | None = ledger.commit_outbound("out-1", {"accepted": True})
    assert committed is not None and committed["response"] == {"accepted": True}
    assert ledger.prune(retain_seconds=0) >= 0


def main(directory: Path) -> None:
    engine = create_engine(directory / "state.db")
    try:
        migrate.upgrade(engine)
        page = use_rooms(engine)
        use_replicas(engine, page)
        use_peers(engine)
        use_ledger(engine)
        with UnitOfWork(engine, write=False) as uow:
            assert uow.connection is not None
        assert hostedrooms.verify(engine) == []
    finally:
        engine.dispose()


if __name__ == "__main__":
    main(Path(sys.argv[1]))

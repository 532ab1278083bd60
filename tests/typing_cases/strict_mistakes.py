"""Mistakes ``mypy --strict`` must report in a user's code: each line ending in ``# E: <code>`` has errors of that
code (``# E: <code> xN``: N of them), and no other line has any (tests/packaging/test_typing.py compares them)."""

from __future__ import annotations

from sqlalchemy import Engine

from hostedrooms import peers, replicas, rooms
from hostedrooms.ledger import DeliveryLedger


def mistakes(engine: Engine, ledger: DeliveryLedger) -> None:
    page = rooms.read_events(engine, room_id="r1")
    print(page["cursr"])  # E: typeddict-item
    rooms.read_events(engine, room_id=42)  # E: arg-type
    rooms.create_room(engine, room_id=42, name=None, members="x", authority_gateway_id=3.5)  # E: arg-type x4
    rooms.append_event(engine, room_id="r1", event_id="e1", kind="message.user",  # E: call-arg x2
                       actor={"kind": "user", "id": "u1"}, payload={})
    rooms.append_event(engine, room_id="r1", event_id="e1", kind="message.user",
                       actor={"kind": "user"},  # E: typeddict-item
                       payload={}, authority_gateway_id="install:gw", authority_epoch=1)
    epoch: str = rooms.room_state(engine, room_id="r1")["authority_epoch"]  # E: assignment
    print(epoch, replicas.replica_state(engine, room_id="r1")["last_sq"])  # E: typeddict-item
    row = ledger.get("env-1")
    print(row["state"])  # E: index
    if row is not None:
        print(row["stat"])  # E: typeddict-item
    for link in peers.list_room_link_records(engine):
        print(link["grnt"])  # E: typeddict-item
    for event in rooms.follow(engine, 42, since_seq="0"):  # E: arg-type x2
        print(event["seq"])
    if row is not None and row["state"] == "complete":  # E: comparison-overlap
        print(row)

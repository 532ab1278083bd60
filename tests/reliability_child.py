"""Child-process workers for the reliability tests (run as a script: ``python reliability_child.py MODE ...``).

Every worker builds its own engine from a target string (a SQLite path or a PostgreSQL URL), prints one JSON
object per line and flushes after each, so a parent that SIGKILLs it knows exactly which writes were
acknowledged.

Modes
- ``crash TARGET GENERATION SEED [RETRY_JSON]``: endless writes (single appends, batches, ledger deliveries
  moved through their states). Prints ``{"intent": ...}`` before each write and ``{"ack": ...}`` after it
  commits. On start it first repeats ``RETRY_JSON`` (the previous run's unacknowledged intent) and drives every
  recoverable delivery to completion.
- ``append TARGET SPEC_JSON``: waits for ``go`` on stdin, runs a planned list of appends (with retries of
  another worker's chunks) and prints ``{"results": ..., "unavailable": n}``.
- ``follow TARGET SPEC_JSON``: appends while following the room's authority until the room is disbanded.
- ``claim TARGET SPEC_JSON``: moves the room's authority back and forth, then disbands the room.
"""

from __future__ import annotations

import json
import random
import sys
import time
from typing import Any

from factories import prepare
from sqlalchemy import Engine

import hostedrooms
from hostedrooms import limits, rooms
from hostedrooms.errors import AuthorityConflictError, RoomNotFoundError, StoreUnavailableError
from hostedrooms.ledger import DeliveryLedger

CRASH_ROOM = "crash-room"
GATEWAY = "install:gw-local"
USER = {"kind": "user", "id": "u1"}
#: The ledger states a crash-test delivery moves through, in order.
LEDGER_STEPS = ("prepared", "authorized", "queued", "running", "completed")


def emit(**fields: Any) -> None:
    sys.stdout.write(json.dumps(fields) + "\n")
    sys.stdout.flush()


def event_item(event_id: str) -> dict[str, Any]:
    """The one content every writer uses for ``event_id`` (so any retry is an exact replay)."""
    return {"event_id": event_id, "kind": "message.user", "actor": USER, "payload": {"text": event_id}}


# --- crash mode --------------------------------------------------------------------------------------------


def append_chunk(engine: Engine, room_id: str, ids: list[str], *, gateway: str = GATEWAY,
                 epoch: int = 1) -> list[dict[str, Any]]:
    """Append ``ids`` (one event: append_event; several: one append_events batch)."""
    if len(ids) == 1:
        item = event_item(ids[0])
        return [rooms.append_event(engine, room_id=room_id, authority_gateway_id=gateway, authority_epoch=epoch,
                                   **item)]
    return rooms.append_events(engine, room_id, [event_item(event_id) for event_id in ids], gateway, epoch)


def ledger_step(ledger: DeliveryLedger, envelope_id: str, state: str) -> dict[str, Any] | None:
    """Move ``envelope_id`` into ``state`` (the next of LEDGER_STEPS); returns the row or None."""
    if state == "prepared":
        row, _ = prepare(ledger, envelope_id, exchange_id=f"ex-{envelope_id}", message=f"hello {envelope_id}")
        return row
    if state == "authorized":
        return ledger.authorize(envelope_id)
    if state == "queued":
        return ledger.bind_owner(envelope_id, queued_id=f"q-{envelope_id}", run_id=None)
    if state == "running":
        return ledger.bind_owner(envelope_id, queued_id=f"q-{envelope_id}", run_id=f"run-{envelope_id}")
    return ledger.finish(envelope_id, succeeded=True, result_text=f"done {envelope_id}")


def perform(engine: Engine, ledger: DeliveryLedger, intent: dict[str, Any]) -> dict[str, Any]:
    """Run one intent and return its acknowledgement."""
    if intent["op"] == "events":
        written = append_chunk(engine, CRASH_ROOM, intent["ids"])
        return {**intent, "seqs": [event["seq"] for event in written]}
    row = ledger_step(ledger, intent["envelope_id"], intent["state"])
    if row is None:  # finish is not idempotent: a retried one finds the delivery already completed
        row = ledger.get(intent["envelope_id"])
    if row is None or row["state"] != intent["state"]:
        raise RuntimeError(f"ledger step {intent} returned {row}")
    return intent


def write(engine: Engine, ledger: DeliveryLedger, intent: dict[str, Any]) -> None:
    emit(intent=intent)
    emit(ack=perform(engine, ledger, intent))


def recover(engine: Engine, ledger: DeliveryLedger) -> None:
    """Drive every delivery a crash left unfinished to completion (what a restarted gateway does)."""
    for row in ledger.recoverable():
        for state in LEDGER_STEPS[LEDGER_STEPS.index(row["state"]) + 1:]:
            write(engine, ledger, {"op": "ledger", "envelope_id": row["envelope_id"], "state": state})


def crash(target: str, generation: int, seed: int, retry: dict[str, Any] | None) -> None:
    # The writers append for as long as the parent lets them (200 runs of up to 0.25 s each): at today's speed
    # that can pass the default 50,000-event history limit of the one crash room, which is not what is tested.
    limits.MAX_EVENTS_PER_ROOM = 10**7
    limits.MAX_ROOM_EVENT_BYTES = limits.MAX_GATEWAY_EVENT_BYTES = 1 << 40
    engine = hostedrooms.create_engine(target)
    ledger = DeliveryLedger(engine)
    rooms.create_room(engine, room_id=CRASH_ROOM, name="Crash", members=[], authority_gateway_id=GATEWAY)
    emit(ready=generation)
    if retry is not None:
        write(engine, ledger, retry)
    recover(engine, ledger)
    rng = random.Random(seed)
    for n in range(10**9):
        choice = rng.random()
        if choice < 0.4:
            write(engine, ledger, {"op": "events", "ids": [f"g{generation}-s{n}"]})
        elif choice < 0.8:
            size = rng.randint(2, 12)
            write(engine, ledger, {"op": "events", "ids": [f"g{generation}-b{n}-{i}" for i in range(size)]})
        else:
            for state in LEDGER_STEPS:
                write(engine, ledger, {"op": "ledger", "envelope_id": f"g{generation}-env{n}", "state": state})


# --- contention modes --------------------------------------------------------------------------------------


def append_planned(target: str, spec: dict[str, Any]) -> None:
    """Run ``spec["plan"]``: a list of [room_id, [event ids]] chunks; StoreUnavailableError is retried."""
    engine = hostedrooms.create_engine(target)
    emit(ready=spec["worker"])
    sys.stdin.readline()  # "go": every worker starts together
    results: list[list[Any]] = []
    unavailable = 0
    for room_id, ids in spec["plan"]:
        while True:
            try:
                written = append_chunk(engine, room_id, ids)
                break
            except StoreUnavailableError:  # documented: a lock held past the busy timeout; retry
                unavailable += 1
        results.extend([room_id, event["event_id"], event["seq"], event["idempotent"]] for event in written)
    emit(results=results, unavailable=unavailable)


def authority(engine: Engine, room_id: str) -> tuple[str, int]:
    state = rooms.room_state(engine, room_id=room_id)
    return state["authority_gateway_id"], state["authority_epoch"]


def follow(target: str, spec: dict[str, Any]) -> None:
    """Append events, refreshing the authority after every refusal, until the room is disbanded."""
    engine = hostedrooms.create_engine(target)
    room_id, worker = spec["room_id"], spec["worker"]
    emit(ready=worker)
    sys.stdin.readline()
    gateway, epoch = authority(engine, room_id)
    written: list[list[Any]] = []
    stale = unavailable = 0
    index = 0
    while index < spec["max_events"]:
        item = event_item(f"f{worker}-{index}")
        try:
            event = rooms.append_event(engine, room_id=room_id, authority_gateway_id=gateway,
                                       authority_epoch=epoch, **item)
        except AuthorityConflictError:
            stale += 1
            gateway, epoch = authority(engine, room_id)
            continue
        except RoomNotFoundError:
            break
        except StoreUnavailableError:
            unavailable += 1
            continue
        written.append([event["event_id"], event["seq"], epoch])
        index += 1
    emit(written=written, stale=stale, unavailable=unavailable)


def claim(target: str, spec: dict[str, Any]) -> None:
    """``spec["claims"]`` claims alternating between two gateways, then a disband at the final authority."""
    engine = hostedrooms.create_engine(target)
    room_id = spec["room_id"]
    rng = random.Random(spec["seed"])
    emit(ready="claimer")
    sys.stdin.readline()
    claims: list[list[Any]] = []
    for index in range(spec["claims"]):
        time.sleep(rng.uniform(0.002, 0.02))
        gateway, epoch = authority(engine, room_id)
        new_gateway = "install:gw-b" if gateway != "install:gw-b" else "install:gw-a"
        result = rooms.claim_authority(engine, room_id=room_id, expected_gateway_id=gateway, expected_epoch=epoch,
                                       new_gateway_id=new_gateway, event_id=f"claim-{index}")
        claims.append([result["claim_event"]["seq"], result["authority_epoch"]])
    time.sleep(0.02)
    gateway, epoch = authority(engine, room_id)
    disbanded = rooms.disband_room(engine, room_id=room_id, expected_gateway_id=gateway, expected_epoch=epoch)
    emit(claims=claims, disband_seq=disbanded["event"]["seq"])


def main(argv: list[str]) -> None:
    mode, target = argv[1], argv[2]
    if mode == "crash":
        retry = json.loads(argv[5]) if len(argv) > 5 and argv[5] else None
        crash(target, int(argv[3]), int(argv[4]), retry)
    elif mode == "append":
        append_planned(target, json.loads(argv[3]))
    elif mode == "follow":
        follow(target, json.loads(argv[3]))
    elif mode == "claim":
        claim(target, json.loads(argv[3]))
    else:
        raise SystemExit(f"unknown mode {mode}")


if __name__ == "__main__":
    main(sys.argv)

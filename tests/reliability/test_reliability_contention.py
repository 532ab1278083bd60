"""Multi-process contention on both backends: separate processes (each with its own engine) append to one room
or to several, retry chunks another process may already have written, and race claims and a disband against
appends. Nothing is lost, duplicated or reordered, and no event is committed at a stale authority epoch.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from sqlalchemy import Engine

import hostedrooms
from hostedrooms import models, rooms

CHILD = str(Path(__file__).resolve().parents[1] / "reliability_child.py")
LOCAL = "install:gw-local"
BATCH = 5
RETRY_EVERY = 7


def run_children(target: str, specs: list[tuple[str, dict[str, Any]]], timeout: float = 240) -> list[dict[str, Any]]:
    """Start one process per (mode, spec); release them together; return each one's final JSON line."""
    children = [subprocess.Popen([sys.executable, CHILD, mode, target, json.dumps(spec)], stdin=subprocess.PIPE,
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
                for mode, spec in specs]
    try:
        for child in children:
            assert child.stdout is not None
            ready = child.stdout.readline()
            assert ready.startswith('{"ready"'), (ready, child.stderr.read() if child.stderr else "")
        for child in children:  # all imported and connected: go
            assert child.stdin is not None
            child.stdin.write("go\n")
            child.stdin.flush()
        outputs = [child.communicate(timeout=timeout) for child in children]
    finally:
        for child in children:
            if child.poll() is None:
                child.kill()
    results = []
    for child, (out, err) in zip(children, outputs, strict=True):
        assert child.returncode == 0, f"worker failed with an undocumented error:\n{err}"
        results.append(json.loads(out.strip().splitlines()[-1]))
    return results


def plan(worker: int, room_ids: list[str], count: int) -> list[list[Any]]:
    """Worker ``worker``'s own chunks: ``count`` events as singles and batches of BATCH, rooms round-robin."""
    chunks: list[list[Any]] = []
    index = 0
    while index < count:
        size = BATCH if len(chunks) % 3 == 2 else 1
        ids = [f"w{worker}-{i}" for i in range(index, min(count, index + size))]
        chunks.append([room_ids[(len(chunks) + worker) % len(room_ids)], ids])
        index += len(ids)
    return chunks


def with_retries(own: list[list[Any]], neighbour: list[list[Any]]) -> list[list[Any]]:
    """Every RETRY_EVERY-th chunk, also (re)send a chunk of the neighbour's plan: the same ids, same content."""
    mixed: list[list[Any]] = []
    for position, chunk in enumerate(own):
        mixed.append(chunk)
        if position % RETRY_EVERY == RETRY_EVERY - 1:
            mixed.append(neighbour[position - 2])  # the neighbour may or may not have written it yet
            mixed.append(chunk)  # and an idempotent retry of our own
    return mixed


def stored_events(engine: Engine) -> list[Any]:
    with engine.connect() as connection:
        return connection.execute(
            sa.select(models.events.c.room_id, models.events.c.seq, models.events.c.event_id, models.events.c.kind,
                      models.events.c.authority_epoch)
            .order_by(models.events.c.room_id, models.events.c.seq)).all()


def check_appends(engine: Engine, room_ids: list[str], plans: list[list[list[Any]]],
                  outputs: list[dict[str, Any]]) -> None:
    stored = stored_events(engine)
    expected = {(room_id, event_id) for own in plans for room_id, ids in own for event_id in ids}
    # Every event id exactly once, in the room its plan named, and nothing else.
    keys = [(row.room_id, row.event_id) for row in stored]
    assert len(keys) == len(set(keys)) == len(expected)
    assert set(keys) == expected
    # No gap: each room holds seqs 1..n.
    for room_id in room_ids:
        seqs = [row.seq for row in stored if row.room_id == room_id]
        assert seqs == list(range(1, len(seqs) + 1)), room_id
    assert hostedrooms.verify(engine) == []
    # Every answer any process got names the stored seq, and each event was written (not replayed) exactly once.
    where = {(row.room_id, row.event_id): row.seq for row in stored}
    fresh: dict[tuple[str, str], int] = {}
    for output in outputs:
        for room_id, event_id, seq, idempotent in output["results"]:
            assert where[(room_id, event_id)] == seq, (room_id, event_id)
            if not idempotent:
                fresh[(room_id, event_id)] = fresh.get((room_id, event_id), 0) + 1
    assert set(fresh) == expected and set(fresh.values()) == {1}
    # Batches are contiguous: an atomic batch's events got consecutive seqs.
    for own in plans:
        for room_id, ids in own:
            seqs = [where[(room_id, event_id)] for event_id in ids]
            assert seqs == list(range(seqs[0], seqs[0] + len(ids))), (room_id, ids, seqs)


def contend(engine: Engine, target: str, room_ids: list[str], workers: int, count: int) -> None:
    for room_id in room_ids:
        rooms.create_room(engine, room_id=room_id, name="Busy", members=[], authority_gateway_id=LOCAL)
    plans = [plan(worker, room_ids, count) for worker in range(workers)]
    specs = [("append", {"worker": worker, "plan": with_retries(plans[worker], plans[(worker + 1) % workers])})
             for worker in range(workers)]
    outputs = run_children(target, specs)
    check_appends(engine, room_ids, plans, outputs)


def test_four_processes_append_250_each_to_one_room(engine: Engine, target: str) -> None:
    contend(engine, target, ["one-room"], workers=4, count=250)


def test_four_processes_append_to_four_rooms(engine: Engine, target: str) -> None:
    contend(engine, target, [f"room-{n}" for n in range(4)], workers=4, count=250)


@pytest.mark.slow
def test_eight_processes_append_1000_each_to_four_rooms(engine: Engine, target: str) -> None:
    contend(engine, target, [f"room-{n}" for n in range(4)], workers=8, count=1000)


def check_epochs(engine: Engine, room_id: str) -> list[Any]:
    """Scan the log: every event carries the epoch the latest claim before it established (1 before any)."""
    log = [row for row in stored_events(engine) if row.room_id == room_id]
    epoch = 1
    for row in log:
        if row.kind == "authority.claimed":
            assert row.authority_epoch == epoch + 1, row
            epoch = row.authority_epoch
        else:
            assert row.authority_epoch == epoch, f"seq {row.seq} committed at stale epoch {row.authority_epoch}"
    return log


def race_claims(engine: Engine, target: str, appenders: int, claims: int) -> None:
    room_id = "contested"
    rooms.create_room(engine, room_id=room_id, name="Contested", members=[], authority_gateway_id=LOCAL)
    specs: list[tuple[str, dict[str, Any]]] = [
        ("follow", {"room_id": room_id, "worker": worker, "max_events": 5000}) for worker in range(appenders)]
    specs.append(("claim", {"room_id": room_id, "claims": claims, "seed": 8}))
    *followers, claimer = run_children(target, specs)
    log = check_epochs(engine, room_id)
    assert hostedrooms.verify(engine) == []
    # The claimer's claims are all in the log at the epochs it was told; the disband is the last event.
    claimed = [[row.seq, row.authority_epoch] for row in log if row.kind == "authority.claimed"]
    assert claimed == claimer["claims"] and len(claimed) == claims
    assert log[-1].kind == "room.disbanded" and log[-1].seq == claimer["disband_seq"] == len(log)
    # Each follower's acknowledged events are stored at the seq and epoch it was told.
    where = {row.event_id: (row.seq, row.authority_epoch) for row in log}
    for follower in followers:
        for event_id, seq, epoch in follower["written"]:
            assert where[event_id] == (seq, epoch)
    assert sum(len(follower["written"]) for follower in followers) == len(log) - claims - 1
    # The race was real: appends were refused at a stale epoch and retried at the new one.
    assert sum(follower["stale"] for follower in followers) >= 1
    with pytest.raises(hostedrooms.RoomNotFoundError):
        rooms.append_event(engine, room_id=room_id, event_id="late", kind="message.user",
                           actor={"kind": "user", "id": "u1"}, payload={}, authority_gateway_id=LOCAL,
                           authority_epoch=1)


def test_claims_and_disband_race_appends_without_stale_epochs(engine: Engine, target: str) -> None:
    race_claims(engine, target, appenders=3, claims=20)


@pytest.mark.slow
def test_many_claims_race_appends_without_stale_epochs(engine: Engine, target: str) -> None:
    race_claims(engine, target, appenders=6, claims=150)

"""A replicator SIGKILLed at random points of a catch-up resumes with no gap and no duplicate: after the kills
(and appends in between), a final pass leaves every replica equal to the authority's log, and verify is clean
on both stores. A handful of kills per backend in the default run, 50 in the slow one."""

from __future__ import annotations

import json
import random
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from sqlalchemy import Engine
from standby_support import host, replica_log, room_log, say

from hostedrooms import replicas, verify
from hostedrooms.standby import EnginePageSource, Replicator
from hostedrooms.standby.replicator import CAUGHT_UP

pytest_plugins = ["standby_fixtures"]

CHILD = Path(__file__).resolve().parents[1] / "standby_child.py"
ROOMS = [f"room-{index:02}" for index in range(10)]


def _kill_during_catch_up(source: str, target: str, rng: random.Random, total_pages: int) -> bool:
    """Start a catch-up child, SIGKILL it after a random number of stored pages plus a random fraction of the
    next; return whether it was killed before it finished."""
    child = subprocess.Popen([sys.executable, str(CHILD), "catch-up", source, target, "40"],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert child.stdout is not None
    pages, kill_after = 0, rng.randint(0, max(1, total_pages - 1))
    try:
        for line in child.stdout:
            record = json.loads(line)
            if "done" in record:
                break
            pages += 1
            if pages >= kill_after:
                # Land anywhere in the next page: its read, its ingest transaction, its commit.
                for _ in range(rng.randint(0, 20_000)):
                    pass
                child.send_signal(signal.SIGKILL)
                break
    finally:
        child.kill()
        _, err = child.communicate(timeout=60)
    assert child.returncode in (0, -signal.SIGKILL), err
    return child.returncode == -signal.SIGKILL


def _run_kills(engine: Engine, standby: Engine, target: str, standby_target: str, kills: int, seed: int) -> None:
    rng = random.Random(seed)
    for index, room_id in enumerate(ROOMS):
        host(engine, room_id, 150 + 37 * index)
    killed = 0
    while killed < kills:
        pending = sum(len(room_log(engine, room_id)) for room_id in ROOMS) - sum(
            _stored(standby, room_id) for room_id in ROOMS)
        if pending < 200:  # keep the catch-up long enough to be killed in the middle
            say(engine, rng.choice(ROOMS), 400)
            continue
        killed += _kill_during_catch_up(target, standby_target, rng, pending // 40)
        if rng.random() < 0.5:
            say(engine, rng.choice(ROOMS), rng.randint(1, 60))
    final = Replicator(EnginePageSource(engine), standby).sync_once()
    assert {room.status for room in final.rooms} == {CAUGHT_UP}, final.summary()
    for room_id in ROOMS:
        assert replica_log(standby, room_id) == room_log(engine, room_id), room_id
        state = replicas.replica_state(standby, room_id=room_id)
        assert state["last_seq"] == state["latest_seq"] == len(room_log(engine, room_id))
    assert verify(engine) == [] and verify(standby) == []


def _stored(standby: Engine, room_id: str) -> int:
    try:
        return int(replicas.replica_state(standby, room_id=room_id)["last_seq"])
    except Exception:  # no replica yet
        return 0


def test_catch_up_survives_sigkill(engine: Engine, standby: Engine, target: str, standby_target: str) -> None:
    _run_kills(engine, standby, target, standby_target, kills=4, seed=19)


@pytest.mark.slow
def test_catch_up_survives_50_sigkills(engine: Engine, standby: Engine, target: str, standby_target: str) -> None:
    _run_kills(engine, standby, target, standby_target, kills=50, seed=1919)

"""Several processes sharing one SQLite file: no acknowledged write is lost and the file stays sound.

Real processes (tests/shared_file_child.py), each with its own engine, write to one file: long-lived writers next
to processes that open the store, write, close and exit one after another (rolling restarts, a cron job, the
CLI). Every process logs each write it was told had committed; afterwards ``PRAGMA integrity_check`` is ``ok``,
``verify`` is clean and every acknowledged delivery and event is stored.

These catch the descriptor bug of issue 14: a ledger that opened and closed a descriptor of the database file
before each transaction dropped its process's POSIX locks, so another process that closed its last connection
checkpointed and deleted the WAL under it (lost rows, "database disk image is malformed").
"""

from __future__ import annotations

import contextlib
import json
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest
from factories import private_store

import hostedrooms

CHILD = str(Path(__file__).resolve().parents[1] / "shared_file_child.py")
ROOM = "shared-room"
GATEWAY = "install:gw-local"
STATE_RANK = {"prepared": 0, "authorized": 1, "completed": 2}
TIMEOUT = 120


@pytest.fixture
def store(tmp_path: Path) -> Path:
    """A migrated SQLite file holding the shared room, in a private directory (the ledger requires one)."""
    return private_store(tmp_path, room_id=ROOM, name="Shared", gateway=GATEWAY)


class Workers:
    """The child processes of one test and their acknowledgement logs."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.logs: list[Path] = []
        self.children: list[tuple[str, subprocess.Popen[str]]] = []

    def start(self, mode: str, name: str, count: int) -> subprocess.Popen[str]:
        log = self.path.parent.parent / f"{name}.log"
        self.logs.append(log)
        child = subprocess.Popen([sys.executable, CHILD, mode, str(self.path), str(log), name, str(count)],
                                 stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        self.children.append((name, child))
        return child

    def finish(self, child: subprocess.Popen[str]) -> None:
        _, err = child.communicate(timeout=TIMEOUT)
        last = err.strip().splitlines()[-1:] or ["(no output)"]
        assert child.returncode == 0, f"a worker failed: {last[0]}\n{err}"

    def wait_for_acks(self, name: str) -> None:
        """Until worker ``name`` has acknowledged a write (so it holds a connection while others come and go)."""
        log = self.path.parent.parent / f"{name}.log"
        deadline = time.monotonic() + TIMEOUT
        while not (log.exists() and log.read_text(encoding="utf-8")):
            assert time.monotonic() < deadline, f"{name} acknowledged nothing"
            time.sleep(0.02)

    def stop(self, name: str) -> None:
        (self.path.parent.parent / f"{name}.log.stop").touch()

    def kill_all(self) -> None:
        for _, child in self.children:
            if child.poll() is None:
                child.kill()
                child.wait(timeout=30)

    def acknowledged(self) -> tuple[dict[str, str], dict[str, int]]:
        deliveries: dict[str, str] = {}
        events: dict[str, int] = {}
        for log in self.logs:
            for line in log.read_text(encoding="utf-8").splitlines():
                ack = json.loads(line)
                if "delivery" in ack:
                    known = deliveries.get(ack["delivery"])
                    if known is None or STATE_RANK[ack["state"]] > STATE_RANK[known]:
                        deliveries[ack["delivery"]] = ack["state"]
                else:
                    events[ack["event"]] = ack["seq"]
        return deliveries, events


def check_store(workers: Workers) -> tuple[int, int]:
    """The file is sound, verify is clean, and every acknowledged row is stored; return how many were acked."""
    deliveries, events = workers.acknowledged()
    with contextlib.closing(sqlite3.connect(workers.path)) as raw:
        assert raw.execute("PRAGMA integrity_check").fetchall() == [("ok",)]
        stored_deliveries = dict(raw.execute("SELECT envelope_id, state FROM secure_peer_deliveries").fetchall())
        stored_events = dict(raw.execute(
            "SELECT event_id, seq FROM hosted_room_events WHERE room_id = ?", (ROOM,)).fetchall())
    lost = sorted(envelope_id for envelope_id in deliveries if envelope_id not in stored_deliveries)
    assert not lost, f"{len(lost)} of {len(deliveries)} acknowledged deliveries lost: {lost[:5]}"
    regressed = [envelope_id for envelope_id, state in deliveries.items()
                 if STATE_RANK[stored_deliveries[envelope_id]] < STATE_RANK[state]]
    assert not regressed, f"acknowledged state changes lost: {regressed[:5]}"
    moved = {event_id: seq for event_id, seq in events.items() if stored_events.get(event_id) != seq}
    assert not moved, f"{len(moved)} of {len(events)} acknowledged events lost or moved: {list(moved)[:5]}"
    assert hostedrooms.verify(workers.path) == []
    return len(deliveries), len(events)


def concurrent_ledgers(path: Path, processes: int, base: int) -> None:
    """(a) ``processes`` ledgers prepare, authorise and complete their own deliveries at once; they finish at different
    times, so some close their last connection while the others keep writing."""
    workers = Workers(path)
    try:
        children = [workers.start("ledger", f"gw{n}", base * (n + 1)) for n in range(processes)]
        for child in children:
            workers.finish(child)
    finally:
        workers.kill_all()
    deliveries, _ = check_store(workers)
    assert deliveries == sum(base * (n + 1) for n in range(processes))


def gateway_and_passers_by(path: Path, mode: str, passers_by: int, count: int) -> None:
    """(b)/(c) a long-lived gateway uses the ledger while short-lived processes (``mode``: ``ledger`` or
    ``events``) open the store, write ``count`` rows, close it and exit, one after another."""
    workers = Workers(path)
    try:
        gateway = workers.start("ledger", "gateway", 0)
        workers.wait_for_acks("gateway")
        for n in range(passers_by):
            workers.finish(workers.start(mode, f"visit{n}", count))
        workers.stop("gateway")
        workers.finish(gateway)
    finally:
        workers.kill_all()
    deliveries, events = check_store(workers)
    assert deliveries >= 1
    expected = passers_by * count
    if mode == "events":
        assert events == expected
    else:
        assert deliveries >= expected + 1


def test_processes_preparing_their_own_deliveries_lose_nothing(store: Path) -> None:
    concurrent_ledgers(store, processes=4, base=10)


def test_a_gateway_ledger_and_short_lived_ledger_processes_lose_nothing(store: Path) -> None:
    gateway_and_passers_by(store, "ledger", passers_by=4, count=10)


def test_a_gateway_ledger_and_short_lived_event_writers_lose_nothing(store: Path) -> None:
    gateway_and_passers_by(store, "events", passers_by=4, count=25)


@pytest.mark.slow
def test_eight_ledger_processes_lose_nothing(store: Path) -> None:
    concurrent_ledgers(store, processes=8, base=60)


@pytest.mark.slow
def test_many_short_lived_processes_around_a_gateway_lose_nothing(store: Path) -> None:
    gateway_and_passers_by(store, "ledger", passers_by=15, count=20)
    gateway_and_passers_by(store, "events", passers_by=15, count=40)


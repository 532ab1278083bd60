"""Crash durability: a writer SIGKILLed at random moments never loses an acknowledged write, and nothing
half-done is ever visible (a batch is all or nothing; a ledger transition is applied whole or not at all).

The child (tests/reliability_child.py, ``crash`` mode) appends single events and batches and moves ledger
deliveries through their states, printing each intent before the write and each acknowledgement after it
commits. After every kill the parent checks the store, then restarts the child, which retries the
unacknowledged intent and recovers unfinished deliveries, as a restarted gateway would.
"""

from __future__ import annotations

import json
import queue
import random
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

import hostedrooms
from hostedrooms import models
from hostedrooms.db import sqlite_path

CHILD = str(Path(__file__).resolve().parents[1] / "reliability_child.py")
ROOM = "crash-room"
STEPS = ("prepared", "authorized", "queued", "running", "completed")


@dataclass
class Observed:
    """Everything the children said across all runs."""

    acked_events: dict[str, int] = field(default_factory=dict)  # event_id -> seq
    intended_batches: list[list[str]] = field(default_factory=list)
    acked_ledger: dict[str, int] = field(default_factory=dict)  # envelope_id -> index of the last acked state
    pending: dict[str, Any] | None = None  # the intent printed last without its ack

    def record(self, message: dict[str, Any]) -> None:
        if "intent" in message:
            intent = message["intent"]
            self.pending = intent
            if intent["op"] == "events":
                self.intended_batches.append(intent["ids"])
        elif "ack" in message:
            ack = message["ack"]
            if ack["op"] == "events":
                self.acked_events.update(zip(ack["ids"], ack["seqs"], strict=True))
            else:
                step = STEPS.index(ack["state"])
                self.acked_ledger[ack["envelope_id"]] = max(step, self.acked_ledger.get(ack["envelope_id"], -1))
            self.pending = None


def run_and_kill(target: str, generation: int, rng: random.Random, observed: Observed) -> int:
    """Start a child, SIGKILL it at a random moment after it is ready; return how many acks it printed."""
    retry = json.dumps(observed.pending) if observed.pending is not None else ""
    child = subprocess.Popen(
        [sys.executable, CHILD, "crash", target, str(generation), str(rng.randrange(2**32)), retry],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    lines: queue.Queue[str | None] = queue.Queue()

    def read() -> None:
        assert child.stdout is not None
        for line in child.stdout:
            lines.put(line)
        lines.put(None)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    messages: list[dict[str, Any]] = []
    deadline = time.monotonic() + 60
    while not messages or "ready" not in messages[0]:
        try:
            line = lines.get(timeout=max(0.1, deadline - time.monotonic()))
        except queue.Empty:
            child.kill()
            pytest.fail("crash child never became ready")
        if line is None:
            _, err = child.communicate(timeout=30)
            pytest.fail(f"crash child exited early ({child.returncode}): {err}")
        messages.append(json.loads(line))
    time.sleep(rng.uniform(0.0, 0.25))
    child.send_signal(signal.SIGKILL)
    child.wait(timeout=30)
    reader.join(timeout=30)
    stderr = child.stderr.read() if child.stderr is not None else ""
    assert child.returncode == -signal.SIGKILL, f"child failed before the kill: {stderr}"
    while (line := lines.get(timeout=30)) is not None:  # the reader ended: None comes last
        # A line cut short by the kill was never acknowledged; it is simply not a message.
        try:
            messages.append(json.loads(line))
        except json.JSONDecodeError:
            assert not line.endswith("\n"), line
    for message in messages:
        observed.record(message)
    return sum(1 for message in messages if "ack" in message)


def check_store(target: str, observed: Observed) -> None:
    engine = hostedrooms.create_engine(target)
    try:
        with engine.connect() as connection:
            stored = dict(connection.execute(
                sa.select(models.events.c.event_id, models.events.c.seq).where(models.events.c.room_id == ROOM)).all())
            deliveries = {row.envelope_id: row for row in connection.execute(sa.select(models.deliveries))}
            path = sqlite_path(engine)
            if path is not None:
                assert connection.exec_driver_sql("PRAGMA integrity_check").scalars().all() == ["ok"]
        assert hostedrooms.verify(engine) == []
    finally:
        engine.dispose()
    # Every acknowledged event is there, at the seq the child was told.
    missing = {event_id: seq for event_id, seq in observed.acked_events.items() if stored.get(event_id) != seq}
    assert not missing, f"acknowledged events lost or moved: {missing}"
    # Each batch is all or nothing, and nothing is stored that no child intended.
    for ids in observed.intended_batches:
        present = [event_id in stored for event_id in ids]
        assert all(present) or not any(present), f"partial batch visible: {list(zip(ids, present, strict=True))}"
    intended = {event_id for ids in observed.intended_batches for event_id in ids}
    assert set(stored) <= intended
    # A delivery is at its last acknowledged state or (the in-flight transition) one step beyond, whole.
    for envelope_id, acked in observed.acked_ledger.items():
        row = deliveries.get(envelope_id)
        assert row is not None, f"acknowledged delivery {envelope_id} lost"
        step = STEPS.index(row.state)
        assert acked <= step <= acked + 1, (envelope_id, STEPS[acked], row.state)
    for envelope_id, row in deliveries.items():
        check_delivery_row(envelope_id, row)


def check_delivery_row(envelope_id: str, row: Any) -> None:
    """The columns a transition writes together are all there, or none of them are."""
    step = STEPS.index(row.state)
    assert row.queued_id == (f"q-{envelope_id}" if step >= 2 else None), (envelope_id, row.state, row.queued_id)
    assert row.run_id == (f"run-{envelope_id}" if step >= 3 else None), (envelope_id, row.state, row.run_id)
    assert (row.result_hash is not None) == (step == 4), (envelope_id, row.state)


def crash_many_times(target: str, kills: int, seed: int) -> Observed:
    rng = random.Random(seed)
    observed = Observed()
    acks = 0
    for generation in range(kills):
        acks += run_and_kill(target, generation, rng, observed)
        check_store(target, observed)
    assert acks > 0, "the children never acknowledged a write"
    assert observed.acked_events, "no event was ever acknowledged"
    # One last clean run recovers every delivery and retries the last intent.
    run_and_kill(target, kills, rng, observed)
    check_store(target, observed)
    return observed


def test_acknowledged_writes_survive_sigkill(target: str) -> None:
    observed = crash_many_times(target, kills=5, seed=8)
    assert observed.intended_batches


@pytest.mark.slow
def test_acknowledged_writes_survive_200_sigkills(target: str) -> None:
    observed = crash_many_times(target, kills=200, seed=2008)
    assert len(observed.acked_ledger) > 10

"""The whole failover story under load, each actor its own process, on SQLite files and on PostgreSQL:

an appender writes to the authority A (acknowledging each commit), the standby B follows it with
``hostedrooms replicate --follow``; A's appender is SIGKILLed (the authority dies); ``hostedrooms failover
--catch-up-from`` promotes every room on B; an appender writes to B while A comes back and runs ``hostedrooms
replicate`` from B, which demotes each room; then A's old writer retries at the stale epoch, on A and on B.

No acknowledged event is lost on the surviving lineage (B's log holds every event A acknowledged, at the same
seq, and every event B acknowledged), and no stale write is accepted anywhere."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

from sqlalchemy import Engine
from standby_support import GATEWAY_A, GATEWAY_B, host, replica_ids, room_log

from hostedrooms import rooms, verify

pytest_plugins = ["standby_fixtures"]

CHILD = Path(__file__).resolve().parents[1] / "standby_child.py"
ROOMS = [f"chat-{index}" for index in range(6)]
CLI = [sys.executable, "-m", "hostedrooms.cli"]


def _records(stream: IO[str]) -> Iterator[dict[str, Any]]:
    for line in stream:
        if line.endswith("\n"):  # a line cut by SIGKILL was never acknowledged
            yield json.loads(line)


def _appender(target: str, gateway: str, epoch: int, prefix: str, count: int) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, str(CHILD), "append", target, gateway, str(epoch), ",".join(ROOMS),
                             prefix, str(count)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _wait_for_replicas(standby: Engine) -> None:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if replica_ids(standby) == ROOMS:
            return
        time.sleep(0.02)
    raise AssertionError("the follower did not replicate within 60 s")


def _cli(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*CLI, *argv], capture_output=True, text=True, timeout=120, check=False)


def test_failover_under_load_loses_no_acknowledged_event(engine: Engine, standby: Engine, target: str,
                                                        standby_target: str) -> None:
    for room_id in ROOMS:
        host(engine, room_id, 5)
    writer_a = _appender(target, GATEWAY_A, 1, "a", 0)
    follower = subprocess.Popen([*CLI, "replicate", "--from", target, "--to", standby_target, "--follow",
                                 "--interval", "0.5", "--gateway", GATEWAY_B],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        _wait_for_replicas(standby)  # the follower is running its loop (its SIGTERM handler is in place)
        assert writer_a.stdout is not None
        acked_a: list[list[Any]] = []
        for record in _records(writer_a.stdout):
            acked_a.append(record["ack"])
            if len(acked_a) >= 150:
                break
        writer_a.send_signal(signal.SIGKILL)  # the authority dies mid-stream
        writer_a.wait(timeout=30)
        # The rest through the same reader: its buffer may hold lines already read from the pipe.
        acked_a += [record["ack"] for record in _records(writer_a.stdout)]
        assert writer_a.returncode == -signal.SIGKILL
        time.sleep(0.3)  # the follower keeps replicating what A committed
    finally:
        follower.send_signal(signal.SIGTERM)
        out, err = follower.communicate(timeout=60)
    assert follower.returncode == 0, (follower.returncode, out, err)
    assert out.splitlines()[-1].startswith("replicate: stopped after "), (out, err)

    taken = _cli("failover", "--from-gateway", GATEWAY_A, "--to", standby_target, "--gateway", GATEWAY_B,
                 "--catch-up-from", target)
    assert taken.returncode == 0, (taken.stdout, taken.stderr)
    assert [line.split()[:2] for line in taken.stdout.splitlines()[2:-1]] == [["promoted", room] for room in ROOMS], \
        taken.stdout
    promoted_at = {room_id: len(room_log(standby, room_id)) for room_id in ROOMS}  # the claim's seq

    writer_b = _appender(standby_target, GATEWAY_B, 2, "b", 120)
    back = _cli("replicate", "--from", standby_target, "--to", target, "--gateway", GATEWAY_A)  # under B's load
    out_b, err_b = writer_b.communicate(timeout=120)
    assert writer_b.returncode == 0, err_b
    assert back.returncode == 0, (back.stdout, back.stderr)
    # The failover fenced A in its own store: the returning replicator finds every room demoted there already.
    assert back.stdout.startswith(f"replicate: {len(ROOMS)} rooms ({len(ROOMS)} local)"), back.stdout
    acked_b = [json.loads(line)["ack"] for line in out_b.splitlines()]
    assert len(acked_b) == 120

    stale_on_a = _appender(target, GATEWAY_A, 1, "stale-a", 12)
    stale_on_b = _appender(standby_target, GATEWAY_A, 1, "stale-b", 12)
    for stale in (stale_on_a, stale_on_b):
        out_stale, _ = stale.communicate(timeout=60)
        records = [json.loads(line) for line in out_stale.splitlines()]
        assert len(records) == 12 and all("AuthorityConflictError" in record["refused"][2] for record in records)

    logs_a = {room_id: room_log(engine, room_id) for room_id in ROOMS}
    logs_b = {room_id: room_log(standby, room_id) for room_id in ROOMS}
    for room_id, seq, event_id in acked_a + acked_b:  # every acknowledged event is on the surviving lineage
        assert logs_b[room_id][seq - 1][:2] == (seq, event_id), (room_id, seq, event_id)
    for room_id in ROOMS:
        claim = promoted_at[room_id]
        assert logs_b[room_id][claim - 1][2] == "authority.claimed"
        assert logs_a[room_id][:claim - 1] == logs_b[room_id][:claim - 1]  # A's log up to the takeover
        assert [event[2] for event in logs_a[room_id][claim - 1:]] == ["authority.lost"]  # then only the fence
        assert all(event[4] == 2 for event in logs_b[room_id][claim - 1:])
        for log in (logs_a[room_id], logs_b[room_id]):
            assert not any(event[1].startswith("stale-") for event in log)
        state = rooms.room_state(engine, room_id=room_id)
        assert (state["authority_gateway_id"], state["authority_epoch"]) == (GATEWAY_B, 2)
    assert verify(engine) == [] and verify(standby) == []

"""Failover from an authority that keeps writing (issue #25 item 5): with its store reachable, failover fences it
there first (each of its rooms demoted to the lineage this gateway claims), catches up to the fence, then
promotes, so no write it acknowledged is lost and its next write fails; two failovers at once both succeed,
each room promoted once; and no message shows the catch-up URL's password. Both backends."""

from __future__ import annotations

import importlib
import io
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Engine
from standby_support import GATEWAY_A, GATEWAY_B, GATEWAY_C, host, room_log, say

from hostedrooms import rooms, verify
from hostedrooms.cli import main
from hostedrooms.errors import AuthorityConflictError
from hostedrooms.standby import EnginePageSource, Replicator, failover
from hostedrooms.standby.failover import NOT_FENCED, PROMOTED, TAKEN_OVER, FencedSource, fence_authority

pytest_plugins = ["standby_fixtures"]

failover_module = importlib.import_module("hostedrooms.standby.takeover")  # where failover promotes

CHILD = Path(__file__).resolve().parents[1] / "standby_child.py"
ROOMS = [f"room-{index}" for index in range(4)]
#: A generous bound: only a hang would take this long.
BOUND = 60.0


def _replicate(authority: Engine, standby: Engine) -> None:
    report = Replicator(EnginePageSource(authority), standby, local_gateway_id=GATEWAY_B).sync_once()
    assert report.error == ""


def _lines(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _wait_for(path: Path, done: Any) -> list[dict[str, Any]]:
    deadline = time.monotonic() + BOUND
    while True:
        lines = _lines(path) if path.exists() else []
        if done(lines) or time.monotonic() > deadline:
            return lines
        time.sleep(0.02)


# --- the fence ---------------------------------------------------------------------------------------------------


def test_no_acknowledged_write_is_lost_while_the_old_authority_keeps_writing(
        engine: Engine, standby: Engine, target: str, standby_target: str, tmp_path: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    """A writes continuously, in a process of its own, all through `failover --catch-up-from A`: every write A
    acknowledged is in the new log, and each of A's writes after the fence is refused (AuthorityConflictError)."""
    for room_id in ROOMS:
        host(engine, room_id, 3)
    _replicate(engine, standby)
    log = tmp_path / "writer.jsonl"
    with log.open("w") as output:
        writer = subprocess.Popen([sys.executable, str(CHILD), "append", target, GATEWAY_A, "1", ",".join(ROOMS),
                                   "w", "0"], stdout=output, stderr=subprocess.DEVNULL)
    try:
        _wait_for(log, lambda lines: sum("ack" in line for line in lines) >= 40)  # writing hard by now
        code = main(["failover", "--to", standby_target, "--from-gateway", GATEWAY_A, "--gateway", GATEWAY_B,
                     "--catch-up-from", target])
        refused_everywhere = _wait_for(log, lambda lines: {line["refused"][0] for line in lines
                                                           if "refused" in line} == set(ROOMS))
    finally:
        writer.kill()
        writer.wait(timeout=30)
    out = capsys.readouterr().out
    assert code == 0, out
    acked = [line["ack"] for line in _lines(log) if "ack" in line]
    refusals = [line["refused"] for line in refused_everywhere if "refused" in line]
    assert len(acked) > 40
    logs = {room_id: {row[0]: row[1] for row in room_log(standby, room_id)} for room_id in ROOMS}
    missing = [(room_id, seq, event_id) for room_id, seq, event_id in acked if logs[room_id].get(seq) != event_id]
    assert missing == []
    assert refusals and all(reason.startswith("AuthorityConflictError") for _, _, reason in refusals)
    assert f"fenced: {len(ROOMS)} rooms of {GATEWAY_A}" in out
    for room_id in ROOMS:
        state = rooms.room_state(standby, room_id=room_id)
        assert (state["authority_gateway_id"], state["authority_epoch"]) == (GATEWAY_B, 2)
        with pytest.raises(AuthorityConflictError):
            say(engine, room_id, 1, prefix="late")
        # A's log ends with the fence, which its replicator would have written on its return.
        assert room_log(engine, room_id)[-1][1:3] == ("system:authority-lost:2", "authority.lost")
    assert verify(standby) == [] and verify(engine) == []


def test_fence_authority_is_idempotent_and_leaves_other_rooms_alone(engine: Engine) -> None:
    host(engine, "mine", 3)
    host(engine, "empty", 0)
    host(engine, "gone", 1)
    rooms.disband_room(engine, room_id="gone", expected_gateway_id=GATEWAY_A, expected_epoch=1)
    host(engine, "theirs", 2)
    rooms.claim_authority(engine, room_id="theirs", expected_gateway_id=GATEWAY_A, expected_epoch=1,
                          new_gateway_id=GATEWAY_C, event_id="to-c")
    host(engine, "c-own", 1, gateway=GATEWAY_C)
    before = room_log(engine, "mine")
    fences = fence_authority(engine, from_gateway=GATEWAY_A, local_gateway_id=GATEWAY_B, now=5.0)
    assert {room_id: (fence.gateway, fence.epoch, fence.seq, fence.refused) for room_id, fence in fences.items()} \
        == {"empty": (GATEWAY_A, 1, 0, ""), "mine": (GATEWAY_A, 1, 3, "")}
    assert fence_authority(engine, from_gateway=GATEWAY_A, local_gateway_id=GATEWAY_B) == fences
    with pytest.raises(AuthorityConflictError):
        say(engine, "mine", 1, prefix="late")
    # The fenced view shows the room as A left it: its lineage and its events before the fence.
    view = FencedSource(EnginePageSource(engine), fences, holder=GATEWAY_B)
    assert [head.to_dict() for head in view.list_rooms()] == [
        {"room_id": "empty", "authority_gateway_id": GATEWAY_A, "authority_epoch": 1, "latest_seq": 0,
         "disbanded": False},
        {"room_id": "mine", "authority_gateway_id": GATEWAY_A, "authority_epoch": 1, "latest_seq": 3,
         "disbanded": False}]
    assert [head.room_id for head in view.list_rooms(after="empty", limit=1)] == ["mine"]
    page = view.read_events("mine", since_seq=1, limit=100)
    assert [event["event_id"] for event in page["events"]] == [row[1] for row in before[1:]]
    assert (page["latest_seq"], page["has_more"], page["authority"]) == (
        3, False, {"gateway_id": GATEWAY_A, "epoch": 1})
    assert view.read_events("mine", since_seq=3, limit=100)["events"] == []
    assert rooms.room_state(engine, room_id="theirs")["authority_gateway_id"] == GATEWAY_C
    assert verify(engine) == []


def test_a_failover_stopped_after_the_fence_is_finished_by_the_next(engine: Engine, standby: Engine) -> None:
    for room_id in ROOMS:
        host(engine, room_id, 2)
    _replicate(engine, standby)
    for room_id in ROOMS:
        say(engine, room_id, 3, prefix="after")
    fence_authority(engine, from_gateway=GATEWAY_A, local_gateway_id=GATEWAY_B)  # then the run was stopped
    source = EnginePageSource(engine)
    report = failover(standby, from_gateway=GATEWAY_A, local_gateway_id=GATEWAY_B, catch_up_from=source)
    assert report.ok and report.fenced == ROOMS
    assert {room.room_id: (room.outcome, room.claim_seq) for room in report.rooms} == {
        room_id: (PROMOTED, 6) for room_id in ROOMS}
    for room_id in ROOMS:
        assert room_log(standby, room_id)[:5] == room_log(engine, room_id)[:5]
    assert verify(standby) == []


def test_a_replica_the_old_authority_no_longer_holds_is_not_promoted(engine: Engine, standby: Engine) -> None:
    host(engine, "kept", 1)
    host(engine, "moved", 1)
    _replicate(engine, standby)
    rooms.claim_authority(engine, room_id="moved", expected_gateway_id=GATEWAY_A, expected_epoch=1,
                          new_gateway_id=GATEWAY_C, event_id="to-c")
    report = failover(standby, from_gateway=GATEWAY_A, local_gateway_id=GATEWAY_B,
                      catch_up_from=EnginePageSource(engine))
    assert {room.room_id: room.outcome for room in report.rooms} == {"kept": PROMOTED, "moved": NOT_FENCED}
    assert not report.ok


# --- two failovers at once -----------------------------------------------------------------------------------------


def test_a_room_another_run_promoted_meanwhile_is_reported_taken_over(
        engine: Engine, standby: Engine, monkeypatch: pytest.MonkeyPatch) -> None:
    for room_id in ROOMS:
        host(engine, room_id, 2)
    _replicate(engine, standby)
    real = failover_module.promote_replica

    def another_run_first(target: Any, **options: Any) -> Any:
        real(target, **options)  # the other run wins the room between this run's listing and its promotion
        return real(target, **options)

    monkeypatch.setattr(failover_module, "promote_replica", another_run_first)
    report = failover(standby, from_gateway=GATEWAY_A, local_gateway_id=GATEWAY_B)
    assert {room.room_id: (room.outcome, room.epoch) for room in report.rooms} == {
        room_id: (TAKEN_OVER, 2) for room_id in ROOMS}
    assert report.ok and report.summary().endswith(f"; {len(ROOMS)} taken over by another run")


def test_two_failovers_at_once_both_succeed_and_promote_each_room_once(engine: Engine, standby: Engine,
                                                                        standby_target: str) -> None:
    names = [f"r{index:02d}" for index in range(24)]
    for room_id in names:
        host(engine, room_id, 2)
    _replicate(engine, standby)
    barrier = threading.Barrier(2, timeout=60)
    reports: list[Any] = []

    def run() -> None:
        from hostedrooms import create_engine

        own = create_engine(standby_target)
        try:
            barrier.wait()
            reports.append(failover(own, from_gateway=GATEWAY_A, local_gateway_id=GATEWAY_B))
        finally:
            own.dispose()

    threads = [threading.Thread(target=run) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(BOUND)
    assert len(reports) == 2 and all(report.ok for report in reports)
    promoted = sorted(room.room_id for report in reports for room in report.rooms if room.outcome == PROMOTED)
    assert promoted == names
    assert {room.outcome for report in reports for room in report.rooms} <= {PROMOTED, TAKEN_OVER}
    assert verify(standby) == []


def test_two_failover_commands_at_once_both_exit_0(engine: Engine, standby: Engine, target: str,
                                                   standby_target: str) -> None:
    """Two processes, each fencing A in its store, catching up and promoting: both exit 0, each room is claimed
    once, and A can no longer write."""
    names = [f"r{index:02d}" for index in range(16)]
    for room_id in names:
        host(engine, room_id, 2)
    _replicate(engine, standby)
    argv = [sys.executable, "-m", "hostedrooms.cli", "failover", "--to", standby_target, "--from-gateway",
            GATEWAY_A, "--gateway", GATEWAY_B, "--catch-up-from", target]
    runs = [subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                             env={**os.environ, "PYTHONPATH": str(Path(__file__).parents[2])}) for _ in range(2)]
    outputs = [run.communicate(timeout=BOUND) for run in runs]
    assert [run.returncode for run in runs] == [0, 0], outputs
    lines = [line for out, _ in outputs for line in out.splitlines()]
    assert sorted(line.split()[1] for line in lines if line.startswith("promoted ")) == names
    for room_id in names:
        claims = [row for row in room_log(standby, room_id) if row[2] == "authority.claimed"]
        assert len(claims) == 1
        with pytest.raises(AuthorityConflictError):
            say(engine, room_id, 1, prefix="late")
    assert verify(standby) == [] and verify(engine) == []


# --- secrets -------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("source", [
    "postgresql://gw:S3CRET@127.0.0.1:1/hostedrooms",
    "postgresql://127.0.0.1:1/hostedrooms?user=gw&password=S3CRET",
    "postgresql+psycopg://gw:S3CRET@127.0.0.1:notaport/hostedrooms?sslpassword=S3CRET",
    "postgresql://gw:S3CRET@[unresolvable/hostedrooms",
])
def test_the_catch_up_source_password_is_never_printed(source: str, standby_target: str,
                                                       capsys: pytest.CaptureFixture[str]) -> None:
    out = io.StringIO()
    code = main(["failover", "--to", standby_target, "--from-gateway", GATEWAY_A, "--gateway", GATEWAY_B,
                 "--catch-up-from", source], out=out)
    captured = capsys.readouterr()
    assert code == 1
    text = out.getvalue() + captured.out + captured.err
    assert "S3CRET" not in text and "***" in text, text


def test_a_catch_up_that_fails_after_the_fence_names_the_source_masked(
        engine: Engine, standby_target: str, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    host(engine, "r", 1)
    url = engine.url.render_as_string(hide_password=False)
    secret = engine.url.password or ""
    if engine.url.get_backend_name() != "sqlite":  # a SQLite URL carries no secret: the message is checked alone
        secret = "S3CRET"
        url += ("&" if "?" in url else "?") + "sslpassword=S3CRET"  # unused without a client key, but secret

    calls: list[str] = []
    real_sync = Replicator.sync_once

    def failing_pass(self: Replicator) -> Any:
        calls.append("pass")
        report = real_sync(self)
        report.error = f"the source {self.source.describe()} went away"
        return report

    monkeypatch.setattr(Replicator, "sync_once", failing_pass)
    out = io.StringIO()
    code = main(["failover", "--to", standby_target, "--from-gateway", GATEWAY_A, "--gateway", GATEWAY_B,
                 "--catch-up-from", url], out=out)
    captured = capsys.readouterr()
    assert code == 1 and calls == ["pass"], captured.err
    text = out.getvalue() + captured.err
    assert "stay fenced: run failover again" in text and "went away" in text, text
    assert (secret not in text and "password=***" in text) if secret else url in text

"""``hostedrooms status``: an UNKNOWN said once; ``--warn-lag 0`` warns at any lag and never at none (Nagios's
threshold convention); the gateway budget and the per-room byte cap told apart in text and JSON."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from factories import run_cli
from sqlalchemy import Engine

from hostedrooms import UnitOfWork
from hostedrooms.cli import inspect as cli
from hostedrooms.models import replicas, rooms
from hostedrooms.status import Thresholds, assess, store_status

NOW = 10_000.0
GATEWAY = "install:gw-a"
QUIET = ("--warn-percent", "99", "--critical-percent", "100")  # only the lag thresholds speak


@pytest.fixture(autouse=True)
def _clock(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cli, "status_clock", lambda: NOW)


def _room(room_id: str, events: int, size: int) -> dict[str, Any]:
    return {"room_id": room_id, "name": room_id, "members_json": "[]", "authority_gateway_id": GATEWAY,
            "authority_epoch": 1, "next_seq": events + 1, "event_bytes": size, "created_at": 1.0,
            "updated_at": 1.0, "disbanded_at": None}


def _replica(room_id: str, last: int, latest: int) -> dict[str, Any]:
    return {"room_id": room_id, "name": room_id, "members_json": "[]", "authority_gateway_id": GATEWAY,
            "authority_epoch": 1, "last_seq": last, "latest_seq": latest, "event_bytes": 0, "created_at": 1.0,
            "updated_at": NOW}


def _insert(engine: Engine, table: sa.Table, rows: list[dict[str, Any]]) -> None:
    with UnitOfWork(engine) as uow:
        uow.execute(sa.insert(table), rows)
        uow.commit()


# --- UNKNOWN, once ---------------------------------------------------------------------------------------------


def test_a_missing_store_is_unknown_in_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    missing = tmp_path / "missing.db"
    code, out, err = run_cli(capsys, "status", "--url", str(missing))
    assert code == 3
    assert out.splitlines() == [f"UNKNOWN: hosted room store {missing} does not exist (no SQLite file there)"]
    assert err == ""


def test_a_store_without_schema_is_unknown_once(empty_target: str, backend: str, tmp_path: Path,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    if backend == "sqlite":
        import sqlite3

        sqlite3.connect(empty_target).close()
    code, out, err = run_cli(capsys, "status", "--url", empty_target)
    lines = out.splitlines()
    assert code == 3 and err == "" and len(lines) == 1
    assert lines[0].startswith("UNKNOWN: ") and "no hostedrooms schema" in lines[0]
    assert (out + err).count("no hostedrooms schema") == 1
    code, out, err = run_cli(capsys, "status", "--url", empty_target, "--json")
    document = json.loads(out)
    assert code == 3 and err == "" and len(out.splitlines()) == 1
    assert set(document) == {"state", "exit_code", "target", "error"} and document["state"] == "unknown"
    assert (out + err).count("no hostedrooms schema") == 1


def test_refused_thresholds_are_unknown_once(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run_cli(capsys, "status", "--url", str(tmp_path / "state.db"), "--warn-percent", "96")
    assert code == 3 and err == ""
    assert out.splitlines() == ["UNKNOWN: --warn-percent (96) is above --critical-percent (95)"]
    assert not (tmp_path / "state.db").exists()


# --- --warn-lag 0 ----------------------------------------------------------------------------------------------


def test_warn_lag_zero_is_ok_without_lag(engine: Engine, target: str, capsys: pytest.CaptureFixture[str]) -> None:
    _insert(engine, replicas, [_replica("caught-up", 7, 7)])
    code, out, _ = run_cli(capsys, "status", "--url", target, *QUIET, "--warn-lag", "0", "--critical-lag", "0")
    first = out.splitlines()[0]
    assert code == 0
    assert first.startswith("OK: every limit and age within thresholds | ")
    assert first.endswith(" replicas.lag=0;0;0;0;")


def test_warn_lag_zero_warns_at_a_lag_of_one(engine: Engine, target: str,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    _insert(engine, replicas, [_replica("caught-up", 7, 7), _replica("behind", 6, 7)])
    code, out, _ = run_cli(capsys, "status", "--url", target, *QUIET, "--warn-lag", "0")
    first = out.splitlines()[0]
    assert code == 1
    assert first.startswith("WARNING: replicas.lag: a replica is 1 events behind its source's last reported seq "
                            "(> 0) | ")
    assert first.endswith(" replicas.lag=1;0;;0;")
    code, out, _ = run_cli(capsys, "status", "--url", target, *QUIET, "--warn-lag", "0", "--critical-lag", "0")
    assert code == 2 and out.startswith("CRITICAL: replicas.lag: a replica is 1 events behind its source's last "
                                        "reported seq (> 0) | ")
    code, out, _ = run_cli(capsys, "status", "--url", target, *QUIET, "--warn-lag", "1")
    assert code == 0 and out.startswith("OK: ")  # a lag of 1 is not above 1


@pytest.mark.parametrize(("max_lag", "warn", "critical", "state"), [
    (0, 0, None, "ok"), (1, 0, None, "warning"), (5, 5, None, "ok"), (6, 5, None, "warning"),
    (6, 0, 5, "critical"), (5, 0, 5, "warning"), (0, 0, 0, "ok")])
def test_lag_thresholds_are_crossed_when_passed(engine: Engine, max_lag: int, warn: int, critical: int | None,
                                                state: str) -> None:
    _insert(engine, replicas, [_replica("r", 10 - max_lag, 10)])
    status = store_status(engine, now=NOW)
    verdict = assess(status, Thresholds(warn_percent=None, critical_percent=None, warn_lag=warn,
                                        critical_lag=critical))
    assert verdict["state"] == state
    assert [item["check"] for item in verdict["findings"]] == ([] if state == "ok" else ["replicas.lag"])


# --- the gateway budget and the per-room cap, told apart --------------------------------------------------------


def test_gateway_budget_and_room_cap_are_labelled(engine: Engine, target: str, monkeypatch: pytest.MonkeyPatch,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    import hostedrooms.limits

    for name, value in {"MAX_GATEWAY_EVENT_BYTES": 10_000, "MAX_ROOM_EVENT_BYTES": 1_000,
                        "MAX_EVENTS_PER_ROOM": 100}.items():
        monkeypatch.setattr(hostedrooms.limits, name, value)
    _insert(engine, rooms, [_room("alpha", 10, 500), _room("beta", 20, 850)])
    code, out, _ = run_cli(capsys, "status", "--url", target)
    lines = out.splitlines()
    assert code == 1  # beta holds 85% of its per-room byte cap
    assert ("bytes       1,350 of 10,000 (13.5%) of the gateway budget (MAX_GATEWAY_EVENT_BYTES, every room "
            "together); 0 in disbanded rooms") in lines
    assert ("room bytes  850 of 1,000 (85%) of the per-room cap (MAX_ROOM_EVENT_BYTES, each room alone), in the "
            "room with the most") in lines
    assert "ROOM   EVENTS OF ROOM CAP  BYTES OF ROOM CAP" in lines
    assert "beta   20 of 100 (20%)     850 of 1,000 (85%)" in lines

    code, out, _ = run_cli(capsys, "status", "--url", target, "--json")
    room_status = json.loads(out)["status"]["rooms"]
    # The existing keys are unchanged; each limit now says which one it is.
    assert room_status["bytes"] == {"used": 1350, "limit": 10_000, "percent": 13.5,
                                    "limit_name": "MAX_GATEWAY_EVENT_BYTES"}
    assert room_status["most_bytes"] == {"used": 850, "limit": 1000, "percent": 85.0,
                                         "limit_name": "MAX_ROOM_EVENT_BYTES"}
    assert room_status["most_events"]["limit_name"] == "MAX_EVENTS_PER_ROOM"
    assert {room["bytes"]["limit_name"] for room in room_status["fullest"]} == {"MAX_ROOM_EVENT_BYTES"}
    assert room_status["live"]["limit_name"] == "MAX_ACTIVE_ROOMS"

"""Logs: the library logs through ``logging`` and installs no handler (a NullHandler only); its records carry an
event name and structured fields and never a body or a secret; the long-running commands' ``--log-format json``
writes one JSON object per stderr line with the required keys."""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest
from factories import lowered
from factories import run_cli as _run
from sqlalchemy import Engine
from standby_support import GATEWAY_A, GATEWAY_B, host

from hostedrooms import create_engine, migrate, rooms
from hostedrooms.errors import CapacityExceededError, HostedRoomError
from hostedrooms.ledger import DeliveryLedger
from hostedrooms.logs import REQUIRED_FIELDS, JsonFormatter
from hostedrooms.standby import EnginePageSource, Replicator, failover

pytest_plugins = ["standby_fixtures"]

ROOT = Path(__file__).resolve().parents[2]
SECRETS = ("SECRET-PAYLOAD", "SECRET-LEASE", "SECRET-BODY", "SECRET-ERROR")


def _env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}


def test_no_handler_is_installed_on_import_and_use(tmp_path: Path) -> None:
    """In a fresh interpreter with no logging configured: every module imported, a refusal (a warning record),
    a status and a replication pass; the only handler under ``hostedrooms`` is the package's NullHandler, the root
    logger has none, and nothing reached stderr (no ``logging.lastResort`` output)."""
    script = textwrap.dedent(f"""
        import importlib, logging, pkgutil
        import hostedrooms
        for module in pkgutil.walk_packages(hostedrooms.__path__, "hostedrooms."):
            importlib.import_module(module.name)
        from hostedrooms import create_engine, migrate, rooms, status
        from hostedrooms.errors import CapacityExceededError
        from hostedrooms.limits import LimitValues
        from hostedrooms.standby import EnginePageSource, Replicator
        import dataclasses
        a, b = create_engine({str(tmp_path / "a.db")!r}), create_engine({str(tmp_path / "b.db")!r})
        migrate.upgrade(a)
        migrate.upgrade(b)
        rooms.create_room(a, room_id="r1", name="R", members=[], authority_gateway_id="install:a")
        try:
            rooms.create_room(a, room_id="r2", name="R", members=[], authority_gateway_id="install:a",
                              limits=dataclasses.replace(LimitValues.read(), MAX_ACTIVE_ROOMS=1))
        except CapacityExceededError:
            pass
        status.store_status(a)
        Replicator(EnginePageSource(a), b).sync_once()
        loggers = [name for name in logging.root.manager.loggerDict if name.startswith("hostedrooms")]
        assert "hostedrooms.rooms.transaction" in loggers, loggers
        handlers = {{name: [type(handler).__name__ for handler in logging.getLogger(name).handlers]
                    for name in loggers}}
        assert handlers.pop("hostedrooms") == ["NullHandler"], handlers
        assert all(found == [] for found in handlers.values()), handlers
        assert logging.root.handlers == [], logging.root.handlers
        print("clean")
    """)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=_env(), timeout=120,
                          cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stdout == "clean\n" and done.stderr == ""


@pytest.mark.parametrize("backend", ["sqlite"], indirect=True)  # what is logged does not depend on the backend
def test_the_library_logs_events_with_fields_and_no_secrets(
        engine: Engine, standby: Engine, target: str, standby_target: str, caplog: pytest.LogCaptureFixture) -> None:
    host(engine, "fine", 2)
    host(engine, "odd", 1)
    rooms.append_event(engine, room_id="fine", event_id="s1", kind="message.user", actor={"kind": "user", "id": "u"},
                       payload={"text": "SECRET-PAYLOAD"}, authority_gateway_id=GATEWAY_A, authority_epoch=1)

    class Hostile(EnginePageSource):
        def read_events(self, room_id: str, *, since_seq: int, limit: int) -> dict[str, Any]:
            if room_id == "odd":
                raise HostedRoomError("no page for you")
            return super().read_events(room_id, since_seq=since_seq, limit=limit)

    with caplog.at_level(logging.DEBUG, logger="hostedrooms"):
        Replicator(Hostile(engine), standby).sync_once()
        failover(standby, from_gateway=GATEWAY_A, local_gateway_id=GATEWAY_B)
        Replicator(EnginePageSource(standby), engine, local_gateway_id=GATEWAY_A).sync_once()  # demotes "fine"
        with pytest.raises(CapacityExceededError):
            rooms.create_room(engine, room_id="extra", name="X", members=[], authority_gateway_id=GATEWAY_A,
                              limits=lowered(MAX_ACTIVE_ROOMS=1))
        ledger = DeliveryLedger(engine, clock=lambda: 1_000)
        ledger.prepare_outbound(request_id="out-1", source_session_id="chat-1", source_run_id="run-1",
                                snapshot={"connection_id": "conn-1", "source_route_id": "route-a",
                                          "source_route_revision": "rev-1", "source_chat_id": "chat-1",
                                          "action": "request_reply"},
                                body="SECRET-BODY", action="request_reply", expires_at=2**40)
        ledger.defer_outbound("out-1", "SECRET-ERROR")
        ledger.fail_outbound("out-1", "SECRET-ERROR")
    ours = [record for record in caplog.records if record.name.startswith("hostedrooms")]
    by_event: dict[str, list[dict[str, Any]]] = {}
    formatter = JsonFormatter()
    for record in ours:
        line = json.loads(formatter.format(record))
        assert set(REQUIRED_FIELDS) <= set(line) and line["event"] != record.name, line
        assert not any(secret in json.dumps(line) for secret in SECRETS), line
        by_event.setdefault(line["event"], []).append(line)
    refused = by_event["replicate.room_refused"][0]
    assert (refused["room"], refused["gateway"], refused["level"]) == ("odd", GATEWAY_A, "WARNING")
    first_pass = by_event["replicate.pass"][0]
    assert (first_pass["rooms"], first_pass["events"], first_pass["refused"], first_pass["level"]) == (
        2, 3, 1, "INFO")
    assert {(line["room"], line["events"]) for line in by_event["replicate.room"]} >= {("fine", 3)}
    promoted = {line["room"]: line for line in by_event["failover.room"]}
    assert promoted["fine"]["outcome"] == "promoted" and promoted["fine"]["gateway"] == GATEWAY_B
    assert by_event["failover.done"][0]["promoted"] == 1
    demoted = by_event["replicate.room_demoted"][0]
    assert (demoted["room"], demoted["gateway"], demoted["epoch"], demoted["level"]) == (
        "fine", GATEWAY_B, 2, "WARNING")
    assert by_event["room.refused"][0]["limit"] == "MAX_ACTIVE_ROOMS"
    retry, failed = by_event["ledger.retry"][0], by_event["ledger.failed"][0]
    assert (retry["key"], retry["attempts"], retry["state"], retry["level"]) == ("out-1", 1, "pending", "INFO")
    assert (failed["key"], failed["state"], failed["level"]) == ("out-1", "failed", "WARNING")


def _store(path: Path) -> str:
    engine = create_engine(str(path))
    migrate.upgrade(engine)
    engine.dispose()
    return str(path)


def _json_lines(text: str) -> list[dict[str, Any]]:
    lines = [json.loads(line) for line in text.splitlines()]
    for line in lines:
        assert set(REQUIRED_FIELDS) <= set(line), line
    return lines


def test_long_running_commands_log_one_json_object_per_line(tmp_path: Path) -> None:
    source, standby = _store(tmp_path / "a.db"), _store(tmp_path / "b.db")
    engine = create_engine(source)
    host(engine, "r1", 3)
    command = [sys.executable, "-m", "hostedrooms.cli"]
    follow = subprocess.Popen([*command, "replicate", "--from", source, "--to", standby, "--follow", "--interval",
                               "0.05", "--log-format", "json", "--log-level", "debug"],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=_env(), cwd=tmp_path)
    try:
        assert follow.stderr is not None
        first = json.loads(follow.stderr.readline())  # the first pass's records come before any idle one
        deadline = time.monotonic() + 60
        while first["event"] != "replicate.pass" and time.monotonic() < deadline:
            first = json.loads(follow.stderr.readline())
        follow.send_signal(signal.SIGTERM)
        out, rest = follow.communicate(timeout=60)
    finally:
        follow.kill()
    assert follow.returncode == 0 and out.startswith("replicate: stopped after ")
    assert first["event"] == "replicate.pass" and first["events"] == 3
    lines = _json_lines(rest)
    assert all(line["event"] == "replicate.pass" and line["level"] == "DEBUG" for line in lines)  # idle passes
    # log --follow: from the start of the room to its disband.
    logged = subprocess.Popen([*command, "log", "r1", "--follow", "--interval", "0.05", "--url", source,
                               "--log-format", "json"],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=_env(), cwd=tmp_path)
    try:
        assert logged.stdout is not None
        for _ in range(3):
            logged.stdout.readline()
        rooms.disband_room(engine, room_id="r1", expected_gateway_id=GATEWAY_A, expected_epoch=1)
        out, err = logged.communicate(timeout=60)
    finally:
        logged.kill()
    engine.dispose()
    assert logged.returncode == 0
    lines = _json_lines(err)
    assert [(line["event"], line["room"], line["level"]) for line in lines] == [
        ("log.follow", "r1", "INFO"), ("log.follow_ended", "r1", "INFO")]


def test_text_logs_and_levels(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    source, standby = _store(tmp_path / "a.db"), _store(tmp_path / "b.db")
    engine = create_engine(source)
    host(engine, "r1", 3)
    engine.dispose()
    code, _, err = _run(capsys, "replicate", "--from", source, "--to", standby, "--log-format", "text")
    assert code == 0 and err.count("\n") == 1
    assert " INFO    replicate.pass replicate pass: 1 room (1 caught-up); 3 events in 1 page;" in err
    assert "rooms=1 events=3 pages=1 lag=0" in err
    code, _, err = _run(capsys, "replicate", "--from", source, "--to", standby, "--log-level", "warning")
    assert code == 0 and err == ""  # an idle pass is debug
    code, _, err = _run(capsys, "replicate", "--from", source, "--to", standby, "--log-level", "debug")
    assert err.startswith("20") and "replicate.pass" in err  # text by default once a level is given
    package = logging.getLogger("hostedrooms")
    assert package.level == logging.NOTSET and [type(handler) for handler in package.handlers] == [
        logging.NullHandler]
    with pytest.raises(SystemExit) as refused:
        _run(capsys, "replicate", "--from", source, "--to", standby, "--log-format", "xml")
    assert refused.value.code == 2 and "argument --log-format: invalid choice: 'xml'" in capsys.readouterr().err


def test_no_progress_line_among_log_lines(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """On a terminal, a progress line overwrites itself: with logs on stderr it would garble them, so it is off."""
    import io

    from hostedrooms.cli import main

    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    source, standby = _store(tmp_path / "a.db"), _store(tmp_path / "b.db")
    engine = create_engine(source)
    host(engine, "r1", 3)
    engine.dispose()
    terminal = Terminal()
    monkeypatch.setattr(sys, "stderr", terminal)
    assert main(["replicate", "--from", source, "--to", standby, "--log-format", "json"], out=io.StringIO()) == 0
    assert "\r" not in terminal.getvalue()
    assert [line["event"] for line in _json_lines(terminal.getvalue())] == ["replicate.pass"]

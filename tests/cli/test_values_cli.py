"""The console script never hands stored text to the terminal raw, and bad ``log`` input is a one-line error
(issue 14, section 5).

Names, ids and messages arriving from peers could carry terminal escape sequences (recolour, clear, set the
title, move the cursor) or newlines that fake table rows. Every human-readable output escapes control, separator
and bidi-override characters as ``\\uXXXX`` (also a valid JSON escape, so ``log --json`` stays valid JSON).
"""

from __future__ import annotations

import json
import unicodedata
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from factories import run_cli as _run
from sqlalchemy import Engine

from hostedrooms import demo, models, rooms
from hostedrooms.display import terminal_text
from hostedrooms.ledger import DeliveryLedger

GATEWAY = "install:gw-a"
EVIL = "evil\x1b[2J\x1b]0;owned\x07\r\nr9  FAKE ROW  install:x \u009b31m \u202eesrever\u2028line"


def _clean(text: str) -> bool:
    """No character a terminal would act on, other than the line feeds ending lines."""
    return not any(terminal_text(char) != char for char in text.replace("\n", ""))


def test_terminal_text_escapes_what_a_terminal_acts_on() -> None:
    unsafe = [chr(code) for code in range(0x20)] + [chr(code) for code in range(0x7F, 0xA0)] + [
        "\u061c", "\u200e", "\u200f", "\u2028", "\u2029", *map(chr, range(0x202A, 0x202F)),
        *map(chr, range(0x2066, 0x206A))]
    for char in unsafe:
        assert terminal_text(char) == f"\\u{ord(char):04x}"
        assert unicodedata.category(char) in ("Cc", "Cf", "Zl", "Zp")
    kept = "Röom ☃ 👩‍💻 日本 tab-free text \\ \" '"
    assert terminal_text(kept) == kept
    assert json.loads(terminal_text(json.dumps({"k": "".join(unsafe)}, ensure_ascii=False))) == {
        "k": "".join(unsafe)}


def _room(engine: Engine) -> None:
    rooms.create_room(engine, room_id="r1", name=EVIL, members=[], authority_gateway_id=GATEWAY, now=1.0)
    rooms.append_event(engine, room_id="r1", event_id="e1", kind="message.user",
                       actor={"kind": "user", "id": "u1", "display_name": EVIL}, payload={"text": EVIL},
                       authority_gateway_id=GATEWAY, authority_epoch=1, now=2.0)


# Regression: a peer's room name with escape sequences and a newline reached the terminal raw (a fake row).
def test_rooms_prints_names_escaped(engine: Engine, target: str, capsys: pytest.CaptureFixture[str]) -> None:
    _room(engine)
    code, out, _ = _run(capsys, "rooms", "--url", target)
    assert code == 0 and _clean(out)
    assert len(out.splitlines()) == 2  # the header and one room: no fake row
    assert "evil\\u001b[2J\\u001b]0;owned\\u0007\\u000d\\u000ar9  FAKE ROW" in out


def test_log_prints_events_escaped(engine: Engine, target: str, capsys: pytest.CaptureFixture[str]) -> None:
    _room(engine)
    code, out, _ = _run(capsys, "log", "r1", "--url", target)
    assert code == 0 and _clean(out) and len(out.splitlines()) == 1
    assert "\\u009b31m" in out and "\\u202e" in out
    code, out, _ = _run(capsys, "log", "r1", "--json", "--url", target)
    assert code == 0 and _clean(out) and len(out.splitlines()) == 1
    event = json.loads(out)
    assert event["payload"] == {"text": EVIL} and event["actor"]["display_name"] == EVIL


def test_replicas_and_deliveries_print_escaped(engine: Engine, target: str,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    ledger = DeliveryLedger(engine, clock=lambda: 1_000)
    envelope: dict[str, Any] = {
        "envelope_id": "env\x1b[31m\nFAKE", "request_id": "req", "team_id": "t", "source_server_identity": "s",
        "source_route_id": "sr", "source_route_revision": "1", "target_server_identity": "t",
        "target_route_id": "tr", "target_route_revision": "1", "exchange_id": "x", "action": "instruction",
        "kind": "instruction", "body": {"message": "hi"}, "used_legs": 1, "max_legs": 6, "expires_at": 2**40}
    ledger.prepare(envelope, transport_role="host", connection_id="c", lease_token="l",
                   target_chat_id="chat\x1b[0m")
    code, out, _ = _run(capsys, "deliveries", "--url", target)
    assert code == 0 and _clean(out) and len(out.splitlines()) == 2 and "env\\u001b[31m\\u000aFAKE" in out
    # A replica row written by older code (today's ingest validates these ids).
    with engine.begin() as connection:
        connection.execute(sa.insert(models.replicas).values(
            room_id="x\x1b[1m", name="X", members_json="[]", authority_gateway_id="g\nFAKE", authority_epoch=1,
            last_seq=0, latest_seq=0, event_bytes=0, created_at=1.0, updated_at=1.0))
    code, out, _ = _run(capsys, "replicas", "--url", target)
    assert code == 0 and _clean(out) and len(out.splitlines()) == 2 and "g\\u000aFAKE" in out


def test_verify_prints_violations_escaped(engine: Engine, target: str, capsys: pytest.CaptureFixture[str]) -> None:
    ledger = DeliveryLedger(engine, clock=lambda: 1_000)
    envelope: dict[str, Any] = {
        "envelope_id": "env\x1b[2J\nverify: clean", "request_id": "req", "team_id": "t",
        "source_server_identity": "s", "source_route_id": "sr", "source_route_revision": "1",
        "target_server_identity": "t", "target_route_id": "tr", "target_route_revision": "1", "exchange_id": "x",
        "action": "instruction", "kind": "instruction", "body": {"message": "hi"}, "used_legs": 1, "max_legs": 6,
        "expires_at": 2**40}
    ledger.prepare(envelope, transport_role="host", connection_id="c", lease_token="l", target_chat_id="chat")
    with engine.begin() as connection:
        connection.execute(sa.update(models.deliveries).values(body_json="{not json"))
    code, out, _ = _run(capsys, "verify", "--url", target)
    assert code == 1 and _clean(out)
    assert out.splitlines() == [
        "ledger_json: env\\u001b[2J\\u000averify: clean: delivery body is not JSON within 64 levels",
        "verify: 1 violation(s)"]


def test_errors_print_escaped(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from hostedrooms import migrate

    url = str(tmp_path / "state.db")
    migrate.upgrade(url)
    code, _, err = _run(capsys, "log", "nope\x1b[2J\nFAKE", "--url", url)
    assert code == 1 and _clean(err) and err.count("\n") == 1 and "nope\\u001b[2J\\u000aFAKE" in err


def test_demo_cells_are_escaped() -> None:
    cell = demo._cell({"authority_epoch": 1, "kind": "message.user", "payload": {"text": "\x1b[2J\nFAKE"}})
    assert _clean(cell) and "\\u001b[2J\\u000aFAKE" in cell


# --- log: one-line errors -------------------------------------------------------------------------------------------


# Regression: --since beyond 64 bits ended in an OverflowError traceback.
@pytest.mark.parametrize("since", ["18446744073709551616", str(2**63), "-1"])
def test_log_since_out_of_range_is_a_one_line_error(engine: Engine, target: str, since: str,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    _room(engine)
    code, out, err = _run(capsys, "log", "r1", "--since", since, "--url", target)
    assert code == 1 and out == ""
    assert err == f"hostedrooms: error: --since must be between 0 and {2**63 - 1}\n"


def _deep_event(engine: Engine, column: str) -> None:
    deep = '{"a":' * 5000 + "{}" + "}" * 5000
    values = {"payload_json": "{}", "actor_json": '{"id":"u1","kind":"user"}', column: deep}
    with engine.begin() as connection:
        connection.execute(sa.insert(models.events).values(
            room_id="r1", seq=2, event_id="deep", kind="message.user", authority_epoch=1, created_at=3.0, **values))
        connection.execute(sa.update(models.rooms).values(next_seq=3))


# Regression: log --json on a payload stored deeper than the interpreter decodes ended in a RecursionError traceback.
@pytest.mark.parametrize(("column", "json_flag"), [("payload_json", True), ("actor_json", True),
                                                    ("actor_json", False)])
def test_log_of_an_undecodable_event_is_a_one_line_error(engine: Engine, target: str, column: str, json_flag: bool,
                                                         capsys: pytest.CaptureFixture[str]) -> None:
    _room(engine)
    _deep_event(engine, column)
    code, out, err = _run(capsys, "log", "r1", *(["--json"] if json_flag else []), "--url", target)
    assert code == 1 and len(out.splitlines()) == 1  # the readable event before it was printed
    assert err == ("hostedrooms: error: hosted room 'r1' event seq 2 holds a stored value that cannot be decoded "
                   "(RecursionError)\n")


def test_log_prints_a_deep_payload_as_text(engine: Engine, target: str, capsys: pytest.CaptureFixture[str]) -> None:
    """Without --json the payload is printed as stored: nothing to decode, nothing to refuse."""
    _room(engine)
    _deep_event(engine, "payload_json")
    code, out, _ = _run(capsys, "log", "r1", "--url", target)
    assert code == 0 and len(out.splitlines()) == 2


@pytest.mark.parametrize(("argv", "message"), [
    (["--limit", str(2**64)], f"--limit must be between 1 and {2**63 - 1}"),
    (["--interval", "nan", "--follow"], "--interval must be a finite number of seconds, 0 or more"),
    (["--interval", "-1", "--follow"], "--interval must be a finite number of seconds, 0 or more"),
])
def test_other_log_arguments_out_of_range_are_one_line_errors(engine: Engine, target: str, argv: list[str],
                                                               message: str,
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    _room(engine)
    code, out, err = _run(capsys, "log", "r1", *argv, "--url", target)
    assert (code, out, err) == (1, "", f"hostedrooms: error: {message}\n")

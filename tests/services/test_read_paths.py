"""Read paths on the store's compiled statements (``list_rooms``, the CLI ``log``) return exactly what the plain
path returns: rows through ``execute()`` and one ``json.loads`` per stored text, written here, on both backends."""

from __future__ import annotations

import json
import time
from typing import Any

import pytest
import sqlalchemy as sa
from factories import run_cli
from sqlalchemy import Engine

from hostedrooms import models, rooms
from hostedrooms.cli import inspect as cli
from hostedrooms.display import terminal_text

GATEWAY = "g1"

# --- list_rooms ------------------------------------------------------------------------------------------------


def _plain_rooms(engine: Engine, include_disbanded: bool, limit: int, offset: int) -> list[dict[str, Any]]:
    """The reference's listing: most recent change first, then room id code point by code point."""
    with engine.connect() as connection:
        rows = connection.execute(sa.select(models.rooms)).mappings().all()
    rows = sorted((row for row in rows if include_disbanded or row["disbanded_at"] is None),
                  key=lambda row: (-row["updated_at"], row["room_id"]))
    listed = []
    for row in rows[offset:offset + limit]:
        room = {"room_id": row["room_id"], "name": row["name"], "members": json.loads(row["members_json"]),
                "authority_gateway_id": row["authority_gateway_id"], "authority_epoch": row["authority_epoch"],
                "revision": row["revision"], "created_at": float(row["created_at"]),
                "updated_at": float(row["updated_at"]), "idempotent": False}
        if row["disbanded_at"] is not None:
            room["disbanded_at"] = float(row["disbanded_at"])
        room["latest_seq"] = row["next_seq"] - 1
        listed.append(room)
    return listed


def test_list_rooms_is_the_plain_listing(engine: Engine) -> None:
    # Ids that sort differently by code point and by a locale's collation; members of every shape; rooms changed
    # at the same instant (the id decides); some disbanded.
    ids = ["b", "B", "a", "a-1", "a.1", "Z9", "z:0", "m", "n", "o", "p", "q"]
    for index, room_id in enumerate(ids):
        members = [{"id": f"m{n}", "name": "Zoë 😀" if n % 2 else "\u2028x"} for n in range(index % 4)]
        rooms.create_room(engine, room_id=room_id, name=f"Room {index} é", members=members,
                          authority_gateway_id=GATEWAY, now=1000.0 + index % 3)
    for room_id in ("a", "Z9", "q"):
        rooms.disband_room(engine, room_id=room_id, expected_gateway_id=GATEWAY, expected_epoch=1, now=1001.0)
    compared = 0
    for include_disbanded in (False, True):
        for limit, offset in ((500, 0), (1, 0), (4, 3), (5, 10), (500, 11), (3, 50)):
            listed = rooms.list_rooms(engine, include_disbanded=include_disbanded, limit=limit, offset=offset)
            assert json.dumps(listed) == json.dumps(_plain_rooms(engine, include_disbanded, limit, offset))
            compared += len(listed)
    assert compared > 20  # (not vacuous)


# --- the CLI log ---------------------------------------------------------------------------------------------------

#: Stored texts the API never writes, each read back as stored (whitespace, escapes, floats that grow).
_HAND_WRITTEN = {3: ("payload_json", '{"text" : "h\\u00e9\\/llo",  "n": [1e15, 1E-7, -0]}'),
                 4: ("actor_json", ' {"kind":"user","id":"u1"} ')}


def _log_room(engine: Engine) -> None:
    rooms.create_room(engine, room_id="r1", name="Team", members=[], authority_gateway_id=GATEWAY, now=1000.0)
    events = [{"event_id": f"e{n}", "kind": "message.user",
               "actor": {"kind": "user", "id": "u1", "display_name": "Zoë\u202e"},
               "payload": {"text": "é😀\x00\u2028" * n, "data": [{"deep": [n, n / 3, None, True]}]}}
              for n in range(7)]
    rooms.append_events(engine, "r1", events, GATEWAY, 1, now=1234.5)
    with engine.begin() as connection:
        for seq, (column, text) in _HAND_WRITTEN.items():
            connection.execute(sa.update(models.events).where(models.events.c.seq == seq).values({column: text}))


def _plain_log(engine: Engine, as_json: bool, since: int, limit: int) -> str:
    """What ``hostedrooms log`` printed before it read through the store, written plainly."""
    with engine.connect() as connection:
        rows = connection.execute(sa.select(models.events).where(models.events.c.room_id == "r1",
                                                                 models.events.c.seq > since)
                                  .order_by(models.events.c.seq).limit(limit)).mappings().all()
    lines = []
    for row in rows:
        actor = json.loads(row["actor_json"])
        if as_json:
            event = {"room_id": row["room_id"], "seq": row["seq"], "event_id": row["event_id"], "kind": row["kind"],
                     "actor": actor, "authority_epoch": row["authority_epoch"],
                     "payload": json.loads(row["payload_json"]), "created_at": row["created_at"]}
            lines.append(terminal_text(json.dumps(event, ensure_ascii=False)))
        else:
            stamp = time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(row["created_at"]))
            who = f"{actor.get('kind')}:{actor.get('id')}"
            lines.append(terminal_text(f"{row['seq']:>6}  {stamp}  e{row['authority_epoch'] or '-'}  "
                                       f"{row['kind']:<20} {who:<24} {row['payload_json']}"))
    return "".join(line + "\n" for line in lines)


@pytest.mark.parametrize("as_json", [False, True])
def test_cli_log_is_the_plain_rendering(
    engine: Engine, target: str, capsys: pytest.CaptureFixture[str], as_json: bool
) -> None:
    _log_room(engine)
    for since, limit in ((0, 500), (0, 1), (2, 3), (6, 500), (7, 500)):
        code, out, _ = run_cli(capsys, "log", "r1", "--since", str(since), "--limit", str(limit), "--url", target,
                               *(["--json"] if as_json else []))
        assert code == 0
        assert out == _plain_log(engine, as_json, since, limit), (since, limit)
        assert out.count("\n") == max(0, min(limit, 7 - since))


def test_cli_log_reads_a_large_limit_a_page_at_a_time(
    engine: Engine, target: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    pages: list[int] = []
    read_page = cli._log_page

    def counted(*args: Any) -> list[tuple[Any, ...]]:
        rows = read_page(*args)
        pages.append(len(rows))
        return rows

    monkeypatch.setattr(cli, "_log_page", counted)
    rooms.create_room(engine, room_id="big", name="Big", members=[], authority_gateway_id=GATEWAY)
    for first in range(1, 1204, 100):
        rooms.append_events(engine, "big", [
            {"event_id": f"e{n}", "kind": "message.user", "actor": {"kind": "user", "id": "u1"}, "payload": {"n": n}}
            for n in range(first, min(first + 100, 1204))], GATEWAY, 1)
    code, out, _ = run_cli(capsys, "log", "big", "--since", "1", "--limit", "1201", "--json", "--url", target)
    assert code == 0
    assert [json.loads(line)["seq"] for line in out.splitlines()] == list(range(2, 1203))
    assert pages == [500, 500, 201]  # memory: one page of rows at a time, whatever --limit says
    pages.clear()
    code, out, _ = run_cli(capsys, "log", "big", "--since", "900", "--limit", "9223372036854775807", "--url", target)
    assert code == 0 and [int(line.split()[0]) for line in out.splitlines()] == list(range(901, 1204))
    assert pages == [303]  # a short page ends the read

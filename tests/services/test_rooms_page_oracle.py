"""Replay pages against an oracle written here from the reference's page rule, on both backends.

The rule (the reference's ``read_events``): take at most ``limit`` events after ``since_seq``, in seq order, while
the running sum of the UTF-8 bytes of their stored id, kind, actor and payload texts stays within the budget
(``MAX_LOG_PAGE_BYTES``); then keep the longest prefix whose page, serialised with ``json.dumps(...,
ensure_ascii=False, separators=(",", ":"))``, is at most the budget in UTF-8 bytes. One deviation (README): when
not even one event fits, hostedrooms raises "hosted room event exceeds replay page limit" instead of returning an
empty page with ``has_more``.

The oracle below reads the rows with a plain SELECT, decodes each text with ``json.loads`` and tries every prefix
from the longest down, serialising each: nothing of the library's page code runs in it. Each example builds a room
through the API (payloads of very different sizes, any unicode, nested values, several actors), then walks the
whole log page by page through ``read_events`` and through the oracle, with budgets right at, one byte under and
one byte over the size of a page prefix, and one smaller than any single event.
"""

from __future__ import annotations

import json
from typing import Any

import sqlalchemy as sa
from factories import lowered, only_room
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sqlalchemy import Engine

from hostedrooms import models, rooms
from hostedrooms.errors import HostedRoomError

GATEWAY = "g1"
ROOM = "r1"

_CHARACTERS = st.one_of(
    st.characters(exclude_categories=("Cs",)), st.sampled_from('"\\\x00\x1f\x7f/é€😀\u2028'))
_TEXT = st.text(_CHARACTERS, max_size=10)
_SCALAR = st.one_of(st.none(), st.booleans(), st.integers(min_value=-(2**64), max_value=2**64),
                    st.floats(allow_nan=False, allow_infinity=False), _TEXT)
_VALUE = st.recursive(_SCALAR, lambda inner: st.one_of(
    st.lists(inner, max_size=3), st.dictionaries(_TEXT, inner, max_size=3)), max_leaves=10)
#: (actor, an event kind it may append)
_ACTORS = (
    ({"kind": "user", "id": "u1"}, "message.user"),
    ({"kind": "user", "id": "u-2.x", "display_name": "Zoë 😀"}, "message.user"),
    ({"kind": "member", "id": "m1", "profile": "p", "connection_id": "c\u2028"}, "message.member"),
    ({"kind": "gateway", "id": GATEWAY}, "turn.started"),
)


@st.composite
def _new_events(draw: st.DrawFn) -> list[dict[str, Any]]:
    events = []
    for index in range(draw(st.integers(min_value=1, max_value=10))):
        actor, kind = draw(st.sampled_from(_ACTORS))
        filler = draw(st.sampled_from("aé€😀\"\x01")) * draw(st.sampled_from((0, 0, 30, 400, 2500)))
        payload = {"text": draw(_TEXT) + filler, "data": draw(_VALUE)}
        suffix = draw(st.from_regex("[a-z0-9._:-]{0,30}", fullmatch=True))
        events.append({"event_id": f"e{index}-{suffix}", "kind": kind, "actor": dict(actor), "payload": payload})
    return events


def _dumps(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


def _size(value: Any) -> int:
    return len(_dumps(value).encode("utf-8"))


def oracle(engine: Engine, since: int, limit: int, budget: int) -> dict[str, Any]:
    """The reference's page rule, written plainly (the rows of one read transaction)."""
    r, e = models.rooms.c, models.events.c
    with engine.connect() as connection, connection.begin():
        room = connection.execute(sa.select(r.next_seq, r.authority_gateway_id, r.authority_epoch)
                                  .where(r.room_id == ROOM)).one()
        rows = connection.execute(
            sa.select(e.room_id, e.seq, e.event_id, e.kind, e.actor_json, e.authority_epoch, e.payload_json,
                      e.created_at)
            .where(e.room_id == ROOM, e.seq > since).order_by(e.seq).limit(limit)).all()
    latest_seq = room.next_seq - 1
    if since > latest_seq:
        raise HostedRoomError("since_seq is ahead of the hosted room log")
    events, running = [], 0
    for row in rows:
        running += len((row.event_id + row.kind + row.actor_json + row.payload_json).encode("utf-8"))
        if running > budget:
            break
        events.append({
            "room_id": row.room_id, "seq": row.seq, "event_id": row.event_id, "kind": row.kind,
            "actor": json.loads(row.actor_json), "authority_epoch": row.authority_epoch,
            "payload": json.loads(row.payload_json), "created_at": float(row.created_at), "idempotent": False})
    authority = {"gateway_id": room.authority_gateway_id, "epoch": room.authority_epoch}

    def page(count: int) -> dict[str, Any]:
        cursor = events[count - 1]["seq"] if count else since
        return {"events": events[:count], "cursor": cursor, "latest_seq": latest_seq,
                "has_more": cursor < latest_seq, "authority": authority}

    count = len(events)
    while count and _size(page(count)) > budget:
        count -= 1
    if count == 0 and since < latest_seq:
        raise HostedRoomError("hosted room event exceeds replay page limit")
    return page(count)


def _outcome(read: Any, engine: Engine, since: int, limit: int, budget: int) -> tuple[str, Any]:
    try:
        page = read(engine, since, limit, budget)
    except HostedRoomError as exc:
        return ("error", (type(exc).__name__, str(exc)))
    return ("page", _dumps(page))


def _library(engine: Engine, since: int, limit: int, budget: int) -> Any:
    page = rooms.read_events(engine, room_id=ROOM, since_seq=since, limit=limit,
                             limits=lowered(MAX_LOG_PAGE_BYTES=budget))
    assert isinstance(page.get("lineage"), str)
    return {key: value for key, value in page.items() if key != "lineage"}  # added after the reference's rule


def _build(engine: Engine, events: list[dict[str, Any]], start: int = 1) -> None:
    """The room, its log from seq ``start`` (an operator may have moved ``next_seq``: the widest seqs)."""
    only_room(engine, ROOM, GATEWAY, next_seq=start)
    for first in range(0, len(events), 4):  # several appends: several created_at values
        rooms.append_events(engine, ROOM, events[first:first + 4], GATEWAY, 1, now=1000.0 + first / 7,
                            limits=lowered(MAX_EVENTS_PER_ROOM=2**63 - 1))


def _walk(engine: Engine, limit: int, budget: int) -> int:
    """Read the whole log page by page both ways, comparing each page and where the next one starts; the number
    of pages compared."""
    since, pages = 0, 0
    while True:
        kind, fast = _outcome(_library, engine, since, limit, budget)
        assert (kind, fast) == _outcome(oracle, engine, since, limit, budget), (since, limit, budget)
        pages += 1
        if kind == "error":
            return pages
        page = json.loads(fast)
        assert page["cursor"] > since or not page["has_more"]
        if not page["has_more"]:
            return pages
        since = page["cursor"]


def _boundary_budgets(engine: Engine, limit: int) -> list[int]:
    """Budgets at, one under and one over the size of every prefix of the first page under a roomy budget; and
    one byte under the smallest one-event page (no page can be built)."""
    first = oracle(engine, 0, limit, 1 << 30)
    sizes = [_size({**first, "events": first["events"][:count], "cursor": first["events"][count - 1]["seq"],
                    "has_more": first["events"][count - 1]["seq"] < first["latest_seq"]})
             for count in range(1, len(first["events"]) + 1)]
    return sorted({size + delta for size in sizes for delta in (-1, 0, 1)} | {sizes[0] - 1})


def test_pages_are_the_reference_rule(engine: Engine) -> None:
    seen = {"pages": 0, "errors": 0, "cut": 0}

    @settings(max_examples=25, deadline=None, database=None,
              suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow,
                                     HealthCheck.data_too_large])
    @given(_new_events(), st.data())
    def agree(events: list[dict[str, Any]], data: st.DataObject) -> None:
        _build(engine, events, data.draw(st.sampled_from((1, 1, 2**63 - 20))))
        limit = data.draw(st.sampled_from((1, 3, 500)))
        budgets = _boundary_budgets(engine, limit)
        for budget in [2 * 1024 * 1024, *data.draw(st.lists(st.sampled_from(budgets), min_size=3, max_size=5))]:
            seen["pages"] += _walk(engine, limit, budget)
            try:
                page = oracle(engine, 0, limit, budget)
                seen["cut"] += len(page["events"]) < min(limit, len(events) + 1)
            except HostedRoomError:
                seen["errors"] += 1

    agree()
    # The walks met every case: whole pages, pages cut by the budget, and an event too large for any page.
    assert seen["pages"] > 20 and seen["errors"] > 0 and seen["cut"] > 0, seen


def test_an_event_larger_than_the_budget_is_refused_like_the_oracle(engine: Engine) -> None:
    """Refused when the stored bytes alone exceed the budget, and when only the serialised page does."""
    _build(engine, [{"event_id": "big", "kind": "message.user", "actor": {"kind": "user", "id": "u1"},
                     "payload": {"text": "é" * 5000}}])
    whole = _size(oracle(engine, 0, 10, 1 << 30))
    refused = ("error", ("HostedRoomError", "hosted room event exceeds replay page limit"))
    for budget in (1000, 10_000, whole - 1):
        assert _outcome(_library, engine, 0, 10, budget) == _outcome(oracle, engine, 0, 10, budget) == refused
    assert _outcome(_library, engine, 0, 10, whole) == _outcome(oracle, engine, 0, 10, whole) != refused

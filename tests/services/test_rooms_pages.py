"""The fast replay page (driver rows, one scanner call per text, a size bound instead of serialising the page)
returns exactly what the plain path returns, on both backends.

Each generated example writes a room log through the API (unicode, escapes, control characters, floats of every
size, big and small events), then optionally overwrites some stored texts by hand the way a legacy writer or an
operator might (whitespace, escapes the json module would not write, floats that grow when written back, an escaped
lone surrogate, a text that is not one JSON value, deep nesting, ids that need escaping). It then reads pages at
several positions and limits, under the default budget and under budgets lowered to just around the size of every
prefix of the page, through :func:`read_events` and through the plain path
(:func:`hostedrooms.rooms.events.read_events_exact`): the pages must serialise to the same bytes, and an error
must be the same class with the same message.
"""

from __future__ import annotations

import json
import random
import tracemalloc
from typing import Any

import pytest
import sqlalchemy as sa
from factories import lowered, only_room
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sqlalchemy import Engine

from hostedrooms import models, rooms
from hostedrooms.errors import HostedRoomError
from hostedrooms.rooms import pages as page_rows
from hostedrooms.rooms.events import read_events_exact
from hostedrooms.store import REPLAY_COLUMNS
from hostedrooms.uow import UnitOfWork

GATEWAY = "g1"
ROOM = "r1"

# Texts: any character but a lone surrogate (which no driver can store); the quote, the backslash and control
# characters (escaped when written) and characters of every UTF-8 width are favoured.
_CHARACTERS = st.one_of(
    st.characters(exclude_categories=("Cs",)), st.sampled_from('"\\\x00\x01\n\x1f\x7f/é€😀\u2028'))
_TEXT = st.text(_CHARACTERS, max_size=12)
_FLOAT = st.one_of(
    st.floats(allow_nan=False, allow_infinity=False),
    st.sampled_from((1e15, 1e16, 1.5e-7, 0.1, -0.0, 123456789012345678.0, 5e-324, 1.7976931348623157e308)))
_SCALAR = st.one_of(st.none(), st.booleans(), st.integers(min_value=-(2**70), max_value=2**70), _FLOAT, _TEXT)
_VALUE = st.recursive(_SCALAR, lambda inner: st.one_of(
    st.lists(inner, max_size=4), st.dictionaries(_TEXT, inner, max_size=4)), max_leaves=12)

# Stored texts no API call writes, each meant to steer the fast path somewhere else: its doubt checks, its float
# growth, or the plain decode's errors.
_HAND_WRITTEN = (
    ' {"a": 1}', '{"a": 1} ', '{"a" : [1, 2]}', '{"b":"\\u00e9\\/\\u0041"}', '[1e15,1E-7,123456789012345678.0]',
    "1e400", "[-1e400,1E+2]", '"\\ud800"', '"\\ud83d\\ude00"', '"\\uDFFF x"', "1,2", '"x', '{not json', "",
    '{"k":1,"k":2}', "NaN", "-0", "[" * 300 + "]" * 300, "[" * 5000 + "]" * 5000, '"\\\\ud800"')
_ODD_IDS = ('id"quote', "id\\back", "id\nline", "idé", "\x01" * 60, '"' * 60)
#: Where a log starts (the widest seqs a BIGINT holds, after an operator moved next_seq), and when it was written
#: (the widest float repr there is).
_STARTS = (1, 1, 10**18)
_TIMES = (1234.5678901234567, -2.2250738585072014e-308, 1e16, 0.0)


@st.composite
def _events(draw: st.DrawFn) -> list[dict[str, Any]]:
    count = draw(st.integers(min_value=1, max_value=14))
    events = []
    for index in range(count):
        size = draw(st.sampled_from((0, 0, 0, 40, 700, 3000)))
        payload = {"text": draw(_TEXT) + draw(st.sampled_from("xé😀\x01")) * size, "data": draw(_VALUE)}
        actor: dict[str, Any] = {"kind": "user", "id": draw(st.sampled_from(("u1", "user-2", "u:3")))}
        if draw(st.booleans()):
            actor["display_name"] = draw(_TEXT).strip() or "name"
        events.append({"event_id": f"e{index}", "kind": "message.user", "actor": actor, "payload": payload})
    return events


@st.composite
def _edits(draw: st.DrawFn, count: int) -> list[tuple[int, str, Any]]:
    """(seq, column, stored value) overwrites, by hand."""
    if draw(st.integers(min_value=0, max_value=2)):
        return []
    edits = []
    for _ in range(draw(st.integers(min_value=1, max_value=3))):
        seq = draw(st.integers(min_value=1, max_value=count))
        column = draw(st.sampled_from(("actor_json", "payload_json", "payload_json", "event_id", "kind",
                                       "authority_epoch")))
        if column in ("event_id", "kind"):
            value: Any = draw(st.sampled_from(_ODD_IDS))
        elif column == "authority_epoch":
            value = draw(st.sampled_from((None, 2**63 - 1)))
        else:
            value = draw(st.sampled_from(_HAND_WRITTEN))
        edits.append((seq, column, value))
    return edits


def _write(engine: Engine, events: list[dict[str, Any]], edits: list[tuple[int, str, Any]], *, start: int = 1,
           now: float = 1234.5678901234567) -> None:
    """A room whose log holds ``events`` from seq ``start``, appended at ``now``, then ``edits`` (seqs counted from
    1) written by hand."""
    only_room(engine, ROOM, GATEWAY, next_seq=start)
    rooms.append_events(engine, ROOM, events, GATEWAY, 1, now=now, limits=lowered(MAX_EVENTS_PER_ROOM=2**63 - 1))
    with engine.begin() as connection:
        for seq, column, value in edits:
            if column == "event_id":
                value = f"{value}{seq}"  # unique within the room
            table = models.events
            connection.execute(sa.update(table).where(table.c.room_id == ROOM, table.c.seq == start - 1 + seq)
                               .values({column: value}))


def _outcome(read: Any, engine: Engine, since: int, limit: int, budget: int | None) -> Any:
    """The page as the bytes a caller would send, or the error's class and message."""
    lim = None if budget is None else lowered(MAX_LOG_PAGE_BYTES=budget)
    try:
        page = read(engine, room_id=ROOM, since_seq=since, limit=limit, limits=lim)
    except Exception as exc:  # whatever the plain path raises, the fast path must raise too
        return (type(exc).__name__, str(exc))
    return json.dumps(page, ensure_ascii=False, separators=(",", ":"))


def _budgets(engine: Engine, since: int, limit: int, rng: random.Random) -> list[int | None]:
    """The default budget, and budgets around the size of every prefix of the default page."""
    budgets: list[int | None] = [None]
    try:
        page = read_events_exact(engine, room_id=ROOM, since_seq=since, limit=limit)
    except Exception:  # an error: the default budget decides it
        return budgets
    for count in range(len(page["events"]) + 1):
        events = page["events"][:count]
        cursor = events[-1]["seq"] if events else since
        prefix = {**page, "events": events, "cursor": cursor, "has_more": cursor < page["latest_seq"]}
        size = len(json.dumps(prefix, ensure_ascii=False, separators=(",", ":")).encode())
        budgets += [size, size - 1, size + 1, size + rng.randint(2, 400)]
    return [None, *rng.sample(budgets[1:], min(len(budgets) - 1, 6))]


@pytest.fixture
def proved(monkeypatch: pytest.MonkeyPatch) -> dict[str, int]:
    """How many fast pages the bound proved, and how many took the exact rule (fit_page)."""
    counts = {"bound": 0, "exact": 0}
    fast, exact = page_rows.replay_page, page_rows.fit_page

    def counting_exact(*args: Any, **kwargs: Any) -> Any:
        counts["exact"] += 1
        return exact(*args, **kwargs)

    def counting_fast(*args: Any, **kwargs: Any) -> Any:
        before = counts["exact"]
        page = fast(*args, **kwargs)
        counts["bound"] += counts["exact"] == before
        return page

    monkeypatch.setattr(page_rows, "fit_page", counting_exact)
    monkeypatch.setattr("hostedrooms.rooms.events.replay_page", counting_fast)
    return counts


def test_fast_pages_are_the_plain_pages(engine: Engine, proved: dict[str, int]) -> None:
    @settings(max_examples=40, deadline=None, database=None,
              suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow,
                                     HealthCheck.data_too_large])
    @given(st.data(), _events())
    def agree(data: st.DataObject, events: list[dict[str, Any]]) -> None:
        edits = data.draw(_edits(len(events)))
        rng = data.draw(st.randoms(use_true_random=False))
        start = data.draw(st.sampled_from(_STARTS))
        _write(engine, events, edits, start=start, now=data.draw(st.sampled_from(_TIMES)))
        for since in sorted({0, start - 1 + rng.randint(0, len(events))}):
            for limit in sorted({rng.randint(1, len(events)), 500}):
                for budget in _budgets(engine, since, limit, rng):
                    fast = _outcome(rooms.read_events, engine, since, limit, budget)
                    assert fast == _outcome(read_events_exact, engine, since, limit, budget), (since, limit, budget)

    agree()
    # Both ways of deciding a page ran: the comparison is not vacuous.
    assert proved["bound"] > 0 and proved["exact"] > 0, proved


@pytest.mark.parametrize("stored", _HAND_WRITTEN)
def test_each_hand_written_text_reads_as_on_the_plain_path(engine: Engine, stored: str) -> None:
    events = [{"event_id": f"e{n}", "kind": "message.user", "actor": {"kind": "user", "id": "u1"},
               "payload": {"text": "x" * n}} for n in range(3)]
    for column in ("actor_json", "payload_json"):
        _write(engine, events, [(2, column, stored)])
        for budget in (None, 400, 600, 900):
            assert (_outcome(rooms.read_events, engine, 0, 10, budget)
                    == _outcome(read_events_exact, engine, 0, 10, budget))


_ONE = [{"event_id": "e1", "kind": "message.user", "actor": {"kind": "user", "id": "u1"}, "payload": {}}]


@pytest.mark.parametrize(("edits", "start", "now"), [
    # 1e15 is stored in 4 bytes and written into the page in 18: the bound counts what floats grow.
    ([(1, "payload_json", "[" + ",".join(["1e15"] * 50) + "]")], 1, 1.5),
    # An id or a kind JSON must escape (a control character takes 6 bytes in the page) goes to the exact rule.
    ([(1, "event_id", "\x01" * 100)], 1, 1.5),
    ([(1, "kind", '"' * 100)], 1, 1.5),
    # The widest seq, epoch and created_at a row holds: the frame the bound adds per event covers them.
    ([(1, "authority_epoch", 2**63 - 1)], 2**63 - 2, -2.2250738585072014e-308),
])
def test_one_byte_over_the_budget_is_seen(
    engine: Engine, edits: list[tuple[int, str, Any]], start: int, now: float
) -> None:
    _write(engine, _ONE, edits, start=start, now=now)
    page = read_events_exact(engine, room_id=ROOM)
    replay = {key: value for key, value in page.items() if key != "lineage"}  # lineage: added after fitting
    size = len(json.dumps(replay, ensure_ascii=False, separators=(",", ":")).encode())
    assert rooms.read_events(engine, room_id=ROOM, limits=lowered(MAX_LOG_PAGE_BYTES=size)) == page
    with pytest.raises(HostedRoomError, match="^hosted room event exceeds replay page limit$"):
        rooms.read_events(engine, room_id=ROOM, limits=lowered(MAX_LOG_PAGE_BYTES=size - 1))


def test_a_replay_page_holds_about_one_page_of_rows(engine: Engine) -> None:
    """Rows are read from the driver a budget's worth at a time: a page of big events never holds the room."""
    events = [{"event_id": f"e{n}", "kind": "message.user", "actor": {"kind": "user", "id": "u1"},
               "payload": {"text": "x" * 20_000}} for n in range(400)]
    _write(engine, events, [])  # an 8 MB room
    lim = lowered(MAX_LOG_PAGE_BYTES=500_000)
    tracemalloc.start()
    try:
        page = rooms.read_events(engine, room_id=ROOM, limit=500, limits=lim)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert len(page["events"]) == 24 and page["has_more"] is True
    assert peak < 5 * 500_000  # the rows, the events, and the exact rule's serialised page
    assert page == read_events_exact(engine, room_id=ROOM, limit=500, limits=lim)


def test_the_store_reads_the_rows_of_the_plain_page(engine: Engine) -> None:
    """replay_rows and read_page select exactly the rows event_page (the plain statement) selects, cut by the running
    byte sum at the same row, with their accounted bytes; read_page's head is room_head's."""
    events = [{"event_id": f"e{n}", "kind": "message.user", "actor": {"kind": "user", "id": "u1"},
               "payload": {"text": "é" * (n * 37 % 300)}} for n in range(40)]
    _write(engine, events, [])
    with UnitOfWork(engine, write=False) as uow:
        store = uow.rooms
        for since, limit, max_bytes in [(0, 500, 2 << 20), (0, 7, 2 << 20), (3, 500, 3000), (39, 500, 100),
                                        (0, 500, 0), (40, 500, 2 << 20), (10, 20, 2500)]:
            plain = [tuple(row[name] for name in REPLAY_COLUMNS) for row in store.event_page(
                ROOM, since=since, latest_seq=40, limit=limit, max_bytes=max_bytes)]
            rows, total = store.replay_rows(ROOM, since=since, latest_seq=40, limit=limit,
                                            max_bytes=max_bytes, max_event_bytes=1000)
            assert [row[:8] for row in rows] == plain
            assert total == sum(len("".join(row[i] for i in (2, 3, 4, 6)).encode()) for row in plain)
            head, page_rows_, page_total = store.read_page(ROOM, since=since, limit=limit,
                                                           max_bytes=max_bytes, max_event_bytes=1000)
            assert head == store.room_head(ROOM)
            assert ([row[:8] for row in page_rows_], page_total) == (plain, total)
        assert store.read_page("absent", since=0, limit=5, max_bytes=100, max_event_bytes=10) == (
            None, [], 0)


_ANY_FLOAT = st.one_of(_FLOAT, st.sampled_from((float("inf"), float("-inf"), float("nan"))))
_ANY_VALUE = st.recursive(st.one_of(_SCALAR, _ANY_FLOAT), lambda inner: st.one_of(
    st.lists(inner, max_size=4), st.dictionaries(_TEXT, inner, max_size=4)), max_leaves=16)


@settings(max_examples=300, deadline=None)
@given(_ANY_VALUE)
def test_the_measured_size_is_the_serialized_size(value: Any) -> None:
    """The cut of a page is found by measuring its events (rows._json_size) instead of serialising prefixes: each
    measure is the length json.dumps writes, or the value is left to the exact rule (never a wrong number)."""
    written = json.dumps(value, ensure_ascii=False, separators=(",", ":"))
    try:
        measured = page_rows._json_size(value)
    except page_rows._NoSize:
        assert page_rows._NEEDS_ESCAPE(written) is not None  # only a string needing an escape is left unmeasured
        return
    assert measured == len(written.encode("utf-8"))
    text = json.dumps(value, ensure_ascii=False, separators=(",", ":"))
    if "\\" not in text:  # decoded from a backslash-free text: measured without looking for escapes
        assert page_rows._json_size(json.loads(text), plain=True) == measured


def test_a_cut_page_is_measured_not_searched(engine: Engine, monkeypatch: pytest.MonkeyPatch) -> None:
    """A page cut by the byte budget (events of 10 KB, a 2 MB page) is found without the exact rule's search:
    fit_page does not run, and the page is the plain path's."""
    only_room(engine, ROOM, GATEWAY)
    batch = [{"event_id": f"e{n}", "kind": "message.user", "actor": {"kind": "user", "id": "u1"},
              "payload": {"text": "x" * 10_000}} for n in range(100)]
    for first in range(0, 300, 100):
        rooms.append_events(engine, ROOM, [dict(event, event_id=f"e{first + n}") for n, event in enumerate(batch)],
                            GATEWAY, 1)
    plain = read_events_exact(engine, room_id=ROOM, since_seq=0, limit=500)
    searched: list[int] = []
    exact = page_rows.fit_page

    def counting(*args: Any, **kwargs: Any) -> Any:
        searched.append(1)
        return exact(*args, **kwargs)

    monkeypatch.setattr(page_rows, "fit_page", counting)
    page = rooms.read_events(engine, room_id=ROOM, since_seq=0, limit=500)
    assert plain["has_more"] and page == plain and not searched

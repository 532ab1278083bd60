"""A batch append stores exactly what the same events appended one by one store (issue 14, section 2).

``append_events`` validates each distinct actor once per batch. That memo used to be keyed by ``id(actor)``: with
item Mappings that build a fresh actor dict on each access, a freed dict's id is reused by the next one, and a
later event was stored under an earlier event's author.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from functools import partial
from typing import Any

import pytest
import sqlalchemy as sa
from apis import use_api
from factories import make_room
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sqlalchemy import Engine

from hostedrooms import models, rooms
from hostedrooms.errors import HostedRoomError

_api = use_api("rooms")  # the tests on a database run on both APIs

GATEWAY = "install:gw-a"
AUTHORS = ("alice", "bob", "carol", "dave", "erin", "frank")


_room = partial(make_room, gateway=GATEWAY, members=[], now=1.0)


def _stored(engine: Engine, room_id: str) -> list[tuple[Any, ...]]:
    table = models.events
    with engine.connect() as connection:
        return [tuple(row) for row in connection.execute(
            sa.select(table.c.seq, table.c.event_id, table.c.kind, table.c.actor_json, table.c.payload_json,
                      table.c.authority_epoch).where(table.c.room_id == room_id).order_by(table.c.seq))]


class FreshActorItem(Mapping[str, Any]):
    """An event item whose ``actor`` is a new dict on every access (as a view over another model would be)."""

    def __init__(self, event_id: str, author: str, display_name: str | None = None, kind: str = "message.user",
                 text: str | None = None) -> None:
        self._event_id, self._author, self._display_name = event_id, author, display_name
        self._kind, self._text = kind, f"from {author}" if text is None else text

    def _fields(self) -> dict[str, Any]:
        actor: dict[str, Any] = {"kind": "user", "id": self._author}
        if self._display_name is not None:
            actor["display_name"] = self._display_name
        return {"event_id": self._event_id, "kind": self._kind, "actor": actor, "payload": {"text": self._text}}

    def __getitem__(self, key: str) -> Any:
        return self._fields()[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._fields())

    def __len__(self) -> int:
        return 4


# Regression: 4 of 6 events were stored under another item's author (the memo was keyed by id(actor)).
def test_items_building_fresh_actors_keep_their_own_authors(engine: Engine) -> None:
    _room(engine, "r1")
    items = [FreshActorItem(f"e{index}", author) for index, author in enumerate(AUTHORS * 3)]
    result = rooms.append_events(engine, "r1", items, GATEWAY, 1, now=2.0)
    assert [event["actor"]["id"] for event in result] == list(AUTHORS * 3)
    stored = _stored(engine, "r1")
    assert [actor_json for _, _, _, actor_json, _, _ in stored] == [
        f'{{"id":"{author}","kind":"user"}}' for author in AUTHORS * 3]
    assert [payload for *_, payload, _ in stored] == [f'{{"text":"from {author}"}}' for author in AUTHORS * 3]


class SharedActorItem(Mapping[str, Any]):
    """An event item that rewrites one shared actor dict in place on each access (same object, new content)."""

    shared: dict[str, Any] = {"kind": "user", "id": "nobody"}

    def __init__(self, event_id: str, author: str) -> None:
        self._event_id, self._author = event_id, author

    def __getitem__(self, key: str) -> Any:
        if key == "actor":
            self.shared["id"] = self._author
            return self.shared
        return {"event_id": self._event_id, "kind": "message.user", "payload": {"n": self._event_id}}[key]

    def __iter__(self) -> Iterator[str]:
        return iter(("event_id", "kind", "actor", "payload"))

    def __len__(self) -> int:
        return 4


# Regression: the same dict object with new content must not reuse the first validation.
def test_an_actor_object_changed_between_items_is_validated_again(engine: Engine) -> None:
    _room(engine, "r1")
    items = [SharedActorItem(f"e{index}", author) for index, author in enumerate(AUTHORS)]
    result = rooms.append_events(engine, "r1", items, GATEWAY, 1, now=2.0)
    assert [event["actor"]["id"] for event in result] == list(AUTHORS)
    assert [actor_json for _, _, _, actor_json, _, _ in _stored(engine, "r1")] == [
        f'{{"id":"{author}","kind":"user"}}' for author in AUTHORS]


class HostileStr(str):
    """A str subclass whose equality and hash lie (every instance equals every other)."""

    def __eq__(self, other: object) -> bool:
        return isinstance(other, str)

    def __hash__(self) -> int:
        return 0


def test_actors_that_could_lie_to_a_memo_are_not_memoised(engine: Engine) -> None:
    _room(engine, "r1")
    items = [{"event_id": f"e{index}", "kind": "message.user", "actor": {"kind": "user", "id": HostileStr(author)},
              "payload": {}} for index, author in enumerate(AUTHORS)]
    result = rooms.append_events(engine, "r1", items, GATEWAY, 1, now=2.0)
    assert [event["actor"]["id"] for event in result] == list(AUTHORS)


# --- property: a batch == the same events one by one -------------------------------------------------------------

# Mostly valid items (so most batches succeed and are compared), sometimes a refusal, a replay or a conflict.
kinds = st.sampled_from(["message.user"] * 16 + ["turn.started", "Bad Kind"])
authors = st.sampled_from(["alice", "bob", "carol", "dave", " alice ", "install:gw-b"])
names = st.sampled_from([None] * 6 + ["Alice", " Alice ", "", "x" * 201])
texts = st.sampled_from(["hi", "hello", "é"])


@st.composite
def batch_items(draw: st.DrawFn) -> list[Any]:
    items: list[Any] = []
    for index in range(draw(st.integers(min_value=1, max_value=12))):
        event_id = "e0" if draw(st.integers(min_value=0, max_value=9)) == 0 else f"e{index}"
        kind, name, text = draw(kinds), draw(names), draw(texts)
        if kind == "turn.started":  # a gateway actor: its id must be the batch's gateway (sometimes it is not)
            author = draw(st.sampled_from([GATEWAY, GATEWAY, "install:gw-b"]))
            items.append({"event_id": event_id, "kind": kind, "actor": {"kind": "gateway", "id": author},
                          "payload": {"text": text}})
        elif draw(st.booleans()):
            items.append(FreshActorItem(event_id, draw(authors), name, kind, text))
        else:
            actor: dict[str, Any] = {"kind": "user", "id": draw(authors)}
            if name is not None:
                actor["display_name"] = name
            items.append({"event_id": event_id, "kind": kind, "actor": actor, "payload": {"text": text}})
    return items


def _empty(engine: Engine) -> None:
    with engine.begin() as connection:
        for table in reversed(models.metadata.sorted_tables):
            connection.execute(sa.delete(table))


def test_a_batch_stores_what_single_appends_store(engine: Engine) -> None:
    @settings(max_examples=50, deadline=None, database=None,
              suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
    @given(batch_items())
    def check(items: list[Any]) -> None:
        _empty(engine)
        _room(engine, "batch")
        _room(engine, "single")
        try:
            rooms.append_events(engine, "batch", items, GATEWAY, 1, now=5.0)
        except HostedRoomError as exc:
            batch_error: type[HostedRoomError] | None = type(exc)
        else:
            batch_error = None
        single_error: type[HostedRoomError] | None = None
        for item in items:
            try:
                rooms.append_event(engine, room_id="single", event_id=item["event_id"], kind=item["kind"],
                                   actor=item["actor"], payload=item["payload"], authority_gateway_id=GATEWAY,
                                   authority_epoch=1, now=5.0)
            except HostedRoomError as exc:
                single_error = type(exc)
                break
        if batch_error is not None:
            # All or nothing: the batch wrote nothing, and one by one some item is refused too (a batch validates
            # every item before it looks for conflicts, so which refusal comes first may differ).
            assert _stored(engine, "batch") == []
            assert single_error is not None
        else:
            assert single_error is None
            assert _stored(engine, "batch") == _stored(engine, "single")

    check()


@pytest.mark.parametrize("count", [1, 100])
def test_batch_results_name_each_items_own_actor(engine: Engine, count: int) -> None:
    """The returned dicts too: each event's actor is its item's normalised actor."""
    _room(engine, "r1")
    items = [{"event_id": f"e{index}", "kind": "message.user",
              "actor": {"kind": "user", "id": AUTHORS[index % len(AUTHORS)], "display_name": f" n{index} "},
              "payload": {}} for index in range(count)]
    result = rooms.append_events(engine, "r1", items, GATEWAY, 1, now=2.0)
    assert [event["actor"] for event in result] == [
        {"kind": "user", "id": AUTHORS[index % len(AUTHORS)], "display_name": f"n{index}"} for index in range(count)]

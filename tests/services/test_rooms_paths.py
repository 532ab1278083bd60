"""The store's one-statement append and the full path agree on every outcome, on both backends.

Each generated example runs one sequence of room operations three times on an emptied database: once as the
services run it (the one-statement append first, with no unit of work around it: on PostgreSQL on the thread's
held autocommit connection, on SQLite on the held writer), once with
:func:`hostedrooms.held_autocommit.without_held_connections` and :func:`hostedrooms.writer.without_lone_appends`
(the one-statement append in a unit of work), once with :meth:`RoomStore.without_one_statement`, so every append
takes the full path. The runs must
return the same results, raise the same errors with the same messages (so the same precedence) and leave the same
rows. Sequences mix fresh appends, batches, replays, conflicting ids, repeated
ids within a batch, stale and moved authority, control kinds, disbanded rooms, absent rooms, and limits lowered
near the edge the sequence reaches.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from typing import Any

import pytest
import sqlalchemy as sa
from apis import use_api
from factories import lowered, snapshot
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sqlalchemy import Engine

from hostedrooms import held_autocommit, models, rooms, writer
from hostedrooms.backends import backend_for
from hostedrooms.errors import HostedRoomError
from hostedrooms.store import RoomStore, room_store

_api = use_api("rooms")  # the tests on a database run on both APIs

ROOMS = ("r1", "r2", "r3")  # r3 never exists
GATEWAYS = ("g1", "g2")
EVENT_IDS = tuple(f"e{n}" for n in range(1, 9))
TEXTS = ("a", "a", "bb", "c" * 40)



# --- generated operations ------------------------------------------------------------------------------------

def _item(kind: str, actor: str, event_id: str, text: str) -> dict[str, Any]:
    """One event item; a ``gateway`` actor takes the operation's authority gateway id when it runs."""
    actors = {"user": {"kind": "user", "id": "u1"}, "gateway": {"kind": "gateway"},
              "other-gateway": {"kind": "gateway", "id": "g9"}}
    return {"event_id": event_id, "kind": kind, "actor": actors[actor], "payload": {"text": text}}


def _authored(item: dict[str, Any], gateway: str) -> dict[str, Any]:
    return item if "id" in item["actor"] else {**item, "actor": {**item["actor"], "id": gateway}}


# Weighted choices: mostly admissible operations on the live rooms at their current authority, so sequences reach
# the limits; the rest are refused by the rules, stale, conflicting, or aimed at absent or disbanded rooms.
KINDS = (*(("message.user", "user"),) * 8, *(("turn.started", "gateway"),) * 3,
         *(("room.stop_requested", "gateway"),) * 3, ("message.user", "gateway"), ("turn.started", "other-gateway"),
         ("authority.lost", "gateway"))
AUTHORITIES = (*(("g1", 1),) * 8, ("g2", 1), ("g1", 2), ("g2", 2))


def _operation(rng: random.Random) -> tuple[Any, ...]:
    def item() -> dict[str, Any]:
        return _item(*rng.choice(KINDS), rng.choice(EVENT_IDS), rng.choice(TEXTS))

    room = rng.choice(ROOMS) if rng.random() < 0.1 else rng.choice(ROOMS[:2])
    authority = rng.choice(AUTHORITIES)
    roll = rng.random()
    if roll < 0.6:
        return ("append", room, authority, item())
    if roll < 0.85:
        return ("batch", room, authority, [item() for _ in range(rng.randint(1, 4))])
    if roll < 0.95:
        return ("claim", room, authority, rng.choice(("c1", "c2")))
    return ("disband", room, authority, None)


def _limits(rng: random.Random) -> Any:
    if rng.random() < 0.25:
        return None
    return lowered(
        MAX_EVENTS_PER_ROOM=rng.randint(0, 12), MAX_ROOM_EVENT_BYTES=rng.randint(0, 1000),
        MAX_GATEWAY_EVENT_BYTES=rng.randint(0, 500), CONTROL_EVENT_COUNT_RESERVE=rng.randint(0, 2),
        CONTROL_EVENT_BYTE_RESERVE=rng.randint(0, 200), MAX_EVENT_JSON_BYTES=rng.choice((20, 4096, 4096, 4096)))


def _run(engine: Engine, operation: tuple[Any, ...], lim: Any, now: float) -> Any:
    name, room_id, (gateway, epoch), detail = operation
    if name == "append":
        return rooms.append_event(engine, room_id=room_id, **_authored(detail, gateway), authority_gateway_id=gateway,
                                  authority_epoch=epoch, now=now, limits=lim)
    if name == "batch":
        items = [_authored(item, gateway) for item in detail]
        return rooms.append_events(engine, room_id, items, gateway, epoch, now, limits=lim)
    if name == "claim":
        other = GATEWAYS[1 - GATEWAYS.index(gateway)]
        return rooms.claim_authority(engine, room_id=room_id, expected_gateway_id=gateway, expected_epoch=epoch,
                                     new_gateway_id=other, event_id=detail, now=now, limits=lim)
    return rooms.disband_room(engine, room_id=room_id, expected_gateway_id=gateway, expected_epoch=epoch, now=now,
                              limits=lim)


def _outcomes(engine: Engine, operations: list[tuple[Any, ...]], lim: Any) -> list[Any]:
    """Each operation's result, or its error's class and message."""
    outcomes: list[Any] = []
    for index, operation in enumerate(operations):
        try:
            outcomes.append(_run(engine, operation, lim, now=2000.0 + index))
        except HostedRoomError as exc:
            outcomes.append((type(exc).__name__, str(exc)))
    return outcomes



def _fresh(engine: Engine, lim: Any = None) -> None:
    """Empty the room log, then two live rooms owned by g1 at epoch 1, and the gateway budget spread for ``lim``
    (as the first write holding every budget shard leaves it; pruning takes them all)."""
    with engine.begin() as connection:
        for table in reversed(models.metadata.sorted_tables):
            connection.execute(sa.delete(table))
    for room_id in ROOMS[:2]:
        rooms.create_room(engine, room_id=room_id, name=room_id, members=[], authority_gateway_id="g1", now=1000.0)
    rooms.prune_disbanded_rooms(engine, limits=lim)


@contextmanager
def _in_units() -> Iterator[None]:
    """The one-statement append in a unit of work (no held autocommit connection, no lone append on the writer)."""
    with held_autocommit.without_held_connections(), writer.without_lone_appends():
        yield


def _every_way(
    engine: Engine, store: RoomStore, operations: list[tuple[Any, ...]], lim: Any
) -> Iterator[tuple[list[Any], dict[str, list[tuple[Any, ...]]]]]:
    """The outcomes and rows of ``operations`` run as the services run them (held connection), on a pooled unit of
    work's one-statement append, and on the full path only."""
    contexts: tuple[Callable[[], AbstractContextManager[None]], ...] = (
        nullcontext, _in_units, store.without_one_statement)
    for context in contexts:
        _fresh(engine, lim)
        with context():
            outcomes = _outcomes(engine, operations, lim)
        yield outcomes, snapshot(engine, (models.rooms, models.events, models.retired_ids))


@pytest.fixture
def counted(engine: Engine, monkeypatch: pytest.MonkeyPatch) -> dict[str, int]:
    """How often the one-statement append applied and declined while the test ran."""
    store_class = type(room_store(backend_for(engine)))  # every unit binds its own copy: count on the class
    counts = {"applied": 0, "declined": 0}
    original = store_class.append_one_statement

    def counting(self: RoomStore, *args: Any, **kwargs: Any) -> Any:
        rows = original(self, *args, **kwargs)
        counts["applied" if rows is not None else "declined"] += 1
        return rows

    monkeypatch.setattr(store_class, "append_one_statement", counting)
    return counts


def test_one_statement_and_full_appends_agree_on_generated_sequences(
    engine: Engine, counted: dict[str, int], api: Any
) -> None:
    store = room_store(backend_for(engine))

    # The asyncio API runs the same store code: fewer examples show it gives the same outcomes.
    @settings(max_examples=100 if api.name == "sync" else 25, deadline=None, database=None,
              suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
    @given(st.randoms(use_true_random=False))
    def agree(rng: random.Random) -> None:
        operations = [_operation(rng) for _ in range(rng.randint(1, 20))]
        lim = _limits(rng)
        (held, held_rows), (pooled, pooled_rows), (full, full_rows) = _every_way(engine, store, operations, lim)
        assert held == pooled == full
        assert held_rows == pooled_rows == full_rows

    agree()
    # Both branches ran: the comparison is not vacuous.
    assert counted["applied"] > 0 and counted["declined"] > 0, counted


def test_without_one_statement_really_takes_the_full_path(engine: Engine, counted: dict[str, int]) -> None:
    store = room_store(backend_for(engine))
    operations = [("append", "r1", ("g1", 1), _item("message.user", "user", "e1", "a"))]
    (held, _), (pooled, _), (full, _) = _every_way(engine, store, operations, None)
    assert counted == {"applied": 2, "declined": 0}
    assert held == pooled == full and held[0]["seq"] == 1


@pytest.mark.parametrize(("operations", "lim", "expected"), [
    # Conflict beats stale authority, a disbanded room and full limits; replays are answered before the limits.
    ([("append", "r1", ("g1", 1), _item("message.user", "user", "e1", "a")),
      ("disband", "r1", ("g1", 1), None),
      ("append", "r1", ("g2", 2), _item("message.user", "user", "e1", "bb"))],
     lowered(MAX_EVENTS_PER_ROOM=1), ("EventConflictError", "event_id already exists with different content")),
    ([("append", "r1", ("g1", 1), _item("message.user", "user", "e1", "a")),
      ("append", "r1", ("g1", 1), _item("message.user", "user", "e1", "a"))],
     lowered(MAX_EVENTS_PER_ROOM=1), "idempotent"),
    # Stale authority beats the limits.
    ([("append", "r1", ("g2", 1), _item("message.user", "user", "e1", "a"))],
     lowered(MAX_EVENTS_PER_ROOM=0), ("AuthorityConflictError", "stale hosted room authority")),
    # A control kind may use the reserve the room's user limit no longer leaves.
    ([("append", "r1", ("g1", 1), _item("room.stop_requested", "gateway", "e1", "a"))],
     lowered(MAX_EVENTS_PER_ROOM=0, CONTROL_EVENT_COUNT_RESERVE=1), "written"),
])
def test_one_statement_and_full_agree_on_precedence_cases(
    engine: Engine, operations: list[tuple[Any, ...]], lim: Any, expected: Any
) -> None:
    store = room_store(backend_for(engine))
    (held, held_rows), (pooled, pooled_rows), (full, full_rows) = _every_way(engine, store, operations, lim)
    assert held == pooled == full and held_rows == pooled_rows == full_rows
    last = held[-1]
    if expected == "idempotent":
        assert last["idempotent"] is True
    elif expected == "written":
        assert last["idempotent"] is False
    else:
        assert last == expected

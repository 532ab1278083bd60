"""The gateway budget's arithmetic at every gateway limit a host may set: the settle statement adds numbers the
driver binds (psycopg sends each int in the narrowest integer type that holds it, and PostgreSQL then adds
smallints or integers in their own width), so every bound number of the budget's SQL is a 64-bit integer.

Appends (single and a batch), disband and prune run at a small limit (a few KB), at limits where the settled
allowance passes the smallint and the integer ranges while each bound number fits them, at the default, and at
2**62; the budget stays what the rooms hold (``verify`` clean).
"""

from __future__ import annotations

from typing import Any

import pytest
import sqlalchemy as sa
from factories import USER, lowered
from sqlalchemy import Engine

from hostedrooms import integrity, models, rooms
from hostedrooms.limits import LimitValues

LOCAL = "install:gw-local"
TEXT = "x" * 900  # about 1 KB an event

#: The gateway limits: a small one; the shard 0 allowance (total + share) past 32767 with both below it; past
#: 2**31 - 1 with both below it (the share just below, the total a few KB); the default; the largest bound here.
LIMITS = {"4 KB": 4096, "200 KB": 200_000, "near 16 GiB": 8 * (2**31 - 100), "default": 16 * 1024 * 1024,
          "2**62": 2**62}


def _event(n: int) -> dict[str, Any]:
    return {"event_id": f"e{n}", "kind": "message.user", "actor": dict(USER), "payload": {"text": TEXT}}


def _append(engine: Engine, room_id: str, n: int, limits: LimitValues) -> None:
    rooms.append_events(engine, room_id, [_event(n)], authority_gateway_id=LOCAL, authority_epoch=1,
                        limits=limits)


def _held(engine: Engine) -> tuple[int, int]:
    """The budget's used bytes, and what the rooms hold."""
    with engine.connect() as connection:
        used = connection.execute(sa.select(sa.func.coalesce(sa.func.sum(models.budget.c.used), 0))).scalar_one()
        held = connection.execute(sa.select(sa.func.coalesce(sa.func.sum(models.rooms.c.event_bytes), 0))
                                  ).scalar_one()
    return int(used), int(held)


@pytest.mark.parametrize("limit", list(LIMITS.values()), ids=list(LIMITS))
def test_appends_disband_and_prune_keep_the_budget_at_any_gateway_limit(engine: Engine, limit: int) -> None:
    limits = lowered(MAX_GATEWAY_EVENT_BYTES=limit, CONTROL_EVENT_BYTE_RESERVE=2048,
                     DISBANDED_ROOM_RETENTION_SECONDS=60)
    fits = min(20, limit // 1100 - 1)  # events of about 1 KB the gateway takes (the small limit: two)
    for room_id in ("r1", "r2"):
        rooms.create_room(engine, room_id=room_id, name="Team", members=[], authority_gateway_id=LOCAL,
                          now=1000.0, limits=limits)
    for n in range(fits // 2):
        _append(engine, "r1", n, limits)
    rooms.append_events(engine, "r2", [_event(n) for n in range(100, 100 + fits - fits // 2)],
                        authority_gateway_id=LOCAL, authority_epoch=1, limits=limits)
    assert integrity.verify(engine) == []
    rooms.disband_room(engine, room_id="r1", expected_gateway_id=LOCAL, expected_epoch=1, now=2000.0,
                       limits=limits)
    assert integrity.verify(engine) == []
    assert rooms.prune_disbanded_rooms(engine, now=5000.0, limits=limits) == 1
    used, held = _held(engine)
    assert used == held > 0 and integrity.verify(engine) == []
    # The freed bytes are the gateway's again: r1's appends fit once more, in r2.
    for n in range(fits // 2):
        _append(engine, "r2", 200 + n, limits)
    assert integrity.verify(engine) == []
    assert rooms.room_state(engine, room_id="r2")["latest_seq"] == fits

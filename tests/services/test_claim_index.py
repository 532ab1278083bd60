"""room_state's claim lookup: the same claim as a plain walk of the log, served by the partial claim index.

The index makes ``room_state`` (and ``follow(since_seq>0)`` and the standby's room info, which call it) cost the
same at any log length; these tests pin that the lookup is answered from the index on both backends and that it
returns exactly what walking the log returns, claims at several epochs, interleaved with other events.
"""

from __future__ import annotations

from typing import Any

import factories
import sqlalchemy as sa
from sqlalchemy import Engine

from hostedrooms import models, rooms
from hostedrooms.store.rooms import base as store_base

A, B = factories.A, factories.B


def _plain_claim(engine: Engine, room_id: str, epoch: int) -> dict[str, Any] | None:
    """The latest claim of ``epoch`` by walking every event of the room (no index can change this answer)."""
    events = models.events
    with engine.connect() as connection:
        rows = connection.execute(sa.select(events).where(events.c.room_id == room_id)).mappings().all()
    claims = [row for row in rows if row["kind"] == "authority.claimed" and row["authority_epoch"] == epoch]
    return dict(max(claims, key=lambda row: row["seq"])) if claims else None


def test_room_state_claim_equals_the_plain_walk(engine: Engine) -> None:
    rooms.create_room(engine, room_id="r1", name="R", members=[], authority_gateway_id=A)
    gateways = [A, B]
    for epoch in range(1, 5):
        gateway = gateways[(epoch - 1) % 2]
        for n in range(3):
            factories.message(engine, "r1", f"m{epoch}-{n}", gateway=gateway, epoch=epoch)
        state = rooms.room_state(engine, room_id="r1")
        plain = _plain_claim(engine, "r1", epoch)
        if plain is None:
            assert "authority_claim" not in state
        else:
            assert state["authority_claim"]["event_id"] == plain["event_id"]
            assert state["authority_claim"]["seq"] == plain["seq"]
        rooms.claim_authority(engine, room_id="r1", expected_gateway_id=gateway, expected_epoch=epoch,
                              new_gateway_id=gateways[epoch % 2], event_id=f"claim-{epoch + 1}")
        state = rooms.room_state(engine, room_id="r1")
        plain = _plain_claim(engine, "r1", epoch + 1)
        assert plain is not None and state["authority_claim"]["event_id"] == plain["event_id"] == f"claim-{epoch + 1}"
        assert state["authority_claim"]["seq"] == plain["seq"]


def test_the_claim_lookup_is_served_by_the_claim_index(engine: Engine) -> None:
    """The compiled lookup can use ``idx_hosted_room_events_claims`` (a bound kind would hide the partial index)."""
    statement = store_base._CLAIM_EVENT
    params = {"room_id": "r1", "epoch": 1}
    with engine.connect() as connection:
        compiled = statement.compile(dialect=connection.dialect)
        values = compiled.construct_params(params)
        if connection.dialect.name == "sqlite":
            positional = tuple(values[name] for name in compiled.positiontup or ())
            plan = connection.exec_driver_sql(f"EXPLAIN QUERY PLAN {compiled.string}", positional).all()
            text = " ".join(str(row[-1]) for row in plan)
        else:
            connection.exec_driver_sql("SET LOCAL enable_seqscan = off")  # tiny tables: make the choice visible
            plan = connection.exec_driver_sql(f"EXPLAIN {compiled.string}", values).all()
            text = " ".join(str(row[0]) for row in plan)
    assert "idx_hosted_room_events_claims" in text, text

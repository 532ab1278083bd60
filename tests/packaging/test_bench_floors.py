"""The benchmark's floor contenders (bench/contenders/) do exactly the work hostedrooms' append does.

The README reads issue #16's targets against these floors: hostedrooms' own append statements through the raw
driver; its validation and statements on a bare SQLAlchemy Connection, with and without the validation, and on
the pool's DB-API connection. They are only floors if they store what hostedrooms stores: the same event rows at
the same seqs, and the same room accounting. Each one runs a few appends and batches beside hostedrooms itself,
on both backends, and the stored rows are compared.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

from bench.common import Context
from bench.contenders import (
    WORKLOADS,
    Contender,
    Hostedrooms,
    PooledDBAPIFloor,
    RawOwnStatements,
    SQLAlchemyFloor,
    SQLAlchemyStatements,
)
from hostedrooms import limits, testing

FLOORS = (RawOwnStatements, SQLAlchemyFloor, SQLAlchemyStatements, PooledDBAPIFloor)
CALLS = {"append": 3, "batch100": 2}


@pytest.fixture
def context(request: pytest.FixtureRequest, backend: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Context:
    # The contenders raise the room limits for long benchmark rounds: put them back after the test.
    for name in ("MAX_EVENTS_PER_ROOM", "MAX_GATEWAY_EVENT_BYTES", "MAX_ROOM_EVENT_BYTES"):
        monkeypatch.setattr(limits, name, getattr(limits, name))
    url = request.getfixturevalue("pg_admin_url") if backend == "postgresql" else None
    return Context(url=url, folder=str(tmp_path), synchronous="FULL", quick=True)


def _stored(context: Context, kind: type[Contender], workload: str) -> tuple[list[tuple[Any, ...]], tuple[Any, ...]]:
    """Run ``kind`` on ``workload`` for a few calls in a fresh database; its room's event rows and accounting."""
    contender: Any = kind(context, WORKLOADS[workload], {})
    contender.state = contender.prepare()
    target = contender.state["target"]
    try:
        contender.open(0)
        try:
            for index in range(CALLS[workload]):
                getattr(contender, WORKLOADS[workload].method)(index)
        finally:
            contender.close()
        with testing.open_engine(target) as engine, engine.connect() as connection:
            events = connection.execute(sa.text(
                "SELECT seq, event_id, kind, actor_json, authority_epoch, payload_json FROM hosted_room_events "
                "WHERE room_id = 'round-0' ORDER BY seq")).all()
            room = connection.execute(sa.text(
                "SELECT next_seq, event_bytes, authority_gateway_id, authority_epoch FROM hosted_rooms "
                "WHERE room_id = 'round-0'")).one()
        return [tuple(row) for row in events], tuple(room)
    finally:
        if context.url is not None:
            testing.drop_database(context.url, str(sa.make_url(target).database))


@pytest.mark.parametrize("workload", sorted(CALLS))
def test_each_floor_stores_what_hostedrooms_stores(context: Context, workload: str) -> None:
    expected = _stored(context, Hostedrooms, workload)
    assert len(expected[0]) == CALLS[workload] * WORKLOADS[workload].batch
    floors = [kind for kind in FLOORS if kind.supports(WORKLOADS[workload], context.dialect)]
    assert RawOwnStatements in floors
    for kind in floors:
        assert _stored(context, kind, workload) == expected, kind.name

"""A host table with a foreign key to ``hosted_rooms``: the supported patterns (README, "Inside your application's
Alembic"), on both backends.

Pruning purges a disbanded room's row. A host key with ``ON DELETE CASCADE`` loses its rows with the room, one with
``ON DELETE SET NULL`` keeps them unlinked; a plain key refuses the purge, which then fails whole
(``StoreIntegrityError``, nothing pruned). The host declares its key against hostedrooms' own ``Table`` (a
``MetaData`` of its own, or hostedrooms' tables inside its ``target_metadata``).
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import sqlalchemy as sa
from sqlalchemy import Engine

from hostedrooms import models, rooms
from hostedrooms.errors import RoomNotFoundError, StoreIntegrityError

GATEWAY = "install:host"


@pytest.fixture
def host_tables(engine: Engine) -> Iterator[sa.MetaData]:
    """The host's own MetaData, its tables dropped after the test (a PostgreSQL test database is reused)."""
    metadata = sa.MetaData()
    yield metadata
    metadata.drop_all(engine)


def _host_table(engine: Engine, metadata: sa.MetaData, ondelete: str | None) -> sa.Table:
    orders = sa.Table(
        "host_orders", metadata,
        sa.Column("id", sa.Integer, primary_key=True),
        sa.Column("room_id", sa.Text, sa.ForeignKey(models.rooms.c.room_id, ondelete=ondelete), nullable=True))
    metadata.create_all(engine)
    return orders


def _disbanded_room_with_an_order(engine: Engine, orders: sa.Table) -> None:
    rooms.create_room(engine, room_id="r1", name="R", members=[], authority_gateway_id=GATEWAY)
    with engine.begin() as connection:
        connection.execute(sa.insert(orders).values(id=1, room_id="r1"))
    rooms.disband_room(engine, room_id="r1", expected_gateway_id=GATEWAY, expected_epoch=1, now=100.0)


def _orders(engine: Engine, orders: sa.Table) -> list[tuple[int, str | None]]:
    with engine.connect() as connection:
        return [tuple(row) for row in connection.execute(sa.select(orders.c.id, orders.c.room_id))]


@pytest.mark.parametrize(("ondelete", "left"), [("CASCADE", []), ("SET NULL", [(1, None)])])
def test_a_host_key_with_on_delete_lets_pruning_purge(
        engine: Engine, host_tables: sa.MetaData, ondelete: str, left: list[object]) -> None:
    orders = _host_table(engine, host_tables, ondelete)
    _disbanded_room_with_an_order(engine, orders)
    assert rooms.prune_disbanded_rooms(engine, now=100.0 + 10**9) == 1
    assert _orders(engine, orders) == left
    with pytest.raises(RoomNotFoundError):
        rooms.room_state(engine, room_id="r1", include_disbanded=True)


def test_a_plain_host_key_refuses_the_purge_whole(engine: Engine, host_tables: sa.MetaData) -> None:
    orders = _host_table(engine, host_tables, None)
    _disbanded_room_with_an_order(engine, orders)
    with pytest.raises(StoreIntegrityError):
        rooms.prune_disbanded_rooms(engine, now=100.0 + 10**9)
    assert _orders(engine, orders) == [(1, "r1")]
    assert rooms.room_state(engine, room_id="r1", include_disbanded=True)["disbanded_at"] == 100.0


def test_a_string_key_in_a_target_metadata_holding_hostedrooms_tables(engine: Engine) -> None:
    """A host whose ``target_metadata`` holds hostedrooms' tables (copied in, as the host Alembic docs show for
    declaring such keys) names the key by string; ``create_all`` of its own table and pruning work as above, and
    hostedrooms' tables are neither created nor changed by it."""
    metadata = sa.MetaData()
    for table in models.metadata.sorted_tables:
        table.to_metadata(metadata)
    orders = sa.Table(
        "host_orders", metadata,
        sa.Column("id", sa.Integer, primary_key=True),
        sa.Column("room_id", sa.Text, sa.ForeignKey("hosted_rooms.room_id", ondelete="CASCADE"), nullable=True))
    orders.create(engine)
    try:
        _disbanded_room_with_an_order(engine, orders)
        assert rooms.prune_disbanded_rooms(engine, now=100.0 + 10**9) == 1
        assert _orders(engine, orders) == []
    finally:
        orders.drop(engine)

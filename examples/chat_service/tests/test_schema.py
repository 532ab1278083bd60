"""The service's own table beside hostedrooms': its history matches its models, and its key lets hostedrooms
prune a disbanded room (the webhook row goes with it)."""

from __future__ import annotations

import pytest
import sqlalchemy as sa
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from hostedrooms import aio, migrate
from sqlalchemy.ext.asyncio import AsyncEngine

from chat_service.models import metadata, webhooks
from conftest import GATEWAY

pytestmark = pytest.mark.anyio


def _differences(connection: sa.Connection) -> list[object]:
    context = MigrationContext.configure(connection, opts={
        "include_name": migrate.host_include_name, "include_object": migrate.host_include_object})
    return list(compare_metadata(context, metadata))


async def test_the_history_matches_the_models_and_hostedrooms_is_at_head(
        hostedrooms_async_engine: AsyncEngine) -> None:
    async with hostedrooms_async_engine.connect() as connection:
        assert await connection.run_sync(_differences) == []  # what `alembic check` checks
    assert await aio.migrate.is_at_head(hostedrooms_async_engine)


async def test_pruning_a_disbanded_room_deletes_its_webhook(hostedrooms_async_engine: AsyncEngine) -> None:
    engine = hostedrooms_async_engine
    await aio.rooms.create_room(engine, room_id="r1", name="R", members=[], authority_gateway_id=GATEWAY)
    async with aio.AsyncUnitOfWork(engine) as uow:
        await uow.execute(sa.insert(webhooks).values(room_id="r1", url="https://hooks.example/r1"))
        await uow.commit()
    await aio.rooms.disband_room(engine, room_id="r1", expected_gateway_id=GATEWAY, expected_epoch=1, now=100.0)
    assert await aio.rooms.prune_disbanded_rooms(engine, now=100.0 + 10**9) == 1
    async with aio.AsyncUnitOfWork(engine, write=False) as uow:
        assert (await uow.execute(sa.select(sa.func.count()).select_from(webhooks))).scalar_one() == 0

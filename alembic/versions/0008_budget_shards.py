"""the gateway byte budget as escrow shards; no duplicate cursor index on PostgreSQL

Creates ``hosted_room_budget`` and fills it in place: shard 0 holds every room's ``event_bytes`` (live and
disbanded) with no free allowance and no spread limit yet, so the first append takes the full path, which spreads
the free bytes for the limits it was given. PostgreSQL gets 8 shards, SQLite one counter row. On PostgreSQL it
also drops ``idx_hosted_room_events_cursor``, which repeats the primary key (room_id, seq); SQLite keeps it, since
the reference's readiness check asks for it by name.

Revision ID: 0008_budget_shards
Revises: 0007_claim_index
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import sqlalchemy as sa
from alembic import op
from alembic.util import load_python_file

# Frozen code only, never hostedrooms.models (see frozen/__init__.py).
schema = load_python_file(Path(__file__).parent / "frozen", "__init__.py").load("schema_0008")

revision: str = "0008_budget_shards"
down_revision: str | Sequence[str] | None = "0007_claim_index"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_CURSOR = "idx_hosted_room_events_cursor"


def upgrade() -> None:
    bind = op.get_bind()
    schema.budget.create(bind)
    total = bind.execute(sa.select(sa.func.coalesce(sa.func.sum(schema.rooms.c.event_bytes), 0))).scalar_one()
    shards = schema.SHARDS.get(bind.dialect.name, 1)
    bind.execute(schema.budget.insert(), [
        {"shard": shard, "used": int(total) if shard == 0 else 0, "allowance": int(total) if shard == 0 else 0,
         "spread_limit": 0} for shard in range(shards)])
    if bind.dialect.name == "postgresql":
        op.drop_index(_CURSOR, table_name="hosted_room_events")


def downgrade() -> None:
    bind = op.get_bind()
    if bind.dialect.name == "postgresql":
        op.create_index(_CURSOR, "hosted_room_events", ["room_id", "seq"])
    schema.budget.drop(bind)

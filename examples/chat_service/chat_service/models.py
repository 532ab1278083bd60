"""The service's own table, beside hostedrooms' tables in the same database (its own Alembic history)."""

from __future__ import annotations

import sqlalchemy as sa
from hostedrooms import models as hostedrooms_models

metadata = sa.MetaData()

#: Where a room's webhook goes. The row belongs to the room: ``ON DELETE CASCADE`` lets hostedrooms' pruning purge
#: a disbanded room (a key without ``ON DELETE`` would make the whole prune fail).
webhooks = sa.Table(
    "chat_webhooks", metadata,
    sa.Column("room_id", sa.Text,
              sa.ForeignKey(hostedrooms_models.rooms.c.room_id, ondelete="CASCADE", name="fk_chat_webhooks_room"),
              primary_key=True),
    sa.Column("url", sa.Text, nullable=False),
)

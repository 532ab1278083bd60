"""Your application's tables: one with a foreign key to hostedrooms' ``hosted_rooms``."""

import sqlalchemy as sa
from hostedrooms import models as hostedrooms_models

metadata = sa.MetaData()

orders = sa.Table(
    "myapp_orders", metadata,
    sa.Column("id", sa.Integer, primary_key=True),
    sa.Column("room_id", sa.Text,
              sa.ForeignKey(hostedrooms_models.rooms.c.room_id, ondelete="CASCADE", name="fk_myapp_orders_room"),
              nullable=False),
    sa.Column("note", sa.Text, nullable=False),
)

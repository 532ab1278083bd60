"""myapp_orders: an order per room, deleted with the room"""

import sqlalchemy as sa
from alembic import op

revision = "myapp_0001"
down_revision = None
branch_labels = None
depends_on = None  # hostedrooms is at head already: env.py upgrades it before any revision of yours (see the docs)


def upgrade() -> None:
    op.create_table(
        "myapp_orders",
        sa.Column("id", sa.Integer, primary_key=True),
        sa.Column("room_id", sa.Text, nullable=False),
        sa.Column("note", sa.Text, nullable=False),
        sa.ForeignKeyConstraint(["room_id"], ["hosted_rooms.room_id"], name="fk_myapp_orders_room",
                                ondelete="CASCADE"),
    )


def downgrade() -> None:
    op.drop_table("myapp_orders")

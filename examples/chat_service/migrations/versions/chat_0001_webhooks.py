"""chat_webhooks: a room's webhook URL, deleted with the room"""

import sqlalchemy as sa
from alembic import op

revision = "chat_0001"
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    # The key refers to hostedrooms' table, so hostedrooms' schema must exist first on PostgreSQL: env.py upgrades
    # hostedrooms before this runs (or deploy with `hostedrooms upgrade` first). SQLite checks keys only on writes.
    op.create_table(
        "chat_webhooks",
        sa.Column("room_id", sa.Text, primary_key=True),
        sa.Column("url", sa.Text, nullable=False),
        sa.ForeignKeyConstraint(["room_id"], ["hosted_rooms.room_id"], name="fk_chat_webhooks_room",
                                ondelete="CASCADE"),
    )


def downgrade() -> None:
    op.drop_table("chat_webhooks")

"""index the rooms by last change: list_rooms reads its page without sorting every room

A plain index over ``hosted_rooms.updated_at``; the listing's order (``updated_at`` descending, then the room id
code point by code point) is read from it, the id order among rooms changed at the same instant sorted in the
few rows that share it.

Revision ID: 0009_list_rooms_index
Revises: 0008_budget_shards
"""

from __future__ import annotations

from collections.abc import Sequence

from alembic import op

revision: str = "0009_list_rooms_index"
down_revision: str | Sequence[str] | None = "0008_budget_shards"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    # Written out here, never read from hostedrooms.models: a revision's meaning is frozen.
    op.create_index("idx_hosted_rooms_updated", "hosted_rooms", ["updated_at"])


def downgrade() -> None:
    op.drop_index("idx_hosted_rooms_updated", table_name="hosted_rooms")

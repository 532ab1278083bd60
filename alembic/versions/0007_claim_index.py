"""index the claim events: room_state finds a room's current claim without walking its log

A partial index over ``hosted_room_events`` (room_id, authority_epoch, seq) holding only ``authority.claimed``
rows; every other append leaves it untouched.

Revision ID: 0007_claim_index
Revises: 0006_conform_reference_tables
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0007_claim_index"
down_revision: str | Sequence[str] | None = "0006_conform_reference_tables"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# Written out here, never read from hostedrooms.models: a revision's meaning is frozen.
_WHERE = "kind = 'authority.claimed'"


def upgrade() -> None:
    op.create_index("idx_hosted_room_events_claims", "hosted_room_events", ["room_id", "authority_epoch", "seq"],
                    sqlite_where=sa.text(_WHERE), postgresql_where=sa.text(_WHERE))


def downgrade() -> None:
    op.drop_index("idx_hosted_room_events_claims", table_name="hosted_room_events")

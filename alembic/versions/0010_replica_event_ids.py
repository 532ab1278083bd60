"""index the replicated events by id: a page's ingest probes its new ids instead of reading the replicated room

A plain (not unique) index over ``hosted_room_replica_events (room_id, event_id)``: ingest refuses a page whose new
event reuses a stored id, and without the index that check read every stored event of the room for each page, so
a catch-up of a long log slowed with every page. Not unique, so an existing replica upgrades whatever it holds.

Revision ID: 0010_replica_event_ids
Revises: 0009_list_rooms_index
"""

from __future__ import annotations

from collections.abc import Sequence

from alembic import op

revision: str = "0010_replica_event_ids"
down_revision: str | Sequence[str] | None = "0009_list_rooms_index"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    # Written out here, never read from hostedrooms.models: a revision's meaning is frozen.
    op.create_index("idx_hosted_room_replica_events_event_id", "hosted_room_replica_events", ["room_id", "event_id"])


def downgrade() -> None:
    op.drop_index("idx_hosted_room_replica_events_event_id", table_name="hosted_room_replica_events")

"""legacy room layouts: authority, actor and event_bytes columns

Draft layouts lacked hosted_rooms.authority_gateway_id / authority_epoch / event_bytes and
hosted_room_events.actor_json / authority_epoch. Old events become the system actor "legacy" with a NULL
epoch; rooms get authority 'legacy' at epoch 1; event_bytes is backfilled from the events (UTF-8 bytes of
event_id, kind, actor_json and payload_json), a batch of rooms per statement. A no-op where the columns exist.

Downgrade: nothing to undo in the baseline layout (the adopted rows stay valid there); the reference's
legacy layout itself is not restored.

Revision ID: 0002_legacy_room_columns
Revises: 0001_baseline
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from alembic import op
from alembic.util import load_python_file

# Frozen code only, never hostedrooms.models (see frozen/__init__.py).
legacy = load_python_file(Path(__file__).parent / "frozen", "__init__.py").load("adoption_0001")

revision: str = "0002_legacy_room_columns"
down_revision: str | Sequence[str] | None = "0001_baseline"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    legacy.add_room_columns(op)


def downgrade() -> None:
    legacy.downgrade_note(revision)

"""legacy disbanded rooms: copy their ids into the retired ids

Old layouts kept a disbanded room's identity only in hosted_rooms; copy each into
hosted_room_retired_ids (retired_at = disbanded_at) so pruning can never free the id. Idempotent.

Downgrade: nothing to undo in the baseline layout (the adopted rows stay valid there); the reference's
legacy layout itself is not restored.

Revision ID: 0004_legacy_retired_ids
Revises: 0003_legacy_remote_run_key
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from alembic import op
from alembic.util import load_python_file

# Frozen code only, never hostedrooms.models (see frozen/__init__.py).
legacy = load_python_file(Path(__file__).parent / "frozen", "__init__.py").load("adoption_0001")

revision: str = "0004_legacy_retired_ids"
down_revision: str | Sequence[str] | None = "0003_legacy_remote_run_key"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    legacy.retire_disbanded_rooms(op)


def downgrade() -> None:
    legacy.downgrade_note(revision)

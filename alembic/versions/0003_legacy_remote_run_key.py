"""legacy remote runs: the 9-column identity key

hosted_room_remote_runs with an older primary key is rebuilt with the full authority-lineage key;
missing home_install_id / authority_gateway_id / authority_epoch become 'legacy', 'legacy', 1.
A no-op where the key is current.

Downgrade: nothing to undo in the baseline layout (the adopted rows stay valid there); the reference's
legacy layout itself is not restored.

Revision ID: 0003_legacy_remote_run_key
Revises: 0002_legacy_room_columns
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from alembic import op
from alembic.util import load_python_file

# Frozen code only, never hostedrooms.models (see frozen/__init__.py).
legacy = load_python_file(Path(__file__).parent / "frozen", "__init__.py").load("adoption_0001")

revision: str = "0003_legacy_remote_run_key"
down_revision: str | Sequence[str] | None = "0002_legacy_room_columns"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    legacy.rebuild_remote_runs(op)


def downgrade() -> None:
    legacy.downgrade_note(revision)

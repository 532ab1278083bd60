"""legacy secure-peer ledgers: later columns and route backfill

secure_peer_deliveries gains the columns later ledgers added; secure_peer_outbound_intents gains
connection_id / source_route_id / source_route_revision, backfilled from snapshot_json. A malformed snapshot
fails the intent closed (state 'failed', last_error 'invalid legacy secure peer route snapshot', the three
columns ''). The reference's own repair never commits; this one does (it is part of the upgrade).

Downgrade: nothing to undo in the baseline layout (the adopted rows stay valid there); the reference's
legacy layout itself is not restored.

Revision ID: 0005_legacy_ledger_columns
Revises: 0004_legacy_retired_ids
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from alembic import op
from alembic.util import load_python_file

# Frozen code only, never hostedrooms.models (see frozen/__init__.py).
legacy = load_python_file(Path(__file__).parent / "frozen", "__init__.py").load("adoption_0001")

revision: str = "0005_legacy_ledger_columns"
down_revision: str | Sequence[str] | None = "0004_legacy_retired_ids"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    legacy.add_ledger_columns(op)


def downgrade() -> None:
    legacy.downgrade_note(revision)

"""conform tables the reference created to the hostedrooms layout

Each table the reference created (unnamed constraints, extra defaults from its ALTERs, missing indexes) is
rebuilt into the model's exact layout, keeping every row and the host's own indexes/triggers on it, so
`alembic check` is clean on an adopted database. A no-op on tables hostedrooms created.

Downgrade: nothing to undo in the baseline layout (the adopted rows stay valid there); the reference's
legacy layout itself is not restored.

Revision ID: 0006_conform_reference_tables
Revises: 0005_legacy_ledger_columns
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from alembic import op
from alembic.util import load_python_file

# Frozen code only, never hostedrooms.models (see frozen/__init__.py).
legacy = load_python_file(Path(__file__).parent / "frozen", "__init__.py").load("adoption_0001")

revision: str = "0006_conform_reference_tables"
down_revision: str | Sequence[str] | None = "0005_legacy_ledger_columns"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    legacy.conform_reference_tables(op)


def downgrade() -> None:
    legacy.downgrade_note(revision)

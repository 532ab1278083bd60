"""SQLite: the duplicate cursor index holds no row any more (its name stays, for the reference's readiness check)

``idx_hosted_room_events_cursor`` repeats the primary key's index (room_id, seq), so every append on SQLite wrote
one more index page than it needed, and every commit one more page to the WAL; no statement of hostedrooms needs it
(the primary key's index serves the same lookups). Revision 0008 dropped it on PostgreSQL. SQLite keeps an index of
that name, because the reference implementation's readiness check asks ``sqlite_master`` for it by name (and its
``CREATE INDEX IF NOT EXISTS`` then leaves it alone): it becomes a partial index whose condition no row meets
(``WHERE 0``), which SQLite never writes to and never plans with. Nothing on PostgreSQL.

Downgrade builds the full index again (one pass over the log).

Revision ID: 0012_sqlite_cursor_index_empty
Revises: 0011_pooler_append_functions
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0012_sqlite_cursor_index_empty"
down_revision: str | Sequence[str] | None = "0011_pooler_append_functions"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_CURSOR = "idx_hosted_room_events_cursor"
_TABLE = "hosted_room_events"


def upgrade() -> None:
    if op.get_bind().dialect.name != "sqlite":
        return
    op.drop_index(_CURSOR, table_name=_TABLE, if_exists=True)
    op.create_index(_CURSOR, _TABLE, ["room_id", "seq"], sqlite_where=sa.text("0"))


def downgrade() -> None:
    if op.get_bind().dialect.name != "sqlite":
        return
    op.drop_index(_CURSOR, table_name=_TABLE, if_exists=True)
    op.create_index(_CURSOR, _TABLE, ["room_id", "seq"])

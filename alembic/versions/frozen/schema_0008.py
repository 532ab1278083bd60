"""The table revision 0008_budget_shards creates, frozen (a copy, never an import, of ``hostedrooms.models`` as
it was when 0008 was written; see ``__init__``). Never edit this module."""

from __future__ import annotations

import sqlalchemy as sa

metadata = sa.MetaData()

#: Shards a fresh fill creates per backend (SQLite serialises writers: one counter row is exact there).
SHARDS = {"sqlite": 1, "postgresql": 8}

budget = sa.Table(
    'hosted_room_budget',
    metadata,
    sa.Column('shard', sa.BigInteger().with_variant(sa.Integer(), 'sqlite'), autoincrement=False, nullable=False),
    sa.Column('used', sa.BigInteger().with_variant(sa.Integer(), 'sqlite'), server_default=sa.text('0'),
              nullable=False),
    sa.Column('allowance', sa.BigInteger().with_variant(sa.Integer(), 'sqlite'), server_default=sa.text('0'),
              nullable=False),
    sa.Column('spread_limit', sa.BigInteger().with_variant(sa.Integer(), 'sqlite'), server_default=sa.text('0'),
              nullable=False),
    sa.CheckConstraint('shard >= 0', name='ck_hosted_room_budget_shard_non_negative'),
    sa.CheckConstraint('used >= 0', name='ck_hosted_room_budget_used_non_negative'),
    sa.CheckConstraint('used <= allowance', name='ck_hosted_room_budget_used_within_allowance'),
    sa.PrimaryKeyConstraint('shard', name='pk_hosted_room_budget'),
)

rooms = sa.table('hosted_rooms', sa.column('event_bytes', sa.BigInteger()))

"""The schema of revision 0001_baseline, frozen: every hostedrooms table as that revision creates it.

A copy, not an import, of what ``hostedrooms.models`` said when 0001 was written, so that no later change to
the models changes what 0001 (or the legacy revisions 0002-0006 that conform old layouts to it) does. Never
edit this module: a revision that needs other tables copies them into its own frozen module (see
``__init__``). Constraint names are written out in full (no naming convention to re-derive them), in the
order 0001 always emitted them, so the DDL is byte-for-byte what 0001 produced before it was frozen.
"""

from __future__ import annotations

import sqlalchemy as sa

metadata = sa.MetaData()


links = sa.Table(
    'hosted_room_links',
    metadata,
    sa.Column('room_id', sa.Text(), nullable=False),
    sa.Column('member_id', sa.Text(), nullable=False),
    sa.Column('target_url', sa.Text(), nullable=False),
    sa.Column('target_profile', sa.Text(), nullable=False),
    sa.Column('grant', sa.Text(), nullable=False),
    sa.Column('catalog_json', sa.Text(), nullable=False),
    sa.Column('cancellation_scope_id', sa.Text(), nullable=False),
    sa.Column('trace_id', sa.Text(), nullable=False),
    sa.Column('transport_security', sa.Text(), nullable=False),
    sa.Column('status', sa.Text(), server_default=sa.text("'ready'"), nullable=False),
    sa.Column('updated_at', sa.Double().with_variant(sa.REAL(), 'sqlite'), nullable=False),
    sa.PrimaryKeyConstraint('room_id', 'member_id', name='pk_hosted_room_links'),
)


peer_reservations = sa.Table(
    'hosted_room_peer_reservations',
    metadata,
    sa.Column('room_id', sa.Text(), nullable=False),
    sa.Column('member_id', sa.Text(), nullable=False),
    sa.Column('target_profile', sa.Text(), nullable=False),
    sa.Column('authority_gateway_id', sa.Text(), nullable=False),
    sa.Column('authority_epoch', sa.BigInteger().with_variant(sa.Integer(), 'sqlite'), nullable=False),
    sa.Column('expires_at', sa.Double().with_variant(sa.REAL(), 'sqlite'), nullable=False),
    sa.Column('revoked_at', sa.Double().with_variant(sa.REAL(), 'sqlite'), nullable=True),
    sa.Column('created_at', sa.Double().with_variant(sa.REAL(), 'sqlite'), nullable=False),
    sa.Column('updated_at', sa.Double().with_variant(sa.REAL(), 'sqlite'), nullable=False),
    sa.CheckConstraint('authority_epoch >= 1', name='ck_hosted_room_peer_reservations_authority_epoch_positive'),
    sa.PrimaryKeyConstraint('room_id', 'member_id', 'target_profile', name='pk_hosted_room_peer_reservations'),
)


remote_runs = sa.Table(
    'hosted_room_remote_runs',
    metadata,
    sa.Column('room_id', sa.Text(), nullable=False),
    sa.Column('home_install_id', sa.Text(), nullable=False),
    sa.Column('authority_gateway_id', sa.Text(), nullable=False),
    sa.Column('authority_epoch', sa.BigInteger().with_variant(sa.Integer(), 'sqlite'), nullable=False),
    sa.Column('member_id', sa.Text(), nullable=False),
    sa.Column('task_id', sa.Text(), nullable=False),
    sa.Column('execution_generation', sa.BigInteger().with_variant(sa.Integer(), 'sqlite'), nullable=False),
    sa.Column('target_install_id', sa.Text(), nullable=False),
    sa.Column('target_profile', sa.Text(), nullable=False),
    sa.Column('run_id', sa.Text(), nullable=False),
    sa.Column('session_id', sa.Text(), nullable=False),
    sa.Column('created_at', sa.Double().with_variant(sa.REAL(), 'sqlite'), nullable=False),
    sa.Column('updated_at', sa.Double().with_variant(sa.REAL(), 'sqlite'), nullable=False),
    sa.CheckConstraint('authority_epoch >= 1', name='ck_hosted_room_remote_runs_authority_epoch_positive'),
    sa.CheckConstraint('execution_generation >= 1', name='ck_hosted_room_remote_runs_execution_generation_positive'),
    sa.PrimaryKeyConstraint('room_id', 'home_install_id', 'authority_gateway_id', 'authority_epoch', 'member_id', 'target_install_id', 'target_profile', 'task_id', 'execution_generation', name='pk_hosted_room_remote_runs'),
)


replica_events = sa.Table(
    'hosted_room_replica_events',
    metadata,
    sa.Column('room_id', sa.Text(), nullable=False),
    sa.Column('seq', sa.BigInteger().with_variant(sa.Integer(), 'sqlite'), nullable=False),
    sa.Column('event_id', sa.Text(), nullable=False),
    sa.Column('kind', sa.Text(), nullable=False),
    sa.Column('actor_json', sa.Text(), nullable=False),
    sa.Column('authority_epoch', sa.BigInteger().with_variant(sa.Integer(), 'sqlite'), nullable=True),
    sa.Column('payload_json', sa.Text(), nullable=False),
    sa.Column('created_at', sa.Double().with_variant(sa.REAL(), 'sqlite'), nullable=False),
    sa.CheckConstraint('seq >= 1', name='ck_hosted_room_replica_events_seq_positive'),
    sa.PrimaryKeyConstraint('room_id', 'seq', name='pk_hosted_room_replica_events'),
)


replicas = sa.Table(
    'hosted_room_replicas',
    metadata,
    sa.Column('room_id', sa.Text(), nullable=False),
    sa.Column('name', sa.Text(), nullable=False),
    sa.Column('members_json', sa.Text(), nullable=False),
    sa.Column('authority_gateway_id', sa.Text(), nullable=False),
    sa.Column('authority_epoch', sa.BigInteger().with_variant(sa.Integer(), 'sqlite'), nullable=False),
    sa.Column('last_seq', sa.BigInteger().with_variant(sa.Integer(), 'sqlite'), server_default=sa.text('0'), nullable=False),
    sa.Column('latest_seq', sa.BigInteger().with_variant(sa.Integer(), 'sqlite'), server_default=sa.text('0'), nullable=False),
    sa.Column('event_bytes', sa.BigInteger().with_variant(sa.Integer(), 'sqlite'), server_default=sa.text('0'), nullable=False),
    sa.Column('created_at', sa.Double().with_variant(sa.REAL(), 'sqlite'), nullable=False),
    sa.Column('updated_at', sa.Double().with_variant(sa.REAL(), 'sqlite'), nullable=False),
    sa.CheckConstraint('authority_epoch >= 1', name='ck_hosted_room_replicas_authority_epoch_positive'),
    sa.CheckConstraint('last_seq >= 0', name='ck_hosted_room_replicas_last_seq_non_negative'),
    sa.PrimaryKeyConstraint('room_id', name='pk_hosted_room_replicas'),
)


retired_ids = sa.Table(
    'hosted_room_retired_ids',
    metadata,
    sa.Column('room_id', sa.Text(), nullable=False),
    sa.Column('retired_at', sa.Double().with_variant(sa.REAL(), 'sqlite'), nullable=False),
    sa.PrimaryKeyConstraint('room_id', name='pk_hosted_room_retired_ids'),
)


revoked_grants = sa.Table(
    'hosted_room_revoked_grants',
    metadata,
    sa.Column('scope_key', sa.Text(), nullable=False),
    sa.Column('expires_at', sa.Double().with_variant(sa.REAL(), 'sqlite'), nullable=False),
    sa.Column('revoked_before', sa.Double().with_variant(sa.REAL(), 'sqlite'), nullable=False),
    sa.PrimaryKeyConstraint('scope_key', name='pk_hosted_room_revoked_grants'),
)


rooms = sa.Table(
    'hosted_rooms',
    metadata,
    sa.Column('room_id', sa.Text(), nullable=False),
    sa.Column('name', sa.Text(), nullable=False),
    sa.Column('members_json', sa.Text(), nullable=False),
    sa.Column('authority_gateway_id', sa.Text(), nullable=False),
    sa.Column('authority_epoch', sa.BigInteger().with_variant(sa.Integer(), 'sqlite'), server_default=sa.text('1'), nullable=False),
    sa.Column('next_seq', sa.BigInteger().with_variant(sa.Integer(), 'sqlite'), server_default=sa.text('1'), nullable=False),
    sa.Column('event_bytes', sa.BigInteger().with_variant(sa.Integer(), 'sqlite'), server_default=sa.text('0'), nullable=False),
    sa.Column('revision', sa.BigInteger().with_variant(sa.Integer(), 'sqlite'), server_default=sa.text('1'), nullable=False),
    sa.Column('created_at', sa.Double().with_variant(sa.REAL(), 'sqlite'), nullable=False),
    sa.Column('updated_at', sa.Double().with_variant(sa.REAL(), 'sqlite'), nullable=False),
    sa.Column('disbanded_at', sa.Double().with_variant(sa.REAL(), 'sqlite'), nullable=True),
    sa.CheckConstraint('authority_epoch >= 1', name='ck_hosted_rooms_authority_epoch_positive'),
    sa.CheckConstraint('event_bytes >= 0', name='ck_hosted_rooms_event_bytes_non_negative'),
    sa.CheckConstraint('next_seq >= 1', name='ck_hosted_rooms_next_seq_positive'),
    sa.CheckConstraint('revision >= 1', name='ck_hosted_rooms_revision_positive'),
    sa.PrimaryKeyConstraint('room_id', name='pk_hosted_rooms'),
)


deliveries = sa.Table(
    'secure_peer_deliveries',
    metadata,
    sa.Column('envelope_id', sa.Text(), nullable=False),
    sa.Column('request_id', sa.Text(), nullable=False),
    sa.Column('claim_digest', sa.Text(), nullable=False),
    sa.Column('transport_role', sa.Text(), nullable=False),
    sa.Column('connection_id', sa.Text(), nullable=False),
    sa.Column('lease_token', sa.Text(), nullable=False),
    sa.Column('team_id', sa.Text(), nullable=False),
    sa.Column('source_peer_id', sa.Text(), nullable=True),
    sa.Column('source_server_identity', sa.Text(), nullable=False),
    sa.Column('source_route_id', sa.Text(), nullable=False),
    sa.Column('source_route_revision', sa.Text(), nullable=False),
    sa.Column('target_peer_id', sa.Text(), nullable=True),
    sa.Column('target_server_identity', sa.Text(), nullable=False),
    sa.Column('target_route_id', sa.Text(), nullable=False),
    sa.Column('target_route_revision', sa.Text(), nullable=False),
    sa.Column('target_chat_id', sa.Text(), nullable=False),
    sa.Column('action', sa.Text(), nullable=False),
    sa.Column('kind', sa.Text(), nullable=False),
    sa.Column('exchange_id', sa.Text(), nullable=False),
    sa.Column('parent_envelope_id', sa.Text(), nullable=True),
    sa.Column('parent_leg', sa.BigInteger().with_variant(sa.Integer(), 'sqlite'), nullable=True),
    sa.Column('used_legs', sa.BigInteger().with_variant(sa.Integer(), 'sqlite'), nullable=False),
    sa.Column('max_legs', sa.BigInteger().with_variant(sa.Integer(), 'sqlite'), nullable=False),
    sa.Column('expires_at', sa.BigInteger().with_variant(sa.Integer(), 'sqlite'), nullable=False),
    sa.Column('body_json', sa.Text(), nullable=False),
    sa.Column('state', sa.Text(), nullable=False),
    sa.Column('queued_id', sa.Text(), nullable=True),
    sa.Column('run_id', sa.Text(), nullable=True),
    sa.Column('admission_retry_at', sa.BigInteger().with_variant(sa.Integer(), 'sqlite'), nullable=True),
    sa.Column('admission_attempts', sa.BigInteger().with_variant(sa.Integer(), 'sqlite'), server_default=sa.text('0'), nullable=False),
    sa.Column('admission_last_error', sa.Text(), nullable=True),
    sa.Column('response_committed', sa.BigInteger().with_variant(sa.Integer(), 'sqlite'), server_default=sa.text('0'), nullable=False),
    sa.Column('response_request_id', sa.Text(), nullable=True),
    sa.Column('response_request_digest', sa.Text(), nullable=True),
    sa.Column('response_body', sa.Text(), nullable=True),
    sa.Column('response_request_response', sa.BigInteger().with_variant(sa.Integer(), 'sqlite'), nullable=True),
    sa.Column('response_retry_at', sa.BigInteger().with_variant(sa.Integer(), 'sqlite'), nullable=True),
    sa.Column('response_attempts', sa.BigInteger().with_variant(sa.Integer(), 'sqlite'), server_default=sa.text('0'), nullable=False),
    sa.Column('response_last_error', sa.Text(), nullable=True),
    sa.Column('result_hash', sa.Text(), nullable=True),
    sa.Column('error', sa.Text(), nullable=True),
    sa.Column('created_at', sa.BigInteger().with_variant(sa.Integer(), 'sqlite'), nullable=False),
    sa.Column('updated_at', sa.BigInteger().with_variant(sa.Integer(), 'sqlite'), nullable=False),
    sa.CheckConstraint("action IN ('instruction', 'request_reply')", name='ck_secure_peer_deliveries_action'),
    sa.CheckConstraint("kind IN ('instruction', 'request_reply', 'response')", name='ck_secure_peer_deliveries_kind'),
    sa.CheckConstraint("state IN ('prepared', 'authorized', 'queued', 'running', 'completed', 'failed')", name='ck_secure_peer_deliveries_state'),
    sa.CheckConstraint("transport_role IN ('host', 'client')", name='ck_secure_peer_deliveries_transport_role'),
    sa.CheckConstraint('max_legs = 6', name='ck_secure_peer_deliveries_max_legs'),
    sa.CheckConstraint('response_committed IN (0, 1)', name='ck_secure_peer_deliveries_response_committed'),
    sa.CheckConstraint('response_request_response IS NULL OR response_request_response IN (0, 1)', name='ck_secure_peer_deliveries_response_request_response'),
    sa.CheckConstraint('used_legs BETWEEN 1 AND 6', name='ck_secure_peer_deliveries_used_legs'),
    sa.PrimaryKeyConstraint('envelope_id', name='pk_secure_peer_deliveries'),
    sa.Index('secure_peer_delivery_queued_owner', 'queued_id', unique=True, sqlite_where=sa.text('queued_id IS NOT NULL'), postgresql_where=sa.text('queued_id IS NOT NULL')),
    sa.Index('secure_peer_delivery_run', 'run_id', 'state'),
    sa.Index('secure_peer_delivery_run_owner', 'run_id', unique=True, sqlite_where=sa.text('run_id IS NOT NULL'), postgresql_where=sa.text('run_id IS NOT NULL')),
    sa.Index('secure_peer_delivery_state', 'state', 'updated_at'),
)


outbound_intents = sa.Table(
    'secure_peer_outbound_intents',
    metadata,
    sa.Column('request_id', sa.Text(), nullable=False),
    sa.Column('intent_digest', sa.Text(), nullable=False),
    sa.Column('source_session_id', sa.Text(), nullable=False),
    sa.Column('source_run_id', sa.Text(), nullable=False),
    sa.Column('connection_id', sa.Text(), nullable=False),
    sa.Column('source_route_id', sa.Text(), nullable=False),
    sa.Column('source_route_revision', sa.Text(), nullable=False),
    sa.Column('snapshot_json', sa.Text(), nullable=False),
    sa.Column('body', sa.Text(), nullable=False),
    sa.Column('action', sa.Text(), nullable=False),
    sa.Column('expires_at', sa.BigInteger().with_variant(sa.Integer(), 'sqlite'), nullable=False),
    sa.Column('state', sa.Text(), nullable=False),
    sa.Column('response_json', sa.Text(), nullable=True),
    sa.Column('retry_at', sa.BigInteger().with_variant(sa.Integer(), 'sqlite'), nullable=True),
    sa.Column('attempts', sa.BigInteger().with_variant(sa.Integer(), 'sqlite'), server_default=sa.text('0'), nullable=False),
    sa.Column('last_error', sa.Text(), nullable=True),
    sa.Column('created_at', sa.BigInteger().with_variant(sa.Integer(), 'sqlite'), nullable=False),
    sa.Column('updated_at', sa.BigInteger().with_variant(sa.Integer(), 'sqlite'), nullable=False),
    sa.CheckConstraint("action IN ('instruction', 'request_reply')", name='ck_secure_peer_outbound_intents_action'),
    sa.CheckConstraint("state IN ('pending', 'committed', 'failed')", name='ck_secure_peer_outbound_intents_state'),
    sa.PrimaryKeyConstraint('request_id', name='pk_secure_peer_outbound_intents'),
    sa.Index('secure_peer_outbound_connection', 'state', 'connection_id', 'created_at'),
    sa.Index('secure_peer_outbound_pending', 'state', 'retry_at', 'created_at'),
    sa.Index('secure_peer_outbound_source', 'state', 'source_session_id', 'created_at'),
)


events = sa.Table(
    'hosted_room_events',
    metadata,
    sa.Column('room_id', sa.Text(), nullable=False),
    sa.Column('seq', sa.BigInteger().with_variant(sa.Integer(), 'sqlite'), nullable=False),
    sa.Column('event_id', sa.Text(), nullable=False),
    sa.Column('kind', sa.Text(), nullable=False),
    sa.Column('actor_json', sa.Text(), nullable=False),
    sa.Column('authority_epoch', sa.BigInteger().with_variant(sa.Integer(), 'sqlite'), nullable=True),
    sa.Column('payload_json', sa.Text(), nullable=False),
    sa.Column('created_at', sa.Double().with_variant(sa.REAL(), 'sqlite'), nullable=False),
    sa.CheckConstraint('authority_epoch IS NULL OR authority_epoch >= 1', name='ck_hosted_room_events_authority_epoch_positive'),
    sa.CheckConstraint('seq >= 1', name='ck_hosted_room_events_seq_positive'),
    sa.ForeignKeyConstraint(['room_id'], ['hosted_rooms.room_id'], name='fk_hosted_room_events_room_id_hosted_rooms'),
    sa.PrimaryKeyConstraint('room_id', 'seq', name='pk_hosted_room_events'),
    sa.UniqueConstraint('room_id', 'event_id', name='uq_hosted_room_events_room_id_event_id'),
    sa.Index('idx_hosted_room_events_cursor', 'room_id', 'seq'),
)


#: Every table, in the order 0001 creates them (parents before children).
TABLES: tuple[sa.Table, ...] = (
    links,
    peer_reservations,
    remote_runs,
    replica_events,
    replicas,
    retired_ids,
    revoked_grants,
    rooms,
    deliveries,
    outbound_intents,
    events,
)

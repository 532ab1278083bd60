-- The DDL (sqlite_master) of every hostedrooms table after upgrading a SQLite database to
-- 0006_conform_reference_tables, recorded before the revisions were frozen. tests/migrations/test_frozen_migrations.py
-- compares fresh and adopted databases with it; revisions up to 0006 must never change it.
CREATE TABLE hosted_room_events (
	room_id TEXT NOT NULL, 
	seq INTEGER NOT NULL, 
	event_id TEXT NOT NULL, 
	kind TEXT NOT NULL, 
	actor_json TEXT NOT NULL, 
	authority_epoch INTEGER, 
	payload_json TEXT NOT NULL, 
	created_at REAL NOT NULL, 
	CONSTRAINT pk_hosted_room_events PRIMARY KEY (room_id, seq), 
	CONSTRAINT ck_hosted_room_events_authority_epoch_positive CHECK (authority_epoch IS NULL OR authority_epoch >= 1), 
	CONSTRAINT ck_hosted_room_events_seq_positive CHECK (seq >= 1), 
	CONSTRAINT fk_hosted_room_events_room_id_hosted_rooms FOREIGN KEY(room_id) REFERENCES hosted_rooms (room_id), 
	CONSTRAINT uq_hosted_room_events_room_id_event_id UNIQUE (room_id, event_id)
);
CREATE TABLE hosted_room_links (
	room_id TEXT NOT NULL, 
	member_id TEXT NOT NULL, 
	target_url TEXT NOT NULL, 
	target_profile TEXT NOT NULL, 
	grant TEXT NOT NULL, 
	catalog_json TEXT NOT NULL, 
	cancellation_scope_id TEXT NOT NULL, 
	trace_id TEXT NOT NULL, 
	transport_security TEXT NOT NULL, 
	status TEXT DEFAULT 'ready' NOT NULL, 
	updated_at REAL NOT NULL, 
	CONSTRAINT pk_hosted_room_links PRIMARY KEY (room_id, member_id)
);
CREATE TABLE hosted_room_peer_reservations (
	room_id TEXT NOT NULL, 
	member_id TEXT NOT NULL, 
	target_profile TEXT NOT NULL, 
	authority_gateway_id TEXT NOT NULL, 
	authority_epoch INTEGER NOT NULL, 
	expires_at REAL NOT NULL, 
	revoked_at REAL, 
	created_at REAL NOT NULL, 
	updated_at REAL NOT NULL, 
	CONSTRAINT pk_hosted_room_peer_reservations PRIMARY KEY (room_id, member_id, target_profile), 
	CONSTRAINT ck_hosted_room_peer_reservations_authority_epoch_positive CHECK (authority_epoch >= 1)
);
CREATE TABLE hosted_room_remote_runs (
	room_id TEXT NOT NULL, 
	home_install_id TEXT NOT NULL, 
	authority_gateway_id TEXT NOT NULL, 
	authority_epoch INTEGER NOT NULL, 
	member_id TEXT NOT NULL, 
	task_id TEXT NOT NULL, 
	execution_generation INTEGER NOT NULL, 
	target_install_id TEXT NOT NULL, 
	target_profile TEXT NOT NULL, 
	run_id TEXT NOT NULL, 
	session_id TEXT NOT NULL, 
	created_at REAL NOT NULL, 
	updated_at REAL NOT NULL, 
	CONSTRAINT pk_hosted_room_remote_runs PRIMARY KEY (room_id, home_install_id, authority_gateway_id, authority_epoch, member_id, target_install_id, target_profile, task_id, execution_generation), 
	CONSTRAINT ck_hosted_room_remote_runs_authority_epoch_positive CHECK (authority_epoch >= 1), 
	CONSTRAINT ck_hosted_room_remote_runs_execution_generation_positive CHECK (execution_generation >= 1)
);
CREATE TABLE hosted_room_replica_events (
	room_id TEXT NOT NULL, 
	seq INTEGER NOT NULL, 
	event_id TEXT NOT NULL, 
	kind TEXT NOT NULL, 
	actor_json TEXT NOT NULL, 
	authority_epoch INTEGER, 
	payload_json TEXT NOT NULL, 
	created_at REAL NOT NULL, 
	CONSTRAINT pk_hosted_room_replica_events PRIMARY KEY (room_id, seq), 
	CONSTRAINT ck_hosted_room_replica_events_seq_positive CHECK (seq >= 1)
);
CREATE TABLE hosted_room_replicas (
	room_id TEXT NOT NULL, 
	name TEXT NOT NULL, 
	members_json TEXT NOT NULL, 
	authority_gateway_id TEXT NOT NULL, 
	authority_epoch INTEGER NOT NULL, 
	last_seq INTEGER DEFAULT 0 NOT NULL, 
	latest_seq INTEGER DEFAULT 0 NOT NULL, 
	event_bytes INTEGER DEFAULT 0 NOT NULL, 
	created_at REAL NOT NULL, 
	updated_at REAL NOT NULL, 
	CONSTRAINT pk_hosted_room_replicas PRIMARY KEY (room_id), 
	CONSTRAINT ck_hosted_room_replicas_authority_epoch_positive CHECK (authority_epoch >= 1), 
	CONSTRAINT ck_hosted_room_replicas_last_seq_non_negative CHECK (last_seq >= 0)
);
CREATE TABLE hosted_room_retired_ids (
	room_id TEXT NOT NULL, 
	retired_at REAL NOT NULL, 
	CONSTRAINT pk_hosted_room_retired_ids PRIMARY KEY (room_id)
);
CREATE TABLE hosted_room_revoked_grants (
	scope_key TEXT NOT NULL, 
	expires_at REAL NOT NULL, 
	revoked_before REAL NOT NULL, 
	CONSTRAINT pk_hosted_room_revoked_grants PRIMARY KEY (scope_key)
);
CREATE TABLE hosted_rooms (
	room_id TEXT NOT NULL, 
	name TEXT NOT NULL, 
	members_json TEXT NOT NULL, 
	authority_gateway_id TEXT NOT NULL, 
	authority_epoch INTEGER DEFAULT 1 NOT NULL, 
	next_seq INTEGER DEFAULT 1 NOT NULL, 
	event_bytes INTEGER DEFAULT 0 NOT NULL, 
	revision INTEGER DEFAULT 1 NOT NULL, 
	created_at REAL NOT NULL, 
	updated_at REAL NOT NULL, 
	disbanded_at REAL, 
	CONSTRAINT pk_hosted_rooms PRIMARY KEY (room_id), 
	CONSTRAINT ck_hosted_rooms_authority_epoch_positive CHECK (authority_epoch >= 1), 
	CONSTRAINT ck_hosted_rooms_event_bytes_non_negative CHECK (event_bytes >= 0), 
	CONSTRAINT ck_hosted_rooms_next_seq_positive CHECK (next_seq >= 1), 
	CONSTRAINT ck_hosted_rooms_revision_positive CHECK (revision >= 1)
);
CREATE INDEX idx_hosted_room_events_cursor ON hosted_room_events (room_id, seq);
CREATE TABLE secure_peer_deliveries (
	envelope_id TEXT NOT NULL, 
	request_id TEXT NOT NULL, 
	claim_digest TEXT NOT NULL, 
	transport_role TEXT NOT NULL, 
	connection_id TEXT NOT NULL, 
	lease_token TEXT NOT NULL, 
	team_id TEXT NOT NULL, 
	source_peer_id TEXT, 
	source_server_identity TEXT NOT NULL, 
	source_route_id TEXT NOT NULL, 
	source_route_revision TEXT NOT NULL, 
	target_peer_id TEXT, 
	target_server_identity TEXT NOT NULL, 
	target_route_id TEXT NOT NULL, 
	target_route_revision TEXT NOT NULL, 
	target_chat_id TEXT NOT NULL, 
	action TEXT NOT NULL, 
	kind TEXT NOT NULL, 
	exchange_id TEXT NOT NULL, 
	parent_envelope_id TEXT, 
	parent_leg INTEGER, 
	used_legs INTEGER NOT NULL, 
	max_legs INTEGER NOT NULL, 
	expires_at INTEGER NOT NULL, 
	body_json TEXT NOT NULL, 
	state TEXT NOT NULL, 
	queued_id TEXT, 
	run_id TEXT, 
	admission_retry_at INTEGER, 
	admission_attempts INTEGER DEFAULT 0 NOT NULL, 
	admission_last_error TEXT, 
	response_committed INTEGER DEFAULT 0 NOT NULL, 
	response_request_id TEXT, 
	response_request_digest TEXT, 
	response_body TEXT, 
	response_request_response INTEGER, 
	response_retry_at INTEGER, 
	response_attempts INTEGER DEFAULT 0 NOT NULL, 
	response_last_error TEXT, 
	result_hash TEXT, 
	error TEXT, 
	created_at INTEGER NOT NULL, 
	updated_at INTEGER NOT NULL, 
	CONSTRAINT pk_secure_peer_deliveries PRIMARY KEY (envelope_id), 
	CONSTRAINT ck_secure_peer_deliveries_action CHECK (action IN ('instruction', 'request_reply')), 
	CONSTRAINT ck_secure_peer_deliveries_kind CHECK (kind IN ('instruction', 'request_reply', 'response')), 
	CONSTRAINT ck_secure_peer_deliveries_state CHECK (state IN ('prepared', 'authorized', 'queued', 'running', 'completed', 'failed')), 
	CONSTRAINT ck_secure_peer_deliveries_transport_role CHECK (transport_role IN ('host', 'client')), 
	CONSTRAINT ck_secure_peer_deliveries_max_legs CHECK (max_legs = 6), 
	CONSTRAINT ck_secure_peer_deliveries_response_committed CHECK (response_committed IN (0, 1)), 
	CONSTRAINT ck_secure_peer_deliveries_response_request_response CHECK (response_request_response IS NULL OR response_request_response IN (0, 1)), 
	CONSTRAINT ck_secure_peer_deliveries_used_legs CHECK (used_legs BETWEEN 1 AND 6)
);
CREATE UNIQUE INDEX secure_peer_delivery_queued_owner ON secure_peer_deliveries (queued_id) WHERE queued_id IS NOT NULL;
CREATE INDEX secure_peer_delivery_run ON secure_peer_deliveries (run_id, state);
CREATE UNIQUE INDEX secure_peer_delivery_run_owner ON secure_peer_deliveries (run_id) WHERE run_id IS NOT NULL;
CREATE INDEX secure_peer_delivery_state ON secure_peer_deliveries (state, updated_at);
CREATE INDEX secure_peer_outbound_connection ON secure_peer_outbound_intents (state, connection_id, created_at);
CREATE TABLE secure_peer_outbound_intents (
	request_id TEXT NOT NULL, 
	intent_digest TEXT NOT NULL, 
	source_session_id TEXT NOT NULL, 
	source_run_id TEXT NOT NULL, 
	connection_id TEXT NOT NULL, 
	source_route_id TEXT NOT NULL, 
	source_route_revision TEXT NOT NULL, 
	snapshot_json TEXT NOT NULL, 
	body TEXT NOT NULL, 
	action TEXT NOT NULL, 
	expires_at INTEGER NOT NULL, 
	state TEXT NOT NULL, 
	response_json TEXT, 
	retry_at INTEGER, 
	attempts INTEGER DEFAULT 0 NOT NULL, 
	last_error TEXT, 
	created_at INTEGER NOT NULL, 
	updated_at INTEGER NOT NULL, 
	CONSTRAINT pk_secure_peer_outbound_intents PRIMARY KEY (request_id), 
	CONSTRAINT ck_secure_peer_outbound_intents_action CHECK (action IN ('instruction', 'request_reply')), 
	CONSTRAINT ck_secure_peer_outbound_intents_state CHECK (state IN ('pending', 'committed', 'failed'))
);
CREATE INDEX secure_peer_outbound_pending ON secure_peer_outbound_intents (state, retry_at, created_at);
CREATE INDEX secure_peer_outbound_source ON secure_peer_outbound_intents (state, source_session_id, created_at);

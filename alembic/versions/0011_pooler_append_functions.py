"""the one-statement append as PL/pgSQL functions, for engines behind a transaction pooler (PostgreSQL only)

Behind PgBouncer in transaction mode nothing may be prepared on the server, so the append's data-modifying CTE was
planned again at every call. ``hostedrooms_append_one`` and ``hostedrooms_append_batch`` do the same work in one
round trip, and PL/pgSQL keeps their plans for the server connection's life. Each is created in the migration's
current schema (the gateway's), its tables qualified with that schema's name when the revision runs (quoted by the
server: ``format('%I')``), so a call costs no ``search_path`` change and reads no other schema's tables. Nothing on
SQLite.

The functions do what the statement did (``hostedrooms/store/rooms/postgresql.py``), one step at a time: a stored
id returns the stored rows and writes nothing; the room advances only under its fences and limits while some
budget shard has room (else nothing is returned and nothing written); one shard not held by another writer pays
(the connection's own first) or the call fails whole with SQLSTATE 22012, as the statement's division by zero did;
the rows are inserted (a batch from its JSON, every row or the call fails with 22012), and the followers'
``NOTIFY`` is queued. A batch probes each id on its own in the ``(room_id, event_id)`` index.

Revision ID: 0011_pooler_append_functions
Revises: 0010_replica_event_ids
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0011_pooler_append_functions"
down_revision: str | Sequence[str] | None = "0010_replica_event_ids"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# Written out here, never read from hostedrooms: a revision's meaning is frozen. Each text is a format() string run
# by the server in a DO block, %1$I standing for the current schema's name as a quoted identifier (constant text:
# nothing in it comes from input; no other % sign, since format() reads them). PL/pgSQL variables are p_* (arguments), v_* (locals), r_* (result columns), so
# none is read where a column is meant.
_RESULT = ("TABLE (r_seq bigint, r_room_id text, r_event_id text, r_kind text, r_actor_json text, "
           "r_authority_epoch bigint, r_payload_json text, r_created_at double precision)")

# The room advances under its fences and limits while some shard has room; then a shard with room pays, one not
# locked by another writer, the connection's own first (8 shards); none: the call fails whole, nothing written.
_ADVANCE_AND_CHARGE = """
  UPDATE %1$I.hosted_rooms SET next_seq = next_seq + p_count, event_bytes = event_bytes + p_size,
      updated_at = p_now
    WHERE room_id = p_room_id AND authority_gateway_id = p_gateway_id AND authority_epoch = p_epoch
      AND disbanded_at IS NULL AND next_seq <= p_max_events AND event_bytes + p_size <= p_max_room_bytes
      AND EXISTS (SELECT 1 FROM %1$I.hosted_room_budget
                  WHERE used + p_size <= allowance AND spread_limit <= p_spread_limit)
    RETURNING next_seq INTO v_next;
  IF NOT FOUND THEN
    RETURN;
  END IF;
  UPDATE %1$I.hosted_room_budget SET used = used + p_size WHERE shard = (
      SELECT shard FROM %1$I.hosted_room_budget WHERE used + p_size <= allowance AND spread_limit <= p_spread_limit
      ORDER BY mod(shard + 8 - mod(pg_backend_pid(), 8), 8) LIMIT 1 FOR UPDATE SKIP LOCKED);
  IF NOT FOUND THEN
    RAISE EXCEPTION 'no budget shard could pay for the append' USING ERRCODE = 'division_by_zero';
  END IF;
"""

_STORED_COLUMNS = "seq, room_id, event_id, kind, actor_json, authority_epoch, payload_json, created_at"

_APPEND_ONE = f"""
CREATE OR REPLACE FUNCTION %1$I.hostedrooms_append_one(
    p_room_id text, p_gateway_id text, p_epoch bigint, p_count bigint, p_size bigint, p_max_events bigint,
    p_max_room_bytes bigint, p_spread_limit bigint, p_now double precision, p_channel text, p_event_id text,
    p_kind text, p_actor_json text, p_authority_epoch bigint, p_payload_json text)
RETURNS {_RESULT} LANGUAGE plpgsql AS $body$
DECLARE
  v_next bigint;
BEGIN
  RETURN QUERY SELECT {_STORED_COLUMNS} FROM %1$I.hosted_room_events
    WHERE room_id = p_room_id AND event_id = p_event_id;
  IF FOUND THEN
    RETURN;
  END IF;
{_ADVANCE_AND_CHARGE}
  INSERT INTO %1$I.hosted_room_events ({_STORED_COLUMNS})
    VALUES (v_next - 1, p_room_id, p_event_id, p_kind, p_actor_json, p_authority_epoch, p_payload_json, p_now);
  PERFORM pg_notify(p_channel, p_room_id);
  r_seq := v_next;
  RETURN NEXT;
END
$body$"""  # noqa: S608 (constant texts joined)

# Each id probed on its own (LATERAL, LIMIT 1), the ids taken out of the JSON first (OFFSET 0): as in the
# statement, the probe compares with a plain value, which keeps it in the (room_id, event_id) index.
_APPEND_BATCH = f"""
CREATE OR REPLACE FUNCTION %1$I.hostedrooms_append_batch(
    p_room_id text, p_gateway_id text, p_epoch bigint, p_count bigint, p_size bigint, p_max_events bigint,
    p_max_room_bytes bigint, p_spread_limit bigint, p_now double precision, p_channel text, p_rows json)
RETURNS {_RESULT} LANGUAGE plpgsql AS $body$
DECLARE
  v_next bigint;
  v_inserted bigint;
BEGIN
  RETURN QUERY SELECT hit.* FROM (SELECT value ->> 0 AS id FROM json_array_elements(p_rows) OFFSET 0) AS batch,
    LATERAL (SELECT {_STORED_COLUMNS} FROM %1$I.hosted_room_events
             WHERE room_id = p_room_id AND event_id = batch.id LIMIT 1) AS hit;
  IF FOUND THEN
    RETURN;
  END IF;
{_ADVANCE_AND_CHARGE}
  INSERT INTO %1$I.hosted_room_events ({_STORED_COLUMNS})
    SELECT v_next - p_count + item.ord - 1, p_room_id, item.row ->> 0, item.row ->> 1, item.row ->> 2,
        CAST(item.row ->> 3 AS bigint), item.row ->> 4, p_now
      FROM json_array_elements(p_rows) WITH ORDINALITY AS item(row, ord);
  GET DIAGNOSTICS v_inserted = ROW_COUNT;
  IF v_inserted <> p_count THEN
    RAISE EXCEPTION 'not every row of the batch was inserted' USING ERRCODE = 'division_by_zero';
  END IF;
  PERFORM pg_notify(p_channel, p_room_id);
  r_seq := v_next;
  RETURN NEXT;
END
$body$"""  # noqa: S608 (constant texts joined)

_DROP = """
DROP FUNCTION IF EXISTS %1$I.hostedrooms_append_one(text, text, bigint, bigint, bigint, bigint, bigint, bigint,
    double precision, text, text, text, text, bigint, text);
DROP FUNCTION IF EXISTS %1$I.hostedrooms_append_batch(text, text, bigint, bigint, bigint, bigint, bigint, bigint,
    double precision, text, json)"""


def _in_current_schema(template: str) -> None:
    """Run ``template`` with %1$I as the current schema's quoted name (the server formats it)."""
    # A dollar-quoted literal of the server's own (its tag appears in no template).
    op.execute(sa.text(f"DO $install$ BEGIN EXECUTE format($sql${template}$sql$, current_schema()); END $install$"))


def upgrade() -> None:
    if op.get_bind().dialect.name != "postgresql":
        return
    _in_current_schema(_APPEND_ONE)
    _in_current_schema(_APPEND_BATCH)


def downgrade() -> None:
    if op.get_bind().dialect.name != "postgresql":
        return
    for statement in _DROP.split(";"):
        _in_current_schema(statement)

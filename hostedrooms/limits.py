"""Limits and protocol constants of the reference implementation.

Services read these module attributes at call time (never bind them at import), so tests and operators can
lower them; the compat facades pass their own module's values through, so lowering a limit on
``hostedrooms.compat.hosted_rooms`` takes effect too.
"""

from __future__ import annotations

PROTOCOL_VERSION = 2
MAX_ROOM_ID_CHARS = 128
MAX_EVENT_ID_CHARS = 128
MAX_ROOM_NAME_CHARS = 200
MAX_EVENT_KIND_CHARS = 64
MAX_ACTOR_ID_CHARS = 128
MAX_ACTOR_LABEL_CHARS = 200
MAX_ACTOR_JSON_BYTES = 4 * 1024
MAX_MEMBERS = 128
MAX_MEMBERS_JSON_BYTES = 128 * 1024
MAX_EVENT_JSON_BYTES = 256 * 1024
MAX_LOG_LIMIT = 500
MAX_LOG_PAGE_BYTES = 2 * 1024 * 1024
# The deepest nesting of arrays and objects in any stored JSON document (the outermost counts as 1): actors,
# payloads, members, replicated events, ledger snapshots and responses. Readers decode and re-serialise these
# recursively (json.loads, a replay page adds 3 levels, callers walk them); 64 is far below CPython's
# recursion limit (1000) and below other common parsers' defaults (Ruby's 100, serde_json's 128), and no chat
# event needs more. Not a reference constant: hostedrooms reads it here even when a facade passes its limits.
MAX_JSON_DEPTH = 64
MAX_ROOM_LIST_LIMIT = 500
MAX_ACTIVE_ROOMS = 256
MAX_DISBANDED_ROOM_TOMBSTONES = 512
DISBANDED_ROOM_RETENTION_SECONDS = 90 * 24 * 60 * 60
MAX_EVENTS_PER_ROOM = 50_000
MAX_ROOM_EVENT_BYTES = 256 * 1024 * 1024
# Headroom below the physical file: event accounting excludes indexes and repeated room ids.
MAX_GATEWAY_EVENT_BYTES = 16 * 1024 * 1024
CONTROL_EVENT_COUNT_RESERVE = 64
CONTROL_EVENT_BYTE_RESERVE = 1024 * 1024

# Replicas
MAX_REPLICA_ROOMS = 256
MAX_REPLICA_EVENT_BYTES = 256 * 1024 * 1024

# Secure-peer delivery ledger
MAX_NONTERMINAL_DELIVERIES = 2_048

"""Peer routing state for asyncio: each coroutine is :mod:`hostedrooms.peers`' function of the same name, derived
from it, taking an AsyncEngine. The probes take a target or an AsyncEngine and run in a worker thread (they open
their own small synchronous engine, bounded to :data:`~hostedrooms.peers.PROBE_TIMEOUT_SECONDS` of waiting)."""

from __future__ import annotations

from .. import peers as _peers
from ..peers import room_grant_scope_key as room_grant_scope_key  # re-exported (see __all__)
from .derive import service, threaded

#: The synchronous module's names that stay there: its constants and what manages its own engines.
_SYNC_ONLY = frozenset({
    "GRANT_SCOPE_FIELDS", "LINK_COLUMNS", "PROBE_TIMEOUT_SECONDS", "REMOTE_RUN_COLUMNS", "EngineSource",
    "forget_probe_engines"})
__all__ = [name for name in _peers.__all__ if name not in _SYNC_ONLY]

list_room_link_records = service(_peers.list_room_link_records)
upsert_room_link_record = service(_peers.upsert_room_link_record)
update_room_link_status = service(_peers.update_room_link_status)
delete_room_link_records = service(_peers.delete_room_link_records)
revoke_room_grant_scope = service(_peers.revoke_room_grant_scope)
room_grant_is_revoked = service(_peers.room_grant_is_revoked)
reserve_peer_room = service(_peers.reserve_peer_room)
peer_room_is_reserved = service(_peers.peer_room_is_reserved)
peer_room_grant_is_current = service(_peers.peer_room_grant_is_current)
upsert_remote_run_receipt = service(_peers.upsert_remote_run_receipt)
list_remote_run_receipts = service(_peers.list_remote_run_receipts)
remote_run_receipt = service(_peers.remote_run_receipt)
probe_hosted_room = threaded(_peers.probe_hosted_room)
probe_peer_room_reservation = threaded(_peers.probe_peer_room_reservation)

"""Peer routing functions of the seed-compatible facade: links, grants, reservations, receipts, probes.

Same names, keyword arguments, return shapes, error classes and messages as the reference
``gateway.hosted_rooms``, annotated with its loose types (mappings in, ``dict[str, Any]`` out: the service's typed
records, cast); ``db_path`` may be a SQLite path, a URL or an Engine. All but the probes use the
facade's cached, migrated engine, resolved only after the arguments validated (bad input never creates
or migrates a database). The probes never use it: they must not create or migrate a store.

Identifier limits are read once per call from ``hostedrooms.compat.hosted_rooms`` (falling back to
:mod:`hostedrooms.limits`; :func:`~hostedrooms.compat._rooms_api.facade_limits`), so lowering
``MAX_ROOM_ID_CHARS`` / ``MAX_ACTOR_ID_CHARS`` there takes effect.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from typing import Any, cast

from sqlalchemy import Engine

from .. import peers
from ..db import Target
from ..records import RemoteRunIdentity, RemoteRunRecord, RoomLinkRecord
from ._engine import engine_for
from ._rooms_api import facade_limits

__all__ = [
    "delete_room_link_records",
    "list_remote_run_receipts",
    "list_room_link_records",
    "peer_room_grant_is_current",
    "peer_room_is_reserved",
    "probe_hosted_room",
    "probe_peer_room_reservation",
    "remote_run_receipt",
    "reserve_peer_room",
    "revoke_room_grant_scope",
    "room_grant_is_revoked",
    "update_room_link_status",
    "upsert_remote_run_receipt",
    "upsert_room_link_record",
]

def _engine(db_path: Target) -> functools.partial[Engine]:
    # Resolved by the service after validation, so bad input never creates or migrates a database.
    return functools.partial(engine_for, db_path)




def list_room_link_records(db_path: Target) -> list[dict[str, Any]]:
    """Return private RoomLink records without logging or formatting grants."""
    return cast("list[dict[str, Any]]", peers.list_room_link_records(_engine(db_path)))


def upsert_room_link_record(db_path: Target, *, record: Mapping[str, Any], max_links: int) -> None:
    """Atomically insert or replace one private RoomLink record."""
    peers.upsert_room_link_record(_engine(db_path), record=cast(RoomLinkRecord, record), max_links=max_links)


def update_room_link_status(
    db_path: Target, *, room_id: str, member_id: str, status: str, now: float | None = None
) -> bool:
    """Persist a non-secret route health classification."""
    return peers.update_room_link_status(
        _engine(db_path), room_id=room_id, member_id=member_id, status=status, now=now)


def delete_room_link_records(db_path: Target, *, room_id: str) -> int:
    """Delete persisted peer routes after their target grants are revoked."""
    return peers.delete_room_link_records(_engine(db_path), room_id=room_id)


def revoke_room_grant_scope(
    db_path: Target, *, claims: Mapping[str, Any], expires_at: float, now: float | None = None
) -> None:
    """Revoke every grant issued at or before now for one exact room scope."""
    peers.revoke_room_grant_scope(_engine(db_path), claims=claims, expires_at=expires_at, now=now)


def reserve_peer_room(
    db_path: Target, *, claims: Mapping[str, Any], expires_at: float, now: float | None = None
) -> None:
    """Fence direct Desktop prompts before the first peer run is admitted."""
    peers.reserve_peer_room(_engine(db_path), claims=claims, expires_at=expires_at, now=now, limits=facade_limits())


def peer_room_is_reserved(db_path: Target, *, room_id: str, target_profile: str, now: float | None = None) -> bool:
    """Return whether a live target-side RoomLink reservation fences Desktop."""
    return peers.peer_room_is_reserved(
        _engine(db_path), room_id=room_id, target_profile=target_profile, now=now, limits=facade_limits())


def peer_room_grant_is_current(db_path: Target, *, claims: Mapping[str, Any], now: float | None = None) -> bool:
    """Require a grant to match the target's current live reservation."""
    return peers.peer_room_grant_is_current(_engine(db_path), claims=claims, now=now, limits=facade_limits())


def room_grant_is_revoked(db_path: Target, *, claims: Mapping[str, Any], now: float | None = None) -> bool:
    """Return whether a grant predates its exact scope's revocation fence."""
    return peers.room_grant_is_revoked(_engine(db_path), claims=claims, now=now)


def upsert_remote_run_receipt(db_path: Target, *, record: Mapping[str, Any], now: float | None = None) -> None:
    """Durably bind one logical peer task attempt to its remote run handle."""
    peers.upsert_remote_run_receipt(_engine(db_path), record=cast(RemoteRunRecord, record), now=now)


def list_remote_run_receipts(
    db_path: Target, *, room_id: str | None = None, target_profile: str | None = None, session_id: str | None = None
) -> list[dict[str, Any]]:
    """Return remote run handles in durable task order."""
    return cast("list[dict[str, Any]]", peers.list_remote_run_receipts(
        _engine(db_path), room_id=room_id, target_profile=target_profile, session_id=session_id))


def remote_run_receipt(db_path: Target, *, record: Mapping[str, Any]) -> dict[str, Any] | None:
    """Return the exact durable remote run handle for one task attempt."""
    receipt = peers.remote_run_receipt(_engine(db_path), record=cast(RemoteRunIdentity, record))
    return cast("dict[str, Any] | None", receipt)


def probe_hosted_room(db_path: Target, *, room_id: Any) -> bool:
    """Check room ownership without creating or migrating the shared store; fails fast under contention."""
    return peers.probe_hosted_room(db_path, room_id=room_id, limits=facade_limits())


def probe_peer_room_reservation(
    db_path: Target, *, room_id: Any, target_profile: Any, now: float | None = None
) -> bool:
    """Check a peer reservation without creating or migrating shared state."""
    return peers.probe_peer_room_reservation(
        db_path, room_id=room_id, target_profile=target_profile, now=now, limits=facade_limits())

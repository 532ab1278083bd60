"""Replicas for asyncio: each coroutine is :mod:`hostedrooms.replicas`' function of the same name, derived from
it, taking an AsyncEngine."""

from __future__ import annotations

from .. import replicas as _replicas
from .derive import service

__all__ = ["demote_room", "ingest_page", "promote_replica", "prune_disbanded_replicas", "replica_state",
           "reset_replica_latest"]

ingest_page = service(_replicas.ingest_page)
replica_state = service(_replicas.replica_state)
promote_replica = service(_replicas.promote_replica)
demote_room = service(_replicas.demote_room)
prune_disbanded_replicas = service(_replicas.prune_disbanded_replicas)
reset_replica_latest = service(_replicas.reset_replica_latest)

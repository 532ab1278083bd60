"""Drop-in replacement for the reference ``gateway.hosted_room_replicas`` module.

Switch with one import change (``from hostedrooms.compat import hosted_room_replicas``); ``db_path`` may be a
SQLite file path, a SQLAlchemy URL string, or an Engine, and names the same database as the room facade. The
local gateway is what this module's ``local_authority_gateway_id()`` returns (``install:$HOSTEDROOMS_INSTALL_ID``),
looked up at each call after the arguments validated, as the reference does: replacing it with
``monkeypatch.setattr(hosted_room_replicas, "local_authority_gateway_id", ...)`` takes effect. Calls without
``now=`` read this module's ``time.time()`` at call time, so replacing ``hosted_room_replicas.time`` works too.

Limits are read at call time: a ``MAX_*`` constant set on THIS module wins (the reference binds
``MAX_REPLICA_*``, ``MAX_ACTOR_ID_CHARS``, ``MAX_EVENT_JSON_BYTES`` and ``MAX_ROOM_ID_CHARS`` here), every
other limit comes from :mod:`hostedrooms.compat.hosted_rooms`, so lowering a limit on either module takes effect.
"""

from __future__ import annotations

import functools
import sys
import time
from typing import Any, cast

from .. import replicas as _replicas
from ..errors import HostedRoomError, ReplicaEpochRegressionError, ReplicaError, ReplicaGapError, RoomConflictError
from ..limits import (
    MAX_ACTOR_ID_CHARS,
    MAX_EVENT_JSON_BYTES,
    MAX_REPLICA_EVENT_BYTES,
    MAX_REPLICA_ROOMS,
    MAX_ROOM_ID_CHARS,
    LimitValues,
)
from . import _rooms_api
from ._engine import engine_for
from ._rooms_api import DbPath, local_authority_gateway_id

__all__ = [
    "MAX_ACTOR_ID_CHARS",
    "MAX_EVENT_JSON_BYTES",
    "MAX_REPLICA_EVENT_BYTES",
    "MAX_REPLICA_ROOMS",
    "MAX_ROOM_ID_CHARS",
    "HostedRoomError",
    "ReplicaEpochRegressionError",
    "ReplicaError",
    "ReplicaGapError",
    "RoomConflictError",
    "demote_room",
    "ingest_page",
    "local_authority_gateway_id",
    "promote_replica",
    "replica_state",
]


def _limits() -> LimitValues:
    """The limits of one call, read now: this module's own constants first, then the room facade's."""
    return _rooms_api.facade_limits(sys.modules[__name__])


def _engine(db_path: DbPath) -> functools.partial[Any]:
    # Resolved by the service after validation, so bad input never creates or migrates a database.
    return functools.partial(engine_for, db_path)


def _local_gateway() -> str:
    """This module's ``local_authority_gateway_id``, looked up now (callers and test suites replace it)."""
    return local_authority_gateway_id()  # a global: replacing the module attribute replaces what runs here


def _now(now: float | None) -> float | None:
    """``now``, else this module's ``time.time()`` read now (callers and test suites replace ``time``)."""
    return time.time() if now is None else now


def ingest_page(
    db_path: DbPath, *, room_id: Any, room_name: Any, members: Any, page: Any, now: float | None = None
) -> dict[str, Any]:
    """Persist one replay page for ``room_id``; idempotent, gap- and epoch-regression-safe."""
    return cast("dict[str, Any]", _replicas.ingest_page(
        _engine(db_path), room_id=room_id, room_name=room_name, members=members, page=page, now=_now(now),
        limits=_limits()))


def replica_state(db_path: DbPath, *, room_id: Any) -> dict[str, Any]:
    """Return the stored replica's coverage and authority lineage."""
    return cast("dict[str, Any]", _replicas.replica_state(_engine(db_path), room_id=room_id, limits=_limits()))


def promote_replica(
    db_path: DbPath, *, room_id: Any, reason: Any = "authority-unreachable", now: float | None = None
) -> dict[str, Any]:
    """Continue a replicated room on THIS gateway at ``epoch + 1``."""
    return cast("dict[str, Any]", _replicas.promote_replica(
        _engine(db_path), room_id=room_id, reason=reason, now=_now(now), local_gateway_id=_local_gateway,
        limits=_limits()))


def demote_room(
    db_path: DbPath, *, room_id: Any, observed_gateway_id: Any, observed_epoch: Any, now: float | None = None
) -> dict[str, Any]:
    """Fence THIS gateway's stale room authority against a proven newer epoch."""
    return cast("dict[str, Any]", _replicas.demote_room(
        _engine(db_path), room_id=room_id, observed_gateway_id=observed_gateway_id, observed_epoch=observed_epoch,
        now=_now(now), local_gateway_id=_local_gateway, limits=_limits()))

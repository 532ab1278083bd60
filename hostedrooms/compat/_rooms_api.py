"""Room and event functions of the seed-compatible facade, with its constants and exception classes.

Each wrapper takes ``db_path`` first (a SQLite file path, a SQLAlchemy URL string, or an Engine) and the
reference's keyword arguments, and calls :mod:`hostedrooms.rooms`. Like the reference, it is annotated with loose
types: ``Any`` arguments, and ``dict[str, Any]`` results (the service's typed result, cast: the same dict; but
``read_events``' page has the reference's keys only, without the store's ``lineage``). The
``MAX_*`` limits are read once per call (:func:`facade_limits`) from ``hostedrooms.compat.hosted_rooms`` (which
re-exports them) and passed down, so lowering one there takes effect. The engine is resolved only after the
arguments validated, so bad input never creates or migrates a database.
"""

from __future__ import annotations

import functools
import os
import sys
from pathlib import Path
from types import ModuleType
from typing import Any, cast

from .. import rooms as _rooms
from ..db import DATABASE_URL_ENV, Target
from ..errors import (
    AuthorityConflictError,
    AuthoritySupersededError,
    EventConflictError,
    HostedRoomError,
    RoomConflictError,
    RoomHistoryExpiredError,
    RoomNotFoundError,
    RoomProbeUnavailableError,
)
from ..limits import (
    CONTROL_EVENT_BYTE_RESERVE,
    CONTROL_EVENT_COUNT_RESERVE,
    DISBANDED_ROOM_RETENTION_SECONDS,
    MAX_ACTIVE_ROOMS,
    MAX_ACTOR_ID_CHARS,
    MAX_ACTOR_JSON_BYTES,
    MAX_ACTOR_LABEL_CHARS,
    MAX_DISBANDED_ROOM_TOMBSTONES,
    MAX_EVENT_ID_CHARS,
    MAX_EVENT_JSON_BYTES,
    MAX_EVENT_KIND_CHARS,
    MAX_EVENTS_PER_ROOM,
    MAX_GATEWAY_EVENT_BYTES,
    MAX_LOG_LIMIT,
    MAX_LOG_PAGE_BYTES,
    MAX_MEMBERS,
    MAX_MEMBERS_JSON_BYTES,
    MAX_ROOM_EVENT_BYTES,
    MAX_ROOM_ID_CHARS,
    MAX_ROOM_LIST_LIMIT,
    MAX_ROOM_NAME_CHARS,
    PROTOCOL_VERSION,
    LimitValues,
)
from ._engine import engine_for, local_gateway_id

__all__ = [
    "CONTROL_EVENT_BYTE_RESERVE",
    "CONTROL_EVENT_COUNT_RESERVE",
    "DISBANDED_ROOM_RETENTION_SECONDS",
    "HERMES_HOME_ENV",
    "MAX_ACTIVE_ROOMS",
    "MAX_ACTOR_ID_CHARS",
    "MAX_ACTOR_JSON_BYTES",
    "MAX_ACTOR_LABEL_CHARS",
    "MAX_DISBANDED_ROOM_TOMBSTONES",
    "MAX_EVENTS_PER_ROOM",
    "MAX_EVENT_ID_CHARS",
    "MAX_EVENT_JSON_BYTES",
    "MAX_EVENT_KIND_CHARS",
    "MAX_GATEWAY_EVENT_BYTES",
    "MAX_LOG_LIMIT",
    "MAX_LOG_PAGE_BYTES",
    "MAX_MEMBERS",
    "MAX_MEMBERS_JSON_BYTES",
    "MAX_ROOM_EVENT_BYTES",
    "MAX_ROOM_ID_CHARS",
    "MAX_ROOM_LIST_LIMIT",
    "MAX_ROOM_NAME_CHARS",
    "PROTOCOL_VERSION",
    "AuthorityConflictError",
    "AuthoritySupersededError",
    "DbPath",
    "EventConflictError",
    "HostedRoomError",
    "RoomConflictError",
    "RoomHistoryExpiredError",
    "RoomNotFoundError",
    "RoomProbeUnavailableError",
    "append_event",
    "claim_authority",
    "create_room",
    "default_db_path",
    "disband_room",
    "list_rooms",
    "local_authority_gateway_id",
    "prune_disbanded_rooms",
    "read_events",
    "rename_room",
    "request_room_stop",
    "room_state",
    "user_event_id",
]

#: What ``db_path`` may be: a filesystem path (SQLite), a SQLAlchemy URL string, or an Engine.
DbPath = Target
#: The hermes home the reference derives its default database from (``~/.hermes`` when unset).
HERMES_HOME_ENV = "HERMES_HOME"
_FACADE = "hostedrooms.compat.hosted_rooms"


def _facade() -> ModuleType:
    """The module callers patch: the public facade, else (not imported yet) this one."""
    return sys.modules.get(_FACADE) or sys.modules[__name__]


def facade_limits(*first: object) -> LimitValues:
    """The limits of one facade call, read now: each from the first of ``first`` that defines it, else from the
    public facade module (callers lower its ``MAX_*`` constants), else :mod:`hostedrooms.limits`."""
    return LimitValues.read(*first, _facade())


def _engine(db_path: DbPath) -> functools.partial[Any]:
    # Resolved by the service after validation, so bad input never creates or migrates a database.
    return functools.partial(engine_for, db_path)


def default_db_path() -> Path | str:
    """The gateway-wide database: ``$HOSTEDROOMS_DATABASE_URL`` when set, else ``state.db`` in the hermes root.

    Like the reference, a profile home ``<root>/profiles/<name>`` maps to ``<root>/state.db`` and any other home
    to ``<home>/state.db``; the home is ``$HERMES_HOME`` or ``~/.hermes``.
    """
    url = os.environ.get(DATABASE_URL_ENV, "").strip()
    if url:
        return url
    home = Path(os.environ.get(HERMES_HOME_ENV) or "~/.hermes").expanduser()
    return (home.parent.parent if home.parent.name == "profiles" else home) / "state.db"


def local_authority_gateway_id() -> str:
    """The stable server-owned identity for hosted-room authority: ``install:$HOSTEDROOMS_INSTALL_ID``."""
    return local_gateway_id()


def user_event_id(client_event_id: Any) -> str:
    """Map a client retry key into the server-owned user-event namespace."""
    return _rooms.user_event_id(client_event_id, limits=facade_limits())


def create_room(
    db_path: DbPath, *, room_id: Any, name: Any, members: Any, authority_gateway_id: Any, now: float | None = None
) -> dict[str, Any]:
    """Create a room, or return the identical existing room idempotently."""
    return cast("dict[str, Any]", _rooms.create_room(
        _engine(db_path), room_id=room_id, name=name, members=members, authority_gateway_id=authority_gateway_id,
        now=now, limits=facade_limits()))


def list_rooms(
    db_path: DbPath, *, include_disbanded: bool = False, limit: int | None = None, offset: int = 0
) -> list[dict[str, Any]]:
    """Return one bounded read-only page ordered by most recent change."""
    return cast("list[dict[str, Any]]", _rooms.list_rooms(
        _engine(db_path), include_disbanded=include_disbanded, limit=limit, offset=offset, limits=facade_limits()))


def rename_room(db_path: DbPath, *, room_id: Any, event_id: Any, name: Any, now: float | None = None) -> dict[str, Any]:
    """Rename a live room and append its replay event atomically."""
    return cast("dict[str, Any]", _rooms.rename_room(
        _engine(db_path), room_id=room_id, event_id=event_id, name=name, now=now, limits=facade_limits()))


def append_event(
    db_path: DbPath, *, room_id: Any, event_id: Any, kind: Any, actor: Any, payload: Any,
    authority_gateway_id: Any = None, authority_epoch: Any = None, now: float | None = None,
) -> dict[str, Any]:
    """Append one immutable event and allocate its per-room sequence atomically."""
    return cast("dict[str, Any]", _rooms.append_event(
        _engine(db_path), room_id=room_id, event_id=event_id, kind=kind, actor=actor, payload=payload,
        authority_gateway_id=authority_gateway_id, authority_epoch=authority_epoch, now=now, limits=facade_limits()))


def room_state(db_path: DbPath, *, room_id: Any, include_disbanded: bool = False) -> dict[str, Any]:
    """Return durable replay and authority state for one room."""
    return cast("dict[str, Any]", _rooms.room_state(
        _engine(db_path), room_id=room_id, include_disbanded=include_disbanded, limits=facade_limits()))


def request_room_stop(
    db_path: DbPath, *, room_id: Any, cancel_id: Any, expected_gateway_id: Any, expected_epoch: Any
) -> dict[str, Any]:
    """Append an idempotent fence that supersedes earlier user turns.

    Like the reference, this goes through the module's ``append_event``, looked up at call time, so a caller
    that replaces ``hosted_rooms.append_event`` sees stop requests too.
    """
    module = _facade()
    stop = _rooms.room_stop_event(cancel_id=cancel_id, expected_gateway_id=expected_gateway_id,
                                  expected_epoch=expected_epoch, limits=facade_limits())
    append: Any = getattr(module, "append_event", append_event)
    result: dict[str, Any] = append(db_path, room_id=room_id, **stop)
    return result


def claim_authority(
    db_path: DbPath, *, room_id: Any, expected_gateway_id: Any, expected_epoch: Any, new_gateway_id: Any,
    event_id: Any, now: float | None = None,
) -> dict[str, Any]:
    """Fence a verified authority transfer with a compare-and-swap epoch."""
    return cast("dict[str, Any]", _rooms.claim_authority(
        _engine(db_path), room_id=room_id, expected_gateway_id=expected_gateway_id, expected_epoch=expected_epoch,
        new_gateway_id=new_gateway_id, event_id=event_id, now=now, limits=facade_limits()))


def disband_room(
    db_path: DbPath, *, room_id: Any, expected_gateway_id: Any, expected_epoch: Any, now: float | None = None
) -> dict[str, Any]:
    """Tombstone a room id permanently and idempotently."""
    return cast("dict[str, Any]", _rooms.disband_room(
        _engine(db_path), room_id=room_id, expected_gateway_id=expected_gateway_id, expected_epoch=expected_epoch,
        now=now, limits=facade_limits()))


def read_events(
    db_path: DbPath, *, room_id: Any, since_seq: Any = 0, limit: Any = 100, include_disbanded: bool = False
) -> dict[str, Any]:
    """Read a monotonic room-log delta after ``since_seq``.

    The page has exactly the reference's keys (``events``, ``cursor``, ``latest_seq``, ``has_more``,
    ``authority``): the store's ``lineage``, which :func:`hostedrooms.rooms.read_events` adds for followers and
    standbys, is left out, so code comparing whole pages (as the reference's own tests do) sees the same dict.
    """
    page = _rooms.read_events(
        _engine(db_path), room_id=room_id, since_seq=since_seq, limit=limit, include_disbanded=include_disbanded,
        limits=facade_limits())
    return {"events": page["events"], "cursor": page["cursor"], "latest_seq": page["latest_seq"],
            "has_more": page["has_more"], "authority": page["authority"]}


def prune_disbanded_rooms(db_path: DbPath, *, now: float | None = None) -> int:
    """Purge deleted Group Chat payloads while reserving their identities."""
    return _rooms.prune_disbanded_rooms(_engine(db_path), now=now, limits=facade_limits())

"""Rooms and their append-only event log, with authority fencing (the native service).

Every public function takes an :class:`~sqlalchemy.Engine` first, then the reference implementation's keyword
arguments, validates all of them before touching the database, runs in one transaction (one
:class:`~hostedrooms.uow.UnitOfWork`) and returns the reference's dict shapes (typed in
:mod:`hostedrooms.records`), errors and messages.

Limits (``MAX_*``) are read at call time from ``limits=`` (default: :mod:`hostedrooms.limits`), so tests and
operators can lower them, and the compat facade passes its own module so lowering a limit there works too.

The package, by concern: :mod:`.rules` (validation, :class:`PreparedEvent`), :mod:`.rows` (row mappers, replay
page checks), :mod:`.transaction` (:class:`RoomTransaction`, :func:`run_room_write`, and the concurrency
argument), :mod:`.events` (append, read), :mod:`.lifecycle` (create, rename, claim, disband, prune) and
:mod:`.follow` (the live log). Every statement they run is a method of the backend's
:class:`hostedrooms.store.RoomStore`.
"""

from __future__ import annotations

from ..engines import EngineSource
from .events import append_event, append_events, read_events, request_room_stop
from .follow import follow
from .lifecycle import (
    claim_authority,
    create_room,
    disband_room,
    list_rooms,
    prune_disbanded_rooms,
    rename_room,
    room_state,
)
from .pages import decode_rows, event_page_checker, event_to_dict, room_to_dict
from .rules import (
    CONTROL_EVENT_KINDS,
    EVENT_KINDS_BY_ACTOR,
    PreparedEvent,
    max_event_bytes,
    payload_json,
    room_stop_event,
    system_actor_json,
    user_event_id,
    validate_actor_id,
    validate_event_id,
    validate_event_kind,
    validate_members,
    validate_room_id,
    validate_room_name,
)
from .transaction import (
    ROOM_CREATION_LOCK_KEY,
    NeedExclusiveGatewayLock,
    RoomChange,
    RoomTransaction,
    run_room_write,
)

__all__ = [
    "CONTROL_EVENT_KINDS",
    "EVENT_KINDS_BY_ACTOR",
    "ROOM_CREATION_LOCK_KEY",
    "EngineSource",
    "NeedExclusiveGatewayLock",
    "PreparedEvent",
    "RoomChange",
    "RoomTransaction",
    "append_event",
    "append_events",
    "claim_authority",
    "create_room",
    "decode_rows",
    "disband_room",
    "event_page_checker",
    "event_to_dict",
    "follow",
    "list_rooms",
    "max_event_bytes",
    "payload_json",
    "prune_disbanded_rooms",
    "read_events",
    "rename_room",
    "request_room_stop",
    "room_state",
    "room_stop_event",
    "room_to_dict",
    "run_room_write",
    "system_actor_json",
    "user_event_id",
    "validate_actor_id",
    "validate_event_id",
    "validate_event_kind",
    "validate_members",
    "validate_room_id",
    "validate_room_name",
]

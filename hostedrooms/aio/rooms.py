"""The rooms service for asyncio: each coroutine is :mod:`hostedrooms.rooms`' function of the same name, derived
from it (same arguments, results, errors and messages), taking an AsyncEngine. ``follow`` is
:func:`hostedrooms.aio.follow.follow`, and ``open_follow`` (:func:`hostedrooms.aio.follow.open_follow`) is ``follow``
with the room checked first."""

from __future__ import annotations

from .. import rooms as _rooms
from .derive import service
from .follow import follow, open_follow

__all__ = [
    "append_event",
    "append_events",
    "claim_authority",
    "create_room",
    "disband_room",
    "follow",
    "list_rooms",
    "open_follow",
    "prune_disbanded_rooms",
    "read_events",
    "rename_room",
    "request_room_stop",
    "room_state",
    "run_room_write",
]

append_event = service(_rooms.append_event)
append_events = service(_rooms.append_events)
read_events = service(_rooms.read_events)
request_room_stop = service(_rooms.request_room_stop)
create_room = service(_rooms.create_room)
list_rooms = service(_rooms.list_rooms)
room_state = service(_rooms.room_state)
rename_room = service(_rooms.rename_room)
claim_authority = service(_rooms.claim_authority)
disband_room = service(_rooms.disband_room)
prune_disbanded_rooms = service(_rooms.prune_disbanded_rooms)
run_room_write = service(_rooms.run_room_write)

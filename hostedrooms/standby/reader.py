"""One pass's reads of a source for a replicator (:class:`SourceReader`), every value validated before any use.

A listing head (:func:`head_problem`), a page (:func:`~hostedrooms.replicas.validate_page`) and a room's name and
members are checked before the replicator uses them: a bad value refuses that room only, with a reason naming the
room and the field; an exception of the source's own becomes a
:class:`~hostedrooms.standby.source.SourceProtocolError`. Pages are charged to the pass's page and byte bounds.

Memory: one page per room being read (one room at a time, or one per worker), plus a small head per room of one
pass's listing (at most ``max_rooms_per_pass``); never a whole log. Names and members are read from the source
when a room is first replicated and again when a page holds a rename or a claim.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..errors import HostedRoomError
from ..limits import Limits, in_force
from ..replicas import CheckedPage, validate_page
from ..rooms import rules as room_rules
from ..validation import INT64_MAX, MAX_EPOCH, identifier
from .bounds import PassBounds
from .heads import RoomHead
from .source import PageSource, RoomInfo, SourceProtocolError, call_source

__all__ = ["EXTRA_CACHED_INFOS", "SourceReader", "head_problem"]

#: Room infos kept beyond one pass's rooms (a cache; cleared when a listing outgrows it).
EXTRA_CACHED_INFOS = 1024

#: Event kinds after which a room's name or members may differ (a rename; a claim adopting a legacy room).
_INFO_KINDS = frozenset({"room.renamed", "authority.claimed"})


@dataclass(frozen=True, slots=True)
class SourceReader:
    """Reads ``source`` for one pass: pages of ``page_limit`` events charged to ``bounds``, and room infos kept in
    ``infos`` (the replicator's cache, which outlives the pass)."""

    source: PageSource
    page_limit: int
    limits: Limits | None
    bounds: PassBounds
    infos: dict[str, RoomInfo]

    def page(self, room_id: str, since: int, *, extra: int = 0) -> CheckedPage:
        """The source's page of ``room_id`` after ``since`` (``extra`` events more than ``page_limit``, within
        MAX_LOG_LIMIT), validated (SourceProtocolError names the room and the field), charged to the pass's page
        and byte bounds."""
        self.bounds.charge_page()
        limit = min(self.page_limit + extra, max(self.page_limit, int(in_force(self.limits).MAX_LOG_LIMIT)))
        raw = call_source("page", self.source.read_events, room_id, since_seq=since, limit=limit)
        try:
            page = validate_page(raw, room_id=room_id, limits=self.limits)
            if len(page.events) > limit:
                raise HostedRoomError(f"page.events holds more than the {limit} events asked for")
        except HostedRoomError as exc:
            raise SourceProtocolError(f"the source's page of room {room_id!r} after seq {since} is invalid: "
                                      f"{exc}") from None
        self.bounds.charge_bytes(page.size)
        return page

    def room_info(self, room_id: str, page: CheckedPage) -> RoomInfo:
        """The cached name and members, read again from the source when ``page`` renames or claims the room."""
        info = self.infos.get(room_id)
        if info is None or any(event.event.kind in _INFO_KINDS for event in page.events):
            info = self.infos[room_id] = self._checked_info(room_id)
        return info

    def _checked_info(self, room_id: str) -> RoomInfo:
        info = call_source("room info", self.source.room_info, room_id)
        lim = in_force(self.limits)
        try:
            if not isinstance(info, RoomInfo):
                raise HostedRoomError("it is not a RoomInfo")
            if info.room_id != room_id:
                raise HostedRoomError("room_id: another room's")
            room_rules.validate_room_name(info.name, lim)
            room_rules.validate_members(info.members, lim)
        except HostedRoomError as exc:
            raise SourceProtocolError(f"the source's room info of room {room_id!r} is invalid: {exc}") from None
        return info


def _int_within(value: Any, low: int, high: int) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and low <= value <= high


def head_problem(head: RoomHead, lim: Limits) -> str:
    """Why a listing head cannot be used ("" when every field is valid); the caller checked ``room_id`` is a str."""
    try:
        if room_rules.validate_room_id(head.room_id, lim) != head.room_id:
            return "room_id: invalid room_id"
    except HostedRoomError as exc:
        return f"room_id: {exc}"
    try:
        if identifier(head.authority_gateway_id, error=HostedRoomError, label="authority_gateway_id",
                      max_chars=lim.MAX_ACTOR_ID_CHARS) != head.authority_gateway_id:
            return "authority_gateway_id: invalid authority_gateway_id"
    except HostedRoomError as exc:
        return str(exc)
    if not _int_within(head.authority_epoch, 1, MAX_EPOCH):
        return "authority_epoch must be an integer from 1 to the largest epoch"
    if not _int_within(head.latest_seq, 0, INT64_MAX):
        return "latest_seq must be an integer from 0 to 2**63-1"
    if not isinstance(head.disbanded, bool):
        return "disbanded must be a boolean"
    return ""

"""The proof a returning authority's replicator needs before it demotes a room (:class:`Proofs`).

The source's log must continue this gateway's local room: read from seq 1, exactly the local events up to the
local head (ids and content), then, before any event of a newer epoch, an ``authority.claimed`` naming this
gateway at the local epoch as the previous authority. Anything else (another gateway's room of the same name, a
listing that only claims a newer epoch, a claim naming another previous authority, local events the source never
got) raises :class:`Refused` with the reason.

A proof returns the head it was proven against (:class:`~hostedrooms.demotion.ProvenHead`): the demoting write is
conditioned on it. A proof cut short by a pass bound resumes on the next pass where it stopped: the local log
below its head never changes, and a source whose store lineage changed is read again from seq 1.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Engine

from ..demotion import ProvenHead
from ..limits import Limits
from ..replicas import CheckedPage
from ..rooms import read_events as read_local_events
from .heads import RoomHead

__all__ = ["LocalLog", "Proofs", "Refused", "claims_from"]


class Refused(Exception):
    """A room-level refusal found by the replicator itself (not by a service)."""


#: No lineage read yet.
_UNREAD: Any = object()


@dataclass(frozen=True, slots=True)
class LocalLog:
    """Reads of the local store's room log, a page at a time."""

    engine: Engine
    page_limit: int
    limits: Limits | None

    def events(self, room_id: str, head: int, since: int) -> Iterator[dict[str, Any]]:
        """The local log of ``room_id`` after seq ``since`` up to seq ``head``."""
        while since < head:
            page = read_local_events(self.engine, room_id=room_id, since_seq=since,
                                     limit=min(self.page_limit, 500), include_disbanded=True, limits=self.limits)
            events = page["events"]
            if not events:
                return
            for event in events:
                if int(event["seq"]) > head:
                    return
                yield dict(event)
            since = int(events[-1]["seq"])

    def event_id(self, room_id: str, seq: int) -> str | None:
        """The id of the local event at ``seq`` (None for seq 0)."""
        if seq == 0:
            return None
        page = read_local_events(self.engine, room_id=room_id, since_seq=seq - 1, limit=1, include_disbanded=True,
                                 limits=self.limits)
        events = page["events"]
        if not events or int(events[0]["seq"]) != seq:
            raise Refused(f"the local log of this room holds no event at its seq {seq}")
        return str(events[0]["event_id"])


@dataclass(slots=True)
class _Progress:
    """How far one room's proof got: the source's log equals the local log up to seq ``matched``, read from a
    source store of ``lineage``, for ``gateway`` at ``epoch``."""

    gateway: str
    epoch: int
    lineage: Any = _UNREAD
    matched: int = 0


class Proofs:
    """Demotion proofs by room, each resumable across passes (at most one entry per room being demoted)."""

    def __init__(self) -> None:
        self._rooms: dict[str, _Progress] = {}

    def keep_only(self, room_ids: set[str]) -> None:
        """Forget rooms a whole listing no longer holds."""
        for room_id in [room_id for room_id in self._rooms if room_id not in room_ids]:
            del self._rooms[room_id]

    def prove(self, room_id: str, local: RoomHead, gateway: str, read_page: Callable[[int], CheckedPage],
              log: Callable[[], LocalLog]) -> tuple[str, int, ProvenHead]:
        """The source's current lineage (gateway, epoch) and the local head it was proven against, once the
        source's log (``read_page(since)``) is proven to continue ``gateway``'s local room (see the module
        docstring); raises Refused otherwise. An exception from ``read_page`` (a pass bound) keeps the progress."""
        epoch, local_log = local.authority_epoch, log()
        progress = self._rooms.get(room_id)
        if progress is None or (progress.gateway, progress.epoch) != (gateway, epoch) or (
                progress.matched > local.latest_seq):
            progress = self._rooms[room_id] = _Progress(gateway, epoch)
        since = progress.matched
        mine = local_log.events(room_id, local.latest_seq, since)
        try:
            while True:
                page = read_page(since)
                if progress.lineage is not _UNREAD and page.lineage != progress.lineage:  # again from seq 1
                    progress.lineage, progress.matched, since = page.lineage, 0, 0
                    mine = local_log.events(room_id, local.latest_seq, 0)
                    continue
                progress.lineage = page.lineage
                observed = _prove_page(page, since, local, gateway, mine, progress, local_log.limits)
                if observed is not None:
                    del self._rooms[room_id]
                    return (*observed, ProvenHead(local.latest_seq, local_log.event_id(room_id, local.latest_seq),
                                                  epoch))
                since = page.events[-1].seq
        except Refused:
            self._rooms.pop(room_id, None)
            raise


def _prove_page(page: CheckedPage, since: int, local: RoomHead, gateway: str, mine: Iterator[dict[str, Any]],
                progress: _Progress, limits: Limits | None) -> tuple[str, int] | None:
    """Check one page of the proof: the source's lineage once the claim is found, else None (read on)."""
    epoch = local.authority_epoch
    if not page.events:
        if since < local.latest_seq:
            raise Refused(f"local events after seq {since} are missing from the source (its log ends there): it "
                          "does not continue this room")
        raise Refused(f"the source's log holds no authority.claimed naming {gateway} at epoch {epoch} after seq "
                      f"{local.latest_seq}: it does not continue this room")
    if page.events[0].seq != since + 1:
        raise Refused(f"the source's page after seq {since} does not start at seq {since + 1}")
    for event in page.events:
        kind, event_epoch = event.event.kind, event.event.authority_epoch
        if event.seq <= local.latest_seq:
            record = next(mine, None)
            if record is None:
                raise Refused(f"the local log of this room ends before its seq {local.latest_seq}")
            if event.same_record(record, limits):
                progress.matched = event.seq
                continue
            if kind == "authority.claimed" and claims_from(event.event.payload_json, gateway, epoch):
                raise Refused(f"local events from seq {event.seq} to {local.latest_seq} are missing from the "
                              f"source (its claim is at seq {event.seq}): they were written here after its last "
                              "copy")
            raise Refused(f"the source's event at seq {event.seq} is not this room's (another event id or "
                          "content): it does not continue this room")
        if kind == "authority.claimed":
            if event_epoch == epoch + 1 and claims_from(event.event.payload_json, gateway, epoch):
                if page.epoch <= epoch or page.gateway_id == gateway:
                    raise Refused("the source's page authority does not hold a newer epoch")
                return page.gateway_id, page.epoch
            raise Refused(f"the source's claim at seq {event.seq} does not name {gateway} at epoch {epoch} as "
                          "the previous authority")
        if event_epoch is None or event_epoch > epoch:
            raise Refused(f"the source's seq {event.seq} was written at epoch {event_epoch} before any claim from "
                          f"{gateway} at epoch {epoch}")
    return None


def claims_from(payload_json: str, gateway: str, epoch: int) -> bool:
    """Whether a validated ``authority.claimed`` payload names (``gateway``, ``epoch``) as the previous authority
    (both claim paths write ``previous_gateway_id`` and the new ``authority_epoch``, ``epoch + 1``)."""
    payload = json.loads(payload_json)
    value = payload.get("authority_epoch") if isinstance(payload, dict) else None
    return (isinstance(payload, dict) and payload.get("previous_gateway_id") == gateway
            and isinstance(value, int) and not isinstance(value, bool) and value == epoch + 1)

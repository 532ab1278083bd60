"""Fencing a silent authority in its own store, reading up to the fence, and giving a fence back.

* :func:`fence_planned` demotes one room of the old authority in its store to this gateway at ``epoch + 1``
  (``authority.lost``), conditioned, under the room's lock, on the room being no bigger than the standby planned
  to hold: a room is fenced only if this gateway can take it over;
* :func:`read_fence` recognises a room fenced earlier (by this gateway's earlier run, or by another standby):
  the fence is the room's last event, since nothing can write the room after it in the old authority's store;
* :class:`FencedSource` serves each fenced room as the old authority left it (its lineage and events up to the
  fence), so a catch-up reads every write the old authority acknowledged and nothing else;
* :func:`release_fence` gives a fenced room back to the old authority when this standby cannot promote it after
  all: first this store records that the room moved on past the fence (so no promotion at the fence's epoch can
  happen here any more), then the old authority's store gets ``authority.claimed`` naming it again at
  ``epoch + 2``. A release stopped between the two is finished by the next failover run.
"""

from __future__ import annotations

import bisect
from collections.abc import Hashable, Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Engine

from .. import rooms as room_services
from ..demotion import demote_room, lost_event_id
from ..engines import EngineSource, resolve_engine
from ..errors import HostedRoomError, RoomNotFoundError, StoreConfigurationError, StoreUnavailableError
from ..identity import local_gateway_id as resolve_local_gateway_id
from ..limits import Limits, in_force
from ..replicas import supersede_replica
from ..validation import identifier
from .heads import LISTING_PAGE, RoomHead, TakeoverHead, all_room_heads
from .source import EnginePageSource, RoomInfo, SourceProtocolError

__all__ = ["Fence", "FencedSource", "block_promotion", "fence_authority", "fence_planned", "give_back", "read_fence",
           "release_fence", "released_event_id"]

#: Errors that make a store unusable: raised, never charged to one room.
STORE_ERRORS = (StoreUnavailableError, StoreConfigurationError)


@dataclass(frozen=True, slots=True)
class Fence:
    """One room of the old authority fenced in its own store: the lineage it wrote (``gateway``, ``epoch``) and
    the last seq it committed before the fence (``seq``), or why it could not be fenced (``refused``); ``at``: the
    fence's timestamp (as its writer's clock stamped it)."""

    room_id: str
    gateway: str
    epoch: int
    seq: int = 0
    refused: str = ""
    at: float = 0.0


def released_event_id(epoch: int) -> str:
    """The id of the ``authority.claimed`` event that gives a fenced room back to its old authority at ``epoch``."""
    return f"system:authority-released:{epoch}"


def fence_planned(engine: Engine, head: TakeoverHead, allowance: tuple[int, int], *, silent: str, local: str,
                  now: float | None, limits: Limits | None) -> Fence:
    """Fence ``head``'s room in the old authority's store, provided it holds at most ``allowance`` (events,
    bytes): what this gateway planned to take over (DemotionStaleError when it grew past that: nothing changed)."""
    demote_room(engine, room_id=head.room_id, observed_gateway_id=local, observed_epoch=head.authority_epoch + 1,
                now=now, local_gateway_id=silent, limits=limits, max_size=allowance)
    fence = read_fence(engine, head.room_id, holder=local, epoch=head.authority_epoch + 1, silent=silent,
                       limits=limits)
    if fence is None:
        raise HostedRoomError("the fence is not the room's last event")
    return fence


def read_fence(engine: Engine, room_id: str, *, holder: str, epoch: int, silent: str,
               limits: Limits | None) -> Fence | None:
    """The fence of ``room_id`` in the old authority's store if the room is held by ``holder`` at ``epoch``
    through a fence from ``silent`` (``authority.lost`` as its last event), else None."""
    try:
        latest = int(room_services.read_events(engine, room_id=room_id, since_seq=0, limit=1, include_disbanded=True,
                                               limits=limits)["latest_seq"])
        last = room_services.read_events(engine, room_id=room_id, since_seq=max(latest - 1, 0), limit=1,
                                         include_disbanded=True, limits=limits)
    except STORE_ERRORS:
        raise
    except HostedRoomError:
        return None
    event: Any = last["events"][-1] if last["events"] else {}
    fenced = (event.get("event_id") == lost_event_id(epoch)
              and last["authority"] == {"gateway_id": holder, "epoch": epoch}
              and isinstance(event.get("payload"), dict)
              and event["payload"].get("previous_gateway_id") == silent)
    return Fence(room_id, silent, epoch - 1, seq=latest - 1, at=float(event["created_at"])) if fenced else None


def fence_authority(
    source: EngineSource, *, from_gateway: Any, local_gateway_id: Any = None, now: float | None = None,
    limits: Limits | None = None,
) -> dict[str, Fence]:
    """Fence EVERY live room of ``from_gateway`` in its own store ``source`` to this gateway at ``epoch + 1``,
    whether or not this gateway can promote it, and return every room fenced (by this call or an earlier one)
    by ``room_id``; a room that could not be fenced is returned with ``refused`` set. Idempotent.

    An operator's tool: a room fenced here that no standby then promotes has no writer until a failover run
    promotes or releases it. :func:`~hostedrooms.standby.failover.failover` fences only the rooms it planned to
    promote.

    :param source: the silent authority's store: an :class:`~sqlalchemy.Engine`, or a zero-argument factory.
    :param from_gateway: the silent authority's gateway id.
    :param local_gateway_id: this gateway's id (default: the configured one).
    :param now: the fence time in Unix seconds (default: the wall clock).
    :param limits: the limits in force (default: :mod:`hostedrooms.limits`).
    :returns: every fenced room's :class:`Fence`, by room id.
    :raises HostedRoomError: ``from_gateway`` is invalid or is this gateway.
    :raises MisuseError: ``source`` is not a SQLAlchemy Engine.
    :raises StorageError: the store failed underneath.
    """
    lim = in_force(limits)
    silent = identifier(from_gateway, error=HostedRoomError, label="from_gateway", max_chars=lim.MAX_ACTOR_ID_CHARS)
    local = resolve_local_gateway_id(local_gateway_id)
    if silent == local:
        raise HostedRoomError("from_gateway is this gateway: failover takes rooms over from another gateway")
    engine = resolve_engine(source)
    fences: dict[str, Fence] = {}
    for head in sorted(all_room_heads(engine).values(), key=lambda head: head.room_id):
        if head.disbanded or head.authority_gateway_id not in (silent, local):
            continue
        fence = _fence_room(engine, head, silent, local, now, limits)
        if fence is not None:
            fences[head.room_id] = fence
    return fences


def _fence_room(engine: Engine, head: RoomHead, silent: str, local: str, now: float | None,
                limits: Limits | None) -> Fence | None:
    epoch = head.authority_epoch
    if head.authority_gateway_id == silent:
        try:
            demote_room(engine, room_id=head.room_id, observed_gateway_id=local, observed_epoch=epoch + 1,
                        now=now, local_gateway_id=silent, limits=limits)
        except STORE_ERRORS:
            raise
        except HostedRoomError as exc:  # moved on meanwhile (claimed, disbanded), or at the largest epoch
            return Fence(head.room_id, silent, epoch, refused=f"could not be fenced in {silent}'s store: {exc}")
        epoch += 1
    fence = read_fence(engine, head.room_id, holder=local, epoch=epoch, silent=silent, limits=limits)
    if fence is None and head.authority_gateway_id == silent:
        return Fence(head.room_id, silent, epoch - 1, refused="the fence is not the room's last event")
    return fence  # None: this gateway's room in that store for another reason, not one of the old authority's


def release_fence(authority: Engine, standby: Engine, fence: Fence, *, local: str, now: float | None,
                  limits: Limits | None) -> None:
    """Give ``fence``'s room back to the old authority at ``epoch + 2`` (see the module docstring). Raises the
    refusal of either step; a rerun repeats both (each is idempotent)."""
    block_promotion(authority, standby, fence, now=now, limits=limits)
    give_back(authority, fence, holder=local, now=now, limits=limits)


def block_promotion(authority: Engine, standby: Engine, fence: Fence, *, now: float | None,
                    limits: Limits | None, unless_retired: bool = False) -> None:
    """The first half of a release: record in the fence holder's store ``standby`` that the room moved on to the
    old authority at ``epoch + 2``, so the holder can no longer promote it at the fence's epoch. Refused
    (RoomConflictError) when the holder already promoted it or, with ``unless_retired``, holds its id retired
    (a room promoted there and disbanded since: giving it back would revive it). Serialised with promotion in
    the holder's store; idempotent."""
    state = room_services.room_state(authority, room_id=fence.room_id, include_disbanded=True, limits=limits)
    supersede_replica(standby, room_id=fence.room_id, room_name=str(state["name"]), members=state["members"],
                      authority_gateway_id=fence.gateway, authority_epoch=fence.epoch + 2,
                      latest_seq=fence.seq + 2, now=now, limits=limits, unless_retired=unless_retired)


def give_back(authority: Engine, fence: Fence, *, holder: str, now: float | None, limits: Limits | None) -> None:
    """The second half of a release (only after :func:`block_promotion`): ``authority.claimed`` naming the old
    authority again at ``epoch + 2`` in its own store, compared and swapped against the fence (``holder`` at
    ``epoch + 1``). An exact rerun replays."""
    released = fence.epoch + 2
    room_services.claim_authority(authority, room_id=fence.room_id, expected_gateway_id=holder,
                                  expected_epoch=fence.epoch + 1, new_gateway_id=fence.gateway,
                                  event_id=released_event_id(released), now=now, limits=limits)


class FencedSource:
    """A :class:`~hostedrooms.standby.source.PageSource` over the old authority's store showing each fenced room
    as the old authority left it: its lineage before the fence and its events up to the fence (the fence itself,
    and any room not fenced, are not shown). What it serves is checked by the replicator like any source's.

    :param source: the old authority's store.
    :param fences: the fences by room id (refused ones are left out).
    :param holder: the gateway the rooms were fenced to.
    """

    def __init__(self, source: EnginePageSource, fences: dict[str, Fence], *, holder: str) -> None:
        self.source = source
        self.holder = holder  # the gateway the rooms were fenced to
        self.fences = {room_id: fence for room_id, fence in fences.items() if not fence.refused}
        self._order = sorted(self.fences)

    def list_rooms(self, *, after: str | None = None, limit: int = LISTING_PAGE) -> Sequence[RoomHead]:
        start = 0 if after is None else bisect.bisect_right(self._order, after)
        return [RoomHead(room_id, self.fences[room_id].gateway, self.fences[room_id].epoch, self.fences[room_id].seq,
                         False) for room_id in self._order[start:start + limit]]

    def room_info(self, room_id: str) -> RoomInfo:
        self._fence(room_id)
        return self.source.room_info(room_id)

    def read_events(self, room_id: str, *, since_seq: int, limit: int) -> dict[str, Any]:
        fence = self._fence(room_id)
        authority = {"gateway_id": fence.gateway, "epoch": fence.epoch}
        if since_seq >= fence.seq:
            return {"events": [], "cursor": since_seq, "latest_seq": fence.seq, "has_more": False,
                    "authority": authority}
        page = self.source.read_events(room_id, since_seq=since_seq, limit=min(limit, fence.seq - since_seq))
        if page.get("authority") != {"gateway_id": self.holder, "epoch": fence.epoch + 1}:
            raise SourceProtocolError("the fenced room moved on in the old authority's store")
        events = [event for event in page["events"] if isinstance(event, dict) and event.get("seq", 0) <= fence.seq]
        cursor = int(events[-1]["seq"]) if events else since_seq
        return {"events": events, "cursor": cursor, "latest_seq": fence.seq, "has_more": cursor < fence.seq,
                "authority": authority}

    def change_token(self) -> Hashable | None:
        return None

    def describe(self) -> str:
        return f"{self.source.describe()} (fenced)"

    def close(self) -> None:
        self.source.close()

    def _fence(self, room_id: str) -> Fence:
        fence = self.fences.get(room_id)
        if fence is None:
            raise RoomNotFoundError("hosted room not found")
        return fence

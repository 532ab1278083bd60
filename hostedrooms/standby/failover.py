"""Take over every room of a silent authority at once (:func:`failover`).

For each replica this store holds of ``from_gateway``'s rooms, :func:`failover` promotes it at ``epoch + 1``
(``promote_replica``: one transaction per room, the capacity gates of an append, the claim event) or reports
why it could not: the replica is not caught up with what the authority last reported, the room was disbanded,
the local store already holds a room with that id, or a capacity limit refused it. A dry run reports the same
decisions without writing (the byte budgets are checked only by a real promotion).

Whether the authority is really gone is the caller's decision: promotion is safe only once the old authority
can no longer commit. ``catch_up_from`` (``hostedrooms failover --catch-up-from``) reads what it committed after
the standby's last page before promoting:

* from its **store** (an :class:`~hostedrooms.standby.source.EnginePageSource`), the old authority is first
  **fenced in its own store** (:func:`fence_authority`): each of its rooms is demoted there to the lineage this
  gateway is about to claim (this gateway at ``epoch + 1``, with ``authority.lost``: the compare-and-swap of
  every room write, and exactly what the old authority's replicator would do on its return), so its next write
  at the old epoch fails with AuthorityConflictError whether or not it knows it was replaced. The catch-up then
  reads each fenced room up to the fence (:class:`FencedSource`) and only fenced rooms are promoted: every
  write the old authority acknowledged is in the new log. A room it creates after the fence stays its own.
* from its **page endpoint** (HTTP), nothing can be fenced: a write it commits after the catch-up read its
  room is left behind on the old lineage. Stop it (or cut it off from its store) first.

Two failovers at once promote each room once: the run that finds a room already promoted here by another run
reports it ``taken-over``, which counts as done. When the old authority returns, replicate from this gateway back
into its store: the replicator demotes each room this failover took that is not fenced already (see
:class:`~hostedrooms.standby.replicator.Replicator`).
"""

from __future__ import annotations

import bisect
import logging
import time
from collections.abc import Hashable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from sqlalchemy import Engine

from .. import rooms as room_services
from ..engines import EngineSource, resolve_engine
from ..errors import (
    HostedRoomError,
    ReplicaError,
    RoomConflictError,
    RoomNotFoundError,
    StoreConfigurationError,
    StoreUnavailableError,
)
from ..identity import local_gateway_id as resolve_local_gateway_id
from ..limits import Limits, in_force
from ..replicas import demote_room, promote_replica
from ..validation import identifier
from .heads import LISTING_PAGE, RoomHead, all_replica_heads, all_room_heads, disbanded_replicas
from .replicator import PassReport, Replicator
from .source import EnginePageSource, PageSource, RoomInfo, SourceProtocolError

_log = logging.getLogger(__name__)

__all__ = [
    "CAPACITY",
    "CONFLICT",
    "DISBANDED",
    "NOT_CAUGHT_UP",
    "NOT_FENCED",
    "PROMOTED",
    "REFUSED",
    "TAKEN_OVER",
    "WOULD_PROMOTE",
    "FailoverReport",
    "Fence",
    "FencedSource",
    "RoomFailover",
    "failover",
    "fence_authority",
]

PROMOTED = "promoted"
WOULD_PROMOTE = "would-promote"  # dry run
NOT_CAUGHT_UP = "not-caught-up"
DISBANDED = "disbanded"
CONFLICT = "conflict"  # the local store already holds (or retired) the room id
CAPACITY = "capacity"
REFUSED = "refused"  # anything else promote_replica refused
TAKEN_OVER = "taken-over"  # another failover run promoted it here meanwhile (done: counts as promoted)
NOT_FENCED = "not-fenced"  # the old authority's store holds the room but it could not be fenced there


@dataclass(frozen=True, slots=True)
class RoomFailover:
    """What failover did (or, in a dry run, would do) for one replica."""

    room_id: str
    outcome: str
    previous_epoch: int
    last_seq: int
    latest_seq: int
    epoch: int | None = None  # the new epoch, once promoted (or the one a dry run would take)
    claim_seq: int | None = None
    reason: str = ""

    @property
    def promoted(self) -> bool:
        """Promoted (or, in a dry run, would be) by this run."""
        return self.outcome in (PROMOTED, WOULD_PROMOTE)

    @property
    def done(self) -> bool:
        """The room ended promoted here, by this run or by another one."""
        return self.promoted or self.outcome == TAKEN_OVER


@dataclass
class FailoverReport:
    from_gateway: str
    local_gateway: str
    dry_run: bool
    rooms: list[RoomFailover] = field(default_factory=list)
    #: With ``catch_up_from``: the catch-up pass (None without one). When it stopped early (``error``), nothing
    #: was promoted and ``rooms`` is empty.
    catch_up: PassReport | None = None
    #: With a store to catch up from: the rooms fenced in the old authority's store (by this run or an earlier
    #: one), in ``room_id`` order.
    fenced: list[str] = field(default_factory=list)

    @property
    def promoted(self) -> list[RoomFailover]:
        return [room for room in self.rooms if room.promoted]

    @property
    def taken_over(self) -> list[RoomFailover]:
        return [room for room in self.rooms if room.outcome == TAKEN_OVER]

    @property
    def not_promoted(self) -> list[RoomFailover]:
        return [room for room in self.rooms if not room.done]

    @property
    def ok(self) -> bool:
        """Every replica of the silent authority ended (or would end) promoted here, by this run or another one,
        disbanded rooms aside; and the catch-up, if any, completed."""
        if self.catch_up is not None and self.catch_up.error:
            return False
        return all(room.done or room.outcome == DISBANDED for room in self.rooms)

    def summary(self) -> str:
        verb = "would promote" if self.dry_run else "promoted"
        left, taken = len(self.not_promoted), len(self.taken_over)
        return (f"{verb} {len(self.promoted)} of {len(self.rooms)} rooms of {self.from_gateway} on "
                f"{self.local_gateway}" + (f"; {taken} taken over by another run" if taken else "")
                + (f"; {left} not promoted" if left else ""))


# --- fencing the old authority in its own store ----------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Fence:
    """One room of the old authority fenced in its own store: the lineage it wrote (``gateway``, ``epoch``) and
    the last seq it committed before the fence (``seq``), or why it could not be fenced (``refused``)."""

    room_id: str
    gateway: str
    epoch: int
    seq: int = 0
    refused: str = ""


def fence_authority(
    source: EngineSource, *, from_gateway: Any, local_gateway_id: Any = None, now: float | None = None,
    limits: Limits | None = None,
) -> dict[str, Fence]:
    """Fence ``from_gateway`` in its own store ``source``: demote each of its live rooms there to this gateway
    at ``epoch + 1`` (``demote_room``: a fenced compare-and-swap appending ``authority.lost``), so its next write
    at the old epoch fails with AuthorityConflictError; return every room fenced, by this call or an earlier one
    (held there by this gateway after an ``authority.lost`` from ``from_gateway``), with the last seq the old
    authority committed, by ``room_id``. A room that could not be fenced is returned with ``refused`` set.
    Storage errors that make the store unusable are raised. Idempotent.
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
        except (StoreUnavailableError, StoreConfigurationError):
            raise
        except HostedRoomError as exc:  # moved on meanwhile (claimed, disbanded), or at the largest epoch
            return Fence(head.room_id, silent, epoch, refused=f"could not be fenced in {silent}'s store: {exc}")
        epoch += 1
    # Nothing is written to the room after authority.lost (its old authority is refused, and this gateway writes
    # to its own store): the fence is the room's last event, and what came before it is the old authority's.
    try:
        latest = int(room_services.read_events(engine, room_id=head.room_id, since_seq=0, limit=1,
                                               include_disbanded=True, limits=limits)["latest_seq"])
        last = room_services.read_events(engine, room_id=head.room_id, since_seq=max(latest - 1, 0), limit=1,
                                         include_disbanded=True, limits=limits)
    except (StoreUnavailableError, StoreConfigurationError):
        raise
    except HostedRoomError as exc:
        return Fence(head.room_id, silent, epoch - 1, refused=f"its fence could not be read: {exc}")
    fence_event: Any = last["events"][-1] if last["events"] else {}
    fenced = (fence_event.get("event_id") == f"system:authority-lost:{epoch}"
              and last["authority"] == {"gateway_id": local, "epoch": epoch}
              and isinstance(fence_event.get("payload"), dict)
              and fence_event["payload"].get("previous_gateway_id") == silent)
    if not fenced:
        if head.authority_gateway_id == local:
            return None  # this gateway's room in that store for another reason: not one of the old authority's
        return Fence(head.room_id, silent, epoch - 1, refused="the fence is not the room's last event")
    return Fence(head.room_id, silent, epoch - 1, seq=latest - 1)


class FencedSource:
    """A :class:`~hostedrooms.standby.source.PageSource` over the old authority's store showing each fenced room
    as the old authority left it: its lineage before the fence and its events up to the fence (the fence itself,
    and any room not fenced, are not shown). What it serves is checked by the replicator like any source's."""

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


def failover(
    target: EngineSource,
    *,
    from_gateway: Any,
    local_gateway_id: Any = None,
    dry_run: bool = False,
    reason: str = "authority-unreachable",
    now: float | None = None,
    limits: Limits | None = None,
    catch_up_from: PageSource | None = None,
) -> FailoverReport:
    """Promote every caught-up replica of ``from_gateway`` in ``target`` (this gateway's store), in ``room_id``
    order, and report each room's outcome (see the module docstring). ``local_gateway_id`` defaults to
    ``install:$HOSTEDROOMS_INSTALL_ID``. Storage errors that make the store unusable (unreachable, missing
    schema) are raised; a room's refusal never stops the others.

    ``catch_up_from``: the old authority, still readable, replicated from first (one pass; the caller closes it).
    An :class:`~hostedrooms.standby.source.EnginePageSource` (its store) is fenced first and only the rooms fenced
    in it are promoted (:func:`fence_authority`); any other source (its page endpoint) cannot be fenced. When the
    catch-up stops early (``report.catch_up.error``), nothing is promoted; rooms fenced by then stay fenced, and a
    later run picks them up.
    """
    lim = in_force(limits)
    silent = identifier(from_gateway, error=HostedRoomError, label="from_gateway", max_chars=lim.MAX_ACTOR_ID_CHARS)
    local = resolve_local_gateway_id(local_gateway_id)
    if silent == local:
        raise HostedRoomError("from_gateway is this gateway: failover takes rooms over from another gateway")
    if dry_run and catch_up_from is not None:
        raise HostedRoomError("a dry run writes nothing: it cannot catch up (replicate first instead)")
    engine = resolve_engine(target)
    report = FailoverReport(silent, local, dry_run)
    fences: dict[str, Fence] | None = None
    if catch_up_from is not None:
        source: PageSource = catch_up_from
        if isinstance(catch_up_from, EnginePageSource):
            fences = fence_authority(catch_up_from.engine, from_gateway=silent, local_gateway_id=local, now=now,
                                     limits=limits)
            report.fenced = [room_id for room_id, fence in fences.items() if not fence.refused]
            source = FencedSource(catch_up_from, fences, holder=local)
        report.catch_up = Replicator(source, engine, local_gateway_id=local, limits=limits).sync_once()
        if report.catch_up.error:
            return report
    replicas = sorted((head for head in all_replica_heads(engine).values() if head.authority_gateway_id == silent),
                      key=lambda head: head.room_id)
    local_rooms = all_room_heads(engine)
    disbanded = disbanded_replicas(engine, [head.room_id for head in replicas])
    active = sum(1 for room in local_rooms.values() if not room.disbanded)
    for head in replicas:
        base = RoomFailover(head.room_id, "", head.authority_epoch, head.last_seq, head.latest_seq)
        fence = None if fences is None else fences.get(head.room_id)
        if head.room_id in local_rooms and _taken_over(local_rooms[head.room_id], base, local):
            report.rooms.append(_taken(base, local_rooms[head.room_id].authority_epoch))
        elif not head.caught_up:
            report.rooms.append(replace(base, outcome=NOT_CAUGHT_UP, reason=(
                f"the replica holds seq {head.last_seq} of the {head.latest_seq} the authority reported")))
        elif head.room_id in disbanded:
            report.rooms.append(replace(base, outcome=DISBANDED, reason="the room was disbanded"))
        elif head.room_id in local_rooms:
            report.rooms.append(replace(base, outcome=CONFLICT, reason=(
                "the local store already holds a room with this id")))
        elif fences is not None and (fence is None or fence.refused):
            report.rooms.append(replace(base, outcome=NOT_FENCED, reason=(
                fence.refused if fence is not None else f"{silent}'s store does not hold the room as its own")))
        elif fence is not None and (fence.epoch, fence.seq) != (head.authority_epoch, head.last_seq):
            report.rooms.append(replace(base, outcome=NOT_CAUGHT_UP, reason=(
                f"the replica holds seq {head.last_seq} at epoch {head.authority_epoch}; {silent} was fenced at "
                f"seq {fence.seq}, epoch {fence.epoch}")))
        elif dry_run:
            if active >= lim.MAX_ACTIVE_ROOMS:
                report.rooms.append(replace(base, outcome=CAPACITY, reason=(
                    f"this gateway would then host more than {lim.MAX_ACTIVE_ROOMS} active rooms")))
                continue
            active += 1
            report.rooms.append(replace(base, outcome=WOULD_PROMOTE, epoch=head.authority_epoch + 1))
        else:
            report.rooms.append(_promote(engine, head.room_id, base, reason, now, local, limits))
    _log_failover(report)
    return report


def _promote(engine: Any, room_id: str, base: RoomFailover, reason: str, now: float | None, local: str,
             limits: Limits | None) -> RoomFailover:
    try:
        promoted = promote_replica(engine, room_id=room_id, reason=reason, now=time.time() if now is None else now,
                                   local_gateway_id=local, limits=limits)
    except (StoreUnavailableError, StoreConfigurationError):
        raise
    except (ReplicaError, RoomConflictError) as exc:
        taken = _taken_over_meanwhile(engine, base, local, limits)
        if taken is not None:
            return taken
        if isinstance(exc, RoomConflictError):
            return replace(base, outcome=CONFLICT, reason=str(exc))
        outcome = NOT_CAUGHT_UP if "not caught up" in str(exc) else DISBANDED if "disbanded" in str(exc) else REFUSED
        return replace(base, outcome=outcome, reason=str(exc))
    except HostedRoomError as exc:  # the capacity gates raise the plain class with the append's messages
        return replace(base, outcome=CAPACITY, reason=str(exc))
    return replace(base, outcome=PROMOTED, epoch=int(promoted["authority_epoch"]),
                        claim_seq=int(promoted["claim_seq"]))


def _taken_over(room: RoomHead, base: RoomFailover, local: str) -> bool:
    """Whether the local room is this replica promoted here by another run (this gateway at the next epoch)."""
    return room.authority_gateway_id == local and room.authority_epoch == base.previous_epoch + 1


def _taken(base: RoomFailover, epoch: int) -> RoomFailover:
    return replace(base, outcome=TAKEN_OVER, epoch=epoch, reason="promoted here by another failover run")


def _taken_over_meanwhile(engine: Engine, base: RoomFailover, local: str,
                          limits: Limits | None) -> RoomFailover | None:
    """After a refused promotion: the room as another run promoted it meanwhile, or None."""
    try:
        state = room_services.room_state(engine, room_id=base.room_id, include_disbanded=True, limits=limits)
    except (StoreUnavailableError, StoreConfigurationError):
        raise
    except HostedRoomError:  # no such room here: the refusal stands
        return None
    room = RoomHead(base.room_id, str(state["authority_gateway_id"]), int(state["authority_epoch"]), 0, False)
    return _taken(base, room.authority_epoch) if _taken_over(room, base, local) else None


def _log_failover(report: FailoverReport) -> None:
    """Each room's outcome (a warning where it was not promoted), then the summary (hostedrooms.logs)."""
    for room in report.rooms:
        level = logging.INFO if room.done or room.outcome == DISBANDED else logging.WARNING
        _log.log(level, "failover of room %s: %s", room.room_id, room.outcome, extra={
            "event": "failover.room", "room": room.room_id, "gateway": report.local_gateway,
            "from_gateway": report.from_gateway, "outcome": room.outcome, "epoch": room.epoch,
            "reason": room.reason or None, "dry_run": report.dry_run})
    _log.info("failover: %s", report.summary(), extra={
        "event": "failover.done", "gateway": report.local_gateway, "from_gateway": report.from_gateway,
        "rooms": len(report.rooms), "promoted": len(report.promoted), "dry_run": report.dry_run})

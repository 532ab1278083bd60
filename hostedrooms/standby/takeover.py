"""Failover from a silent authority whose store is still reachable: plan, fence, catch up, promote.

Each step is conditioned on what the step before it established, so a run that stops anywhere leaves nothing a
rerun cannot finish, and no room without a writer:

1. **Plan** (:class:`Plan`): for each live room of the old authority in its store, read its head (last seq,
   that event's id, bytes) and decide whether this gateway can promote it: the id is free here (no room, not
   retired), and an active-room slot, a replica slot and the bytes (the room's and the gateway's limits, with
   the claim event) are left, counting the rooms planned before it. A room that cannot be promoted is reported
   left with the old authority, with the reason, and is never fenced.
2. **Fence** only the planned rooms, each at exactly the head it was planned with (:func:`.fence.fence_planned`:
   ``demote_room`` conditioned on that head). A room the old authority wrote meanwhile is planned again from its
   new head, a few times, then left with it. Two standbys racing fence each room once: the loser finds the room
   held by the winner through a fence (:func:`.fence.read_fence`) and reports it taken over by that gateway.
3. **Catch up** through :class:`.fence.FencedSource`: every write the old authority acknowledged before its
   fence, and nothing else.
4. **Promote** each fenced room. A room this gateway cannot promote after all (its own writes used the bytes
   meanwhile, a page was refused) is **released** (:func:`.fence.release_fence`), so the old authority keeps it.

A rerun finds rooms fenced for this gateway by an earlier run (and half-released ones) and finishes them.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, replace

from sqlalchemy import Engine

from .. import rooms as room_services
from ..errors import DemotionStaleError, HostedRoomError, ReplicaError, RoomConflictError
from ..limits import Limits, in_force
from ..replicas import promote_replica, promotion_claim
from .fence import STORE_ERRORS, Fence, FencedSource, fence_planned, read_fence, release_fence
from .heads import (
    ReplicaHead,
    RoomHead,
    TakeoverHead,
    TakeoverUsage,
    all_replica_heads,
    all_room_heads,
    takeover_heads,
    takeover_usage,
)
from .outcomes import (
    CAPACITY,
    CONFLICT,
    DISBANDED,
    FENCED,
    NOT_CAUGHT_UP,
    NOT_FENCED,
    PROMOTED,
    REFUSED,
    RELEASED,
    TAKEN_OVER,
    FailoverReport,
    RoomFailover,
)
from .replicator import Replicator
from .reports import BEHIND, RoomReport
from .source import EnginePageSource
from .steps import step

__all__ = ["FENCE_ATTEMPTS", "Plan", "fenced_failover", "is_taken_over", "promote_one", "taken_over_here"]

#: Times a room the old authority keeps writing is planned and fenced again before it is left with it.
FENCE_ATTEMPTS = 3


@dataclass
class Plan:
    """What this gateway can still take on, counted down as rooms are planned (see the module docstring)."""

    limits: Limits
    silent: str
    local: str
    reason: str
    usage: TakeoverUsage
    local_rooms: dict[str, RoomHead]
    replicas: dict[str, ReplicaHead]

    def __post_init__(self) -> None:
        self.active, self.size, self.replica_count = (
            self.usage.active_rooms, self.usage.event_bytes, self.usage.replicas)
        self.planned = 0

    def refusal(self, head: TakeoverHead) -> tuple[str, str] | None:
        """Why this gateway cannot promote ``head``'s room (outcome, reason), else None (then counted as planned)."""
        lim, room_id = self.limits, head.room_id
        if room_id in self.local_rooms:
            return CONFLICT, "this gateway's store already holds a room with this id"
        if room_id in self.usage.retired:
            return CONFLICT, "this gateway's store retired this room id (a disbanded room of its own)"
        if self.active >= int(lim.MAX_ACTIVE_ROOMS):
            return CAPACITY, f"this gateway would then host more than {lim.MAX_ACTIVE_ROOMS} active rooms"
        replica = self.replicas.get(room_id)
        if replica is None and self.replica_count >= int(lim.MAX_REPLICA_ROOMS):
            return CAPACITY, f"this gateway holds {lim.MAX_REPLICA_ROOMS} replicas: no slot for this room's"
        if replica is not None and (replica.authority_epoch > head.authority_epoch or (
                replica.authority_epoch == head.authority_epoch
                and replica.authority_gateway_id != head.authority_gateway_id)):
            return REFUSED, "this gateway's replica of the room is of another lineage"
        problem = self._size_problem(head)
        if problem:
            return CAPACITY, problem
        self._reserve(head, 1)
        return None

    def unreserve(self, head: TakeoverHead) -> None:
        """Forget a planned room (before it is planned again from a newer head)."""
        self._reserve(head, -1)

    def _reserve(self, head: TakeoverHead, sign: int) -> None:
        self.active += sign
        self.replica_count += sign * (head.room_id not in self.replicas)
        self.size += sign * (head.event_bytes + self._claim_size(head))
        self.planned += sign

    def allowance(self, head: TakeoverHead) -> tuple[int, int]:
        """The (events, bytes) ``head``'s room may hold when it is fenced: what the room and replica limits allow,
        and its size now plus an equal share of the gateway bytes no planned room takes."""
        lim, claim = self.limits, self._claim_size(head)
        share = max(0, int(lim.MAX_GATEWAY_EVENT_BYTES) - self.size) // max(1, self.planned)
        size = min(head.event_bytes + share, int(lim.MAX_REPLICA_EVENT_BYTES),
                   int(lim.MAX_ROOM_EVENT_BYTES) + int(lim.CONTROL_EVENT_BYTE_RESERVE) - claim)
        return int(lim.MAX_EVENTS_PER_ROOM) + int(lim.CONTROL_EVENT_COUNT_RESERVE) - 1, max(size, head.event_bytes)

    def _claim_size(self, head: TakeoverHead) -> int:
        return promotion_claim(self.silent, self.local, head.authority_epoch + 1, self.reason, self.limits).size

    def _size_problem(self, head: TakeoverHead) -> str:
        lim, claim = self.limits, self._claim_size(head)
        if head.latest_seq >= int(lim.MAX_EVENTS_PER_ROOM) + int(lim.CONTROL_EVENT_COUNT_RESERVE):
            return "the room's history is full here: no room for the claim event"
        if head.event_bytes + claim > int(lim.MAX_ROOM_EVENT_BYTES) + int(lim.CONTROL_EVENT_BYTE_RESERVE):
            return "the room's bytes and the claim event exceed this gateway's per-room byte limit"
        if head.event_bytes > int(lim.MAX_REPLICA_EVENT_BYTES):
            return "the room's bytes exceed this gateway's replica byte limit"
        gateway = int(lim.MAX_GATEWAY_EVENT_BYTES)
        if (self.size + head.event_bytes > gateway
                or self.size + head.event_bytes + claim > gateway + int(lim.CONTROL_EVENT_BYTE_RESERVE)):
            return f"the room's {head.event_bytes} bytes do not fit this gateway's byte budget"
        return ""


def fenced_failover(engine: Engine, source: EnginePageSource, report: FailoverReport, *, reason: str,
                    now: float | None, limits: Limits | None) -> None:
    """Plan, fence, catch up and promote (see the module docstring), filling ``report``."""
    authority, local = source.engine, report.local_gateway
    fences, planned, plan = _plan(engine, authority, report, reason, limits)
    step("failover.planned", gateway=local)
    for head in planned:
        fence = _fence(authority, head, plan, report, now, limits)
        if fence is not None:
            fences[head.room_id] = fence
    report.fenced = sorted(fences)
    step("failover.fenced", gateway=local)
    report.catch_up = Replicator(FencedSource(source, fences, holder=local), engine, local_gateway_id=local,
                                 limits=limits).sync_once()
    step("failover.caught_up", gateway=local)
    if report.catch_up.error:
        report.rooms += [_pending(fence, f"the catch-up stopped ({report.catch_up.error}); run failover again")
                         for _, fence in sorted(fences.items())]
    else:
        caught = {room.room_id: room for room in report.catch_up.rooms}
        replicas, local_rooms = all_replica_heads(engine), all_room_heads(engine)
        for room_id, fence in sorted(fences.items()):
            report.rooms.append(_finish(engine, authority, fence, caught.get(room_id), replicas.get(room_id),
                                        local_rooms.get(room_id), local, reason, now, limits))
    report.rooms.sort(key=lambda room: room.room_id)


def _plan(engine: Engine, authority: Engine, report: FailoverReport, reason: str,
          limits: Limits | None) -> tuple[dict[str, Fence], list[TakeoverHead], Plan]:
    """The rooms fenced for this gateway by an earlier run, and the old authority's rooms planned for fencing;
    every other room of the old authority is reported (taken over elsewhere, or left with it)."""
    silent, local = report.from_gateway, report.local_gateway
    ids = sorted(room_id for room_id, head in all_room_heads(authority).items() if not head.disbanded)
    heads = takeover_heads(authority, ids)
    plan = Plan(in_force(limits), silent, local, reason, takeover_usage(engine, ids), all_room_heads(engine),
                all_replica_heads(engine))
    fences: dict[str, Fence] = {}
    planned: list[TakeoverHead] = []
    for room_id in ids:
        head = heads.get(room_id)
        if head is None or head.disbanded:
            continue
        if head.authority_gateway_id != silent:
            fence = read_fence(authority, room_id, holder=head.authority_gateway_id, epoch=head.authority_epoch,
                               silent=silent, limits=limits)
            if fence is not None and head.authority_gateway_id == local:
                fences[room_id] = fence  # an earlier run's: this run finishes it
            elif fence is not None:
                report.rooms.append(_elsewhere(head, fence))
            continue
        refusal = plan.refusal(head)
        if refusal is None:
            planned.append(head)
        else:
            report.rooms.append(_left(head, silent, *refusal))
    decided = {room.room_id for room in report.rooms} | set(fences) | {head.room_id for head in planned}
    for replica in sorted(plan.replicas.values(), key=lambda replica: replica.room_id):
        if replica.authority_gateway_id == silent and replica.room_id not in decided:
            holder = heads[replica.room_id].authority_gateway_id if replica.room_id in heads else None
            report.rooms.append(RoomFailover(
                replica.room_id, NOT_FENCED, replica.authority_epoch, replica.last_seq, replica.latest_seq,
                holder=holder, reason=f"{silent}'s store does not hold the room as its own"
                + (f" ({holder} holds it there)" if holder else "")))
    return fences, planned, plan


def _fence(authority: Engine, head: TakeoverHead, plan: Plan, report: FailoverReport, now: float | None,
           limits: Limits | None) -> Fence | None:
    """Fence ``head``'s room within its planned allowance; planned again from its newer head when the old
    authority wrote past that meanwhile; reported and None when it cannot be fenced."""
    silent, local = report.from_gateway, report.local_gateway
    for _ in range(FENCE_ATTEMPTS):
        try:
            return fence_planned(authority, head, plan.allowance(head), silent=silent, local=local, now=now,
                                 limits=limits)
        except STORE_ERRORS:
            raise
        except HostedRoomError as exc:
            refused = None if isinstance(exc, DemotionStaleError) else exc
        plan.unreserve(head)
        current = takeover_heads(authority, [head.room_id]).get(head.room_id)
        if current is None or current.disbanded:
            return None
        if current.authority_gateway_id != silent:  # another standby (or another run of this one) fenced it first
            fence = read_fence(authority, head.room_id, holder=current.authority_gateway_id,
                               epoch=current.authority_epoch, silent=silent, limits=limits)
            if fence is not None and current.authority_gateway_id == local:
                return fence
            if fence is not None:
                report.rooms.append(_elsewhere(current, fence))
            else:
                report.rooms.append(_left(current, current.authority_gateway_id, NOT_FENCED,
                                          f"{silent} gave it to {current.authority_gateway_id} meanwhile"))
            return None
        if refused is not None:
            report.rooms.append(_left(current, silent, NOT_FENCED, f"it could not be fenced: {refused}"))
            return None
        refusal = plan.refusal(current)
        if refusal is not None:
            report.rooms.append(_left(current, silent, *refusal))
            return None
        head = current
    report.rooms.append(_left(head, silent, NOT_FENCED, f"{silent} kept writing past what this gateway can hold "
                                                        "while this run fenced it"))
    return None


def _finish(engine: Engine, authority: Engine, fence: Fence, caught: RoomReport | None, replica: ReplicaHead | None,
            local_room: RoomHead | None, local: str, reason: str, now: float | None,
            limits: Limits | None) -> RoomFailover:
    """Promote one fenced room, or release it when this gateway cannot; a room still behind stays fenced."""
    base = RoomFailover(fence.room_id, "", fence.epoch, replica.last_seq if replica else 0, fence.seq)
    if local_room is not None and is_taken_over(local_room, base, local):
        return taken_over_here(base, local_room.authority_epoch, local)
    if replica is not None and (replica.authority_gateway_id, replica.authority_epoch) == (fence.gateway,
                                                                                         fence.epoch + 2):
        return _release(engine, authority, fence, base, local, "a release started by an earlier run", now, limits)
    if caught is not None and caught.status == BEHIND:
        return _pending(fence, "the catch-up has not read it to its fence yet; run failover again")
    step("failover.promote", room_id=fence.room_id, gateway=local)
    outcome = promote_one(engine, fence.room_id, base, reason, now, local, limits)
    step("failover.promoted", room_id=fence.room_id, gateway=local)
    if outcome.done:
        return outcome
    return _release(engine, authority, fence, base, local, outcome.reason, now, limits)


def _release(engine: Engine, authority: Engine, fence: Fence, base: RoomFailover, local: str, why: str,
             now: float | None, limits: Limits | None) -> RoomFailover:
    try:
        release_fence(authority, engine, fence, local=local, now=now, limits=limits)
    except STORE_ERRORS:
        raise
    except HostedRoomError as exc:
        return _pending(fence, f"this gateway cannot promote it ({why}) and could not give it back: {exc}")
    return replace(base, outcome=RELEASED, epoch=fence.epoch + 2, holder=fence.gateway,
                   reason=f"given back to {fence.gateway} at epoch {fence.epoch + 2}: {why}")


def promote_one(engine: Engine, room_id: str, base: RoomFailover, reason: str, now: float | None, local: str,
                limits: Limits | None) -> RoomFailover:
    """Promote one replica: the outcome, ``taken-over`` when another run of this gateway promoted it."""
    try:
        promoted = promote_replica(engine, room_id=room_id, reason=reason, now=time.time() if now is None else now,
                                   local_gateway_id=local, limits=limits)
    except STORE_ERRORS:
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
                   claim_seq=int(promoted["claim_seq"]), holder=local)


def is_taken_over(room: RoomHead, base: RoomFailover, local: str) -> bool:
    """Whether the local room is this replica promoted here by another run (this gateway at the next epoch)."""
    return room.authority_gateway_id == local and room.authority_epoch == base.previous_epoch + 1


def taken_over_here(base: RoomFailover, epoch: int, holder: str) -> RoomFailover:
    return replace(base, outcome=TAKEN_OVER, epoch=epoch, holder=holder,
                   reason="promoted here by another failover run")


def _taken_over_meanwhile(engine: Engine, base: RoomFailover, local: str,
                          limits: Limits | None) -> RoomFailover | None:
    """After a refused promotion: the room as another run promoted it meanwhile, or None."""
    try:
        state = room_services.room_state(engine, room_id=base.room_id, include_disbanded=True, limits=limits)
    except STORE_ERRORS:
        raise
    except HostedRoomError:  # no such room here: the refusal stands
        return None
    room = RoomHead(base.room_id, str(state["authority_gateway_id"]), int(state["authority_epoch"]), 0, False)
    return taken_over_here(base, room.authority_epoch, local) if is_taken_over(room, base, local) else None


def _left(head: TakeoverHead, silent: str, outcome: str, reason: str) -> RoomFailover:
    return RoomFailover(head.room_id, outcome, head.authority_epoch, 0, head.latest_seq, holder=silent,
                        reason=f"left with {silent}: {reason}")


def _elsewhere(head: TakeoverHead, fence: Fence) -> RoomFailover:
    holder = head.authority_gateway_id
    return RoomFailover(head.room_id, TAKEN_OVER, fence.epoch, 0, fence.seq, epoch=head.authority_epoch,
                        holder=holder, reason=f"taken over by {holder} (another failover run fenced it first)")


def _pending(fence: Fence, reason: str) -> RoomFailover:
    return RoomFailover(fence.room_id, FENCED, fence.epoch, 0, fence.seq,
                        reason=f"fenced for this gateway, not promoted yet: {reason}")

"""The returning authority's side of an unfinished takeover: rooms a standby fenced here and never promoted.

``failover --catch-up-from`` fences a room in this gateway's store before it promotes it in the standby's own. A
failover stopped between the two (killed, its store unreachable) leaves the room with no writer until a rerun
finishes it, or until this gateway's replicator does: replicating from that standby's *store* (an engine source)
with ``source_gateway_id`` naming whose store it is, each pass looks for the local rooms fenced for that gateway
(``authority.lost`` from this gateway as the room's last event) and gives back each one the standby has not
promoted, as failover itself gives a room back (:func:`.fence.release_fence`):

1. the standby's store records that the room moved on to this gateway at ``epoch + 2`` (refused there, in the
   same transaction that would promote it, once it is promoted; or when its id is retired there, a room promoted
   and disbanded since), so the standby can no longer promote it at the fence's epoch;
2. only then, this store gets ``authority.claimed`` naming this gateway again at ``epoch + 2``.

A standby that promoted first wins: step 1 is refused and nothing changes here. A pass stopped between the steps
is finished by the next pass, or by the standby's rerun (which finds its promotion refused and releases). A fence
younger than ``after`` seconds (by its timestamp against ``now``) is left to the failover that may still be
running (reported :data:`FENCED`): giving it back at once would undo every failover while this replicator runs.
Over an HTTP source the standby's store cannot be written; such rooms are reported :data:`FENCED`, with what to
run.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Engine

from .. import rooms as room_services
from ..errors import HostedRoomError, RoomConflictError, RoomNotFoundError
from ..limits import Limits, in_force
from ..validation import identifier
from .fence import STORE_ERRORS, Fence, block_promotion, give_back, read_fence
from .heads import RoomHead
from .steps import step

__all__ = ["DEFAULT_RECLAIM_AFTER", "FENCED", "RECLAIMED", "RECLAIM_STEP", "Reclaim", "Reclaims", "reclaims_for"]

#: A room this gateway's store had fenced for the source's gateway, never promoted there: held here again.
RECLAIMED = "reclaimed"
#: A room fenced for the source's gateway that this replicator cannot give back (an HTTP source): see ``reason``.
FENCED = "fenced"
#: Seconds a fence is left to the failover that wrote it before a returning authority's replicator gives it back.
DEFAULT_RECLAIM_AFTER = 300.0
#: The step boundary between the two writes of a reclaim (after the standby's store, before this one's).
RECLAIM_STEP = "replicator.reclaim_blocked"


@dataclass(frozen=True, slots=True)
class Reclaim:
    """What a pass did with one fenced room: ``status`` RECLAIMED (``epoch``: held here again at it), FENCED,
    or a refusal (``refused``, the replicator's REFUSED status, with ``reason``)."""

    room_id: str
    status: str
    epoch: int
    reason: str


class Reclaims:
    """The rooms of one replicator's store fenced for its source's gateway, across passes: those the source
    promoted are remembered (by their local head) and not read again while that head stands."""

    def __init__(self, *, holder: str, local: str, after: float, limits: Limits | None) -> None:
        self.holder = holder  # the source's gateway, as the operator named it
        self.local = local
        self.after = after  # seconds a fence is left to its failover
        self.limits = limits
        self._taken: dict[str, int] = {}  # room -> the local epoch at which the source was found holding it

    def run(self, target: Engine, holder_store: Engine | None, local_rooms: Mapping[str, RoomHead],
            now: float) -> list[Reclaim]:
        """One pass: each local room fenced for the holder and not taken over by it, reclaimed (or reported)."""
        self._taken = {room_id: epoch for room_id, epoch in self._taken.items()
                       if (head := local_rooms.get(room_id)) is not None and head.authority_epoch == epoch}
        done = []
        for fence in self._fences(target, local_rooms):
            outcome = self._one(target, holder_store, fence, now)
            if outcome is not None:
                done.append(outcome)
        return done

    def _fences(self, target: Engine, local_rooms: Mapping[str, RoomHead]) -> list[Fence]:
        fences = []
        for room_id in sorted(local_rooms):
            head = local_rooms[room_id]
            if head.disbanded or head.authority_gateway_id != self.holder or room_id in self._taken:
                continue
            fence = read_fence(target, room_id, holder=self.holder, epoch=head.authority_epoch, silent=self.local,
                               limits=self.limits)
            if fence is not None:
                fences.append(fence)
        return fences

    def _one(self, target: Engine, holder_store: Engine | None, fence: Fence, now: float) -> Reclaim | None:
        where = f"fenced here for {self.holder} at epoch {fence.epoch + 1}"
        if holder_store is not None and now - fence.at < self.after:
            return Reclaim(fence.room_id, FENCED, fence.epoch + 1, (
                f"{where} {max(now - fence.at, 0.0):.0f} s ago, not promoted there yet: given back if it still is "
                f"not after {self.after:.0f} s"))
        if holder_store is None:
            return Reclaim(fence.room_id, FENCED, fence.epoch + 1, (
                f"{where}; this replicator reads {self.holder} over HTTP and cannot give it back: run "
                f"`hostedrooms failover` on {self.holder} again, or replicate from {self.holder}'s store"))
        if self._hosted(holder_store, fence) == (self.holder, fence.epoch + 1):  # promoted: the usual case
            self._taken[fence.room_id] = fence.epoch + 1
            return None
        try:
            block_promotion(target, holder_store, fence, now=now, limits=self.limits, unless_retired=True)
            step(RECLAIM_STEP, room_id=fence.room_id, gateway=self.local)
            give_back(target, fence, holder=self.holder, now=now, limits=self.limits)
        except STORE_ERRORS:
            raise
        except RoomConflictError as exc:
            # With the room hosted there, the refusal is that it was promoted there from this gateway at the
            # fence's epoch (whoever holds it since); without, that its id is retired there.
            if self._hosted(holder_store, fence) is not None:
                self._taken[fence.room_id] = fence.epoch + 1
                return None
            return Reclaim(fence.room_id, "refused", fence.epoch + 1, f"{where}; not given back: {exc}")
        except HostedRoomError as exc:
            return Reclaim(fence.room_id, "refused", fence.epoch + 1, f"{where}; not given back: {exc}")
        return Reclaim(fence.room_id, RECLAIMED, fence.epoch + 2, (
            f"{where} and never promoted there: this gateway holds it again at epoch {fence.epoch + 2}"))

    def _hosted(self, holder_store: Engine, fence: Fence) -> tuple[str, int] | None:
        """The authority of the room of this id in the holder's store, if it hosts one (disbanded included)."""
        try:
            state = room_services.room_state(holder_store, room_id=fence.room_id, include_disbanded=True,
                                             limits=self.limits)
        except RoomNotFoundError:
            return None
        return state["authority_gateway_id"], int(state["authority_epoch"])


def reclaims_for(source_gateway_id: Any, after: Any, local_gateway: Callable[[], str | None],
                 limits: Limits | None) -> Reclaims | None:
    """What gives back the rooms fenced here for ``source_gateway_id`` and never promoted (None: not asked for),
    for a replicator whose options these are (``local_gateway``: this gateway, None when it has no identity)."""
    if isinstance(after, bool) or not isinstance(after, (int, float)) or not 0 <= after < float("inf"):
        raise HostedRoomError("reclaim_after must be a non-negative number of seconds")
    if source_gateway_id is None:
        return None
    lim = in_force(limits)
    holder = identifier(source_gateway_id, error=HostedRoomError, label="source_gateway_id",
                        max_chars=lim.MAX_ACTOR_ID_CHARS)
    local = local_gateway()
    if local is None:
        raise HostedRoomError("source_gateway_id needs this gateway's identity (local_gateway_id, or "
                              "HOSTEDROOMS_INSTALL_ID)")
    if holder == local:
        raise HostedRoomError("source_gateway_id is this gateway: name the gateway whose store the source is")
    return Reclaims(holder=holder, local=local, after=float(after), limits=limits)

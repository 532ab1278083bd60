"""Take over every room of a silent authority at once (:func:`failover`).

For each replica this store holds of ``from_gateway``'s rooms, :func:`failover` promotes it at ``epoch + 1``
(``promote_replica``: one transaction per room, the capacity gates of an append, the claim event) or reports
why it could not: the replica is not caught up with what the authority last reported, the room was disbanded,
the local store already holds a room with that id, or a capacity limit refused it. A dry run reports the same
decisions without writing (the byte budgets are checked only by a real promotion).

Whether the authority is really gone is the caller's decision: promotion is safe only once the old authority
can no longer commit (stopped, fenced off the network, or its store unreachable to it). If its store is still
readable, replicate from it first (``hostedrooms failover --catch-up-from``): anything it committed after the
standby's last page would otherwise be left behind on the old lineage. When it returns, replicate from this
gateway back into its store: the replicator demotes each room this failover took (see
:class:`~hostedrooms.standby.replicator.Replicator`).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field, replace
from typing import Any

from .. import limits as default_limits
from ..engines import EngineSource, resolve_engine
from ..errors import (
    HostedRoomError,
    ReplicaError,
    RoomConflictError,
    StoreConfigurationError,
    StoreUnavailableError,
)
from ..identity import local_gateway_id as resolve_local_gateway_id
from ..limits import Limits
from ..replicas import promote_replica
from ..validation import identifier
from .heads import all_replica_heads, all_room_heads, disbanded_replicas

__all__ = [
    "CAPACITY",
    "CONFLICT",
    "DISBANDED",
    "NOT_CAUGHT_UP",
    "PROMOTED",
    "REFUSED",
    "WOULD_PROMOTE",
    "FailoverReport",
    "RoomFailover",
    "failover",
]

PROMOTED = "promoted"
WOULD_PROMOTE = "would-promote"  # dry run
NOT_CAUGHT_UP = "not-caught-up"
DISBANDED = "disbanded"
CONFLICT = "conflict"  # the local store already holds (or retired) the room id
CAPACITY = "capacity"
REFUSED = "refused"  # anything else promote_replica refused


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
        return self.outcome in (PROMOTED, WOULD_PROMOTE)


@dataclass
class FailoverReport:
    from_gateway: str
    local_gateway: str
    dry_run: bool
    rooms: list[RoomFailover] = field(default_factory=list)

    @property
    def promoted(self) -> list[RoomFailover]:
        return [room for room in self.rooms if room.promoted]

    @property
    def not_promoted(self) -> list[RoomFailover]:
        return [room for room in self.rooms if not room.promoted]

    @property
    def ok(self) -> bool:
        """Every replica of the silent authority was (or would be) promoted, disbanded rooms aside."""
        return all(room.promoted or room.outcome == DISBANDED for room in self.rooms)

    def summary(self) -> str:
        verb = "would promote" if self.dry_run else "promoted"
        left = len(self.not_promoted)
        return (f"{verb} {len(self.promoted)} of {len(self.rooms)} rooms of {self.from_gateway} on "
                f"{self.local_gateway}" + (f"; {left} not promoted" if left else ""))


def failover(
    target: EngineSource,
    *,
    from_gateway: Any,
    local_gateway_id: Any = None,
    dry_run: bool = False,
    reason: str = "authority-unreachable",
    now: float | None = None,
    limits: Limits | None = None,
) -> FailoverReport:
    """Promote every caught-up replica of ``from_gateway`` in ``target`` (this gateway's store), in ``room_id``
    order, and report each room's outcome (see the module docstring). ``local_gateway_id`` defaults to
    ``install:$HOSTEDROOMS_INSTALL_ID``. Storage errors that make the store unusable (unreachable, missing
    schema) are raised; a room's refusal never stops the others.
    """
    lim = default_limits if limits is None else limits
    silent = identifier(from_gateway, error=HostedRoomError, label="from_gateway", max_chars=lim.MAX_ACTOR_ID_CHARS)
    local = resolve_local_gateway_id(local_gateway_id)
    if silent == local:
        raise HostedRoomError("from_gateway is this gateway: failover takes rooms over from another gateway")
    engine = resolve_engine(target)
    report = FailoverReport(silent, local, dry_run)
    replicas = sorted((head for head in all_replica_heads(engine).values() if head.authority_gateway_id == silent),
                      key=lambda head: head.room_id)
    local_rooms = all_room_heads(engine)
    disbanded = disbanded_replicas(engine, [head.room_id for head in replicas])
    active = sum(1 for room in local_rooms.values() if not room.disbanded)
    for head in replicas:
        base = RoomFailover(head.room_id, "", head.authority_epoch, head.last_seq, head.latest_seq)
        if not head.caught_up:
            report.rooms.append(replace(base, outcome=NOT_CAUGHT_UP, reason=(
                f"the replica holds seq {head.last_seq} of the {head.latest_seq} the authority reported")))
        elif head.room_id in disbanded:
            report.rooms.append(replace(base, outcome=DISBANDED, reason="the room was disbanded"))
        elif head.room_id in local_rooms:
            report.rooms.append(replace(base, outcome=CONFLICT, reason=(
                "the local store already holds a room with this id")))
        elif dry_run:
            if active >= lim.MAX_ACTIVE_ROOMS:
                report.rooms.append(replace(base, outcome=CAPACITY, reason=(
                    f"this gateway would then host more than {lim.MAX_ACTIVE_ROOMS} active rooms")))
                continue
            active += 1
            report.rooms.append(replace(base, outcome=WOULD_PROMOTE, epoch=head.authority_epoch + 1))
        else:
            report.rooms.append(_promote(engine, head.room_id, base, reason, now, local, limits))
    return report


def _promote(engine: Any, room_id: str, base: RoomFailover, reason: str, now: float | None, local: str,
             limits: Limits | None) -> RoomFailover:
    try:
        promoted = promote_replica(engine, room_id=room_id, reason=reason, now=time.time() if now is None else now,
                                   local_gateway_id=local, limits=limits)
    except (StoreUnavailableError, StoreConfigurationError):
        raise
    except ReplicaError as exc:
        outcome = NOT_CAUGHT_UP if "not caught up" in str(exc) else DISBANDED if "disbanded" in str(exc) else REFUSED
        return replace(base, outcome=outcome, reason=str(exc))
    except RoomConflictError as exc:
        return replace(base, outcome=CONFLICT, reason=str(exc))
    except HostedRoomError as exc:  # the capacity gates raise the plain class with the append's messages
        return replace(base, outcome=CAPACITY, reason=str(exc))
    return replace(base, outcome=PROMOTED, epoch=int(promoted["authority_epoch"]),
                        claim_seq=int(promoted["claim_seq"]))

"""Take over every room of a silent authority at once (:func:`failover`).

For each replica this store holds of ``from_gateway``'s rooms, :func:`failover` promotes it at ``epoch + 1``
(``promote_replica``: one transaction per room, the capacity gates of an append, the claim event) or reports
why it could not: the replica is not caught up with what the authority last reported, the room was disbanded,
the local store already holds a room with that id, or a capacity limit refused it. A dry run reports the same
decisions without writing (the byte budgets are checked only by a real promotion).

Whether the authority is really gone is the caller's decision: promotion is safe only once the old authority
can no longer commit. ``catch_up_from`` (``hostedrooms failover --catch-up-from``) reads what it committed after
the standby's last page before promoting:

* from its **store** (an :class:`~hostedrooms.standby.source.EnginePageSource`), the run plans, fences, catches
  up and promotes (:mod:`hostedrooms.standby.takeover`): only rooms this gateway can promote are fenced in the
  old authority's store, each at exactly the head it was planned with, so its next write there fails with
  AuthorityConflictError; every write it acknowledged before the fence is in the new log; a room this gateway
  cannot promote after all is given back to it; a rerun finishes an interrupted run; and two standbys racing
  take each room once (the loser reports the room taken over by the winner). Every room of the old authority
  is reported promoted, taken over (by whom), or left with it (why).
* from its **page endpoint** (HTTP), nothing can be fenced: a write it commits after the catch-up read its
  room is left behind on the old lineage. Stop it (or cut it off from its store) first.

Two failovers at once promote each room once: the run that finds a room already promoted here by another run
reports it ``taken-over``, which counts as done. When the old authority returns, replicate from this gateway back
into its store: the replicator demotes each room this failover took that is not fenced already (see
:class:`~hostedrooms.standby.replicator.Replicator`).
"""

from __future__ import annotations

import logging
from dataclasses import replace
from typing import Any

from sqlalchemy import Engine

from ..engines import EngineSource, resolve_engine
from ..errors import HostedRoomError, ReplicaError
from ..identity import local_gateway_id as resolve_local_gateway_id
from ..limits import Limits, in_force
from ..validation import identifier
from .fence import Fence, FencedSource, fence_authority
from .heads import ReplicaHead, RoomHead, all_replica_heads, all_room_heads, disbanded_replicas
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
    WOULD_PROMOTE,
    FailoverReport,
    RoomFailover,
)
from .replicator import Replicator
from .source import EnginePageSource, PageSource
from .steps import step
from .takeover import fenced_failover, is_taken_over, promote_one, taken_over_here

_log = logging.getLogger(__name__)

__all__ = [
    "CAPACITY",
    "CONFLICT",
    "DISBANDED",
    "FENCED",
    "NOT_CAUGHT_UP",
    "NOT_FENCED",
    "PROMOTED",
    "REFUSED",
    "RELEASED",
    "TAKEN_OVER",
    "WOULD_PROMOTE",
    "FailoverReport",
    "Fence",
    "FencedSource",
    "RoomFailover",
    "failover",
    "fence_authority",
]


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
    """Take over the rooms of ``from_gateway`` on this gateway (``target``, its store), in ``room_id`` order, and
    report each room's outcome (see the module docstring). ``local_gateway_id`` defaults to
    ``install:$HOSTEDROOMS_INSTALL_ID``. Storage errors that make a store unusable (unreachable, missing schema)
    are raised; a room's refusal never stops the others.

    ``catch_up_from``: the old authority, still readable (the caller closes it). An
    :class:`~hostedrooms.standby.source.EnginePageSource` (its store) takes the planned path of
    :mod:`hostedrooms.standby.takeover`: only the rooms this gateway can promote are fenced there, caught up to
    their fence and promoted, and a rerun finishes an interrupted run. Any other source (its page endpoint) is
    replicated from once, and then every caught-up replica is promoted; when that catch-up stops early
    (``report.catch_up.error``), nothing is promoted.

    :param target: this gateway's store: an :class:`~sqlalchemy.Engine`, or a zero-argument factory returning one.
    :param from_gateway: the silent authority's gateway id.
    :param local_gateway_id: this gateway's id.
    :param dry_run: report what would be promoted and write nothing.
    :param reason: recorded with each promotion (1 to 200 characters).
    :param now: the promotion time in Unix seconds (default: the wall clock).
    :param limits: the limits in force (default: :mod:`hostedrooms.limits`).
    :param catch_up_from: the old authority, if still readable, or None.
    :returns: each room's outcome and holder.
    :raises HostedRoomError: ``from_gateway`` is invalid or is this gateway, or a dry run was given ``catch_up_from``.
    :raises ReplicaError: ``reason`` is invalid.
    :raises StorageError: a store is unusable (unreachable, no schema).
    """
    lim = in_force(limits)
    silent = identifier(from_gateway, error=HostedRoomError, label="from_gateway", max_chars=lim.MAX_ACTOR_ID_CHARS)
    local = resolve_local_gateway_id(local_gateway_id)
    if silent == local:
        raise HostedRoomError("from_gateway is this gateway: failover takes rooms over from another gateway")
    if dry_run and catch_up_from is not None:
        raise HostedRoomError("a dry run writes nothing: it cannot catch up (replicate first instead)")
    if not isinstance(reason, str) or not reason or len(reason) > 200:
        raise ReplicaError("reason must be a non-empty string of at most 200 chars")
    engine = resolve_engine(target)
    report = FailoverReport(silent, local, dry_run)
    if isinstance(catch_up_from, EnginePageSource):
        fenced_failover(engine, catch_up_from, report, reason=reason, now=now, limits=limits)
        _log_failover(report)
        return report
    if catch_up_from is not None:
        report.catch_up = Replicator(catch_up_from, engine, local_gateway_id=local, limits=limits).sync_once()
        step("failover.caught_up", gateway=local)
        if report.catch_up.error:
            return report
    _promote_replicas(engine, report, lim, reason, now, limits)
    _log_failover(report)
    return report


def _promote_replicas(engine: Engine, report: FailoverReport, lim: Any, reason: str, now: float | None,
                      limits: Limits | None) -> None:
    """Promote every caught-up replica of the silent authority (or, in a dry run, say which would be)."""
    silent, local = report.from_gateway, report.local_gateway
    replicas = sorted((head for head in all_replica_heads(engine).values() if head.authority_gateway_id == silent),
                      key=lambda head: head.room_id)
    local_rooms = all_room_heads(engine)
    disbanded = disbanded_replicas(engine, [head.room_id for head in replicas])
    active = sum(1 for room in local_rooms.values() if not room.disbanded)
    for head in replicas:
        base = RoomFailover(head.room_id, "", head.authority_epoch, head.last_seq, head.latest_seq)
        decided = _decision(head, base, local_rooms.get(head.room_id), head.room_id in disbanded, report.dry_run,
                            active >= lim.MAX_ACTIVE_ROOMS, lim, local)
        if decided is not None:
            if decided.outcome == WOULD_PROMOTE:
                active += 1
            report.rooms.append(decided)
            continue
        step("failover.promote", room_id=head.room_id, gateway=local)
        report.rooms.append(promote_one(engine, head.room_id, base, reason, now, local, limits))
        step("failover.promoted", room_id=head.room_id, gateway=local)


def _decision(head: ReplicaHead, base: RoomFailover, local_room: RoomHead | None, disbanded: bool, dry_run: bool,
              full: bool, lim: Any, local: str) -> RoomFailover | None:
    """What becomes of one replica without writing: its outcome, or None when it is to be promoted now. ``full``:
    this gateway already hosts MAX_ACTIVE_ROOMS active rooms (counting those a dry run would promote)."""
    if local_room is not None and is_taken_over(local_room, base, local):
        return taken_over_here(base, local_room.authority_epoch, local)
    if not head.caught_up:
        return replace(base, outcome=NOT_CAUGHT_UP, reason=(
            f"the replica holds seq {head.last_seq} of the {head.latest_seq} the authority reported"))
    if disbanded:
        return replace(base, outcome=DISBANDED, reason="the room was disbanded")
    if local_room is not None:
        return replace(base, outcome=CONFLICT, reason="the local store already holds a room with this id")
    if not dry_run:
        return None
    if full:
        return replace(base, outcome=CAPACITY, reason=(
            f"this gateway would then host more than {lim.MAX_ACTIVE_ROOMS} active rooms"))
    return replace(base, outcome=WOULD_PROMOTE, epoch=head.authority_epoch + 1, holder=local)


def _log_failover(report: FailoverReport) -> None:
    """Each room's outcome (a warning where it was not promoted), then the summary (hostedrooms.logs)."""
    for room in report.rooms:
        level = logging.INFO if room.done or room.outcome == DISBANDED else logging.WARNING
        _log.log(level, "failover of room %s: %s", room.room_id, room.outcome, extra={
            "event": "failover.room", "room": room.room_id, "gateway": report.local_gateway,
            "from_gateway": report.from_gateway, "outcome": room.outcome, "epoch": room.epoch,
            "holder": room.holder, "reason": room.reason or None, "dry_run": report.dry_run})
    _log.info("failover: %s", report.summary(), extra={
        "event": "failover.done", "gateway": report.local_gateway, "from_gateway": report.from_gateway,
        "rooms": len(report.rooms), "promoted": len(report.promoted), "dry_run": report.dry_run})

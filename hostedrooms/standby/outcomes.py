"""What a failover reports: each room's outcome (:class:`RoomFailover`) and the run's (:class:`FailoverReport`).

Every room of the silent authority ends a run in one of three places, which :attr:`RoomFailover.holder` names:
promoted here (this gateway), taken over by another run (this gateway's, or another standby's: its id), or left
with the old authority (its id), with the reason. A room fenced for this gateway whose promotion is still
pending (the catch-up stopped, a page is still missing) has no holder until a rerun finishes it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from .reports import PassReport

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
    "RoomFailover",
]

PROMOTED = "promoted"
WOULD_PROMOTE = "would-promote"  # dry run
NOT_CAUGHT_UP = "not-caught-up"
DISBANDED = "disbanded"
CONFLICT = "conflict"  # the local store already holds (or retired) the room id
CAPACITY = "capacity"
REFUSED = "refused"  # anything else promote_replica refused
TAKEN_OVER = "taken-over"  # another failover run took it (this gateway's or another standby's; see holder)
NOT_FENCED = "not-fenced"  # left with the old authority: it wrote while this run tried to fence the room
FENCED = "fenced"  # fenced for this gateway, promotion pending: a rerun of the same command finishes it
RELEASED = "released"  # fenced, then given back to the old authority: this gateway could not promote it


@dataclass(frozen=True, slots=True)
class RoomFailover:
    """What failover did (or, in a dry run, would do) for one room of the silent authority."""

    room_id: str
    outcome: str
    previous_epoch: int
    last_seq: int
    latest_seq: int
    epoch: int | None = None  # the new epoch, once promoted (or the one a dry run would take)
    claim_seq: int | None = None
    reason: str = ""
    #: The gateway that may write the room after this run: this one (promoted, or taken over by another of its
    #: runs), another standby, or the old authority (left with it); None while a fenced room's promotion is
    #: pending, or where this run could not tell (a replica only, without the old authority's store).
    holder: str | None = None

    @property
    def promoted(self) -> bool:
        """Promoted (or, in a dry run, would be) by this run."""
        return self.outcome in (PROMOTED, WOULD_PROMOTE)

    @property
    def done(self) -> bool:
        """The room ended promoted, here by this run or another one, or by another standby's run."""
        return self.promoted or self.outcome == TAKEN_OVER


@dataclass
class FailoverReport:
    from_gateway: str
    local_gateway: str
    dry_run: bool
    rooms: list[RoomFailover] = field(default_factory=list)
    #: With ``catch_up_from``: the catch-up pass (None without one). When it stopped early (``error``), nothing
    #: was promoted; the rooms fenced so far are reported ``fenced`` (a rerun finishes them).
    catch_up: PassReport | None = None
    #: With a store to catch up from: the rooms fenced for this gateway in the old authority's store (by this
    #: run or an earlier one), in ``room_id`` order.
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
        """Every room of the silent authority ended (or would end) promoted, here by this run or another one or
        by another standby, disbanded rooms aside; and the catch-up, if any, completed. (So every room has
        exactly one writer, and it is not the silent authority.)"""
        if self.catch_up is not None and self.catch_up.error:
            return False
        return all(room.done or room.outcome == DISBANDED for room in self.rooms)

    def summary(self) -> str:
        verb = "would promote" if self.dry_run else "promoted"
        left, taken = len(self.not_promoted), len(self.taken_over)
        return (f"{verb} {len(self.promoted)} of {len(self.rooms)} rooms of {self.from_gateway} on "
                f"{self.local_gateway}" + (f"; {taken} taken over by another run" if taken else "")
                + (f"; {left} not promoted" if left else ""))

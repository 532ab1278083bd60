"""A room the local **authoritative** store holds, as a replicator meets it (:class:`Demoter`).

Such a room is never replicated over (``ingest_page`` does not look at the authoritative tables, so the replicator
does): when the source shows a strictly newer epoch held by another gateway and the local room is this gateway's,
the local room is **demoted** (``demote_room``), which is how a returning authority fences itself, but only on
proof that the source's log continues this room (:mod:`.proof`): read from seq 1, it must hold exactly the local
events up to the local head (ids and content), then, before any event of a newer epoch, an ``authority.claimed``
naming this gateway at the local epoch as the previous authority. Anything else (another gateway's room of the
same name, a listing that only claims a newer epoch, a claim naming another previous authority, local events the
source never got) refuses the room with the reason and changes nothing, and the room is backed off; the demoting
write is conditioned on the head the proof read, so a write committed after the proof leaves the room untouched
and proved again next pass. A room that is not this gateway's is reported ``local`` and left alone.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Engine

from ..demotion import demote_room
from ..errors import DemotionStaleError, HostedRoomError
from ..identity import local_gateway_id as resolve_local_gateway_id
from .bounds import PASS_ERRORS, Backoff, BoundReached
from .heads import RoomHead
from .proof import LocalLog, Proofs, Refused
from .reader import SourceReader
from .reports import BACKING_OFF, DEMOTED, LOCAL, REFUSED, RoomReport
from .steps import step

__all__ = ["Demoter", "resolve_gateway"]


@dataclass(frozen=True, slots=True)
class Demoter:
    """One pass's demotions of local rooms into ``target`` (``proofs`` and ``backoff`` outlive the pass)."""

    target: Engine
    gateway: Any  # the replicator's local_gateway_id (None: install:$HOSTEDROOMS_INSTALL_ID), resolved when needed
    proofs: Proofs
    backoff: Backoff
    now: Callable[[], float]
    monotonic: Callable[[], float]

    def local_room(self, head: RoomHead, local: RoomHead, report: RoomReport,
                   reader: SourceReader) -> tuple[RoomReport, bool]:
        """``report`` for a room the local store holds, demoted here when the source proves a newer epoch (see the
        module docstring); with whether a pass bound cut the proof short."""
        report.status, report.last_seq = LOCAL, 0
        held = f"the local store holds this room for {local.authority_gateway_id} at epoch {local.authority_epoch}"
        if not (head.authority_epoch > local.authority_epoch and not local.disbanded):
            report.reason = f"{held}; never replicated over"
            return report, False
        local_gateway = self._local_gateway()
        if local_gateway is None:
            report.status = REFUSED
            report.reason = (f"{held}, and the source shows epoch {head.authority_epoch}: demoting needs this "
                             "gateway's identity (local_gateway_id, or HOSTEDROOMS_INSTALL_ID)")
            return report, False
        if local.authority_gateway_id != local_gateway or head.authority_gateway_id == local_gateway:
            report.reason = f"{held} (the source shows epoch {head.authority_epoch}); not this gateway's to demote"
            return report, False
        waiting = self.backoff.waiting(head.room_id, self.monotonic())
        if waiting is not None:  # a refused demotion is not retried on every pass either
            report.status, report.reason = BACKING_OFF, f"{waiting[1]} (retrying in {waiting[0]:.0f} s)"
            return report, False
        return self._prove_and_demote(head, local, local_gateway, report, reader, held)

    def _prove_and_demote(self, head: RoomHead, local: RoomHead, local_gateway: str, report: RoomReport,
                          reader: SourceReader, held: str) -> tuple[RoomReport, bool]:
        try:
            new_gateway, new_epoch, proven = self.proofs.prove(
                head.room_id, local, local_gateway, lambda since: reader.page(head.room_id, since),
                lambda: LocalLog(self.target, reader.page_limit, reader.limits))
            step("replicator.proved", room_id=head.room_id, gateway=local_gateway)
            demote_room(self.target, room_id=head.room_id, observed_gateway_id=new_gateway,
                        observed_epoch=new_epoch, now=self.now(), local_gateway_id=local_gateway,
                        limits=reader.limits, proven_head=proven)
        except PASS_ERRORS:
            raise
        except BoundReached as exc:
            report.reason = (f"{held}; the proof of the source's newer epoch was cut short (it resumes on the next "
                             f"pass): {exc}")
            return report, True
        except DemotionStaleError as exc:  # written to after the proof: nothing changed, and the next pass proves
            report.reason = f"{held}; not demoted: {exc}"
            return report, False
        except (HostedRoomError, Refused) as exc:
            delay = self.backoff.refuse(head.room_id, str(exc), self.monotonic())
            report.status, report.reason = REFUSED, f"demotion refused: {exc} (retrying in {delay:.0f} s)"
            return report, False
        self.backoff.clear(head.room_id)
        report.status = DEMOTED
        report.authority_gateway_id, report.authority_epoch = new_gateway, new_epoch
        report.reason = (f"the source holds epoch {new_epoch} for {new_gateway}; this gateway's epoch "
                         f"{local.authority_epoch} is fenced")
        return report, False

    def _local_gateway(self) -> str | None:
        return resolve_gateway(self.gateway)


def resolve_gateway(local_gateway_id: Any) -> str | None:
    """This gateway's id from a replicator's ``local_gateway_id`` (None: it has no identity)."""
    try:
        return resolve_local_gateway_id(local_gateway_id)
    except HostedRoomError:
        return None

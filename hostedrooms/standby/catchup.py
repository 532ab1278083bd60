"""One room of a replicator pass (:class:`RoomPass`): compare the source's head (lineage, latest seq) with what the
local store holds, and catch the replica up (:class:`CatchUp`).

* a room the local authoritative store holds is never replicated over (:mod:`.demote`: demoted on proof);
* a listing head's ``latest_seq`` is never stored: only pages are; a replica whose stored ``latest_seq`` is
  above its ``last_seq`` (no stored event supports it) takes the source's current claim from the next page
  (``ingest_page``'s ``supersede_latest_seq``), so one lying page cannot keep it from ever being caught up;
* a replica behind the source is fed ``read_events`` pages from its own ``last_seq`` (``replica_state``'s
  coverage, read back from the store on every pass: nothing is remembered across a crash, and ``ingest_page``
  is idempotent and refuses gaps, so a pass killed at any point resumes with no gap and no duplicate);
* **fork check**: when the source's lineage differs from the replica's (a claim, a promotion elsewhere, another
  source), the first page starts one event early: the source's event at the replica's ``last_seq`` must be the
  same event at an epoch the replica knows, or the source forked from this replica and the room is refused;
* **lineage check**: the source's store lineage (each page's ``lineage``: :mod:`hostedrooms.lineage`) is
  remembered per room, with the replica it fed; a page showing another lineage (the source's PostgreSQL failed
  over to a standby), or the first page of a room this replicator has not read yet, starts one event early too:
  the source's event at the replica's ``last_seq`` must be the very event the replica holds (seq, id and
  content), or the source lost events this replica had (an asynchronous standby was promoted, and its seqs may
  hold other events now) and the room is refused with that reason instead of ingesting a diverged log. A
  caught-up replica reads no page, so such a change is found at the room's next append on the source;
* **fence stop**: a page holding the ``authority.lost`` that handed the room to the page's own authority stops the
  room there (:func:`stop_at_fence`): its log goes on in that gateway's store;
* a disband is replicated like any event; a room whose disband is stored is then no longer read;
* a refused page (a conflict, a regression, a fork, a hostile page) is reported with the reason and the room
  is backed off (:class:`~hostedrooms.standby.bounds.Backoff`).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from sqlalchemy import Engine

from ..errors import HostedRoomError, ReplicaError, RoomNotFoundError
from ..limits import in_force
from ..records import IngestResult
from ..replicas import CheckedEvent, CheckedPage, ingest_page, supersede_replica
from .bounds import PASS_ERRORS, Backoff, BoundReached
from .demote import Demoter
from .heads import ReplicaHead, RoomHead
from .proof import Refused
from .reader import SourceReader, head_problem
from .reports import BACKING_OFF, BEHIND, CAUGHT_UP, DISBANDED, GONE, REFUSED, SKIPPED, PageIngested, RoomReport

__all__ = ["CatchUp", "RoomPass", "stop_at_fence"]

#: No store lineage remembered for a room yet (not read by this replicator).
_NOT_READ: Any = object()


@dataclass(frozen=True, slots=True)
class RoomPass:
    """What one pass needs to handle a room (``lineages``, ``backoff`` and the reader's infos outlive the pass)."""

    reader: SourceReader
    target: Engine
    max_pages_per_room: int | None
    backoff: Backoff
    #: Per room: the source store's lineage its replica was last fed under (a room absent: not read yet by this
    #: replicator, so its first page is checked against the replica's last event).
    lineages: dict[str, str | None]
    demoter: Demoter
    now: Callable[[], float]
    monotonic: Callable[[], float]
    page_stored: Callable[[PageIngested], None]

    def sync_room(self, head: RoomHead, local: RoomHead | None,
                  replica: ReplicaHead | None) -> tuple[RoomReport | None, bool]:
        """(the room's report, whether a pass bound cut it short); no report when the pass was over before it."""
        try:
            self.reader.bounds.check()
        except BoundReached:
            return None, True
        problem = head_problem(head, in_force(self.reader.limits))
        if problem:
            room_id = head.room_id[:200]
            return RoomReport(room_id, REFUSED, reason=f"the source's listing of room {room_id!r} is invalid: "
                                                       f"{problem}"), False
        report = RoomReport(head.room_id, CAUGHT_UP, latest_seq=head.latest_seq,
                            authority_gateway_id=head.authority_gateway_id, authority_epoch=head.authority_epoch,
                            last_seq=replica.last_seq if replica is not None else 0)
        if local is not None:
            return self.demoter.local_room(head, local, report, self.reader)
        waiting = self.backoff.waiting(head.room_id, self.monotonic())
        if waiting is not None:
            report.status, report.reason = BACKING_OFF, f"{waiting[1]} (retrying in {waiting[0]:.0f} s)"
            return report, False
        if replica is None and head.disbanded:
            report.status, report.reason = SKIPPED, "disbanded on the source before it was replicated here"
            return report, False
        try:
            if replica is not None:
                refuse_source_behind(head, replica)
                if (replica.last_seq >= head.latest_seq and _same_lineage(head, replica)
                        and replica.caught_up):
                    report.status = DISBANDED if head.disbanded else CAUGHT_UP
                    self.backoff.clear(head.room_id)
                    return report, False
            self.catch_up(head, replica, report)
        except PASS_ERRORS:
            raise
        except BoundReached as exc:
            report.status, report.reason = BEHIND, f"the pass stopped: {exc}"
            return report, True
        except RoomNotFoundError as exc:  # purged (or expired) between the listing and the read
            report.status, report.reason = GONE, str(exc)
        except (HostedRoomError, Refused) as exc:
            self.reader.infos.pop(head.room_id, None)
            delay = self.backoff.refuse(head.room_id, str(exc), self.monotonic())
            report.status, report.reason = REFUSED, f"{exc} (retrying in {delay:.0f} s)"
        else:
            self.backoff.clear(head.room_id)
        return report, False

    def catch_up(self, head: RoomHead, replica: ReplicaHead | None, report: RoomReport) -> None:
        """Feed the replica pages until it is caught up, the room's page bound is reached or the source has
        nothing new (see the module docstring); ``report`` says how far it got."""
        state = CatchUp.start(head, replica, self.lineages)
        while self.max_pages_per_room is None or report.pages < self.max_pages_per_room:
            page = state.next_page(self.reader)
            state.check_continuity(page)
            fence = _fence_at(page)
            if fence is not None:  # the room's log goes on in another store: stop this room at the fence
                stop_at_fence(self, head.room_id, page, fence, state.lineage, report)
                return
            claim = page.latest_seq if page.latest_seq is not None else 0
            unsupported = state.contradicted(claim)
            if page.last_seq is None or page.last_seq <= state.since:
                # Only a full page (the fork check's, of one event) may hold nothing new while the log goes on.
                if claim > state.since and len(page.events) < self.reader.page_limit:
                    raise Refused(f"the source reports seq {claim} but its page holds nothing after seq "
                                  f"{state.since}")
                if not state.must_store and not unsupported:
                    break
            info = self.reader.room_info(head.room_id, page)
            try:
                result = ingest_page(self.target, room_id=head.room_id, room_name=info.name, members=info.members,
                                     page=page, now=self.now(), limits=self.reader.limits,
                                     supersede_latest_seq=state.stored_latest if unsupported else None)
            except ReplicaError as exc:  # the overlapping event differs from the replica's
                raise state.refusal(exc, page) from None
            self.lineages[head.room_id] = page.lineage
            self.page_stored(state.stored(page, result, claim, unsupported, report, self.monotonic))
            if result["caught_up"] or not int(result["ingested"]):
                break
            self.reader.bounds.check()
        state.finish(report)


@dataclass(slots=True)
class CatchUp:
    """Where one room's catch-up stands, page after page (see the module docstring for each check)."""

    room_id: str
    replica: ReplicaHead | None
    since: int  # the replica's stored seq: the next page is read after it
    stored_latest: int | None  # the replica's stored latest_seq, as this pass knows it (None: no replica yet)
    #: Store a page even when it holds no new event: a replica of an empty room is stored too (so it can be
    #: promoted), and a lineage change with no new event still updates the replica's authority.
    must_store: bool
    fork_check_due: bool  # the next page is read one event early, for the fork check
    lineage_check_due: bool  # the next page is read one event early (on top of the page), for the lineage check
    fed_lineage: Any  # the source store's lineage this replica was fed under (_NOT_READ: not read yet)
    disbanded: bool
    lineage: tuple[str, int] | None  # the lineage the replica records (None: no replica yet)

    @classmethod
    def start(cls, head: RoomHead, replica: ReplicaHead | None, lineages: dict[str, str | None]) -> CatchUp:
        """The catch-up of ``head``'s room into ``replica`` (None: not replicated yet)."""
        if replica is None:
            return cls(head.room_id, None, 0, None, True, False, False, lineages.get(head.room_id, _NOT_READ),
                       head.disbanded, None)
        same, since = _same_lineage(head, replica), replica.last_seq
        fed = lineages.get(head.room_id, _NOT_READ)
        return cls(head.room_id, replica, since, replica.latest_seq, not same, since > 0 and not same,
                   since > 0 and fed is _NOT_READ, fed, head.disbanded,
                   (replica.authority_gateway_id, replica.authority_epoch))

    def next_page(self, reader: SourceReader) -> CheckedPage:
        """The next page: one event early while a check is due; read again one event early when the source's
        store shows another lineage than this replica was fed under."""
        early = self.fork_check_due or self.lineage_check_due
        # The lineage check's early event comes on top of the page (the fork check's, as it always did, not).
        page = reader.page(self.room_id, self.since - 1 if early else self.since,
                           extra=1 if self.lineage_check_due and not self.fork_check_due else 0)
        if not early and self.replica is not None and self.since > 0 and page.lineage != self.fed_lineage:
            self.lineage_check_due = True  # the source's store changed lineage: read again, one event early
            page = reader.page(self.room_id, self.since - 1, extra=1)
        return page

    def check_continuity(self, page: CheckedPage) -> None:
        """The fork and lineage checks, when due: ``page`` (read one event early) must start with the replica's
        last event."""
        if not (self.fork_check_due or self.lineage_check_due):
            return
        assert self.replica is not None
        try:
            _check_fork(page, self.since, self.replica)
        except Refused as exc:
            raise self.refusal(exc, page) from None
        self.fork_check_due = False

    def refusal(self, exc: Exception, page: CheckedPage) -> Exception:
        """What refuses the room when ``page`` does not continue the replica: the lineage check's reason while it
        is due, else ``exc``."""
        if not self.lineage_check_due:
            return exc
        previous = "unknown" if self.fed_lineage is _NOT_READ else str(self.fed_lineage)
        return Refused(f"the source's store lineage is {page.lineage} (was {previous}) and it no longer holds this "
                       f"replica's last event as stored ({exc}): the source lost events this replica has (a standby "
                       "that lacked them was promoted?); refusing to ingest a diverged log")

    def contradicted(self, claim: int) -> bool:
        """Whether the stored latest_seq is a claim no stored event supports that ``claim`` (a page read after
        it was stored) contradicts."""
        return self.stored_latest is not None and self.stored_latest > self.since and claim < self.stored_latest

    def stored(self, page: CheckedPage, result: IngestResult, claim: int, unsupported: bool, report: RoomReport,
               monotonic: Callable[[], float]) -> PageIngested:
        """Record ``page`` as ``ingest_page`` stored it (``result``), in this state and in ``report``."""
        self.lineage_check_due, self.fed_lineage = False, page.lineage
        self.lineage = (str(result["authority"]["gateway_id"]), int(result["authority"]["epoch"]))
        stored, ingested = int(result["stored_seq"]), int(result["ingested"])
        page_claim = claim if page.latest_seq is not None else stored
        if unsupported:
            assert self.stored_latest is not None
            report.reason = (f"the source's log ends at seq {max(stored, page_claim)}, before the seq "
                             f"{self.stored_latest} it reported earlier: that claim was lowered")
            self.stored_latest = max(stored, page_claim)
        else:
            self.stored_latest = max(self.stored_latest or 0, stored, page_claim)
        report.pages += 1
        report.events += ingested
        report.authority_gateway_id = str(result["authority"]["gateway_id"])
        report.authority_epoch = int(result["authority"]["epoch"])
        report.latest_seq = self.stored_latest
        self.disbanded = self.disbanded or any(event.event.kind == "room.disbanded" for event in page.events)
        ingested_page = PageIngested(self.room_id, self.since + 1 if ingested else 0, stored, ingested,
                                     self.stored_latest, monotonic())
        report.last_seq = self.since = stored
        self.must_store = False
        return ingested_page

    def finish(self, report: RoomReport) -> None:
        """The room's status once no more page is read this pass."""
        if self.stored_latest is not None:
            report.latest_seq = self.stored_latest  # the pages' claim, newer than the listing's
        if self.stored_latest is not None and self.since >= self.stored_latest:
            report.status = DISBANDED if self.disbanded else CAUGHT_UP
        else:
            report.status = BEHIND


def refuse_source_behind(head: RoomHead, replica: ReplicaHead) -> None:
    """Refuse, without reading a page, a source that is behind what this replica already holds."""
    if head.authority_epoch < replica.authority_epoch:
        raise Refused(f"the source holds epoch {head.authority_epoch}, older than this replica's epoch "
                      f"{replica.authority_epoch}")
    if (head.authority_epoch == replica.authority_epoch
            and head.authority_gateway_id != replica.authority_gateway_id):
        raise Refused(f"the source's owner at epoch {head.authority_epoch} differs from this replica's")
    # Only stored events count: a latest_seq no stored event supports is the page's claim, which the next page
    # read confirms or corrects (see CatchUp.contradicted).
    if _same_lineage(head, replica) and head.latest_seq < replica.last_seq:
        raise Refused(f"the source's log ends at seq {head.latest_seq}, before the seq "
                      f"{replica.last_seq} this replica stored")


def stop_at_fence(rooms: RoomPass, room_id: str, page: CheckedPage, fence: CheckedEvent,
                  lineage: tuple[str, int] | None, report: RoomReport) -> None:
    """``page`` holds an ``authority.lost``: the source's store fenced its own room for ``page``'s authority,
    whose log holds its own event at that seq. Store what comes before the fence under the replica's lineage,
    then record that the room moved on to the new authority at the fence's seq (the replica is then behind
    it, never promotable at the old lineage), and say where the log goes on; never ingest the fence itself
    under the new authority's lineage (that log would fork from the new authority's)."""
    where = (f"the source's room was fenced for {page.gateway_id} at epoch {page.epoch} (authority.lost at seq "
             f"{fence.seq}): its log goes on in {page.gateway_id}'s store; replicate it from there")
    moved = (page.gateway_id, page.epoch)
    report.status, report.reason = BEHIND, where
    if lineage == moved:
        return  # recorded by an earlier pass
    if lineage is None or lineage[0] != _previous_gateway(fence):
        raise Refused(where)
    info = rooms.reader.room_info(room_id, page)
    limits = rooms.reader.limits
    before = [event for event in page.events if event.seq < fence.seq]
    if before:
        ingest_page(rooms.target, room_id=room_id, room_name=info.name, members=info.members,
                    page=replace(page, gateway_id=lineage[0], epoch=lineage[1], events=before,
                                 latest_seq=fence.seq - 1, cursor=fence.seq - 1, has_more=False),
                    now=rooms.now(), limits=limits)
        report.events += len(before)
    supersede_replica(rooms.target, room_id=room_id, room_name=info.name, members=info.members,
                      authority_gateway_id=page.gateway_id, authority_epoch=page.epoch, latest_seq=fence.seq,
                      now=rooms.now(), limits=limits)
    report.authority_gateway_id, report.authority_epoch, report.latest_seq = page.gateway_id, page.epoch, fence.seq


def _same_lineage(head: RoomHead, replica: ReplicaHead) -> bool:
    return (head.authority_gateway_id, head.authority_epoch) == (replica.authority_gateway_id,
                                                                 replica.authority_epoch)


def _fence_at(page: CheckedPage) -> CheckedEvent | None:
    """The ``authority.lost`` that handed the room to the page's own authority (the source's store fenced its room
    for that gateway, whose log goes on elsewhere), or None. An older fence, since undone by a later claim, is
    history like any event."""
    for event in page.events:
        if event.event.kind == "authority.lost":
            payload = json.loads(event.event.payload_json)
            if isinstance(payload, dict) and (payload.get("authority_gateway_id"), payload.get("authority_epoch")) \
                    == (page.gateway_id, page.epoch):
                return event
    return None


def _previous_gateway(fence: CheckedEvent) -> Any:
    payload = json.loads(fence.event.payload_json)
    return payload.get("previous_gateway_id") if isinstance(payload, dict) else None


def _check_fork(page: CheckedPage, since: int, replica: ReplicaHead) -> None:
    """The first event of a page read from ``since - 1`` must be the replica's last event, at an epoch the
    replica knows: otherwise the source's log diverged from this replica at or before ``since``.

    ``ingest_page`` then compares the event's content with the stored one. Only events up to the replica's
    epoch can be shared history: a newer lineage starts with its claim, placed after the last event its
    claimer held.
    """
    first = page.events[0] if page.events else None
    if first is None or first.seq != since:
        raise Refused(f"the source's log no longer holds this replica's seq {since}")
    epoch = first.event.authority_epoch
    if epoch is not None and epoch > replica.authority_epoch:
        raise Refused(f"the source forked from this replica: its seq {since} was written at epoch {epoch}, "
                      f"after this replica's epoch {replica.authority_epoch}")

"""Keep a local store's replicas of every room of a source caught up (:class:`Replicator`).

One pass (:meth:`Replicator.sync_once`) walks the source's rooms in ``room_id`` order and, for each, compares
the source's head (lineage, latest seq) with what the local store holds:

* a room in the local **authoritative** store is never replicated over (``ingest_page`` does not look at the
  authoritative tables, so the replicator does): when the source shows a strictly newer epoch held by another
  gateway and the local room is this gateway's, the local room is **demoted** (``demote_room``), which is how a
  returning authority fences itself; otherwise the room is reported ``local`` and left alone;
* a replica behind the source is fed ``read_events`` pages from its own ``last_seq`` (``replica_state``'s
  coverage, read back from the store on every pass: nothing is remembered across a crash, and ``ingest_page``
  is idempotent and refuses gaps, so a pass killed at any point resumes with no gap and no duplicate);
* when the source's lineage differs from the replica's (a claim, a promotion elsewhere, another source), the
  first page starts one event early: the source's event at the replica's ``last_seq`` must be the same event
  at an epoch the replica knows, or the source forked from this replica and the room is refused;
* a disband is replicated like any event; a room whose disband is stored is then no longer read;
* a refused page (a conflict, a regression, a fork, a hostile page) is reported with the reason and the room
  is backed off (1 s, doubling to 5 min): never retried in a hot loop.

Memory: one page per room being read (one room at a time, or one per worker), plus a small head per room;
never a whole log. Names and members are read from the source when a room is first replicated and again when a
page holds a rename or a claim.

:meth:`Replicator.run` repeats passes: immediately while a pass made progress and left rooms behind, else when
its :class:`~hostedrooms.standby.wake.Waker` says the source changed, or at the latest after ``interval``.
"""

from __future__ import annotations

import threading
import time
from collections import Counter, deque
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from ..engines import EngineSource, resolve_engine
from ..errors import (
    HostedRoomError,
    RoomNotFoundError,
    StoreConfigurationError,
    StoreUnavailableError,
)
from ..identity import local_gateway_id as resolve_local_gateway_id
from ..limits import Limits
from ..replicas import demote_room, ingest_page, prune_disbanded_replicas
from .heads import ReplicaHead, RoomHead, all_replica_heads, all_room_heads
from .source import PageSource, RoomInfo, SourceUnavailableError, iter_rooms
from .wake import IntervalWaker, Waker

__all__ = [
    "BACKING_OFF",
    "BEHIND",
    "CAUGHT_UP",
    "DEMOTED",
    "DISBANDED",
    "GONE",
    "LOCAL",
    "REFUSED",
    "SKIPPED",
    "Backoff",
    "PageIngested",
    "PassReport",
    "Replicator",
    "RoomReport",
]

#: The replica holds everything the source reported.
CAUGHT_UP = "caught-up"
#: The replica is still behind (the page budget of the pass ran out, or the source kept appending).
BEHIND = "behind"
#: A page or the room was refused this pass (see ``reason``); the room is backed off.
REFUSED = "refused"
#: Refused earlier; not read again until its back-off ends.
BACKING_OFF = "backing-off"
#: The disband is replicated; the room is no longer followed.
DISBANDED = "disbanded"
#: The local authoritative store holds this room: never replicated over.
LOCAL = "local"
#: The source showed a newer lineage and this gateway's local room was demoted.
DEMOTED = "demoted"
#: The room vanished from the source between listing and reading (purged).
GONE = "gone"
#: Not replicated: disbanded on the source before this replica ever existed.
SKIPPED = "skipped"

#: Errors that end a pass (the store or the source is unreachable or unusable): retried by the next pass, and
#: never charged to a room.
_PASS_ERRORS = (StoreUnavailableError, StoreConfigurationError, SourceUnavailableError)


@dataclass
class RoomReport:
    """What one pass did for one room."""

    room_id: str
    status: str
    pages: int = 0
    events: int = 0
    last_seq: int = 0  # the replica's stored seq after this pass (0: no replica)
    latest_seq: int = 0  # the source's latest seq, as last seen
    authority_gateway_id: str = ""  # the source's lineage, as last seen
    authority_epoch: int = 0
    reason: str = ""

    @property
    def lag(self) -> int:
        """Events the source holds that the replica does not (0 for rooms that are not replicated)."""
        if self.status in (LOCAL, DEMOTED, GONE, SKIPPED):
            return 0
        return max(0, self.latest_seq - self.last_seq)


@dataclass
class PassReport:
    """One pass over every room of the source."""

    rooms: list[RoomReport] = field(default_factory=list)
    seconds: float = 0.0
    error: str = ""  # the pass stopped early: the source or the local store could not be used
    pruned: list[str] = field(default_factory=list)  # disbanded replicas removed after this pass

    @property
    def pages(self) -> int:
        return sum(room.pages for room in self.rooms)

    @property
    def events(self) -> int:
        return sum(room.events for room in self.rooms)

    @property
    def lag(self) -> int:
        return sum(room.lag for room in self.rooms)

    def count(self, status: str) -> int:
        return sum(1 for room in self.rooms if room.status == status)

    @property
    def ok(self) -> bool:
        """No pass error and no room refused (or still backing off)."""
        return not self.error and not any(room.status in (REFUSED, BACKING_OFF) for room in self.rooms)

    def summary(self) -> str:
        counts = Counter(room.status for room in self.rooms)
        parts = ", ".join(f"{counts[status]} {status}" for status in (
            CAUGHT_UP, BEHIND, REFUSED, BACKING_OFF, DISBANDED, LOCAL, DEMOTED, GONE, SKIPPED) if counts[status])
        text = (f"{_count(len(self.rooms), 'room')} ({parts or 'none'}); {_count(self.events, 'event')} in "
                f"{_count(self.pages, 'page')}; lag {_count(self.lag, 'event')}; {self.seconds:.2f} s")
        if self.pruned:
            text += f"; {_count(len(self.pruned), 'disbanded replica')} removed"
        return f"{text}; stopped early: {self.error}" if self.error else text


def _count(number: int, noun: str) -> str:
    return f"{number:,} {noun}{'' if number == 1 else 's'}"


@dataclass(frozen=True, slots=True)
class PageIngested:
    """Given to ``on_page`` after each stored page (``monotonic`` is when ``ingest_page`` returned)."""

    room_id: str
    first_seq: int  # the first newly stored seq (0 when the page stored nothing new)
    last_seq: int  # the replica's stored seq after the page
    events: int
    latest_seq: int
    monotonic: float


class Backoff:
    """Per-room back-off after a refusal: ``base`` seconds, doubling per consecutive refusal up to ``maximum``."""

    def __init__(self, base: float = 1.0, maximum: float = 300.0) -> None:
        self.base, self.maximum = base, maximum
        self._rooms: dict[str, tuple[int, float, str]] = {}  # room -> (refusals, retry at, reason)
        self._lock = threading.Lock()  # a replicator's workers share it

    def refuse(self, room_id: str, reason: str, now: float) -> float:
        """Record a refusal; return the delay before the room is read again."""
        with self._lock:
            failures = self._rooms.get(room_id, (0, 0.0, ""))[0] + 1
            delay = float(min(self.maximum, self.base * 2.0 ** min(failures - 1, 30)))
            self._rooms[room_id] = (failures, now + delay, reason)
        return delay

    def waiting(self, room_id: str, now: float) -> tuple[float, str] | None:
        """(seconds left, reason) while the room is backed off, else None."""
        with self._lock:
            entry = self._rooms.get(room_id)
        if entry is None or entry[1] <= now:
            return None
        return float(entry[1] - now), str(entry[2])

    def clear(self, room_id: str) -> None:
        with self._lock:
            self._rooms.pop(room_id, None)

    def keep_only(self, room_ids: set[str]) -> None:
        """Forget rooms the source no longer lists (bounded by the rooms of one listing)."""
        with self._lock:
            for room_id in [room for room in self._rooms if room not in room_ids]:
                del self._rooms[room_id]


class _Refused(Exception):
    """A room-level refusal found by the replicator itself (not by a service)."""


class Replicator:
    """Keeps ``target``'s replicas of every room of ``source`` caught up.

    ``local_gateway_id``: this gateway (only needed to demote a local room when the source shows a newer
    lineage; default ``install:$HOSTEDROOMS_INSTALL_ID``). ``page_limit``: events per page (at most
    MAX_LOG_LIMIT). ``max_pages_per_room``: pages one pass reads from one room (None: until caught up), so a long
    catch-up of one room does not delay the others in a following replicator. ``now`` stamps ingested events
    that carry no ``created_at``, and ``monotonic`` times the back-off. ``on_page`` and ``on_room`` observe
    each stored page and each room's report (progress displays, lag measurements); they are never called
    concurrently.

    ``workers``: rooms handled at once (threads; default 1). Each room is still read and stored in order, one page
    at a time, so memory stays one page per room being read; what overlaps is one room's round trips and commit
    with another's. Worth it where the stores take concurrent work (PostgreSQL, a remote source); on SQLite the
    standby's writes still take turns. With more than one worker the source must be thread-safe (both shipped
    sources are).

    ``prune_disbanded_after``: seconds a replica whose room was disbanded is kept (its disband's timestamp
    against ``now``) before a pass removes it (:func:`~hostedrooms.replicas.prune_disbanded_replicas`), freeing its
    ``MAX_REPLICA_ROOMS`` slot; None (the default) keeps them, as the reference's replicas are kept.
    """

    def __init__(
        self,
        source: PageSource,
        target: EngineSource,
        *,
        local_gateway_id: Any = None,
        page_limit: int = 500,
        max_pages_per_room: int | None = None,
        backoff: Backoff | None = None,
        now: Callable[[], float] = time.time,
        monotonic: Callable[[], float] = time.monotonic,
        on_page: Callable[[PageIngested], None] | None = None,
        on_room: Callable[[RoomReport], None] | None = None,
        workers: int = 1,
        limits: Limits | None = None,
        prune_disbanded_after: int | None = None,
    ) -> None:
        if prune_disbanded_after is not None and (
                type(prune_disbanded_after) is not int or not 0 <= prune_disbanded_after <= 2**63 - 1):
            raise HostedRoomError("prune_disbanded_after must be a non-negative integer (seconds) or None")
        if isinstance(page_limit, bool) or not isinstance(page_limit, int) or page_limit < 1:
            raise HostedRoomError("page_limit must be a positive integer")
        if max_pages_per_room is not None and (
                isinstance(max_pages_per_room, bool) or not isinstance(max_pages_per_room, int)
                or max_pages_per_room < 1):
            raise HostedRoomError("max_pages_per_room must be a positive integer or None")
        if isinstance(workers, bool) or not isinstance(workers, int) or not 1 <= workers <= 64:
            raise HostedRoomError("workers must be an integer from 1 to 64")
        self.source = source
        self.target = resolve_engine(target)
        self._local_gateway_arg = local_gateway_id
        self.page_limit = page_limit
        self.max_pages_per_room = max_pages_per_room
        self.backoff = backoff or Backoff()
        self._now, self._monotonic = now, monotonic
        self._on_page, self._on_room = on_page, on_room
        self._page_lock = threading.Lock()
        self.workers = workers
        self.limits = limits
        self.prune_disbanded_after = prune_disbanded_after
        # Names and members change only with a rename or a claim: read again when a page holds one.
        self._infos: dict[str, RoomInfo] = {}

    # -- one pass ----------------------------------------------------------------------------------------------

    def sync_once(self) -> PassReport:
        """One pass over every room of the source; returns a report per room (see the module docstring).

        A pass that cannot list the source or read the local store stops early with ``error`` set; rooms it
        reached keep their reports. Room-level refusals never stop a pass.
        """
        started = self._monotonic()
        report = PassReport()
        seen: set[str] = set()
        try:
            local_rooms = all_room_heads(self.target)
            local_replicas = all_replica_heads(self.target)
            heads = iter_rooms(self.source)
            if self.workers == 1:
                for head in heads:
                    seen.add(head.room_id)
                    self._done(report, self._sync_room(
                        head, local_rooms.get(head.room_id), local_replicas.get(head.room_id)))
            else:
                self._in_parallel(heads, local_rooms, local_replicas, report, seen)
        except _PASS_ERRORS as exc:
            report.error = str(exc)
        except HostedRoomError as exc:  # the listing itself was refused (a hostile or broken source)
            report.error = f"the source's room listing was refused: {exc}"
        else:
            self.backoff.keep_only(seen)
            for room_id in [room for room in self._infos if room not in seen]:
                del self._infos[room_id]
            self._prune(report)
        report.seconds = self._monotonic() - started
        return report

    def _prune(self, report: PassReport) -> None:
        """Remove the disbanded replicas past ``prune_disbanded_after`` (only while the pass reported some)."""
        if self.prune_disbanded_after is None or not report.count(DISBANDED):
            return
        try:
            report.pruned = prune_disbanded_replicas(
                self.target, retain_seconds=self.prune_disbanded_after, now=self._now(), limits=self.limits)
        except _PASS_ERRORS as exc:
            report.error = f"removing disbanded replicas: {exc}"
            return
        pruned = set(report.pruned)
        for room in report.rooms:
            if room.room_id in pruned:
                room.reason = "replica removed"

    def _done(self, report: PassReport, room: RoomReport) -> None:
        report.rooms.append(room)
        if self._on_room is not None:
            self._on_room(room)

    def _in_parallel(self, heads: Iterator[RoomHead], local_rooms: dict[str, RoomHead],
                     local_replicas: dict[str, ReplicaHead], report: PassReport, seen: set[str]) -> None:
        """Rooms on ``workers`` threads, reported in listing order; at most two rooms per worker are queued, so
        the listing is walked as the work goes, and a pass error stops what has not started."""
        pending: deque[Future[RoomReport]] = deque()
        with ThreadPoolExecutor(self.workers, thread_name_prefix="hostedrooms-replicator") as pool:
            try:
                for head in heads:
                    seen.add(head.room_id)
                    pending.append(pool.submit(self._sync_room, head, local_rooms.get(head.room_id),
                                               local_replicas.get(head.room_id)))
                    while len(pending) >= 2 * self.workers:
                        self._done(report, pending.popleft().result())
                while pending:
                    self._done(report, pending.popleft().result())
            finally:
                for future in pending:
                    future.cancel()

    def _page_done(self, page: PageIngested) -> None:
        if self._on_page is not None:
            with self._page_lock:
                self._on_page(page)

    def _room_info(self, room_id: str, page: Any) -> RoomInfo:
        """The cached name and members, read again from the source when ``page`` renames or claims the room."""
        info = self._infos.get(room_id)
        if info is None or _changes_info(page):
            info = self._infos[room_id] = self.source.room_info(room_id)
        return info

    def _sync_room(self, head: RoomHead, local: RoomHead | None, replica: ReplicaHead | None) -> RoomReport:
        report = RoomReport(head.room_id, CAUGHT_UP, latest_seq=head.latest_seq,
                            authority_gateway_id=head.authority_gateway_id, authority_epoch=head.authority_epoch,
                            last_seq=replica.last_seq if replica is not None else 0)
        if local is not None:
            return self._local_room(head, local, report)
        waiting = self.backoff.waiting(head.room_id, self._monotonic())
        if waiting is not None:
            report.status, report.reason = BACKING_OFF, f"{waiting[1]} (retrying in {waiting[0]:.0f} s)"
            return report
        if replica is None and head.disbanded:
            report.status, report.reason = SKIPPED, "disbanded on the source before it was replicated here"
            return report
        try:
            if replica is not None:
                self._check_lineage(head, replica)
                if replica.last_seq >= head.latest_seq and _same_lineage(head, replica):
                    report.status = DISBANDED if head.disbanded else CAUGHT_UP
                    self.backoff.clear(head.room_id)
                    return report
            self._catch_up(head, replica, report)
        except _PASS_ERRORS:
            raise
        except RoomNotFoundError as exc:  # purged (or expired) between the listing and the read
            report.status, report.reason = GONE, str(exc)
        except (HostedRoomError, _Refused) as exc:
            self._infos.pop(head.room_id, None)
            delay = self.backoff.refuse(head.room_id, str(exc), self._monotonic())
            report.status, report.reason = REFUSED, f"{exc} (retrying in {delay:.0f} s)"
        else:
            self.backoff.clear(head.room_id)
        return report

    @staticmethod
    def _check_lineage(head: RoomHead, replica: ReplicaHead) -> None:
        """Refuse, without reading a page, a source that is behind what this replica already knows."""
        if head.authority_epoch < replica.authority_epoch:
            raise _Refused(f"the source holds epoch {head.authority_epoch}, older than this replica's epoch "
                           f"{replica.authority_epoch}")
        if (head.authority_epoch == replica.authority_epoch
                and head.authority_gateway_id != replica.authority_gateway_id):
            raise _Refused(f"the source's owner at epoch {head.authority_epoch} differs from this replica's")
        if _same_lineage(head, replica) and head.latest_seq < replica.latest_seq:
            raise _Refused(f"the source's log ends at seq {head.latest_seq}, before the seq "
                           f"{replica.latest_seq} this replica saw it reach")

    def _catch_up(self, head: RoomHead, replica: ReplicaHead | None, report: RoomReport) -> None:
        room_id = head.room_id
        since = replica.last_seq if replica is not None else 0
        known_latest = max(head.latest_seq, replica.latest_seq if replica is not None else 0)
        # A replica of an empty room is stored too (so it can be promoted); and a lineage change with no new
        # event still updates the replica's authority.
        store_empty = replica is None or not _same_lineage(head, replica)
        fork_check = replica is not None and since > 0 and not _same_lineage(head, replica)
        disbanded = head.disbanded
        while self.max_pages_per_room is None or report.pages < self.max_pages_per_room:
            page = self.source.read_events(room_id, since_seq=since - 1 if fork_check else since,
                                           limit=self.page_limit)
            if fork_check:
                assert replica is not None
                _check_fork(page, since, replica)
                fork_check = False
            page_latest = _page_latest(page)
            if _no_new_events(page, since):
                # Only a full page (the fork check's, of one event) may hold nothing new while the log goes on.
                if page_latest > since and len(page["events"]) < self.page_limit:
                    raise _Refused(f"the source reports seq {page_latest} but its page holds nothing after seq "
                                   f"{since}")
                if not store_empty:
                    break
            info = self._room_info(room_id, page)
            result = ingest_page(self.target, room_id=room_id, room_name=info.name, members=info.members,
                                 page=page, now=self._now(), limits=self.limits)
            stored, ingested = int(result["stored_seq"]), int(result["ingested"])
            known_latest = max(known_latest, page_latest, stored)
            report.pages += 1
            report.events += ingested
            report.authority_gateway_id = str(result["authority"]["gateway_id"])
            report.authority_epoch = int(result["authority"]["epoch"])
            report.latest_seq = known_latest
            disbanded = disbanded or any(event["kind"] == "room.disbanded" for event in page["events"])
            self._page_done(PageIngested(room_id, since + 1 if ingested else 0, stored, ingested, known_latest,
                                         self._monotonic()))
            report.last_seq = since = stored
            store_empty = False
            if result["caught_up"] or not ingested:
                break
        if since >= known_latest:
            report.status = DISBANDED if disbanded else CAUGHT_UP
        else:
            report.status = BEHIND

    # -- the local authoritative store -------------------------------------------------------------------------

    def _local_room(self, head: RoomHead, local: RoomHead, report: RoomReport) -> RoomReport:
        report.status, report.last_seq = LOCAL, 0
        held = f"the local store holds this room for {local.authority_gateway_id} at epoch {local.authority_epoch}"
        newer = head.authority_epoch > local.authority_epoch and not local.disbanded
        if not newer:
            report.reason = f"{held}; never replicated over"
            return report
        local_gateway = self._local_gateway()
        if local_gateway is None:
            report.status = REFUSED
            report.reason = (f"{held}, and the source shows epoch {head.authority_epoch}: demoting needs this "
                             "gateway's identity (local_gateway_id, or HOSTEDROOMS_INSTALL_ID)")
            return report
        if local.authority_gateway_id != local_gateway or head.authority_gateway_id == local_gateway:
            report.reason = f"{held} (the source shows epoch {head.authority_epoch}); not this gateway's to demote"
            return report
        waiting = self.backoff.waiting(head.room_id, self._monotonic())
        if waiting is not None:  # a refused demotion is not retried on every pass either
            report.status, report.reason = BACKING_OFF, f"{waiting[1]} (retrying in {waiting[0]:.0f} s)"
            return report
        try:
            demote_room(self.target, room_id=head.room_id, observed_gateway_id=head.authority_gateway_id,
                        observed_epoch=head.authority_epoch, now=self._now(), local_gateway_id=local_gateway,
                        limits=self.limits)
        except _PASS_ERRORS:
            raise
        except HostedRoomError as exc:
            delay = self.backoff.refuse(head.room_id, str(exc), self._monotonic())
            report.status, report.reason = REFUSED, f"demotion refused: {exc} (retrying in {delay:.0f} s)"
            return report
        self.backoff.clear(head.room_id)
        report.status = DEMOTED
        report.reason = (f"the source holds epoch {head.authority_epoch} for {head.authority_gateway_id}; this "
                         f"gateway's epoch {local.authority_epoch} is fenced")
        return report

    def _local_gateway(self) -> str | None:
        try:
            return resolve_local_gateway_id(self._local_gateway_arg)
        except HostedRoomError:
            return None

    # -- following ---------------------------------------------------------------------------------------------

    def run(
        self,
        *,
        interval: float = 1.0,
        waker: Waker | None = None,
        stop: threading.Event | None = None,
        on_pass: Callable[[PassReport], None] | None = None,
        max_error_delay: float = 60.0,
    ) -> None:
        """Run passes until ``stop`` is set: again at once while a pass made progress and left rooms behind;
        otherwise when ``waker`` reports a change or after ``interval`` seconds. A pass that stops early (the
        source or the store unreachable) is retried after ``interval``, doubling up to ``max_error_delay``."""
        stop = stop if stop is not None else threading.Event()
        waker = waker if waker is not None else IntervalWaker()
        errors = 0
        while not stop.is_set():
            waker.arm()
            report = self.sync_once()
            if on_pass is not None:
                on_pass(report)
            if report.error:
                errors += 1
                stop.wait(min(max_error_delay, interval * 2 ** min(errors - 1, 16)))
                continue
            errors = 0
            if report.events and report.count(BEHIND):
                continue
            waker.wait(interval, stop)


def _same_lineage(head: RoomHead, replica: ReplicaHead) -> bool:
    return (head.authority_gateway_id, head.authority_epoch) == (replica.authority_gateway_id,
                                                                 replica.authority_epoch)


#: Event kinds after which a room's name or members may differ (a rename; a claim adopting a legacy room).
_INFO_KINDS = frozenset({"room.renamed", "authority.claimed"})


def _changes_info(page: Any) -> bool:
    events = page.get("events") if isinstance(page, dict) else None
    return not isinstance(events, list) or any(
        not isinstance(event, dict) or event.get("kind") in _INFO_KINDS for event in events)


def _page_latest(page: Any) -> int:
    """The page's ``latest_seq`` when it is a plain integer, else 0 (``ingest_page`` judges the page)."""
    latest = page.get("latest_seq") if isinstance(page, dict) else None
    return latest if isinstance(latest, int) and not isinstance(latest, bool) else 0


def _no_new_events(page: Any, since: int) -> bool:
    """Whether ``page`` (unchecked) plainly holds nothing after ``since``; anything odd goes to ``ingest_page``,
    which refuses it with a reason."""
    if not isinstance(page, dict) or not isinstance(page.get("events"), list):
        return False
    events = page["events"]
    return not events or (isinstance(events[-1], dict) and isinstance(events[-1].get("seq"), int)
                          and events[-1]["seq"] <= since)


def _check_fork(page: Any, since: int, replica: ReplicaHead) -> None:
    """The first event of a page read from ``since - 1`` must be the replica's last event, at an epoch the
    replica knows: otherwise the source's log diverged from this replica at or before ``since``.

    ``ingest_page`` then compares the event's content with the stored one. Only events up to the replica's
    epoch can be shared history: a newer lineage starts with its claim, placed after the last event its
    claimer held.
    """
    events = page.get("events") if isinstance(page, dict) else None
    first = events[0] if isinstance(events, list) and events else None
    if not isinstance(first, dict) or first.get("seq") != since:
        raise _Refused(f"the source's log no longer holds this replica's seq {since}")
    epoch = first.get("authority_epoch")
    if epoch is not None and (isinstance(epoch, bool) or not isinstance(epoch, int)
                              or epoch > replica.authority_epoch):
        raise _Refused(f"the source forked from this replica: its seq {since} was written at epoch {epoch}, "
                       f"after this replica's epoch {replica.authority_epoch}")

"""Keep a local store's replicas of every room of a source caught up (:class:`Replicator`).

One pass (:meth:`Replicator.sync_once`) walks the source's rooms in ``room_id`` order and, for each, compares
the source's head (lineage, latest seq) with what the local store holds:

* every value a source returns (a listing head, a page, a room's name and members) is validated before any
  use (:func:`~hostedrooms.replicas.validate_page` for pages): a bad value refuses that room only, with a
  reason naming the room and the field; an exception of the source's own becomes a
  :class:`~hostedrooms.standby.source.SourceProtocolError`;
* a room in the local **authoritative** store is never replicated over (``ingest_page`` does not look at the
  authoritative tables, so the replicator does): when the source shows a strictly newer epoch held by another
  gateway and the local room is this gateway's, the local room is **demoted** (``demote_room``), which is how a
  returning authority fences itself, but only on proof that the source's log continues this room: read from
  seq 1, it must hold exactly the local events up to the local head (ids and content), then, before any event
  of a newer epoch, an ``authority.claimed`` naming this gateway at the local epoch as the previous authority.
  Anything else (another gateway's room of the same name, a listing that only claims a newer epoch, a claim
  naming another previous authority, local events the source never got) refuses the room with the reason and
  changes nothing (:mod:`.proof`); the demoting write is conditioned on the head the proof read, so a write
  committed after the proof leaves the room untouched and proved again next pass; a room that is not this
  gateway's is reported ``local`` and left alone;
* a listing head's ``latest_seq`` is never stored: only pages are; a replica whose stored ``latest_seq`` is
  above its ``last_seq`` (no stored event supports it) takes the source's current claim from the next page
  (``ingest_page``'s ``supersede_latest_seq``), so one lying page cannot keep it from ever being caught up;
* a replica behind the source is fed ``read_events`` pages from its own ``last_seq`` (``replica_state``'s
  coverage, read back from the store on every pass: nothing is remembered across a crash, and ``ingest_page``
  is idempotent and refuses gaps, so a pass killed at any point resumes with no gap and no duplicate);
* when the source's lineage differs from the replica's (a claim, a promotion elsewhere, another source), the
  first page starts one event early: the source's event at the replica's ``last_seq`` must be the same event
  at an epoch the replica knows, or the source forked from this replica and the room is refused;
* the source's store lineage (each page's ``lineage``: :mod:`hostedrooms.lineage`) is remembered per room,
  with the replica it fed; a page showing another lineage (the source's PostgreSQL failed over to a standby), or
  the first page of a room this replicator has not read yet, starts one event early too: the source's event at
  the replica's ``last_seq`` must be the very event the replica holds (seq, id and content), or the source lost
  events this replica had (an asynchronous standby was promoted, and its seqs may hold other events now) and the
  room is refused with that reason instead of ingesting a diverged log. A caught-up replica reads no page, so
  such a change is found at the room's next append on the source;
* a disband is replicated like any event; a room whose disband is stored is then no longer read;
* a refused page (a conflict, a regression, a fork, a hostile page) is reported with the reason and the room
  is backed off (1 s, doubling to 5 min): never retried in a hot loop.

A pass is bounded (``max_rooms_per_pass``, ``max_pages_per_pass``, ``max_bytes_per_pass``,
``max_seconds_per_pass``; the defaults follow from what a real source can hold): when a bound is reached the
pass ends with ``PassReport.bound`` saying which, and the next pass resumes the listing after the last room
finished, so a source whose listing never ends costs one bounded pass at a time.

Memory: one page per room being read (one room at a time, or one per worker), plus a small head per room of
one pass's listing (at most ``max_rooms_per_pass``); never a whole log. Names and members are read from the
source when a room is first replicated and again when a page holds a rename or a claim.

:meth:`Replicator.run` repeats passes: immediately while a pass made progress and left rooms behind, else when
its :class:`~hostedrooms.standby.wake.Waker` says the source changed, or at the latest after ``interval``.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections import Counter, deque
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from typing import Any

from ..demotion import demote_room
from ..engines import EngineSource, resolve_engine
from ..errors import (
    DemotionStaleError,
    HostedRoomError,
    ReplicaError,
    RoomNotFoundError,
    StoreConfigurationError,
    StoreUnavailableError,
)
from ..identity import local_gateway_id as resolve_local_gateway_id
from ..limits import Limits, in_force
from ..replicas import (
    CheckedEvent,
    CheckedPage,
    ingest_page,
    prune_disbanded_replicas,
    supersede_replica,
    validate_page,
)
from ..rooms import rules as room_rules
from ..telemetry import traced
from ..validation import INT64_MAX, MAX_EPOCH, identifier
from .heads import ReplicaHead, RoomHead, all_replica_heads, all_room_heads
from .lag import pass_attributes, record_pass
from .proof import LocalLog, Proofs, Refused
from .reclaim import DEFAULT_RECLAIM_AFTER, FENCED, RECLAIMED, Reclaims
from .source import (
    EnginePageSource,
    PageSource,
    RoomInfo,
    SourceProtocolError,
    SourceUnavailableError,
    call_source,
    iter_rooms,
)
from .steps import step
from .wake import IntervalWaker, Waker

_log = logging.getLogger(__name__)

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

#: No lineage remembered for a room yet.
_UNKNOWN: Any = object()


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
        if self.status in (LOCAL, DEMOTED, GONE, SKIPPED, RECLAIMED, FENCED):
            return 0
        return max(0, self.latest_seq - self.last_seq)


@dataclass
class PassReport:
    """One pass over every room of the source."""

    rooms: list[RoomReport] = field(default_factory=list)
    seconds: float = 0.0
    error: str = ""  # the pass stopped early: the source or the local store could not be used
    pruned: list[str] = field(default_factory=list)  # disbanded replicas removed after this pass
    bound: str = ""  # the pass stopped at one of its bounds (which one); the next pass resumes the listing

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
        """No pass error, no bound reached (every room of the source was looked at) and no room refused (or still
        backing off)."""
        return not self.error and not self.bound and not any(
            room.status in (REFUSED, BACKING_OFF) for room in self.rooms)

    def summary(self) -> str:
        counts = Counter(room.status for room in self.rooms)
        parts = ", ".join(f"{counts[status]} {status}" for status in (
            CAUGHT_UP, BEHIND, REFUSED, BACKING_OFF, DISBANDED, LOCAL, DEMOTED, GONE, SKIPPED, RECLAIMED, FENCED)
            if counts[status])
        text = (f"{_count(len(self.rooms), 'room')} ({parts or 'none'}); {_count(self.events, 'event')} in "
                f"{_count(self.pages, 'page')}; lag {_count(self.lag, 'event')}; {self.seconds:.2f} s")
        if self.pruned:
            text += f"; {_count(len(self.pruned), 'disbanded replica')} removed"
        if self.bound:
            text += f"; stopped at a bound: {self.bound}"
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
    """Per-room back-off after a refusal: ``base`` seconds, doubling per consecutive refusal up to ``maximum``.

    At most ``max_rooms`` rooms are remembered (the oldest refusal is forgotten first), so a source listing
    ever new rooms to refuse cannot grow it."""

    def __init__(self, base: float = 1.0, maximum: float = 300.0, *, max_rooms: int = 4096) -> None:
        self.base, self.maximum, self.max_rooms = base, maximum, max_rooms
        self._rooms: dict[str, tuple[int, float, str]] = {}  # room -> (refusals, retry at, reason)
        self._lock = threading.Lock()  # a replicator's workers share it

    def refuse(self, room_id: str, reason: str, now: float) -> float:
        """Record a refusal; return the delay before the room is read again."""
        with self._lock:
            failures = self._rooms.pop(room_id, (0, 0.0, ""))[0] + 1
            delay = float(min(self.maximum, self.base * 2.0 ** min(failures - 1, 30)))
            self._rooms[room_id] = (failures, now + delay, reason)
            while len(self._rooms) > self.max_rooms:
                del self._rooms[next(iter(self._rooms))]
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


class _Bounded(Exception):
    """The pass reached one of its bounds (the message says which)."""


#: Seconds one pass may take by default (a real source's rooms fit in far less; a slower one resumes next pass).
DEFAULT_MAX_SECONDS_PER_PASS = 600.0


class _Budget:
    """What one pass may still spend: rooms listed, pages and bytes read, time (shared by the workers)."""

    def __init__(self, rooms: int, pages: int, size: int, deadline: float, monotonic: Callable[[], float]) -> None:
        self.rooms, self.pages, self.size, self.deadline = rooms, pages, size, deadline
        self._monotonic = monotonic
        self._lock = threading.Lock()
        self.reached = ""  # the first bound reached ("" while none)

    def _stop(self, reason: str) -> None:
        with self._lock:
            self.reached = self.reached or reason
        raise _Bounded(self.reached)

    def check(self) -> None:
        """Raise _Bounded once a bound was reached (or the time is up)."""
        if self.reached:
            raise _Bounded(self.reached)
        if self._monotonic() >= self.deadline:
            self._stop("the pass took its time limit (max_seconds_per_pass)")

    def room(self) -> None:
        """Charge one listed room. The room bound ends the listing only: rooms listed before it are still handled
        (so it never sets ``reached``, which stops the rooms not yet started)."""
        self.check()
        with self._lock:
            self.rooms -= 1
            left = self.rooms
        if left < 0:
            raise _Bounded("the source listed more rooms than a pass takes (max_rooms_per_pass)")

    def page(self) -> None:
        self.check()
        with self._lock:
            self.pages -= 1
            left = self.pages
        if left < 0:
            self._stop("the pass read its page limit (max_pages_per_pass)")

    def spend(self, size: int) -> None:
        with self._lock:
            self.size -= size
            left = self.size
        if left < 0:
            with self._lock:
                self.reached = self.reached or "the pass read its byte limit (max_bytes_per_pass)"


class Replicator:
    """Keeps ``target``'s replicas of every room of ``source`` caught up.

    ``local_gateway_id``: this gateway (only needed to demote a local room when the source shows a newer
    lineage; default ``install:$HOSTEDROOMS_INSTALL_ID``). ``page_limit``: events per page (at most
    MAX_LOG_LIMIT). ``max_pages_per_room``: pages one pass reads from one room (None: until caught up), so a long
    catch-up of one room does not delay the others in a following replicator. ``now`` stamps ingested events
    that carry no ``created_at``, and ``monotonic`` times the back-off and the pass. ``on_page`` and ``on_room``
    observe each stored page and each room's report (progress displays, lag measurements); they are never called
    concurrently.

    ``workers``: rooms handled at once (threads; default 1). Each room is still read and stored in order, one page
    at a time, so memory stays one page per room being read; what overlaps is one room's round trips and commit
    with another's. Worth it where the stores take concurrent work (PostgreSQL, a remote source); on SQLite the
    standby's writes still take turns. With more than one worker the source must be thread-safe (both shipped
    sources are).

    ``prune_disbanded_after``: seconds a replica whose room was disbanded is kept (its disband's timestamp
    against ``now``) before a pass removes it (:func:`~hostedrooms.replicas.prune_disbanded_replicas`), freeing its
    ``MAX_REPLICA_ROOMS`` slot; None (the default) keeps them, as the reference's replicas are kept.

    The bounds of one pass (None: the default named): ``max_rooms_per_pass`` rooms listed (default
    MAX_ACTIVE_ROOMS + MAX_DISBANDED_ROOM_TOMBSTONES, every room a source can hold, live or retained);
    ``max_pages_per_pass`` pages read (default: that many rooms times the pages of a full room,
    (MAX_EVENTS_PER_ROOM + CONTROL_EVENT_COUNT_RESERVE) / ``page_limit`` + 2); ``max_bytes_per_pass`` event
    bytes read (default twice MAX_GATEWAY_EVENT_BYTES, a source's whole event budget, re-reads included);
    ``max_seconds_per_pass`` (default :data:`DEFAULT_MAX_SECONDS_PER_PASS`). The limits are ``limits``' (the
    module's by default), read at each pass.

    ``source_gateway_id``: the gateway whose own store the source is (the operator's word; None: not said). With
    it, each pass also gives back the local rooms that gateway's failover fenced here and never promoted, once
    the fence is ``reclaim_after`` seconds old (:mod:`hostedrooms.standby.reclaim`; needs ``local_gateway_id``).
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
        max_rooms_per_pass: int | None = None,
        max_pages_per_pass: int | None = None,
        max_bytes_per_pass: int | None = None,
        max_seconds_per_pass: float | None = DEFAULT_MAX_SECONDS_PER_PASS,
        source_gateway_id: Any = None,
        reclaim_after: float = DEFAULT_RECLAIM_AFTER,
    ) -> None:
        if prune_disbanded_after is not None and (
                type(prune_disbanded_after) is not int or not 0 <= prune_disbanded_after <= 2**63 - 1):
            raise HostedRoomError("prune_disbanded_after must be a non-negative integer (seconds) or None")
        if isinstance(page_limit, bool) or not isinstance(page_limit, int) or page_limit < 1:
            raise HostedRoomError("page_limit must be a positive integer")
        for name, value in (("max_pages_per_room", max_pages_per_room), ("max_rooms_per_pass", max_rooms_per_pass),
                            ("max_pages_per_pass", max_pages_per_pass), ("max_bytes_per_pass", max_bytes_per_pass)):
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
                raise HostedRoomError(f"{name} must be a positive integer or None")
        if max_seconds_per_pass is not None and (
                isinstance(max_seconds_per_pass, bool) or not isinstance(max_seconds_per_pass, (int, float))
                or not 0 < max_seconds_per_pass < float("inf")):
            raise HostedRoomError("max_seconds_per_pass must be a positive number of seconds or None")
        if isinstance(workers, bool) or not isinstance(workers, int) or not 1 <= workers <= 64:
            raise HostedRoomError("workers must be an integer from 1 to 64")
        self.source = source
        self.target = resolve_engine(target)
        self._local_gateway_arg = local_gateway_id
        self.page_limit = page_limit
        self.max_pages_per_room = max_pages_per_room
        self.max_rooms_per_pass = max_rooms_per_pass
        self.max_pages_per_pass = max_pages_per_pass
        self.max_bytes_per_pass = max_bytes_per_pass
        self.max_seconds_per_pass = max_seconds_per_pass
        self.backoff = backoff or Backoff()
        self._now, self._monotonic = now, monotonic
        self._on_page, self._on_room = on_page, on_room
        self._page_lock = threading.Lock()
        self.workers = workers
        self.limits = limits
        self.prune_disbanded_after = prune_disbanded_after
        # Names and members change only with a rename or a claim: read again when a page holds one.
        self._infos: dict[str, RoomInfo] = {}
        # Where the next pass starts its listing (after a pass that stopped at a bound), else None.
        self._resume_after: str | None = None
        # Per room: the source store's lineage its replica was last fed under (a room absent: not read yet by
        # this replicator, so its first page is checked against the replica's last event).
        self._lineages: dict[str, str | None] = {}
        # Demotion proofs cut short by a pass bound, by room (each resumes there).
        self._proofs = Proofs()
        self._reclaims = self._reclaimer(source_gateway_id, reclaim_after)

    def _reclaimer(self, source_gateway_id: Any, after: Any) -> Reclaims | None:
        """What gives back the rooms fenced here for ``source_gateway_id`` and never promoted (standby/reclaim)."""
        if isinstance(after, bool) or not isinstance(after, (int, float)) or not 0 <= after < float("inf"):
            raise HostedRoomError("reclaim_after must be a non-negative number of seconds")
        if source_gateway_id is None:
            return None
        lim = in_force(self.limits)
        holder = identifier(source_gateway_id, error=HostedRoomError, label="source_gateway_id",
                            max_chars=lim.MAX_ACTOR_ID_CHARS)
        local = self._local_gateway()
        if local is None:
            raise HostedRoomError("source_gateway_id needs this gateway's identity (local_gateway_id, or "
                                  "HOSTEDROOMS_INSTALL_ID)")
        if holder == local:
            raise HostedRoomError("source_gateway_id is this gateway: name the gateway whose store the source is")
        return Reclaims(holder=holder, local=local, after=float(after), limits=self.limits)

    # -- one pass ----------------------------------------------------------------------------------------------

    @property
    def monotonic(self) -> Callable[[], float]:
        """The clock that times this replicator's back-off and passes (its lag seconds too)."""
        return self._monotonic

    def _budget(self) -> _Budget:
        lim = in_force(self.limits)
        rooms = self.max_rooms_per_pass or int(lim.MAX_ACTIVE_ROOMS) + int(lim.MAX_DISBANDED_ROOM_TOMBSTONES)
        full_room = -(-(int(lim.MAX_EVENTS_PER_ROOM) + int(lim.CONTROL_EVENT_COUNT_RESERVE)) // self.page_limit) + 2
        pages = self.max_pages_per_pass or rooms * full_room
        size = self.max_bytes_per_pass or 2 * int(lim.MAX_GATEWAY_EVENT_BYTES)
        seconds = self.max_seconds_per_pass
        deadline = float("inf") if seconds is None else self._monotonic() + seconds
        return _Budget(rooms, pages, size, deadline, self._monotonic)

    @traced("standby.pass", engine=lambda args: args[0].target, result=pass_attributes, on_result=record_pass)
    def sync_once(self) -> PassReport:
        """One pass over the rooms of the source; returns a report per room (see the module docstring).

        A pass that cannot list the source or read the local store stops early with ``error`` set; one that
        reaches a bound stops with ``bound`` set (and the next pass resumes the listing); rooms it reached keep
        their reports. Room-level refusals never stop a pass, and nothing a source returns makes it raise.
        """
        started = self._monotonic()
        report = PassReport()
        budget = self._budget()
        start_after = self._resume_after
        seen: set[str] = set()  # at most one pass's listing (max_rooms_per_pass)
        cut: list[str | None] = []  # the room after which the next pass resumes, once a bound cut the pass
        try:
            local_rooms = all_room_heads(self.target)
            local_replicas = all_replica_heads(self.target)
            heads = self._listing(start_after, budget, seen)
            if self.workers == 1:
                for head in heads:
                    self._done(report, cut, head, self._sync_room(
                        head, local_rooms.get(head.room_id), local_replicas.get(head.room_id), budget))
            else:
                self._in_parallel(heads, local_rooms, local_replicas, report, cut, budget)
        except _PASS_ERRORS as exc:
            report.error = str(exc)
        except _Bounded as exc:
            report.bound = str(exc)
        except HostedRoomError as exc:  # the listing itself was refused (a hostile or broken source)
            report.error = f"the source's room listing was refused: {exc}"
        else:
            report.bound = budget.reached
            if not report.bound and start_after is None:  # a whole listing: forget rooms the source dropped
                self.backoff.keep_only(seen)
                for room_id in [room for room in self._infos if room not in seen]:
                    del self._infos[room_id]
                for room_id in [room for room in self._lineages if room not in seen]:
                    del self._lineages[room_id]
                self._proofs.keep_only(seen)
            self._prune(report)
            self._reclaim(report, local_rooms)
        if report.bound:
            last = report.rooms[-1].room_id if report.rooms else start_after
            self._resume_after = cut[0] if cut else last
        elif not report.error:
            self._resume_after = None
        if len(self._infos) > 2 * len(seen) + LISTING_CACHE:  # a cache: never more than a pass or two of rooms
            self._infos.clear()
        report.seconds = self._monotonic() - started
        _log_pass(report)
        return report

    def _listing(self, after: str | None, budget: _Budget, seen: set[str]) -> Iterator[RoomHead]:
        """The source's rooms after ``after``, each charged to the pass's room bound."""
        for head in iter_rooms(self.source, after=after):
            budget.room()
            seen.add(head.room_id)
            yield head

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

    def _reclaim(self, report: PassReport, local_rooms: dict[str, RoomHead]) -> None:
        """Give back the rooms fenced here for the source's gateway that it never promoted (standby/reclaim)."""
        if self._reclaims is None:
            return
        holder_store = self.source.engine if isinstance(self.source, EnginePageSource) else None
        try:
            done = self._reclaims.run(self.target, holder_store, local_rooms, self._now())
        except _PASS_ERRORS as exc:
            report.error = f"giving back fenced rooms: {exc}"
            return
        for outcome in done:
            status = REFUSED if outcome.status == "refused" else outcome.status
            holder = self._reclaims.local if outcome.status == RECLAIMED else self._reclaims.holder
            self._done(report, [], None, (RoomReport(outcome.room_id, status, authority_gateway_id=holder,
                                                     authority_epoch=outcome.epoch, reason=outcome.reason), False))

    def _done(self, report: PassReport, cut: list[str | None], head: RoomHead | None,
              room: tuple[RoomReport | None, bool]) -> None:
        """Report a room (in listing order); the first room a bound cut short is where the next pass resumes."""
        reported, bounded = room
        if bounded and not cut:
            cut.append(report.rooms[-1].room_id if report.rooms else self._resume_after)
        if reported is not None:
            _log_room(reported)
            report.rooms.append(reported)
            if self._on_room is not None:
                self._on_room(reported)

    def _in_parallel(self, heads: Iterator[RoomHead], local_rooms: dict[str, RoomHead],
                     local_replicas: dict[str, ReplicaHead], report: PassReport, cut: list[str | None],
                     budget: _Budget) -> None:
        """Rooms on ``workers`` threads, reported in listing order; at most two rooms per worker are queued, so
        the listing is walked as the work goes, and a pass error stops what has not started."""
        pending: deque[tuple[RoomHead, Future[tuple[RoomReport | None, bool]]]] = deque()
        bounded: _Bounded | None = None
        with ThreadPoolExecutor(self.workers, thread_name_prefix="hostedrooms-replicator") as pool:
            try:
                try:
                    for head in heads:
                        pending.append((head, pool.submit(self._sync_room, head, local_rooms.get(head.room_id),
                                                          local_replicas.get(head.room_id), budget)))
                        while len(pending) >= 2 * self.workers:
                            done, future = pending.popleft()
                            self._done(report, cut, done, future.result())
                except _Bounded as exc:  # the listing reached a bound: the rooms already started are reported
                    bounded = exc
                while pending:
                    done, future = pending.popleft()
                    self._done(report, cut, done, future.result())
            finally:
                for _, future in pending:
                    future.cancel()
        if bounded is not None:
            raise bounded

    def _page_done(self, page: PageIngested) -> None:
        if self._on_page is not None:
            with self._page_lock:
                self._on_page(page)

    # -- reading the source (every value validated before use) ---------------------------------------------------

    def _read_page(self, room_id: str, since: int, budget: _Budget, *, extra: int = 0) -> CheckedPage:
        """The source's page of ``room_id`` after ``since`` (``extra`` events more than ``page_limit``, within
        MAX_LOG_LIMIT), validated (SourceProtocolError names the room and the field), charged to the pass's page
        and byte bounds."""
        budget.page()
        limit = min(self.page_limit + extra, max(self.page_limit, int(in_force(self.limits).MAX_LOG_LIMIT)))
        raw = call_source("page", self.source.read_events, room_id, since_seq=since, limit=limit)
        try:
            page = validate_page(raw, room_id=room_id, limits=self.limits)
            if len(page.events) > limit:
                raise HostedRoomError(f"page.events holds more than the {limit} events asked for")
        except HostedRoomError as exc:
            raise SourceProtocolError(f"the source's page of room {room_id!r} after seq {since} is invalid: "
                                      f"{exc}") from None
        budget.spend(page.size)
        return page

    def _room_info(self, room_id: str, page: CheckedPage) -> RoomInfo:
        """The cached name and members, read again from the source when ``page`` renames or claims the room."""
        info = self._infos.get(room_id)
        if info is None or _changes_info(page):
            info = self._infos[room_id] = self._checked_info(room_id)
        return info

    def _checked_info(self, room_id: str) -> RoomInfo:
        info = call_source("room info", self.source.room_info, room_id)
        lim = in_force(self.limits)
        try:
            if not isinstance(info, RoomInfo):
                raise HostedRoomError("it is not a RoomInfo")
            if info.room_id != room_id:
                raise HostedRoomError("room_id: another room's")
            room_rules.validate_room_name(info.name, lim)
            room_rules.validate_members(info.members, lim)
        except HostedRoomError as exc:
            raise SourceProtocolError(f"the source's room info of room {room_id!r} is invalid: {exc}") from None
        return info

    # -- one room ----------------------------------------------------------------------------------------------

    def _sync_room(self, head: RoomHead, local: RoomHead | None, replica: ReplicaHead | None,
                   budget: _Budget) -> tuple[RoomReport | None, bool]:
        """(the room's report, whether a pass bound cut it short); no report when the pass was over before it."""
        try:
            budget.check()
        except _Bounded:
            return None, True
        problem = _head_problem(head, in_force(self.limits))
        if problem:
            room_id = head.room_id[:200]
            return RoomReport(room_id, REFUSED, reason=f"the source's listing of room {room_id!r} is invalid: "
                                                       f"{problem}"), False
        report = RoomReport(head.room_id, CAUGHT_UP, latest_seq=head.latest_seq,
                            authority_gateway_id=head.authority_gateway_id, authority_epoch=head.authority_epoch,
                            last_seq=replica.last_seq if replica is not None else 0)
        if local is not None:
            return self._local_room(head, local, report, budget)
        waiting = self.backoff.waiting(head.room_id, self._monotonic())
        if waiting is not None:
            report.status, report.reason = BACKING_OFF, f"{waiting[1]} (retrying in {waiting[0]:.0f} s)"
            return report, False
        if replica is None and head.disbanded:
            report.status, report.reason = SKIPPED, "disbanded on the source before it was replicated here"
            return report, False
        try:
            if replica is not None:
                self._check_lineage(head, replica)
                if (replica.last_seq >= head.latest_seq and _same_lineage(head, replica)
                        and replica.caught_up):
                    report.status = DISBANDED if head.disbanded else CAUGHT_UP
                    self.backoff.clear(head.room_id)
                    return report, False
            self._catch_up(head, replica, report, budget)
        except _PASS_ERRORS:
            raise
        except _Bounded as exc:
            report.status, report.reason = BEHIND, f"the pass stopped: {exc}"
            return report, True
        except RoomNotFoundError as exc:  # purged (or expired) between the listing and the read
            report.status, report.reason = GONE, str(exc)
        except (HostedRoomError, Refused) as exc:
            self._infos.pop(head.room_id, None)
            delay = self.backoff.refuse(head.room_id, str(exc), self._monotonic())
            report.status, report.reason = REFUSED, f"{exc} (retrying in {delay:.0f} s)"
        else:
            self.backoff.clear(head.room_id)
        return report, False

    @staticmethod
    def _check_lineage(head: RoomHead, replica: ReplicaHead) -> None:
        """Refuse, without reading a page, a source that is behind what this replica already holds."""
        if head.authority_epoch < replica.authority_epoch:
            raise Refused(f"the source holds epoch {head.authority_epoch}, older than this replica's epoch "
                           f"{replica.authority_epoch}")
        if (head.authority_epoch == replica.authority_epoch
                and head.authority_gateway_id != replica.authority_gateway_id):
            raise Refused(f"the source's owner at epoch {head.authority_epoch} differs from this replica's")
        # Only stored events count: a latest_seq no stored event supports is the page's claim, which the next page
        # read confirms or corrects (see _catch_up).
        if _same_lineage(head, replica) and head.latest_seq < replica.last_seq:
            raise Refused(f"the source's log ends at seq {head.latest_seq}, before the seq "
                           f"{replica.last_seq} this replica stored")

    def _catch_up(self, head: RoomHead, replica: ReplicaHead | None, report: RoomReport, budget: _Budget) -> None:
        room_id = head.room_id
        since = replica.last_seq if replica is not None else 0
        # The replica's stored latest_seq, as this pass knows it (None: no replica yet).
        stored_latest = replica.latest_seq if replica is not None else None
        # A replica of an empty room is stored too (so it can be promoted); and a lineage change with no new
        # event still updates the replica's authority.
        store_empty = replica is None or not _same_lineage(head, replica)
        fork_check = replica is not None and since > 0 and not _same_lineage(head, replica)
        # The source store's lineage this replica was fed under; unknown (a room not read yet by this
        # replicator): its first page is checked against the replica's last event.
        known = self._lineages.get(room_id, _UNKNOWN)
        lineage_check = replica is not None and since > 0 and known is _UNKNOWN
        disbanded = head.disbanded
        # The lineage this replica records (None: no replica yet).
        lineage = None if replica is None else (replica.authority_gateway_id, replica.authority_epoch)
        while self.max_pages_per_room is None or report.pages < self.max_pages_per_room:
            # The lineage check's early event comes on top of the page (the fork check's, as it always did, not).
            early = fork_check or lineage_check
            page = self._read_page(room_id, since - 1 if early else since, budget,
                                   extra=1 if lineage_check and not fork_check else 0)
            if not early and replica is not None and since > 0 and page.lineage != known:
                lineage_check = True  # the source's store changed lineage: read again, one event early
                page = self._read_page(room_id, since - 1, budget, extra=1)
            if fork_check or lineage_check:
                assert replica is not None
                try:
                    _check_fork(page, since, replica)
                except Refused as exc:
                    raise _lineage_refusal(exc, known, page) if lineage_check else exc from None
                fork_check = False
            fence = _fence_at(page)
            if fence is not None:  # the room's log goes on in another store: stop this room at the fence
                self._stop_at_fence(room_id, page, fence, lineage, report)
                return
            claim = page.latest_seq if page.latest_seq is not None else 0
            # A stored claim no stored event supports, which this page (read after it was stored) contradicts.
            unsupported = stored_latest is not None and stored_latest > since and claim < stored_latest
            if page.last_seq is None or page.last_seq <= since:
                # Only a full page (the fork check's, of one event) may hold nothing new while the log goes on.
                if claim > since and len(page.events) < self.page_limit:
                    raise Refused(f"the source reports seq {claim} but its page holds nothing after seq "
                                   f"{since}")
                if not store_empty and not unsupported:
                    break
            info = self._room_info(room_id, page)
            try:
                result = ingest_page(self.target, room_id=room_id, room_name=info.name, members=info.members,
                                     page=page, now=self._now(), limits=self.limits,
                                     supersede_latest_seq=stored_latest if unsupported else None)
            except ReplicaError as exc:  # the overlapping event differs from the replica's
                raise _lineage_refusal(exc, known, page) if lineage_check else exc from None
            lineage_check, known = False, page.lineage
            lineage = (str(result["authority"]["gateway_id"]), int(result["authority"]["epoch"]))
            self._lineages[room_id] = page.lineage
            stored, ingested = int(result["stored_seq"]), int(result["ingested"])
            page_claim = claim if page.latest_seq is not None else stored
            if unsupported:
                assert stored_latest is not None
                report.reason = (f"the source's log ends at seq {max(stored, page_claim)}, before the seq "
                                 f"{stored_latest} it reported earlier: that claim was lowered")
                stored_latest = max(stored, page_claim)
            else:
                stored_latest = max(stored_latest or 0, stored, page_claim)
            report.pages += 1
            report.events += ingested
            report.authority_gateway_id = str(result["authority"]["gateway_id"])
            report.authority_epoch = int(result["authority"]["epoch"])
            report.latest_seq = stored_latest
            disbanded = disbanded or any(event.event.kind == "room.disbanded" for event in page.events)
            self._page_done(PageIngested(room_id, since + 1 if ingested else 0, stored, ingested, stored_latest,
                                         self._monotonic()))
            report.last_seq = since = stored
            store_empty = False
            if result["caught_up"] or not ingested:
                break
            budget.check()
        if stored_latest is not None:
            report.latest_seq = stored_latest  # the pages' claim, newer than the listing's
        if stored_latest is not None and since >= stored_latest:
            report.status = DISBANDED if disbanded else CAUGHT_UP
        else:
            report.status = BEHIND

    def _stop_at_fence(self, room_id: str, page: CheckedPage, fence: CheckedEvent, lineage: tuple[str, int] | None,
                       report: RoomReport) -> None:
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
        info = self._room_info(room_id, page)
        before = [event for event in page.events if event.seq < fence.seq]
        if before:
            ingest_page(self.target, room_id=room_id, room_name=info.name, members=info.members,
                        page=replace(page, gateway_id=lineage[0], epoch=lineage[1], events=before,
                                     latest_seq=fence.seq - 1, cursor=fence.seq - 1, has_more=False),
                        now=self._now(), limits=self.limits)
            report.events += len(before)
        supersede_replica(self.target, room_id=room_id, room_name=info.name, members=info.members,
                          authority_gateway_id=page.gateway_id, authority_epoch=page.epoch, latest_seq=fence.seq,
                          now=self._now(), limits=self.limits)
        report.authority_gateway_id, report.authority_epoch, report.latest_seq = page.gateway_id, page.epoch, fence.seq

    # -- the local authoritative store -------------------------------------------------------------------------

    def _local_room(self, head: RoomHead, local: RoomHead, report: RoomReport,
                    budget: _Budget) -> tuple[RoomReport, bool]:
        report.status, report.last_seq = LOCAL, 0
        held = f"the local store holds this room for {local.authority_gateway_id} at epoch {local.authority_epoch}"
        newer = head.authority_epoch > local.authority_epoch and not local.disbanded
        if not newer:
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
        waiting = self.backoff.waiting(head.room_id, self._monotonic())
        if waiting is not None:  # a refused demotion is not retried on every pass either
            report.status, report.reason = BACKING_OFF, f"{waiting[1]} (retrying in {waiting[0]:.0f} s)"
            return report, False
        try:
            new_gateway, new_epoch, proven = self._proofs.prove(
                head.room_id, local, local_gateway, lambda since: self._read_page(head.room_id, since, budget),
                self._local_log)
            step("replicator.proved", room_id=head.room_id, gateway=local_gateway)
            demote_room(self.target, room_id=head.room_id, observed_gateway_id=new_gateway,
                        observed_epoch=new_epoch, now=self._now(), local_gateway_id=local_gateway,
                        limits=self.limits, proven_head=proven)
        except _PASS_ERRORS:
            raise
        except _Bounded as exc:
            report.reason = (f"{held}; the proof of the source's newer epoch was cut short (it resumes on the next "
                             f"pass): {exc}")
            return report, True
        except DemotionStaleError as exc:  # written to after the proof: nothing changed, and the next pass proves
            report.reason = f"{held}; not demoted: {exc}"
            return report, False
        except (HostedRoomError, Refused) as exc:
            delay = self.backoff.refuse(head.room_id, str(exc), self._monotonic())
            report.status, report.reason = REFUSED, f"demotion refused: {exc} (retrying in {delay:.0f} s)"
            return report, False
        self.backoff.clear(head.room_id)
        report.status = DEMOTED
        report.authority_gateway_id, report.authority_epoch = new_gateway, new_epoch
        report.reason = (f"the source holds epoch {new_epoch} for {new_gateway}; this gateway's epoch "
                         f"{local.authority_epoch} is fenced")
        return report, False

    def _local_log(self) -> LocalLog:
        return LocalLog(self.target, self.page_limit, self.limits)

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
        """Run passes until ``stop`` is set: again at once while a pass made progress and left rooms behind (or
        stopped at a bound); otherwise when ``waker`` reports a change or after ``interval`` seconds. A pass that
        stops early (the source or the store unreachable, a listing refused) is retried after ``interval``,
        doubling up to ``max_error_delay``. Nothing a source returns ends it: a pass reports it."""
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
            if report.events and (report.count(BEHIND) or report.bound):
                continue
            waker.wait(interval, stop)


#: Room infos kept beyond one pass's rooms (a cache; cleared when a listing outgrows it).
LISTING_CACHE = 1024


def _same_lineage(head: RoomHead, replica: ReplicaHead) -> bool:
    return (head.authority_gateway_id, head.authority_epoch) == (replica.authority_gateway_id,
                                                                 replica.authority_epoch)


def _int_within(value: Any, low: int, high: int) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and low <= value <= high


def _head_problem(head: RoomHead, lim: Limits) -> str:
    """Why a listing head cannot be used ("" when every field is valid); the caller checked ``room_id`` is a str."""
    try:
        if room_rules.validate_room_id(head.room_id, lim) != head.room_id:
            return "room_id: invalid room_id"
    except HostedRoomError as exc:
        return f"room_id: {exc}"
    try:
        if identifier(head.authority_gateway_id, error=HostedRoomError, label="authority_gateway_id",
                      max_chars=lim.MAX_ACTOR_ID_CHARS) != head.authority_gateway_id:
            return "authority_gateway_id: invalid authority_gateway_id"
    except HostedRoomError as exc:
        return str(exc)
    if not _int_within(head.authority_epoch, 1, MAX_EPOCH):
        return "authority_epoch must be an integer from 1 to the largest epoch"
    if not _int_within(head.latest_seq, 0, INT64_MAX):
        return "latest_seq must be an integer from 0 to 2**63-1"
    if not isinstance(head.disbanded, bool):
        return "disbanded must be a boolean"
    return ""


#: Event kinds after which a room's name or members may differ (a rename; a claim adopting a legacy room).
_INFO_KINDS = frozenset({"room.renamed", "authority.claimed"})


def _changes_info(page: CheckedPage) -> bool:
    return any(event.event.kind in _INFO_KINDS for event in page.events)



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


def _lineage_refusal(exc: Exception, known: Any, page: CheckedPage) -> Refused:
    """The refusal of a room whose replica's last event the source no longer holds as it was (checked after the
    source's store lineage changed, or on the first read of the room by this replicator)."""
    previous = "unknown" if known is _UNKNOWN else str(known)
    return Refused(f"the source's store lineage is {page.lineage} (was {previous}) and it no longer holds this "
                    f"replica's last event as stored ({exc}): the source lost events this replica has (a standby "
                    "that lacked them was promoted?); refusing to ingest a diverged log")


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


# --- logs (hostedrooms.logs: an event name and structured fields; never a page's events) ---------------------------

_ROOM_EVENTS = {
    REFUSED: ("replicate.room_refused", logging.WARNING), DEMOTED: ("replicate.room_demoted", logging.WARNING),
    GONE: ("replicate.room_gone", logging.INFO), DISBANDED: ("replicate.room_disbanded", logging.DEBUG)}


def _log_room(room: RoomReport) -> None:
    """A room whose pass changed its standing (refused, demoted here, gone from the source, disbanded) or that
    ingested events (debug)."""
    event, level = _ROOM_EVENTS.get(room.status, ("replicate.room", logging.DEBUG) if room.events else ("", 0))
    if event and _log.isEnabledFor(level):
        _log.log(level, "room %s %s: %s", room.room_id, room.status, room.reason, extra={
            "event": event, "room": room.room_id, "gateway": room.authority_gateway_id or None,
            "epoch": room.authority_epoch or None, "last_seq": room.last_seq, "latest_seq": room.latest_seq,
            "events": room.events, "reason": room.reason or None})


def _log_pass(report: PassReport) -> None:
    """One pass: a warning when it stopped early, info when it moved events or left rooms behind, else debug."""
    level = (logging.WARNING if report.error else logging.INFO
             if report.events or report.bound or not report.ok else logging.DEBUG)
    if _log.isEnabledFor(level):
        _log.log(level, "replicate pass: %s", report.summary(), extra={
            "event": "replicate.pass", "rooms": len(report.rooms), "events": report.events, "pages": report.pages,
            "lag": report.lag, "behind": report.count(BEHIND), "refused": report.count(REFUSED),
            "demoted": report.count(DEMOTED), "seconds": round(report.seconds, 3), "error": report.error or None,
            "bound": report.bound or None, "pruned": len(report.pruned)})

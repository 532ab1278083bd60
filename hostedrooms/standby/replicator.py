"""Keep a local store's replicas of every room of a source caught up (:class:`Replicator`).

One pass (:meth:`Replicator.sync_once`) walks the source's rooms in ``room_id`` order, within the pass's bounds
(:mod:`.bounds`), and handles each (:mod:`.catchup`: the catch-up and its checks; :mod:`.demote`: a room the local
authoritative store holds), every value a source returns validated first (:mod:`.reader`); it reports per room
(:mod:`.reports`). :meth:`Replicator.run` repeats passes: immediately while a pass made progress and left rooms
behind, else when its :class:`~hostedrooms.standby.wake.Waker` says the source changed, or at the latest after
``interval``.
"""

from __future__ import annotations

import random as _random
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

from ..engines import EngineSource, resolve_engine
from ..errors import HostedRoomError
from ..limits import Limits
from ..replicas import prune_disbanded_replicas
from ..retry import JitteredBackoff
from ..telemetry import traced
from .bounds import DEFAULT_MAX_SECONDS_PER_PASS, PASS_ERRORS, Backoff, BoundReached, PassBounds, ReplicatorOptions
from .catchup import RoomPass
from .demote import Demoter, resolve_gateway
from .heads import ReplicaHead, RoomHead, all_replica_heads, all_room_heads
from .lag import pass_attributes, record_pass
from .proof import Proofs
from .reader import EXTRA_CACHED_INFOS, SourceReader
from .reclaim import DEFAULT_RECLAIM_AFTER, RECLAIMED, reclaims_for
from .reports import (
    BACKING_OFF,
    BEHIND,
    CAUGHT_UP,
    DEMOTED,
    DISBANDED,
    GONE,
    LOCAL,
    REFUSED,
    SKIPPED,
    PageIngested,
    PassReport,
    RoomReport,
    log_pass,
    log_room,
)
from .source import EnginePageSource, PageSource, RoomInfo, iter_rooms
from .wake import IntervalWaker, Waker

# The statuses and reports (defined in .reports) stay importable from here, where they were always documented.
__all__ = ["BACKING_OFF", "BEHIND", "CAUGHT_UP", "DEMOTED", "DISBANDED", "GONE", "LOCAL", "REFUSED", "SKIPPED",
           "Backoff", "PageIngested", "PassReport", "Replicator", "RoomReport"]

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
    ``max_seconds_per_pass`` (default :data:`~hostedrooms.standby.bounds.DEFAULT_MAX_SECONDS_PER_PASS`). The
    limits are ``limits``' (the module's by default), read at each pass. The options are validated
    (:class:`~hostedrooms.standby.bounds.ReplicatorOptions`, kept as ``options``).

    ``source_gateway_id``: the gateway whose own store the source is (the operator's word; None: not said). With
    it, each pass also gives back the local rooms that gateway's failover fenced here and never promoted, once
    the fence is ``reclaim_after`` seconds old (:mod:`hostedrooms.standby.reclaim`; needs ``local_gateway_id``).

    :param source: the authority's page source.
    :param target: this gateway's store: an :class:`~sqlalchemy.Engine`, or a zero-argument factory returning one.
    :param local_gateway_id: this gateway's id, or None.
    :param page_limit: events per page.
    :param max_pages_per_room: pages one pass reads from one room, or None.
    :param backoff: the back-off of refused rooms (default: a new :class:`Backoff`).
    :param now: returns the time in Unix seconds.
    :param monotonic: returns monotonic seconds.
    :param on_page: called after each stored page, or None.
    :param on_room: called with each room's report, or None.
    :param workers: rooms handled at once (1 to 64).
    :param limits: the limits in force (default: :mod:`hostedrooms.limits`).
    :param prune_disbanded_after: seconds a disbanded room's replica is kept, or None to keep it.
    :param max_rooms_per_pass: rooms one pass lists, or None.
    :param max_pages_per_pass: pages one pass reads, or None.
    :param max_bytes_per_pass: event bytes one pass reads, or None.
    :param max_seconds_per_pass: seconds one pass may take, or None.
    :param source_gateway_id: the gateway whose own store the source is, or None.
    :param reclaim_after: seconds a fence must be old before its room is given back.
    :raises HostedRoomError: an option is invalid.
    """

    def __init__(self, source: PageSource, target: EngineSource, *, local_gateway_id: Any = None,
                 page_limit: int = 500, max_pages_per_room: int | None = None, backoff: Backoff | None = None,
                 now: Callable[[], float] = time.time, monotonic: Callable[[], float] = time.monotonic,
                 on_page: Callable[[PageIngested], None] | None = None,
                 on_room: Callable[[RoomReport], None] | None = None, workers: int = 1, limits: Limits | None = None,
                 prune_disbanded_after: int | None = None, max_rooms_per_pass: int | None = None,
                 max_pages_per_pass: int | None = None, max_bytes_per_pass: int | None = None,
                 max_seconds_per_pass: float | None = DEFAULT_MAX_SECONDS_PER_PASS, source_gateway_id: Any = None,
                 reclaim_after: float = DEFAULT_RECLAIM_AFTER) -> None:
        self.options = ReplicatorOptions(
            page_limit=page_limit, max_pages_per_room=max_pages_per_room, workers=workers,
            prune_disbanded_after=prune_disbanded_after, max_rooms_per_pass=max_rooms_per_pass,
            max_pages_per_pass=max_pages_per_pass, max_bytes_per_pass=max_bytes_per_pass,
            max_seconds_per_pass=max_seconds_per_pass)
        self.source = source
        self.target = resolve_engine(target)
        self._local_gateway_arg = local_gateway_id
        self.backoff = backoff or Backoff()
        self._now, self._monotonic = now, monotonic
        self._on_page, self._on_room = on_page, on_room
        self._page_lock = threading.Lock()
        self.limits = limits
        # Names and members change only with a rename or a claim: read again when a page holds one.
        self._infos: dict[str, RoomInfo] = {}
        # Where the next pass starts its listing (after a pass that stopped at a bound), else None.
        self._resume_after: str | None = None
        # Per room: the source store's lineage its replica was last fed under (see RoomPass.lineages).
        self._lineages: dict[str, str | None] = {}
        # Demotion proofs cut short by a pass bound, by room (each resumes there).
        self._proofs = Proofs()
        self._reclaims = reclaims_for(source_gateway_id, reclaim_after, lambda: resolve_gateway(local_gateway_id),
                                      limits)

    @property
    def monotonic(self) -> Callable[[], float]:
        """The clock that times this replicator's back-off and passes (its lag seconds too)."""
        return self._monotonic

    # -- one pass ----------------------------------------------------------------------------------------------

    def _room_pass(self, bounds: PassBounds) -> RoomPass:
        """What the rooms of a pass starting now share (the limits as they are now)."""
        reader = SourceReader(self.source, self.options.page_limit, self.limits, bounds, self._infos)
        demoter = Demoter(self.target, self._local_gateway_arg, self._proofs, self.backoff, self._now,
                          self._monotonic)
        return RoomPass(reader, self.target, self.options.max_pages_per_room, self.backoff, self._lineages, demoter,
                        self._now, self._monotonic, self._page_stored)

    @traced("standby.pass", engine=lambda args: args[0].target, result=pass_attributes, on_result=record_pass)
    def sync_once(self) -> PassReport:
        """One pass over the rooms of the source; returns a report per room (see :mod:`.catchup`).

        A pass that cannot list the source or read the local store stops early with ``error`` set; one that
        reaches a bound stops with ``bound`` set (and the next pass resumes the listing); rooms it reached keep
        their reports. Room-level refusals never stop a pass, and nothing a source returns makes it raise.

        :returns: the pass's report.
        """
        started = self._monotonic()
        report = PassReport()
        bounds = PassBounds.start(self.options, self.limits, self._monotonic)
        start_after = self._resume_after
        seen: set[str] = set()  # at most one pass's listing (max_rooms_per_pass)
        resume: list[str | None] = []  # the room after which the next pass resumes, once a bound cut a room short
        try:
            local_rooms = all_room_heads(self.target)
            local_replicas = all_replica_heads(self.target)
            rooms = self._room_pass(bounds)
            heads = self._listing(start_after, bounds, seen)
            if self.options.workers == 1:
                for head in heads:
                    self._report_room(report, resume, rooms.sync_room(
                        head, local_rooms.get(head.room_id), local_replicas.get(head.room_id)))
            else:
                self._in_parallel(rooms, heads, local_rooms, local_replicas, report, resume)
        except PASS_ERRORS as exc:
            report.error = str(exc)
        except BoundReached as exc:
            report.bound = str(exc)
        except HostedRoomError as exc:  # the listing itself was refused (a hostile or broken source)
            report.error = f"the source's room listing was refused: {exc}"
        else:
            report.bound = bounds.reached
            if not report.bound and start_after is None:  # a whole listing: forget rooms the source dropped
                self._keep_only(seen)
            self._prune(report)
            self._reclaim(report, local_rooms)
        if report.bound:
            last = report.rooms[-1].room_id if report.rooms else start_after
            self._resume_after = resume[0] if resume else last
        elif not report.error:
            self._resume_after = None
        if len(self._infos) > 2 * len(seen) + EXTRA_CACHED_INFOS:  # a cache: never more than a pass or two of rooms
            self._infos.clear()
        report.seconds = self._monotonic() - started
        log_pass(report)
        return report

    def _keep_only(self, seen: set[str]) -> None:
        """Forget what is remembered of rooms a whole listing no longer holds."""
        self.backoff.keep_only(seen)
        for room_id in [room for room in self._infos if room not in seen]:
            del self._infos[room_id]
        for room_id in [room for room in self._lineages if room not in seen]:
            del self._lineages[room_id]
        self._proofs.keep_only(seen)

    def _listing(self, after: str | None, bounds: PassBounds, seen: set[str]) -> Iterator[RoomHead]:
        """The source's rooms after ``after``, each charged to the pass's room bound."""
        for head in iter_rooms(self.source, after=after):
            bounds.charge_room()
            seen.add(head.room_id)
            yield head

    def _prune(self, report: PassReport) -> None:
        """Remove the disbanded replicas past ``prune_disbanded_after`` (only while the pass reported some)."""
        retain = self.options.prune_disbanded_after
        if retain is None or not report.count(DISBANDED):
            return
        try:
            report.pruned = prune_disbanded_replicas(self.target, retain_seconds=retain, now=self._now(),
                                                     limits=self.limits)
        except PASS_ERRORS as exc:
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
        except PASS_ERRORS as exc:
            report.error = f"giving back fenced rooms: {exc}"
            return
        for outcome in done:
            holder = self._reclaims.local if outcome.status == RECLAIMED else self._reclaims.holder
            self._report_room(report, [], (RoomReport(outcome.room_id, outcome.status, authority_gateway_id=holder,
                                                      authority_epoch=outcome.epoch, reason=outcome.reason), False))

    def _report_room(self, report: PassReport, resume: list[str | None],
                     outcome: tuple[RoomReport | None, bool]) -> None:
        """Report a room (in listing order); the first room a bound cut short is where the next pass resumes."""
        reported, bounded = outcome
        if bounded and not resume:
            resume.append(report.rooms[-1].room_id if report.rooms else self._resume_after)
        if reported is not None:
            log_room(reported)
            report.rooms.append(reported)
            if self._on_room is not None:
                self._on_room(reported)

    def _in_parallel(self, rooms: RoomPass, heads: Iterator[RoomHead], local_rooms: dict[str, RoomHead],
                     local_replicas: dict[str, ReplicaHead], report: PassReport, resume: list[str | None]) -> None:
        """Rooms on ``workers`` threads, reported in listing order; at most two rooms per worker are queued, so
        the listing is walked as the work goes, and a pass error stops what has not started."""
        pending: deque[Future[tuple[RoomReport | None, bool]]] = deque()
        bounded: BoundReached | None = None
        with ThreadPoolExecutor(self.options.workers, thread_name_prefix="hostedrooms-replicator") as pool:
            try:
                try:
                    for head in heads:
                        pending.append(pool.submit(rooms.sync_room, head, local_rooms.get(head.room_id),
                                                   local_replicas.get(head.room_id)))
                        while len(pending) >= 2 * self.options.workers:
                            self._report_room(report, resume, pending.popleft().result())
                except BoundReached as exc:  # the listing reached a bound: the rooms already started are reported
                    bounded = exc
                while pending:
                    self._report_room(report, resume, pending.popleft().result())
            finally:
                for future in pending:
                    future.cancel()
        if bounded is not None:
            raise bounded

    def _page_stored(self, page: PageIngested) -> None:
        if self._on_page is not None:
            with self._page_lock:
                self._on_page(page)

    # -- following ---------------------------------------------------------------------------------------------

    def run(self, *, interval: float = 1.0, waker: Waker | None = None, stop: threading.Event | None = None,
            on_pass: Callable[[PassReport], None] | None = None, max_error_delay: float = 60.0,
            random: Callable[[], float] | None = None) -> None:
        """Run passes until ``stop`` is set: again at once while a pass made progress and left rooms behind (or
        stopped at a bound); otherwise when ``waker`` reports a change or after ``interval`` seconds. A pass that
        stops early (the source or the store unreachable, a listing refused) is retried after a wait below
        ``interval``, doubling up to ``max_error_delay``, jittered (:class:`hostedrooms.retry.JitteredBackoff`,
        equal jitter: between half and all of it, drawn with ``random``) so that standbys that failed together do
        not come back together. Nothing a source returns ends it: a pass reports it. A negative or non-finite
        ``max_error_delay`` (or a negative ``interval``) raises :class:`hostedrooms.retry.RetryArgumentError`
        before the first pass.

        :param interval: seconds between passes when nothing wakes it.
        :param waker: says when the source may have changed (default: an :class:`IntervalWaker`).
        :param stop: set it to end the loop (default: a new event, never set).
        :param on_pass: called with each pass's report, or None.
        :param max_error_delay: the longest wait after failed passes, in seconds.
        :param random: returns a float in ``[0, 1)`` for the jitter (default: :func:`random.random`).
        :raises hostedrooms.retry.RetryArgumentError: ``interval`` or ``max_error_delay`` is invalid (before the
            first pass).
        """
        stop = stop if stop is not None else threading.Event()
        waker = waker if waker is not None else IntervalWaker()
        backoff = JitteredBackoff(base=min(interval, max_error_delay), cap=max_error_delay, jitter="equal",
                                  random=random if random is not None else _random.random)
        errors = 0
        while not stop.is_set():
            waker.arm()
            report = self.sync_once()
            if on_pass is not None:
                on_pass(report)
            if report.error:
                errors += 1
                stop.wait(backoff.delay(errors))
                continue
            errors = 0
            if report.events and (report.count(BEHIND) or report.bound):
                continue
            waker.wait(interval, stop)

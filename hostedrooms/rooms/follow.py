"""Following a room's log live: :func:`follow` yields each event once, in seq order, as it commits.

Why a follower never skips or repeats a seq: it reads with :func:`~hostedrooms.rooms.read_events` from the last
seq it yielded, and a page holds exactly the events ``since < seq <= latest_seq`` where ``latest_seq`` comes from
the room row read first. Every write that adds events to a room advances that row in the same transaction, under
the room row's lock (SQLite: the database write lock), so a room's events commit in seq order: a writer that
allocated seq ``n + 1`` waited for the one holding ``n`` to commit or roll back. A row that shows ``latest_seq``
therefore means every seq up to it is committed and readable; nothing below it can commit later.

It waits between pages with a :class:`~hostedrooms.wakeup.Wakeup` entered before the first read (so a commit
between a read and the wait still wakes it): ``NOTIFY`` on PostgreSQL with a re-read every
``fallback_interval`` seconds anyway, ``PRAGMA data_version`` polled every ``poll_interval`` seconds on SQLite.
A lost waiting connection is opened again (with back-off) and every follower then re-reads from its cursor, since
notifications sent meanwhile are lost: still no seq skipped or repeated. A follower raises StoreUnavailableError
only once no connection has served for ``reconnect_deadline`` seconds.
Across a failover: the cursor remembers the store's lineage (each page's ``lineage``) and the last event it
handed out. When a page shows another lineage (a standby was promoted), it reads that event again in the store as
it is now: the same seq, event id and content, and it goes on; gone or different (an asynchronous standby that
lacked it was promoted), and it raises :class:`~hostedrooms.errors.StoreLineageError` instead of yielding other
events at the same seqs. A follower started again after an error resumes safely the same way: pass the last
event it handled as ``last_event`` (and the lineage it read it under, if known, as ``lineage``).

It ends after yielding ``room.disbanded`` (nothing follows it), and raises what ``read_events`` raises:
RoomHistoryExpiredError when the room was purged under it, RoomNotFoundError for an unknown room, InvalidInputError
for a ``since_seq`` ahead of the log. The room is checked when ``follow()`` is called, before it returns the
iterator (RoomNotFoundError, RoomHistoryExpiredError, InvalidInputError), so a web service can answer 404 or 400
instead of a stream; the asyncio ``follow()`` cannot await there: ``await open_follow(...)`` does the same check
(:mod:`hostedrooms.aio.follow`).

What a follower costs: one page of events at a time, and a pooled connection only while it reads a page. While
it waits it holds none: every follower (and ledger worker) of an engine shares the engine's one waiting
connection (:class:`~hostedrooms.wakeup.SharedWaiter`, outside the services' pool), so followers never take the
connections the services need, however many there are. Close it (``with contextlib.closing(follow(...))``, or
let the generator go) to unregister it; the last one leaving closes the waiting connection.
"""

from __future__ import annotations

from collections.abc import Generator, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ..engines import EngineSource, resolve_engine
from ..errors import HostedRoomError, InvalidInputError
from ..limits import Limits, in_force
from ..lineage import check_lineage, lost_event, same_event
from ..records import EventPage, EventRecord
from ..telemetry import follow_woke, traced
from ..validation import interval
from ..wakeup import FALLBACK_INTERVAL, RECONNECT_DEADLINE, ROOM_EVENTS_CHANNEL, Wakeup, check_waitable
from .events import read_events
from .lifecycle import room_state
from .rules import _bounded_limit, _non_negative, _room_id

__all__ = ["FollowCursor", "follow"]

#: The event that ends a room's log.
DISBANDED = "room.disbanded"


@dataclass
class FollowCursor:
    """The state of one follower, shared by the synchronous and the asyncio :func:`follow`: where it is, and
    whether the log has ended. Validates the arguments as ``read_events`` does, before anything is opened."""

    room_id: str
    since: int
    limit: int
    done: bool = False
    more: bool = False  # the last page said more events are already committed: read again without waiting
    lineage: str | None = None  # the store's lineage as the last page showed it (None: not known yet)
    last: Mapping[str, Any] | None = None  # the last event handed out (None: none known), checked on a change

    @classmethod
    def start(cls, room_id: Any, since_seq: Any, limit: Any, limits: Limits | None, *, last_event: Any = None,
              lineage: Any = None) -> FollowCursor:
        lim = in_force(limits)
        cursor = cls(_room_id(room_id, lim), _non_negative(since_seq, "since_seq"),
                     _bounded_limit(limit, lim.MAX_LOG_LIMIT))
        if lineage is not None:
            try:
                cursor.lineage = check_lineage(lineage)
            except HostedRoomError as exc:
                raise InvalidInputError(str(exc), field="lineage") from None
        if last_event is not None:
            if not isinstance(last_event, Mapping) or last_event.get("seq") != cursor.since or not cursor.since:
                raise InvalidInputError("last_event must be the event read at since_seq (an event dict)",
                                        field="last_event")
            cursor.last = dict(last_event)
        return cursor

    def check_room(self, state: Mapping[str, Any]) -> None:
        """Refuse a ``since_seq`` ahead of the room's log (``state``: ``room_state`` with ``include_disbanded``,
        whose read already refused an unknown or purged room), as ``read_events`` would on the first read; with
        a ``last_event``, that event is gone: StoreLineageError."""
        if self.since > int(state["latest_seq"]):
            if self.last is not None:
                raise lost_event(self.room_id, self.last, None, previous=self.lineage, current=None)
            raise InvalidInputError("since_seq is ahead of the hosted room log", field="since_seq")

    def lineage_changed(self, page: EventPage) -> bool:
        """Whether ``page`` shows a lineage other than the cursor's while it holds an event to check (without
        one, the page's lineage is simply adopted)."""
        current = page.get("lineage")
        if current == self.lineage:
            return False
        if self.last is None or not self.since:
            self.lineage = current
            return False
        return True

    def check_arguments(self, limits: Limits | None) -> dict[str, Any]:
        """The keyword arguments of the ``read_events`` call that reads the last event handed out again."""
        return {"room_id": self.room_id, "since_seq": self.since - 1, "limit": 1, "include_disbanded": True,
                "limits": limits}

    def confirm(self, page: EventPage, check: EventPage) -> None:
        """After a lineage change: ``check`` (read with :meth:`check_arguments`) must hold the last event handed
        out, the same event; then the cursor takes ``page``'s lineage. Otherwise StoreLineageError."""
        assert self.last is not None
        found = check["events"][0] if check["events"] else None
        if found is None or not same_event(found, self.last):
            raise lost_event(self.room_id, self.last, found, previous=self.lineage, current=page.get("lineage"))
        self.lineage = page.get("lineage")

    def lost(self, exc: InvalidInputError) -> Exception:
        """A read from the cursor found the log ending before it: with an event handed out, that event is gone
        (StoreLineageError); else ``exc`` as it is."""
        if self.last is None or exc.field != "since_seq":
            return exc
        return lost_event(self.room_id, self.last, None, previous=self.lineage, current=None)

    def read_arguments(self, limits: Limits | None) -> dict[str, Any]:
        """The keyword arguments of the next ``read_events`` call."""
        return {"room_id": self.room_id, "since_seq": self.since, "limit": self.limit, "include_disbanded": True,
                "limits": limits}

    def ended_before(self, state: Mapping[str, Any]) -> bool:
        """Whether a room (``room_state`` with ``include_disbanded``) was disbanded at or before the cursor: a
        follower resuming after ``room.disbanded`` has nothing left to wait for."""
        if state.get("disbanded_at") is not None and int(state["latest_seq"]) <= self.since:
            self.done = True
        return self.done

    def take(self, page: EventPage) -> tuple[Sequence[EventRecord], bool]:
        """The events of ``page`` to yield, and whether more are already committed (read again at once)."""
        events = page["events"]
        for index, event in enumerate(events):
            if event["kind"] == DISBANDED:
                self.done = True
                return events[: index + 1], False
        return events, bool(page["has_more"])

    def advance(self, event: Mapping[str, Any]) -> None:
        """The event was yielded: the next read starts after it (and it is the one checked on a lineage
        change)."""
        self.since = int(event["seq"])
        self.last = event

    def deliver(self, page: EventPage) -> Iterator[EventRecord]:
        """The events of ``page`` to hand out, in order; each counts as handed out (the next read starts after
        it) once the follower asks for the next one, so a follower closed while holding an event resumes at it."""
        events, self.more = self.take(page)
        for event in events:
            yield event
            self.advance(event)

    @property
    def waiting(self) -> bool:
        """Whether the follower has caught up with what is committed and should wait for a commit."""
        return not self.done and not self.more


def check_intervals(poll_interval: Any, fallback_interval: Any) -> None:
    """Refuse a ``poll_interval`` (None or seconds) or ``fallback_interval`` (seconds) that is no interval, before
    anything is opened (a waiter would fail on it later, in its own thread)."""
    if poll_interval is not None:
        interval(poll_interval, "poll_interval")
    interval(fallback_interval, "fallback_interval")


@traced("follow")
def follow(
    engine: EngineSource, room_id: str, since_seq: int = 0, *, limit: int = 100, poll_interval: float | None = None,
    fallback_interval: float = FALLBACK_INTERVAL, limits: Limits | None = None,
    reconnect_deadline: float = RECONNECT_DEADLINE,
    last_event: Mapping[str, Any] | None = None, lineage: str | None = None,
) -> Generator[EventRecord, None, None]:
    """Yield each event of ``room_id`` after ``since_seq``, in seq order, as it commits (see the module
    docstring); the dicts are ``read_events``' events. Ends after ``room.disbanded``.

    The arguments and the room are checked here, before the iterator is returned: an unknown room raises
    RoomNotFoundError, a purged one RoomHistoryExpiredError, a ``since_seq`` ahead of the log InvalidInputError
    (one read; nothing stays open).

    ``last_event``: the event at ``since_seq`` this reader handled before (resuming a follower): it is checked
    against the store unless ``lineage`` (the lineage it was read under) is the store's still; gone or different,
    StoreLineageError. On a hot standby ``follow()`` raises StoreReadOnlyError (it cannot ``LISTEN``).

    ``reconnect_deadline`` (seconds, default :data:`~hostedrooms.wakeup.RECONNECT_DEADLINE`, 30): when the
    engine's waiting connection is lost (a restarted server, a terminated backend), the shared waiter opens a new
    one with back-off and the follower goes on from its cursor, skipping and repeating nothing; only when no new
    one serves for this long does its wait raise StoreUnavailableError.

    :param engine: the store: an :class:`~sqlalchemy.Engine`, or a zero-argument factory returning one.
    :param room_id: the room to follow (a disbanded room that is not pruned yet can be followed to its end).
    :param since_seq: yield the events after this sequence number (0: from the start).
    :param limit: at most this many events per page read (1 to MAX_LOG_LIMIT).
    :param poll_interval: SQLite: seconds between checks of ``PRAGMA data_version`` (None: the waiter's default).
    :param fallback_interval: PostgreSQL: seconds after which the log is read again even with no notification.
    :param limits: the limits in force (default: :mod:`hostedrooms.limits`).
    :param reconnect_deadline: seconds a lost waiting connection may stay lost before the wait fails.
    :param last_event: the event at ``since_seq`` this reader handled before, when it resumes.
    :param lineage: the store lineage ``last_event`` was read under, if known.
    :returns: a generator of the room's events (``read_events``' event dicts) in seq order; close it to stop.
    :raises InvalidInputError: an argument is invalid, or ``since_seq`` is ahead of the log (when called, or
        while following).
    :raises RoomNotFoundError: the room does not exist.
    :raises RoomHistoryExpiredError: the room was pruned, before the call or while it is followed.
    :raises StoreLineageError: after a failover (or on resuming) ``last_event`` is gone or different.
    :raises StoreReadOnlyError: the server is a hot standby.
    :raises StoreConfigurationError: the engine goes through a transaction pooler with no ``listen_url``.
    :raises StoreUnavailableError: no waiting connection served for ``reconnect_deadline`` seconds.
    :raises MisuseError: ``engine`` is not a SQLAlchemy Engine.
    """
    check_intervals(poll_interval, fallback_interval)
    cursor = FollowCursor.start(room_id, since_seq, limit, limits, last_event=last_event, lineage=lineage)
    source = resolve_engine(engine)
    check_waitable(source)  # behind a transaction pooler without listen_url: refused now, not at the first wait
    cursor.check_room(room_state(source, room_id=cursor.room_id, include_disbanded=True, limits=limits))
    return _follow(source, cursor, (poll_interval, fallback_interval, reconnect_deadline), limits)


def _follow(
    engine: Any, cursor: FollowCursor, waiting: tuple[float | None, float, float], limits: Limits | None
) -> Generator[EventRecord, None, None]:
    poll_interval, fallback_interval, reconnect_deadline = waiting
    with Wakeup(engine, ROOM_EVENTS_CHANNEL, key=cursor.room_id, poll_interval=poll_interval,
                reconnect_deadline=reconnect_deadline) as wakeup:
        if cursor.since and cursor.ended_before(
                room_state(engine, room_id=cursor.room_id, include_disbanded=True, limits=limits)):
            return
        woke = False
        while not cursor.done:
            page = _next_page(engine, cursor, limits)
            if woke:
                follow_woke(page)
            yield from cursor.deliver(page)
            woke = cursor.waiting
            if woke:
                wakeup.wait(fallback_interval)


def _next_page(engine: Any, cursor: FollowCursor, limits: Limits | None) -> EventPage:
    """The next page from the cursor; after a lineage change, once its last event was found unchanged."""
    try:
        page = read_events(engine, **cursor.read_arguments(limits))
    except InvalidInputError as exc:
        raise cursor.lost(exc) from None
    if cursor.lineage_changed(page):
        cursor.confirm(page, read_events(engine, **cursor.check_arguments(limits)))
    return page

"""Waiting for committed writes without busy polling: a room's log growing (:func:`hostedrooms.follow.follow`),
ledger work becoming due (:meth:`hostedrooms.ledger.DeliveryLedger.work_wakeup`).

PostgreSQL: every writing transaction that adds room events, or makes ledger work due, sends a ``NOTIFY`` on a
fixed channel (inside the transaction, so it is delivered when, and only if, the transaction commits). SQLite has
no notifications: ``PRAGMA data_version`` (no transaction, no I/O beyond the shared-memory index) changes whenever
another connection commits to the file.

One waiter per Engine serves every waiting follower and ledger worker of it (:class:`SharedWaiter`): a daemon thread
holding ONE connection of its own, opened from a private copy of the engine's pool (the same connect hooks), never
from the pool the services use, so any number of waiters costs one connection and no pool slot. On PostgreSQL it
``LISTEN``\\ s on the channels its waiters need and fans each notification out to the waiters of its channel and
payload; on SQLite it reads ``data_version`` every ``poll_interval`` seconds (the shortest any waiter asked for) and
wakes every waiter when it moves (SQLite cannot say what changed); it reads at once when a write unit commits on the
engine in this process (:func:`committed`) and, on Linux, when another process writes the database's ``-wal`` file
(:mod:`hostedrooms.filewatch`), so the period bounds only commits nothing announced. It starts with its first waiter
and, when the last one leaves, closes its connection and ends; in between it keeps that one connection (never one
per wait). Closing a SQLite connection never drops the locks the process's other connections hold on the file
(SQLite defers closing the descriptor; a test checks); the file is never opened here other than through the driver.
Where no second connection sees the same database (an in-memory SQLite database) there is no waiter: waits end at
their timeout.

A wake-up says only "look again": a waiter re-reads what it waits for (checking a pooled connection out for that
read only), and a timeout (the polling fallback on PostgreSQL) re-reads too. Enter the wake-up *before* reading:
from then on a commit wakes it, so a commit between the read and the wait is not missed. A wake-up that arrives
while its waiter is reading is kept for its next wait (a spurious re-read at worst). Leaving the ``with`` block
only unregisters; nothing of the services' pool is held at any time.

A waiting connection lost after it served (a terminated backend, a restarted server) is opened again: attempts
back off from :data:`RECONNECT_FIRST` doubling to :data:`RECONNECT_CAP` (jittered), and once the new connection
serves, every subscription is signalled, since notifications sent while nobody listened are lost (each re-reads).
A subscription raises from its wait only after ``reconnect_deadline`` seconds without a serving connection
(:data:`RECONNECT_DEADLINE`); a first connection that never served fails them all at once (a wrong URL, a hot
standby refusing ``LISTEN``). The waiter's driver calls hold :mod:`hostedrooms.forkgate`'s gate, never its waits on
the socket: a fork never finds this thread inside SQLite or the driver.

Behind a transaction pooler (``create_engine(..., pooler="transaction")``) a ``LISTEN`` would hold for one
transaction of some server connection and then be lost: the waiter connects to ``listen_url`` instead (a direct
connection), and without one every wait is refused with a StoreConfigurationError rather than silently polling.
"""

from __future__ import annotations

import contextlib
import os
import random
import selectors
import socket
import threading
import time
from collections.abc import Iterator
from types import TracebackType
from typing import Any, Self

from sqlalchemy import Engine
from sqlalchemy import create_engine as _sa_create_engine
from sqlalchemy import exc as sa_exc
from sqlalchemy.pool import NullPool, Pool, PoolProxiedConnection, SingletonThreadPool, StaticPool

from . import forkgate
from .backends import (
    LEDGER_WORK_CHANNEL,
    ROOM_EVENTS_CHANNEL,
    Backend,
    backend_for,
    check_listen_through,
    scoped_channel,
)
from .engine_profile import known_runtime, runtime_of
from .errors import translate
from .filewatch import FileWatch, watch_writes
from .retry import JitteredBackoff
from .validation import interval

__all__ = [
    "DEFAULT_POLL_INTERVAL", "LEDGER_WORK_CHANNEL", "RECONNECT_DEADLINE", "ROOM_EVENTS_CHANNEL", "SharedWaiter",
    "Subscription", "Wakeup", "check_waitable", "committed", "driver_error", "join_waiter",
]

#: How often a SQLite waiter looks for a commit (seconds); PostgreSQL waiters re-read this often without a
#: notification only as a fallback, at :data:`FALLBACK_INTERVAL`.
DEFAULT_POLL_INTERVAL = 0.05
FALLBACK_INTERVAL = 5.0
#: After another process wrote the commit file (Linux), a SQLite poller reads every SETTLE_PERIOD seconds for
#: SETTLE_SPAN seconds: the commit becomes visible only once the writer's sync has ended.
SETTLE_PERIOD = 0.002
SETTLE_SPAN = 0.1
#: How long a waiter waits through a lost waiting connection (seconds): the shared waiter reconnects meanwhile, and
#: a waiter still without one after this long raises StoreUnavailableError from its wait (each waiter's
#: ``reconnect_deadline``, counted from the loss, or from when it joined if later).
RECONNECT_DEADLINE = 30.0
#: The back-off between reconnection attempts: the first delay, doubling to at most the cap (each drawn at random
#: between half and all of it, :class:`hostedrooms.retry.JitteredBackoff`'s equal jitter, so the waiters of many
#: processes do not reconnect in step).
RECONNECT_FIRST = 0.05
RECONNECT_CAP = 2.0


def driver_error(engine: Engine, exc: BaseException) -> BaseException:
    """A raw driver error of ``engine`` (outside SQLAlchemy's execution layer) as hostedrooms' error."""
    dbapi = engine.dialect.loaded_dbapi
    if isinstance(exc, dbapi.Error):
        wrapped = sa_exc.DBAPIError.instance(None, None, exc, dbapi.Error, dialect=engine.dialect)
        return translate(wrapped, engine.url)
    return translate(exc, engine.url)


class Subscription:
    """One waiter's interest in a channel (``key``: only notifications with this payload; None: any), as the
    shared waiter sees it. The waiter's thread calls :meth:`signal` (a commit may concern it), :meth:`mark_ready`
    (from now on a commit signals it) and :meth:`fail`; subclasses deliver those to a thread or an event loop."""

    def __init__(self, channel: str, key: str | None, poll_interval: float | None,
                 reconnect_deadline: float | None = None) -> None:
        self.channel, self.key = channel, key
        self.poll_interval = DEFAULT_POLL_INTERVAL if poll_interval is None else poll_interval
        self.reconnect_deadline = RECONNECT_DEADLINE if reconnect_deadline is None else reconnect_deadline
        self.joined = time.monotonic()
        self.error: BaseException | None = None

    def gives_up_at(self, lost: float) -> float:
        """When this waiter stops waiting for a connection lost at ``lost`` (monotonic seconds)."""
        return max(lost, self.joined) + self.reconnect_deadline

    def signal(self) -> None:
        raise NotImplementedError

    def mark_ready(self) -> None:
        raise NotImplementedError

    def fail(self, exc: BaseException) -> None:
        """The shared waiter failed: the next wait raises ``exc`` (translated)."""
        self.error = exc
        self.mark_ready()
        self.signal()


class SharedWaiter:
    """The one waiting connection of an Engine and the subscriptions it fans out to (see the module docstring).
    Get it through :func:`join_waiter`; it ends by itself once it has no subscription left."""

    def __init__(self, engine: Engine) -> None:
        self.backend: Backend = backend_for(engine)
        self._dialect, self._url = engine.dialect, engine.url  # the engine's namespace: its channels' names
        self._pool: Pool = _waiting_pool(engine)
        self._cond = threading.Condition()
        self._subscriptions: dict[str, dict[str | None, set[Subscription]]] = {}
        self._count = 0
        self._effective: set[str] = set()  # channels whose commits reach subscriptions now
        self._closing = False
        self._look = False  # a commit of this process asked the poller to look now (look_now)
        self._settle_until = 0.0  # another process wrote the commit file: poll quickly until then (_idle)
        self._wake_r, self._wake_w = socket.socketpair()  # how a subscriber interrupts the LISTEN wait
        self._served = False  # a connection of this waiter has served its subscriptions (a loss is retried)
        self._connected = False  # the current connection serves them
        self._wake_w.setblocking(False)
        self._wake_r.setblocking(False)

    # -- the subscribers' side (any thread) ---------------------------------------------------------------------

    def add(self, subscription: Subscription) -> bool:
        """Register ``subscription`` (False when this waiter is ending: use a new one)."""
        with self._cond:
            if self._closing:
                return False
            channel = subscription.channel
            self._subscriptions.setdefault(channel, {}).setdefault(subscription.key, set()).add(subscription)
            self._count += 1
            if channel in self._effective:
                subscription.mark_ready()
            else:
                self._poke()
            return True

    def remove(self, subscription: Subscription) -> None:
        """Unregister ``subscription``; the last one leaving ends the waiter (its connection is closed)."""
        with self._cond:
            if self._drop(subscription) and not self._count:
                self._poke()

    def _drop(self, subscription: Subscription) -> bool:
        """Unregister ``subscription`` (called holding the condition); False if it was not registered."""
        keys = self._subscriptions.get(subscription.channel, {})
        members = keys.get(subscription.key)
        if members is None or subscription not in members:
            return False
        members.discard(subscription)
        if not members:
            del keys[subscription.key]
        self._count -= 1
        return True

    def start(self) -> None:
        threading.Thread(target=self._run, name="hostedrooms-wakeup", daemon=True).start()

    def look_now(self) -> None:
        """A write of this engine committed in this process: a poller reads the change counter now instead of at
        its next period (set under the condition, so a poller busy reading does not wait a period first)."""
        with self._cond:
            self._look = True
            self._poke()

    def _poke(self) -> None:
        """Wake the thread to look at the subscriptions again (called holding the condition)."""
        if self._closing:  # the thread is gone, or going, and its sockets with it
            return
        self._cond.notify_all()
        with contextlib.suppress(BlockingIOError):  # a full buffer already holds a poke
            self._wake_w.send(b"\0")

    # -- the waiter's thread ------------------------------------------------------------------------------------

    def _run(self) -> None:
        try:
            self._serve()
        except BaseException as exc:  # every subscriber raises it from its wait
            self._fail(exc)
        finally:
            self._wake_r.close()
            self._wake_w.close()
            with forkgate.inside_driver():
                self._pool.dispose()

    def _serve(self) -> None:
        """Keep a waiting connection until nobody waits. One lost after it served is opened again with back-off
        (:meth:`_back_off`), and every subscription is woken once it serves again (notifications sent meanwhile
        are lost: each re-reads); the first connection failing before it served fails them all at once (a
        configuration error, a hot standby refusing ``LISTEN``)."""
        lost = 0.0  # when the waiter lost its last serving connection
        attempt = 0
        while True:
            try:
                self._session(resumed=attempt > 0)
                return  # nobody waits any more
            except Exception as exc:
                if not self._served:
                    raise
                if self._connected:  # it was serving: the outage starts now
                    lost, attempt = time.monotonic(), 0
                attempt += 1
                if not self._back_off(exc, lost, attempt):
                    return

    def _session(self, *, resumed: bool) -> None:
        """One connection: open it, serve until nobody waits (or it fails), close it."""
        with self._cond:
            self._effective, self._connected = set(), False  # new subscriptions wait until it serves
        with forkgate.inside_driver():
            raw = self._pool.connect()
        try:
            if self.backend.notifies:
                self._listen(raw, resumed)
            else:
                self._poll(raw, resumed)
        finally:
            with forkgate.inside_driver():
                raw.invalidate()  # closed, never pooled: the pool is this waiter's alone

    def _back_off(self, exc: BaseException, lost: float, attempt: int) -> bool:
        """Wait before reconnection ``attempt`` (jittered, doubling up to :data:`RECONNECT_CAP`), failing with
        ``exc`` each subscription whose ``reconnect_deadline`` passed meanwhile; False once nobody waits."""
        # Equal jitter (between half and all of the doubled delay), read at call time: tests lower the constants.
        delay = JitteredBackoff(base=min(RECONNECT_FIRST, RECONNECT_CAP), cap=RECONNECT_CAP, jitter="equal",
                                random=random.random).delay(attempt)
        until = time.monotonic() + delay
        with selectors.DefaultSelector() as selector:
            selector.register(self._wake_r, selectors.EVENT_READ)
            while True:
                now = time.monotonic()
                with self._cond:
                    for subscription in [sub for sub in self._all() if sub.gives_up_at(lost) <= now]:
                        self._drop(subscription)
                        subscription.fail(exc)
                    if not self._still_wanted():
                        return False
                    wake = min([until, *(sub.gives_up_at(lost) for sub in self._all())])
                if now >= until:
                    return True
                selector.select(max(0.0, wake - now))  # a subscription leaving pokes
                self._drain_pokes()

    def _still_wanted(self) -> bool:
        """Whether anyone still waits (called holding the condition); if not, the waiter is ending from now on."""
        if not self._count:
            self._closing = True
        return not self._closing

    def _listen(self, raw: PoolProxiedConnection, resumed: bool) -> None:
        driver: Any = raw.driver_connection
        with forkgate.inside_driver():
            driver.rollback()
            driver.autocommit = True
            # Channels are named per namespace (schema): this engine's only, never another schema's writes.
            namespace = self.backend.raw_namespace(self._dialect, driver, self._url)
        names: dict[str, str] = {}  # the namespace's channel name -> hostedrooms' channel
        with selectors.DefaultSelector() as selector:  # not select(): a process may have descriptors past 1024
            selector.register(driver.fileno(), selectors.EVENT_READ)
            selector.register(self._wake_r, selectors.EVENT_READ)
            while True:
                with self._cond:
                    if not self._still_wanted():
                        return
                    new = set(self._subscriptions) - self._effective
                with forkgate.inside_driver():
                    for channel in new:
                        names[scoped_channel(namespace, channel)] = channel
                        driver.execute(self.backend.listen_statement(channel, namespace))
                    # those read meanwhile, and any received
                    received = [(notification.channel, notification.payload)
                                for notification in driver.notifies(timeout=0)]
                if new:
                    self._now_effective(new)
                    if resumed:  # what committed while no connection listened was not notified: everyone looks
                        self._dispatch(None, None)
                        resumed = False
                for channel, payload in received:
                    ours = names.get(channel)
                    if ours is not None:
                        self._dispatch(ours, payload)
                selector.select()  # outside the gate: a fork never waits for this wait
                self._drain_pokes()

    def _drain_pokes(self) -> None:
        with contextlib.suppress(BlockingIOError):
            while self._wake_r.recv(4096):
                pass

    def _poll(self, raw: PoolProxiedConnection, resumed: bool) -> None:
        connection = raw.dbapi_connection
        with forkgate.inside_driver():
            version = self.backend.change_counter(connection)
        commit_file = self.backend.commit_file(self._url)  # it exists now: this connection has read the database
        watch = watch_writes(commit_file) if commit_file is not None else None
        self._now_effective(None)
        if resumed:  # commits while no connection polled may have been missed: everyone looks
            self._dispatch(None, None)
        try:
            with selectors.DefaultSelector() as selector:
                selector.register(self._wake_r, selectors.EVENT_READ)
                if watch is not None:
                    selector.register(watch, selectors.EVENT_READ)
                while True:
                    with self._cond:
                        if not self._still_wanted():
                            return
                        look, self._look = self._look, False
                        period = self._poll_interval()
                    if not look:
                        watch = self._idle(selector, watch, period)
                    with self._cond:
                        if not self._still_wanted():
                            return
                    with forkgate.inside_driver():
                        current = self.backend.change_counter(connection)
                    if current != version:
                        version = current
                        self._dispatch(None, None)
        finally:
            if watch is not None:
                watch.close()

    def _idle(self, selector: selectors.BaseSelector, watch: FileWatch | None, period: float) -> FileWatch | None:
        """Wait until the period ends, a commit of this process pokes, or (Linux) another process writes the
        commit file; the watch, or None once it has ended (then the period alone).

        A write is seen before its commit is: the writer appends its frames, syncs them, and only then publishes the
        commit in the shared-memory index (which no watch sees). So for :data:`SETTLE_SPAN` after a write the
        period is :data:`SETTLE_PERIOD`, and the commit is read soon after it is published."""
        if time.monotonic() < self._settle_until:
            period = min(period, SETTLE_PERIOD)
        ready = selector.select(period)
        self._drain_pokes()
        if watch is not None and any(key.fileobj is watch for key, _ in ready):
            if not watch.drain():
                selector.unregister(watch)
                watch.close()
                return None
            self._settle_until = time.monotonic() + SETTLE_SPAN
        return watch

    def _poll_interval(self) -> float:
        """The shortest polling period any subscription asked for (called holding the condition)."""
        return min(subscription.poll_interval for subscription in self._all())

    def _all(self) -> Iterator[Subscription]:
        for keys in self._subscriptions.values():
            for members in keys.values():
                yield from members

    def _now_effective(self, channels: set[str] | None) -> None:
        """Commits on ``channels`` (None: every channel, polling) now reach their subscriptions: they are ready."""
        with self._cond:
            self._served = self._connected = True
            if channels is None:
                self._effective = set(self._subscriptions) | {ROOM_EVENTS_CHANNEL, LEDGER_WORK_CHANNEL}
                ready = list(self._all())
            else:
                self._effective |= channels
                ready = [sub for channel in channels for keys in self._subscriptions.get(channel, {}).values()
                         for sub in keys]
            for subscription in ready:
                subscription.mark_ready()

    def _dispatch(self, channel: str | None, payload: str | None) -> None:
        """Signal the subscriptions a notification concerns (``channel`` None: every subscription)."""
        with self._cond:
            if channel is None:
                targets = list(self._all())
            else:
                keys = self._subscriptions.get(channel, {})
                targets = [*keys.get(None, ()), *(keys.get(payload, ()) if payload is not None else ())]
            for subscription in targets:
                subscription.signal()

    def _fail(self, exc: BaseException) -> None:
        with self._cond:
            self._closing = True
            for subscription in list(self._all()):
                subscription.fail(exc)


#: Each engine's waiter is kept in its :class:`~hostedrooms.engine_profile.EngineRuntime`, with the generation it
#: was started in: bumped in every forked child, whose parent's waiters are never used.
_generation = 0
_waiters_lock = threading.Lock()


def _waiter_of(engine: Engine) -> SharedWaiter | None:
    """``engine``'s shared waiter of this process, if one was started (it may be ending)."""
    runtime = known_runtime(engine)
    if runtime is None or runtime.waiter_generation != _generation:
        return None
    waiter: SharedWaiter | None = runtime.waiter
    return waiter


def committed(engine: Engine) -> None:
    """A write unit of ``engine`` committed: where waiters poll (SQLite), the engine's poller looks now, so its
    followers wake without waiting for the next period; commits of other processes are seen at the next poll. Where
    commits notify (PostgreSQL), nothing to do."""
    waiter = _waiter_of(engine)
    if waiter is not None and not waiter.backend.notifies:
        waiter.look_now()


def _forget_waiters() -> None:
    """In a forked child: the parent's waiter threads do not exist here (nor may their connections be used), and
    the lock may have been held by a thread that does not exist either; start afresh."""
    global _generation, _waiters_lock
    _generation, _waiters_lock = _generation + 1, threading.Lock()


if hasattr(os, "register_at_fork"):  # not on Windows, which does not fork
    os.register_at_fork(after_in_child=_forget_waiters)


def _waiting_pool(engine: Engine) -> Pool:
    """Where the waiter's one connection comes from: a private copy of ``engine``'s pool (the same connect hooks,
    none of the services' slots), or, given ``listen_url`` (a transaction pooler would lose the ``LISTEN``), a
    plain pool of that direct connection."""
    listen_url = check_listen_through(engine) if backend_for(engine).notifies else None
    if listen_url is None:
        return engine.pool.recreate()
    return _sa_create_engine(listen_url, poolclass=NullPool).pool


def check_waitable(engine: Engine) -> None:
    """Refuse (StoreConfigurationError) waits on ``engine`` whose notifications a transaction pooler would lose:
    ``pooler="transaction"`` without ``listen_url``."""
    if backend_for(engine).notifies:
        check_listen_through(engine)


def has_separate_connections(engine: Engine) -> bool:
    """Whether a connection of a private copy of ``engine``'s pool sees the database the services use: not where
    the pool hands out one connection (an in-memory SQLite database; a copy would open a new, empty one)."""
    return not isinstance(engine.pool, (StaticPool, SingletonThreadPool))


def join_waiter(engine: Engine | None, subscription: Subscription) -> SharedWaiter | None:
    """Register ``subscription`` with ``engine``'s shared waiter, starting one if none is running; None (and the
    subscription marked ready, never signalled) where there can be none (``engine`` None, or no second
    connection sees the same database). Wait for the subscription to be ready before reading."""
    if engine is None or not has_separate_connections(engine):
        subscription.mark_ready()
        return None
    check_waitable(engine)  # a transaction pooler without listen_url: refused, never silently polled
    with _waiters_lock:
        waiter = _waiter_of(engine)
        if waiter is not None and waiter.add(subscription):
            return waiter
        runtime = runtime_of(engine)
        waiter = runtime.waiter = SharedWaiter(engine)
        runtime.waiter_generation = _generation
        waiter.add(subscription)
        waiter.start()
        return waiter


class _ThreadSubscription(Subscription):
    """A subscription whose waiter is a thread: two ``threading.Event``\\ s."""

    def __init__(self, channel: str, key: str | None, poll_interval: float | None,
                 reconnect_deadline: float | None) -> None:
        super().__init__(channel, key, poll_interval, reconnect_deadline)
        self._woken, self._ready = threading.Event(), threading.Event()

    def signal(self) -> None:
        self._woken.set()

    def mark_ready(self) -> None:
        self._ready.set()

    def until_ready(self) -> None:
        self._ready.wait()

    def wait(self, timeout: float) -> bool:
        # Cleared before the caller re-reads: a commit signalled after this is either seen by that read or
        # signals again, so none is missed.
        woken = self._woken.wait(max(0.0, timeout))
        if woken:
            self._woken.clear()
        return woken


class Wakeup:
    """``with Wakeup(engine, channel, key=...) as wakeup: ... wakeup.wait(timeout)``: see the module docstring.

    ``key``: only notifications with this payload wake the waiter (a room id); None: any on ``channel``.
    ``poll_interval``: SQLite's polling period (default :data:`DEFAULT_POLL_INTERVAL`; the engine's one poller
    polls at the shortest period its waiters ask for). ``reconnect_deadline``: how long a wait goes on through a
    lost waiting connection, which the shared waiter opens again meanwhile (default :data:`RECONNECT_DEADLINE`);
    after it, the wait raises StoreUnavailableError.
    """

    def __init__(
        self, engine: Engine, channel: str, *, key: str | None = None, poll_interval: float | None = None,
        reconnect_deadline: float | None = None,
    ) -> None:
        if poll_interval is not None:
            interval(poll_interval, "poll_interval")  # the poller thread would fail on it later
        self.engine = engine
        self.backend: Backend = backend_for(engine)
        if self.backend.notifies:
            self.backend.listen_statement(channel)  # one of hostedrooms' channels (a programming error otherwise)
            check_waitable(engine)  # a transaction pooler without listen_url: refused here, at once
        self.channel, self.key = channel, key
        self.poll_interval = DEFAULT_POLL_INTERVAL if poll_interval is None else poll_interval
        self.reconnect_deadline = reconnect_deadline
        self._subscription: _ThreadSubscription | None = None
        self._waiter: SharedWaiter | None = None

    def __enter__(self) -> Self:
        subscription = self._subscription = _ThreadSubscription(
            self.channel, self.key, self.poll_interval, self.reconnect_deadline)
        try:
            self._waiter = join_waiter(self.engine, subscription)
            subscription.until_ready()
        except BaseException:
            self._leave()
            raise
        self._raise_failure()
        return self

    def _raise_failure(self) -> None:
        subscription = self._subscription
        if subscription is not None and subscription.error is not None:
            self._leave()
            raise driver_error(self.engine, subscription.error) from subscription.error

    def wait(self, timeout: float) -> bool:
        """Block until a commit may have changed what is waited for (True) or ``timeout`` seconds passed (False)."""
        assert self._subscription is not None, "wake-up not entered"
        woken = self._subscription.wait(timeout)
        self._raise_failure()
        return woken

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self._leave()

    def _leave(self) -> None:
        waiter, self._waiter = self._waiter, None
        if waiter is not None and self._subscription is not None:
            waiter.remove(self._subscription)

"""Writers in several processes queue for a SQLite file instead of polling for it: a sidecar lock file.

SQLite lets one transaction write at a time, and a writer that finds the write lock taken sleeps in its busy
handler and tries again, with growing sleeps (up to 100 ms). Under a steady stream of writes it rarely catches the
lock free: a process could wait out the whole busy timeout while the others kept writing (issue 34: 6 of 60
processes appending once each beside a busy gateway failed with "database is locked"). So every write unit of a
SQLite file engine first takes an exclusive ``flock`` on ``<database>-hostedrooms.lock`` (:data:`LOCK_SUFFIX`)
and holds it from before its ``BEGIN IMMEDIATE`` until after its ``COMMIT`` or ``ROLLBACK``
(:mod:`hostedrooms.uow`; a migration too, :mod:`hostedrooms.migrate`). A waiter sleeps in the kernel and is woken
when the holder lets go, so the lock passes between processes in turn; ``BEGIN IMMEDIATE`` then finds SQLite's
lock free. Reads never take it (WAL readers do not wait for writers).

Why a separate file: closing *any* descriptor of the database (or of its ``-wal``/``-shm``/``-journal``) drops
every POSIX lock the process holds on it, SQLite's included (sqlite.org/howtocorrupt.html, section 2.2), so
nothing here opens those. The lock file holds no data; it is created ``0600`` beside the database once the
database exists and is never deleted (deleting it while processes use it would split them onto two locks).

In one process: a thread mutex first (so one thread per process waits in the kernel, and a thread's nested
write unit, which already holds the lock, proceeds without it as before: SQLite's busy timeout decides), then
the ``flock`` on a descriptor of this process's own, opened lazily (``O_CLOEXEC``; one per database file, kept
while an engine of that file lives, closed after the last one is gone, when the next lock file is opened: a
process that opens many databases in turn, a test suite, holds no descriptor for each). ``flock`` locks belong to an
open file description, which a forked child shares: a child closes every descriptor it inherited from here
(:func:`_forked`; that never unlocks the parent's lock) and opens its own, and a lock object of the parent
never unlocks anything in a child (the pid is checked).

How long a writer waits (:class:`_Patience`): while the queue moves. Each turn, as it ends, writes its process
id and a count into the lock file; a waiter that sees no turn end within the engine's busy timeout (a stopped
process, a transaction that does not end) gives up with :class:`~hostedrooms.errors.StoreUnavailableError`, as
a busy SQLite lock always made it, and so does one still waiting after :data:`PATIENCE` busy timeouts. A plain
deadline of one busy timeout would fail a writer that is merely far back in a long queue: many short-lived
processes each writing once take that long in all when the machine is loaded, although every turn is short.

A blocking ``flock`` has no timeout and nothing interrupts it in a thread, and a loop of non-blocking attempts
would be polling again; so an uncontended turn is one non-blocking ``flock``, and a contended one blocks in a
short-lived helper thread on a fresh descriptor while the caller waits on an event and checks the queue's
progress once per busy timeout (the helper keeps its place meanwhile). A helper whose caller gave up unlocks as
soon as its ``flock`` returns and closes its descriptor (a fresh one each time: the abandoned lock can never be
mistaken for a later caller's).

Where no lock is taken: an in-memory database or a SQLite URI (used as given), an AsyncEngine's own
``sync_engine`` (its driver calls are awaited on the loop: ``AsyncUnitOfWork`` and ``services="awaited"`` keep
SQLite's busy timeout), a database file that does not exist yet (its first write creates it), and a lock file
that cannot be opened (a read-only directory: logged once; SQLite's busy timeout arbitrates). Processes that do
not take the lock (older versions, the ``sqlite3`` shell) still exclude each other through SQLite itself: its
busy timeout stays the backstop.
"""

from __future__ import annotations

import logging
import os
import stat
import struct
import threading
import time
import weakref

from sqlalchemy import Engine

from .errors import StoreUnavailableError, describe_target
from .files import create_private_file

try:
    import fcntl
except ImportError:  # pragma: no cover - Windows: no flock; SQLite's busy timeout arbitrates there
    fcntl = None  # type: ignore[assignment]

__all__ = ["LOCK_SUFFIX", "FileWriteLock", "allow", "lock_file", "take"]

#: The lock file of a database file ``X`` is ``X-hostedrooms.lock``.
LOCK_SUFFIX = "-hostedrooms.lock"
#: A waiter gives up after this many busy timeouts even while the queue moves (:class:`_Patience`).
PATIENCE = 3
#: Written into the lock file by each turn as it ends: the process id and its count of turns (waiters read it
#: to tell a moving queue from a holder that does not let go).
_TURN = struct.Struct("<qq")
#: The attribute of an engine's SQLAlchemy dialect (shared with its ``execution_options()`` engines) holding
#: its :class:`_Site`.
_ATTRIBUTE = "_hostedrooms_write_lock"

_log = logging.getLogger(__name__)
#: Bumped in every forked child: lock objects of an older generation belong to the parent.
_generation = 0
#: This process's lock objects, one per lock file (two engines of one file share the mutex and the queue), held
#: by the engines' sites and by the turns in progress: a lock no engine uses any more is dropped.
_locks: weakref.WeakValueDictionary[str, FileWriteLock] = weakref.WeakValueDictionary()
#: Every lock-file descriptor open in this process (a forked child closes them all); guarded by ``_fds_lock``.
_fds: set[int] = set()
_fds_lock = threading.Lock()
#: Descriptors of locks no engine uses any more, closed at the next opening of a lock file (:func:`_drop`).
_dropped: list[tuple[int, int, int]] = []


class _Site:
    """What an engine needs to find its process's lock: the lock file, the busy timeout, the current lock."""

    def __init__(self, path: str, database: str, timeout: float, where: str) -> None:
        self.path = path
        self.database = database
        self.timeout = timeout
        self.where = where
        self.lock: FileWriteLock | None = None
        self.generation = -1

    def current(self) -> FileWriteLock:
        lock = self.lock
        if lock is None or self.generation != _generation:
            with _fds_lock:
                lock = _locks.get(self.path)
                if lock is None:
                    lock = _locks[self.path] = FileWriteLock(self.path, self.database)
            self.lock, self.generation = lock, _generation
        return lock


class _Patience:
    """How long a waiter keeps its place in the queue: as long as some writer (of any process) ends its turn at
    least once per busy timeout, and :data:`PATIENCE` busy timeouts at most. So a holder that keeps its turn past
    the busy timeout (a stopped process, a long transaction) fails the waiters as a busy SQLite lock did, while a
    long queue that keeps moving (many processes writing at once) does not."""

    def __init__(self, fd: int, timeout: float) -> None:
        self.fd = fd
        self.timeout = timeout
        now = time.monotonic()
        self.limit = now + timeout * PATIENCE
        self.next = now + timeout
        self.seen = _last_turn(fd)

    def interval(self) -> float:
        return max(0.0, min(self.next, self.limit) - time.monotonic())

    def check(self) -> None:
        """Raise TimeoutError when no turn ended since the last check (a busy timeout ago) or the limit passed."""
        now = time.monotonic()
        if now < min(self.next, self.limit):
            return
        if now >= self.limit:
            raise TimeoutError(f"still no turn after {self.timeout * PATIENCE:g} s")
        turn = _last_turn(self.fd)
        if turn == self.seen:
            raise TimeoutError(f"no writer ended its turn within the busy timeout of {self.timeout:g} s")
        self.seen, self.next = turn, now + self.timeout


def _last_turn(fd: int) -> bytes:
    """What the last turn to end wrote into the lock file (its process and its count of turns)."""
    try:
        return os.pread(fd, _TURN.size, 0)
    except OSError:
        return b""


class _Wait:
    """One contended turn: a helper thread blocks in ``flock`` on ``fd``; the caller waits for ``done``."""

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self.done = threading.Event()
        self.abandoned = False
        self.error: OSError | None = None
        self.lock = threading.Lock()

    def block(self) -> None:
        try:
            fcntl.flock(self.fd, fcntl.LOCK_EX)
        except OSError as exc:
            self.error = exc
        with self.lock:
            if not self.abandoned:
                self.done.set()
                return
        if self.error is None:  # the caller gave up: pass the turn on at once
            fcntl.flock(self.fd, fcntl.LOCK_UN)
        _close(self.fd)


class FileWriteLock:
    """This process's turns on one lock file: a thread mutex, then an exclusive ``flock``."""

    def __init__(self, path: str, database: str) -> None:
        self.path = path
        self.database = database
        self.pid = os.getpid()
        self._mutex = threading.Lock()
        self._opening = threading.Lock()
        self._owner: int | None = None
        self._fd: int | None = None  # for uncontended turns, opened on first use
        self._held: int | None = None  # the descriptor holding the flock during a turn
        self._warned = False
        self._turns = 0  # turns this process ended: with the pid, what it writes into the lock file

    def take(self, timeout: float) -> bool:
        """Wait for this thread's turn (see :class:`_Patience` for how long); True: held (call :meth:`release`).
        False: no turn is needed or possible (this thread holds one already, or the lock file cannot be used).
        Raises TimeoutError when the turn did not come in time."""
        ident = threading.get_ident()
        if self._owner == ident:
            return False
        fd = self._fd if self._fd is not None else self._first_descriptor()
        if fd is None:
            return False
        patience = None  # only a turn that has to wait reads the queue's progress
        if not self._mutex.acquire(blocking=False):
            patience = _Patience(fd, timeout)
            while not self._mutex.acquire(timeout=patience.interval()):
                patience.check()  # another thread of this process holds the turn
        try:
            held = self._lock(fd, patience, timeout)
        except BaseException:
            self._mutex.release()
            raise
        if held is None:
            self._mutex.release()
            return False
        self._held, self._owner = held, ident
        return True

    def release(self) -> None:
        """End this thread's turn: unlock, then let the next thread of this process in."""
        held, self._held = self._held, None
        self._owner = None
        try:
            if held is not None and os.getpid() == self.pid:  # a forked child never unlocks its parent's lock
                self._turns += 1
                try:
                    os.pwrite(held, _TURN.pack(self.pid, self._turns), 0)
                except OSError:  # the waiters only see less progress
                    pass
                fcntl.flock(held, fcntl.LOCK_UN)
                if held != self._fd:
                    _close(held)
        finally:
            self._mutex.release()

    def _first_descriptor(self) -> int | None:
        with self._opening:  # one descriptor for uncontended turns, ever: release() tells it from fresh ones
            if self._fd is None:
                self._fd = self._open()
                if self._fd is not None:  # closed when this lock is dropped (no engine or turn holds it)
                    weakref.finalize(self, _drop, self._fd, self.pid, _generation)
            return self._fd

    def _lock(self, fd: int, patience: _Patience | None, timeout: float) -> int | None:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return fd
        except BlockingIOError:
            pass
        fresh = self._open()
        if fresh is None:
            return None
        return _wait(fresh, patience or _Patience(fd, timeout))

    def _open(self) -> int | None:
        """A new descriptor of the lock file (created ``0600`` if missing); None when it cannot be used."""
        if not os.path.exists(self.database):
            return None  # its first connection creates the database; no stray lock file beside a missing one
        try:
            return _open(self.path)
        except OSError as exc:
            if not self._warned:
                self._warned = True
                _log.warning("writers of %s do not queue: cannot use the lock file %s (%s); SQLite's busy "
                             "timeout arbitrates", self.database, self.path, exc)
            return None


def _open(path: str) -> int:
    flags = os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK  # O_NONBLOCK: a FIFO never blocks open
    with _fds_lock:
        _close_dropped()
        try:
            fd = os.open(path, flags)
        except FileNotFoundError:
            create_private_file(path)
            fd = os.open(path, flags)
        _fds.add(fd)
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        _close(fd)
        raise PermissionError(f"not a regular file: {path}")
    return fd


def _drop(fd: int, pid: int, generation: int) -> None:
    """A dropped lock's descriptor, to close at the next opening (:func:`_close_dropped`). This runs inside the
    garbage collector, at any point of any thread, possibly one holding ``_fds_lock``: it takes no lock (a list
    append is atomic) and closes nothing itself."""
    _dropped.append((fd, pid, generation))


def _close_dropped() -> None:
    """Close the descriptors of dropped locks, those of this process and generation only (a forked child closed
    its copies already, and the number may name another file there by now). Called holding ``_fds_lock``."""
    while _dropped:
        fd, pid, generation = _dropped.pop()
        if os.getpid() == pid and _generation == generation and fd in _fds:
            _fds.discard(fd)
            os.close(fd)


def _close(fd: int) -> None:
    with _fds_lock:
        _fds.discard(fd)
        os.close(fd)


def _wait(fd: int, patience: _Patience) -> int:
    """Block for the lock on ``fd`` (in a helper thread) while ``patience`` lasts; ``fd`` once it holds the lock."""
    wait = _Wait(fd)
    threading.Thread(target=wait.block, name="hostedrooms-write-lock", daemon=True).start()
    while not wait.done.wait(patience.interval()):
        try:
            patience.check()
        except TimeoutError:
            with wait.lock:
                if not wait.done.is_set():
                    wait.abandoned = True  # the helper unlocks and closes when its flock returns
                    raise
            break
    if wait.error is not None:
        _close(fd)
        raise wait.error
    return fd


def lock_file(database: str) -> str:
    """The lock file of the SQLite database file ``database``."""
    return database + LOCK_SUFFIX


def allow(engine: Engine, busy_timeout: float) -> None:
    """Make ``engine``'s write units queue on its database's lock file (see the module docstring for which
    engines do)."""
    database = engine.url.database
    if fcntl is None or engine.dialect.is_async or database in (None, "", ":memory:") or database.startswith("file:"):
        return
    site = _Site(lock_file(database), database, busy_timeout, describe_target(engine.url))
    setattr(engine.dialect, _ATTRIBUTE, site)


def take(engine: Engine) -> FileWriteLock | None:
    """Wait for this thread's turn to write through ``engine``; the lock to release after the transaction ends,
    or None (no lock for this engine, or this thread holds its turn already). Raises
    :class:`~hostedrooms.errors.StoreUnavailableError` after the engine's busy timeout."""
    site: _Site | None = getattr(engine.dialect, _ATTRIBUTE, None)
    if site is None:
        return None
    lock = site.current()
    try:
        return lock if lock.take(site.timeout) else None
    except TimeoutError as exc:
        raise StoreUnavailableError(
            f"hosted room store {site.where} is unavailable: database is locked (waiting for a turn to write: "
            f"{exc}; lock file {site.path})") from None
    except OSError as exc:
        raise StoreUnavailableError(
            f"hosted room store {site.where} is unavailable: cannot lock {site.path}: {exc}") from exc


def _forked() -> None:
    """In a forked child: forget the parent's lock objects and close every lock descriptor inherited from it
    (closing a copy never unlocks the parent's lock; keeping it would keep the parent's lock alive here)."""
    global _generation, _fds_lock
    _generation += 1
    _locks.clear()
    _dropped.clear()
    for fd in list(_fds):
        try:
            os.close(fd)
        except OSError:
            pass
    _fds.clear()
    _fds_lock = threading.Lock()  # it may have been held by a thread that does not exist here


# No hook before the fork: holding ``_fds_lock`` across it would stall a unit ending its turn meanwhile, while the
# fork gate (hostedrooms.forkgate) waits for that unit to leave. The cost: a descriptor another thread opens at
# the very moment of the fork may be missing from the child's set, and stay open there unused (never unlocked
# through: the pid check), keeping the parent's lock alive only if the parent died holding it through that one.
if hasattr(os, "register_at_fork"):  # not on Windows, which does not fork (nor has fcntl)
    os.register_at_fork(after_in_child=_forked)

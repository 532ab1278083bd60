"""Fork safety: no thread is inside hostedrooms' driver calls when the process forks.

A forked child has one thread, the one that called ``fork()``; every lock another thread held at that moment stays
held in the child, by nobody. SQLite keeps process-wide mutexes (its global ones, and one per open file and per WAL
index, which every connection of the process to that file shares); a thread of the parent inside SQLite at the
fork may hold one, and the child's first connection to the same file then blocks on it forever (a futex, seen in a
child's first append while the parent's shared waiter was polling). So hostedrooms' driver work passes through one
gate: a thread holds it (shared; counted, reentrant per thread) while it is inside the driver, and a ``fork()``
(``os.register_at_fork``) closes it first: new entries wait, and the fork waits for the threads inside to leave.
After the fork the parent opens it again; the child starts with a fresh gate.

What holds it: every unit of work (:class:`~hostedrooms.uow.UnitOfWork`, from taking its connection until it is
given back, on whichever thread runs it, so a host's threads calling hostedrooms are covered too) and the shared
waiter's thread (:mod:`hostedrooms.wakeup`) around each driver call; never while it waits on a socket (the
``LISTEN`` wait, the poller's period), so a waiting follower never delays a fork. The thread that forks may itself
be inside (a fork inside a unit): its own entry is not waited for.

The wait is bounded (:data:`FORK_PAUSE`): a call that stays inside longer (a write waiting out SQLite's busy
timeout, a connect to an unreachable server) lets the fork go ahead after it, with a warning on the
``hostedrooms.forkgate`` logger; the child is then exposed as before. Not covered: SQLite or driver calls that do not
go through hostedrooms (a host's own ``sqlite3`` connections, its own SQLAlchemy sessions, the driver threads of
``aiosqlite`` on an AsyncEngine whose services are awaited): a fork while one of them is inside SQLite can still
leave the child a held mutex. Fork before starting such threads, or use the ``spawn`` or ``forkserver`` start
methods.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

__all__ = ["FORK_PAUSE", "inside_driver"]

#: The longest a ``fork()`` waits for hostedrooms' threads to leave the driver (seconds).
FORK_PAUSE = 10.0

_log = logging.getLogger(__name__)


class _Gate:
    """The threads inside the driver, and whether a fork is waiting for them to leave."""

    def __init__(self, inside: int = 0) -> None:
        self.lock = threading.Lock()
        self.cond = threading.Condition(self.lock)  # waited on only while a fork is pending
        self.inside = inside
        self.forking = False
        self.holding = False  # the forking thread holds ``lock`` across the fork


_gate = _Gate()
_local = threading.local()


def _depth() -> int:
    depth: int = getattr(_local, "depth", 0)
    return depth


def enter() -> None:
    """This thread enters the driver (wait while a fork is pending; reentrant)."""
    depth = _depth()
    if not depth:
        gate = _gate
        with gate.lock:
            while gate.forking:
                gate.cond.wait()
            gate.inside += 1
    _local.depth = depth + 1


def leave() -> None:
    """This thread left the driver (the outermost leave lets a pending fork go on)."""
    depth = _local.depth = _local.depth - 1
    if not depth:
        gate = _gate
        with gate.lock:
            gate.inside -= 1
            if gate.forking:
                gate.cond.notify_all()


@contextmanager
def inside_driver() -> Iterator[None]:
    """Hold the gate for the block (see the module docstring)."""
    enter()
    try:
        yield
    finally:
        leave()


def _before_fork() -> None:
    gate = _gate
    gate.lock.acquire()
    while gate.forking:  # another thread is forking: its fork first
        gate.cond.wait()
    gate.forking, gate.holding = True, True
    own = 1 if _depth() else 0
    deadline = time.monotonic() + FORK_PAUSE
    while gate.inside > own:
        left = deadline - time.monotonic()
        if left <= 0:
            _log.warning("fork() went ahead with %d thread(s) still inside a hosted room store's driver after %.0f s; "
                         "the child may block on a lock they held", gate.inside - own, FORK_PAUSE)
            break
        gate.cond.wait(left)


def _after_in_parent() -> None:
    gate = _gate
    if gate.holding:
        gate.forking, gate.holding = False, False
        gate.cond.notify_all()
        gate.lock.release()


def _after_in_child() -> None:
    global _gate
    # Only this thread exists here: the others' entries went with them.
    _gate = _Gate(1 if _depth() else 0)


if hasattr(os, "register_at_fork"):  # not on Windows, which does not fork
    os.register_at_fork(before=_before_fork, after_in_parent=_after_in_parent, after_in_child=_after_in_child)

"""Being told when a file is written (Linux inotify), so the SQLite poller of :mod:`hostedrooms.wakeup` reads at
once when another process commits, instead of at its next period.

Every SQLite commit in WAL mode writes the ``-wal`` file; a watch on it (``IN_MODIFY``) makes a descriptor
readable then. A write is only a hint to read ``PRAGMA data_version`` again (a checkpoint or an uncommitted
transaction's spill writes too: a spurious read at worst), and the poller keeps its period, so a write the watch
does not see (another platform, a file system without inotify, a watch that could not be added) is still seen at
the next poll. A watch never opens the watched file: the process's POSIX locks on the database are untouched.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import os
import struct
import sys
from typing import Any

__all__ = ["FileWatch", "watch_writes"]

_IN_MODIFY = 0x00000002
#: The watch is gone (the file was deleted, or its file system unmounted).
_IN_IGNORED = 0x00008000
#: ``struct inotify_event``: wd, mask, cookie, len (then ``len`` bytes of name).
_EVENT = struct.Struct("iIII")
_libc: Any = None


class FileWatch:
    """A watch on one file: :meth:`fileno` becomes readable when the file is written; :meth:`drain` reads the
    pending notifications (whether the watch still holds); :meth:`close` ends it."""

    def __init__(self, fd: int) -> None:
        self._fd = fd

    def fileno(self) -> int:
        return self._fd

    def drain(self) -> bool:
        """Consume every pending notification; False once the watch has ended (the file was removed)."""
        alive = True
        while True:
            try:
                data = os.read(self._fd, 4096)
            except BlockingIOError:
                return alive
            if not data:
                return alive
            offset = 0
            while offset + _EVENT.size <= len(data):
                _, mask, _, length = _EVENT.unpack_from(data, offset)
                if mask & _IN_IGNORED:
                    alive = False
                offset += _EVENT.size + length

    def close(self) -> None:
        with contextlib.suppress(OSError):
            os.close(self._fd)


def _inotify() -> Any:
    global _libc
    if _libc is None:
        try:
            libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
            libc.inotify_init1.argtypes, libc.inotify_init1.restype = [ctypes.c_int], ctypes.c_int
            libc.inotify_add_watch.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_uint32]
            libc.inotify_add_watch.restype = ctypes.c_int
            _libc = libc
        except (OSError, AttributeError):  # no C library to load, or one without inotify
            _libc = False
    return _libc


def watch_writes(path: str) -> FileWatch | None:
    """A watch on writes to ``path``, or None where none can be had (not Linux, no inotify, the file is missing,
    the user's inotify instances are used up): the caller then relies on polling alone."""
    if not sys.platform.startswith("linux"):
        return None
    libc = _inotify()
    if not libc:
        return None
    fd = libc.inotify_init1(os.O_NONBLOCK | os.O_CLOEXEC)
    if fd < 0:
        return None
    if libc.inotify_add_watch(fd, os.fsencode(path), _IN_MODIFY) < 0:
        os.close(fd)
        return None
    return FileWatch(fd)

"""Owner-private files and directories, changed without following links and without dropping SQLite's locks.

The descriptor policy of hostedrooms: closing *any* descriptor of a file releases every POSIX advisory lock the
process holds on that file, including the locks SQLite's connections hold on a database and its ``-wal``/``-shm``
files; another process then believes it is the last user, checkpoints and deletes the WAL, and the file is
corrupted (sqlite.org/howtocorrupt.html, section 2.2). So nothing here opens and closes a readable or writable
descriptor of an existing database file:

- a file is created ``0600`` with ``O_CREAT | O_EXCL | O_NOFOLLOW`` (a file that did not exist cannot carry this
  process's locks, so closing that descriptor is harmless);
- an existing file is examined with ``os.lstat`` (never followed), and its mode is changed through an
  ``O_PATH | O_NOFOLLOW`` descriptor: ``fstat`` proves it is the regular file we own that ``lstat`` saw, and the
  mode is set through ``/proc/self/fd``. Closing an ``O_PATH`` descriptor releases no lock (Linux skips the
  POSIX-lock cleanup for such descriptors); where there is no ``O_PATH`` the change is refused;
- a directory is changed through its own ``O_DIRECTORY | O_NOFOLLOW`` descriptor (no database lock rides on a
  directory), and only when it is ours alone: a sticky or group/other-writable directory is shared and is
  refused, never changed.

This module imports nothing from hostedrooms, so every layer may use it.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

__all__ = [
    "PRIVATE_DIRECTORY_MODE",
    "PRIVATE_FILE_MODE",
    "SQLITE_SIDECARS",
    "create_private_file",
    "ensure_private_directory",
    "restrict_file",
]

PRIVATE_FILE_MODE = 0o600
PRIVATE_DIRECTORY_MODE = 0o700
#: The files SQLite keeps next to a database file ``X``: ``X-wal``, ``X-shm`` and (rollback journal) ``X-journal``.
SQLITE_SIDECARS = ("-wal", "-shm", "-journal")
_SHARED_DIRECTORY_BITS = stat.S_ISVTX | stat.S_IWGRP | stat.S_IWOTH
_PROC_FD = "/proc/self/fd"


def _refuse(message: str, path: str | os.PathLike[str]) -> PermissionError:
    return PermissionError(f"{message}: {os.fspath(path)}")


def _require_own_regular_file(path: str | os.PathLike[str], info: os.stat_result) -> None:
    if stat.S_ISLNK(info.st_mode):
        raise _refuse("refusing to change the mode of a symlink", path)
    if not stat.S_ISREG(info.st_mode):
        raise _refuse("refusing to change the mode of something that is not a regular file", path)
    if info.st_uid != os.getuid():
        raise _refuse("refusing to change the mode of a file owned by another user", path)


def create_private_file(path: str | os.PathLike[str]) -> bool:
    """Create ``path`` as an empty ``0600`` file unless something (even a dangling symlink) is there already.

    Returns True when this call created it. Never follows a symlink.
    """
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, PRIVATE_FILE_MODE)
    except FileExistsError:
        return False
    try:
        os.fchmod(fd, PRIVATE_FILE_MODE)  # the umask may have taken bits away
    finally:
        os.close(fd)  # a file this call created carries no lock of this process
    return True


def restrict_file(path: str | os.PathLike[str], mode: int = PRIVATE_FILE_MODE) -> os.stat_result:
    """Give the existing regular file ``path`` exactly ``mode`` unless it has it; return its ``lstat`` after.

    Raises ``FileNotFoundError`` when there is no such file, and ``PermissionError`` for a symlink (never
    followed), anything but a regular file, a file owned by another user, or a platform where the mode cannot be
    changed without following links or opening the file. Safe while this process holds SQLite connections to
    the file: no descriptor whose closing would release their locks is opened.
    """
    info = os.lstat(path)
    _require_own_regular_file(path, info)
    if stat.S_IMODE(info.st_mode) == mode:
        return info
    if not hasattr(os, "O_PATH") or not os.path.isdir(_PROC_FD):
        raise _refuse("cannot change this file's mode without following links on this platform", path)
    fd = os.open(path, os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        held = os.fstat(fd)
        if (held.st_dev, held.st_ino) != (info.st_dev, info.st_ino):
            raise _refuse("the file was replaced while its mode was being changed", path)
        _require_own_regular_file(path, held)
        os.chmod(f"{_PROC_FD}/{fd}", mode)  # changes the inode held, whatever the path names now
    finally:
        os.close(fd)  # an O_PATH descriptor: closing it releases no POSIX lock
    return os.lstat(path)


def ensure_private_directory(path: str | os.PathLike[str]) -> Path:
    """Create ``path`` (with parents) as an owner-only (``0700``) directory, or make an existing one so.

    Refused with ``PermissionError`` naming the directory: a symlink, anything but a directory, a directory owned
    by another user, and a shared directory (sticky, or writable by group or others: for example ``/tmp``),
    which is never changed. A directory that is ours alone but more open (``0755``) becomes ``0700``.
    """
    directory = Path(path)
    try:
        info = os.lstat(directory)
    except FileNotFoundError:
        directory.mkdir(mode=PRIVATE_DIRECTORY_MODE, parents=True, exist_ok=True)
        info = os.lstat(directory)
    _require_own_directory(directory, info)
    if stat.S_IMODE(info.st_mode) == PRIVATE_DIRECTORY_MODE:
        return directory
    if info.st_mode & _SHARED_DIRECTORY_BITS:
        raise PermissionError(
            f"private directory is shared (sticky, or writable by group or others) and will not be changed: "
            f"{directory}; keep the store in a directory of its own")
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        held = os.fstat(fd)
        if (held.st_dev, held.st_ino) != (info.st_dev, info.st_ino):
            raise PermissionError(f"private directory was replaced while it was checked: {directory}")
        os.fchmod(fd, PRIVATE_DIRECTORY_MODE)
    finally:
        os.close(fd)  # a directory's descriptor: no database lock rides on it
    return directory


def _require_own_directory(directory: Path, info: os.stat_result) -> None:
    if stat.S_ISLNK(info.st_mode):
        raise PermissionError(f"private directory must not be a symlink: {directory}")
    if not stat.S_ISDIR(info.st_mode):
        raise PermissionError(f"private directory is not a directory: {directory}")
    if info.st_uid != os.getuid():
        raise PermissionError(f"private directory is owned by another user: {directory}")

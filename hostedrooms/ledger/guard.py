"""The ledger file's guard: an owner-private SQLite file, checked by path (``os.lstat``), never opened.

Built on :mod:`hostedrooms.files`: closing any descriptor of a SQLite file (or its sidecars) would release this
process's locks on it, so nothing here opens one.
"""

from __future__ import annotations

import errno
import os
import stat
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ..errors import LedgerInputError, LedgerPermissionError, StoreUnavailableError
from ..files import SQLITE_SIDECARS, create_private_file, ensure_private_directory, restrict_file

_SYMLINK_MESSAGE = "secure peer delivery ledger must not be a symlink"
_UNSAFE_MESSAGE = "secure peer delivery ledger is unsafe"
_PRIVATE_MODE = 0o600

FileIdentity = tuple[int, int]


def secure_ledger_file(
    path: str | os.PathLike[str], *, create: bool = False, expected: FileIdentity | None = None
) -> FileIdentity:
    """Refuse the ledger file unless it is a private regular file; return its (device, inode) identity.

    With ``create`` a missing file is created ``0600`` (``O_EXCL``, never through a symlink). The file is then
    examined with ``os.lstat`` only (never followed, never opened: closing a descriptor of it would release
    this process's SQLite locks, see :mod:`hostedrooms.files`); a mode other than ``0600`` is repaired without
    following links, like the reference does on every connect. Refusals are ``LedgerPermissionError`` (a
    ``PermissionError``) with the reference's messages; a file that is no longer the one the ledger opened
    (``expected``) is refused as unsafe.
    """
    try:
        if create:
            create_private_file(path)
        info = os.lstat(path)
    except FileNotFoundError as exc:
        raise StoreUnavailableError(f"secure peer delivery ledger {os.fspath(path)} is missing") from exc
    except PermissionError:
        raise
    except OSError as exc:  # a name no file system takes is bad input; anything else, a store that cannot be used
        if exc.errno == errno.ENAMETOOLONG:
            raise LedgerInputError("path is longer than the file system allows", field="path") from exc
        raise StoreUnavailableError(f"secure peer delivery ledger {os.fspath(path)} cannot be used: "
                                    f"{exc.strerror or exc}") from exc
    if stat.S_ISLNK(info.st_mode):
        raise LedgerPermissionError(_SYMLINK_MESSAGE)
    identity = (info.st_dev, info.st_ino)
    if (
        not stat.S_ISREG(info.st_mode)
        or info.st_nlink != 1
        or info.st_uid != os.getuid()
        or (expected is not None and identity != expected)
    ):
        raise LedgerPermissionError(_UNSAFE_MESSAGE)
    if stat.S_IMODE(info.st_mode) != _PRIVATE_MODE:
        try:
            info = restrict_file(path, _PRIVATE_MODE)
        except OSError as exc:
            raise LedgerPermissionError(_UNSAFE_MESSAGE) from exc
        if (info.st_dev, info.st_ino) != identity or stat.S_IMODE(info.st_mode) != _PRIVATE_MODE:
            raise LedgerPermissionError(_UNSAFE_MESSAGE)
    return identity


def _inside_hierarchy(exc: PermissionError) -> LedgerPermissionError:
    """``exc`` as a LedgerPermissionError with the same text, errno and file names (a refused ledger folder)."""
    refusal = LedgerPermissionError(str(exc))  # (its constructor is BaseException's: the text as it is)
    for name in ("errno", "strerror", "filename", "filename2"):
        value = getattr(exc, name)
        if value is not None:  # (an attribute set, even to None, changes how OSError prints)
            setattr(refusal, name, value)
    return refusal


def prepare_ledger_file(
    path: str | os.PathLike[str], *, prepare_directory: Callable[[Path], Any] = ensure_private_directory
) -> FileIdentity:
    """Make the ledger's files private once, before the first connection; return the file's identity.

    The directory becomes ``0700`` through ``prepare_directory`` (a shared one is refused: its PermissionError
    becomes a :class:`~hostedrooms.errors.LedgerPermissionError` with the same text), the file is created
    ``0600`` or checked (and its mode repaired) by :func:`secure_ledger_file`, and existing
    ``-wal``/``-shm``/``-journal`` files become ``0600`` (a symlink, or one that is not ours, is refused as
    unsafe). SQLite gives the sidecars it creates later the database file's mode. Nothing here opens a
    descriptor that could release a SQLite lock.
    """
    file = Path(path)
    try:
        prepare_directory(file.parent)
    except PermissionError as exc:
        if type(exc) is not PermissionError:  # already ours, or a caller's own class (a patched preparer's)
            raise
        raise _inside_hierarchy(exc) from exc
    identity = secure_ledger_file(file, create=True)
    for suffix in SQLITE_SIDECARS:
        try:
            restrict_file(os.fspath(path) + suffix, _PRIVATE_MODE)
        except FileNotFoundError:
            continue
        except OSError as exc:
            raise LedgerPermissionError(_UNSAFE_MESSAGE) from exc
    return identity


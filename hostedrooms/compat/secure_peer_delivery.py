"""Drop-in replacement for the reference ``secure_peer_delivery`` module.

Switch with one import change (``from hostedrooms.compat.secure_peer_delivery import
SecurePeerDeliveryLedger``). ``SecurePeerDeliveryLedger(path)`` takes a filesystem path like the reference (an
owner-private SQLite file: the parent directory is made ``0700`` (a shared one is refused), the file is created
``0600`` before the first connection, and its path is checked with ``os.lstat`` before every transaction); a
SQLAlchemy URL string or an Engine works too (PostgreSQL: no file checks).
``MAX_NONTERMINAL_DELIVERIES`` below is read at call time, so lowering it on this module takes effect.

As in the reference, the ledger's clock is this module's ``time.time()`` and its folder is prepared by this
module's ``ensure_private_directory``, both looked up at call time: replacing ``secure_peer_delivery.time`` or
``secure_peer_delivery.ensure_private_directory`` (a test suite's monkeypatch) takes effect. ``os`` is the
standard module (the owner checks call ``os.getuid()`` at call time); ``canonical_json`` keeps the reference's
contract (UTF-8 bytes).
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path
from typing import Any

from sqlalchemy import URL, Engine

from .. import migrate
from ..backends import backend_named
from ..db import create_engine, parse_url, reject_async
from ..ledger import (
    DELIVERY_STATES,
    TERMINAL_DELIVERY_STATES,
    DeliveryLedger,
    ensure_private_directory,
    prepare_ledger_file,
)
from ..limits import Limits, LimitValues
from ..validation import canonical_json_bytes as canonical_json
from ._engine import engine_for

__all__ = [
    "DELIVERY_STATES",
    "MAX_NONTERMINAL_DELIVERIES",
    "TERMINAL_DELIVERY_STATES",
    "SecurePeerDeliveryLedger",
    "canonical_json",
    "ensure_private_directory",
]

MAX_NONTERMINAL_DELIVERIES = 2_048


def _ledger_file(target: Any) -> Path | None:
    """The SQLite file a target names, as given (absolute, symlinks NOT resolved), or None."""
    if isinstance(target, Engine):
        return None  # an Engine's file is guarded by DeliveryLedger itself
    if isinstance(target, URL) or "://" in os.fspath(target):
        url = target if isinstance(target, URL) else parse_url(os.fspath(target))
        backend = backend_named(url.get_backend_name())  # None: unsupported, refused by engine_for below
        file = backend.file_path(url) if backend is not None else None
        if file is None:
            return None
    else:
        file = Path(os.fspath(target))
    return Path(os.path.abspath(file.expanduser()))


class SecurePeerDeliveryLedger(DeliveryLedger):
    """Owner-private, crash-safe mapping from a relay envelope to one turn (the reference's API)."""

    def __init__(self, path: Path | str | URL | Engine) -> None:
        reject_async(path)
        file = _ledger_file(path)
        self._prepared: Path | None = None
        if file is None:
            engine, owned = engine_for(path), False
        else:
            # Private directory, 0600 file and sidecars first, so SQLite never creates the ledger with the umask's
            # mode nor opens a sidecar that is not ours.
            prepare_ledger_file(file, prepare_directory=self._prepare_directory)
            engine, owned = create_engine(file), True
            try:
                if not migrate.is_at_head(engine):
                    migrate.upgrade(engine)
            except BaseException:
                engine.dispose()
                raise
        self._owns_engine = owned
        try:
            super().__init__(engine, path=file, clock=_clock, limits=_limits)
        except BaseException:
            self.close()
            raise
        self.path: Path | None = file
        if isinstance(path, (str, Path)) and "://" not in str(path):
            self.path = Path(path)  # as given, like the reference

    def _prepare_directory(self, directory: Path) -> None:
        # This module's global, read at call time; once per ledger, as the reference calls it once.
        if self._prepared != directory:
            ensure_private_directory(directory)
            self._prepared = directory


def _limits() -> Limits:
    """The limits of one call: this module's MAX_NONTERMINAL_DELIVERIES read now (so lowering it takes effect),
    every other limit from :mod:`hostedrooms.limits`."""
    return LimitValues.read(sys.modules[__name__])


def _clock() -> float:
    """This module's ``time.time()``, read at call time (callers and test suites replace ``time``)."""
    return float(time.time())

"""hostedrooms: the durable state layer for gateway-hosted multi-agent Group Chat rooms.

One database (a SQLite file by default, or PostgreSQL) holds rooms and their append-only event logs with
authority fencing, peer routing state, replicas, and the secure-peer delivery ledger.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from ._version import __version__ as __version__
from .db import create_engine
from .errors import (
    AuthorityConflictError,
    AuthoritySupersededError,
    CapacityExceededError,
    DemotionStaleError,
    EventConflictError,
    HostedRoomError,
    InvalidInputError,
    LedgerCapacityError,
    LedgerInputError,
    LedgerPermissionError,
    LedgerStateError,
    MisuseError,
    ReplicaCapacityError,
    ReplicaEpochRegressionError,
    ReplicaError,
    ReplicaGapError,
    RoomConflictError,
    RoomHistoryExpiredError,
    RoomNotFoundError,
    RoomProbeUnavailableError,
    SchemaMissingError,
    StorageError,
    StoreAuthenticationError,
    StoreConfigurationError,
    StoreHostNotFoundError,
    StoreIntegrityError,
    StoreLineageError,
    StoreMissingError,
    StoreReadOnlyError,
    StoreUnavailableError,
)
from .uow import UnitOfWork

if TYPE_CHECKING:
    from .integrity import Violation, verify

# The library logs, and prints nothing unless the application routes its records (hostedrooms.logs).
logging.getLogger(__name__).addHandler(logging.NullHandler())

__all__ = [
    "AuthorityConflictError",
    "AuthoritySupersededError",
    "CapacityExceededError",
    "DemotionStaleError",
    "EventConflictError",
    "HostedRoomError",
    "InvalidInputError",
    "LedgerCapacityError",
    "LedgerInputError",
    "LedgerPermissionError",
    "LedgerStateError",
    "MisuseError",
    "ReplicaCapacityError",
    "ReplicaEpochRegressionError",
    "ReplicaError",
    "ReplicaGapError",
    "RoomConflictError",
    "RoomHistoryExpiredError",
    "RoomNotFoundError",
    "RoomProbeUnavailableError",
    "SchemaMissingError",
    "StorageError",
    "StoreAuthenticationError",
    "StoreConfigurationError",
    "StoreHostNotFoundError",
    "StoreIntegrityError",
    "StoreLineageError",
    "StoreMissingError",
    "StoreReadOnlyError",
    "StoreUnavailableError",
    "UnitOfWork",
    "Violation",
    "__version__",
    "create_engine",
    "verify",
]


def __getattr__(name: str) -> Any:
    # integrity reads the live models: importing it on first use keeps ``import hostedrooms.errors`` (the one
    # hostedrooms module the frozen migration scripts import) free of hostedrooms.models.
    if name in ("Violation", "verify"):
        from . import integrity

        return getattr(integrity, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

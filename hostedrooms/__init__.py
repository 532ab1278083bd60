"""hostedrooms: the durable state layer for gateway-hosted multi-agent Group Chat rooms.

One database (a SQLite file by default, or PostgreSQL) holds rooms and their append-only event logs with
authority fencing, peer routing state, replicas, and the secure-peer delivery ledger.
"""

from __future__ import annotations

from .db import create_engine
from .errors import (
    AuthorityConflictError,
    AuthoritySupersededError,
    EventConflictError,
    HostedRoomError,
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
    StoreMissingError,
    StoreUnavailableError,
)
from .integrity import Violation, verify
from .uow import UnitOfWork

__version__ = "0.1.0"

__all__ = [
    "AuthorityConflictError",
    "AuthoritySupersededError",
    "EventConflictError",
    "HostedRoomError",
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
    "StoreMissingError",
    "StoreUnavailableError",
    "UnitOfWork",
    "Violation",
    "__version__",
    "create_engine",
    "verify",
]

"""Every advisory lock key hostedrooms takes, the retired ones included: one table, so no new key reuses one.

A key serialises the transactions that take it (PostgreSQL ``pg_advisory_xact_lock``; on SQLite ``BEGIN IMMEDIATE``
already serialises every writer, and the backend takes no key). Keys are per database, so the backend scopes each
one to the engine's namespace (its schema) before taking it; the ``public`` schema takes the key as written here,
which is what earlier versions took (:func:`hostedrooms.backends.scoped_key`).

A retired key is never taken again and never reused: an older gateway running beside a newer one may still take
it. This module imports nothing of hostedrooms, so every layer may read its keys.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

__all__ = [
    "LOCK_KEYS",
    "MIGRATION_LOCK_KEY",
    "PEER_LINKS_LOCK_KEY",
    "PEER_RESERVATIONS_LOCK_KEY",
    "PREPARE_LOCK_KEY",
    "REPLICA_CREATION_LOCK_KEY",
    "ROOM_CREATION_LOCK_KEY",
    "LockKey",
]


def _table_key(table: str) -> int:
    """The key of a lock named after a table: the first 8 bytes of sha256("hostedrooms:<table>"), signed."""
    return int.from_bytes(hashlib.sha256(f"hostedrooms:{table}".encode()).digest()[:8], "big", signed=True)


@dataclass(frozen=True, slots=True)
class LockKey:
    """One advisory key: its 64-bit value, what it serialises, and whether it is retired (never taken again)."""

    name: str
    value: int
    reason: str
    retired: bool = False


#: Schema migrations ("hosted" + 1): one upgrade at a time per namespace.
MIGRATION_LOCK_KEY = 0x686F737465640001
#: Room creation ("hosted" + 3): the active-room cap is exact and a concurrent create of one id replays.
ROOM_CREATION_LOCK_KEY = 0x686F737465640003
#: Replica creation ("hosted" + 4): the replica cap (MAX_REPLICA_ROOMS) is exact.
REPLICA_CREATION_LOCK_KEY = 0x686F737465640004
#: The ledger's prepare ("ledger" + 1): its read, sweep, capacity count and insert run one at a time.
PREPARE_LOCK_KEY = 0x6C65646765720001
#: Peer links: the link cap counts every stored link.
PEER_LINKS_LOCK_KEY = _table_key("hosted_room_links")
#: Peer reservations: the reservation rules read other rows of the table.
PEER_RESERVATIONS_LOCK_KEY = _table_key("hosted_room_peer_reservations")

#: Every key, live and retired, by name.
LOCK_KEYS: dict[str, LockKey] = {key.name: key for key in (
    LockKey("migration", MIGRATION_LOCK_KEY, "serialises schema migrations (hostedrooms upgrade)"),
    LockKey("gateway_budget", 0x686F737465640002,
            "the gateway byte budget's, before the budget became rows of its own (hosted_room_budget)", retired=True),
    LockKey("room_creation", ROOM_CREATION_LOCK_KEY, "makes the active-room cap exact; concurrent creates replay"),
    LockKey("replica_creation", REPLICA_CREATION_LOCK_KEY, "makes the replica cap exact"),
    LockKey("ledger_prepare", PREPARE_LOCK_KEY, "serialises the ledger's prepare (read, sweep, count, insert)"),
    LockKey("peer_links", PEER_LINKS_LOCK_KEY, "the link cap counts every stored link"),
    LockKey("peer_reservations", PEER_RESERVATIONS_LOCK_KEY, "reservation rules read other reservations"),
)}

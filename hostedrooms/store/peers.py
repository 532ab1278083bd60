"""The peer routing store: every statement of room links, revoked grant scopes, peer reservations, remote-run
receipts and the ownership probes, with the advisory keys that serialise them.

:mod:`hostedrooms.peers` holds the rules (validation, the link cap, which reservation outranks which, the receipts'
conflicts, secrets) and reaches this store from its unit of work as ``uow.peers``; a probe, which runs outside any
unit of work on its own hook-free connection, builds one with :class:`PeerStore` itself. Each method is one
statement (or one lock) on the store's connection, in the caller's transaction.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from sqlalchemy import (
    ColumnElement,
    Connection,
    RowMapping,
    Select,
    Table,
    delete,
    exists,
    func,
    inspect,
    select,
    update,
)

from .. import models
from ..advisory_keys import PEER_LINKS_LOCK_KEY, PEER_RESERVATIONS_LOCK_KEY
from ..backends import Backend

__all__ = [
    "LINK_COLUMNS",
    "LINK_KEY",
    "PEER_LINKS_LOCK_KEY",
    "PEER_RESERVATIONS_LOCK_KEY",
    "REMOTE_RUN_COLUMNS",
    "PeerStore",
]


#: The columns of a room link record, in the reference's order, and the two that identify one.
LINK_COLUMNS = (
    "room_id", "member_id", "target_url", "target_profile", "grant", "catalog_json", "cancellation_scope_id",
    "trace_id", "transport_security", "status", "updated_at")
LINK_KEY = ("room_id", "member_id")
#: The caller-supplied columns of a remote-run receipt: the 9-column identity, then the run it is bound to.
REMOTE_RUN_COLUMNS = (*models.REMOTE_RUN_IDENTITY_COLUMNS, "run_id", "session_id")

_links = models.links
_grants = models.revoked_grants
_reservations = models.peer_reservations
_receipts = models.remote_runs
_RESERVATION_KEY = ["room_id", "member_id", "target_profile"]


def _live_reservations(room_id: str, target_profile: str, now: float) -> list[ColumnElement[bool]]:
    """A room/profile's reservations that are unexpired at ``now`` and not revoked."""
    table = _reservations
    return [table.c.room_id == room_id, table.c.target_profile == target_profile, table.c.expires_at > now,
            table.c.revoked_at.is_(None)]


def _matching(table: Table, values: Mapping[str, Any]) -> list[ColumnElement[bool]]:
    return [table.c[column] == value for column, value in values.items()]


class PeerStore:
    """The peer routing tables' statements on ``connection`` (a unit of work's: ``uow.peers``)."""

    __slots__ = ("backend", "connection")

    def __init__(self, backend: Backend, connection: Connection) -> None:
        self.backend = backend
        self.connection = connection

    def _exists(self, stmt: Select[Any]) -> bool:
        return self.connection.execute(stmt.limit(1)).first() is not None

    # -- room links

    def lock_links(self) -> None:
        """Serialise link writes until the transaction ends (the cap counts every stored link)."""
        self.backend.advisory_lock(self.connection, PEER_LINKS_LOCK_KEY)

    def restrict_to_owner(self) -> None:
        """Make the store's files owner-only (SQLite ``0600``; nothing for a server). Raises ``OSError``."""
        self.backend.restrict_to_owner(self.connection)

    def links(self) -> Sequence[RowMapping]:
        """Every link record (LINK_COLUMNS) by room and member, in code-point order."""
        bytewise = self.backend.bytewise
        stmt = select(*(_links.c[column] for column in LINK_COLUMNS)).order_by(
            bytewise(_links.c.room_id), bytewise(_links.c.member_id))
        return self.connection.execute(stmt).mappings().all()

    def link_exists(self, values: Mapping[str, Any]) -> bool:
        """Whether the link of ``values``' (room_id, member_id) is stored."""
        key = [_links.c[column] == values[column] for column in LINK_KEY]
        return bool(self.connection.execute(select(exists().where(*key))).scalar_one())

    def link_count(self) -> int:
        """How many links are stored."""
        return int(self.connection.execute(select(func.count()).select_from(_links)).scalar_one())

    def upsert_link(self, values: Mapping[str, Any]) -> None:
        """Insert a link record (every LINK_COLUMNS value), or replace every field of the stored one."""
        stmt = self.backend.insert(_links).values(**values)
        replaced = {column: stmt.excluded[column] for column in LINK_COLUMNS if column not in LINK_KEY}
        self.connection.execute(stmt.on_conflict_do_update(index_elements=list(LINK_KEY), set_=replaced))

    def set_link_status(self, room_id: str, member_id: str, status: str, now: float) -> bool:
        """Set one link's status and ``updated_at``; False when there is no such link."""
        stmt = (update(_links).where(_links.c.room_id == room_id, _links.c.member_id == member_id)
                .values(status=status, updated_at=now))
        return bool(self.connection.execute(stmt).rowcount == 1)

    def delete_links(self, room_id: str) -> int:
        """Delete a room's links; return how many."""
        return int(self.connection.execute(delete(_links).where(_links.c.room_id == room_id)).rowcount)

    # -- revoked grant scopes

    def lock_reservations(self) -> None:
        """Serialise reservation and revocation writes until the transaction ends."""
        self.backend.advisory_lock(self.connection, PEER_RESERVATIONS_LOCK_KEY)

    def drop_expired_grant_fences(self, now: float) -> None:
        """Delete the revocation fences that expired by ``now``."""
        self.connection.execute(delete(_grants).where(_grants.c.expires_at <= now))

    def raise_grant_fence(self, scope_key: str, expires_at: float, revoked_before: float) -> None:
        """Store a scope's fence, or move the stored one's ``expires_at`` and ``revoked_before`` up (never down)."""
        stmt = self.backend.insert(_grants).values(
            scope_key=scope_key, expires_at=expires_at, revoked_before=revoked_before)
        greatest = self.backend.greatest
        self.connection.execute(stmt.on_conflict_do_update(index_elements=["scope_key"], set_={
            "expires_at": greatest(_grants.c.expires_at, stmt.excluded.expires_at),
            "revoked_before": greatest(_grants.c.revoked_before, stmt.excluded.revoked_before)}))

    def grant_fence(self, scope_key: str, now: float) -> Any:
        """The ``revoked_before`` of the scope's fence still live at ``now``, or None."""
        stmt = select(_grants.c.revoked_before).where(_grants.c.scope_key == scope_key, _grants.c.expires_at > now)
        return self.connection.execute(stmt).scalar_one_or_none()

    # -- peer reservations

    def revoke_scope_reservations(self, scope: Mapping[str, str], epoch: int, now: float) -> None:
        """Revoke the reservations matching ``scope``'s columns at ``epoch``."""
        self.connection.execute(update(_reservations).where(
            *_matching(_reservations, scope),
            _reservations.c.authority_epoch == epoch).values(revoked_at=now, updated_at=now))

    def drop_expired_reservations(self, now: float) -> None:
        """Delete the reservations that expired by ``now``."""
        self.connection.execute(delete(_reservations).where(_reservations.c.expires_at <= now))

    def live_reservation_holders(self, room_id: str, target_profile: str, now: float) -> Sequence[Any]:
        """``(authority_gateway_id, authority_epoch)`` of the room/profile's live reservations."""
        table = _reservations
        return self.connection.execute(select(table.c.authority_gateway_id, table.c.authority_epoch).where(
            *_live_reservations(room_id, target_profile, now))).all()

    def revoke_older_reservations(self, room_id: str, target_profile: str, epoch: int, now: float) -> None:
        """Revoke the room/profile's unrevoked reservations at epochs below ``epoch``."""
        table = _reservations
        self.connection.execute(update(table).where(
            table.c.room_id == room_id, table.c.target_profile == target_profile, table.c.authority_epoch < epoch,
            table.c.revoked_at.is_(None)).values(revoked_at=now, updated_at=now))

    def reservation_holder(self, room_id: str, member_id: str, target_profile: str) -> Any:
        """``(authority_gateway_id, authority_epoch)`` of one member's reservation (revoked or not), or None."""
        table = _reservations
        return self.connection.execute(select(table.c.authority_gateway_id, table.c.authority_epoch).where(
            table.c.room_id == room_id, table.c.member_id == member_id,
            table.c.target_profile == target_profile)).first()

    def upsert_reservation(self, values: Mapping[str, Any], expires_at: float, now: float) -> None:
        """Store a claim's reservation live: insert it, or take the claim's authority, keep the later expiry and
        clear ``revoked_at``."""
        table = _reservations
        stmt = self.backend.insert(table).values(
            **values, expires_at=expires_at, revoked_at=None, created_at=now, updated_at=now)
        self.connection.execute(stmt.on_conflict_do_update(index_elements=_RESERVATION_KEY, set_={
            "authority_gateway_id": stmt.excluded.authority_gateway_id,
            "authority_epoch": stmt.excluded.authority_epoch,
            "expires_at": self.backend.greatest(table.c.expires_at, stmt.excluded.expires_at),
            "revoked_at": None,
            "updated_at": stmt.excluded.updated_at}))

    def reservation_is_live(self, room_id: str, target_profile: str, now: float) -> bool:
        """Whether a live reservation of the room/profile exists."""
        return self._exists(select(1).where(*_live_reservations(room_id, target_profile, now)))

    def live_reservation_matches(self, values: Mapping[str, Any], now: float) -> bool:
        """Whether a live reservation has exactly ``values``' columns."""
        table = _reservations
        return self._exists(select(1).where(
            *_matching(table, values), table.c.expires_at > now, table.c.revoked_at.is_(None)))

    # -- remote-run receipts

    def insert_receipt(self, values: Mapping[str, Any], now: float) -> bool:
        """Insert a receipt (REMOTE_RUN_COLUMNS); False, changing nothing, when its identity is stored."""
        stmt = self.backend.insert(_receipts).values(**values, created_at=now, updated_at=now)
        # SQLAlchemy keeps an INSERT's rowcount only when asked (psycopg's would otherwise read -1: never inserted).
        inserted = self.connection.execute(stmt.on_conflict_do_nothing().execution_options(preserve_rowcount=True))
        return bool(inserted.rowcount == 1)

    def locked_receipt(self, identity: Mapping[str, Any]) -> tuple[Any, ...]:
        """The stored REMOTE_RUN_COLUMNS of the receipt ``identity`` (it must exist), locked until the end."""
        stmt = select(*(_receipts.c[column] for column in REMOTE_RUN_COLUMNS)).where(*_matching(_receipts, identity))
        return tuple(self.connection.execute(self.backend.for_update(stmt)).one())

    def touch_receipt(self, identity: Mapping[str, Any], now: float) -> None:
        """Move the receipt ``identity``'s ``updated_at`` to ``now``."""
        self.connection.execute(update(_receipts).where(*_matching(_receipts, identity)).values(updated_at=now))

    def receipts(self, filters: Mapping[str, str]) -> Sequence[RowMapping]:
        """The receipts whose columns equal ``filters``, by ``created_at``, ``task_id`` (code points) and
        ``execution_generation``."""
        stmt = select(_receipts).where(*_matching(_receipts, filters)).order_by(
            _receipts.c.created_at, self.backend.bytewise(_receipts.c.task_id), _receipts.c.execution_generation)
        return self.connection.execute(stmt).mappings().all()

    def receipt(self, identity: Mapping[str, Any]) -> RowMapping | None:
        """The receipt ``identity``, or None."""
        return self.connection.execute(select(_receipts).where(*_matching(_receipts, identity))).mappings().first()

    # -- probes (on a probe's own connection; a missing table answers False)

    def _probe(self, table: Table, stmt: Select[Any]) -> bool:
        if not inspect(self.connection).has_table(table.name):
            return False
        return self._exists(stmt)

    def probe_live_room(self, room_id: str) -> bool:
        """Whether the live (not disbanded) room ``room_id`` is stored here."""
        rooms = models.rooms
        return self._probe(rooms, select(1).where(rooms.c.room_id == room_id, rooms.c.disbanded_at.is_(None)))

    def probe_live_reservation(self, room_id: str, target_profile: str, now: float) -> bool:
        """Whether a live reservation of the room/profile is stored here."""
        return self._probe(_reservations, select(1).where(*_live_reservations(room_id, target_profile, now)))

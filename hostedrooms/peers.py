"""Peer routing state: room links, revoked grant scopes, peer reservations, remote-run receipts, probes.

Every public function takes an :class:`~sqlalchemy.Engine` first (the probes take any database target,
because they must never go through anything that creates or migrates a store), then the reference
implementation's keyword arguments, and returns the reference's shapes. Each call is one transaction. The rules
are here; the statements and the advisory keys that serialise them are the store's (:mod:`hostedrooms.store.peers`,
reached as ``uow.peers``). The non-blocking ownership probes are :mod:`hostedrooms.peer_probes`'s, re-exported here.

Secrets: a room link carries a private ``grant``. No message raised here contains one, a failed link write
never chains the driver error (its bound parameters would hold the grant), and on SQLite the database
file is made owner-only (``0600``) before a link write commits.
"""

from __future__ import annotations

import hashlib
import logging
import math
from collections.abc import Mapping
from typing import Any, cast

from sqlalchemy import Engine

from . import models
from .engines import EngineSource, resolve_engine
from .errors import (
    AuthorityConflictError,
    CapacityExceededError,
    HostedRoomError,
    InvalidInputError,
    RoomConflictError,
    StorageError,
)
from .limits import Limits, in_force
from .peer_probes import (
    PROBE_TIMEOUT_SECONDS,
    actor_id_of,
    forget_probe_engines,
    probe_hosted_room,
    probe_peer_room_reservation,
    room_and_profile,
    room_id_of,
)
from .records import RemoteRunIdentity, RemoteRunReceipt, RemoteRunRecord, RoomLinkRecord
from .store.peers import LINK_COLUMNS, REMOTE_RUN_COLUMNS
from .telemetry import traced
from .uow import UnitOfWork
from .validation import INT64_MAX, clock, compact_json, storable_string, storable_text

__all__ = [
    "GRANT_SCOPE_FIELDS",
    "LINK_COLUMNS",
    "PROBE_TIMEOUT_SECONDS",
    "REMOTE_RUN_COLUMNS",
    "EngineSource",
    "delete_room_link_records",
    "forget_probe_engines",
    "list_remote_run_receipts",
    "list_room_link_records",
    "peer_room_grant_is_current",
    "peer_room_is_reserved",
    "probe_hosted_room",
    "probe_peer_room_reservation",
    "remote_run_receipt",
    "reserve_peer_room",
    "revoke_room_grant_scope",
    "room_grant_is_revoked",
    "room_grant_scope_key",
    "update_room_link_status",
    "upsert_remote_run_receipt",
    "upsert_room_link_record",
]


#: The seven claim fields whose values identify one revocable grant scope.
GRANT_SCOPE_FIELDS = (
    "room_id", "home_install_id", "authority_gateway_id", "authority_epoch", "member_id", "target_install_id",
    "target_profile")

_RECEIPT_INT_COLUMNS = frozenset({"authority_epoch", "execution_generation"})

def _resolve(engine: EngineSource) -> Engine:
    return resolve_engine(engine)


# --- argument validation (pure) ----------------------------------------------------------------------


def _mapping(value: Any, label: str) -> Mapping[str, Any]:
    if not isinstance(value, Mapping):
        raise InvalidInputError(f"{label} must be a mapping", field=label)
    return value


def _required(record: Mapping[str, Any], key: str, label: str) -> Any:
    # Name the key, never the record: a link record holds a grant.
    if key not in record:
        raise InvalidInputError(f"{label} is missing {key}", field=key)
    return record[key]


def _text(value: Any, label: str) -> str:
    """A string both backends can store and compare: no NUL character, no lone surrogate. The message never
    quotes the value (it may be a grant), and no encoding error is chained."""
    return storable_string(value, error=InvalidInputError, label=label)


def _seconds(value: Any, label: str) -> float:
    """A timestamp argument: anything ``float()`` accepts (the reference's leniency) except NaN."""
    try:
        seconds = float(value)
    except (TypeError, ValueError, OverflowError) as exc:
        raise InvalidInputError(f"{label} must be a number", field=label) from exc
    if math.isnan(seconds):
        raise InvalidInputError(f"{label} must be a number", field=label)
    return seconds


def _lenient_epoch(claims: Mapping[str, Any]) -> int:
    """``int(claims.get("authority_epoch") or 0)``: the reference accepts ``"3"``, ``3.9`` and ``True``."""
    try:
        epoch = int(claims.get("authority_epoch") or 0)
    except (TypeError, ValueError, OverflowError) as exc:
        raise InvalidInputError("authority_epoch must be a positive integer", field="authority_epoch") from exc
    if not -INT64_MAX - 1 <= epoch <= INT64_MAX:  # both backends store 64-bit integers
        raise InvalidInputError("authority_epoch must be a positive integer", field="authority_epoch")
    return epoch


def _claim_values(claims: Mapping[str, Any], keys: tuple[str, ...]) -> dict[str, str]:
    """``str(value or "")`` of each key (the reference's reading), refused when that text could not be stored
    or compared by both backends, or when ``str()`` itself fails (an int beyond Python's digit limit)."""
    values: dict[str, str] = {}
    for key in keys:
        try:
            text = str(claims.get(key) or "")
        except ValueError:
            text = None
        if text is None or not storable_text(text):
            raise InvalidInputError("room grant scope is invalid", field=key)
        values[key] = text
    return values


def room_grant_scope_key(claims: Mapping[str, Any]) -> str:
    """The stable, non-secret key of one room/home/target/profile grant scope.

    It is the SHA-256 of the compact JSON of the seven :data:`GRANT_SCOPE_FIELDS`, each taken as
    ``str(value or "")``; a missing or empty field raises ``InvalidInputError("room grant scope is incomplete")``
    (a :class:`~hostedrooms.errors.HostedRoomError`) naming the first such field.

    :param claims: the grant's claims.
    :returns: the scope key (64 hexadecimal digits).
    :raises InvalidInputError: ``claims`` is no mapping, or a scope field is missing, empty or not storable.
    """
    fields = _claim_values(_mapping(claims, "claims"), GRANT_SCOPE_FIELDS)
    missing = [key for key, value in fields.items() if not value]
    if missing:
        raise InvalidInputError("room grant scope is incomplete", field=missing[0])
    return hashlib.sha256(compact_json(fields).encode("utf-8")).hexdigest()


def _link_values(record: Any) -> dict[str, Any]:
    record = _mapping(record, "room link record")
    values: dict[str, Any] = {}
    for column in LINK_COLUMNS:
        value = _required(record, column, "room link record")
        if column == "updated_at":
            values[column] = _seconds(value, "room link updated_at")
        else:
            values[column] = _text(value, f"room link {column}")
    return values


def _max_links(value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or math.isnan(value):
        raise InvalidInputError("max_links must be a number", field="max_links")
    return value


def _receipt_identity(record: Any) -> dict[str, Any]:
    return _receipt_values(record, models.REMOTE_RUN_IDENTITY_COLUMNS)


def _receipt_values(record: Any, columns: tuple[str, ...]) -> dict[str, Any]:
    record = _mapping(record, "remote run record")
    values: dict[str, Any] = {}
    for column in columns:
        value = _required(record, column, "remote run record")
        if column in _RECEIPT_INT_COLUMNS:
            # Both backends store 64-bit integers: a larger value is refused here, not by the driver.
            if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= INT64_MAX:
                raise InvalidInputError(f"remote run {column} must be a positive integer", field=column)
        else:
            _text(value, f"remote run {column}")
        values[column] = value
    return values


def _reservation_claims(claims: Any, limits: Limits) -> dict[str, Any]:
    """Validated (room_id, member_id, target_profile, authority_gateway_id, authority_epoch), stripped."""
    claims = _mapping(claims, "claims")
    values: dict[str, Any] = {"room_id": room_id_of(claims.get("room_id"), limits)}
    for key in ("member_id", "target_profile", "authority_gateway_id"):
        values[key] = actor_id_of(claims.get(key), key, limits)
    values["authority_epoch"] = _lenient_epoch(claims)
    if values["authority_epoch"] < 1:
        raise InvalidInputError("authority_epoch must be positive", field="authority_epoch")
    return values


# --- secrets -----------------------------------------------------------------------------------------


def _without_grant(exc: HostedRoomError, grant: str) -> HostedRoomError:
    """``exc`` itself when it cannot hold ``grant``; else a copy with the grant masked and no driver chain
    (the chained SQLAlchemy error keeps the statement's bound parameters, the grant among them)."""
    if exc.__cause__ is None and exc.__context__ is None and grant not in str(exc):
        return exc
    copy = type(exc)(str(exc).replace(grant, "***") if grant else str(exc))
    copy.__dict__.update(exc.__dict__)  # field, limit: what the class says besides the message
    return copy


class _MutedLogger(logging.Logger):
    """A logger that is never enabled, whatever the logging configuration says."""

    def isEnabledFor(self, level: int) -> bool:
        return False


_MUTED = _MutedLogger("hostedrooms.peers.grants")


def _secret_engine(engine: Engine) -> Engine:
    """``engine`` for statements that bind or return grants: bound parameters are hidden from error
    messages, and SQLAlchemy's statement/row logging is off (it would print grants at INFO/DEBUG).
    The copy shares the engine's pool, dialect and event hooks."""
    secret = engine.execution_options()
    secret.hide_parameters = True
    secret.logger = _MUTED
    return secret


def _restrict_to_owner(uow: UnitOfWork) -> None:
    """Before a link write commits: the store's files become owner-only (SQLite), or the write fails."""
    try:
        uow.peers.restrict_to_owner()
    except OSError as exc:
        raise StorageError(f"cannot make the room store owner-only: {exc.strerror or exc}") from exc


# --- room links --------------------------------------------------------------------------------------


@traced("list_room_link_records")
def list_room_link_records(engine: EngineSource) -> list[RoomLinkRecord]:
    """Every private room link record (grant included) ordered by room and member; never logged.

    :param engine: the store (an Engine, or a factory returning one).
    :returns: the records, each with its ``grant``.
    :raises StorageError: the database failed (the message never holds a grant).
    """
    with UnitOfWork(_secret_engine(_resolve(engine)), write=False) as uow:
        rows = uow.peers.links()
    return [cast(RoomLinkRecord, dict(row)) for row in rows]


@traced("upsert_room_link_record")
def upsert_room_link_record(engine: EngineSource, *, record: RoomLinkRecord, max_links: int) -> None:
    """Atomically insert or replace every field of one private room link record.

    ``max_links`` caps the number of stored links; it counts only a new (room_id, member_id), so replacing
    an existing record always succeeds (``CapacityExceededError("too many stored room links")`` otherwise, its
    ``limit`` ``"max_links"``).

    :param engine: the store (an Engine, or a factory returning one).
    :param record: the link: every column of a room link, its private ``grant`` included.
    :param max_links: the most links the store may hold (a number; ``math.inf`` for no cap).
    :raises InvalidInputError: ``record`` or ``max_links`` is invalid.
    :raises CapacityExceededError: a new link would exceed ``max_links``.
    :raises StorageError: the database failed; no message or chained error holds the grant.
    """
    values = _link_values(record)
    cap = _max_links(max_links)
    failure: HostedRoomError | None = None
    try:
        _write_link(engine, values, cap)
    except HostedRoomError as exc:
        failure = _without_grant(exc, values["grant"])
    if failure is not None:
        raise failure  # outside the except block, so the original does not ride along as __context__


def _write_link(engine: EngineSource, values: dict[str, Any], cap: float) -> None:
    with UnitOfWork(_secret_engine(_resolve(engine))) as uow:
        store = uow.peers
        store.lock_links()
        if not store.link_exists(values) and store.link_count() >= cap:
            raise CapacityExceededError("too many stored room links", limit="max_links")
        store.upsert_link(values)
        _restrict_to_owner(uow)
        uow.commit()


@traced("update_room_link_status")
def update_room_link_status(
    engine: EngineSource, *, room_id: str, member_id: str, status: str, now: float | None = None
) -> bool:
    """Persist a non-secret route health classification; False when no such link exists.

    :param engine: the store (an Engine, or a factory returning one).
    :param room_id: the link's room.
    :param member_id: the link's member.
    :param status: the classification to store.
    :param now: the update time, in Unix seconds (default: the wall clock).
    :returns: whether a link was updated.
    :raises InvalidInputError: a text argument cannot be stored (not a string, a NUL, a lone surrogate).
    """
    room_id = _text(room_id, "room_id")
    member_id = _text(member_id, "member_id")
    status = _text(status, "status")
    timestamp = clock(now)
    with UnitOfWork(_resolve(engine)) as uow:
        changed = uow.peers.set_link_status(room_id, member_id, status, timestamp)
        _restrict_to_owner(uow)
        uow.commit()
    return changed


@traced("delete_room_link_records")
def delete_room_link_records(engine: EngineSource, *, room_id: str) -> int:
    """Delete a room's persisted peer routes (after their target grants are revoked); return how many.

    :param engine: the store (an Engine, or a factory returning one).
    :param room_id: the room whose links go.
    :returns: the number of links deleted.
    :raises InvalidInputError: ``room_id`` is not storable text.
    """
    room_id = _text(room_id, "room_id")
    with UnitOfWork(_resolve(engine)) as uow:
        deleted = uow.peers.delete_links(room_id)
        uow.commit()
    return deleted


# --- grant revocation --------------------------------------------------------------------------------


@traced("revoke_room_grant_scope")
def revoke_room_grant_scope(
    engine: EngineSource, *, claims: Mapping[str, Any], expires_at: float, now: float | None = None
) -> None:
    """Revoke every grant of one exact scope issued at or before ``now``, until ``expires_at``.

    The fence's ``expires_at`` and ``revoked_before`` only grow. In the same transaction the scope's peer
    reservation (same room, member, profile, gateway and epoch) is revoked. An ``expires_at`` that is not in
    the future does nothing at all (the reference's behaviour).

    :param engine: the store (an Engine, or a factory returning one).
    :param claims: the grant's claims: the seven :data:`GRANT_SCOPE_FIELDS`.
    :param expires_at: until when the fence holds, in Unix seconds.
    :param now: the revocation time (default: the wall clock); grants issued at or before it are revoked.
    :raises InvalidInputError: the scope is incomplete or invalid, or a time is not a number.
    """
    scope_key = room_grant_scope_key(claims)
    timestamp = clock(now)
    expiry = _seconds(expires_at, "expires_at")
    if expiry <= timestamp:
        return
    scope = _claim_values(claims, ("room_id", "member_id", "target_profile", "authority_gateway_id"))
    epoch = _lenient_epoch(claims)
    with UnitOfWork(_resolve(engine)) as uow:
        store = uow.peers
        store.lock_reservations()
        store.drop_expired_grant_fences(timestamp)
        store.raise_grant_fence(scope_key, expiry, timestamp)
        store.revoke_scope_reservations(scope, epoch, timestamp)
        uow.commit()


@traced("room_grant_is_revoked")
def room_grant_is_revoked(engine: EngineSource, *, claims: Mapping[str, Any], now: float | None = None) -> bool:
    """Whether a grant (``claims["issued_at"]``, default 0) was issued at or before its scope's live fence.

    :param engine: the store (an Engine, or a factory returning one).
    :param claims: the grant's claims: the seven :data:`GRANT_SCOPE_FIELDS`, and ``issued_at``.
    :param now: the time the fence must be live at (default: the wall clock).
    :returns: whether the grant is revoked.
    :raises InvalidInputError: the scope is incomplete or invalid, or ``issued_at`` is not a number.
    """
    timestamp = clock(now)
    scope_key = room_grant_scope_key(claims)
    issued_at = _seconds(claims.get("issued_at") or 0, "issued_at")
    with UnitOfWork(_resolve(engine), write=False) as uow:
        revoked_before = uow.peers.grant_fence(scope_key, timestamp)
    return revoked_before is not None and issued_at <= float(revoked_before)


# --- peer reservations -------------------------------------------------------------------------------


def _outranks(row_gateway: str, row_epoch: int, gateway_id: str, epoch: int) -> bool:
    """A newer epoch, or the same epoch under another gateway, outranks the claim (gateway_id, epoch)."""
    return int(row_epoch) > epoch or (int(row_epoch) == epoch and str(row_gateway) != gateway_id)


@traced("reserve_peer_room")
def reserve_peer_room(
    engine: EngineSource, *, claims: Mapping[str, Any], expires_at: float, now: float | None = None,
    limits: Limits | None = None,
) -> None:
    """Fence direct Desktop prompts for a room/profile before the first peer run is admitted.

    Expired reservations are dropped first. A live reservation of the room/profile at a newer epoch, or at
    the same epoch under another gateway, wins (``AuthorityConflictError``); live reservations at lower
    epochs are revoked. The claim's own row is upserted keeping the later expiry and clearing ``revoked_at``.
    ``limits`` (default :mod:`hostedrooms.limits`) supplies the identifier length limits.

    :param engine: the store (an Engine, or a factory returning one).
    :param claims: ``room_id``, ``member_id``, ``target_profile``, ``authority_gateway_id``, ``authority_epoch``.
    :param expires_at: until when the reservation holds, in Unix seconds (after ``now``).
    :param now: the reservation time (default: the wall clock).
    :param limits: the identifier length limits (default: :mod:`hostedrooms.limits`).
    :raises InvalidInputError: a claim is invalid, or ``expires_at`` is not in the future.
    :raises AuthorityConflictError: a newer (or same-epoch, other-gateway) reservation holds the room/profile.
    """
    timestamp = clock(now)
    expiry = _seconds(expires_at, "expires_at")
    if expiry <= timestamp:
        raise InvalidInputError("peer room reservation must expire in the future", field="expires_at")
    values = _reservation_claims(claims, in_force(limits))
    room_id, target_profile = values["room_id"], values["target_profile"]
    gateway_id, epoch = values["authority_gateway_id"], values["authority_epoch"]
    conflict = AuthorityConflictError("peer room reservation authority changed")
    with UnitOfWork(_resolve(engine)) as uow:
        store = uow.peers
        store.lock_reservations()
        store.drop_expired_reservations(timestamp)
        live = store.live_reservation_holders(room_id, target_profile, timestamp)
        if any(_outranks(row[0], row[1], gateway_id, epoch) for row in live):
            raise conflict
        store.revoke_older_reservations(room_id, target_profile, epoch, timestamp)
        # The claim's own row counts even when revoked: a revoked newer-epoch row still wins.
        own = store.reservation_holder(room_id, values["member_id"], target_profile)
        if own is not None and _outranks(own[0], own[1], gateway_id, epoch):
            raise conflict
        store.upsert_reservation(values, expiry, timestamp)
        uow.commit()


@traced("peer_room_is_reserved")
def peer_room_is_reserved(
    engine: EngineSource, *, room_id: str, target_profile: str, now: float | None = None, limits: Limits | None = None
) -> bool:
    """Whether a live (unexpired, unrevoked) reservation of the room/profile fences Desktop prompts.

    :param engine: the store (an Engine, or a factory returning one).
    :param room_id: the room.
    :param target_profile: the target profile.
    :param now: the time the reservation must be live at (default: the wall clock).
    :param limits: the identifier length limits (default: :mod:`hostedrooms.limits`).
    :returns: whether such a reservation exists.
    :raises InvalidInputError: ``room_id`` or ``target_profile`` is invalid.
    """
    room_id, target_profile = room_and_profile(room_id, target_profile, in_force(limits))
    timestamp = clock(now)
    with UnitOfWork(_resolve(engine), write=False) as uow:
        return uow.peers.reservation_is_live(room_id, target_profile, timestamp)


@traced("peer_room_grant_is_current")
def peer_room_grant_is_current(
    engine: EngineSource, *, claims: Mapping[str, Any], now: float | None = None, limits: Limits | None = None
) -> bool:
    """Whether a grant's claims match the target's current live reservation exactly.

    :param engine: the store (an Engine, or a factory returning one).
    :param claims: ``room_id``, ``member_id``, ``target_profile``, ``authority_gateway_id``, ``authority_epoch``.
    :param now: the time the reservation must be live at (default: the wall clock).
    :param limits: the identifier length limits (default: :mod:`hostedrooms.limits`).
    :returns: whether a live, unrevoked reservation holds exactly these claims.
    :raises InvalidInputError: a claim is invalid.
    """
    timestamp = clock(now)
    values = _reservation_claims(claims, in_force(limits))
    with UnitOfWork(_resolve(engine), write=False) as uow:
        return uow.peers.live_reservation_matches(values, timestamp)


# --- remote-run receipts -----------------------------------------------------------------------------


@traced("upsert_remote_run_receipt")
def upsert_remote_run_receipt(engine: EngineSource, *, record: RemoteRunRecord, now: float | None = None) -> None:
    """Durably bind one logical peer task attempt (the 9-column identity) to its run and session.

    The same record again only moves ``updated_at``; a different run or session for the same identity
    raises ``RoomConflictError("remote run receipt conflicts with its logical task")`` (a ``HostedRoomError``).

    :param engine: the store (an Engine, or a factory returning one).
    :param record: the receipt: its 9-column identity, its run and session.
    :param now: the binding time, in Unix seconds (default: the wall clock).
    :raises InvalidInputError: a column of ``record`` is missing or invalid.
    :raises RoomConflictError: the identity is bound to another run or session.
    """
    timestamp = clock(now)
    values = _receipt_values(record, REMOTE_RUN_COLUMNS)
    identity = {column: values[column] for column in models.REMOTE_RUN_IDENTITY_COLUMNS}
    with UnitOfWork(_resolve(engine)) as uow:
        store = uow.peers
        if not store.insert_receipt(values, timestamp):
            if store.locked_receipt(identity) != tuple(values.values()):
                raise RoomConflictError("remote run receipt conflicts with its logical task")
            store.touch_receipt(identity, timestamp)
        uow.commit()


@traced("list_remote_run_receipts")
def list_remote_run_receipts(
    engine: EngineSource, *, room_id: str | None = None, target_profile: str | None = None,
    session_id: str | None = None,
) -> list[RemoteRunReceipt]:
    """Remote-run receipts matching every given filter, in durable task order
    (``created_at``, ``task_id``, ``execution_generation``).

    :param engine: the store (an Engine, or a factory returning one).
    :param room_id: only this room's receipts (None: any room).
    :param target_profile: only this profile's receipts (None: any).
    :param session_id: only this session's receipts (None: any).
    :returns: the matching receipts.
    :raises InvalidInputError: a filter is not storable text.
    """
    candidates = (("room_id", room_id), ("target_profile", target_profile), ("session_id", session_id))
    filters = {column: _text(value, column) for column, value in candidates if value is not None}
    with UnitOfWork(_resolve(engine), write=False) as uow:
        rows = uow.peers.receipts(filters)
    return [cast(RemoteRunReceipt, dict(row)) for row in rows]


@traced("remote_run_receipt")
def remote_run_receipt(engine: EngineSource, *, record: RemoteRunIdentity) -> RemoteRunReceipt | None:
    """The durable receipt of one exact task attempt (its 9-column identity), or None.

    :param engine: the store (an Engine, or a factory returning one).
    :param record: the attempt's 9-column identity.
    :returns: its receipt, or None when none is stored.
    :raises InvalidInputError: a column of ``record`` is missing or invalid.
    """
    identity = _receipt_identity(record)
    with UnitOfWork(_resolve(engine), write=False) as uow:
        row = uow.peers.receipt(identity)
    return cast(RemoteRunReceipt, dict(row)) if row is not None else None

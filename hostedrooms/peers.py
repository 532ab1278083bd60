"""Peer routing state: room links, revoked grant scopes, peer reservations, remote-run receipts, probes.

Every public function takes an :class:`~sqlalchemy.Engine` first (the probes take any database target,
because they must never go through anything that creates or migrates a store), then the reference
implementation's keyword arguments, and returns the reference's shapes. Each call is one transaction.

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

from sqlalchemy import URL, ColumnElement, Engine, Select, delete, exists, func, inspect, select, update
from sqlalchemy import exc as sa_exc

from . import models
from .backends import Pooler, backend_for_url, pooler_of, use_pooler
from .db import Target, engine_schema, resolve_url
from .engines import EngineCache, EngineSource, resolve_engine
from .errors import (
    AuthorityConflictError,
    CapacityExceededError,
    HostedRoomError,
    InvalidInputError,
    RoomConflictError,
    RoomProbeUnavailableError,
    SchemaMissingError,
    StorageError,
)
from .limits import Limits, in_force
from .records import RemoteRunIdentity, RemoteRunReceipt, RemoteRunRecord, RoomLinkRecord
from .telemetry import no_engine, traced
from .uow import UnitOfWork
from .validation import INT64_MAX, clock, compact_json, identifier, storable_string, storable_text

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


#: The columns of a room link record, in the reference's order.
LINK_COLUMNS = (
    "room_id", "member_id", "target_url", "target_profile", "grant", "catalog_json", "cancellation_scope_id",
    "trace_id", "transport_security", "status", "updated_at")
_LINK_KEY = ("room_id", "member_id")

#: The seven claim fields whose values identify one revocable grant scope.
GRANT_SCOPE_FIELDS = (
    "room_id", "home_install_id", "authority_gateway_id", "authority_epoch", "member_id", "target_install_id",
    "target_profile")

_RECEIPT_INT_COLUMNS = frozenset({"authority_epoch", "execution_generation"})
#: The caller-supplied columns of a remote-run receipt: the 9-column identity, then the run it is bound to.
REMOTE_RUN_COLUMNS = (*models.REMOTE_RUN_IDENTITY_COLUMNS, "run_id", "session_id")

#: How long a probe may wait for a lock (or a statement) before it answers "unavailable".
PROBE_TIMEOUT_SECONDS = 0.2

# Advisory keys (PostgreSQL) that serialise the read-then-write units below, as BEGIN IMMEDIATE does on
# SQLite: the link cap counts every stored link, and reservation rules read other rows of the table.
_LINKS_LOCK = int.from_bytes(hashlib.sha256(b"hostedrooms:hosted_room_links").digest()[:8], "big", signed=True)
_RESERVATIONS_LOCK = int.from_bytes(
    hashlib.sha256(b"hostedrooms:hosted_room_peer_reservations").digest()[:8], "big", signed=True)


def _resolve(engine: EngineSource) -> Engine:
    return resolve_engine(engine)


# --- argument validation (pure) ----------------------------------------------------------------------


def _room_id(value: Any, limits: Limits) -> str:
    return identifier(value, error=InvalidInputError, label="room_id", max_chars=limits.MAX_ROOM_ID_CHARS)


def _actor_id(value: Any, label: str, limits: Limits) -> str:
    return identifier(value, error=InvalidInputError, label=label, max_chars=limits.MAX_ACTOR_ID_CHARS)


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


def _room_and_profile(room_id: Any, target_profile: Any, limits: Limits) -> tuple[str, str]:
    """A reservation lookup's validated room id and target profile."""
    return _room_id(room_id, limits), _actor_id(target_profile, "target_profile", limits)


def _reservation_claims(claims: Any, limits: Limits) -> dict[str, Any]:
    """Validated (room_id, member_id, target_profile, authority_gateway_id, authority_epoch), stripped."""
    claims = _mapping(claims, "claims")
    values: dict[str, Any] = {"room_id": _room_id(claims.get("room_id"), limits)}
    for key in ("member_id", "target_profile", "authority_gateway_id"):
        values[key] = _actor_id(claims.get(key), key, limits)
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
        uow.backend.restrict_to_owner(uow.connection)
    except OSError as exc:
        raise StorageError(f"cannot make the room store owner-only: {exc.strerror or exc}") from exc


# --- room links --------------------------------------------------------------------------------------


@traced("list_room_link_records")
def list_room_link_records(engine: EngineSource) -> list[RoomLinkRecord]:
    """Every private room link record (grant included) ordered by room and member; never logged."""
    table = models.links
    with UnitOfWork(_secret_engine(_resolve(engine)), write=False) as uow:
        bytewise = uow.backend.bytewise
        stmt = select(*(table.c[column] for column in LINK_COLUMNS)).order_by(
            bytewise(table.c.room_id), bytewise(table.c.member_id))
        rows = uow.connection.execute(stmt).mappings().all()
    return [cast(RoomLinkRecord, dict(row)) for row in rows]


@traced("upsert_room_link_record")
def upsert_room_link_record(engine: EngineSource, *, record: RoomLinkRecord, max_links: int) -> None:
    """Atomically insert or replace every field of one private room link record.

    ``max_links`` caps the number of stored links; it counts only a new (room_id, member_id), so replacing
    an existing record always succeeds (``CapacityExceededError("too many stored room links")`` otherwise, its
    ``limit`` ``"max_links"``).
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
    table = models.links
    with UnitOfWork(_secret_engine(_resolve(engine))) as uow:
        uow.backend.advisory_lock(uow.connection, _LINKS_LOCK)
        key = [table.c[column] == values[column] for column in _LINK_KEY]
        known = uow.connection.execute(select(exists().where(*key))).scalar_one()
        if not known and uow.connection.execute(select(func.count()).select_from(table)).scalar_one() >= cap:
            raise CapacityExceededError("too many stored room links", limit="max_links")
        stmt = uow.backend.insert(table).values(**values)
        replaced = {column: stmt.excluded[column] for column in LINK_COLUMNS if column not in _LINK_KEY}
        uow.connection.execute(stmt.on_conflict_do_update(index_elements=list(_LINK_KEY), set_=replaced))
        _restrict_to_owner(uow)
        uow.commit()


@traced("update_room_link_status")
def update_room_link_status(
    engine: EngineSource, *, room_id: str, member_id: str, status: str, now: float | None = None
) -> bool:
    """Persist a non-secret route health classification; False when no such link exists."""
    room_id = _text(room_id, "room_id")
    member_id = _text(member_id, "member_id")
    status = _text(status, "status")
    timestamp = clock(now)
    table = models.links
    stmt = (update(table).where(table.c.room_id == room_id, table.c.member_id == member_id)
            .values(status=status, updated_at=timestamp))
    with UnitOfWork(_resolve(engine)) as uow:
        changed = uow.connection.execute(stmt).rowcount == 1
        _restrict_to_owner(uow)
        uow.commit()
    return changed


@traced("delete_room_link_records")
def delete_room_link_records(engine: EngineSource, *, room_id: str) -> int:
    """Delete a room's persisted peer routes (after their target grants are revoked); return how many."""
    room_id = _text(room_id, "room_id")
    with UnitOfWork(_resolve(engine)) as uow:
        deleted = int(uow.connection.execute(delete(models.links).where(models.links.c.room_id == room_id)).rowcount)
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
    """
    scope_key = room_grant_scope_key(claims)
    timestamp = clock(now)
    expiry = _seconds(expires_at, "expires_at")
    if expiry <= timestamp:
        return
    scope = _claim_values(claims, ("room_id", "member_id", "target_profile", "authority_gateway_id"))
    epoch = _lenient_epoch(claims)
    grants, reservations = models.revoked_grants, models.peer_reservations
    with UnitOfWork(_resolve(engine)) as uow:
        uow.backend.advisory_lock(uow.connection, _RESERVATIONS_LOCK)
        uow.connection.execute(delete(grants).where(grants.c.expires_at <= timestamp))
        stmt = uow.backend.insert(grants).values(scope_key=scope_key, expires_at=expiry, revoked_before=timestamp)
        greatest = uow.backend.greatest
        uow.connection.execute(stmt.on_conflict_do_update(index_elements=["scope_key"], set_={
            "expires_at": greatest(grants.c.expires_at, stmt.excluded.expires_at),
            "revoked_before": greatest(grants.c.revoked_before, stmt.excluded.revoked_before)}))
        uow.connection.execute(update(reservations).where(
            *(reservations.c[column] == value for column, value in scope.items()),
            reservations.c.authority_epoch == epoch).values(revoked_at=timestamp, updated_at=timestamp))
        uow.commit()


@traced("room_grant_is_revoked")
def room_grant_is_revoked(engine: EngineSource, *, claims: Mapping[str, Any], now: float | None = None) -> bool:
    """Whether a grant (``claims["issued_at"]``, default 0) was issued at or before its scope's live fence."""
    timestamp = clock(now)
    scope_key = room_grant_scope_key(claims)
    issued_at = _seconds(claims.get("issued_at") or 0, "issued_at")
    grants = models.revoked_grants
    stmt = select(grants.c.revoked_before).where(grants.c.scope_key == scope_key, grants.c.expires_at > timestamp)
    with UnitOfWork(_resolve(engine), write=False) as uow:
        revoked_before = uow.connection.execute(stmt).scalar_one_or_none()
    return revoked_before is not None and issued_at <= float(revoked_before)


# --- peer reservations -------------------------------------------------------------------------------


def _live_reservations(room_id: str, target_profile: str, timestamp: float) -> list[ColumnElement[bool]]:
    table = models.peer_reservations
    return [table.c.room_id == room_id, table.c.target_profile == target_profile, table.c.expires_at > timestamp,
            table.c.revoked_at.is_(None)]


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
    """
    timestamp = clock(now)
    expiry = _seconds(expires_at, "expires_at")
    if expiry <= timestamp:
        raise InvalidInputError("peer room reservation must expire in the future", field="expires_at")
    values = _reservation_claims(claims, in_force(limits))
    room_id, target_profile = values["room_id"], values["target_profile"]
    gateway_id, epoch = values["authority_gateway_id"], values["authority_epoch"]
    table = models.peer_reservations
    conflict = AuthorityConflictError("peer room reservation authority changed")
    with UnitOfWork(_resolve(engine)) as uow:
        uow.backend.advisory_lock(uow.connection, _RESERVATIONS_LOCK)
        uow.connection.execute(delete(table).where(table.c.expires_at <= timestamp))
        live = uow.connection.execute(select(table.c.authority_gateway_id, table.c.authority_epoch).where(
            *_live_reservations(room_id, target_profile, timestamp))).all()
        if any(_outranks(row[0], row[1], gateway_id, epoch) for row in live):
            raise conflict
        uow.connection.execute(update(table).where(
            table.c.room_id == room_id, table.c.target_profile == target_profile, table.c.authority_epoch < epoch,
            table.c.revoked_at.is_(None)).values(revoked_at=timestamp, updated_at=timestamp))
        # The claim's own row counts even when revoked: a revoked newer-epoch row still wins.
        own = uow.connection.execute(select(table.c.authority_gateway_id, table.c.authority_epoch).where(
            table.c.room_id == room_id, table.c.member_id == values["member_id"],
            table.c.target_profile == target_profile)).first()
        if own is not None and _outranks(own[0], own[1], gateway_id, epoch):
            raise conflict
        stmt = uow.backend.insert(table).values(
            **values, expires_at=expiry, revoked_at=None, created_at=timestamp, updated_at=timestamp)
        uow.connection.execute(stmt.on_conflict_do_update(
            index_elements=["room_id", "member_id", "target_profile"], set_={
                "authority_gateway_id": stmt.excluded.authority_gateway_id,
                "authority_epoch": stmt.excluded.authority_epoch,
                "expires_at": uow.backend.greatest(table.c.expires_at, stmt.excluded.expires_at),
                "revoked_at": None,
                "updated_at": stmt.excluded.updated_at}))
        uow.commit()


def _exists(engine: EngineSource, stmt: Select[Any]) -> bool:
    with UnitOfWork(_resolve(engine), write=False) as uow:
        return uow.connection.execute(stmt.limit(1)).first() is not None


@traced("peer_room_is_reserved")
def peer_room_is_reserved(
    engine: EngineSource, *, room_id: str, target_profile: str, now: float | None = None, limits: Limits | None = None
) -> bool:
    """Whether a live (unexpired, unrevoked) reservation of the room/profile fences Desktop prompts."""
    room_id, target_profile = _room_and_profile(room_id, target_profile, in_force(limits))
    timestamp = clock(now)
    return _exists(engine, select(1).where(*_live_reservations(room_id, target_profile, timestamp)))


@traced("peer_room_grant_is_current")
def peer_room_grant_is_current(
    engine: EngineSource, *, claims: Mapping[str, Any], now: float | None = None, limits: Limits | None = None
) -> bool:
    """Whether a grant's claims match the target's current live reservation exactly."""
    timestamp = clock(now)
    values = _reservation_claims(claims, in_force(limits))
    table = models.peer_reservations
    return _exists(engine, select(1).where(
        *(table.c[column] == value for column, value in values.items()),
        table.c.expires_at > timestamp, table.c.revoked_at.is_(None)))


# --- remote-run receipts -----------------------------------------------------------------------------


def _identity_filter(identity: Mapping[str, Any]) -> list[ColumnElement[bool]]:
    return [models.remote_runs.c[column] == value for column, value in identity.items()]


@traced("upsert_remote_run_receipt")
def upsert_remote_run_receipt(engine: EngineSource, *, record: RemoteRunRecord, now: float | None = None) -> None:
    """Durably bind one logical peer task attempt (the 9-column identity) to its run and session.

    The same record again only moves ``updated_at``; a different run or session for the same identity
    raises ``RoomConflictError("remote run receipt conflicts with its logical task")`` (a ``HostedRoomError``).
    """
    timestamp = clock(now)
    values = _receipt_values(record, REMOTE_RUN_COLUMNS)
    identity = {column: values[column] for column in models.REMOTE_RUN_IDENTITY_COLUMNS}
    table = models.remote_runs
    with UnitOfWork(_resolve(engine)) as uow:
        inserted = uow.connection.execute(uow.backend.insert(table).values(
            **values, created_at=timestamp, updated_at=timestamp).on_conflict_do_nothing()).rowcount
        if inserted != 1:
            stored = uow.connection.execute(uow.backend.for_update(
                select(*(table.c[column] for column in REMOTE_RUN_COLUMNS)).where(*_identity_filter(identity)))
            ).one()
            if tuple(stored) != tuple(values.values()):
                raise RoomConflictError("remote run receipt conflicts with its logical task")
            uow.connection.execute(update(table).where(*_identity_filter(identity)).values(updated_at=timestamp))
        uow.commit()


@traced("list_remote_run_receipts")
def list_remote_run_receipts(
    engine: EngineSource, *, room_id: str | None = None, target_profile: str | None = None,
    session_id: str | None = None,
) -> list[RemoteRunReceipt]:
    """Remote-run receipts matching every given filter, in durable task order
    (``created_at``, ``task_id``, ``execution_generation``)."""
    candidates = (("room_id", room_id), ("target_profile", target_profile), ("session_id", session_id))
    filters = {column: _text(value, column) for column, value in candidates if value is not None}
    table = models.remote_runs
    with UnitOfWork(_resolve(engine), write=False) as uow:
        stmt = select(table).where(*(table.c[column] == value for column, value in filters.items())).order_by(
            table.c.created_at, uow.backend.bytewise(table.c.task_id), table.c.execution_generation)
        rows = uow.connection.execute(stmt).mappings().all()
    return [cast(RemoteRunReceipt, dict(row)) for row in rows]


@traced("remote_run_receipt")
def remote_run_receipt(engine: EngineSource, *, record: RemoteRunIdentity) -> RemoteRunReceipt | None:
    """The durable receipt of one exact task attempt (its 9-column identity), or None."""
    identity = _receipt_identity(record)
    with UnitOfWork(_resolve(engine), write=False) as uow:
        row = uow.connection.execute(select(models.remote_runs).where(*_identity_filter(identity))).mappings().first()
    return cast(RemoteRunReceipt, dict(row)) if row is not None else None


# --- non-blocking ownership probes -------------------------------------------------------------------

_probe_engines = EngineCache()


def _probe_url(target: Target) -> tuple[URL, str | None, Pooler | None]:
    """The store a probe reads: its URL, and the ``schema=`` and ``pooler=`` of an Engine built with them."""
    if isinstance(target, Engine):
        return target.url, engine_schema(target), pooler_of(target)
    return resolve_url(target), None, None


def _probe_engine(url: URL, schema: str | None, pooler: Pooler | None = None) -> Engine:
    """A cached, hook-free (but for the schema's search_path, and no server-side prepares behind a transaction
    pooler), never-migrating engine per store (never the compat facade's engine)."""

    def build() -> Engine:
        engine = backend_for_url(url).probe_engine(url, PROBE_TIMEOUT_SECONDS)
        if pooler is not None:
            use_pooler(engine, pooler)
        if schema is not None:
            backend_for_url(url).use_schema(engine, schema)
        return engine

    mode = pooler.mode if pooler is not None else ""
    return _probe_engines.get(
        f"{url.render_as_string(hide_password=False)}#schema={schema or ''}#pooler={mode or ''}", build)


def forget_probe_engines() -> None:
    """Dispose and drop the cached probe engines (tests; forked children)."""
    _probe_engines.clear()


def _probe(target: Target, table_name: str, stmt: Select[Any], unavailable: str) -> bool:
    """Answer ``stmt`` finds a row, without creating, migrating or waiting on the store.

    A missing store or table answers False. Any store failure, including a lock held past
    :data:`PROBE_TIMEOUT_SECONDS`, raises ``RoomProbeUnavailableError(unavailable)``.
    """
    url, schema, pooler = _probe_url(target)
    backend = backend_for_url(url)
    if backend.store_absent(url):
        return False
    try:
        connection = _probe_engine(url, schema, pooler).connect()
    except SchemaMissingError:  # the gateway's schema does not exist: it hosts nothing
        return False
    except sa_exc.SQLAlchemyError as exc:
        if backend.is_missing_store(exc):
            return False
        raise RoomProbeUnavailableError(unavailable) from exc
    try:
        with connection, connection.begin(), backend.probe_timeouts(connection, PROBE_TIMEOUT_SECONDS):
            if not inspect(connection).has_table(table_name):
                return False
            return connection.execute(stmt.limit(1)).first() is not None
    except sa_exc.SQLAlchemyError as exc:
        raise RoomProbeUnavailableError(unavailable) from exc


@traced("probe_hosted_room", engine=no_engine)
def probe_hosted_room(target: Target, *, room_id: str, limits: Limits | None = None) -> bool:
    """Whether this store hosts the live room ``room_id``; never creates, migrates or blocks.

    ``target`` is a SQLite path, a URL or an Engine (only its URL is used). On the synchronous
    prompt-admission path this fails fast under contention with ``RoomProbeUnavailableError``.
    """
    room_id = _room_id(room_id, in_force(limits))
    rooms = models.rooms
    stmt = select(1).where(rooms.c.room_id == room_id, rooms.c.disbanded_at.is_(None))
    return _probe(target, rooms.name, stmt, "hosted room ownership is temporarily unavailable")


@traced("probe_peer_room_reservation", engine=no_engine)
def probe_peer_room_reservation(
    target: Target, *, room_id: str, target_profile: str, now: float | None = None, limits: Limits | None = None
) -> bool:
    """Whether a live peer reservation fences the room/profile; never creates, migrates or blocks."""
    room_id, target_profile = _room_and_profile(room_id, target_profile, in_force(limits))
    timestamp = clock(now)
    stmt = select(1).where(*_live_reservations(room_id, target_profile, timestamp))
    return _probe(target, models.peer_reservations.name, stmt, "peer room ownership is temporarily unavailable")

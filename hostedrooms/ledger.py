"""Secure-peer delivery ledger: a crash-safe state machine from a relay envelope to one local chat turn.

The authoritative exchange lives on the designated Hub; this ledger bridges that remote transaction to one
durable local turn. A delivery is *prepared* (its immutable claim is stored and committed) before it is
acknowledged remotely, so a process that dies between the remote compare-and-swap and local admission
resumes the saved intent on restart (:meth:`DeliveryLedger.recoverable`) instead of losing or re-running it.

Delivery states: ``prepared`` -> ``authorized`` -> ``queued`` -> ``running`` -> ``completed``/``failed``.
Each transition is one guarded ``UPDATE ... WHERE state IN (...)``; a transition that lost its race changes
nothing. Response intents (a reply owed to the Hub) and outbound intents (a request this side sends) are
bound to a SHA-256 digest before they leave, and retried with :func:`retry_delay` backoff.

When the ledger is a SQLite file it is owner-private: its directory is ``0700`` (a shared directory, such as
``/tmp``, is refused, never changed); the file must be a regular ``0600`` file owned by this user with a single
link, and before every transaction its path is checked with ``os.lstat`` to still name that same file (the
reference reconnects, and re-checks, for every operation). The file is never opened for these checks: closing
any descriptor of it would release this process's SQLite locks (see :mod:`hostedrooms.files`). Commits must be
crash-safe (WAL with ``synchronous=FULL``). Timestamps are integer seconds: ``int(clock())``.
"""

from __future__ import annotations

import functools
import hashlib
import logging
import os
import stat
import time
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any, TypeVar, cast

from sqlalchemy import (
    ColumnElement,
    CursorResult,
    Engine,
    RowMapping,
    Select,
    Table,
    bindparam,
    delete,
    func,
    select,
    update,
)

from . import limits
from .db import sqlite_path
from .errors import StorageError, StoreUnavailableError
from .files import SQLITE_SIDECARS, create_private_file, ensure_private_directory, restrict_file
from .models import deliveries, outbound_intents
from .uow import UnitOfWork
from .validation import (
    canonical_json_bytes,
    json_depth_within,
    max_json_depth,
    storable_copy,
    storable_text,
    stored_json,
)

__all__ = [
    "ACTIVE_DELIVERY_STATES",
    "DELIVERY_STATES",
    "NONTERMINAL_DELIVERY_STATES",
    "TERMINAL_DELIVERY_STATES",
    "DeliveryLedger",
    "ensure_private_directory",
    "prepare_ledger_file",
    "retry_delay",
    "secure_ledger_file",
]

DELIVERY_STATES = frozenset({"prepared", "authorized", "queued", "running", "completed", "failed"})
TERMINAL_DELIVERY_STATES = frozenset({"completed", "failed"})
#: States a crash can leave a delivery in; sorted tuples keep the SQL deterministic.
NONTERMINAL_DELIVERY_STATES = ("authorized", "prepared", "queued", "running")
#: Admitted (receipt accepted) states: only these may carry a response intent or be finished successfully.
ACTIVE_DELIVERY_STATES = ("authorized", "queued", "running")

ROLES = frozenset({"host", "client"})
ACTIONS = frozenset({"instruction", "request_reply"})
KINDS = frozenset({"instruction", "request_reply", "response"})
MAX_LEGS = 6
MAX_MESSAGE_CHARS = 100_000
MAX_ERROR_CHARS = 400
MAX_RETRY_BATCH = 50
DEFAULT_RETAIN_SECONDS = 30 * 24 * 60 * 60
RETRY_CEILING_SECONDS = 300
RETRY_EXPONENT_CAP = 8
EXPIRED_ERROR = "secure peer exchange expired"
#: PostgreSQL advisory-lock key ("ledger" + 1) serialising prepare's read, sweep, capacity count and insert.
PREPARE_LOCK_KEY = 0x6C65646765720001
_INT64_MIN, _INT64_MAX = -(2**63), 2**63 - 1

_SYMLINK_MESSAGE = "secure peer delivery ledger must not be a symlink"
_UNSAFE_MESSAGE = "secure peer delivery ledger is unsafe"
_PRIVATE_MODE = 0o600

FileIdentity = tuple[int, int]
Clock = Callable[[], float]
_T = TypeVar("_T")

D = deliveries
OUT = outbound_intents
_log = logging.getLogger("hostedrooms.ledger")


# --- pure helpers ----------------------------------------------------------------------------------------


def retry_delay(attempts: int) -> int:
    """Seconds to wait after the ``attempts``-th failed try: ``min(300, 2 ** min(attempts, 8))``.

    The one backoff schedule of admission, response and outbound retries (2, 4, ... 256 seconds; the
    exponent cap means the 300-second ceiling is never reached, as in the reference).
    """
    exponent: int = min(attempts, RETRY_EXPONENT_CAP)
    return min(RETRY_CEILING_SECONDS, int(2**exponent))


def _integer(value: Any, message: str) -> int:
    """``int(value)`` (the reference's coercion) within 64 bits, else ``ValueError(message)``."""
    try:
        number = int(value)
    except (TypeError, ValueError, OverflowError) as exc:
        raise ValueError(message) from exc
    if not _INT64_MIN <= number <= _INT64_MAX:
        raise ValueError(message)
    return number


def _key(value: Any, label: str) -> str:
    """A lookup identifier: strings only (PostgreSQL would refuse other types in the driver), and only text both
    backends can store and compare (no NUL character, no lone surrogate)."""
    if not isinstance(value, str):
        raise ValueError(f"secure peer ledger {label} must be a string")
    if not storable_text(value):
        raise ValueError(f"secure peer ledger {label} must not contain NUL characters or lone surrogates")
    return value


def _stored_text(value: Any, message: str) -> str:
    """``str(value)`` (the reference's coercion) when both backends can store it, else ``ValueError(message)``
    (also when ``str()`` itself fails, e.g. an int beyond Python's digit limit)."""
    try:
        text = str(value)
    except ValueError:
        text = None
    if text is None or not storable_text(text):
        raise ValueError(message)
    return text


def _optional_key(value: Any, label: str) -> str | None:
    return None if value is None else _key(value, label)


def _limit(value: Any, high: int, message: str) -> int:
    if type(value) is not int or not 1 <= value <= high:
        raise ValueError(message)
    return value


def _error_text(error: Any) -> str:
    return _recorded_text(error)[:MAX_ERROR_CHARS]


def _recorded_text(error: Any) -> str:
    """A caller's error message as stored: ``str(error)`` with NUL and lone surrogates backslash-escaped.

    It is a diagnostic the caller cannot always control (an exception's text), so it is recorded, never refused.
    """
    try:
        text = str(error)
    except ValueError:
        text = f"<unprintable {type(error).__name__}>"
    return storable_copy(text)


def _result_hash(result_text: Any) -> str | None:
    """SHA-256 of a delivery's result text (only the hash is stored), None for no text."""
    if not result_text:
        return None
    try:
        if isinstance(result_text, str):
            return hashlib.sha256(result_text.encode("utf-8")).hexdigest()
    except UnicodeEncodeError:  # a lone surrogate
        pass
    raise ValueError("secure peer delivery result is invalid")


def _digest(value: Any) -> str:
    return hashlib.sha256(canonical_json_bytes(value)).hexdigest()


def _optional_text(value: Any, message: str) -> str | None:
    return _stored_text(value, message) if value is not None else None


def _valid_message(body: Any) -> bool:
    return (
        isinstance(body, dict)
        and set(body) == {"message"}
        and isinstance(body["message"], str)
        and bool(body["message"].strip())
        and len(body["message"]) <= MAX_MESSAGE_CHARS
    )


_REQUIRED_CLAIM_FIELDS = (
    "envelope_id", "request_id", "connection_id", "lease_token", "team_id",
    "source_server_identity", "source_route_id", "source_route_revision",
    "target_server_identity", "target_route_id", "target_route_revision", "target_chat_id", "exchange_id",
)


def delivery_claim(
    envelope: Any, *, transport_role: Any, connection_id: Any, lease_token: Any, target_chat_id: Any
) -> tuple[dict[str, Any], str]:
    """Validate an envelope and return its exact claim plus the claim digest.

    The digest covers everything but ``lease_token``: the token belongs to one delivery *attempt*, and a
    crash past the lease deadline legitimately redelivers the same envelope with a new token.
    """
    if not isinstance(transport_role, str) or transport_role not in ROLES:  # unhashable junk: ValueError too
        raise ValueError("secure peer delivery role is invalid")
    if not isinstance(envelope, Mapping):
        raise ValueError("secure peer delivery envelope is invalid")

    identity = "secure peer delivery identity is invalid"

    def text(name: str) -> str:
        return _stored_text(envelope.get(name) or "", identity)

    action, kind = text("action"), text("kind")
    if action not in ACTIONS:
        raise ValueError("secure peer delivery action is invalid")
    if kind not in KINDS:
        raise ValueError("secure peer delivery kind is invalid")
    body = envelope.get("body")
    if not _valid_message(body):
        raise ValueError("secure peer delivery body is invalid")
    legs = "secure peer delivery leg budget is invalid"
    parent_leg = envelope.get("parent_leg")
    claim: dict[str, Any] = {
        "envelope_id": text("envelope_id"),
        "request_id": text("request_id"),
        "transport_role": transport_role,
        "connection_id": _stored_text(connection_id, identity),
        "lease_token": _stored_text(lease_token, identity),
        "team_id": text("team_id"),
        "source_peer_id": _optional_text(envelope.get("source_peer_id"), identity),
        "source_server_identity": text("source_server_identity"),
        "source_route_id": text("source_route_id"),
        "source_route_revision": text("source_route_revision"),
        "target_peer_id": _optional_text(envelope.get("target_peer_id"), identity),
        "target_server_identity": text("target_server_identity"),
        "target_route_id": text("target_route_id"),
        "target_route_revision": text("target_route_revision"),
        "target_chat_id": _stored_text(target_chat_id, identity),
        "action": action,
        "kind": kind,
        "exchange_id": text("exchange_id"),
        "parent_envelope_id": _optional_text(envelope.get("parent_envelope_id"), identity),
        "parent_leg": _integer(parent_leg, legs) if parent_leg is not None else None,
        "used_legs": _integer(envelope.get("used_legs") or 0, legs),
        "max_legs": _integer(envelope.get("max_legs") or 0, legs),
        "expires_at": _integer(envelope.get("expires_at") or 0, "secure peer delivery expiry is invalid"),
        "body": body,
    }
    if any(not claim[name] for name in _REQUIRED_CLAIM_FIELDS):
        raise ValueError("secure peer delivery identity is incomplete")
    if claim["max_legs"] != MAX_LEGS or not 1 <= claim["used_legs"] <= MAX_LEGS:
        raise ValueError(legs)
    immutable = {name: value for name, value in claim.items() if name != "lease_token"}
    try:
        return claim, _digest(immutable)
    except UnicodeEncodeError:  # a lone surrogate in the message (the only text not checked above)
        pass
    raise ValueError("secure peer delivery body is invalid")


def outbound_claim(
    *, request_id: Any, source_session_id: Any, source_run_id: Any, snapshot: Any, body: Any, action: Any,
    expires_at: Any,
) -> tuple[dict[str, Any], str, str]:
    """Validate an outbound intent; return its row values, its digest and its canonical snapshot text."""
    invalid = "secure peer outbound intent is invalid"
    if not isinstance(snapshot, Mapping):  # the reference reads snapshot.get() first (AttributeError)
        raise ValueError(invalid)
    route = {name: _stored_text(snapshot.get(name) or "", invalid) for name in
             ("connection_id", "source_route_id", "source_route_revision")}
    if (
        not all(isinstance(value, str) and value and storable_text(value)
                for value in (request_id, source_session_id, source_run_id, body))
        or not all(route.values())
        or str(snapshot.get("source_chat_id") or "") != source_session_id
        or str(snapshot.get("action") or "") != action
        or action not in ACTIONS
        or not isinstance(body, str)
        or not body.strip()
        or len(body) > MAX_MESSAGE_CHARS
    ):
        raise ValueError(invalid)
    exact = {
        "request_id": request_id,
        "source_session_id": source_session_id,
        "source_run_id": source_run_id,
        "snapshot": dict(snapshot),
        "body": body,
        "action": action,
        "expires_at": _integer(expires_at, invalid),
    }
    try:
        digest = _digest(exact)
        snapshot_text = canonical_json_bytes(exact["snapshot"]).decode("utf-8")
    except (TypeError, ValueError, RecursionError) as exc:
        raise ValueError(invalid) from exc
    if not json_depth_within(snapshot_text, max_json_depth()):
        raise ValueError(invalid)
    values = {key: value for key, value in exact.items() if key != "snapshot"}
    return {**values, **route}, digest, snapshot_text


def _response_text(response: Any) -> str:
    try:
        text = canonical_json_bytes(dict(response)).decode("utf-8")
    except (TypeError, ValueError, RecursionError) as exc:
        raise ValueError("secure peer outbound result is invalid") from exc
    if not json_depth_within(text, max_json_depth()):
        raise ValueError("secure peer outbound result is invalid")
    return text


# --- owner-private files ---------------------------------------------------------------------------------


def secure_ledger_file(
    path: str | os.PathLike[str], *, create: bool = False, expected: FileIdentity | None = None
) -> FileIdentity:
    """Refuse the ledger file unless it is a private regular file; return its (device, inode) identity.

    With ``create`` a missing file is created ``0600`` (``O_EXCL``, never through a symlink). The file is then
    examined with ``os.lstat`` only (never followed, never opened: closing a descriptor of it would release
    this process's SQLite locks, see :mod:`hostedrooms.files`); a mode other than ``0600`` is repaired without
    following links, like the reference does on every connect. Refusals are ``PermissionError`` with the
    reference's messages; a file that is no longer the one the ledger opened (``expected``) is refused as unsafe.
    """
    try:
        if create:
            create_private_file(path)
        info = os.lstat(path)
    except FileNotFoundError as exc:
        raise StoreUnavailableError(f"secure peer delivery ledger {os.fspath(path)} is missing") from exc
    if stat.S_ISLNK(info.st_mode):
        raise PermissionError(_SYMLINK_MESSAGE)
    identity = (info.st_dev, info.st_ino)
    if (
        not stat.S_ISREG(info.st_mode)
        or info.st_nlink != 1
        or info.st_uid != os.getuid()
        or (expected is not None and identity != expected)
    ):
        raise PermissionError(_UNSAFE_MESSAGE)
    if stat.S_IMODE(info.st_mode) != _PRIVATE_MODE:
        try:
            info = restrict_file(path, _PRIVATE_MODE)
        except OSError as exc:
            raise PermissionError(_UNSAFE_MESSAGE) from exc
        if (info.st_dev, info.st_ino) != identity or stat.S_IMODE(info.st_mode) != _PRIVATE_MODE:
            raise PermissionError(_UNSAFE_MESSAGE)
    return identity


def prepare_ledger_file(
    path: str | os.PathLike[str], *, prepare_directory: Callable[[Path], Any] = ensure_private_directory
) -> FileIdentity:
    """Make the ledger's files private once, before the first connection; return the file's identity.

    The directory becomes ``0700`` through ``prepare_directory`` (a shared one is refused), the file is created
    ``0600`` or checked (and its mode repaired) by :func:`secure_ledger_file`, and existing
    ``-wal``/``-shm``/``-journal`` files become ``0600`` (a symlink, or one that is not ours, is refused as
    unsafe). SQLite gives the sidecars it creates later the database file's mode. Nothing here opens a
    descriptor that could release a SQLite lock.
    """
    file = Path(path)
    prepare_directory(file.parent)
    identity = secure_ledger_file(file, create=True)
    for suffix in SQLITE_SIDECARS:
        try:
            restrict_file(os.fspath(path) + suffix, _PRIVATE_MODE)
        except FileNotFoundError:
            continue
        except OSError as exc:
            raise PermissionError(_UNSAFE_MESSAGE) from exc
    return identity


# --- rows ------------------------------------------------------------------------------------------------


# Stored JSON that cannot be decoded (written by the reference or by hand: not JSON, or nested deeper than the
# interpreter decodes) is a StorageError naming the row for a call about that row (nothing it would write is
# committed); a listing skips the row with a warning instead, so one bad row never blocks a queue. Skipped rows
# stay stored until they expire or are finished, and ``verify`` reports them.


def _public_delivery(row: RowMapping | None) -> dict[str, Any] | None:
    if row is None:
        return None
    item = dict(row)
    item["body"] = stored_json(item.pop("body_json"), lambda: f"secure peer delivery {row['envelope_id']!r}")
    return item


def _public_outbound(row: RowMapping | None) -> dict[str, Any] | None:
    if row is None:
        return None

    def where() -> str:
        return f"secure peer outbound intent {row['request_id']!r}"

    item = dict(row)
    item["snapshot"] = stored_json(item.pop("snapshot_json"), where)
    response = item.pop("response_json")
    item["response"] = stored_json(response, where) if response else None
    return item


def _listed(public: Callable[[RowMapping], dict[str, Any] | None], row: RowMapping) -> dict[str, Any] | None:
    """``public(row)``, or None (with a warning) for a row whose stored JSON cannot be decoded."""
    try:
        return public(row)
    except StorageError as exc:
        _log.warning("secure peer ledger listing skipped a row: %s", exc)
        return None


def _public_rows(
    uow: UnitOfWork, statement: Select[Any], public: Callable[[RowMapping], dict[str, Any] | None],
    limit: int | None = None,
) -> list[dict[str, Any]]:
    """The decodable rows of ``statement`` in order, at most ``limit``: rows skipped as undecodable do not count,
    so the next ones are read instead."""
    if limit is None:
        return [item for row in uow.execute(statement).mappings() if (item := _listed(public, row)) is not None]
    found: list[dict[str, Any]] = []
    offset = 0
    while True:
        page = statement.limit(limit) if not offset else statement.limit(limit).offset(offset)
        rows = uow.execute(page).mappings().all()
        for row in rows:
            item = _listed(public, row)
            if item is not None:
                found.append(item)
                if len(found) == limit:
                    return found
        if len(rows) < limit:
            return found
        offset += len(rows)


def _fetch(uow: UnitOfWork, table: Table, key: ColumnElement[bool], *, lock: bool = False) -> RowMapping | None:
    statement = select(table).where(key)
    if lock:
        statement = uow.dialect.for_update(statement)
    return uow.execute(statement).mappings().first()


# Built once: a delivery is read by key several times per transition, and building the statement (cache key
# included) cost more than running it.
_SELECT_DELIVERY = select(D).where(D.c.envelope_id == bindparam("envelope_id"))
_LOCK_DELIVERY: dict[str, Select[Any]] = {}


def _delivery(uow: UnitOfWork, envelope_id: str, *, lock: bool = False) -> RowMapping | None:
    statement = _SELECT_DELIVERY
    if lock:
        locked = _LOCK_DELIVERY.get(uow.dialect.name)
        if locked is None:
            locked = _LOCK_DELIVERY[uow.dialect.name] = uow.dialect.for_update(_SELECT_DELIVERY)
        statement = locked
    return uow.execute(statement, {"envelope_id": envelope_id}).mappings().first()


# prepare(): fail expired prepared rows, count what is in flight, insert (returning the row).
_EXPIRE_PREPARED = (update(D).where(D.c.state == "prepared", D.c.expires_at <= bindparam("now"))
                    .values(state="failed", error=EXPIRED_ERROR, updated_at=bindparam("expired_at")))
_IN_FLIGHT = select(func.count()).select_from(D).where(D.c.state.in_(NONTERMINAL_DELIVERY_STATES))
_INSERT_DELIVERY = D.insert().returning(*D.c)
# bind_owner(): an ownerless authorized delivery gets its owner; a queued one its run.
_BIND_AUTHORIZED = (
    update(D).where(D.c.envelope_id == bindparam("key"), D.c.state == "authorized", D.c.queued_id.is_(None),
                    D.c.run_id.is_(None))
    .values(state=bindparam("set_state"), queued_id=bindparam("set_queued_id"), run_id=bindparam("set_run_id"),
            admission_retry_at=None, admission_last_error=None, updated_at=bindparam("set_updated_at"))
    .returning(*D.c))
_BIND_RUN = (
    update(D).where(D.c.envelope_id == bindparam("key"), D.c.state == "queued",
                    D.c.queued_id == bindparam("bound_queued_id"), D.c.run_id.is_(None))
    .values(state="running", run_id=bindparam("set_run_id"), admission_retry_at=None, admission_last_error=None,
            updated_at=bindparam("set_updated_at"))
    .returning(*D.c))


@functools.cache
def _transition_statement(expected: tuple[str, ...], names: tuple[str, ...]) -> Any:
    """``UPDATE deliveries SET <names>, updated_at WHERE envelope_id = :key AND state IN <expected> RETURNING *``,
    built once per shape (parameters ``key``, ``set_<name>``, ``set_updated_at``)."""
    return (update(D).where(D.c.envelope_id == bindparam("key"), D.c.state.in_(expected))
            .values({name: bindparam(f"set_{name}") for name in (*names, "updated_at")}).returning(*D.c))


def _outbound(uow: UnitOfWork, request_id: str, *, lock: bool = False) -> RowMapping | None:
    return _fetch(uow, OUT, OUT.c.request_id == request_id, lock=lock)


def _changed(uow: UnitOfWork, statement: Any) -> int:
    result = cast("CursorResult[Any]", uow.execute(statement))
    return int(result.rowcount or 0)


def _expire_pending_outbound(uow: UnitOfWork, timestamp: int) -> None:
    uow.execute(
        update(OUT)
        .where(OUT.c.state == "pending", OUT.c.expires_at <= timestamp)
        .values(state="failed", retry_at=None, last_error=EXPIRED_ERROR, updated_at=timestamp)
    )


# --- the service -----------------------------------------------------------------------------------------


class DeliveryLedger:
    """The secure-peer delivery ledger on ``engine`` (SQLite or PostgreSQL, migrated to head).

    ``clock`` returns the current time in seconds (default: ``time.time`` read at call time); ledger
    timestamps are ``int(clock())``. ``path`` is the SQLite file to guard when it differs from the engine's
    own (the seed-compatible facade passes the path it was given, before symlink resolution). Every method
    is one transaction and returns the reference's shapes: a delivery row with ``body`` decoded, an outbound
    row with ``snapshot`` and ``response`` decoded, or None.

    Stored values follow the store's rules (README, "Limits on stored values"): text with a NUL character or a
    lone surrogate is refused with ``ValueError`` (a caller's error text is recorded escaped instead), and
    snapshots and responses nest at most MAX_JSON_DEPTH deep. A row whose stored JSON cannot be decoded (left by
    the reference) is skipped by the listings and raises ``StorageError`` in a call about that row.
    """

    def __init__(
        self, engine: Engine, *, clock: Clock | None = None, path: str | os.PathLike[str] | None = None
    ) -> None:
        self.engine = engine
        self._clock = clock
        guarded = Path(os.path.abspath(path)) if path is not None else sqlite_path(engine)
        self.file: Path | None = guarded
        self._identity: FileIdentity | None = None
        if guarded is not None:
            # Once, before this ledger's first transaction; from then on only the path is examined (os.lstat),
            # never opened: see hostedrooms.files.
            self._identity = prepare_ledger_file(guarded, prepare_directory=self._prepare_directory)
        self._require_crash_safe()

    # -- plumbing

    def _prepare_directory(self, directory: Path) -> None:
        """Make the ledger's folder owner-private (the facade substitutes its module's patchable function)."""
        ensure_private_directory(directory)

    def _capacity(self) -> int:
        """MAX_NONTERMINAL_DELIVERIES, read at call time (the facade reads its own module's value)."""
        return int(limits.MAX_NONTERMINAL_DELIVERIES)

    def _now(self) -> int:
        return int(self._clock() if self._clock is not None else time.time())

    def _timestamp(self, now: Any) -> int:
        return self._now() if now is None else _integer(now, "secure peer ledger timestamp is invalid")

    def _check_file(self) -> None:
        if self.file is not None:
            secure_ledger_file(self.file, expected=self._identity)

    def _write(self, work: Callable[[UnitOfWork], _T]) -> _T:
        """Run ``work`` in one write transaction (committed when it returns) after the file checks."""
        self._check_file()
        with UnitOfWork(self.engine) as uow:
            result = work(uow)
            uow.commit()
            return result

    def _read(self, work: Callable[[UnitOfWork], _T]) -> _T:
        self._check_file()
        with UnitOfWork(self.engine, write=False) as uow:
            return work(uow)

    def _require_crash_safe(self) -> None:
        def check(uow: UnitOfWork) -> bool:
            return uow.dialect.is_crash_safe(uow.connection)

        if not self._read(check):
            raise StorageError("secure peer delivery ledger requires WAL with synchronous=FULL")

    def _order(self, uow: UnitOfWork, *first: Any, table: Table = D) -> list[Any]:
        """``first``, then creation time, then the key in code-point order (as SQLite sorts it)."""
        key = table.c.envelope_id if table is D else table.c.request_id
        return [*first, table.c.created_at, uow.dialect.bytewise(key)]

    def _deliveries_where(self, *conditions: ColumnElement[bool]) -> list[dict[str, Any]]:
        def work(uow: UnitOfWork) -> list[dict[str, Any]]:
            statement = select(D).where(*conditions).order_by(*self._order(uow))
            return _public_rows(uow, statement, _public_delivery)

        return self._read(work)

    def _pending_outbound_where(self, now: Any, *conditions: ColumnElement[bool]) -> list[dict[str, Any]]:
        timestamp = self._timestamp(now)

        def work(uow: UnitOfWork) -> list[dict[str, Any]]:
            _expire_pending_outbound(uow, timestamp)  # expiring intents fail before anyone sees them
            statement = (select(OUT).where(OUT.c.state == "pending", *conditions)
                         .order_by(*self._order(uow, table=OUT)))
            return _public_rows(uow, statement, _public_outbound)

        return self._write(work)

    # -- deliveries

    def prepare(
        self, envelope: Mapping[str, Any], *, transport_role: str, connection_id: str, lease_token: str,
        target_chat_id: str,
    ) -> tuple[dict[str, Any], bool]:
        """Durably record an envelope's claim before it is acknowledged; return ``(row, created)``.

        A known envelope must carry the same claim digest (else ``RuntimeError``); while it is still
        ``prepared`` a new lease token replaces the old one. A new envelope first fails expired prepared
        rows, then is refused with ``RuntimeError`` when MAX_NONTERMINAL_DELIVERIES are in flight.
        """
        claim, digest = delivery_claim(envelope, transport_role=transport_role, connection_id=connection_id,
                                       lease_token=lease_token, target_chat_id=target_chat_id)
        timestamp = self._now()

        def work(uow: UnitOfWork) -> tuple[dict[str, Any], bool]:
            # PostgreSQL: one prepare at a time, so the capacity count cannot be raced (SQLite: BEGIN IMMEDIATE).
            uow.dialect.serialize(uow.connection, PREPARE_LOCK_KEY)
            envelope_id = claim["envelope_id"]
            row = _delivery(uow, envelope_id, lock=True)
            if row is not None:
                return self._known_envelope(uow, row, claim, digest, timestamp), False
            uow.execute(_EXPIRE_PREPARED, {"now": timestamp, "expired_at": timestamp})
            in_flight = uow.execute(_IN_FLIGHT).scalar_one()
            if int(in_flight) >= self._capacity():
                raise RuntimeError("secure peer delivery capacity is full")
            values = {name: value for name, value in claim.items() if name != "body"}
            inserted = uow.execute(_INSERT_DELIVERY, {
                **values, "claim_digest": digest, "body_json": canonical_json_bytes(claim["body"]).decode("utf-8"),
                "state": "prepared", "created_at": timestamp, "updated_at": timestamp}).mappings().first()
            created = _public_delivery(inserted)
            assert created is not None
            return created, True

        return self._write(work)

    @staticmethod
    def _known_envelope(
        uow: UnitOfWork, row: RowMapping, claim: dict[str, Any], digest: str, timestamp: int
    ) -> dict[str, Any]:
        if row["claim_digest"] != digest:
            raise RuntimeError("secure peer envelope identity changed")
        if row["state"] == "prepared" and str(row["lease_token"] or "") != claim["lease_token"]:
            uow.execute(
                update(D).where(D.c.envelope_id == claim["envelope_id"], D.c.state == "prepared",
                                D.c.claim_digest == digest)
                .values(lease_token=claim["lease_token"], updated_at=timestamp)
            )
            row = _delivery(uow, claim["envelope_id"]) or row
        public = _public_delivery(row)
        assert public is not None
        return public

    def get(self, envelope_id: str) -> dict[str, Any] | None:
        """The delivery of ``envelope_id``, or None."""
        key = _key(envelope_id, "envelope_id")
        return self._read(lambda uow: _public_delivery(_delivery(uow, key)))

    def _transition(self, envelope_id: Any, *, expected: Iterable[str], **values: Any) -> dict[str, Any] | None:
        """Guarded state change: the row if it was in ``expected`` (and now changed), else None."""
        key = _key(envelope_id, "envelope_id")
        timestamp = self._now()

        statement = _transition_statement(tuple(sorted(expected)), tuple(sorted(values)))
        params = {"key": key, "set_updated_at": timestamp, **{f"set_{name}": value for name, value in values.items()}}

        def work(uow: UnitOfWork) -> dict[str, Any] | None:
            return _public_delivery(uow.execute(statement, params).mappings().first())

        return self._write(work)

    def authorize(self, envelope_id: str) -> dict[str, Any] | None:
        """``prepared``/``authorized`` -> ``authorized`` (the remote receipt was accepted); else None."""
        return self._transition(envelope_id, expected=("prepared", "authorized"), state="authorized")

    def fail_ownerless_authorized(self, envelope_id: str, *, error: str) -> dict[str, Any] | None:
        """Fail only an ``authorized`` delivery that has no queued/run owner; return the current row."""
        key = _key(envelope_id, "envelope_id")
        text, timestamp = _error_text(error), self._now()

        def work(uow: UnitOfWork) -> dict[str, Any] | None:
            uow.execute(
                update(D).where(D.c.envelope_id == key, D.c.state == "authorized",
                                D.c.queued_id.is_(None), D.c.run_id.is_(None))
                .values(state="failed", error=text, admission_retry_at=None, admission_last_error=None,
                        updated_at=timestamp)
            )
            return _public_delivery(_delivery(uow, key))

        return self._write(work)

    def bind_owner(self, envelope_id: str, *, queued_id: str | None, run_id: str | None) -> dict[str, Any] | None:
        """Bind a queue entry and/or run to an admitted delivery.

        ``authorized`` becomes ``queued`` (queue id only) or ``running`` (with a run id); a ``queued``
        delivery gains its run and becomes ``running``. Repeating the current binding returns the row; any
        other owner, or a missing/terminal/prepared delivery, returns None.
        """
        key = _key(envelope_id, "envelope_id")
        queued, run = _optional_key(queued_id, "queued_id"), _optional_key(run_id, "run_id")
        if queued is None and run is None:
            raise ValueError("secure peer delivery owner is empty")
        timestamp = self._now()

        def work(uow: UnitOfWork) -> dict[str, Any] | None:
            row = _delivery(uow, key, lock=True)
            if row is None:
                return None
            state, owner = row["state"], (row["queued_id"], row["run_id"])
            # The row is locked (PostgreSQL FOR UPDATE; SQLite's write lock): the guarded updates match.
            if state == "authorized":
                row = uow.execute(_BIND_AUTHORIZED, {
                    "key": key, "set_state": "running" if run is not None else "queued", "set_queued_id": queued,
                    "set_run_id": run, "set_updated_at": timestamp}).mappings().first()
            elif state == "queued":
                if owner != (queued, None):  # another queue entry, or a run is already bound
                    return None
                if run is not None:
                    row = uow.execute(_BIND_RUN, {
                        "key": key, "bound_queued_id": row["queued_id"], "set_run_id": run,
                        "set_updated_at": timestamp}).mappings().first()
            elif state != "running" or owner != (queued, run):
                return None
            return _public_delivery(row)

        return self._write(work)

    def defer_admission(self, envelope_id: str, *, error: str) -> dict[str, Any] | None:
        """Schedule another admission try of an ownerless ``authorized`` delivery (backoff); return the row."""
        key = _key(envelope_id, "envelope_id")
        text, timestamp = _error_text(error), self._now()

        def work(uow: UnitOfWork) -> dict[str, Any] | None:
            row = _delivery(uow, key, lock=True)
            if row is None or row["state"] != "authorized" or row["queued_id"] is not None \
                    or row["run_id"] is not None:
                return _public_delivery(row)
            attempts = int(row["admission_attempts"] or 0) + 1
            uow.execute(
                update(D).where(D.c.envelope_id == key, D.c.state == "authorized",
                                D.c.queued_id.is_(None), D.c.run_id.is_(None))
                .values(admission_attempts=attempts, admission_retry_at=timestamp + retry_delay(attempts),
                        admission_last_error=text, updated_at=timestamp)
            )
            return _public_delivery(_delivery(uow, key))

        return self._write(work)

    def pending_admissions(self, *, limit: int = 20, now: int | None = None) -> list[dict[str, Any]]:
        """Ownerless ``authorized`` deliveries whose admission retry is due, soonest first."""
        count = _limit(limit, MAX_RETRY_BATCH, "secure peer admission retry limit is invalid")
        timestamp = self._timestamp(now)
        due = func.coalesce(D.c.admission_retry_at, 0)

        def work(uow: UnitOfWork) -> list[dict[str, Any]]:
            statement = (
                select(D).where(D.c.state == "authorized", D.c.queued_id.is_(None), D.c.run_id.is_(None),
                                due <= timestamp)
                .order_by(*self._order(uow, due))
            )
            return _public_rows(uow, statement, _public_delivery, count)

        return self._read(work)

    def nonterminal_for_chat(self, chat_id: str) -> list[dict[str, Any]]:
        """Every unfinished delivery targeting ``chat_id``, oldest first."""
        key = _key(chat_id, "chat_id")
        return self._deliveries_where(D.c.target_chat_id == key, D.c.state.in_(NONTERMINAL_DELIVERY_STATES))

    def finish(
        self, envelope_id: str, *, succeeded: bool, result_text: str = "", error: str | None = None
    ) -> dict[str, Any] | None:
        """Complete an admitted delivery (storing the result's SHA-256) or fail any unfinished one."""
        result_hash = _result_hash(result_text)
        expected = ACTIVE_DELIVERY_STATES if succeeded else NONTERMINAL_DELIVERY_STATES
        return self._transition(envelope_id, expected=expected, state="completed" if succeeded else "failed",
                                result_hash=result_hash, error=_recorded_text(error) if error is not None else None)

    # -- response intents

    def prepare_response(
        self, envelope_id: str, *, request_id: str, body: str, request_response: bool
    ) -> dict[str, Any] | None:
        """Bind the reply owed for a request delivery to its digest before it is sent (idempotent)."""
        key = _key(envelope_id, "envelope_id")
        if (
            not isinstance(request_id, str)
            or not request_id
            or not storable_text(request_id)
            or not isinstance(body, str)
            or not storable_text(body)
            or not body.strip()
            or len(body) > MAX_MESSAGE_CHARS
            or type(request_response) is not bool
        ):
            raise ValueError("secure peer response intent is invalid")
        digest = _digest({"request_id": request_id, "body": body, "request_response": request_response})
        timestamp = self._now()

        def work(uow: UnitOfWork) -> dict[str, Any] | None:
            row = _delivery(uow, key, lock=True)
            if row is None or row["state"] not in ACTIVE_DELIVERY_STATES or row["kind"] == "instruction":
                return None
            if row["response_request_digest"] is not None:
                if row["response_request_digest"] != digest:
                    raise RuntimeError("secure peer response intent changed")
                return _public_delivery(row)
            uow.execute(
                update(D).where(D.c.envelope_id == key, D.c.response_request_digest.is_(None),
                                D.c.response_committed == 0, D.c.state.in_(ACTIVE_DELIVERY_STATES))
                .values(response_request_id=request_id, response_request_digest=digest, response_body=body,
                        response_request_response=int(request_response), response_retry_at=timestamp,
                        response_attempts=0, response_last_error=None, updated_at=timestamp)
            )
            return _public_delivery(_delivery(uow, key))

        return self._write(work)

    def mark_response_committed(self, envelope_id: str, *, request_id: str | None = None) -> dict[str, Any] | None:
        """Record that the reply (``request_id``, or any when None) reached the Hub; return the row."""
        key = _key(envelope_id, "envelope_id")
        request = _optional_key(request_id, "request_id")
        timestamp = self._now()

        def work(uow: UnitOfWork) -> dict[str, Any] | None:
            conditions = [D.c.envelope_id == key, D.c.state.in_(ACTIVE_DELIVERY_STATES), D.c.response_committed == 0]
            if request is not None:
                conditions.append(D.c.response_request_id == request)
            statement = update(D).where(*conditions).values(
                response_committed=1, response_retry_at=None, response_last_error=None, updated_at=timestamp)
            if _changed(uow, statement) not in (0, 1):
                raise RuntimeError("secure peer response state is ambiguous")
            return _public_delivery(_delivery(uow, key))

        return self._write(work)

    def clear_response_intent(self, envelope_id: str, *, request_id: str) -> dict[str, Any] | None:
        """Drop an uncommitted response intent ``request_id`` (so another may be prepared); return the row."""
        key, request = _key(envelope_id, "envelope_id"), _key(request_id, "request_id")
        timestamp = self._now()

        def work(uow: UnitOfWork) -> dict[str, Any] | None:
            uow.execute(
                update(D).where(D.c.envelope_id == key, D.c.response_request_id == request,
                                D.c.response_committed == 0, D.c.state.in_(ACTIVE_DELIVERY_STATES))
                .values(response_request_id=None, response_request_digest=None, response_body=None,
                        response_request_response=None, response_retry_at=None, response_attempts=0,
                        response_last_error=None, updated_at=timestamp)
            )
            return _public_delivery(_delivery(uow, key))

        return self._write(work)

    def defer_response(self, envelope_id: str, *, request_id: str, error: str) -> dict[str, Any] | None:
        """Persist bounded exponential retry state for one response intent; return the row."""
        key, request = _key(envelope_id, "envelope_id"), _key(request_id, "request_id")
        text, timestamp = _error_text(error), self._now()

        def work(uow: UnitOfWork) -> dict[str, Any] | None:
            row = _delivery(uow, key, lock=True)
            if row is None or row["state"] not in ACTIVE_DELIVERY_STATES or row["response_request_id"] != request \
                    or int(row["response_committed"] or 0) != 0:
                return _public_delivery(row)
            attempts = int(row["response_attempts"] or 0) + 1
            uow.execute(
                update(D).where(D.c.envelope_id == key, D.c.response_request_id == request,
                                D.c.response_committed == 0, D.c.state.in_(ACTIVE_DELIVERY_STATES))
                .values(response_attempts=attempts, response_retry_at=timestamp + retry_delay(attempts),
                        response_last_error=text, updated_at=timestamp)
            )
            return _public_delivery(_delivery(uow, key))

        return self._write(work)

    def pending_responses(self, *, limit: int = 8, now: int | None = None) -> list[dict[str, Any]]:
        """Uncommitted response intents whose retry is due, soonest first (limit up to the capacity)."""
        count = _limit(limit, self._capacity(), "secure peer response retry limit is invalid")
        timestamp = self._timestamp(now)
        due = func.coalesce(D.c.response_retry_at, 0)

        def work(uow: UnitOfWork) -> list[dict[str, Any]]:
            statement = (
                select(D).where(D.c.state.in_(ACTIVE_DELIVERY_STATES), D.c.response_request_id.is_not(None),
                                D.c.response_committed == 0, due <= timestamp)
                .order_by(*self._order(uow, due))
            )
            return _public_rows(uow, statement, _public_delivery, count)

        return self._read(work)

    def recoverable(self) -> list[dict[str, Any]]:
        """Every unfinished delivery (including ``prepared`` ones a crash left behind), oldest first."""
        return self._deliveries_where(D.c.state.in_(NONTERMINAL_DELIVERY_STATES))

    def for_run(self, run_id: str) -> dict[str, Any] | None:
        """The delivery owned by run ``run_id``, or None."""
        key = _key(run_id, "run_id")
        return self._read(lambda uow: _public_delivery(_fetch(uow, D, D.c.run_id == key)))

    def nonterminal_for_connection(self, connection_id: str) -> list[dict[str, Any]]:
        """Every unfinished delivery received over ``connection_id``, oldest first."""
        key = _key(connection_id, "connection_id")
        return self._deliveries_where(D.c.connection_id == key, D.c.state.in_(NONTERMINAL_DELIVERY_STATES))

    # -- outbound intents

    def prepare_outbound(
        self, *, request_id: str, source_session_id: str, source_run_id: str, snapshot: Mapping[str, Any],
        body: str, action: str, expires_at: int,
    ) -> tuple[dict[str, Any], bool]:
        """Bind an outbound request to its digest before it is sent; return ``(row, created)``.

        Replaying the same intent returns the stored row; a different intent under the same ``request_id``
        raises ``RuntimeError``.
        """
        values, digest, snapshot_text = outbound_claim(
            request_id=request_id, source_session_id=source_session_id, source_run_id=source_run_id,
            snapshot=snapshot, body=body, action=action, expires_at=expires_at)
        timestamp = self._now()

        def known(row: RowMapping) -> tuple[dict[str, Any], bool]:
            if row["intent_digest"] != digest:
                raise RuntimeError("secure peer outbound intent changed")
            public = _public_outbound(row)
            assert public is not None
            return public, False

        def work(uow: UnitOfWork) -> tuple[dict[str, Any], bool]:
            row = _outbound(uow, request_id, lock=True)
            if row is not None:
                return known(row)
            # ON CONFLICT DO NOTHING: a concurrent prepare of the same id (PostgreSQL) becomes a replay.
            # (RETURNING tells whether this insert won: psycopg reports no rowcount for it.)
            inserted = uow.execute(uow.dialect.insert(OUT).values(
                **values, intent_digest=digest, snapshot_json=snapshot_text, state="pending",
                retry_at=timestamp, created_at=timestamp, updated_at=timestamp,
            ).on_conflict_do_nothing(index_elements=["request_id"]).returning(OUT.c.request_id)).first()
            row = _outbound(uow, request_id)
            assert row is not None
            if inserted is None:
                return known(row)
            public = _public_outbound(row)
            assert public is not None
            return public, True

        return self._write(work)

    def pending_outbound_for_chat(self, source_session_id: str, *, now: int | None = None) -> list[dict[str, Any]]:
        """Pending outbound intents of one chat, oldest first (expired ones are failed first)."""
        key = _key(source_session_id, "source_session_id")
        return self._pending_outbound_where(now, OUT.c.source_session_id == key)

    def pending_outbound_for_route(
        self, connection_id: str, source_route_id: str, source_route_revision: str, *, now: int | None = None
    ) -> list[dict[str, Any]]:
        """Pending outbound intents of one exact route revision, oldest first (expired ones failed first)."""
        keys = (_key(connection_id, "connection_id"), _key(source_route_id, "source_route_id"),
                _key(source_route_revision, "source_route_revision"))
        return self._pending_outbound_where(
            now, OUT.c.connection_id == keys[0], OUT.c.source_route_id == keys[1],
            OUT.c.source_route_revision == keys[2])

    def pending_outbound_for_connection(self, connection_id: str, *, now: int | None = None) -> list[dict[str, Any]]:
        """Pending outbound intents of one connection, oldest first (expired ones are failed first)."""
        key = _key(connection_id, "connection_id")
        return self._pending_outbound_where(now, OUT.c.connection_id == key)

    def outbound(self, request_id: str) -> dict[str, Any] | None:
        """The outbound intent ``request_id``, or None."""
        key = _key(request_id, "request_id")
        return self._read(lambda uow: _public_outbound(_outbound(uow, key)))

    def commit_outbound(self, request_id: str, response: Mapping[str, Any]) -> dict[str, Any] | None:
        """Store the Hub's response of a pending intent (idempotent; a different response raises)."""
        key = _key(request_id, "request_id")
        text, timestamp = _response_text(response), self._now()

        def work(uow: UnitOfWork) -> dict[str, Any] | None:
            row = _outbound(uow, key, lock=True)
            if row is None:
                return None
            if row["state"] == "committed" and str(row["response_json"] or "") != text:
                raise RuntimeError("secure peer outbound result changed")
            if row["state"] != "pending":
                return _public_outbound(row)
            uow.execute(
                update(OUT).where(OUT.c.request_id == key, OUT.c.state == "pending")
                .values(state="committed", response_json=text, retry_at=None, last_error=None, updated_at=timestamp)
            )
            return _public_outbound(_outbound(uow, key))

        return self._write(work)

    def defer_outbound(self, request_id: str, error: str) -> dict[str, Any] | None:
        """Schedule another send of a pending intent (backoff); return the row."""
        key = _key(request_id, "request_id")
        text, timestamp = _error_text(error), self._now()

        def work(uow: UnitOfWork) -> dict[str, Any] | None:
            row = _outbound(uow, key, lock=True)
            if row is None or row["state"] != "pending":
                return _public_outbound(row)
            attempts = int(row["attempts"] or 0) + 1
            uow.execute(
                update(OUT).where(OUT.c.request_id == key, OUT.c.state == "pending")
                .values(attempts=attempts, retry_at=timestamp + retry_delay(attempts), last_error=text,
                        updated_at=timestamp)
            )
            return _public_outbound(_outbound(uow, key))

        return self._write(work)

    def fail_outbound(self, request_id: str, error: str) -> dict[str, Any] | None:
        """Fail a pending intent; return the current row."""
        key = _key(request_id, "request_id")
        text, timestamp = _error_text(error), self._now()

        def work(uow: UnitOfWork) -> dict[str, Any] | None:
            uow.execute(
                update(OUT).where(OUT.c.request_id == key, OUT.c.state == "pending")
                .values(state="failed", retry_at=None, last_error=text, updated_at=timestamp)
            )
            return _public_outbound(_outbound(uow, key))

        return self._write(work)

    def pending_outbound(self, *, limit: int = 8, now: int | None = None) -> list[dict[str, Any]]:
        """Pending intents whose send is due, soonest first."""
        count = _limit(limit, MAX_RETRY_BATCH, "secure peer outbound retry limit is invalid")
        timestamp = self._timestamp(now)
        due = func.coalesce(OUT.c.retry_at, 0)

        def work(uow: UnitOfWork) -> list[dict[str, Any]]:
            statement = (select(OUT).where(OUT.c.state == "pending", due <= timestamp)
                         .order_by(*self._order(uow, due, table=OUT)))
            return _public_rows(uow, statement, _public_outbound, count)

        return self._read(work)

    def recoverable_outbound(self, *, limit: int = 50) -> list[dict[str, Any]]:
        """Return every nonterminal outbound intent, including future retries (oldest first)."""
        count = _limit(limit, MAX_RETRY_BATCH, "secure peer outbound recovery limit is invalid")

        def work(uow: UnitOfWork) -> list[dict[str, Any]]:
            statement = select(OUT).where(OUT.c.state == "pending").order_by(*self._order(uow, table=OUT))
            return _public_rows(uow, statement, _public_outbound, count)

        return self._read(work)

    # -- retention

    def prune(self, *, retain_seconds: int = DEFAULT_RETAIN_SECONDS) -> int:
        """Delete terminal deliveries and intents untouched for ``retain_seconds``; return how many."""
        if type(retain_seconds) is not int or not 0 <= retain_seconds <= _INT64_MAX:
            raise ValueError("secure peer ledger retention is invalid")
        # Timestamps are 64-bit: a cutoff below the smallest one deletes nothing, as any older cutoff would.
        cutoff = max(_INT64_MIN, self._now() - retain_seconds)

        def work(uow: UnitOfWork) -> int:
            removed = _changed(uow, delete(D).where(D.c.state.in_(sorted(TERMINAL_DELIVERY_STATES)),
                                                    D.c.updated_at < cutoff))
            return removed + _changed(uow, delete(OUT).where(OUT.c.state.in_(("committed", "failed")),
                                                           OUT.c.updated_at < cutoff))

        return self._write(work)

    def close(self) -> None:
        """Release pooled connections when this ledger owns its engine (the facade's SQLite files)."""
        if getattr(self, "_owns_engine", False):
            self.engine.dispose()

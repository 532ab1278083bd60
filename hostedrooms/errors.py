"""The one error hierarchy of hostedrooms, and the one place driver errors are translated.

The class names and bases are the reference implementation's, so callers that catch
``HostedRoomError`` (a ``ValueError``) or check ``exc.reason`` keep working. Storage failures that the
seeds let escape raw (``sqlite3.OperationalError``, ``psycopg`` errors) become :class:`StorageError`
subclasses here, with the driver error chained as ``__cause__``.

Storage failures come in two kinds a caller must tell apart: :class:`StoreUnavailableError` is transient
(retry later: unreachable, locked, full, restarting, a serialization failure), :class:`StoreConfigurationError`
is not (an operator must act: wrong credentials, a missing database or host, a schema never migrated).
They are classified by SQLSTATE on PostgreSQL, by result code on SQLite, and by the driver's message where
it gives nothing else (libpq reports connection-time failures as text only).
"""

from __future__ import annotations

import re
from urllib.parse import quote_plus

from sqlalchemy import exc as sa_exc
from sqlalchemy.engine import URL


class HostedRoomError(ValueError):
    """Base class for invalid or conflicting hosted-room operations."""


class RoomNotFoundError(HostedRoomError):
    """Raised when a room does not exist or has been disbanded."""


class RoomHistoryExpiredError(RoomNotFoundError):
    """Raised when a retired room remains reserved after history compaction."""

    reason = "room_history_expired"


class RoomConflictError(HostedRoomError):
    """Raised when an idempotency key is reused for different room state."""


class RoomProbeUnavailableError(HostedRoomError):
    """Raised when a non-blocking ownership probe cannot read the room store."""


class EventConflictError(HostedRoomError):
    """Raised when an event id is reused with different immutable content."""


class AuthorityConflictError(HostedRoomError):
    """Raised when a stale room authority attempts to mutate hosted state."""

    reason = "authority_conflict"


class AuthoritySupersededError(AuthorityConflictError):
    """Raised when a successful authority claim was later superseded."""


class ReplicaError(HostedRoomError):
    """A replica page or takeover request is invalid."""


class ReplicaGapError(ReplicaError):
    """A page does not start at the replica's next expected sequence."""


class DemotionStaleError(ReplicaError):
    """The room moved on after the proof a demotion (or a fence) was conditioned on: a write committed after the
    proven head, or the authority changed. Nothing was changed; read the room again and prove again."""


class ReplicaEpochRegressionError(ReplicaError):
    """A page or demotion carries an older authority epoch than stored."""


# --- the caller's mistakes, limits and the ledger (#28) --------------------------------------------------------
# Each is a subclass of what the reference raised for the same case, with its exact message: only the class
# tells more. A web service can map them without reading messages (docs/errors.md).


class InvalidInputError(HostedRoomError):
    """An argument is invalid (wrong type, shape, size or range), found before any transaction opened (only a
    ``since_seq`` ahead of a room's log is found reading it): nothing was written. Not retryable as is; fix the
    input. ``field`` names the argument as the message labels it (``"room_id"``, ``"actor.kind"``, ``"payload"``;
    within a batch, the item's field: ``"event_id"``), or is None where no single field is at fault.

    :param message: the message.
    :param field: the argument at fault, or None.
    """

    def __init__(self, message: str, *, field: str | None = None) -> None:
        super().__init__(message)
        self.field = field


class CapacityExceededError(HostedRoomError):
    """A write would exceed a capacity limit of this host (active rooms, a room's events or bytes, the gateway's
    bytes, stored links, in-flight deliveries); nothing was written. ``limit`` names the limit constant of
    :mod:`hostedrooms.limits` (``"MAX_ACTIVE_ROOMS"``, ``"MAX_GATEWAY_EVENT_BYTES"``, ...). Retrying the same call
    succeeds only once room is made (rooms disbanded and pruned, deliveries finished) or the limit is raised.

    :param message: the message.
    :param limit: the name of the limit that is full, or None.
    """

    def __init__(self, message: str, *, limit: str | None = None) -> None:
        super().__init__(message)
        self.limit = limit


class MisuseError(HostedRoomError, TypeError):
    """The API was called the wrong way, a programming error rather than bad data: a synchronous Engine given to
    :mod:`hostedrooms.aio` (or an AsyncEngine to the synchronous API), an option value it does not offer.
    Never retryable; fix the calling code. Also a ``TypeError``."""


class ReplicaCapacityError(ReplicaError, CapacityExceededError):
    """A replica write would exceed a capacity limit (``limit`` names it); see :class:`CapacityExceededError`."""


class LedgerInputError(InvalidInputError):
    """The secure-peer ledger refused an argument (the reference's ``ValueError``, still one); ``field`` names
    it where the reference's message does not. Not retryable as is."""


class LedgerStateError(HostedRoomError, RuntimeError):
    """The secure-peer ledger's stored state refuses the call: a known key carries other content (an envelope's
    identity, an intent or a result changed) or a state is ambiguous (the reference's ``RuntimeError``, still
    one). Not retryable as is: the caller must reconcile."""


class LedgerCapacityError(LedgerStateError, CapacityExceededError):
    """The ledger holds MAX_NONTERMINAL_DELIVERIES unfinished deliveries (a ``RuntimeError`` too). Retry once
    deliveries finish or expire."""


class LedgerPermissionError(HostedRoomError, PermissionError):
    """The ledger's database file or folder is unsafe: a symbolic link, another owner, or group/other access
    (the reference's ``PermissionError``, still one). Not retryable until an operator fixes the files."""


class StorageError(HostedRoomError):
    """The database failed underneath an operation (not the caller's input). Nothing was committed."""


class StoreUnavailableError(StorageError):
    """Transient: the database could not be reached, stayed locked past its timeout, is full, is restarting, or
    aborted the transaction to resolve a conflict (serialization failure, deadlock). Nothing was committed; the
    same call may succeed later."""


class StoreIntegrityError(StorageError):
    """The database refused a write on a constraint: a concurrent writer or a corrupted store."""


class StoreConfigurationError(StorageError):
    """Not transient: the target is misconfigured (or cannot be opened), and retrying cannot help until someone
    fixes it. The subclasses name the usual causes; this class covers the rest (permissions, not a database)."""


class StoreAuthenticationError(StoreConfigurationError):
    """The database server refused the credentials (wrong password, unknown role, no ``pg_hba.conf`` entry)."""


class StoreMissingError(StoreConfigurationError):
    """The named database does not exist (a PostgreSQL database, or a SQLite file opened with ``create=False``)."""


class StoreHostNotFoundError(StoreConfigurationError):
    """The database host name does not resolve (a temporary DNS failure is a :class:`StoreUnavailableError`)."""


class SchemaMissingError(StoreConfigurationError):
    """The database has no hostedrooms schema, or an older one: run ``hostedrooms upgrade``."""


class StoreReadOnlyError(StoreConfigurationError):
    """The server accepts reads only (a hot standby, a read-only transaction default): writes and ``follow()``'s
    ``LISTEN`` fail. Not transient for the caller: the target must be pointed at the primary (a multi-host URL
    with ``target_session_attrs=read-write`` finds it after a failover)."""


class StoreLineageError(StorageError):
    """The store's history is not the one the caller read before: its lineage changed (a standby was promoted, a
    backup restored) and an event the caller had already read is gone or different there (an asynchronous
    standby lacked it, and its seq may hold another event now). Raised to a reader resuming with what it last
    saw (``follow()``'s cursor, its ``last_event``); never retryable as is: what the caller derived from the lost
    events must be reconciled by someone. ``room_id`` and ``seq`` name the event; ``previous`` and ``current``
    are the lineages (either may be None where unknown).

    :param message: the message.
    :param room_id: the room of the event, or None.
    :param seq: the event's seq, or None.
    :param previous: the lineage the event was read under, or None.
    :param current: the store's lineage now, or None.
    """

    def __init__(self, message: str, *, room_id: str | None = None, seq: int | None = None,
                 previous: str | None = None, current: str | None = None) -> None:
        super().__init__(message)
        self.room_id, self.seq, self.previous, self.current = room_id, seq, previous, current


#: How to install or update the schema; every SchemaMissingError says so.
UPGRADE_HINT = "run `hostedrooms upgrade`"


#: Words that make a URL query parameter secret (``?password=``, ``sslpassword``, a token): masked in messages.
_SECRET_PARAMETER_WORDS = ("pass", "pwd", "secret", "token", "key")
_MASK = "***"
_SECRET_QUERY = re.compile(r"([?&;]([^=&;#\s]*)=)([^&;#\s]*)")
#: ``password=...`` and the like in free text (a libpq keyword DSN, an argument echoed back): the value is masked,
#: quoted (libpq's ``'...'`` with backslash escapes) or up to the next blank or separator.
_SECRET_KEYWORD = re.compile(
    r"(?i)\b([\w.-]*(?:pass|pwd|secret|token)[\w.-]*)(\s*=\s*)('(?:[^'\\]|\\.)*'?|\"(?:[^\"\\]|\\.)*\"?|[^\s&;,]*)")
#: Where a URL starts in free text: any ``scheme://``, or a database scheme missing its ``//``.
_SCHEME_MARK = re.compile(
    r"[A-Za-z][A-Za-z0-9+._-]*://|(?i:\b(?:postgres|postgresql|sqlite|mysql|mariadb|oracle|mssql|cockroachdb)"
    r"(?:\+[\w.-]+)?:)")


def _secret_parameter(name: str) -> bool:
    lowered = name.lower()
    return any(word in lowered for word in _SECRET_PARAMETER_WORDS)


def describe_target(url: URL | str) -> str:
    """Render a database target for messages, with any password masked: the ``user:***@`` of a URL and every
    secret query parameter (``?password=***``). A string is masked as text (:func:`mask_url_text`), never parsed
    (a parser that split a raw ``@`` of a password elsewhere would show the rest of it); a plain path is returned
    as it is, a ``password=`` in it (a libpq keyword DSN) masked.

    :param url: a database URL, as a SQLAlchemy URL or as text, or a file path.
    :returns: the target as text, every password masked.
    """
    if isinstance(url, str):
        return mask_url_text(url) if "://" in url else redact(url)
    base = url.set(query={}).render_as_string(hide_password=True)
    pairs = [(name, value) for name, values in url.query.items()
             for value in ((values,) if isinstance(values, str) else values)]
    if url.password is not None and not url.username:  # rendered nowhere else: say it is there, masked
        pairs.append(("password", _MASK))
    if not pairs:
        return base
    return base + "?" + "&".join(
        f"{quote_plus(name)}={_MASK if _secret_parameter(name) else quote_plus(value)}" for name, value in pairs)


def mask_url_text(text: str) -> str:
    """Mask ``user:password@`` and secret query parameters of one URL given as text, parsed or not.

    The user info ends at the LAST ``@`` of the text: a password may hold a raw ``@``, ``/``, ``?`` or ``#``, so
    everything between ``user:`` and that ``@`` is masked (more than the password, never less, when an ``@``
    follows in the path or the query).

    :param text: one URL as text.
    :returns: ``text`` with its user info and secret query parameters masked.
    """
    scheme, sep, rest = text.partition("://")
    if not sep:
        return redact(text)
    return f"{scheme}://{_mask_after_scheme(rest)}"


def _mask_after_scheme(rest: str) -> str:
    at = rest.rfind("@")
    if at >= 0 and ":" in rest[:at]:
        rest = f"{rest[:at].split(':', 1)[0]}:{_MASK}{rest[at:]}"
    masked = _SECRET_QUERY.sub(
        lambda match: match.group(1) + (_MASK if _secret_parameter(match.group(2)) else match.group(3)), rest)
    return _SECRET_KEYWORD.sub(lambda match: match.group(1) + match.group(2) + _MASK, masked)


def redact(text: str) -> str:
    """``text`` (a message, a usage error, a log line) with every password it may quote masked: the user info of
    each ``scheme://`` URL in it (up to the last ``@`` before the next URL or the end of the line, see
    :func:`mask_url_text`), secret query parameters, and ``password=...`` keywords. Text without a secret is
    returned unchanged.

    :param text: any text.
    :returns: ``text`` with every password it quotes masked.
    """
    lines = []
    for line in text.split("\n"):
        marks = list(_SCHEME_MARK.finditer(line))
        if not marks:
            lines.append(_SECRET_KEYWORD.sub(lambda match: match.group(1) + match.group(2) + _MASK, line))
            continue
        parts = [_SECRET_KEYWORD.sub(lambda match: match.group(1) + match.group(2) + _MASK, line[:marks[0].start()])]
        for index, mark in enumerate(marks):
            end = marks[index + 1].start() if index + 1 < len(marks) else len(line)
            parts.append(mark.group(0) + _mask_after_scheme(line[mark.end():end]))
        lines.append("".join(parts))
    return "\n".join(lines)


def _first_line(exc: BaseException) -> str:
    original = getattr(exc, "orig", None) or exc
    text = str(original).strip().splitlines()
    return text[0] if text else type(original).__name__


# --- classification ------------------------------------------------------------------------------------------

# PostgreSQL SQLSTATEs (appendix A of its manual), by class (first two characters) or in full.
_PG_TRANSIENT_CLASSES = frozenset({
    "08",  # connection exception
    "53",  # insufficient resources: disk full, out of memory, too many connections
    "40",  # transaction rollback: serialization failure, deadlock
})
_PG_TRANSIENT = frozenset({
    "55P03",  # lock_not_available (lock_timeout)
    "57014",  # query_canceled (statement_timeout)
    "57P01", "57P02", "57P03",  # admin_shutdown, crash_shutdown, cannot_connect_now (starting or stopping)
    "57P05",  # idle_session_timeout
})
_PG_AUTHENTICATION_CLASSES = frozenset({"28"})  # invalid authorization specification / password
_PG_SCHEMA = frozenset({"42P01", "42703", "3F000"})  # undefined table / column, invalid schema name
_PG_CONFIGURATION = frozenset({"42501"})  # insufficient_privilege
_PG_READ_ONLY = frozenset({"25006"})  # read_only_sql_transaction (a hot standby: writes, LISTEN)

# SQLite primary result codes (the low byte of an extended code).
_SQLITE_BUSY, _SQLITE_LOCKED, _SQLITE_FULL = 5, 6, 13
_SQLITE_PERM, _SQLITE_READONLY, _SQLITE_CANTOPEN, _SQLITE_AUTH, _SQLITE_NOTADB = 3, 8, 14, 23, 26
# Read-only because another connection is recovering the WAL or its shared memory is not ready yet: transient.
_SQLITE_READONLY_TRANSIENT = frozenset({8 | 1 << 8, 8 | 2 << 8, 8 | 5 << 8})  # RECOVERY, CANTLOCK, CANTINIT

# libpq reports connection-time failures without a SQLSTATE: only the (English) server text says why.
_AUTHENTICATION_TEXT = ("password authentication failed", "no password supplied", "no pg_hba.conf entry",
                        "authentication failed", "peer authentication failed")
_HOST_TEXT = ("could not translate host name", "failed to resolve host")
_HOST_PERMANENT_TEXT = ("name or service not known", "no address associated", "nodename nor servname",
                        "non-recoverable failure", "host not found")
_SCHEMA_TEXT = ("no such table", "no such column")
# A connection pooler refusing what the client asked at startup (PgBouncer: ``options=``): a configuration error,
# though the pooler reports it as a protocol violation (class 08, otherwise transient).
_POOLER_CONFIGURATION_TEXT = ("unsupported startup parameter",)
_READ_ONLY_TEXT = ("during recovery", "read-only transaction")


# --- the missing database: the one rule, for translate() and for probes (Backend.is_missing_store) -------------

#: PostgreSQL's SQLSTATE invalid_catalog_name: the database itself does not exist.
_MISSING_DATABASE_SQLSTATE = "3D000"


def _says_database_missing(text: str) -> bool:
    """libpq reports a missing database at connect time as text only (no SQLSTATE): 'database "x" does not
    exist'."""
    return "database" in text and "does not exist" in text


def is_missing_database(exc: BaseException) -> bool:
    """Whether a driver error (or SQLAlchemy's wrapper of one) says the database itself does not exist.

    :param exc: a driver error, or SQLAlchemy's wrapper of one.
    :returns: True when it says the database does not exist.
    """
    original = getattr(exc, "orig", None) or exc
    if getattr(original, "sqlstate", None) == _MISSING_DATABASE_SQLSTATE:
        return True
    return _says_database_missing(str(original))


def _classify(exc: sa_exc.SQLAlchemyError) -> type[StorageError] | None:
    """The class a driver error belongs to, or None to fall back on the SQLAlchemy exception's kind."""
    original = getattr(exc, "orig", None)
    text = str(original if original is not None else exc).lower()
    if any(marker in text for marker in _POOLER_CONFIGURATION_TEXT):
        return StoreConfigurationError
    sqlstate = getattr(original, "sqlstate", None)
    if isinstance(sqlstate, str) and len(sqlstate) == 5:
        return _classify_sqlstate(sqlstate)
    code = getattr(original, "sqlite_errorcode", None)
    if isinstance(code, int):
        found = _classify_sqlite(code)
        if found is not None:
            return found
    return _classify_text(str(original if original is not None else exc).lower())


def _classify_sqlstate(sqlstate: str) -> type[StorageError] | None:
    sqlclass = sqlstate[:2]
    if sqlstate in _PG_TRANSIENT or sqlclass in _PG_TRANSIENT_CLASSES:
        return StoreUnavailableError
    if sqlclass in _PG_AUTHENTICATION_CLASSES:
        return StoreAuthenticationError
    if sqlstate == _MISSING_DATABASE_SQLSTATE:
        return StoreMissingError
    if sqlstate in _PG_SCHEMA:
        return SchemaMissingError
    if sqlstate in _PG_CONFIGURATION:
        return StoreConfigurationError
    if sqlstate in _PG_READ_ONLY:
        return StoreReadOnlyError
    return None


def _classify_sqlite(extended: int) -> type[StorageError] | None:
    code = extended & 0xFF
    if code in (_SQLITE_BUSY, _SQLITE_LOCKED, _SQLITE_FULL) or extended in _SQLITE_READONLY_TRANSIENT:
        return StoreUnavailableError
    if code in (_SQLITE_PERM, _SQLITE_READONLY, _SQLITE_CANTOPEN, _SQLITE_AUTH, _SQLITE_NOTADB):
        return StoreConfigurationError
    return None  # SQLITE_ERROR and the rest: the message says more ("no such table: ...")


def _classify_text(text: str) -> type[StorageError] | None:
    if any(marker in text for marker in _SCHEMA_TEXT):
        return SchemaMissingError
    if "cannot execute" in text and any(marker in text for marker in _READ_ONLY_TEXT):
        return StoreReadOnlyError
    if any(marker in text for marker in _AUTHENTICATION_TEXT) or ("role" in text and "does not exist" in text):
        return StoreAuthenticationError
    if _says_database_missing(text):
        return StoreMissingError
    if any(marker in text for marker in _HOST_TEXT) and any(marker in text for marker in _HOST_PERMANENT_TEXT):
        return StoreHostNotFoundError
    return None


_MESSAGES: dict[type[StorageError], str] = {
    StoreUnavailableError: "hosted room store {where} is unavailable: {detail}",
    StoreConfigurationError: "hosted room store {where} cannot be used as configured: {detail}",
    StoreAuthenticationError: "hosted room store {where} refused the credentials: {detail}",
    StoreMissingError: "hosted room store {where} does not exist: {detail}",
    StoreHostNotFoundError: "hosted room store {where} names a host that does not resolve: {detail}",
    SchemaMissingError: "hosted room store {where} has no hostedrooms schema or an outdated one ({detail}); "
                        + UPGRADE_HINT,
    StoreReadOnlyError: "hosted room store {where} accepts reads only (a standby, or read-only transactions): "
                        "{detail}; point the target at the primary",
}


def translate(exc: BaseException, target: URL | str) -> BaseException:
    """Map a SQLAlchemy/driver exception to the hierarchy; anything else is returned unchanged.

    Callers ``raise translate(exc, url) from exc`` so the driver error stays available as ``__cause__``.
    Integrity violations become :class:`StoreIntegrityError`; transient failures :class:`StoreUnavailableError`;
    configuration problems a :class:`StoreConfigurationError` subclass; anything else :class:`StorageError`.

    :param exc: the exception caught.
    :param target: the database it came from (named, password masked, in the message).
    :returns: the hostedrooms error to raise in its place, or ``exc`` itself when it is no SQLAlchemy error.
    """
    if isinstance(exc, HostedRoomError) or not isinstance(exc, sa_exc.SQLAlchemyError):
        return exc
    where, detail = describe_target(target), _first_line(exc)
    if isinstance(exc, sa_exc.IntegrityError):
        return StoreIntegrityError(f"hosted room store {where} refused a write: {detail}")
    kind = _classify(exc)
    if kind is None and isinstance(exc, (sa_exc.OperationalError, sa_exc.InterfaceError, sa_exc.TimeoutError)):
        kind = StoreUnavailableError  # unreachable, dropped connections, pool timeouts and the unrecognised
    if kind is None:
        return StorageError(f"hosted room store {where} failed: {detail}")
    return kind(_MESSAGES[kind].format(where=where, detail=detail))

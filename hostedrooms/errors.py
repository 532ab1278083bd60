"""The one error hierarchy of hostedrooms, and the one place driver errors are translated.

The class names and bases are the reference implementation's, so callers that catch
``HostedRoomError`` (a ``ValueError``) or check ``exc.reason`` keep working. Storage failures that the
seeds let escape raw (``sqlite3.OperationalError``, ``psycopg`` errors) become :class:`StorageError`
subclasses here, with the driver error chained as ``__cause__``.
"""

from __future__ import annotations

import re
from urllib.parse import quote_plus

from sqlalchemy import exc as sa_exc
from sqlalchemy.engine import URL, make_url


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


class ReplicaEpochRegressionError(ReplicaError):
    """A page or demotion carries an older authority epoch than stored."""


class StorageError(HostedRoomError):
    """The database failed underneath an operation (not the caller's input). Nothing was committed."""


class StoreUnavailableError(StorageError):
    """The database could not be reached, or stayed locked past its timeout."""


class StoreIntegrityError(StorageError):
    """The database refused a write on a constraint: a concurrent writer or a corrupted store."""


#: Words that make a URL query parameter secret (``?password=``, ``sslpassword``, a token): masked in messages.
_SECRET_PARAMETER_WORDS = ("pass", "pwd", "secret", "token", "key")
_MASK = "***"
_SECRET_QUERY = re.compile(r"([?&;]([^=&;#]*)=)([^&;#]*)")


def _secret_parameter(name: str) -> bool:
    lowered = name.lower()
    return any(word in lowered for word in _SECRET_PARAMETER_WORDS)


def describe_target(url: URL | str) -> str:
    """Render a database target for messages, with any password masked: the ``user:***@`` of a URL and every
    secret query parameter (``?password=***``). A string is parsed as a URL when it looks like one; a plain
    path is returned as it is."""
    if isinstance(url, str):
        text = url
        if "://" not in text:
            return text
        try:
            url = make_url(text)
        except (sa_exc.ArgumentError, ValueError):
            return mask_url_text(text)
    base = url.set(query={}).render_as_string(hide_password=True)
    pairs = [(name, value) for name, values in url.query.items()
             for value in ((values,) if isinstance(values, str) else values)]
    if not pairs:
        return base
    return base + "?" + "&".join(
        f"{quote_plus(name)}={_MASK if _secret_parameter(name) else quote_plus(value)}" for name, value in pairs)


def mask_url_text(text: str) -> str:
    """Mask ``user:password@`` and secret query parameters in a string that did not parse as a URL."""
    scheme, sep, rest = text.partition("://")
    if not sep:
        return text
    # The credentials end at the last "@" before the query (a sloppy password may hold "/" or "@").
    query = rest.find("?")
    at = (rest if query < 0 else rest[:query]).rfind("@")
    if at >= 0 and ":" in rest[:at]:
        rest = f"{rest[:at].split(':', 1)[0]}:{_MASK}{rest[at:]}"
    masked = _SECRET_QUERY.sub(
        lambda match: match.group(1) + (_MASK if _secret_parameter(match.group(2)) else match.group(3)), rest)
    return f"{scheme}://{masked}"


def _first_line(exc: BaseException) -> str:
    original = getattr(exc, "orig", None) or exc
    text = str(original).strip().splitlines()
    return text[0] if text else type(original).__name__


def translate(exc: BaseException, target: URL | str) -> BaseException:
    """Map a SQLAlchemy/driver exception to the hierarchy; anything else is returned unchanged.

    Callers ``raise translate(exc, url) from exc`` so the driver error stays available as ``__cause__``.
    """
    if isinstance(exc, HostedRoomError) or not isinstance(exc, sa_exc.SQLAlchemyError):
        return exc
    where = describe_target(target)
    if isinstance(exc, sa_exc.IntegrityError):
        return StoreIntegrityError(f"hosted room store {where} refused a write: {_first_line(exc)}")
    if isinstance(exc, (sa_exc.OperationalError, sa_exc.InterfaceError, sa_exc.TimeoutError)):
        return StoreUnavailableError(f"hosted room store {where} is unavailable: {_first_line(exc)}")
    return StorageError(f"hosted room store {where} failed: {_first_line(exc)}")

"""The ledger's pure rules: claim builders, digests, limits and input validators (no database; the delivery states
live with the statements that test them, in :mod:`hostedrooms.store.ledger`).

Everything a ledger call accepts is checked here before any transaction opens: a delivery's claim and its
digest (:func:`delivery_claim`), an outbound intent's (:func:`outbound_claim`), lookup keys, 64-bit integers,
batch limits, and the text both backends can store (no NUL character, no lone surrogate).
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from typing import Any

from ..errors import LedgerInputError
from ..validation import (
    canonical_json_bytes,
    json_depth_within,
    max_json_depth,
    storable_copy,
    storable_string,
    storable_text,
)

#: The transport roles, leg actions and message kinds an envelope may name.
ROLES = frozenset({"host", "client"})
ACTIONS = frozenset({"instruction", "request_reply"})
KINDS = frozenset({"instruction", "request_reply", "response"})
#: The leg budget every envelope's claim carries (``max_legs``; ``used_legs`` from 1 to it).
MAX_LEGS = 6
#: The longest message body, and the longest error text recorded (characters).
MAX_MESSAGE_CHARS = 100_000
MAX_ERROR_CHARS = 400
#: The longest error text ``finish`` records (characters, the marker included); a longer one keeps its start and
#: ends with FINISH_ERROR_CUT_MARK, so a reader can tell a cut text from a whole one.
MAX_FINISH_ERROR_CHARS = 4_000
FINISH_ERROR_CUT_MARK = " [... cut]"
#: The most due retries one call may ask for.
MAX_RETRY_BATCH = 50
#: ``prune``'s default retention of finished rows: 30 days.
DEFAULT_RETAIN_SECONDS = 30 * 24 * 60 * 60
#: Retry back-off: ``2 ** attempts`` seconds, the exponent capped at RETRY_EXPONENT_CAP, the delay at the ceiling.
RETRY_CEILING_SECONDS = 300
RETRY_EXPONENT_CAP = 8
_INT64_MIN, _INT64_MAX = -(2**63), 2**63 - 1


# --- pure helpers ----------------------------------------------------------------------------------------


def retry_delay(attempts: int) -> int:
    """Seconds to wait after the ``attempts``-th failed try: ``min(300, 2 ** min(attempts, 8))``.

    The one backoff schedule of admission, response and outbound retries (2, 4, ... 256 seconds; the
    exponent cap means the 300-second ceiling is never reached, as in the reference).
    """
    exponent: int = min(attempts, RETRY_EXPONENT_CAP)
    return min(RETRY_CEILING_SECONDS, int(2**exponent))


def _integer(value: Any, message: str, field: str | None) -> int:
    """``int(value)`` (the reference's coercion) within 64 bits, else ``LedgerInputError(message)`` naming
    ``field``."""
    try:
        number = int(value)
    except (TypeError, ValueError, OverflowError) as exc:
        raise LedgerInputError(message, field=field) from exc
    if not _INT64_MIN <= number <= _INT64_MAX:
        raise LedgerInputError(message, field=field)
    return number


def _key(value: Any, label: str) -> str:
    """A lookup identifier: strings only (PostgreSQL would refuse other types in the driver), and only text both
    backends can store and compare (no NUL character, no lone surrogate)."""
    return storable_string(value, error=lambda message: LedgerInputError(message, field=label),
                           label=f"secure peer ledger {label}")


def _stored_text(value: Any, message: str, field: str | None) -> str:
    """``str(value)`` (the reference's coercion) when both backends can store it, else ``LedgerInputError(message)``
    naming ``field`` (also when ``str()`` itself fails, e.g. an int beyond Python's digit limit)."""
    try:
        text = str(value)
    except ValueError:
        text = None
    if text is None or not storable_text(text):
        raise LedgerInputError(message, field=field)
    return text


def _optional_key(value: Any, label: str) -> str | None:
    return None if value is None else _key(value, label)


def _limit(value: Any, high: int, message: str) -> int:
    if type(value) is not int or not 1 <= value <= high:
        raise LedgerInputError(message, field="limit")
    return value


def _error_text(error: Any) -> str:
    return _recorded_text(error)[:MAX_ERROR_CHARS]


def _finish_error_text(error: Any) -> str:
    """The error ``finish`` records: the whole text up to MAX_FINISH_ERROR_CHARS, else its start and the mark.

    The reference stored any length; a caller's exception text (a whole response body, say) then grew every
    row and every read of it without bound.
    """
    text = _recorded_text(error)
    if len(text) <= MAX_FINISH_ERROR_CHARS:
        return text
    return text[:MAX_FINISH_ERROR_CHARS - len(FINISH_ERROR_CUT_MARK)] + FINISH_ERROR_CUT_MARK


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
    raise LedgerInputError("secure peer delivery result is invalid", field="result_text")


def _digest(value: Any) -> str:
    return hashlib.sha256(canonical_json_bytes(value)).hexdigest()


def _optional_text(value: Any, message: str, field: str) -> str | None:
    return _stored_text(value, message, field) if value is not None else None


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


_IDENTITY = "secure peer delivery identity is invalid"
_LEGS = "secure peer delivery leg budget is invalid"


def delivery_claim(
    envelope: Any, *, transport_role: Any, connection_id: Any, lease_token: Any, target_chat_id: Any
) -> tuple[dict[str, Any], str]:
    """Validate an envelope and return its exact claim plus the claim digest.

    The digest covers everything but ``lease_token``: the token belongs to one delivery *attempt*, and a
    crash past the lease deadline legitimately redelivers the same envelope with a new token.
    """
    if not isinstance(transport_role, str) or transport_role not in ROLES:  # unhashable junk: ValueError too
        raise LedgerInputError("secure peer delivery role is invalid", field="transport_role")
    if not isinstance(envelope, Mapping):
        raise LedgerInputError("secure peer delivery envelope is invalid", field="envelope")
    action, kind, body = _exchange(envelope)
    claim = _claim_values(envelope, transport_role=transport_role, connection_id=connection_id,
                          lease_token=lease_token, target_chat_id=target_chat_id, action=action, kind=kind, body=body)
    missing = [name for name in _REQUIRED_CLAIM_FIELDS if not claim[name]]
    if missing:
        raise LedgerInputError("secure peer delivery identity is incomplete", field=missing[0])
    if claim["max_legs"] != MAX_LEGS:
        raise LedgerInputError(_LEGS, field="max_legs")
    if not 1 <= claim["used_legs"] <= MAX_LEGS:
        raise LedgerInputError(_LEGS, field="used_legs")
    immutable = {name: value for name, value in claim.items() if name != "lease_token"}
    try:
        return claim, _digest(immutable)
    except UnicodeEncodeError:  # a lone surrogate in the message (the only text not checked above)
        pass
    raise LedgerInputError("secure peer delivery body is invalid", field="body")


def _envelope_text(envelope: Mapping[str, Any], name: str) -> str:
    return _stored_text(envelope.get(name) or "", _IDENTITY, name)


def _exchange(envelope: Mapping[str, Any]) -> tuple[str, str, Any]:
    """The envelope's action, kind and body, checked in that order."""
    action, kind = _envelope_text(envelope, "action"), _envelope_text(envelope, "kind")
    if action not in ACTIONS:
        raise LedgerInputError("secure peer delivery action is invalid", field="action")
    if kind not in KINDS:
        raise LedgerInputError("secure peer delivery kind is invalid", field="kind")
    body = envelope.get("body")
    if not _valid_message(body):
        raise LedgerInputError("secure peer delivery body is invalid", field="body")
    return action, kind, body


def _claim_values(
    envelope: Mapping[str, Any], *, transport_role: str, connection_id: Any, lease_token: Any, target_chat_id: Any,
    action: str, kind: str, body: Any,
) -> dict[str, Any]:
    """Every stored field of a claim, coerced like the reference (each checked in this order)."""

    def text(name: str) -> str:
        return _envelope_text(envelope, name)

    parent_leg = envelope.get("parent_leg")
    return {
        "envelope_id": text("envelope_id"),
        "request_id": text("request_id"),
        "transport_role": transport_role,
        "connection_id": _stored_text(connection_id, _IDENTITY, "connection_id"),
        "lease_token": _stored_text(lease_token, _IDENTITY, "lease_token"),
        "team_id": text("team_id"),
        "source_peer_id": _optional_text(envelope.get("source_peer_id"), _IDENTITY, "source_peer_id"),
        "source_server_identity": text("source_server_identity"),
        "source_route_id": text("source_route_id"),
        "source_route_revision": text("source_route_revision"),
        "target_peer_id": _optional_text(envelope.get("target_peer_id"), _IDENTITY, "target_peer_id"),
        "target_server_identity": text("target_server_identity"),
        "target_route_id": text("target_route_id"),
        "target_route_revision": text("target_route_revision"),
        "target_chat_id": _stored_text(target_chat_id, _IDENTITY, "target_chat_id"),
        "action": action,
        "kind": kind,
        "exchange_id": text("exchange_id"),
        "parent_envelope_id": _optional_text(envelope.get("parent_envelope_id"), _IDENTITY, "parent_envelope_id"),
        "parent_leg": _integer(parent_leg, _LEGS, "parent_leg") if parent_leg is not None else None,
        "used_legs": _integer(envelope.get("used_legs") or 0, _LEGS, "used_legs"),
        "max_legs": _integer(envelope.get("max_legs") or 0, _LEGS, "max_legs"),
        "expires_at": _integer(envelope.get("expires_at") or 0, "secure peer delivery expiry is invalid", "expires_at"),
        "body": body,
    }


def outbound_claim(
    *, request_id: Any, source_session_id: Any, source_run_id: Any, snapshot: Any, body: Any, action: Any,
    expires_at: Any,
) -> tuple[dict[str, Any], str, str]:
    """Validate an outbound intent; return its row values, its digest and its canonical snapshot text."""
    invalid = "secure peer outbound intent is invalid"
    if not isinstance(snapshot, Mapping):  # the reference reads snapshot.get() first (AttributeError)
        raise LedgerInputError(invalid, field="snapshot")
    route = {name: _stored_text(snapshot.get(name) or "", invalid, f"snapshot.{name}") for name in
             ("connection_id", "source_route_id", "source_route_revision")}
    field = _outbound_fault(request_id, source_session_id, source_run_id, snapshot, body, action, route)
    if field is not None:
        raise LedgerInputError(invalid, field=field)
    exact = {
        "request_id": request_id,
        "source_session_id": source_session_id,
        "source_run_id": source_run_id,
        "snapshot": dict(snapshot),
        "body": body,
        "action": action,
        "expires_at": _integer(expires_at, invalid, "expires_at"),
    }
    try:
        digest = _digest(exact)
        snapshot_text = canonical_json_bytes(exact["snapshot"]).decode("utf-8")
    except (TypeError, ValueError, RecursionError) as exc:
        raise LedgerInputError(invalid, field="snapshot") from exc
    if not json_depth_within(snapshot_text, max_json_depth()):
        raise LedgerInputError(invalid, field="snapshot")
    values = {key: value for key, value in exact.items() if key != "snapshot"}
    return {**values, **route}, digest, snapshot_text


def _outbound_fault(
    request_id: Any, source_session_id: Any, source_run_id: Any, snapshot: Mapping[str, Any], body: Any,
    action: Any, route: Mapping[str, str],
) -> str | None:
    """The first field that makes an outbound intent invalid (the reference's one test, split to name it)."""
    texts = {"request_id": request_id, "source_session_id": source_session_id, "source_run_id": source_run_id,
             "body": body}
    for name, value in texts.items():
        if not (isinstance(value, str) and value and storable_text(value)):
            return name
    for name, text in route.items():
        if not text:
            return f"snapshot.{name}"
    if str(snapshot.get("source_chat_id") or "") != source_session_id:
        return "snapshot.source_chat_id"
    if str(snapshot.get("action") or "") != action:
        return "snapshot.action"
    if action not in ACTIONS:
        return "action"
    if not body.strip() or len(body) > MAX_MESSAGE_CHARS:
        return "body"
    return None


def response_claim(*, request_id: Any, body: Any, request_response: Any) -> str:
    """Validate a response intent (the reply owed for a request delivery); return its digest."""
    invalid = "secure peer response intent is invalid"
    if not isinstance(request_id, str) or not request_id or not storable_text(request_id):
        raise LedgerInputError(invalid, field="request_id")
    if not isinstance(body, str) or not storable_text(body) or not body.strip() or len(body) > MAX_MESSAGE_CHARS:
        raise LedgerInputError(invalid, field="body")
    if type(request_response) is not bool:
        raise LedgerInputError(invalid, field="request_response")
    return _digest({"request_id": request_id, "body": body, "request_response": request_response})


def _response_text(response: Any) -> str:
    try:
        text = canonical_json_bytes(dict(response)).decode("utf-8")
    except (TypeError, ValueError, RecursionError) as exc:
        raise LedgerInputError("secure peer outbound result is invalid", field="response") from exc
    if not json_depth_within(text, max_json_depth()):
        raise LedgerInputError("secure peer outbound result is invalid", field="response")
    return text


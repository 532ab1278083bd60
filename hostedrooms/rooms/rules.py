"""The rules of a room write, pure and read before any transaction: identifiers, kinds, actors, payloads,
members and events (the reference's checks, order and messages), and :class:`PreparedEvent`."""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from dataclasses import field as dataclass_field
from typing import Any

from ..errors import (
    InvalidInputError,
)
from ..limits import Limits, in_force
from ..store import RowLike
from ..validation import (
    IDENTIFIER_PATTERN,
    INT64_MAX,
    MAX_EPOCH,
    bounded_int,
    canonical_json,
    canonical_json_sized,
    canonical_object,
    identifier,
    utf8_len,
)

_EVENT_KIND_RE = re.compile(r"^[a-z][a-z0-9_.-]*$")
CONTROL_EVENT_KINDS = frozenset({"authority.claimed", "authority.lost", "room.disbanded", "room.stop_requested"})
EVENT_KINDS_BY_ACTOR: Mapping[str, frozenset[str]] = {
    "user": frozenset({"message.user"}),
    "member": frozenset({"message.member"}),
    "gateway": frozenset({
        "member.unavailable", "room.activity", "room.stop_requested", "turn.deferred", "turn.reassigned",
        "turn.cancelled", "turn.failed", "turn.settled", "turn.started"}),
    "system": frozenset({
        "authority.claimed", "authority.lost", "room.created", "room.disbanded", "room.members_changed",
        "room.renamed"}),
}
# (field, the limit bounding it)
_OPTIONAL_ACTOR_FIELDS: tuple[tuple[str, Callable[[Limits], int]], ...] = (
    ("display_name", lambda lim: lim.MAX_ACTOR_LABEL_CHARS), ("profile", lambda lim: lim.MAX_ACTOR_ID_CHARS),
    ("connection_id", lambda lim: lim.MAX_ACTOR_ID_CHARS))
_ACTOR_FIELDS = frozenset({"kind", "id", *(field for field, _ in _OPTIONAL_ACTOR_FIELDS)})
_EVENT_FIELDS = frozenset({"event_id", "kind", "actor", "payload"})
_IDENTIFIER_MATCH = IDENTIFIER_PATTERN.fullmatch


# --- validation (pure; limits read at call time) -------------------------------------------------------------



def _identifier(value: Any, label: str, max_chars: int) -> str:
    return identifier(value, error=InvalidInputError, label=label, max_chars=max_chars)


def _room_id(value: Any, lim: Limits) -> str:
    """A room id (``validate_room_id``): ``value`` stripped, checked for type, shape and length.

    :param value: the caller's argument.
    :param lim: the limits in force (a :class:`~hostedrooms.limits.Limits`).
    :returns: the validated text.
    :raises InvalidInputError: not a string, empty, longer than MAX_ROOM_ID_CHARS or misshapen.
    """
    return _identifier(value, "room_id", lim.MAX_ROOM_ID_CHARS)


def _event_id(value: Any, lim: Limits) -> str:
    """An event id (``validate_event_id``): ``value`` stripped, checked for type, shape and length.

    :param value: the caller's argument.
    :param lim: the limits in force (a :class:`~hostedrooms.limits.Limits`).
    :returns: the validated text.
    :raises InvalidInputError: not a string, empty, longer than MAX_EVENT_ID_CHARS or misshapen.
    """
    return _identifier(value, "event_id", lim.MAX_EVENT_ID_CHARS)


def _actor_id(value: Any, label: str, lim: Limits) -> str:
    """An actor or gateway id (``validate_actor_id``): ``value`` stripped, checked for type, shape and length.

    :param value: the caller's argument.
    :param label: the argument's name, for the message and the error's ``field``.
    :param lim: the limits in force (a :class:`~hostedrooms.limits.Limits`).
    :returns: the validated text.
    :raises InvalidInputError: not a string, empty, longer than MAX_ACTOR_ID_CHARS or misshapen.
    """
    return _identifier(value, label, lim.MAX_ACTOR_ID_CHARS)


def _room_name(value: Any, lim: Limits) -> str:
    """A room name (``validate_room_name``): free text, stripped, not empty.

    :param value: the caller's argument.
    :param lim: the limits in force (a :class:`~hostedrooms.limits.Limits`).
    :returns: the validated name.
    :raises InvalidInputError: not a string, empty, or longer than MAX_ROOM_NAME_CHARS.
    """
    return identifier(
        value, error=InvalidInputError, label="name", max_chars=lim.MAX_ROOM_NAME_CHARS, pattern=None,
        invalid="invalid room name")


def _event_kind(value: Any, lim: Limits) -> str:
    """An event kind (``validate_event_kind``): ``value`` stripped, checked for type, shape and length.

    :param value: the caller's argument.
    :param lim: the limits in force (a :class:`~hostedrooms.limits.Limits`).
    :returns: the validated text.
    :raises InvalidInputError: not a string, empty, longer than MAX_EVENT_KIND_CHARS or misshapen.
    """
    return identifier(
        value, error=InvalidInputError, label="kind", max_chars=lim.MAX_EVENT_KIND_CHARS, pattern=_EVENT_KIND_RE,
        invalid="invalid event kind")


def _positive(value: Any, label: str) -> int:
    return bounded_int(
        value, error=InvalidInputError, message=f"{label} must be a positive integer", low=1, high=INT64_MAX,
        field=label)


def _epoch(value: Any, label: str, high: int = MAX_EPOCH) -> int:
    """A positive epoch of at most ``high`` (default MAX_EPOCH, so that the ``epoch + 1`` a claim or a promotion
    writes always fits 64 bits; a claim's expected epoch is bounded one lower)."""
    epoch = _positive(value, label)
    if epoch > high:
        raise InvalidInputError(f"{label} is beyond the largest authority epoch", field=label)
    return epoch


def _bounded_limit(value: Any, maximum: int) -> int:
    return bounded_int(value, error=InvalidInputError, message=f"limit must be between 1 and {maximum}", low=1,
                       high=maximum, field="limit")


def _non_negative(value: Any, label: str) -> int:
    return bounded_int(value, error=InvalidInputError, message=f"{label} must be a non-negative integer",
                       high=INT64_MAX, field=label)



def _actor_json(value: Any, lim: Limits) -> str:
    return canonical_json(value, error=InvalidInputError, label="actor", max_bytes=lim.MAX_ACTOR_JSON_BYTES)


def _payload_json(value: Any, lim: Limits) -> str:
    return _payload_json_sized(value, lim)[0]


def _payload_json_sized(value: Any, lim: Limits) -> tuple[str, int]:
    return canonical_json_sized(value, error=InvalidInputError, label="payload", max_bytes=lim.MAX_EVENT_JSON_BYTES)


def _system_actor_json(actor_id: str, lim: Limits) -> str:
    return _actor_json({"kind": "system", "id": actor_id}, lim)


def _claim_payload_json(previous_gateway_id: str, new_gateway_id: str, epoch: int, lim: Limits) -> str:
    return _payload_json(
        {"previous_gateway_id": previous_gateway_id, "authority_gateway_id": new_gateway_id,
         "authority_epoch": epoch}, lim)


def _members(value: Any, lim: Limits) -> tuple[list[dict[str, Any]], str]:
    """A room's member list (``validate_members``).

    :param value: the caller's argument: a list of member objects.
    :param lim: the limits in force (a :class:`~hostedrooms.limits.Limits`).
    :returns: the members (copied) and their canonical JSON, as stored.
    :raises InvalidInputError: not a list of objects, more than MAX_MEMBERS, or too large as JSON.
    """
    if not isinstance(value, list):
        raise InvalidInputError("members must be a list", field="members")
    if len(value) > lim.MAX_MEMBERS:
        raise InvalidInputError("too many room members", field="members")
    if not all(isinstance(member, dict) for member in value):
        raise InvalidInputError("each room member must be an object", field="members")
    members = [dict(member) for member in value]
    return members, canonical_json(members, error=InvalidInputError, label="members",
                                   max_bytes=lim.MAX_MEMBERS_JSON_BYTES)


def _actor(value: Any, *, kind: str, lim: Limits) -> tuple[dict[str, str], str, int]:
    """The normalised actor, its canonical JSON and that text's UTF-8 size."""
    if not isinstance(value, dict):
        raise InvalidInputError("actor must be an object", field="actor")
    unknown = set(value) - _ACTOR_FIELDS
    if unknown:
        raise InvalidInputError(f"unknown actor fields: {', '.join(sorted(unknown))}", field="actor")
    actor_kind = value.get("kind")
    if not isinstance(actor_kind, str) or actor_kind not in EVENT_KINDS_BY_ACTOR:
        raise InvalidInputError("invalid actor.kind", field="actor.kind")
    if kind not in EVENT_KINDS_BY_ACTOR[actor_kind]:
        raise InvalidInputError(f"actor kind '{actor_kind}' cannot append '{kind}'", field="actor.kind")
    actor = {"kind": actor_kind, "id": _actor_id(value.get("id"), "actor.id", lim)}
    for field, max_chars in _OPTIONAL_ACTOR_FIELDS:
        field_value = value.get(field)
        if field_value is None:
            continue
        if not isinstance(field_value, str):
            raise InvalidInputError(f"actor.{field} must be a string", field=f"actor.{field}")
        field_value = field_value.strip()
        if len(field_value) > max_chars(lim):
            raise InvalidInputError(f"actor.{field} is too long", field=f"actor.{field}")
        if field_value:
            actor[field] = field_value
    return (actor, *canonical_json_sized(
        actor, error=InvalidInputError, label="actor", max_bytes=lim.MAX_ACTOR_JSON_BYTES))


def _legacy_members_match(existing_json: str, proposed: list[dict[str, Any]]) -> bool:
    """Adoption may add routing metadata (``target``) that an older room could not store."""
    try:
        existing = json.loads(existing_json)
    except (TypeError, ValueError, RecursionError):  # undecodable stored members match nothing
        return False
    if not isinstance(existing, list) or len(existing) != len(proposed):
        return False
    for previous, current in zip(existing, proposed, strict=True):
        if not isinstance(previous, dict):
            return False
        previous, current = dict(previous), dict(current)
        previous_target, current_target = previous.pop("target", None), current.pop("target", None)
        if previous != current or (previous_target not in (None, {}) and previous_target != current_target):
            return False
    return True


# Validation shared with the replica service (the same rules and messages as the reference's rooms).
validate_room_id = _room_id
validate_room_name = _room_name
validate_members = _members
validate_actor_id = _actor_id
validate_event_id = _event_id
validate_event_kind = _event_kind
system_actor_json = _system_actor_json
payload_json = _payload_json


def user_event_id(client_event_id: str, *, limits: Limits | None = None) -> str:
    """Map a client retry key into the server-owned user-event namespace.

    :param client_event_id: the client's retry key (an event id).
    :param limits: the limits in force (default: :mod:`hostedrooms.limits`).
    :returns: ``user:`` and the SHA-256 of the key, in hexadecimal.
    :raises InvalidInputError: ``client_event_id`` is not a valid event id.
    """
    client = _event_id(client_event_id, in_force(limits))
    return f"user:{hashlib.sha256(client.encode('utf-8')).hexdigest()}"


def max_event_bytes(limits: Limits | None = None) -> int:
    """The most bytes one validated event can account for (ids and kinds are ASCII).

    :param limits: the limits in force (default: :mod:`hostedrooms.limits`).
    :returns: the bound, in bytes.
    """
    lim = in_force(limits)
    return int(lim.MAX_EVENT_ID_CHARS + lim.MAX_EVENT_KIND_CHARS + lim.MAX_ACTOR_JSON_BYTES + lim.MAX_EVENT_JSON_BYTES)


@dataclass(slots=True, init=False)
class PreparedEvent:
    """A validated event ready to insert: canonical texts, its epoch stamp and whether it is a control kind.

    Treat it as immutable (not frozen only because a frozen dataclass costs a batch append a tenth of its time).
    """

    event_id: str
    kind: str
    actor_json: str
    payload_json: str
    authority_epoch: int | None
    control: bool
    #: Accounted bytes: event_id + kind + actor_json + payload_json in UTF-8 (computed once, when not given).
    size: int = dataclass_field(compare=False)

    # (Written out rather than generated: the generated one calls a __post_init__ for the size, a frame per event.)
    def __init__(self, event_id: str, kind: str, actor_json: str, payload_json: str, authority_epoch: int | None,
                 control: bool = False, size: int = -1) -> None:
        self.event_id, self.kind, self.actor_json, self.payload_json = event_id, kind, actor_json, payload_json
        self.authority_epoch, self.control = authority_epoch, control
        self.size = size if size >= 0 else utf8_len(event_id, kind, actor_json, payload_json)

    def same_content(self, row: RowLike) -> bool:
        """Whether a stored event row carries exactly this immutable content."""
        stored = (row["kind"], row["actor_json"], row["authority_epoch"], row["payload_json"])
        return stored == (self.kind, self.actor_json, self.authority_epoch, self.payload_json)


class _BatchMemo:
    """What repeats across one batch's items, validated once: kinds by their text, actors by their value (a batch
    usually has one author and a few kinds), plus the batch's already validated authority.

    A memo must never change what is stored, so it is keyed by value, never by object identity (an item Mapping
    may build a fresh actor on each access, and a freed object's id is reused), and only for actors whose
    content cannot change or lie: a plain dict of exact ``str`` keys and ``str``/None values. Anything else is
    validated on its own, every time.
    """

    __slots__ = ("actors", "epoch", "gateway_id", "kinds", "max_event_id", "max_payload")

    def __init__(self, gateway_id: str, epoch: int, lim: Limits | None = None) -> None:
        self.gateway_id, self.epoch = gateway_id, epoch
        self.kinds: dict[str, str] = {}
        self.actors: dict[tuple[str, tuple[tuple[str, str | None], ...]], tuple[dict[str, str], str, int]] = {}
        self.max_event_id = -1 if lim is None else lim.MAX_EVENT_ID_CHARS
        self.max_payload = -1 if lim is None else lim.MAX_EVENT_JSON_BYTES

    def quick(self, item: dict[Any, Any]) -> tuple[PreparedEvent, dict[str, str]] | None:
        """The validated event of a batch item whose every check passes the common way, from values this memo
        already validated (its kind and actor, the batch's authority), in the very checks :func:`_validated_event`
        makes; None when any is not so, and the item then takes :func:`_validated_event` (which validates the
        kind and actor into the memo, and raises the first problem in the reference's order)."""
        event_id, kind, payload = item.get("event_id"), item.get("kind"), item.get("payload")
        # (identifier's own fast path: an exact str within the length, of the identifier shape, is valid as is.)
        if (type(event_id) is not str or len(event_id) > self.max_event_id or _IDENTIFIER_MATCH(event_id) is None
                or type(kind) is not str or type(payload) is not dict):
            return None
        checked_kind = self.kinds.get(kind)
        content = _actor_memo_key(item.get("actor"))
        if checked_kind is None or content is None:
            return None
        known = self.actors.get((checked_kind, content))
        if known is None:
            return None
        actor, actor_json, actor_size = known
        if actor["kind"] == "gateway" and actor["id"] != self.gateway_id:
            return None
        encoded = canonical_object(payload, self.max_payload)
        if encoded is None:
            return None
        payload_json, payload_size = encoded
        return PreparedEvent(
            event_id, checked_kind, actor_json, payload_json, self.epoch, checked_kind in CONTROL_EVENT_KINDS,
            len(event_id) + len(checked_kind) + actor_size + payload_size), actor

    def kind(self, value: Any, lim: Limits) -> str:
        if type(value) is not str:
            return _event_kind(value, lim)
        checked = self.kinds.get(value)
        if checked is None:
            checked = self.kinds[value] = _event_kind(value, lim)
        return checked

    def actor(self, value: Any, kind: str, lim: Limits) -> tuple[dict[str, str], str, int]:
        content = _actor_memo_key(value)
        if content is None:
            return _actor(value, kind=kind, lim=lim)
        key = (kind, content)
        known = self.actors.get(key)
        if known is None:
            known = self.actors[key] = _actor(value, kind=kind, lim=lim)
        return known


def _actor_memo_key(value: Any) -> tuple[tuple[str, str | None], ...] | None:
    """An immutable copy of ``value``'s items when it is a plain dict of exact strings (None values allowed),
    the only actors the batch memo may key by value; None otherwise."""
    if type(value) is not dict or len(value) > len(_ACTOR_FIELDS):
        return None
    items = tuple(value.items())
    for name, field_value in items:
        if type(name) is not str or (type(field_value) is not str and field_value is not None):
            return None
    return items



def _validated_event(
    event_id: Any, kind: Any, actor: Any, payload: Any, authority_gateway_id: Any, authority_epoch: Any, lim: Limits,
    memo: _BatchMemo | None = None,
) -> tuple[PreparedEvent, dict[str, str], str, int]:
    """Validate one event in the reference's order (the first problem reported is the same); returns the event,
    the normalised actor, and the validated authority gateway id and epoch (taken from ``memo`` when given)."""
    checked_id = _event_id(event_id, lim)
    if memo is None:
        checked_kind = _event_kind(kind, lim)
        normalized_actor, actor_json, actor_size = _actor(actor, kind=checked_kind, lim=lim)
        # Every admitted actor kind is room-scoped, so authority fields are always required.
        gateway_id = _actor_id(authority_gateway_id, "authority_gateway_id", lim)
    else:
        checked_kind = memo.kind(kind, lim)
        normalized_actor, actor_json, actor_size = memo.actor(actor, checked_kind, lim)
        gateway_id = memo.gateway_id
    if normalized_actor["kind"] == "gateway" and normalized_actor["id"] != gateway_id:
        raise InvalidInputError("gateway actor.id must match authority_gateway_id", field="actor.id")
    epoch = _epoch(authority_epoch, "authority_epoch") if memo is None else memo.epoch
    if not isinstance(payload, dict):
        raise InvalidInputError("payload must be an object", field="payload")
    payload_json, payload_size = _payload_json_sized(payload, lim)
    # Ids and kinds are ASCII (their shapes say so): their lengths are their byte sizes.
    size = len(checked_id) + len(checked_kind) + actor_size + payload_size
    event = PreparedEvent(
        checked_id, checked_kind, actor_json, payload_json, epoch, control=checked_kind in CONTROL_EVENT_KINDS,
        size=size)
    return event, normalized_actor, gateway_id, epoch



def validated_items(
    items: Sequence[Any], gateway_id: str, epoch: int, lim: Limits
) -> list[tuple[PreparedEvent, dict[str, str]]]:
    """Each batch item validated (after the batch's own arguments) in order, with its normalised actor: the
    first problem raises, as :func:`_validated_event` reports it. Kinds and actors that repeat are validated
    once (:class:`_BatchMemo`), and an item whose every check passes the common way is built straight
    (:meth:`_BatchMemo.quick`): the same event, byte for byte."""
    prepared: list[tuple[PreparedEvent, dict[str, str]]] = []
    memo = _BatchMemo(gateway_id, epoch, lim)
    quick = memo.quick
    for item in items:
        if type(item) is not dict and not isinstance(item, Mapping):  # (the exact type first: the ABC check is slow)
            raise InvalidInputError("each event must be an object", field="events")
        if not item.keys() <= _EVENT_FIELDS:
            unknown = sorted(str(name) for name in item.keys() - _EVENT_FIELDS)
            raise InvalidInputError(f"unknown event fields: {', '.join(unknown)}", field="events")
        fast = quick(item) if type(item) is dict else None
        if fast is None:
            event, actor, _, _ = _validated_event(
                item.get("event_id"), item.get("kind"), item.get("actor"), item.get("payload"), gateway_id, epoch,
                lim, memo)
            fast = event, actor
        prepared.append(fast)
    return prepared


def room_stop_event(
    *, cancel_id: Any, expected_gateway_id: Any, expected_epoch: Any, limits: Limits | None = None
) -> dict[str, Any]:
    """The :func:`append_event` keyword arguments (but ``room_id``) of a stop request; validates ``cancel_id``.

    The seed-compatible facade passes them to its module's ``append_event``, looked up at call time.
    """
    cancel = _identifier(cancel_id, "cancel_id", in_force(limits).MAX_EVENT_ID_CHARS)
    return {"event_id": f"room-stop:{hashlib.sha256(cancel.encode()).hexdigest()[:32]}",
            "kind": "room.stop_requested", "actor": {"kind": "gateway", "id": expected_gateway_id},
            "payload": {"cancel_id": cancel}, "authority_gateway_id": expected_gateway_id,
            "authority_epoch": expected_epoch}


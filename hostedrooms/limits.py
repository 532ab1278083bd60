"""Limits and protocol constants of the reference implementation.

Services read these module attributes at call time (never bind them at import), so tests and operators can
lower them. Every service takes ``limits: Limits | None``: None means this module; the compat facades resolve
their own module's constants into a :class:`LimitValues` snapshot once per call (:meth:`LimitValues.read`), so
lowering a limit on ``hostedrooms.compat.hosted_rooms`` takes effect too.
"""

from __future__ import annotations

from dataclasses import dataclass
from types import ModuleType
from typing import Protocol

PROTOCOL_VERSION = 2
MAX_ROOM_ID_CHARS = 128
MAX_EVENT_ID_CHARS = 128
MAX_ROOM_NAME_CHARS = 200
MAX_EVENT_KIND_CHARS = 64
MAX_ACTOR_ID_CHARS = 128
MAX_ACTOR_LABEL_CHARS = 200
MAX_ACTOR_JSON_BYTES = 4 * 1024
MAX_MEMBERS = 128
MAX_MEMBERS_JSON_BYTES = 128 * 1024
MAX_EVENT_JSON_BYTES = 256 * 1024
MAX_LOG_LIMIT = 500
MAX_LOG_PAGE_BYTES = 2 * 1024 * 1024
# The deepest nesting of arrays and objects in any stored JSON document (the outermost counts as 1): actors,
# payloads, members, replicated events, ledger snapshots and responses. Readers decode and re-serialise these
# recursively (json.loads, a replay page adds 3 levels, callers walk them); 64 is far below CPython's
# recursion limit (1000) and below other common parsers' defaults (Ruby's 100, serde_json's 128), and no chat
# event needs more. Not a reference constant: hostedrooms reads it here even when a facade passes its limits.
MAX_JSON_DEPTH = 64
MAX_ROOM_LIST_LIMIT = 500
MAX_ACTIVE_ROOMS = 256
MAX_DISBANDED_ROOM_TOMBSTONES = 512
DISBANDED_ROOM_RETENTION_SECONDS = 90 * 24 * 60 * 60
MAX_EVENTS_PER_ROOM = 50_000
MAX_ROOM_EVENT_BYTES = 256 * 1024 * 1024
# Headroom below the physical file: event accounting excludes indexes and repeated room ids.
MAX_GATEWAY_EVENT_BYTES = 16 * 1024 * 1024
CONTROL_EVENT_COUNT_RESERVE = 64
CONTROL_EVENT_BYTE_RESERVE = 1024 * 1024

# Replicas
MAX_REPLICA_ROOMS = 256
MAX_REPLICA_EVENT_BYTES = 256 * 1024 * 1024

# Secure-peer delivery ledger
MAX_NONTERMINAL_DELIVERIES = 2_048


# --- the typed seam ----------------------------------------------------------------------------------------------

#: Every limit a service reads, by name (all of the above but PROTOCOL_VERSION).
LIMIT_NAMES = (
    "MAX_ROOM_ID_CHARS", "MAX_EVENT_ID_CHARS", "MAX_ROOM_NAME_CHARS", "MAX_EVENT_KIND_CHARS", "MAX_ACTOR_ID_CHARS",
    "MAX_ACTOR_LABEL_CHARS", "MAX_ACTOR_JSON_BYTES", "MAX_MEMBERS", "MAX_MEMBERS_JSON_BYTES", "MAX_EVENT_JSON_BYTES",
    "MAX_LOG_LIMIT", "MAX_LOG_PAGE_BYTES", "MAX_JSON_DEPTH", "MAX_ROOM_LIST_LIMIT", "MAX_ACTIVE_ROOMS",
    "MAX_DISBANDED_ROOM_TOMBSTONES", "DISBANDED_ROOM_RETENTION_SECONDS", "MAX_EVENTS_PER_ROOM",
    "MAX_ROOM_EVENT_BYTES", "MAX_GATEWAY_EVENT_BYTES", "CONTROL_EVENT_COUNT_RESERVE", "CONTROL_EVENT_BYTE_RESERVE",
    "MAX_REPLICA_ROOMS", "MAX_REPLICA_EVENT_BYTES", "MAX_NONTERMINAL_DELIVERIES")


class Limits(Protocol):
    """What a service reads its limits from: this module (read at call time, so lowering a constant here takes
    effect), or a :class:`LimitValues` snapshot a facade resolved from its own module for one call."""

    @property
    def MAX_ROOM_ID_CHARS(self) -> int: ...
    @property
    def MAX_EVENT_ID_CHARS(self) -> int: ...
    @property
    def MAX_ROOM_NAME_CHARS(self) -> int: ...
    @property
    def MAX_EVENT_KIND_CHARS(self) -> int: ...
    @property
    def MAX_ACTOR_ID_CHARS(self) -> int: ...
    @property
    def MAX_ACTOR_LABEL_CHARS(self) -> int: ...
    @property
    def MAX_ACTOR_JSON_BYTES(self) -> int: ...
    @property
    def MAX_MEMBERS(self) -> int: ...
    @property
    def MAX_MEMBERS_JSON_BYTES(self) -> int: ...
    @property
    def MAX_EVENT_JSON_BYTES(self) -> int: ...
    @property
    def MAX_LOG_LIMIT(self) -> int: ...
    @property
    def MAX_LOG_PAGE_BYTES(self) -> int: ...
    @property
    def MAX_JSON_DEPTH(self) -> int: ...
    @property
    def MAX_ROOM_LIST_LIMIT(self) -> int: ...
    @property
    def MAX_ACTIVE_ROOMS(self) -> int: ...
    @property
    def MAX_DISBANDED_ROOM_TOMBSTONES(self) -> int: ...
    @property
    def DISBANDED_ROOM_RETENTION_SECONDS(self) -> int: ...
    @property
    def MAX_EVENTS_PER_ROOM(self) -> int: ...
    @property
    def MAX_ROOM_EVENT_BYTES(self) -> int: ...
    @property
    def MAX_GATEWAY_EVENT_BYTES(self) -> int: ...
    @property
    def CONTROL_EVENT_COUNT_RESERVE(self) -> int: ...
    @property
    def CONTROL_EVENT_BYTE_RESERVE(self) -> int: ...
    @property
    def MAX_REPLICA_ROOMS(self) -> int: ...
    @property
    def MAX_REPLICA_EVENT_BYTES(self) -> int: ...
    @property
    def MAX_NONTERMINAL_DELIVERIES(self) -> int: ...


@dataclass(frozen=True, slots=True)
class LimitValues:
    """Every limit as a plain int, read once: what a facade passes a service for one call (see :meth:`read`)."""

    MAX_ROOM_ID_CHARS: int
    MAX_EVENT_ID_CHARS: int
    MAX_ROOM_NAME_CHARS: int
    MAX_EVENT_KIND_CHARS: int
    MAX_ACTOR_ID_CHARS: int
    MAX_ACTOR_LABEL_CHARS: int
    MAX_ACTOR_JSON_BYTES: int
    MAX_MEMBERS: int
    MAX_MEMBERS_JSON_BYTES: int
    MAX_EVENT_JSON_BYTES: int
    MAX_LOG_LIMIT: int
    MAX_LOG_PAGE_BYTES: int
    MAX_JSON_DEPTH: int
    MAX_ROOM_LIST_LIMIT: int
    MAX_ACTIVE_ROOMS: int
    MAX_DISBANDED_ROOM_TOMBSTONES: int
    DISBANDED_ROOM_RETENTION_SECONDS: int
    MAX_EVENTS_PER_ROOM: int
    MAX_ROOM_EVENT_BYTES: int
    MAX_GATEWAY_EVENT_BYTES: int
    CONTROL_EVENT_COUNT_RESERVE: int
    CONTROL_EVENT_BYTE_RESERVE: int
    MAX_REPLICA_ROOMS: int
    MAX_REPLICA_EVENT_BYTES: int
    MAX_NONTERMINAL_DELIVERIES: int

    def __post_init__(self) -> None:
        check_limits(self)

    @classmethod
    def read(cls, *sources: object) -> LimitValues:
        """Each limit from the first of ``sources`` that defines it (a facade module first), else from this
        module, all read now and taken as ints (a facade constant patched to ``1e6`` means 1,000,000).

        :param sources: modules or objects to read limits from, the first that defines a limit winning.
        :returns: the limits, as ints.
        """
        # A module's namespace is read directly (a facade reads this on every call); the last source read wins.
        values = {name: globals()[name] for name in LIMIT_NAMES}
        for source in reversed(sources):
            namespace = vars(source) if isinstance(source, ModuleType) else None
            for name in LIMIT_NAMES:
                if namespace is not None and name in namespace:
                    values[name] = namespace[name]
                elif namespace is None and hasattr(source, name):
                    values[name] = getattr(source, name)
        return cls(**{name: int(value) for name, value in values.items()})


def in_force(limits: Limits | None) -> Limits:
    """The limits a service reads for one call: ``limits``, or (None) this module, whose constants are read when
    the service reads them (so lowering one here takes effect). Anything else must hold every limit as a
    non-negative int (checked before any transaction opens), else :class:`~hostedrooms.errors.InvalidInputError`.

    :param limits: the caller's ``limits=``, or None.
    :returns: the limits to read.
    :raises InvalidInputError: ``limits`` lacks a limit or holds one that is not a non-negative int.
    """
    if limits is None or limits is _MODULE:
        return _MODULE
    if type(limits) is not LimitValues:  # a LimitValues was checked when it was made
        check_limits(limits)
    return limits


def check_limits(limits: object) -> None:
    """Refuse a ``limits=`` that lacks a limit or holds one that is not a non-negative int.

    :param limits: the object given as ``limits=``.
    :raises InvalidInputError: a limit is missing or not a non-negative int.
    """
    from .errors import InvalidInputError

    for name in LIMIT_NAMES:
        value = getattr(limits, name, None)
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise InvalidInputError(
                f"limits must be None, hostedrooms.limits or an object with every limit as a non-negative int "
                f"(LimitValues.read(...)); {type(limits).__name__} has {name} = {type(value).__name__}",
                field="limits")


from . import limits as _this_module  # noqa: E402  # itself: the module satisfies Limits (mypy checks it)

_MODULE: Limits = _this_module

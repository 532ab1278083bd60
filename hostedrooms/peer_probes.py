"""Non-blocking ownership probes of a peer store: does it host a live room, or hold a live peer reservation?

A probe answers on the synchronous prompt-admission path, so it never creates, migrates or waits on a store: it
reads through its own small cached engine per store (:func:`forget_probe_engines` drops them), bounded to
:data:`PROBE_TIMEOUT_SECONDS` of waiting, and a store that is missing answers False. They are re-exported by
:mod:`hostedrooms.peers`, whose identifier checks (:func:`room_and_profile`) live here so that module imports
this one and not the reverse.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from sqlalchemy import URL, Engine
from sqlalchemy import exc as sa_exc

from .backends import Pooler, backend_for_url, pooler_of, use_pooler
from .db import Target, engine_schema, resolve_url
from .engines import EngineCache
from .errors import InvalidInputError, RoomProbeUnavailableError, SchemaMissingError
from .limits import Limits, in_force
from .store.peers import PeerStore
from .telemetry import no_engine, traced
from .validation import clock, identifier

__all__ = ["PROBE_TIMEOUT_SECONDS", "forget_probe_engines", "probe_hosted_room", "probe_peer_room_reservation"]

#: How long a probe may wait for a lock (or a statement) before it answers "unavailable".
PROBE_TIMEOUT_SECONDS = 0.2


def room_id_of(value: Any, limits: Limits) -> str:
    """A validated room id (InvalidInputError otherwise)."""
    return identifier(value, error=InvalidInputError, label="room_id", max_chars=limits.MAX_ROOM_ID_CHARS)


def actor_id_of(value: Any, label: str, limits: Limits) -> str:
    """A validated actor id (a gateway, a member, a profile) called ``label`` (InvalidInputError otherwise)."""
    return identifier(value, error=InvalidInputError, label=label, max_chars=limits.MAX_ACTOR_ID_CHARS)


def room_and_profile(room_id: Any, target_profile: Any, limits: Limits) -> tuple[str, str]:
    """A reservation lookup's validated room id and target profile."""
    return room_id_of(room_id, limits), actor_id_of(target_profile, "target_profile", limits)


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
    """Dispose and drop the cached probe engines (tests; forked children): the next probe builds its own again."""
    _probe_engines.clear()


def _probe(target: Target, ask: Callable[[PeerStore], bool], unavailable: str) -> bool:
    """``ask``'s answer on a store of the target's probe connection, without creating, migrating or waiting on it.

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
            return ask(PeerStore(backend, connection))
    except sa_exc.SQLAlchemyError as exc:
        raise RoomProbeUnavailableError(unavailable) from exc


@traced("probe_hosted_room", engine=no_engine)
def probe_hosted_room(target: Target, *, room_id: str, limits: Limits | None = None) -> bool:
    """Whether this store hosts the live room ``room_id``; never creates, migrates or blocks.

    ``target`` is a SQLite path, a URL or an Engine (only its URL is used). On the synchronous
    prompt-admission path this fails fast under contention with ``RoomProbeUnavailableError``.

    :param target: the store: a SQLite path, a database URL, or an Engine (only its URL and schema are used).
    :param room_id: the room.
    :param limits: the identifier length limits (default: :mod:`hostedrooms.limits`).
    :returns: whether the store hosts ``room_id`` live (False for a missing store, schema or table).
    :raises InvalidInputError: ``room_id`` is invalid.
    :raises RoomProbeUnavailableError: the store failed or stayed locked past :data:`PROBE_TIMEOUT_SECONDS`.
    """
    room_id = room_id_of(room_id, in_force(limits))
    return _probe(target, lambda store: store.probe_live_room(room_id),
                  "hosted room ownership is temporarily unavailable")


@traced("probe_peer_room_reservation", engine=no_engine)
def probe_peer_room_reservation(
    target: Target, *, room_id: str, target_profile: str, now: float | None = None, limits: Limits | None = None
) -> bool:
    """Whether a live peer reservation fences the room/profile; never creates, migrates or blocks.

    :param target: the store: a SQLite path, a database URL, or an Engine (only its URL and schema are used).
    :param room_id: the room.
    :param target_profile: the target profile.
    :param now: the time the reservation must be live at (default: the wall clock).
    :param limits: the identifier length limits (default: :mod:`hostedrooms.limits`).
    :returns: whether a live, unrevoked reservation exists (False for a missing store, schema or table).
    :raises InvalidInputError: ``room_id`` or ``target_profile`` is invalid.
    :raises RoomProbeUnavailableError: the store failed or stayed locked past :data:`PROBE_TIMEOUT_SECONDS`.
    """
    room_id, target_profile = room_and_profile(room_id, target_profile, in_force(limits))
    timestamp = clock(now)
    return _probe(target, lambda store: store.probe_live_reservation(room_id, target_profile, timestamp),
                  "peer room ownership is temporarily unavailable")

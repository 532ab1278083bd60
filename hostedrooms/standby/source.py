"""The authority's side of replication: a :class:`PageSource` lists rooms and serves ``read_events`` pages.

A standby never needs more from the gateway it follows than four calls, which any transport can carry:

* ``list_rooms(after=, limit=)``: the rooms in code-point order of ``room_id`` after ``after``, each a
  :class:`~hostedrooms.standby.heads.RoomHead` (lineage, latest seq, disbanded);
* ``room_info(room_id)``: the room's name and members (what ``ingest_page`` stores beside the log);
* ``read_events(room_id, since_seq=, limit=)``: the verbatim result of the authority's ``read_events``
  (disbanded rooms included, so the disband itself is replicated);
* ``change_token()``: a cheap value that changes when the authority commits (None: it cannot tell, so the
  replicator relies on its interval).

:class:`EnginePageSource` answers them from the authority's own database (a SQLite file on the same host, or a
PostgreSQL the standby can reach); :class:`hostedrooms.standby.http.HttpPageSource` over HTTP from a gateway
that serves the same answers (:func:`hostedrooms.standby.http.answer`). Whatever a source returns is checked
again by the replicator and by ``ingest_page``: a source is trusted with nothing.
"""

from __future__ import annotations

import itertools
import os
import threading
from collections.abc import Callable, Hashable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar, cast, runtime_checkable

from sqlalchemy import Engine
from sqlalchemy.engine.interfaces import DBAPIConnection

from .. import rooms
from ..backends import backend_for
from ..db import create_engine
from ..errors import HostedRoomError, describe_target
from ..limits import Limits
from .heads import LISTING_PAGE, RoomHead, room_counters, room_heads

__all__ = [
    "EnginePageSource",
    "PageSource",
    "RoomInfo",
    "SourceAuthenticationError",
    "SourceProtocolError",
    "SourceUnavailableError",
    "call_source",
    "iter_rooms",
]


T = TypeVar("T")


class SourceUnavailableError(HostedRoomError):
    """The source could not be reached or did not answer in time (transient: retry later)."""


class SourceAuthenticationError(SourceUnavailableError):
    """The source refused this standby's credentials (HTTP 401 or 403: no token, or not the server's token).

    An operator must act (give both sides the same token), so it is a configuration error rather than a
    hiccup; it is a :class:`SourceUnavailableError` so that it ends the pass, reported as the pass's error,
    instead of refusing room after room (no room is at fault) and backing each off. A following replicator
    keeps trying at its interval, so it resumes once the server holds the token the standby sends."""


class SourceProtocolError(HostedRoomError):
    """The source answered with something that is not a valid answer (never trusted, never stored)."""


@dataclass(frozen=True, slots=True)
class RoomInfo:
    """A room's name and members, as ``ingest_page`` stores them beside the replicated log."""

    room_id: str
    name: str
    members: list[Any]

    def to_dict(self) -> dict[str, Any]:
        return {"room_id": self.room_id, "name": self.name, "members": self.members}


@runtime_checkable
class PageSource(Protocol):
    """The authority's side: its rooms and their ``read_events`` pages (see the module docstring)."""

    def list_rooms(self, *, after: str | None = None, limit: int = LISTING_PAGE) -> Sequence[RoomHead]:
        """Up to ``limit`` rooms whose ``room_id`` sorts after ``after`` (code-point order), in that order.

        :param after: list the rooms whose id sorts after this one (None: from the first).
        :param limit: the most rooms to list.
        :returns: the room heads, in room id order.
        """
        ...

    def room_info(self, room_id: str) -> RoomInfo:
        """The room's name and members (RoomNotFoundError when it is gone).

        :param room_id: the room.
        :returns: its name and members.
        :raises RoomNotFoundError: the room is gone.
        """
        ...

    def read_events(self, room_id: str, *, since_seq: int, limit: int) -> dict[str, Any]:
        """The authority's ``read_events`` page after ``since_seq``, disbanded rooms included.

        :param room_id: the room.
        :param since_seq: the page starts after this sequence number.
        :param limit: the most events in the page.
        :returns: the page, as :func:`hostedrooms.rooms.read_events` returns it.
        """
        ...

    def change_token(self) -> Hashable | None:
        """A value that differs after the authority committed anything; None when the source cannot tell.

        :returns: the token, or None.
        """
        ...

    def describe(self) -> str:
        """The source for messages (no secrets).

        :returns: the description.
        """
        ...

    def close(self) -> None:
        """Release connections."""
        ...


def iter_rooms(source: PageSource, *, page: int = LISTING_PAGE, after: str | None = None) -> Iterator[RoomHead]:
    """Every room of ``source`` (whose ``room_id`` sorts after ``after``), one listing page at a time, refusing
    a listing that does not move forward (a room id not after the previous one would make the walk repeat).

    Only the walk is checked here (a list of :class:`RoomHead` whose ``room_id`` strings ascend; anything else
    raises SourceProtocolError, and an exception from the source that is not a HostedRoomError becomes one):
    the other fields of each head are the caller's to validate. The walk never ends by itself on a listing
    that goes on forever: bound what you take of it.

    :param source: the page source.
    :param page: the rooms asked for per listing call.
    :param after: start after this room id (None: from the first).
    :returns: an iterator of the room heads, in room id order.
    :raises SourceProtocolError: a listing is malformed or does not move forward.
    """
    while True:
        heads = call_source("room listing", source.list_rooms, after=after, limit=page)
        if not isinstance(heads, (list, tuple)):
            raise SourceProtocolError("the source's room listing is not a list")
        if len(heads) > page:
            raise SourceProtocolError("source listed more rooms than asked for")
        for head in heads:
            if not isinstance(head, RoomHead) or not isinstance(head.room_id, str):
                raise SourceProtocolError("source listed something that is not a room head")
            if after is not None and not head.room_id > after:
                raise SourceProtocolError("source listed rooms out of order")
            after = head.room_id
            yield head
        if len(heads) < page:
            return


def call_source(what: str, method: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    """``method(*args, **kwargs)`` of a source; an exception that is not a HostedRoomError (a source's own bug, or
    a third-party transport's error) becomes a SourceProtocolError naming ``what``, so a source can never end a
    replicator with an undocumented error."""
    try:
        return method(*args, **kwargs)
    except HostedRoomError:
        raise
    except Exception as exc:  # a source is trusted with nothing, its failures included
        raise SourceProtocolError(f"the source failed on its {what}: {type(exc).__name__}: "
                                  f"{str(exc)[:200]}") from None


_fresh = itertools.count()


class EnginePageSource:
    """A :class:`PageSource` over the authority's own database.

    ``target`` is an Engine (used as given, never disposed here) or a path or URL (opened with
    ``create=False``: a missing SQLite file is refused, never created; disposed by :meth:`close`).

    The change token is SQLite's ``PRAGMA data_version`` on one connection held for the purpose (it changes
    whenever another connection commits to the file), and on PostgreSQL the :func:`room_counters` sums. A probe
    that fails answers a fresh token (so the caller runs a pass, which reports the real error) and reconnects.

    :param target: the authority's store: an Engine, a path or a URL.
    :param limits: the limits pages are read with (default: :mod:`hostedrooms.limits`).
    :raises StoreMissingError: a SQLite ``target`` does not exist.
    :raises StoreConfigurationError: ``target`` cannot be understood.
    """

    def __init__(self, target: Engine | str | os.PathLike[str], *, limits: Limits | None = None) -> None:
        self._owned = not isinstance(target, Engine)
        self.engine = target if isinstance(target, Engine) else create_engine(target, create=False)
        self.limits = limits
        self._probe_lock = threading.Lock()
        self._probe: DBAPIConnection | None = None

    def list_rooms(self, *, after: str | None = None, limit: int = LISTING_PAGE) -> list[RoomHead]:
        return room_heads(self.engine, after=after, limit=limit)

    def room_info(self, room_id: str) -> RoomInfo:
        state = rooms.room_state(self.engine, room_id=room_id, include_disbanded=True, limits=self.limits)
        return RoomInfo(str(state["room_id"]), str(state["name"]), list(state["members"]))

    def read_events(self, room_id: str, *, since_seq: int, limit: int) -> dict[str, Any]:
        page = rooms.read_events(self.engine, room_id=room_id, since_seq=since_seq, limit=limit,
                                 include_disbanded=True, limits=self.limits)
        return cast("dict[str, Any]", page)  # an EventPage; the protocol's pages are untrusted (checked again)

    def change_token(self) -> Hashable | None:
        backend = backend_for(self.engine)
        if backend.notifies:  # no commit counter to poll (PostgreSQL): sums over the rooms table instead
            try:
                return room_counters(self.engine)
            except HostedRoomError:
                return ("unavailable", next(_fresh))
        with self._probe_lock:
            try:
                if self._probe is None:
                    # A DB-API connection in autocommit (hostedrooms' SQLite connections emit BEGIN themselves,
                    # and only inside a unit of work): no transaction is held open between probes, so the WAL
                    # can checkpoint and the value reflects the latest commit.
                    self._probe = self.engine.raw_connection()
                return ("data_version", backend.change_counter(self._probe))
            except Exception:  # a hint only: the next pass reports the real (translated) error
                self._drop_probe()
                return ("unavailable", next(_fresh))

    def _drop_probe(self) -> None:
        probe, self._probe = self._probe, None
        if probe is not None:
            try:
                probe.close()  # back to the pool (SQLite keeps its own locks right across its connections)
            except Exception:  # already broken; nothing else holds it
                pass

    def describe(self) -> str:
        return describe_target(self.engine.url)

    def close(self) -> None:
        with self._probe_lock:
            self._drop_probe()
        if self._owned:
            self.engine.dispose()

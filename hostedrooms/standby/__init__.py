"""Standby gateways: keep replicas of every room of another gateway caught up, and take over in one call.

* :class:`~hostedrooms.standby.source.PageSource`: the authority's side (its rooms and ``read_events`` pages);
  :class:`EnginePageSource` reads the authority's database, :class:`HttpPageSource` a gateway's HTTP endpoint
  (served with :func:`~hostedrooms.standby.server.answer` or :class:`PageServer`).
* :class:`Replicator`: ``sync_once()`` brings every replica up to date and reports per room; ``run()`` follows
  (a :class:`Waker` says when to look again).
* :func:`failover`: promote every caught-up replica of a silent authority at ``epoch + 1``; with its store still
  reachable, fence it there first (:func:`fence_authority`) and catch up to the fence; otherwise a returning
  authority is demoted by a replicator reading from the new one.
"""

from __future__ import annotations

from .auth import PageToken, client_tls_context, read_token_file, server_tls_context, token_from_env
from .failover import FailoverReport, Fence, FencedSource, RoomFailover, failover, fence_authority
from .heads import ReplicaHead, RoomHead
from .http import HttpPageSource, PageServer, answer
from .open import open_source
from .replicator import Backoff, PageIngested, PassReport, Replicator, RoomReport
from .source import (
    EnginePageSource,
    PageSource,
    RoomInfo,
    SourceAuthenticationError,
    SourceProtocolError,
    SourceUnavailableError,
    iter_rooms,
)
from .wake import IntervalWaker, PollingWaker, Waker

__all__ = [
    "Backoff",
    "EnginePageSource",
    "FailoverReport",
    "Fence",
    "FencedSource",
    "HttpPageSource",
    "IntervalWaker",
    "PageIngested",
    "PageServer",
    "PageSource",
    "PageToken",
    "PassReport",
    "PollingWaker",
    "ReplicaHead",
    "Replicator",
    "RoomFailover",
    "RoomHead",
    "RoomInfo",
    "RoomReport",
    "SourceAuthenticationError",
    "SourceProtocolError",
    "SourceUnavailableError",
    "Waker",
    "answer",
    "client_tls_context",
    "failover",
    "fence_authority",
    "iter_rooms",
    "open_source",
    "read_token_file",
    "server_tls_context",
    "token_from_env",
]

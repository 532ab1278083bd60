"""Workloads and contenders of the comparison mode (``python bench/run.py --compare read``; bench/compare.py
runs them): hostedrooms beside its peers, each doing the same work through its own API.

A **workload** (:class:`Workload`, listed in :data:`WORKLOADS`) names the contender method its timed loop calls
(``method``), how many calls a round times (``calls``, full and ``--quick``), how many untimed warm-up calls
come first, and what the call does (``batch`` events per append call; ``stored`` events in the room a replay
reads; ``page`` size).

A **contender** (a :class:`Contender` subclass, listed in :data:`CONTENDERS`) takes part in every workload
whose ``method`` it defines, on the dialects it lists. Each contender runs in fresh processes:

- ``prepare()`` once per comparison, in its own process: create its database and schema, store what a replay
  reads; return a picklable ``state`` dict that every round receives;
- per round, in a fresh process: ``open(round_index)`` (connect, create that round's room or stream), the
  warm-up calls, then the timed calls ``method(index)``, each returning how many events it handled (the
  harness checks the total), all through ``drive()``; then ``durability()`` reads back, from the contender's
  OWN connection, the settings it ran with, and ``close()``;
- ``backend_pid()`` names its PostgreSQL backend, so the harness can add the server's CPU time.

**To add a contender** (an async API, a replica reader, another library): subclass :class:`Contender` (or an
existing one), set ``name`` (the ``--contenders`` name), ``label`` (the table's), ``dialects``, ``requires``
(modules; when one is missing the contender is skipped with a message) and ``default`` (False: runs only when
``--contenders`` names it), implement ``prepare``/``open``/``durability``/``close`` and the workload methods it
can do, and append the class to :data:`CONTENDERS`. An async contender overrides ``drive`` to run the loop in an
event loop it created in ``open`` (see :class:`HostedroomsToThread`, which runs the sync API through
``asyncio.to_thread``): the harness times ``drive`` as a whole, so the loop's own costs count, once.

**To add a workload** (replication catch-up, say): add a :class:`Workload` to :data:`WORKLOADS` with a new
``method`` name (``catch_up``), and define that method on the contenders that can do it (including
:class:`Hostedrooms`, the baseline every ratio divides by). ``prepare`` sees the workload as ``self.workload``
and sets up what the method needs.
"""

from __future__ import annotations

from bench.contenders.base import WORKLOADS, Contender, HostedroomsSchema, Workload
from bench.contenders.eventsourcing_peer import EventsourcingAggregate, EventsourcingApplication
from bench.contenders.floors import PooledDBAPIFloor, SQLAlchemyFloor, SQLAlchemyStatements
from bench.contenders.ours import (
    Hostedrooms,
    HostedroomsAsync,
    HostedroomsBareHop,
    HostedroomsPooled,
    HostedroomsToThread,
    RawIngestLoop,
)
from bench.contenders.raw import RawDictLoop, RawInsert, RawOwnStatements, RawReferenceStatements, ReferenceStyleRead

CONTENDERS: list[type[Contender]] = [
    Hostedrooms,
    RawIngestLoop,
    EventsourcingAggregate,
    EventsourcingApplication,
    RawReferenceStatements,
    RawInsert,
    RawOwnStatements,
    SQLAlchemyFloor,
    SQLAlchemyStatements,
    PooledDBAPIFloor,
    RawDictLoop,
    ReferenceStyleRead,
    HostedroomsToThread,
    HostedroomsBareHop,
    HostedroomsAsync,
    HostedroomsPooled,
]

__all__ = [
    "CONTENDERS",
    "WORKLOADS",
    "Contender",
    "EventsourcingAggregate",
    "EventsourcingApplication",
    "Hostedrooms",
    "HostedroomsAsync",
    "HostedroomsBareHop",
    "HostedroomsPooled",
    "HostedroomsSchema",
    "HostedroomsToThread",
    "PooledDBAPIFloor",
    "RawDictLoop",
    "RawIngestLoop",
    "RawInsert",
    "RawOwnStatements",
    "RawReferenceStatements",
    "ReferenceStyleRead",
    "SQLAlchemyFloor",
    "SQLAlchemyStatements",
    "Workload",
]

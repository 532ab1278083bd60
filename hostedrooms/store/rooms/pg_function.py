"""The one-statement append behind a transaction pooler: a call of the server-side function revision
``0011_pooler_append_functions`` installs (``hostedrooms_append_one``, ``hostedrooms_append_batch``).

Behind PgBouncer in transaction mode (``create_engine(..., pooler="transaction")``) nothing is prepared on the
server, so the append's data-modifying CTE (:mod:`.postgresql`) would be parsed and planned again at every call.
The functions do the same work in one round trip and PL/pgSQL keeps their plans for each server connection's life:
the client sends a one-line ``SELECT`` whose plan is trivial. Their rows and errors are the statement's: the
room's new ``next_seq`` (the other columns NULL) when it advanced, else the stored rows of the events' ids, else
nothing; SQLSTATE 22012 when no budget shard could pay (or a batch's rows were not all inserted), the unique
constraint when a concurrent writer stored an id first. The revision froze their text (a released migration never
changes meaning); a change of the statement's meaning needs a new revision with new functions.

Where they live: the revision creates them in the gateway's schema (the migration's current schema), their tables
qualified with that schema's name, so a call is resolved by the connection's ``search_path`` as every other
statement of the engine is (a schema per gateway: the pooler alias's ``search_path``; a database per gateway:
``public``), and costs no ``SET search_path``.

A database not yet upgraded to that revision (or downgraded below it) has no function: the first call fails with
SQLSTATE 42883 (undefined function), which writes nothing; the append then takes the full path, and the engine
remembers (for its life: an engine built after ``hostedrooms upgrade`` uses the function) to run the statement
instead, with one warning saying to run ``hostedrooms upgrade``. A library newer than the database keeps working,
as it does for every other revision a rolling upgrade has not applied yet.
"""

from __future__ import annotations

import logging
import weakref
from typing import Any

from sqlalchemy import Connection, text
from sqlalchemy.engine import Dialect
from sqlalchemy.exc import ProgrammingError

from ...engine_profile import known_record
from ...errors import UPGRADE_HINT, describe_target
from ...statements import HotStatement
from .base import int64

__all__ = ["FUNCTION_REVISION", "PoolerAppend", "function_missing"]

#: The revision that installs the functions.
FUNCTION_REVISION = "0011_pooler_append_functions"
#: SQLSTATE undefined_function.
_UNDEFINED_FUNCTION = "42883"
_FUNCTIONS = ("hostedrooms_append_one", "hostedrooms_append_batch")

# The arguments both functions take first, in their order (the statement's parameters, typed as the revision
# declared them; the casts also keep the server's choice of function independent of the driver's types).
_COMMON = (
    "CAST(:fast_room_id AS text), CAST(:fast_gateway_id AS text), CAST(:fast_epoch AS bigint), "
    "CAST(:fast_count AS bigint), CAST(:fast_size AS bigint), CAST(:fast_max_events AS bigint), "
    "CAST(:fast_max_room_bytes AS bigint), CAST(:fast_spread_limit AS bigint), CAST(:fast_now AS float8), "
    "CAST(:notify_channel AS text)")
_CALL_ONE = (
    "SELECT * FROM hostedrooms_append_one(" + _COMMON + ", CAST(:event_id AS text), CAST(:kind AS text), "  # noqa: S608
    "CAST(:actor_json AS text), CAST(:authority_epoch AS bigint), CAST(:payload_json AS text))")
_CALL_BATCH = "SELECT * FROM hostedrooms_append_batch(" + _COMMON + ", CAST(:fast_rows AS json))"  # noqa: S608

_log = logging.getLogger(__name__)

#: The engines (their dialects: an engine and those derived from it by ``execution_options()``) whose database
#: lacks the functions: they run the statement.
_missing: weakref.WeakSet[Dialect] = weakref.WeakSet()


def _calls(statement: str) -> HotStatement:
    return HotStatement(text(statement).bindparams(*(int64(name) for name in (
        "fast_size", "fast_spread_limit", "fast_max_room_bytes", "fast_count", "fast_max_events"))))


def function_missing(dialect: Dialect) -> bool:
    """Whether the engine of ``dialect`` found the append functions missing (and runs the statement)."""
    return dialect in _missing


class PoolerAppend:
    """The calls of the append functions, for a :class:`~.postgresql.PostgreSQLRoomStore`."""

    __slots__ = ("_batch", "_one")

    def __init__(self) -> None:
        self._one = _calls(_CALL_ONE)
        self._batch = _calls(_CALL_BATCH)

    @staticmethod
    def applies(connection: Connection) -> bool:
        """Whether ``connection``'s appends call the function: its engine was built with
        ``pooler="transaction"`` and has not found the functions missing."""
        dialect = connection.dialect
        record = known_record(dialect)
        if record is None or record.pooler is None or record.pooler.mode != "transaction":
            return False
        return dialect not in _missing

    def rows(self, connection: Connection, params: dict[str, Any], *, batch: bool) -> list[tuple[Any, ...]] | None:
        """The function's rows for the statement's ``params`` (a batch's ``fast_rows``, or one event's columns);
        None when the function is missing (nothing was written; the engine remembers it)."""
        try:
            cursor = (self._batch if batch else self._one).run(connection, params)
        except ProgrammingError as exc:
            if getattr(exc.orig, "sqlstate", None) != _UNDEFINED_FUNCTION or not _names_ours(exc):
                raise
            _forget(connection)
            return None
        try:
            found: list[tuple[Any, ...]] = cursor.fetchall()
        finally:
            cursor.close()
        return found


def _names_ours(exc: ProgrammingError) -> bool:
    """Whether the undefined function is one of the append functions (not one they call)."""
    message = str(exc.orig)
    return any(name in message for name in _FUNCTIONS)


def _forget(connection: Connection) -> None:
    dialect = connection.dialect
    if dialect in _missing:
        return
    _missing.add(dialect)
    _log.warning(
        "hosted room store %s has no append functions (revision %s): appends through the transaction pooler run "
        "the statement, planned at every call; %s", describe_target(connection.engine.url), FUNCTION_REVISION,
        UPGRADE_HINT, extra={"event": "store.append_function_missing"})

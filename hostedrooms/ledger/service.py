"""The secure-peer delivery ledger service: :class:`DeliveryLedger`, composed of its parts."""

from __future__ import annotations

from ..telemetry import traced_methods
from .deliveries import Deliveries
from .outbound import OutboundIntents
from .responses import ResponseIntents
from .retention import Retention

#: The public operations, each one span (hostedrooms.telemetry; docs/observability.md).
_TRACED = (
    "prepare", "get", "authorize", "fail_ownerless_authorized", "bind_owner", "defer_admission",
    "pending_admissions", "nonterminal_for_chat", "finish", "recoverable", "for_run", "nonterminal_for_connection",
    "prepare_response", "mark_response_committed", "clear_response_intent", "defer_response", "pending_responses",
    "prepare_outbound", "pending_outbound_for_chat", "pending_outbound_for_route", "pending_outbound_for_connection",
    "outbound", "commit_outbound", "defer_outbound", "fail_outbound", "pending_outbound", "recoverable_outbound",
    "prune",
)


@traced_methods("ledger", _TRACED)
class DeliveryLedger(Deliveries, ResponseIntents, OutboundIntents, Retention):
    """The secure-peer delivery ledger on ``engine`` (SQLite or PostgreSQL, migrated to head).

    ``clock`` returns the current time in seconds (default: ``time.time`` read at call time); ledger
    timestamps are ``int(clock())``. ``path`` is the SQLite file to guard when it differs from the engine's
    own (the seed-compatible facade passes the path it was given, before symlink resolution). ``limits`` is
    where MAX_NONTERMINAL_DELIVERIES is read, at call time: a :class:`~hostedrooms.limits.Limits` (default: the
    :mod:`hostedrooms.limits` module), or a zero-argument provider of one (the facade resolves its own module's
    constant with :meth:`~hostedrooms.limits.LimitValues.read`). Every method is one transaction and returns
    the reference's shapes: a delivery row with ``body`` decoded, an outbound row with ``snapshot`` and
    ``response`` decoded (typed :class:`~hostedrooms.records.DeliveryRecord` and
    :class:`~hostedrooms.records.OutboundRecord`), or None.

    Stored values follow the store's rules (docs/reliability.md, "Limits on stored values"): text with a NUL
    character or a lone surrogate is refused with ``LedgerInputError``, a ``ValueError`` (a caller's error text is
    recorded escaped instead), and snapshots and responses nest at most MAX_JSON_DEPTH deep. A row whose stored JSON
    cannot be decoded (left by the reference) is skipped by the listings and raises ``StorageError`` in a call
    about that row.

    :param engine: the ledger's store, migrated to head.
    :param clock: returns the time in Unix seconds (default: :func:`time.time`).
    :param path: the SQLite file to guard, when it differs from the engine's own.
    :param limits: where MAX_NONTERMINAL_DELIVERIES is read: a Limits, a zero-argument provider of one, or None.
    :raises LedgerInputError: ``clock`` or ``path`` is invalid.
    :raises InvalidInputError: ``limits`` lacks a limit or holds one that is not a non-negative int.
    :raises LedgerPermissionError: the SQLite ledger file or its folder is unsafe.
    :raises StorageError: the store cannot be used, or is not crash-safe (SQLite without WAL and
        ``synchronous=FULL``).
    """

    def backlog(self) -> dict[tuple[str, str], int]:
        """The non-terminal rows by ``(table, state)``: ``("deliveries", state)`` for each non-terminal delivery
        state and ``("outbound", "pending")``, zeros included (one read transaction; the
        ``hostedrooms.ledger.backlog`` gauge of :func:`hostedrooms.ledger.observe_ledger`).

        :returns: the row count of each ``(table, state)``.
        :raises LedgerPermissionError: the SQLite ledger file or its folder is unsafe (a link, another owner, open
            access).
        :raises StorageError: the database failed underneath; nothing was committed.
        """

        return self._read(lambda uow: uow.ledger.backlog())

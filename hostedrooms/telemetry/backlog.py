"""The ledger's backlog gauge: :func:`observe_ledger` registers a ledger, each metric collection reads it.

The gauge (``hostedrooms.ledger.backlog``) is one of hostedrooms' OpenTelemetry instruments; this module feeds it
through :func:`observe_gauge`. A ledger is anything with an ``engine`` and a ``backlog()`` (:class:`BacklogSource`:
a :class:`~hostedrooms.ledger.DeliveryLedger`), so telemetry never imports the ledger package; the ledger
package exports the same function (``hostedrooms.ledger.observe_ledger``), and ``hostedrooms.telemetry`` keeps it
where docs/observability.md has always named it.
"""

from __future__ import annotations

import weakref
from collections.abc import Mapping
from typing import Any, Protocol

from sqlalchemy import Engine

from .attributes import LEDGER_STATE, LEDGER_TABLE, store_attributes
from .instruments import BACKLOG, observe_gauge

__all__ = ["BacklogSource", "observe_ledger"]


class BacklogSource(Protocol):
    """What the backlog gauge reads: a :class:`~hostedrooms.ledger.DeliveryLedger`."""

    @property
    def engine(self) -> Engine: ...

    def backlog(self) -> Mapping[tuple[str, str], int]: ...


_ledgers: weakref.WeakSet[BacklogSource] = weakref.WeakSet()


def observe_ledger(ledger: BacklogSource) -> None:
    """Report ``ledger``'s backlog (``hostedrooms.ledger.backlog``: its non-terminal rows by table and state,
    :meth:`DeliveryLedger.backlog <hostedrooms.ledger.DeliveryLedger.backlog>`) at each metric collection: one
    read transaction per collection, on the collecting thread. The ledger is held weakly.

    :param ledger: the ledger (anything with a ``backlog()`` method and an ``engine``).
    """
    _ledgers.add(ledger)


def _observations() -> list[tuple[float, Mapping[str, Any]]]:
    observations: list[tuple[float, Mapping[str, Any]]] = []
    for ledger in list(_ledgers):
        base = store_attributes(ledger.engine)
        try:
            counts = ledger.backlog()
        except Exception:  # an unreachable store: no observation this time (a gauge callback must not raise)
            continue
        for (table, state), count in counts.items():
            observations.append((count, {**base, LEDGER_TABLE: table, LEDGER_STATE: state}))
    return observations


observe_gauge(BACKLOG, _observations)

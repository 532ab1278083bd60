"""The ledger's backlog gauge: :func:`observe_ledger` registers a ledger, each metric collection reads it.

The gauge (``hostedrooms.ledger.backlog``) is one of hostedrooms' OpenTelemetry instruments; this module feeds it
through :func:`hostedrooms.telemetry.observe_gauge` (docs/observability.md).
"""

from __future__ import annotations

import weakref
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from ..telemetry import BACKLOG, observe_gauge, store_attributes
from ..telemetry.attributes import LEDGER_STATE, LEDGER_TABLE

if TYPE_CHECKING:
    from .service import DeliveryLedger

__all__ = ["observe_ledger"]

_ledgers: weakref.WeakSet[DeliveryLedger] = weakref.WeakSet()


def observe_ledger(ledger: DeliveryLedger) -> None:
    """Report ``ledger``'s backlog (``hostedrooms.ledger.backlog``: its non-terminal rows by table and state,
    :meth:`DeliveryLedger.backlog <hostedrooms.ledger.DeliveryLedger.backlog>`) at each metric collection: one
    read transaction per collection, on the collecting thread. The ledger is held weakly."""
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

"""OpenTelemetry for hostedrooms: one span per public service call and a few metrics, all optional.

hostedrooms depends on the OpenTelemetry *API* only (the ``otel`` extra: ``pip install 'hostedrooms[otel]'``);
the application configures the SDK, its exporters and its sampling. Without the API installed nothing of
OpenTelemetry is imported and every service runs exactly as without this package. With the API and no SDK
configured (no tracer or meter provider set), a service call checks that once per call and runs the plain
function: no span, no measurement. :func:`configure` points hostedrooms at providers of its own instead of the
global ones (tests, or an application keeping hostedrooms' signals apart).

What is recorded (docs/observability.md lists every name): spans named after ``db.operation.name`` with
OpenTelemetry's database attributes (``db.system.name``, ``db.namespace``, ``db.operation.name``; on PostgreSQL
``server.address`` and ``server.port``; on a failure the database's ``db.response.status_code``) plus room id,
gateway id, epoch, seq range, outcome and error class; never a message body, payload, actor, grant, claim,
lease token, digest, error text or URL. The metrics are hostedrooms' own (``hostedrooms.operation.duration``,
not the conventions' SQL-level ``db.client.operation.duration``), their durations in seconds with the
conventions' bucket boundaries as advice.

Layout: :mod:`.providers` (which providers record, the no-SDK fast path, :func:`configure`), :mod:`.spans`
(:func:`traced` on a function, :func:`traced_methods` on the ledger class, :func:`traced_block` on a block),
:mod:`.attributes` (names, what is recorded, a store's ``db.*`` and ``server.*`` attributes, a failure's status
code), :mod:`.instruments` (the instruments, and :func:`observe_gauge`, the
hook through which the standby's lag and the ledger's backlog feed their gauges) and :mod:`.metrics` (the
metrics that need a value from inside a service, one call each: :func:`count_appended`, :func:`count_retry`,
:func:`follow_woke`).
"""

from __future__ import annotations

from .attributes import store_attributes
from .backlog import observe_ledger
from .instruments import BACKLOG, LAG_SECONDS, LAG_SEQS, GaugeReader, observe_gauge
from .metrics import count_appended, count_retry, follow_woke
from .providers import SCOPE, Signals, configure
from .spans import no_engine, traced, traced_block, traced_methods

__all__ = [
    "BACKLOG",
    "LAG_SECONDS",
    "LAG_SEQS",
    "SCOPE",
    "GaugeReader",
    "Signals",
    "configure",
    "count_appended",
    "count_retry",
    "follow_woke",
    "no_engine",
    "observe_gauge",
    "observe_ledger",
    "store_attributes",
    "traced",
    "traced_block",
    "traced_methods",
]

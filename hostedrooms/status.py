"""A store's status in one read: rooms against their caps, the gateway budget, the rooms nearest their per-room
limits, the delivery ledger's backlog, and the replicas' lag (``hostedrooms status``).

:func:`store_status` reads everything in one read-only snapshot (PostgreSQL: a ``REPEATABLE READ, READ ONLY``
transaction, which a hot standby serves too; SQLite: one read transaction) and never writes or migrates.
:func:`assess` turns a status into a monitoring verdict against :class:`Thresholds`: ``ok``, ``warning`` or
``critical``, with one :class:`Finding` per limit or age that crossed a threshold. The exit codes of the command
follow the Nagios plugin convention (:data:`EXIT_CODES`; 3 is ``unknown``: the store could not be read), and
:func:`perfdata` gives the performance data a monitoring system graphs.

Replica lag is what the store itself knows: each replica's ingested head (``last_seq``) and the source's latest
seq as the last ingested page reported it (``latest_seq``); the lag is their difference as of that page. A
source that appended since is not seen here (the replicator's report, or the source's own status, sees it).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal, cast

from sqlalchemy import Connection
from typing_extensions import TypedDict

from . import migrate
from .engines import EngineSource, resolve_engine
from .errors import UPGRADE_HINT, InvalidInputError, SchemaMissingError
from .limits import Limits, in_force
from .models import DELIVERY_STATES, OUTBOUND_STATES
from .queries import status as reads
from .records import (
    Backlog,
    CapUse,
    DeliveryBacklog,
    LedgerStatus,
    OutboundBacklog,
    ReplicaLag,
    ReplicasStatus,
    RoomsStatus,
    RoomUse,
    SchemaStatus,
    StoreStatus,
)
from .store.ledger import NONTERMINAL_DELIVERY_STATES
from .uow import UnitOfWork
from .validation import bounded_int, clock

__all__ = [
    "CRITICAL",
    "EXIT_CODES",
    "OK",
    "UNKNOWN",
    "WARNING",
    "Assessment",
    "Finding",
    "Thresholds",
    "assess",
    "perfdata",
    "store_status",
]

#: The verdicts, worst last.
OK, WARNING, CRITICAL, UNKNOWN = "ok", "warning", "critical", "unknown"
Verdict = Literal["ok", "warning", "critical", "unknown"]
#: The exit code of each verdict (the Nagios plugin convention).
EXIT_CODES: Mapping[str, int] = {OK: 0, WARNING: 1, CRITICAL: 2, UNKNOWN: 3}
#: The most rooms and replicas a status lists (``top``).
MAX_TOP = 500


def _cap(used: int, limit: int, limit_name: str) -> CapUse:
    # A limit of 0 admits nothing: it is full.
    percent = round(used * 100 / limit, 2) if limit > 0 else 100.0
    return {"used": used, "limit": limit, "percent": percent, "limit_name": limit_name}


def _of(used: int, lim: Limits, limit_name: str) -> CapUse:
    return _cap(used, int(getattr(lim, limit_name)), limit_name)


def _age(now: float, created_at: Any) -> float | None:
    return None if created_at is None else max(0.0, now - float(created_at))


def store_status(
    target: EngineSource, *, now: float | None = None, limits: Limits | None = None, top: int = 10
) -> StoreStatus:
    """The status of the store ``target`` at ``now`` (default: the time of the call), read in one read-only
    snapshot against ``limits`` (default: :mod:`hostedrooms.limits`); ``top`` bounds the lists of fullest rooms
    and most lagging replicas (0 to :data:`MAX_TOP`).

    Raises :class:`~hostedrooms.errors.SchemaMissingError` for a database without hostedrooms' schema, the
    :class:`~hostedrooms.errors.StorageError` subclasses for a store that cannot be read, and
    :class:`~hostedrooms.errors.InvalidInputError` for a bad ``now`` or ``top``. Writes nothing.

    :param target: the store: an :class:`~sqlalchemy.Engine`, or a zero-argument factory returning one.
    :param now: the time in Unix seconds (default: the wall clock).
    :param limits: the limits in force (default: :mod:`hostedrooms.limits`).
    :param top: how many fullest rooms and most lagging replicas to list, 0 to MAX_TOP.
    :returns: the store's status.
    :raises InvalidInputError: ``now``, ``top`` or ``limits`` is invalid.
    :raises MisuseError: ``target`` is not a SQLAlchemy Engine.
    :raises SchemaMissingError: the database has no hostedrooms schema.
    :raises StorageError: the store could not be read.
    """
    timestamp = clock(now)
    top = bounded_int(top, error=InvalidInputError, message=f"top must be an integer from 0 to {MAX_TOP}",
                      high=MAX_TOP, field="top")
    lim = in_force(limits)
    engine = resolve_engine(target)
    with UnitOfWork(engine, write=False) as uow:
        uow.backend.snapshot_reads(uow.connection)
        schema = _schema(uow.connection)
        room_status = _rooms(uow, lim, top)
        replica_status = _replicas(uow, lim, top, timestamp)
        ledger_status = _ledger(uow.connection, lim, timestamp)
    return {"now": timestamp, "backend": uow.backend.name, "schema": schema, "rooms": room_status,
            "replicas": replica_status, "ledger": ledger_status}


def _schema(connection: Connection) -> SchemaStatus:
    revision = migrate.current_revision(connection)
    if revision is None:
        raise SchemaMissingError(f"no hostedrooms schema here; {UPGRADE_HINT} first")
    head = migrate.head_revision()
    return {"revision": revision, "head": head, "at_head": revision == head}


def _rooms(uow: UnitOfWork, lim: Limits, top: int) -> RoomsStatus:
    connection = uow.connection
    live_rooms, disbanded, events, disbanded_bytes, most_events, most_bytes = reads.room_totals(connection)
    events_limit, bytes_limit = float(max(1, lim.MAX_EVENTS_PER_ROOM)), float(max(1, lim.MAX_ROOM_EVENT_BYTES))
    rows = reads.fullest_rooms(connection, uow.backend, events_limit, bytes_limit, top) if top else []
    fullest: list[RoomUse] = [
        {"room_id": str(room_id), "events": _of(int(events_used), lim, "MAX_EVENTS_PER_ROOM"),
         "bytes": _of(int(bytes_used), lim, "MAX_ROOM_EVENT_BYTES")} for room_id, events_used, bytes_used in rows]
    return {
        "live": _of(live_rooms, lim, "MAX_ACTIVE_ROOMS"),
        "disbanded": _of(disbanded, lim, "MAX_DISBANDED_ROOM_TOMBSTONES"),
        "events": events,
        "bytes": _of(uow.rooms.gateway_bytes(), lim, "MAX_GATEWAY_EVENT_BYTES"),
        "disbanded_bytes": disbanded_bytes,
        "most_events": _of(most_events, lim, "MAX_EVENTS_PER_ROOM"),
        "most_bytes": _of(most_bytes, lim, "MAX_ROOM_EVENT_BYTES"),
        "fullest": fullest,
    }


def _replicas(uow: UnitOfWork, lim: Limits, top: int, now: float) -> ReplicasStatus:
    count, behind_count, lag_total, max_lag, largest = reads.replica_totals(uow.connection)
    rows = reads.most_behind_replicas(uow.connection, uow.backend, top) if top else []
    most_behind: list[ReplicaLag] = []
    for room_id, gateway, epoch, last_seq, latest_seq, event_bytes, updated_at in rows:
        most_behind.append({
            "room_id": str(room_id), "authority": {"gateway_id": str(gateway), "epoch": int(epoch)},
            "last_seq": int(last_seq), "latest_seq": int(latest_seq), "lag": max(0, int(latest_seq) - int(last_seq)),
            "bytes": _of(int(event_bytes), lim, "MAX_REPLICA_EVENT_BYTES"), "updated_at": float(updated_at),
            "since_update": max(0.0, now - float(updated_at))})
    return {"rooms": _of(count, lim, "MAX_REPLICA_ROOMS"), "behind": behind_count, "lag": lag_total,
            "max_lag": max_lag, "largest": _of(largest, lim, "MAX_REPLICA_EVENT_BYTES"), "most_behind": most_behind}


def _by_state(found: Mapping[str, tuple[int, Any]], states: tuple[str, ...], now: float) -> dict[str, Backlog]:
    by_state: dict[str, Backlog] = {}
    for state in states:
        count, oldest = found.get(state, (0, None))
        by_state[state] = {"count": count, "oldest_age": _age(now, oldest)}
    return by_state


def _ledger(connection: Connection, lim: Limits, now: float) -> LedgerStatus:
    delivery_states = _by_state(reads.delivery_states(connection), DELIVERY_STATES, now)
    outbound_states = _by_state(reads.outbound_states(connection), OUTBOUND_STATES, now)
    waiting = [delivery_states[state] for state in NONTERMINAL_DELIVERY_STATES] + [outbound_states["pending"]]
    ages = [item["oldest_age"] for item in waiting if item["oldest_age"] is not None]
    in_flight = sum(delivery_states[state]["count"] for state in NONTERMINAL_DELIVERY_STATES)
    return {
        "deliveries": cast(DeliveryBacklog, delivery_states),
        "outbound": cast(OutboundBacklog, outbound_states),
        "in_flight": _of(in_flight, lim, "MAX_NONTERMINAL_DELIVERIES"),
        "responses_pending": reads.responses_pending(connection),
        "backlog": {"count": sum(item["count"] for item in waiting), "oldest_age": max(ages) if ages else None},
    }


# --- the verdict -----------------------------------------------------------------------------------------------


class Finding(TypedDict):
    """One threshold crossed: ``check`` names what was measured (``rooms.live``, ``ledger.backlog_age``, ...),
    ``state`` is ``warning`` or ``critical``, ``value`` and ``threshold`` what was compared (a percent of a
    limit, seconds or events) and ``message`` says it in a line."""

    check: str
    state: str
    value: float
    threshold: float
    message: str


class Assessment(TypedDict):
    """The verdict of :func:`assess`: ``state`` (``ok``, ``warning`` or ``critical``), the ``exit_code`` the
    command returns for it, and every finding, the critical ones first."""

    state: str
    exit_code: int
    findings: list[Finding]


def _threshold(value: float | None, option: str) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) or value < 0:
        raise InvalidInputError(f"{option} must be a finite number, 0 or more", field=option)
    return float(value)


@dataclass(frozen=True, slots=True)
class Thresholds:
    """Where :func:`assess` warns and where it goes critical. ``warn_percent``/``critical_percent``: of any limit
    (the live rooms, the gateway's bytes net of disbanded rooms, the fullest room's events and bytes, the
    replicas and the largest replica, the ledger's in-flight deliveries). ``*_backlog_age``: seconds since the
    oldest unfinished ledger item was created; ``*_lag``: a replica's lag in events, crossed when passed (0: any
    lag); ``schema_behind``: the
    verdict when the store's schema is not this installation's head (``ok`` to ignore). None: not checked.
    A warning threshold above its critical one is refused (InvalidInputError)."""

    warn_percent: float | None = 80.0
    critical_percent: float | None = 95.0
    warn_backlog_age: float | None = None
    critical_backlog_age: float | None = None
    warn_lag: float | None = None
    critical_lag: float | None = None
    schema_behind: str = WARNING

    def __post_init__(self) -> None:
        for warn, critical in (("warn_percent", "critical_percent"), ("warn_backlog_age", "critical_backlog_age"),
                               ("warn_lag", "critical_lag")):
            low = _threshold(getattr(self, warn), warn.replace("_", "-"))
            high = _threshold(getattr(self, critical), critical.replace("_", "-"))
            if low is not None and high is not None and low > high:
                raise InvalidInputError(f"--{warn.replace('_', '-')} ({low:g}) is above --"
                                        f"{critical.replace('_', '-')} ({high:g})", field=warn)
        if self.schema_behind not in (OK, WARNING, CRITICAL):
            raise InvalidInputError("schema_behind must be ok, warning or critical", field="schema_behind")


def _caps(status: StoreStatus) -> list[tuple[str, str, CapUse]]:
    room_status, replica_status = status["rooms"], status["replicas"]
    gateway = room_status["bytes"]
    # Disbanded rooms' bytes are pruned before an append is refused: only the rest can fill the gateway.
    live_bytes = _cap(max(0, gateway["used"] - room_status["disbanded_bytes"]), gateway["limit"], gateway["limit_name"])
    return [
        ("rooms.live", "MAX_ACTIVE_ROOMS", room_status["live"]),
        ("rooms.bytes", "MAX_GATEWAY_EVENT_BYTES (live rooms)", live_bytes),
        ("rooms.room_events", "MAX_EVENTS_PER_ROOM (the room with the most events)", room_status["most_events"]),
        ("rooms.room_bytes", "MAX_ROOM_EVENT_BYTES (the room with the most bytes)", room_status["most_bytes"]),
        ("replicas.rooms", "MAX_REPLICA_ROOMS", replica_status["rooms"]),
        ("replicas.replica_bytes", "MAX_REPLICA_EVENT_BYTES (the largest replica)", replica_status["largest"]),
        ("ledger.in_flight", "MAX_NONTERMINAL_DELIVERIES", status["ledger"]["in_flight"]),
    ]


def _crossed(check: str, value: float, warn: float | None, critical: float | None,
             describe: str, *, above: bool = False) -> Finding | None:
    """The finding of ``value`` against its thresholds: reached (``>=``), or with ``above`` passed (``>``)."""
    for state, threshold in ((CRITICAL, critical), (WARNING, warn)):
        if threshold is not None and (value > threshold if above else value >= threshold):
            return {"check": check, "state": state, "value": float(value), "threshold": float(threshold),
                    "message": f"{describe} ({'>' if above else '>='} {threshold:g})"}
    return None


def assess(status: StoreStatus, thresholds: Thresholds | None = None) -> Assessment:
    """The monitoring verdict of ``status`` against ``thresholds`` (default: :class:`Thresholds`' defaults, 80%
    and 95% of every limit). A percent or an age at its threshold crosses it; a replica lag crosses its
    threshold when above it (Nagios's convention: ``warn_lag=0`` warns at any lag and never at none). The
    disbanded rooms are not checked against MAX_DISBANDED_ROOM_TOMBSTONES: at the cap the oldest tombstone is
    purged, by design, and nothing is refused.

    :param status: what :func:`store_status` returned.
    :param thresholds: the warning and critical thresholds (default: :class:`Thresholds`' defaults).
    :returns: the state, its exit code and the findings, critical ones first.
    """
    rules = thresholds if thresholds is not None else Thresholds()
    findings: list[Finding] = []
    for check, limit_name, use in _caps(status):
        found = _crossed(check, use["percent"], rules.warn_percent, rules.critical_percent,
                         f"{use['used']:,} of {limit_name} {use['limit']:,}: {use['percent']:g}%")
        findings += [found] if found else []
    age = status["ledger"]["backlog"]["oldest_age"]
    if age is not None:
        found = _crossed("ledger.backlog_age", age, rules.warn_backlog_age, rules.critical_backlog_age,
                         f"the oldest unfinished ledger item is {age:,.0f} s old")
        findings += [found] if found else []
    max_lag = status["replicas"]["max_lag"]
    # A lag is always there (0: caught up), so its thresholds are Nagios's: crossed when passed, and
    # --warn-lag 0 warns at any lag, never at none.
    found = _crossed("replicas.lag", max_lag, rules.warn_lag, rules.critical_lag,
                     f"a replica is {max_lag:,} events behind its source's last reported seq", above=True)
    findings += [found] if found else []
    schema = status["schema"]
    if not schema["at_head"] and rules.schema_behind != OK:
        findings.append({"check": "schema", "state": rules.schema_behind, "value": 0.0, "threshold": 0.0,
                         "message": f"the schema is at {schema['revision']}, not this installation's head "
                                    f"{schema['head']}"})
    findings.sort(key=lambda item: item["state"] != CRITICAL)
    state = findings[0]["state"] if findings else OK
    return {"state": state, "exit_code": EXIT_CODES[state], "findings": findings}


def perfdata(status: StoreStatus, thresholds: Thresholds | None = None) -> str:
    """The Nagios performance data of ``status`` (what monitoring systems graph): each checked limit's percent, the
    oldest backlog item's age in seconds (0 when there is none) and the largest replica lag, each as
    ``label=value[unit];warn;crit;min;max`` (an empty field: not checked, or no maximum).

    :param status: what :func:`store_status` returned.
    :param thresholds: the thresholds to print beside each value (default: :class:`Thresholds`' defaults).
    :returns: the performance data, items separated by spaces.
    """
    rules = thresholds if thresholds is not None else Thresholds()

    def field(value: float | None) -> str:
        return "" if value is None else f"{value:g}"

    items = [f"{check}={use['percent']:g}%;{field(rules.warn_percent)};{field(rules.critical_percent)};0;"
             for check, _, use in _caps(status)]
    age = status["ledger"]["backlog"]["oldest_age"]
    items.append(f"ledger.backlog_age={age or 0:g}s;{field(rules.warn_backlog_age)};"
                 f"{field(rules.critical_backlog_age)};0;")
    items.append(f"replicas.lag={status['replicas']['max_lag']};{field(rules.warn_lag)};{field(rules.critical_lag)};0;")
    return " ".join(items)

"""What the benchmark workloads (bench/run.py) and the comparison contenders (bench/contenders/) share: the
event every contender stores, the raw-driver appender, durability read-back and CPU accounting; and what
bench/run.py's workload modules share: a workload's :class:`Result`, its :class:`Setup` and :func:`new_room`."""

from __future__ import annotations

import json
import os
import sqlite3
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

GATEWAY = "install:bench"
KIND = "message.user"
ACTOR = {"kind": "user", "id": "u1"}
PAYLOAD = {"text": "hello from the benchmark " + "x" * 64}


def canonical(value: Any) -> str:
    """The canonical JSON text hostedrooms stores for an actor or a payload."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"))


ACTOR_JSON = canonical(ACTOR)
PAYLOAD_JSON = canonical(PAYLOAD)
SQLITE_SYNCHRONOUS = {0: "OFF", 1: "NORMAL", 2: "FULL", 3: "EXTRA"}


def raise_limits() -> None:
    """Benchmarks fill rooms past the default per-room history limit on purpose."""
    from hostedrooms import limits

    limits.MAX_EVENTS_PER_ROOM = 1_000_000
    limits.MAX_GATEWAY_EVENT_BYTES = 1 << 40
    limits.MAX_ROOM_EVENT_BYTES = 1 << 40


def cpu_seconds(pid: int | None) -> float | None:
    """CPU time (user + system) of process ``pid`` so far, where /proc shows it (a local server); else None."""
    if pid is None:
        return None
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def local_backend(pid: int | None) -> int | None:
    """``pid`` when it is a PostgreSQL backend on this machine (so its /proc CPU time is the server's work for
    our connection), else None: with a remote server the number names some unrelated local process."""
    if pid is None:
        return None
    try:
        name = Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return None
    return pid if name.startswith("postgres") else None


def postgres_connect(target: str) -> Any:
    """A psycopg 3 connection (autocommit) to the database a hostedrooms PostgreSQL URL names."""
    import psycopg
    from sqlalchemy import make_url

    url = make_url(target)
    return psycopg.connect(host=url.host, port=url.port, user=url.username, password=url.password,
                           dbname=url.database, autocommit=True)


Scalar = Callable[[str], Any]


def dbapi_scalar(connection: Any) -> Scalar:
    """Run one statement on this DB-API connection (sqlite3 or psycopg) and return its first value."""

    def scalar(sql: str) -> Any:
        cursor = connection.cursor()
        try:
            cursor.execute(sql)
            row = cursor.fetchone()
        finally:
            cursor.close()
        return next(iter(row.values())) if isinstance(row, dict) else row[0]

    return scalar


def sqlite_durability(scalar: Scalar) -> dict[str, str]:
    """journal_mode and synchronous as the SQLite connection behind ``scalar`` runs them."""
    synchronous = int(scalar("PRAGMA synchronous"))
    return {"journal_mode": str(scalar("PRAGMA journal_mode")).lower(),
            "synchronous": SQLITE_SYNCHRONOUS.get(synchronous, str(synchronous))}


def postgres_durability(scalar: Scalar) -> dict[str, str]:
    """fsync and synchronous_commit as the PostgreSQL session behind ``scalar`` runs them."""
    return {"fsync": str(scalar("SHOW fsync")), "synchronous_commit": str(scalar("SHOW synchronous_commit"))}


class RawAppender:
    """The statements one append needs (the reference's seven), through the raw DBAPI driver, one transaction
    per event: the floor any implementation pays."""

    def __init__(self, target: str, postgres: bool, synchronous: str) -> None:
        self.postgres = postgres
        if not self.postgres:
            self.connection: Any = sqlite3.connect(target, isolation_level=None)
            self.connection.execute(f"PRAGMA synchronous={synchronous}")
            self.backend_pid: int | None = None
        else:
            self.connection = postgres_connect(target)
            self.backend_pid = self.connection.info.backend_pid
        self.begin = "BEGIN" if self.postgres else "BEGIN IMMEDIATE"
        # PostgreSQL locks the room row (SQLite's BEGIN IMMEDIATE already serialises).
        self.statements = [
            "SELECT kind FROM hosted_room_events WHERE room_id=? AND event_id=?",
            "SELECT next_seq, event_bytes, authority_gateway_id, authority_epoch, disbanded_at "
            "FROM hosted_rooms WHERE room_id=?" + (" FOR UPDATE" if self.postgres else ""),
            "SELECT COALESCE(SUM(event_bytes), 0) FROM hosted_rooms",
            "INSERT INTO hosted_room_events (room_id, seq, event_id, kind, actor_json, authority_epoch, "
            "payload_json, created_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
            "UPDATE hosted_rooms SET next_seq=?, event_bytes=event_bytes+?, updated_at=? "
            "WHERE room_id=? AND next_seq=?",
        ]
        if self.postgres:
            self.statements = [statement.replace("?", "%s") for statement in self.statements]

    def append(self, room_id: str, event_id: str) -> None:
        select_event, select_room, gateway_bytes, insert, advance = self.statements
        cursor = self.connection.cursor()
        cursor.execute(self.begin)
        cursor.execute(select_event, (room_id, event_id))
        cursor.fetchone()
        cursor.execute(select_room, (room_id,))
        seq = int(cursor.fetchone()[0])
        cursor.execute(gateway_bytes)
        cursor.fetchone()
        size = len((event_id + KIND + ACTOR_JSON + PAYLOAD_JSON).encode())
        now = time.time()
        cursor.execute(insert, (room_id, seq, event_id, KIND, ACTOR_JSON, 1, PAYLOAD_JSON, now))
        cursor.execute(advance, (seq + 1, size, now, room_id, seq))
        cursor.execute("COMMIT")

    def durability(self) -> dict[str, str]:
        scalar = dbapi_scalar(self.connection)
        return postgres_durability(scalar) if self.postgres else sqlite_durability(scalar)

    def close(self) -> None:
        self.connection.close()


@dataclass(frozen=True)
class Context:
    """Where and how one benchmark run stores its data (picklable: every worker process gets a copy)."""

    url: str | None  # a PostgreSQL admin URL (a role that may CREATE DATABASE); None: SQLite files in ``folder``
    folder: str
    synchronous: str  # SQLite's synchronous mode for every connection (FULL unless the run opts out)
    quick: bool

    @property
    def postgres(self) -> bool:
        return self.url is not None

    @property
    def dialect(self) -> str:
        return "postgresql" if self.url else "sqlite"

    def new_database(self, name: str, *, migrated: bool) -> str:
        """A new database (a SQLite path or a PostgreSQL URL), with hostedrooms' schema when ``migrated``."""
        name = f"{name.replace('-', '_')}_{uuid.uuid4().hex[:6]}"
        if self.url is None:
            target = os.path.join(self.folder, f"{name}.db")
        else:
            from hostedrooms.testing import create_database

            target = create_database(self.url, f"bench_{name}")
        if migrated:
            from hostedrooms import migrate

            migrate.upgrade(target)
        return target

    def required_durability(self) -> dict[str, str]:
        """The settings every contender must run with: same durability for all."""
        if self.postgres:
            return {"fsync": "on", "synchronous_commit": "on"}
        return {"journal_mode": "wal", "synchronous": self.synchronous}


def render(rows: list[tuple[str, ...]]) -> str:
    """``rows`` (the header first) as a Markdown table, each column as wide as its widest cell."""
    widths = [max(len(row[index]) for row in rows) for index in range(len(rows[0]))]
    lines = ["| " + " | ".join(cell.ljust(width) for cell, width in zip(rows[0], widths, strict=True)) + " |",
             "|" + "|".join("-" * (width + 2) for width in widths) + "|"]
    lines += ["| " + " | ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)) + " |"
              for row in rows[1:]]
    return "\n".join(lines) + "\n"


# --- bench/run.py's workloads: what each returns, the databases it runs on ---------------------------------

#: The checkout (spawned workload processes put it on sys.path to import bench and hostedrooms).
ROOT = Path(__file__).resolve().parent.parent


@dataclass
class Result:
    workload: str
    batch: int
    operations: int
    seconds: float
    latencies: list[float] = field(default_factory=list)
    events: int = 0
    peak_rss_kb: int = 0
    note: str = ""

    @property
    def rate(self) -> float:
        return (self.events or self.operations) / self.seconds if self.seconds else 0.0

    def percentile(self, fraction: float) -> float:
        if not self.latencies:
            return 0.0
        ordered = sorted(self.latencies)
        return ordered[min(len(ordered) - 1, int(fraction * len(ordered)))]


# --- databases ---------------------------------------------------------------------------------------------


@dataclass
class Setup:
    url: str | None  # admin URL for PostgreSQL, None for SQLite
    folder: str
    synchronous: str
    quick: bool

    def fresh(self, name: str) -> str:
        """A new, migrated database for one workload; returns its target string."""
        from hostedrooms import migrate

        if self.url is None:
            target = os.path.join(self.folder, f"{name}-{uuid.uuid4().hex[:6]}.db")
        else:
            from hostedrooms.testing import create_database

            target = create_database(self.url, f"bench_{name}_{uuid.uuid4().hex[:6]}")
        migrate.upgrade(target)
        return target

    def engine(self, target: str) -> Any:
        from hostedrooms import create_engine

        return create_engine(target, synchronous=self.synchronous)

    def count(self, full: int, quick: int) -> int:
        return quick if self.quick else full


def new_room(engine: Any, room_id: str) -> None:
    from hostedrooms import rooms

    rooms.create_room(engine, room_id=room_id, name=room_id, members=[], authority_gateway_id=GATEWAY)


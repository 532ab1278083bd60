"""Builders of valid inputs shared by the test files (and the child scripts they start).

Each builder returns what the reference accepts, with fixed, readable values; keyword arguments replace single
fields, so a test states only what it is about. The tests assert; :func:`connect_error` only requires that the
error it returns is raised.

- limits: :func:`lowered`
- rooms and events: :func:`make_room`, :func:`message`, :func:`snapshot`
- replicas: :func:`replica_event`, :func:`replica_page`, :func:`bare_page`, :func:`ingest`, :func:`stored_events`,
  :func:`replica_snapshot`
- peer links: :func:`link`
- the delivery ledger: :func:`envelope`, :func:`prepare`, :func:`outbound`, :func:`outbound_snapshot`
- harness: :func:`private_store`, :func:`file_mode`, :func:`run_together`, :func:`race`, :func:`run_cli`,
  :func:`captured`, :func:`every_text`, :func:`connect_error`
"""

from __future__ import annotations

import dataclasses
import os
import stat
import subprocess
import sys
import threading
import time
import traceback
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import sqlalchemy as sa
from sqlalchemy import Engine

import hostedrooms
from hostedrooms import models, replicas, rooms
from hostedrooms.errors import StorageError
from hostedrooms.limits import LimitValues
from hostedrooms.uow import UnitOfWork

if TYPE_CHECKING:  # not imported at run time: the child scripts use these builders too, and start often
    import pytest

#: The local gateway of most tests, and a user actor.
LOCAL = "install:gw-local"
USER = {"kind": "user", "id": "u1"}

#: Two authorities a replica follows, and the members of a replicated room.
A = "install:gw-a"
B = "install:gw-b"
MEMBERS = [{"id": "m1"}]


# --- limits ------------------------------------------------------------------------------------------------------


def lowered(**overrides: int) -> LimitValues:
    """The default limits with some lowered (what an operator or test does)."""
    return dataclasses.replace(LimitValues.read(), **overrides)


# --- rooms and events --------------------------------------------------------------------------------------------


def make_room(engine: Any, room_id: str = "room-1", *, gateway: str = LOCAL, name: str = "Team",
              members: list[dict[str, Any]] | None = None, now: float | None = 1000.0,
              **kwargs: Any) -> dict[str, Any]:
    """Create room ``room_id`` owned by ``gateway`` (members: one, ``m1``, unless given)."""
    return rooms.create_room(engine, room_id=room_id, name=name,
                             members=[{"id": "m1"}] if members is None else list(members),
                             authority_gateway_id=gateway, now=now, **kwargs)


def only_room(engine: Engine, room_id: str, gateway: str, *, next_seq: int = 1) -> None:
    """An emptied database holding one room ("Team", no members, created at 1000.0) whose log starts at
    ``next_seq`` (as if an operator had moved it: the widest seqs)."""
    with engine.begin() as connection:
        for table in reversed(models.metadata.sorted_tables):
            connection.execute(sa.delete(table))
    rooms.create_room(engine, room_id=room_id, name="Team", members=[], authority_gateway_id=gateway, now=1000.0)
    with engine.begin() as connection:
        connection.execute(sa.update(models.rooms).values(next_seq=next_seq))


def message(engine: Any, room_id: str, event_id: str, text: str = "hi", *, gateway: str = LOCAL, epoch: int = 1,
            **kwargs: Any) -> dict[str, Any]:
    """Append a user's message ``text`` to ``room_id`` under authority ``gateway`` at ``epoch``."""
    return rooms.append_event(engine, room_id=room_id, event_id=event_id, kind="message.user", actor=dict(USER),
                              payload={"text": text}, authority_gateway_id=gateway, authority_epoch=epoch, **kwargs)


def account_raw_bytes(connection: sa.Connection, size: int) -> None:
    """After raw SQL added ``size`` bytes to rooms' ``event_bytes`` (called after that update), keep the gateway
    budget shards equal to the rooms' bytes (as ``verify`` checks): no allowance is left to spend, so the next
    append re-spreads them."""
    budget = models.budget
    connection.execute(sa.update(budget).values(allowance=budget.c.used))
    first = connection.execute(sa.select(sa.func.min(budget.c.shard))).scalar_one()
    if first is None:  # no shard rows (a truncated test database): one holding every room's bytes
        total = connection.execute(
            sa.select(sa.func.coalesce(sa.func.sum(models.rooms.c.event_bytes), 0))).scalar_one()
        connection.execute(sa.insert(budget).values(shard=0, used=total, allowance=total, spread_limit=0))
        return
    connection.execute(sa.update(budget).where(budget.c.shard == first).values(
        used=budget.c.used + size, allowance=budget.c.allowance + size))


def snapshot(engine: Engine, tables: Iterable[sa.Table] | None = None) -> dict[str, list[tuple[Any, ...]]]:
    """Every row of ``tables`` (every hostedrooms table by default), in a stable order: compare two to prove
    that nothing changed."""
    chosen = models.metadata.sorted_tables if tables is None else tables
    with engine.connect() as connection:
        return {table.name: sorted((tuple(row) for row in connection.execute(sa.select(table))), key=repr)
                for table in chosen}


# --- replicas ----------------------------------------------------------------------------------------------------

#: The tables a replica operation may write.
REPLICA_TABLES = (models.rooms, models.events, models.replicas, models.replica_events, models.retired_ids)


def replica_snapshot(engine: Engine) -> dict[str, list[tuple[Any, ...]]]:
    """:func:`snapshot` of the tables a replica operation may write."""
    return snapshot(engine, REPLICA_TABLES)


def replica_event(seq: int, *, room_id: str = "r1", epoch: int | None = 1, **overrides: Any) -> dict[str, Any]:
    """One event as the authority's read_events returns it."""
    value: dict[str, Any] = {
        "room_id": room_id, "seq": seq, "event_id": f"e{seq}", "kind": "message.user",
        "actor": {"id": "u1", "kind": "user"}, "authority_epoch": epoch, "payload": {"text": f"hello {seq}"},
        "created_at": 100.0 + seq, "idempotent": False}
    value.update(overrides)
    return value


def replica_page(first: int, last: int, *, latest: int | None = None, gateway: str = A, epoch: int = 1,
                 room_id: str = "r1") -> dict[str, Any]:
    """A read_events page of ``gateway`` holding seqs first..last (empty when last < first)."""
    events = [replica_event(seq, room_id=room_id, epoch=epoch) for seq in range(first, last + 1)]
    latest_seq = last if latest is None else latest
    cursor = last if events else first - 1
    return {"events": events, "cursor": cursor, "latest_seq": latest_seq, "has_more": cursor < latest_seq,
            "authority": {"gateway_id": gateway, "epoch": epoch}}


def bare_page(*events: dict[str, Any], epoch: int = 1, gateway: str = B) -> dict[str, Any]:
    """A page of only the fields ingest requires, its events at seqs 1, 2, ...: each of ``events`` replaces
    fields of an empty user message."""
    full = [{"seq": index, "event_id": f"e{index}", "kind": "message.user", "actor": dict(USER), "payload": {},
             "authority_epoch": epoch, "created_at": 1.0, **event} for index, event in enumerate(events, start=1)]
    return {"authority": {"gateway_id": gateway, "epoch": epoch}, "latest_seq": len(full), "events": full}


def ingest(engine: Any, pg: dict[str, Any], *, room_id: str = "r1", now: float = 1000.0,
           **kwargs: Any) -> dict[str, Any]:
    """Ingest page ``pg`` into the replica of room ``room_id`` ("Team", :data:`MEMBERS`)."""
    return replicas.ingest_page(engine, room_id=room_id, room_name="Team", members=MEMBERS, page=pg, now=now,
                                **kwargs)


def stored_events(engine: Engine, room_id: str = "r1") -> list[dict[str, Any]]:
    """Every event of ``room_id`` as read_events returns it."""
    events: list[dict[str, Any]] = rooms.read_events(engine, room_id=room_id, limit=500)["events"]
    return events


# --- peer links --------------------------------------------------------------------------------------------------


def link(member_id: str = "m1", **overrides: Any) -> dict[str, Any]:
    """A room link record of ``member_id`` in ``room-1``."""
    record: dict[str, Any] = {
        "room_id": "room-1", "member_id": member_id, "target_url": "https://peer.example/rooms",
        "target_profile": "default", "grant": "grant-1", "catalog_json": "{}", "cancellation_scope_id": "scope-1",
        "trace_id": f"trace-{member_id}", "transport_security": "tls", "status": "ok", "updated_at": 10.0}
    record.update(overrides)
    return record


# --- the delivery ledger -----------------------------------------------------------------------------------------


def envelope(n: int | str = 1, *, message: str = "hi", **overrides: Any) -> dict[str, Any]:
    """A request envelope: ``env-<n>`` (or the id ``n`` itself when a string), request ``req-<n>``."""
    data: dict[str, Any] = {
        "envelope_id": n if isinstance(n, str) else f"env-{n}", "request_id": f"req-{n}", "team_id": "team-1",
        "source_peer_id": "peer-a", "source_server_identity": "srv-a", "source_route_id": "route-a",
        "source_route_revision": "rev-1", "target_peer_id": None, "target_server_identity": "srv-b",
        "target_route_id": "route-b", "target_route_revision": "rev-2", "action": "request_reply",
        "kind": "request_reply", "exchange_id": "ex-1", "parent_envelope_id": None, "parent_leg": None,
        "used_legs": 1, "max_legs": 6, "expires_at": 2**40, "body": {"message": message}}
    data.update(overrides)
    return data


def prepare(ledger: Any, n: int | str = 1, *, transport_role: Any = "host", connection_id: Any = "conn-1",
            lease_token: Any = "lease-1", target_chat_id: Any = "chat-1",
            **envelope_fields: Any) -> tuple[dict[str, Any], bool]:
    """``ledger.prepare`` of :func:`envelope` ``n`` (``envelope_fields`` replace its fields)."""
    result: tuple[dict[str, Any], bool] = ledger.prepare(
        envelope(n, **envelope_fields), transport_role=transport_role, connection_id=connection_id,
        lease_token=lease_token, target_chat_id=target_chat_id)
    return result


def outbound_snapshot(**fields: Any) -> dict[str, Any]:
    """The routing snapshot of an outbound intent."""
    return {"connection_id": "conn-1", "source_route_id": "route-a", "source_route_revision": "rev-1",
            "source_chat_id": "chat-1", "action": "request_reply", **fields}


def outbound(**overrides: Any) -> dict[str, Any]:
    """The arguments of ``ledger.prepare_outbound`` for intent ``out-1``."""
    return {"request_id": "out-1", "source_session_id": "chat-1", "source_run_id": "run-1",
            "snapshot": outbound_snapshot(), "body": "hello", "action": "request_reply", "expires_at": 2**40,
            **overrides}


# --- harness -----------------------------------------------------------------------------------------------------


def private_store(tmp_path: Path, *, room_id: str, name: str, gateway: str) -> Path:
    """A migrated SQLite file ``store/state.db`` holding one room, in a private directory under ``tmp_path``."""
    from hostedrooms import migrate  # here: the child scripts importing this module never migrate

    directory = tmp_path / "store"
    directory.mkdir(mode=0o700)
    path = directory / "state.db"
    migrate.upgrade(path)
    engine = hostedrooms.create_engine(path)
    try:
        rooms.create_room(engine, room_id=room_id, name=name, members=[], authority_gateway_id=gateway)
    finally:
        engine.dispose()
    return path


def file_mode(path: Path) -> int:
    """The permission bits of ``path`` itself (a symlink is not followed)."""
    return stat.S_IMODE(os.lstat(path).st_mode)


def run_together(work: Callable[[int], Any], workers: int) -> list[Any]:
    """Run ``work(i)`` on ``workers`` threads released at once; return each result or exception."""
    barrier = threading.Barrier(workers, timeout=60)  # bounded: a worker that never comes fails them all
    results: list[Any] = [None] * workers

    def run(index: int) -> None:
        barrier.wait()
        try:
            results[index] = work(index)
        except Exception as exc:
            results[index] = exc

    threads = [threading.Thread(target=run, args=(index,)) for index in range(workers)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    return results


#: The start of a racing child script (run as ``python -c SCRIPT TARGET GO`` by :func:`race`): it waits for the
#: file GO, logs Alembic's "Running upgrade" lines to standard output and imports ``migrate``.
RACER_START = """
import logging, sys, time
from pathlib import Path
go = Path(sys.argv[2])
while not go.exists():
    time.sleep(0.005)
logging.basicConfig(level=logging.WARNING, stream=sys.stdout, format="%(message)s")
logging.getLogger("alembic.runtime.migration").setLevel(logging.INFO)
from hostedrooms import migrate
"""


def race(script: str, target: str, tmp_path: Path, *, processes: int, timeout: float) -> list[tuple[int, str]]:
    """Start ``processes`` children running ``script`` on ``target``, release them at once, and return each
    one's exit code and output (standard output and error)."""
    go = tmp_path / "go"
    env = dict(os.environ, PYTHONPATH=str(Path(hostedrooms.__file__).resolve().parent.parent))
    children = [subprocess.Popen([sys.executable, "-c", script, target, str(go)], stdout=subprocess.PIPE,
                                 stderr=subprocess.STDOUT, text=True, env=env) for _ in range(processes)]
    time.sleep(1.0)  # let every child import and start polling
    go.touch()
    finished = []
    for child in children:
        out, _ = child.communicate(timeout=timeout)
        finished.append((child.returncode, out))
    return finished


def run_cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    """The console script's exit code, standard output and standard error for ``argv``."""
    from hostedrooms.cli import main

    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def captured(capfd: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture) -> str:
    """Everything written to the process's standard output and error and to the logs so far."""
    out, err = capfd.readouterr()
    return "\n".join((out, err, caplog.text))


def every_text(exc: BaseException) -> str:
    """Every text of ``exc`` a program could show: message, repr, arguments and the chained traceback."""
    chained = "".join(traceback.format_exception(exc))
    return f"{exc}\n{exc!r}\n{exc.args!r}\n{chained}"


def connect_error(url: str | sa.URL, expected: type[StorageError] = StorageError, *,
                  connect_timeout: int = 5) -> StorageError:
    """What opening a unit of work on ``url`` raises (it must raise ``expected``)."""
    import pytest

    engine = hostedrooms.create_engine(url, connect_args={"connect_timeout": connect_timeout})
    try:
        with pytest.raises(expected) as caught, UnitOfWork(engine):
            pass
    finally:
        engine.dispose()
    return caught.value


def idle_in_transaction(engine: Engine, *, within: float = 10.0) -> int:
    """Sessions of ``engine``'s PostgreSQL database idle in a transaction (0 on SQLite). A cancelled driver call
    leaves its connection in an unknown state, so SQLAlchemy closes it; the server ends that session once it sees
    the socket closed, which may take it a moment: the count is read until it is 0, for at most ``within`` s."""
    if engine.dialect.name != "postgresql":
        return 0
    deadline = time.monotonic() + within
    with engine.connect() as connection:
        while True:
            found = int(connection.execute(sa.text(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                "AND state LIKE 'idle in transaction%'")).scalar_one())
            connection.rollback()
            if found == 0 or time.monotonic() > deadline:
                return found
            time.sleep(0.01)

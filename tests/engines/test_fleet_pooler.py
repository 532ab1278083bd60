"""Through PgBouncer in transaction pooling mode (#26 item 3), and the PostgreSQL-compatible engines hostedrooms
refuses (#26 item 7).

``pooler="transaction"``: no statement prepared on the server (a prepared statement lives on one server
connection, the next transaction may run on another), no session state, and the one waiting connection
``LISTEN``\\ s on ``listen_url`` (a direct connection): a LISTEN through the pooler is lost. The workload shares
PgBouncer's few server connections between more client connections than it has."""

from __future__ import annotations

import asyncio
import re
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from factories import outbound, run_cli
from sqlalchemy import Engine

import hostedrooms
from hostedrooms import aio, models, peers, rooms
from hostedrooms.backends import postgresql as pg_backend
from hostedrooms.errors import StoreConfigurationError
from hostedrooms.ledger import DeliveryLedger

GATEWAY = "install:gw-pooled"
ROOMS = ("pooled-1", "pooled-2", "pooled-3", "pooled-4")
#: How late a followed event may arrive at most: far below the 30 s fallback re-read the follower is given, so
#: only a notification can deliver it in time.
PROMPT = 2.0


def emptied(url: str) -> None:
    engine = hostedrooms.create_engine(url)
    try:
        with engine.begin() as connection:
            for table in reversed(models.metadata.sorted_tables):
                connection.execute(sa.delete(table))
    finally:
        engine.dispose()


@pytest.fixture
def pooled(pgbouncer_url: str, pgbouncer_direct_url: str) -> Iterator[Engine]:
    """An engine through PgBouncer (transaction pooling), its waiter on the direct URL, on an emptied database."""
    emptied(pgbouncer_direct_url)
    engine = hostedrooms.create_engine(pgbouncer_url, pooler="transaction", listen_url=pgbouncer_direct_url)
    try:
        yield engine
    finally:
        engine.dispose()


def make_room(engine: Engine, room_id: str) -> None:
    rooms.create_room(engine, room_id=room_id, name="Team", members=[], authority_gateway_id=GATEWAY, now=1000.0)


def say(engine: Engine, room_id: str, event_id: str) -> dict[str, Any]:
    return rooms.append_event(engine, room_id=room_id, event_id=event_id, kind="message.user",
                              actor={"kind": "user", "id": "u1"}, payload={"text": event_id},
                              authority_gateway_id=GATEWAY, authority_epoch=1)


def whole_log(engine: Engine, room_id: str) -> list[dict[str, Any]]:
    events: list[dict[str, Any]] = []
    while True:
        page = rooms.read_events(engine, room_id=room_id, since_seq=events[-1]["seq"] if events else 0, limit=500)
        if not page["events"]:
            return events
        events.extend(page["events"])


def run_threads(count: int, work: Any) -> list[BaseException]:
    errors: list[BaseException] = []

    def guarded(index: int) -> None:
        try:
            work(index)
        except BaseException as exc:  # every failure counts; none may be lost in a thread
            errors.append(exc)

    threads = [threading.Thread(target=guarded, args=(index,)) for index in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(300)
    return errors


# --- a concurrent workload through the pooler -----------------------------------------------------------------


def test_a_concurrent_workload_through_transaction_pooling_loses_nothing(
        pgbouncer_url: str, pgbouncer_direct_url: str, pooled: Engine) -> None:
    # Two engines (two gateway processes' pools) of up to 4 connections each, six writers, a ledger worker and a
    # reader: more client connections than PgBouncer's 4 server connections, so every server connection serves
    # transactions of several clients, each client's hot statements run far more often than psycopg's prepare
    # threshold.
    other = hostedrooms.create_engine(pgbouncer_url, pooler="transaction", listen_url=pgbouncer_direct_url,
                                      pool_size=4, max_overflow=0)
    engines = (pooled, other)
    for room_id in ROOMS:
        make_room(pooled, room_id)
    acknowledged: dict[str, list[str]] = {room_id: [] for room_id in ROOMS}
    lock = threading.Lock()
    writers, appends = 6, 60

    def work(index: int) -> None:
        engine = engines[index % 2]
        if index < writers:
            for n in range(appends):
                room_id = ROOMS[(index + n) % len(ROOMS)]
                event_id = f"w{index}-{n}"
                say(engine, room_id, event_id)
                with lock:
                    acknowledged[room_id].append(event_id)
        elif index == writers:
            ledger = DeliveryLedger(engine)
            for n in range(40):
                ledger.prepare_outbound(**outbound(request_id=f"out-{n}"))
                assert ledger.commit_outbound(f"out-{n}", {"ok": True}) is not None
        else:
            for n in range(120):
                rooms.read_events(engine, room_id=ROOMS[n % len(ROOMS)], limit=50)

    try:
        errors = run_threads(writers + 2, work)
    finally:
        other.dispose()
    assert errors == []
    for room_id in ROOMS:
        log = whole_log(pooled, room_id)
        seqs = [event["seq"] for event in log]
        assert seqs == list(range(seqs[0], seqs[0] + len(seqs)))  # contiguous, none repeated
        ids = [event["event_id"] for event in log if event["event_id"].startswith("w")]
        assert sorted(ids) == sorted(acknowledged[room_id])  # every acknowledged event, once
    assert sum(len(ids) for ids in acknowledged.values()) == writers * appends
    ledger = DeliveryLedger(pooled)
    assert all(ledger.outbound(f"out-{n}") is not None for n in range(40))


def test_asyncio_engines_through_transaction_pooling(pgbouncer_url: str, pgbouncer_direct_url: str,
                                                     pooled: Engine) -> None:
    make_room(pooled, ROOMS[0])

    async def scenario(services: str, prefix: str) -> None:
        engine = aio.create_async_engine(pgbouncer_url, pooler="transaction", listen_url=pgbouncer_direct_url,
                                         services=services)
        try:
            await asyncio.gather(*(aio.rooms.append_event(
                engine, room_id=ROOMS[0], event_id=f"{prefix}{task}-{n}", kind="message.user",
                actor={"kind": "user", "id": "u1"}, payload={"text": "hi"}, authority_gateway_id=GATEWAY,
                authority_epoch=1) for task in range(8) for n in range(15)))
        finally:
            await engine.dispose()

    asyncio.run(scenario("threads", "t"))
    asyncio.run(scenario("awaited", "a"))
    ids = [event["event_id"] for event in whole_log(pooled, ROOMS[0])]
    assert sorted(ids) == sorted(f"{prefix}{task}-{n}" for prefix in "ta" for task in range(8) for n in range(15))


def test_ownership_probes_of_a_pooled_engine_never_prepare_on_the_server(pooled: Engine) -> None:
    # A probe runs on an engine of its own (one cached connection), built from the gateway's engine: it must not
    # prepare its statement after a few runs either, or a later probe lands on a server connection without it.
    make_room(pooled, ROOMS[0])
    peers.forget_probe_engines()
    try:
        errors = run_threads(4, lambda index: [  # within the probe pool (1 + 4 overflow)
            peers.probe_hosted_room(pooled, room_id=ROOMS[(index + n) % 2]) for n in range(40)])
        assert errors == []
        assert peers.probe_hosted_room(pooled, room_id=ROOMS[0])
        assert not peers.probe_hosted_room(pooled, room_id=ROOMS[1])
    finally:
        peers.forget_probe_engines()


def test_every_advisory_lock_is_transaction_scoped() -> None:
    # A session-level advisory lock would stay on a server connection that a transaction pooler hands to another
    # client afterwards: hostedrooms takes only the _xact_ variants.
    package = Path(hostedrooms.__file__).parent
    session_locks = [f"{path.relative_to(package)}: {match.group(0)}"
                     for path in sorted(package.rglob("*.py"))
                     for match in re.finditer(r"pg_(try_)?advisory_(un)?lock\w*", path.read_text())
                     if "xact" not in match.group(0)]
    assert session_locks == []


# --- wake-ups: LISTEN on listen_url, or refused ------------------------------------------------------------------


def test_follow_through_the_pooler_is_woken_by_notifications(pooled: Engine) -> None:
    make_room(pooled, ROOMS[0])
    received: list[tuple[int, float]] = []
    follower = rooms.follow(pooled, ROOMS[0], fallback_interval=30.0)

    def follow() -> None:
        for event in follower:
            received.append((event["seq"], time.monotonic()))
            if len(received) == 5:
                return

    thread = threading.Thread(target=follow)
    thread.start()
    time.sleep(0.5)  # the follower waiting
    sent: list[tuple[int, float]] = []
    for n in range(5):
        seq = say(pooled, ROOMS[0], f"e{n}")["seq"]
        sent.append((seq, time.monotonic()))
        time.sleep(0.3)
    thread.join(60)
    assert [seq for seq, _ in received] == [seq for seq, _ in sent]
    lateness = [got - at for (_, at), (_, got) in zip(sent, received, strict=True)]
    assert max(lateness) < PROMPT, lateness


def test_ledger_work_wakeup_through_the_pooler(pooled: Engine) -> None:
    ledger = DeliveryLedger(pooled)
    with ledger.work_wakeup() as wakeup:
        started = time.monotonic()
        ledger.prepare_outbound(**outbound())
        assert wakeup.wait(30)
        assert time.monotonic() - started < PROMPT


def test_waits_through_a_transaction_pooler_without_listen_url_are_refused(
        pgbouncer_url: str, pgbouncer_direct_url: str) -> None:
    emptied(pgbouncer_direct_url)
    engine = hostedrooms.create_engine(pgbouncer_url, pooler="transaction")
    try:
        make_room(engine, ROOMS[0])
        with pytest.raises(StoreConfigurationError, match="LISTEN through a transaction pooler is lost.*listen_url"):
            rooms.follow(engine, ROOMS[0])
        with pytest.raises(StoreConfigurationError, match="listen_url"):
            DeliveryLedger(engine).work_wakeup()
        say(engine, ROOMS[0], "still-served")  # everything else works
    finally:
        engine.dispose()

    async def scenario() -> None:
        async_engine = aio.create_async_engine(pgbouncer_url, pooler="transaction")
        try:
            with pytest.raises(StoreConfigurationError, match="listen_url"):
                aio.follow(async_engine, ROOMS[0])
            with pytest.raises(StoreConfigurationError, match="listen_url"):
                await aio.open_follow(async_engine, ROOMS[0])
            with pytest.raises(StoreConfigurationError, match="listen_url"):
                (await aio.open_ledger(async_engine)).work_wakeup()
        finally:
            await async_engine.dispose()

    asyncio.run(scenario())


# --- what pooler= refuses ----------------------------------------------------------------------------------------


def test_pooler_settings_that_cannot_work_are_refused(tmp_path: Any, pg_worker_url: str) -> None:
    with pytest.raises(StoreConfigurationError, match="session state.*database of its own"):
        hostedrooms.create_engine(pg_worker_url, pooler="transaction", schema="gw_a")
    with pytest.raises(StoreConfigurationError, match="pooler must be"):
        hostedrooms.create_engine(pg_worker_url, pooler="statement")
    with pytest.raises(StoreConfigurationError, match="apply to PostgreSQL"):
        hostedrooms.create_engine(tmp_path / "state.db", pooler="transaction")
    with pytest.raises(StoreConfigurationError, match="same postgresql database"):
        hostedrooms.create_engine(pg_worker_url, pooler="transaction", listen_url=str(tmp_path / "other.db"))
    with pytest.raises(StoreConfigurationError, match="session state"):
        aio.create_async_engine(pg_worker_url, pooler="transaction", schema="gw_a")


def test_the_cli_takes_pooler_and_listen_url(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch,
                                             pgbouncer_url: str, pgbouncer_direct_url: str, pooled: Engine) -> None:
    make_room(pooled, ROOMS[0])
    code, out, err = run_cli(capsys, "rooms", "--url", pgbouncer_url, "--pooler", "transaction", "--listen-url",
                             pgbouncer_direct_url)
    assert (code, err) == (0, ""), err
    assert ROOMS[0] in out
    monkeypatch.setenv("HOSTEDROOMS_POOLER", "transaction")
    code, _, err = run_cli(capsys, "rooms", "--url", pgbouncer_url, "--schema", "gw_a")
    assert code != 0 and "session state" in err


# --- engines hostedrooms does not support (item 7) ---------------------------------------------------------------

COCKROACH = "CockroachDB CCL v23.1.11 (x86_64-pc-linux-gnu, built 2023/09/27 01:53:43, go1.19.10)"
YUGABYTE = "PostgreSQL 11.2-YB-2.18.3.0-b0 on x86_64-pc-linux-gnu, compiled by clang version 15.0.3, 64-bit"


@pytest.mark.parametrize(("version", "citus", "named", "missing"), [
    (COCKROACH, False, "CockroachDB", "advisory locks.*LISTEN/NOTIFY"),
    (YUGABYTE, False, "YugabyteDB", "advisory locks.*LISTEN/NOTIFY"),
    ("PostgreSQL 15.4 on x86_64-pc-linux-gnu", True, "Citus", "subqueries in INSERT on distributed tables"),
])
def test_unsupported_engines_are_refused_at_connect(
        monkeypatch: pytest.MonkeyPatch, pg_worker_url: str, version: str, citus: bool, named: str,
        missing: str) -> None:
    monkeypatch.setattr(pg_backend, "_server_identity", lambda _cursor: (version, citus))
    engine = hostedrooms.create_engine(pg_worker_url)
    try:
        for _ in range(2):  # and again at the next connection: never let through after a first refusal
            with pytest.raises(StoreConfigurationError, match=f"runs on {named}.*lacks.*{missing}"):
                rooms.list_rooms(engine)
    finally:
        engine.dispose()

    async def scenario() -> None:
        async_engine = aio.create_async_engine(pg_worker_url, services="awaited")
        try:
            with pytest.raises(StoreConfigurationError, match=f"runs on {named}"):
                await aio.rooms.list_rooms(async_engine)
        finally:
            await async_engine.dispose()

    asyncio.run(scenario())


def test_postgresql_itself_is_not_refused(pg_worker_url: str) -> None:
    identity = pg_backend._server_identity
    seen: list[tuple[str, bool]] = []

    def recording(cursor: Any) -> tuple[str, bool]:
        seen.append(identity(cursor))
        return seen[-1]

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(pg_backend, "_server_identity", recording)
        engine = hostedrooms.create_engine(pg_worker_url)
        try:
            rooms.list_rooms(engine)
        finally:
            engine.dispose()
    assert [(version.startswith("PostgreSQL"), citus) for version, citus in seen] == [(True, False)]

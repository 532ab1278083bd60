"""hostedrooms benchmarks: each workload in a fresh process, with a raw-driver baseline in the same run.

    python bench/run.py                       # SQLite file in a temp folder, synchronous=FULL
    python bench/run.py --synchronous NORMAL  # the documented opt-in (reported as such)
    python bench/run.py --url postgresql://user:pw@127.0.0.1/postgres   # an admin URL: databases are created
    python bench/run.py --postgres            # start a throwaway PostgreSQL cluster for the run
    python bench/run.py --quick               # smaller counts (a smoke run)
    python bench/run.py --compare read        # hostedrooms beside its peers, alternating rounds (bench/compare.py)
    python bench/run.py --fleet               # N gateways x W writers on one PostgreSQL: schema/database per
                                              # gateway, direct and through PgBouncer (bench/fleet.py)
    python bench/run.py --scale [--postgres]  # latency curves as logs, rooms and payloads grow (bench/scale.py)
    python bench/run.py --telemetry-overhead  # OpenTelemetry on vs off (bench/telemetry_overhead.py)
    python bench/run.py --ledger --reference ../shared/reference   # the delivery ledger beside the reference
                                              # implementation, operation by operation (bench/ledger.py)

Prints a table: workload, dialect, synchronous mode, batch size, operations, rate, p50/p99 latency, peak
memory (the worker process's max RSS), and the ratio to the raw-driver baseline where it applies. Absolute
figures on shared machines are noisy: quote the ratios, measured in one run, with the conditions.
"""

from __future__ import annotations

import argparse
import functools
import json
import multiprocessing
import os
import resource
import sys
import tempfile
import time
import tracemalloc
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from queue import Empty
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

# bench/ is a package; `python bench/run.py` puts only bench/ itself on the path, hence the insert above.
from bench.common import ACTOR, GATEWAY, PAYLOAD, RawAppender  # noqa: E402
from bench.common import ACTOR_JSON as _ACTOR_JSON  # noqa: E402
from bench.common import PAYLOAD_JSON as _PAYLOAD_JSON  # noqa: E402
from bench.common import cpu_seconds as _cpu_seconds  # noqa: E402
from bench.common import raise_limits as _raise_limits  # noqa: E402
from bench.follow import follow_idle, follow_latency_process  # noqa: E402


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


def _timed(operation: Callable[[], Any], latencies: list[float]) -> None:
    started = time.perf_counter()
    operation()
    latencies.append(time.perf_counter() - started)


def _measure(n: int, operation: Callable[[int], Any]) -> tuple[float, list[float]]:
    """Run ``operation(0..n-1)``; return the total seconds and each call's latency."""
    latencies: list[float] = []
    started = time.perf_counter()
    for index in range(n):
        _timed(lambda index=index: operation(index), latencies)  # type: ignore[misc]
    return time.perf_counter() - started, latencies


def _room(engine: Any, room_id: str) -> None:
    from hostedrooms import rooms

    rooms.create_room(engine, room_id=room_id, name=room_id, members=[], authority_gateway_id=GATEWAY)


def _fill(engine: Any, room_id: str, count: int, prefix: str = "fill") -> None:
    from hostedrooms import rooms

    for start in range(0, count, 500):
        batch = [{"event_id": f"{prefix}-{seq}", "kind": "message.user", "actor": ACTOR, "payload": PAYLOAD}
                 for seq in range(start, min(count, start + 500))]
        rooms.append_events(engine, room_id, batch, GATEWAY, 1)


# --- workloads (each runs in its own process) -----------------------------------------------------------------


def raw_baseline(setup: Setup) -> Result:
    """The statements one append needs, through the raw DBAPI driver, one transaction per event."""
    target = setup.fresh("raw")
    engine = setup.engine(target)
    _room(engine, "r")
    engine.dispose()
    appender = RawAppender(target, setup.url is not None, setup.synchronous)
    seconds, latencies = _measure(setup.count(2000, 200), lambda index: appender.append("r", f"raw-{index}"))
    appender.close()
    return Result("raw-driver append (baseline)", 1, len(latencies), seconds, latencies,
                  note="the reference's 7 statements")


_FAST_UPDATE = ("UPDATE hosted_rooms SET next_seq=next_seq+1, event_bytes=event_bytes+?, updated_at=? "
                "WHERE room_id=? AND authority_gateway_id=? AND authority_epoch=? AND disbanded_at IS NULL "
                "AND next_seq<=? AND event_bytes+?<=? "
                "AND (SELECT COALESCE(SUM(event_bytes), 0) FROM hosted_rooms)+?<=? RETURNING next_seq")
_FAST_INSERT = ("INSERT INTO hosted_room_events (room_id, seq, event_id, kind, actor_json, authority_epoch, "
                "payload_json, created_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?)")


def _own_parameters(event_id: str) -> tuple[tuple[Any, ...], Callable[[int], tuple[Any, ...]]]:
    """The guarded UPDATE's parameters and, given the allocated seq, the INSERT's (limits far away)."""
    size = len((event_id + "message.user" + _ACTOR_JSON + _PAYLOAD_JSON).encode())
    now = time.time()
    update = (size, now, "r", GATEWAY, 1, 50_000, size, 1 << 30, size, 1 << 30)
    return update, lambda seq: ("r", seq, event_id, "message.user", _ACTOR_JSON, 1, _PAYLOAD_JSON, now)


def raw_fast_baseline(setup: Setup) -> Result:
    """hostedrooms' own SQLite append statements (BEGIN IMMEDIATE, guarded UPDATE ... RETURNING, INSERT,
    COMMIT) through the raw sqlite3 driver: the floor of this implementation's statement set."""
    import sqlite3

    if setup.url is not None:
        raise SystemExit("raw-fast is a SQLite workload")
    target = setup.fresh("rawfast")
    engine = setup.engine(target)
    _room(engine, "r")
    engine.dispose()
    connection = sqlite3.connect(target, isolation_level=None)
    connection.execute(f"PRAGMA synchronous={setup.synchronous}")

    def append(index: int) -> None:
        update, insert = _own_parameters(f"raw-{index}")
        cursor = connection.cursor()
        cursor.execute("BEGIN IMMEDIATE")
        seq = cursor.execute(_FAST_UPDATE, update).fetchone()[0] - 1
        cursor.execute(_FAST_INSERT, insert(seq))
        cursor.execute("COMMIT")

    seconds, latencies = _measure(setup.count(2000, 200), append)
    connection.close()
    n = len(latencies)
    return Result("raw-driver append, hostedrooms' 4 statements", 1, n, seconds, latencies,
                  note="floor of this implementation's statements")


def core_floor(setup: Setup) -> Result:
    """The same 4 statements through SQLAlchemy Core (an engine from hostedrooms.create_engine), no library
    code: what SQLAlchemy itself costs per append."""
    import sqlalchemy as sa

    if setup.url is not None:
        raise SystemExit("core-floor is a SQLite workload")
    engine = setup.engine(setup.fresh("core"))
    _room(engine, "r")
    update_sql = sa.text(_FAST_UPDATE.replace("?", ":p").replace(":p", ":p{}").format(*range(10)))
    insert_sql = sa.text(_FAST_INSERT.replace("?", ":q").replace(":q", ":q{}").format(*range(8)))

    def append(index: int) -> None:
        update, insert = _own_parameters(f"core-{index}")
        with engine.connect() as connection:
            connection.begin()
            seq = connection.execute(update_sql, {f"p{i}": v for i, v in enumerate(update)}).scalar_one() - 1
            connection.execute(insert_sql, {f"q{i}": v for i, v in enumerate(insert(seq))})
            connection.commit()

    seconds, latencies = _measure(setup.count(2000, 200), append)
    engine.dispose()
    n = len(latencies)
    return Result("SQLAlchemy Core, hostedrooms' 4 statements", 1, n, seconds, latencies,
                  note="no library code")


def _appends(setup: Setup, name: str, prepare: Callable[[Any], None], n: int, label: str) -> Result:
    from hostedrooms import rooms

    _raise_limits()
    engine = setup.engine(setup.fresh(name))
    _room(engine, "r")
    prepare(engine)
    rooms.append_event(engine, room_id="r", event_id="warm", kind="message.user", actor=ACTOR, payload=PAYLOAD,
                       authority_gateway_id=GATEWAY, authority_epoch=1)
    seconds, latencies = _measure(n, lambda index: rooms.append_event(
        engine, room_id="r", event_id=f"e-{index}", kind="message.user", actor=ACTOR, payload=PAYLOAD,
        authority_gateway_id=GATEWAY, authority_epoch=1))
    engine.dispose()
    return Result(label, 1, n, seconds, latencies)


def append_single(setup: Setup) -> Result:
    return _appends(setup, "single", lambda engine: None, setup.count(2000, 200), "append_event, empty database")


def append_into_full_room(setup: Setup) -> Result:
    size = setup.count(50_000, 5_000)
    return _appends(setup, "big", lambda engine: _fill(engine, "r", size), setup.count(2000, 200),
                    f"append_event, room holds {size} events")


def append_with_many_rooms(setup: Setup) -> Result:
    def prepare(engine: Any) -> None:
        for index in range(255):
            _room(engine, f"other-{index}")
            _fill(engine, f"other-{index}", 20, prefix=f"o{index}")

    return _appends(setup, "many", prepare, setup.count(2000, 200), "append_event, 256 rooms live")


def _batches(setup: Setup, size: int) -> Result:
    from hostedrooms import rooms

    _raise_limits()
    engine = setup.engine(setup.fresh(f"batch{size}"))
    _room(engine, "r")
    batches = setup.count(max(20, 20_000 // size), max(5, 2000 // size))
    work = [[{"event_id": f"b{index}-{item}", "kind": "message.user", "actor": ACTOR, "payload": PAYLOAD}
             for item in range(size)] for index in range(batches)]
    seconds, latencies = _measure(batches, lambda index: rooms.append_events(engine, "r", work[index], GATEWAY, 1))
    engine.dispose()
    return Result(f"append_events, {size} per batch", size, batches, seconds, latencies, events=batches * size)


def append_batch_10(setup: Setup) -> Result:
    return _batches(setup, 10)


def append_batch_100(setup: Setup) -> Result:
    return _batches(setup, 100)


def _reads(setup: Setup, middle: bool) -> Result:
    from hostedrooms import rooms

    _raise_limits()
    size = setup.count(50_000, 5_000)
    target = os.path.join(setup.folder, f"reads-{size}.db") if setup.url is None else None
    if target is None or not os.path.exists(target):
        fresh = setup.fresh("reads")
        engine = setup.engine(fresh)
        _room(engine, "r")
        _fill(engine, "r", size)
        engine.dispose()
        if target is not None:
            os.replace(fresh, target)
        else:
            target = fresh
    engine = setup.engine(target)
    since = size // 2 if middle else 0
    n = setup.count(300, 50)
    seconds, latencies = _measure(n, lambda _: rooms.read_events(engine, room_id="r", since_seq=since, limit=500))
    engine.dispose()
    where = f"middle (since {since})" if middle else "start"
    return Result(f"read_events 500/page, {size}-event room, {where}", 500, n, seconds, latencies,
                  events=500 * n)


def read_middle(setup: Setup) -> Result:
    return _reads(setup, middle=True)


def read_start(setup: Setup) -> Result:
    return _reads(setup, middle=False)


def read_whole_log_memory(setup: Setup) -> Result:
    """Read a whole log page by page; report traced peak memory against one page's size."""
    from hostedrooms import rooms

    _raise_limits()
    size = setup.count(50_000, 5_000)
    fresh = setup.fresh("memory")
    engine = setup.engine(fresh)
    _room(engine, "r")
    _fill(engine, "r", size)
    engine.dispose()
    engine = setup.engine(fresh)
    page_sizes: list[int] = []
    tracemalloc.start()
    started = time.perf_counter()
    since, pages = 0, 0
    while True:
        page = rooms.read_events(engine, room_id="r", since_seq=since, limit=500)
        page_sizes.append(len(json.dumps(page)))
        since, pages = page["cursor"], pages + 1
        del page
        if since >= size:
            break
    seconds = time.perf_counter() - started
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    engine.dispose()
    note = f"traced peak {peak / 1e6:.1f} MB; one page is {max(page_sizes) / 1e6:.2f} MB of JSON"
    return Result(f"read whole {size}-event log page by page", 500, pages, seconds, events=size, note=note)


def _ledger_envelope(index: int | str, kind: str = "instruction") -> dict[str, Any]:
    return {
        "envelope_id": f"env-{index}", "request_id": f"req-{index}", "team_id": "team",
        "source_server_identity": "src", "source_route_id": "route", "source_route_revision": "1",
        "target_server_identity": "dst", "target_route_id": "troute", "target_route_revision": "1",
        "action": kind, "kind": kind, "exchange_id": f"x-{index}", "used_legs": 1,
        "max_legs": 6, "expires_at": int(time.time()) + 3600, "body": {"message": "do the thing"}}


def ledger_cycle(setup: Setup) -> Result:
    from hostedrooms.ledger import DeliveryLedger

    engine = setup.engine(setup.fresh("ledger"))
    ledger = DeliveryLedger(engine)
    n = setup.count(500, 50)

    def cycle(index: int) -> None:
        ledger.prepare(_ledger_envelope(index), transport_role="host", connection_id="conn", lease_token="lease",
                       target_chat_id="chat")
        ledger.authorize(f"env-{index}")
        ledger.bind_owner(f"env-{index}", queued_id=f"q-{index}", run_id=None)
        ledger.finish(f"env-{index}", succeeded=True, result_text="done")

    seconds, latencies = _measure(n, cycle)
    engine.dispose()
    return Result("ledger prepare>authorize>bind_owner>finish", 4, n, seconds, latencies,
                  note="4 transactions per cycle")


def ledger_full_cycle(setup: Setup) -> Result:
    """One request delivery through every step the ledger records (admission, run, the response intent with one
    retry, completion) and one outbound intent (prepared, retried once, committed): 11 transactions."""
    from hostedrooms.ledger import DeliveryLedger

    engine = setup.engine(setup.fresh("ledger_full"))
    ledger = DeliveryLedger(engine)
    n = setup.count(300, 30)
    snapshot = {"connection_id": "conn", "source_route_id": "route", "source_route_revision": "1",
                "source_chat_id": "chat", "action": "request_reply"}

    def cycle(index: int) -> None:
        key = f"env-{index}"
        ledger.prepare(_ledger_envelope(index, "request_reply"), transport_role="host", connection_id="conn",
                       lease_token="lease", target_chat_id="chat")
        ledger.authorize(key)
        ledger.bind_owner(key, queued_id=f"q-{index}", run_id=None)
        ledger.bind_owner(key, queued_id=f"q-{index}", run_id=f"run-{index}")
        ledger.prepare_response(key, request_id=f"resp-{index}", body="the answer", request_response=True)
        ledger.defer_response(key, request_id=f"resp-{index}", error="hub unreachable")
        ledger.mark_response_committed(key, request_id=f"resp-{index}")
        ledger.finish(key, succeeded=True, result_text="done")
        ledger.prepare_outbound(request_id=f"out-{index}", source_session_id="chat", source_run_id=f"run-{index}",
                                snapshot=snapshot, body="ask them", action="request_reply",
                                expires_at=int(time.time()) + 3600)
        ledger.defer_outbound(f"out-{index}", "hub unreachable")
        ledger.commit_outbound(f"out-{index}", {"ok": True})

    seconds, latencies = _measure(n, cycle)
    engine.dispose()
    return Result("ledger delivery, response and outbound intent", 11, n, seconds, latencies,
                  note="11 transactions per cycle")


def _writer(target: str, setup: Setup, raw: bool, room_id: str, prefix: str, n: int, queue: Any, ready: Any,
            go: Any) -> None:
    sys.path.insert(0, str(ROOT))
    import sqlalchemy as sa

    from hostedrooms import create_engine, rooms

    if raw:
        appender = RawAppender(target, setup.url is not None, setup.synchronous)
        append: Callable[[int], Any] = lambda index: appender.append(room_id, f"{prefix}-{index}")  # noqa: E731
        server_pid = appender.backend_pid
    else:
        engine = create_engine(target, synchronous=setup.synchronous, pool_size=1, max_overflow=0)
        rooms.room_state(engine, room_id=room_id)  # connect and warm up before the clock starts
        with engine.connect() as connection:
            server_pid = connection.execute(sa.select(sa.func.pg_backend_pid())).scalar() if setup.url else None
        append = lambda index: rooms.append_event(  # noqa: E731
            engine, room_id=room_id, event_id=f"{prefix}-{index}", kind="message.user", actor=ACTOR,
            payload=PAYLOAD, authority_gateway_id=GATEWAY, authority_epoch=1)
    ready.release()
    go.wait()
    latencies: list[float] = []
    server_before, client_before = _cpu_seconds(server_pid), time.process_time()
    started = time.perf_counter()
    for index in range(n):
        _timed(lambda index=index: append(index), latencies)  # type: ignore[misc]
    finished = time.perf_counter()
    client = time.process_time() - client_before
    server_after = _cpu_seconds(server_pid)
    server = server_after - server_before if server_after is not None and server_before is not None else None
    if raw:
        appender.close()
    else:
        engine.dispose()
    queue.put((started, finished, latencies, client, server))


def _concurrent(setup: Setup, writers: int, same_room: bool, raw: bool = False) -> Result:
    target = setup.fresh(f"w{writers}{'same' if same_room else ''}{'raw' if raw else ''}")
    engine = setup.engine(target)
    for index in range(writers):
        _room(engine, f"room-{index}")
    engine.dispose()
    n = setup.count(400, 60)
    context = multiprocessing.get_context("spawn")
    queue, ready, go = context.Queue(), context.Semaphore(0), context.Event()
    processes = [context.Process(target=_writer, args=(
        target, setup, raw, "room-0" if same_room else f"room-{index}", f"w{index}", n, queue, ready, go))
        for index in range(writers)]
    for process in processes:
        process.start()
    for _ in processes:
        ready.acquire()
    go.set()  # every writer is connected and warm: start them together
    spans, latencies, client, server = [], [], 0.0, 0.0
    measured_server = True
    for _ in processes:
        started, finished, own, own_client, own_server = queue.get()
        spans.append((started, finished))
        latencies.extend(own)
        client += own_client
        measured_server = measured_server and own_server is not None
        server += own_server or 0.0
    for process in processes:
        process.join()
    seconds = max(end for _, end in spans) - min(start for start, _ in spans)
    where = "one room" if same_room else "distinct rooms"
    count = writers * n
    cpu = f"CPU/append: client {client / count * 1e6:.0f} us" + (
        f", server {server / count * 1e6:.0f} us" if measured_server else "")
    label = f"{'raw-driver, ' if raw else ''}{writers} writer{'s' if writers > 1 else ''}, {where}"
    return Result(label, 1, count, seconds, latencies, note=cpu)


def writers_1(setup: Setup) -> Result:
    return _concurrent(setup, 1, same_room=False)


def writers_4(setup: Setup) -> Result:
    return _concurrent(setup, 4, same_room=False)


def writers_8(setup: Setup) -> Result:
    return _concurrent(setup, 8, same_room=False)


def writers_4_one_room(setup: Setup) -> Result:
    return _concurrent(setup, 4, same_room=True)


def raw_writers_1(setup: Setup) -> Result:
    return _concurrent(setup, 1, same_room=False, raw=True)


def raw_writers_8(setup: Setup) -> Result:
    return _concurrent(setup, 8, same_room=False, raw=True)


# --- asyncio: many tasks on one loop, the loop's responsiveness, follow() wake-ups --------------------------


class _Ticker:
    """A task that sleeps 1 ms at a time on the loop and records how late each wake-up came (the loop's lag)."""

    def __init__(self) -> None:
        self.lags: list[float] = []
        self._running = True

    async def run(self) -> None:
        import asyncio

        while self._running:
            started = time.perf_counter()
            await asyncio.sleep(0.001)
            self.lags.append(max(0.0, time.perf_counter() - started - 0.001))

    def stop(self) -> None:
        self._running = False

    def note(self) -> str:
        lags = sorted(self.lags) or [0.0]
        p99 = lags[min(len(lags) - 1, int(0.99 * len(lags)))]
        return f"1 ms ticker lag: p50 {lags[len(lags) // 2] * 1000:.2f} ms, p99 {p99 * 1000:.2f} ms, " \
               f"max {lags[-1] * 1000:.2f} ms"


def _tasks(setup: Setup, tasks: int, how: str) -> Result:
    """``tasks`` asyncio tasks, each appending to its own room on one event loop, with a 1 ms ticker beside them.

    ``how``: "aio" (hostedrooms.aio on an AsyncEngine; "aio-awaited": with ``services="awaited"``), "to_thread"
    (the synchronous API through
    ``asyncio.to_thread``, the default executor) or "sync-on-loop" (the synchronous API called on the loop, which
    it blocks: the contrast for the ticker).
    """
    import asyncio

    from hostedrooms import aio, rooms

    _raise_limits()
    target = setup.fresh(f"tasks{tasks}{how.replace('-', '')}")
    engine = setup.engine(target)
    for index in range(tasks):
        _room(engine, f"room-{index}")
    each = setup.count(2000 // tasks if tasks > 1 else 1000, max(5, 200 // tasks))
    latencies: list[float] = []

    async def main() -> float:
        services = "awaited" if how == "aio-awaited" else "threads"
        async_engine = aio.create_async_engine(target, synchronous=setup.synchronous, pool_size=tasks,
                                               max_overflow=0, services=services)

        async def append(room: int, n: int) -> None:
            arguments = {"room_id": f"room-{room}", "event_id": f"t{room}-{n}", "kind": "message.user",
                         "actor": ACTOR, "payload": PAYLOAD, "authority_gateway_id": GATEWAY, "authority_epoch": 1}
            started = time.perf_counter()
            if how.startswith("aio"):
                await aio.rooms.append_event(async_engine, **arguments)
            elif how == "to_thread":
                await asyncio.to_thread(lambda: rooms.append_event(engine, **arguments))
            else:
                rooms.append_event(engine, **arguments)
                await asyncio.sleep(0)
            latencies.append(time.perf_counter() - started)

        async def writer(room: int) -> None:
            for n in range(each):
                await append(room, n)

        for room in range(tasks):  # warm: connections open, statements prepared
            await append(room, -1)
        latencies.clear()
        ticker = _Ticker()
        ticking = asyncio.create_task(ticker.run())
        started = time.perf_counter()
        await asyncio.gather(*(writer(room) for room in range(tasks)))
        seconds = time.perf_counter() - started
        ticker.stop()
        await ticking
        await async_engine.dispose()
        self_note.append(ticker.note())
        return seconds

    self_note: list[str] = []
    seconds = asyncio.run(main())
    engine.dispose()
    label = {"aio": "hostedrooms.aio", "aio-awaited": "hostedrooms.aio, services=awaited",
             "to_thread": "sync API via asyncio.to_thread",
             "sync-on-loop": "sync API called on the loop"}[how]
    return Result(f"{tasks} task{'s' if tasks > 1 else ''} x {each} appends, own rooms: {label}", 1, tasks * each,
                  seconds, latencies, note=self_note[0])


def follow_latency(setup: Setup) -> Result:
    """From an append's commit returning (to its caller) to a follower receiving the event: one appender task
    and one ``hostedrooms.aio.rooms.follow`` task on the same loop, an append every 20 ms (the follower waits
    between them, as a live one does). SQLite polls at the default interval."""
    import asyncio

    from hostedrooms import aio
    from hostedrooms.wakeup import DEFAULT_POLL_INTERVAL

    _raise_limits()
    target = setup.fresh("follow")
    engine = setup.engine(target)
    _room(engine, "r")
    engine.dispose()
    n = setup.count(300, 40)
    committed: dict[int, float] = {}
    received: dict[int, float] = {}

    async def main() -> float:
        async_engine = aio.create_async_engine(target, synchronous=setup.synchronous)

        async def follower() -> None:
            # The follower may get an event before the appender's await returns (the commit ran in a worker
            # thread and NOTIFY woke the follower first): such a wake-up counts as zero latency, below.
            async for event in aio.rooms.follow(async_engine, "r", 0):
                received[event["seq"]] = time.perf_counter()
                if len(received) == n:
                    return

        following = asyncio.create_task(follower())
        await asyncio.sleep(0.5)
        started = time.perf_counter()
        for index in range(n):
            event = await aio.rooms.append_event(
                async_engine, room_id="r", event_id=f"f{index}", kind="message.user", actor=ACTOR, payload=PAYLOAD,
                authority_gateway_id=GATEWAY, authority_epoch=1)
            committed[event["seq"]] = time.perf_counter()
            await asyncio.sleep(0.02)
        await asyncio.wait_for(following, 30)
        seconds = time.perf_counter() - started
        await async_engine.dispose()
        return seconds

    seconds = asyncio.run(main())
    latencies = [max(0.0, received[seq] - committed[seq]) for seq in sorted(committed)]
    how = "LISTEN/NOTIFY" if setup.url else f"polling every {DEFAULT_POLL_INTERVAL * 1000:.0f} ms"
    return Result("follow() wake-up: append's commit returned -> follower has the event", 1, n, seconds, latencies,
                  note=f"{how}; latency columns are the wake-up's")


WORKLOADS: dict[str, Callable[[Setup], Result]] = {
    "raw": raw_baseline,
    "raw-fast": raw_fast_baseline,
    "core-floor": core_floor,
    "single": append_single,
    "batch10": append_batch_10,
    "batch100": append_batch_100,
    "read-middle": read_middle,
    "read-start": read_start,
    "read-memory": read_whole_log_memory,
    "ledger": ledger_cycle,
    "ledger-full": ledger_full_cycle,
    "full-room": append_into_full_room,
    "many-rooms": append_with_many_rooms,
    "follow-latency": follow_latency,
    "follow-idle": follow_idle,
    "follow-process": follow_latency_process,
}
SQLITE_ONLY = frozenset({"raw-fast", "core-floor"})
POSTGRES_WORKLOADS: dict[str, Callable[[Setup], Result]] = {
    "writers-1": writers_1,
    "writers-4": writers_4,
    "writers-8": writers_8,
    "writers-4-one-room": writers_4_one_room,
    "raw-writers-1": raw_writers_1,
    "raw-writers-8": raw_writers_8,
    "aio-tasks-1": functools.partial(_tasks, tasks=1, how="aio"),
    "aio-tasks-50": functools.partial(_tasks, tasks=50, how="aio"),
    "aio-awaited-tasks-1": functools.partial(_tasks, tasks=1, how="aio-awaited"),
    "aio-awaited-tasks-50": functools.partial(_tasks, tasks=50, how="aio-awaited"),
    "to-thread-tasks-1": functools.partial(_tasks, tasks=1, how="to_thread"),
    "to-thread-tasks-50": functools.partial(_tasks, tasks=50, how="to_thread"),
    "sync-on-loop-tasks-50": functools.partial(_tasks, tasks=50, how="sync-on-loop"),
}


def _child(name: str, setup: Setup, queue: Any) -> None:
    sys.path.insert(0, str(ROOT))
    workloads = {**WORKLOADS, **POSTGRES_WORKLOADS}
    result = workloads[name](setup)
    result.peak_rss_kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    queue.put(result)


def run(name: str, setup: Setup) -> Result:
    context = multiprocessing.get_context("spawn")
    queue = context.Queue()
    process = context.Process(target=_child, args=(name, setup, queue))
    process.start()
    while True:  # a workload whose process dies (an exception in it) ends the run instead of hanging it
        try:
            result: Result = queue.get(timeout=1.0)
            break
        except Empty:
            if not process.is_alive():
                failed = f"workload {name} failed (exit code {process.exitcode}); see its traceback above"
                raise SystemExit(failed) from None
    process.join()
    return result


def _print(results: list[Result], dialect: str, synchronous: str, out: Any = sys.stdout) -> None:
    baseline = next((result.rate for result in results if result.workload.startswith("raw-driver append")), None)
    single = next((result.rate for result in results if result.workload == "append_event, empty database"), None)
    one_writer = next((result.rate for result in results if result.workload.startswith("1 writer")), None)
    raw_one_writer = next((result.rate for result in results if result.workload.startswith("raw-driver, 1 writer")),
                          None)
    header = ("workload", "dialect", "sync", "batch", "ops", "events/s", "p50 ms", "p99 ms", "peak MB",
              "vs raw", "vs single", "note")
    rows = []
    for result in results:
        vs_raw = f"{result.rate / baseline:.2f}x" if baseline and result.batch == 1 and "writer" not in \
            result.workload and "ledger" not in result.workload else ""
        floor = next((r.rate for r in results if r.workload.startswith("raw-driver append, hostedrooms")), None)
        if floor and result.workload.startswith("append_event"):
            vs_raw += f" ({result.rate / floor:.2f}x own)"
        vs_single = ""
        if single and result.workload.startswith("append") and result.workload != "append_event, empty database":
            vs_single = f"{result.rate / single:.2f}x"
        writers_base = raw_one_writer if result.workload.startswith("raw-driver, ") else one_writer
        if writers_base and "writer" in result.workload:
            vs_single = f"{result.rate / writers_base:.2f}x (vs 1 writer)"
        rows.append((result.workload, dialect, synchronous if dialect == "sqlite" else "fsync=on",
                     str(result.batch), str(result.operations), f"{result.rate:,.0f}",
                     f"{result.percentile(0.5) * 1000:.2f}", f"{result.percentile(0.99) * 1000:.2f}",
                     f"{result.peak_rss_kb / 1024:.0f}", vs_raw, vs_single, result.note))
    widths = [max(len(row[index]) for row in [header, *rows]) for index in range(len(header))]
    out.write("| " + " | ".join(h.ljust(w) for h, w in zip(header, widths, strict=True)) + " |\n")
    out.write("|" + "|".join("-" * (w + 2) for w in widths) + "|\n")
    for row in rows:
        out.write("| " + " | ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)) + " |\n")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", help="PostgreSQL admin URL (a role that may CREATE DATABASE)")
    parser.add_argument("--postgres", action="store_true", help="start a throwaway PostgreSQL cluster")
    parser.add_argument("--synchronous", default="FULL", choices=("FULL", "NORMAL"), help="SQLite only")
    parser.add_argument("--quick", action="store_true", help="small counts")
    parser.add_argument("--workloads", help="comma-separated subset: " + ", ".join(
        [*WORKLOADS, *POSTGRES_WORKLOADS]))
    parser.add_argument("--compare", metavar="WORKLOADS",
                        help="comparison mode: hostedrooms beside its peers in alternating rounds, for these "
                             "comma-separated workloads (read, append, batch100, catch-up, or all); "
                             "see bench/compare.py")
    parser.add_argument("--rounds", type=int, default=None, help="comparison and fleet rounds (default 5; "
                                                                  "--fleet: 4, with --quick 2)")
    parser.add_argument("--scale", action="store_true",
                        help="scale curves (events per room, rooms, payload sizes, follow, standby lag); with "
                             "--postgres or --url on PostgreSQL; see bench/scale.py")
    parser.add_argument("--max-events", type=int, default=100_000,
                        help="--scale: largest room in events (default 100,000; 1,000,000 for the documented run)")
    parser.add_argument("--fleet", action="store_true",
                        help="fleet comparison on PostgreSQL (--url, else a throwaway cluster); see bench/fleet.py")
    parser.add_argument("--gateways", type=int, default=None, help="--fleet: gateways (default 4, --quick 2)")
    parser.add_argument("--writers", type=int, default=None,
                        help="--fleet: writer processes per gateway (default 2)")
    parser.add_argument("--appends", type=int, default=None,
                        help="--fleet: calls per writer per round (default 200, --quick 40)")
    parser.add_argument("--batch", type=int, default=1, help="--fleet: events per call (default 1: append_event)")
    parser.add_argument("--pool-size", type=int, default=None,
                        help="--fleet: PgBouncer server connections per gateway (default: --writers)")
    parser.add_argument("--contenders", help="comparison contenders besides hostedrooms, comma-separated "
                                             "(default: all that apply; see bench/contenders.py)")
    parser.add_argument("--telemetry-overhead", action="store_true",
                        help="single durable appends with the OpenTelemetry instrumentation on and off, in "
                             "alternating rounds (--rounds, default 5; SQLite; bench/telemetry_overhead.py)")
    parser.add_argument("--ledger", action="store_true",
                        help="the delivery ledger beside the reference, operation by operation (--rounds, default "
                             "5; SQLite; bench/ledger.py); needs --reference")
    parser.add_argument("--reference", metavar="DIR",
                        help="--ledger: the folder holding the reference's secure_peer_delivery.py")
    parser.add_argument("--impl", choices=("facade", "ledger"), default="facade",
                        help="--ledger: hostedrooms through its reference-shaped facade (default) or DeliveryLedger")
    parser.add_argument("--cycles", type=int, default=None, help="--ledger: delivery cycles per round (default 150)")
    args = parser.parse_args(argv)
    if args.ledger:
        from bench.ledger import run_ledger

        if not args.reference:
            parser.error("--ledger needs --reference DIR (the reference implementation is not part of hostedrooms)")
        return run_ledger(reference=args.reference, impl=args.impl, rounds=args.rounds or 5,
                          cycles=args.cycles or (30 if args.quick else 150), warm=10)
    if args.telemetry_overhead:
        from bench.telemetry_overhead import run_overhead

        _raise_limits()
        return run_overhead(synchronous=args.synchronous, rounds=args.rounds, per_round=50 if args.quick else 200)
    if args.compare and args.workloads:
        parser.error("--workloads picks bench/run.py's workloads; --compare names comparison workloads")
    if args.rounds is None:
        args.rounds = (2 if args.quick else 4) if args.fleet else 5  # fleet: each layout takes each place
    if args.rounds < 1:
        parser.error("--rounds must be at least 1")
    if args.fleet:
        from bench.fleet import run_fleet

        if args.postgres or args.compare or args.workloads:
            parser.error("--fleet runs on its own (on --url, else on a throwaway cluster it starts)")
        return run_fleet(args.url, gateways=args.gateways or (2 if args.quick else 4), writers=args.writers or 2,
                         calls=args.appends or (40 if args.quick else 200), batch=args.batch, rounds=args.rounds,
                         pool_size=args.pool_size, quick=args.quick)
    cluster = None
    url = args.url
    if args.postgres:
        from hostedrooms import pgcluster

        cluster = pgcluster.start()
        url = cluster.url
    if args.compare:
        return _compare(args, url, cluster)
    if args.scale:
        return _scale(args, url, cluster)
    names = [name for name in WORKLOADS if not url or name not in SQLITE_ONLY]
    names += list(POSTGRES_WORKLOADS) if url else []
    if args.workloads:
        names = [name for name in args.workloads.split(",") if name]
    dialect = "postgresql" if url else "sqlite"
    results: list[Result] = []
    try:
        with tempfile.TemporaryDirectory(prefix="hostedrooms-bench-") as folder:
            setup = Setup(url=url, folder=folder, synchronous=args.synchronous, quick=args.quick)
            for name in names:
                print(f"running {name} ...", file=sys.stderr, flush=True)
                results.append(run(name, setup))
    finally:
        if cluster is not None:
            cluster.stop()
    print(f"# hostedrooms benchmark, {time.strftime('%Y-%m-%d')}, {dialect}, {os.cpu_count()} cores")
    _print(results, dialect, args.synchronous)
    return 0


def _scale(args: argparse.Namespace, url: str | None, cluster: Any) -> int:
    from bench.common import Context
    from bench.scale import run_scale

    try:
        with tempfile.TemporaryDirectory(prefix="hostedrooms-scale-") as folder:
            context = Context(url=url, folder=folder, synchronous=args.synchronous, quick=args.quick)
            return run_scale(context, max_events=args.max_events)
    finally:
        if cluster is not None:
            cluster.stop()


def _compare(args: argparse.Namespace, url: str | None, cluster: Any) -> int:
    from bench.common import Context
    from bench.compare import run_comparisons

    contenders = [name for name in args.contenders.split(",") if name] if args.contenders else None
    try:
        with tempfile.TemporaryDirectory(prefix="hostedrooms-compare-") as folder:
            context = Context(url=url, folder=folder, synchronous=args.synchronous, quick=args.quick)
            return run_comparisons([name for name in args.compare.split(",") if name], context, args.rounds,
                                   contenders)
    finally:
        if cluster is not None:
            cluster.stop()


if __name__ == "__main__":
    raise SystemExit(main())

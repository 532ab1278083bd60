"""bench/run.py's synchronous workloads (each runs in its own process, bench/registry.py): the raw-driver and
Core floors, appends, reads, the ledger, concurrent writers."""

from __future__ import annotations

import json
import multiprocessing
import os
import sys
import time
import tracemalloc
from collections.abc import Callable
from typing import Any

from bench.common import ACTOR, GATEWAY, PAYLOAD, ROOT, RawAppender, Result, Setup, new_room
from bench.common import ACTOR_JSON as _ACTOR_JSON
from bench.common import PAYLOAD_JSON as _PAYLOAD_JSON
from bench.common import cpu_seconds as _cpu_seconds
from bench.common import raise_limits as _raise_limits


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


def _fill(engine: Any, room_id: str, count: int, prefix: str = "fill") -> None:
    from hostedrooms import rooms

    for start in range(0, count, 500):
        batch = [{"event_id": f"{prefix}-{seq}", "kind": "message.user", "actor": ACTOR, "payload": PAYLOAD}
                 for seq in range(start, min(count, start + 500))]
        rooms.append_events(engine, room_id, batch, GATEWAY, 1)


# --- workloads (each runs in its own process) -----------------------------------------------------------------

# --- workloads (each runs in its own process) -----------------------------------------------------------------


def raw_baseline(setup: Setup) -> Result:
    """The statements one append needs, through the raw DBAPI driver, one transaction per event."""
    target = setup.fresh("raw")
    engine = setup.engine(target)
    new_room(engine, "r")
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
    new_room(engine, "r")
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
    new_room(engine, "r")
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
    new_room(engine, "r")
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
            new_room(engine, f"other-{index}")
            _fill(engine, f"other-{index}", 20, prefix=f"o{index}")

    return _appends(setup, "many", prepare, setup.count(2000, 200), "append_event, 256 rooms live")


def _batches(setup: Setup, size: int) -> Result:
    from hostedrooms import rooms

    _raise_limits()
    engine = setup.engine(setup.fresh(f"batch{size}"))
    new_room(engine, "r")
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
        new_room(engine, "r")
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
    new_room(engine, "r")
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
        new_room(engine, f"room-{index}")
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

"""Scale curves (issue #27 part 3): what the public API costs as logs, rooms and payloads grow.

    python bench/run.py --scale                      # SQLite file (WAL, synchronous=FULL), rooms of up to 100k
    python bench/run.py --scale --postgres           # a throwaway PostgreSQL cluster (or --url ADMIN_URL)
    python bench/run.py --scale --max-events 1000000 # the 1M-event point too (minutes to fill)
    python bench/run.py --scale --quick              # small sizes (a smoke run)

Curves, each measured in a fresh process, on one growing store per curve:

- **events per room** (1k, 10k, 100k; ``--max-events`` adds 10x steps up to it): one room filled by batches of
  500 to each size, then p50/p99 of single ``append_event`` calls, of ``room_state``, and of ``follow(since_seq=
  size)`` from the call to its first event (an event appended beforehand: the resume cost of a follower, whose
  start reads ``room_state``).
- **rooms** (10, 100, 1,000, 10,000): that many live rooms (made with ``create_room``; on PostgreSQL then an
  ``ANALYZE``, as autovacuum runs within a minute of such growth), then p50/p99 of single
  appends into one of them and of ``list_rooms``' first page: a page of 10 rooms (the same rows at every count)
  and the default page (``MAX_ROOM_LIST_LIMIT`` = 500 rooms, or all of them when fewer).
- **replay MB/s by payload size** (100 B to 200 KB): a room of about 8 MB of events (at least 20 events) replayed
  with ``read_events`` pages from seq 0 to the end, best of 3; MB are the stored event bytes (id, kind, actor and
  payload text).
- **follow() latency**: ``bench/run.py``'s follow-latency workload (an ``hostedrooms.aio`` follower and an
  appender on one loop, an append every 20 ms; commit returned -> event received); **idle CPU**: the CPU time of
  a process whose one synchronous ``follow()`` waits on an idle room for 5 s (SQLite polls; PostgreSQL waits for
  NOTIFY), as a share of one core.
- **standby lag**: ``bench/standby.py lag`` (200 events/s over 50 rooms, 10 s; --quick 3 s).
"""

from __future__ import annotations

import multiprocessing
import os
import platform
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

from bench.common import ACTOR, GATEWAY, KIND, PAYLOAD, Context, Setup, raise_limits, render

# --- helpers -----------------------------------------------------------------------------------------------------


def _limits() -> None:
    from hostedrooms import limits

    raise_limits()
    limits.MAX_ACTIVE_ROOMS = 1_000_000
    limits.MAX_EVENTS_PER_ROOM = 10_000_000  # the 1M-event room takes the measured appends after its fill


def _times(n: int, call: Callable[[int], Any]) -> list[float]:
    latencies = []
    for index in range(n):
        started = time.perf_counter()
        call(index)
        latencies.append(time.perf_counter() - started)
    return latencies


def _p(values: list[float], fraction: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(fraction * len(ordered)))] * 1000 if ordered else 0.0


def _pp(values: list[float]) -> str:
    return f"{_p(values, 0.5):.2f} / {_p(values, 0.99):.2f}"


def _append(engine: Any, room_id: str, event_id: str, payload: Any = PAYLOAD) -> Any:
    from hostedrooms import rooms

    return rooms.append_event(engine, room_id=room_id, event_id=event_id, kind=KIND, actor=ACTOR, payload=payload,
                              authority_gateway_id=GATEWAY, authority_epoch=1)


def _fill(engine: Any, room_id: str, start: int, stop: int, payload: Any = PAYLOAD, batch: int = 500) -> None:
    from hostedrooms import rooms

    for first in range(start, stop, batch):
        rooms.append_events(engine, room_id, [{"event_id": f"fill-{seq}", "kind": KIND, "actor": ACTOR,
                                               "payload": payload} for seq in range(first, min(stop, first + batch))],
                            GATEWAY, 1)


def _room(engine: Any, room_id: str) -> None:
    from hostedrooms import rooms

    rooms.create_room(engine, room_id=room_id, name=room_id, members=[], authority_gateway_id=GATEWAY)


def _engine(ctx: Context, target: str) -> Any:
    from hostedrooms import create_engine

    return create_engine(target, synchronous=ctx.synchronous)


# --- curves (each in its own process) ------------------------------------------------------------------------------


def events_curve(ctx: Context, sizes: list[int], calls: int) -> list[tuple[str, ...]]:
    from hostedrooms import rooms

    _limits()
    engine = _engine(ctx, ctx.new_database("scale_events", migrated=True))
    _room(engine, "r")
    rows: list[tuple[str, ...]] = []
    filled = 0
    for size in sizes:
        started = time.perf_counter()
        _fill(engine, "r", filled, size)
        fill_seconds = time.perf_counter() - started
        filled = size
        appends = _times(calls, lambda index, size=size: _append(engine, "r", f"a{size}-{index}"))
        states = _times(calls, lambda _: rooms.room_state(engine, room_id="r"))
        head = int(rooms.room_state(engine, room_id="r")["latest_seq"])

        def resume(_: int, head: int = head) -> None:
            follower = rooms.follow(engine, "r", since_seq=head - 1)
            next(follower)
            follower.close()

        follows = _times(max(20, calls // 4), resume)
        filled = head  # the appends above are part of the log now
        rows.append((f"{size:,}", _pp(appends), _pp(states), _pp(follows), f"{fill_seconds:.1f}"))
        _log(f"scale: events {size:,} done")
    engine.dispose()
    return rows


def rooms_curve(ctx: Context, counts: list[int], calls: int) -> list[tuple[str, ...]]:
    from hostedrooms import rooms

    _limits()
    engine = _engine(ctx, ctx.new_database("scale_rooms", migrated=True))
    rows: list[tuple[str, ...]] = []
    made = 0
    for count in counts:
        for index in range(made, count):
            _room(engine, f"room-{index:05}")
        made = count
        if ctx.postgres:
            # What autovacuum does within a minute of such growth; a table never analyzed looks a few rows
            # long to the planner, which then sorts it whole instead of walking the listing index.
            with engine.begin() as connection:
                connection.exec_driver_sql("ANALYZE hosted_rooms")
        appends = _times(calls, lambda index, count=count: _append(engine, "room-00000", f"a{count}-{index}"))
        first10 = _times(calls, lambda _: rooms.list_rooms(engine, limit=10))
        default = _times(max(10, calls // 4), lambda _: rooms.list_rooms(engine))
        page = min(count, 500)
        rows.append((f"{count:,}", _pp(appends), _pp(first10), _pp(default), str(page),
                     f"{_p(default, 0.5) / page * 1000:.1f}"))
        _log(f"scale: rooms {count:,} done")
    engine.dispose()
    return rows


def replay_curve(ctx: Context, sizes: list[int], room_bytes: int) -> list[tuple[str, ...]]:
    from hostedrooms import rooms

    _limits()
    engine = _engine(ctx, ctx.new_database("scale_replay", migrated=True))
    rows: list[tuple[str, ...]] = []
    for size in sizes:
        room_id = f"replay-{size}"
        _room(engine, room_id)
        payload = {"text": "x" * max(1, size - 11)}  # the canonical JSON text is about ``size`` bytes
        count = max(20, room_bytes // size)
        _fill(engine, room_id, 0, count, payload, batch=max(1, min(500, (1 << 20) // size)))
        stored = count * len(("fill-0000" + KIND + '{"id":"u1","kind":"user"}' + '{"text":""}').encode()) + \
            count * len(payload["text"])
        best = float("inf")
        pages = 0
        for _ in range(3):
            started = time.perf_counter()
            since, pages = 0, 0
            while since < count:
                page = rooms.read_events(engine, room_id=room_id, since_seq=since, limit=500)
                since, pages = int(page["cursor"]), pages + 1
            best = min(best, time.perf_counter() - started)
        rows.append((_size(size), f"{count:,}", f"{stored / 1e6:.1f}", str(pages), f"{stored / 1e6 / best:.0f}",
                     f"{count / best:,.0f}"))
        _log(f"scale: replay {_size(size)} done")
    engine.dispose()
    return rows


def idle_follow_cpu(ctx: Context, seconds: float) -> str:
    from hostedrooms import rooms

    engine = _engine(ctx, ctx.new_database("scale_idle", migrated=True))
    _room(engine, "idle")
    _append(engine, "idle", "first")
    follower = rooms.follow(engine, "idle", since_seq=0)
    next(follower)  # the follower now waits for seq 2, which never comes
    stop = threading.Event()

    def drain() -> None:
        for _ in follower:
            if stop.is_set():
                return

    thread = threading.Thread(target=drain, daemon=True)
    thread.start()
    time.sleep(0.5)
    before, started = time.process_time(), time.perf_counter()
    time.sleep(seconds)
    used, elapsed = time.process_time() - before, time.perf_counter() - started
    stop.set()
    _append(engine, "idle", "wake")  # ends the follower's wait
    thread.join(10)
    engine.dispose()
    return f"{used / elapsed * 100:.2f}% of a core ({used * 1000:.0f} ms CPU in {elapsed:.1f} s)"


def _size(size: int) -> str:
    return f"{size // 1000} KB" if size >= 1000 else f"{size} B"


# --- the run -------------------------------------------------------------------------------------------------------


def _child(function: Any, args: tuple[Any, ...], results: Any) -> None:
    import traceback

    try:
        results.put(("ok", function(*args)))
    except BaseException:
        results.put(("error", traceback.format_exc()))


def _in_process(function: Any, *args: Any) -> Any:
    import queue as queue_module

    context = multiprocessing.get_context("spawn")
    results = context.Queue()
    process = context.Process(target=_child, args=(function, args, results))
    process.start()
    try:
        while True:
            try:
                status, value = results.get(timeout=1.0)
                break
            except queue_module.Empty:
                if not process.is_alive():
                    raise RuntimeError(f"worker exited with code {process.exitcode}") from None
    finally:
        process.join()
    if status != "ok":
        raise RuntimeError(value)
    return value


def _sizes(maximum: int) -> list[int]:
    sizes, size = [], 1000
    while size <= maximum:
        sizes.append(size)
        size *= 10
    return sizes


def run_scale(ctx: Context, *, max_events: int, out: Any = sys.stdout) -> int:
    from bench.registry import run as run_workload

    quick = ctx.quick
    where = "PostgreSQL (fsync=on, synchronous_commit=on)" if ctx.postgres else \
        f"SQLite file (WAL, synchronous={ctx.synchronous})"
    calls = 50 if quick else 200
    out.write(f"## scale curves, {where}\n\n{time.strftime('%Y-%m-%d')}, {os.cpu_count()} cores, Python "
              f"{platform.python_version()}, load average {os.getloadavg()[0]:.1f} at the start"
              f"{', --quick' if quick else ''}; latencies p50 / p99 in ms\n\n")
    sizes = _sizes(min(max_events, 10_000) if quick else max_events)
    rows = _in_process(events_curve, ctx, sizes, calls)
    out.write(f"Events per room ({calls} calls each; follow: {max(20, calls // 4)} resumes):\n\n" + render([
        ("events in the room", "append_event", "room_state", "follow(since_seq>0) to first event",
         "fill s"), *rows]) + "\n")
    out.flush()
    counts = [10, 100, 1000] if quick else [10, 100, 1000, 10_000]
    rows = _in_process(rooms_curve, ctx, counts, calls)
    out.write(f"Rooms ({calls} calls each):\n\n" + render([
        ("live rooms", "append_event", "list_rooms, page of 10", "list_rooms, default page", "rooms on it",
         "us per listed room"), *rows]) + "\n")
    out.flush()
    payloads = [100, 1000, 10_000, 64_000, 200_000]
    rows = _in_process(replay_curve, ctx, payloads, (2 << 20) if quick else (8 << 20))
    out.write("Replay by payload size (read_events pages of up to 500 events / 2 MB, best of 3):\n\n" + render([
        ("payload", "events", "MB stored", "pages", "MB/s", "events/s"), *rows]) + "\n")
    out.flush()
    setup = Setup(url=ctx.url, folder=ctx.folder, synchronous=ctx.synchronous, quick=quick)
    follow = run_workload("follow-latency", setup)
    idle = _in_process(idle_follow_cpu, ctx, 2.0 if quick else 5.0)
    out.write(f"follow(): wake-up p50 {follow.percentile(0.5) * 1000:.2f} ms, p99 "
              f"{follow.percentile(0.99) * 1000:.2f} ms over {follow.operations} appends 20 ms apart "
              f"({follow.note}); idle follower: {idle}\n\n")
    out.flush()
    out.write(_in_process(_lag, ctx, 3.0 if quick else 10.0) + "\n\n")
    return 0


def _lag(ctx: Context, seconds: float) -> str:
    from bench.standby import lag

    return lag(ctx, rooms=50, rate=200.0, seconds=seconds, poll=0.01, workers=1)


def _log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


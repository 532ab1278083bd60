"""Standby benchmarks: replication lag in a steady state, and the replicator's memory whatever the room count.

    python bench/standby.py lag                      # SQLite files in a temp folder (WAL, synchronous=FULL)
    python bench/standby.py lag --postgres           # a throwaway PostgreSQL cluster (or --url ADMIN_URL)
    python bench/standby.py lag --rate 200 --rooms 50 --seconds 20 --poll 0.01
    python bench/standby.py memory                   # traced peak of one catch-up pass, 8 / 64 / 256 rooms
    python bench/standby.py all --quick              # both, small (a smoke run)

**lag**: the authority appends ``--rate`` events per second, round-robin over ``--rooms`` rooms, one durable
append per event (its own process, paced by the clock), while a following Replicator (another process: the
CLI's ``replicate --follow`` setup, woken by the source's change token polled every ``--poll`` seconds) keeps
a standby's replicas caught up. For every event, lag = the moment the standby's ``ingest_page`` holding it
returned minus the moment the authority's ``append_event`` returned (CLOCK_MONOTONIC, one clock for both
processes); a replica can store an event before its appender's call has returned, so the smallest lags may be
negative. Reported: p50, p90, p99, max, and the rate the appender achieved.

The catch-up throughput (and its ratio to a bare ``read_events``/``ingest_page`` loop) is measured in
alternating rounds by the comparison harness: ``python bench/run.py --compare catch-up``.

**memory**: tracemalloc's peak during one catch-up pass of N rooms of the same size each, against one page's
JSON size: flat in N means the replicator holds one page (of one room) at a time.
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import platform
import statistics
import sys
import tempfile
import time
import tracemalloc
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.common import ACTOR, GATEWAY, KIND, PAYLOAD, Context, raise_limits  # noqa: E402

# --- lag -------------------------------------------------------------------------------------------------------


def _appender(authority: str, rooms: int, rate: float, seconds: float, start_at: float, results: Any) -> None:
    from hostedrooms import create_engine
    from hostedrooms import rooms as room_service

    engine = create_engine(authority)
    commits: list[tuple[str, int, float]] = []
    total = int(rate * seconds)
    while time.monotonic() < start_at:
        time.sleep(0.001)
    for index in range(total):
        due = start_at + index / rate
        delay = due - time.monotonic()
        if delay > 0:
            time.sleep(delay)
        room_id = f"room-{index % rooms:03}"
        event = room_service.append_event(engine, room_id=room_id, event_id=f"lag-{index}", kind=KIND, actor=ACTOR,
                                          payload=PAYLOAD, authority_gateway_id=GATEWAY, authority_epoch=1)
        commits.append((room_id, int(event["seq"]), time.monotonic()))
    elapsed = time.monotonic() - start_at
    engine.dispose()
    results.put(("appender", commits, elapsed))


def _follower(authority: str, standby: str, poll: float, workers: int, ready: Any, stop: Any,
              results: Any) -> None:
    import threading

    from hostedrooms import create_engine
    from hostedrooms.standby import EnginePageSource, PollingWaker, Replicator

    pages: list[tuple[str, int, int, float]] = []
    source = EnginePageSource(authority)
    target = create_engine(standby)

    def on_page(page: Any) -> None:
        if page.events:
            pages.append((page.room_id, page.first_seq, page.last_seq, page.monotonic))

    replicator = Replicator(source, target, on_page=on_page, max_pages_per_room=16, workers=workers)
    replicator.sync_once()  # the rooms exist on the standby before the clock starts
    ready.set()
    halt = threading.Event()
    watcher = threading.Thread(target=lambda: (stop.wait(), halt.set()), daemon=True)
    watcher.start()
    replicator.run(interval=1.0, waker=PollingWaker(source.change_token, poll_interval=poll), stop=halt)
    source.close()
    target.dispose()
    results.put(("follower", pages, 0.0))


def _percentile(values: list[float], fraction: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(fraction * len(ordered)))]


def lag(ctx: Context, *, rooms: int, rate: float, seconds: float, poll: float, workers: int) -> str:
    from hostedrooms import create_engine, replicas
    from hostedrooms import rooms as room_service

    raise_limits()
    authority = ctx.new_database("lag_authority", migrated=True)
    standby = ctx.new_database("lag_standby", migrated=True)
    engine = create_engine(authority)
    for index in range(rooms):
        room_service.create_room(engine, room_id=f"room-{index:03}", name="Lag", members=[],
                                 authority_gateway_id=GATEWAY)
    engine.dispose()
    context = multiprocessing.get_context("spawn")
    results, ready, stop = context.Queue(), context.Event(), context.Event()
    follower = context.Process(target=_follower, args=(authority, standby, poll, workers, ready, stop, results))
    follower.start()
    ready.wait(120)
    start_at = time.monotonic() + 1.0
    appender = context.Process(target=_appender, args=(authority, rooms, rate, seconds, start_at, results))
    appender.start()
    collected = {}
    kind, commits, elapsed = results.get(timeout=seconds * 10 + 120)
    collected[kind] = (commits, elapsed)
    appender.join()
    # Let the follower store the last commits, then stop it.
    target = create_engine(standby)
    last = {room_id: seq for room_id, seq, _ in collected["appender"][0]}
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and any(
            replicas.replica_state(target, room_id=room_id)["last_seq"] < seq for room_id, seq in last.items()):
        time.sleep(0.05)
    target.dispose()
    stop.set()
    kind, pages, _ = results.get(timeout=120)
    follower.join()
    commits, elapsed = collected["appender"]
    stored: dict[tuple[str, int], float] = {}
    for room_id, first, last_seq, at in pages:
        for seq in range(first, last_seq + 1):
            stored[(room_id, seq)] = at
    lags = [(stored[(room_id, seq)] - at) * 1000 for room_id, seq, at in commits if (room_id, seq) in stored]
    missing = len(commits) - len(lags)
    where = "PostgreSQL" if ctx.postgres else "SQLite (WAL, synchronous=FULL)"
    return (f"lag, {where}: {len(commits):,} events over {rooms} rooms in {elapsed:.1f} s "
            f"({len(commits) / elapsed:.0f} events/s achieved of {rate:.0f} asked), poll {poll * 1000:.0f} ms, "
            f"{workers} worker{'s' if workers != 1 else ''}: "
            f"p50 {_percentile(lags, 0.5):.1f} ms, p90 {_percentile(lags, 0.9):.1f} ms, "
            f"p99 {_percentile(lags, 0.99):.1f} ms, max {max(lags):.1f} ms, min {min(lags):.1f} ms, "
            f"mean {statistics.fmean(lags):.1f} ms" + (f"; {missing} events never seen stored" if missing else ""))


# --- memory ----------------------------------------------------------------------------------------------------


def _memory_pass(authority: str, standby: str, count: int, page: int) -> tuple[int, int, int]:
    from hostedrooms import create_engine
    from hostedrooms.standby import EnginePageSource, Replicator, RoomHead

    raise_limits()
    source = EnginePageSource(authority)

    class FirstRooms(EnginePageSource):
        def list_rooms(self, *, after: str | None = None, limit: int = 500) -> list[RoomHead]:
            return [head for head in super().list_rooms(after=after, limit=limit) if int(head.room_id[5:]) < count]

    limited = FirstRooms(source.engine)
    target = create_engine(standby)
    replicator = Replicator(limited, target, page_limit=page)
    tracemalloc.start()
    report = replicator.sync_once()
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    import json

    from hostedrooms import rooms as room_service

    page_bytes = len(json.dumps(room_service.read_events(source.engine, room_id="room-000", since_seq=0,
                                                         limit=page)).encode())
    return report.events, peak, page_bytes


def memory(ctx: Context, *, counts: list[int], events: int, page: int) -> str:
    from hostedrooms import create_engine
    from hostedrooms import rooms as room_service

    raise_limits()
    authority = ctx.new_database("memory_authority", migrated=True)
    engine = create_engine(authority)
    big = {"text": "x" * 2000}
    for index in range(max(counts)):
        room_id = f"room-{index:03}"
        room_service.create_room(engine, room_id=room_id, name="M", members=[], authority_gateway_id=GATEWAY)
        for first in range(0, events, 500):
            room_service.append_events(engine, room_id, [
                {"event_id": f"m-{n}", "kind": KIND, "actor": ACTOR, "payload": big}
                for n in range(first, min(events, first + 500))], GATEWAY, 1)
    engine.dispose()
    lines = []
    context = multiprocessing.get_context("spawn")
    for count in counts:
        standby = ctx.new_database(f"memory_standby_{count}", migrated=True)
        with context.Pool(1) as pool:
            stored, peak, page_bytes = pool.apply(_memory_pass, (authority, standby, count, page))
        lines.append(f"  {count:>4} rooms x {events} events ({stored:,} events): traced peak {peak / 1e6:.1f} MB "
                     f"({peak / page_bytes:.1f} pages of {page_bytes / 1e6:.2f} MB JSON)")
    return f"memory, one catch-up pass (pages of {page}):\n" + "\n".join(lines)


# --- main ------------------------------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("what", choices=("lag", "memory", "all"))
    parser.add_argument("--url", help="PostgreSQL admin URL (a role that may CREATE DATABASE)")
    parser.add_argument("--postgres", action="store_true", help="start a throwaway PostgreSQL cluster")
    parser.add_argument("--quick", action="store_true", help="small counts")
    parser.add_argument("--rooms", type=int, default=50)
    parser.add_argument("--rate", type=float, default=200.0, help="events per second the authority appends")
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--poll", type=float, default=0.01, help="the follower's change-token poll (seconds)")
    parser.add_argument("--workers", default="1", help="the follower's workers; a comma-separated list runs each")
    args = parser.parse_args(argv)
    cluster, url = None, args.url
    if args.postgres:
        from hostedrooms import pgcluster

        cluster = pgcluster.start()
        url = cluster.url
    print(f"# hostedrooms standby benchmark, {time.strftime('%Y-%m-%d')}, {os.cpu_count()} cores, "
          f"Python {platform.python_version()}, load average {os.getloadavg()[0]:.1f} at the start")
    try:
        with tempfile.TemporaryDirectory(prefix="hostedrooms-standby-") as folder:
            ctx = Context(url=url, folder=folder, synchronous="FULL", quick=args.quick)
            if args.what in ("lag", "all"):
                for workers in [int(value) for value in args.workers.split(",")]:
                    print(lag(ctx, rooms=args.rooms, rate=args.rate, seconds=3.0 if args.quick else args.seconds,
                              poll=args.poll, workers=workers), flush=True)
            if args.what in ("memory", "all"):
                counts = [4, 16] if args.quick else [8, 64, 256]
                print(memory(ctx, counts=counts, events=200 if args.quick else 300, page=500), flush=True)
    finally:
        if cluster is not None:
            cluster.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

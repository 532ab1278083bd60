"""The escrow budget's appends beside another checkout's (the old path), in alternating rounds within one run.

    git archive main | tar -x -C /tmp/hostedrooms-main      # the baseline: any checkout of hostedrooms
    python bench/escrow_ab.py --baseline /tmp/hostedrooms-main --rounds 5
    python bench/escrow_ab.py --baseline /tmp/hostedrooms-main --workloads sqlite-10,sqlite-10000 --rounds 7

Each workload runs each round once per checkout, in a fresh process whose ``PYTHONPATH`` is that checkout, on a
database that checkout's own migrations built (so each runs the statements it was written for), the order
alternating by round. It prints, per workload, the median events/s of each and the ratio this/baseline, per round
then the median with its min-max. Workloads: ``pg-append`` (one event per call, one room), ``pg-batch100``,
``pg-4writers`` (4 processes, 4 rooms, each its own engine), ``sqlite-10`` and ``sqlite-10000`` (single appends
to one room of a gateway holding 10 or 10,000 rooms; SQLite WAL, synchronous=FULL). Only the public API is used,
so any checkout runs it. Absolute rates on a shared machine are noisy: quote the ratios, with the conditions.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve()
ACTOR: Any = {"kind": "user", "id": "u1"}
PAYLOAD = {"text": "hello, this is a typical chat message of a modest length"}
GATEWAY = "install:bench"
CALLS = {"pg-append": 1000, "pg-batch100": 40, "pg-4writers": 300, "sqlite-10": 1000, "sqlite-10000": 1000}
WORKLOADS = tuple(CALLS)


# --- child side (public API only: runs on any checkout) --------------------------------------------------------


def _target(kind: str, admin_url: str | None, folder: str) -> str:
    if kind.startswith("pg"):
        from hostedrooms.testing import create_database

        assert admin_url is not None
        return create_database(admin_url, f"escrow_{uuid.uuid4().hex[:12]}")
    return str(Path(folder) / f"{uuid.uuid4().hex}.db")


def _append(rooms: Any, engine: Any, room_id: str, event_id: str) -> None:
    rooms.append_event(engine, room_id=room_id, event_id=event_id, kind="message.user", actor=ACTOR, payload=PAYLOAD,
                       authority_gateway_id=GATEWAY, authority_epoch=1)


def _writer(target: str, room_id: str, calls: int, ready: Any, go: Any, out: Any) -> None:
    from hostedrooms import create_engine, rooms

    engine = create_engine(target, pool_size=1, max_overflow=0)
    for index in range(10):
        _append(rooms, engine, room_id, f"warm-{index}")
    ready.release()
    go.wait()
    started = time.perf_counter()
    for index in range(calls):
        _append(rooms, engine, room_id, f"e-{index}")
    out.put((started, time.perf_counter()))
    engine.dispose()


def child(workload: str, admin_url: str | None, folder: str) -> dict[str, float]:
    import sqlalchemy as sa

    from hostedrooms import create_engine, migrate, rooms

    target = _target(workload, admin_url, folder)
    migrate.upgrade(target)
    engine = create_engine(target, pool_size=1, max_overflow=0)
    calls = CALLS[workload]
    room_count = {"sqlite-10": 10, "sqlite-10000": 10_000, "pg-4writers": 4}.get(workload, 1)
    rooms.create_room(engine, room_id="room-0", name="r", members=[], authority_gateway_id=GATEWAY)
    if room_count > 1:  # the other rooms in one transaction (setup, not timed): no bytes, no events
        with engine.begin() as connection:
            connection.execute(sa.text(
                "INSERT INTO hosted_rooms (room_id, name, members_json, authority_gateway_id, created_at, "
                "updated_at) VALUES (:r, 'r', '[]', :g, 1, 1)"),
                [{"r": f"room-{index}", "g": GATEWAY} for index in range(1, room_count)])
    if workload == "pg-4writers":
        engine.dispose()
        context = multiprocessing.get_context("spawn")
        ready, go, out = context.Semaphore(0), context.Event(), context.Queue()
        processes = [context.Process(target=_writer, args=(target, f"room-{index}", calls, ready, go, out))
                     for index in range(4)]
        for process in processes:
            process.start()
        for _ in processes:
            ready.acquire()
        go.set()
        spans = [out.get() for _ in processes]
        for process in processes:
            process.join()
        return {"events": 4 * calls, "seconds": max(end for _, end in spans) - min(start for start, _ in spans)}
    for index in range(20):
        _append(rooms, engine, "room-0", f"warm-{index}")
    started = time.perf_counter()
    if workload == "pg-batch100":
        for index in range(calls):
            rooms.append_events(engine, "room-0", [
                {"event_id": f"b{index}-{item}", "kind": "message.user", "actor": ACTOR, "payload": PAYLOAD}
                for item in range(100)], GATEWAY, 1)
        events = calls * 100
    else:
        for index in range(calls):
            _append(rooms, engine, "room-0", f"e-{index}")
        events = calls
    seconds = time.perf_counter() - started
    engine.dispose()
    return {"events": events, "seconds": seconds}


# --- parent side -------------------------------------------------------------------------------------------------


def _run_child(checkout: Path, workload: str, admin_url: str | None, folder: str) -> float:
    env = dict(os.environ, PYTHONPATH=str(checkout))
    result = subprocess.run(
        [sys.executable, str(HERE), "--child", workload, "--folder", folder, *(["--url", admin_url] if admin_url
                                                                              else [])],
        env=env, cwd=str(checkout), capture_output=True, text=True, check=False, timeout=1800)
    if result.returncode != 0:
        raise SystemExit(f"{workload} on {checkout} failed:\n{result.stdout}\n{result.stderr}")
    outcome = json.loads(result.stdout.strip().splitlines()[-1])
    return float(outcome["events"]) / float(outcome["seconds"])


def _report(title: str, ours: list[float], other_name: str, other: list[float]) -> None:
    ratios = [mine / theirs for mine, theirs in zip(ours, other, strict=True)]
    print(f"{title}: {statistics.median(ours):.0f} ev/s ({min(ours):.0f}-{max(ours):.0f}), {other_name} "
          f"{statistics.median(other):.0f} ev/s ({min(other):.0f}-{max(other):.0f}); ratio median "
          f"{statistics.median(ratios):.2f}x ({min(ratios):.2f}-{max(ratios):.2f}), {len(ratios)} rounds", flush=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--baseline", type=Path, help="the other checkout (its root folder)")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--workloads", default=",".join(WORKLOADS))
    parser.add_argument("--child")
    parser.add_argument("--folder")
    parser.add_argument("--url")
    args = parser.parse_args(argv)
    if args.child:
        print(json.dumps(child(args.child, args.url, args.folder)))
        return 0
    if args.baseline is None:
        parser.error("--baseline is required")
    workloads = [name for name in args.workloads.split(",") if name]
    checkouts = {"this": HERE.parent.parent, "baseline": args.baseline.resolve()}
    cluster = None
    if any(name.startswith("pg") for name in workloads):
        sys.path.insert(0, str(checkouts["this"]))
        from hostedrooms import pgcluster

        cluster = pgcluster.start()
    try:
        with tempfile.TemporaryDirectory(prefix="escrow-ab-") as folder:
            rates: dict[tuple[str, str], list[float]] = {(w, n): [] for w in workloads for n in checkouts}
            for round_index in range(args.rounds):  # every workload in every round: rounds pair up across them
                for workload in workloads:
                    order = list(checkouts) if round_index % 2 == 0 else list(reversed(checkouts))
                    for name in order:
                        rates[workload, name].append(_run_child(checkouts[name], workload,
                                                                cluster.url if cluster else None, folder))
            for workload in workloads:
                _report(workload, rates[workload, "this"], "baseline", rates[workload, "baseline"])
            if {"sqlite-10", "sqlite-10000"} <= set(workloads):
                for name in checkouts:
                    _report(f"{name}: sqlite-10000 vs sqlite-10", rates["sqlite-10000", name], "10 rooms",
                            rates["sqlite-10", name])
    finally:
        if cluster is not None:
            cluster.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

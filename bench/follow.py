"""follow() on SQLite: what an engine's idle followers cost (bench/run.py's ``follow-idle`` workload).

Several followers, each a thread iterating ``rooms.follow()`` on a room of its own, wait on the engine's one shared
waiter (hostedrooms/wakeup.py), which polls ``PRAGMA data_version`` on its own connection (and, on Linux, watches
the ``-wal`` file). Nothing is appended: the process's CPU time (user + system, ``getrusage``) over the idle span,
divided by that span, is the share of one core the waiting costs. The wake-up latency itself is the
``follow-latency`` workload.
"""

from __future__ import annotations

import resource
import threading
import time
from typing import Any

from bench.common import ACTOR, GATEWAY, PAYLOAD, Result, new_room

FOLLOWERS = 8


def _cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def follow_idle(setup: Any) -> Any:
    """``FOLLOWERS`` idle followers of one engine for 20 s (5 s with ``--quick``): the share of a core used."""
    from hostedrooms import rooms
    from hostedrooms.backends import backend_for
    from hostedrooms.wakeup import DEFAULT_POLL_INTERVAL

    engine = setup.engine(setup.fresh("follow-idle"))
    for index in range(FOLLOWERS):
        new_room(engine, f"room-{index}")
    started = threading.Barrier(FOLLOWERS + 1)

    def follower(room_id: str) -> None:
        started.wait()
        for _ in rooms.follow(engine, room_id, 0):  # never yields: nothing is appended
            pass

    for index in range(FOLLOWERS):  # daemon threads: the worker process ends with the result
        threading.Thread(target=follower, args=(f"room-{index}",), daemon=True).start()
    started.wait()
    time.sleep(1.0)  # every follower has read its room and waits
    span = setup.count(20.0, 5.0)
    before, wall = _cpu(), time.perf_counter()
    time.sleep(span)
    used, seconds = _cpu() - before, time.perf_counter() - wall
    how = ("LISTEN/NOTIFY" if backend_for(engine).notifies
           else f"one data_version poller every {DEFAULT_POLL_INTERVAL * 1000:.0f} ms")
    return Result(f"follow() idle: {FOLLOWERS} followers of one engine, nothing appended", 1, FOLLOWERS, seconds,
                  note=f"{how}; {used / seconds * 100:.2f}% of one core over {seconds:.0f} s (getrusage)")


def _appender(target: str, synchronous: str, n: int, committed: Any, go: Any) -> None:
    """In another process: append ``n`` events 20 ms apart, reporting each one's seq and commit time."""
    from hostedrooms import create_engine, rooms

    engine = create_engine(target, synchronous=synchronous)
    rooms.room_state(engine, room_id="r")  # connected and warm before the clock starts
    go.wait()
    for index in range(n):
        event = rooms.append_event(engine, room_id="r", event_id=f"p{index}", kind="message.user", actor=ACTOR,
                                   payload=PAYLOAD, authority_gateway_id=GATEWAY, authority_epoch=1)
        committed.put((event["seq"], time.monotonic()))
        time.sleep(0.02)
    engine.dispose()


def follow_latency_process(setup: Any) -> Any:
    """From an append's commit returning in ANOTHER process to a follower of this process having the event (a
    thread iterating ``rooms.follow()``): on SQLite what the poll period bounds, since only this process's own
    commits wake its followers at once. Monotonic clock, shared by the two processes."""
    import multiprocessing

    from hostedrooms import rooms
    from hostedrooms.backends import backend_for
    from hostedrooms.wakeup import DEFAULT_POLL_INTERVAL

    target = setup.fresh("follow-process")
    engine = setup.engine(target)
    new_room(engine, "r")
    n = setup.count(300, 40)
    context = multiprocessing.get_context("spawn")
    committed_queue, go = context.Queue(), context.Event()
    child = context.Process(target=_appender, args=(target, setup.synchronous, n, committed_queue, go))
    child.start()
    received: dict[int, float] = {}

    def follower() -> None:
        for event in rooms.follow(engine, "r", 0):
            received[event["seq"]] = time.monotonic()
            if len(received) == n:
                return

    thread = threading.Thread(target=follower, daemon=True)
    thread.start()
    time.sleep(1.0)
    started = time.perf_counter()
    go.set()
    committed = dict(committed_queue.get(timeout=120) for _ in range(n))
    thread.join(30)
    child.join(30)
    seconds = time.perf_counter() - started
    latencies = [max(0.0, received[seq] - committed[seq]) for seq in sorted(committed)]
    how = ("LISTEN/NOTIFY" if backend_for(engine).notifies
           else f"-wal watch (Linux), backstop poll every {DEFAULT_POLL_INTERVAL * 1000:.0f} ms")
    engine.dispose()
    return Result("follow() wake-up, appender in another process: commit returned -> follower has the event", 1, n,
                  seconds, latencies, note=f"{how}; latency columns are the wake-up's")

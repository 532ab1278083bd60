"""bench/run.py's asyncio workloads: many tasks on one loop (and the loop's responsiveness beside them), and
follow()'s wake-up latency on one loop."""

from __future__ import annotations

import time
from collections.abc import Coroutine
from typing import Any

from bench.common import ACTOR, GATEWAY, PAYLOAD, Result, Setup, new_room
from bench.common import raise_limits as _raise_limits


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


async def _beside_ticker(writers: list[Coroutine[Any, Any, None]]) -> tuple[float, str]:
    """Run ``writers`` together with a 1 ms ticker beside them: their seconds, and the ticker's note."""
    import asyncio

    ticker = _Ticker()
    ticking = asyncio.create_task(ticker.run())
    started = time.perf_counter()
    await asyncio.gather(*writers)
    seconds = time.perf_counter() - started
    ticker.stop()
    await ticking
    return seconds, ticker.note()


_TASK_LABELS = {"aio": "hostedrooms.aio", "aio-awaited": "hostedrooms.aio, services=awaited",
                "to_thread": "sync API via asyncio.to_thread", "sync-on-loop": "sync API called on the loop"}


def _tasks(setup: Setup, tasks: int, how: str) -> Result:
    """``tasks`` asyncio tasks, each appending to its own room on one event loop, with a 1 ms ticker beside them.

    ``how``: "aio" (hostedrooms.aio on an AsyncEngine; "aio-awaited": with ``services="awaited"``), "to_thread"
    (the synchronous API through ``asyncio.to_thread``, the default executor) or "sync-on-loop" (the synchronous
    API called on the loop, which it blocks: the contrast for the ticker).
    """
    import asyncio

    from hostedrooms import aio, rooms

    _raise_limits()
    target = setup.fresh(f"tasks{tasks}{how.replace('-', '')}")
    engine = setup.engine(target)
    for index in range(tasks):
        new_room(engine, f"room-{index}")
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
        seconds, note = await _beside_ticker([writer(room) for room in range(tasks)])
        await async_engine.dispose()
        self_note.append(note)
        return seconds

    self_note: list[str] = []
    seconds = asyncio.run(main())
    engine.dispose()
    label = _TASK_LABELS[how]
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
    new_room(engine, "r")
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

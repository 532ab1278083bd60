"""SQLite followers wake at once for commits of their own process: every write unit that commits on an engine asks
that engine's shared ``data_version`` poller to look now (hostedrooms.wakeup.committed), so only commits of other
processes wait for the next poll. The poll period here is far longer than the bound the tests allow, so a follower
that waited for it fails them; the bound is generous (it proves no poll period was waited, not a speed)."""

from __future__ import annotations

import asyncio
import sys
import threading
import time
from typing import Any

import pytest
from factories import make_room
from sqlalchemy import Engine

from hostedrooms import aio, rooms, wakeup

GATEWAY = "install:gw-a"
USER = {"kind": "user", "id": "u1"}
#: Neither the poll period nor the fallback re-read can deliver an event within BOUND.
SLOW = {"poll_interval": 20.0, "fallback_interval": 60.0}
BOUND = 5.0


def _append(engine: Engine, event_id: str) -> Any:
    return rooms.append_event(engine, room_id="r1", event_id=event_id, kind="message.user", actor=USER,
                              payload={"text": event_id}, authority_gateway_id=GATEWAY, authority_epoch=1)


@pytest.mark.parametrize("backend", ["sqlite"], indirect=True)
def test_a_commit_of_this_process_wakes_a_slow_polling_follower_at_once(engine: Engine) -> None:
    make_room(engine, room_id="r1", gateway=GATEWAY)
    seen: list[tuple[int, float]] = []
    ready = threading.Event()

    def follow() -> None:
        iterator = rooms.follow(engine, "r1", 0, **SLOW)
        ready.set()
        for event in iterator:
            seen.append((event["seq"], time.monotonic()))
            if len(seen) == 3:
                return

    thread = threading.Thread(target=follow, daemon=True)
    thread.start()
    assert ready.wait(10)
    time.sleep(0.5)  # the follower has read its empty room and waits
    appended = []
    for n in range(3):
        _append(engine, f"e{n}")
        appended.append(time.monotonic())
        time.sleep(0.2)
    thread.join(BOUND * 3)
    assert [seq for seq, _ in seen] == [1, 2, 3]
    assert all(at - committed < BOUND for (_, at), committed in zip(seen, appended, strict=True))


@pytest.mark.parametrize("backend", ["sqlite"], indirect=True)
def test_an_asyncio_commit_wakes_an_asyncio_follower_at_once(engine: Engine) -> None:
    make_room(engine, room_id="r1", gateway=GATEWAY)

    async def run() -> list[int]:
        async_engine = aio.create_async_engine(engine.url)
        try:
            async def follow() -> list[int]:
                seqs = []
                async for event in aio.rooms.follow(async_engine, "r1", 0, **SLOW):
                    seqs.append(event["seq"])
                    if len(seqs) == 2:
                        return seqs
                return seqs

            following = asyncio.ensure_future(follow())
            await asyncio.sleep(0.5)
            for n in range(2):
                await aio.rooms.append_event(async_engine, room_id="r1", event_id=f"e{n}", kind="message.user",
                                             actor=USER, payload={"n": n}, authority_gateway_id=GATEWAY,
                                             authority_epoch=1)
            return await asyncio.wait_for(following, BOUND)
        finally:
            await async_engine.dispose()

    assert asyncio.run(run()) == [1, 2]


APPENDER = r"""
import sys
from hostedrooms import create_engine, rooms
engine = create_engine(sys.argv[1])
for n in range(int(sys.argv[2])):
    rooms.append_event(engine, room_id="r1", event_id=f"p{n}", kind="message.user", actor={"kind": "user", "id": "u1"},
                       payload={"n": n}, authority_gateway_id="install:gw-a", authority_epoch=1)
engine.dispose()
"""


def _followed_from_another_process(engine: Engine, poll: dict[str, float], count: int = 2) -> list[int]:
    """Start a follower here, append ``count`` events from another process; the seqs followed within BOUND."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    import hostedrooms

    make_room(engine, room_id="r1", gateway=GATEWAY)
    seen: list[int] = []
    ready = threading.Event()

    def follow() -> None:
        iterator = rooms.follow(engine, "r1", 0, **poll)
        ready.set()
        for event in iterator:
            seen.append(event["seq"])
            if len(seen) == count:
                return

    thread = threading.Thread(target=follow, daemon=True)
    thread.start()
    assert ready.wait(10)
    time.sleep(0.5)
    env = dict(os.environ, PYTHONPATH=str(Path(hostedrooms.__file__).resolve().parent.parent))
    subprocess.run([sys.executable, "-c", APPENDER, str(engine.url.database), str(count)], check=True, env=env,
                   timeout=60)
    thread.join(BOUND)
    return seen


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the commit file is watched with Linux inotify")
@pytest.mark.parametrize("backend", ["sqlite"], indirect=True)
def test_a_commit_of_another_process_wakes_a_slow_polling_follower_on_linux(engine: Engine) -> None:
    assert _followed_from_another_process(engine, SLOW) == [1, 2]


@pytest.mark.parametrize("backend", ["sqlite"], indirect=True)
def test_without_a_file_watch_commits_of_another_process_are_polled(
    engine: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(wakeup, "watch_writes", lambda _path: None)
    assert _followed_from_another_process(engine, {"poll_interval": 0.05, "fallback_interval": 60.0}) == [1, 2]

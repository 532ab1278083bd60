"""Fork safety: a child forked while hostedrooms' threads work in the parent (writer threads appending, followers
and their shared waiter reading) never inherits a lock one of them held inside the driver (SQLite's mutexes: a
child once blocked 16 minutes in its first connect). Each child appends and follows its own event back, then
exits 0; every wait on a child is bounded (it is killed and the test fails). Both backends; 200 forks by default,
1000 behind ``-m slow``."""

from __future__ import annotations

import contextlib
import os
import threading
import time
from typing import Any

import pytest
from factories import make_room
from sqlalchemy import Engine
from waits import join, wait_child

from hostedrooms import rooms

pytestmark = [
    pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork"),
    pytest.mark.filterwarnings("ignore:This process .* is multi-threaded:DeprecationWarning"),
]

GATEWAY = "install:gw-a"
#: Children alive at once, and how long one may take before it counts as hung.
AT_ONCE = 4
CHILD_BOUND = 30.0
#: Each writer's appends to one room before it moves on to a new one.
ROOM_SHARE = 10_000


def append(engine: Engine, room_id: str, event_id: str) -> int:
    event = rooms.append_event(engine, room_id=room_id, event_id=event_id, kind="message.user",
                               actor={"kind": "user", "id": "u1"}, payload={"text": event_id},
                               authority_gateway_id=GATEWAY, authority_epoch=1)
    return int(event["seq"])


def child(engine: Engine, index: int) -> int:
    """In the child: append to its own room and read that event back through follow()."""
    engine.dispose(close=False)  # SQLAlchemy's fork recipe: the parent's pooled connections are not ours
    event_id = f"child-{index}"
    seq = append(engine, "children", event_id)
    with contextlib.closing(rooms.follow(engine, "children", seq - 1, fallback_interval=60.0)) as feed:
        return 0 if next(feed)["event_id"] == event_id else 2


class Busy:
    """Writer threads appending and followers reading in the parent until stopped."""

    def __init__(self, engine: Engine) -> None:
        self.stop = threading.Event()
        self.errors: list[BaseException] = []
        self.appended = [0, 0]
        self.threads = [threading.Thread(target=self._write, args=(engine, n), daemon=True) for n in range(2)]
        self.threads += [threading.Thread(target=self._follow, args=(engine,), daemon=True) for _ in range(2)]
        for thread in self.threads:
            thread.start()

    def _write(self, engine: Engine, n: int) -> None:
        room = "busy"
        try:
            while not self.stop.is_set():
                self.appended[n] += 1
                if self.appended[n] % ROOM_SHARE == 0:  # a room holds at most MAX_EVENTS_PER_ROOM events
                    room = f"busy-{n}-{self.appended[n]}"
                    make_room(engine, room_id=room, gateway=GATEWAY)
                append(engine, room, f"w{n}-{self.appended[n]}")
        except BaseException as exc:  # reported by the test
            self.errors.append(exc)

    def _follow(self, engine: Engine) -> None:
        try:
            with contextlib.closing(rooms.follow(engine, "busy", 0, poll_interval=0.001)) as feed:
                for _event in feed:
                    if self.stop.is_set():
                        return
        except BaseException as exc:  # reported by the test
            self.errors.append(exc)

    def end(self, engine: Engine) -> None:
        self.stop.set()
        append(engine, "busy", "last")  # wakes the followers to see the stop
        for thread in self.threads:
            join(thread, 30)


def fork_many(engine: Engine, count: int) -> list[int]:
    """Fork ``count`` children (``AT_ONCE`` at a time) while the parent is busy; their exit codes."""
    make_room(engine, room_id="busy", gateway=GATEWAY)
    make_room(engine, room_id="children", gateway=GATEWAY)
    busy = Busy(engine)
    codes: list[int] = []
    running: list[int] = []
    try:
        time.sleep(0.1)  # the writers and the followers under way
        for index in range(count):
            if len(running) == AT_ONCE:
                codes.append(wait_child(running.pop(0), CHILD_BOUND))
            pid = os.fork()
            if pid == 0:
                code = 1
                try:
                    code = child(engine, index)
                finally:
                    os._exit(code)
            running.append(pid)
        while running:
            codes.append(wait_child(running.pop(0), CHILD_BOUND))
    finally:
        for pid in running:  # a failed wait: none left behind
            with contextlib.suppress(AssertionError):
                wait_child(pid, 0)
        busy.end(engine)
    assert busy.errors == []
    assert sum(busy.appended) > 0
    return codes


def check_children(engine: Engine, codes: list[Any], count: int) -> None:
    assert codes == [0] * count
    stored: list[str] = []
    while True:
        page = rooms.read_events(engine, room_id="children", since_seq=len(stored), limit=100)
        stored += [event["event_id"] for event in page["events"]]
        if not page["has_more"]:
            break
    assert sorted(stored) == sorted(f"child-{i}" for i in range(count))


def test_forks_while_writers_and_followers_run(engine: Engine) -> None:
    check_children(engine, fork_many(engine, 200), 200)


@pytest.mark.slow
def test_a_thousand_forks_while_writers_and_followers_run(engine: Engine) -> None:
    check_children(engine, fork_many(engine, 1000), 1000)

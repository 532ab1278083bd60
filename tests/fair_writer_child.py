"""One writer process of the fairness test (run as a script: ``python fair_writer_child.py PATH ROOM SECONDS OUT``).

It opens its own engine on the SQLite file ``PATH``, appends once (warm-up), writes ``OUT.ready``, waits (bounded)
for ``OUT.go`` and then appends to ``ROOM`` as fast as it can for ``SECONDS``. ``SECONDS`` 0: no warm-up, and
exactly one append after the release (a short-lived process: its first connection is part of its wait). Each
append's wall time is its wait: ``OUT`` gets one JSON object, the list of those times (seconds) of the appends that
succeeded and the number that failed with ``StoreUnavailableError`` (the lock stayed busy past the busy timeout).
Any other error ends the process with a traceback and a non-zero exit.
"""

from __future__ import annotations

import dataclasses
import json
import os
import sys
import time
from pathlib import Path

from sqlalchemy import Engine

import hostedrooms
from hostedrooms import rooms
from hostedrooms.errors import StoreUnavailableError
from hostedrooms.limits import LimitValues

GATEWAY = "install:gw-local"
#: Room for what 30 s of appends at full speed store (the default limits would end the run, not the test).
ROOMY = dataclasses.replace(LimitValues.read(), MAX_EVENTS_PER_ROOM=10_000_000, MAX_ROOM_EVENT_BYTES=2**40,
                            MAX_GATEWAY_EVENT_BYTES=2**40)
START_WITHIN = 120.0


def append(engine: Engine, room: str, event_id: str) -> None:
    rooms.append_event(engine, room_id=room, event_id=event_id, kind="message.user",
                       actor={"kind": "user", "id": "u1"}, payload={"text": event_id},
                       authority_gateway_id=GATEWAY, authority_epoch=1, limits=ROOMY)


def main(path: str, room: str, seconds: float, out: str) -> None:
    name = f"p{os.getpid()}"
    engine = hostedrooms.create_engine(path, synchronous=os.environ.get("FAIR_SYNCHRONOUS", "FULL"))
    try:
        if seconds:
            append(engine, room, f"{name}-warm")
        Path(out + ".ready").touch()
        deadline = time.monotonic() + START_WITHIN
        while not os.path.exists(out + ".go"):
            if time.monotonic() > deadline:
                raise SystemExit("never released")
            time.sleep(0.002)
        waits: list[float] = []
        timeouts = 0
        end = time.monotonic() + seconds
        n = 0
        while time.monotonic() < end or not (seconds or n):
            n += 1
            began = time.monotonic()
            try:
                append(engine, room, f"{name}-{n}")
            except StoreUnavailableError:
                timeouts += 1
                continue
            waits.append(time.monotonic() - began)
    finally:
        engine.dispose()
    Path(out).write_text(json.dumps({"waits": waits, "timeouts": timeouts}), encoding="utf-8")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], float(sys.argv[3]), sys.argv[4])

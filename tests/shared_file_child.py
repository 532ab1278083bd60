"""Child processes sharing one SQLite file (run as a script: ``python shared_file_child.py MODE PATH LOG NAME ...``).

Each worker opens its own engine on the file ``PATH`` and appends one JSON line to ``LOG`` (flushed) after every
write that was acknowledged, so the parent can check that each acknowledged row is stored. A write refused as
``StoreUnavailableError`` (the lock stayed busy past the timeout) is documented and retried; any other error ends
the worker with a traceback and a non-zero exit.

Modes
- ``ledger PATH LOG NAME COUNT``: prepare, authorise and complete ``COUNT`` deliveries of its own (``COUNT`` 0:
  until the file ``LOG.stop`` exists), then close the ledger and exit. Each acknowledged step is logged.
- ``events PATH LOG NAME COUNT``: append ``COUNT`` events of its own to the shared room, then exit.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable
from typing import Any, TextIO, TypeVar

from factories import prepare

import hostedrooms
from hostedrooms import rooms
from hostedrooms.errors import StoreUnavailableError
from hostedrooms.ledger import DeliveryLedger

ROOM = "shared-room"
GATEWAY = "install:gw-local"
_T = TypeVar("_T")


def retried(action: Callable[..., _T], *args: Any, **kwargs: Any) -> _T:
    """``action(*args, **kwargs)``, again while the store stays locked past its timeout (documented)."""
    while True:
        try:
            return action(*args, **kwargs)
        except StoreUnavailableError:
            continue


def ack(log: TextIO, **fields: Any) -> None:
    log.write(json.dumps(fields) + "\n")
    log.flush()


def run_ledger(path: str, log: TextIO, name: str, count: int, stop: str) -> None:
    engine = hostedrooms.create_engine(path)
    ledger = DeliveryLedger(engine)
    try:
        n = 0
        while (n < count) if count else not os.path.exists(stop):
            envelope_id = f"{name}-{n}"
            row, _ = retried(prepare, ledger, envelope_id, lease_token=f"lease-{envelope_id}",
                             exchange_id=f"ex-{envelope_id}", message=f"hello {envelope_id}")
            assert row["state"] == "prepared", row
            ack(log, delivery=envelope_id, state="prepared")
            row = retried(ledger.authorize, envelope_id)
            assert row is not None and row["state"] == "authorized", row
            ack(log, delivery=envelope_id, state="authorized")
            row = retried(ledger.finish, envelope_id, succeeded=True, result_text="done")
            assert row is not None and row["state"] == "completed", row
            ack(log, delivery=envelope_id, state="completed")
            n += 1
    finally:
        engine.dispose()


def run_events(path: str, log: TextIO, name: str, count: int) -> None:
    engine = hostedrooms.create_engine(path)
    try:
        for n in range(count):
            event_id = f"{name}-{n}"
            event = retried(rooms.append_event, engine, room_id=ROOM, event_id=event_id, kind="message.user",
                            actor={"kind": "user", "id": "u1"}, payload={"text": event_id},
                            authority_gateway_id=GATEWAY, authority_epoch=1)
            ack(log, event=event_id, seq=event["seq"])
    finally:
        engine.dispose()


def main(argv: list[str]) -> None:
    mode, path, log_path, name, count = argv[1], argv[2], argv[3], argv[4], int(argv[5])
    with open(log_path, "a", encoding="utf-8") as log:
        if mode == "ledger":
            run_ledger(path, log, name, count, log_path + ".stop")
        elif mode == "events":
            run_events(path, log, name, count)
        else:
            raise SystemExit(f"unknown mode {mode}")


if __name__ == "__main__":
    main(sys.argv)

"""Child processes of the standby reliability tests (``python standby_child.py MODE ...``); each prints one JSON
object per line and flushes, so a parent that SIGKILLs it knows exactly what was acknowledged.

- ``catch-up SOURCE TARGET PAGE_LIMIT``: one replicator pass from the authority's store into the standby's,
  printing ``{"page": room, "last": seq}`` after each stored page and ``{"done": summary}`` at the end.
- ``append TARGET GATEWAY EPOCH ROOMS PREFIX COUNT``: appends COUNT user messages round-robin over the comma-
  separated ROOMS (COUNT 0: until killed), as GATEWAY at EPOCH, printing ``{"ack": [room, seq, event_id]}``
  after each commit, or ``{"refused": [room, event_id, error]}`` when the store refuses it.
"""

from __future__ import annotations

import json
import sys
import time
from typing import Any


def emit(**fields: Any) -> None:
    sys.stdout.write(json.dumps(fields) + "\n")
    sys.stdout.flush()


def catch_up(source: str, target: str, page_limit: str) -> None:
    from hostedrooms import create_engine
    from hostedrooms.standby import EnginePageSource, Replicator

    replicator = Replicator(EnginePageSource(source), create_engine(target, create=False),
                            page_limit=int(page_limit),
                            on_page=lambda page: emit(page=page.room_id, last=page.last_seq))
    emit(done=replicator.sync_once().summary())


def append(target: str, gateway: str, epoch: str, room_list: str, prefix: str, count: str) -> None:
    from hostedrooms import create_engine, rooms
    from hostedrooms.errors import HostedRoomError, StoreUnavailableError

    engine = create_engine(target, create=False)
    names = room_list.split(",")
    index = 0
    while int(count) == 0 or index < int(count):
        room_id = names[index % len(names)]
        event_id = f"{prefix}-{room_id}-{index}"
        try:
            event = rooms.append_event(engine, room_id=room_id, event_id=event_id, kind="message.user",
                                       actor={"kind": "user", "id": "u1"}, payload={"n": index},
                                       authority_gateway_id=gateway, authority_epoch=int(epoch))
        except StoreUnavailableError:
            time.sleep(0.01)
            continue
        except HostedRoomError as exc:
            emit(refused=[room_id, event_id, f"{type(exc).__name__}: {exc}"])
        else:
            emit(ack=[room_id, event["seq"], event_id])
        index += 1


if __name__ == "__main__":
    mode, *arguments = sys.argv[1:]
    {"catch-up": catch_up, "append": append}[mode](*arguments)

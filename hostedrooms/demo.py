"""The whole story on two gateways' databases, in a few seconds (``hostedrooms demo``).

By hand, with the replica primitives: gateway A hosts a room and talks; gateway B replicates A's log page by
page; A goes silent; B promotes its replica at epoch 2 and continues; A comes back, observes B's lineage and
demotes itself; A's stale write is refused by A's own store.

Then automatically, with the standby tools (:mod:`hostedrooms.standby`): a Replicator keeps B's replicas of
every room of A caught up, ``failover`` promotes them all at once when A goes silent, and a Replicator reading
from B back into A's store demotes each of A's rooms. The first room's logs are printed side by side, and
``verify`` must end clean on both databases.
"""

from __future__ import annotations

import tempfile
import textwrap
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TextIO

from sqlalchemy import Engine

from . import migrate, replicas, rooms
from .db import create_engine
from .display import terminal_text
from .errors import AuthorityConflictError, HostedRoomError, describe_target
from .integrity import verify
from .records import EventRecord
from .standby import EnginePageSource, Replicator, failover

GATEWAY_A = "install:gateway-a"
GATEWAY_B = "install:gateway-b"
ROOM = "standup"
MEMBERS = [{"id": "planner-bot", "profile": "planner"}, {"id": "coder-bot", "profile": "coder"}]


class Story:
    """Narrates each step and keeps the clock moving (timestamps are injected, never read deep inside)."""

    def __init__(self, a: Engine, b: Engine, out: TextIO) -> None:
        self.a, self.b, self.out = a, b, out
        self.now = 1_800_000_000.0
        self.step = 0
        self.sent = 0

    def tick(self) -> float:
        self.now += 1.0
        return self.now

    def say(self, text: str) -> None:
        self.step += 1
        self.out.write(f"\n{self.step}. {terminal_text(text)}\n")

    def note(self, text: str) -> None:
        self.out.write(textwrap.indent("\n".join(map(terminal_text, text.split("\n"))), "   ") + "\n")

    def authority(self, engine: Engine, label: str) -> None:
        state = rooms.room_state(engine, room_id=ROOM)
        self.note(f"{label}: room {ROOM!r} owned by {state['authority_gateway_id']} at epoch "
                  f"{state['authority_epoch']}, latest seq {state.get('latest_seq', '?')}")

    def message(self, engine: Engine, gateway: str, epoch: int, user: str, text: str) -> EventRecord:
        self.sent += 1
        return rooms.append_event(
            engine, room_id=ROOM, event_id=rooms.user_event_id(f"{user}-{self.sent}"), kind="message.user",
            actor={"kind": "user", "id": user}, payload={"text": text}, authority_gateway_id=gateway,
            authority_epoch=epoch, now=self.tick())


def _log(engine: Engine) -> list[EventRecord]:
    events: list[EventRecord] = []
    since = 0
    while True:
        page = rooms.read_events(engine, room_id=ROOM, since_seq=since, limit=500)
        events.extend(page["events"])
        since = page["cursor"]
        if not page["has_more"]:
            return events


def _cell(event: EventRecord | None) -> str:
    if event is None:
        return ""
    payload = event["payload"]
    detail = payload.get("text") or payload.get("authority_gateway_id") or payload.get("reason") or ""
    text = str(detail)
    cell = f"e{event['authority_epoch'] or '-'} {event['kind']:<19} {text if len(text) <= 26 else text[:25] + '~'}"
    return terminal_text(cell)


def _side_by_side(story: Story) -> None:
    log_a, log_b = _log(story.a), _log(story.b)
    by_seq_a = {event["seq"]: event for event in log_a}
    by_seq_b = {event["seq"]: event for event in log_b}
    width = 52
    story.out.write(f"\n   {'seq':>3}  {'gateway A (' + GATEWAY_A + ')':<{width}}  gateway B ({GATEWAY_B})\n")
    for seq in range(1, max([*by_seq_a, *by_seq_b, 0]) + 1):
        story.out.write(f"   {seq:>3}  {_cell(by_seq_a.get(seq)):<{width}}  {_cell(by_seq_b.get(seq))}\n")


def _run(story: Story) -> int:
    a, b = story.a, story.b
    story.say(f"Gateway A creates room {ROOM!r} and the conversation starts.")
    rooms.create_room(a, room_id=ROOM, name="Daily stand-up", members=MEMBERS, authority_gateway_id=GATEWAY_A,
                      now=story.tick())
    for user, text in (("alice", "morning! what's on today?"), ("bob", "shipping the replica work"),
                       ("alice", "planner-bot, draft the plan"), ("bob", "coder-bot, pair with me")):
        story.message(a, GATEWAY_A, 1, user, text)
    story.authority(a, "A")

    story.say("Gateway B ingests A's log into its replica, two events per page (and one page twice).")
    since, pages = 0, []
    while True:
        page = rooms.read_events(a, room_id=ROOM, since_seq=since, limit=2)
        pages.append(page)
        result = replicas.ingest_page(b, room_id=ROOM, room_name="Daily stand-up", members=MEMBERS, page=page,
                                      now=story.tick())
        since = page["cursor"]
        if not page["has_more"]:
            break
    replicas.ingest_page(b, room_id=ROOM, room_name="Daily stand-up", members=MEMBERS, page=pages[0],
                         now=story.tick())  # a retried old page changes nothing
    state = replicas.replica_state(b, room_id=ROOM)
    story.note(f"B's replica: {len(pages)} pages, last_seq {state['last_seq']} of latest_seq {state['latest_seq']}, "
               f"authority {state['authority']['gateway_id']} at epoch {state['authority']['epoch']}, "
               f"caught up: {result['caught_up']}")

    story.say("Gateway A goes silent. B promotes its caught-up replica at epoch 2 and carries on.")
    promoted = replicas.promote_replica(b, room_id=ROOM, reason="authority-unreachable", now=story.tick(),
                                        local_gateway_id=GATEWAY_B)
    story.note(f"B claimed the room at epoch {promoted['authority_epoch']} (claim at seq {promoted['claim_seq']}, "
               f"previous owner {promoted['previous_gateway_id']} at epoch {promoted['previous_epoch']})")
    story.message(b, GATEWAY_B, 2, "bob", "A is down, B has the room now")
    story.message(b, GATEWAY_B, 2, "alice", "seamless, nothing lost")
    story.authority(b, "B")

    story.say("Gateway A comes back, reads B's log, observes the newer lineage and demotes itself.")
    observed = rooms.read_events(b, room_id=ROOM, since_seq=0, limit=1)["authority"]
    story.note(f"observed authority: {observed['gateway_id']} at epoch {observed['epoch']}")
    replicas.demote_room(a, room_id=ROOM, observed_gateway_id=observed["gateway_id"],
                         observed_epoch=observed["epoch"], now=story.tick(), local_gateway_id=GATEWAY_A)
    story.authority(a, "A")

    story.say("A stale write from A at epoch 1 is refused by A's own store.")
    try:
        story.message(a, GATEWAY_A, 1, "mallory", "writing at the old epoch")
    except AuthorityConflictError as exc:
        story.note(f"refused: {type(exc).__name__}: {exc}")
    else:
        story.note("NOT refused: the fence failed")
        return 1

    if _run_automatic(story) != 0:
        return 1

    story.say(f"Room {ROOM!r}: both logs, side by side (e<epoch> kind detail):")
    _side_by_side(story)

    story.say("verify on both databases:")
    problems = 0
    for label, engine in (("A", a), ("B", b)):
        found = verify(engine)
        problems += len(found)
        story.note(f"{label}: {'clean' if not found else '; '.join(map(str, found))}")
    return 0 if problems == 0 else 1


AUTO_ROOMS = {"design": ("alice", "bob", "alice"), "ops": ("carol", "dave"), "retro": ("bob",)}


def _plural(count: int, noun: str) -> str:
    return f"{count} {noun}{'' if count == 1 else 's'}"


def _pass_lines(story: Story, report: Any) -> None:
    for room in report.rooms:
        parts = [f"{_plural(room.events, 'new event')} in {_plural(room.pages, 'page')}" if room.pages
                 else "up to date" if room.status in ("caught-up", "disbanded") else "", room.reason]
        story.note(f"{room.room_id:<8} {room.status:<10} " + "; ".join(part for part in parts if part))
    story.note(f"pass: {report.summary().rsplit(';', 1)[0]}")


def _run_automatic(story: Story) -> int:
    """The same story for every room at once, driven by the standby tools."""
    a, b = story.a, story.b
    story.say("Now automatically. Gateway A hosts three more rooms.")
    for room_id, speakers in AUTO_ROOMS.items():
        rooms.create_room(a, room_id=room_id, name=room_id.title(), members=MEMBERS, authority_gateway_id=GATEWAY_A,
                          now=story.tick())
        for index, user in enumerate(speakers):
            rooms.append_event(a, room_id=room_id, event_id=rooms.user_event_id(f"{room_id}-{index}"),
                               kind="message.user", actor={"kind": "user", "id": user},
                               payload={"text": f"{room_id} note {index}"}, authority_gateway_id=GATEWAY_A,
                               authority_epoch=1, now=story.tick())

    story.say("Gateway B runs a Replicator on A's database: one pass brings a replica of every room up to date "
              f"(A's {ROOM!r} now belongs to B: B's own room is never replicated over).")
    to_b = Replicator(EnginePageSource(a), b, local_gateway_id=GATEWAY_B, now=story.tick)
    _pass_lines(story, to_b.sync_once())
    rooms.append_event(a, room_id="design", event_id=rooms.user_event_id("design-late"), kind="message.user",
                       actor={"kind": "user", "id": "alice"}, payload={"text": "one more thing"},
                       authority_gateway_id=GATEWAY_A, authority_epoch=1, now=story.tick())
    rooms.disband_room(a, room_id="retro", expected_gateway_id=GATEWAY_A, expected_epoch=1, now=story.tick())
    story.note("A appends to 'design' and disbands 'retro'; the next pass reads only what is new:")
    _pass_lines(story, to_b.sync_once())

    story.say("Gateway A goes silent. `failover` promotes every caught-up replica of A on B, each at epoch 2.")
    report = failover(b, from_gateway=GATEWAY_A, local_gateway_id=GATEWAY_B, now=story.tick())
    for room in report.rooms:
        outcome = (f"promoted at epoch {room.epoch}, claim at seq {room.claim_seq}" if room.promoted
                   else f"not promoted ({room.outcome}): {room.reason}")
        story.note(f"{room.room_id:<8} {outcome}")
    rooms.append_event(b, room_id="design", event_id=rooms.user_event_id("design-on-b"), kind="message.user",
                       actor={"kind": "user", "id": "bob"}, payload={"text": "B carries on"},
                       authority_gateway_id=GATEWAY_B, authority_epoch=2, now=story.tick())

    story.say("Gateway A returns and runs a Replicator on B's database: it observes B's newer lineage and "
              "demotes each room B took over.")
    _pass_lines(story, Replicator(EnginePageSource(b), a, local_gateway_id=GATEWAY_A, now=story.tick).sync_once())
    try:
        rooms.append_event(a, room_id="design", event_id="late-on-a", kind="message.user",
                           actor={"kind": "user", "id": "mallory"}, payload={"text": "stale"},
                           authority_gateway_id=GATEWAY_A, authority_epoch=1, now=story.tick())
    except AuthorityConflictError as exc:
        story.note(f"A's stale write to 'design': refused: {type(exc).__name__}: {exc}")
        return 0
    story.note("A's stale write to 'design' was NOT refused: the fence failed")
    return 1


def _has_demo_replica(engine: Engine) -> bool:
    """True when ``engine`` already holds a replica of the demo room."""
    try:
        replicas.replica_state(engine, room_id=ROOM)
    except HostedRoomError:
        return False
    return True


@contextmanager
def _databases(directory: str | None, url_a: str | None, url_b: str | None) -> Iterator[tuple[Engine, Engine]]:
    with tempfile.TemporaryDirectory(prefix="hostedrooms-demo-") as scratch:
        folder = Path(directory or scratch)
        targets = (url_a or str(folder / "gateway-a.db"), url_b or str(folder / "gateway-b.db"))
        if (url_a is None) != (url_b is None):
            raise HostedRoomError("give both --url-a and --url-b, or neither")
        engines = tuple(create_engine(target) for target in targets)
        try:
            for engine in engines:
                migrate.upgrade(engine)
            yield engines[0], engines[1]
        finally:
            for engine in engines:
                engine.dispose()


def run_demo(*, directory: str | None, url_a: str | None, url_b: str | None, out: TextIO) -> int:
    """Run the story on two fresh databases; returns the process exit code (0 when every step held)."""
    with _databases(directory, url_a, url_b) as (a, b):
        for engine in (a, b):
            if rooms.list_rooms(engine, include_disbanded=True) or _has_demo_replica(engine):
                raise HostedRoomError("the demo needs empty databases")
        out.write(terminal_text(f"hostedrooms demo: gateway A on {describe_target(a.url)}, "
                                f"gateway B on {describe_target(b.url)}") + "\n")
        code = _run(Story(a, b, out))
    out.write("\ndemo finished: " + ("every step held\n" if code == 0 else "a step FAILED\n"))
    return code

"""A model of the takeover, tested by interleaving (issue #34): a hypothesis state machine of two or three gateways,
each with its own store (SQLite files; PostgreSQL databases), as the CLI builds them, on both backends.

Rooms are created on A. The machine chooses who runs next: an application write on any gateway (a stale one must be
refused with AuthorityConflictError; every acknowledged write is recorded), a replicator pass from one store into
another, a failover with or without ``--catch-up-from`` the old authority's store, the return of a stopped
authority (a replicator pass from each other store into its own, before it serves again), a standby creating a
room of its own with one of A's room ids. Any of these operations may be **paused** at a named step
(``hostedrooms.standby.steps``) in a thread of its own while the machine runs other rules (an append on the old
authority, another failover), then resumed; or **killed** at a step (the process died there) and run again later.

The operator's rules the model keeps: a failover is from a gateway that still writes a room of its own; one
without a fence is run only on an authority that was stopped (the model stops it, replicates a last time from its
store, then fails over), by one standby, and the stopped authority serves again only through its return (its
application may write while the return pass runs: the replicator is documented to refuse the demotion then,
never to lose the write).

Invariants, in terms of the stores (a room is told apart from another room with its id by its name; a room is
**writable in store S** when S's authoritative row is held by S's own gateway and not disbanded):

* every acknowledged write is in the log of each running gateway's store where its room is writable (while no
  running gateway may write it, mid-takeover or stopped, it is checked later); for a room written while another
  running gateway could write it too (a documented fork: the return pass refuses to demote it), in the log of at
  least one store that may write it;
* at most one running gateway's store may write each room (forks aside);
* after a failover completes (or its rerun), with no other operation paused or killed half-way, every room has a
  store that may write it; and so after a stopped authority's return, when only failovers from it were killed
  half-way (its replicators, told whose store each source is, give back the rooms fenced and never promoted);
* ``hostedrooms.integrity.verify`` is clean on every store.

Plain tests below replay the two interleavings issue #34 reports (a demotion losing a write; the fence stranding
a room a standby then does not promote). Every replicator pass in the model is run as the docs tell operators to
run it between gateways' stores, with ``--source-gateway`` (``source_gateway_id``).
"""

from __future__ import annotations

import shutil
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, Phase, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)
from sqlalchemy import Engine
from standby_support import migrated_database
from takeover_model_support import (
    GATEWAYS,
    Conductor,
    Paused,
    Row,
    empty,
    event_ids,
    fingerprint,
    killed_at,
    replicate,
    rows,
    take_over,
)

from hostedrooms import rooms, verify
from hostedrooms.db import create_engine
from hostedrooms.errors import AuthorityConflictError, HostedRoomError
from hostedrooms.limits import Limits
from hostedrooms.records import Actor
from hostedrooms.standby.reclaim import RECLAIM_STEP
from hostedrooms.standby.steps import step_hook

pytest_plugins = ["standby_fixtures"]

ROOM_IDS = ("r0", "r1", "r2")
USER: Actor = {"kind": "user", "id": "u1"}
MEMBERS = [{"id": "bot-1"}]
FAILOVER_STEPS = ("failover.planned", "failover.fenced", "failover.caught_up", "failover.promote", "failover.promoted")
PROVED = "replicator.proved"


# --- the stores -------------------------------------------------------------------------------------------------


@pytest.fixture(scope="session")
def pg_third_url(pg_admin_url: str) -> Iterator[str]:
    yield from migrated_database(pg_admin_url, "hostedrooms_third")


@pytest.fixture
def stores(request: pytest.FixtureRequest, backend: str, engine: Engine, standby: Engine,
           tmp_path: Path) -> Iterator[dict[str, Engine]]:
    """A's, B's and C's stores: three migrated stores of the test's backend."""
    if backend == "sqlite":
        path = tmp_path / "gateway-c.db"
        shutil.copyfile(request.getfixturevalue("sqlite_template"), path)
        third = create_engine(str(path))
    else:
        third = create_engine(request.getfixturevalue("pg_third_url"))
        empty(third)  # one database for the session: emptied for each test, as the other two are
    try:
        yield {"A": engine, "B": standby, "C": third}
    finally:
        third.dispose()


# --- the model --------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Op:
    """One command: ``replicate`` (into ``gateway``'s store from ``source``'s), ``failover`` (on ``gateway`` from
    ``source``, ``fenced``: with ``--catch-up-from`` the source's store) or ``return`` (of ``gateway``)."""

    kind: str
    gateway: str
    source: str = ""
    fenced: bool = True

    def __str__(self) -> str:
        if self.kind == "replicate":
            return f"replicate {self.source}->{self.gateway}"
        if self.kind == "failover":
            return f"failover on {self.gateway} from {self.source}" + (" --catch-up-from" if self.fenced else "")
        return f"return of {self.gateway}"

    def steps(self) -> tuple[str, ...]:
        if self.kind != "failover":
            return (PROVED, RECLAIM_STEP)
        return FAILOVER_STEPS if self.fenced else FAILOVER_STEPS[3:]


@dataclass(frozen=True)
class Ack:
    room_id: str
    family: str
    event_id: str
    gateway: str


def writable(stores: dict[str, dict[str, Row]], room_id: str, family: str) -> list[str]:
    """The gateways whose own store may write this room."""
    return [name for name, found in stores.items()
            if (row := found.get(room_id)) is not None and row.family == family and not row.disbanded
            and row.holder == GATEWAYS[name]]


def machine_for(engines: dict[str, Engine], conductor: Conductor) -> type[RuleBasedStateMachine]:
    verified: dict[str, Any] = {}  # per store: its fingerprint when verify last found it clean

    class TakeoverMachine(RuleBasedStateMachine):
        def __init__(self) -> None:
            super().__init__()
            self.paused: tuple[Op, Paused] | None = None
            # What the stores hold, read once per change: every write of the machine's (a command, however it
            # ends, pauses or dies; an application write; a room created) calls _stale(), and between rules nothing
            # else writes (a paused command waits at its step). The preconditions, reads and invariants of one
            # state then share one read of each store instead of a query each (the PostgreSQL run's main cost).
            self.generation = 0
            self.seen: dict[tuple[str, str], tuple[int, Any]] = {}
            self.verified_at = -1  # the generation stores_verify last found every store clean at

        # -- the stores, as last read --------------------------------------------------------------------------

        def _stale(self) -> None:
            self.generation += 1

        def _read(self, kind: str, name: str, read: Callable[[Engine], Any]) -> Any:
            cached = self.seen.get((kind, name))
            if cached is None or cached[0] != self.generation:
                cached = self.seen[(kind, name)] = (self.generation, read(engines[name]))
            return cached[1]

        def _rows_of(self, name: str) -> dict[str, Row]:
            return dict(self._read("rows", name, rows))

        def _marking(self, command: Callable[[], Any]) -> Callable[[], Any]:
            """``command``, marking the stores changed once it ends (returns, raises or is killed)."""
            def run() -> Any:
                try:
                    return command()
                finally:
                    self._stale()
            return run

        # -- set-up ------------------------------------------------------------------------------------------

        @initialize(gateways=st.sampled_from([2, 3]), count=st.integers(1, 3), capacity=st.sampled_from([0, 0, 1, 2]))
        def rooms_on_a(self, gateways: int, count: int, capacity: int) -> None:
            """``gateways`` gateways (A, B, C), ``count`` rooms on A; the standbys host at most ``capacity`` active
            rooms (0: the default)."""
            self.names = sorted(engines)[:gateways]
            for store in engines.values():
                empty(store)
            lowered = None if not capacity else _limits(capacity)
            self.limits: dict[str, Limits | None] = {"A": None, "B": lowered, "C": lowered}
            self.status = {name: "up" for name in self.names}  # up, down (stopped) or returning
            self.unfenced_by: dict[str, str] = {}  # a stopped gateway -> the standby that took over unfenced
            self.pending: set[Op] = set()  # failovers killed half-way, not run again yet
            self.acks: list[Ack] = []
            self.forked: set[tuple[str, str]] = set()
            self.belief: dict[tuple[str, str], int] = {}  # (gateway, room): the epoch its application writes at
            self.serial = 0
            self._stale()
            for room_id in ROOM_IDS[:count]:
                rooms.create_room(engines["A"], room_id=room_id, name=f"A-{room_id}", members=MEMBERS,
                                  authority_gateway_id=GATEWAYS["A"], now=1.0)
                self._stale()
                self._append("A", room_id)

        def teardown(self) -> None:
            if self.paused is not None:
                paused = self.paused[1]
                self.paused = None
                try:
                    paused.resume()
                except BaseException:
                    pass

        # -- application writes ------------------------------------------------------------------------------

        def _writes(self) -> list[tuple[str, str]]:
            """(gateway, room) pairs an application may try: a running gateway, a room its store holds that it
            holds or once held."""
            choices = []
            for name in self.names:
                if self.status[name] == "down":
                    continue
                for room_id, row in sorted(self._rows_of(name).items()):
                    if row.holder == GATEWAYS[name] or (name, room_id) in self.belief:
                        choices.append((name, room_id))
            return choices

        def _append(self, name: str, room_id: str) -> None:
            row = self._rows_of(name)[room_id]
            mine = row.holder == GATEWAYS[name] and not row.disbanded
            epoch = row.epoch if mine else self.belief[(name, room_id)]
            self.belief[(name, room_id)] = epoch
            self.serial += 1
            event_id = f"ev-{self.serial}-{name}"
            try:
                rooms.append_event(engines[name], room_id=room_id, event_id=event_id, kind="message.user",
                                   actor=USER, payload={"n": self.serial}, authority_gateway_id=GATEWAYS[name],
                                   authority_epoch=epoch, limits=self.limits[name])
            except AuthorityConflictError:
                assert not mine, f"{name}'s own room {room_id} refused its write"
                return
            finally:
                self._stale()
            assert mine, f"{name} wrote {room_id} at epoch {epoch}, but its store holds it for {row.holder}"
            self.acks.append(Ack(room_id, row.family, event_id, name))
            others = [other for other in writable(self._rows(), room_id, row.family)
                      if other != name and self.status[other] != "down"]
            if others:  # a write while another running gateway may write the room: the two logs forked
                self.forked.add((room_id, row.family))

        @precondition(lambda self: bool(self._writes()))
        @rule(data=st.data())
        def append(self, data: st.DataObject) -> None:
            name, room_id = data.draw(st.sampled_from(self._writes()), label="append (gateway, room)")
            self._append(name, room_id)

        def _creations(self) -> list[tuple[str, str]]:
            return [(name, room_id) for name in self.names[1:] if self.status[name] == "up"
                    for room_id in ROOM_IDS if room_id not in self._rows_of(name)]

        @precondition(lambda self: bool(self._creations()))
        @rule(data=st.data())
        def standby_creates_a_room(self, data: st.DataObject) -> None:
            """A standby hosts a room of its own with one of A's room ids (or is refused: capacity)."""
            name, room_id = data.draw(st.sampled_from(self._creations()), label="own room (gateway, room)")
            try:
                rooms.create_room(engines[name], room_id=room_id, name=f"{name}-{room_id}", members=MEMBERS,
                                  authority_gateway_id=GATEWAYS[name], now=2.0, limits=self.limits[name])
            except HostedRoomError as exc:
                assert "active" in str(exc), exc
            finally:
                self._stale()

        # -- commands ----------------------------------------------------------------------------------------

        def _ops(self) -> list[Op]:
            """The commands an operator following the docs may run now."""
            busy = self.paused[0].gateway if self.paused is not None else None
            # A failover is from a gateway that still writes a room of its own (or a rerun of one killed).
            authorities = {name for name in self.names if any(
                row.holder == GATEWAYS[name] and not row.disbanded for row in self._rows_of(name).values())}
            authorities |= {op.source for op in self.pending}
            ops: list[Op] = []
            for gateway in self.names:
                if self.status[gateway] != "up" or gateway == busy:
                    continue
                for source in self.names:
                    if source == gateway:
                        continue
                    ops.append(Op("replicate", gateway, source))
                    if source not in authorities:
                        continue
                    taker = self.unfenced_by.get(source)
                    if taker in (None, gateway):
                        ops.append(Op("failover", gateway, source, fenced=True))
                    unfenced = Op("failover", gateway, source, fenced=False)
                    fresh = (all(state == "up" for state in self.status.values()) and not self.pending
                             and self.paused is None)
                    if fresh or unfenced in self.pending:
                        ops.append(unfenced)
            if self.paused is None:
                ops += [Op("return", gateway) for gateway in self.names if self.status[gateway] == "down"]
            return ops

        def _operation(self, op: Op) -> Callable[[], Any]:
            """Mark the command started in the model; return what runs it (marking the stores changed)."""
            return self._marking(self._command(op))

        def _command(self, op: Op) -> Callable[[], Any]:
            target, limits = engines[op.gateway], self.limits[op.gateway]
            gateway = GATEWAYS[op.gateway]
            if op.kind == "replicate":
                return lambda: replicate(engines[op.source], target, gateway, limits, GATEWAYS[op.source])
            if op.kind == "return":
                self.status[op.gateway] = "returning"
                return lambda: [replicate(engines[source], target, gateway, limits, GATEWAYS[source])
                                for source in self.names if source != op.gateway]
            if op.fenced:
                return lambda: take_over(target, gateway, GATEWAYS[op.source], limits, engines[op.source])
            # Without a fence: the old authority is stopped first, then replicated from a last time.
            self.status[op.source] = "down"
            self.unfenced_by[op.source] = op.gateway

            def unfenced() -> Any:
                last = replicate(engines[op.source], target, gateway, limits, GATEWAYS[op.source])
                if not last.ok:  # the standby does not hold all of it: the operator does not fail over
                    return last
                return take_over(target, gateway, GATEWAYS[op.source], limits, None)

            return unfenced

        def _finished(self, op: Op, result: Any) -> None:
            if op.kind == "replicate":
                assert result.error == "", result.error
                if self.paused is None and self.pending and all(
                        (pending.gateway, pending.source) == (op.source, op.gateway) for pending in self.pending):
                    # the old authority's pass from the standby that was killed half-way gave back what it fenced
                    # and never promoted
                    self._one_writer_each(f"after {op}")
            elif op.kind == "return":
                assert all(report.error == "" for report in result), [report.error for report in result]
                self.status[op.gateway] = "up"
                self.unfenced_by.pop(op.gateway, None)
                if self.paused is None and all(pending.source == op.gateway for pending in self.pending):
                    # its replicators gave back whatever a failover from it fenced and left unpromoted
                    self._one_writer_each(f"after {op}")
            else:
                catch_up = getattr(result, "catch_up", None)
                if catch_up is not None and catch_up.error:
                    raise AssertionError(f"{op}: the catch-up stopped: {catch_up.error}")
                self.pending.discard(op)
                if self.paused is None and not self.pending:
                    self._one_writer_each(f"after {op}")

        def _killed(self, op: Op) -> None:
            if op.kind == "return":
                self.status[op.gateway] = "down"
            elif op.kind == "failover":
                self.pending.add(op)

        def _draw(self, data: st.DataObject, kind: str | None, label: str) -> Op:
            """One of the commands that may run now: of ``kind``, or of a kind drawn first."""
            ops = self._ops()
            if kind is None:
                kind = data.draw(st.sampled_from(sorted({op.kind for op in ops})), label=f"{label}: kind")
            return data.draw(st.sampled_from([op for op in ops if op.kind == kind]), label=label)

        def _run(self, op: Op) -> None:
            self._finished(op, self._operation(op)())

        @precondition(lambda self: any(op.kind == "replicate" for op in self._ops()))
        @rule(data=st.data())
        def replicate(self, data: st.DataObject) -> None:
            self._run(self._draw(data, "replicate", "replicate"))

        @precondition(lambda self: any(op.kind == "failover" for op in self._ops()))
        @rule(data=st.data())
        def failover(self, data: st.DataObject) -> None:
            self._run(self._draw(data, "failover", "failover"))

        @precondition(lambda self: any(op.kind == "return" for op in self._ops()))
        @rule(data=st.data())
        def return_(self, data: st.DataObject) -> None:
            self._run(self._draw(data, "return", "return"))

        @precondition(lambda self: self.paused is None and bool(self._ops()))
        @rule(data=st.data())
        def pause(self, data: st.DataObject) -> None:
            """Run a command in a thread of its own, paused at a step until ``resume``."""
            op = self._draw(data, None, "pause")
            at = data.draw(st.sampled_from(op.steps()), label="at step")
            paused = Paused(conductor, str(op), at, self._operation(op))
            started = paused.start()
            self._stale()  # it may have written before its step
            if started:
                self.paused = (op, paused)
            else:  # it never reached the step: it ran to its end
                self._finished(op, paused.resume())

        @precondition(lambda self: self.paused is None and any(op.kind == "return" for op in self._ops()))
        @rule(data=st.data())
        def return_while_writing(self, data: st.DataObject) -> None:
            """A stopped authority returns, and its application writes while the return pass waits between its
            proof and its demotion (issue #34 item 1): pause, append, resume in one rule."""
            op = self._draw(data, "return", "return")
            paused = Paused(conductor, str(op), PROVED, self._operation(op))
            started = paused.start()
            self._stale()  # it may have written before its step
            if started:
                writes = [pair for pair in self._writes() if pair[0] == op.gateway]
                if writes:
                    self._append(*data.draw(st.sampled_from(writes), label="append (gateway, room)"))
            self._finished(op, paused.resume())

        @precondition(lambda self: self.paused is not None)
        @rule()
        def resume(self) -> None:
            assert self.paused is not None
            op, paused = self.paused
            self.paused = None
            self._finished(op, paused.resume())

        @precondition(lambda self: bool(self._ops()))
        @rule(data=st.data())
        def kill(self, data: st.DataObject) -> None:
            """Run a command killed at a step (its process died there); it may be run again later."""
            op = self._draw(data, None, "kill")
            at = data.draw(st.sampled_from(op.steps()), label="at step")
            died, result = killed_at(conductor, at, self._operation(op))
            if died:
                self._killed(op)
            else:
                self._finished(op, result)

        # -- invariants --------------------------------------------------------------------------------------

        def _rows(self) -> dict[str, dict[str, Row]]:
            return {name: self._rows_of(name) for name in self.names}

        def _families(self, found: dict[str, dict[str, Row]]) -> set[tuple[str, str]]:
            return {(row.room_id, row.family) for by_room in found.values() for row in by_room.values()}

        def _one_writer_each(self, when: str) -> None:
            found = self._rows()
            for room_id, family in sorted(self._families(found)):
                holders = {name: found[name][room_id].holder for name in self.names if room_id in found[name]
                           and found[name][room_id].family == family}
                assert writable(found, room_id, family), (
                    f"{when}: no gateway may write room {room_id} ({family}); its rows: {holders}")

        @invariant()
        def acknowledged_writes_are_in_the_writers_logs(self) -> None:
            found = self._rows()
            logs = {name: self._read("events", name, event_ids) for name in self.names}
            for ack in self.acks:
                writers = writable(found, ack.room_id, ack.family)
                running = [name for name in writers if self.status[name] == "up"]
                if not running:
                    continue  # mid-takeover, or only a stopped gateway may write it: checked once one runs
                holding = [name for name in writers if ack.event_id in logs[name].get(ack.room_id, set())]
                if (ack.room_id, ack.family) in self.forked:
                    if self.pending or self.paused is not None:
                        continue  # one branch of the fork may be mid-takeover: checked once that ends
                    assert holding, (f"{ack.gateway} acknowledged {ack.event_id} in {ack.room_id}; no store that "
                                     f"may write the room holds it (writers: {writers})")
                else:
                    missing = [name for name in running if name not in holding]
                    assert not missing, (f"{ack.gateway} acknowledged {ack.event_id} in {ack.room_id}; the log "
                                         f"of {missing}, which may write the room, lacks it")

        @invariant()
        def at_most_one_writer(self) -> None:
            found = self._rows()
            for room_id, family in sorted(self._families(found)):
                if (room_id, family) in self.forked:
                    continue
                running = [name for name in writable(found, room_id, family) if self.status[name] == "up"]
                assert len(running) <= 1, f"room {room_id} ({family}) may be written in {running}' stores"

        @invariant()
        def stores_verify(self) -> None:
            if self.verified_at == self.generation:
                return  # no store written since every one was found clean
            for name in self.names:
                summary = fingerprint(engines[name])
                if verified.get(name) != summary:  # verify only a store that changed since its last check
                    assert verify(engines[name]) == [], (name, verify(engines[name]))
                    verified[name] = summary
            self.verified_at = self.generation

    return TakeoverMachine


def _limits(active: int) -> Limits:
    from factories import lowered

    return lowered(MAX_ACTIVE_ROOMS=active)


def _run(stores: dict[str, Engine], **options: Any) -> None:
    conductor = Conductor()
    with step_hook(conductor):
        run_state_machine_as_test(machine_for(stores, conductor), settings=settings(
            deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
            **options))


def test_the_takeover_model(stores: dict[str, Engine]) -> None:
    # Not shrunk here (a shrink replays hundreds of sequences): the long run shrinks what it finds.
    _run(stores, max_examples=40, stateful_step_count=15, derandomize=True,
         phases=[Phase.explicit, Phase.reuse, Phase.generate])


@pytest.mark.slow
def test_the_takeover_model_long(stores: dict[str, Engine]) -> None:
    _run(stores, max_examples=300, stateful_step_count=30)


# --- the two interleavings of issue #34, replayed -----------------------------------------------------------------


def _host(engine: Engine, room_id: str, events: int) -> None:
    rooms.create_room(engine, room_id=room_id, name=f"A-{room_id}", members=MEMBERS,
                      authority_gateway_id=GATEWAYS["A"], now=1.0)
    for index in range(events):
        _say(engine, room_id, f"a-{room_id}-{index}", "A", 1)


def _say(engine: Engine, room_id: str, event_id: str, gateway: str, epoch: int) -> None:
    rooms.append_event(engine, room_id=room_id, event_id=event_id, kind="message.user", actor=USER,
                       payload={"id": event_id}, authority_gateway_id=GATEWAYS[gateway], authority_epoch=epoch)


def _writers(stores: dict[str, Engine]) -> dict[tuple[str, str], list[str]]:
    """Every room (id, name) of the stores, with the gateways whose own store may write it."""
    found = {name: rows(engine) for name, engine in stores.items()}
    families = {(row.room_id, row.family) for by_room in found.values() for row in by_room.values()}
    return {family: writable(found, *family) for family in sorted(families)}


def test_a_write_committed_after_the_demotion_proof_is_not_lost(stores: dict[str, Engine]) -> None:
    """Issue #34 item 1: A returns (B took its room over while it was stopped) and its replicator proves B's log
    continues A's room; A's application writes before the demotion commits. That write was acknowledged: it must
    be in the log of a store that may write the room (the demotion is refused, and the fork reported), never only
    in a log no one may write any more."""
    a, b = stores["A"], stores["B"]
    _host(a, "r0", 2)
    assert replicate(a, b, GATEWAYS["B"], None, GATEWAYS["A"]).ok
    assert take_over(b, GATEWAYS["B"], GATEWAYS["A"], None, None).ok  # A was stopped: no fence
    _say(b, "r0", "b-after-takeover", "B", 2)
    conductor = Conductor()
    with step_hook(conductor):
        returning = Paused(conductor, "A's replicator from B", PROVED,
                           lambda: replicate(b, a, GATEWAYS["A"], None, GATEWAYS["B"]))
        assert returning.start(), "A's replicator never reached its demotion"
        _say(a, "r0", "a-between-proof-and-demotion", "A", 1)  # A's store still holds r0 for A: acknowledged
        returning.resume()
    writers = _writers(stores)[("r0", "A-r0")]
    holding = [name for name in writers if "a-between-proof-and-demotion" in event_ids(stores[name]).get("r0", ())]
    assert holding, f"the acknowledged write is in no log that may still be written (writers: {writers})"
    assert verify(a) == [] and verify(b) == []


@pytest.mark.parametrize("obstacle", ["same-id", "capacity"])
def test_a_failover_leaves_every_room_with_a_writer(stores: dict[str, Engine], obstacle: str) -> None:
    """Issue #34 item 2: ``failover --catch-up-from A`` on B when B cannot take every room of A (it hosts a room
    of the same id already, or it is at its active-room limit): each room of A still has exactly one gateway that
    may write it (B, or A itself), and A's writes to a room B did not take are acknowledged."""
    a, b = stores["A"], stores["B"]
    for room_id in ("r0", "r1"):
        _host(a, room_id, 2)
    limits = _limits(1) if obstacle == "capacity" else None
    assert replicate(a, b, GATEWAYS["B"], limits, GATEWAYS["A"]).ok
    if obstacle == "same-id":
        rooms.create_room(b, room_id="r0", name="B-r0", members=MEMBERS, authority_gateway_id=GATEWAYS["B"])
    report = take_over(b, GATEWAYS["B"], GATEWAYS["A"], limits, a)
    writers = _writers(stores)
    assert all(len(names) == 1 for names in writers.values()), (writers, report.summary())
    left = [room_id for (room_id, family), names in writers.items() if family.startswith("A-") and names == ["A"]]
    assert len(left) == 1, writers  # the one room B could not take stays A's
    state = rooms.room_state(a, room_id=left[0])
    _say(a, left[0], "a-after-failover", "A", int(state["authority_epoch"]))
    assert verify(a) == [] and verify(b) == []


# --- what the model found on the fixed failover (issue #34 follow-ups) ------------------------------------------


def test_a_room_taken_locally_after_the_plan_keeps_a_writer(stores: dict[str, Engine]) -> None:
    """B's failover plans A's room r0 (the id is free on B), then, before the fence, B's application creates a
    room r0 of its own: r0 of A must keep a gateway that may write it (not fenced, or given back)."""
    a, b = stores["A"], stores["B"]
    _host(a, "r0", 1)
    assert replicate(a, b, GATEWAYS["B"], None, GATEWAYS["A"]).ok
    conductor = Conductor()
    with step_hook(conductor):
        running = Paused(conductor, "failover on B", "failover.planned",
                         lambda: take_over(b, GATEWAYS["B"], GATEWAYS["A"], None, a))
        assert running.start()
        rooms.create_room(b, room_id="r0", name="B-r0", members=MEMBERS, authority_gateway_id=GATEWAYS["B"])
        report = running.resume()
    writers = _writers(stores)
    assert writers == {("r0", "A-r0"): ["A"], ("r0", "B-r0"): ["B"]}, (writers, report.summary())


def test_a_standby_that_followed_the_fenced_store_does_not_fork_the_room(stores: dict[str, Engine]) -> None:
    """C follows A; B fails over from A with the fence; C keeps following A's (fenced) store, so its replica
    holds A's ``authority.lost`` at the seq where B's log holds its ``authority.claimed``, both at B's epoch.
    B stops; C replicates from B a last time and fails over from it; B returns: the room must end with one
    gateway that may write it (C's pass from B finds that its replica is not B's log, or B's return demotes)."""
    a, b, c = stores["A"], stores["B"], stores["C"]
    _host(a, "r0", 1)
    assert replicate(a, c, GATEWAYS["C"], None, GATEWAYS["A"]).ok
    assert take_over(b, GATEWAYS["B"], GATEWAYS["A"], None, a).ok
    replicate(a, c, GATEWAYS["C"], None, GATEWAYS["A"])  # C still follows A
    if replicate(b, c, GATEWAYS["C"], None, GATEWAYS["B"]).ok:  # B stopped: C's last pass from it, then its failover
        take_over(c, GATEWAYS["C"], GATEWAYS["B"], None, None)
    for source, name in ((a, "A"), (c, "C")):  # B returns
        replicate(source, b, GATEWAYS["B"], None, GATEWAYS[name])
    assert _writers(stores) == {("r0", "A-r0"): ["B"]} or _writers(stores) == {("r0", "A-r0"): ["C"]}, \
        _writers(stores)


def test_a_room_taken_locally_before_the_rerun_keeps_a_writer(stores: dict[str, Engine]) -> None:
    """B's failover is killed after the fence; B's application then creates a room r0 of its own; the rerun
    cannot promote A's r0: it must give it back, so r0 of A keeps a gateway that may write it."""
    a, b = stores["A"], stores["B"]
    _host(a, "r0", 1)
    conductor = Conductor()
    with step_hook(conductor):
        died, _ = killed_at(conductor, "failover.fenced", lambda: take_over(b, GATEWAYS["B"], GATEWAYS["A"], None, a))
    assert died
    rooms.create_room(b, room_id="r0", name="B-r0", members=MEMBERS, authority_gateway_id=GATEWAYS["B"])
    report = take_over(b, GATEWAYS["B"], GATEWAYS["A"], None, a)
    writers = _writers(stores)
    assert writers == {("r0", "A-r0"): ["A"], ("r0", "B-r0"): ["B"]}, (writers, report.summary())

"""Support of tests/standby/test_takeover_model.py: the step conductor (pause or kill an operation at a named step of
``hostedrooms.standby.steps``), each gateway's store as the model reads it (who may write each room, which event
ids each room's log holds), and the CLI's operations on that topology (each gateway its own store).

A room is told apart from another room with the same id by its **name** (its family): the model names each room
after the gateway that created it, and a name travels with the room through replication and promotion.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import sqlalchemy as sa
from sqlalchemy import Engine

from hostedrooms import models
from hostedrooms.limits import Limits
from hostedrooms.standby import EnginePageSource, FailoverReport, PassReport, Replicator, failover

#: A generous bound on every wait of the conductor: only a hang takes this long.
BOUND = 60.0

GATEWAYS = {"A": "install:gw-a", "B": "install:gw-b", "C": "install:gw-c"}


class Killed(BaseException):
    """Raised by the conductor at a chosen step: the operation stops there, as if its process died (a
    BaseException, so no ``except Exception`` or ``except HostedRoomError`` of the code under test catches it)."""


@dataclass
class Plan:
    """Pause (or kill) the thread ``thread`` the first time it reaches ``step``."""

    thread: threading.Thread
    step: str
    kill: bool
    fired: bool = False
    reached: threading.Event = field(default_factory=threading.Event)
    go: threading.Event = field(default_factory=threading.Event)


class Conductor:
    """The one step hook of a test (``step_hook(conductor)``): each plan acts on its own thread only."""

    def __init__(self) -> None:
        self._plans: dict[int, Plan] = {}
        self._lock = threading.Lock()

    def __call__(self, name: str, details: Mapping[str, Any]) -> None:
        with self._lock:
            plan = self._plans.get(threading.get_ident())
            if plan is None or plan.fired or plan.step != name:
                return
            plan.fired = True
        if plan.kill:
            raise Killed(name)
        plan.reached.set()
        if not plan.go.wait(BOUND):
            raise Killed(f"{name}: never released")

    def arm(self, plan: Plan, ident: int) -> None:
        with self._lock:
            self._plans[ident] = plan

    def disarm(self, ident: int) -> None:
        with self._lock:
            self._plans.pop(ident, None)


class Paused:
    """An operation run in a thread of its own, paused at ``step`` until :meth:`resume`."""

    def __init__(self, conductor: Conductor, label: str, step: str, operation: Callable[[], Any]) -> None:
        self.label, self.step = label, step
        self.result: Any = None
        self.error: BaseException | None = None
        self._conductor = conductor
        self._operation = operation
        self._thread = threading.Thread(target=self._run, name=f"paused {label}", daemon=True)
        self._plan = Plan(self._thread, step, kill=False)

    def _run(self) -> None:
        self._conductor.arm(self._plan, threading.get_ident())
        try:
            self.result = self._operation()
        except BaseException as exc:  # handed to the test thread by resume()
            self.error = exc
        finally:
            self._conductor.disarm(threading.get_ident())

    def start(self) -> bool:
        """Start; True once the thread waits at the step, False when it ended without reaching it."""
        self._thread.start()
        deadline = threading.Event()
        waited = 0.0
        while not self._plan.reached.is_set() and self._thread.is_alive():
            deadline.wait(0.005)
            waited += 0.005
            if waited > BOUND:
                raise AssertionError(f"{self.label} neither reached {self.step} nor ended")
        if self._plan.reached.is_set():
            return True
        self._thread.join(BOUND)
        return False

    def resume(self) -> Any:
        """Let it go on and wait (bounded) for its end; its exception, if any, is raised here."""
        self._plan.go.set()
        self._thread.join(BOUND)
        if self._thread.is_alive():
            raise AssertionError(f"{self.label} did not end within {BOUND} s of being resumed")
        if self.error is not None:
            raise self.error
        return self.result


def killed_at(conductor: Conductor, step: str, operation: Callable[[], Any]) -> tuple[bool, Any]:
    """Run ``operation`` in this thread, killed (:class:`Killed`) the first time it reaches ``step``: (whether it
    was killed, its result otherwise)."""
    ident = threading.get_ident()
    conductor.arm(Plan(threading.current_thread(), step, kill=True), ident)
    try:
        return False, operation()
    except Killed:
        return True, None
    finally:
        conductor.disarm(ident)


# --- a store as the model reads it --------------------------------------------------------------------------------


@dataclass(frozen=True)
class Row:
    """A store's authoritative row of a room."""

    room_id: str
    family: str  # the room's name: which room of that id it is
    holder: str
    epoch: int
    disbanded: bool


def rows(engine: Engine) -> dict[str, Row]:
    table = models.rooms
    with engine.connect() as connection:
        found = connection.execute(sa.select(
            table.c.room_id, table.c.name, table.c.authority_gateway_id, table.c.authority_epoch,
            table.c.disbanded_at)).all()
    return {row[0]: Row(row[0], row[1], row[2], int(row[3]), row[4] is not None) for row in found}


def event_ids(engine: Engine) -> dict[str, set[str]]:
    """Every room's logged event ids (the authoritative log, not replicas)."""
    table = models.events
    logs: dict[str, set[str]] = {}
    with engine.connect() as connection:
        for room_id, event_id in connection.execute(sa.select(table.c.room_id, table.c.event_id)):
            logs.setdefault(room_id, set()).add(event_id)
    return logs


def fingerprint(engine: Engine) -> tuple[Any, ...]:
    """A cheap summary of a store that changes with every committed room, event or replica write (so a test
    runs ``verify`` again only on a store that changed)."""
    room, replica = models.rooms.c, models.replicas.c
    with engine.connect() as connection:
        return (*connection.execute(sa.select(
            sa.func.count(), sa.func.sum(room.next_seq), sa.func.sum(room.authority_epoch), sa.func.sum(room.revision),
            sa.func.count(room.disbanded_at))).one(),
            *connection.execute(sa.select(
                sa.func.count(), sa.func.sum(replica.last_seq), sa.func.sum(replica.latest_seq),
                sa.func.sum(replica.authority_epoch))).one(),
            connection.execute(sa.select(sa.func.count()).select_from(models.replica_events)).scalar_one())


def empty(engine: Engine) -> None:
    """Delete every row (faster than a new migrated store per example)."""
    with engine.begin() as connection:
        for table in reversed(models.metadata.sorted_tables):
            connection.execute(sa.delete(table))


# --- the CLI's operations on this topology --------------------------------------------------------------------------


def replicate(source: Engine, target: Engine, gateway: str, limits: Limits | None, source_gateway: str) -> PassReport:
    """``hostedrooms replicate --from SOURCE --to TARGET --gateway GATEWAY --source-gateway SOURCE_GATEWAY``: one
    pass, a new replicator (which also gives back rooms the source's gateway fenced here and never promoted)."""
    return Replicator(EnginePageSource(source), target, local_gateway_id=gateway, limits=limits,
                      source_gateway_id=source_gateway, reclaim_after=0).sync_once()


def take_over(target: Engine, gateway: str, from_gateway: str, limits: Limits | None,
              catch_up_from: Engine | None) -> FailoverReport:
    """``hostedrooms failover --to TARGET --gateway GATEWAY --from-gateway FROM [--catch-up-from STORE]``."""
    source = None if catch_up_from is None else EnginePageSource(catch_up_from)
    return failover(target, from_gateway=from_gateway, local_gateway_id=gateway, limits=limits,
                    catch_up_from=source)

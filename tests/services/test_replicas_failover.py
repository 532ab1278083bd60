"""Failover stories across gateways, each gateway with its own database (SQLite files or PostgreSQL databases),
through the native API and through the facade. The store is checked with verify() after every step."""

from __future__ import annotations

import shutil
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from apis import use_api

from hostedrooms import migrate, replicas, rooms, verify
from hostedrooms.compat import hosted_room_replicas as hrr
from hostedrooms.compat import hosted_rooms as hr
from hostedrooms.db import create_engine
from hostedrooms.errors import AuthorityConflictError, ReplicaEpochRegressionError, ReplicaError
from hostedrooms.testing import create_database, drop_database, unique_name

_api = use_api("replicas", "rooms", "verify")  # the tests on a database run on both APIs

MEMBERS = [{"id": "m1"}]
USER = {"kind": "user", "id": "u1"}


class Gateway:
    """One gateway: its identity and its own database, driven through the native API or the facade."""

    def __init__(self, name: str, target: str, api: str, monkeypatch: pytest.MonkeyPatch) -> None:
        self.install = name
        self.id = f"install:{name}"
        self.target = target
        self.engine = create_engine(target)
        self.api = api
        self._monkeypatch = monkeypatch

    def _as_me(self) -> None:
        self._monkeypatch.setenv("HOSTEDROOMS_INSTALL_ID", self.install)

    def check(self) -> None:
        assert verify(self.engine) == [], f"{self.id} store is inconsistent"

    def host(self, room_id: str) -> None:
        rooms.create_room(self.engine, room_id=room_id, name="Team", members=MEMBERS, authority_gateway_id=self.id,
                          now=1.0)

    def say(self, room_id: str, text: str, epoch: int, gateway: str | None = None) -> dict[str, Any]:
        return rooms.append_event(
            self.engine, room_id=room_id, event_id=f"{self.install}:{text}", kind="message.user", actor=USER,
            payload={"text": text}, authority_gateway_id=gateway or self.id, authority_epoch=epoch, now=2.0)

    def log(self, room_id: str, since: int = 0, limit: int = 500) -> dict[str, Any]:
        return rooms.read_events(self.engine, room_id=room_id, since_seq=since, limit=limit)

    def ingest(self, room_id: str, page: dict[str, Any]) -> dict[str, Any]:
        if self.api == "facade":
            return hrr.ingest_page(self.target, room_id=room_id, room_name="Team", members=MEMBERS, page=page, now=3.0)
        return replicas.ingest_page(self.engine, room_id=room_id, room_name="Team", members=MEMBERS, page=page,
                                    now=3.0)

    def promote(self, room_id: str) -> dict[str, Any]:
        if self.api == "facade":
            self._as_me()
            return hrr.promote_replica(self.target, room_id=room_id, reason="authority-unreachable", now=4.0)
        return replicas.promote_replica(self.engine, room_id=room_id, now=4.0, local_gateway_id=self.id)

    def demote(self, room_id: str, observed: Gateway, epoch: int) -> dict[str, Any]:
        if self.api == "facade":
            self._as_me()
            return hrr.demote_room(self.target, room_id=room_id, observed_gateway_id=observed.id,
                                   observed_epoch=epoch, now=5.0)
        return replicas.demote_room(self.engine, room_id=room_id, observed_gateway_id=observed.id,
                                    observed_epoch=epoch, now=5.0, local_gateway_id=self.id)


@pytest.fixture
def gateways(
    request: pytest.FixtureRequest, backend: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[Callable[..., Gateway]]:
    """A factory of gateways, each on a fresh migrated database of ``backend``."""
    made: list[Gateway] = []
    databases: list[str] = []
    admin = request.getfixturevalue("pg_admin_url") if backend == "postgresql" else None

    def make(name: str, api: str = "native") -> Gateway:
        if admin is None:
            target = str(tmp_path / f"{name}.db")
            shutil.copyfile(request.getfixturevalue("sqlite_template"), target)
        else:
            database = unique_name("hostedrooms_gw")
            databases.append(database)
            target = create_database(admin, database)
            migrate.upgrade(target)
        gateway = Gateway(name, target, api, monkeypatch)
        made.append(gateway)
        return gateway

    yield make
    for gateway in made:
        gateway.engine.dispose()
    if admin is not None:
        from hostedrooms.compat._engine import forget_engines

        forget_engines()  # the facade caches engines per URL; drop them before the databases go
        for database in databases:
            drop_database(admin, database)


def replicate(source: Gateway, follower: Gateway, room_id: str, *, page_size: int = 2) -> list[dict[str, Any]]:
    """Ingest the whole log of ``room_id`` from ``source`` in pages; return the pages."""
    pages: list[dict[str, Any]] = []
    cursor = 0
    while True:
        page = source.log(room_id, since=cursor, limit=page_size)
        follower.ingest(room_id, page)
        follower.check()
        pages.append(page)
        cursor = page["cursor"]
        if not page["has_more"]:
            return pages


@pytest.mark.parametrize("surface", ["native", "facade"])
def test_full_failover_story(gateways: Callable[..., Gateway], surface: str) -> None:
    a, b = gateways("gw-a", surface), gateways("gw-b", surface)
    a.host("room")
    for n in range(5):
        a.say("room", f"a{n}", epoch=1)
    a.check()

    # B follows A's log in several pages; a retried old page changes nothing and lowers nothing.
    partial = a.log("room", limit=2)
    assert b.ingest("room", partial)["caught_up"] is False
    pages = replicate(a, b, "room", page_size=2)
    assert len(pages) == 3
    retry = b.ingest("room", partial)
    assert (retry["ingested"], retry["stored_seq"], retry["caught_up"]) == (0, 5, True)
    b.check()

    # A dies; B continues the room at epoch 2 and appends.
    promoted = b.promote("room")
    assert (promoted["authority_gateway_id"], promoted["authority_epoch"], promoted["claim_seq"]) == (b.id, 2, 6)
    b.check()
    for n in range(2):
        b.say("room", f"b{n}", epoch=2)
    b.check()

    # A comes back, observes B's lineage and fences itself; its stale writes now fail in its own store.
    assert b.log("room")["authority"] == {"gateway_id": b.id, "epoch": 2}
    assert a.demote("room", b, 2)["idempotent"] is False
    assert a.demote("room", b, 2)["idempotent"] is True
    a.check()
    with pytest.raises(AuthorityConflictError, match="^stale hosted room authority$"):
        a.say("room", "late", epoch=1)
    a.check()

    # B's log: A's events, the claim, B's events, contiguous.
    log = b.log("room")["events"]
    assert [event["seq"] for event in log] == list(range(1, 9))
    assert [event["event_id"] for event in log] == [
        *(f"gw-a:a{n}" for n in range(5)), "system:authority-claimed:2", "gw-b:b0", "gw-b:b1"]
    assert [event["authority_epoch"] for event in log] == [1, 1, 1, 1, 1, 2, 2, 2]
    assert log[5]["payload"]["previous_gateway_id"] == a.id
    a_log = a.log("room")["events"]
    assert [event["kind"] for event in a_log][-1] == "authority.lost"
    assert [event["seq"] for event in a_log] == list(range(1, 7))

    # A now follows B (a fresh replica would need the room row gone: the reference's failback limitation).
    assert a.log("room")["authority"] == {"gateway_id": b.id, "epoch": 2}


def test_two_promotions_fork_and_the_demoted_store_fences_itself(gateways: Callable[..., Gateway]) -> None:
    a, b, c = gateways("gw-a"), gateways("gw-b"), gateways("gw-c")
    a.host("room")
    a.say("room", "hello", epoch=1)
    replicate(a, b, "room")
    replicate(a, c, "room")

    # Both followers promote in their own stores: each succeeds locally (the caller decided it was safe).
    assert b.promote("room")["authority_epoch"] == 2
    assert c.promote("room")["authority_epoch"] == 2
    b.say("room", "from-b", epoch=2)
    c.say("room", "from-c", epoch=2)
    for gateway in (b, c):
        gateway.check()

    # A same-epoch fork cannot be adopted by demotion; a replica of the other side refuses it too.
    with pytest.raises(ReplicaEpochRegressionError):
        c.demote("room", b, 2)
    a.demote("room", b, 2)
    with pytest.raises(ReplicaEpochRegressionError):
        a.demote("room", c, 2)

    # B's lineage moves on to epoch 3; C, presented with it, demotes and then refuses its own stale writes.
    rooms.claim_authority(b.engine, room_id="room", expected_gateway_id=b.id, expected_epoch=2, new_gateway_id=b.id,
                          event_id="b-claims-3", now=6.0)
    assert c.demote("room", b, 3)["authority_epoch"] == 3
    with pytest.raises(AuthorityConflictError, match="^stale hosted room authority$"):
        c.say("room", "after", epoch=2)
    with pytest.raises(AuthorityConflictError, match="^stale hosted room authority$"):
        a.say("room", "after", epoch=1)
    with pytest.raises(ReplicaError, match="^room is not locally authoritative; nothing to demote$"):
        c.demote("room", b, 4)
    for gateway in (a, b, c):
        gateway.check()


def test_a_follower_of_the_new_authority_sees_the_claim(gateways: Callable[..., Gateway]) -> None:
    a, b, c = gateways("gw-a"), gateways("gw-b"), gateways("gw-c")
    a.host("room")
    a.say("room", "one", epoch=1)
    replicate(a, b, "room")
    replicate(a, c, "room")
    b.promote("room")
    b.say("room", "two", epoch=2)
    # C keeps following, now from B: the epoch-2 pages extend its epoch-1 replica contiguously.
    replicate(b, c, "room")
    state = replicas.replica_state(c.engine, room_id="room")
    assert state["authority"] == {"gateway_id": b.id, "epoch": 2}
    assert (state["last_seq"], state["latest_seq"]) == (3, 3)
    # A page from A's stale lineage is now refused.
    with pytest.raises(ReplicaEpochRegressionError):
        c.ingest("room", a.log("room"))
    # C can take over from B at epoch 3 with the whole history.
    assert c.promote("room")["authority_epoch"] == 3
    assert [event["event_id"] for event in c.log("room")["events"]] == [
        "gw-a:one", "system:authority-claimed:2", "gw-b:two", "system:authority-claimed:3"]
    c.check()


@pytest.mark.sync_api_only  # several threads call the services at once
def test_concurrent_ingest_of_one_room(gateways: Callable[..., Gateway]) -> None:
    a, b = gateways("gw-a"), gateways("gw-b")
    a.host("room")
    for n in range(6):
        a.say("room", f"m{n}", epoch=1)
    pages = [a.log("room", since=since, limit=2) for since in (0, 2, 4)]
    errors: list[BaseException] = []

    def follow() -> None:
        for page in pages:
            try:
                b.ingest("room", page)
            except ReplicaError as exc:  # a later page racing ahead of its predecessor
                errors.append(exc)

    threads = [threading.Thread(target=follow) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert not any(thread.is_alive() for thread in threads)
    assert all("skips sequences" in str(exc) for exc in errors)
    for page in pages:  # whatever raced, replaying the pages in order completes the replica
        b.ingest("room", page)
    state = replicas.replica_state(b.engine, room_id="room")
    assert (state["last_seq"], state["latest_seq"]) == (6, 6)
    b.check()


def test_facade_and_native_share_one_store(gateways: Callable[..., Gateway]) -> None:
    a = gateways("gw-a")
    hr.create_room(a.target, room_id="room", name="Team", members=MEMBERS, authority_gateway_id=a.id, now=1.0)
    b = gateways("gw-b", "facade")
    b.ingest("room", hr.read_events(a.target, room_id="room"))
    assert replicas.replica_state(b.engine, room_id="room")["last_seq"] == 0
    assert b.promote("room")["claim_seq"] == 1
    b.check()


@pytest.mark.sync_api_only  # several threads call the services at once
def test_concurrent_promotions_of_one_replica(gateways: Callable[..., Gateway]) -> None:
    """Within one store exactly one promotion wins; the others find the replica consumed (no driver error)."""
    a, b = gateways("gw-a"), gateways("gw-b")
    a.host("room")
    a.say("room", "one", epoch=1)
    replicate(a, b, "room")
    outcomes: list[object] = []
    barrier = threading.Barrier(4, timeout=60)

    def promote() -> None:
        barrier.wait(timeout=30)
        try:
            outcomes.append(b.promote("room")["authority_epoch"])
        except ReplicaError as exc:
            outcomes.append(str(exc))

    threads = [threading.Thread(target=promote) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert not any(thread.is_alive() for thread in threads)
    assert sorted(map(str, outcomes)) == ["2", "replica not found", "replica not found", "replica not found"]
    assert [event["seq"] for event in b.log("room")["events"]] == [1, 2]
    b.check()

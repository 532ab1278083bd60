"""The peer routing store (:class:`hostedrooms.store.peers.PeerStore`): links, revoked grant scopes, reservations,
remote-run receipts and the ownership probes, method by method, on a migrated, empty store."""

from __future__ import annotations

from typing import Any

import pytest
import sqlalchemy as sa
from sqlalchemy import Engine

from hostedrooms import models
from hostedrooms.backends import Backend
from hostedrooms.errors import StoreUnavailableError
from hostedrooms.store.peers import LINK_COLUMNS, REMOTE_RUN_COLUMNS, PeerStore
from hostedrooms.uow import UnitOfWork

from .support import OnBackend, contend, room_values

_reservations = models.peer_reservations


def link(room_id: str = "r1", member_id: str = "m1", **overrides: Any) -> dict[str, Any]:
    values = {"room_id": room_id, "member_id": member_id, "target_url": "https://peer.invalid",
              "target_profile": "p", "grant": "g", "catalog_json": "{}", "cancellation_scope_id": "c",
              "trace_id": "t", "transport_security": "tls", "status": "ready", "updated_at": 1.0}
    return {**values, **overrides}


def reservation(member_id: str = "m1", *, gateway: str = "gw-a", epoch: int = 1, **overrides: Any) -> dict[str, Any]:
    values = {"room_id": "r1", "member_id": member_id, "target_profile": "p", "authority_gateway_id": gateway,
              "authority_epoch": epoch}
    return {**values, **overrides}


def receipt(task_id: str = "task", **overrides: Any) -> dict[str, Any]:
    values = {"room_id": "r1", "home_install_id": "h", "authority_gateway_id": "gw-a", "authority_epoch": 1,
              "member_id": "m1", "target_install_id": "t", "target_profile": "p", "task_id": task_id,
              "execution_generation": 1, "run_id": "run", "session_id": "s"}
    return {**values, **overrides}


def identity(values: dict[str, Any]) -> dict[str, Any]:
    return {column: values[column] for column in models.REMOTE_RUN_IDENTITY_COLUMNS}


class PeerStoreContract(OnBackend):
    """What the peer store promises on every backend."""

    def test_each_unit_binds_a_peer_store(self, engine: Engine, impl: Backend) -> None:
        with UnitOfWork(engine, write=False) as uow:
            assert isinstance(uow.peers, PeerStore) and uow.peers is uow.peers
            assert uow.peers.connection is uow.connection and uow.peers.backend is impl

    # -- links ---------------------------------------------------------------------------------------------------

    def test_upsert_link_inserts_then_replaces_every_field(self, engine: Engine) -> None:
        with UnitOfWork(engine) as uow:
            peers = uow.peers
            peers.upsert_link(link())
            assert peers.link_exists(link()) and not peers.link_exists(link(member_id="m2"))
            peers.upsert_link(link(target_url="https://other.invalid", grant="g2", status="stale", updated_at=2.0))
            assert [dict(row) for row in peers.links()] == [
                link(target_url="https://other.invalid", grant="g2", status="stale", updated_at=2.0)]
            assert peers.link_count() == 1

    def test_links_in_code_point_order_and_their_status_and_deletion(self, engine: Engine) -> None:
        with UnitOfWork(engine) as uow:
            peers = uow.peers
            for room_id, member_id in (("rb", "m1"), ("rB", "m2"), ("ra", "mb"), ("ra", "mB"), ("r\u00e9", "m")):
                peers.upsert_link(link(room_id, member_id))
            assert [(row["room_id"], row["member_id"]) for row in peers.links()] == [
                ("rB", "m2"), ("ra", "mB"), ("ra", "mb"), ("rb", "m1"), ("r\u00e9", "m")]
            assert tuple(peers.links()[0].keys()) == LINK_COLUMNS
            assert peers.set_link_status("ra", "mb", "revoked", 9.0)
            assert not peers.set_link_status("ra", "absent", "revoked", 9.0)
            assert [(row["status"], row["updated_at"]) for row in peers.links() if row["member_id"] == "mb"] == [
                ("revoked", 9.0)]
            assert peers.delete_links("ra") == 2 and peers.delete_links("ra") == 0
            assert peers.link_count() == 3

    def test_lock_links_and_lock_reservations_exclude_a_second_writer(self, engine: Engine, quick_engine: Engine,
                                                                      impl: Backend) -> None:
        for take in (PeerStore.lock_links, PeerStore.lock_reservations):
            with UnitOfWork(engine) as uow:
                take(uow.peers)
                with pytest.raises(StoreUnavailableError):
                    contend(quick_engine, lambda connection: take(PeerStore(impl, connection)))  # noqa: B023
            contend(quick_engine, lambda connection: take(PeerStore(impl, connection)))  # noqa: B023

    def test_restrict_to_owner_runs_in_a_unit(self, engine: Engine) -> None:
        with UnitOfWork(engine) as uow:
            uow.peers.restrict_to_owner()  # owner-only files (SQLite) or nothing (a server): never raises here

    # -- revoked grant scopes ------------------------------------------------------------------------------------

    def test_grant_fences_only_move_up_and_expire(self, engine: Engine) -> None:
        with UnitOfWork(engine) as uow:
            peers = uow.peers
            peers.raise_grant_fence("scope", expires_at=100.0, revoked_before=50.0)
            peers.raise_grant_fence("scope", expires_at=80.0, revoked_before=40.0)  # lower: kept as it was
            assert peers.grant_fence("scope", now=10.0) == 50.0
            peers.raise_grant_fence("scope", expires_at=120.0, revoked_before=60.0)
            assert peers.grant_fence("scope", now=110.0) == 60.0
            assert peers.grant_fence("scope", now=120.0) is None and peers.grant_fence("other", now=1.0) is None
            peers.raise_grant_fence("old", expires_at=5.0, revoked_before=1.0)
            peers.drop_expired_grant_fences(now=5.0)
            rows = uow.connection.execute(sa.select(models.revoked_grants.c.scope_key)).scalars().all()
            assert rows == ["scope"]

    # -- reservations --------------------------------------------------------------------------------------------

    def test_upsert_reservation_takes_the_authority_and_keeps_the_later_expiry(self, engine: Engine) -> None:
        with UnitOfWork(engine) as uow:
            peers = uow.peers
            peers.upsert_reservation(reservation(), expires_at=100.0, now=1.0)
            assert tuple(peers.reservation_holder("r1", "m1", "p")) == ("gw-a", 1)
            assert peers.reservation_holder("r1", "m2", "p") is None
            peers.revoke_scope_reservations({"room_id": "r1", "member_id": "m1", "target_profile": "p"}, 1, 5.0)
            assert not peers.reservation_is_live("r1", "p", now=6.0)
            peers.upsert_reservation(reservation(gateway="gw-b", epoch=2), expires_at=50.0, now=7.0)
            row = uow.connection.execute(sa.select(_reservations)).mappings().one()
            assert (row["authority_gateway_id"], row["authority_epoch"], row["expires_at"], row["revoked_at"],
                    row["created_at"], row["updated_at"]) == ("gw-b", 2, 100.0, None, 1.0, 7.0)
            assert peers.reservation_is_live("r1", "p", now=99.0) and not peers.reservation_is_live("r1", "p", 100.0)
            assert peers.live_reservation_matches(reservation(gateway="gw-b", epoch=2), now=8.0)
            assert not peers.live_reservation_matches(reservation(), now=8.0)

    def test_reservation_holders_revocation_and_expiry(self, engine: Engine) -> None:
        with UnitOfWork(engine) as uow:
            peers = uow.peers
            peers.upsert_reservation(reservation("m1", epoch=1), expires_at=100.0, now=1.0)
            peers.upsert_reservation(reservation("m2", epoch=2), expires_at=100.0, now=1.0)
            peers.upsert_reservation(reservation("m3", epoch=3), expires_at=10.0, now=1.0)
            assert sorted(map(tuple, peers.live_reservation_holders("r1", "p", now=5.0))) == [
                ("gw-a", 1), ("gw-a", 2), ("gw-a", 3)]
            peers.revoke_older_reservations("r1", "p", 2, now=6.0)  # below epoch 2: m1 only
            assert sorted(map(tuple, peers.live_reservation_holders("r1", "p", now=7.0))) == [("gw-a", 2), ("gw-a", 3)]
            peers.revoke_scope_reservations({"room_id": "r1", "member_id": "m2"}, 1, now=8.0)  # wrong epoch: none
            assert len(peers.live_reservation_holders("r1", "p", now=9.0)) == 2
            peers.drop_expired_reservations(now=10.0)
            members = uow.connection.execute(sa.select(_reservations.c.member_id)).scalars().all()
            assert sorted(members) == ["m1", "m2"]  # m3 expired; a revoked one stays until it expires

    # -- remote-run receipts --------------------------------------------------------------------------------------

    def test_insert_receipt_says_whether_it_inserted(self, engine: Engine) -> None:
        with UnitOfWork(engine) as uow:
            peers = uow.peers
            assert peers.insert_receipt(receipt(), now=1.0) is True
            assert peers.insert_receipt(receipt(run_id="other"), now=2.0) is False  # the identity is stored
            assert peers.locked_receipt(identity(receipt())) == tuple(receipt()[c] for c in REMOTE_RUN_COLUMNS)
            stored = peers.receipt(identity(receipt()))
            assert stored is not None and (stored["created_at"], stored["updated_at"]) == (1.0, 1.0)
            peers.touch_receipt(identity(receipt()), now=3.0)
            stored = peers.receipt(identity(receipt()))
            assert stored is not None and (stored["run_id"], stored["updated_at"]) == ("run", 3.0)
            assert peers.receipt(identity(receipt("absent"))) is None

    def test_receipts_filter_and_order(self, engine: Engine) -> None:
        with UnitOfWork(engine) as uow:
            peers = uow.peers
            peers.insert_receipt(receipt("tb"), now=2.0)
            peers.insert_receipt(receipt("tB"), now=2.0)
            peers.insert_receipt(receipt("ta", execution_generation=2), now=2.0)
            peers.insert_receipt(receipt("ta"), now=2.0)
            peers.insert_receipt(receipt("tz"), now=1.0)
            peers.insert_receipt(receipt("other", session_id="s2"), now=0.5)
            found = [(row["task_id"], row["execution_generation"]) for row in peers.receipts({"session_id": "s"})]
            assert found == [("tz", 1), ("tB", 1), ("ta", 1), ("ta", 2), ("tb", 1)]
            assert len(peers.receipts({})) == 6

    # -- probes -------------------------------------------------------------------------------------------------

    def test_probes_answer_from_the_tables(self, engine: Engine, impl: Backend) -> None:
        with UnitOfWork(engine) as uow:
            uow.rooms.insert_room(room_values("live"))
            uow.rooms.insert_room(room_values("gone", disbanded_at=5.0))
            uow.peers.upsert_reservation(reservation(), expires_at=100.0, now=1.0)
            uow.commit()
        with engine.connect() as connection:
            probe = PeerStore(impl, connection)
            assert probe.probe_live_room("live") and not probe.probe_live_room("gone")
            assert not probe.probe_live_room("absent")
            assert probe.probe_live_reservation("r1", "p", now=50.0)
            assert not probe.probe_live_reservation("r1", "p", now=100.0)
            assert not probe.probe_live_reservation("r1", "other", now=50.0)


class TestPeerStoreSQLite(PeerStoreContract):
    backend_name = "sqlite"


class TestPeerStorePostgreSQL(PeerStoreContract):
    backend_name = "postgresql"

"""``uow.peers`` and ``uow.ledger``: the peer and ledger stores bound to the unit's connection, one per unit."""

from __future__ import annotations

import pytest
import sqlalchemy as sa

from hostedrooms import UnitOfWork, peers
from hostedrooms.store.ledger import LedgerStore, ledger_statements
from hostedrooms.store.peers import PeerStore


def test_each_unit_has_its_stores_on_its_own_connection(engine: sa.Engine) -> None:
    with UnitOfWork(engine, write=False) as first, UnitOfWork(engine, write=False) as second:
        for uow in (first, second):
            assert isinstance(uow.peers, PeerStore) and isinstance(uow.ledger, LedgerStore)
            assert uow.peers is uow.peers and uow.ledger is uow.ledger  # built once per unit
            assert uow.peers.connection is uow.connection and uow.ledger.connection is uow.connection
            assert uow.peers.backend is uow.backend and uow.ledger.backend is uow.backend
        assert first.peers is not second.peers and first.ledger is not second.ledger
        # The compiled statements are the backend's, shared by every unit.
        assert first.ledger.statements is second.ledger.statements is ledger_statements(first.backend)


def test_a_unit_not_entered_has_no_store(engine: sa.Engine) -> None:
    uow = UnitOfWork(engine)
    for name in ("peers", "ledger"):
        with pytest.raises(RuntimeError, match="unit of work is not active"):
            getattr(uow, name)


def test_the_stores_run_in_the_units_transaction(engine: sa.Engine) -> None:
    # A link written through uow.peers and rolled back leaves nothing; committed, the service reads it.
    record = {"room_id": "r1", "member_id": "m1", "target_url": "https://peer.invalid", "target_profile": "p",
              "grant": "g", "catalog_json": "{}", "cancellation_scope_id": "c", "trace_id": "t",
              "transport_security": "tls", "status": "ok", "updated_at": 1.0}
    with UnitOfWork(engine) as uow:
        uow.peers.upsert_link(record)
        assert uow.peers.link_count() == 1
    assert peers.list_room_link_records(engine) == []
    with UnitOfWork(engine) as uow:
        uow.peers.upsert_link(record)
        uow.commit()
    assert peers.list_room_link_records(engine) == [record]
    with UnitOfWork(engine, write=False) as uow:
        assert uow.ledger.backlog()[("outbound", "pending")] == 0

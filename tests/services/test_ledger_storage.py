"""Ledger storage: owner-private SQLite files, crash recovery in a killed process, concurrent writers."""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from factories import envelope, outbound, prepare, run_together
from factories import file_mode as mode
from sqlalchemy import Engine

from hostedrooms import limits
from hostedrooms.compat import secure_peer_delivery as facade
from hostedrooms.compat.secure_peer_delivery import SecurePeerDeliveryLedger
from hostedrooms.db import create_engine
from hostedrooms.errors import HostedRoomError, StorageError
from hostedrooms.ledger import DeliveryLedger
from hostedrooms.models import deliveries


@pytest.fixture
def ledger_path(tmp_path: Path) -> Path:
    return tmp_path / "home" / "private" / "ledger.db"


@pytest.fixture
def opened(ledger_path: Path) -> Iterator[SecurePeerDeliveryLedger]:
    ledger = SecurePeerDeliveryLedger(ledger_path)
    yield ledger
    ledger.close()


# --- owner-private SQLite files ------------------------------------------------------------------------------


def test_new_ledger_file_is_private_wal_and_durable(ledger_path: Path) -> None:
    ledger_path.parent.parent.mkdir(mode=0o755)
    ledger_path.parent.mkdir(mode=0o755)
    previous = os.umask(0o022)
    try:
        ledger = SecurePeerDeliveryLedger(str(ledger_path))
    finally:
        os.umask(previous)
    try:
        assert ledger.path == ledger_path and ledger.file == ledger_path
        assert mode(ledger_path.parent) == 0o700 and mode(ledger_path) == 0o600
        prepare(ledger, 1)
        with ledger.engine.connect() as connection:
            assert connection.exec_driver_sql("PRAGMA journal_mode").scalar() == "wal"
            assert connection.exec_driver_sql("PRAGMA synchronous").scalar() == 2  # FULL
        assert mode(ledger_path) == 0o600
    finally:
        ledger.close()
    with sqlite3.connect(ledger_path) as raw:  # the ledger tables live in the migrated hostedrooms schema
        names = {row[0] for row in raw.execute("SELECT name FROM sqlite_master")}
    assert {"secure_peer_deliveries", "secure_peer_outbound_intents", "secure_peer_outbound_connection"} <= names


def test_symlinked_file_or_directory_is_refused(ledger_path: Path, tmp_path: Path) -> None:
    SecurePeerDeliveryLedger(ledger_path).close()
    link = ledger_path.parent / "link.db"
    link.symlink_to(ledger_path)
    with pytest.raises(PermissionError, match="^secure peer delivery ledger must not be a symlink$"):
        SecurePeerDeliveryLedger(link)
    dangling = ledger_path.parent / "dangling.db"
    dangling.symlink_to(tmp_path / "nowhere.db")
    with pytest.raises(PermissionError, match="must not be a symlink"):
        SecurePeerDeliveryLedger(dangling)
    assert not (tmp_path / "nowhere.db").exists()
    outside = tmp_path / "outside"
    outside.symlink_to(ledger_path.parent, target_is_directory=True)
    with pytest.raises(PermissionError, match="private directory must not be a symlink"):
        SecurePeerDeliveryLedger(outside / "x.db")


def test_hard_linked_file_is_refused(ledger_path: Path) -> None:
    SecurePeerDeliveryLedger(ledger_path).close()
    os.link(ledger_path, ledger_path.parent / "second-name.db")
    with pytest.raises(PermissionError, match="^secure peer delivery ledger is unsafe$"):
        SecurePeerDeliveryLedger(ledger_path)


def test_files_are_rechecked_before_every_transaction(opened: SecurePeerDeliveryLedger, ledger_path: Path) -> None:
    prepare(opened, 1)
    os.chmod(ledger_path, 0o644)
    assert opened.get("env-1") is not None and mode(ledger_path) == 0o600  # repaired, like the reference
    extra = ledger_path.parent / "extra-link.db"
    os.link(ledger_path, extra)
    with pytest.raises(PermissionError, match="^secure peer delivery ledger is unsafe$"):
        opened.get("env-1")
    with pytest.raises(PermissionError, match="is unsafe"):
        prepare(opened, 2)
    extra.unlink()
    assert prepare(opened, 2)[1] is True


def test_a_replaced_or_swapped_file_is_refused(opened: SecurePeerDeliveryLedger, ledger_path: Path) -> None:
    prepare(opened, 1)
    moved = ledger_path.with_name("moved.db")
    os.rename(ledger_path, moved)
    ledger_path.symlink_to(moved)
    with pytest.raises(PermissionError, match="must not be a symlink"):
        opened.recoverable()
    ledger_path.unlink()
    impostor = ledger_path.with_name("impostor.db")
    SecurePeerDeliveryLedger(impostor).close()
    os.rename(impostor, ledger_path)  # a private, regular file, but not the one this ledger opened
    with pytest.raises(PermissionError, match="^secure peer delivery ledger is unsafe$"):
        opened.recoverable()


def test_mode_that_cannot_be_fixed_is_refused(ledger_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    SecurePeerDeliveryLedger(ledger_path).close()
    os.chmod(ledger_path, 0o640)
    monkeypatch.setattr(os, "chmod", lambda *args, **kwargs: None)  # e.g. a filesystem that ignores chmod
    with pytest.raises(PermissionError, match="^secure peer delivery ledger is unsafe$"):
        SecurePeerDeliveryLedger(ledger_path)


@pytest.mark.skipif(not hasattr(os, "chown") or os.getuid() != 0, reason="needs root to give a file away")
def test_foreign_owner_is_refused(ledger_path: Path) -> None:
    SecurePeerDeliveryLedger(ledger_path).close()
    os.chown(ledger_path, 65534, 65534)
    with pytest.raises(PermissionError, match="^secure peer delivery ledger is unsafe$"):
        SecurePeerDeliveryLedger(ledger_path)
    assert mode(ledger_path) == 0o600  # a foreign file is never chmod-ed


def test_native_ledger_guards_its_engines_file(tmp_path: Path) -> None:
    path = tmp_path / "data" / "state.db"
    engine = create_engine(path)
    try:
        from hostedrooms import migrate

        migrate.upgrade(engine)
        os.chmod(path, 0o644)
        ledger = DeliveryLedger(engine)
        assert ledger.file == path and mode(path) == 0o600 and mode(path.parent) == 0o700
        os.link(path, tmp_path / "data" / "alias.db")
        with pytest.raises(PermissionError, match="is unsafe"):
            ledger.recoverable()
    finally:
        engine.dispose()


def test_ledger_refuses_an_engine_without_durable_commits(tmp_path: Path) -> None:
    engine = create_engine(tmp_path / "fast" / "state.db", synchronous="NORMAL")
    try:
        with pytest.raises(StorageError, match="requires WAL with synchronous=FULL"):
            DeliveryLedger(engine)
    finally:
        engine.dispose()


# --- facade module --------------------------------------------------------------------------------------------


def test_facade_exports_the_reference_constants() -> None:
    assert facade.DELIVERY_STATES == frozenset(
        {"prepared", "authorized", "queued", "running", "completed", "failed"})
    assert facade.TERMINAL_DELIVERY_STATES == frozenset({"completed", "failed"})
    assert facade.MAX_NONTERMINAL_DELIVERIES == 2_048


def test_facade_on_every_backend(target: str) -> None:
    ledger = SecurePeerDeliveryLedger(target)
    try:
        row, created = prepare(ledger, 1)
        assert created and row["body"] == {"message": "hi"} and ledger.recoverable() == [row]
    finally:
        ledger.close()


def test_facade_guards_the_file_a_sqlite_url_names_as_given(tmp_path: Path) -> None:
    path = tmp_path / "ledger" / "ledger.db"
    for target in (f"sqlite:///{path}", sa.make_url(f"sqlite:///{path}")):
        ledger = SecurePeerDeliveryLedger(target)
        try:
            assert ledger.file == path and ledger.path == path and mode(path) == 0o600 and mode(path.parent) == 0o700
        finally:
            ledger.close()
    (tmp_path / "alias.db").symlink_to(path)
    with pytest.raises(PermissionError, match="^secure peer delivery ledger must not be a symlink$"):
        SecurePeerDeliveryLedger(f"sqlite:///{tmp_path / 'alias.db'}")  # the link itself, never resolved
    with pytest.raises(HostedRoomError, match="unsupported database dialect 'mysql'"):
        SecurePeerDeliveryLedger("mysql://user@localhost/ledger")


# --- crash recovery -------------------------------------------------------------------------------------------

CHILD = """
import json, os, signal, sys
from hostedrooms.compat.secure_peer_delivery import SecurePeerDeliveryLedger
ledger = SecurePeerDeliveryLedger(sys.argv[1])
row, created = ledger.prepare(json.loads(sys.argv[2]), transport_role="host", connection_id="conn-1",
                              lease_token="lease-1", target_chat_id="chat-1")
print(row["state"], created, flush=True)
os.kill(os.getpid(), signal.SIGKILL)  # die before authorizing: no cleanup, no atexit, no pool disposal
"""


def test_prepared_delivery_survives_a_killed_process(target: str) -> None:
    child = subprocess.run(
        [sys.executable, "-c", CHILD, target, json.dumps(envelope(1))],
        capture_output=True, text=True, timeout=120, check=False,
    )
    assert child.returncode == -signal.SIGKILL, child.stderr
    assert child.stdout.split() == ["prepared", "True"]
    ledger = SecurePeerDeliveryLedger(target)  # "restart"
    try:
        recovered = ledger.recoverable()
        assert [(row["envelope_id"], row["state"], row["lease_token"]) for row in recovered] == [
            ("env-1", "prepared", "lease-1")]
        # the redelivery after the lease deadline resumes the saved intent with a new token
        resumed, created = prepare(ledger, 1, lease_token="lease-2")
        assert created is False and resumed["lease_token"] == "lease-2"
        assert (ledger.authorize("env-1") or {}).get("state") == "authorized"
    finally:
        ledger.close()


# --- concurrent writers ---------------------------------------------------------------------------------------


def nonterminal(engine: Engine) -> int:
    with engine.connect() as connection:
        return int(connection.execute(
            sa.select(sa.func.count()).select_from(deliveries)
            .where(deliveries.c.state.in_(("prepared", "authorized", "queued", "running")))).scalar_one())


def test_concurrent_prepares_never_exceed_capacity(engine: Engine, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(limits, "MAX_NONTERMINAL_DELIVERIES", 5)
    for round_ in range(3):  # several rounds: a race that slips through once is caught
        ledgers = [DeliveryLedger(engine) for _ in range(8)]  # one instance per worker: no shared lock

        def work(index: int, ledgers: list[DeliveryLedger] = ledgers, base: int = 100 * round_) -> Any:
            return prepare(ledgers[index], base + index)

        results = run_together(work, 8)
        created = [result for result in results if isinstance(result, tuple)]
        refused = [result for result in results if isinstance(result, RuntimeError)]
        assert len(created) + len(refused) == 8, results
        assert all(str(exc) == "secure peer delivery capacity is full" for exc in refused)
        assert len(created) == 5 and nonterminal(engine) == 5
        with engine.begin() as connection:
            connection.execute(sa.update(deliveries).values(state="failed"))


def test_concurrent_replays_of_one_envelope_and_one_intent(engine: Engine) -> None:
    ledgers = [DeliveryLedger(engine) for _ in range(6)]
    results = run_together(lambda i: prepare(ledgers[i], 1), 6)
    assert sorted(created for _, created in results) == [False] * 5 + [True], results
    arguments = outbound()
    results = run_together(lambda i: ledgers[i].prepare_outbound(**arguments), 6)
    assert sorted(created for _, created in results) == [False] * 5 + [True], results

"""The descriptor policy and owner-private files (issue 14, sections 1 and 4).

* Closing any descriptor of a SQLite file releases this process's POSIX locks on it. A child process probes the
  locks with ``F_GETLK``: the probe sees a lock dropped by an ordinary open+close (control), an ``O_PATH``
  descriptor's close keeps them (the claim ``hostedrooms.files`` relies on), and every operation that touches the
  files (ledger, facade, link writes with mode repairs, verify, the CLI, migrations) keeps them while this process
  holds a connection. An audit hook and a wrapped ``os.close`` also show that none of them opens the database or
  its ``-wal``/``-shm``/``-journal`` with a descriptor whose closing would drop locks.
* Modes are never changed through a symlink (a planted ``state.db-journal``, a symlinked database or sidecar), a
  file owned by someone else is never changed, and a shared directory (sticky, or writable by group or others)
  is refused with an error naming it, never changed.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import re
import sqlite3
import stat
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from factories import file_mode as mode
from factories import link, prepare, private_store

import hostedrooms
from hostedrooms import files, migrate, peers, rooms
from hostedrooms.cli import main
from hostedrooms.compat.secure_peer_delivery import SecurePeerDeliveryLedger
from hostedrooms.errors import StorageError
from hostedrooms.ledger import DeliveryLedger, ensure_private_directory

GATEWAY = "install:gw-local"
SUFFIXES = ("", "-wal", "-shm", "-journal")
LINUX = sys.platform.startswith("linux")

# SQLite's lock bytes (os_unix.c): a connection's SHARED lock on the database file is a read lock on
# [SHARED_FIRST, SHARED_FIRST + SHARED_SIZE); in WAL mode it is held for the connection's life. Each connection
# also holds a read lock on the DMS byte of the -shm file.
PENDING_BYTE = 0x40000000
SHARED_FIRST, SHARED_SIZE = PENDING_BYTE + 2, 510
SHM_DMS_BYTE = 128

PROBE = textwrap.dedent("""
    import fcntl, os, struct, sys
    path, start, length = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    fd = os.open(path, os.O_RDONLY)
    request = struct.pack("hhqqi4x", fcntl.F_WRLCK, os.SEEK_SET, start, length, 0)
    kind, _, _, _, pid = struct.unpack("hhqqi4x", fcntl.fcntl(fd, fcntl.F_GETLK, request))
    print(pid if kind == fcntl.F_RDLCK else 0)
""")


def lock_holder(path: Path, start: int, length: int) -> int:
    """The pid holding a read lock on ``path``'s byte range, seen from another process (0: none)."""
    result = subprocess.run([sys.executable, "-c", PROBE, str(path), str(start), str(length)],
                            capture_output=True, text=True, timeout=60, check=True)
    return int(result.stdout)


def assert_locks_held(path: Path) -> None:
    assert lock_holder(path, SHARED_FIRST, SHARED_SIZE) == os.getpid(), "database SHARED lock lost"
    assert lock_holder(Path(f"{path}-shm"), SHM_DMS_BYTE, 1) == os.getpid(), "-shm DMS lock lost"


@pytest.fixture
def store(tmp_path: Path) -> Path:
    """A migrated SQLite store holding one room, in a private directory."""
    return private_store(tmp_path, room_id="room-1", name="Room", gateway=GATEWAY)


@pytest.fixture
def reader(store: Path) -> Iterator[sqlite3.Connection]:
    """A connection of this process inside a read transaction: it holds SQLite's locks on the store."""
    connection = sqlite3.connect(store, isolation_level=None)
    try:
        connection.execute("BEGIN")
        assert connection.execute("SELECT count(*) FROM hosted_rooms").fetchone() == (1,)
        yield connection
    finally:
        connection.close()


# --- the lock probe and the O_PATH claim -------------------------------------------------------------------


@pytest.mark.skipif(not LINUX, reason="the F_GETLK probe and O_PATH are Linux's")
def test_the_probe_sees_locks_an_ordinary_close_drops(store: Path, reader: sqlite3.Connection) -> None:
    """Control: the hazard is real and the probe sees it (closing a read-only descriptor drops SQLite's lock)."""
    assert_locks_held(store)
    os.close(os.open(store, os.O_RDONLY))
    assert lock_holder(store, SHARED_FIRST, SHARED_SIZE) == 0


@pytest.mark.skipif(not LINUX, reason="O_PATH is Linux's")
def test_closing_an_o_path_descriptor_keeps_the_locks(store: Path, reader: sqlite3.Connection) -> None:
    for suffix in ("", "-shm", "-wal"):
        fd = os.open(f"{store}{suffix}", os.O_PATH | os.O_NOFOLLOW)
        os.fstat(fd)
        os.close(fd)
    assert_locks_held(store)


# --- nothing hostedrooms does drops the locks ----------------------------------------------------------------


class DescriptorWatch:
    """Records every Python-level open and close of a store file by a descriptor that can carry locks."""

    def __init__(self, path: Path) -> None:
        self.names = {os.path.realpath(f"{path}{suffix}") for suffix in SUFFIXES}
        self.active = False
        self.opened: list[tuple[str, int]] = []
        self.closed: list[str] = []

    def audit(self, event: str, args: tuple[Any, ...]) -> None:
        if not self.active or event != "open" or not isinstance(args[0], (str, bytes, os.PathLike)):
            return
        name = os.path.realpath(os.fsdecode(args[0]))
        flags = args[2] if isinstance(args[2], int) else 0
        harmless = flags & getattr(os, "O_PATH", 0) or flags & (os.O_CREAT | os.O_EXCL) == os.O_CREAT | os.O_EXCL
        if name in self.names and not harmless:
            self.opened.append((name, flags))

    def close(self, original: Any, fd: int) -> None:
        if self.active:
            with contextlib.suppress(OSError):
                name = os.readlink(f"/proc/self/fd/{fd}")
                if name in self.names and not fcntl.fcntl(fd, fcntl.F_GETFL) & getattr(os, "O_PATH", 0):
                    self.closed.append(name)
        original(fd)


_WATCHES: list[DescriptorWatch] = []
_AUDITING: list[bool] = []  # non-empty once the audit hook is installed (once per process)


def _audit(event: str, args: tuple[Any, ...]) -> None:
    if event == "open":
        for watch in _WATCHES:
            watch.audit(event, args)


@pytest.fixture
def watch(store: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[DescriptorWatch]:
    if not _AUDITING:
        sys.addaudithook(_audit)  # cannot be removed: it only records while a watch is active
        _AUDITING.append(True)
    watching = DescriptorWatch(store)
    original = os.close
    monkeypatch.setattr(os, "close", lambda fd: watching.close(original, fd))
    _WATCHES.append(watching)
    try:
        yield watching
    finally:
        _WATCHES.remove(watching)


def touch_everything(store: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Every hostedrooms path that examines or changes the store's files, with mode repairs to do."""
    for suffix in ("", "-wal", "-shm"):
        os.chmod(f"{store}{suffix}", 0o644)
    engine = hostedrooms.create_engine(store)
    try:
        ledger = DeliveryLedger(engine)  # repairs the modes of the file and its sidecars
        assert mode(store) == mode(Path(f"{store}-wal")) == 0o600
        prepare(ledger, 1, connection_id="c", lease_token="l", target_chat_id="x")
        assert ledger.authorize("env-1") is not None
        os.chmod(store, 0o640)
        assert ledger.get("env-1") is not None and mode(store) == 0o600  # re-checked and repaired
        for suffix in ("", "-wal", "-shm"):
            os.chmod(f"{store}{suffix}", 0o644)
        peers.upsert_room_link_record(engine, record=link(), max_links=5)  # owner-only chmods of every file
        assert all(mode(Path(f"{store}{suffix}")) == 0o600 for suffix in ("", "-wal", "-shm"))
        assert peers.update_room_link_status(engine, room_id="room-1", member_id="m1", status="down", now=11.0)
        rooms.append_event(engine, room_id="room-1", event_id="e1", kind="message.user",
                           actor={"kind": "user", "id": "u1"}, payload={"text": "hi"},
                           authority_gateway_id=GATEWAY, authority_epoch=1)
    finally:
        engine.dispose()
    facade = SecurePeerDeliveryLedger(store)
    try:
        prepare(facade, 2, connection_id="c", lease_token="l", target_chat_id="x")
    finally:
        facade.close()
    assert hostedrooms.verify(store) == []
    migrate.upgrade(store)  # at head already: the legacy adoption steps run and change nothing
    for command in ("verify", "deliveries", "rooms", "check"):
        assert main([command, "--url", str(store)]) == 0
    capsys.readouterr()


@pytest.mark.skipif(not LINUX, reason="the F_GETLK probe and /proc/self/fd are Linux's")
def test_no_operation_drops_the_locks_of_an_open_connection(
    store: Path, reader: sqlite3.Connection, watch: DescriptorWatch, capsys: pytest.CaptureFixture[str]
) -> None:
    assert_locks_held(store)
    watch.active = True
    touch_everything(store, capsys)
    watch.active = False
    assert_locks_held(store)
    assert watch.opened == [] and watch.closed == []


# --- symlinks are never followed -------------------------------------------------------------------------


@pytest.fixture
def victim(tmp_path: Path) -> Path:
    """Someone else's file (given away when running as root) whose mode must stay 0644."""
    path = tmp_path / "elsewhere" / "victim.txt"
    path.parent.mkdir()
    path.write_text("not yours\n")
    os.chmod(path, 0o644)
    if os.geteuid() == 0:
        os.chown(path, 65534, 65534)
    return path


def assert_untouched(victim: Path) -> None:
    info = os.stat(victim)
    assert stat.S_IMODE(info.st_mode) == 0o644
    assert info.st_uid == (65534 if os.geteuid() == 0 else os.geteuid())


def test_a_link_write_never_chmods_through_a_planted_journal_symlink(store: Path, victim: Path) -> None:
    """The issue's case: ``state.db-journal`` planted while the gateway runs, pointing at someone else's file."""
    engine = hostedrooms.create_engine(store)
    try:
        peers.upsert_room_link_record(engine, record=link("m0"), max_links=5)
        # The gateway's connections are open before the plant (a connection opened after it meets a "hot journal"
        # and is refused as locked, which also writes nothing): the status write below runs on them.
        assert peers.update_room_link_status(engine, room_id="room-1", member_id="m0", status="up", now=10.0)
        planted = Path(f"{store}-journal")
        planted.symlink_to(victim)
        with pytest.raises(StorageError, match="owner-only.*symlink"):
            peers.upsert_room_link_record(engine, record=link(), max_links=5)
        assert [row["member_id"] for row in peers.list_room_link_records(engine)] == ["m0"]  # nothing written
        with pytest.raises(StorageError, match="owner-only.*symlink"):
            peers.update_room_link_status(engine, room_id="room-1", member_id="m0", status="down", now=11.0)
    finally:
        engine.dispose()
    assert_untouched(victim)
    assert planted.is_symlink()


def test_a_symlinked_store_is_not_chmodded_through_the_link(tmp_path: Path, store: Path) -> None:
    os.chmod(store, 0o644)
    alias = tmp_path / "alias.db"
    alias.symlink_to(store)
    engine = hostedrooms.create_engine(sa.URL.create("sqlite", database=str(alias)))  # the link itself, unresolved
    try:
        with pytest.raises(StorageError, match="symlink"):
            peers.upsert_room_link_record(engine, record=link(), max_links=5)
    finally:
        engine.dispose()
    assert mode(store) == 0o644


def test_a_ledger_refuses_a_symlinked_sidecar(tmp_path: Path, victim: Path) -> None:
    path = tmp_path / "private" / "ledger.db"
    SecurePeerDeliveryLedger(path).close()
    Path(f"{path}-wal").symlink_to(victim)
    with pytest.raises(PermissionError, match="^secure peer delivery ledger is unsafe$"):
        SecurePeerDeliveryLedger(path)
    assert_untouched(victim)


def test_restrict_file_changes_only_our_own_regular_files(tmp_path: Path, victim: Path) -> None:
    mine = tmp_path / "mine"
    mine.write_text("")
    os.chmod(mine, 0o644)
    assert stat.S_IMODE(files.restrict_file(mine).st_mode) == 0o600 and mode(mine) == 0o600
    link_path = tmp_path / "link"
    link_path.symlink_to(victim)
    with pytest.raises(PermissionError, match=f"symlink: {re.escape(str(link_path))}"):
        files.restrict_file(link_path)
    with pytest.raises(PermissionError, match="not a regular file"):
        files.restrict_file(tmp_path)
    with pytest.raises(FileNotFoundError):
        files.restrict_file(tmp_path / "missing")
    if os.geteuid() == 0:
        with pytest.raises(PermissionError, match="owned by another user"):
            files.restrict_file(victim)
    assert_untouched(victim)


def test_restrict_file_refuses_where_it_cannot_avoid_following_links(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    mine = tmp_path / "mine"
    mine.write_text("")
    os.chmod(mine, 0o644)
    monkeypatch.delattr(os, "O_PATH", raising=False)
    with pytest.raises(PermissionError, match="without following links"):
        files.restrict_file(mine)
    assert mode(mine) == 0o644
    os.chmod(mine, 0o600)
    assert stat.S_IMODE(files.restrict_file(mine).st_mode) == 0o600  # nothing to change: no refusal


def test_create_private_file_never_follows_a_dangling_symlink(tmp_path: Path) -> None:
    fresh = tmp_path / "fresh.db"
    previous = os.umask(0o277)  # a umask that would leave the file unwritable
    try:
        assert files.create_private_file(fresh) is True
    finally:
        os.umask(previous)
    assert mode(fresh) == 0o600 and files.create_private_file(fresh) is False
    dangling = tmp_path / "dangling.db"
    dangling.symlink_to(tmp_path / "target.db")
    assert files.create_private_file(dangling) is False
    assert not (tmp_path / "target.db").exists()


# --- shared directories are never changed ----------------------------------------------------------------


@pytest.mark.parametrize("shared_mode", [0o1777, 0o777, 0o770, 0o1755])
def test_a_ledger_in_a_shared_directory_is_refused_and_the_directory_kept(tmp_path: Path, shared_mode: int) -> None:
    shared = tmp_path / "shared"
    shared.mkdir()
    os.chmod(shared, shared_mode)
    with pytest.raises(PermissionError, match=f"shared .*: {re.escape(str(shared))};"):
        SecurePeerDeliveryLedger(shared / "ledger.db")
    assert mode(shared) == shared_mode
    assert not (shared / "ledger.db").exists()


def test_a_native_ledger_on_a_store_in_a_shared_directory_is_refused(tmp_path: Path) -> None:
    shared = tmp_path / "shared"
    shared.mkdir()
    os.chmod(shared, 0o1777)
    engine = hostedrooms.create_engine(shared / "state.db")
    try:
        migrate.upgrade(engine)
        with pytest.raises(PermissionError, match=f"shared .*: {re.escape(str(shared))};"):
            DeliveryLedger(engine)
    finally:
        engine.dispose()
    assert mode(shared) == 0o1777


def test_a_directory_of_our_own_becomes_private(tmp_path: Path) -> None:
    own = tmp_path / "own"
    own.mkdir()
    os.chmod(own, 0o755)
    assert ensure_private_directory(own) == own and mode(own) == 0o700
    nested = tmp_path / "a" / "b"
    assert ensure_private_directory(nested) == nested and mode(nested) == 0o700


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to give a directory away")
def test_a_directory_owned_by_someone_else_is_refused(tmp_path: Path) -> None:
    foreign = tmp_path / "foreign"
    foreign.mkdir()
    os.chmod(foreign, 0o755)
    os.chown(foreign, 65534, 65534)
    with pytest.raises(PermissionError, match=f"owned by another user: {re.escape(str(foreign))}"):
        ensure_private_directory(foreign)
    assert mode(foreign) == 0o755

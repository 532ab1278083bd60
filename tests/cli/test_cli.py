"""The hostedrooms console script: one clear line and a non-zero exit on errors, tables and logs otherwise."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from factories import account_raw_bytes
from factories import run_cli as _run
from waits import readable

from hostedrooms import UnitOfWork, migrate
from hostedrooms.cli import main
from hostedrooms.db import create_engine
from hostedrooms.models import events, rooms
from hostedrooms.writelock import LOCK_SUFFIX


def test_upgrade_current_and_check(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    url = str(tmp_path / "state.db")
    assert _run(capsys, "check", "--url", url)[0] == 1
    code, out, _ = _run(capsys, "upgrade", "--url", url)
    assert code == 0 and migrate.head_revision() in out
    code, out, _ = _run(capsys, "current", "--url", url)
    assert code == 0 and out.strip() == f"{migrate.head_revision()} (head)"
    code, out, _ = _run(capsys, "check", "--url", url)
    assert code == 0 and "at head" in out


def test_url_defaults_to_the_environment(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                         monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HOSTEDROOMS_DATABASE_URL", str(tmp_path / "env.db"))
    assert _run(capsys, "upgrade")[0] == 0
    assert (tmp_path / "env.db").is_file()


def _seed(target: str) -> None:
    engine = create_engine(target)
    with UnitOfWork(engine) as uow:
        uow.execute(sa.insert(rooms).values(
            room_id="r1", name="Röom", members_json="[]", authority_gateway_id="install:a", authority_epoch=1,
            next_seq=3, event_bytes=2 * len("e1message.user" + '{"id":"u","kind":"user"}' + '{"text":"hi"}'),
            created_at=1.0, updated_at=1.0))
        uow.execute(sa.insert(events), [
            {"room_id": "r1", "seq": seq, "event_id": f"e{seq}", "kind": "message.user",
             "actor_json": '{"id":"u","kind":"user"}', "authority_epoch": 1, "payload_json": '{"text":"hi"}',
             "created_at": 1.0} for seq in (1, 2)])
        account_raw_bytes(uow.connection, 2 * len("e1message.user" + '{"id":"u","kind":"user"}' + '{"text":"hi"}'))
        uow.commit()
    engine.dispose()


def test_inspection_commands(target: str, capsys: pytest.CaptureFixture[str]) -> None:
    _seed(target)
    code, out, _ = _run(capsys, "rooms", "--url", target)
    assert code == 0 and "r1" in out and "Röom" in out and "install:a" in out
    code, out, _ = _run(capsys, "log", "r1", "--url", target)
    assert code == 0 and len(out.splitlines()) == 2 and "message.user" in out
    code, out, _ = _run(capsys, "log", "r1", "--since", "1", "--json", "--url", target)
    assert code == 0 and '"seq": 2' in out and len(out.splitlines()) == 1
    code, out, _ = _run(capsys, "replicas", "--url", target)
    assert code == 0 and "(none)" in out
    code, out, _ = _run(capsys, "deliveries", "--state", "queued", "--url", target)
    assert code == 0 and "(none)" in out
    code, out, _ = _run(capsys, "verify", "--url", target)
    assert code == 0 and "verify: clean" in out


def test_verify_exits_non_zero_on_violations(target: str, capsys: pytest.CaptureFixture[str]) -> None:
    _seed(target)
    engine = create_engine(target)
    with UnitOfWork(engine) as uow:
        uow.execute(sa.update(rooms).values(event_bytes=1))
        uow.commit()
    engine.dispose()
    code, out, _ = _run(capsys, "verify", "--url", target)
    assert code == 1 and "event_bytes" in out


@pytest.mark.parametrize(("argv", "message"), [
    (["rooms", "--url", "mysql://u:secret@h/db"], "unsupported database dialect"),
    (["log", "nope"], "hosted room not found"),
    (["rooms"], "does not exist"),
    (["rooms", "--url", "empty.db"], "no hostedrooms schema"),
    (["upgrade", "not-a-revision"], "not-a-revision"),
])
def test_errors_are_one_line(argv: list[str], message: str, tmp_path: Path, capsys: pytest.CaptureFixture[str],
                             monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    if argv[0] == "log":
        migrate.upgrade(tmp_path / "state.db")
    (tmp_path / "empty.db").touch()  # an existing file that was never migrated
    code, _out, err = _run(capsys, *argv)
    assert code == 1
    assert err.startswith("hostedrooms: error: ") and message in err and err.count("\n") == 1
    assert "secret" not in err


def test_console_script_prints_no_traceback(tmp_path: Path) -> None:
    (tmp_path / "x.db").touch()
    result = subprocess.run([sys.executable, "-m", "hostedrooms.cli", "rooms", "--url", str(tmp_path / "x.db")],
                            capture_output=True, text=True, check=False, timeout=120)
    assert result.returncode == 1
    assert "Traceback" not in result.stderr and "no hostedrooms schema" in result.stderr


# --- the CLI never creates what it was asked to read ---------------------------------------------------------

READ_COMMANDS = [["current"], ["check"], ["rooms"], ["log", "r1"], ["replicas"], ["deliveries"], ["verify"]]


def _tree(root: Path) -> list[str]:
    return sorted(str(path.relative_to(root)) for path in root.rglob("*"))


@pytest.mark.parametrize("command", READ_COMMANDS, ids=lambda argv: argv[0])
@pytest.mark.parametrize("where", ["typo.db", "missing/folder/typo.db"])
def test_read_commands_refuse_a_missing_sqlite_file(command: list[str], where: str, tmp_path: Path,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    before = _tree(tmp_path)
    code, out, err = _run(capsys, *command, "--url", str(tmp_path / where))
    assert code == 1 and out == ""
    assert err == f"hostedrooms: error: hosted room store {tmp_path / where} does not exist (no SQLite file there)\n"
    assert _tree(tmp_path) == before  # no file, no -wal/-shm, no folder


@pytest.mark.parametrize("command", READ_COMMANDS, ids=lambda argv: argv[0])
def test_read_commands_refuse_the_default_database_when_it_is_missing(
        command: list[str], tmp_path: Path, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("HOSTEDROOMS_DATABASE_URL", raising=False)
    code, _out, err = _run(capsys, *command)
    assert code == 1 and "state.db does not exist" in err and err.count("\n") == 1
    assert _tree(tmp_path) == []


@pytest.mark.parametrize("command", [*READ_COMMANDS, ["upgrade"]], ids=lambda argv: argv[0])
def test_a_directory_is_refused_as_a_directory(command: list[str], tmp_path: Path,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    folder = tmp_path / "data"
    folder.mkdir()
    code, _out, err = _run(capsys, *command, "--url", str(folder))
    assert code == 1
    assert err == f"hostedrooms: error: hosted room store {folder} is a directory, not a SQLite file\n"
    assert _tree(tmp_path) == ["data"]


def test_upgrade_creates_the_file_and_its_folders(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    target = tmp_path / "new" / "folder" / "state.db"
    code, _out, _err = _run(capsys, "upgrade", "--url", str(target))
    assert code == 0 and target.is_file()
    for command in READ_COMMANDS[:3]:  # and the read commands then open it
        assert _run(capsys, *command, "--url", str(target))[0] == 0


def test_console_script_current_on_a_typo_leaves_nothing_behind(tmp_path: Path) -> None:
    result = subprocess.run([sys.executable, "-m", "hostedrooms.cli", "current", "--url", "typo.db"],
                            capture_output=True, text=True, check=False, cwd=tmp_path, timeout=120)
    assert result.returncode == 1 and result.stdout == ""
    assert result.stderr == f"hostedrooms: error: hosted room store {tmp_path / 'typo.db'} does not exist " \
                            "(no SQLite file there)\n"
    assert _tree(tmp_path) == []


def test_verify_api_refuses_a_missing_path(tmp_path: Path) -> None:
    from hostedrooms import StoreMissingError, verify

    with pytest.raises(StoreMissingError, match="does not exist"):
        verify(tmp_path / "sub" / "typo.db")
    with pytest.raises(StoreMissingError, match="does not exist"):
        verify(f"sqlite:///{tmp_path / 'typo.db'}")
    assert _tree(tmp_path) == []


def test_an_existing_only_engine_never_recreates_a_file_removed_after_the_check(tmp_path: Path) -> None:
    from hostedrooms import StoreConfigurationError

    path = tmp_path / "state.db"
    migrate.upgrade(path)
    engine = create_engine(path, create=False)
    try:
        for suffix in ("", "-wal", "-shm", LOCK_SUFFIX):  # the migration wrote: it left the write lock file too
            Path(f"{path}{suffix}").unlink(missing_ok=True)
        with pytest.raises(StoreConfigurationError, match="unable to open"), UnitOfWork(engine, write=False):
            pass
    finally:
        engine.dispose()
    assert _tree(tmp_path) == []


def test_the_library_still_creates_on_first_use(tmp_path: Path) -> None:
    from hostedrooms.compat import hosted_rooms

    target = tmp_path / "lib" / "state.db"
    assert hosted_rooms.list_rooms(str(target)) == []  # the facade creates and migrates, like the reference
    assert target.is_file()


def test_progress_only_on_a_terminal() -> None:
    import io

    from hostedrooms.cli import Progress

    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    terminal, pipe = Terminal(), io.StringIO()
    for stream in (terminal, pipe):
        progress = Progress(stream)
        progress("verifying room_seqs ...")
        progress.done()
    assert "verifying room_seqs" in terminal.getvalue()
    assert pipe.getvalue() == ""


def test_long_commands_stay_quiet_when_piped(tmp_path: Path) -> None:
    target = str(tmp_path / "quiet.db")
    for command in (["upgrade"], ["verify"]):
        result = subprocess.run([sys.executable, "-m", "hostedrooms.cli", *command, "--url", target],
                                capture_output=True, text=True, check=False, timeout=120)
        assert result.returncode == 0, result.stderr
        assert result.stderr == ""


def _read_lines(fd: int, count: int, *, timeout: float) -> list[str]:
    """``count`` lines from a child's pipe, or fewer if they do not arrive in time (never hangs the run)."""
    import os
    import time

    data, deadline = b"", time.monotonic() + timeout
    while data.count(b"\n") < count and time.monotonic() < deadline:
        ready = readable(fd, deadline - time.monotonic())
        if ready:
            chunk = os.read(fd, 65536)
            if not chunk:
                break
            data += chunk
    return data.decode().splitlines()[:count]


def test_log_follow_prints_new_events_as_they_arrive(tmp_path: Path) -> None:
    import time

    from hostedrooms import rooms

    target = str(tmp_path / "follow.db")
    migrate.upgrade(target)
    engine = create_engine(target)
    rooms.create_room(engine, room_id="r1", name="R", members=[], authority_gateway_id="install:a")
    follower = subprocess.Popen(
        [sys.executable, "-m", "hostedrooms.cli", "log", "r1", "--follow", "--json", "--interval", "0.1",
         "--url", target], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        time.sleep(0.5)  # the follower is polling an empty log
        for index in (1, 2):
            rooms.append_event(engine, room_id="r1", event_id=f"e{index}", kind="message.user",
                               actor={"kind": "user", "id": "u"}, payload={"n": index},
                               authority_gateway_id="install:a", authority_epoch=1)
        assert follower.stdout is not None
        lines = _read_lines(follower.stdout.fileno(), 2, timeout=30)
        rooms.disband_room(engine, room_id="r1", expected_gateway_id="install:a", expected_epoch=1)
        lines += _read_lines(follower.stdout.fileno(), 1, timeout=30)
        assert follower.wait(timeout=30) == 0  # the log ended with room.disbanded: so does --follow
    finally:
        follower.kill()
        follower.wait(timeout=10)
        engine.dispose()
    assert len(lines) == 3 and '"seq": 1' in lines[0] and '"seq": 2' in lines[1], lines
    assert '"kind": "room.disbanded"' in lines[2]


def _reader(target: str, ready: Any, stop: Any, results: Any) -> None:
    """Run ``current`` on ``target`` until told to stop; report each outcome (exit code, stdout, stderr)."""
    import contextlib
    import io

    seen = []
    while not stop.is_set() or len(seen) < 5:
        out, err = io.StringIO(), io.StringIO()
        with contextlib.redirect_stderr(err):
            code = main(["current", "--url", target], out=out)
        seen.append((code, out.getvalue(), err.getvalue()))
        ready.set()
    results.put(seen)


def test_concurrent_readers_never_create_or_disturb_a_database_being_created(tmp_path: Path) -> None:
    import multiprocessing

    target = str(tmp_path / "state.db")
    context = multiprocessing.get_context("spawn")
    results, stop = context.Queue(), context.Event()
    ready = [context.Event() for _ in range(3)]
    readers = [context.Process(target=_reader, args=(target, flag, stop, results)) for flag in ready]
    for reader in readers:
        reader.start()
    try:
        for flag in ready:
            assert flag.wait(timeout=120)  # every reader is polling the missing file
        migrate.upgrade(target)  # this process creates and migrates the file while they poll
    finally:
        stop.set()
    outcomes = [outcome for _ in readers for outcome in results.get(timeout=300)]
    for reader in readers:
        reader.join(timeout=60)
        assert reader.exitcode == 0
    head = migrate.head_revision()
    for code, out, err in outcomes:
        assert (code, out, err) in {(0, f"{head} (head)\n", ""), (0, "(none)\n", "")} or (
            code == 1 and out == "" and err.count("\n") == 1
            and ("does not exist" in err or "is unavailable" in err)), (code, out, err)
    assert any("does not exist" in err for _, _, err in outcomes)  # they ran before the file existed ...
    assert any(out == f"{head} (head)\n" for _, out, _ in outcomes)  # ... and after it was migrated
    assert main(["verify", "--url", target]) == 0
    assert {path.name for path in tmp_path.iterdir()} <= {
        "state.db", "state.db-wal", "state.db-shm", f"state.db{LOCK_SUFFIX}"}
    print("reader outcomes:", sorted({(code, (out or err).strip()[:40]) for code, out, err in outcomes}),
          len(outcomes))

"""`hostedrooms replicate` and `hostedrooms failover`: what they print (a summary line, a line per refused,
demoted or promoted room, peer text escaped; progress only on a terminal), their exit codes and errors."""

from __future__ import annotations

import io
import signal
import sys
import threading
from typing import Any

import pytest
from sqlalchemy import Engine
from standby_support import GATEWAY_A, GATEWAY_B, host, say

from hostedrooms import rooms
from hostedrooms.cli import main
from hostedrooms.cli.standby import _stop_on_signals
from hostedrooms.errors import HostedRoomError
from hostedrooms.standby import EnginePageSource, PageServer

pytest_plugins = ["standby_fixtures"]


def _run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_replicate_once_prints_one_summary_line(engine: Engine, target: str, standby_target: str,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    host(engine, "r1", 3)
    host(engine, "r2", 700)
    code, out, err = _run(capsys, "replicate", "--from", target, "--to", standby_target)
    assert code == 0 and err == ""
    assert out.startswith("replicate: 2 rooms (2 caught-up); 703 events in 3 pages; lag 0 events; ")
    assert out.count("\n") == 1


def test_replicate_can_remove_disbanded_replicas(engine: Engine, target: str, standby_target: str,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    host(engine, "r1", 3)
    host(engine, "r2", 2)
    assert _run(capsys, "replicate", "--from", target, "--to", standby_target)[0] == 0
    rooms.disband_room(engine, room_id="r2", expected_gateway_id=GATEWAY_A, expected_epoch=1)
    code, out, _ = _run(capsys, "replicate", "--from", target, "--to", standby_target)
    assert code == 0 and "(1 caught-up, 1 disbanded)" in out and "removed" not in out  # kept by default
    code, out, _ = _run(capsys, "replicate", "--from", target, "--to", standby_target,
                        "--prune-disbanded-after", "0")
    assert code == 0 and out.rstrip().endswith("; 1 disbanded replica removed")
    code, out, _ = _run(capsys, "replicas", "--url", standby_target)
    assert "r1" in out and "r2" not in out
    with pytest.raises(SystemExit) as refused:
        main(["replicate", "--from", target, "--to", standby_target, "--prune-disbanded-after", "-5"])
    assert refused.value.code == 2 and "--prune-disbanded-after" in capsys.readouterr().err


def test_replicate_shows_progress_on_a_terminal(engine: Engine, target: str, standby_target: str,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    host(engine, "r1", 600)
    terminal, out = Terminal(), io.StringIO()
    monkeypatch.setattr(sys, "stderr", terminal)
    assert main(["replicate", "--from", target, "--to", standby_target], out=out) == 0
    assert "replicating from " in terminal.getvalue() and "600 events, lag" in terminal.getvalue()
    assert out.getvalue().startswith("replicate: 1 room (1 caught-up); 600 events")


def test_replicate_reports_refused_and_demoted_rooms_with_peer_text_escaped(
        engine: Engine, standby: Engine, target: str, standby_target: str,
        capsys: pytest.CaptureFixture[str]) -> None:
    host(engine, "fine", 2)
    host(engine, "odd", 2)

    class Hostile(EnginePageSource):
        def read_events(self, room_id: str, *, since_seq: int, limit: int) -> dict[str, Any]:
            if room_id == "odd":
                raise HostedRoomError("\x1b[2J\x1b[31mall is well\r\nfine caught-up")
            return super().read_events(room_id, since_seq=since_seq, limit=limit)

    with PageServer(Hostile(engine)) as server:
        code, out, _ = _run(capsys, "replicate", "--from", server.url, "--to", standby_target)
    assert code == 1
    lines = out.splitlines()
    assert lines[0].startswith("refused odd: the source refused the request (400): \\u001b[2J\\u001b[31mall is well"
                               "\\u000d\\u000afine caught-up (retrying in 1 s)")
    assert lines[1].startswith("replicate: 2 rooms (1 caught-up, 1 refused)") and len(lines) == 2
    # The returning authority's replicate demotes, and says so per room.
    host(standby, "mine", 1, gateway=GATEWAY_B)
    code, out, _ = _run(capsys, "failover", "--from-gateway", GATEWAY_A, "--to", standby_target, "--gateway",
                        GATEWAY_B)
    assert code == 0 and out.splitlines()[0].startswith("promoted      fine  epoch 1 -> 2, claim at seq 3")
    code, out, _ = _run(capsys, "replicate", "--from", standby_target, "--to", target, "--gateway", GATEWAY_A)
    assert code == 0 and out.splitlines()[0] == (
        f"demoted fine: the source holds epoch 2 for {GATEWAY_B}; this gateway's epoch 1 is fenced")
    assert out.splitlines()[1].startswith("replicate: 2 rooms (1 caught-up, 1 demoted)")


def test_failover_dry_run_then_for_real(engine: Engine, target: str, standby_target: str,
                                        capsys: pytest.CaptureFixture[str]) -> None:
    host(engine, "done", 2)
    host(engine, "long", 30)
    assert main(["replicate", "--from", target, "--to", standby_target]) == 0
    say(engine, "done", 1)
    say(engine, "long", 30)
    argv = ["failover", "--from-gateway", GATEWAY_A, "--to", standby_target, "--gateway", GATEWAY_B]
    capsys.readouterr()
    code, out, _ = _run(capsys, *argv, "--dry-run")
    assert code == 0 and out.splitlines() == [
        "would promote done  epoch 1 -> 2 (seq 2)", "would promote long  epoch 1 -> 2 (seq 30)",
        f"failover: would promote 2 of 2 rooms of {GATEWAY_A} on {GATEWAY_B}"]
    code, out, err = _run(capsys, *argv, "--dry-run", "--catch-up-from", target)
    assert code == 1 and "--dry-run writes nothing" in err
    code, out, _ = _run(capsys, *argv, "--catch-up-from", target)
    assert code == 0 and out.splitlines() == [
        *out.splitlines()[:2], "promoted      done  epoch 1 -> 2, claim at seq 4",
        "promoted      long  epoch 1 -> 2, claim at seq 61",
        f"failover: promoted 2 of 2 rooms of {GATEWAY_A} on {GATEWAY_B}"]
    assert out.startswith(f"fenced: 2 rooms of {GATEWAY_A} in ")
    assert out.splitlines()[1].startswith("catch-up: 2 rooms (2 caught-up); 31 events in 2 pages")


def test_failover_exits_1_when_a_room_is_left_behind(engine: Engine, standby: Engine, target: str,
                                                     standby_target: str, capsys: pytest.CaptureFixture[str]) -> None:
    from hostedrooms.standby import Replicator

    host(engine, "long", 30)
    Replicator(EnginePageSource(engine), standby, page_limit=10, max_pages_per_room=1).sync_once()
    code, out, _ = _run(capsys, "failover", "--from-gateway", GATEWAY_A, "--to", standby_target, "--gateway",
                        GATEWAY_B)
    assert code == 1 and out.splitlines()[0] == (
        "not promoted  long  not-caught-up: the replica holds seq 10 of the 30 the authority reported")


@pytest.mark.parametrize("backend", ["sqlite"], indirect=True)  # argument handling: the same on both backends
@pytest.mark.parametrize(("argv", "message"), [
    (["replicate", "--from", "{missing}", "--to", "{standby}"], "does not exist"),
    (["replicate", "--from", "{source}", "--to", "{missing}"], "does not exist"),
    (["replicate", "--from", "{source}", "--to", "{standby}", "--interval", "nan", "--follow"], "--interval"),
    (["replicate", "--from", "http://u:p@h/x", "--to", "{standby}"], "must not carry credentials"),
    (["failover", "--from-gateway", GATEWAY_A, "--to", "{standby}"], "identity is unavailable"),
    (["failover", "--from-gateway", GATEWAY_B, "--to", "{standby}", "--gateway", GATEWAY_B], "is this gateway"),
    (["failover", "--from-gateway", GATEWAY_A, "--to", "{standby}", "--gateway", GATEWAY_B, "--catch-up-from",
      "{missing}"], "does not exist"),
])
def test_errors_are_one_line(argv: list[str], message: str, target: str, standby_target: str, backend: str,
                             tmp_path: Any, capsys: pytest.CaptureFixture[str],
                             monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("HOSTEDROOMS_INSTALL_ID", raising=False)
    places = {"source": target, "standby": standby_target, "missing": str(tmp_path / "missing.db")}
    code, out, err = _run(capsys, *[part.format(**places) for part in argv])
    assert code == 1 and out == ""
    assert err.startswith("hostedrooms: error: ") and message in err and err.count("\n") == 1
    assert not (tmp_path / "missing.db").exists()


# Regression: `replicate --follow` once ignored a SIGTERM for good (the story test's follower never exited). Its
# handler called threading.Event.set(), which takes the event's lock; a signal handled while the main thread held
# that lock inside Event.wait (the follower waits every few milliseconds) waited for itself forever.
def test_the_stop_handler_never_waits_for_a_lock_the_main_thread_may_hold() -> None:
    with _stop_on_signals() as stop:
        handler = signal.getsignal(signal.SIGTERM)
        assert callable(handler)
        handled = threading.Event()

        def signal_lands_inside_wait() -> None:
            with stop._cond:  # type: ignore[attr-defined]  # what Event.wait holds around its sleep
                handler(signal.SIGTERM, None)
            handled.set()

        threading.Thread(target=signal_lands_inside_wait, daemon=True).start()
        assert handled.wait(10), "the SIGTERM handler blocked on the stop event's lock"
        assert stop.is_set() and stop.wait(0)
    assert signal.getsignal(signal.SIGTERM) is not handler  # the previous handler is back

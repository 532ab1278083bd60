"""`hostedrooms replicate --follow --metrics HOST:PORT` (issue 29, item 3): Prometheus text of every room's lag and
the passes, scraped while the command runs with appends in flight; the address checked before anything opens."""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from standby_support import GATEWAY_A, host, say
from waits import join

from hostedrooms import create_engine, replicas
from hostedrooms.cli import main
from hostedrooms.errors import HostedRoomError
from hostedrooms.standby import PassReport, RoomReport

parser = pytest.importorskip("prometheus_client.parser")
from hostedrooms.standby.metrics import StandbyMetrics, parse_address  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(("text", "expected"), [
    ("127.0.0.1:9464", ("127.0.0.1", 9464)),
    ("localhost:0", ("localhost", 0)),
    ("[::1]:9464", ("::1", 9464)),
    ("metrics.internal.example:65535", ("metrics.internal.example", 65535)),
])
def test_addresses_that_name_where_to_bind(text: str, expected: tuple[str, int]) -> None:
    assert parse_address(text) == expected


@pytest.mark.parametrize("text", [
    "9464", ":9464", "127.0.0.1", "127.0.0.1:", "127.0.0.1:http", "127.0.0.1:65536", "127.0.0.1:-1", "::1:9464",
    "[::1", "[nothing]:9464", "bad host:9464", "host/path:9464", "127.0.0.1:9464\n", "", "x" * 400 + ":1",
    "127.0.0.1:٣٣",
])
def test_other_addresses_are_refused_with_the_expected_form(text: str) -> None:
    with pytest.raises(HostedRoomError, match=r"^--metrics must be HOST:PORT \(e\.g\. 127\.0\.0\.1:9464"):
        parse_address(text)


def test_the_command_checks_the_option_before_opening_anything(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    missing = str(tmp_path / "missing.db")
    assert main(["replicate", "--from", missing, "--to", missing, "--follow", "--metrics", "9464"]) == 1
    assert "--metrics must be HOST:PORT" in capsys.readouterr().err
    assert main(["replicate", "--from", missing, "--to", missing, "--metrics", "127.0.0.1:0"]) == 1
    assert "--metrics needs --follow" in capsys.readouterr().err
    assert not (tmp_path / "missing.db").exists()


def test_a_port_in_use_is_a_clear_error() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(HostedRoomError, match=rf"^--metrics 127\.0\.0\.1:{port}: cannot listen there"):
            StandbyMetrics().serve(f"127.0.0.1:{port}")


def _scrape(url: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    with urllib.request.urlopen(url, timeout=10) as answer:
        text = answer.read().decode()
    return {(sample.name, tuple(sorted(sample.labels.items()))): sample.value
            for family in parser.text_string_to_metric_families(text) for sample in family.samples}


def test_the_lag_seconds_grow_until_a_pass_catches_the_room_up() -> None:
    clock = [10.0]
    metrics = StandbyMetrics(monotonic=lambda: clock[0])
    behind = PassReport(rooms=[RoomReport("r1", "behind", last_seq=2, latest_seq=5),
                               RoomReport("r2", "caught-up", last_seq=3, latest_seq=3)], seconds=0.5)
    metrics.on_pass(behind)
    clock[0] = 12.5
    metrics.on_pass(behind)
    clock[0] = 14.0
    samples = {(s.name, s.labels.get("room")): s.value for family in metrics.registry.collect() for s in family.samples}
    assert samples["hostedrooms_replica_lag_seqs", "r1"] == 3 and samples["hostedrooms_replica_lag_seconds", "r1"] == 4
    assert samples["hostedrooms_replica_lag_seqs", "r2"] == 0 and samples["hostedrooms_replica_lag_seconds", "r2"] == 0
    metrics.on_pass(PassReport(rooms=[RoomReport("r1", "caught-up", last_seq=5, latest_seq=5)], seconds=0.1))
    samples = {(s.name, s.labels.get("room")): s.value for family in metrics.registry.collect() for s in family.samples}
    assert samples["hostedrooms_replica_lag_seconds", "r1"] == 0
    assert ("hostedrooms_replica_lag_seqs", "r2") not in samples  # a complete pass no longer lists it
    assert samples["hostedrooms_standby_passes_total", None] == 3


def _lags(samples: dict[Any, float], name: str) -> dict[str, float]:
    return {dict(labels)["room"]: value for (metric, labels), value in samples.items() if metric == name}


def test_a_running_replicate_serves_the_lag_until_it_is_zero(tmp_path: Path, sqlite_template: Path) -> None:
    source, standby = tmp_path / "authority.db", tmp_path / "standby.db"
    for path in (source, standby):
        path.write_bytes(sqlite_template.read_bytes())
    authority, standby_engine = create_engine(str(source)), create_engine(str(standby))
    host(authority, "r1", 1200)
    host(authority, "r2", 10)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    child = subprocess.Popen(
        [sys.executable, "-m", "hostedrooms.cli", "replicate", "--from", str(source), "--to", str(standby),
         "--follow", "--metrics", "127.0.0.1:0", "--max-pages", "1", "--interval", "0.2"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    writer_done = threading.Event()

    def appends_in_flight() -> None:
        try:
            for _ in range(20):
                say(authority, "r1", 40, gateway=GATEWAY_A)
                say(authority, "r2", 5, gateway=GATEWAY_A)
                time.sleep(0.02)
        finally:
            writer_done.set()

    try:
        assert child.stdout is not None
        first = child.stdout.readline()
        match = re.fullmatch(r"replicate: metrics at (http://127\.0\.0\.1:\d+/metrics)\n", first)
        assert match, (first, child.stderr.read() if child.poll() is not None else "")  # type: ignore[union-attr]
        writer = threading.Thread(target=appends_in_flight)
        writer.start()
        passes_after_writes = None  # a pass that started after the last append has seen every event
        deadline = time.monotonic() + 120  # generous: it must not hang
        while True:
            done = writer_done.is_set()
            samples = _scrape(match.group(1))
            passes = samples.get(("hostedrooms_standby_passes_total", ()), 0)
            if done and passes_after_writes is None:
                passes_after_writes = passes + 1
            lags = _lags(samples, "hostedrooms_replica_lag_seqs")
            if (passes_after_writes is not None and passes > passes_after_writes and set(lags) == {"r1", "r2"}
                    and not any(lags.values())):
                break
            assert time.monotonic() < deadline, f"the lag never reached 0: {lags}"
            time.sleep(0.02)
        join(writer, 60)
        assert _lags(samples, "hostedrooms_replica_lag_seconds") == {"r1": 0.0, "r2": 0.0}
        assert samples["hostedrooms_standby_passes_total", ()] >= 3  # --max-pages 1: 1,200 events took passes
        assert samples["hostedrooms_standby_pass_duration_seconds_count", ()] >= 3
        assert samples["hostedrooms_standby_pass_failures_total", ()] == 0
        stored = {room: replicas.replica_state(standby_engine, room_id=room)["last_seq"] for room in ("r1", "r2")}
        assert stored == {"r1": 2000, "r2": 110}  # every event appended in flight
    finally:
        child.send_signal(signal.SIGTERM)
        out, err = child.communicate(timeout=60)
        authority.dispose()
        standby_engine.dispose()
    assert child.returncode == 0, err
    assert out.splitlines()[-1].startswith("replicate: stopped after ")


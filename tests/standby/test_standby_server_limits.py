"""PageServer bounds slow and idle clients (issue #25 item 4): a connection waiting for a request, a request's
headers however slowly they trickle, and the connections held at once; so a crowd of idle sockets cannot hold the
threads and descriptors a standby needs, and a real replicator pass still completes at once."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Hashable, Iterator, Sequence
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Engine
from standby_support import host, replica_log, room_log
from waits import join

from hostedrooms.errors import HostedRoomError
from hostedrooms.standby import EnginePageSource, HttpPageSource, PageServer, PageSource, Replicator, RoomHead
from hostedrooms.standby.http import (
    DEFAULT_HEADER_TIMEOUT,
    DEFAULT_IDLE_TIMEOUT,
    DEFAULT_MAX_CONNECTIONS,
    DEFAULT_SEND_TIMEOUT,
)
from hostedrooms.standby.replicator import CAUGHT_UP
from hostedrooms.standby.source import RoomInfo

pytest_plugins = ["standby_fixtures"]

CHILD = Path(__file__).resolve().parents[1] / "page_server_child.py"
#: A generous bound that still proves nothing waited for a held connection to let go (the idle timeout is 30 s).
BOUND = 10.0


def _address(url: str) -> tuple[str, int]:
    host_port = url.split("://", 1)[1].split("/", 1)[0]
    name, port = host_port.rsplit(":", 1)
    return name, int(port)


def _open(address: tuple[str, int], count: int, stack: ExitStack, send: bytes = b"") -> list[socket.socket]:
    sockets = []
    for _ in range(count):
        sock = stack.enter_context(socket.create_connection(address, timeout=BOUND))
        if send:
            sock.sendall(send)
        sockets.append(sock)
    return sockets


def _closed_by_server(sock: socket.socket, within: float) -> bool:
    """Whether the server closed ``sock`` within ``within`` seconds (EOF or reset; any answer it sent is read)."""
    sock.settimeout(within)
    try:
        while sock.recv(4096):
            pass
    except TimeoutError:
        return False
    except ConnectionResetError:
        return True
    return True


@pytest.fixture
def child_server(target: str) -> Iterator[str]:
    """The authority's page server in a process of its own with 256 descriptors, like the gateway of the issue."""
    child = subprocess.Popen([sys.executable, str(CHILD), target, "256"], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout is not None
        yield str(json.loads(child.stdout.readline())["url"])
    finally:
        assert child.stdin is not None
        child.stdin.close()
        try:
            child.wait(timeout=BOUND)
        except subprocess.TimeoutExpired:
            child.kill()
            child.wait(timeout=30)


def test_a_standby_is_served_past_250_idle_and_half_sent_connections(engine: Engine, standby: Engine,
                                                                      child_server: str) -> None:
    """The issue's case: 250 connections that sent half a request line (or nothing) to a server with 256
    descriptors; the standby's pass completes within the bound, not after the idle ones give up."""
    for index in range(3):
        host(engine, f"room-{index}", 5 * index)
    address = _address(child_server)
    with ExitStack() as stack:
        _open(address, 125, stack, send=b"GET /rooms HTT")
        _open(address, 125, stack)
        started = time.monotonic()
        source = HttpPageSource(child_server, timeout=BOUND)
        try:
            report = Replicator(source, standby).sync_once()
        finally:
            source.close()
        elapsed = time.monotonic() - started
        assert report.error == "" and {room.status for room in report.rooms} == {CAUGHT_UP}, report.error
        assert elapsed < BOUND
    for index in range(3):
        assert replica_log(standby, f"room-{index}") == room_log(engine, f"room-{index}")


def test_idle_half_sent_and_trickling_connections_are_closed_by_the_server(engine: Engine) -> None:
    with PageServer(EnginePageSource(engine), idle_timeout=0.5, header_timeout=1.0) as server, \
            ExitStack() as stack:
        address = _address(server.url)
        idle = _open(address, 10, stack)
        half = _open(address, 10, stack, send=b"GET /rooms HTTP/1.1\r\nHost: x\r\n")
        trickler = _open(address, 1, stack)[0]
        stop = threading.Event()

        def trickle() -> None:  # a byte every 0.1 s: each read comes well within any per-read timeout
            try:
                for byte in b"GET /rooms HTTP/1.1\r\n" + b"X-Slow: " + b"a" * 10_000:
                    if stop.wait(0.1):
                        return
                    trickler.send(bytes([byte]))
            except OSError:
                return

        thread = threading.Thread(target=trickle, daemon=True)
        thread.start()
        try:
            started = time.monotonic()
            assert all(_closed_by_server(sock, BOUND) for sock in idle + half)
            assert _closed_by_server(trickler, BOUND)
            assert time.monotonic() - started < BOUND
        finally:
            stop.set()
            join(thread, 30)
        # A kept-alive connection is closed once idle too, after its answers.
        with socket.create_connection(address, timeout=BOUND) as sock:
            sock.sendall(b"GET /rooms HTTP/1.1\r\nHost: x\r\n\r\n")
            assert sock.recv(65536).startswith(b"HTTP/1.1 200")
            assert _closed_by_server(sock, BOUND)


class _Held:
    """A source whose listing waits until released (a request being answered, as long as the test wants)."""

    def __init__(self, source: PageSource) -> None:
        self.source = source
        self.release = threading.Event()
        self.entered = threading.Semaphore(0)

    def list_rooms(self, *, after: str | None = None, limit: int = 500) -> Sequence[RoomHead]:
        self.entered.release()
        self.release.wait(BOUND)
        return self.source.list_rooms(after=after, limit=limit)

    def room_info(self, room_id: str) -> RoomInfo:
        return self.source.room_info(room_id)

    def read_events(self, room_id: str, *, since_seq: int, limit: int) -> dict[str, Any]:
        return self.source.read_events(room_id, since_seq=since_seq, limit=limit)

    def change_token(self) -> Hashable | None:
        return None

    def describe(self) -> str:
        return "held"

    def close(self) -> None:
        self.source.close()


def test_connections_are_capped_the_longest_waiting_makes_room_and_busy_ones_get_503(engine: Engine) -> None:
    host(engine, "r", 1)
    held = _Held(EnginePageSource(engine))
    with PageServer(held, max_connections=4) as server, ExitStack() as stack:
        address = _address(server.url)
        idle = _open(address, 10, stack)
        deadline = time.monotonic() + BOUND
        while not all(_closed_by_server(sock, 0.01) for sock in idle[:6]) and time.monotonic() < deadline:
            pass
        assert server.connections <= 4
        assert all(_closed_by_server(sock, BOUND) for sock in idle[:6])  # the oldest made room for the newest
        # Four requests being answered hold every slot: a fifth connection is answered 503 at once.
        busy = _open(address, 4, stack, send=b"GET /rooms HTTP/1.1\r\nHost: x\r\n\r\n")
        for _ in busy:
            assert held.entered.acquire(timeout=BOUND)
        assert server.connections == 4
        with socket.create_connection(address, timeout=BOUND) as extra:
            assert extra.recv(65536).startswith(b"HTTP/1.1 503")
            assert _closed_by_server(extra, BOUND)
        held.release.set()
        for sock in busy:
            assert sock.recv(65536).startswith(b"HTTP/1.1 200")
        # Answered, they wait again: a new standby takes the place of one and is served.
        held.entered = threading.Semaphore(1000)
        assert [head.room_id for head in HttpPageSource(server.url, timeout=BOUND).list_rooms()] == ["r"]


def test_a_request_with_a_body_is_refused_and_closed(engine: Engine) -> None:
    with PageServer(EnginePageSource(engine)) as server, \
            socket.create_connection(_address(server.url), timeout=BOUND) as sock:
        sock.sendall(b"GET /rooms HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\n\r\nGET")
        assert sock.recv(65536).startswith(b"HTTP/1.1 400")
        assert _closed_by_server(sock, BOUND)


def test_the_limits_are_documented_defaults_and_checked(engine: Engine) -> None:
    assert (DEFAULT_MAX_CONNECTIONS, DEFAULT_IDLE_TIMEOUT, DEFAULT_HEADER_TIMEOUT, DEFAULT_SEND_TIMEOUT) == (
        64, 30.0, 10.0, 60.0)
    source = EnginePageSource(engine)
    for options in ({"max_connections": 0}, {"max_connections": True}, {"idle_timeout": 0},
                    {"header_timeout": float("nan")}, {"send_timeout": "5"}):
        with pytest.raises(HostedRoomError):
            PageServer(source, **options)  # type: ignore[arg-type]

"""Pages over HTTP: a real local server (the standard library's, in a thread) serves the engine source's answers,
and the standby's client replicates from it exactly as from the engine. The client trusts nothing: hostile and
broken servers (oversized, slow, not JSON, deep, malformed, out of order, redirecting, refusing) are refused with
bounded time and memory, and nothing they send is stored."""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
from sqlalchemy import Engine
from standby_support import GATEWAY_A, host, replica_ids, replica_log, room_log, say

from hostedrooms import verify
from hostedrooms.errors import (
    HostedRoomError,
    RoomHistoryExpiredError,
    RoomNotFoundError,
    StorageError,
    StoreUnavailableError,
)
from hostedrooms.standby import (
    EnginePageSource,
    HttpPageSource,
    PageServer,
    Replicator,
    SourceProtocolError,
    SourceUnavailableError,
    answer,
)
from hostedrooms.standby.replicator import CAUGHT_UP, REFUSED

pytest_plugins = ["standby_fixtures"]


# --- the real thing --------------------------------------------------------------------------------------------


def test_replication_over_http_equals_replication_from_the_engine(engine: Engine, standby: Engine) -> None:
    for index, size in enumerate((0, 3, 1201)):
        host(engine, f"room-{index}", size, name=f"Röom {index} ✓")
    with PageServer(EnginePageSource(engine), prefix="/standby") as server:
        source = HttpPageSource(server.url)
        try:
            report = Replicator(source, standby, page_limit=500).sync_once()
            assert {room.status for room in report.rooms} == {CAUGHT_UP} and report.events == 1204
            token = source.change_token()
            assert token is not None and source.change_token() == token
            say(engine, "room-1", 2)
            assert source.change_token() != token
            assert Replicator(source, standby).sync_once().events == 2
        finally:
            source.close()
    for index in range(3):
        assert replica_log(standby, f"room-{index}") == room_log(engine, f"room-{index}")
    assert verify(standby) == []


def test_the_server_can_require_a_token(engine: Engine) -> None:
    host(engine, "r", 1)
    with PageServer(EnginePageSource(engine),
                    authorize=lambda headers: headers.get("Authorization") == "Bearer s3cret") as server:
        with pytest.raises(SourceUnavailableError, match="answered 401"):
            HttpPageSource(server.url).list_rooms()
        assert [head.room_id for head in HttpPageSource(server.url, headers={
            "Authorization": "Bearer s3cret"}).list_rooms()] == ["r"]


def test_answer_maps_errors_and_hides_store_details(engine: Engine) -> None:
    host(engine, "r", 2)
    source = EnginePageSource(engine)

    def decoded(target: str) -> tuple[int, dict[str, Any]]:
        status, body = answer(source, target)
        return status, json.loads(body)

    assert decoded("/rooms?limit=1")[1]["rooms"][0]["room_id"] == "r"
    assert decoded("/rooms?after=r")[1] == {"rooms": []}
    assert decoded("/rooms/r")[1]["name"] == "R"
    assert decoded("/rooms/r/events?since_seq=1&limit=5")[1]["events"][0]["seq"] == 2
    assert decoded("/nope")[0] == 404 and decoded("/rooms/r/other")[0] == 404
    assert decoded("/rooms/missing")[1]["error"] == "room_not_found"
    assert decoded("/rooms/r/events?since_seq=9")[1] == {"error": "bad_request",
                                                         "message": "since_seq is ahead of the hosted room log"}
    assert decoded("/rooms/r/events?since_seq=-1")[0] == 400
    assert decoded("/rooms/r/events?since_seq=1e3")[0] == 400
    assert decoded("/rooms?" + "&".join(f"x{n}=1" for n in range(20)))[0] == 400

    class Failing(EnginePageSource):
        error: Exception

        def list_rooms(self, *, after: str | None = None, limit: int = 500) -> Any:
            raise self.error

    failing = Failing(engine)
    failing.error = StoreUnavailableError("store postgresql://gw:***@db.internal/a is unavailable")
    assert answer(failing, "/rooms") == (503, json.dumps(
        {"error": "unavailable", "message": "the authority's store is unavailable; retry later"},
        separators=(",", ":")).encode())
    failing.error = StorageError("store postgresql://gw:***@db.internal/a failed: disk I/O error")
    status, body = answer(failing, "/rooms")
    assert status == 500 and b"db.internal" not in body
    failing.error = RoomHistoryExpiredError("expired")
    assert decoded.__call__  # (keep mypy quiet about the closure)
    assert answer(failing, "/rooms")[0] == 404


# --- hostile and broken servers --------------------------------------------------------------------------------


Script = Callable[[BaseHTTPRequestHandler], None]


class Scripted(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self) -> None:
        self.routes: dict[str, Script] = {}
        self.hits: list[str] = []
        super().__init__(("127.0.0.1", 0), _ScriptedHandler)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"


class _ScriptedHandler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: Scripted

    def do_GET(self) -> None:
        path = self.path.split("?")[0]
        self.server.hits.append(self.path)
        route = self.server.routes.get(path)
        if route is None:
            reply(404, {"error": "not_found"})(self)
        else:
            route(self)

    def log_message(self, format: str, *args: Any) -> None:
        pass


def raw(status: int, body: bytes, content_type: str = "application/json", *, length: int | None = None,
        extra: dict[str, str] | None = None, close_after: bool = False) -> Script:
    def send(handler: BaseHTTPRequestHandler) -> None:
        handler.send_response(status)
        handler.send_header("Content-Type", content_type)
        if length is not None or not close_after:
            handler.send_header("Content-Length", str(len(body) if length is None else length))
        for key, value in (extra or {}).items():
            handler.send_header(key, value)
        handler.end_headers()
        handler.wfile.write(body)
        if close_after:
            handler.close_connection = True
            handler.wfile.flush()
            handler.connection.shutdown(socket.SHUT_RDWR)

    return send


def reply(status: int, value: Any, **options: Any) -> Script:
    return raw(status, json.dumps(value).encode(), **options)


@pytest.fixture
def scripted() -> Iterator[Scripted]:
    server = Scripted()
    thread = threading.Thread(target=server.serve_forever, args=(0.02,), daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()


HEAD = {"room_id": "r", "authority_gateway_id": GATEWAY_A, "authority_epoch": 1, "latest_seq": 0, "disbanded": False}


@pytest.mark.parametrize(("body", "content_type", "match"), [
    (b"<html>hi</html>", "text/html", "not JSON"),
    (b"{not json", "application/json", "not valid JSON"),
    (b'{"rooms": [], "x": NaN}', "application/json", "not valid JSON"),
    (b'{"rooms": [], "x": "\xff\xfe"}', "application/json", "not valid JSON"),
    (b'{"x": ' + b"[" * 100_000 + b"]" * 100_000 + b"}", "application/json", "nests too deeply"),
    (b'{"x": ' + b"[" * 73 + b"]" * 73 + b"}", "application/json", "nests too deeply"),
    (b"[1, 2]", "application/json", "not a JSON object"),
    (json.dumps({"rooms": "all"}).encode(), "application/json", "malformed"),
    (json.dumps({"rooms": [HEAD, HEAD]}).encode(), "application/json", "out of order"),
    (json.dumps({"rooms": [{**HEAD, "room_id": "b"}, {**HEAD, "room_id": "a"}]}).encode(), "application/json",
     "out of order"),
    (json.dumps({"rooms": [{**HEAD, "room_id": "../etc"}]}).encode(), "application/json", "invalid room_id"),
    (json.dumps({"rooms": [{**HEAD, "room_id": "r" * 129}]}).encode(), "application/json", "invalid room_id"),
    (json.dumps({"rooms": [{**HEAD, "room_id": " r"}]}).encode(), "application/json", "invalid room_id"),
    (json.dumps({"rooms": [{**HEAD, "room_id": 7}]}).encode(), "application/json", "room_id must be a string"),
    (json.dumps({"rooms": [HEAD] * 3}).encode(), "application/json", "malformed"),  # more than the limit (2)
])
def test_a_bad_listing_is_refused(scripted: Scripted, body: bytes, content_type: str, match: str) -> None:
    scripted.routes["/rooms"] = raw(200, body, content_type)
    with pytest.raises(SourceProtocolError, match=match):
        HttpPageSource(scripted.url).list_rooms(limit=2)


def test_a_listing_must_start_after_the_cursor(scripted: Scripted) -> None:
    scripted.routes["/rooms"] = reply(200, {"rooms": [HEAD]})
    with pytest.raises(SourceProtocolError, match="out of order"):
        HttpPageSource(scripted.url).list_rooms(after="r")


@pytest.mark.parametrize("size", ["declared", "sent"])
def test_an_oversized_answer_is_refused_without_reading_it_all(scripted: Scripted, size: str) -> None:
    body = json.dumps({"rooms": [], "pad": "x" * 300_000}).encode()
    scripted.routes["/rooms"] = raw(200, body, close_after=size == "sent")
    with pytest.raises(SourceProtocolError, match="exceeds 100000 bytes"):
        HttpPageSource(scripted.url, max_response_bytes=100_000).list_rooms()


def test_a_trickling_server_is_cut_off_at_the_deadline(scripted: Scripted) -> None:
    def trickle(handler: BaseHTTPRequestHandler) -> None:
        handler.send_response(200)
        handler.send_header("Content-Type", "application/json")
        handler.send_header("Content-Length", "1000")
        handler.end_headers()
        try:
            for _ in range(1000):
                handler.wfile.write(b" ")
                handler.wfile.flush()
                time.sleep(0.05)  # each byte within any per-read timeout, the whole far beyond the deadline
        except OSError:
            pass

    scripted.routes["/rooms"] = trickle
    started = time.monotonic()
    with pytest.raises(SourceUnavailableError, match="TimeoutError"):
        HttpPageSource(scripted.url, timeout=0.5).list_rooms()
    assert time.monotonic() - started < 10  # generous: it is cut off near 0.5 s, not after 50 s


def test_errors_are_mapped_and_peer_text_is_bounded(scripted: Scripted) -> None:
    source = HttpPageSource(scripted.url)
    scripted.routes["/rooms/gone"] = reply(404, {"error": "room_not_found", "message": "x"})
    scripted.routes["/rooms/old"] = reply(404, {"error": "room_history_expired"})
    scripted.routes["/rooms/busy"] = reply(503, {"error": "unavailable"})
    scripted.routes["/rooms/odd"] = reply(400, {"error": "bad_request", "message": "\x1b[31mred\x1b[0m" + "y" * 5000})
    scripted.routes["/rooms/moved"] = raw(302, b"", "text/html", extra={"Location": scripted.url + "/rooms/r"})
    scripted.routes["/rooms/mismatch"] = reply(200, {"room_id": "other", "name": "N", "members": []})
    with pytest.raises(RoomNotFoundError):
        source.room_info("gone")
    with pytest.raises(RoomHistoryExpiredError):
        source.room_info("old")
    with pytest.raises(SourceUnavailableError, match="answered 503"):
        source.room_info("busy")
    with pytest.raises(SourceProtocolError) as refused:
        source.room_info("odd")
    assert len(str(refused.value)) < 300  # the peer's text is cut (and escaped by whoever prints it)
    with pytest.raises(SourceProtocolError, match="answered 302"):
        source.room_info("moved")
    assert not any(hit.startswith("/rooms/r") for hit in scripted.hits)  # redirects are not followed
    with pytest.raises(SourceProtocolError, match="malformed"):
        source.room_info("mismatch")


@pytest.mark.parametrize("page", [
    {"events": {}, "authority": {}, "latest_seq": 0, "cursor": 0, "has_more": False},
    {"events": [], "authority": None, "latest_seq": 0, "cursor": 0, "has_more": False},
    {"events": [], "authority": {}, "latest_seq": "1", "cursor": 0, "has_more": False},
    {"events": [], "authority": {}, "latest_seq": 0, "cursor": 0},
    {"events": [{}] * 6, "authority": {}, "latest_seq": 0, "cursor": 0, "has_more": False},
])
def test_a_malformed_page_is_refused(scripted: Scripted, page: dict[str, Any]) -> None:
    scripted.routes["/rooms/r/events"] = reply(200, page)
    with pytest.raises(SourceProtocolError, match="page is malformed"):
        HttpPageSource(scripted.url).read_events("r", since_seq=0, limit=5)


def test_unreachable_servers_and_bad_urls() -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    with pytest.raises(SourceUnavailableError, match="ConnectionRefusedError"):
        HttpPageSource(f"http://127.0.0.1:{port}").list_rooms()
    for url in ("ftp://h/x", "http://user:pw@h/x", "http://h/x?token=1", "http:///x"):
        with pytest.raises(HostedRoomError):
            HttpPageSource(url)
    for headers in ({"Authorization": "Bearer x\r\nX-Evil: 1"}, {"Bad: Name": "x"}, {"X": 1}):
        with pytest.raises(HostedRoomError, match="single-line strings"):
            HttpPageSource("http://h/x", headers=headers)  # type: ignore[arg-type]


def test_a_connection_the_peer_closed_is_reopened_once(scripted: Scripted) -> None:
    # The server answers, then drops the kept-alive connection: the next request opens a fresh one.
    scripted.routes["/rooms"] = reply(200, {"rooms": []}, close_after=True, length=len(b'{"rooms": []}'))
    source = HttpPageSource(scripted.url)
    for _ in range(3):
        assert source.list_rooms() == []
    assert len(scripted.hits) == 3


def test_hostile_pages_are_refused_by_the_replicator_and_nothing_is_stored(engine: Engine, standby: Engine) -> None:
    host(engine, "ok", 3)
    host(engine, "evil", 3)
    host(engine, "deep", 3)
    inner = EnginePageSource(engine)

    class Hostile(EnginePageSource):
        def read_events(self, room_id: str, *, since_seq: int, limit: int) -> dict[str, Any]:
            page = inner.read_events(room_id, since_seq=since_seq, limit=limit)
            if room_id == "evil":
                page["events"][1]["kind"] = "NOT A KIND!"
            if room_id == "deep":
                deep: Any = []
                for _ in range(80):
                    deep = [deep]
                page["events"][1]["payload"] = {"deep": deep}
            return page

    with PageServer(Hostile(engine)) as server:
        report = Replicator(HttpPageSource(server.url), standby).sync_once()
    statuses = {room.room_id: room.status for room in report.rooms}
    assert statuses == {"deep": REFUSED, "evil": REFUSED, "ok": CAUGHT_UP}
    assert "nests too deeply" in report.rooms[0].reason and "event.kind" in report.rooms[1].reason
    assert replica_ids(standby) == ["ok"] and verify(standby) == []


def test_a_hostile_listing_stops_the_pass(scripted: Scripted, standby: Engine) -> None:
    scripted.routes["/rooms"] = reply(200, {"rooms": [{**HEAD, "room_id": "b"}, {**HEAD, "room_id": "a"}]})
    report = Replicator(HttpPageSource(scripted.url), standby).sync_once()
    assert "out of order" in report.error and not report.ok and replica_ids(standby) == []

"""Pages over HTTP: serve a :class:`PageSource` from a gateway, and read one as a standby.

The four calls of :class:`~hostedrooms.standby.source.PageSource` map to four GET requests, each answered
with one JSON object (``Content-Type: application/json``):

====================================================  ==========================================================
``GET {base}/rooms?after=ID&limit=N``                  ``{"rooms": [{"room_id", "authority_gateway_id",
                                                       "authority_epoch", "latest_seq", "disbanded"}, ...]}``
``GET {base}/rooms/{room_id}``                         ``{"room_id", "name", "members"}``
``GET {base}/rooms/{room_id}/events?since_seq=S&limit=N``  the authority's ``read_events`` page, verbatim (its
                                                       ``lineage`` included)
``GET {base}/change``                                   ``{"token": "..."}`` (or ``null``: cannot tell)
====================================================  ==========================================================

Errors are ``{"error": CODE, "message": TEXT}`` with 404 (``room_not_found``, ``room_history_expired``,
``not_found``), 400 (``bad_request``: the authority refused the arguments), 503 (``unavailable``) or 500.

A gateway mounts :func:`answer` in its own HTTP stack behind its own authentication (it takes the path and
query below the mount point and returns the status and body); :class:`PageServer` is a small standard-library
server around it (tests, or a loopback sidecar). :class:`HttpPageSource` is the standby's client: it trusts
nothing it receives (bounded sizes and time, JSON only, every shape checked; ``ingest_page`` then validates
every event as the authority's own append rules would).
"""

from __future__ import annotations

import http.client
import io
import json
import math
import socket
import ssl
import sys
import threading
import time
import urllib.parse
from collections.abc import Callable, Hashable, Mapping
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from .. import limits as default_limits
from ..errors import (
    HostedRoomError,
    RoomHistoryExpiredError,
    RoomNotFoundError,
    StorageError,
    StoreUnavailableError,
)
from ..limits import Limits, check_limits
from ..lineage import check_lineage
from ..validation import INT64_MAX, identifier, json_depth_within, max_json_depth
from .heads import LISTING_PAGE, RoomHead
from .source import PageSource, RoomInfo, SourceProtocolError, SourceUnavailableError

__all__ = ["HttpPageSource", "PageServer", "answer"]

_JSON = "application/json"
_EXPIRED_MESSAGE = "Group Chat history expired; room_id remains permanently retired"
#: Longest error message kept from a source (its text reaches reports and terminals, escaped).
_MAX_MESSAGE_CHARS = 200


# --- the gateway's side ----------------------------------------------------------------------------------------


def _body(status: int, value: Any) -> tuple[int, bytes]:
    return status, json.dumps(value, ensure_ascii=False, separators=(",", ":"), allow_nan=False).encode("utf-8")


def _error(status: int, code: str, message: str = "") -> tuple[int, bytes]:
    return _body(status, {"error": code, "message": message})


def _int_param(query: Mapping[str, list[str]], name: str, default: int) -> int:
    values = query.get(name)
    if not values:
        return default
    text = values[-1]
    if len(text) > 20 or not text.isascii() or not text.isdigit():
        raise HostedRoomError(f"{name} must be a non-negative integer")
    return int(text)


def answer(source: PageSource, target: str) -> tuple[int, bytes]:
    """Answer ``GET target`` (the path and query below the mount point, e.g. ``/rooms?limit=10``) from
    ``source``: the HTTP status and the JSON body. Never raises for a request; storage failures are reported
    without their details (they name the authority's database)."""
    try:
        parts = urllib.parse.urlsplit(target)
        query = urllib.parse.parse_qs(parts.query, max_num_fields=8)
        segments = [urllib.parse.unquote(segment, errors="strict") for segment in parts.path.split("/")[1:]]
        if segments == ["rooms"]:
            after = query.get("after", [None])[-1]
            limit = min(max(_int_param(query, "limit", LISTING_PAGE), 1), LISTING_PAGE)
            heads = source.list_rooms(after=after, limit=limit)
            return _body(200, {"rooms": [head.to_dict() for head in heads]})
        if len(segments) == 2 and segments[0] == "rooms":
            return _body(200, source.room_info(segments[1]).to_dict())
        if len(segments) == 3 and segments[0] == "rooms" and segments[2] == "events":
            page = source.read_events(segments[1], since_seq=_int_param(query, "since_seq", 0),
                                      limit=_int_param(query, "limit", 100))
            return _body(200, page)
        if segments == ["change"]:
            token = source.change_token()
            return _body(200, {"token": None if token is None else repr(token)})
        return _error(404, "not_found", "no such page endpoint")
    except RoomHistoryExpiredError as exc:
        return _error(404, "room_history_expired", str(exc))
    except RoomNotFoundError as exc:
        return _error(404, "room_not_found", str(exc))
    except StoreUnavailableError:
        return _error(503, "unavailable", "the authority's store is unavailable; retry later")
    except StorageError:
        return _error(500, "storage_error", "the authority's store failed")
    except (HostedRoomError, ValueError, UnicodeError) as exc:
        return _error(400, "bad_request", str(exc)[:_MAX_MESSAGE_CHARS])


#: PageServer's defaults (see its docstring).
DEFAULT_MAX_CONNECTIONS = 64
DEFAULT_IDLE_TIMEOUT = 30.0
DEFAULT_HEADER_TIMEOUT = 10.0
DEFAULT_SEND_TIMEOUT = 60.0

_BUSY = _body(503, {"error": "unavailable", "message": "too many connections; retry later"})[1]
_BUSY_RESPONSE = (b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\nContent-Length: "
                  + str(len(_BUSY)).encode() + b"\r\nConnection: close\r\nCache-Control: no-store\r\n\r\n" + _BUSY)


class _DeadlineReader(io.RawIOBase):
    """The connection's reads, each bounded by what is left of one deadline (not a fresh timeout per read, which
    a peer trickling a byte at a time would renew forever): ``expect_request`` allows ``idle`` seconds for a
    request to begin, then ``header`` seconds from its first byte to the end of its headers."""

    def __init__(self, sock: socket.socket) -> None:
        super().__init__()
        self._sock = sock
        self._deadline: float | None = None
        self._header = 0.0
        self._started = True

    def readable(self) -> bool:
        return True

    def expect_request(self, idle: float, header: float) -> None:
        self._deadline = time.monotonic() + idle
        self._header = header
        self._started = False

    def disarm(self) -> None:
        self._deadline = None
        self._started = True

    def readinto(self, buffer: Any) -> int:
        if self._deadline is not None:
            remaining = self._deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError("the request did not arrive in time")
            self._sock.settimeout(remaining)
        received = self._sock.recv_into(buffer)
        if received and not self._started:
            self._started = True
            self._deadline = time.monotonic() + self._header
        return received


class _Slot:
    """One admitted connection: whether a request is being answered on it, and since when it has waited."""

    __slots__ = ("busy", "since")

    def __init__(self) -> None:
        self.busy = False
        self.since = time.monotonic()


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive: a catch-up is thousands of requests
    server: PageServer
    _reader: _DeadlineReader

    def setup(self) -> None:
        super().setup()
        self._reader = _DeadlineReader(self.connection)
        self.rfile = io.BufferedReader(self._reader, 65536)

    def handle_one_request(self) -> None:
        self._reader.expect_request(self.server.idle_timeout, self.server.header_timeout)
        try:
            super().handle_one_request()
        finally:
            self.server._set_busy(self.request, False)

    def do_GET(self) -> None:
        self._reader.disarm()
        self.connection.settimeout(self.server.send_timeout)  # the whole answer: sendall keeps one deadline
        if not self.server._set_busy(self.request, True):  # evicted while its headers arrived
            self.close_connection = True
            return
        if self.headers.get("Content-Length", "0").strip() != "0" or "Transfer-Encoding" in self.headers:
            # A body is never read: left on the connection it would be taken for the next request.
            self.close_connection = True
            status, body = _error(400, "bad_request", "page requests carry no body")
        elif self.server.authorize is not None and not self.server.authorize(self.headers):
            status, body = _error(401, "unauthorized", "not authorized")
        elif not self.path.startswith(self.server.prefix + "/"):
            status, body = _error(404, "not_found", "no such page endpoint")
        else:
            status, body = answer(self.server.source, self.path[len(self.server.prefix):])
        self.send_response(status)
        self.send_header("Content-Type", _JSON)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Cache-Control", "no-store")
        if self.close_connection:
            self.send_header("Connection", "close")
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        """Quiet: a request log line per page would flood a gateway's output (and name its rooms)."""


def _seconds(value: Any, label: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
        raise HostedRoomError(f"{label} must be a positive number of seconds")
    return float(value)


class PageServer(ThreadingHTTPServer):
    """A standard-library HTTP server answering the page endpoints from ``source`` (one thread per connection).

    ``prefix``: the mount point (``""``, or like ``"/standby"``). ``authorize(headers)``: return False to answer
    401 (for instance, check a bearer token); without it every client that can connect reads every room, so bind
    it to loopback (the default) or put it behind the gateway's authenticated transport. Use as a context
    manager, or :meth:`start` and :meth:`stop`.

    Slow and idle clients are bounded, so they cannot hold the threads and descriptors a standby needs:

    * ``idle_timeout`` (default 30 s): how long a connection may wait for a request to begin (a new one, or a
      kept-alive one between requests) before the server closes it;
    * ``header_timeout`` (default 10 s): from a request's first byte to the end of its headers, in all, however
      slowly the bytes trickle; requests carry no body (one that declares a body is answered 400 and closed);
    * ``send_timeout`` (default 60 s): to hand over a whole answer to a client that reads slowly;
    * ``max_connections`` (default 64): connections held at once. A new connection beyond it takes the place of
      the held connection that has waited longest without a request being answered on it (closed at once); when
      every held connection is being answered, the new one is answered 503 and closed, without a thread.
    """

    daemon_threads = True
    block_on_close = False
    request_queue_size = 128  # a burst of connections waits in the kernel's queue, not in SYN retries

    def __init__(self, source: PageSource, address: tuple[str, int] = ("127.0.0.1", 0), *, prefix: str = "",
                 authorize: Callable[[Any], bool] | None = None,
                 max_connections: int = DEFAULT_MAX_CONNECTIONS, idle_timeout: float = DEFAULT_IDLE_TIMEOUT,
                 header_timeout: float = DEFAULT_HEADER_TIMEOUT, send_timeout: float = DEFAULT_SEND_TIMEOUT) -> None:
        if not all(callable(getattr(source, name, None)) for name in ("list_rooms", "room_info", "read_events")):
            raise HostedRoomError("source must be a page source (EnginePageSource, HttpPageSource, ...)")
        if not (isinstance(address, tuple) and len(address) == 2 and isinstance(address[0], str)
                and type(address[1]) is int and 0 <= address[1] <= 65535):
            raise HostedRoomError("address must be a (host, port) tuple, the port from 0 to 65535")
        if not isinstance(prefix, str) or (authorize is not None and not callable(authorize)):
            raise HostedRoomError("prefix must be a string and authorize None or a callable")
        if isinstance(max_connections, bool) or not isinstance(max_connections, int) or max_connections < 1:
            raise HostedRoomError("max_connections must be a positive integer")
        self.idle_timeout = _seconds(idle_timeout, "idle_timeout")
        self.header_timeout = _seconds(header_timeout, "header_timeout")
        self.send_timeout = _seconds(send_timeout, "send_timeout")
        self.max_connections = max_connections
        super().__init__(address, _Handler)
        self.source = source
        self.prefix = prefix.rstrip("/")
        self.authorize = authorize
        self._thread: threading.Thread | None = None
        self._slots_lock = threading.Lock()
        self._slots: dict[socket.socket, _Slot] = {}

    @property
    def url(self) -> str:
        host, port = str(self.server_address[0]), self.server_address[1]
        return f"http://{f'[{host}]' if ':' in host else host}:{port}{self.prefix}"

    @property
    def connections(self) -> int:
        """Connections held now (at most ``max_connections``)."""
        with self._slots_lock:
            return len(self._slots)

    # -- admission --

    def process_request(self, request: Any, client_address: Any) -> None:
        with self._slots_lock:
            admitted = len(self._slots) < self.max_connections or self._evict_waiting()
            if admitted:
                self._slots[request] = _Slot()
        if not admitted:
            _refuse(request)
            self.shutdown_request(request)
            return
        super().process_request(request, client_address)

    def _evict_waiting(self) -> bool:
        """Close the held connection that has waited longest without a request being answered (lock held)."""
        waiting = [(slot.since, id(sock), sock) for sock, slot in self._slots.items() if not slot.busy]
        if not waiting:
            return False
        _, _, victim = min(waiting)
        del self._slots[victim]
        try:
            victim.shutdown(socket.SHUT_RDWR)  # its thread's read ends at once; the thread closes the socket
        except OSError:  # already gone
            pass
        return True

    def _set_busy(self, request: Any, busy: bool) -> bool:
        """Mark a connection answering (or waiting again); False when it was evicted meanwhile."""
        with self._slots_lock:
            slot = self._slots.get(request)
            if slot is None:
                return False
            slot.busy = busy
            if not busy:
                slot.since = time.monotonic()
            return True

    def shutdown_request(self, request: Any) -> None:
        with self._slots_lock:
            self._slots.pop(request, None)
        super().shutdown_request(request)

    def handle_error(self, request: Any, client_address: Any) -> None:
        """Quiet for a connection the client or the server cut (evicted, reset, timed out); else the default."""
        if isinstance(sys.exc_info()[1], OSError):
            return
        super().handle_error(request, client_address)

    # -- running --

    def start(self) -> PageServer:
        # A short poll keeps stop() quick (shutdown waits for the loop's next look).
        self._thread = threading.Thread(target=self.serve_forever, args=(0.05,), name="hostedrooms-page-server",
                                        daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        if self._thread is not None:
            self.shutdown()
            self._thread.join()
            self._thread = None
        self.server_close()

    def __enter__(self) -> PageServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _refuse(request: socket.socket) -> None:
    """Answer 503 without waiting: a small answer on a fresh connection fits its send buffer, or is dropped."""
    try:
        request.setblocking(False)
        request.send(_BUSY_RESPONSE)
    except OSError:
        pass


# --- the standby's side ----------------------------------------------------------------------------------------


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


class HttpPageSource:
    """A :class:`PageSource` reading a gateway's page endpoints over HTTP(S) (one keep-alive connection).

    ``base_url``: ``http://host:port/prefix`` (no credentials, query or fragment: pass ``headers``, for
    instance ``{"Authorization": "Bearer ..."}``). ``timeout``: seconds for a whole request, however slowly the
    peer sends. ``max_response_bytes``: the largest answer read (default: MAX_LOG_PAGE_BYTES plus 1 MiB, since a
    page fits MAX_LOG_PAGE_BYTES as JSON and members fit MAX_MEMBERS_JSON_BYTES). Redirects are not followed.
    Thread-safe (requests are serialised).
    """

    def __init__(
        self,
        base_url: str,
        *,
        timeout: float = 30.0,
        max_response_bytes: int | None = None,
        headers: Mapping[str, str] | None = None,
        ssl_context: ssl.SSLContext | None = None,
        limits: Limits | None = None,
    ) -> None:
        if not isinstance(base_url, str):
            raise HostedRoomError(f"the page source URL must be a string, not {type(base_url).__name__}")
        if (headers is not None and not isinstance(headers, Mapping)) or (ssl_context is not None and not isinstance(
                ssl_context, ssl.SSLContext)):
            raise HostedRoomError("headers must be None or a mapping, ssl_context None or an ssl.SSLContext")
        if max_response_bytes is not None and (type(max_response_bytes) is not int or max_response_bytes < 1):
            raise HostedRoomError("max_response_bytes must be None or a positive int")
        if limits is not None:
            check_limits(limits)
        parts = urllib.parse.urlsplit(base_url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise HostedRoomError("the page source URL must be http:// or https:// with a host")
        if parts.username is not None or parts.password is not None or parts.query or parts.fragment:
            raise HostedRoomError("the page source URL must not carry credentials, a query or a fragment "
                                  "(pass headers= for authentication)")
        if not (isinstance(timeout, (int, float)) and math.isfinite(timeout) and timeout > 0):
            raise HostedRoomError("timeout must be a positive number of seconds")
        for key, value in (headers or {}).items():
            if not (isinstance(key, str) and isinstance(value, str) and key.isascii() and key.isprintable()
                    and ":" not in key and "\r" not in value and "\n" not in value):
                raise HostedRoomError("headers must map header names to single-line strings")
        self.limits = default_limits if limits is None else limits
        self.max_response_bytes = (int(self.limits.MAX_LOG_PAGE_BYTES) + (1 << 20) if max_response_bytes is None
                                   else int(max_response_bytes))
        self.timeout = float(timeout)
        self._https = parts.scheme == "https"
        self._host, self._port = parts.hostname, parts.port
        self._prefix = parts.path.rstrip("/")
        self._headers = {"Accept": _JSON, **dict(headers or {})}
        self._ssl = ssl_context
        self._described = f"{parts.scheme}://{parts.netloc}{self._prefix}"
        self._lock = threading.Lock()
        self._connection: http.client.HTTPConnection | None = None

    # -- the protocol --

    def list_rooms(self, *, after: str | None = None, limit: int = LISTING_PAGE) -> list[RoomHead]:
        """The peer's listing page: its room ids checked (identifiers, ascending after ``after``, at most
        ``limit``); every other field of a head as the peer sent it (see :meth:`_head`)."""
        query = {"limit": str(limit)} | ({"after": after} if after is not None else {})
        answer = self._get("/rooms", query)
        rooms = answer.get("rooms")
        if not isinstance(rooms, list) or len(rooms) > limit:
            raise SourceProtocolError("the source's room listing is malformed")
        heads: list[RoomHead] = []
        for raw in rooms:
            head = self._head(raw)
            if (heads and not head.room_id > heads[-1].room_id) or (after is not None and not head.room_id > after):
                raise SourceProtocolError("the source listed rooms out of order")
            heads.append(head)
        return heads

    def room_info(self, room_id: str) -> RoomInfo:
        answer = self._get(f"/rooms/{_quote(room_id)}", {})
        if answer.get("room_id") != room_id or not isinstance(answer.get("name"), str) \
                or not isinstance(answer.get("members"), list):
            raise SourceProtocolError("the source's room answer is malformed")
        return RoomInfo(room_id, answer["name"], answer["members"])

    def read_events(self, room_id: str, *, since_seq: int, limit: int) -> dict[str, Any]:
        page = self._get(f"/rooms/{_quote(room_id)}/events", {"since_seq": str(since_seq), "limit": str(limit)})
        events = page.get("events")
        if (not isinstance(events, list) or len(events) > limit or not isinstance(page.get("authority"), dict)
                or not _int_within(page.get("latest_seq"), 0, INT64_MAX)
                or not _int_within(page.get("cursor"), 0, INT64_MAX)
                or not isinstance(page.get("has_more"), bool)):
            raise SourceProtocolError("the source's page is malformed")
        if page.get("lineage") is not None:  # absent from a source that predates lineages
            check_lineage(page["lineage"], error=SourceProtocolError, label="the source's page.lineage")
        return page

    def change_token(self) -> Hashable | None:
        try:
            token = self._get("/change", {}).get("token")
        except HostedRoomError:
            return None
        return token if isinstance(token, str) and len(token) <= 200 else None

    def describe(self) -> str:
        return self._described

    def close(self) -> None:
        with self._lock:
            self._disconnect()

    # -- checks --

    def _head(self, raw: Any) -> RoomHead:
        """One listed room. Its ``room_id`` is checked here (the walk's order rests on it: a bad one refuses the
        listing); its other fields are passed on as the peer sent them, for the caller to check room by room (the
        :class:`~hostedrooms.standby.replicator.Replicator` refuses a room whose head is invalid, naming the field,
        and goes on with the others)."""
        if not isinstance(raw, dict):
            raise SourceProtocolError("the source's room listing is malformed")
        room_id = _exact_identifier(raw.get("room_id"), "room_id", int(self.limits.MAX_ROOM_ID_CHARS))
        gateway: Any = raw.get("authority_gateway_id")
        epoch: Any = raw.get("authority_epoch")
        latest: Any = raw.get("latest_seq")
        disbanded: Any = raw.get("disbanded")
        return RoomHead(room_id, gateway, epoch, latest, disbanded)

    # -- transport --

    def _get(self, path: str, query: Mapping[str, str]) -> dict[str, Any]:
        target = self._prefix + path + (f"?{urllib.parse.urlencode(query)}" if query else "")
        with self._lock:
            deadline = time.monotonic() + self.timeout
            for attempt in (1, 2):
                reused = self._connection is not None
                try:
                    status, content_type, body = self._exchange(target, deadline)
                    break
                except (http.client.RemoteDisconnected, BrokenPipeError, ConnectionResetError) as exc:
                    self._disconnect()
                    if attempt == 2 or not reused:  # a kept-alive connection the peer closed: one fresh try
                        raise SourceUnavailableError(f"page source {self._described}: {type(exc).__name__}") from None
                except SourceProtocolError:
                    self._disconnect()
                    raise
                except (OSError, http.client.HTTPException) as exc:
                    self._disconnect()
                    raise SourceUnavailableError(f"page source {self._described}: {type(exc).__name__}") from None
        return self._decode(status, content_type, body)

    def _exchange(self, target: str, deadline: float) -> tuple[int, str, bytes]:
        connection = self._connection
        if connection is None:
            remaining = max(deadline - time.monotonic(), 0.001)
            connection = (http.client.HTTPSConnection(self._host, self._port, timeout=remaining,
                                                      context=self._ssl or ssl.create_default_context())
                          if self._https else http.client.HTTPConnection(self._host, self._port, timeout=remaining))
            self._connection = connection
        # Socket timeouts bound each read, not a whole answer trickled a byte at a time: a watchdog shuts the
        # socket down at the deadline, which ends any read in progress.
        expired = threading.Event()
        watchdog = threading.Timer(max(deadline - time.monotonic(), 0.0), _shut, (connection, expired))
        watchdog.daemon = True
        watchdog.start()
        try:
            answer = self._request(connection, target, deadline)
        except (OSError, http.client.HTTPException):
            if expired.is_set():
                raise TimeoutError("the source did not answer in time") from None
            raise
        finally:
            watchdog.cancel()
        if expired.is_set():  # the shutdown may have looked like the end of the answer
            raise TimeoutError("the source did not answer in time")
        return answer

    def _request(self, connection: http.client.HTTPConnection, target: str,
                 deadline: float) -> tuple[int, str, bytes]:
        if connection.sock is not None:
            connection.sock.settimeout(max(deadline - time.monotonic(), 0.001))
        connection.request("GET", target, headers=self._headers)
        response = connection.getresponse()
        declared = response.getheader("Content-Length")
        if declared is not None and (not declared.isdigit() or int(declared) > self.max_response_bytes):
            raise SourceProtocolError(f"the source's answer exceeds {self.max_response_bytes} bytes")
        chunks: list[bytes] = []
        size = 0
        while True:
            chunk = response.read1(65536)
            if not chunk:
                break
            size += len(chunk)
            if size > self.max_response_bytes:
                raise SourceProtocolError(f"the source's answer exceeds {self.max_response_bytes} bytes")
            chunks.append(chunk)
        if response.length:  # the peer closed before sending what it declared
            raise http.client.IncompleteRead(b"".join(chunks), response.length)
        response.close()  # fully read: the connection can carry the next request
        if response.will_close:
            self._disconnect()
        return response.status, response.getheader("Content-Type", ""), b"".join(chunks)

    def _disconnect(self) -> None:
        connection, self._connection = self._connection, None
        if connection is not None:
            connection.close()

    def _decode(self, status: int, content_type: str, body: bytes) -> dict[str, Any]:
        if content_type.split(";")[0].strip().lower() != _JSON:
            raise SourceProtocolError(f"the source answered {status} with a body that is not JSON")
        try:
            text = body.decode("utf-8")
        except UnicodeDecodeError:
            raise SourceProtocolError("the source's answer is not valid JSON (not UTF-8)") from None
        # A page nests 3 levels above an event's payload, which nests at most MAX_JSON_DEPTH: anything deeper is
        # refused before the parser recurses into it.
        if not json_depth_within(text, max_json_depth() + 8):
            raise SourceProtocolError("the source's answer nests too deeply")
        try:
            value = json.loads(text, parse_constant=_reject_constant)
        except (ValueError, RecursionError) as exc:
            raise SourceProtocolError(f"the source's answer is not valid JSON ({exc.__class__.__name__})") from None
        if not isinstance(value, dict):
            raise SourceProtocolError("the source's answer is not a JSON object")
        if status == 200:
            return value
        code = value.get("error")
        message = value.get("message")
        message = message[:_MAX_MESSAGE_CHARS] if isinstance(message, str) else ""
        if status == 404 and code == "room_history_expired":
            raise RoomHistoryExpiredError(_EXPIRED_MESSAGE)
        if status == 404 and code == "room_not_found":
            raise RoomNotFoundError("hosted room not found")
        if status in (401, 403, 407, 429) or status >= 500:
            raise SourceUnavailableError(f"page source {self._described} answered {status}")
        raise SourceProtocolError(f"the source refused the request ({status}): {message}")


def _shut(connection: http.client.HTTPConnection, expired: threading.Event) -> None:
    expired.set()
    sock = connection.sock
    if sock is not None:
        try:
            sock.shutdown(socket.SHUT_RDWR)
        except OSError:  # already closed
            pass


def _quote(room_id: str) -> str:
    return urllib.parse.quote(room_id, safe="")


def _int_within(value: Any, low: int, high: int) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and low <= value <= high


def _malformed(message: str) -> SourceProtocolError:
    return SourceProtocolError(f"the source's room listing is malformed: {message}")


def _exact_identifier(value: Any, label: str, max_chars: int) -> str:
    checked = identifier(value, error=_malformed, label=label, max_chars=max_chars)
    if checked != value:
        raise _malformed(f"invalid {label}")
    return checked

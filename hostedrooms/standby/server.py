"""The gateway's side of the page endpoints: :func:`answer` (one request, for a gateway's own HTTP stack) and
:class:`PageServer` (a standard-library server around it, with the bearer token, TLS and the bounds on slow and
idle clients). The protocol is in :mod:`hostedrooms.standby.http`'s docstring; who may read is
:mod:`hostedrooms.standby.auth`'s.
"""

from __future__ import annotations

import io
import json
import logging
import math
import socket
import ssl
import sys
import threading
import time
import urllib.parse
from collections.abc import Callable, Mapping
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from ..errors import (
    HostedRoomError,
    InvalidInputError,
    RoomHistoryExpiredError,
    RoomNotFoundError,
    StorageError,
    StoreUnavailableError,
)
from .auth import PageToken, authorization_matches, is_loopback, page_token
from .heads import LISTING_PAGE
from .source import PageSource

__all__ = [
    "DEFAULT_HEADER_TIMEOUT",
    "DEFAULT_IDLE_TIMEOUT",
    "DEFAULT_MAX_CONNECTIONS",
    "DEFAULT_SEND_TIMEOUT",
    "PageServer",
    "answer",
]

_log = logging.getLogger(__name__)

JSON_TYPE = "application/json"
#: Longest error message kept from a peer (its text reaches reports and terminals, escaped).
MAX_MESSAGE_CHARS = 200


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
    without their details (they name the authority's database).

    :param source: the source to read.
    :param target: the request's path and query.
    :returns: ``(HTTP status, JSON body)``.
    """
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
        return _error(400, "bad_request", str(exc)[:MAX_MESSAGE_CHARS])


#: PageServer's defaults (see its docstring).
DEFAULT_MAX_CONNECTIONS = 64
DEFAULT_IDLE_TIMEOUT = 30.0
DEFAULT_HEADER_TIMEOUT = 10.0
DEFAULT_SEND_TIMEOUT = 60.0

_BUSY = _body(503, {"error": "unavailable", "message": "too many connections; retry later"})[1]
#: The one answer to a request without the token, whatever its path (no 404 beside it, no room named).
_UNAUTHORIZED = _error(401, "unauthorized", "a valid bearer token is required")
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
        if isinstance(self.request, ssl.SSLSocket):  # here, on the connection's thread: never the accept loop's
            self.request.settimeout(self.server.header_timeout)
            self.request.do_handshake()
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
        with_body = self.headers.get("Content-Length", "0").strip() != "0" or "Transfer-Encoding" in self.headers
        # A body is never read: left on the connection it would be taken for the next request.
        self.close_connection = self.close_connection or with_body
        if not self.server._authorized(self.headers):
            self.close_connection = True  # a stranger holds no slot a standby may need
            status, body = _UNAUTHORIZED
        elif with_body:
            status, body = _error(400, "bad_request", "page requests carry no body")
        elif not self.path.startswith(self.server.prefix + "/"):
            status, body = _error(404, "not_found", "no such page endpoint")
        else:
            status, body = answer(self.server.source, self.path[len(self.server.prefix):])
        self.send_response(status)
        self.send_header("Content-Type", JSON_TYPE)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Cache-Control", "no-store")
        if status == 401:
            self.send_header("WWW-Authenticate", 'Bearer realm="hostedrooms-pages"')
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

    ``prefix``: the mount point (``""``, or like ``"/standby"``). ``token``: the shared bearer token (str or
    bytes, see :mod:`~hostedrooms.standby.auth`): a request without ``Authorization: Bearer TOKEN`` is answered
    401 (the same body on every path, naming no room). ``authorize(headers)``: return False to answer that 401
    too (the gateway's own check; with ``token`` both must pass). Without either, every client that can connect
    reads every room: so on an address that is not loopback the server refuses to start (InvalidInputError)
    unless ``insecure_no_token=True`` says the network itself is trusted. ``ssl_context``: serve HTTPS with it
    (:func:`~hostedrooms.standby.auth.server_tls_context`; each handshake runs on its connection's thread,
    bounded by ``header_timeout``). Use as a context manager, or :meth:`start` and :meth:`stop`.

    Slow and idle clients are bounded, so they cannot hold the threads and descriptors a standby needs:

    * ``idle_timeout`` (default 30 s): how long a connection may wait for a request to begin (a new one, or a
      kept-alive one between requests) before the server closes it;
    * ``header_timeout`` (default 10 s): from a request's first byte to the end of its headers, in all, however
      slowly the bytes trickle; requests carry no body (one that declares a body is answered 400 and closed);
    * ``send_timeout`` (default 60 s): to hand over a whole answer to a client that reads slowly;
    * ``max_connections`` (default 64): connections held at once. A new connection beyond it takes the place of
      the held connection that has waited longest without a request being answered on it (closed at once); when
      every held connection is being answered, the new one is answered 503 and closed, without a thread.

    :param source: the page source to serve.
    :param address: ``(host, port)`` to listen on (port 0: any free one).
    :param prefix: the mount point.
    :param authorize: ``authorize(headers)`` returns whether a request may be answered, or None.
    :param token: the bearer token requests must carry, or None.
    :param insecure_no_token: serve beyond loopback with neither ``token`` nor ``authorize``.
    :param ssl_context: serve HTTPS with it, or None for HTTP.
    :param max_connections: connections held at once.
    :param idle_timeout: seconds a connection may wait for a request to begin.
    :param header_timeout: seconds from a request's first byte to the end of its headers.
    :param send_timeout: seconds to hand over a whole answer.
    :raises HostedRoomError: an argument is invalid.
    :raises InvalidInputError: ``token`` is invalid, or the address is not loopback with nothing checking who reads.
    :raises OSError: the address cannot be bound.
    """

    daemon_threads = True
    block_on_close = False
    request_queue_size = 128  # a burst of connections waits in the kernel's queue, not in SYN retries

    def __init__(self, source: PageSource, address: tuple[str, int] = ("127.0.0.1", 0), *, prefix: str = "",
                 authorize: Callable[[Any], bool] | None = None, token: PageToken | str | bytes | None = None,
                 insecure_no_token: bool = False, ssl_context: ssl.SSLContext | None = None,
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
        self._token = page_token(token)
        if ssl_context is not None and not isinstance(ssl_context, ssl.SSLContext):
            raise HostedRoomError("ssl_context must be an ssl.SSLContext")
        self.ssl_context = ssl_context
        self.source = source
        self.prefix = prefix.rstrip("/")
        self.authorize = authorize
        super().__init__(address, _Handler, bind_and_activate=False)
        try:
            self.server_bind()
            self._refuse_open_bind(insecure_no_token)
            self.server_activate()
        except BaseException:
            self.server_close()
            raise
        self._thread: threading.Thread | None = None
        self._slots_lock = threading.Lock()
        self._slots: dict[socket.socket, _Slot] = {}

    def _refuse_open_bind(self, insecure_no_token: bool) -> None:
        """Refuse to listen beyond loopback with nothing checking who reads (the bound address is checked, so a
        host name that resolves elsewhere is caught too)."""
        host = str(self.server_address[0])
        if self._token is not None or self.authorize is not None or is_loopback(host):
            return
        if insecure_no_token:
            _log.warning("page server at %s serves every room to every client that can connect (no token, "
                         "insecure_no_token=True)", self.url)
        else:
            raise InvalidInputError(
                f"refusing to serve every room on {host} (not a loopback address) without a token: pass token= "
                "(hostedrooms serve-pages: --token-file or $HOSTEDROOMS_PAGE_TOKEN), or insecure_no_token=True "
                "when only trusted clients can reach it", field="token")

    def _authorized(self, headers: Any) -> bool:
        if self._token is not None and not authorization_matches(self._token, headers.get_all("Authorization")):
            return False
        return self.authorize is None or bool(self.authorize(headers))

    @property
    def url(self) -> str:
        host, port = str(self.server_address[0]), self.server_address[1]
        scheme = "http" if self.ssl_context is None else "https"
        return f"{scheme}://{f'[{host}]' if ':' in host else host}:{port}{self.prefix}"

    @property
    def connections(self) -> int:
        """Connections held now (at most ``max_connections``)."""
        with self._slots_lock:
            return len(self._slots)

    # -- admission --

    def process_request(self, request: Any, client_address: Any) -> None:
        if self.ssl_context is not None:  # no I/O here: the handshake runs on the connection's thread
            try:
                request = self.ssl_context.wrap_socket(request, server_side=True, do_handshake_on_connect=False)
            except OSError:
                self.shutdown_request(request)
                return
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
        """Quiet for a connection the client or the server cut (evicted, reset, timed out); else the default.

        :param request: the request's socket.
        :param client_address: the client's address.
        """
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

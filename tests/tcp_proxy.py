"""A TCP forwarder a test can cut: :meth:`Proxy.cut` closes its listening socket and every forwarded connection
(the server is unreachable: connections are refused), :meth:`Proxy.restore` listens again on the same port."""

from __future__ import annotations

import contextlib
import selectors
import socket
import threading
from types import TracebackType

from waits import join


class Proxy:
    """Forwards 127.0.0.1:``port`` to ``target`` (host, port) until cut."""

    def __init__(self, target: tuple[str, int]) -> None:
        self.target = target
        self.port = 0
        self._lock = threading.Lock()
        self._sockets: set[socket.socket] = set()
        self._listener: socket.socket | None = None
        self._threads: list[threading.Thread] = []

    def __enter__(self) -> Proxy:
        self.restore()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.cut()
        for thread in self._threads:
            join(thread, 10)

    def restore(self) -> None:
        listener = socket.socket()
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", self.port))
        listener.listen()
        self.port = listener.getsockname()[1]
        self._listener = listener
        self._start(self._accept, listener)

    def cut(self) -> None:
        with self._lock:
            listener, self._listener = self._listener, None
            doomed = [*self._sockets, *([listener] if listener is not None else [])]
            self._sockets.clear()
        for sock in doomed:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            sock.close()

    def _start(self, target: object, *args: object) -> None:
        thread = threading.Thread(target=target, args=args, daemon=True)  # type: ignore[arg-type]
        self._threads.append(thread)
        thread.start()

    def _accept(self, listener: socket.socket) -> None:
        while True:
            try:
                client, _ = listener.accept()
            except OSError:  # cut
                return
            try:
                server = socket.create_connection(self.target, timeout=10)
                server.settimeout(None)
            except OSError:
                client.close()
                continue
            with self._lock:
                if self._listener is not listener:  # cut meanwhile
                    client.close()
                    server.close()
                    return
                self._sockets |= {client, server}
            self._start(self._pump, client, server)

    def _pump(self, client: socket.socket, server: socket.socket) -> None:
        with contextlib.suppress(OSError, ValueError):  # cut under it: the sockets are closed
            self._forward(client, server)

    @staticmethod
    def _forward(client: socket.socket, server: socket.socket) -> None:
        peers = {client: server, server: client}
        with selectors.DefaultSelector() as selector:
            for sock in peers:
                selector.register(sock, selectors.EVENT_READ)
            while True:
                for key, _ in selector.select(1.0):
                    source: socket.socket = key.fileobj  # type: ignore[assignment]
                    try:
                        data = source.recv(65536)
                        if not data:
                            raise OSError("closed")
                        peers[source].sendall(data)
                    except OSError:
                        for sock in peers:
                            sock.close()
                        return
                if all(sock.fileno() < 0 for sock in peers):
                    return

"""The exporter's HTTP server: one thread, non-blocking sockets, every connection bounded in time and number.

Why not a thread per connection (``socketserver.ThreadingMixIn``): a client that connects and sends
nothing holds its thread forever, so a thousand idle sockets (a port scanner, a broken scraper, anyone
on the network when bound to 0.0.0.0) meant a thousand threads and the real scrapes timing out. Here
one selector loop serves every connection as its bytes arrive, so an idle one costs a socket and
nothing else, and:

* a connection is closed when its request is not complete within :data:`REQUEST_TIMEOUT_S`, or its
  answer not taken within :data:`SEND_TIMEOUT_S`;
* at most :data:`MAX_CONNECTIONS` are open: a new one closes the oldest that has not sent its request,
  so a scrape always gets in;
* a request is at most :data:`MAX_REQUEST_BYTES`; one answer per connection (``Connection: close``).

Paths: ``/metrics`` (``GET``/``HEAD``) serves the metrics, ``/`` a short page pointing there, anything
else is 404. The metrics are rendered by the ``render`` callable (the Prometheus sink's registry), on
this thread.
"""

from __future__ import annotations

import contextlib
import selectors
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

REQUEST_TIMEOUT_S = 10.0
SEND_TIMEOUT_S = 10.0
MAX_CONNECTIONS = 256
MAX_REQUEST_BYTES = 8192

# (accept header, query string) -> (body, content type)
Render = Callable[[str, str], tuple[bytes, str]]

_INDEX = (
    b"<!doctype html><title>vramscope</title><h1>vramscope</h1>"
    b'<p>GPU memory metrics for Prometheus are at <a href="/metrics">/metrics</a>.</p>\n'
)


@dataclass
class _Connection:
    sock: socket.socket
    deadline: float
    request: bytearray = field(default_factory=bytearray)
    answer: memoryview | None = None  # what is left to send, once the request is read


class MetricsServer:
    """Listens on ``host:port`` at construction (OSError if it cannot) and serves on a daemon thread."""

    def __init__(self, host: str, port: int, family: socket.AddressFamily, render: Render) -> None:
        self._render = render
        self._listener = socket.socket(family, socket.SOCK_STREAM)
        try:
            self._listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # a restart finds its port
            self._listener.bind((host, port))
            self._listener.listen(128)
            self._listener.setblocking(False)
        except OSError:
            self._listener.close()
            raise
        self.server_port: int = self._listener.getsockname()[1]
        self._wake_read, self._wake_write = socket.socketpair()
        self._wake_read.setblocking(False)
        self._selector = selectors.DefaultSelector()
        self._selector.register(self._listener, selectors.EVENT_READ, None)
        self._selector.register(self._wake_read, selectors.EVENT_READ, None)
        self._connections: dict[socket.socket, _Connection] = {}  # in order of arrival
        self._stopping = False
        self._thread = threading.Thread(target=self._loop, name="vramscope-prometheus", daemon=True)
        self._thread.start()

    @property
    def open_connections(self) -> int:
        """Connections open now (for tests and diagnostics)."""
        return len(self._connections)

    def close(self, timeout: float = 5.0) -> None:
        """Stop serving, close every connection and free the port (idempotent)."""
        if self._stopping:
            return
        self._stopping = True
        with contextlib.suppress(OSError):
            self._wake_write.send(b"x")
        self._thread.join(timeout=timeout)
        for sock in [*self._connections, self._listener, self._wake_read, self._wake_write]:
            with contextlib.suppress(OSError):
                sock.close()
        self._connections.clear()
        with contextlib.suppress(Exception):
            self._selector.close()

    # -- the loop ---------------------------------------------------------------------------------------

    def _loop(self) -> None:
        while not self._stopping:
            now = time.monotonic()
            wait = min((c.deadline for c in self._connections.values()), default=now + 1.0) - now
            try:
                events = self._selector.select(timeout=max(0.0, min(wait, 1.0)))
            except OSError:  # the selector was closed under us: we are stopping
                return
            for key, mask in events:
                sock = key.fileobj
                if sock is self._listener:
                    self._accept()
                elif sock is self._wake_read:
                    return
                else:
                    assert isinstance(sock, socket.socket)
                    connection = self._connections.get(sock)
                    if connection is None:
                        continue
                    if mask & selectors.EVENT_READ:
                        self._read(connection)
                    elif mask & selectors.EVENT_WRITE:
                        self._send(connection)
            self._expire(time.monotonic())

    def _accept(self) -> None:
        for _ in range(64):  # what is waiting now; the rest on the next round
            try:
                sock, _ = self._listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError:  # out of file descriptors, say: drop this round, the scraper retries
                return
            sock.setblocking(False)
            if len(self._connections) >= MAX_CONNECTIONS:
                self._evict()
            self._connections[sock] = _Connection(sock, time.monotonic() + REQUEST_TIMEOUT_S)
            self._selector.register(sock, selectors.EVENT_READ, None)

    def _evict(self) -> None:
        """Close the oldest connection still waiting for its request (else the oldest): room for a new one."""
        waiting = [c for c in self._connections.values() if c.answer is None]
        victim = (waiting or list(self._connections.values()))[0]
        self._drop(victim)

    def _read(self, connection: _Connection) -> None:
        try:
            data = connection.sock.recv(4096)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            self._drop(connection)
            return
        if not data:  # the client went away before finishing its request
            self._drop(connection)
            return
        connection.request += data
        end = connection.request.find(b"\r\n\r\n")
        if end < 0:
            end = connection.request.find(b"\n\n")  # a hand-typed request
        if end < 0:
            if len(connection.request) > MAX_REQUEST_BYTES:
                self._answer(connection, 431, b"request too large\n", "text/plain; charset=utf-8")
            return
        self._respond(connection, bytes(connection.request[:end]))

    def _respond(self, connection: _Connection, head: bytes) -> None:
        lines = head.decode("latin-1").splitlines()
        parts = lines[0].split() if lines else []
        if len(parts) != 3 or not parts[2].startswith("HTTP/"):
            self._answer(connection, 400, b"bad request\n", "text/plain; charset=utf-8")
            return
        method, target = parts[0], parts[1]
        path, _, query = target.partition("?")
        accept = ""
        for line in lines[1:]:
            name, _, value = line.partition(":")
            if name.strip().lower() == "accept":
                accept = value.strip()
        if method not in ("GET", "HEAD"):
            self._answer(connection, 405, b"only GET and HEAD\n", "text/plain; charset=utf-8", allow=True)
            return
        if path == "/metrics":
            try:
                body, content_type = self._render(accept, query)
            except Exception:  # a collector failed: the scraper sees an error, the run goes on
                self._answer(connection, 500, b"metrics could not be rendered\n", "text/plain; charset=utf-8")
                return
        elif path == "/":
            body, content_type = _INDEX, "text/html; charset=utf-8"
        else:
            self._answer(connection, 404, b"not found; the metrics are at /metrics\n", "text/plain; charset=utf-8")
            return
        self._answer(connection, 200, body, content_type, head_only=method == "HEAD")

    def _answer(
        self,
        connection: _Connection,
        status: int,
        body: bytes,
        content_type: str,
        head_only: bool = False,
        allow: bool = False,
    ) -> None:
        reason = {
            200: "OK",
            400: "Bad Request",
            404: "Not Found",
            405: "Method Not Allowed",
            431: "Request Header Fields Too Large",
            500: "Internal Server Error",
        }[status]
        headers = [
            f"HTTP/1.1 {status} {reason}",
            f"Content-Type: {content_type}",
            f"Content-Length: {len(body)}",
            "Connection: close",
        ]
        if allow:
            headers.append("Allow: GET, HEAD")
        data = ("\r\n".join(headers) + "\r\n\r\n").encode("latin-1") + (b"" if head_only else body)
        connection.answer = memoryview(data)
        connection.deadline = time.monotonic() + SEND_TIMEOUT_S
        with contextlib.suppress(KeyError, ValueError):
            self._selector.modify(connection.sock, selectors.EVENT_WRITE, None)
        self._send(connection)

    def _send(self, connection: _Connection) -> None:
        answer = connection.answer
        if answer is None:
            return
        try:
            sent = connection.sock.send(answer)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            self._drop(connection)
            return
        connection.answer = answer[sent:]
        if not connection.answer:
            with contextlib.suppress(OSError):
                connection.sock.shutdown(socket.SHUT_WR)
            self._drop(connection)

    def _expire(self, now: float) -> None:
        for connection in [c for c in self._connections.values() if c.deadline <= now]:
            self._drop(connection)

    def _drop(self, connection: _Connection) -> None:
        self._connections.pop(connection.sock, None)
        with contextlib.suppress(KeyError, ValueError, OSError):
            self._selector.unregister(connection.sock)
        with contextlib.suppress(OSError):
            connection.sock.close()

"""A small threaded HTTP server for WSGI apps: wattpipe's own telemetry and the Prometheus exporter.

Serving happens on a daemon thread, so a slow scraper never holds up a tick, and scrapes only read
what the last finished tick left in memory. That thread sleeps in ``select`` until a connection arrives
or :meth:`HttpServer.close` wakes it, so an idle listener costs no CPU. (``socketserver``'s
``serve_forever`` wakes every ``poll_interval`` to look for ``shutdown()``: what that cost an idle agent is
in docs/benchmarks.md, measured by benchmarks/idle_cpu.py.)
"""

from __future__ import annotations

import selectors
import socket
import socketserver
import ssl
import threading
from collections.abc import Callable, Iterable
from socketserver import ThreadingMixIn
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

__all__ = ["HttpServer", "WsgiApp", "parse_listen"]

_HANDSHAKE_TIMEOUT_S = 10.0

WsgiApp = Callable[[dict[str, Any], Callable[..., Any]], Iterable[bytes]]


def parse_listen(listen: str) -> tuple[str, int]:
    """``host:port`` (``[::1]:port`` for IPv6) → (host, port). Port 0 picks a free one."""
    host, sep, port_text = listen.rpartition(":")
    if not sep or not (port_text.isascii() and port_text.isdigit()):
        raise ValueError(f"'{listen}' is not host:port (for example 127.0.0.1:8888 or 0.0.0.0:28282)")
    port = int(port_text)
    if not 0 <= port <= 65535:
        raise ValueError(f"port {port} in '{listen}' is out of range 0–65535")
    return host.strip("[]") or "0.0.0.0", port


class _ThreadingServer(ThreadingMixIn, WSGIServer):
    daemon_threads = True
    allow_reuse_address = True
    # socketserver's default backlog of 5 makes a burst of scrapes (many Prometheus replicas, a
    # dashboard refresh) wait on TCP retries for seconds; answers come from memory, so accept them all.
    request_queue_size = 128

    def finish_request(self, request: Any, client_address: Any) -> None:
        # The TLS handshake runs here, on the request's own thread, not in accept(): there a client that
        # connects and never speaks would stop the server from accepting anyone else.
        if isinstance(request, ssl.SSLSocket):
            try:
                request.settimeout(_HANDSHAKE_TIMEOUT_S)
                request.do_handshake()
                request.settimeout(None)
            except OSError:  # ssl.SSLError included: plain HTTP, no or an untrusted client certificate
                return  # shutdown_request() closes the connection
        super().finish_request(request, client_address)


class _ThreadingServer6(_ThreadingServer):
    # WSGIServer binds IPv4 only; "[::1]:port" or "[::]:port" needs an IPv6 socket.
    address_family = socket.AF_INET6


class _QuietHandler(WSGIRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        pass


class HttpServer:
    """Serve ``app`` on ``listen`` from a background thread until :meth:`close`; HTTPS with ``ssl_context``."""

    def __init__(self, listen: str, app: WsgiApp, ssl_context: ssl.SSLContext | None = None) -> None:
        self.host, port = parse_listen(listen)
        server_class = _ThreadingServer6 if ":" in self.host else _ThreadingServer
        self._server = make_server(self.host, port, app, server_class=server_class, handler_class=_QuietHandler)
        self.scheme = "http"
        if ssl_context is not None:
            self._server.socket = ssl_context.wrap_socket(
                self._server.socket, server_side=True, do_handshake_on_connect=False
            )
            self.scheme = "https"
        self.port = self._server.server_address[1]
        # close() writes a byte here to end the serving thread's select() at once, with no polling.
        self._wakeup, self._wakeup_sender = socket.socketpair()
        self._thread = threading.Thread(target=self._serve, name=f"http-{self.port}", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def close(self) -> None:
        # Only a running thread can be woken (and waited for); one that never started has nothing to end.
        if self._thread.is_alive():
            self._wake()
            self._thread.join(timeout=5)
        self._server.server_close()
        self._wakeup.close()
        self._wakeup_sender.close()

    def _serve(self) -> None:
        """Accept connections, each served on a thread of its own, until :meth:`_wake`."""
        with selectors.DefaultSelector() as selector:
            selector.register(self._server, selectors.EVENT_READ)
            selector.register(self._wakeup, selectors.EVENT_READ)
            while all(key.fileobj is not self._wakeup for key, _ in selector.select()):
                _accept(self._server)

    def _wake(self) -> None:
        self._wakeup_sender.send(b"\0")

    @property
    def bound(self) -> str:
        """The address really listened on, ``0.0.0.0:28282`` (every interface) as it is; :attr:`url` is the
        one to connect to."""
        return f"[{self.host}]:{self.port}" if ":" in self.host else f"{self.host or '0.0.0.0'}:{self.port}"

    @property
    def url(self) -> str:
        host = {"0.0.0.0": "127.0.0.1", "": "127.0.0.1", "::": "::1"}.get(self.host, self.host)
        return f"{self.scheme}://[{host}]:{self.port}" if ":" in host else f"{self.scheme}://{host}:{self.port}"


def _accept(server: socketserver.BaseServer) -> None:
    """Take one waiting connection and start serving it: ``socketserver``'s private
    ``_handle_request_noblock``, written with its public steps."""
    try:
        request, client_address = server.get_request()
    except OSError:  # the client gave up between select() and accept()
        return
    if not server.verify_request(request, client_address):
        server.shutdown_request(request)
        return
    try:
        server.process_request(request, client_address)  # ThreadingMixIn: starts the request's thread
    except Exception:
        server.handle_error(request, client_address)
        server.shutdown_request(request)

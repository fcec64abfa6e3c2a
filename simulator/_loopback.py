"""An HTTP server on 127.0.0.1, served from a daemon thread: what the simulator's HTTP faces share."""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

__all__ = ["JsonApiHandler", "LoopbackHttp"]


class LoopbackHttp:
    """Serves ``handler`` on ``127.0.0.1:port`` (0: any free port) until :meth:`stop`."""

    def __init__(self, port: int, handler: type[BaseHTTPRequestHandler], name: str) -> None:
        self.server = ThreadingHTTPServer(("127.0.0.1", port), handler)
        self.server.daemon_threads = True
        # A short poll interval so stop() (and so a test's teardown) returns in tens of milliseconds.
        self._thread = threading.Thread(
            target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, name=name, daemon=True
        )
        self._thread.start()
        self._stopped = False

    @property
    def port(self) -> int:
        return int(self.server.server_address[1])

    def stop(self, after_close: Callable[[], None] | None = None) -> None:
        """Stop serving; ``after_close`` runs once the listening socket is closed (e.g. to cut idle connections)."""
        if self._stopped:
            return
        self._stopped = True
        self.server.shutdown()
        self.server.server_close()
        if after_close is not None:
            after_close()
        self._thread.join(timeout=5)


class JsonApiHandler(BaseHTTPRequestHandler):
    """What the Kubernetes API faces answer with: JSON bodies, and watches as chunked JSON lines."""

    protocol_version = "HTTP/1.1"  # keep-alive like the real server; watches need chunked encoding

    def _json(self, code: int, body: dict[str, Any]) -> None:
        data = json.dumps(body, separators=(",", ":")).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self._write(data)

    def _start_watch(self) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()

    def _event(self, kind: str, obj: dict[str, Any]) -> bool:
        """One watch event as a chunk; False once the client is gone."""
        line = json.dumps({"type": kind, "object": obj}, separators=(",", ":")).encode() + b"\n"
        return self._write(f"{len(line):x}\r\n".encode() + line + b"\r\n")

    def _end(self) -> None:
        self._write(b"0\r\n\r\n")

    def _write(self, data: bytes) -> bool:
        try:
            self.wfile.write(data)
            self.wfile.flush()
        except OSError:  # the client went away (BrokenPipe, ConnectionReset) or close() cut us off
            self.close_connection = True
            return False
        return True

    def log_message(self, format: str, *args: Any) -> None:
        return  # no access log on stderr

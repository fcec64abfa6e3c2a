"""An HTTP server on 127.0.0.1, served from a daemon thread: what the simulator's HTTP faces share."""

from __future__ import annotations

import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

__all__ = ["LoopbackHttp"]


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

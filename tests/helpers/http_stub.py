"""A loopback HTTP server whose every GET is answered by a function: a stand-in for a peer of what is tested."""

from __future__ import annotations

import http.server
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager

# (status, body, Content-Type) for a request's path
Answer = Callable[[str], tuple[int, bytes, str]]


@contextmanager
def serving(answer: Answer) -> Iterator[str]:
    """A server on 127.0.0.1 answering each GET with ``answer(path)``; yields its base URL, shuts down after."""

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            status, body, content_type = answer(self.path)
            self.send_response(status)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()

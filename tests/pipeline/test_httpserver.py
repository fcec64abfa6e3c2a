"""The HTTP listener waits for connections without polling, serves them, and stops at once when closed."""

from __future__ import annotations

import socket
import sys
import threading
import time
import urllib.request
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

import pytest

from wattpipe.pipeline.httpserver import HttpServer


def hello(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
    start_response("200 OK", [("Content-Type", "text/plain")])
    return [f"hello {environ['PATH_INFO']}\n".encode()]


@pytest.fixture
def server() -> Iterator[HttpServer]:
    served = HttpServer("127.0.0.1:0", hello)
    served.start()
    yield served
    served.close()


def get(url: str) -> bytes:
    with urllib.request.urlopen(url, timeout=5) as response:
        body: bytes = response.read()
        return body


def serving_thread(port: int) -> threading.Thread:
    return next(t for t in threading.enumerate() if t.name == f"http-{port}")


def wakeups(thread: threading.Thread) -> int:
    """How many times ``thread`` has gone to sleep and been woken (Linux: voluntary context switches)."""
    status = Path(f"/proc/self/task/{thread.native_id}/status").read_text()
    return int(next(line.split()[1] for line in status.splitlines() if line.startswith("voluntary_ctxt_switches")))


def test_serves_requests_one_after_another_and_at_once(server: HttpServer) -> None:
    assert get(f"{server.url}/a") == b"hello /a\n"
    assert get(f"{server.url}/b") == b"hello /b\n"
    bodies: list[bytes] = []
    threads = [threading.Thread(target=lambda i=i: bodies.append(get(f"{server.url}/{i}"))) for i in range(20)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=10)
    assert sorted(bodies) == sorted(f"hello /{i}\n".encode() for i in range(20))


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self/task")
def test_an_idle_listener_does_not_wake_up(server: HttpServer) -> None:
    get(f"{server.url}/warm")
    thread = serving_thread(server.port)
    time.sleep(0.2)  # the answer can arrive before the serving thread is back in its wait: let it settle
    before = wakeups(thread)
    time.sleep(1.0)  # socketserver's serve_forever(poll_interval=0.05) woke 20 times in this second
    assert wakeups(thread) - before == 0
    # and it still answers: the wait was for a connection, not a stall
    assert get(f"{server.url}/after") == b"hello /after\n"
    assert wakeups(thread) - before >= 1


def test_close_ends_the_serving_thread_at_once_and_frees_the_port() -> None:
    served = HttpServer("127.0.0.1:0", hello)
    served.start()
    thread = serving_thread(served.port)
    start = time.monotonic()
    served.close()
    assert time.monotonic() - start < 0.5
    assert not thread.is_alive()
    with socket.socket() as s:  # nothing listens on the port any more
        assert s.connect_ex(("127.0.0.1", served.port)) != 0


def test_close_without_start_and_twice_is_harmless() -> None:
    never_started = HttpServer("127.0.0.1:0", hello)
    never_started.close()
    served = HttpServer("127.0.0.1:0", hello)
    served.start()
    served.close()
    served.close()
    assert not any(t.name == f"http-{served.port}" for t in threading.enumerate())

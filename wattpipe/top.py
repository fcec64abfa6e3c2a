"""``wattpipe top``: a live terminal view of what a wattpipe attributes, GPU by GPU and RAPL zone type by type.

It reads a running wattpipe's Prometheus ``/metrics`` (``--url``; Kepler or OpenTelemetry names). Without
``--url`` it reads the wattpipe on this machine's default port (:data:`LOCAL_URL`, where ``wattpipe demo``
and ``run`` serve) when one answers there, and otherwise starts ``wattpipe demo`` as a child process on a
free loopback port and reads that (``--demo`` starts it in any case). The
screen (:mod:`wattpipe._top_view`) is redrawn after every scrape and every key: ``w``/``j``/``n`` sort
by watts, joules or name, ``r`` reverses, ``p`` pauses, ``q`` (or Ctrl-C) quits. ``--once`` prints
one screen and exits, for scripts, and so does top when its output is not a terminal.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import select
import socket
import subprocess
import sys
import tempfile
import termios
import time
import tty
import urllib.parse
from collections.abc import Iterator
from pathlib import Path
from typing import IO

import httpx
from rich.console import Console
from rich.live import Live

from wattpipe._top_model import CpuZone, Gpu, Snapshot, is_wattpipe, parse
from wattpipe._top_view import SORTS, History, View, render

__all__ = ["add_arguments", "main", "metrics_url"]

EXIT_OK, EXIT_RUNTIME, EXIT_USAGE = 0, 1, 2
_DEMO_START_S = 60.0  # how long the demo may take to serve its first scrape
_ONCE_DEMO_SETTLE_S = 15.0
"""With the demo, ``--once`` waits up to this long after its first power reading for a tick that attributes
something (the first tick has GPU power but no process yet); a scenario without processes prints after it."""
LOCAL_URL = "http://127.0.0.1:28282/metrics"
"""Where top looks first without ``--url``: the Prometheus exporter's default listen address."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The options of ``wattpipe top``."""
    parser.epilog = "keys: w/j/n sort by watts/joules/name, r reverses, p pauses, q quits. docs/top.md (in the source repository) says more."
    parser.add_argument(
        "--url",
        default=None,
        help=f"a running wattpipe's /metrics (e.g. http://node:28282/metrics; node:28282 reads the same); default: "
        f"{LOCAL_URL} if a wattpipe answers there, else the demo, started by top",
    )
    parser.add_argument("--demo", action="store_true", help="start the demo and read it, even if a wattpipe is local")
    parser.add_argument("--every", type=float, default=2.0, help="seconds between scrapes (default 2)")
    parser.add_argument(
        "--scenario", default=None, help="without --url: the simulated node the demo runs (default: the demo's own)"
    )
    parser.add_argument("--sort", choices=sorted(SORTS.values()), default="watts", help="first sort (default watts)")
    parser.add_argument("--once", action="store_true", help="print one screen (after the first good scrape) and exit")


class _Source:
    """Where the exposition comes from: a URL, and the demo process behind it if top started one."""

    def __init__(self, url: str, demo: subprocess.Popen[bytes] | None = None, log: Path | None = None) -> None:
        self.url = url
        self.demo = demo
        self.log = log
        self.client = httpx.Client(timeout=5.0)

    def fetch(self) -> Snapshot:
        """One scrape; raises RuntimeError saying what went wrong, naming the URL."""
        if self.demo is not None and self.demo.poll() is not None:
            raise RuntimeError(f"the demo exited with code {self.demo.returncode}: {self.demo_log_tail()}")
        try:
            response = self.client.get(self.url)
        except httpx.HTTPError as exc:
            raise RuntimeError(f"cannot read {self.url}: {exc}") from exc
        if response.is_error:  # the status alone: httpx's own message adds a line pointing at a web page
            raise RuntimeError(f"cannot read {self.url}: HTTP {response.status_code} {response.reason_phrase}")
        try:
            return parse(response.text)
        except ValueError as exc:
            raise RuntimeError(f"{self.url} is not a Prometheus exposition: {exc}") from exc

    def demo_log_tail(self) -> str:
        if self.log is None or not self.log.exists():
            return ""
        return " | ".join(self.log.read_text(errors="replace").strip().splitlines()[-3:])


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _answers(url: str) -> bool:
    """Whether a wattpipe serves ``url``: its exposition has a family of the catalog (GPU, CPU or its own; a
    node without GPUs serves no GPU family, and is read all the same)."""
    try:
        response = httpx.get(url, timeout=1.0)
        return response.status_code == 200 and is_wattpipe(response.text)
    except httpx.HTTPError:
        return False


def metrics_url(given: str) -> str:
    """``--url`` as read: ``http://`` when no scheme is given, ``/metrics`` when no path is."""
    url = given if "://" in given else f"http://{given}"
    parts = urllib.parse.urlsplit(url)
    return parts._replace(path="/metrics").geturl() if parts.path in ("", "/") else url


@contextlib.contextmanager
def _source(args: argparse.Namespace) -> Iterator[_Source]:
    """The URL given, or ``wattpipe demo`` started on a free port (stopped when top stops)."""
    if args.url:
        yield _Source(metrics_url(args.url))
        return
    if not args.demo and _answers(LOCAL_URL):
        yield _Source(LOCAL_URL)
        return
    port = _free_port()
    env = {
        **os.environ,
        "WATTPIPE_PROMETHEUS_LISTEN": f"127.0.0.1:{port}",
        "WATTPIPE_TELEMETRY_LISTEN": "",
        "WATTPIPE_CONSOLE_FORMAT": "json",
    }
    command = [sys.executable, "-m", "wattpipe", "demo", "--log-level", "warning"]
    if args.scenario:
        command += ["--scenario", args.scenario]
    with tempfile.TemporaryDirectory(prefix="wattpipe-top-") as tmp:
        log = Path(tmp) / "demo.log"
        with log.open("wb") as stderr:
            demo = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=stderr)
        try:
            yield _Source(f"http://127.0.0.1:{port}/metrics", demo, log)
        finally:
            demo.terminate()
            try:
                demo.wait(timeout=10)
            except subprocess.TimeoutExpired:
                demo.kill()
                demo.wait()


@contextlib.contextmanager
def _keys(stream: IO[str]) -> Iterator[bool]:
    """Single keys without Enter while inside (cbreak mode) when ``stream`` is a terminal; yields whether it is."""
    if not stream.isatty():
        yield False
        return
    fd = stream.fileno()
    saved = termios.tcgetattr(fd)
    tty.setcbreak(fd)
    try:
        yield True
    finally:
        termios.tcsetattr(fd, termios.TCSADRAIN, saved)


def _read_key(stream: IO[str], timeout_s: float) -> str | None:
    ready, _, _ = select.select([stream], [], [], max(0.0, timeout_s))
    if not ready:
        return None
    return os.read(stream.fileno(), 1).decode(errors="replace")


def _apply_key(key: str, view: View) -> bool:
    """Change the view for ``key``; False to quit."""
    if key in ("q", "Q", "\x03"):
        return False
    if key in SORTS:
        view.sort = key
    elif key == "r":
        view.reverse = not view.reverse
    elif key == "p":
        view.paused = not view.paused
    return True


def _devices(snapshot: Snapshot) -> list[Gpu] | list[CpuZone]:
    """What ``--once`` waits on with the demo: the GPUs, or on a node without any its CPU zone types."""
    return snapshot.gpus or snapshot.cpus


def _settled(snapshot: Snapshot, first_measured: float | None) -> bool:
    """The demo's screen is worth printing: a tick attributed something, or none did for a while after power."""
    attributed = any(row.kind != "unattributed" for device in _devices(snapshot) for row in device.rows)
    return attributed or (first_measured is not None and time.monotonic() - first_measured > _ONCE_DEMO_SETTLE_S)


def _once(source: _Source, view: View, console: Console, wait_s: float) -> int:
    """Scrape until the first good reading (with the demo, one that attributes something), print it, exit."""
    deadline = time.monotonic() + wait_s
    history = History()
    first_measured: float | None = None
    while True:
        try:
            snapshot = source.fetch()
        except RuntimeError as exc:
            if source.demo is None or time.monotonic() > deadline or source.demo.poll() is not None:
                print(f"error: {exc}", file=sys.stderr)
                return EXIT_RUNTIME
            time.sleep(0.5)
            continue
        measured = any(device.watts is not None for device in _devices(snapshot))
        first_measured = first_measured or (time.monotonic() if measured else None)
        if source.demo is None or time.monotonic() > deadline or (measured and _settled(snapshot, first_measured)):
            history.add(snapshot)
            console.print(render(snapshot, history, view))
            return EXIT_OK
        time.sleep(0.5)


def _scrape(source: _Source, history: History, view: View, started: float) -> Snapshot | None:
    try:
        snapshot = source.fetch()
    except RuntimeError as exc:
        demo = source.demo
        starting = demo is not None and demo.poll() is None and time.monotonic() - started < _DEMO_START_S
        view.status = "starting the demo…" if starting else f"error: {exc}"
        return None
    history.add(snapshot)
    view.status = "" if snapshot.gpus or snapshot.cpus or source.demo is None else "waiting for the demo's first tick…"
    return snapshot


def _live(source: _Source, view: View, console: Console, every_s: float) -> int:
    """Redraw after every scrape and every key until q or Ctrl-C."""
    history = History()
    snapshot: Snapshot | None = None
    started = time.monotonic()
    next_scrape = started
    with _keys(sys.stdin) as interactive, Live(console=console, screen=True, auto_refresh=False) as live:
        while True:
            view.height = console.size.height  # the rows fit it (a resized terminal too): no device falls off
            if time.monotonic() >= next_scrape:
                next_scrape = time.monotonic() + every_s
                if not view.paused:
                    snapshot = _scrape(source, history, view, started) or snapshot
                live.update(render(snapshot, history, view), refresh=True)
            if not interactive:
                time.sleep(max(0.0, next_scrape - time.monotonic()))
                continue
            key = _read_key(sys.stdin, next_scrape - time.monotonic())
            if key is None:
                continue
            if not _apply_key(key, view):
                return EXIT_OK
            live.update(render(snapshot, history, view), refresh=True)


def _url_problem(given: str) -> str | None:
    """What makes ``--url`` not a URL top can read (before any request is made), or None."""
    try:
        parts = urllib.parse.urlsplit(metrics_url(given))
        port = parts.port  # raises on a port that is not a number in 0-65535
    except ValueError as exc:
        return f"not a URL ({exc})"
    if parts.scheme not in ("http", "https"):
        return f"'{parts.scheme}://' is not http:// or https://"
    if not parts.hostname:
        return "no host in it"
    if any(c.isspace() for c in parts.hostname):
        return f"'{parts.hostname}' is not a host name"
    if port == 0:
        return "port 0 is not a port to read from"
    return None


def _usage_problem(args: argparse.Namespace) -> str | None:
    problem = _url_problem(args.url) if args.url else None
    if problem:
        return f"--url {args.url}: {problem} (e.g. http://node:28282/metrics or node:28282)"
    if args.every <= 0:
        return f"--every {args.every}: must be a positive number of seconds"
    if args.url and (args.demo or args.scenario):
        return (
            "--url reads a running wattpipe; --demo and --scenario are for the demo top starts: give one or the other"
        )
    return None


def main(args: argparse.Namespace) -> int:
    """Run the live view until q or Ctrl-C (or print one screen with ``--once``); the exit code."""
    problem = _usage_problem(args)
    if problem:
        print(f"error: {problem}", file=sys.stderr)
        return EXIT_USAGE
    view = View(sort={v: k for k, v in SORTS.items()}[args.sort])
    console = Console()
    if not console.is_terminal:  # a pipe or a file: wide enough for every column
        console.width = max(console.width, 160)
    with _source(args) as source:
        view.source = f"demo at {source.url}" if source.demo is not None else source.url
        try:
            if args.once or not console.is_terminal:  # into a pipe or a file: one screen, no keys read
                view.keys = False
                return _once(source, view, console, _DEMO_START_S)
            return _live(source, view, console, args.every)
        except KeyboardInterrupt:
            return EXIT_OK


if __name__ == "__main__":
    _parser = argparse.ArgumentParser(prog="wattpipe top", description=__doc__.splitlines()[0])
    add_arguments(_parser)
    sys.exit(main(_parser.parse_args()))

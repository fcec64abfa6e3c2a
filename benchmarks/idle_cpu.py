"""Benchmark: the CPU an idle agent burns between ticks (issue 16: listeners that wait without polling).

    .venv/bin/python benchmarks/idle_cpu.py [--seconds 20] [--repeat 3]

Starts ``wattpipe run`` as a child process with both HTTP listeners (the telemetry endpoint and the
``prometheus`` exporter's /metrics) and a one-hour interval, waits for its first tick (``/readyz``), then
measures the child's CPU time over ``--seconds`` in which nothing happens: no tick, no scrape. The CPU time
is the sum of every thread's run time in ``/proc/<pid>/task/*/schedstat`` (nanoseconds; ``/proc/<pid>/stat``'s
10 ms clock ticks are too coarse for this).

Each repeat runs the child twice, once per listener:

- ``blocking``: the listeners as they are (a thread blocked in ``select`` on the listening socket and a
  wake-up socket for shutdown);
- ``polling``: the listeners before issue 16, rebuilt by swapping the serving loop back to
  ``socketserver``'s ``serve_forever(poll_interval=0.05)`` (wake-up by ``shutdown()``), everything else
  unchanged; so the ratio compares the listeners alone, in one run on one machine.

Linux only (``/proc``).
"""

from __future__ import annotations

import argparse
import http.client
import os
import platform
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MODES = ("polling", "blocking")
CONFIG = """\
receivers:
  procfs:
exporters:
  prometheus: {{listen: "127.0.0.1:{prometheus}"}}
service:
  node_name: idle-bench
  pipelines:
    metrics: {{interval: 1h, receivers: [procfs], exporters: [prometheus]}}
  telemetry: {{listen: "127.0.0.1:{telemetry}"}}
"""


def child(mode: str, config: str) -> int:
    """Run the service in this process, with the listener ``mode`` asks for."""
    sys.path.insert(0, str(ROOT))
    from wattpipe.cli import main
    from wattpipe.pipeline.httpserver import HttpServer

    if mode == "polling":
        # The serving loop before issue 16: socketserver wakes every 50 ms to check for shutdown().
        HttpServer._serve = lambda self: self._server.serve_forever(poll_interval=0.05)  # type: ignore[method-assign]
        HttpServer._wake = lambda self: self._server.shutdown()  # type: ignore[method-assign]
    return main(["run", "-c", config, "--log-level", "warning"])


def cpu_ns(pid: int) -> int:
    """The process's CPU time so far, every thread summed (ns)."""
    total = 0
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            total += int((task / "schedstat").read_text().split()[0])
        except (FileNotFoundError, ProcessLookupError):  # a thread that ended meanwhile
            continue
    return total


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def wait_ready(port: int, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=1)
            conn.request("GET", "/readyz")
            if conn.getresponse().status == 200:
                return
        except OSError:
            pass
        time.sleep(0.1)
    raise TimeoutError(f"the service on port {port} was not ready within {timeout_s:g}s")


def measure(mode: str, seconds: float, workdir: Path) -> tuple[float, int]:
    """CPU ms per second of an idle service with the ``mode`` listener, and its thread count."""
    telemetry = free_port()
    config = workdir / f"{mode}.yaml"
    config.write_text(CONFIG.format(prometheus=free_port(), telemetry=telemetry), encoding="utf-8")
    proc = subprocess.Popen([sys.executable, __file__, "--child", mode, str(config)], cwd=ROOT)
    try:
        wait_ready(telemetry)
        time.sleep(1.0)  # let the first tick's leftovers (the readiness scrapes' threads) settle
        before, start = cpu_ns(proc.pid), time.monotonic()
        time.sleep(seconds)
        used_ns, elapsed = cpu_ns(proc.pid) - before, time.monotonic() - start
        threads = len(list(Path(f"/proc/{proc.pid}/task").iterdir()))
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    return used_ns / 1e6 / elapsed, threads


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=20.0, help="idle time measured per run (default 20)")
    parser.add_argument("--repeat", type=int, default=3, help="runs per listener (default 3)")
    parser.add_argument("--child", nargs=2, metavar=("MODE", "CONFIG"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        sys.exit(child(*args.child))
    print(f"{platform.node()}: {os.cpu_count()} CPUs, {platform.machine()}, Python {platform.python_version()}")
    results: dict[str, list[float]] = {mode: [] for mode in MODES}
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(args.repeat):
            for mode in MODES:
                ms_per_s, threads = measure(mode, args.seconds, Path(tmp))
                results[mode].append(ms_per_s)
                print(f"run {i + 1} {mode:<8}: {ms_per_s:8.4f} ms CPU per s idle ({threads} threads)", flush=True)
    polling, blocking = (statistics.median(results[mode]) for mode in MODES)
    print(f"median over {args.repeat} × {args.seconds:g} s: polling {polling:.4f} ms/s, blocking {blocking:.4f} ms/s")
    print(f"blocking / polling = {blocking / polling:.4f} (the listeners' share saved: {polling - blocking:.3f} ms/s)")


if __name__ == "__main__":
    main()

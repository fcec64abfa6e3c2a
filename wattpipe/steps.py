"""The steps every command that runs a pipeline takes: :mod:`wattpipe.cli` (``run``, ``validate``, ``probe``)
and :mod:`wattpipe.simulated` (``demo``, ``simulate``) both use them, so they live here and not in either.

Load the installed components, load and build a configuration (each problem printed as ``error: …``),
set up logging, and run the service until SIGTERM/SIGINT with its telemetry endpoint served.
Exit codes: 0 ok, 2 configuration error, 1 runtime failure.
"""

from __future__ import annotations

import asyncio
import dataclasses
import errno
import logging
import signal
import sys
from pathlib import Path
from typing import TYPE_CHECKING, TextIO

from wattpipe.pipeline.clock import Clock
from wattpipe.pipeline.components import Registry
from wattpipe.pipeline.config import Config, ConfigError, load_config
from wattpipe.pipeline.errors import alternatives
from wattpipe.pipeline.graph import Graph, build
from wattpipe.pipeline.runtime import Service
from wattpipe.pipeline.telemetry import Telemetry
from wattpipe.pipeline.webconfig import WebConfig, load_web_config

# The shipped configs and scenarios: inside the package in an installed wheel (pyproject.toml maps configs/ to
# wattpipe/configs/), beside it in a checkout or an editable install.
_HERE = Path(__file__).resolve().parent
CONFIGS = next((d for d in (_HERE / "configs", _HERE.parent / "configs") if d.is_dir()), _HERE.parent / "configs")

if TYPE_CHECKING:  # `run` and `validate` never load the simulator
    from wattpipe.simulator import ScenarioError

__all__ = [
    "CONFIGS",
    "EXIT_CONFIG",
    "EXIT_OK",
    "EXIT_RUNTIME",
    "build_or_report",
    "listen_advice",
    "load_or_report",
    "load_registry",
    "run_service",
    "scenario_refused",
    "setup_logging",
    "telemetry_web_config",
    "ticks_to_run",
    "with_port",
]

EXIT_OK, EXIT_RUNTIME, EXIT_CONFIG = 0, 1, 2

log = logging.getLogger("wattpipe")


def setup_logging(level: str) -> None:
    """wattpipe's own loggers at ``level``; every other library's (httpx logs each scrape at INFO) at
    WARNING unless ``level`` is debug. (A filter on the handler, not logger levels: nothing is left set
    on a logger for the next command run in the same process.)"""
    logging.basicConfig(
        level=getattr(logging, level.upper()),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
        force=True,
    )
    if level != "debug":
        for handler in logging.getLogger().handlers:
            handler.addFilter(_others_at_warning)


def _others_at_warning(record: logging.LogRecord) -> bool:
    return record.levelno >= logging.WARNING or record.name == "wattpipe" or record.name.startswith("wattpipe.")


def load_registry(err: TextIO) -> Registry:
    """Every installed component factory; a plugin that cannot be loaded is a warning on ``err``."""
    registry = Registry.from_entry_points()
    for problem in registry.load_errors:
        print(f"warning: plugin {problem}", file=err)
    return registry


def load_or_report(path: str, registry: Registry, err: TextIO) -> Config | None:
    """The configuration at ``path``, or None with every problem printed on ``err``."""
    try:
        return load_config(path, registry)
    except ConfigError as exc:
        for message in exc.messages:
            print(f"error: {message}", file=err)
        return None


def scenario_refused(exc: ScenarioError | OSError, path: str, err: TextIO) -> int:
    """A scenario file that cannot be used (``demo``, ``simulate``, ``topology``), said on ``err``; the exit code.
    A missing file named as one wattpipe ships (``cpu-moves.yaml``) is told the shipped one's path."""
    if isinstance(exc, OSError):
        shipped = CONFIGS / "scenarios" / Path(path).name
        hint = (
            f"; wattpipe ships one of that name: --scenario configs/scenarios/{shipped.name}"
            if isinstance(exc, FileNotFoundError) and Path(path).parent == Path() and shipped.is_file()
            else ""
        )
        print(f"error: scenario {path}: cannot read it: {exc.strerror or exc}{hint}", file=err)
        return EXIT_CONFIG
    for message in exc.messages:  # each names the file (and line) already
        print(f"error: scenario {message}", file=err)
    return EXIT_CONFIG


def build_or_report(config: Config, registry: Registry, clock: Clock, err: TextIO) -> Graph | None:
    """The built (not started) pipelines, or None with every problem printed on ``err``."""
    try:
        graph = build(config, registry, clock, Telemetry(clock))
        telemetry_web_config(config)  # checked here too, so `validate` reports a bad file (exit 2)
        return graph
    except ConfigError as exc:
        for message in exc.messages:
            print(f"error: {message}", file=err)
        return None


def telemetry_web_config(config: Config) -> WebConfig | None:
    """``service.telemetry.web_config_file`` loaded (None without one); :class:`ConfigError` names the key."""
    path = config.service.telemetry.web_config_file
    if not path:
        return None
    try:
        return load_web_config(path)
    except ConfigError as exc:
        raise ConfigError(
            [f"{config.source_name} service.telemetry.web_config_file: {m}" for m in exc.messages]
        ) from exc


def ticks_to_run(graph: Graph, ticks: int | None, duration_s: float | None) -> int | None:
    """``--ticks``; else the ticks ``--duration`` holds at the shortest pipeline interval, and the first; None:
    until stopped."""
    if ticks is not None or duration_s is None:
        return ticks
    return int(duration_s // min(p.config.interval for p in graph.pipelines)) + 1


async def run_service(graph: Graph, max_ticks: int | None = None, service: Service | None = None) -> int:
    """Serve telemetry, run every pipeline until SIGTERM/SIGINT (or ``max_ticks``), shut down in bounded time."""
    service = service or Service(graph)
    code = _serve_telemetry(graph)
    if code is not None:
        return code
    loop = asyncio.get_running_loop()
    signals = (signal.SIGTERM, signal.SIGINT)
    for sig in signals:
        loop.add_signal_handler(sig, _on_signal, service, sig)
    try:
        task = asyncio.ensure_future(service.run(max_ticks=max_ticks))
        await asyncio.wait(
            {task, asyncio.ensure_future(service.stop_event.wait())}, return_when=asyncio.FIRST_COMPLETED
        )
        if not task.done():
            # Stopping: the tick in flight may finish and the shutdown flush; beyond that, give up.
            grace = graph.config.service.shutdown_timeout + max(p.config.interval for p in graph.pipelines)
            done, _ = await asyncio.wait({task}, timeout=grace)
            if not done:
                log.error("shutdown took longer than %.1fs; exiting without waiting further", grace)
                task.cancel()
                return EXIT_RUNTIME
        task.result()
    except Exception as exc:
        log.error("wattpipe stopped on an error: %s: %s", type(exc).__name__, exc)
        advice = _busy_exporter_advice(graph.config, exc)
        if advice:
            log.error("%s", advice)
        return EXIT_RUNTIME
    finally:
        for sig in signals:
            loop.remove_signal_handler(sig)
        graph.telemetry.close()
    if not service.state_saved:
        log.error(
            "stopped, but the state file %s could not be written (see above): the next start goes on from the last "
            "checkpoint that was written, or from zero",
            graph.state.path,
        )
        return EXIT_RUNTIME
    log.info("stopped cleanly")
    return EXIT_OK


def _serve_telemetry(graph: Graph) -> int | None:
    """Start /metrics, /healthz and /readyz where ``service.telemetry.listen`` says; an exit code if that fails."""
    listen = graph.config.service.telemetry.listen
    if not listen:
        return None
    try:
        web = telemetry_web_config(graph.config)
    except ConfigError as exc:
        for message in exc.messages:
            log.error("%s", message)
        return EXIT_CONFIG
    try:
        server = graph.telemetry.serve(listen, web)
    except (OSError, ValueError) as exc:
        log.error("service.telemetry.listen %s: cannot listen: %s", listen, exc)
        if _port_in_use(exc):
            advice = listen_advice(graph.config, ("service", "telemetry", "listen"), port_flag=False)
            log.error(
                "%s; or set it empty for no telemetry listener (/healthz, /readyz and wattpipe's own /metrics; "
                "the energy series are the exporter's)",
                advice,
            )
        return EXIT_RUNTIME
    log.info("telemetry listening on %s: %s (/metrics, /healthz, /readyz)", server.bound, server.url)
    return None


def _on_signal(service: Service, sig: signal.Signals) -> None:
    log.info("%s received: finishing the tick in flight, flushing exporters, saving state", sig.name)
    service.stop()


# --- listening ports ------------------------------------------------------------------------------


def with_port(config: Config, port: int) -> Config:
    """``--port``: the Prometheus exporter's port replaced (its host kept); :class:`ConfigError` unless the
    configuration has exactly one."""
    targets = [cid for cid in config.exporters if cid.split("/")[0] == "prometheus"]
    if len(targets) != 1:
        names = ", ".join(targets) or "none"
        raise ConfigError(
            [
                f"--port: {config.source_name} has {len(targets)} prometheus exporters ({names}), and --port "
                "changes one: set each one's listen in the configuration instead"
            ]
        )
    cid = targets[0]
    exporter = config.exporters[cid]
    host = str(getattr(exporter, "listen", "")).rpartition(":")[0] or "0.0.0.0"
    exporters = {**config.exporters, cid: exporter.model_copy(update={"listen": f"{host}:{port}"})}
    return dataclasses.replace(config, exporters=exporters)


def listen_advice(config: Config, path: tuple[str, ...], port_flag: bool) -> str:
    """How to move a listener off a port another program holds: the option (file and line), the
    environment variable the file reads it from, and ``--port`` where it applies."""
    where = f"{'.'.join(path)} in {config.where(path)}"
    ways = (["--port", where] if port_flag else [where]) + [
        f"the environment variable {name} (which that line reads)" for name in config.env.get(path, ())
    ]
    return f"that port is in use (another wattpipe?): choose another with {alternatives(ways)}"


def _port_in_use(exc: BaseException) -> bool:
    while exc is not None:
        if isinstance(exc, OSError) and exc.errno == errno.EADDRINUSE:
            return True
        exc = exc.__cause__  # type: ignore[assignment]
    return False


def _busy_exporter_advice(config: Config, exc: BaseException) -> str | None:
    """Advice when an exporter could not listen because its port is taken (its error names it)."""
    if not _port_in_use(exc):
        return None
    for cid, exporter in config.exporters.items():
        if getattr(exporter, "listen", None) and str(exc).startswith(f"exporter {cid}:"):
            prometheus = (
                cid.split("/")[0] == "prometheus"
                and len([c for c in config.exporters if c.split("/")[0] == "prometheus"]) == 1
            )
            return listen_advice(config, ("exporters", cid, "listen"), port_flag=prometheus)
    return None

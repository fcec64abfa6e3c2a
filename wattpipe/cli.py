"""The ``wattpipe`` command: run | validate | print-config | components | probe | demo | simulate.

``demo`` and ``simulate`` live in :mod:`wattpipe.simulated`.

Exit codes: 0 ok, 2 configuration error, 1 runtime failure. This module is the composition root: the
only place that knows the engine, the components and the real clock together.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import signal
import sys
from collections.abc import Sequence
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import TextIO

import yaml

from pipeline.clock import Clock, RealClock
from pipeline.components import Receiver, Registry, call_optional
from pipeline.config import Config, ConfigError, load_config, parse_duration
from pipeline.graph import Graph, build
from pipeline.runtime import Service
from pipeline.telemetry import Telemetry
from pipeline.webconfig import WebConfig, load_web_config

__all__ = ["main"]

EXIT_OK, EXIT_RUNTIME, EXIT_CONFIG = 0, 1, 2

# Shipped with the repository (an editable install or a checkout): the demo's node and pipeline.
CONFIGS = Path(__file__).resolve().parents[1] / "configs"
DEMO_CONFIG = CONFIGS / "demo.yaml"
DEMO_SCENARIO = CONFIGS / "scenarios" / "demo.yaml"

log = logging.getLogger("wattpipe")


def _version() -> str:
    try:
        return version("wattpipe")
    except PackageNotFoundError:
        return "0+unknown"


def _setup_logging(level: str) -> None:
    logging.basicConfig(
        level=getattr(logging, level.upper()),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
        force=True,
    )


def _load(path: str, registry: Registry, err: TextIO) -> Config | None:
    try:
        return load_config(path, registry)
    except ConfigError as exc:
        for message in exc.messages:
            print(f"error: {message}", file=err)
        return None


def _build(config: Config, registry: Registry, clock: Clock, err: TextIO) -> Graph | None:
    try:
        graph = build(config, registry, clock, Telemetry(clock))
        _telemetry_web_config(config)  # checked here too, so `validate` reports a bad file (exit 2)
        return graph
    except ConfigError as exc:
        for message in exc.messages:
            print(f"error: {message}", file=err)
        return None


def _telemetry_web_config(config: Config) -> WebConfig | None:
    path = config.service.telemetry.web_config_file
    if not path:
        return None
    try:
        return load_web_config(path)
    except ConfigError as exc:
        raise ConfigError(
            [f"{config.source_name} service.telemetry.web_config_file: {m}" for m in exc.messages]
        ) from exc


def _registry(err: TextIO) -> Registry:
    registry = Registry.from_entry_points()
    for problem in registry.load_errors:
        print(f"warning: plugin {problem}", file=err)
    return registry


# --- commands -------------------------------------------------------------------------------


def cmd_validate(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    registry = _registry(err)
    config = _load(args.config, registry, err)
    if config is None:
        return EXIT_CONFIG
    graph = _build(config, registry, RealClock(), err)
    if graph is None:
        return EXIT_CONFIG
    pipes = ", ".join(
        f"{p.name} ({len(p.receivers)} receivers, {len(p.processors)} processors, {len(p.exporters)} exporters)"
        for p in graph.pipelines
    )
    print(f"{args.config}: valid: {pipes}", file=out)
    return EXIT_OK


def cmd_print_config(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    config = _load(args.config, _registry(err), err)
    if config is None:
        return EXIT_CONFIG
    yaml.safe_dump(config.effective(), out, sort_keys=False, default_flow_style=False)
    return EXIT_OK


def cmd_components(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    registry = _registry(err)
    rows = [(f.kind, f.type, f.stability, f.description) for f in registry.all()]
    if args.json:
        json.dump(
            [dict(zip(("kind", "type", "stability", "description"), r, strict=True)) for r in rows], out, indent=2
        )
        out.write("\n")
        return EXIT_OK
    width = max((len(r[1]) for r in rows), default=4)
    for kind in ("receiver", "processor", "exporter"):
        print(f"{kind}s:", file=out)
        for _, type_name, stability, description in (r for r in rows if r[0] == kind):
            print(f"  {type_name:<{width}}  {stability:<11}  {description}", file=out)
    return EXIT_OK


def cmd_probe(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    registry = _registry(err)
    config = _load(args.config, registry, err)
    if config is None:
        return EXIT_CONFIG
    if args.id not in config.receivers:
        defined = ", ".join(config.receivers) or "none"
        print(f"error: {args.config}: no receiver '{args.id}' (receivers defined: {defined})", file=err)
        return EXIT_CONFIG
    _setup_logging(config.service.telemetry.log_level)
    graph = _build(config, registry, RealClock(), err)
    if graph is None:
        return EXIT_CONFIG
    receiver = graph.receivers[args.id]
    return asyncio.run(_probe(receiver, args, out, err))


async def _probe(receiver: Receiver, args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    try:
        await call_optional(receiver, "start")
        batches = []
        for i in range(args.count):
            if i:
                await asyncio.sleep(args.every)
            records = await asyncio.wait_for(receiver.collect(), timeout=args.timeout)
            batches.append([r.to_json() for r in records])
    except TimeoutError:
        print(f"error: receiver {args.id} did not answer within {args.timeout:g}s", file=err)
        return EXIT_RUNTIME
    except Exception as exc:
        print(f"error: receiver {args.id} failed: {type(exc).__name__}: {exc}", file=err)
        return EXIT_RUNTIME
    finally:
        await call_optional(receiver, "shutdown")
    json.dump(batches[0] if args.count == 1 else batches, out, indent=2, sort_keys=True)
    out.write("\n")
    return EXIT_OK


def cmd_run(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    registry = _registry(err)
    config = _load(args.config, registry, err)
    if config is None:
        return EXIT_CONFIG
    _setup_logging(args.log_level or config.service.telemetry.log_level)
    graph = _build(config, registry, RealClock(), err)
    if graph is None:
        return EXIT_CONFIG
    return asyncio.run(run_service(graph, max_ticks=args.ticks))


async def run_service(graph: Graph, max_ticks: int | None = None, service: Service | None = None) -> int:
    """Serve telemetry, run every pipeline until SIGTERM/SIGINT (or ``max_ticks``), shut down in bounded time."""
    service = service or Service(graph)
    listen = graph.config.service.telemetry.listen
    if listen:
        try:
            web = _telemetry_web_config(graph.config)
        except ConfigError as exc:
            for message in exc.messages:
                log.error("%s", message)
            return EXIT_CONFIG
        try:
            server = graph.telemetry.serve(listen, web)
        except (OSError, ValueError) as exc:
            log.error("service.telemetry.listen %s: cannot listen: %s", listen, exc)
            return EXIT_RUNTIME
        log.info("telemetry on %s (/metrics, /healthz, /readyz)", server.url)
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
        return EXIT_RUNTIME
    finally:
        for sig in signals:
            loop.remove_signal_handler(sig)
        graph.telemetry.close()
    log.info("stopped cleanly")
    return EXIT_OK


def _on_signal(service: Service, sig: signal.Signals) -> None:
    log.info("%s received: finishing the tick in flight, flushing exporters, saving state", sig.name)
    service.stop()


# --- parser ---------------------------------------------------------------------------------


# The simulator (and everything it serves: gRPC, the API server face) is loaded only by the commands that
# use it, never by `run` or `validate` on a real node.
def _cmd_demo(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    from wattpipe.simulated import cmd_demo

    return cmd_demo(args, out, err)


def _cmd_simulate(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    from wattpipe.simulated import cmd_simulate

    return cmd_simulate(args, out, err)


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="wattpipe",
        description="Measure GPU and CPU energy and attribute it to processes, containers and pods.",
    )
    p.add_argument("--version", action="version", version=f"wattpipe {_version()}")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def with_config(sp: argparse.ArgumentParser) -> None:
        sp.add_argument("-c", "--config", required=True, help="pipeline configuration (YAML)")

    sp = sub.add_parser("run", help="run the pipelines until SIGTERM/SIGINT")
    with_config(sp)
    sp.add_argument("--ticks", type=int, default=None, help="stop after this many ticks per pipeline")
    sp.add_argument("--log-level", choices=["debug", "info", "warning", "error"], default=None)
    sp.set_defaults(fn=cmd_run)

    sp = sub.add_parser("validate", help="build everything, start nothing; exit 0 if valid, 2 if not")
    with_config(sp)
    sp.set_defaults(fn=cmd_validate)

    sp = sub.add_parser("print-config", help="the effective configuration: defaults filled in, env expanded")
    with_config(sp)
    sp.set_defaults(fn=cmd_print_config)

    sp = sub.add_parser("components", help="every installed component type, its stability and purpose")
    sp.add_argument("--json", action="store_true")
    sp.set_defaults(fn=cmd_components)

    sp = sub.add_parser("probe", help="run one receiver once and print its records as JSON")
    sp.add_argument("id", help="the receiver's ID in the config, e.g. nvml or dcgm/local")
    with_config(sp)
    sp.add_argument("--count", type=int, default=1, help="polls to make (default 1)")
    sp.add_argument("--every", type=float, default=1.0, help="seconds between polls (default 1)")
    sp.add_argument("--timeout", type=float, default=10.0, help="seconds one poll may take (default 10)")
    sp.set_defaults(fn=cmd_probe)

    def simulated(sp: argparse.ArgumentParser) -> None:
        sp.add_argument("-c", "--config", default=str(DEMO_CONFIG), help="pipeline (default: configs/demo.yaml)")
        sp.add_argument(
            "--scenario", default=str(DEMO_SCENARIO), help="simulated node (default: configs/scenarios/demo.yaml)"
        )
        sp.add_argument("--ticks", type=int, default=None, help="stop after this many ticks per pipeline")
        sp.add_argument("--log-level", choices=["debug", "info", "warning", "error"], default=None)

    sp = sub.add_parser("demo", help="run the pipeline on a simulated GPU node, in real time (no GPU needed)")
    simulated(sp)
    sp.add_argument("--duration", type=parse_duration, default=None, help="stop after this long (default: Ctrl-C)")
    sp.set_defaults(fn=_cmd_demo)

    sp = sub.add_parser("simulate", help="the pipeline on a simulated node with a stepped clock, checked against truth")
    simulated(sp)
    sp.add_argument("--duration", type=parse_duration, default=600.0, help="node time to simulate (default 10m)")
    sp.add_argument("--report", default=None, help="write the attributed-vs-true report as JSON to this file")
    sp.set_defaults(fn=_cmd_simulate)
    return p


def main(argv: Sequence[str] | None = None, out: TextIO | None = None, err: TextIO | None = None) -> int:
    args = parser().parse_args(argv)
    if getattr(args, "config", None) and not Path(args.config).exists():
        print(f"error: {args.config}: no such file", file=err or sys.stderr)
        return EXIT_CONFIG
    code: int = args.fn(args, out or sys.stdout, err or sys.stderr)
    return code


if __name__ == "__main__":
    sys.exit(main())

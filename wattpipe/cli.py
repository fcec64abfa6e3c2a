"""The ``wattpipe`` command: run | validate | print-config | components | probe | demo | simulate | top | topology |
extender.

``demo`` and ``simulate`` live in :mod:`wattpipe.simulated`; the steps both use (load, build, run the service)
in :mod:`wattpipe.steps`; ``top`` in :mod:`wattpipe.top`. A reader that goes away (``… | head``) ends any
command quietly.

Exit codes: 0 ok, 2 configuration error, 1 runtime failure. This module is the composition root: the
only place that knows the engine, the components and the real clock together.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
from collections.abc import Sequence
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import TextIO

import yaml

from wattpipe._probe import default_receiver
from wattpipe.pipeline.clock import RealClock
from wattpipe.pipeline.components import Receiver, call_optional
from wattpipe.pipeline.config import ConfigError, parse_duration
from wattpipe.pipeline.records import Record
from wattpipe.saturation_probe import print_saturation_sources
from wattpipe.steps import (
    CONFIGS,
    EXIT_CONFIG,
    EXIT_OK,
    EXIT_RUNTIME,
    build_or_report,
    load_or_report,
    load_registry,
    run_service,
    setup_logging,
    ticks_to_run,
    with_port,
)

# The exit codes and run_service are defined in wattpipe.steps and still importable from here.
__all__ = ["EXIT_BROKEN_PIPE", "EXIT_CONFIG", "EXIT_OK", "EXIT_RUNTIME", "main", "run_service"]

# The demo's node and pipeline: inside the package in an installed wheel (pyproject.toml maps configs/ to
# wattpipe/configs/), beside it in a checkout or an editable install.
# CONFIGS is wattpipe.steps's (scenario_refused names a shipped scenario from it).
DEMO_CONFIG = CONFIGS / "demo.yaml"
DEMO_SCENARIO = CONFIGS / "scenarios" / "demo.yaml"

EXIT_BROKEN_PIPE = 141
"""The exit code when the reader of stdout went away: what a shell reports for a command killed by SIGPIPE."""


def _version() -> str:
    try:
        return version("wattpipe")
    except PackageNotFoundError:
        return "0+unknown"


# --- commands -------------------------------------------------------------------------------


def cmd_validate(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    registry = load_registry(err)
    config = load_or_report(args.config, registry, err)
    if config is None:
        return EXIT_CONFIG
    graph = build_or_report(config, registry, RealClock(), err)
    if graph is None:
        return EXIT_CONFIG
    pipes = ", ".join(
        f"{p.name} ({len(p.receivers)} receivers, {len(p.processors)} processors, {len(p.exporters)} exporters)"
        for p in graph.pipelines
    )
    print(f"{args.config}: valid: {pipes}", file=out)
    return EXIT_OK


def cmd_print_config(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    config = load_or_report(args.config, load_registry(err), err)
    if config is None:
        return EXIT_CONFIG
    yaml.safe_dump(config.effective(), out, sort_keys=False, default_flow_style=False)
    return EXIT_OK


def cmd_components(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    registry = load_registry(err)
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
    registry = load_registry(err)
    if args.config is None:  # no config: the receiver type named, with its default options
        setup_logging("warning")
        receiver = default_receiver(registry, args.id)
        if receiver is None:
            types = ", ".join(registry.types("receiver"))
            print(f"error: no receiver type '{args.id}' (installed: {types}); or give -c CONFIG", file=err)
            return EXIT_CONFIG
        return asyncio.run(_probe(receiver, args, out, err))
    config = load_or_report(args.config, registry, err)
    if config is None:
        return EXIT_CONFIG
    if args.id not in config.receivers:
        defined = ", ".join(config.receivers) or "none"
        print(f"error: {args.config}: no receiver '{args.id}' (receivers defined: {defined})", file=err)
        return EXIT_CONFIG
    setup_logging(config.service.telemetry.log_level)
    graph = build_or_report(config, registry, RealClock(), err)
    if graph is None:
        return EXIT_CONFIG
    receiver = graph.receivers[args.id]
    return asyncio.run(_probe(receiver, args, out, err))


async def _probe(receiver: Receiver, args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    try:
        await call_optional(receiver, "start")
        batches = []
        records: Sequence[Record] = ()
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
    result: object = batches[0] if args.count == 1 else batches
    describe = getattr(receiver, "describe", None)
    if callable(describe):  # a receiver that can say what it sees (rapl: every zone, readable or not)
        result = {"sees": describe(), "records": result}
    json.dump(result, out, indent=2, sort_keys=True)
    out.write("\n")
    print_saturation_sources(records, getattr(receiver, "provides", ()), err)
    return EXIT_OK


def cmd_run(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    registry = load_registry(err)
    config = load_or_report(args.config, registry, err)
    if config is None:
        return EXIT_CONFIG
    if args.port is not None:
        try:
            config = with_port(config, args.port)
        except ConfigError as exc:
            print(f"error: {exc}", file=err)
            return EXIT_CONFIG
    setup_logging(args.log_level or config.service.telemetry.log_level)
    graph = build_or_report(config, registry, RealClock(), err)
    if graph is None:
        return EXIT_CONFIG
    return asyncio.run(run_service(graph, max_ticks=ticks_to_run(graph, args.ticks, args.duration)))


# --- parser ---------------------------------------------------------------------------------


# The simulator (and everything it serves: gRPC, the API server face) is loaded only by the commands that
# use it, never by `run` or `validate` on a real node.
def _cmd_demo(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    from wattpipe.simulated import cmd_demo

    return cmd_demo(args, out, err)


def _cmd_simulate(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    from wattpipe.simulated import cmd_simulate

    return cmd_simulate(args, out, err)


def _top(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    from wattpipe import top

    return top.main(args)


def _duration(text: str) -> float:
    """``--duration``'s type: argparse shows the message, not the function's name."""
    try:
        seconds = parse_duration(text)
    except ValueError as exc:
        if text.startswith("-") and _parses(text[1:]):
            raise argparse.ArgumentTypeError(f"'{text}' is not above 0 (e.g. 30s, 10m)") from None
        raise argparse.ArgumentTypeError(str(exc)) from None
    if seconds <= 0:
        raise argparse.ArgumentTypeError(f"'{text}' is not above 0 (e.g. 30s, 10m)")
    return seconds


def _parses(text: str) -> bool:
    try:
        parse_duration(text)
    except ValueError:
        return False
    return True


def _negative_durations_joined(argv: Sequence[str]) -> list[str]:
    """``--duration -5s`` as ``--duration=-5s``: argparse takes a value that starts with ``-`` (and is not a plain
    negative number) for an option and says only "expected one argument"; joined, the value is checked and said."""
    out = list(argv)
    for i in range(len(out) - 2, -1, -1):
        if out[i] == "--duration" and out[i + 1][:2] in {f"-{d}" for d in "0123456789."}:
            out[i : i + 2] = [f"--duration={out[i + 1]}"]
    return out


def _count(text: str) -> int:
    """``--ticks`` and ``--count``: a whole number above 0 (0 or less would start, do nothing and say it stopped)."""
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"'{text}' is not a whole number above 0")
    return int(text)


def _seconds(text: str, above_zero: bool) -> float:
    try:
        seconds = float(text)
    except ValueError:
        seconds = float("nan")
    if not (seconds > 0 or (seconds == 0 and not above_zero)):  # NaN too
        bound = "above 0" if above_zero else "of 0 or more"
        raise argparse.ArgumentTypeError(f"'{text}' is not a number of seconds {bound}")
    return seconds


def _pause_s(text: str) -> float:
    """``probe --every``: seconds between polls, 0 allowed."""
    return _seconds(text, above_zero=False)


def _timeout_s(text: str) -> float:
    """``probe --timeout``: seconds one poll may take, above 0."""
    return _seconds(text, above_zero=True)


def _port(text: str) -> int:
    """``--port``'s type: a TCP port (0: any free one; the log says which)."""
    if not text.isdigit() or int(text) > 65535:
        raise argparse.ArgumentTypeError(f"'{text}' is not a TCP port (0-65535)")
    return int(text)


PORT_HELP = "serve /metrics on this port (the prometheus exporter's listen, its host kept)"


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
    sp.add_argument("--ticks", type=_count, default=None, help="stop after this many ticks per pipeline")
    sp.add_argument("--log-level", choices=["debug", "info", "warning", "error"], default=None)
    sp.add_argument("--port", type=_port, default=None, help=PORT_HELP)
    sp.add_argument("--duration", type=_duration, default=None, help="stop after this long (default: SIGTERM/SIGINT)")
    sp.set_defaults(fn=cmd_run)

    sp = sub.add_parser("validate", help="build everything, start nothing; exit 0 if valid, 2 if not")
    with_config(sp)
    sp.set_defaults(fn=cmd_validate)

    sp = sub.add_parser("print-config", help="the effective configuration: defaults filled in, env expanded")
    with_config(sp)
    sp.set_defaults(fn=cmd_print_config)

    sp = sub.add_parser("components", help="every installed component type, its stability and purpose")
    sp.add_argument("--json", action="store_true", help="the same as JSON: kind, type, stability, description")
    sp.set_defaults(fn=cmd_components)

    sp = sub.add_parser("probe", help="run one receiver once and print its records as JSON")
    sp.add_argument("id", help="the receiver's ID in the config, e.g. nvml or dcgm/local; without -c, a receiver type")
    sp.add_argument("-c", "--config", default=None, help="pipeline configuration (YAML); none: the type's defaults")
    sp.add_argument("--count", type=_count, default=1, help="polls to make (default 1)")
    sp.add_argument("--every", type=_pause_s, default=1.0, help="seconds between polls (default 1)")
    sp.add_argument("--timeout", type=_timeout_s, default=10.0, help="seconds one poll may take (default 10)")
    sp.set_defaults(fn=cmd_probe)

    _simulated_commands(sub)
    from wattpipe import extender, topology  # GPU placement (docs/topology.md): each module owns its options

    topology.add_parser(sub, str(DEMO_SCENARIO))
    extender.add_parser(sub)
    return p


def _simulated_commands(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """``demo``, ``simulate`` and ``top``: the commands that need no configuration of their own."""

    def simulated(sp: argparse.ArgumentParser) -> None:
        sp.add_argument("-c", "--config", default=str(DEMO_CONFIG), help="pipeline (default: configs/demo.yaml)")
        sp.add_argument(
            "--scenario", default=str(DEMO_SCENARIO), help="simulated node (default: configs/scenarios/demo.yaml)"
        )
        sp.add_argument("--ticks", type=_count, default=None, help="stop after this many ticks per pipeline")
        sp.add_argument("--log-level", choices=["debug", "info", "warning", "error"], default=None)

    sp = sub.add_parser("demo", help="run the pipeline on a simulated GPU node, in real time (no GPU needed)")
    simulated(sp)
    sp.add_argument("--duration", type=_duration, default=None, help="stop after this long (default: Ctrl-C)")
    sp.add_argument("--port", type=_port, default=None, help=PORT_HELP + " (default 28282)")
    sp.set_defaults(fn=_cmd_demo)

    sp = sub.add_parser("simulate", help="the pipeline on a simulated node with a stepped clock, checked against truth")
    simulated(sp)
    sp.add_argument("--duration", type=_duration, default=600.0, help="node time to simulate (default 10m)")
    sp.add_argument("--report", default=None, help="write the attributed-vs-true report as JSON to this file")
    sp.add_argument(
        "--console",
        action="store_true",
        help="print every tick's tables too (default: a progress bar, then the summary)",
    )
    sp.set_defaults(fn=_cmd_simulate)

    from wattpipe import top  # the live view: its options are its own

    sp = sub.add_parser(
        "top", help="a live view of a running wattpipe (or of the demo): GPUs and CPU (RAPL) zones, pods, processes"
    )
    top.add_arguments(sp)
    sp.set_defaults(fn=_top)


def main(argv: Sequence[str] | None = None, out: TextIO | None = None, err: TextIO | None = None) -> int:
    out, err = out or sys.stdout, err or sys.stderr
    try:
        args = parser().parse_args(_negative_durations_joined(sys.argv[1:] if argv is None else argv))
        for option in ("config", "scenario"):
            if getattr(args, option, None):
                setattr(args, option, _shipped_if_missing(getattr(args, option), err))
        if getattr(args, "config", None) and not Path(args.config).exists():
            print(f"error: {args.config}: no such file", file=err)
            return EXIT_CONFIG
        code: int = args.fn(args, out, err)
    except BrokenPipeError:
        # The reader went away (`wattpipe probe procfs | head -1`): stop quietly, as a Unix tool does.
        _silence_stdout()
        return EXIT_BROKEN_PIPE
    return code


def _shipped_if_missing(given: str, err: TextIO) -> str:
    """``configs/…`` as README writes it: the file here if there is one, else the copy installed with wattpipe
    (a wheel ships configs/ as wattpipe/configs/), said on stderr; any other path as given."""
    path = Path(given)
    if path.is_absolute() or path.exists() or path.parts[:1] != ("configs",):
        return given
    shipped = (CONFIGS / Path(*path.parts[1:])).resolve()
    if not shipped.is_file():
        return given
    print(f"{given} is not in {Path.cwd()}: using the one installed with wattpipe, {shipped}", file=err)
    return str(shipped)


def _silence_stdout() -> None:
    """Point stdout at /dev/null, so the interpreter's flush at exit does not raise a second time."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):  # stdout is not a file (a test's StringIO): nothing to flush later
        pass


if __name__ == "__main__":
    sys.exit(main())

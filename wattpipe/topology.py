"""``wattpipe topology``: the GPU link matrix like ``nvidia-smi topo -m``, each link's score, the best free sets.

By default on the demo's simulated node; ``--scenario FILE`` on another simulated node; ``--node`` on this
machine's GPUs through the real NVML. A GPU is taken when the kubelet's pod-resources API lists it for a
container (whole, or a time-sliced replica) or it is in MIG mode: on a simulated node the simulator's kubelet
is asked, read by the ``podresources`` receiver; with ``--node``, the socket ``--podresources`` names (without
it every GPU not in MIG mode counts free). ``--json`` prints ``{"gpus", "links", "best_sets"}``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any, TextIO

import pynvml

from wattpipe.pipeline.clock import RealClock, SteppedClock
from wattpipe.pipeline.components import CreateContext
from wattpipe.pipeline.records import DeviceAllocation, Record
from wattpipe.pipeline.state import StateStore
from wattpipe.pipeline.telemetry import Telemetry
from wattpipe.pipeline.topology import BestSet, GpuTopology, best_sets, free_gpus
from wattpipe.receivers.nvml._errors import NvmlFailure, nvml_call
from wattpipe.receivers.nvml._topology import mig_mode_uuids, open_handles, read_topology
from wattpipe.receivers.podresources import PodResourcesConfig, PodResourcesError, PodResourcesReceiver
from wattpipe.steps import EXIT_CONFIG, EXIT_OK, EXIT_RUNTIME, scenario_refused

__all__ = ["add_parser", "cmd_topology", "render_json", "render_text"]

LEGEND = """Legend:

  X    = Self
  SYS  = Connection traversing PCIe as well as the SMP interconnect between NUMA nodes (e.g., QPI/UPI)
  NODE = Connection traversing PCIe as well as the interconnect between PCIe Host Bridges within a NUMA node
  PHB  = Connection traversing PCIe as well as a PCIe Host Bridge (typically the CPU)
  PXB  = Connection traversing multiple PCIe bridges (without traversing the PCIe Host Bridge)
  PIX  = Connection traversing at most a single PCIe bridge
  NV#  = Connection traversing a bonded set of # NVLinks
  PSB  = GPUs on the same board (NVML's INTERNAL level)
Scores (go-gpuallocator): PSB 60, PIX 50, PXB 40, PHB 30, NODE 20, SYS 10, plus 100 per NVLink."""


def _read_nvml() -> tuple[GpuTopology, set[str]]:
    """The topology and the UUIDs of GPUs in MIG mode, from whatever NVML library is loaded."""
    nvml_call(pynvml.nvmlInit)
    try:
        handles = open_handles()
        return read_topology(handles), mig_mode_uuids(handles)
    finally:
        nvml_call(pynvml.nvmlShutdown)


def _allocated(endpoint: str) -> set[str]:
    """Device ids the kubelet's pod-resources API lists for any container (any ``nvidia.com/`` resource)."""
    clock = RealClock()
    logger = logging.getLogger("wattpipe.topology.podresources")
    ctx = CreateContext(
        component_id="podresources",
        kind="receiver",
        clock=clock,
        node_name="",
        logger=logger,
        telemetry=Telemetry(clock).for_component("receiver", "podresources", logger),
        state=StateStore(None, clock, ""),
    )
    receiver = PodResourcesReceiver(PodResourcesConfig(endpoint=endpoint, resources=["nvidia.com/*"]), ctx)

    async def ask() -> Sequence[Record]:
        await receiver.start()
        try:
            return await receiver.collect()
        finally:
            await receiver.shutdown()

    return {r.device_id for r in asyncio.run(ask()) if isinstance(r, DeviceAllocation)}


def _simulated(path: str) -> tuple[GpuTopology, set[str]]:
    from wattpipe import simulator

    node = simulator.install(path, SteppedClock())
    try:
        with tempfile.TemporaryDirectory(prefix="wattpipe-topology-") as tmp:
            kubelet = simulator.start_kubelet(node, socket_dir=Path(tmp) / "pod-resources")
            topology, mig = _read_nvml()
            return topology, mig | _allocated(kubelet.endpoint)
    finally:
        simulator.uninstall()


def render_json(topology: GpuTopology, sets: list[BestSet]) -> dict[str, Any]:
    return {
        "gpus": [{"index": index, "uuid": uuid} for index, uuid in enumerate(topology.uuids)],
        "links": [
            {"a": link.a, "b": link.b, "link": link.name, "nvlinks": link.nvlinks, "score": link.score}
            for link in topology.links
        ],
        "best_sets": [{"size": s.size, "gpus": list(s.gpus), "score": s.score} for s in sets],
    }


def render_text(topology: GpuTopology, free: list[int], sets: list[BestSet]) -> str:
    count = len(topology)
    names = [f"GPU{i}" for i in range(count)]
    width = max([6, *(len(name) + 2 for name in names)])
    lines = [(" " * width + "".join(f"{name:<{width}}" for name in names)).rstrip()]
    for a in range(count):
        cells = ["X" if a == b else topology.link(a, b).name for b in range(count)]
        lines.append(f"{names[a]:<{width}}" + "".join(f"{cell:<{width}}" for cell in cells).rstrip())
    lines += ["", LEGEND, "", "Link scores (link, PCIe path beneath, score):"]
    lines += [f"  GPU{lk.a}-GPU{lk.b}  {lk.name:<5} {lk.pcie:<4} {lk.score:>5}" for lk in topology.links]
    lines.append("")
    lines.append(f"Free GPUs: {', '.join(map(str, free)) or 'none'} ({len(free)} of {count})")
    lines.append("Best sets among the free GPUs:")
    lines.append("  size  score  gpus")
    for found in sets:
        method = "" if found.exact else "  (heuristic)"
        lines.append(f"  {found.size:>4}  {found.score:>5}  {', '.join(map(str, found.gpus))}{method}")
    return "\n".join(lines) + "\n"


def cmd_topology(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    from wattpipe import simulator

    if args.podresources and not args.node:
        print("error: --podresources goes with --node (a simulated node's kubelet is asked anyway)", file=err)
        return EXIT_CONFIG
    try:
        if args.node:
            topology, taken = _read_nvml()
            if args.podresources:
                taken |= _allocated(args.podresources)
        else:
            topology, taken = _simulated(args.scenario)
    except (simulator.ScenarioError, OSError) as exc:  # as demo says them
        return scenario_refused(exc, args.scenario, err)
    except NvmlFailure as exc:
        no_driver = exc.code in (pynvml.NVML_ERROR_LIBRARY_NOT_FOUND, pynvml.NVML_ERROR_DRIVER_NOT_LOADED)
        hint = " (no NVIDIA driver on this node?)" if no_driver else ""
        print(f"error: reading the GPU topology from NVML: {exc}{hint}", file=err)
        return EXIT_RUNTIME
    except PodResourcesError as exc:
        print(f"error: asking the kubelet's pod-resources API which GPUs are taken: {exc}", file=err)
        return EXIT_RUNTIME
    free = free_gpus(topology, taken)
    sets = best_sets(topology, free)
    if args.json:
        json.dump(render_json(topology, sets), out, indent=2)
        out.write("\n")
    else:
        out.write(render_text(topology, free, sets))
    return EXIT_OK


def add_parser(sub: Any, demo_scenario: str) -> None:
    sp = sub.add_parser("topology", help="the GPU link matrix (like nvidia-smi topo -m), link scores, best GPU sets")
    where = sp.add_mutually_exclusive_group()
    where.add_argument(
        "--scenario", default=demo_scenario, help="simulated node (default: configs/scenarios/demo.yaml)"
    )
    where.add_argument("--node", action="store_true", help="this machine's GPUs, through the real NVML")
    sp.add_argument(
        "--podresources",
        default=None,
        metavar="ENDPOINT",
        help="with --node: the kubelet's pod-resources socket (unix:///var/lib/kubelet/pod-resources/kubelet.sock) "
        "for which GPUs are taken; without it every GPU counts free",
    )
    sp.add_argument("--json", action="store_true", help='{"gpus", "links", "best_sets"} as JSON')
    sp.set_defaults(fn=cmd_topology)

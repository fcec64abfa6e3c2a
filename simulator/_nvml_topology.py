"""Topology calls: PCIe common ancestors, P2P status and NVLink state, from the scenario's topology.

PCIe levels: the same GPU, or the same ``board``, is INTERNAL (PSB); other NUMA nodes are SYSTEM; within
a NUMA node the same ``pcie_switch`` is SINGLE (PIX), the same ``pcie_root`` MULTIPLE (PXB), the same
``host_bridge`` HOSTBRIDGE (PHB), otherwise NODE. NVLink: each GPU's links are numbered from 0, assigned to peers in
ascending peer order (``nvlinks: {1: 4, 2: 4}`` → links 0–3 to GPU 1, 4–7 to GPU 2). On an NVSwitch
system every link is active and its remote end is a switch, not the peer GPU (as on real HGX boards).
"""

from __future__ import annotations

from typing import Any

import pynvml

from wattpipe.simulator._ctypes_io import DeviceRef, as_int, decode_handle, out
from wattpipe.simulator._nvml_calls import INVALID_ARGUMENT, NOT_FOUND, NOT_SUPPORTED, SUCCESS, _call, fill_pci
from wattpipe.simulator.hardware import gpu_model_info
from wattpipe.simulator.node import SimulatedNode
from wattpipe.simulator.scenario import Gpu, Topology

__all__ = ["link_peers"]


def link_peers(gpu: Gpu) -> tuple[int, list[int | None]]:
    """(link count, peer GPU index per link; None = an inactive link)."""
    assigned: list[int | None] = []
    for peer in sorted(gpu.topology.nvlinks):
        assigned.extend([peer] * gpu.topology.nvlinks[peer])
    count = max(gpu_model_info(gpu.model).nvlink_count, len(assigned))
    if not assigned and not gpu.topology.nvswitch:
        return 0, []
    return count, assigned + [None] * (count - len(assigned))


@_call("nvmlDeviceGetTopologyCommonAncestor")
def _common_ancestor(node: SimulatedNode, t_s: float, device: DeviceRef, other: Any, level: Any) -> int:
    peer = decode_handle(other)
    if peer is None or peer.gpu >= len(node.scenario.gpus) or device.gi is not None or peer.gi is not None:
        return INVALID_ARGUMENT
    mine = node.scenario.gpus[device.gpu].topology
    theirs = node.scenario.gpus[peer.gpu].topology
    out(level).value = _level(mine, theirs, same_gpu=peer.gpu == device.gpu)
    return SUCCESS


def _same(mine: int | None, theirs: int | None) -> bool:
    return mine is not None and mine == theirs


def _level(mine: Topology, theirs: Topology, same_gpu: bool) -> int:
    """The deepest PCIe element two GPUs share, as nvmlDeviceGetTopologyCommonAncestor names it."""
    if same_gpu or _same(mine.board, theirs.board):
        return int(pynvml.NVML_TOPOLOGY_INTERNAL)
    if mine.numa != theirs.numa:
        return int(pynvml.NVML_TOPOLOGY_SYSTEM)
    for element, level in (
        ("pcie_switch", pynvml.NVML_TOPOLOGY_SINGLE),
        ("pcie_root", pynvml.NVML_TOPOLOGY_MULTIPLE),
        ("host_bridge", pynvml.NVML_TOPOLOGY_HOSTBRIDGE),
    ):
        if _same(getattr(mine, element), getattr(theirs, element)):
            return int(level)
    return int(pynvml.NVML_TOPOLOGY_NODE)


@_call("nvmlDeviceGetP2PStatus")
def _p2p_status(node: SimulatedNode, t_s: float, device: DeviceRef, other: Any, index: Any, status: Any) -> int:
    peer = decode_handle(other)
    if peer is None or peer.gpu >= len(node.scenario.gpus):
        return INVALID_ARGUMENT
    mine = node.scenario.gpus[device.gpu]
    theirs = node.scenario.gpus[peer.gpu]
    if as_int(index) == pynvml.NVML_P2P_CAPS_INDEX_NVLINK:
        linked = peer.gpu in mine.topology.nvlinks or (mine.topology.nvswitch and theirs.topology.nvswitch)
        ok = linked and peer.gpu != device.gpu
    else:
        ok = mine.topology.numa == theirs.topology.numa
    out(status).value = pynvml.NVML_P2P_STATUS_OK if ok else pynvml.NVML_P2P_STATUS_NOT_SUPPORTED
    return SUCCESS


def _link(node: SimulatedNode, device: DeviceRef, link: Any) -> tuple[int, int | None]:
    """(status, peer) for a link: NOT_SUPPORTED beyond the GPU's links, INVALID_ARGUMENT beyond 36."""
    number = as_int(link)
    if device.gi is not None:
        return NOT_SUPPORTED, None
    if not 0 <= number < pynvml.NVML_NVLINK_MAX_LINKS:
        return INVALID_ARGUMENT, None
    count, peers = link_peers(node.scenario.gpus[device.gpu])
    if number >= count:
        return NOT_SUPPORTED, None
    return SUCCESS, peers[number]


@_call("nvmlDeviceGetNvLinkState")
def _nvlink_state(node: SimulatedNode, t_s: float, device: DeviceRef, link: Any, active: Any) -> int:
    status, peer = _link(node, device, link)
    if status != SUCCESS:
        return status
    nvswitch = node.scenario.gpus[device.gpu].topology.nvswitch
    out(active).value = pynvml.NVML_FEATURE_ENABLED if (peer is not None or nvswitch) else 0
    return SUCCESS


@_call("nvmlDeviceGetNvLinkRemotePciInfo_v2")
def _nvlink_remote(node: SimulatedNode, t_s: float, device: DeviceRef, link: Any, pci: Any) -> int:
    status, peer = _link(node, device, link)
    if status != SUCCESS:
        return status
    if node.scenario.gpus[device.gpu].topology.nvswitch:
        # Links fan out over the board's NVSwitches: the remote end is a switch, never the peer GPU.
        fill_pci(out(pci), f"00000000:{0xC0 + as_int(link) % 4:02X}:00.0")
        return SUCCESS
    if peer is None:
        return NOT_FOUND
    fill_pci(out(pci), node.scenario.gpus[peer].pci_bus_id)
    return SUCCESS

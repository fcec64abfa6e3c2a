"""The node's GPU topology from NVML: every pair's PCIe common ancestor and the NVLinks they share.

NVLinks are counted per link: an active link whose remote PCI id is another GPU's joins that pair. On an
NVSwitch board every remote end is a switch, so that count is 0 for every pair (go-gpuallocator's flaw):
there a pair whose P2P status over NVLink is OK is given as many NVLinks as the poorer of the two GPUs has
active towards switches (18 on HGX H100, printed ``NV18`` as nvidia-smi does). Read once: the topology of
a running node does not change.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from typing import Any

import pynvml

from wattpipe.pipeline.topology import PCIE_BY_NVML_LEVEL, GpuTopology, Link
from wattpipe.receivers.nvml._errors import NotSupported, NvmlFailure, nvml_call

__all__ = ["mig_mode_uuids", "open_handles", "read_topology"]


def _text(value: str | bytes) -> str:
    return value.decode() if isinstance(value, bytes) else value


def _bus(pci: Any) -> str:
    return _text(pci.busId).upper()


def open_handles() -> list[Any]:
    """Every GPU's handle in NVML index order (NVML must be initialised)."""
    count = nvml_call(pynvml.nvmlDeviceGetCount)
    return [nvml_call(pynvml.nvmlDeviceGetHandleByIndex, index) for index in range(count)]


def _nvlinks(handle: Any, gpu_by_bus: dict[str, int]) -> tuple[dict[int, int], int]:
    """(active links per peer GPU index, active links whose far end is not a GPU: NVSwitch)."""
    peers: dict[int, int] = {}
    to_switch = 0
    for link in range(pynvml.NVML_NVLINK_MAX_LINKS):
        try:
            active = nvml_call(pynvml.nvmlDeviceGetNvLinkState, handle, link)
        except NvmlFailure:  # NotSupported past the GPU's last link, or no NVLink at all
            break
        if active != pynvml.NVML_FEATURE_ENABLED:
            continue
        try:
            remote = _bus(nvml_call(pynvml.nvmlDeviceGetNvLinkRemotePciInfo, handle, link))
        except NvmlFailure:
            continue
        if remote in gpu_by_bus:
            peers[gpu_by_bus[remote]] = peers.get(gpu_by_bus[remote], 0) + 1
        else:
            to_switch += 1
    return peers, to_switch


def _p2p_over_nvlink(a: Any, b: Any) -> bool:
    try:
        status = nvml_call(pynvml.nvmlDeviceGetP2PStatus, a, b, pynvml.NVML_P2P_CAPS_INDEX_NVLINK)
    except NotSupported:
        return False
    return bool(status == pynvml.NVML_P2P_STATUS_OK)


def read_topology(handles: Sequence[Any]) -> GpuTopology:
    """The topology of the GPUs behind ``handles`` (index order); NVML errors are typed (``NvmlFailure``)."""
    uuids = [_text(nvml_call(pynvml.nvmlDeviceGetUUID, handle)) for handle in handles]
    gpu_by_bus = {_bus(nvml_call(pynvml.nvmlDeviceGetPciInfo, handle)): i for i, handle in enumerate(handles)}
    nvlinks = [_nvlinks(handle, gpu_by_bus) for handle in handles]
    links = []
    for a, b in itertools.combinations(range(len(handles)), 2):
        level = nvml_call(pynvml.nvmlDeviceGetTopologyCommonAncestor, handles[a], handles[b])
        pcie = PCIE_BY_NVML_LEVEL.get(level)
        if pcie is None:
            raise NvmlFailure("nvmlDeviceGetTopologyCommonAncestor", None, f"GPUs {a}-{b}: unknown level {level}")
        direct = nvlinks[a][0].get(b, 0)
        switched = min(nvlinks[a][1], nvlinks[b][1])
        if not direct and switched and _p2p_over_nvlink(handles[a], handles[b]):
            direct = switched
        links.append(Link(a, b, pcie, min(direct, 18)))
    return GpuTopology(uuids, links)


def mig_mode_uuids(handles: Sequence[Any]) -> set[str]:
    """UUIDs of the GPUs in MIG mode now (a whole-GPU request cannot have them); NotSupported: not MIG."""
    found = set()
    for handle in handles:
        try:
            current, _ = nvml_call(pynvml.nvmlDeviceGetMigMode, handle)
        except NotSupported:
            continue
        if current == pynvml.NVML_DEVICE_MIG_ENABLE:
            found.add(_text(nvml_call(pynvml.nvmlDeviceGetUUID, handle)))
    return found
